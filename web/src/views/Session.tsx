import { useCallback, useEffect, useMemo, useRef, useState } from "preact/hooks";
import { AnsiUp } from "ansi_up";
import { api } from "../api";
import type { Identity } from "../auth";
import type { Connection } from "../follow";
import { linkSession, type SessionLink, type Transport } from "../link";
import { renderMarkdown } from "../markdown";
import { buildItems, formatArguments, mergeEntries, sortedEntries, type ApprovalView, type Item } from "../transcript";
import type { Attachment, BlobRef, ChildInfo, JobInfo, Entry, FollowEvent, Lane, QueueItem, RunnerInfo, SessionInfo, SessionUsage } from "../types";
import { ErrorLine, StatusBadge, errorText, timeAgo, timeUntil } from "../util";

export function SessionView({ id, me }: { id: string; me: Identity }) {
  const entries = useRef(new Map<number, Entry>());
  const delivered = useRef(new Set<string>());
  const [version, setVersion] = useState(0);
  const [session, setSession] = useState<SessionInfo | null>(null);
  const [queue, setQueue] = useState<QueueItem[]>([]);
  const [children, setChildren] = useState<ChildInfo[]>([]);
  const [jobs, setJobs] = useState<JobInfo[]>([]);
  // Output of the tool calls still running (`tool_output_delta`), by call id: each call's last
  // LIVE_OUTPUT_CHARS, dropped when its result arrives (the result is the source of truth).
  const [live, setLive] = useState<Record<string, string>>({});
  // What the model is writing before its entry: thinking, and the calls it is composing.
  const [thinking, setThinking] = useState("");
  const [composing, setComposing] = useState<string[]>([]);
  const [attached, setAttached] = useState<Attachment[]>([]);
  const [runners, setRunners] = useState<RunnerInfo[]>([]);
  const [streaming, setStreaming] = useState("");
  const [connection, setConnection] = useState<{ state: Connection; detail: string }>({ state: "connecting", detail: "" });
  const [transport, setTransport] = useState<Transport | null>(null);
  // Events and requests go through the link once the transcript is loaded; before that,
  // requests go over HTTP.
  const link = useRef<SessionLink | null>(null);
  const [resumed, setResumed] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [loaded, setLoaded] = useState(false);
  const scroller = useRef<HTMLDivElement>(null);
  const stickToBottom = useRef(true);

  const lastCursor = () => Math.max(0, ...entries.current.keys());

  // Session, queue and attached environments come with a transcript page: one entry's worth
  // is the cheapest way to refresh them.
  const refreshing = useRef(false);
  const refreshMeta = useCallback(async () => {
    if (refreshing.current) return;
    refreshing.current = true;
    try {
      const page = await api.sessionPage(id, lastCursor(), 1);
      setSession(page.session);
      setQueue(page.queue.filter((q) => !delivered.current.has(q.id)));
      setAttached(page.environments ?? []);
      setChildren(page.children ?? []);
      setJobs((await api.sessionJobs(id)).jobs);
    } catch (err) {
      setError(errorText(err));
    } finally {
      refreshing.current = false;
    }
  }, [id]);

  const addEntries = useCallback((list: Entry[]) => {
    for (const entry of list) {
      if (entry.type === "message" && entry.message.role === "user" && entry.message.queueItemId) {
        delivered.current.add(entry.message.queueItemId);
      }
    }
    if (mergeEntries(entries.current, list)) setVersion((v) => v + 1);
    setQueue((q) => q.filter((item) => !delivered.current.has(item.id)));
  }, []);

  useEffect(() => {
    let cancelled = false;
    let wasLive = false;
    let resumedTimer: number | undefined;
    const onEvent = (event: FollowEvent) => {
      switch (event.type) {
        case "entry_appended": {
          addEntries([event.entry]);
          const e = event.entry;
          if (e.type === "message" && e.message.role === "assistant") {
            setStreaming("");
            setThinking("");
            setComposing([]);
          }
          if (e.type === "message" && e.message.role === "tool_result") {
            const done = e.message.toolCallId;
            setLive((l) => {
              if (!(done in l)) return l;
              const { [done]: _, ...rest } = l;
              return rest;
            });
          }
          if (e.type === "custom" && /environment_(attached|detached)/.test(e.custom_type)) void refreshMeta();
          break;
        }
        case "assistant_text_delta":
          setStreaming((s) => s + event.delta);
          break;
        case "thinking_delta":
          setThinking((t) => (t + event.delta).slice(-LIVE_OUTPUT_CHARS));
          break;
        case "tool_call_delta":
          setComposing((c) => (c.includes(event.name) ? c : [...c, event.name]));
          break;
        case "tool_output_delta":
          setLive((l) => ({ ...l, [event.callId]: ((l[event.callId] ?? "") + event.text).slice(-LIVE_OUTPUT_CHARS) }));
          break;
        // Everyone viewing the session sees what others queue, live (the preview is the
        // message's first 200 characters; a reload shows it whole).
        case "queue_item_added":
          if (!delivered.current.has(event.id)) {
            setQueue((q) =>
              q.some((item) => item.id === event.id)
                ? q
                : [...q, { id: event.id, lane: event.lane, author: event.author, content: event.preview, enqueuedAt: Date.now() / 1000 }],
            );
          }
          break;
        // A child's lifecycle, live: the newer report (by the child's cursor) wins.
        case "child_status":
          setChildren((list) => {
            const known = list.find((c) => c.id === event.child.id);
            if (known && known.cursor > event.child.cursor) return list;
            return known ? list.map((c) => (c.id === event.child.id ? event.child : c)) : [...list, event.child];
          });
          break;
        case "queue_item_removed":
          if (event.reason === "delivered") delivered.current.add(event.id);
          setQueue((q) => q.filter((item) => item.id !== event.id));
          break;
        case "status":
          setSession((s) => (s ? { ...s, status: event.status } : s));
          if (event.status !== "running") setStreaming("");
          break;
        case "idle":
          setStreaming("");
          void refreshMeta();
          break;
        default:
          break;
      }
    };
    (async () => {
      try {
        let since = 0;
        for (;;) {
          const page = await api.sessionPage(id, since);
          if (cancelled) return;
          addEntries(page.transcript);
          setSession(page.session);
          setQueue(page.queue.filter((q) => !delivered.current.has(q.id)));
          setAttached(page.environments ?? []);
          setChildren(page.children ?? []);
          if (page.nextCursor === null || page.nextCursor === undefined) break;
          since = page.nextCursor;
        }
        setLoaded(true);
        api.sessionJobs(id).then(
          (listed) => !cancelled && setJobs(listed.jobs),
          (err) => setError(errorText(err)),
        );
        link.current = linkSession(id, lastCursor(), {
          onEvent,
          onTransport: setTransport,
          onError: (err) => setError(errorText(err)),
          onConnection: (state, detail) => {
            setConnection({ state, detail });
            if (state === "live") {
              if (wasLive) {
                // Deltas sent while we were away are gone; the finished message arrives as an entry.
                setStreaming("");
                setResumed(`Reconnected: caught up from #${lastCursor()}`);
                window.clearTimeout(resumedTimer);
                resumedTimer = window.setTimeout(() => setResumed(null), 6000);
                void refreshMeta();
              }
              wasLive = true;
            }
          },
        });
      } catch (err) {
        setError(errorText(err));
      }
    })();
    api.runners().then((r) => !cancelled && setRunners(r.runners)).catch(() => {});
    return () => {
      cancelled = true;
      window.clearTimeout(resumedTimer);
      link.current?.close();
      link.current = null;
    };
  }, [id, addEntries, refreshMeta]);

  const items = useMemo(() => buildItems(sortedEntries(entries.current)), [version]);

  // Keep the newest message in view unless the person scrolled up to read.
  useEffect(() => {
    const el = scroller.current;
    if (el && stickToBottom.current) el.scrollTop = el.scrollHeight;
  }, [items, streaming]);
  const onScroll = () => {
    const el = scroller.current;
    if (el) stickToBottom.current = el.scrollHeight - el.scrollTop - el.clientHeight < 80;
  };

  const enqueue = async (lane: Lane, content: string) => {
    const { id: itemId } = await (link.current?.enqueue(lane, content) ?? api.enqueue(id, lane, content));
    if (!delivered.current.has(itemId)) {
      setQueue((q) =>
        q.some((x) => x.id === itemId)
          ? q
          : [...q, { id: itemId, lane, content, author: me.sub, enqueuedAt: Date.now() / 1000 }],
      );
    }
    stickToBottom.current = true;
    void refreshMeta();
  };
  const cancel = async (itemId: string) => {
    try {
      await (link.current?.cancel(itemId) ?? api.cancel(id, itemId));
      setQueue((q) => q.filter((x) => x.id !== itemId));
    } catch (err) {
      setError(errorText(err));
      void refreshMeta();
    }
  };
  const stop = async () => {
    try {
      await (link.current?.stop() ?? api.stop(id));
      void refreshMeta();
    } catch (err) {
      setError(errorText(err));
    }
  };

  return (
    // `data-transport` says which door the view uses: `socket` once one opened, `sse` once it
    // fell back (the browser test reads it).
    <section class="session-page" data-transport={transport ?? undefined}>
      <SessionHead session={session} onStop={stop} onChanged={setSession} onError={setError} />
      <ConnectionLine connection={connection} resumed={resumed} />
      <ErrorLine error={error} />
      <div class="session-body">
        <div class="chat" ref={scroller} onScroll={onScroll} aria-label="Transcript" role="log" data-testid="transcript">
          {!loaded && <p class="muted">Loading transcript…</p>}
          {items.map((item) => (
            <ItemView key={item.entry.cursor} item={item} sessionId={id} live={live} />
          ))}
          {(thinking || composing.length > 0) && (
            <div class="msg assistant streaming" data-testid="composing">
              {thinking && <div class="thinking-live muted small">{thinking}</div>}
              {composing.length > 0 && <div class="muted small">writing {composing.join(", ")}…</div>}
            </div>
          )}
          {streaming && (
            <div class="msg assistant streaming" data-testid="streaming" aria-live="polite">
              <div class="who">assistant</div>
              <div class="md" dangerouslySetInnerHTML={{ __html: renderMarkdown(streaming) }} />
            </div>
          )}
          {session?.status === "running" && !streaming && <p class="muted working">Working…</p>}
        </div>
        <aside class="side">
          <QueuePanel queue={queue} onCancel={cancel} />
          {children.length > 0 && <ChildrenPanel children={children} />}
          {jobs.length > 0 && <JobsPanel jobs={jobs} />}
          <EnvironmentsPanel attached={attached} runners={runners} />
        </aside>
      </div>
      <Composer onSend={enqueue} running={session?.status === "running"} />
    </section>
  );
}

function SessionHead({
  session,
  onStop,
  onChanged,
  onError,
}: {
  session: SessionInfo | null;
  onStop: () => void;
  onChanged: (s: SessionInfo) => void;
  onError: (e: string | null) => void;
}) {
  const [editing, setEditing] = useState(false);
  const [title, setTitle] = useState("");
  if (!session) return <div class="session-head" />;
  const save = async (e: Event) => {
    e.preventDefault();
    try {
      onChanged(await api.patchSession(session.id, { title }));
      setEditing(false);
      onError(null);
    } catch (err) {
      onError(errorText(err));
    }
  };
  return (
    <div class="session-head">
      {editing ? (
        <form onSubmit={save} class="rename" aria-label="Rename session">
          <input
            aria-label="Title"
            value={title}
            autoFocus
            maxLength={200}
            onInput={(e) => setTitle((e.target as HTMLInputElement).value)}
            onKeyDown={(e) => e.key === "Escape" && setEditing(false)}
          />
          <button type="submit">Save</button>
          <button type="button" class="secondary" onClick={() => setEditing(false)}>
            Cancel
          </button>
        </form>
      ) : (
        <h1>
          <span data-testid="session-title">{session.title || `Untitled ${session.id.slice(0, 8)}`}</span>
          <button
            type="button"
            class="link small"
            onClick={() => {
              setTitle(session.title ?? "");
              setEditing(true);
            }}
          >
            Rename
          </button>
        </h1>
      )}
      <div class="meta">
        <span data-testid="session-status">
          <StatusBadge status={session.status} />
        </span>
        <span class="muted">
          {session.provider} · {session.model} · owner {session.owner}
          {session.access === "tenant" ? " · shared with the tenant" : ""}
        </span>
        <button
          type="button"
          class="link small"
          aria-pressed={session.access === "tenant"}
          onClick={async () => {
            try {
              onChanged(await api.patchSession(session.id, { access: session.access === "tenant" ? "private" : "tenant" }));
              onError(null);
            } catch (err) {
              onError(errorText(err));
            }
          }}
        >
          {session.access === "tenant" ? "Make private" : "Share with the tenant"}
        </button>
        {session.status === "running" && (
          <button type="button" class="danger small" onClick={onStop}>
            Stop
          </button>
        )}
      </div>
      <SessionTools session={session} onError={onError} onChanged={onChanged} />
    </div>
  );
}

/** Usage and cost, compact, fork and delete (docs/api.md): the API's session routes. */
function SessionTools({
  session,
  onError,
  onChanged,
}: {
  session: SessionInfo;
  onError: (e: string | null) => void;
  onChanged: (s: SessionInfo) => void;
}) {
  const [usage, setUsage] = useState<SessionUsage | null>(null);
  const [switching, setSwitching] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const [note, setNote] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const run = async (what: () => Promise<void>) => {
    setBusy(true);
    try {
      await what();
      onError(null);
    } catch (err) {
      onError(errorText(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <div class="session-tools">
      <button
        type="button"
        class="link small"
        aria-expanded={usage !== null}
        disabled={busy}
        onClick={() => (usage ? setUsage(null) : run(async () => setUsage(await api.sessionUsage(session.id))))}
      >
        Usage
      </button>
      <button type="button" class="link small" aria-expanded={switching} disabled={busy} onClick={() => setSwitching(!switching)}>
        Model
      </button>
      <button
        type="button"
        class="link small"
        disabled={busy}
        onClick={() =>
          run(async () => {
            const done = await api.compact(session.id);
            setNote(`Compacted: about ${done.compaction.tokensBefore} tokens summarised; kept from entry ${done.compaction.firstKeptCursor}.`);
          })
        }
      >
        Compact
      </button>
      <button
        type="button"
        class="link small"
        disabled={busy || session.lastCursor < 1}
        onClick={() =>
          run(async () => {
            const fork = await api.forkSession(session.id, session.lastCursor);
            location.hash = `#/s/${encodeURIComponent(fork.id)}`;
          })
        }
      >
        Fork
      </button>
      {confirming ? (
        <span class="confirm" role="group" aria-label="Confirm deleting this session">
          <button
            type="button"
            class="danger small"
            disabled={busy}
            onClick={() =>
              run(async () => {
                await api.deleteSession(session.id);
                location.hash = "#/sessions";
              })
            }
          >
            Yes, delete it and its children
          </button>
          <button type="button" class="secondary small" onClick={() => setConfirming(false)}>
            Cancel
          </button>
        </span>
      ) : (
        <button type="button" class="link small danger-text" disabled={busy} onClick={() => setConfirming(true)}>
          Delete
        </button>
      )}
      {note && (
        <p class="muted small" role="status">
          {note}
        </p>
      )}
      {switching && (
        <ModelForm
          session={session}
          busy={busy}
          onSubmit={(body) =>
            run(async () => {
              onChanged(await api.patchSession(session.id, body));
              setSwitching(false);
              setNote("Switched: the next request uses it.");
            })
          }
        />
      )}
      {usage && (
        <div class="usage" data-testid="session-usage">
          <p>
            {usage.messages} replies · {usage.inputTokens} input and {usage.outputTokens} output tokens · ${usage.costUsd.toFixed(4)}
            {usage.unpricedMessages > 0 ? ` (${usage.unpricedMessages} unpriced)` : ""}
          </p>
          <p class="muted small">
            Policy: {usage.policy.allowed} allowed, {usage.policy.asked} asked, {usage.policy.denied} denied · MCP: {usage.mcp.calls} calls,{" "}
            {usage.mcp.errors} failed
          </p>
          {usage.byModel.length > 1 && (
            <ul>
              {usage.byModel.map((m) => (
                <li key={`${m.provider}/${m.model}`}>
                  {m.provider}/{m.model}: {m.messages} replies, ${m.costUsd.toFixed(4)}
                </li>
              ))}
            </ul>
          )}
        </div>
      )}
    </div>
  );
}

/** The model and reasoning of the session's next requests (`PATCH /v1/sessions/:id`). */
function ModelForm({
  session,
  busy,
  onSubmit,
}: {
  session: SessionInfo;
  busy: boolean;
  onSubmit: (body: { provider: string; model: string; reasoning: { effort: "low" | "medium" | "high" } | null }) => void;
}) {
  const [provider, setProvider] = useState(session.provider);
  const [model, setModel] = useState(session.model);
  const [effort, setEffort] = useState<string>(session.reasoning?.effort ?? "");
  return (
    <form
      class="model-form row"
      aria-label="Model and reasoning"
      onSubmit={(e) => {
        e.preventDefault();
        onSubmit({
          provider,
          model: model.trim(),
          reasoning: effort ? { effort: effort as "low" | "medium" | "high" } : null,
        });
      }}
    >
      <label>
        Provider{" "}
        <select aria-label="Provider" value={provider} onChange={(e) => setProvider((e.target as HTMLSelectElement).value)}>
          {["anthropic", "openai", "openai-compatible", "fake"].map((p) => (
            <option key={p} value={p}>
              {p}
            </option>
          ))}
        </select>
      </label>{" "}
      <label>
        Model <input aria-label="Model" value={model} onInput={(e) => setModel((e.target as HTMLInputElement).value)} />
      </label>{" "}
      <label>
        Reasoning{" "}
        <select aria-label="Reasoning" value={effort} onChange={(e) => setEffort((e.target as HTMLSelectElement).value)}>
          <option value="">provider's default</option>
          <option value="low">low</option>
          <option value="medium">medium</option>
          <option value="high">high</option>
        </select>
      </label>{" "}
      <button type="submit" disabled={busy || model.trim() === ""}>
        Switch
      </button>
    </form>
  );
}

function ConnectionLine({ connection, resumed }: { connection: { state: Connection; detail: string }; resumed: string | null }) {
  if (connection.state === "reconnecting") {
    return (
      <p class="banner warn" role="status" data-testid="connection">
        Connection lost ({connection.detail}).
      </p>
    );
  }
  if (resumed) {
    return (
      <p class="banner ok" role="status" data-testid="connection">
        {resumed}
      </p>
    );
  }
  return null;
}

/** The most characters of a running call's output (or of streaming thinking) the page keeps. */
const LIVE_OUTPUT_CHARS = 64 * 1024;

/** `color:rgb(1,2,3);font-weight:bold` as a style object (applied through the CSSOM, which the
 * page's CSP allows, where a `style` attribute in markup is refused). */
function styleObject(style: string | null): Record<string, string> | undefined {
  if (!style) return undefined;
  const out: Record<string, string> = {};
  for (const part of style.split(";")) {
    const at = part.indexOf(":");
    if (at > 0) out[part.slice(0, at).trim()] = part.slice(at + 1).trim();
  }
  return out;
}

/** A running command's output as a terminal shows it: ANSI colours rendered (ansi_up, with
 * classes for the 16 colours), HTML escaped. ansi_up's markup is read in an inert document and
 * rebuilt as elements, so nothing is set as a style attribute. */
function Terminal({ text }: { text: string }) {
  const nodes = useMemo(() => {
    const ansi = new AnsiUp();
    ansi.escape_html = true;
    ansi.use_classes = true;
    const doc = new DOMParser().parseFromString(`<pre>${ansi.ansi_to_html(text)}</pre>`, "text/html");
    const pre = doc.body.firstElementChild;
    return Array.from(pre?.childNodes ?? []).map((node, i) =>
      node.nodeType === Node.ELEMENT_NODE ? (
        <span key={i} class={(node as Element).getAttribute("class") ?? undefined} style={styleObject((node as Element).getAttribute("style"))}>
          {node.textContent}
        </span>
      ) : (
        node.textContent
      ),
    );
  }, [text]);
  return (
    <pre class="terminal" data-testid="live-output" aria-live="polite">
      {nodes}
    </pre>
  );
}

/** "Fork here": a new session whose history is this one's up to and including `cursor`. */
function ForkHere({ sessionId, cursor }: { sessionId: string; cursor: number }) {
  const [error, setError] = useState<string | null>(null);
  return (
    <>
      <button
        type="button"
        class="link small fork-here"
        aria-label={`Fork from entry ${cursor}`}
        onClick={async () => {
          try {
            const fork = await api.forkSession(sessionId, cursor);
            location.hash = `#/s/${encodeURIComponent(fork.id)}`;
          } catch (err) {
            setError(errorText(err));
          }
        }}
      >
        Fork here
      </button>
      <ErrorLine error={error} />
    </>
  );
}

function ItemView({ item, sessionId, live }: { item: Item; sessionId: string; live: Record<string, string> }) {
  switch (item.kind) {
    case "header":
      return (
        <details class="notice">
          <summary>
            Session started · {item.provider} · {item.model}
          </summary>
          <pre>{item.systemPrompt}</pre>
        </details>
      );
    case "user":
      return (
        <div class="msg user" data-cursor={item.entry.cursor}>
          <div class="who">
            {item.author}
            {item.lane === "steer" ? <span class="badge">steer</span> : null} <ForkHere sessionId={sessionId} cursor={item.entry.cursor} />
          </div>
          <div class="md" dangerouslySetInnerHTML={{ __html: renderMarkdown(item.content) }} />
        </div>
      );
    case "assistant":
      return (
        <div class="msg assistant" data-cursor={item.entry.cursor} data-testid="assistant-message">
          <div class="who">
            assistant <ForkHere sessionId={sessionId} cursor={item.entry.cursor} />
          </div>
          {item.thinking && (
            <details class="thinking">
              <summary>Thinking</summary>
              <div class="md" dangerouslySetInnerHTML={{ __html: renderMarkdown(item.thinking) }} />
            </details>
          )}
          {item.text && <div class="md" dangerouslySetInnerHTML={{ __html: renderMarkdown(item.text) }} />}
          {item.calls.map(({ call, result }) => (
            <details key={call.id} class={`tool ${result?.isError ? "tool-error" : ""}`} open={!result && call.id in live}>
              <summary>
                <code>{call.name}</code>
                <span class="muted">{result ? (result.isError ? " · failed" : " · done") : call.id in live ? " · running" : " · waiting"}</span>
              </summary>
              {!result && call.id in live && <Terminal text={live[call.id]} />}
              <div class="tool-label">arguments</div>
              <pre>{formatArguments(call.arguments)}</pre>
              {result && (
                <>
                  <div class="tool-label">result</div>
                  <pre class={result.isError ? "error-text" : ""}>{result.content}</pre>
                </>
              )}
            </details>
          ))}
          {item.calls.map(({ call, result }) => result && <ToolImages key={`img-${call.id}`} blobs={result.blobs} />)}
        </div>
      );
    case "tool_result":
      return (
        <>
          <details class={`tool ${item.result.isError ? "tool-error" : ""}`}>
            <summary>
              <code>{item.result.toolName}</code> result
            </summary>
            <pre>{item.result.content}</pre>
          </details>
          <ToolImages blobs={item.result.blobs} />
        </>
      );
    case "context":
      return (
        <details class="notice context">
          <summary>{contextLabel(item.customType)}</summary>
          <div class="md" dangerouslySetInnerHTML={{ __html: renderMarkdown(item.content) }} />
        </details>
      );
    case "approval":
      return <ApprovalCard approval={item.approval} sessionId={sessionId} />;
    case "notice":
      return (
        <p class={`notice ${item.error ? "notice-error" : ""}`} data-custom-type={item.customType}>
          {item.text}
        </p>
      );
  }
}

function contextLabel(customType: string): string {
  switch (customType) {
    case "wuhu_global_context_v1":
      return "Your global context was added";
    case "wuhu_agents_md_v1":
      return "AGENTS.md of the environment was added";
    case "wuhu_resume_note_v1":
      return "Resume note for the agent";
    case "wuhu_group_chat_reminder_v1":
      return "This session became a group chat";
    default:
      return customType;
  }
}

function ApprovalCard({ approval, sessionId }: { approval: ApprovalView; sessionId: string }) {
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const answer = async (decision: "approve" | "approve_session" | "always" | "deny") => {
    setBusy(true);
    setError(null);
    try {
      await api.answerApproval(sessionId, approval.approvalId, decision);
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  };
  const expired = approval.expiresAt !== null && approval.expiresAt < Date.now() / 1000;
  return (
    <div class="approval" data-testid="approval" data-approval-id={approval.approvalId}>
      <p>
        <strong>Approval needed{approval.approver ? ` from ${approval.approver.sub}` : ""}</strong>
        {approval.expiresAt !== null && !approval.decision && !expired ? (
          <span class="muted"> · expires {timeUntil(approval.expiresAt)}</span>
        ) : null}
      </p>
      <p data-testid="approval-summary">{approval.text}</p>
      {approval.path !== null && <p class="mono small">{approval.path}</p>}
      {approval.detail !== null && (
        <pre class="approval-detail" data-testid="approval-detail">
          {approval.detail}
        </pre>
      )}
      {approval.decision ? (
        <p class="decision" data-testid="approval-decision">
          {approval.decision}
          {approval.decidedBy ? ` by ${approval.decidedBy}` : ""}
        </p>
      ) : expired ? (
        <p class="muted">Expired</p>
      ) : (
        <div class="actions">
          <button type="button" disabled={busy} onClick={() => answer("approve")}>
            Approve
          </button>
          {approval.approver?.kind === "runnerOwner" && approval.sessionApproval && (
            <button type="button" class="secondary" disabled={busy} onClick={() => answer("approve_session")}>
              Approve for this session
            </button>
          )}
          {approval.always && (
            <button type="button" class="secondary" disabled={busy} onClick={() => answer("always")}>
              Always allow this
            </button>
          )}
          <button type="button" class="danger" disabled={busy} onClick={() => answer("deny")}>
            Deny
          </button>
        </div>
      )}
      <ErrorLine error={error} />
    </div>
  );
}

/** The session's background jobs: where, what, how it stands, and the tail of its output. */
function JobsPanel({ jobs }: { jobs: JobInfo[] }) {
  return (
    <section class="panel" aria-label="Jobs" data-testid="jobs">
      <h2>Jobs</h2>
      <ul>
        {jobs.map((job) => (
          <li key={job.jobId} data-state={job.state}>
            <span class="mono small">{job.command}</span>{" "}
            <span class="muted small">
              {job.state}
              {job.report?.exitCode !== undefined ? ` (exit ${job.report.exitCode})` : ""} · {job.environment} on {job.runner}
            </span>
            {job.reason && <div class="error small">{job.reason}</div>}
            {job.report && job.report.outputTail && (
              <details>
                <summary class="small">Output ({job.report.totalLines} lines)</summary>
                <pre class="mono small log-record">{job.report.outputTail}</pre>
              </details>
            )}
          </li>
        ))}
      </ul>
    </section>
  );
}

/** The session's children (spawned by its tools), each linked, with where it is. */
function ChildrenPanel({ children }: { children: ChildInfo[] }) {
  return (
    <section class="panel" aria-label="Children" data-testid="children">
      <h2>Children</h2>
      <ul>
        {children.map((child) => (
          <li key={child.id} data-state={child.state}>
            <a href={`#/s/${encodeURIComponent(child.id)}`}>{child.title || child.id.slice(0, 8)}</a>{" "}
            <span class="muted small">
              {child.state}
              {child.detached ? " · detached" : ""}
            </span>
            {child.finalText && <div class="muted small">{child.finalText.slice(0, 160)}</div>}
            {child.state === "failed" && child.message && <div class="error small">{child.message}</div>}
          </li>
        ))}
      </ul>
    </section>
  );
}

function QueuePanel({ queue, onCancel }: { queue: QueueItem[]; onCancel: (id: string) => void }) {
  return (
    <section class="panel" aria-label="Queue" data-testid="queue">
      <h2>Queue</h2>
      {queue.length === 0 ? (
        <p class="muted">Nothing waiting.</p>
      ) : (
        <ul>
          {queue.map((item) => (
            <li key={item.id} class="queue-item">
              <span class="badge">{item.lane}</span>
              <span class="queue-text">{item.content}</span>
              <button type="button" class="link small" onClick={() => onCancel(item.id)} aria-label={`Cancel "${item.content.slice(0, 40)}"`}>
                Cancel
              </button>
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

function EnvironmentsPanel({ attached, runners }: { attached: Attachment[]; runners: RunnerInfo[] }) {
  return (
    <section class="panel" aria-label="Environments" data-testid="environments">
      <h2>Environments</h2>
      {attached.length === 0 ? (
        <p class="muted">None attached.</p>
      ) : (
        <ul>
          {attached.map((a) => {
            const runner = runners.find((r) => r.name === a.runner && r.owner === a.runnerOwner);
            return (
              <li key={a.environment.name}>
                <strong>{a.environment.name}</strong> <span class="muted">({a.environment.kind})</span>
                <div class="muted small">
                  runner {a.runner} of {a.runnerOwner} · {a.runnerKind} ·{" "}
                  {runner ? (runner.connected ? "connected" : `last seen ${timeAgo(runner.lastSeen)}`) : "status unknown"}
                </div>
                <div class="muted small mono">{a.environment.root}</div>
              </li>
            );
          })}
        </ul>
      )}
    </section>
  );
}

function Composer({ onSend, running }: { onSend: (lane: Lane, content: string) => Promise<void>; running: boolean }) {
  const [text, setText] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const send = async (lane: Lane) => {
    const content = text.trim();
    if (!content || busy) return;
    setBusy(true);
    try {
      await onSend(lane, content);
      setText("");
      setError(null);
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  };
  const onKeyDown = (e: KeyboardEvent) => {
    if (e.key !== "Enter" || e.shiftKey || e.isComposing) return;
    e.preventDefault();
    void send(e.ctrlKey || e.metaKey ? "steer" : "followUp");
  };
  return (
    <form
      class="composer"
      aria-label="Message"
      onSubmit={(e) => {
        e.preventDefault();
        void send("followUp");
      }}
    >
      <textarea
        aria-label="Message"
        rows={2}
        placeholder={running ? "Enter queues a follow-up · Ctrl+Enter steers now · Shift+Enter new line" : "Message · Enter sends · Shift+Enter new line"}
        value={text}
        onInput={(e) => setText((e.target as HTMLTextAreaElement).value)}
        onKeyDown={onKeyDown}
      />
      <div class="composer-actions">
        <button type="submit" disabled={busy || !text.trim()}>
          Send
        </button>
        <button type="button" class="secondary" disabled={busy || !text.trim()} onClick={() => send("steer")} title="Ctrl+Enter">
          Steer
        </button>
      </div>
      <ErrorLine error={error} />
    </form>
  );
}

const BLOB_URI = "wuhu://blob/";

/**
 * The images a tool result refers to (a `read` of a PNG, a screenshot), shown in the transcript
 * outside the collapsed call: loaded from `GET /v1/blobs/:id` on this origin, so the cookie
 * session authenticates it like any API call, and served with its image media type.
 */
function ToolImages({ blobs }: { blobs?: BlobRef[] }) {
  const images = (blobs ?? []).filter((b) => b.mediaType.startsWith("image/") && b.uri.startsWith(BLOB_URI));
  if (images.length === 0) return null;
  return (
    <div class="tool-images">
      {images.map((blob) => (
        <a key={blob.uri} href={blobUrl(blob)} target="_blank" rel="noopener noreferrer">
          <img
            class="tool-image"
            data-testid="tool-image"
            src={blobUrl(blob)}
            alt={blob.uri}
            title={`${blob.uri} (${blob.mediaType}${blob.width && blob.height ? `, ${blob.width}x${blob.height}` : ""}, ${blob.size} bytes)`}
            width={blob.width}
            height={blob.height}
          />
        </a>
      ))}
    </div>
  );
}

function blobUrl(blob: BlobRef): string {
  return `/v1/blobs/${encodeURIComponent(blob.uri.slice(BLOB_URI.length))}`;
}
