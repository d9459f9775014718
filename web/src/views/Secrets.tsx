// Secrets (docs/api.md, "Secrets"; docs/security.md): values commands get by name, set here and
// never shown again. The page lists names, scopes and where each may go; it sets or replaces a
// value (a password field, cleared once saved) and deletes after a confirm. Admins may set the
// tenant's secrets; everyone sets their own.

import { useCallback, useEffect, useState } from "preact/hooks";
import { api } from "../api";
import type { Identity } from "../auth";
import type { SecretInfo } from "../types";
import { ErrorLine, errorText, timeAgo, useTick } from "../util";

/** `a, b ,c` → `["a", "b", "c"]`. */
function list(text: string): string[] {
  return text
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);
}

export function Secrets({ me }: { me: Identity }) {
  const [secrets, setSecrets] = useState<SecretInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  useTick(30_000);
  const refresh = useCallback(async () => {
    try {
      setSecrets((await api.listSecrets()).secrets);
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, []);
  useEffect(() => void refresh(), [refresh]);
  return (
    <section class="page secrets">
      <h1>Secrets</h1>
      <p class="muted">
        An environment definition lists the secrets its commands get as environment variables; scripts may send one in a
        fetch header to the hosts it names. Values are never shown again, and are masked wherever output shows them.
      </p>
      <SecretForm me={me} onSaved={refresh} />
      <ErrorLine error={error} />
      {secrets === null ? (
        <p class="muted">Loading…</p>
      ) : secrets.length === 0 ? (
        <p class="muted">No secrets yet.</p>
      ) : (
        <SecretTable me={me} secrets={secrets} onDeleted={refresh} onError={setError} />
      )}
    </section>
  );
}

function SecretForm({ me, onSaved }: { me: Identity; onSaved: () => void }) {
  const [name, setName] = useState("");
  const [value, setValue] = useState("");
  const [scope, setScope] = useState<"user" | "tenant">("user");
  const [environments, setEnvironments] = useState("");
  const [hosts, setHosts] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [saved, setSaved] = useState<string | null>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    setSaved(null);
    try {
      const info = await api.putSecret(name.trim(), {
        value,
        scope,
        environments: list(environments),
        hosts: list(hosts),
      });
      setValue("");
      setSaved(`Saved ${info.scope === "tenant" ? "the tenant's" : "your"} secret ${info.name}.`);
      onSaved();
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  };
  const input = (set: (v: string) => void) => (e: Event) => set((e.target as HTMLInputElement).value);
  return (
    <form class="card form" onSubmit={submit} aria-label="Set a secret">
      <h2>Set a secret</h2>
      <label>
        Name
        <input name="name" value={name} required maxLength={64} placeholder="GITHUB_TOKEN" onInput={input(setName)} />
      </label>
      <label>
        Value
        <input name="value" type="password" autoComplete="off" value={value} required onInput={input(setValue)} />
      </label>
      {me.role === "admin" && (
        <label>
          Scope
          <select name="scope" value={scope} onChange={(e) => setScope((e.target as HTMLSelectElement).value as "user" | "tenant")}>
            <option value="user">yours</option>
            <option value="tenant">the tenant's</option>
          </select>
        </label>
      )}
      <label>
        Environments
        <input name="environments" value={environments} placeholder="ci, deploy" onInput={input(setEnvironments)} />
        <span class="muted small">
          {scope === "tenant"
            ? "The definitions whose commands may get it (a tenant secret goes nowhere else)."
            : "Besides your own runners: definitions on others' runners whose commands may get it."}
        </span>
      </label>
      <label>
        Hosts
        <input name="hosts" value={hosts} placeholder="api.github.com, *.npmjs.org" onInput={input(setHosts)} />
        <span class="muted small">Where a script may send it in a fetch header.</span>
      </label>
      <ErrorLine error={error} />
      {saved && <p role="status">{saved}</p>}
      <div class="actions">
        <button type="submit" disabled={busy || !name.trim() || !value}>
          Save
        </button>
      </div>
    </form>
  );
}

function SecretTable({
  me,
  secrets,
  onDeleted,
  onError,
}: {
  me: Identity;
  secrets: SecretInfo[];
  onDeleted: () => void;
  onError: (e: string | null) => void;
}) {
  const [confirming, setConfirming] = useState<string | null>(null);
  const key = (s: SecretInfo) => `${s.scope}/${s.name}`;
  const remove = async (s: SecretInfo) => {
    try {
      await api.deleteSecret(s.name, s.scope);
      onError(null);
    } catch (err) {
      onError(errorText(err));
    } finally {
      setConfirming(null);
      onDeleted();
    }
  };
  return (
    <table class="table" aria-label="Secrets">
      <thead>
        <tr>
          <th>Name</th>
          <th>Scope</th>
          <th>Environments</th>
          <th>Hosts</th>
          <th>Set</th>
          <th />
        </tr>
      </thead>
      <tbody>
        {secrets.map((s) => (
          <tr key={key(s)}>
            <td class="mono">{s.name}</td>
            <td>{s.scope === "tenant" ? "tenant" : "yours"}</td>
            <td>{s.environments.join(", ") || <span class="muted">{s.scope === "tenant" ? "none" : "your runners"}</span>}</td>
            <td>{s.hosts.join(", ") || <span class="muted">none</span>}</td>
            <td title={new Date(s.setAt * 1000).toLocaleString()}>
              {timeAgo(s.setAt)} <span class="muted">by {s.setBy}</span>
            </td>
            <td class="row-actions">
              {s.scope === "tenant" && me.role !== "admin" ? null : confirming === key(s) ? (
                <span class="confirm" role="group" aria-label={`Confirm deleting ${s.name}`}>
                  <button type="button" class="danger small" onClick={() => remove(s)}>
                    Yes, delete
                  </button>
                  <button type="button" class="secondary small" onClick={() => setConfirming(null)}>
                    Cancel
                  </button>
                </span>
              ) : (
                <button
                  type="button"
                  class="link small danger-text"
                  aria-label={`Delete ${s.name}`}
                  onClick={() => setConfirming(key(s))}
                >
                  Delete
                </button>
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
