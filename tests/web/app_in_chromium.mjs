// Drives the web app in headless Chromium (Debian's, through playwright-core) against a real
// stack started by tests/tests/web_app.rs, which passes everything through the environment:
//
//   WUHU_URL            the Worker (`wrangler dev`) base URL, through a proxy that can drop connections
//   WUHU_DROP_ADDR      host:port; connecting there makes the proxy cut every open connection
//   WUHU_NO_WS_URL      the Worker through a proxy that refuses WebSocket upgrades (502)
//   WUHU_ALICE_TOKEN    a user token for alice; WUHU_BOB_TOKEN for bob (same tenant)
//   WUHU_RUNNER         alice's connected runner, offering the environment `api` at WUHU_API_DIR
//   WUHU_CHROMIUM       the browser (default /usr/bin/chromium)
//   WUHU_ALLOWED_PORT   a port for a page on an origin listed in WUHU_ALLOWED_ORIGINS (CORS)
//   WUHU_FOREIGN_PORT   a port for a page on an unlisted origin
//   WUHU_RUNNER_BIN     wuhu-runner, started with the command the Runners page shows
//   WUHU_STACK_LOG      the Worker's log (to see that a cross-site request was refused with 403)
//   WUHU_SCREENSHOTS    where to save screenshots (docs/screenshots to refresh the README's)
//
// Every step polls with a deadline; nothing sleeps for a fixed time. Any console error or
// uncaught exception in the page fails the run. Exit code 0 when every step passed.

import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { connect } from "node:net";
import { join } from "node:path";

const env = (name, fallback) => {
  const value = process.env[name] ?? fallback;
  if (value === undefined) throw new Error(`${name} is not set`);
  return value;
};
const BASE = env("WUHU_URL");
const ALICE = env("WUHU_ALICE_TOKEN");
const BOB = env("WUHU_BOB_TOKEN");
const ADMIN = env("WUHU_ADMIN_TOKEN");
const RUNNER = env("WUHU_RUNNER");
const API_DIR = env("WUHU_API_DIR");
const CHROMIUM = env("WUHU_CHROMIUM", "/usr/bin/chromium");
const SHOTS = process.env.WUHU_SCREENSHOTS ?? null;
const DROP_ADDR = env("WUHU_DROP_ADDR");
const NO_WS = env("WUHU_NO_WS_URL");
const ALLOWED_PORT = Number(env("WUHU_ALLOWED_PORT"));
const FOREIGN_PORT = Number(env("WUHU_FOREIGN_PORT"));
const RUNNER_BIN = env("WUHU_RUNNER_BIN");
const STACK_LOG = env("WUHU_STACK_LOG");
const STEP_TIMEOUT = 30_000;

/** Asks the proxy in front of the Worker to cut every open connection. */
function dropConnections() {
  const [host, port] = DROP_ADDR.split(":");
  return new Promise((resolve, reject) => {
    const socket = connect({ host, port: Number(port) }, () => socket.end());
    socket.on("close", resolve);
    socket.on("error", reject);
  });
}

/**
 * The Worker's request log lines (worker/src/observe.rs) for one session's route (`socket`,
 * `follow`, `enqueue`, …): how the test knows which door the page used, whatever the timing.
 */
function loggedRequests(sessionId, route) {
  const path = `"path":"/v1/sessions/${sessionId}/${route}"`;
  return readFileSync(STACK_LOG, "utf8")
    .split("\n")
    .filter((line) => line.includes('"event":"request"') && line.includes(path))
    .map((line) => JSON.parse(line.slice(line.indexOf("{"))));
}
/** Session sockets the Worker upgraded for the session. */
const socketsOpened = (sessionId) => loggedRequests(sessionId, "socket").filter((r) => r.status === 101).length;

const started = Date.now();
const log = (...args) => console.log(`[${((Date.now() - started) / 1000).toFixed(1)}s]`, ...args);
function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

// --- The HTTP API, for set-up and for checking what the page did ---------------------------

async function call(token, method, path, body) {
  const response = await fetch(BASE + path, {
    method,
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

async function transcript(token, id) {
  let since = 0;
  const entries = [];
  for (;;) {
    const page = await call(token, "GET", `/v1/sessions/${id}?sinceCursor=${since}`);
    entries.push(...page.transcript);
    if (page.nextCursor == null) return entries;
    since = page.nextCursor;
  }
}

async function poll(what, probe, timeout = STEP_TIMEOUT) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    last = await probe();
    if (last) return last;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const assistantTexts = (entries) =>
  entries
    .filter((e) => e.type === "message" && e.message.role === "assistant")
    .map((e) => e.message.content.filter((b) => b.type === "text").map((b) => b.text).join(""));

const fake = (directive) => `@fake ${JSON.stringify(directive)}`;
const words = (prefix, n) => Array.from({ length: n }, (_, i) => `${prefix}${i}`).join(" ");

// --- The browser ----------------------------------------------------------------------------

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  // Without the background-networking flags Chromium keeps trying to reach Google's hosts,
  // which this machine's closed network refuses.
  args: [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const consoleErrors = [];
const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
context.setDefaultTimeout(STEP_TIMEOUT);
const page = await context.newPage();
// While the test cuts the connections, a failed request is what it asked for.
let dropping = false;
// While a page on another origin calls the API, the browser reports the refusals it asked for.
let expectingRefusals = false;
// While a wrong confirming token is sent on purpose, the browser reports its 401.
let expectingWrongToken = false;
/** Set while the page is expected to get a 400 (a bad secret name, shown in its form). */
let expectingBadRequest = false;
// The MCP page asks a server that cannot be reached: the 502 it shows is expected.
let expectingBadGateway = false;
page.on("console", (msg) => {
  if (msg.type() === "error" && expectingRefusals && /CORS policy|net::ERR_FAILED|status of 403/.test(msg.text())) return;
  if (msg.type() === "error" && expectingWrongToken && /status of 401/.test(msg.text())) return;
  if (msg.type() === "error" && expectingBadRequest && /status of 400/.test(msg.text())) return;
  if (msg.type() === "error" && expectingBadGateway && /status of 502/.test(msg.text())) return;
  if (msg.type() === "error" && dropping && /net::ERR_|Failed to fetch|WebSocket connection to/.test(msg.text())) return;
  if (msg.type() === "error") consoleErrors.push(`console.error: ${msg.text()} (${msg.location().url})`);
});
page.on("pageerror", (error) => consoleErrors.push(`uncaught: ${error.message}`));

async function shot(name, fullPage = false) {
  if (!SHOTS) return;
  mkdirSync(SHOTS, { recursive: true });
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage });
}

const chat = () => page.getByTestId("transcript");
const composer = () => page.getByRole("textbox", { name: "Message" });
const assistantMessages = () => chat().getByTestId("assistant-message");

/** The assistant texts the page shows, in order. */
async function shownAssistantTexts() {
  return (await assistantMessages().locator(".md").allInnerTexts()).map((t) => t.trim());
}

/** Cursors of the rendered entries: each must appear once. */
async function shownCursors() {
  return page.locator("[data-cursor]").evaluateAll((els) => els.map((e) => Number(e.dataset.cursor)));
}

/**
 * A fresh browser context signed in with `token` at `base`. Its console errors fail the run like
 * the main page's, but for those `expected` matches.
 */
async function signedInPage(token, who, base, expected = null) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  context.setDefaultTimeout(STEP_TIMEOUT);
  const page = await context.newPage();
  page.on("console", (msg) => {
    if (msg.type() !== "error" || (expected && expected.test(msg.text()))) return;
    consoleErrors.push(`console.error (${who}'s other page): ${msg.text()} (${msg.location().url})`);
  });
  page.on("pageerror", (error) => consoleErrors.push(`uncaught (${who}'s other page): ${error.message}`));
  await page.goto(base + "/");
  await page.getByLabel("Your token").fill(token);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByTestId("whoami").filter({ hasText: who }).waitFor();
  return { context, page };
}

let failed = false;
try {
  // 1. Sign in with a pasted token; the page says who we are.
  log("sign in");
  await page.goto(BASE + "/");
  const csp = (await page.request.get(BASE + "/")).headers()["content-security-policy"] ?? "";
  check(csp.includes("default-src 'self'"), `the page is served with a CSP (got ${JSON.stringify(csp)})`);
  const notAPage = await page.request.get(BASE + "/no-such-page");
  check(notAPage.status() === 404 && (await notAPage.json()).error?.code === "not_found", "a path that is not a file is the API's JSON 404");
  const unauthenticated = await page.request.get(BASE + "/v1/sessions");
  check(unauthenticated.status() === 401, "/v1 still reaches the Worker, which wants a token");
  await shot("sign-in");
  await page.getByLabel("Your token").fill("not a token");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("alert").filter({ hasText: "not a Wuhu token" }).waitFor();
  await page.getByLabel("Your token").fill(ALICE);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByTestId("whoami").filter({ hasText: "alice" }).waitFor();
  const cookies = await context.cookies(BASE);
  const session = cookies.find((c) => c.name === "wuhu_session");
  check(session && session.httpOnly && session.sameSite === "Strict", `signed in with an HttpOnly SameSite=Strict cookie (${JSON.stringify(cookies)})`);
  const stored = await page.evaluate(() => JSON.stringify({ ...localStorage }) + document.cookie);
  check(!stored.includes(ALICE.split(".")[1]) && !stored.includes("wuhu_session"), `the page keeps no token it can read (${stored})`);

  // 2. Create a session from the form.
  log("create a session");
  await page.getByRole("button", { name: "New session" }).click();
  const form = page.getByRole("form", { name: "New session" });
  await form.getByLabel("Title").fill("Browser chat");
  await form.getByLabel("System prompt").fill("You are terse.");
  await form.getByRole("button", { name: "Create" }).click();
  await page.getByTestId("session-title").filter({ hasText: "Browser chat" }).waitFor();
  const sessionId = decodeURIComponent(new URL(page.url()).hash.replace("#/s/", ""));
  check(sessionId.length > 10, `the page went to the new session (${page.url()})`);

  // 3. A reply streams in: partial text shows before the finished message.
  log("send a message and watch the reply stream");
  const firstReply = words("alpha", 24);
  // Sent before the socket opens, a message would go over HTTP (as it should).
  await page.locator("[data-transport=socket]").waitFor();
  await composer().fill(`hello **there**\n${fake({ reply: firstReply, chunks: 12, delayMs: 120 })}`);
  await composer().press("Enter");
  const streaming = page.getByTestId("streaming");
  await streaming.waitFor();
  const partial = (await streaming.innerText()).trim();
  check(partial.length > 0 && partial.length < firstReply.length, `text streamed in part by part (saw ${JSON.stringify(partial)})`);
  await assistantMessages().filter({ hasText: "alpha23" }).waitFor();
  await streaming.waitFor({ state: "detached" });
  check((await chat().locator(".msg.user strong").innerText()) === "there", "user markdown is rendered");
  await shot("session");
  // That went through the session socket (docs/api.md): the page neither followed with an
  // EventSource nor enqueued over HTTP, the Worker upgraded a socket for it, and the page says so.
  check(loggedRequests(sessionId, "follow").length === 0, "the page did not open the SSE follow stream");
  check(loggedRequests(sessionId, "enqueue").length === 0, "the page did not enqueue over HTTP");
  await poll("the Worker to log the socket's upgrade", async () => socketsOpened(sessionId) >= 1);
  await page.locator("[data-transport=socket]").waitFor();

  // 3b. A reply of 600 deltas (more than the socket's window of 256 unacknowledged frames):
  // it arrives whole on the same socket only because the page acks as it reads (a page that
  // never acked would have it held back by the server after 256 frames).
  log("a long reply over one socket (acks)");
  const opened = socketsOpened(sessionId);
  await composer().fill(fake({ reply: words("long", 600), chunks: 600 }));
  await composer().press("Enter");
  await assistantMessages().filter({ hasText: "long599" }).waitFor();
  await page.getByTestId("session-status").filter({ hasText: "idle" }).waitFor();
  check(socketsOpened(sessionId) === opened, `the reply came on the socket it started on (${socketsOpened(sessionId)} upgrades, was ${opened})`);

  // 4. Reload in the middle of a stream: afterwards every entry shows exactly once and the
  // reply is whole.
  log("reload mid-stream");
  const secondReply = words("beta", 30);
  await composer().fill(fake({ reply: secondReply, chunks: 15, delayMs: 150 }));
  await composer().press("Enter");
  await streaming.waitFor();
  await page.reload();
  await assistantMessages().filter({ hasText: "beta29" }).waitFor();
  await poll("the turn to end in the API", async () => (await call(ALICE, "GET", `/v1/sessions/${sessionId}`)).session.status === "idle");
  const apiTexts = assistantTexts(await transcript(ALICE, sessionId));
  await poll("the page to show every reply", async () => (await shownAssistantTexts()).length === apiTexts.length);
  const shown = await shownAssistantTexts();
  check(JSON.stringify(shown) === JSON.stringify(apiTexts), `the page shows the replies the API has, once each:\n${JSON.stringify(shown)}\nvs\n${JSON.stringify(apiTexts)}`);
  const cursors = await shownCursors();
  check(new Set(cursors).size === cursors.length, `no entry is shown twice (${cursors})`);

  // 4b. The connection drops (the proxy in front of the Worker cuts every connection): the
  // page says so, resumes by itself, and shows what happened meanwhile exactly once.
  log("dropped connection");
  const openedBeforeDrop = socketsOpened(sessionId);
  dropping = true;
  await dropConnections();
  const connection = page.getByTestId("connection");
  await connection.filter({ hasText: "Connection lost" }).waitFor();
  await call(ALICE, "POST", `/v1/sessions/${sessionId}/enqueue?lane=followUp`, { content: "sent while the line was down" });
  await connection.filter({ hasText: "Reconnected" }).waitFor({ timeout: 15_000 });
  dropping = false;
  await assistantMessages().filter({ hasText: "echo: sent while the line was down" }).waitFor();
  const resumedCursors = await shownCursors();
  check(new Set(resumedCursors).size === resumedCursors.length, `no entry is shown twice after resuming (${resumedCursors})`);
  // It resumed on a new socket (`?after=`), not on the EventSource, and nothing is missing.
  check(socketsOpened(sessionId) > openedBeforeDrop, "the page opened a new socket after the drop");
  check(loggedRequests(sessionId, "follow").length === 0, "the page did not fall back to the follow stream after a drop");
  await page.locator("[data-transport=socket]").waitFor();
  await poll("the turn sent while the line was down to end", async () => (await call(ALICE, "GET", `/v1/sessions/${sessionId}`)).session.status === "idle");
  const resumedApi = await transcript(ALICE, sessionId);
  const apiMessageCursors = resumedApi
    .filter((e) => e.type === "message" && (e.message.role === "user" || e.message.role === "assistant"))
    .map((e) => e.cursor);
  const shownMessageCursors = () => page.locator(".msg[data-cursor]").evaluateAll((els) => els.map((e) => Number(e.dataset.cursor)));
  await poll("the page to show every message after resuming", async () => (await shownMessageCursors()).length >= apiMessageCursors.length);
  const resumedShown = await shownMessageCursors();
  check(
    JSON.stringify(resumedShown) === JSON.stringify(apiMessageCursors),
    `after resuming the page shows every message the API has, once each, in order:\n${resumedShown}\nvs\n${apiMessageCursors}`,
  );
  check(
    JSON.stringify(await shownAssistantTexts()) === JSON.stringify(assistantTexts(resumedApi)),
    "after resuming the page's replies are the API's",
  );

  // 5. While a slow turn runs: a follow-up waits in the queue and can be cancelled; a steer
  // (Ctrl+Enter) joins the running turn.
  log("queue, cancel and steer mid-turn");
  await composer().fill(fake({ reply: words("gamma", 40), chunks: 20, delayMs: 200 }));
  await composer().press("Enter");
  await streaming.waitFor();
  await composer().fill("a follow-up I take back");
  await composer().press("Enter");
  const queue = page.getByTestId("queue");
  await queue.getByText("a follow-up I take back").waitFor();
  await queue.getByRole("button", { name: /Cancel "a follow-up I take back/ }).click();
  await queue.getByText("Nothing waiting.").waitFor();
  await composer().fill("steer: please wrap up");
  await composer().press("Control+Enter");
  await assistantMessages().filter({ hasText: "echo: steer: please wrap up" }).waitFor();
  const afterSteer = await transcript(ALICE, sessionId);
  const users = afterSteer.filter((e) => e.type === "message" && e.message.role === "user");
  const steer = users.find((e) => e.message.content === "steer: please wrap up");
  check(steer && steer.message.lane === "steer", "Ctrl+Enter sent the message on the steer lane");
  check(!users.some((e) => e.message.content === "a follow-up I take back"), "the cancelled follow-up never reached the transcript");
  await chat().locator(".msg.user .badge", { hasText: "steer" }).first().waitFor();

  // 6. Stop a running turn from the page.
  log("stop");
  await composer().fill(fake({ reply: words("delta", 40), chunks: 20, delayMs: 250 }));
  await composer().press("Enter");
  await streaming.waitFor();
  await page.getByRole("button", { name: "Stop" }).click();
  await chat().locator("[data-custom-type=wuhu_execution_stopped_v1]").waitFor();
  await page.getByTestId("session-status").filter({ hasText: "stopped" }).waitFor();
  // Queueing, cancelling, steering and stopping went over the socket: the only HTTP enqueue of
  // this session is the test's own (4b), and no cancel or stop reached the router.
  check(loggedRequests(sessionId, "enqueue").length === 1, "the page's messages went over the socket");
  check(loggedRequests(sessionId, "cancel").length === 0, "the page cancelled over the socket");
  check(loggedRequests(sessionId, "stop").length === 0, "the page stopped over the socket");

  // 6a. A message whose reply is lost (the socket closes after the server queued it, before the
  // page heard back) is sent again over HTTP under the same key (`body.key`), and queued once. A
  // route stands in for a network that fails at exactly that moment: it passes the page's next
  // enqueue frame to the Worker, swallows the Worker's reply to it and closes the socket (every
  // other frame passes through). In a context of its own, so the route ends with it.
  log("a send whose reply was lost");
  {
    // Playwright relays a routed socket's frames through the page: an ack on its way when the
    // route closed the socket is refused by the closed relay (not by the app, which checks).
    const { context: cutContext, page: cutPage } = await signedInPage(ALICE, "alice", BASE, /WebSocket is already in CLOSING or CLOSED state/);
    try {
      let cutReplyTo = null;
      let swallowed = false;
      await cutPage.routeWebSocket(/\/socket\?after=\d+$/, (ws) => {
        const server = ws.connectToServer();
        ws.onMessage((message) => {
          if (cutReplyTo === null && typeof message === "string") {
            const frame = JSON.parse(message);
            if (frame.type === "enqueue") cutReplyTo = frame.id;
          }
          server.send(message);
        });
        server.onMessage((message) => {
          // A reply is a message of its own; events may come several to a message.
          if (!swallowed && cutReplyTo !== null && typeof message === "string" && !message.includes("\n")) {
            const frame = JSON.parse(message);
            if (frame.type === "reply" && frame.id === cutReplyTo) {
              swallowed = true;
              ws.close({ code: 4000, reason: "the test cut it" });
              server.close();
              return;
            }
          }
          ws.send(message);
        });
      });
      const httpBefore = loggedRequests(sessionId, "enqueue").length;
      await cutPage.goto(`${BASE}/#/s/${sessionId}`);
      await cutPage.locator("[data-transport=socket]").waitFor();
      const cutComposer = cutPage.getByRole("textbox", { name: "Message" });
      await cutComposer.fill("lost on the way");
      await cutComposer.press("Enter");
      await cutPage.getByTestId("assistant-message").filter({ hasText: "echo: lost on the way" }).waitFor();
      const lostOnTheWay = (await transcript(ALICE, sessionId)).filter(
        (e) => e.type === "message" && e.message.role === "user" && e.message.content === "lost on the way",
      );
      check(swallowed, "the route swallowed the server's reply");
      check(lostOnTheWay.length === 1, `the message whose reply was lost was queued once (${lostOnTheWay.length})`);
      check(loggedRequests(sessionId, "enqueue").length === httpBefore + 1, "the page sent it again over HTTP");
      check((await cutComposer.inputValue()) === "", "the message counts as sent");
      check((await cutPage.getByRole("form", { name: "Message" }).getByRole("alert").count()) === 0, "no error is shown");
    } finally {
      await cutContext.close();
    }
  }

  // 6b. Through a proxy that cannot carry WebSockets (it answers the upgrade 502 itself), the
  // page falls back to the EventSource and HTTP: a message sent there gets its reply in full.
  log("no WebSockets: the SSE fallback");
  {
    // The refused upgrade is what this step is about; Chromium reports it as an error.
    const { context: plain, page: plainPage } = await signedInPage(ALICE, "alice", NO_WS, /WebSocket connection to .*\/socket\?after=\d+' failed/);
    try {
      const socketsBefore = socketsOpened(sessionId);
      await plainPage.goto(`${NO_WS}/#/s/${sessionId}`);
      await plainPage.locator("[data-transport=sse]").waitFor();
      await plainPage.getByTestId("assistant-message").filter({ hasText: "echo: lost on the way" }).waitFor();
      const plainComposer = plainPage.getByRole("textbox", { name: "Message" });
      await plainComposer.fill(fake({ reply: words("plain", 12), chunks: 6, delayMs: 100 }));
      await plainComposer.press("Enter");
      await plainPage.getByTestId("assistant-message").filter({ hasText: "plain11" }).waitFor();
      check(loggedRequests(sessionId, "follow").length >= 1, "the page followed with the EventSource");
      check(loggedRequests(sessionId, "enqueue").length === 3, "the page enqueued over HTTP");
      check(socketsOpened(sessionId) === socketsBefore, "no socket reached the Worker through that proxy");
      // The page on the socket saw that turn too.
      await assistantMessages().filter({ hasText: "plain11" }).waitFor();
    } finally {
      await plain.close();
    }
  }

  // 7. Rename, then find it by title in the list.
  log("rename and search");
  await page.getByRole("button", { name: "Rename" }).click();
  await page.getByRole("form", { name: "Rename session" }).getByLabel("Title").fill("Renamed in the browser");
  await page.getByRole("button", { name: "Save" }).click();
  await page.getByTestId("session-title").filter({ hasText: "Renamed in the browser" }).waitFor();
  await call(ALICE, "POST", "/v1/sessions", { title: "Another session" });
  await page.getByRole("link", { name: "Sessions" }).click();
  await page.getByRole("list", { name: "Sessions" }).getByText("Another session").waitFor();
  await page.getByLabel("Search sessions by title").fill("renamed");
  await page.getByRole("list", { name: "Sessions" }).getByText("Another session").waitFor({ state: "detached" });
  await page.getByRole("list", { name: "Sessions" }).getByText("Renamed in the browser").waitFor();
  await page.getByLabel("Search sessions by title").fill("");
  await shot("sessions");

  // 7b. A session's own tools: usage and cost, compact, fork (the page goes to the fork), and
  // delete after a confirm (the page goes back to the list; the API then answers 404).
  log("usage, compact, fork and delete");
  {
    const session = await call(ALICE, "POST", "/v1/sessions", { title: "Tools of a session" });
    for (const text of ["fact: the hint is green", "one", "two", "three"]) {
      await call(ALICE, "POST", `/v1/sessions/${session.id}/enqueue?lane=followUp`, { content: text });
      await poll("the reply", async () => {
        const s = await call(ALICE, "GET", `/v1/sessions/${session.id}?limit=1`);
        return s.session.status === "idle" && s.queue.length === 0 && assistantTexts(await transcript(ALICE, session.id)).some((t) => t.endsWith(text));
      });
    }
    await page.goto(`${BASE}/#/s/${session.id}`);
    await page.getByTestId("session-title").filter({ hasText: "Tools of a session" }).waitFor();
    await page.getByRole("button", { name: "Usage", exact: true }).click();
    await page.getByTestId("session-usage").getByText(/4 replies/).waitFor();
    await page.getByTestId("session-usage").getByText("MCP: 0 calls, 0 failed").waitFor();
    await page.getByRole("button", { name: "Compact", exact: true }).click();
    await page.getByRole("status").filter({ hasText: "Compacted" }).waitFor();
    check(
      (await transcript(ALICE, session.id)).some((e) => e.type === "compaction"),
      "the compaction is in the transcript",
    );
    // The model and reasoning of the next requests: the fake model takes no reasoning (the
    // server's 400 is shown); another model name switches, and the page says so.
    await page.getByRole("button", { name: "Model", exact: true }).click();
    const modelForm = page.getByRole("form", { name: "Model and reasoning" });
    await modelForm.getByLabel("Reasoning").selectOption("high");
    expectingBadRequest = true;
    await modelForm.getByRole("button", { name: "Switch" }).click();
    await page.getByRole("alert").filter({ hasText: "invalid_reasoning" }).waitFor();
    expectingBadRequest = false;
    await modelForm.getByLabel("Reasoning").selectOption("");
    await modelForm.getByLabel("Model", { exact: true }).fill("fake-second");
    await modelForm.getByRole("button", { name: "Switch" }).click();
    await page.getByText("fake · fake-second").waitFor();
    check(
      (await transcript(ALICE, session.id)).some((e) => e.type === "custom" && e.custom_type === "wuhu_model_changed_v1"),
      "the switch is recorded in the transcript",
    );
    await page.getByRole("button", { name: "Fork", exact: true }).click();
    await poll("the fork's page", async () => !page.url().includes(session.id) && page.url().includes("#/s/"));
    const forkId = decodeURIComponent(page.url().split("#/s/")[1]);
    const fork = await call(ALICE, "GET", `/v1/sessions/${forkId}?limit=1`);
    check(fork.session.forkedFrom?.sessionId === session.id, `the fork names its origin (${JSON.stringify(fork.session.forkedFrom)})`);
    // Fork at a message: the first reply's "Fork here" forks the history up to it.
    await page.goto(`${BASE}/#/s/${session.id}`);
    await page.getByTestId("session-title").filter({ hasText: "Tools of a session" }).waitFor();
    const firstReply = assistantMessages().first();
    const at = Number(await firstReply.getAttribute("data-cursor"));
    await firstReply.getByRole("button", { name: `Fork from entry ${at}` }).click();
    await poll("the earlier fork's page", async () => page.url().includes("#/s/") && !page.url().includes(session.id) && !page.url().includes(forkId));
    const earlier = await call(ALICE, "GET", `/v1/sessions/${decodeURIComponent(page.url().split("#/s/")[1])}?limit=1`);
    check(earlier.session.forkedFrom?.cursor === at, `the fork is at the message (${JSON.stringify(earlier.session.forkedFrom)} / ${at})`);
    await page.goto(`${BASE}/#/s/${session.id}`);
    await page.getByTestId("session-title").filter({ hasText: "Tools of a session" }).waitFor();
    await page.getByRole("button", { name: "Delete", exact: true }).click();
    await page
      .getByRole("group", { name: "Confirm deleting this session" })
      .getByRole("button", { name: "Yes, delete it and its children" })
      .click();
    await poll("the sessions list", async () => page.url().endsWith("#/sessions"));
    const gone = await fetch(`${BASE}/v1/sessions/${session.id}`, { headers: { authorization: `Bearer ${ALICE}` } });
    check(gone.status === 404, `the deleted session is gone (${gone.status})`);
  }

  // 7c2. A session's children: spawned by its tool, listed on its page with where each is
  // (live, from child_status), each a link to its own page.
  log("children");
  {
    const parent = await call(ALICE, "POST", "/v1/sessions", { title: "A parent" });
    await page.goto(`${BASE}/#/s/${parent.id}`);
    await page.getByTestId("session-title").filter({ hasText: "A parent" }).waitFor();
    await composer().fill(
      fake({ toolCalls: [{ name: "spawn_session", arguments: { task: "child work", title: "the first child" } }], afterTools: "spawned" }),
    );
    await composer().press("Enter");
    const children = page.getByTestId("children");
    await children.locator("li[data-state=idle]").filter({ hasText: "the first child" }).waitFor();
    await children.getByRole("link", { name: "the first child" }).click();
    await page.getByTestId("session-title").filter({ hasText: "the first child" }).waitFor();
  }

  // 7c. Usage: alice (a member) sees her sessions' usage grouped by model and by session, with
  // the budget; an admin sets a budget from the page, and reads the request logs (a tenant that
  // keeps none here: the list says so).
  log("tenant usage, budget and request logs");
  {
    await page.goto(`${BASE}/#/usage`);
    const usage = page.getByTestId("tenant-usage");
    // Per day by default: today's spend, as a bar.
    const today = new Date().toISOString().slice(0, 10);
    await usage.getByTestId("usage-group").filter({ hasText: today }).waitFor();
    await page.getByRole("combobox", { name: "Group by" }).selectOption("model");
    await usage.getByTestId("usage-group").filter({ hasText: "fake/" }).first().waitFor();
    // The page's total is the API's (reports of the last replies may still be arriving:
    // refreshed until both agree).
    await poll("the page's total is the API's", async () => {
      await page.getByRole("button", { name: "Refresh" }).click();
      const api = await call(ALICE, "GET", "/v1/usage");
      const total = await page.getByTestId("usage-total").textContent();
      return total.includes(`Total: ${api.total.messages} replies`);
    });
    await page.getByRole("combobox", { name: "Group by" }).selectOption("session");
    await poll("groups by session", async () => (await usage.getByTestId("usage-group").first().textContent()).match(/^[0-9a-f-]{36}/) !== null);
    await page.getByTestId("budget-state").filter({ hasText: "No budget" }).waitFor();
    check((await page.getByRole("button", { name: "Save budget" }).count()) === 0, "a member gets no budget form");
    check((await page.getByTestId("request-logs").count()) === 0, "a member gets no request logs");
    const { context: adminContext, page: adminPage } = await signedInPage(ADMIN, "root", BASE);
    try {
      await adminPage.goto(`${BASE}/#/usage`);
      await adminPage.getByLabel("Max tokens").fill("5000000");
      await adminPage.getByRole("button", { name: "Save budget" }).click();
      // On a failure, the admin page's own state says why (its error line).
      await adminPage.getByTestId("budget-state").filter({ hasText: "Limit: 5000000 tokens" }).waitFor().catch(async (e) => {
        console.log("the admin's page:", await adminPage.locator("main").innerHTML());
        throw e;
      });
      check((await call(ALICE, "GET", "/v1/budget")).budget?.maxTokens === 5000000, "the page set the budget");
      await adminPage.getByLabel("Max tokens").fill("");
      await adminPage.getByRole("button", { name: "Save budget" }).click();
      await adminPage.getByTestId("budget-state").filter({ hasText: "No budget" }).waitFor();
      await adminPage.getByTestId("request-logs").getByText("No request logs.").waitFor();
      // Channels (admins): a generic binding added from its JSON (the page shows where to point
      // the platform, never the secret), a member mapped and unmapped, then deleted.
      await adminPage.getByRole("link", { name: "Channels" }).click();
      await adminPage.getByText("Add a channel").click();
      const secret = `generic-secret-${Date.now()}`;
      await adminPage.getByLabel("Binding JSON").fill(
        JSON.stringify({ platform: "generic", name: "web hooks", credentials: { secret, replyUrl: "http://127.0.0.1:9/reply" } }),
      );
      await adminPage.getByRole("form", { name: "Add a channel" }).getByRole("button", { name: "Add" }).click();
      await adminPage.getByRole("status").filter({ hasText: "Added generic channel “web hooks”" }).waitFor();
      const card = adminPage.getByRole("region", { name: "Channel web hooks" });
      await card.getByText("/hooks/generic/").first().waitFor();
      check(!(await adminPage.locator("main").textContent()).includes(secret), "the secret is never shown");
      await card.getByLabel("Platform user id").fill("u-9");
      await card.getByLabel("Wuhu name").fill("alice");
      await card.getByRole("button", { name: "Map" }).click();
      await card.getByTestId("channel-members").getByText("u-9").waitFor();
      const channelId = (await call(ADMIN, "GET", "/v1/channels")).channels[0].id;
      check((await call(ADMIN, "GET", `/v1/channels/${channelId}/members`)).members[0]?.sub === "alice", "the mapping was saved");
      await card.getByRole("button", { name: "Unmap u-9" }).click();
      await poll("the mapping is gone", async () => (await call(ADMIN, "GET", `/v1/channels/${channelId}/members`)).members.length === 0);
      await card.getByRole("button", { name: "Delete" }).click();
      await adminPage.getByRole("group", { name: "Confirm deleting web hooks" }).getByRole("button", { name: "Yes, delete it" }).click();
      await adminPage.getByText("No channels yet.").waitFor();
    } finally {
      await adminContext.close();
    }
  }

  // 8. An approval for alice's machine, asked by bob's prompt, answered in the page.
  log("approval for a runner-backed environment");
  const shared = await call(ALICE, "POST", "/v1/sessions", { title: "Shared with bob" });
  await page.goto(`${BASE}/#/s/${shared.id}`);
  await page.getByRole("button", { name: "Share with the tenant" }).click();
  await page.getByRole("button", { name: "Make private" }).waitFor();
  check((await call(ALICE, "GET", `/v1/sessions/${shared.id}`)).session.access === "tenant", "the page shared the session");
  await call(ALICE, "POST", `/v1/sessions/${shared.id}/enqueue?lane=followUp`, {
    content: fake({ toolCalls: [{ name: "request_environment", arguments: { spec: `${RUNNER}:api`, name: "api" } }], afterTools: "attached api" }),
  });
  await poll("alice's attach", async () => assistantTexts(await transcript(ALICE, shared.id)).includes("attached api"));
  const marker = join(API_DIR, `approved-${Date.now()}`);
  await call(BOB, "POST", `/v1/sessions/${shared.id}/enqueue?lane=followUp`, {
    content: fake({ toolCalls: [{ name: "bash", arguments: { command: `touch '${marker}'` } }], afterTools: "touched it" }),
  });
  await page.goto(`${BASE}/#/s/${shared.id}`);
  const approval = page.getByTestId("approval");
  await approval.getByRole("button", { name: "Approve", exact: true }).waitFor();
  // The card speaks to people: who asks to do what, where, the exact command and when it
  // expires; not the model's wording with the API call to answer it.
  await approval.getByTestId("approval-summary").filter({ hasText: `bob asks to run bash on environment "api" on alice's local runner "${RUNNER}".` }).waitFor();
  await approval.getByTestId("approval-detail").filter({ hasText: `touch '${marker}'` }).waitFor();
  await approval.getByText(/expires in \d+ (min|h)/).waitFor();
  check(!(await approval.textContent()).includes("Answer with POST"), "the card does not show the model's API instructions");
  await page.getByTestId("environments").getByText("api", { exact: true }).waitFor();
  check(!existsSync(marker), "the call waits for alice before it runs");
  // Bob may prompt this group chat but not stop it: his page's Stop goes over his socket and
  // the server's 403 reply is shown as the HTTP error would be; the turn goes on.
  {
    const { context: bobContext, page: bobPage } = await signedInPage(BOB, "bob", BASE);
    try {
      await bobPage.goto(`${BASE}/#/s/${shared.id}`);
      await bobPage.locator("[data-transport=socket]").waitFor();
      await bobPage.getByTestId("approval").waitFor();
      // Two viewers see each other's queue live (queue_item_added / queue_item_removed): a
      // follow-up bob queues from his page shows in alice's queue without a reload, and goes
      // from it when bob takes it back.
      const bobsNote = `bob's follow-up ${Date.now()}`;
      await bobPage.getByRole("textbox", { name: "Message" }).fill(bobsNote);
      await bobPage.getByRole("textbox", { name: "Message" }).press("Enter");
      await page.getByTestId("queue").getByText(bobsNote).waitFor();
      await bobPage.getByTestId("queue").getByRole("button", { name: /Cancel "bob's follow-up/ }).click();
      await page.getByTestId("queue").getByText("Nothing waiting.").waitFor();
      await bobPage.getByRole("button", { name: "Stop" }).click();
      await bobPage.getByRole("alert").filter({ hasText: "(403 forbidden)" }).waitFor();
      check(loggedRequests(shared.id, "stop").length === 0, "bob's stop went over his socket");
      check((await call(ALICE, "GET", `/v1/sessions/${shared.id}`)).session.status === "running", "bob's refused stop stopped nothing");
    } finally {
      await bobContext.close();
    }
  }
  await shot("approval");
  await approval.getByRole("button", { name: "Approve", exact: true }).click();
  await approval.getByTestId("approval-decision").filter({ hasText: "approve by alice" }).waitFor();
  await assistantMessages().filter({ hasText: "touched it" }).waitFor();
  check(existsSync(marker), "the approved call ran on alice's machine");
  // 8a. A background job on alice's machine: listed on the session's page with where it ran,
  // how it ended and its output.
  log("background jobs");
  await call(ALICE, "POST", `/v1/sessions/${shared.id}/enqueue?lane=followUp`, {
    content: fake({ toolCalls: [{ name: "bash", arguments: { command: "echo from-the-job", background: true } }], afterTools: "job started" }),
  });
  await poll("the job's end", async () => {
    const listed = await call(ALICE, "GET", `/v1/sessions/${shared.id}/jobs`);
    return listed.jobs.length === 1 && listed.jobs[0].state === "succeeded";
  });
  await page.reload();
  const jobsPanel = page.getByTestId("jobs");
  await jobsPanel.locator("li[data-state=succeeded]").filter({ hasText: "echo from-the-job" }).waitFor();
  await jobsPanel.getByText(/Output \(1 lines\)/).click();
  await jobsPanel.getByText("from-the-job", { exact: true }).waitFor();

  // 8a2. A running command's output shows while it runs, colours rendered; the result replaces
  // it when the command ends.
  log("live output of a running command");
  const go = join(API_DIR, `go-${Date.now()}`);
  await call(ALICE, "POST", `/v1/sessions/${shared.id}/enqueue?lane=followUp`, {
    content: fake({
      toolCalls: [{ name: "bash", arguments: { command: `printf '\\033[31mred-line\\033[0m\\n'; while [ ! -e '${go}' ]; do sleep 0.1; done; echo after-go` } }],
      afterTools: "ran it",
    }),
  });
  const terminal = page.getByTestId("live-output");
  const red = terminal.locator("span", { hasText: "red-line" });
  await red.waitFor();
  const [colour, around] = await red.evaluate((el) => [getComputedStyle(el).color, getComputedStyle(el.parentElement).color]);
  check((await red.getAttribute("class")) === "ansi-red-fg" && colour !== around, `the colour is rendered (${colour} in ${around})`);
  check(!(await terminal.textContent()).includes("\\033"), "no raw escape codes");
  writeFileSync(go, "");
  await assistantMessages().filter({ hasText: "ran it" }).waitFor();
  await poll("the live pane is gone", async () => (await page.getByTestId("live-output").count()) === 0);

  // 8b. An image a tool read (shot.png, 3x2, written by web_app.rs into the environment) is
  // shown in the transcript, loaded from GET /v1/blobs/:id with the cookie session.
  log("an image tool result");
  await call(ALICE, "POST", `/v1/sessions/${shared.id}/enqueue?lane=followUp`, {
    content: fake({ toolCalls: [{ name: "read", arguments: { path: "shot.png" } }], afterTools: "read the image" }),
  });
  await assistantMessages().filter({ hasText: "read the image" }).waitFor();
  const image = page.getByTestId("tool-image").first();
  await image.waitFor();
  const natural = await poll("the image decoded", async () => {
    const size = await image.evaluate((img) => (img.complete ? [img.naturalWidth, img.naturalHeight] : null));
    return size && size[0] > 0 ? size : null;
  });
  check(natural[0] === 3 && natural[1] === 2, `the image is the 3x2 PNG (${natural})`);
  const src = await image.getAttribute("src");
  check(/^\/v1\/blobs\/[0-9a-f-]{36}\.[0-9a-f]{32}$/.test(src ?? ""), `the image comes from the blob route (${src})`);
  const served = await page.evaluate(async (path) => {
    const response = await fetch(path);
    return [response.status, response.headers.get("content-type")];
  }, src);
  check(served[0] === 200 && served[1] === "image/png", `the blob is served as image/png with the cookie (${served})`);

  // 9. Workspace: create a document with frontmatter, then edit and save it again.
  log("workspace documents");
  const docPath = `notes/web-${Date.now()}.md`;
  await page.goto(`${BASE}/#/workspace/${docPath}`);
  await page.getByText("A new document").waitFor();
  const editor = page.getByLabel("Document text");
  await editor.fill("---\ntags: [web]\n---\n# Notes\n\nfirst draft\n");
  await page.getByRole("button", { name: "Save" }).click();
  await page.getByRole("status").filter({ hasText: "Saved" }).waitFor();
  await page.getByRole("list", { name: "Documents" }).getByText(docPath).waitFor();
  await page.reload();
  await poll("the saved text in the editor", async () => (await editor.inputValue()).includes("first draft"));
  await editor.fill((await editor.inputValue()).replace("first draft", "second draft"));
  await page.keyboard.press("Control+s");
  await page.getByRole("status").filter({ hasText: "Saved" }).waitFor();
  const saved = await call(ALICE, "GET", `/v1/workspace/docs/${docPath}`);
  check(saved.content === "---\ntags: [web]\n---\n# Notes\n\nsecond draft\n", `the document was saved as edited (${JSON.stringify(saved.content)})`);
  check(JSON.stringify(saved.frontmatter) === JSON.stringify({ tags: ["web"] }), `frontmatter kept (${JSON.stringify(saved.frontmatter)})`);
  await shot("workspace");

  // 10. Runners and environment definitions.
  log("runners and environment definitions");
  await page.getByRole("link", { name: "Runners" }).click();
  await page.getByRole("table", { name: "Runners" }).getByText(RUNNER, { exact: true }).waitFor();
  await page.getByRole("button", { name: "New definition" }).click();
  const defForm = page.getByRole("form", { name: "New environment definition" });
  await defForm.getByLabel("Name").fill("web-env");
  await defForm.getByLabel("Runner").fill(RUNNER);
  await defForm.getByLabel("Path").fill(API_DIR);
  await defForm.getByRole("button", { name: "Create" }).click();
  const defs = page.getByRole("table", { name: "Environment definitions" });
  await defs.getByText("web-env").waitFor();
  await defs.getByRole("row", { name: /web-env/ }).getByRole("button", { name: "Edit" }).click();
  const editForm = page.getByRole("form", { name: "Edit web-env" });
  await editForm.getByLabel("Approval").selectOption("ask");
  await editForm.getByRole("button", { name: "Save" }).click();
  await defs.getByRole("row", { name: /web-env/ }).getByText("ask", { exact: true }).waitFor();
  // A runner token minted by the page, and the command it shows, connect a real runner.
  await page.getByText("Register a runner").click();
  await page.getByLabel("Runner name").fill("web-runner");
  // A cookie session cannot mint by itself: the page asks for the token it was made from.
  check(await page.getByRole("button", { name: "Create a runner token" }).isDisabled(), "no runner token without the confirming token");
  await page.getByLabel("Confirm with your token").fill(ALICE);
  await page.getByRole("button", { name: "Create a runner token" }).click();
  const commandBox = page.getByTestId("register-command");
  await commandBox.filter({ hasText: /WUHU_RUNNER_TOKEN=ey/ }).waitFor();
  const command = await commandBox.innerText();
  const runnerToken = command.match(/WUHU_RUNNER_TOKEN=(\S+)/)[1];
  const server = command.match(/--server (\S+)/)[1];
  check(server === BASE && command.includes("--name web-runner"), `the command names this server and the runner (${command})`);
  await shot("runners");
  const runnerHome = join(API_DIR, "..", "web-runner-home");
  mkdirSync(runnerHome, { recursive: true });
  const runnerProcess = spawn(RUNNER_BIN, ["register", "--server", server, "--name", "web-runner"], {
    env: { HOME: runnerHome, PATH: "/usr/local/bin:/usr/bin:/bin", WUHU_RUNNER_TOKEN: runnerToken },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let runnerLog = "";
  runnerProcess.stdout.on("data", (d) => (runnerLog += d));
  runnerProcess.stderr.on("data", (d) => (runnerLog += d));
  try {
    await poll("the runner to connect with the page's token", async () => {
      if (runnerProcess.exitCode !== null) throw new Error(`the runner exited: ${runnerLog}`);
      return runnerLog.includes("connected to");
    });
    await page.reload();
    await page.getByRole("table", { name: "Runners" }).getByRole("row", { name: /web-runner.*connected/ }).waitFor();
  } finally {
    runnerProcess.kill("SIGKILL");
  }
  page.once("dialog", (dialog) => dialog.accept());
  await defs.getByRole("row", { name: /web-env/ }).getByRole("button", { name: "Delete" }).click();
  await defs.getByText("web-env").waitFor({ state: "detached" });
  const remaining = await call(ALICE, "GET", "/v1/environments");
  check(!remaining.environments.some((d) => d.name === "web-env"), "the definition was deleted");

  // 10b. Tokens: mint a personal token from the page with the keyboard, see it once and copy
  // it, use it against the API; mint a runner token and see the command that registers it;
  // revoke the personal one after a confirm (Escape backs out first): the API then refuses it.
  log("tokens");
  await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: BASE });
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Tokens" }).click();
  const mintForm = page.getByRole("form", { name: "New token" });
  await mintForm.getByLabel("Name").fill("web-cli");
  await mintForm.getByLabel("Kind").selectOption("user");
  await mintForm.getByLabel("Lifetime (days)").fill("7");
  check(await mintForm.getByRole("button", { name: "Create token" }).isDisabled(), "no token without the confirming token");
  // A wrong token is the server's 401 for that token alone: shown, and the page stays signed in.
  expectingWrongToken = true;
  await mintForm.getByLabel("Confirm with your token").fill("not.a.token");
  await mintForm.getByLabel("Name").press("Enter");
  await mintForm.getByRole("alert").filter({ hasText: "401" }).waitFor();
  expectingWrongToken = false;
  await page.getByTestId("whoami").filter({ hasText: "alice" }).waitFor();
  await mintForm.getByLabel("Confirm with your token").fill(ALICE);
  await mintForm.getByLabel("Name").press("Enter");
  const minted = page.getByTestId("minted");
  const personal = (await minted.getByTestId("minted-token").innerText()).trim();
  check(/^ey[\w-]+\.[\w-]+\.[\w-]+$/.test(personal), `the page shows the new token (${personal.slice(0, 20)}…)`);
  check(
    await page.evaluate(() => document.activeElement?.closest("[data-testid=minted]") != null),
    "focus moves to the new token",
  );
  await minted.getByRole("button", { name: "Copy the token" }).click();
  await minted.getByRole("button", { name: "Copy the token" }).filter({ hasText: "Copied" }).waitFor();
  check((await page.evaluate(() => navigator.clipboard.readText())) === personal, "Copy put the token on the clipboard");
  const bearer = (token, path) => fetch(BASE + path, { headers: { authorization: `Bearer ${token}` } });
  const mintedMe = await call(personal, "GET", "/v1/auth/me");
  check(mintedMe.sub === "alice" && mintedMe.via === "bearer", `the minted token works against the API (${JSON.stringify(mintedMe)})`);
  check((await bearer(personal, "/v1/sessions?limit=1")).status === 200, "the minted token lists sessions");
  const tokensTable = page.getByRole("table", { name: "Tokens" });
  const webCliRow = tokensTable.getByRole("row", { name: /web-cli/ });
  await webCliRow.getByText("personal").waitFor();
  const listedTokens = await call(ALICE, "GET", "/v1/tokens");
  const webCli = listedTokens.tokens.find((t) => t.name === "web-cli");
  check(webCli && webCli.expiresAt - webCli.createdAt === 7 * 86400, `listed with its 7-day lifetime (${JSON.stringify(webCli)})`);
  check(!JSON.stringify(listedTokens).includes(personal), "the list never holds the token");
  await minted.getByRole("button", { name: "Done, hide it" }).click();
  await minted.waitFor({ state: "detached" });
  check(!(await page.content()).includes(personal.split(".")[2]), "once hidden, the token is nowhere on the page");
  await mintForm.getByLabel("Name").fill("web-box");
  await mintForm.getByLabel("Kind").selectOption("runner");
  await mintForm.getByLabel("Confirm with your token").fill(ALICE);
  await mintForm.getByRole("button", { name: "Create token" }).click();
  const mintedCommand = (await page.getByTestId("minted-command").innerText()).trim();
  const runnerMinted = (await minted.getByTestId("minted-token").innerText()).trim();
  check(
    mintedCommand.includes(`WUHU_RUNNER_TOKEN=${runnerMinted}`) &&
      mintedCommand.includes(`wuhu-runner register --server ${BASE} --name web-box`),
    `the runner token comes with its register command (${mintedCommand.replace(runnerMinted, "<token>")})`,
  );
  await tokensTable.getByRole("row", { name: /web-box/ }).getByText("runner").waitFor();
  await minted.getByRole("button", { name: "Copy the command" }).click();
  check((await page.evaluate(() => navigator.clipboard.readText())) === mintedCommand, "Copy put the command on the clipboard");
  await shot("tokens", true);
  const revokeWebCli = tokensTable.getByRole("button", { name: 'Revoke "web-cli"' });
  const confirmRevoke = tokensTable.getByRole("group", { name: 'Confirm revoking "web-cli"' });
  await revokeWebCli.focus();
  await page.keyboard.press("Enter");
  await confirmRevoke.waitFor();
  await page.keyboard.press("Escape");
  await confirmRevoke.waitFor({ state: "detached" });
  await poll("focus back on the Revoke button", () => revokeWebCli.evaluate((b) => b === document.activeElement));
  check((await bearer(personal, "/v1/sessions?limit=1")).status === 200, "backing out revoked nothing");
  await page.keyboard.press("Enter");
  await poll("focus on the confirm button", () =>
    confirmRevoke.getByRole("button", { name: "Yes, revoke" }).evaluate((b) => b === document.activeElement),
  );
  await page.keyboard.press("Enter");
  await webCliRow.waitFor({ state: "detached" });
  const refusedAfterRevoke = await bearer(personal, "/v1/sessions?limit=1");
  const refusal = await refusedAfterRevoke.json();
  check(
    refusedAfterRevoke.status === 401 && /revoked/.test(refusal.error?.message ?? ""),
    `the revoked token is refused (${refusedAfterRevoke.status} ${JSON.stringify(refusal)})`,
  );
  check(!(await call(ALICE, "GET", "/v1/tokens")).tokens.some((t) => t.name === "web-cli"), "the revoked token is no longer listed");
  await page.getByTestId("whoami").filter({ hasText: "alice" }).waitFor();

  // 10b. Secrets: one is set (its value never shows again), listed, refused with a bad name
  // (the server's 400 in the form), and deleted after a confirm.
  log("secrets");
  {
    const value = `web-secret-${Date.now()}-value`;
    await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Secrets" }).click();
    const form = page.getByRole("form", { name: "Set a secret" });
    await form.getByLabel("Name").fill("WEB_TOKEN");
    await form.getByLabel("Value").fill(value);
    await form.getByLabel("Environments").fill("ci, deploy");
    await form.getByRole("button", { name: "Save" }).click();
    await form.getByRole("status").filter({ hasText: "Saved your secret WEB_TOKEN" }).waitFor();
    check((await form.getByLabel("Value").inputValue()) === "", "the value field is cleared once saved");
    const row = page.getByRole("table", { name: "Secrets" }).getByRole("row", { name: /WEB_TOKEN/ });
    await row.getByText("ci, deploy").waitFor();
    check(!(await page.content()).includes(value), "the secret's value is nowhere on the page");
    const listed = await call(ALICE, "GET", "/v1/secrets");
    check(
      listed.secrets.some((x) => x.name === "WEB_TOKEN") && !JSON.stringify(listed).includes(value),
      "the API lists it without its value",
    );
    expectingBadRequest = true;
    await form.getByLabel("Name").fill("lower");
    await form.getByLabel("Value").fill("x-value");
    await form.getByRole("button", { name: "Save" }).click();
    await form.getByRole("alert").filter({ hasText: "environment variable name" }).waitFor();
    expectingBadRequest = false;
    await row.getByRole("button", { name: "Delete WEB_TOKEN" }).click();
    await page.getByRole("group", { name: "Confirm deleting WEB_TOKEN" }).getByRole("button", { name: "Yes, delete" }).click();
    await row.waitFor({ state: "detached" });
    check(!(await call(ALICE, "GET", "/v1/secrets")).secrets.some((x) => x.name === "WEB_TOKEN"), "deleted");
  }

  // 10b2. MCP servers: alice's own list (written through the API) shows on the MCP page with its
  // bearer secret's name; asking a server that cannot be reached shows why (the server's 502),
  // with the keyboard.
  log("MCP servers");
  {
    await call(ALICE, "PUT", "/v1/workspace/docs/users/alice/mcp.json", {
      servers: [{ name: "tracker", url: "http://127.0.0.1:9/mcp", auth: { type: "bearer", secret: "TRACKER_TOKEN" }, approval: "ask" }],
    });
    await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "MCP" }).click();
    const card = page.getByTestId("mcp-server-tracker");
    await card.getByText("bearer TRACKER_TOKEN").waitFor();
    await card.getByText("each call waits for approval").waitFor();
    expectingBadGateway = true;
    await card.getByRole("button", { name: "Show tools" }).focus();
    await page.keyboard.press("Enter");
    await card.getByRole("alert").filter({ hasText: "egress refused" }).waitFor();
    expectingBadGateway = false;
  }

  // 10c. Other origins. A page on the listed origin may call the API with a bearer token; an
  // unlisted one may not read the answer. And a request from another origin of the same site
  // (so the SameSite=Strict cookie rides along) that would change something is refused.
  log("CORS and cross-site requests");
  const elsewhere = (port) =>
    new Promise((resolve) => {
      const server = createServer((_, res) => {
        res.writeHead(200, { "content-type": "text/html" });
        res.end('<!doctype html><html><head><link rel="icon" href="data:,"></head><body>elsewhere</body></html>');
      });
      server.listen(port, "127.0.0.1", () => resolve(server));
    });
  const servers = [await elsewhere(ALLOWED_PORT), await elsewhere(FOREIGN_PORT)];
  try {
    const readSessions = (base, token) =>
      fetch(`${base}/v1/sessions?limit=1`, { headers: { authorization: `Bearer ${token}` } }).then(
        async (r) => ({ status: r.status, body: await r.json() }),
        (e) => ({ failed: String(e) }),
      );
    await page.goto(`http://127.0.0.1:${ALLOWED_PORT}/`);
    const allowed = await page.evaluate(`(${readSessions})(${JSON.stringify(BASE)}, ${JSON.stringify(BOB)})`);
    check(allowed.status === 200 && Array.isArray(allowed.body.sessions), `a listed origin reads the API (${JSON.stringify(allowed)})`);
    await page.goto(`http://127.0.0.1:${FOREIGN_PORT}/`);
    expectingRefusals = true;
    const refused = await page.evaluate(`(${readSessions})(${JSON.stringify(BASE)}, ${JSON.stringify(BOB)})`);
    check(refused.failed, `an unlisted origin cannot read the API (${JSON.stringify(refused)})`);

    const before = (await call(ALICE, "GET", "/v1/sessions?limit=200")).sessions.length;
    await page.evaluate(
      `fetch(${JSON.stringify(BASE + "/v1/sessions")}, { method: "POST", mode: "no-cors", credentials: "include",
         headers: { "content-type": "text/plain" }, body: JSON.stringify({ title: "planted" }) }).then(() => "sent", String)`,
    );
    // The refusal is a 403 (the cookie was sent and checked), not a 401 (no credential).
    await poll("the Worker to log the refused cross-site POST", async () =>
      readFileSync(STACK_LOG, "utf8")
        .split("\n")
        .some((line) => line.includes('"method":"POST","path":"/v1/sessions"') && line.includes('"status":403')),
    );
    const after = await call(ALICE, "GET", "/v1/sessions?limit=200");
    check(after.sessions.length === before && !after.sessions.some((x) => x.title === "planted"), "the cross-site POST created nothing");
    expectingRefusals = false;
  } finally {
    for (const server of servers) server.close();
  }
  await page.goto(`${BASE}/#/sessions`);
  await page.getByTestId("whoami").filter({ hasText: "alice" }).waitFor();

  // 11. Phone width: the session view fits without sideways scrolling.
  log("phone width");
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(`${BASE}/#/s/${sessionId}`);
  await assistantMessages().first().waitFor();
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 0, `no sideways scrolling at phone width (overflow ${overflow}px)`);
  await shot("phone");
  await page.goto(`${BASE}/#/tokens`);
  await page.getByRole("table", { name: "Tokens" }).getByText("web-box").waitFor();
  const tokensOverflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(tokensOverflow <= 0, `the tokens page fits at phone width (overflow ${tokensOverflow}px)`);

  // 11b. A cookie session revoked while its page shows a session (here: logged out behind the
  // app's back, as a revoke elsewhere would): the server closes the socket (4401) within its
  // 5 s re-check and the page goes back to sign-in.
  log("a revoked cookie session's socket");
  {
    // The page's own requests after the revoke are refused (401), as they should be.
    const { context: revokedContext, page: revokedPage } = await signedInPage(ALICE, "alice", BASE, /status of 401|WebSocket connection to/);
    try {
      await revokedPage.goto(`${BASE}/#/s/${sessionId}`);
      await revokedPage.locator("[data-transport=socket]").waitFor();
      const status = await revokedPage.evaluate(() => fetch("/v1/auth/logout", { method: "POST" }).then((r) => r.status));
      check(status === 200, `the cookie session was revoked (${status})`);
      await revokedPage.getByLabel("Your token", { exact: true }).waitFor({ timeout: 15_000 });
    } finally {
      await revokedContext.close();
    }
  }

  // 11c. Sign out everywhere, as bob in a browser of his own: the Tokens page lists this
  // browser's session, and ending everything sends the page back to sign-in; the cookie is
  // refused from then on.
  log("sign out everywhere");
  {
    const { context: bobContext, page: bobPage } = await signedInPage(BOB, "bob", BASE, /status of 401/);
    try {
      await bobPage.goto(`${BASE}/#/tokens`);
      const tokens = bobPage.getByRole("table", { name: "Tokens" });
      await tokens.getByRole("row", { name: /this browser/ }).getByText("browser session", { exact: true }).waitFor();
      await bobPage.getByRole("button", { name: "Sign out everywhere" }).click();
      await bobPage.getByRole("group", { name: "Confirm signing out everywhere" }).getByRole("button", { name: "Yes, end them all" }).click();
      await bobPage.getByLabel("Your token", { exact: true }).waitFor({ timeout: 15_000 });
      const me = await bobPage.evaluate(() => fetch("/v1/auth/me").then((r) => r.status));
      check(me === 401, `bob's cookie is refused after signing out everywhere (${me})`);
    } finally {
      await bobContext.close();
    }
  }

  // 12. Sign out.
  log("sign out");
  await page.getByRole("button", { name: "Sign out", exact: true }).click();
  await page.getByLabel("Your token", { exact: true }).waitFor();

  check(consoleErrors.length === 0, `no console errors:\n${consoleErrors.join("\n")}`);
  log("all steps passed");
} catch (error) {
  failed = true;
  console.error(`FAILED: ${error?.stack ?? error}`);
  if (consoleErrors.length) console.error(`console errors so far:\n${consoleErrors.join("\n")}`);
  try {
    const html = await page.locator("main").innerHTML({ timeout: 2000 });
    console.error(`the page's main element ends with:\n${html.slice(-3000)}`);
  } catch {
    // The page may be gone.
  }
  try {
    const dir = SHOTS ?? process.env.WUHU_FAILURE_DIR;
    if (dir) {
      mkdirSync(dir, { recursive: true });
      await page.screenshot({ path: join(dir, "failure.png"), fullPage: true });
      console.error(`screenshot: ${join(dir, "failure.png")}`);
    }
  } catch {
    // The page may be gone.
  }
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
