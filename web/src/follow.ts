// Follows a session's event stream (`GET /v1/sessions/:id/follow`) with a plain EventSource: the
// cookie session authenticates it, and the browser reconnects by itself with `Last-Event-ID`,
// from which the server replays every later entry exactly once. When the browser gives up (the
// server refused the stream: an HTTP error rather than a drop), this module opens a new one from
// the last cursor it saw, after a backoff. The session view uses it through link.ts, when a
// session socket cannot be opened.

import { request } from "./api";
import type { FollowEvent } from "./types";

/** `connecting`: the first attempt; `live`: events flow; `reconnecting`: it dropped and we retry. */
export type Connection = "connecting" | "live" | "reconnecting";

export interface FollowHandlers {
  onEvent(event: FollowEvent): void;
  onConnection(state: Connection, detail: string): void;
}

/** Backoff before a new EventSource after the browser gave up on one, capped. */
const RETRY_MS = [1000, 2000, 4000, 8000];

const EVENTS = ["entry_appended", "assistant_text_delta", "status", "idle", "done", "lagged", "error"] as const;

/** Starts following after `sinceCursor`; returns a function that stops for good. */
export function follow(sessionId: string, sinceCursor: number, handlers: FollowHandlers): () => void {
  let lastCursor = sinceCursor;
  let stopped = false;
  let source: EventSource | null = null;
  let attempt = 0;
  let timer: number | undefined;

  const open = () => {
    if (stopped) return;
    const es = new EventSource(`/v1/sessions/${encodeURIComponent(sessionId)}/follow?sinceCursor=${lastCursor}`);
    source = es;
    es.onopen = () => {
      attempt = 0;
      handlers.onConnection("live", `following from #${lastCursor}`);
    };
    for (const name of EVENTS) {
      es.addEventListener(name, (raw) => {
        // The server's own `error` frame is a MessageEvent with data; a connection failure
        // is a plain Event, handled below.
        if (!(raw instanceof MessageEvent)) return;
        let event: FollowEvent;
        try {
          event = JSON.parse(raw.data) as FollowEvent;
        } catch {
          return;
        }
        if (event.type === "entry_appended") {
          if (event.entry.cursor <= lastCursor) return;
          lastCursor = event.entry.cursor;
        }
        if (event.type === "lagged") lastCursor = Math.max(lastCursor, event.cursor);
        handlers.onEvent(event);
      });
    }
    es.addEventListener("error", (raw) => {
      if (raw instanceof MessageEvent || stopped) return;
      if (es.readyState === EventSource.CONNECTING) {
        handlers.onConnection("reconnecting", "the stream dropped; the browser is reconnecting");
        return;
      }
      // CLOSED: the browser gave up (an HTTP error). Open a new stream later. If the refusal
      // was a 401 (the session was revoked or signed out elsewhere, which also ends an open
      // stream), asking who we are sends the app back to sign-in, which stops this follower.
      es.close();
      void request("GET", "/v1/auth/me").catch(() => {});
      const wait = RETRY_MS[Math.min(attempt, RETRY_MS.length - 1)];
      attempt += 1;
      handlers.onConnection("reconnecting", `the server refused the stream; retrying in ${wait / 1000}s`);
      timer = window.setTimeout(open, wait);
    });
  };

  handlers.onConnection("connecting", "");
  open();
  return () => {
    stopped = true;
    if (timer !== undefined) window.clearTimeout(timer);
    source?.close();
  };
}
