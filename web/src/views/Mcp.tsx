// MCP servers (docs/mcp.md): the servers your own turns would use — the tenant's
// (`config/mcp.json`, admins) and yours (`users/<you>/mcp.json`) — with a server's tools asked
// now and its failure when it fails. The lists themselves are workspace documents, edited on the
// Workspace page (linked here).

import { useCallback, useEffect, useState } from "preact/hooks";
import { api } from "../api";
import type { Identity } from "../auth";
import type { McpServerInfo, McpServerList, McpToolInfo } from "../types";
import { ErrorLine, errorText } from "../util";

type Tools = { state: "loading" } | { state: "ok"; tools: McpToolInfo[]; truncated: boolean } | { state: "failed"; error: string };

export function Mcp({ me, finish }: { me: Identity; finish: string | null }) {
  const [list, setList] = useState<McpServerList | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [finished, setFinished] = useState<string | null>(null);
  const [tools, setTools] = useState<Record<string, Tools>>({});
  const refresh = useCallback(async () => {
    try {
      setList(await api.mcpServers());
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, []);
  useEffect(() => void refresh(), [refresh]);
  // Back from a server's sign-in (`#/mcp/finish/<state>`): the person signed in here finishes
  // it; the address then forgets the state.
  useEffect(() => {
    if (!finish) return;
    history.replaceState(null, "", "#/mcp");
    api
      .mcpFinish(finish)
      .then((done) => {
        setFinished(`Connected ${done.server}.`);
        setError(null);
        return refresh();
      })
      .catch((err) => setError(errorText(err)));
  }, [finish, refresh]);
  const ask = async (name: string) => {
    setTools((t) => ({ ...t, [name]: { state: "loading" } }));
    try {
      const answer = await api.mcpTools(name);
      setTools((t) => ({ ...t, [name]: { state: "ok", tools: answer.tools, truncated: answer.truncated } }));
    } catch (err) {
      setTools((t) => ({ ...t, [name]: { state: "failed", error: errorText(err) } }));
    }
  };
  const own = `users/${me.sub}/mcp.json`;
  return (
    <section class="page mcp">
      <h1>MCP servers</h1>
      <p class="muted">
        Sessions reach these servers through <span class="mono">mcp_tools</span> and <span class="mono">mcp_call</span>.
        Your own servers serve only turns that act for you alone. Edit{" "}
        {me.role === "admin" ? (
          <>
            <a href="#/workspace/config/mcp.json">the tenant's list</a> or{" "}
          </>
        ) : null}
        <a href={`#/workspace/${own}`}>your own list</a>.
      </p>
      <ErrorLine error={error} />
      {finished && <p role="status">{finished}</p>}
      {list?.errors.map((e) => (
        <p class="error" role="alert" key={e}>
          {e}
        </p>
      ))}
      {list === null ? (
        <p class="muted">Loading…</p>
      ) : list.servers.length === 0 ? (
        <p class="muted">No MCP servers yet.</p>
      ) : (
        <ul class="mcp-servers" aria-label="MCP servers">
          {list.servers.map((s) => (
            <Server
              key={`${s.source}/${s.name}`}
              server={s}
              tools={tools[s.name]}
              onAsk={() => ask(s.name)}
              onChanged={refresh}
              onError={setError}
            />
          ))}
        </ul>
      )}
      {list?.notOffered.map((s) => (
        <p class="muted" key={`hidden/${s.name}`}>
          Not offered: your server <span class="mono">{s.name}</span>, whose name a tenant server takes.
        </p>
      ))}
    </section>
  );
}

function Server({
  server,
  tools,
  onAsk,
  onChanged,
  onError,
}: {
  server: McpServerInfo;
  tools: Tools | undefined;
  onAsk: () => void;
  onChanged: () => void;
  onError: (e: string | null) => void;
}) {
  const [busy, setBusy] = useState(false);
  // OAuth: the browser goes to the server's sign-in and comes back to this page.
  const connect = async () => {
    setBusy(true);
    try {
      const started = await api.mcpConnect(server.name);
      location.assign(started.authorizationUrl);
    } catch (err) {
      onError(errorText(err));
      setBusy(false);
    }
  };
  const disconnect = async () => {
    setBusy(true);
    try {
      await api.mcpDisconnect(server.name);
      onError(null);
    } catch (err) {
      onError(errorText(err));
    } finally {
      setBusy(false);
      onChanged();
    }
  };
  return (
    <li class="card" data-testid={`mcp-server-${server.name}`}>
      <h2 class="mono">{server.name}</h2>
      <p>
        {server.source === "tenant" ? "The tenant's" : "Yours"} · <span class="mono">{server.url}</span>
        {server.auth === "bearer" ? (
          <>
            {" "}
            · bearer <span class="mono">{server.secret}</span>
          </>
        ) : null}
        {server.approval === "ask" ? " · each call waits for approval" : null} · {server.timeoutSeconds} s
      </p>
      {server.allow.length + server.deny.length > 0 && (
        <p class="muted small">
          {server.allow.length > 0 && <>Offers {server.allow.join(", ")}. </>}
          {server.deny.length > 0 && <>Hides {server.deny.join(", ")}.</>}
        </p>
      )}
      {server.auth === "oauth" && (
        <p>
          {server.connected ? "Your account is connected." : "Signs in per person: your account is not connected."}
        </p>
      )}
      <div class="actions">
        {server.auth === "oauth" &&
          (server.connected ? (
            <button type="button" class="secondary small" onClick={disconnect} disabled={busy}>
              Disconnect
            </button>
          ) : (
            <button type="button" class="small" onClick={connect} disabled={busy}>
              Connect
            </button>
          ))}
        <button type="button" class="secondary small" onClick={onAsk} disabled={tools?.state === "loading"}>
          {tools ? "Ask again" : "Show tools"}
        </button>
      </div>
      {tools?.state === "loading" && <p class="muted">Asking the server…</p>}
      {tools?.state === "failed" && <ErrorLine error={tools.error} />}
      {tools?.state === "ok" && (
        <table class="table" aria-label={`Tools of ${server.name}`}>
          <thead>
            <tr>
              <th>Tool</th>
              <th>Offered</th>
              <th>Description</th>
            </tr>
          </thead>
          <tbody>
            {tools.tools.map((t) => (
              <tr key={t.name}>
                <td class="mono">{t.name}</td>
                <td>{t.offered ? "yes" : "no"}</td>
                <td>{t.description}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {tools?.state === "ok" && tools.truncated && <p class="muted small">The server lists more tools than were read.</p>}
    </li>
  );
}
