use serde_json::{Value, json};

use super::config::*;
use super::exchange::*;
use super::present::*;

fn server(doc: &str) -> Server {
    McpServers::parse(TENANT_MCP_PATH, Some(&format!(r#"{{"servers":[{doc}]}}"#)))
        .unwrap()
        .servers
        .remove(0)
}

#[test]
fn documents_are_checked_when_written() {
    let cases: Vec<(&str, &str)> = vec![
        (r#"{"servers":[]}"#, "ok"),
        (
            r#"{"servers":[{"name":"docs","url":"https://mcp.example.com/mcp"}]}"#,
            "ok",
        ),
        (
            r#"{"servers":[{"name":"gh","url":"https://x.example/mcp","auth":{"type":"bearer","secret":"GH_TOKEN"},"tools":{"allow":["issue_*"],"deny":["issue_delete"]},"approval":"ask","timeoutSeconds":600}]}"#,
            "ok",
        ),
        (
            r#"{"servers":{}}"#,
            "config/mcp.json: invalid type: map, expected a sequence at line 1 column 11",
        ),
        (
            r#"{"servers":[],"x":1}"#,
            "config/mcp.json: unknown field `x`, expected `servers` at line 1 column 17",
        ),
        (
            r#"{"servers":[{"name":"Docs","url":"https://a.example"}]}"#,
            r#"config/mcp.json: server 1: name "Docs" must be 1 to 32 of a-z, 0-9, '-' and '_', starting with a letter or digit"#,
        ),
        (
            r#"{"servers":[{"name":"a","url":"https://a.example"},{"name":"a","url":"https://b.example"}]}"#,
            r#"config/mcp.json: server 2: name "a" is used by an earlier server"#,
        ),
        (
            r#"{"servers":[{"name":"a","url":"ftp://a.example"}]}"#,
            r#"config/mcp.json: server 1: url: scheme "ftp": http or https only"#,
        ),
        (
            r#"{"servers":[{"name":"a","url":"https://u:p@a.example"}]}"#,
            "config/mcp.json: server 1: url: credentials do not belong in the URL: put them in a secret and name it in auth",
        ),
        (
            r#"{"servers":[{"name":"a","url":"https://a.example/#x"}]}"#,
            "config/mcp.json: server 1: url: a fragment is not sent to a server: remove it",
        ),
        (
            r#"{"servers":[{"name":"a","url":"not a url"}]}"#,
            "config/mcp.json: server 1: url: relative URL without a base",
        ),
        (
            r#"{"servers":[{"name":"a","url":"https://a.example","transport":"sse"}]}"#,
            "ok",
        ),
        (
            r#"{"servers":[{"name":"a","url":"https://a.example","auth":{"type":"oauth"}}]}"#,
            "ok",
        ),
        (
            r#"{"servers":[{"name":"a","url":"https://a.example","auth":{"type":"bearer","secret":"lower"}}]}"#,
            r#"config/mcp.json: server 1: auth.secret: a secret's name is an environment variable name: 1 to 64 of A-Z, 0-9 and _, not starting with a digit (got "lower")"#,
        ),
        (
            r#"{"servers":[{"name":"a","url":"https://a.example","timeoutSeconds":0}]}"#,
            "config/mcp.json: server 1: timeoutSeconds must be 1 to 600",
        ),
        (
            r#"{"servers":[{"name":"a","url":"https://a.example","tools":{"allow":[""]}}]}"#,
            "config/mcp.json: server 1: tools.allow: a pattern must be 1 to 128 characters",
        ),
        (
            r#"{"servers":[{"name":"a","url":"https://a.example","approval":"maybe"}]}"#,
            "config/mcp.json: unknown variant `maybe`, expected `auto` or `ask` at line 1 column 68",
        ),
    ];
    let mut got = String::new();
    for (doc, _) in &cases {
        let result = McpServers::parse(TENANT_MCP_PATH, Some(doc));
        got.push_str(&match result {
            Ok(_) => "ok".to_string(),
            Err(e) => e.to_string(),
        });
        got.push('\n');
    }
    let want: String = cases.iter().map(|(_, w)| format!("{w}\n")).collect();
    assert_eq!(got, want);
}

#[test]
fn bounds_are_exact() {
    let name = "a".repeat(MAX_NAME_CHARS);
    assert!(valid_server_name(&name));
    assert!(!valid_server_name(&format!("{name}a")));
    assert!(!valid_server_name("-a"));
    assert!(valid_server_name("0a_b-c"));
    let servers = |n: usize| {
        let list: Vec<String> = (0..n)
            .map(|i| format!(r#"{{"name":"s{i}","url":"https://a.example"}}"#))
            .collect();
        format!(r#"{{"servers":[{}]}}"#, list.join(","))
    };
    assert!(McpServers::parse(TENANT_MCP_PATH, Some(&servers(MAX_SERVERS))).is_ok());
    assert!(McpServers::parse(TENANT_MCP_PATH, Some(&servers(MAX_SERVERS + 1))).is_err());
    let patterns = |n: usize| {
        let list: Vec<String> = (0..n).map(|i| format!("\"t{i}\"")).collect();
        format!(
            r#"{{"servers":[{{"name":"a","url":"https://a.example","tools":{{"deny":[{}]}}}}]}}"#,
            list.join(",")
        )
    };
    assert!(McpServers::parse(TENANT_MCP_PATH, Some(&patterns(MAX_TOOL_PATTERNS))).is_ok());
    assert!(McpServers::parse(TENANT_MCP_PATH, Some(&patterns(MAX_TOOL_PATTERNS + 1))).is_err());
    let timeout = |t: u32| {
        format!(r#"{{"servers":[{{"name":"a","url":"https://a.example","timeoutSeconds":{t}}}]}}"#)
    };
    assert!(McpServers::parse(TENANT_MCP_PATH, Some(&timeout(MAX_TIMEOUT_SECONDS))).is_ok());
    assert!(McpServers::parse(TENANT_MCP_PATH, Some(&timeout(MAX_TIMEOUT_SECONDS + 1))).is_err());
    assert_eq!(
        McpServers::parse(TENANT_MCP_PATH, None)
            .unwrap()
            .servers
            .len(),
        0
    );
}

#[test]
fn documents_and_whose_they_are() {
    assert!(is_mcp_document("config/mcp.json"));
    assert!(is_mcp_document("users/alice/mcp.json"));
    assert_eq!(mcp_user("users/alice/mcp.json"), Some("alice"));
    assert!(!is_mcp_document("users/alice/x/mcp.json"));
    assert!(!is_mcp_document("users//mcp.json"));
    assert!(!is_mcp_document("mcp.json"));
    let user = McpServers::parse(
        "users/alice/mcp.json",
        Some(r#"{"servers":[{"name":"a","url":"https://a.example"}]}"#),
    )
    .unwrap();
    assert_eq!(user.servers[0].source, Source::User("alice".into()));
}

#[test]
fn the_tool_filter_denies_first() {
    let s = server(
        r#"{"name":"a","url":"https://a.example","tools":{"allow":["issue_*","search"],"deny":["issue_delete*"]}}"#,
    );
    let table = [
        ("issue_create", true),
        ("issue_delete", false),
        ("issue_delete_all", false),
        ("search", true),
        ("searchx", false),
        ("other", false),
    ];
    for (tool, offered) in table {
        assert_eq!(s.offers(tool), offered, "{tool}");
    }
    let open = server(r#"{"name":"a","url":"https://a.example"}"#);
    assert!(open.offers("anything"));
}

#[test]
fn a_users_servers_serve_only_turns_for_that_user_alone() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(crate::authority::sole_member(&s(&["alice"])), Some("alice"));
    assert_eq!(crate::authority::sole_member(&s(&["alice", "bob"])), None);
    assert_eq!(crate::authority::sole_member(&s(&[])), None);
    let guest = "guest:slack:T1:U1";
    assert!(crate::authority::is_guest(guest));
    assert_eq!(crate::authority::sole_member(&s(&[guest])), None);

    let tenant = McpServers::parse(
        TENANT_MCP_PATH,
        Some(r#"{"servers":[{"name":"docs","url":"https://t.example"}]}"#),
    )
    .unwrap();
    let user = McpServers::parse(
        "users/alice/mcp.json",
        Some(r#"{"servers":[{"name":"docs","url":"https://evil.example"},{"name":"mine","url":"https://m.example"}]}"#),
    )
    .unwrap();
    let (seen, shadowed) = visible(&tenant, Some(&user));
    let names: Vec<_> = seen
        .iter()
        .map(|s| (s.doc.name.as_str(), s.host()))
        .collect();
    assert_eq!(
        names,
        [
            ("docs", "t.example".to_string()),
            ("mine", "m.example".to_string())
        ]
    );
    assert_eq!(shadowed[0].host(), "evil.example");
    expect_test::expect![[r#"
        MCP servers (call mcp_tools with server=<name> to see a server's tools):
        - docs (the tenant's; t.example)
        - mine (alice's own; m.example)
        (not offered: alice's own "docs", whose name the tenant's server takes)
    "#]]
    .assert_eq(&render_servers(&seen, &shadowed, None));
}

/// Drives an exchange with scripted answers; returns the requests it sent, one per line, and
/// its end.
fn drive(session: Option<McpSession>, answers: Vec<Answer>) -> (String, Option<McpSession>) {
    let mut exchange = Exchange::new(session, "tools/list", Value::Null);
    let mut step = exchange.start();
    let mut log = String::new();
    let mut answers = answers.into_iter();
    loop {
        match step {
            Step::Send(request) => {
                let body: Value = serde_json::from_str(&request.body).unwrap();
                let headers: Vec<String> = request
                    .headers
                    .iter()
                    .filter(|(k, _)| k.starts_with("mcp-"))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                log.push_str(&format!(
                    "send {} id={} {}\n",
                    body["method"].as_str().unwrap(),
                    body.get("id").map(Value::to_string).unwrap_or("-".into()),
                    headers.join(" ")
                ));
                let Some(answer) = answers.next() else {
                    log.push_str("(no more answers)\n");
                    break;
                };
                step = exchange.answered(answer);
            }
            Step::Done(result) => {
                log.push_str(&match result {
                    Ok(v) => format!("done {v}\n"),
                    Err(e) => format!("failed: {e}\n"),
                });
                break;
            }
        }
    }
    (log, exchange.session().cloned())
}

fn ok(id: u64, result: Value) -> Answer {
    Answer {
        status: 200,
        session_id: None,
        body: Ok(Some(json!({"jsonrpc":"2.0","id":id,"result":result}))),
    }
}

fn init(id: u64, session: Option<&str>, version: &str) -> Answer {
    Answer {
        session_id: session.map(str::to_string),
        ..ok(id, json!({"protocolVersion": version, "capabilities": {}}))
    }
}

fn accepted() -> Answer {
    Answer {
        status: 202,
        session_id: None,
        body: Ok(None),
    }
}

fn status(status: u16) -> Answer {
    Answer {
        status,
        session_id: None,
        body: Err(McpError::Malformed("an empty body".into())),
    }
}

#[test]
fn an_exchange_opens_a_session_and_keeps_it() {
    let (log, session) = drive(
        None,
        vec![
            init(1, Some("s-1"), "2025-06-18"),
            accepted(),
            ok(2, json!({"tools": []})),
        ],
    );
    expect_test::expect![[r#"
        send initialize id=1 
        send notifications/initialized id=- mcp-protocol-version=2025-06-18 mcp-session-id=s-1
        send tools/list id=2 mcp-protocol-version=2025-06-18 mcp-session-id=s-1
        done {"tools":[]}
    "#]]
    .assert_eq(&log);
    let kept = session.unwrap();
    assert_eq!(kept.id.as_deref(), Some("s-1"));

    // The kept session is used as is.
    let (log, _) = drive(Some(kept.clone()), vec![ok(1, json!({"tools": []}))]);
    expect_test::expect![[r#"
        send tools/list id=1 mcp-protocol-version=2025-06-18 mcp-session-id=s-1
        done {"tools":[]}
    "#]]
    .assert_eq(&log);

    // Expired (404): a new session, the request again, once.
    let (log, session) = drive(
        Some(kept.clone()),
        vec![
            status(404),
            init(2, Some("s-2"), "2025-03-26"),
            accepted(),
            ok(3, json!({"tools": []})),
        ],
    );
    expect_test::expect![[r#"
        send tools/list id=1 mcp-protocol-version=2025-06-18 mcp-session-id=s-1
        send initialize id=2 
        send notifications/initialized id=- mcp-protocol-version=2025-03-26 mcp-session-id=s-2
        send tools/list id=3 mcp-protocol-version=2025-03-26 mcp-session-id=s-2
        done {"tools":[]}
    "#]]
    .assert_eq(&log);
    assert_eq!(session.unwrap().id.as_deref(), Some("s-2"));

    // A 404 in a session this exchange opened is final: no loop.
    let (log, _) = drive(
        Some(kept),
        vec![
            status(404),
            init(2, Some("s-2"), "2025-06-18"),
            accepted(),
            status(404),
        ],
    );
    assert!(log.ends_with("failed: HTTP 404\n"), "{log}");
}

#[test]
fn an_exchange_fails_with_what_went_wrong() {
    let cases: Vec<(Vec<Answer>, &str)> = vec![
        (vec![status(401)], "failed: HTTP 401"),
        (
            vec![init(1, None, "2024-11-05")],
            r#"failed: a malformed answer: the server speaks protocol revision "2024-11-05"; this client speaks 2025-06-18 and 2025-03-26"#,
        ),
        (
            vec![ok(1, json!({}))],
            "failed: a malformed answer: initialize answered without a protocolVersion",
        ),
        (
            vec![init(1, None, "2025-06-18"), status(500)],
            "failed: HTTP 500",
        ),
        (
            vec![
                init(1, None, "2025-06-18"),
                accepted(),
                Answer {
                    status: 200,
                    session_id: None,
                    body: Ok(Some(
                        json!({"jsonrpc":"2.0","id":2,"error":{"code":-32602,"message":"Unknown tool: nope"}}),
                    )),
                },
            ],
            "failed: error -32602: Unknown tool: nope",
        ),
        (
            vec![
                init(1, None, "2025-06-18"),
                accepted(),
                Answer {
                    status: 200,
                    session_id: None,
                    body: Err(McpError::TooLarge),
                },
            ],
            "failed: the answer is larger than 4 MiB",
        ),
        (
            vec![
                init(1, None, "2025-06-18"),
                accepted(),
                Answer {
                    status: 400,
                    session_id: None,
                    body: Ok(Some(
                        json!({"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Bad Request: no session"}}),
                    )),
                },
            ],
            "failed: HTTP 400: Bad Request: no session",
        ),
    ];
    let no_answer = |e: McpError| Answer {
        status: 0,
        session_id: None,
        body: Err(e),
    };
    let cases = cases.into_iter().chain([
        (
            vec![no_answer(McpError::Timeout(5))],
            "failed: no answer within 5 s",
        ),
        (
            vec![
                init(1, None, "2025-06-18"),
                no_answer(McpError::Transport("connection refused".into())),
            ],
            "failed: the request failed: connection refused",
        ),
    ]);
    for (answers, want) in cases {
        let (log, _) = drive(None, answers);
        assert_eq!(log.lines().last().unwrap(), want, "{log}");
    }
    // No session id from the server (a stateless one), or one that is not visible ASCII: none
    // is sent.
    let (log, session) = drive(
        None,
        vec![
            init(1, Some("bad id"), "2025-06-18"),
            accepted(),
            ok(2, json!({"tools": []})),
        ],
    );
    assert!(!log.contains("mcp-session-id"), "{log}");
    assert_eq!(session.unwrap().id, None);
}

/// What [`read_all`] read: the response, the progress notes, whether the reader stopped on its
/// own (the response arrived).
type Read = (Result<Option<Value>, McpError>, Vec<ProgressNote>, bool);

fn read_all(content_type: &str, expects: Option<u64>, body: &[u8], pieces: &[usize]) -> Read {
    let mut reader = AnswerReader::new(Some(content_type), expects);
    let mut at: usize = 0;
    let mut progress = Vec::new();
    let mut stopped_early = false;
    for &len in pieces.iter().chain(std::iter::once(&usize::MAX)) {
        let end = at.saturating_add(len).min(body.len());
        match reader.push(&body[at..end]) {
            Ok(true) => {
                stopped_early = true;
                progress.extend(reader.take_progress());
                return (reader.finish(), progress, stopped_early);
            }
            Ok(false) => {}
            Err(e) => return (Err(e), progress, stopped_early),
        }
        progress.extend(reader.take_progress());
        at = end;
        if at == body.len() {
            break;
        }
    }
    (reader.finish(), progress, stopped_early)
}

#[test]
fn an_event_stream_is_read_until_its_response_whatever_the_pieces() {
    let body = concat!(
        ": keep-alive\n\n",
        "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"t\",\"progress\":1,\"total\":3,\"message\":\"first\"}}\r\n\r\n",
        "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"x\"}}\n\n",
        "data: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"other\":true}}\n\n",
        "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"héllo\"}]}}\n\n",
        "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":3}}\n\n",
    )
    .as_bytes();
    // Every split into two pieces, and bytes one by one: the same response, the same progress,
    // and reading stops at the response (the stream may stay open).
    let mut splits: Vec<Vec<usize>> = (0..=body.len()).map(|i| vec![i]).collect();
    splits.push(vec![1; body.len()]);
    for pieces in splits {
        let (result, progress, stopped) = read_all("text/event-stream", Some(7), body, &pieces);
        let response = result.unwrap().unwrap();
        assert_eq!(
            response["result"]["content"][0]["text"], "héllo",
            "{pieces:?}"
        );
        assert_eq!(progress.len(), 1, "{pieces:?}");
        assert_eq!(progress[0].line(), "[progress 1/3] first\n");
        assert!(stopped, "{pieces:?}");
    }
}

#[test]
fn answers_that_break_the_protocol_are_errors() {
    let json = "application/json; charset=utf-8";
    let cases: Vec<(&str, Option<u64>, &str, &str)> = vec![
        (
            json,
            Some(1),
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            "ok",
        ),
        (
            json,
            Some(1),
            r#"[{"jsonrpc":"2.0","method":"x"},{"jsonrpc":"2.0","id":1,"result":{}}]"#,
            "ok",
        ),
        (
            json,
            Some(1),
            "not json",
            "a malformed answer: a body that is not JSON (expected ident at line 1 column 2)",
        ),
        (json, Some(1), "", "a malformed answer: an empty body"),
        (
            json,
            Some(1),
            r#"{"id":1,"result":{}}"#,
            "a malformed answer: a message that is not JSON-RPC 2.0",
        ),
        (
            json,
            Some(1),
            r#"{"jsonrpc":"2.0","id":2,"result":{}}"#,
            "a malformed answer: the answer holds no response to request 1",
        ),
        (
            "text/event-stream",
            Some(1),
            "data: {oops\n\n",
            "a malformed answer: an event that is not JSON (key must be a string at line 1 column 2)",
        ),
        (
            "text/event-stream",
            Some(1),
            "data: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n\n",
            "a malformed answer: the answer holds no response to request 1",
        ),
        (
            "text/html",
            Some(1),
            "<html>",
            "a malformed answer: content type \"text/html\", not application/json or text/event-stream",
        ),
        ("", None, "", "ok"),
    ];
    for (content_type, expects, body, want) in cases {
        let (result, _, _) = read_all(content_type, expects, body.as_bytes(), &[3]);
        let got = match result {
            Ok(_) => "ok".to_string(),
            Err(e) => e.to_string(),
        };
        assert_eq!(got, want, "{body}");
    }
}

#[test]
fn an_answer_is_bounded() {
    let at_bound = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"x":"{}"}}}}"#,
        "a".repeat(MAX_ANSWER_BYTES - 42)
    );
    assert!(at_bound.len() <= MAX_ANSWER_BYTES);
    let (result, _, _) = read_all(
        "application/json",
        Some(1),
        at_bound.as_bytes(),
        &[65_536; 100],
    );
    assert!(result.is_ok());
    let over = format!(
        "{at_bound}{}",
        " ".repeat(MAX_ANSWER_BYTES - at_bound.len() + 1)
    );
    let (result, _, _) = read_all("application/json", Some(1), over.as_bytes(), &[65_536; 100]);
    assert_eq!(result, Err(McpError::TooLarge));
    let events = format!("data: {}\n\n", "x".repeat(MAX_ANSWER_BYTES));
    let (result, _, _) = read_all(
        "text/event-stream",
        Some(1),
        events.as_bytes(),
        &[65_536; 100],
    );
    assert_eq!(result, Err(McpError::TooLarge));
}

fn tool(name: &str, description: &str) -> Value {
    json!({"name": name, "description": description, "inputSchema": {"type":"object","properties":{"q":{"type":"string"}}}})
}

#[test]
fn tool_listings_filter_page_and_cut() {
    let (tools, next) = tools_page(&json!({
        "tools": [tool("echo", "Echoes back"), tool("add", "Adds two numbers"), tool("secret_admin", "x"), {"nameless": true}],
        "nextCursor": "c2",
    }))
    .unwrap();
    assert_eq!(tools.len(), 3);
    assert_eq!(next.as_deref(), Some("c2"));
    assert!(tools_page(&json!({})).is_err());
    let s = server(r#"{"name":"every","url":"https://e.example","tools":{"deny":["secret_*"]}}"#);
    expect_test::expect![[r#"
        ## echo
        Echoes back
        arguments: {"properties":{"q":{"type":"string"}},"type":"object"}

        ## add
        Adds two numbers
        arguments: {"properties":{"q":{"type":"string"}},"type":"object"}

        Call one with mcp_call {server: "every", tool, arguments}.
    "#]]
    .assert_eq(&render_tools(&s, &tools, None, 0, false));
    let found = render_tools(&s, &tools, Some("NUMBERS"), 0, false);
    assert!(
        found.contains("## add") && !found.contains("## echo"),
        "{found}"
    );
    assert!(
        render_tools(&s, &tools, Some("admin"), 0, false).contains("offers no tools that match")
    );

    // Paging: 60 tools, 25 a page.
    let many: Vec<ToolInfo> = (0..60)
        .map(|i| {
            tools_page(&json!({"tools": [tool(&format!("t{i:02}"), "")]}))
                .unwrap()
                .0
                .remove(0)
        })
        .collect();
    let first = render_tools(&s, &many, None, 0, false);
    assert!(first.contains("## t24") && !first.contains("## t25"));
    assert!(
        first.contains("[35 more: call mcp_tools with server=\"every\" offset=25]"),
        "{first}"
    );
    let last = render_tools(&s, &many, None, 50, true);
    assert!(last.contains("## t59") && !last.contains("more:"), "{last}");
    assert!(last.contains("more than 1000 tools"));

    // A long schema is cut, and shown whole when the tool is asked for by name.
    let big =
        json!({"name": "big", "inputSchema": {"description": "y".repeat(MAX_SCHEMA_BYTES * 2)}});
    let (tools, _) = tools_page(&json!({"tools": [big]})).unwrap();
    let cut = render_tools(&s, &tools, None, 0, false);
    assert!(cut.contains("(cut: call mcp_tools with server=\"every\" query=\"big\""));
    assert!(cut.len() < MAX_SCHEMA_BYTES + 1_000);
    let whole = render_tools(&s, &tools, Some("big"), 0, false);
    assert!(whole.len() > MAX_SCHEMA_BYTES * 2, "{}", whole.len());
}

#[test]
fn call_results_become_text_and_blobs() {
    // A 1x1 PNG, as base64 with padding.
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
    let big_text = "z".repeat(MAX_INLINE_RESOURCE_BYTES + 1);
    let result = json!({
        "content": [
            {"type": "text", "text": "Here it is"},
            {"type": "image", "data": png, "mimeType": "image/png"},
            {"type": "image", "data": "!!!", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "test://small", "mimeType": "text/plain", "text": "small text"}},
            {"type": "resource", "resource": {"uri": "test://big", "text": big_text}},
            {"type": "resource_link", "uri": "test://static/resource/1", "name": "Resource 1"},
            {"type": "video"},
        ]
    });
    let plan = plan_call_result(&result, "every").unwrap();
    assert!(!plan.is_error);
    let Part::Store { bytes, .. } = &plan.parts[1] else {
        panic!("{:?}", plan.parts[1])
    };
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let stored = vec![
        Ok(("wuhu://blob/s.1".to_string(), true)),
        Err("too large".to_string()),
    ];
    expect_test::expect![[r#"
        Here it is
        [image: image/png, 70 bytes, attached: wuhu://blob/s.1]
        [image: its data is not base64]
        [resource test://small]
        small text
        [resource test://big: text/plain, 16385 bytes, not kept: too large]
        [resource Resource 1: read it with read wuhu://mcp/every/test://static/resource/1]
        [content of type "video", not shown]"#]]
    .assert_eq(&render_result(&plan, &stored));

    let text_blob = plan_resource(&json!({"contents": [{"uri": "test://big", "text": "q".repeat(MAX_INLINE_RESOURCE_BYTES + 1)}]}), "every").unwrap();
    let shown = render_result(&text_blob, &[Ok(("wuhu://blob/s.2".into(), false))]);
    assert!(shown.starts_with("[resource test://big: text/plain, 16385 bytes, stored as wuhu://blob/s.2 (read it with read)]\nqqq"), "{shown}");
    assert!(shown.len() < 1_200);

    let error = plan_call_result(
        &json!({"content": [{"type":"text","text":"boom"}], "isError": true}),
        "e",
    )
    .unwrap();
    assert!(error.is_error);
    let structured = plan_call_result(&json!({"structuredContent": {"sum": 3}}), "e").unwrap();
    assert_eq!(render_result(&structured, &[]), "{\n  \"sum\": 3\n}");
    assert!(plan_call_result(&json!({}), "e").is_err());
    assert!(plan_resource(&json!({}), "e").is_err());
    assert_eq!(
        render_result(
            &ResultPlan {
                is_error: false,
                parts: vec![]
            },
            &[]
        ),
        "(the tool returned no content)"
    );
    assert_eq!(
        error_text("every", "tools/call echo", &McpError::Timeout(60)),
        "MCP server \"every\": tools/call echo: no answer within 60 s"
    );
    assert_eq!(
        call_params("echo", &json!({"message": "hi"}), Some("call-1")),
        json!({"name": "echo", "arguments": {"message": "hi"}, "_meta": {"progressToken": "call-1"}})
    );
}

mod oauth_flow {
    use serde_json::json;

    use super::super::oauth::*;

    #[test]
    fn pkce_matches_rfc_7636() {
        // RFC 7636, appendix B.
        let random = [
            116, 24, 223, 180, 151, 153, 224, 37, 79, 250, 96, 125, 216, 173, 187, 186, 22, 212,
            37, 77, 105, 214, 191, 240, 91, 88, 5, 88, 83, 132, 141, 121,
        ];
        let (verifier, challenge) = pkce(random);
        assert_eq!(verifier, "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk");
        assert_eq!(challenge, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        assert!(valid_state(&verifier));
        assert!(!valid_state("short"));
        assert!(!valid_state(&format!("{}=", &verifier[..42])));
        assert_eq!(state_key("x").len(), 64);
    }

    #[test]
    fn discovery_urls_follow_the_rfcs() {
        assert_eq!(
            resource_metadata_urls("https://mcp.example.com/v1/mcp"),
            [
                "https://mcp.example.com/.well-known/oauth-protected-resource/v1/mcp",
                "https://mcp.example.com/.well-known/oauth-protected-resource"
            ]
        );
        assert_eq!(
            resource_metadata_urls("http://localhost:3000/"),
            ["http://localhost:3000/.well-known/oauth-protected-resource"]
        );
        assert_eq!(
            authorization_metadata_urls("https://auth.example.com"),
            [
                "https://auth.example.com/.well-known/oauth-authorization-server",
                "https://auth.example.com/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            authorization_metadata_urls("https://auth.example.com/tenant1/"),
            [
                "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
                "https://auth.example.com/.well-known/openid-configuration/tenant1",
                "https://auth.example.com/tenant1/.well-known/openid-configuration"
            ]
        );
        let challenge = r#"Bearer error="invalid_token", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp""#;
        assert_eq!(
            resource_metadata_from_challenge(challenge).as_deref(),
            Some("https://mcp.example.com/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(
            resource_metadata_from_challenge(
                "Bearer resource_metadata=https://x.example/m, scope=a"
            )
            .as_deref(),
            Some("https://x.example/m")
        );
        assert_eq!(resource_metadata_from_challenge("Bearer realm=\"x\""), None);
        assert_eq!(
            canonical_resource("HTTPS://MCP.Example.com/mcp#x"),
            "https://mcp.example.com/mcp"
        );
    }

    #[test]
    fn metadata_is_checked() {
        let resource = parse_resource_metadata(
            &json!({"resource": "https://m.example/mcp", "authorization_servers": ["https://a.example"], "scopes_supported": ["mcp:tools"]}),
            "https://m.example/mcp",
        )
        .unwrap();
        assert_eq!(resource.authorization_server, "https://a.example");
        assert_eq!(resource.scopes, ["mcp:tools"]);
        assert!(parse_resource_metadata(&json!({"resource": "x"}), "https://m.example").is_err());
        let full = json!({
            "authorization_endpoint": "https://a.example/authorize",
            "token_endpoint": "https://a.example/token",
            "registration_endpoint": "https://a.example/register",
            "code_challenge_methods_supported": ["S256"],
        });
        let server = parse_authorization_metadata(&full).unwrap();
        assert_eq!(
            server.registration_endpoint.as_deref(),
            Some("https://a.example/register")
        );
        let mut plain = full.clone();
        plain["code_challenge_methods_supported"] = json!(["plain"]);
        assert!(
            parse_authorization_metadata(&plain)
                .unwrap_err()
                .contains("S256")
        );
        let mut no_token = full.clone();
        no_token.as_object_mut().unwrap().remove("token_endpoint");
        assert!(
            parse_authorization_metadata(&no_token)
                .unwrap_err()
                .contains("token_endpoint")
        );
        assert!(parse_registration(&json!({})).is_err());
        assert_eq!(
            parse_registration(&json!({"client_id": "c1", "client_secret": "s"})).unwrap(),
            Client {
                client_id: "c1".into(),
                client_secret: Some("s".into())
            }
        );
    }

    fn pending() -> Pending {
        Pending {
            tenant: "t".into(),
            sub: "alice".into(),
            source: "tenant".into(),
            server: "docs".into(),
            url: "https://m.example/mcp".into(),
            resource: "https://m.example/mcp".into(),
            verifier: "v".repeat(43),
            client: Client {
                client_id: "c1".into(),
                client_secret: None,
            },
            token_endpoint: "https://a.example/token".into(),
            redirect_uri: "https://wuhu.example/v1/mcp/callback".into(),
            expires_at_ms: 1,
            code: None,
        }
    }

    #[test]
    fn only_who_began_a_sign_in_finishes_it() {
        let p = pending();
        assert_eq!(may_finish(&p, "t", "alice"), Ok(()));
        assert!(
            may_finish(&p, "t", "bob")
                .unwrap_err()
                .contains("begun by another person")
        );
        assert!(may_finish(&p, "other", "alice").is_err());
        assert_eq!(finish_location("abc"), "/#/mcp/finish/abc");
    }

    #[test]
    fn requests_carry_pkce_and_the_resource() {
        let server = AuthorizationServer {
            authorization_endpoint: "https://a.example/authorize?x=1".into(),
            token_endpoint: "https://a.example/token".into(),
            registration_endpoint: None,
        };
        expect_test::expect!["https://a.example/authorize?x=1&response_type=code&client_id=c1&redirect_uri=https%3A%2F%2Fwuhu.example%2Fv1%2Fmcp%2Fcallback&code_challenge=ch&code_challenge_method=S256&state=st&resource=https%3A%2F%2Fm.example%2Fmcp&scope=mcp%3Atools+read"]
            .assert_eq(&authorization_url(&server, &pending(), "ch", "st", &["mcp:tools".into(), "read".into()]).unwrap());
        expect_test::expect!["grant_type=authorization_code&code=the+code&redirect_uri=https%3A%2F%2Fwuhu.example%2Fv1%2Fmcp%2Fcallback&client_id=c1&code_verifier=vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv&resource=https%3A%2F%2Fm.example%2Fmcp"]
            .assert_eq(&code_request(&pending(), "the code"));
        assert_eq!(
            registration_request("https://w/cb")["token_endpoint_auth_method"],
            "none"
        );
    }

    #[test]
    fn tokens_expire_and_refresh() {
        let (access, refresh, expires) = parse_tokens(
            &json!({"access_token": "a", "token_type": "Bearer", "expires_in": 3600, "refresh_token": "r"}),
            1_000,
            None,
        )
        .unwrap();
        assert_eq!(
            (access.as_str(), refresh.as_deref(), expires),
            ("a", Some("r"), Some(3_601_000))
        );
        // A refresh that sends no new refresh token keeps the old one.
        let (_, kept, _) = parse_tokens(&json!({"access_token": "b"}), 0, Some("r")).unwrap();
        assert_eq!(kept.as_deref(), Some("r"));
        assert_eq!(
            parse_tokens(
                &json!({"error": "invalid_grant", "error_description": "expired"}),
                0,
                None
            )
            .unwrap_err(),
            "the authorization server refused: invalid_grant: expired"
        );
        assert!(parse_tokens(&json!({"access_token": "a", "token_type": "mac"}), 0, None).is_err());
        let connection = Connection {
            url: "u".into(),
            access_token: "a".into(),
            refresh_token: Some("r".into()),
            expires_at_ms: Some(100_000),
            client: Client {
                client_id: "c1".into(),
                client_secret: Some("s".into()),
            },
            token_endpoint: "t".into(),
            resource: "https://m.example/mcp".into(),
            connected_at_ms: 0,
        };
        assert!(!connection.stale(100_000 - REFRESH_MARGIN_MS - 1));
        assert!(connection.stale(100_000 - REFRESH_MARGIN_MS));
        assert!(
            !Connection {
                expires_at_ms: None,
                ..connection.clone()
            }
            .stale(u64::MAX)
        );
        expect_test::expect!["grant_type=refresh_token&refresh_token=r&client_id=c1&resource=https%3A%2F%2Fm.example%2Fmcp&client_secret=s"]
            .assert_eq(&connection.refresh_request().unwrap());
        assert_eq!(
            Connection {
                refresh_token: None,
                ..connection
            }
            .refresh_request(),
            None
        );
    }
}

#[test]
fn an_environments_stdio_servers_are_listed_after_the_configured_ones() {
    use crate::environments::Attachment;
    use crate::wire::runner::mcp::StdioServer;
    use crate::wire::runner::{AttachedEnvironment, EnvironmentKind, RunnerKind, Snapshot};
    let attachment = |name: &str, servers: Vec<StdioServer>| Attachment {
        environment: AttachedEnvironment {
            name: name.into(),
            kind: EnvironmentKind::Local,
            root: "/src".into(),
            os: "Linux".into(),
            repo_path: None,
            branch: None,
            snapshot: Snapshot::default(),
            agents_md: None,
            agents_md_truncated: false,
            agents_md_file: None,
            cell: Default::default(),
        },
        runner: "box".into(),
        runner_owner: "ana".into(),
        runner_kind: RunnerKind::Local,
        definition_id: None,
        definition_name: None,
        secrets: Vec::new(),
        cost_per_hour_usd: None,
        mcp_servers: servers,
        attached_at: 0,
    };
    let stdio = |name: &str, args: &[&str]| StdioServer {
        name: name.into(),
        command: "node".into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Default::default(),
        secrets: Vec::new(),
    };
    let attachments = [
        attachment(
            "api",
            vec![
                stdio("every", &["dist/index.js", "stdio"]),
                stdio("long", &[&"x".repeat(100)]),
            ],
        ),
        attachment("bare", Vec::new()),
        attachment("web", vec![stdio("every", &[])]),
    ];
    let in_envs = environment_servers(&attachments);
    let names: Vec<&str> = in_envs.iter().map(|s| s.doc.name.as_str()).collect();
    assert_eq!(names, ["api/every", "api/long", "web/every"]);
    // Every tool is offered; the policy sees `<environment>/<server>/<tool>` as its `mcp`.
    assert!(in_envs[0].offers("anything"));
    assert_eq!(in_envs[0].host(), "");
    let tenant = McpServers::parse(
        TENANT_MCP_PATH,
        Some(r#"{"servers":[{"name":"docs","url":"https://t.example"}]}"#),
    )
    .unwrap();
    let (mut seen, shadowed) = visible(&tenant, None);
    seen.extend(in_envs.iter());
    expect_test::expect![[r#"
        MCP servers (call mcp_tools with server=<name> to see a server's tools):
        - docs (the tenant's; t.example)
        - api/every (in environment "api"; stdio: node dist/index.js stdio)
        - api/long (in environment "api"; stdio: node xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…)
        - web/every (in environment "web"; stdio: node)
    "#]]
    .assert_eq(&render_servers(&seen, &shadowed, None));
    let (tools, _) = tools_page(&json!({"tools": [tool("echo", "Echoes back")]})).unwrap();
    assert!(
        render_tools(&in_envs[0], &tools, None, 0, false)
            .ends_with("Call one with mcp_call {server: \"api/every\", tool, arguments}.\n")
    );
}
