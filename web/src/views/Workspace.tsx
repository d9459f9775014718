import { useCallback, useEffect, useState } from "preact/hooks";
import { api } from "../api";
import type { Identity } from "../auth";
import { renderMarkdown } from "../markdown";
import type { Doc, DocSummary } from "../types";
import { ErrorLine, errorText, timeAgo } from "../util";

const docHref = (path: string) => `#/workspace/${path.split("/").map(encodeURIComponent).join("/")}`;

export function Workspace({ me, path }: { me: Identity; path: string | null }) {
  const [docs, setDocs] = useState<DocSummary[] | null>(null);
  const [cursor, setCursor] = useState<string | null>(null);
  const [prefix, setPrefix] = useState("");
  const [newPath, setNewPath] = useState("");
  const [error, setError] = useState<string | null>(null);
  const contextPath = `users/${me.sub}/context.md`;

  const load = useCallback(async () => {
    try {
      const page = await api.listDocs(prefix);
      setDocs(page.docs);
      setCursor(page.cursor);
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, [prefix]);
  useEffect(() => void load(), [load, path]);

  const more = async () => {
    if (!cursor) return;
    try {
      const page = await api.listDocs(prefix, cursor);
      setDocs((d) => [...(d ?? []), ...page.docs]);
      setCursor(page.cursor);
    } catch (err) {
      setError(errorText(err));
    }
  };

  return (
    <section class="page workspace">
      <div class="docs-list">
        <h1>Workspace</h1>
        <p>
          <a href={docHref(contextPath)}>Your global context</a>
          <span class="muted small"> (added to every new session of yours)</span>
        </p>
        <input
          type="search"
          placeholder="Filter by path prefix"
          aria-label="Filter documents by path prefix"
          value={prefix}
          onInput={(e) => setPrefix((e.target as HTMLInputElement).value)}
        />
        <ErrorLine error={error} />
        {docs === null ? (
          <p class="muted">Loading…</p>
        ) : docs.length === 0 ? (
          <p class="muted">No documents.</p>
        ) : (
          <ul aria-label="Documents">
            {docs.map((d) => (
              <li key={d.path} class={d.path === path ? "active" : ""}>
                <a href={docHref(d.path)}>{d.path}</a>
                <span class="muted small"> {timeAgo(d.updated)}</span>
              </li>
            ))}
          </ul>
        )}
        {cursor && (
          <button type="button" class="secondary small" onClick={more}>
            More
          </button>
        )}
        <form
          class="new-doc"
          aria-label="New document"
          onSubmit={(e) => {
            e.preventDefault();
            if (newPath.trim()) location.hash = docHref(newPath.trim().replace(/^\/+/, ""));
          }}
        >
          <input
            placeholder="notes/new.md"
            aria-label="New document path"
            value={newPath}
            onInput={(e) => setNewPath((e.target as HTMLInputElement).value)}
          />
          <button type="submit" class="secondary small">
            New
          </button>
        </form>
      </div>
      <div class="doc-editor">{path ? <DocEditor key={path} path={path} onSaved={load} /> : <p class="muted">Pick a document.</p>}</div>
    </section>
  );
}

function DocEditor({ path, onSaved }: { path: string; onSaved: () => void }) {
  const [doc, setDoc] = useState<Doc | null>(null);
  const [text, setText] = useState("");
  const [missing, setMissing] = useState(false);
  const [status, setStatus] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [preview, setPreview] = useState(false);
  useEffect(() => {
    // Ask the listing first: a new document is normal here, and a 404 would be a console error.
    (async () => {
      try {
        const listed = await api.listDocs(path);
        if (!listed.docs.some((d) => d.path === path)) {
          setMissing(true);
          return;
        }
        const d = await api.readDoc(path);
        setDoc(d);
        setText(d.content);
      } catch (err) {
        setError(errorText(err));
      }
    })();
  }, [path]);
  const dirty = doc ? text !== doc.content : text !== "";
  const save = async () => {
    try {
      await api.writeDoc(path, text);
      const fresh = await api.readDoc(path);
      setDoc(fresh);
      setText(fresh.content);
      setMissing(false);
      setStatus(`Saved (version ${fresh.version.slice(0, 8)})`);
      setError(null);
      onSaved();
    } catch (err) {
      setError(errorText(err));
    }
  };
  return (
    <div>
      <div class="page-head">
        <h2 class="mono">{path}</h2>
        <div class="actions">
          <button type="button" class="secondary small" onClick={() => setPreview((p) => !p)} aria-pressed={preview}>
            {preview ? "Edit" : "Preview"}
          </button>
          <button type="button" onClick={save} disabled={!dirty}>
            Save
          </button>
        </div>
      </div>
      {missing && <p class="muted">A new document: it is created when you save.</p>}
      <ErrorLine error={error} />
      {status && !dirty && (
        <p class="muted" role="status">
          {status}
        </p>
      )}
      {preview ? (
        <div class="md card" dangerouslySetInnerHTML={{ __html: renderMarkdown(text.replace(/^---\r?\n[\s\S]*?\r?\n---\r?\n?/, "")) }} />
      ) : (
        <textarea
          class="editor"
          aria-label="Document text"
          spellcheck={false}
          value={text}
          onInput={(e) => setText((e.target as HTMLTextAreaElement).value)}
          onKeyDown={(e) => {
            if ((e.ctrlKey || e.metaKey) && e.key === "s") {
              e.preventDefault();
              void save();
            }
          }}
        />
      )}
    </div>
  );
}
