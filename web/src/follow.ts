// Follows a session's event stream (`GET /v1/sessions/:id/follow`) and keeps following: when the
// connection drops it reconnects with `sinceCursor` set to the last entry it saw, so nothing is
// lost or repeated (the server replays every later entry exactly once). The stream is read with
// fetch because it carries the bearer token from auth.ts; a plain EventSource (which
// reconnects by itself with `Last-Event-ID`) needs the cookie session.

import { authHeaders } from "./auth";
import { SseParser } from "./sse";
import type { FollowEvent } from "./types";

/** `connecting`: the first attempt; `live`: events flow; `reconnecting`: it dropped and we retry. */
export type Connection = "connecting" | "live" | "reconnecting";

export interface FollowHandlers {
  onEvent(event: FollowEvent): void;
  onConnection(state: Connection, detail: string): void;
}

/** Backoff between attempts after a drop, capped. */
const RETRY_MS = [250, 1000, 2000, 4000, 8000];

/** Starts following after `sinceCursor`; returns a function that stops for good. */
export function follow(sessionId: string, sinceCursor: number, handlers: FollowHandlers): () => void {
  let lastCursor = sinceCursor;
  let stopped = false;
  let controller: AbortController | null = null;
  let attempt = 0;
  let timer: number | undefined;

  const run = async () => {
    if (stopped) return;
    controller = new AbortController();
    let reason = "the stream ended";
    let opened = false;
    try {
      const response = await fetch(
        `/v1/sessions/${encodeURIComponent(sessionId)}/follow?sinceCursor=${lastCursor}`,
        { headers: { ...authHeaders(), accept: "text/event-stream" }, signal: controller.signal },
      );
      if (!response.ok || !response.body) {
        reason = `the server answered ${response.status}`;
        throw new Error(reason);
      }
      opened = true;
      attempt = 0;
      handlers.onConnection("live", `following from #${lastCursor}`);
      const parser = new SseParser();
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        for (const frame of parser.push(value)) {
          let event: FollowEvent;
          try {
            event = JSON.parse(frame.data) as FollowEvent;
          } catch {
            continue;
          }
          if (event.type === "entry_appended") {
            // Entries arrive in cursor order; an older one (never expected) is not replayed.
            if (event.entry.cursor <= lastCursor) continue;
            lastCursor = event.entry.cursor;
          }
          if (event.type === "lagged") {
            // The server closes a stream that fell too far behind; resume from what it covered.
            lastCursor = Math.max(lastCursor, event.cursor);
            reason = "the stream fell behind";
          }
          if (event.type === "error") reason = event.message;
          handlers.onEvent(event);
        }
      }
    } catch (error) {
      if (stopped) return;
      if (!opened && reason === "the stream ended") reason = String((error as Error)?.message ?? error);
    }
    if (stopped) return;
    const wait = RETRY_MS[Math.min(attempt, RETRY_MS.length - 1)];
    attempt += 1;
    handlers.onConnection("reconnecting", `${reason}; reconnecting in ${Math.round(wait / 100) / 10}s`);
    timer = window.setTimeout(run, wait);
  };

  handlers.onConnection("connecting", "");
  void run();
  return () => {
    stopped = true;
    if (timer !== undefined) window.clearTimeout(timer);
    controller?.abort();
  };
}
