import { useCallback, useEffect, useState } from "preact/hooks";
import { api } from "../api";
import type { Identity } from "../auth";
import type { EnvironmentDefinition, RunnerInfo } from "../types";
import { ErrorLine, copyText, errorText, timeAgo, useInterval } from "../util";
import { ConfirmTokenField, mintErrorText, registerCommand } from "./Tokens";

export function Runners({ me }: { me: Identity }) {
  const [runners, setRunners] = useState<RunnerInfo[] | null>(null);
  const [definitions, setDefinitions] = useState<EnvironmentDefinition[] | null>(null);
  const [editing, setEditing] = useState<EnvironmentDefinition | "new" | null>(null);
  const [error, setError] = useState<string | null>(null);
  const refresh = useCallback(async () => {
    try {
      const [r, d] = await Promise.all([api.runners(), api.environments()]);
      setRunners(r.runners);
      setDefinitions(d.environments);
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, []);
  useEffect(() => void refresh(), [refresh]);
  useInterval(refresh, 10000);

  const remove = async (def: EnvironmentDefinition) => {
    if (!confirm(`Delete the environment definition "${def.name}"?`)) return;
    try {
      await api.deleteEnvironment(def.id);
      await refresh();
    } catch (err) {
      setError(errorText(err));
    }
  };

  return (
    <section class="page">
      <h1>Runners</h1>
      <ErrorLine error={error} />
      {runners === null ? (
        <p class="muted">Loading…</p>
      ) : runners.length === 0 ? (
        <p class="muted">No runner has connected yet.</p>
      ) : (
        <table class="table" aria-label="Runners">
          <thead>
            <tr>
              <th>Name</th>
              <th>Owner</th>
              <th>Kind</th>
              <th>Status</th>
              <th>Machine</th>
              <th>Offers</th>
            </tr>
          </thead>
          <tbody>
            {runners.map((r) => (
              <tr key={`${r.owner}/${r.name}`}>
                <td>{r.name}</td>
                <td>{r.owner}</td>
                <td>
                  {r.kind}
                  {r.sandbox === "off" && (
                    <>
                      {" "}
                      <span class="badge status-stopped" title="Started with --sandbox off: sessions run with this runner's own rights on its machine">
                        sandbox: off
                      </span>
                    </>
                  )}
                </td>
                <td>{r.connected ? <span class="badge status-running">connected</span> : `last seen ${timeAgo(r.lastSeen)}`}</td>
                <td class="muted">
                  {r.os} {r.arch} {r.version ? `· ${r.version}` : ""}
                </td>
                <td class="muted">{r.environments.map((e) => e.name).join(", ") || "—"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <p class="muted">
        Every session's commands run in a cell: its environment's directory and a temp dir, the
        system read-only, nothing else. Network: a <strong>local</strong> environment (on a
        person's own machine) reaches whatever that machine reaches; copies on cloud runners reach
        only package registries and git hosts, unless a definition's <code>network</code> says
        otherwise (<code>"none"</code>, <code>"open"</code> or <code>{"{"}"allow": [...]{"}"}</code>).
      </p>
      <RegisterRunner me={me} />
      <div class="page-head">
        <h2>Environment definitions</h2>
        <button type="button" onClick={() => setEditing("new")}>
          New definition
        </button>
      </div>
      {editing && (
        <DefinitionForm
          key={editing === "new" ? "new" : editing.id}
          initial={editing === "new" ? null : editing}
          onDone={async () => {
            setEditing(null);
            await refresh();
          }}
          onCancel={() => setEditing(null)}
        />
      )}
      {definitions && definitions.length === 0 && <p class="muted">No definitions yet.</p>}
      {definitions && definitions.length > 0 && (
        <table class="table" aria-label="Environment definitions">
          <thead>
            <tr>
              <th>Name</th>
              <th>Kind</th>
              <th>Runner</th>
              <th>Where</th>
              <th>Approval</th>
              <th>Owner</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {definitions.map((d) => (
              <tr key={d.id}>
                <td>{d.name}</td>
                <td>{d.kind}</td>
                <td>{d.runner ? `${d.runner}${d.runnerOwner ? ` (${d.runnerOwner})` : ""}` : "any cloud runner"}</td>
                <td class="mono small">{d.path ?? d.templatePath ?? d.repoPath ?? ""}</td>
                <td>{d.approval}</td>
                <td>{d.owner ?? "—"}</td>
                <td class="row-actions">
                  <button type="button" class="link small" onClick={() => setEditing(d)}>
                    Edit
                  </button>
                  <button type="button" class="link small danger-text" onClick={() => remove(d)}>
                    Delete
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

function RegisterRunner({ me }: { me: Identity }) {
  const [name, setName] = useState(`${me.sub.replace(/[^A-Za-z0-9_.-]/g, "-")}-laptop`);
  const [token, setToken] = useState<string | null>(null);
  const [confirmToken, setConfirmToken] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [copied, setCopied] = useState(false);
  const mint = async () => {
    try {
      const minted = await api.mintToken({ name, kind: "runner", ttlDays: 90 }, confirmToken);
      setToken(minted.token);
      setConfirmToken("");
      setError(null);
    } catch (err) {
      setError(`Could not mint a runner token here: ${mintErrorText(err)}`);
    }
  };
  const command = registerCommand(token ?? "<runner token>", name);
  return (
    <details class="card">
      <summary>Register a runner</summary>
      <label>
        Runner name
        <input value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
      </label>
      <ConfirmTokenField me={me} value={confirmToken} onInput={setConfirmToken} />
      <div class="actions">
        <button type="button" onClick={mint} disabled={me.via === "cookie" && !confirmToken.trim()}>
          Create a runner token
        </button>
      </div>
      <ErrorLine error={error} />
      <p class="muted">
        Run this on the machine (the token is shown once; see and revoke tokens on the <a href="#/tokens">Tokens</a> page):
      </p>
      <pre class="command" data-testid="register-command">{command}</pre>
      <button
        type="button"
        class="secondary small"
        onClick={async () => {
          setCopied(await copyText(command));
        }}
      >
        {copied ? "Copied" : "Copy"}
      </button>
    </details>
  );
}

const KINDS = ["local", "folder-template", "worktree"] as const;

function DefinitionForm({
  initial,
  onDone,
  onCancel,
}: {
  initial: EnvironmentDefinition | null;
  onDone: () => void;
  onCancel: () => void;
}) {
  const [form, setForm] = useState({
    name: initial?.name ?? "",
    kind: initial?.kind ?? "local",
    runner: initial?.runner ?? "",
    path: initial?.path ?? "",
    templatePath: initial?.templatePath ?? "",
    startupScript: initial?.startupScript ?? "",
    repoPath: initial?.repoPath ?? "",
    baseRef: initial?.baseRef ?? "",
    approval: initial?.approval ?? "auto",
  });
  const [error, setError] = useState<string | null>(null);
  const set = (key: keyof typeof form) => (e: Event) =>
    setForm((f) => ({ ...f, [key]: (e.target as HTMLInputElement).value }));
  const submit = async (e: Event) => {
    e.preventDefault();
    const orNull = (v: string) => (v.trim() ? v.trim() : null);
    const body: Record<string, unknown> = {
      name: form.name.trim(),
      kind: form.kind,
      runner: orNull(form.runner),
      path: form.kind === "local" ? orNull(form.path) : null,
      templatePath: form.kind === "folder-template" ? orNull(form.templatePath) : null,
      startupScript: form.kind === "folder-template" ? orNull(form.startupScript) : null,
      repoPath: form.kind === "worktree" ? orNull(form.repoPath) : null,
      baseRef: form.kind === "worktree" ? orNull(form.baseRef) : null,
      approval: form.approval,
    };
    try {
      if (initial) {
        await api.updateEnvironment(initial.id, body);
      } else {
        // Creation takes absent fields, not nulls.
        for (const key of Object.keys(body)) if (body[key] === null) delete body[key];
        await api.createEnvironment(body);
      }
      onDone();
    } catch (err) {
      setError(errorText(err));
    }
  };
  return (
    <form class="card form" onSubmit={submit} aria-label={initial ? `Edit ${initial.name}` : "New environment definition"}>
      <label>
        Name
        <input name="name" value={form.name} onInput={set("name")} required />
      </label>
      <label>
        Kind
        <select name="kind" value={form.kind} onChange={set("kind")}>
          {KINDS.map((k) => (
            <option key={k} value={k}>
              {k}
            </option>
          ))}
        </select>
      </label>
      <label>
        Runner
        <input name="runner" value={form.runner} onInput={set("runner")} placeholder={form.kind === "folder-template" ? "any cloud runner" : ""} />
      </label>
      {form.kind === "local" && (
        <label>
          Path
          <input name="path" value={form.path} onInput={set("path")} placeholder="/Users/you/src/project" />
        </label>
      )}
      {form.kind === "folder-template" && (
        <>
          <label>
            Template path
            <input name="templatePath" value={form.templatePath} onInput={set("templatePath")} />
          </label>
          <label>
            Startup script
            <textarea name="startupScript" rows={2} value={form.startupScript} onInput={set("startupScript")} />
          </label>
        </>
      )}
      {form.kind === "worktree" && (
        <>
          <label>
            Repository path
            <input name="repoPath" value={form.repoPath} onInput={set("repoPath")} />
          </label>
          <label>
            Base ref
            <input name="baseRef" value={form.baseRef} onInput={set("baseRef")} placeholder="HEAD" />
          </label>
        </>
      )}
      <label>
        Approval
        <select name="approval" value={form.approval} onChange={set("approval")}>
          <option value="auto">auto</option>
          <option value="ask">ask the session owner</option>
        </select>
      </label>
      <ErrorLine error={error} />
      <div class="actions">
        <button type="submit">{initial ? "Save" : "Create"}</button>
        <button type="button" class="secondary" onClick={onCancel}>
          Cancel
        </button>
      </div>
    </form>
  );
}
