// The Wuhu web app: a single page served by the Worker as static assets. Routes live in the
// URL hash (`#/sessions`, `#/s/<id>`, `#/runners`, `#/tokens`, `#/secrets`, `#/mcp`, `#/usage`, `#/workspace`), so any page can be reloaded
// and linked without the server knowing about them.

import "./app.css";
import { render } from "preact";
import { useCallback, useEffect, useState } from "preact/hooks";
import { setUnauthorizedHandler } from "./api";
import { currentIdentity, signOut, signedInBefore, type Identity } from "./auth";
import { SignIn } from "./views/SignIn";
import { Sessions } from "./views/Sessions";
import { SessionView } from "./views/Session";
import { Runners } from "./views/Runners";
import { Tokens } from "./views/Tokens";
import { Secrets } from "./views/Secrets";
import { Mcp } from "./views/Mcp";
import { Usage } from "./views/Usage";
import { Channels } from "./views/Channels";
import { Workspace } from "./views/Workspace";

type Route =
  | { name: "sessions" }
  | { name: "session"; id: string }
  | { name: "runners" }
  | { name: "tokens" }
  | { name: "secrets" }
  | { name: "mcp"; finish: string | null }
  | { name: "usage" }
  | { name: "channels" }
  | { name: "workspace"; path: string | null };

function parseRoute(hash: string): Route {
  const parts = hash.replace(/^#\/?/, "").split("/");
  if (parts[0] === "s" && parts[1]) return { name: "session", id: decodeURIComponent(parts[1]) };
  if (parts[0] === "runners") return { name: "runners" };
  if (parts[0] === "tokens") return { name: "tokens" };
  if (parts[0] === "secrets") return { name: "secrets" };
  if (parts[0] === "usage") return { name: "usage" };
  if (parts[0] === "channels") return { name: "channels" };
  if (parts[0] === "mcp") return { name: "mcp", finish: parts[1] === "finish" && parts[2] ? parts[2] : null };
  if (parts[0] === "workspace") {
    const path = parts.slice(1).map(decodeURIComponent).join("/");
    return { name: "workspace", path: path || null };
  }
  return { name: "sessions" };
}

function useRoute(): Route {
  const [route, setRoute] = useState(() => parseRoute(location.hash));
  useEffect(() => {
    const onHash = () => setRoute(parseRoute(location.hash));
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);
  return route;
}

function App() {
  // `undefined` while the page asks the server who it is.
  const [me, setMe] = useState<Identity | null | undefined>(() => (signedInBefore() ? undefined : null));
  const route = useRoute();
  useEffect(() => {
    if (me !== undefined) return;
    currentIdentity()
      .then(setMe)
      .catch(() => setMe(null));
  }, [me]);
  const leave = useCallback(async (who: Identity | null) => {
    try {
      await signOut(who);
    } finally {
      setMe(null);
    }
  }, []);
  // A 401 from any call means the session ended (expired, revoked, signed out elsewhere).
  useEffect(() => setUnauthorizedHandler(() => setMe(null)), []);

  if (me === undefined) return <p class="muted page">Loading…</p>;
  if (!me) return <SignIn onSignedIn={setMe} />;
  const nav = (name: Route["name"], href: string, label: string) => (
    <a href={href} class={route.name === name || (name === "sessions" && route.name === "session") ? "active" : ""}>
      {label}
    </a>
  );
  return (
    <div class="app">
      <header class="topbar">
        <a class="brand" href="#/sessions">
          Wuhu
        </a>
        <nav aria-label="Main">
          {nav("sessions", "#/sessions", "Sessions")}
          {nav("runners", "#/runners", "Runners")}
          {nav("tokens", "#/tokens", "Tokens")}
          {nav("secrets", "#/secrets", "Secrets")}
          {nav("mcp", "#/mcp", "MCP")}
          {nav("usage", "#/usage", "Usage")}
          {me.role === "admin" && nav("channels", "#/channels", "Channels")}
          {nav("workspace", "#/workspace", "Workspace")}
        </nav>
        <div class="whoami" data-testid="whoami" title={`tenant ${me.tenant}, signed in by ${me.via}`}>
          <span>
            {me.sub}
            <span class="muted">@{me.tenant}</span>
            {me.role === "admin" ? <span class="badge">admin</span> : null}
          </span>
          <button type="button" class="link" onClick={() => leave(me)}>
            Sign out
          </button>
        </div>
      </header>
      <main>
        {route.name === "sessions" && <Sessions />}
        {route.name === "session" && <SessionView key={route.id} id={route.id} me={me} />}
        {route.name === "runners" && <Runners me={me} />}
        {route.name === "tokens" && <Tokens me={me} />}
        {route.name === "secrets" && <Secrets me={me} />}
        {route.name === "mcp" && <Mcp me={me} finish={route.finish} />}
        {route.name === "usage" && <Usage me={me} />}
        {route.name === "channels" && <Channels me={me} />}
        {route.name === "workspace" && <Workspace me={me} path={route.path} />}
      </main>
    </div>
  );
}

render(<App />, document.getElementById("app")!);
