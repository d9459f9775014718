//! Wuhu as an MCP server (`POST /mcp`, issue 33, decision 0036) against the real Worker: the
//! official TypeScript SDK client (`@modelcontextprotocol/sdk` from `package.json`, streamable
//! HTTP; `tests/mcp/sdk_client.mjs`) creates a session, sends a message, waits for the reply,
//! reads it, writes and reads a workspace document, and lists and reads them as resources;
//! another member cannot see, prompt or read (as a resource) the private session through MCP.
//! Raw requests check the transport's edges: no credential, GET, a message that is not JSON-RPC,
//! a batch, an unknown revision, a notification, an unknown method, a foreign `Origin`, a body
//! over the bound.

use std::process::{Command, Stdio};

use serde_json::{Value, json};
use wuhu_e2e::Stack;
use wuhu_e2e::http::Request;
use wuhu_e2e::util::unique_name;

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

/// Runs `command` (node and its arguments), which must succeed; its standard output, parsed as
/// one JSON value.
#[track_caller]
fn node_json(command: &mut Command, what: &str) -> Value {
    let output = command.stdin(Stdio::null()).output().expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{what} failed: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{what}: {e}: {stdout}"))
}

#[test]
fn the_official_sdk_client_drives_a_session_and_another_member_cannot() {
    let stack = stack();
    let tenant = unique_name("mcp");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = format!("notes/mcp-{}.md", wuhu_e2e::util::random_hex(4));
    let seen = node_json(
        Command::new("node")
            .current_dir(&root)
            .arg("tests/mcp/sdk_client.mjs")
            .env("WUHU_MCP_URL", format!("{}/mcp", stack.base_url()))
            .env("WUHU_ALICE_TOKEN", stack.user_token("alice", &tenant))
            .env("WUHU_BOB_TOKEN", stack.user_token("bob", &tenant))
            .env("WUHU_DOC", &doc),
        "the SDK client",
    );
    assert_eq!(seen["server"]["name"], "wuhu", "{seen}");
    assert_eq!(
        seen["tools"],
        json!([
            "approval_answer",
            "approvals_list",
            "session_create",
            "session_read",
            "session_send",
            "session_stop",
            "session_wait",
            "sessions_list",
            "workspace_read",
            "workspace_write"
        ])
    );
    assert_eq!(seen["createdError"], false, "{seen}");
    assert_eq!(seen["sentError"], false, "{seen}");
    assert_eq!(seen["waited"]["settled"], true, "{seen}");
    assert_eq!(seen["waited"]["status"], "idle", "{seen}");
    assert_eq!(
        seen["waited"]["finalText"], "echo: hello over mcp",
        "{seen}"
    );
    // The wait that asked for progress: notifications while the reply streamed, their progress
    // growing, their text the reply's (joined, the tail of it: the wait may start after the
    // first piece), then the result.
    let notes = seen["progressNotes"].as_array().expect("progressNotes");
    assert!(notes.len() >= 2, "{seen}");
    let progress: Vec<u64> = notes
        .iter()
        .filter_map(|n| n["progress"].as_u64())
        .collect();
    assert_eq!(progress.len(), notes.len(), "{seen}");
    assert!(progress.windows(2).all(|w| w[0] < w[1]), "{progress:?}");
    let streamed: String = notes.iter().filter_map(|n| n["message"].as_str()).collect();
    let reply = "one two three four five six seven eight nine ten eleven twelve";
    assert!(
        !streamed.is_empty() && reply.ends_with(&streamed),
        "{streamed:?}"
    );
    assert_eq!(seen["progressWaited"]["settled"], true, "{seen}");
    assert_eq!(seen["progressWaited"]["finalText"], reply, "{seen}");
    assert!(seen["readEntries"].as_u64().unwrap_or(0) >= 5, "{seen}");
    assert_eq!(seen["approvals"], json!([]), "{seen}");
    assert_eq!(seen["docContent"], "written over MCP\n", "{seen}");
    // An unknown tool is a protocol error (invalid params), not a tool result.
    assert_eq!(seen["unknownTool"], -32602, "{seen}");
    // Bob is a member of the tenant; alice's session is private.
    assert_eq!(seen["bobSees"], false, "{seen}");
    assert_eq!(seen["bobRead"]["isError"], true, "{seen}");
    assert!(
        seen["bobRead"]["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("404 not_found"),
        "{seen}"
    );
    assert_eq!(seen["bobSend"]["isError"], true, "{seen}");
    // Resources: alice's session is one of hers, read whole; bob sees it nowhere.
    let uri = format!("wuhu://session/{}", seen["id"].as_str().unwrap_or_default());
    assert!(
        seen["resources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|u| u == &json!(uri))),
        "{seen}"
    );
    assert_eq!(
        seen["templates"],
        json!(["wuhu://session/{id}", "wuhu://workspace/{path}"])
    );
    assert!(seen["sessionResource"].as_u64().unwrap_or(0) >= 3, "{seen}");
    assert_eq!(seen["docResource"], "written over MCP\n", "{seen}");
    assert!(
        !seen["bobResources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|u| u == &json!(uri))),
        "{seen}"
    );
    assert_eq!(seen["bobResource"], -32002, "{seen}");
    // What the API shows matches: the session has alice's message and the reply, nothing of bob.
    let api = stack.client("alice", &tenant);
    let id = seen["id"].as_str().expect("id");
    let transcript = api.transcript(id);
    let text = serde_json::to_string(&transcript).unwrap_or_default();
    assert!(text.contains("hello over mcp") && !text.contains("let me in"));
}

#[test]
fn the_transport_refuses_what_it_should() {
    let stack = stack();
    let tenant = unique_name("mcp-edges");
    let token = stack.user_token("alice", &tenant);
    let url = format!("{}/mcp", stack.base_url());
    let post = |body: &str| {
        Request::new("POST", url.clone())
            .bearer(&token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.as_bytes().to_vec())
    };
    let rpc_code = |response: &wuhu_e2e::http::Response| response.json()["error"]["code"].clone();

    // No credential: the API's 401.
    let anonymous = Request::new("POST", url.clone())
        .body(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec())
        .send()
        .expect("answer");
    anonymous.expect_error(401);
    // No stream and no MCP session: GET and DELETE are 405, saying POST.
    for method in ["GET", "DELETE"] {
        let answer = Request::new(method, url.clone())
            .bearer(&token)
            .send()
            .expect("answer");
        answer.expect_error(405);
        assert_eq!(answer.header("allow"), Some("POST"));
    }
    // Messages that cannot be read: 400 with a JSON-RPC error and no id.
    for (body, code) in [
        ("{not json", -32700),
        (r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#, -32600),
        (r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, -32600),
    ] {
        let answer = post(body).send().expect("answer");
        assert_eq!(answer.status, 400, "{body}: {answer}");
        assert_eq!(rpc_code(&answer), code, "{body}: {answer}");
        assert_eq!(answer.json()["id"], Value::Null);
    }
    let old = post(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)
        .header("mcp-protocol-version", "2024-01-01")
        .send()
        .expect("answer");
    assert_eq!(old.status, 400, "{old}");
    // A notification is accepted without a body; a request is answered under its id.
    let note = post(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
        .send()
        .expect("answer");
    assert_eq!(note.status, 202, "{note}");
    assert!(note.text().is_empty());
    let ping = post(r#"{"jsonrpc":"2.0","id":"p1","method":"ping"}"#)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .expect("answer");
    assert_eq!(ping.status, 200);
    assert_eq!(
        ping.json(),
        json!({"jsonrpc": "2.0", "id": "p1", "result": {}})
    );
    let unknown = post(r#"{"jsonrpc":"2.0","id":2,"method":"prompts/list"}"#)
        .send()
        .expect("answer");
    assert_eq!(unknown.status, 200);
    assert_eq!(rpc_code(&unknown), -32601, "{unknown}");
    // A page of another origin may not drive it with the user's credentials.
    let foreign = post(r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#)
        .header("origin", "https://evil.example")
        .send()
        .expect("answer");
    foreign.expect_error(403);
    // A body over the bound (2 MiB) is refused before it is read.
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"session_create","arguments":{{"title":"{}"}}}}}}"#,
        "x".repeat(2 * 1024 * 1024 + 1)
    );
    let refused = post(&big).send().expect("answer");
    refused.expect_error(413);
    // A tool's failure is a result with isError, the route's status and code in its text.
    let bad = post(
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"session_create","arguments":{"provider":"nobody"}}}"#,
    )
    .send()
    .expect("answer");
    assert_eq!(bad.status, 200, "{bad}");
    let result = &bad.json()["result"];
    assert_eq!(result["isError"], true, "{bad}");
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .starts_with("400 "),
        "{bad}"
    );
}

/// The official MCP Inspector's CLI (`@modelcontextprotocol/inspector-cli`, pinned in
/// `package.json`) drives a session end to end against the real Worker: create, send, wait for
/// the reply, read it as a resource; another member's token reads nothing of it.
#[test]
fn the_mcp_inspector_cli_creates_sends_waits_and_reads() {
    let stack = stack();
    let tenant = unique_name("mcp-inspector");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The CLI reads its own package.json relative to the working directory.
    let dir = root.join("node_modules/@modelcontextprotocol/inspector-cli/build");
    let url = format!("{}/mcp", stack.base_url());
    let inspect = |token: &str, args: &[&str]| -> Value {
        node_json(
            Command::new("node")
                .current_dir(&dir)
                .arg("index.js")
                .arg(&url)
                .args(args)
                .arg("--header")
                .arg(format!("Authorization: Bearer {token}")),
            &format!("the inspector on {args:?}"),
        )
    };
    let alice = stack.user_token("alice", &tenant);
    let bob = stack.user_token("bob", &tenant);
    let tools = inspect(&alice, &["--method", "tools/list"]);
    assert!(
        tools["tools"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["name"] == "session_wait")),
        "{tools}"
    );
    let call = |token: &str, tool: &str, args: &[&str]| {
        let mut all = vec!["--method", "tools/call", "--tool-name", tool];
        if !args.is_empty() {
            all.push("--tool-arg");
            all.extend_from_slice(args);
        }
        inspect(token, &all)
    };
    let created = call(
        &alice,
        "session_create",
        &["title=inspected", "provider=fake"],
    );
    let id = created["structuredContent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    let sent = call(
        &alice,
        "session_send",
        &[&format!("id={id}"), "content=hello inspector"],
    );
    assert_eq!(sent["isError"], false, "{sent}");
    let waited = call(
        &alice,
        "session_wait",
        &[&format!("id={id}"), "timeoutSeconds=40"],
    );
    assert_eq!(
        waited["structuredContent"]["finalText"], "echo: hello inspector",
        "{waited}"
    );
    let uri = format!("wuhu://session/{id}");
    let read = inspect(&alice, &["--method", "resources/read", "--uri", &uri]);
    assert!(
        read["contents"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("hello inspector")),
        "{read}"
    );
    let theirs = call(&bob, "session_read", &[&format!("id={id}")]);
    assert_eq!(theirs["isError"], true, "{theirs}");
}
