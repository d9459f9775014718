//! Wuhu as an MCP client (issue 33, decision 0039) against the real Worker: the official
//! reference server (`@modelcontextprotocol/server-everything`, streamable HTTP) through
//! `mcp_tools`, `mcp_call`, js `wuhu.mcp.*` and `read wuhu://mcp/…` (text, an image, resources,
//! a tool with progress); a server that hangs, one that answers 5 MiB and one that answers what
//! is not JSON-RPC are tool errors and the session works on; authority travels: a user's own
//! server, with her own secret as its bearer, serves only turns for her alone (not another
//! member's turn in her shared session, not a child that turn spawns, a child of her own turn
//! does), and the credential never reaches the transcript. One stack for the file; every test
//! uses its own tenant.

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{Entry, ToolResult};
use wuhu_e2e::entries::{fake_directive, results_of};
use wuhu_e2e::mcp_servers::{BrokenMcpServer, NodeMcpServer};
use wuhu_e2e::util::{random_hex, unique_name};
use wuhu_e2e::{Api, Stack, StackOptions};

const TURN: Duration = Duration::from_secs(60);

struct Fixture {
    stack: Stack,
    everything: NodeMcpServer,
    broken: BrokenMcpServer,
    oauth: NodeMcpServer,
    /// The reference server over the legacy HTTP+SSE transport.
    legacy: NodeMcpServer,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let everything = NodeMcpServer::everything();
        let broken = BrokenMcpServer::start();
        let oauth = NodeMcpServer::sdk_example_with_oauth();
        let legacy = NodeMcpServer::everything_sse();
        let stack = Stack::start_with(StackOptions {
            vars: vec![(
                "WUHU_SANDBOX_EGRESS_ALLOW".to_string(),
                format!(
                    "{},{},{},{}",
                    everything.egress_allow(),
                    broken.host_port(),
                    oauth.egress_allow(),
                    legacy.egress_allow()
                ),
            )],
            fake_delay_ms: Some(0),
            ..StackOptions::default()
        });
        Fixture {
            stack,
            everything,
            broken,
            oauth,
            legacy,
        }
    })
}

/// A tenant whose admins list the reference server as `every` and the broken one as `broken`
/// (3 s per request); returns alice's client.
fn tenant(prefix: &str) -> (String, Api) {
    let f = fixture();
    let tenant = unique_name(prefix);
    let admin = f.stack.admin_client("root", &tenant);
    let config = json!({"servers": [
        {"name": "every", "url": f.everything.url(), "tools": {"deny": ["toggle-*"]}},
        {"name": "broken", "url": f.broken.url(), "timeoutSeconds": 3},
    ]});
    admin
        .put_doc("config/mcp.json", config.to_string())
        .expect_status(200);
    let alice = f.stack.client("alice", &tenant);
    (tenant, alice)
}

#[track_caller]
fn ok(result: &ToolResult) -> &str {
    assert!(!result.is_error, "{}", result.content);
    &result.content
}

#[track_caller]
fn failed(result: &ToolResult) -> &str {
    assert!(result.is_error, "{}", result.content);
    &result.content
}

#[test]
fn the_reference_server_through_the_tool_pair_js_and_read() {
    let _guard = fixture().stack.guard();
    let (_, alice) = tenant("mcp-every");
    let id = alice.create_fake_session().id;

    let servers = alice.run_tool(&id, "mcp_tools", json!({}), TURN);
    assert!(
        ok(&servers).contains("- every (the tenant's; 127.0.0.1)"),
        "{}",
        servers.content
    );
    let tools = alice.run_tool(&id, "mcp_tools", json!({"server": "every"}), TURN);
    let listed = ok(&tools);
    for name in ["## echo", "## get-sum", "## get-tiny-image"] {
        assert!(listed.contains(name), "{name} missing:\n{listed}");
    }
    // The document's filter hides what it denies, from the listing and from calls.
    assert!(!listed.contains("toggle-"), "{listed}");
    let found = alice.run_tool(&id, "mcp_tools", json!({"query": "sum"}), TURN);
    assert!(ok(&found).contains("## get-sum") && !found.content.contains("## echo"));

    let results = alice.run_tool_calls(
        &id,
        &[
            (
                "mcp_call",
                json!({"server": "every", "tool": "echo", "arguments": {"message": "hi there"}}),
            ),
            (
                "mcp_call",
                json!({"server": "every", "tool": "get-sum", "arguments": {"a": 2, "b": 40}}),
            ),
            (
                "mcp_call",
                json!({"server": "every", "tool": "get-tiny-image"}),
            ),
            (
                "mcp_call",
                json!({"server": "every", "tool": "get-resource-reference", "arguments": {"resourceId": 3}}),
            ),
            (
                "mcp_call",
                json!({"server": "every", "tool": "trigger-long-running-operation", "arguments": {"duration": 1, "steps": 2}}),
            ),
            (
                "mcp_call",
                json!({"server": "every", "tool": "toggle-simulated-logging"}),
            ),
            (
                "mcp_call",
                json!({"server": "every", "tool": "get-sum", "arguments": {"a": "two"}}),
            ),
        ],
        TURN,
    );
    assert_eq!(ok(&results[0]), "Echo: hi there");
    assert!(ok(&results[1]).contains("The sum of 2 and 40 is 42."));
    // The image is stored as a blob and attached for the model to see.
    let image = ok(&results[2]);
    assert!(image.contains("[image: image/png"), "{image}");
    assert_eq!(results[2].blobs.len(), 1, "{image}");
    assert_eq!(results[2].blobs[0].media_type, "image/png");
    assert_eq!(results[2].blobs[0].width, Some(20));
    // An embedded resource is shown with its URI.
    assert!(
        ok(&results[3]).contains("[resource demo://resource/dynamic/text/3]"),
        "{}",
        results[3].content
    );
    assert!(
        ok(&results[4]).contains("Long running operation completed"),
        "{}",
        results[4].content
    );
    assert!(
        failed(&results[5]).contains("does not offer the tool \"toggle-simulated-logging\""),
        "{}",
        results[5].content
    );
    // A tool's own failure names the server and says what the server said.
    let bad = failed(&results[6]);
    assert!(bad.starts_with("MCP server \"every\""), "{bad}");

    // A long call's progress notifications reach a follower while it runs, as live output.
    let mut follow = alice.follow(&id, "timeoutSeconds=60");
    let marker = format!("progress done {}", random_hex(4));
    alice.enqueue(
        &id,
        "followUp",
        &fake_directive(&json!({"toolCalls": [{"name": "mcp_call", "arguments": {
            "server": "every", "tool": "trigger-long-running-operation",
            "arguments": {"duration": 2, "steps": 4}}}], "afterTools": marker})),
    );
    // (The marker is in the prompt too: the turn ends with the assistant's message saying it.)
    let events = follow.collect_until(TURN, |e| {
        e.data["entry"]["message"]["role"] == "assistant" && e.raw_data.contains(&marker)
    });
    let progress: Vec<String> = events
        .iter()
        .filter(|e| e.event == "tool_output_delta")
        .map(|e| e.data["text"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        progress.iter().any(|t| t.contains("[progress 1/4]")),
        "no progress shown: {progress:?}"
    );
    let stored = serde_json::to_string(&alice.transcript(&id)).unwrap();
    assert!(
        !stored.contains("[progress 1/4]"),
        "live output is never stored"
    );

    // Resources by URL, through `read`.
    let read = alice.run_tool(
        &id,
        "read",
        json!({"path": "wuhu://mcp/every/demo://resource/static/document/architecture.md"}),
        TURN,
    );
    assert!(ok(&read).contains("[resource demo://resource/static/document/architecture.md]"));
    let missing = alice.run_tool(
        &id,
        "read",
        json!({"path": "wuhu://mcp/every/demo://nothing/here"}),
        TURN,
    );
    assert!(failed(&missing).starts_with("MCP server \"every\": resources/read"));

    // A script fans out and reduces before anything reaches the context.
    let js = alice.run_tool(
        &id,
        "js",
        json!({"code": r#"
            const tools = await wuhu.mcp.list("every");
            const sums = await Promise.all([1, 2, 3].map((n) => wuhu.mcp.call("every", "get-sum", {a: n, b: n})));
            ({tools: tools.length, hasEcho: tools.some((t) => t.name === "echo"),
              sums: sums.map((r) => r.content[0].text), servers: (await wuhu.mcp.list()).map((s) => s.name)})
        "#}),
        TURN,
    );
    let value: Value = serde_json::from_str(ok(&js).split("\n\nconsole:").next().unwrap())
        .unwrap_or_else(|e| panic!("{e}: {}", js.content));
    assert_eq!(value["hasEcho"], true, "{value}");
    assert_eq!(
        value["sums"],
        json!([
            "The sum of 1 and 1 is 2.",
            "The sum of 2 and 2 is 4.",
            "The sum of 3 and 3 is 6."
        ])
    );
    assert_eq!(value["servers"], json!(["every", "broken"]));
}

#[test]
fn a_server_on_the_legacy_sse_transport_serves_the_same_tool_pair_js_and_read() {
    let f = fixture();
    let _guard = f.stack.guard();
    let tenant = unique_name("mcp-legacy");
    let admin = f.stack.admin_client("root", &tenant);
    let config = json!({"servers": [
        {"name": "old", "url": f.legacy.url(), "transport": "sse", "timeoutSeconds": 20},
        // A streamable HTTP server said to be legacy: its answer is not an event stream.
        {"name": "mislabelled", "url": f.everything.url(), "transport": "sse", "timeoutSeconds": 5},
    ]});
    admin
        .put_doc("config/mcp.json", config.to_string())
        .expect_status(200);
    let alice = f.stack.client("alice", &tenant);
    let id = alice.create_fake_session().id;

    let tools = alice.run_tool(&id, "mcp_tools", json!({"server": "old"}), TURN);
    for name in ["## echo", "## get-sum", "## get-tiny-image"] {
        assert!(ok(&tools).contains(name), "{name}:\n{}", tools.content);
    }
    let results = alice.run_tool_calls(
        &id,
        &[
            (
                "mcp_call",
                json!({"server": "old", "tool": "echo", "arguments": {"message": "over sse"}}),
            ),
            (
                "mcp_call",
                json!({"server": "old", "tool": "get-tiny-image"}),
            ),
            (
                "mcp_call",
                json!({"server": "old", "tool": "trigger-long-running-operation", "arguments": {"duration": 1, "steps": 2}}),
            ),
            (
                "read",
                json!({"path": "wuhu://mcp/old/demo://resource/static/document/architecture.md"}),
            ),
            (
                "js",
                json!({"code": "const r = await Promise.all([1, 2, 3].map(n => wuhu.mcp.call('old', 'get-sum', {a: n, b: n}))); r.map(x => x.content[0].text).join(' | ')"}),
            ),
            ("mcp_call", json!({"server": "mislabelled", "tool": "echo"})),
        ],
        TURN,
    );
    assert_eq!(ok(&results[0]), "Echo: over sse");
    assert!(
        ok(&results[1]).contains("[image: image/png"),
        "{}",
        results[1].content
    );
    assert_eq!(results[1].blobs.len(), 1);
    assert!(
        ok(&results[2]).contains("Long running operation completed"),
        "{}",
        results[2].content
    );
    assert!(ok(&results[3]).contains("[resource demo://resource/static/document/architecture.md]"));
    assert_eq!(
        ok(&results[4]),
        // The script's value, as JSON.
        "\"The sum of 1 and 1 is 2. | The sum of 2 and 2 is 4. | The sum of 3 and 3 is 6.\""
    );
    let mislabelled = failed(&results[5]);
    assert!(
        mislabelled.contains("mislabelled")
            && mislabelled.contains("HTTP 400: its event stream did not open"),
        "{mislabelled}"
    );

    // The tenant's usage counts the model's MCP calls by server, and the failed one; another
    // member sees none of alice's (members see the sessions they own), an admin all of them.
    let counted = wuhu_e2e::wait_until(Duration::from_secs(20), || {
        let usage = alice.get("/v1/usage").json();
        (usage["mcp"]["calls"] == 4 && usage["mcp"]["errors"] == 1).then_some(usage)
    })
    .unwrap_or_else(|_| panic!("{}", alice.get("/v1/usage").json()));
    assert_eq!(
        counted["mcp"]["byServer"],
        json!([{"server": "old", "calls": 3}, {"server": "mislabelled", "calls": 1}]),
        "{counted}"
    );
    let bob = f.stack.client("bob", &tenant).get("/v1/usage").json();
    assert_eq!(
        bob["mcp"],
        json!({"calls": 0, "errors": 0, "byServer": []}),
        "{bob}"
    );
    let all = admin.get("/v1/usage").json();
    assert_eq!(all["mcp"]["calls"], 4, "{all}");
}

#[test]
fn broken_servers_are_tool_errors_and_the_session_goes_on() {
    let _guard = fixture().stack.guard();
    let (_, alice) = tenant("mcp-broken");
    let id = alice.create_fake_session().id;
    let call = |tool: &str| ("mcp_call", json!({"server": "broken", "tool": tool}));
    let results = alice.run_tool_calls(
        &id,
        &[
            call("hang"),
            call("big"),
            call("malformed"),
            ("mcp_call", json!({"server": "nowhere", "tool": "x"})),
            (
                "mcp_call",
                json!({"server": "every", "tool": "echo", "arguments": "no"}),
            ),
        ],
        TURN,
    );
    assert_eq!(
        failed(&results[0]),
        "MCP server \"broken\": tools/call hang: no answer within 3 s"
    );
    assert_eq!(
        failed(&results[1]),
        "MCP server \"broken\": tools/call big: the answer is larger than 4 MiB"
    );
    assert!(
        failed(&results[2])
            .starts_with("MCP server \"broken\": tools/call malformed: a malformed answer: a body that is not JSON"),
        "{}",
        results[2].content
    );
    assert_eq!(
        failed(&results[3]),
        "No MCP server \"nowhere\" for this turn. Servers: every, broken."
    );
    assert!(failed(&results[4]).contains("arguments must be an object"));
    // The session works on: the next call, and the next turn.
    let after = alice.run_tool(
        &id,
        "mcp_call",
        json!({"server": "every", "tool": "echo", "arguments": {"message": "still here"}}),
        TURN,
    );
    assert_eq!(ok(&after), "Echo: still here");
    // A session's tools never change where its calls go.
    let write = alice.run_tool(
        &id,
        "write",
        json!({"path": "wuhu://workspace/users/alice/mcp.json", "content": "{\"servers\":[]}"}),
        TURN,
    );
    assert!(
        failed(&write).contains("lists MCP servers"),
        "{}",
        write.content
    );
    // A document that is not valid is refused when written, naming what is wrong.
    let admin = fixture()
        .stack
        .admin_client("root", &unique_name("mcp-bad-doc"));
    let bad = admin.put_doc(
        "config/mcp.json",
        r#"{"servers":[{"name":"x","url":"https://u:p@example.com/mcp"}]}"#,
    );
    assert_eq!(bad.status, 400, "{bad}");
    assert!(
        bad.text().contains("credentials do not belong in the URL"),
        "{bad}"
    );
}

/// The result of the one `mcp_call` a child makes (its task is the call).
fn childs_call(api: &Api, child: &str) -> ToolResult {
    let entries = api.wait_transcript(child, "the child's mcp_call", TURN, |e| {
        results_of(e, "mcp_call").len() == 1
    });
    results_of(&entries, "mcp_call").remove(0)
}

#[test]
fn a_users_own_server_serves_only_turns_for_her_alone() {
    let f = fixture();
    let _guard = f.stack.guard();
    let (tenant, alice) = tenant("mcp-own");
    let bob = f.stack.client("bob", &tenant);
    // The tenant keeps request logs: MCP requests are in them too.
    let admin = f.stack.admin_client("root", &tenant);
    admin
        .put_doc("config/tenant.json", r#"{"llmRequestLogs":true}"#)
        .expect_status(200);
    let value = format!("mcp-{}", random_hex(12));
    let put = alice.send(
        alice
            .request("PUT", "/v1/secrets/ALICE_MCP")
            .json(&json!({"value": value, "hosts": ["127.0.0.1"]})),
    );
    assert_eq!(put.status, 200, "{put}");
    let mine = json!({"servers": [{"name": "mine", "url": f.broken.url(),
        "auth": {"type": "bearer", "secret": "ALICE_MCP"}}]});
    alice
        .put_doc("users/alice/mcp.json", mine.to_string())
        .expect_status(200);
    // Bob may not list servers in alice's name.
    bob.put_doc("users/alice/mcp.json", mine.to_string())
        .expect_error(403);

    let id = alice.create_fake_session().id;
    let shared = alice.patch(&format!("/v1/sessions/{id}"), &json!({"access": "tenant"}));
    assert_eq!(shared.status, 200, "{shared}");
    let whoami = json!({"server": "mine", "tool": "whoami"});

    // Alice's own turn: her server, with her credential, which the transcript shows masked.
    let listed = alice.run_tool(&id, "mcp_tools", json!({}), TURN);
    assert!(
        ok(&listed).contains("- mine (alice's own; 127.0.0.1)"),
        "{}",
        listed.content
    );
    let own = alice.run_tool(&id, "mcp_call", whoami.clone(), TURN);
    assert_eq!(ok(&own), "you sent: Bearer [secret:ALICE_MCP]");
    let sent = f.broken.requests();
    assert!(
        sent.iter().any(|r| r
            .headers
            .iter()
            .any(|(k, v)| k == "authorization" && *v == format!("Bearer {value}"))),
        "the server never got alice's credential"
    );
    // In the tenant's request logs (admins read them): the JSON-RPC request and the server's
    // answer, her credential (which the server echoed) redacted.
    let (text, record) = wuhu_e2e::wait_until(Duration::from_secs(10), || {
        let listed = admin.get(&format!("/v1/llm-logs?session={id}")).json();
        listed["records"].as_array()?.iter().find_map(|r| {
            let logged = admin.get(&format!("/v1/llm-logs/{}", r["name"].as_str()?));
            let text = logged.text();
            let record: Value = serde_json::from_str(&text).ok()?;
            (record["request"]["body"]["params"]["name"] == "whoami").then_some((text, record))
        })
    })
    .expect("a request log of the MCP call");
    assert!(
        !text.contains(&value),
        "the credential is in the log: {text}"
    );
    assert_eq!(record["provider"], "mcp", "{record}");
    assert_eq!(record["model"], "mine", "{record}");
    assert_eq!(record["purpose"], "mcp", "{record}");
    assert_eq!(
        record["request"]["body"]["method"], "tools/call",
        "{record}"
    );
    assert_eq!(
        record["request"]["body"]["params"]["name"], "whoami",
        "{record}"
    );
    assert_eq!(record["response"]["status"], 200, "{record}");
    let answered = record["response"]["body"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(answered.starts_with("you sent: "), "{record}");
    assert!(
        answered.contains("[redacted]") || answered.contains("[secret:"),
        "{record}"
    );

    // Bob's turn in the same session: no such server for him.
    let theirs = bob.run_tool(&id, "mcp_call", whoami.clone(), TURN);
    assert_eq!(
        failed(&theirs),
        "No MCP server \"mine\" for this turn. Servers: every, broken."
    );
    let listed = bob.run_tool(&id, "mcp_tools", json!({}), TURN);
    assert!(!ok(&listed).contains("mine"), "{}", listed.content);

    // A child that bob's turn spawns acts for bob: no alice server either.
    let task = fake_directive(
        &json!({"toolCalls": [{"name": "mcp_call", "arguments": whoami}],
        "afterTools": "done"}),
    );
    let spawn = fake_directive(
        &json!({"toolCalls": [{"name": "spawn_session", "arguments": {"task": task}}],
        "afterTools": format!("spawned {}", random_hex(4))}),
    );
    bob.enqueue(&id, "followUp", &spawn);
    let bobs_child = alice.wait_children(&id, 1, TURN).remove(0).id;
    let result = childs_call(&alice, &bobs_child);
    assert!(
        failed(&result).starts_with("No MCP server \"mine\""),
        "{}",
        result.content
    );

    // A child of alice's own turn acts for her alone: her server serves it.
    alice.enqueue(&id, "followUp", &spawn);
    let alices_child = alice.wait_children(&id, 2, TURN).remove(1).id;
    let result = childs_call(&alice, &alices_child);
    assert_eq!(ok(&result), "you sent: Bearer [secret:ALICE_MCP]");

    // The value is nowhere in what any of them stored.
    for session in [&id, &bobs_child, &alices_child] {
        let stored = serde_json::to_string(&alice.transcript(session)).unwrap();
        assert!(!stored.contains(&value), "{session} holds the credential");
    }
}

/// `GET /v1/mcp/servers` and `…/{name}/tools`, and `wuhu mcp list|tools`: what a person's own
/// turns would see, asked now; bad input and a failing server are JSON errors.
#[test]
fn people_see_their_servers_and_tools_through_the_api_and_the_cli() {
    let f = fixture();
    let _guard = f.stack.guard();
    let (tenant, alice) = tenant("mcp-api");
    alice
        .put_doc(
            "users/alice/mcp.json",
            json!({"servers": [{"name": "every", "url": f.broken.url()}, {"name": "mine", "url": f.everything.url(), "approval": "ask"}]})
                .to_string(),
        )
        .expect_status(200);
    let list = alice.get("/v1/mcp/servers");
    assert_eq!(list.status, 200, "{list}");
    let list = list.json();
    let names: Vec<&str> = list["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["every", "broken", "mine"], "{list}");
    assert_eq!(list["servers"][2]["source"], "user");
    assert_eq!(list["servers"][2]["approval"], "ask");
    // Her `every` is hidden by the tenant's.
    assert_eq!(list["notOffered"][0]["name"], "every", "{list}");
    assert_eq!(list["notOffered"][0]["url"], f.broken.url());

    let tools = alice.get("/v1/mcp/servers/every/tools");
    assert_eq!(tools.status, 200, "{tools}");
    let tools = tools.json();
    let echo = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "echo")
        .cloned()
        .unwrap_or_else(|| panic!("{tools}"));
    assert_eq!(echo["offered"], true);
    assert_eq!(
        echo["inputSchema"]["properties"]["message"]["type"],
        "string"
    );
    let toggle = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"].as_str().unwrap_or("").starts_with("toggle-"))
        .cloned()
        .unwrap();
    assert_eq!(
        toggle["offered"], false,
        "the tenant's entry denies toggle-*"
    );

    // Bob sees the tenant's servers, never alice's own.
    let bob = f.stack.client("bob", &tenant);
    let theirs = bob.get("/v1/mcp/servers").json();
    assert_eq!(theirs["servers"].as_array().unwrap().len(), 2, "{theirs}");
    bob.get("/v1/mcp/servers/mine/tools").expect_error(404);

    alice.get("/v1/mcp/servers/NOPE/tools").expect_error(400);
    alice.get("/v1/mcp/servers/nope/tools").expect_error(404);
    let method = alice.post("/v1/mcp/servers", &json!({}));
    method.expect_error(405);
    // A server that breaks on `tools/list`: 502 saying why.
    alice
        .put_doc(
            "users/alice/mcp.json",
            json!({"servers": [{"name": "gone", "url": "http://127.0.0.1:9/mcp"}]}).to_string(),
        )
        .expect_status(200);
    let gone = alice.get("/v1/mcp/servers/gone/tools");
    assert_eq!(gone.status, 502, "{gone}");
    assert_eq!(gone.json()["error"]["code"], "mcp_server_failed", "{gone}");
    // (Its port is not on the stack's egress allowlist.)
    assert!(gone.text().contains("egress refused"), "{gone}");

    let cli = wuhu_e2e::cli::Wuhu::new()
        .env("WUHU_SERVER", &f.stack.base_url())
        .env("WUHU_TOKEN", alice.token().expect("a token"));
    let ran = cli.run(&["mcp", "list"]).ok();
    assert!(
        ran.stdout.contains("every") && ran.stdout.contains("gone"),
        "{ran:?}"
    );
    let ran = cli.run(&["--json", "mcp", "tools", "every"]).ok();
    assert!(
        ran.json()["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "get-sum")),
        "{ran:?}"
    );
    let ran = cli.run(&["mcp", "tools", "nope"]);
    assert_eq!(ran.code(), 3, "{ran:?}");
}

/// A server behind OAuth (the official SDK's example server with its demo authorization
/// server, which signs anyone in at once and accepts only tokens for its own URL): alice
/// connects her account through the browser's round trip (discovery, registration, PKCE, the
/// callback), her turns then reach the server with her token; bob's turn in her shared session
/// is not connected; the callback works once; disconnecting forgets the token.
#[test]
fn a_person_connects_an_oauth_server_and_only_their_turns_use_it() {
    let f = fixture();
    let _guard = f.stack.guard();
    let tenant = unique_name("mcp-oauth");
    let admin = f.stack.admin_client("root", &tenant);
    admin
        .put_doc(
            "config/mcp.json",
            json!({"servers": [{"name": "demo", "url": f.oauth.url(), "auth": {"type": "oauth"}}]})
                .to_string(),
        )
        .expect_status(200);
    let alice = f.stack.client("alice", &tenant);
    let bob = f.stack.client("bob", &tenant);
    let id = alice.create_fake_session().id;
    let shared = alice.patch(&format!("/v1/sessions/{id}"), &json!({"access": "tenant"}));
    assert_eq!(shared.status, 200, "{shared}");
    let greet = json!({"server": "demo", "tool": "greet", "arguments": {"name": "Ana"}});

    let listed = alice.get("/v1/mcp/servers").json();
    assert_eq!(listed["servers"][0]["auth"], "oauth", "{listed}");
    assert_eq!(listed["servers"][0]["connected"], false, "{listed}");
    let before = alice.run_tool(&id, "mcp_call", greet.clone(), TURN);
    assert!(
        failed(&before).starts_with("MCP server \"demo\" is not connected for alice"),
        "{}",
        before.content
    );

    // The sign-in: the API answers where the browser goes; the authorization server sends the
    // browser back to the callback with a code; the callback stores the connection.
    let started = alice.post("/v1/mcp/servers/demo/connect", &json!({}));
    assert_eq!(started.status, 200, "{started}");
    let authorize = started.json()["authorizationUrl"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        authorize.contains("code_challenge_method=S256") && authorize.contains("resource="),
        "{authorize}"
    );
    let signed_in = wuhu_e2e::Request::new("GET", authorize.clone())
        .send()
        .expect("the authorization server answers");
    assert_eq!(signed_in.status, 302, "{signed_in}");
    let back = signed_in
        .header("location")
        .expect("a redirect")
        .to_string();
    assert!(
        back.starts_with(&format!("{}/v1/mcp/callback?", f.stack.base_url())),
        "{back}"
    );
    let done = wuhu_e2e::Request::new("GET", back.clone())
        .send()
        .expect("callback");
    assert_eq!(done.status, 302, "{done}");
    let finish_page = done.header("location").unwrap_or_default().to_string();
    let state = finish_page
        .strip_prefix("/#/mcp/finish/")
        .unwrap_or_else(|| panic!("{finish_page}"))
        .to_string();
    // The callback is answered once; the code waits for alice to finish it.
    let again = wuhu_e2e::Request::new("GET", back)
        .send()
        .expect("callback");
    again.expect_error(400);
    wuhu_e2e::Request::new("GET", f.stack.url("/v1/mcp/callback?state=nope&code=x"))
        .send()
        .expect("callback")
        .expect_error(400);
    let connected = || alice.get("/v1/mcp/servers").json()["servers"][0]["connected"].clone();
    assert_eq!(connected(), false, "not connected before it is finished");
    // The login CSRF of OAuth: had bob's browser come back with a sign-in alice began (his
    // account at the server), finishing it as bob is refused, and drops it.
    let hijack = alice.post("/v1/mcp/servers/demo/connect", &json!({}));
    assert_eq!(hijack.status, 200, "{hijack}");
    let url = hijack.json()["authorizationUrl"]
        .as_str()
        .unwrap()
        .to_string();
    let to_callback = wuhu_e2e::Request::new("GET", url)
        .send()
        .expect("authorize");
    let callback = to_callback
        .header("location")
        .unwrap_or_default()
        .to_string();
    let answered = wuhu_e2e::Request::new("GET", callback)
        .send()
        .expect("callback");
    let hijack_state = answered
        .header("location")
        .unwrap_or_default()
        .trim_start_matches("/#/mcp/finish/")
        .to_string();
    bob.post("/v1/mcp/finish", &json!({"state": hijack_state}))
        .expect_error(403);
    alice
        .post("/v1/mcp/finish", &json!({"state": hijack_state}))
        .expect_error(400);
    assert_eq!(connected(), false);
    // Alice finishes her own, once.
    let finished = alice.post("/v1/mcp/finish", &json!({"state": state}));
    assert_eq!(finished.status, 200, "{finished}");
    assert_eq!(finished.json()["server"], "demo");
    alice
        .post("/v1/mcp/finish", &json!({"state": state}))
        .expect_error(400);
    assert_eq!(connected(), true);

    // Her turns carry her token; bob's turn in the same session has none of its own.
    let hers = alice.run_tool(&id, "mcp_call", greet.clone(), TURN);
    assert!(ok(&hers).contains("Hello, Ana!"), "{}", hers.content);
    let tools = alice.get("/v1/mcp/servers/demo/tools");
    assert_eq!(tools.status, 200, "{tools}");
    let his = bob.run_tool(&id, "mcp_call", greet.clone(), TURN);
    assert!(
        failed(&his).starts_with("MCP server \"demo\" is not connected for bob"),
        "{}",
        his.content
    );
    bob.get("/v1/mcp/servers/demo/tools").expect_error(502);

    // Disconnected: forgotten.
    let gone = alice.send(alice.request("DELETE", "/v1/mcp/servers/demo/connection"));
    assert_eq!(gone.json()["disconnected"], true, "{gone}");
    let after = alice.run_tool(&id, "mcp_call", greet, TURN);
    assert!(
        failed(&after).contains("is not connected for alice"),
        "{}",
        after.content
    );
    // A server that does not sign in with OAuth has nothing to connect.
    alice
        .post("/v1/mcp/servers/nope/connect", &json!({}))
        .expect_error(404);
}

/// The approval requests in a transcript.
fn approval_requests(entries: &[Entry]) -> Vec<Value> {
    wuhu_e2e::entries::customs(entries, wuhu_core::wire::custom_types::APPROVAL_REQUESTED)
        .into_iter()
        .cloned()
        .collect()
}

#[test]
fn an_environments_stdio_server_runs_on_its_runner_and_other_members_wait_for_its_owner() {
    use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
    let f = fixture();
    let _guard = f.stack.guard();
    let (tenant, alice) = tenant("mcp-stdio");
    let bob = f.stack.client("bob", &tenant);
    let dir = TempDir::new("wuhu-e2e-mcp-stdio");
    let api = dir.mkdir("api");
    let mut mac = Runner::start(
        RunnerConfig::new(&f.stack, "alice", &tenant, "mac")
            .env("api", &api)
            .workspaces_root(dir.mkdir("workspaces")),
    );
    let node_modules = wuhu_e2e::stack::repo_root()
        .join("node_modules")
        .canonicalize()
        .unwrap();
    let entry = node_modules.join("@modelcontextprotocol/server-everything/dist/index.js");
    // Finds the server's processes on this machine (their environment carries the mark).
    let mark = random_hex(8);
    let marked = || {
        let wanted = format!("WUHU_E2E_MARK={mark}");
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read(e.path().join("environ")).ok())
            .filter(|environ| environ.split(|&b| b == 0).any(|v| v == wanted.as_bytes()))
            .count()
    };
    // The definition lists the reference server in stdio mode; its cell may read the
    // repository's node_modules.
    // A second server gets alice's own secret (as `bash` would: on her runner, in her turns).
    let token = format!("stdio-{}", random_hex(12));
    let put = alice.send(
        alice
            .request("PUT", "/v1/secrets/MCP_STDIO_TOKEN")
            .json(&json!({"value": token})),
    );
    assert_eq!(put.status, 200, "{put}");
    let defined = alice.post(
        "/v1/environments",
        &json!({"name": "api", "kind": "local", "runner": "mac", "path": api,
                "readOnlyPaths": [node_modules],
                "mcpServers": [{"name": "every", "command": "node", "args": [entry, "stdio"],
                                "env": {"WUHU_E2E_MARK": mark}},
                               {"name": "tokened", "command": "node", "args": [entry, "stdio"],
                                "secrets": ["MCP_STDIO_TOKEN"]}]}),
    );
    assert_eq!(defined.status, 201, "{defined}");
    assert_eq!(defined.json()["mcpServers"][0]["name"], "every");
    let broken = alice.post(
        "/v1/environments",
        &json!({"name": "bad", "kind": "local", "runner": "mac", "path": api,
                "mcpServers": [{"name": "Every", "command": "node"}]}),
    );
    assert_eq!(broken.status, 400, "{broken}");

    let session = alice.create_fake_session().id;
    let shared = alice.patch(
        &format!("/v1/sessions/{session}"),
        &json!({"access": "tenant"}),
    );
    assert_eq!(shared.status, 200, "{shared}");
    // Before the environment is attached, there is no such server.
    let none = alice.run_tool(
        &session,
        "mcp_call",
        json!({"server": "api/every", "tool": "echo"}),
        TURN,
    );
    assert!(
        failed(&none).contains("No MCP server \"api/every\""),
        "{}",
        none.content
    );
    let attached = alice.run_tool(
        &session,
        "request_environment",
        json!({"spec": "api"}),
        TURN,
    );
    ok(&attached);

    let servers = alice.run_tool(&session, "mcp_tools", json!({}), TURN);
    let listed = ok(&servers);
    let every = listed.find("- every (the tenant's").expect(listed);
    let stdio = listed
        .find("- api/every (in environment \"api\"; stdio: node ")
        .expect(listed);
    assert!(
        every < stdio,
        "the configured servers come first:\n{listed}"
    );
    let tools = alice.run_tool(&session, "mcp_tools", json!({"server": "api/every"}), TURN);
    for name in ["## echo", "## get-sum", "## get-tiny-image"] {
        assert!(ok(&tools).contains(name), "{name}:\n{}", tools.content);
    }
    assert!(tools.content.contains("mcp_call {server: \"api/every\""));
    let results = alice.run_tool_calls(
        &session,
        &[
            (
                "mcp_call",
                json!({"server": "api/every", "tool": "get-sum", "arguments": {"a": 2, "b": 40}}),
            ),
            (
                "mcp_call",
                json!({"server": "api/every", "tool": "get-tiny-image"}),
            ),
            (
                "read",
                json!({"path": "wuhu://mcp/api/every/demo://resource/static/document/architecture.md"}),
            ),
            (
                "js",
                json!({"code": "(await wuhu.mcp.call('api/every', 'echo', {message: 'from js'})).content[0].text"}),
            ),
            ("mcp_call", json!({"server": "api/tokened", "tool": "get-env"})),
        ],
        TURN,
    );
    // Results look as an HTTP server's do.
    assert!(ok(&results[0]).contains("The sum of 2 and 40 is 42."));
    assert!(
        ok(&results[1]).contains("[image: image/png"),
        "{}",
        results[1].content
    );
    assert_eq!(results[1].blobs.len(), 1);
    assert!(ok(&results[2]).contains("[resource demo://resource/static/document/architecture.md]"));
    assert!(
        ok(&results[3]).contains("Echo: from js"),
        "{}",
        results[3].content
    );
    // The server has the secret; what it answers is masked.
    let env = ok(&results[4]);
    assert!(
        env.contains("\"MCP_STDIO_TOKEN\": \"[secret:MCP_STDIO_TOKEN]\""),
        "{env}"
    );
    assert!(!env.contains(&token), "{env}");

    // bob's call reaches alice's machine: it waits for her, like his bash would.
    let turn = ToolTurn::start(
        &bob,
        &session,
        &[(
            "mcp_call",
            json!({"server": "api/every", "tool": "echo", "arguments": {"message": "bob"}}),
        )],
    );
    let entries = alice.wait_transcript(&session, "an approval request", TURN, |e| {
        !approval_requests(e).is_empty()
    });
    let request = approval_requests(&entries).remove(0);
    assert_eq!(
        request["approver"],
        json!({"kind": "runnerOwner", "sub": "alice"}),
        "{request}"
    );
    assert_eq!(request["tool"], "mcp_call", "{request}");
    assert_eq!(request["requestedBy"], json!(["bob"]), "{request}");
    let id = request["approvalId"].as_str().unwrap();
    let path = format!("/v1/sessions/{session}/approvals/{id}");
    // bob cannot answer for alice.
    assert_eq!(bob.post(&path, &json!({"decision": "approve"})).status, 403);
    assert_eq!(
        alice.post(&path, &json!({"decision": "approve"})).status,
        200
    );
    let (results, _) = turn.finish(&bob, TURN);
    assert_eq!(ok(&results[0]), "Echo: bob");

    // Alice's own secret is not for bob's turn: approved or not, the server it would start
    // with it is refused, naming the secret.
    let turn = ToolTurn::start(
        &bob,
        &session,
        &[(
            "mcp_call",
            json!({"server": "api/tokened", "tool": "get-env"}),
        )],
    );
    let entries = alice.wait_transcript(&session, "the second approval request", TURN, |e| {
        approval_requests(e).len() >= 2
    });
    let request = approval_requests(&entries).remove(1);
    let path = format!(
        "/v1/sessions/{session}/approvals/{}",
        request["approvalId"].as_str().unwrap()
    );
    assert_eq!(
        alice.post(&path, &json!({"decision": "approve"})).status,
        200
    );
    let (results, _) = turn.finish(&bob, TURN);
    let refused = failed(&results[0]);
    assert!(refused.contains("MCP_STDIO_TOKEN"), "{refused}");
    assert!(!refused.contains(&token), "{refused}");

    // A child that bob's turn spawns with the environment acts for bob: sharing it and its
    // call each wait for alice.
    let task = fake_directive(&json!({"toolCalls": [{"name": "mcp_call", "arguments":
        {"server": "api/every", "tool": "echo", "arguments": {"message": "child"}}}],
        "afterTools": "done"}));
    let spawn = fake_directive(&json!({"toolCalls": [{"name": "spawn_session",
        "arguments": {"task": task, "environment": "inherit"}}],
        "afterTools": format!("spawned {}", random_hex(4))}));
    bob.enqueue(&session, "followUp", &spawn);
    let entries = alice.wait_transcript(&session, "the share's approval request", TURN, |e| {
        approval_requests(e).len() >= 3
    });
    let share = approval_requests(&entries).remove(2);
    assert_eq!(share["requestedBy"], json!(["bob"]), "{share}");
    let path = format!(
        "/v1/sessions/{session}/approvals/{}",
        share["approvalId"].as_str().unwrap()
    );
    assert_eq!(
        alice.post(&path, &json!({"decision": "approve"})).status,
        200
    );
    let child = alice.wait_children(&session, 1, TURN).remove(0).id;
    let entries = alice.wait_transcript(&child, "the child's approval request", TURN, |e| {
        !approval_requests(e).is_empty()
    });
    let request = approval_requests(&entries).remove(0);
    assert_eq!(request["tool"], "mcp_call", "{request}");
    assert_eq!(request["requestedBy"], json!(["bob"]), "{request}");
    let path = format!(
        "/v1/sessions/{child}/approvals/{}",
        request["approvalId"].as_str().unwrap()
    );
    assert_eq!(
        alice.post(&path, &json!({"decision": "approve"})).status,
        200
    );
    assert_eq!(ok(&childs_call(&alice, &child)), "Echo: child");

    // The policy sees `<environment>/<server>/<tool>` and the environment.
    let admin = f.stack.admin_client("root", &tenant);
    let rules = json!({"rules": [
        {"match": {"mcp": "api/every/get-sum"}, "decision": "deny"},
        {"match": {"tool": "mcp_call", "environment": "api", "mcp": "*/echo"}, "decision": "deny"},
    ]});
    admin
        .put_doc("config/policy.json", rules.to_string())
        .expect_status(200);
    let results = alice.run_tool_calls(
        &session,
        &[
            (
                "mcp_call",
                json!({"server": "api/every", "tool": "get-sum", "arguments": {"a": 1, "b": 1}}),
            ),
            (
                "mcp_call",
                json!({"server": "api/every", "tool": "echo", "arguments": {"message": "no"}}),
            ),
            (
                "mcp_call",
                json!({"server": "api/every", "tool": "get-tiny-image"}),
            ),
        ],
        TURN,
    );
    assert!(
        failed(&results[0]).contains("polic"),
        "{}",
        results[0].content
    );
    assert!(
        failed(&results[1]).contains("polic"),
        "{}",
        results[1].content
    );
    ok(&results[2]);
    admin
        .put_doc("config/policy.json", json!({"rules": []}).to_string())
        .expect_status(200);

    // Detached, the server is gone from the listing and stopped on the runner. The child has
    // its own process (a server per session), which lives as long as its attachment.
    let node_processes = marked();
    assert!(
        node_processes >= 2,
        "{node_processes} processes of the servers"
    );
    let detached = alice.run_tool(&session, "detach_environment", json!({"name": "api"}), TURN);
    ok(&detached);
    let halved = wuhu_e2e::wait_until(Duration::from_secs(5), || {
        (marked() == node_processes / 2).then_some(())
    });
    assert!(halved.is_ok(), "{} of {node_processes} left", marked());
    ok(&alice.run_tool(&child, "detach_environment", json!({"name": "api"}), TURN));
    let gone = alice.run_tool(&session, "mcp_tools", json!({"server": "api/every"}), TURN);
    assert!(
        failed(&gone).contains("No MCP server \"api/every\""),
        "{}",
        gone.content
    );
    // The runner reaps the server before it answers detach; what its cell forked is reaped
    // by init soon after.
    let stopped = wuhu_e2e::wait_until(Duration::from_secs(5), || (marked() == 0).then_some(()));
    assert!(stopped.is_ok(), "the server outlived detach");

    // Attached again, it starts again; the runner stopping stops it too.
    ok(&alice.run_tool(
        &session,
        "request_environment",
        json!({"spec": "api"}),
        TURN,
    ));
    let echoed = alice.run_tool(
        &session,
        "mcp_call",
        json!({"server": "api/every", "tool": "echo", "arguments": {"message": "again"}}),
        TURN,
    );
    assert_eq!(ok(&echoed), "Echo: again");
    assert!(marked() >= 1, "the server's process is not found");
    let status = mac.stop(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.code() == Some(143)), "{status:?}");
    let stopped = wuhu_e2e::wait_until(Duration::from_secs(5), || (marked() == 0).then_some(()));
    assert!(stopped.is_ok(), "the server outlived its runner");
}
