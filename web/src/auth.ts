// The one place that knows how the page authenticates. The page uses a same-origin cookie
// session (docs/api.md, "How the web app signs in"): a pasted token is exchanged once for an
// HttpOnly `wuhu_session` cookie by `POST /v1/auth/session` and kept nowhere; behind Cloudflare
// Access every request already carries the identity. Requests carry no Authorization header,
// and the follow stream is a plain EventSource (follow.ts).

/** Who the page is signed in as, as the server sees it (`GET /v1/auth/me`). */
export interface Identity {
  sub: string;
  tenant: string;
  role: "admin" | "member";
  via: "cookie" | "access" | "bearer";
  expiresAt: number | null;
}

/**
 * Whether this browser signed in before (not a secret: the cookie is the credential). Only then
 * does the page ask the server who it is at start-up, so a signed-out page makes no request
 * that must fail.
 */
const SIGNED_IN_KEY = "wuhu.signedIn";

function remember(signedIn: boolean) {
  try {
    if (signedIn) localStorage.setItem(SIGNED_IN_KEY, "1");
    else localStorage.removeItem(SIGNED_IN_KEY);
  } catch {
    // Storage unavailable: the page asks the server each time instead.
  }
}

export function signedInBefore(): boolean {
  try {
    return localStorage.getItem(SIGNED_IN_KEY) === "1";
  } catch {
    return true;
  }
}

/** Headers that authenticate a request: none, the cookie (or Access) does. */
export function authHeaders(): Record<string, string> {
  return {};
}

async function errorMessage(response: Response): Promise<string> {
  try {
    const body = await response.json();
    if (body?.error?.message) return body.error.message;
  } catch {
    // Not JSON: the status says enough.
  }
  return `the server answered ${response.status}`;
}

/** Who we are (cookie session or Access), or null when the server says we are not signed in. */
export async function currentIdentity(): Promise<Identity | null> {
  const response = await fetch("/v1/auth/me");
  if (response.status === 401) {
    remember(false);
    return null;
  }
  if (!response.ok) throw new Error(await errorMessage(response));
  remember(true);
  return (await response.json()) as Identity;
}

/** Exchanges a pasted token for a cookie session; throws the server's message when refused. */
export async function signInWithToken(raw: string): Promise<Identity> {
  const token = raw.trim().replace(/^Bearer\s+/i, "");
  if (!/^[\w-]+\.[\w-]+\.[\w-]+$/.test(token)) throw new Error("That is not a Wuhu token (a JWT)");
  const response = await fetch("/v1/auth/session", {
    method: "POST",
    headers: { authorization: `Bearer ${token}` },
  });
  if (!response.ok) throw new Error(await errorMessage(response));
  remember(true);
  return (await response.json()) as Identity;
}

/** Ends the cookie session (the server revokes it); Access users sign out at Access. */
export async function signOut(me: Identity | null): Promise<void> {
  remember(false);
  if (me?.via === "access") {
    location.href = "/cdn-cgi/access/logout";
    return;
  }
  if (me?.via === "cookie") await fetch("/v1/auth/logout", { method: "POST" });
}
