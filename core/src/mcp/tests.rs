use super::*;

const SID: &str = "0f3c2a1b-5d1e-4c0a-9f7e-2b8f1d3c4a5e";

#[test]
fn messages() {
    let cases: Vec<(&str, Result<&str, i64>)> = vec![
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            Ok("request tools/list"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"a","method":"ping","params":{}}"#,
            Ok("request ping"),
        ),
        (
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            Ok("accepted"),
        ),
        (r#"{"jsonrpc":"2.0","id":7,"result":{}}"#, Ok("accepted")),
        ("not json", Err(codes::PARSE_ERROR)),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            Err(codes::INVALID_REQUEST),
        ),
        (r#"{"id":1,"method":"ping"}"#, Err(codes::INVALID_REQUEST)),
        (
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            Err(codes::INVALID_REQUEST),
        ),
        (r#"{"jsonrpc":"2.0","id":1}"#, Err(codes::INVALID_REQUEST)),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":5}"#,
            Err(codes::INVALID_REQUEST),
        ),
        (
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}"#,
            Err(codes::INVALID_REQUEST),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            Err(codes::INVALID_REQUEST),
        ),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":[1]}"#,
            Err(codes::INVALID_REQUEST),
        ),
    ];
    for (body, want) in cases {
        let got = parse(body.as_bytes()).map(|m| match m {
            Incoming::Request { method, .. } => format!("request {method}"),
            Incoming::Accepted => "accepted".into(),
        });
        match (want, got) {
            (Ok(w), Ok(g)) => assert_eq!(g, w, "{body}"),
            (Err(code), Err(e)) => assert_eq!(e.code, code, "{body}: {}", e.message),
            (w, g) => panic!("{body}: want {w:?}, got {g:?}"),
        }
    }
}

#[test]
fn versions() {
    assert!(version_supported(None));
    assert!(version_supported(Some("2025-06-18")));
    assert!(version_supported(Some("2025-03-26")));
    assert!(!version_supported(Some("2024-11-05")));
    assert!(!version_supported(Some("tomorrow")));
    let init = |v: &str| {
        initialize_result(&json!({"protocolVersion": v}), "1.0")["protocolVersion"].clone()
    };
    assert_eq!(init("2025-03-26"), "2025-03-26");
    assert_eq!(init("2025-06-18"), "2025-06-18");
    assert_eq!(init("2024-11-05"), "2025-06-18");
    let result = initialize_result(&json!({}), "1.2.3");
    assert_eq!(result["serverInfo"]["version"], "1.2.3");
    assert_eq!(
        result["capabilities"],
        json!({"tools": {"listChanged": false}, "resources": {"listChanged": false, "subscribe": false}})
    );
}

fn call(name: &str, args: Value) -> Result<Plan, RpcError> {
    plan(&json!({"name": name, "arguments": args}))
}

fn http(method: &'static str, path: &str, body: Option<Value>) -> Result<Plan, i64> {
    Ok(Plan::Http(HttpCall {
        method,
        path: path.into(),
        body: body.map(|b| match b {
            Value::String(text) => CallBody::Text(text),
            json => CallBody::Json(json),
        }),
    }))
}

#[test]
fn tools_become_api_requests() {
    let cases: Vec<(&str, Value, Result<Plan, i64>)> = vec![
        (
            "sessions_list",
            json!({}),
            http("GET", "/v1/sessions?limit=50", None),
        ),
        (
            "sessions_list",
            json!({"limit": 200}),
            http("GET", "/v1/sessions?limit=200", None),
        ),
        (
            "sessions_list",
            json!({"limit": 0}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "sessions_list",
            json!({"limit": "5"}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "sessions_list",
            json!({"limits": 5}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "session_create",
            json!({"title": "t", "provider": "fake", "access": "tenant"}),
            http(
                "POST",
                "/v1/sessions",
                Some(json!({"title": "t", "provider": "fake", "access": "tenant"})),
            ),
        ),
        (
            "session_create",
            json!({}),
            http("POST", "/v1/sessions", Some(json!({}))),
        ),
        (
            "session_create",
            json!({"title": 5}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "session_send",
            json!({"id": SID, "content": "hi"}),
            http(
                "POST",
                &format!("/v1/sessions/{SID}/enqueue?lane=followUp"),
                Some(json!({"content": "hi"})),
            ),
        ),
        (
            "session_send",
            json!({"id": SID, "content": "hi", "lane": "steer"}),
            http(
                "POST",
                &format!("/v1/sessions/{SID}/enqueue?lane=steer"),
                Some(json!({"content": "hi"})),
            ),
        ),
        (
            "session_send",
            json!({"id": SID, "content": "hi", "lane": "system"}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "session_send",
            json!({"id": SID, "content": "  "}),
            Err(codes::INVALID_PARAMS),
        ),
        // Nothing but a UUID goes into a path.
        (
            "session_send",
            json!({"id": "../tokens", "content": "x"}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "session_read",
            json!({"id": format!("{SID}?x=1")}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "session_read",
            json!({"id": SID, "sinceCursor": 7, "limit": 10}),
            http(
                "GET",
                &format!("/v1/sessions/{SID}?limit=10&sinceCursor=7"),
                None,
            ),
        ),
        (
            "session_read",
            json!({"id": SID, "limit": 201}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "session_wait",
            json!({"id": SID}),
            Ok(Plan::Wait {
                id: SID.into(),
                timeout_secs: 30,
            }),
        ),
        (
            "session_wait",
            json!({"id": SID, "timeoutSeconds": 51}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "session_stop",
            json!({"id": SID}),
            http("POST", &format!("/v1/sessions/{SID}/stop"), Some(json!({}))),
        ),
        (
            "approvals_list",
            json!({"id": SID}),
            Ok(Plan::Approvals { id: SID.into() }),
        ),
        (
            "approval_answer",
            json!({"id": SID, "approvalId": SID, "decision": "approve_session"}),
            http(
                "POST",
                &format!("/v1/sessions/{SID}/approvals/{SID}"),
                Some(json!({"decision": "approve_session"})),
            ),
        ),
        (
            "approval_answer",
            json!({"id": SID, "approvalId": SID, "decision": "maybe"}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "approval_answer",
            json!({"id": SID, "approvalId": "x/../y", "decision": "deny"}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "workspace_read",
            json!({"path": "notes/a plan.md"}),
            http("GET", "/v1/workspace/docs/notes/a%20plan.md", None),
        ),
        (
            "workspace_read",
            json!({"path": "../secrets"}),
            Err(codes::INVALID_PARAMS),
        ),
        (
            "workspace_write",
            json!({"path": "notes/x.md", "content": ""}),
            http("PUT", "/v1/workspace/docs/notes/x.md", Some(json!(""))),
        ),
        (
            "workspace_write",
            json!({"path": "notes/x.md"}),
            Err(codes::INVALID_PARAMS),
        ),
        ("rm_rf", json!({}), Err(codes::INVALID_PARAMS)),
    ];
    for (name, args, want) in cases {
        let got = call(name, args.clone()).map_err(|e| e.code);
        assert_eq!(got, want, "{name} {args}");
    }
    // Arguments are optional as a whole, never of another type.
    assert!(plan(&json!({"name": "sessions_list"})).is_ok());
    assert!(plan(&json!({"name": "sessions_list", "arguments": [1]})).is_err());
    assert!(plan(&json!({"arguments": {}})).is_err());
}

#[test]
fn every_listed_tool_is_planned_and_every_planned_tool_listed() {
    let listed = tools();
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 10);
    for tool in listed["tools"].as_array().unwrap() {
        let name = tool["name"].as_str().unwrap();
        assert_eq!(tool["inputSchema"]["type"], "object", "{name}");
        // With its required arguments filled in, each tool plans (never "unknown tool").
        let mut args = Map::new();
        for key in tool["inputSchema"]["required"].as_array().unwrap() {
            let key = key.as_str().unwrap();
            let value = match key {
                "id" | "approvalId" => SID,
                "decision" => "deny",
                "path" => "notes/x.md",
                _ => "text",
            };
            args.insert(key.into(), value.into());
        }
        let planned = call(name, Value::Object(args));
        assert!(planned.is_ok(), "{name}: {planned:?}");
    }
}

#[test]
fn results() {
    let ok = http_result(200, &json!({"id": SID}));
    assert_eq!(ok["isError"], false);
    assert_eq!(ok["structuredContent"], json!({"id": SID}));
    let empty = http_result(204, &Value::Null);
    assert_eq!(empty["structuredContent"], json!({"ok": true}));
    let list = http_result(200, &json!([1, 2]));
    assert_eq!(list["structuredContent"], json!({"value": [1, 2]}));
    let err = http_result(
        404,
        &json!({"error": {"code": "not_found", "message": "session not found"}}),
    );
    assert_eq!(err["isError"], true);
    assert_eq!(
        err["content"][0]["text"],
        "404 not_found: session not found"
    );
    assert!(err.get("structuredContent").is_none());
    let long = "é".repeat(MAX_RESULT_TEXT_CHARS + 5);
    let cut_text = http_result(200, &json!({"text": long}))["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        cut_text.contains("cut at"),
        "{}",
        &cut_text[cut_text.len() - 80..]
    );
}

#[test]
fn waiting() {
    let running = json!({"session": {"status": "running", "lastCursor": 5}, "queue": []});
    let queued = json!({"session": {"status": "idle", "lastCursor": 5}, "queue": [{"id": "q"}]});
    let idle = json!({"session": {"status": "idle", "lastCursor": 25}, "queue": []});
    assert!(!at_rest(&running));
    assert!(!at_rest(&queued));
    assert!(at_rest(&idle));
    assert_eq!(tail_cursor(&idle), 5);
    assert_eq!(tail_cursor(&running), 0);
    let entries: Vec<Entry> = serde_json::from_value(json!([
        {"cursor": 4, "id": "a", "createdAt": 1, "type": "message", "message": {"role": "assistant", "provider": "fake", "model": "m", "content": [{"type": "text", "text": "first"}], "stopReason": "stop"}},
        {"cursor": 5, "id": "b", "createdAt": 1, "type": "message", "message": {"role": "user", "author": "ana", "content": "again"}},
        {"cursor": 6, "id": "c", "createdAt": 1, "type": "message", "message": {"role": "assistant", "provider": "fake", "model": "m", "content": [{"type": "text", "text": "second"}], "stopReason": "stop"}},
    ]))
    .unwrap();
    let done = wait_result(&idle, &entries, true);
    assert_eq!(done["structuredContent"]["finalText"], "second");
    assert_eq!(done["content"][0]["text"], "second");
    let pending = wait_result(&running, &[], false);
    assert_eq!(pending["structuredContent"]["settled"], false);
    assert!(
        pending["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("again")
    );
}

#[test]
fn resources_are_sessions_and_workspace_documents() {
    let read = |uri: Value| resource_read_call(&json!({"uri": uri})).map(|c| c.path);
    assert_eq!(
        read(json!(format!("wuhu://session/{SID}"))),
        Ok(format!("/v1/sessions/{SID}?limit=200"))
    );
    assert_eq!(
        read(json!("wuhu://workspace/notes/a b.md")),
        Ok("/v1/workspace/docs/notes/a%20b.md".to_string())
    );
    for bad in [
        json!("wuhu://session/../x"),
        json!("wuhu://workspace/../etc/passwd"),
        json!("wuhu://session/not-a-uuid"),
        json!("https://example.com/"),
        json!(7),
    ] {
        assert_eq!(
            read(bad.clone()).map_err(|e| e.code),
            Err(codes::INVALID_PARAMS),
            "{bad}"
        );
    }
    assert_eq!(
        resources_list_call(&json!({})).unwrap().path,
        "/v1/sessions?limit=50"
    );
    assert_eq!(
        resources_list_call(&json!({"cursor": SID})).unwrap().path,
        format!("/v1/sessions?limit=50&before={SID}")
    );
    assert!(resources_list_call(&json!({"cursor": "x&limit=1000"})).is_err());
    let page = json!({"sessions": [{"id": SID, "title": null, "status": "idle", "model": "fake-echo", "owner": "alice"}], "nextBefore": SID});
    expect_test::expect![[r#"{"nextCursor":"0f3c2a1b-5d1e-4c0a-9f7e-2b8f1d3c4a5e","resources":[{"description":"A Wuhu session (idle, fake-echo), owned by alice","mimeType":"application/json","name":"(untitled)","uri":"wuhu://session/0f3c2a1b-5d1e-4c0a-9f7e-2b8f1d3c4a5e"}]}"#]]
        .assert_eq(&resources_list_result(&page).to_string());
    assert!(
        resources_list_result(&json!({"sessions": []}))
            .get("nextCursor")
            .is_none()
    );
    let uri = "wuhu://workspace/notes/a.md";
    assert_eq!(
        resource_read_result(uri, 200, &json!({"content": "# A\n", "path": "notes/a.md"})),
        Ok(json!({"contents": [{"uri": uri, "mimeType": "text/markdown", "text": "# A\n"}]}))
    );
    assert_eq!(
        resource_read_result(uri, 404, &json!({})).map_err(|e| e.code),
        Err(codes::RESOURCE_NOT_FOUND)
    );
    assert_eq!(
        resource_read_result(uri, 503, &json!({})).map_err(|e| e.code),
        Err(codes::INTERNAL_ERROR)
    );
    assert_eq!(
        initialize_result(&json!({}), "1")["capabilities"]["resources"]["subscribe"],
        false
    );
}
