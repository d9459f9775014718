// The one place that knows how the page authenticates. Today: a bearer token the person pastes,
// kept in localStorage and sent as `Authorization` on every request (so the follow stream is
// read with fetch, see follow.ts). When the server offers a same-origin cookie session, this
// module exchanges the token for the cookie and the rest of the page does not change.

const TOKEN_KEY = "wuhu.token";

/** Who the page is signed in as (read from the token's claims, for display only: the server verifies). */
export interface Identity {
  sub: string;
  tenant: string;
  role: "admin" | "member";
  exp: number;
}

export function token(): string | null {
  try {
    return localStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

/** Headers that authenticate a request. */
export function authHeaders(): Record<string, string> {
  const t = token();
  return t ? { authorization: `Bearer ${t}` } : {};
}

/** The claims of a JWT, or null when it is not one. */
export function decodeClaims(jwt: string): Identity | null {
  const parts = jwt.split(".");
  if (parts.length !== 3) return null;
  try {
    const b64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
    const json = new TextDecoder().decode(Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)));
    const claims = JSON.parse(json);
    if (typeof claims.sub !== "string" || typeof claims.tenant !== "string") return null;
    return {
      sub: claims.sub,
      tenant: claims.tenant,
      role: claims.role === "admin" ? "admin" : "member",
      exp: typeof claims.exp === "number" ? claims.exp : 0,
    };
  } catch {
    return null;
  }
}

export function identity(): Identity | null {
  const t = token();
  return t ? decodeClaims(t) : null;
}

/**
 * Signs in with a pasted token: checks it against the server (a cheap authenticated read), then
 * keeps it. Throws the server's message when it is refused.
 */
export async function signInWithToken(raw: string): Promise<Identity> {
  const candidate = raw.trim().replace(/^Bearer\s+/i, "");
  const claims = decodeClaims(candidate);
  if (!claims) throw new Error("That is not a Wuhu token (a JWT with sub and tenant)");
  const response = await fetch("/v1/sessions?limit=1", {
    headers: { authorization: `Bearer ${candidate}` },
  });
  if (!response.ok) {
    let message = `the server answered ${response.status}`;
    try {
      const body = await response.json();
      if (body?.error?.message) message = body.error.message;
    } catch {
      // Not JSON: keep the status.
    }
    throw new Error(message);
  }
  localStorage.setItem(TOKEN_KEY, candidate);
  return claims;
}

export async function signOut(): Promise<void> {
  try {
    localStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage unavailable: nothing was kept.
  }
}
