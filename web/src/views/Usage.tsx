// Usage (docs/api.md, "GET /v1/usage", "GET|PUT /v1/budget", "GET /v1/llm-logs"): what the
// tenant's sessions used over a period, per day (a chart of spend over time, the default) or
// grouped by model, user or session, drawn as bars of cost (tokens when nothing is priced); the budget and what was spent against it (admins set
// it); and, for admins, the request logs when the tenant keeps them. A member sees only the
// sessions they own, as the API answers.

import { useCallback, useEffect, useState } from "preact/hooks";
import { api } from "../api";
import type { Identity } from "../auth";
import type { LogRecordSummary, TenantBudget, TenantUsage } from "../types";
import { ErrorLine, errorText } from "../util";

const PERIODS: { label: string; seconds: number | null }[] = [
  { label: "Last 24 hours", seconds: 24 * 3600 },
  { label: "Last 7 days", seconds: 7 * 24 * 3600 },
  { label: "Last 30 days", seconds: 30 * 24 * 3600 },
  { label: "All time", seconds: null },
];

const usd = (n: number) => `$${n.toFixed(4)}`;

export function Usage({ me }: { me: Identity }) {
  const [by, setBy] = useState<"day" | "model" | "user" | "session">("day");
  const [period, setPeriod] = useState(1);
  const [usage, setUsage] = useState<TenantUsage | null>(null);
  const [error, setError] = useState<string | null>(null);
  const refresh = useCallback(async () => {
    const seconds = PERIODS[period].seconds;
    const from = seconds === null ? undefined : Math.floor(Date.now() / 1000) - seconds;
    try {
      setUsage(await api.tenantUsage(by, from));
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, [by, period]);
  useEffect(() => void refresh(), [refresh]);
  return (
    <section class="page usage">
      <h1>Usage</h1>
      <p class="muted">
        {me.role === "admin" ? "Every session of the tenant." : "The sessions you own."} Replies and compaction summaries, as each
        session reports them (a new reply shows within moments).
      </p>
      <div class="row">
        <label>
          Period{" "}
          <select aria-label="Period" value={String(period)} onChange={(e) => setPeriod(Number((e.target as HTMLSelectElement).value))}>
            {PERIODS.map((p, i) => (
              <option key={p.label} value={String(i)}>
                {p.label}
              </option>
            ))}
          </select>
        </label>{" "}
        <label>
          Group by{" "}
          <select aria-label="Group by" value={by} onChange={(e) => setBy((e.target as HTMLSelectElement).value as typeof by)}>
            <option value="day">day</option>
            <option value="model">model</option>
            <option value="user">user</option>
            <option value="session">session</option>
          </select>
        </label>{" "}
        <button type="button" class="secondary" onClick={() => void refresh()}>
          Refresh
        </button>
      </div>
      <ErrorLine error={error} />
      {usage === null ? <p class="muted">Loading…</p> : <UsageChart usage={usage} />}
      <Budget me={me} />
      {me.role === "admin" && <RequestLogs />}
    </section>
  );
}

function UsageChart({ usage }: { usage: TenantUsage }) {
  const t = usage.total;
  // Bars of cost; of tokens when nothing in the period was priced.
  const priced = usage.groups.some((g) => g.costUsd > 0);
  const measure = (g: TenantUsage["groups"][number]) => (priced ? g.costUsd : g.inputTokens + g.outputTokens);
  const top = Math.max(0, ...usage.groups.map(measure));
  return (
    <div data-testid="tenant-usage">
      <p data-testid="usage-total">
        Total: {t.messages} replies · {t.inputTokens} input and {t.outputTokens} output tokens · {usd(t.costUsd)}
        {t.unpricedMessages > 0 && <span class="muted"> ({t.unpricedMessages} unpriced)</span>}
      </p>
      {usage.mcp.calls + usage.mcp.errors > 0 && (
        <p class="muted" data-testid="usage-mcp">
          MCP: {usage.mcp.calls} calls, {usage.mcp.errors} failed
          {usage.mcp.byServer.length > 0 && ` (${usage.mcp.byServer.map((s) => `${s.server} ${s.calls}`).join(", ")})`}
        </p>
      )}
      {usage.groups.length === 0 ? (
        <p class="muted">Nothing used in this period.</p>
      ) : (
        <table class="table usage-table">
          <thead>
            <tr>
              <th>{usage.by}</th>
              <th>Replies</th>
              <th>Input</th>
              <th>Output</th>
              <th>Cost</th>
              <th aria-hidden="true" />
            </tr>
          </thead>
          <tbody>
            {usage.groups.map((g) => (
              <tr key={`${g.provider ?? ""}/${g.key}`} data-testid="usage-group">
                <td class="mono">{g.provider ? `${g.provider}/${g.key}` : g.key}</td>
                <td>{g.messages}</td>
                <td>{g.inputTokens}</td>
                <td>{g.outputTokens}</td>
                <td>{usd(g.costUsd)}</td>
                <td class="bar-cell" aria-hidden="true">
                  <span class="bar" style={{ width: `${top > 0 ? Math.max(1, (measure(g) / top) * 100) : 0}%` }} />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {usage.truncated && <p class="muted">More groups than shown (the costliest 1,000 are).</p>}
    </div>
  );
}

function Budget({ me }: { me: Identity }) {
  const [state, setState] = useState<TenantBudget | null>(null);
  const [tokens, setTokens] = useState("");
  const [dollars, setDollars] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const load = useCallback(async () => {
    try {
      const got = await api.budget();
      setState(got);
      setTokens(got.budget?.maxTokens != null ? String(got.budget.maxTokens) : "");
      setDollars(got.budget?.maxUsd != null ? String(got.budget.maxUsd) : "");
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, []);
  useEffect(() => void load(), [load]);
  const save = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const body: { maxTokens?: number; maxUsd?: number } = {};
      if (tokens.trim() !== "") body.maxTokens = Number(tokens);
      if (dollars.trim() !== "") body.maxUsd = Number(dollars);
      setState(await api.putBudget(body));
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  };
  const b = state?.budget;
  return (
    <section class="panel" aria-label="Budget" data-testid="budget">
      <h2>Budget</h2>
      {state === null ? (
        <p class="muted">Loading…</p>
      ) : (
        <p data-testid="budget-state">
          {b ? `Limit: ${b.maxTokens != null ? `${b.maxTokens} tokens` : "no token limit"}, ${b.maxUsd != null ? usd(b.maxUsd) : "no dollar limit"}.` : "No budget: sessions are not limited."}{" "}
          Spent: {state.spent.tokens} tokens, {usd(state.spent.usd)}.
        </p>
      )}
      {me.role === "admin" && (
        <form onSubmit={save} class="row">
          <label>
            Max tokens <input inputMode="numeric" value={tokens} onInput={(e) => setTokens((e.target as HTMLInputElement).value)} />
          </label>{" "}
          <label>
            Max USD <input inputMode="decimal" value={dollars} onInput={(e) => setDollars((e.target as HTMLInputElement).value)} />
          </label>{" "}
          <button type="submit" disabled={busy}>
            Save budget
          </button>
          <span class="muted small"> Leave both empty to remove the budget.</span>
        </form>
      )}
      <ErrorLine error={error} />
    </section>
  );
}

function RequestLogs() {
  const [records, setRecords] = useState<LogRecordSummary[] | null>(null);
  const [next, setNext] = useState<string | null>(null);
  const [open, setOpen] = useState<{ name: string; text: string } | null>(null);
  const [error, setError] = useState<string | null>(null);
  const load = useCallback(async (after?: string) => {
    try {
      const page = await api.llmLogs(after);
      setRecords((r) => (after && r ? [...r, ...page.records] : page.records));
      setNext(page.nextAfter ?? null);
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, []);
  useEffect(() => void load(), [load]);
  const show = async (name: string) => {
    try {
      setOpen({ name, text: JSON.stringify(await api.llmLog(name), null, 2) });
    } catch (err) {
      setError(errorText(err));
    }
  };
  return (
    <section class="panel" aria-label="Request logs" data-testid="request-logs">
      <h2>Request logs</h2>
      <p class="muted small">
        Kept when <span class="mono">config/tenant.json</span> says <span class="mono">"llmRequestLogs": true</span>: every provider
        request and every MCP request, redacted.
      </p>
      <ErrorLine error={error} />
      {records === null ? (
        <p class="muted">Loading…</p>
      ) : records.length === 0 ? (
        <p class="muted">No request logs.</p>
      ) : (
        <ul class="plain">
          {records.map((r) => (
            <li key={r.name}>
              <button type="button" class="link mono small" onClick={() => void show(r.name)}>
                {r.name}
              </button>{" "}
              <span class="muted small">
                step {r.step} · {new Date(r.startedAtMs).toLocaleString()} · {r.size} bytes
              </span>
            </li>
          ))}
        </ul>
      )}
      {next && (
        <button type="button" class="secondary" onClick={() => void load(next)}>
          More
        </button>
      )}
      {open && (
        <div data-testid="request-log">
          <h3 class="mono small">{open.name}</h3>
          <pre class="mono small log-record">{open.text}</pre>
        </div>
      )}
    </section>
  );
}
