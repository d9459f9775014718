import { useCallback, useEffect, useState } from "preact/hooks";
import { api } from "../api";
import type { SessionInfo } from "../types";
import { ErrorLine, StatusBadge, errorText, timeAgo, useInterval, useTick } from "../util";

export function Sessions() {
  // The first page is polled for live status; older pages the person loaded stay as they were.
  const [first, setFirst] = useState<SessionInfo[] | null>(null);
  const [older, setOlder] = useState<SessionInfo[]>([]);
  const [nextBefore, setNextBefore] = useState<string | null>(null);
  const [query, setQuery] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [creating, setCreating] = useState(false);
  useTick(15000);

  const refresh = useCallback(async () => {
    try {
      const page = await api.listSessions();
      setFirst(page.sessions);
      setNextBefore((nb) => nb ?? page.nextBefore);
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, []);
  useEffect(() => void refresh(), [refresh]);
  useInterval(refresh, 5000);

  const more = async () => {
    if (!nextBefore) return;
    try {
      const page = await api.listSessions(nextBefore);
      setOlder((old) => [...old, ...page.sessions]);
      setNextBefore(page.nextBefore);
    } catch (err) {
      setError(errorText(err));
    }
  };

  const seen = new Set((first ?? []).map((s) => s.id));
  const sessions = first === null ? null : [...first, ...older.filter((s) => !seen.has(s.id))];
  const needle = query.trim().toLowerCase();
  const shown = (sessions ?? []).filter((s) => !needle || (s.title ?? "").toLowerCase().includes(needle));
  return (
    <section class="page">
      <div class="page-head">
        <h1>Sessions</h1>
        <button type="button" onClick={() => setCreating((c) => !c)} aria-expanded={creating}>
          New session
        </button>
      </div>
      {creating && <NewSession onCancel={() => setCreating(false)} />}
      <input
        type="search"
        class="search"
        placeholder="Search by title"
        aria-label="Search sessions by title"
        value={query}
        onInput={(e) => setQuery((e.target as HTMLInputElement).value)}
      />
      <ErrorLine error={error} />
      {sessions === null ? (
        <p class="muted">Loading…</p>
      ) : shown.length === 0 ? (
        <p class="muted">{needle ? "No session has that in its title." : "No sessions yet."}</p>
      ) : (
        <ul class="session-list" aria-label="Sessions">
          {shown.map((s) => (
            <li key={s.id}>
              <a href={`#/s/${encodeURIComponent(s.id)}`} class="session-row">
                <span class="title">{s.title || <span class="muted">Untitled {s.id.slice(0, 8)}</span>}</span>
                <StatusBadge status={s.status} />
                <span class="muted owner">{s.owner}{s.access === "tenant" ? " · shared" : ""}</span>
                <span class="muted updated">{timeAgo(s.updatedAt)}</span>
              </a>
            </li>
          ))}
        </ul>
      )}
      {nextBefore && (
        <button type="button" class="secondary" onClick={more}>
          Load older sessions
        </button>
      )}
    </section>
  );
}

function NewSession({ onCancel }: { onCancel: () => void }) {
  const [provider, setProvider] = useState("fake");
  const [model, setModel] = useState("");
  const [systemPrompt, setSystemPrompt] = useState("");
  const [title, setTitle] = useState("");
  const [error, setError] = useState<string | null>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    try {
      const session = await api.createSession({
        provider,
        model: model.trim() || undefined,
        systemPrompt: systemPrompt.trim() || undefined,
        title: title.trim() || undefined,
      });
      location.hash = `#/s/${encodeURIComponent(session.id)}`;
    } catch (err) {
      setError(errorText(err));
    }
  };
  const field = (e: Event) => (e.target as HTMLInputElement).value;
  return (
    <form class="card form" onSubmit={submit} aria-label="New session">
      <label>
        Title
        <input name="title" value={title} onInput={(e) => setTitle(field(e))} placeholder="optional" />
      </label>
      <label>
        Provider
        <select name="provider" value={provider} onChange={(e) => setProvider(field(e))}>
          <option value="fake">fake (no key needed)</option>
          <option value="openai-compatible">openai-compatible</option>
          <option value="anthropic">anthropic</option>
        </select>
      </label>
      <label>
        Model
        <input name="model" value={model} onInput={(e) => setModel(field(e))} placeholder="the provider's default" />
      </label>
      <label>
        System prompt
        <textarea
          name="systemPrompt"
          rows={3}
          value={systemPrompt}
          onInput={(e) => setSystemPrompt(field(e))}
          placeholder="the built-in default"
        />
      </label>
      <ErrorLine error={error} />
      <div class="actions">
        <button type="submit">Create</button>
        <button type="button" class="secondary" onClick={onCancel}>
          Cancel
        </button>
      </div>
    </form>
  );
}
