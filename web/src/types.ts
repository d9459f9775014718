// Wire types of the HTTP API (docs/api.md), as the page reads them. The Rust definitions in
// core/src/wire are the source of truth; these mirror only the fields the page uses.

export type Status = "idle" | "running" | "stopped";
export type Lane = "steer" | "followUp" | "system";

export interface SessionInfo {
  id: string;
  title: string | null;
  provider: string;
  model: string;
  status: Status;
  createdBy: string;
  owner: string;
  access: "private" | "tenant";
  createdAt: number;
  updatedAt: number;
  lastCursor: number;
  /** The session's reasoning setting (absent: the provider's default). */
  reasoning?: { effort: "low" | "medium" | "high"; budgetTokens?: number };
}

/** A child session as its parent knows it (`children` of a session page; `child_status`). */
export interface ChildInfo {
  id: string;
  title?: string;
  detached: boolean;
  state: "spawning" | "queued" | "created" | "running" | "idle" | "failed" | "stopped" | "disposed";
  finalText?: string;
  /** Why it failed (`failed`). */
  message?: string;
  cursor: number;
}

export interface QueueItem {
  id: string;
  lane: Lane;
  author: string;
  content: string;
  enqueuedAt: number;
}

export interface ToolCall {
  id: string;
  name: string;
  arguments: unknown;
}

/** A blob a tool produced (`wuhu://blob/<id>`), served by `GET /v1/blobs/:id` (docs/api.md). */
export interface BlobRef {
  uri: string;
  size: number;
  mediaType: string;
  preview?: string;
  width?: number;
  height?: number;
}

export type ContentBlock =
  | { type: "text"; text: string }
  | ({ type: "tool_call" } & ToolCall)
  | { type: "thinking"; thinking: string }
  | { type: "redacted_thinking" }
  | { type: "reasoning"; summary?: string | null };

export type Message =
  | { role: "user"; author: string; content: string; queueItemId?: string; lane?: Lane }
  | { role: "assistant"; provider: string; model: string; content: ContentBlock[]; stopReason: string }
  | {
      role: "tool_result";
      toolCallId: string;
      toolName: string;
      content: string;
      isError: boolean;
      blobs?: BlobRef[];
    }
  | { role: "custom_message"; customType: string; content: string; details?: unknown };

interface EntryBase {
  cursor: number;
  id: string;
  createdAt: number;
}

export type Entry =
  | (EntryBase & { type: "header"; systemPrompt: string; provider: string; model: string })
  | (EntryBase & { type: "message"; message: Message })
  // A custom entry's type is `custom_type` on the wire (unlike a custom_message's `customType`).
  | (EntryBase & { type: "custom"; custom_type: string; data: Record<string, unknown> | null });

export interface Attachment {
  environment: { name: string; kind: string; root: string; os: string; branch?: string | null };
  runner: string;
  runnerOwner: string;
  runnerKind: "local" | "cloud";
  attachedAt: number;
}

export interface SessionPage {
  session: SessionInfo;
  transcript: Entry[];
  queue: QueueItem[];
  nextCursor: number | null;
  environments?: Attachment[];
  children?: ChildInfo[];
}

export interface RunnerInfo {
  name: string;
  owner: string;
  kind: "local" | "cloud";
  os: string;
  arch: string;
  connected: boolean;
  lastSeen: number | null;
  connectedAt: number | null;
  version: string | null;
  /** `off`: started with `--sandbox off`, sessions act with the runner's own rights. */
  sandbox?: "on" | "off" | null;
  environments: { name: string; path: string }[];
}

export interface EnvironmentDefinition {
  id: string;
  name: string;
  kind: "local" | "folder-template" | "worktree";
  runner: string | null;
  owner: string | null;
  runnerOwner: string | null;
  path: string | null;
  templatePath: string | null;
  startupScript: string | null;
  repoPath: string | null;
  baseRef: string | null;
  approval: "auto" | "ask";
  extraEnvVars: string[];
  createdAt: number;
  updatedAt: number;
}

export interface DocSummary {
  path: string;
  size: number;
  updated: number;
  version: string;
  frontmatter: unknown;
}

export interface Doc extends DocSummary {
  content: string;
  body: string;
}

/** A frame of `GET /v1/sessions/:id/follow`. */
export type FollowEvent =
  | { type: "entry_appended"; entry: Entry }
  | { type: "assistant_text_delta"; delta: string }
  | { type: "status"; status: Status }
  | { type: "queue_item_added"; id: string; lane: Lane; author: string; preview: string }
  | { type: "queue_item_removed"; id: string; reason: "delivered" | "cancelled" }
  | { type: "child_status"; child: ChildInfo }
  | { type: "tool_output_delta"; callId: string; stream: string; text: string }
  | { type: "thinking_delta"; delta: string }
  | { type: "tool_call_delta"; callId: string; name: string; argumentsDelta: string }
  | { type: "idle" }
  | { type: "done" }
  | { type: "lagged"; cursor: number }
  | { type: "error"; message: string };

/** A row of `GET /v1/tokens` (never the token itself). */
export interface TokenInfo {
  jti: string;
  name: string;
  kind: "user" | "runner" | "session";
  sub: string;
  role: "admin" | "member";
  runnerKind?: "local" | "cloud";
  createdBy: string;
  createdAt: number;
  expiresAt: number;
  /** The token or cookie session it was made from (revoking that one ends this one). */
  parent?: string;
  /** What its lineage rests on. */
  root: { kind: "operator" } | { kind: "access"; email: string } | { kind: "unrecorded" };
  /** Whether it is the credential this page is signed in with. */
  current: boolean;
}

/** `200` of `POST /v1/tokens/revoke-all`. */
export interface RevokedAll {
  sub: string;
  revoked: number;
  sessions: number;
  runnerConnectionsClosed: number;
}

/** `201` of `POST /v1/tokens`: the token, shown this once. */
export interface MintedToken extends TokenInfo {
  token: string;
}

/** `GET /v1/secrets` (never a value). */
export interface SecretInfo {
  name: string;
  scope: "user" | "tenant";
  owner: string | null;
  hosts: string[];
  environments: string[];
  setBy: string;
  setAt: number;
}

/** An MCP server sessions use (`GET /v1/mcp/servers`, docs/mcp.md). */
export interface McpServerInfo {
  name: string;
  source: "tenant" | "user";
  user?: string;
  url: string;
  transport: "streamable-http" | "sse";
  auth: "none" | "bearer" | "oauth";
  secret?: string;
  approval: "auto" | "ask";
  allow: string[];
  deny: string[];
  timeoutSeconds: number;
  /** An OAuth server: whether you connected your account. */
  connected?: boolean;
}

export interface McpServerList {
  servers: McpServerInfo[];
  notOffered: McpServerInfo[];
  errors: string[];
}

export interface McpToolInfo {
  name: string;
  description: string;
  inputSchema: unknown;
  offered: boolean;
}

/** `GET /v1/sessions/:id/usage` (the fields the page shows). */
export interface SessionUsage {
  messages: number;
  inputTokens: number;
  outputTokens: number;
  costUsd: number;
  unpricedMessages: number;
  byModel: { provider: string; model: string; messages: number; inputTokens: number; outputTokens: number; costUsd: number }[];
  policy: { allowed: number; asked: number; denied: number };
  mcp: { calls: number; errors: number };
}

/** `GET /v1/usage`. */
export interface TenantUsage {
  from: number;
  to: number;
  by: "day" | "model" | "user" | "session";
  total: { messages: number; inputTokens: number; outputTokens: number; costUsd: number; unpricedMessages: number };
  groups: { key: string; provider?: string; messages: number; inputTokens: number; outputTokens: number; costUsd: number }[];
  truncated: boolean;
  mcp: { calls: number; errors: number; byServer: { server: string; calls: number }[] };
}

/** `GET|PUT /v1/budget`. */
export interface TenantBudget {
  budget: { maxTokens?: number | null; maxUsd?: number | null } | null;
  spent: { tokens: number; usd: number };
}

/** A row of `GET /v1/llm-logs`. */
export interface LogRecordSummary {
  name: string;
  session: string;
  step: number;
  startedAtMs: number;
  size: number;
}

/** A background job of a session (`GET /v1/sessions/:id/jobs`). */
export interface JobInfo {
  jobId: string;
  runner: string;
  runnerOwner: string;
  environment: string;
  command: string;
  startedAtMs: number;
  state: "running" | "succeeded" | "failed" | "killed";
  reason?: string;
  report?: { exitCode?: number; signal?: number; timedOut: boolean; durationMs: number; totalLines: number; outputTail: string };
}

/** A chat platform binding as the API shows it (`GET /v1/channels`): credentials masked. */
export interface ChannelInfo {
  id: string;
  platform: "slack" | "telegram" | "discord" | "generic";
  name: string;
  admit: string;
  credentials: Record<string, unknown>;
  webhookUrl: string;
  setup: string[];
}

/** A platform user mapped to a Wuhu name (`GET|PUT /v1/channels/:id/members`). */
export interface ChannelMember {
  user: string;
  sub: string;
}
