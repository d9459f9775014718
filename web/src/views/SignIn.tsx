import { useState } from "preact/hooks";
import { currentIdentity, signInWithToken, type Identity } from "../auth";
import { ErrorLine, errorText } from "../util";

export function SignIn({ onSignedIn }: { onSignedIn: (me: Identity) => void }) {
  const [token, setToken] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      onSignedIn(await signInWithToken(token));
      if (!location.hash) location.hash = "#/sessions";
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  };
  // Behind Cloudflare Access every request already says who we are.
  const viaAccess = async () => {
    setBusy(true);
    setError(null);
    try {
      const me = await currentIdentity();
      if (me) onSignedIn(me);
      else setError("This server does not know you through Cloudflare Access; paste a token");
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <main class="signin">
      <h1>Wuhu</h1>
      <form onSubmit={submit} aria-label="Sign in">
        <label for="token">Your token</label>
        <textarea
          id="token"
          name="token"
          rows={4}
          autoComplete="off"
          spellcheck={false}
          placeholder="eyJhbGciOi…"
          value={token}
          onInput={(e) => setToken((e.target as HTMLTextAreaElement).value)}
        />
        <p class="muted">
          Paste a user token (from <code>scripts/dev</code>, or minted by an admin): it is exchanged for a
          session cookie and not kept by the page.
        </p>
        <ErrorLine error={error} />
        <div class="actions">
          <button type="submit" disabled={busy || !token.trim()}>
            Sign in
          </button>
          <button type="button" class="secondary" disabled={busy} onClick={viaAccess}>
            Continue with Cloudflare Access
          </button>
        </div>
      </form>
    </main>
  );
}
