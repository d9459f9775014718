// A session view's link to the server: the session's events, and its requests (enqueue, stop,
// cancel). It prefers the session socket (`GET /v1/sessions/:id/socket`, docs/api.md): one
// connection for both directions that ends in the session's actor, where the EventSource + HTTP
// pair crosses the router for every chunk and every request. The cookie session authenticates
// the upgrade as it does the EventSource (the browser sends the cookie and `Origin`, which the
// server's cross-site check wants).
//
// - Resuming: every `entry_appended` carries its cursor; a socket that closes after it opened is
//   opened again with `?after=<last cursor>`, after a capped backoff, and the server replays
//   every later entry exactly once (deltas are not replayed; the finished message is).
// - Fallback: a socket that closes before it ever opened (a proxy that cannot carry WebSockets,
//   an upgrade the server refused: 401, 404, 429) hands over to `follow.ts`'s EventSource from the
//   last cursor, and requests go over HTTP, for the rest of this view. The EventSource already
//   handles each refusal (a 401 goes back to sign-in) and resumes with `Last-Event-ID`.
// - Acks: the server sends a socket's events only while fewer than 256 frames and 256 KiB are
//   unacknowledged, so the page acks what it has read every 64 frames or 64 KiB (a quarter of
//   that window, as docs/api.md asks) and within ACK_IDLE_MS of any frame, so a quiet page owes
//   nothing.
// - Requests: each frame carries an id the reply echoes. A request made while no socket is open,
//   or too long for a socket frame, goes over HTTP instead (same rules, same answers). A request whose socket closes before its
//   reply is retried over HTTP, which is harmless: stop and cancel repeat safely, and each
//   message is named by a key of its own (`body.key`), so the server queues it once however
//   often it arrives and answers a repeat as it answered the first.

import { ApiError, api, apiError, request } from "./api";
import { follow, type FollowHandlers } from "./follow";
import type { FollowEvent, Lane } from "./types";

/** Which door the view's events and requests go through. */
export type Transport = "socket" | "sse";

export interface LinkHandlers extends FollowHandlers {
  /** A socket opened, or the link fell back to the EventSource. */
  onTransport(transport: Transport): void;
  /** An error reply no request waits for (`id: null`: a frame the server could not read). */
  onError(error: ApiError): void;
}

export interface SessionLink {
  enqueue(lane: Lane, content: string): Promise<{ id: string }>;
  cancel(itemId: string): Promise<{ id: string; cancelled: boolean }>;
  stop(): Promise<{ status: string; stoppedToolCalls: number }>;
  /** Stops for good. */
  close(): void;
}

/** Backoff before opening a socket again after one closed, capped; reset once events flow. */
const RETRY_MS = [1000, 2000, 4000, 8000];
/** docs/api.md: every client acks at least every 64 frames and 64 KiB received. */
const ACK_EVERY_FRAMES = 64;
const ACK_EVERY_BYTES = 64 * 1024;
/** A frame is acked at most this long after it arrived, even in a trickle. */
const ACK_IDLE_MS = 100;
/** docs/api.md: the socket refuses larger client frames (413); HTTP bodies may be 1 MiB. */
const MAX_CLIENT_FRAME_BYTES = 256 * 1024;

/** What the view is told when a socket closed with one of the server's codes (docs/api.md). */
const CLOSED_BECAUSE: Record<number, string> = {
  4401: "your sign-in was revoked or expired",
  4404: "the session was deleted",
  4429: "the page fell behind; catching up",
};

interface Pending {
  resolve(body: any): void;
  reject(error: Error): void;
  /** What to do when the socket closed before the reply: retry over HTTP, or fail. */
  lost(): Promise<any>;
}

/** Follows the session after `sinceCursor` and carries its requests; see the module docs. */
export function linkSession(sessionId: string, sinceCursor: number, handlers: LinkHandlers): SessionLink {
  let lastCursor = sinceCursor;
  let closed = false;
  let socket: WebSocket | null = null;
  let stopFollowing: (() => void) | null = null; // set once fallen back to the EventSource
  let attempt = 0;
  let retryTimer: number | undefined;
  let ackTimer: number | undefined;
  let nextId = 0;
  const pending = new Map<string, Pending>();

  // The same dedupe as follow.ts: an entry at or below the last cursor was already shown.
  const deliver = (event: FollowEvent) => {
    if (event.type === "entry_appended") {
      if (event.entry.cursor <= lastCursor) return;
      lastCursor = event.entry.cursor;
    }
    if (event.type === "lagged") lastCursor = Math.max(lastCursor, event.cursor);
    handlers.onEvent(event);
  };

  const fallBack = () => {
    handlers.onTransport("sse");
    stopFollowing = follow(sessionId, lastCursor, { onEvent: deliver, onConnection: handlers.onConnection });
  };

  const open = () => {
    if (closed) return;
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${scheme}//${location.host}/v1/sessions/${encodeURIComponent(sessionId)}/socket?after=${lastCursor}`);
    socket = ws;
    let opened = false;
    // The server counts the text frames it sent on this socket; so do we, from 1.
    let received = 0;
    let acked = 0;
    let unackedBytes = 0;
    const ack = () => {
      window.clearTimeout(ackTimer);
      ackTimer = undefined;
      if (received === acked || ws.readyState !== WebSocket.OPEN) return;
      ws.send(JSON.stringify({ type: "ack", received }));
      acked = received;
      unackedBytes = 0;
    };

    ws.onopen = () => {
      opened = true;
      handlers.onTransport("socket");
      handlers.onConnection("live", `following from #${lastCursor} over a socket`);
    };
    ws.onmessage = (message) => {
      if (typeof message.data !== "string") return; // the server sends text only
      // A message carries one or more frames, one JSON object per line; each counts.
      for (const line of message.data.split("\n")) {
        if (!line) continue;
        received += 1;
        // The server counts UTF-8 bytes; a UTF-16 unit is at most 3 of them, so this
        // overcounts (acks early, which is harmless) and never needs an encoder.
        unackedBytes += line.length * 3;
        let frame: any;
        try {
          frame = JSON.parse(line);
        } catch {
          frame = null;
        }
        if (frame?.type === "reply") settle(frame);
        else if (frame) {
          if (frame.type === "status") attempt = 0; // the backfill is in: this socket works
          deliver(frame as FollowEvent);
        }
      }
      if (received - acked >= ACK_EVERY_FRAMES || unackedBytes >= ACK_EVERY_BYTES) ack();
      else if (ackTimer === undefined) ackTimer = window.setTimeout(ack, ACK_IDLE_MS);
    };
    ws.onclose = (event) => {
      if (socket === ws) socket = null;
      window.clearTimeout(ackTimer);
      ackTimer = undefined;
      for (const [id, request] of pending) {
        pending.delete(id);
        request.lost().then(request.resolve, request.reject);
      }
      if (closed) return;
      if (!opened) {
        fallBack();
        return;
      }
      const why = CLOSED_BECAUSE[event.code] ?? "the connection dropped";
      // A revoked credential: asking who we are gets the 401 that sends the app to sign-in
      // (which closes this link). A deleted session will not come back. Anything else resumes
      // from the last cursor.
      if (event.code === 4401) void request("GET", "/v1/auth/me").catch(() => {});
      if (event.code === 4404) {
        handlers.onConnection("reconnecting", why);
        return;
      }
      const wait = event.code === 4429 ? 0 : RETRY_MS[Math.min(attempt, RETRY_MS.length - 1)];
      attempt += 1;
      handlers.onConnection("reconnecting", `${why}; reconnecting${wait ? ` in ${wait / 1000}s` : ""}`);
      retryTimer = window.setTimeout(open, wait);
    };
  };

  const settle = (reply: { id: string | null; status: number; body?: any; error?: { code: string; message: string } }) => {
    const request = reply.id === null ? undefined : pending.get(reply.id);
    if (reply.id !== null) pending.delete(reply.id);
    if (reply.status >= 200 && reply.status < 300) {
      request?.resolve(reply.body);
      return;
    }
    const error = apiError(reply.status, reply.error, `the server answered ${reply.status}`);
    if (request) request.reject(error);
    else handlers.onError(error);
  };

  /** Sends `frame` over the open socket, or the request over HTTP when there is none. */
  const send = <T>(frame: Record<string, unknown>, http: () => Promise<T>, lost: () => Promise<T>): Promise<T> => {
    const ws = socket;
    if (!ws || ws.readyState !== WebSocket.OPEN) return http();
    const id = `r${++nextId}`;
    const text = JSON.stringify({ ...frame, id });
    // A message too long for a socket frame still fits an HTTP body: send it there.
    if (text.length > MAX_CLIENT_FRAME_BYTES / 3 && new TextEncoder().encode(text).length > MAX_CLIENT_FRAME_BYTES) return http();
    return new Promise<T>((resolve, reject) => {
      pending.set(id, { resolve, reject, lost });
      ws.send(text);
    });
  };

  handlers.onConnection("connecting", "");
  open();

  return {
    enqueue: (lane, content) => {
      // The message's name: whichever door it goes through, and however often (a retry after a
      // lost reply), it is queued once.
      const key = crypto.randomUUID();
      const http = () => api.enqueue(sessionId, lane, content, key);
      return send({ type: "enqueue", lane, body: { content, key } }, http, http);
    },
    cancel: (itemId) => {
      const http = () => api.cancel(sessionId, itemId);
      // Cancelling twice is harmless: a 404 on the retry means the first one went through (the
      // page only offers items it saw queued), which is the answer the caller wanted.
      const retry = () =>
        http().catch((err) => {
          if (err instanceof ApiError && err.status === 404) return { id: itemId, cancelled: true };
          throw err;
        });
      return send({ type: "cancel", body: { id: itemId } }, http, retry);
    },
    stop: () => {
      // Stopping twice is harmless: a stopped session answers the same.
      const http = () => api.stop(sessionId);
      return send({ type: "stop" }, http, http);
    },
    close: () => {
      closed = true;
      window.clearTimeout(retryTimer);
      window.clearTimeout(ackTimer);
      socket?.close(1000);
      stopFollowing?.();
    },
  };
}
