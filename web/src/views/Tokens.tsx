// Tokens for programs and runners (docs/api.md, "Tokens for programs"): list them and the
// browser sessions (never the token itself), mint one and see it exactly once, revoke one after
// a confirm, or end every credential at once ("Sign out everywhere"). Admins may mint for
// another user and list every user's tokens. A cookie session cannot mint by itself
// (docs/security.md, "Token lineage"): the form asks for the token the person signed in with.

import { useCallback, useEffect, useLayoutEffect, useRef, useState } from "preact/hooks";
import { ApiError, api } from "../api";
import type { Identity } from "../auth";
import type { MintedToken, TokenInfo } from "../types";
import { ErrorLine, copyText, errorText, timeAgo, useTick } from "../util";

/**
 * The field a cookie session's mint form needs: the token the person signed in with, sent with
 * this one request (the new token is its child). Nothing for Access or a bearer page.
 */
export function ConfirmTokenField({ me, value, onInput }: { me: Identity; value: string; onInput: (v: string) => void }) {
  if (me.via !== "cookie") return null;
  return (
    <label class="span-all">
      Confirm with your token
      <input
        name="confirmToken"
        type="password"
        autoComplete="off"
        required
        value={value}
        placeholder="the token you signed in with"
        onInput={(e) => onInput((e.target as HTMLInputElement).value)}
      />
      <span class="muted small">
        A browser session cannot create tokens by itself: the new token belongs to the one you paste, and ends with it.
      </span>
    </label>
  );
}

/** The error of a mint, with the way out when Access wants a fresh sign-in. */
export function mintErrorText(err: unknown): string {
  if (err instanceof ApiError && err.code === "reauthentication_required") return err.message;
  return errorText(err);
}

/** `5 Dec 2026` style, for expiry dates (relative times are for the past). */
function day(unixSeconds: number): string {
  return new Date(unixSeconds * 1000).toLocaleDateString(undefined, { day: "numeric", month: "short", year: "numeric" });
}

/** The command that registers a runner on a machine with `token`. */
export function registerCommand(token: string, name: string): string {
  const safe = name.replace(/[^A-Za-z0-9_.-]/g, "-") || "my-runner";
  return (
    `WUHU_RUNNER_TOKEN=${token} \\\n` +
    `  wuhu-runner register --server ${location.origin} --name ${safe} --env project=~/src/project`
  );
}

export function Tokens({ me }: { me: Identity }) {
  const isAdmin = me.role === "admin";
  const [all, setAll] = useState(false);
  const [tokens, setTokens] = useState<TokenInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [minted, setMinted] = useState<MintedToken | null>(null);
  const [endingAll, setEndingAll] = useState(false);
  const [ended, setEnded] = useState<string | null>(null);
  useTick(30_000);
  const refresh = useCallback(async () => {
    try {
      setTokens((await api.listTokens(all)).tokens);
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, [all]);
  useEffect(() => void refresh(), [refresh]);

  return (
    <section class="page tokens">
      <h1>Tokens</h1>
      <p class="muted">
        Tokens let programs (the CLI, scripts) and runners act as you. Each is shown once, when it is created;
        revoke one and everything using it is refused at once, open streams and runner connections included.
      </p>
      <MintForm
        me={me}
        onMinted={async (m) => {
          setMinted(m);
          await refresh();
        }}
      />
      {minted && <MintedCard minted={minted} onDone={() => setMinted(null)} />}
      <div class="page-head">
        <h2>{all ? "Every user's tokens" : "Your tokens"}</h2>
        {isAdmin && (
          <label class="inline">
            <input type="checkbox" checked={all} onChange={(e) => setAll((e.target as HTMLInputElement).checked)} />
            Every user
          </label>
        )}
      </div>
      <ErrorLine error={error} />
      {tokens === null ? (
        <p class="muted">Loading…</p>
      ) : tokens.length === 0 ? (
        <p class="muted">No tokens yet.</p>
      ) : (
        <TokenTable tokens={tokens} showOwner={all} onRevoked={refresh} onError={setError} />
      )}
      <div class="card danger-zone">
        <h2>Sign out everywhere</h2>
        <p class="muted">
          Ends every token and browser session of yours at once, and everything made from them: programs, runners and other
          browsers are refused from the next request, open connections close.
          {me.via === "access" ? " Your Cloudflare Access sign-in is Access's to end." : " This browser is signed out too."}
        </p>
        {ended && <p role="status">{ended}</p>}
        {endingAll ? (
          <span class="confirm" role="group" aria-label="Confirm signing out everywhere">
            <span class="small">End all of them?</span>
            <button
              type="button"
              class="danger small"
              onClick={async () => {
                try {
                  const answer = await api.revokeAll();
                  setEnded(`${answer.revoked} credential(s) ended, ${answer.runnerConnectionsClosed} runner connection(s) closed.`);
                  setError(null);
                } catch (err) {
                  setError(errorText(err));
                } finally {
                  setEndingAll(false);
                  // With the page's own cookie session ended this goes back to sign-in (401).
                  await refresh();
                }
              }}
            >
              Yes, end them all
            </button>
            <button type="button" class="secondary small" onClick={() => setEndingAll(false)}>
              Cancel
            </button>
          </span>
        ) : (
          <button type="button" class="danger" onClick={() => setEndingAll(true)}>
            Sign out everywhere
          </button>
        )}
      </div>
    </section>
  );
}

function MintForm({ me, onMinted }: { me: Identity; onMinted: (m: MintedToken) => void }) {
  const [name, setName] = useState("");
  const [kind, setKind] = useState<"user" | "runner">("user");
  const [ttlDays, setTtlDays] = useState("30");
  const [sub, setSub] = useState("");
  const [cloud, setCloud] = useState(false);
  const [confirmToken, setConfirmToken] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    const days = Number(ttlDays);
    if (!Number.isInteger(days) || days < 1) {
      setError("Lifetime must be a whole number of days, at least 1");
      return;
    }
    setBusy(true);
    setError(null);
    try {
      const body: Parameters<typeof api.mintToken>[0] = { name: name.trim(), kind, ttlDays: days };
      if (sub.trim() && sub.trim() !== me.sub) body.sub = sub.trim();
      if (kind === "runner" && cloud) body.runnerKind = "cloud";
      const minted = await api.mintToken(body, confirmToken);
      setName("");
      setConfirmToken("");
      onMinted(minted);
    } catch (err) {
      setError(mintErrorText(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="card form mint" onSubmit={submit} aria-label="New token">
      <h2>New token</h2>
      <div class="mint-fields">
        <label>
          Name
          <input
            name="name"
            value={name}
            required
            maxLength={100}
            placeholder={kind === "runner" ? "my-laptop" : "ci, laptop cli…"}
            onInput={(e) => setName((e.target as HTMLInputElement).value)}
          />
        </label>
        <label>
          Kind
          <select name="kind" value={kind} onChange={(e) => setKind((e.target as HTMLSelectElement).value as "user" | "runner")}>
            <option value="user">personal (API, CLI)</option>
            <option value="runner">runner (a machine)</option>
          </select>
        </label>
        <label>
          Lifetime (days)
          <input
            name="ttlDays"
            type="number"
            min={1}
            step={1}
            inputMode="numeric"
            value={ttlDays}
            onInput={(e) => setTtlDays((e.target as HTMLInputElement).value)}
          />
        </label>
        {me.role === "admin" && kind === "runner" && (
          <label class="inline span-all">
            <input type="checkbox" name="cloud" checked={cloud} onChange={(e) => setCloud((e.target as HTMLInputElement).checked)} />
            Cloud runner (serves every user's sessions in the tenant)
          </label>
        )}
        {me.role === "admin" && (
          <label>
            For user
            <input
              name="sub"
              value={sub}
              placeholder={me.sub}
              autoComplete="off"
              onInput={(e) => setSub((e.target as HTMLInputElement).value)}
            />
          </label>
        )}
        <ConfirmTokenField me={me} value={confirmToken} onInput={setConfirmToken} />
      </div>
      <ErrorLine error={error} />
      {me.via === "access" && error?.includes("sign in again") && (
        <p>
          <a href="/cdn-cgi/access/logout">Sign in to Access again</a>, then come back and create the token.
        </p>
      )}
      <div class="actions">
        <button type="submit" disabled={busy || !name.trim() || (me.via === "cookie" && !confirmToken.trim())}>
          Create token
        </button>
      </div>
    </form>
  );
}

function CopyButton({ text, label }: { text: string; label: string }) {
  const [state, setState] = useState<"idle" | "copied" | "failed">("idle");
  return (
    <button
      type="button"
      class="secondary small"
      aria-label={label}
      onClick={async () => setState((await copyText(text)) ? "copied" : "failed")}
    >
      {state === "copied" ? "Copied" : state === "failed" ? "Copy failed: select it" : "Copy"}
    </button>
  );
}

/** The new token, shown this once. */
function MintedCard({ minted, onDone }: { minted: MintedToken; onDone: () => void }) {
  const heading = useRef<HTMLHeadingElement>(null);
  // Focus moves to the new token so a keyboard user lands on it.
  // In the render that shows the card (a layout effect), not after the next paint: focus never
  // lags the card, for a screen reader or a script that reads the page as soon as it appears.
  useLayoutEffect(() => heading.current?.focus(), [minted.jti]);
  return (
    <div class="card minted" data-testid="minted" role="region" aria-label="New token">
      <h2 tabIndex={-1} ref={heading}>
        {minted.kind === "runner" ? "Runner" : "Personal"} token “{minted.name}”
        {minted.sub !== minted.createdBy ? ` for ${minted.sub}` : ""}
      </h2>
      <p class="warn-text">Copy it now: this is the only time it is shown.</p>
      <pre class="command secret" data-testid="minted-token">
        {minted.token}
      </pre>
      <CopyButton text={minted.token} label="Copy the token" />
      {minted.kind === "runner" && (
        <>
          <p class="muted">Run this on the machine that should serve sessions:</p>
          <pre class="command" data-testid="minted-command">
            {registerCommand(minted.token, minted.name)}
          </pre>
          <CopyButton text={registerCommand(minted.token, minted.name)} label="Copy the command" />
        </>
      )}
      <div class="actions">
        <button type="button" onClick={onDone}>
          Done, hide it
        </button>
      </div>
    </div>
  );
}

function TokenTable({
  tokens,
  showOwner,
  onRevoked,
  onError,
}: {
  tokens: TokenInfo[];
  showOwner: boolean;
  onRevoked: () => void;
  onError: (e: string | null) => void;
}) {
  const [confirming, setConfirming] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const revoke = async (t: TokenInfo) => {
    setBusy(true);
    try {
      await api.revokeToken(t.jti);
      setConfirming(null);
      onError(null);
    } catch (err) {
      onError(errorText(err));
    } finally {
      setBusy(false);
      onRevoked();
    }
  };
  return (
    <table class="table" aria-label="Tokens">
      <thead>
        <tr>
          <th>Name</th>
          <th>Kind</th>
          {showOwner && <th>Owner</th>}
          <th>Created</th>
          <th>Expires</th>
          <th />
        </tr>
      </thead>
      <tbody>
        {tokens.map((t) => (
          <tr key={t.jti} data-jti={t.jti}>
            <td>
              {t.name}
              {t.current ? <span class="badge">this browser</span> : null}
            </td>
            <td>
              {t.kind === "runner"
                ? `runner${t.runnerKind ? ` (${t.runnerKind})` : ""}`
                : t.kind === "session"
                  ? "browser session"
                  : "personal"}
              {t.role === "admin" ? <span class="badge">admin</span> : null}
            </td>
            {showOwner && <td>{t.sub}</td>}
            <td title={new Date(t.createdAt * 1000).toLocaleString()}>
              {timeAgo(t.createdAt)}
              {t.createdBy !== t.sub ? <span class="muted"> by {t.createdBy}</span> : null}
            </td>
            <td title={new Date(t.expiresAt * 1000).toLocaleString()}>{day(t.expiresAt)}</td>
            <td class="row-actions">
              {confirming === t.jti ? (
                <ConfirmRevoke
                  token={t}
                  busy={busy}
                  onYes={() => revoke(t)}
                  onNo={() => {
                    setConfirming(null);
                    // Back to the Revoke button the confirm replaced, for keyboard users.
                    requestAnimationFrame(() =>
                      document.querySelector<HTMLButtonElement>(`tr[data-jti="${CSS.escape(t.jti)}"] button`)?.focus(),
                    );
                  }}
                />
              ) : (
                <button
                  type="button"
                  class="link small danger-text"
                  aria-label={`Revoke "${t.name}"`}
                  onClick={() => setConfirming(t.jti)}
                >
                  Revoke
                </button>
              )}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

/** An inline confirm: focus lands on it, Escape (or Cancel) backs out. */
function ConfirmRevoke({
  token,
  busy,
  onYes,
  onNo,
}: {
  token: TokenInfo;
  busy: boolean;
  onYes: () => void;
  onNo: () => void;
}) {
  const yes = useRef<HTMLButtonElement>(null);
  useLayoutEffect(() => yes.current?.focus(), []);
  return (
    <span
      class="confirm"
      role="group"
      aria-label={`Confirm revoking "${token.name}"`}
      onKeyDown={(e) => {
        if (e.key === "Escape") onNo();
      }}
    >
      <span class="small">Revoke?</span>
      <button type="button" class="danger small" ref={yes} disabled={busy} onClick={onYes}>
        Yes, revoke
      </button>
      <button type="button" class="secondary small" onClick={onNo}>
        Cancel
      </button>
    </span>
  );
}
