// Drives Wuhu's MCP server with the official TypeScript SDK client
// (@modelcontextprotocol/sdk, streamable HTTP): alice creates a session, sends a message, waits
// for the reply and reads it; bob, another member, tries to see it. Prints one JSON object of
// what it saw; tests/tests/mcp.rs checks it. Env: WUHU_MCP_URL, WUHU_ALICE_TOKEN, WUHU_BOB_TOKEN,
// WUHU_DOC (a workspace path).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.env.WUHU_MCP_URL);

async function connect(token) {
  const client = new Client({ name: "wuhu-e2e", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(url, {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  return client;
}

const out = {};
const alice = await connect(process.env.WUHU_ALICE_TOKEN);
out.server = alice.getServerVersion();
out.tools = (await alice.listTools()).tools.map((t) => t.name).sort();

const created = await alice.callTool({
  name: "session_create",
  arguments: { title: "over MCP", provider: "fake" },
});
out.createdError = created.isError;
const id = created.structuredContent.id;
out.id = id;
const sent = await alice.callTool({
  name: "session_send",
  arguments: { id, content: "hello over mcp" },
});
out.sentError = sent.isError;
const waited = await alice.callTool({ name: "session_wait", arguments: { id, timeoutSeconds: 40 } });
out.waited = waited.structuredContent;
// A wait that asks for progress: what the agent writes arrives as notifications/progress
// before the result (the fake model streams a reply in 6 pieces, 300 ms apart).
const slow = { reply: "one two three four five six seven eight nine ten eleven twelve", chunks: 6, delayMs: 300 };
await alice.callTool({ name: "session_send", arguments: { id, content: `@fake ${JSON.stringify(slow)}` } });
const notes = [];
const streamed = await alice.callTool(
  { name: "session_wait", arguments: { id, timeoutSeconds: 40 } },
  undefined,
  { onprogress: (p) => notes.push({ progress: p.progress, message: p.message }) },
);
out.progressNotes = notes;
out.progressWaited = streamed.structuredContent;
const read = await alice.callTool({ name: "session_read", arguments: { id } });
out.readEntries = read.structuredContent.transcript.length;
const approvals = await alice.callTool({ name: "approvals_list", arguments: { id } });
out.approvals = approvals.structuredContent.approvals;

const doc = process.env.WUHU_DOC;
await alice.callTool({ name: "workspace_write", arguments: { path: doc, content: "written over MCP\n" } });
const docRead = await alice.callTool({ name: "workspace_read", arguments: { path: doc } });
out.docContent = docRead.structuredContent.content;

// Resources: her sessions are listed; a session and a document are read by URI.
out.resources = (await alice.listResources()).resources.map((r) => r.uri);
out.templates = (await alice.listResourceTemplates()).resourceTemplates.map((t) => t.uriTemplate);
const sessionResource = await alice.readResource({ uri: `wuhu://session/${id}` });
out.sessionResource = JSON.parse(sessionResource.contents[0].text).transcript.length;
const docResource = await alice.readResource({ uri: `wuhu://workspace/${doc}` });
out.docResource = docResource.contents[0].text;

try {
  await alice.callTool({ name: "rm_rf", arguments: {} });
  out.unknownTool = "answered";
} catch (e) {
  out.unknownTool = e.code;
}

const bob = await connect(process.env.WUHU_BOB_TOKEN);
const bobList = await bob.callTool({ name: "sessions_list", arguments: {} });
out.bobSees = bobList.structuredContent.sessions.some((s) => s.id === id);
const bobRead = await bob.callTool({ name: "session_read", arguments: { id } });
out.bobRead = { isError: bobRead.isError, text: bobRead.content[0].text };
const bobSend = await bob.callTool({ name: "session_send", arguments: { id, content: "let me in" } });
out.bobSend = { isError: bobSend.isError, text: bobSend.content[0].text };
out.bobResources = (await bob.listResources()).resources.map((r) => r.uri);
try {
  await bob.readResource({ uri: `wuhu://session/${id}` });
  out.bobResource = "answered";
} catch (e) {
  out.bobResource = e.code;
}

await alice.close();
await bob.close();
console.log(JSON.stringify(out));
