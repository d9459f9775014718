// Turns transcript entries into what the chat view shows: assistant messages with their tool
// calls paired with the results, approval requests with their decisions, notices. Pure: no DOM.

import type { Entry, Message, ToolCall } from "./types";

export const APPROVAL_REQUEST = "wuhu_approval_request_v1";
export const APPROVAL_DECISION = "wuhu_approval_decision_v1";
export const LLM_ERROR = "wuhu_llm_error_v1";

export type ToolResultMessage = Extract<Message, { role: "tool_result" }>;

export interface ToolCallView {
  call: ToolCall;
  result: ToolResultMessage | null;
}

export interface ApprovalView {
  approvalId: string;
  /** What people read: who asks to do what, where (`summary`); the model's `text` for requests from before it existed. */
  text: string;
  /** The file the call touches, when it names one. */
  path: string | null;
  tool: string;
  approver: { kind: string; sub: string } | null;
  expiresAt: number | null;
  decision: string | null;
  decidedBy: string | null;
  /** Whether "approve for this session" may answer it (not for a request that acts for a guest). */
  sessionApproval: boolean;
  /** What a policy's ask is about, shown as is: the command, the diff, the written content or the URL. */
  detail: string | null;
  /** Whether "always" may answer it: a policy's ask about the approver's own machine. */
  always: boolean;
}

/** The exact thing a policy rule asks about (`wuhu_approval_request_v1` of an ask). */
function approvalDetail(data: Record<string, unknown>): string | null {
  for (const key of ["diff", "command", "content", "url"]) {
    if (typeof data[key] === "string") return data[key] as string;
  }
  return null;
}

export type Item =
  | { kind: "header"; entry: Entry; systemPrompt: string; provider: string; model: string }
  | { kind: "user"; entry: Entry; author: string; content: string; lane: string | null }
  | { kind: "assistant"; entry: Entry; text: string; thinking: string; calls: ToolCallView[] }
  | { kind: "tool_result"; entry: Entry; result: ToolResultMessage }
  | { kind: "context"; entry: Entry; customType: string; content: string }
  | { kind: "approval"; entry: Entry; approval: ApprovalView }
  | { kind: "notice"; entry: Entry; customType: string; text: string; error: boolean };

/** Adds `entries` to `byCursor` (a cursor seen before is kept as it was); returns whether anything was new. */
export function mergeEntries(byCursor: Map<number, Entry>, entries: Entry[]): boolean {
  let changed = false;
  for (const entry of entries) {
    if (!byCursor.has(entry.cursor)) {
      byCursor.set(entry.cursor, entry);
      changed = true;
    }
  }
  return changed;
}

export function sortedEntries(byCursor: Map<number, Entry>): Entry[] {
  return [...byCursor.values()].sort((a, b) => a.cursor - b.cursor);
}

/** The chat items of a transcript, in order. */
export function buildItems(entries: Entry[]): Item[] {
  const results = new Map<string, ToolResultMessage>();
  const decisions = new Map<string, { decision: string; by: string | null }>();
  for (const entry of entries) {
    if (entry.type === "message" && entry.message.role === "tool_result") {
      results.set(entry.message.toolCallId, entry.message);
    }
    if (entry.type === "custom" && entry.custom_type === APPROVAL_DECISION && entry.data) {
      const id = String(entry.data.approvalId ?? "");
      decisions.set(id, { decision: String(entry.data.decision ?? ""), by: (entry.data.by as string) ?? null });
    }
  }
  const paired = new Set<string>();
  const items: Item[] = [];
  for (const entry of entries) {
    if (entry.type === "header") {
      items.push({ kind: "header", entry, systemPrompt: entry.systemPrompt, provider: entry.provider, model: entry.model });
    } else if (entry.type === "message") {
      const m = entry.message;
      if (m.role === "user") {
        items.push({ kind: "user", entry, author: m.author, content: m.content, lane: m.lane ?? null });
      } else if (m.role === "assistant") {
        const text = m.content.map((b) => (b.type === "text" ? b.text : "")).join("");
        // What the model shows of its reasoning (Anthropic thinking, OpenAI reasoning summaries).
        const thinking = m.content
          .map((b) => (b.type === "thinking" ? b.thinking : b.type === "reasoning" ? (b.summary ?? "") : ""))
          .filter((t) => t)
          .join("\n\n");
        const calls: ToolCallView[] = m.content
          .filter((b) => b.type === "tool_call")
          .map((b) => {
            const call = b as ToolCall;
            const result = results.get(call.id) ?? null;
            if (result) paired.add(call.id);
            return { call: { id: call.id, name: call.name, arguments: call.arguments }, result };
          });
        items.push({ kind: "assistant", entry, text, thinking, calls });
      } else if (m.role === "tool_result") {
        if (!paired.has(m.toolCallId)) items.push({ kind: "tool_result", entry, result: m });
      } else {
        items.push({ kind: "context", entry, customType: m.customType, content: m.content });
      }
    } else {
      const data = entry.data ?? {};
      if (entry.custom_type === APPROVAL_REQUEST) {
        const approvalId = String(data.approvalId ?? "");
        const decided = decisions.get(approvalId);
        items.push({
          kind: "approval",
          entry,
          approval: {
            approvalId,
            text: String(data.summary ?? data.text ?? `Approval needed for ${String(data.tool ?? "a tool call")}`),
            path: typeof data.path === "string" ? data.path : null,
            tool: String(data.tool ?? ""),
            approver: (data.approver as ApprovalView["approver"]) ?? null,
            // Requests from before scoped grants have no field: offered, as they were.
            sessionApproval: data.sessionApproval !== null,
            expiresAt: typeof data.expiresAt === "number" ? data.expiresAt : null,
            decision: decided?.decision ?? null,
            decidedBy: decided?.by ?? null,
            detail: approvalDetail(data),
            always: data.always !== undefined && data.always !== null,
          },
        });
      } else {
        items.push({
          kind: "notice",
          entry,
          customType: entry.custom_type,
          text: noticeText(entry.custom_type, data),
          error: entry.custom_type === LLM_ERROR,
        });
      }
    }
  }
  return items;
}

function noticeText(customType: string, data: Record<string, unknown>): string {
  if (typeof data.text === "string") return data.text;
  switch (customType) {
    case "wuhu_execution_stopped_v1":
      return `Stopped by ${String(data.by ?? "someone")}` +
        (data.stoppedToolCalls ? ` (${String(data.stoppedToolCalls)} tool call(s) stopped)` : "");
    case LLM_ERROR:
      return `Model error${data.status ? ` ${String(data.status)}` : ""}: ${String(data.message ?? "")}` +
        (data.willRetry ? ` (attempt ${String(data.attempt ?? "?")}, retrying)` : "");
    case APPROVAL_DECISION:
      return `Approval ${String(data.approvalId ?? "")}: ${String(data.decision ?? "")}` +
        (data.by ? ` by ${String(data.by)}` : "");
    default:
      return customType;
  }
}

/** Text of a tool call's arguments for display. */
export function formatArguments(args: unknown): string {
  if (typeof args === "string") return args;
  return JSON.stringify(args, null, 2);
}
