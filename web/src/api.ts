// JSON calls to the HTTP API (docs/api.md). Errors become `ApiError` with the server's code
// and message, so screens can show them as they are.

import { authHeaders } from "./auth";
import type {
  Doc,
  DocSummary,
  EnvironmentDefinition,
  Lane,
  McpServerInfo,
  McpServerList,
  McpToolInfo,
  MintedToken,
  RevokedAll,
  RunnerInfo,
  SecretInfo,
  SessionInfo,
  SessionPage,
  SessionUsage,
  TenantBudget,
  TenantUsage,
  LogRecordSummary,
  JobInfo,
  ChannelInfo,
  ChannelMember,
  TokenInfo,
} from "./types";

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** Called when the server refuses our credentials (401): the app goes back to sign-in. */
let onUnauthorized: () => void = () => {};
export function setUnauthorizedHandler(handler: () => void) {
  onUnauthorized = handler;
}

export async function request<T>(method: string, path: string, body?: unknown, raw?: string, bearer?: string): Promise<T> {
  const headers: Record<string, string> = { ...authHeaders() };
  if (bearer) headers.authorization = `Bearer ${bearer}`;
  let payload: string | undefined;
  if (raw !== undefined) {
    payload = raw;
    headers["content-type"] = "text/markdown; charset=utf-8";
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers["content-type"] = "application/json";
  }
  const response = await fetch(path, { method, headers, body: payload });
  if (response.status === 204) return undefined as T;
  const text = await response.text();
  let json: any = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    // Not JSON: reported below with the status.
  }
  if (!response.ok) {
    const fallback = `${method} ${path} answered ${response.status}`;
    // A 401 for a token typed in for this one request is about that token, not the page's
    // own session: it does not send the page back to sign-in.
    if (bearer) throw new ApiError(response.status, json?.error?.code ?? "http_error", json?.error?.message ?? fallback);
    throw apiError(response.status, json?.error, fallback);
  }
  return json as T;
}

/**
 * The error of an answer, HTTP or a session socket's reply (docs/api.md: the same
 * `{code, message}` with the same status): a 401 also sends the app back to sign-in.
 */
export function apiError(status: number, error: { code?: string; message?: string } | undefined, fallback: string): ApiError {
  if (status === 401) onUnauthorized();
  return new ApiError(status, error?.code ?? "http_error", error?.message ?? fallback);
}

const enc = encodeURIComponent;

export const api = {
  listSessions: (before?: string) =>
    request<{ sessions: SessionInfo[]; nextBefore: string | null }>(
      "GET",
      `/v1/sessions?limit=100${before ? `&before=${enc(before)}` : ""}`,
    ),
  createSession: (body: { provider?: string; model?: string; systemPrompt?: string; title?: string }) =>
    request<SessionInfo>("POST", "/v1/sessions", body),
  sessionPage: (id: string, sinceCursor: number, limit = 1000) =>
    request<SessionPage>("GET", `/v1/sessions/${enc(id)}?sinceCursor=${sinceCursor}&limit=${limit}`),
  patchSession: (
    id: string,
    body: {
      title?: string;
      access?: "private" | "tenant";
      provider?: string;
      model?: string;
      reasoning?: { effort: "low" | "medium" | "high" } | null;
    },
  ) =>
    request<SessionInfo>("PATCH", `/v1/sessions/${enc(id)}`, body),
  /** `key` names the message: sent again with it, it is queued once (docs/api.md). */
  enqueue: (id: string, lane: Lane, content: string, key?: string) =>
    request<{ id: string }>("POST", `/v1/sessions/${enc(id)}/enqueue?lane=${lane}`, key ? { content, key } : { content }),
  cancel: (id: string, itemId: string) =>
    request<{ id: string; cancelled: boolean }>("POST", `/v1/sessions/${enc(id)}/cancel`, { id: itemId }),
  forkSession: (id: string, atCursor: number) =>
    request<SessionInfo>("POST", `/v1/sessions/${enc(id)}/fork`, { atCursor }),
  compact: (id: string) =>
    request<{ cursor: number; compaction: { tokensBefore: number; firstKeptCursor: number } }>(
      "POST",
      `/v1/sessions/${enc(id)}/compact`,
      {},
    ),
  deleteSession: (id: string) => request<unknown>("DELETE", `/v1/sessions/${enc(id)}`),
  sessionJobs: (id: string) => request<{ jobs: JobInfo[] }>("GET", `/v1/sessions/${enc(id)}/jobs`),
  sessionUsage: (id: string) => request<SessionUsage>("GET", `/v1/sessions/${enc(id)}/usage`),
  stop: (id: string) =>
    request<{ status: string; stoppedToolCalls: number }>("POST", `/v1/sessions/${enc(id)}/stop`, {}),
  answerApproval: (id: string, approvalId: string, decision: "approve" | "approve_session" | "always" | "deny") =>
    request<unknown>("POST", `/v1/sessions/${enc(id)}/approvals/${enc(approvalId)}`, { decision }),
  runners: () => request<{ runners: RunnerInfo[] }>("GET", "/v1/runners"),
  environments: () => request<{ environments: EnvironmentDefinition[] }>("GET", "/v1/environments"),
  createEnvironment: (body: Record<string, unknown>) =>
    request<EnvironmentDefinition>("POST", "/v1/environments", body),
  updateEnvironment: (id: string, body: Record<string, unknown>) =>
    request<EnvironmentDefinition>("PATCH", `/v1/environments/${enc(id)}`, body),
  deleteEnvironment: (id: string) => request<unknown>("DELETE", `/v1/environments/${enc(id)}`),
  listDocs: (prefix: string, cursor?: string) =>
    request<{ docs: DocSummary[]; cursor: string | null }>(
      "GET",
      `/v1/workspace/docs?prefix=${enc(prefix)}${cursor ? `&cursor=${enc(cursor)}` : ""}`,
    ),
  readDoc: (path: string) => request<Doc>("GET", `/v1/workspace/docs/${docPath(path)}`),
  writeDoc: (path: string, content: string) =>
    request<DocSummary>("PUT", `/v1/workspace/docs/${docPath(path)}`, undefined, content),
  deleteDoc: (path: string) => request<unknown>("DELETE", `/v1/workspace/docs/${docPath(path)}`),
  listTokens: (all = false) => request<{ tokens: TokenInfo[] }>("GET", `/v1/tokens${all ? "?all=1" : ""}`),
  /**
   * A cookie session cannot mint (docs/security.md, "Token lineage"): the page sends the token
   * the person signed in with, typed again (`confirmToken`), as `Authorization: Bearer` for
   * this one request, and keeps it nowhere. Behind Access none is needed, only a recent sign-in.
   */
  mintToken: (
    body: { name: string; kind: "user" | "runner"; ttlDays: number; sub?: string; runnerKind?: "cloud" },
    confirmToken?: string,
  ) => request<MintedToken>("POST", "/v1/tokens", body, undefined, confirmToken?.trim().replace(/^Bearer\s+/i, "") || undefined),
  revokeToken: (jti: string) =>
    request<{ jti: string; revoked: boolean; alsoRevoked: number }>("DELETE", `/v1/tokens/${enc(jti)}`),
  listSecrets: () => request<{ secrets: SecretInfo[] }>("GET", "/v1/secrets"),
  mcpServers: () => request<McpServerList>("GET", "/v1/mcp/servers"),
  tenantUsage: (by: "day" | "model" | "user" | "session", from?: number) =>
    request<TenantUsage>("GET", `/v1/usage?by=${by}${from !== undefined ? `&from=${from}` : ""}`),
  budget: () => request<TenantBudget>("GET", "/v1/budget"),
  channels: () => request<{ channels: ChannelInfo[] }>("GET", "/v1/channels"),
  createChannel: (body: unknown) => request<ChannelInfo>("POST", "/v1/channels", body),
  deleteChannel: (id: string) => request<unknown>("DELETE", `/v1/channels/${enc(id)}`),
  channelMembers: (id: string) => request<{ members: ChannelMember[] }>("GET", `/v1/channels/${enc(id)}/members`),
  setChannelMembers: (id: string, members: ChannelMember[]) =>
    request<{ members: ChannelMember[] }>("PUT", `/v1/channels/${enc(id)}/members`, { members }),
  putBudget: (body: { maxTokens?: number; maxUsd?: number }) => request<TenantBudget>("PUT", "/v1/budget", body),
  llmLogs: (after?: string) =>
    request<{ records: LogRecordSummary[]; nextAfter?: string }>("GET", `/v1/llm-logs?limit=100${after ? `&after=${enc(after)}` : ""}`),
  llmLog: (name: string) => request<unknown>("GET", `/v1/llm-logs/${name.split("/").map(enc).join("/")}`),
  mcpConnect: (name: string) =>
    request<{ authorizationUrl: string; expiresAt: number }>("POST", `/v1/mcp/servers/${enc(name)}/connect`, {}),
  mcpFinish: (state: string) => request<{ server: string }>("POST", "/v1/mcp/finish", { state }),
  mcpDisconnect: (name: string) =>
    request<{ disconnected: boolean }>("DELETE", `/v1/mcp/servers/${enc(name)}/connection`),
  mcpTools: (name: string) =>
    request<{ server: McpServerInfo; tools: McpToolInfo[]; truncated: boolean }>("GET", `/v1/mcp/servers/${enc(name)}/tools`),
  putSecret: (name: string, body: { value: string; scope: "user" | "tenant"; environments: string[]; hosts: string[] }) =>
    request<SecretInfo>("PUT", `/v1/secrets/${enc(name)}`, body),
  deleteSecret: (name: string, scope: "user" | "tenant") =>
    request<unknown>("DELETE", `/v1/secrets/${enc(name)}?scope=${scope}`),
  /** Ends every registered credential of the caller (this page's cookie session included). */
  revokeAll: () => request<RevokedAll>("POST", "/v1/tokens/revoke-all", {}),
};

/** A workspace path with each segment percent-encoded (the server decodes per segment). */
function docPath(path: string): string {
  return path.split("/").map(enc).join("/");
}
