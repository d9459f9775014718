//! The baseline tools of a session without an environment, through the real Worker: the `js`
//! tool (QuickJS in the session actor) with `fetch` under the egress policy and the `wuhu.*`
//! host API, the `read`/`write` tools on `wuhu://` URLs, the workspace API, and the global
//! context entry. One `wrangler dev` for the file, with a local JSON server on the egress
//! allowlist and a second one that is not; every test uses its own tenant.

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::wire::{EntryPayload, Message, ToolResult, custom_types};
use wuhu_e2e::entries::{assistants, describe};
use wuhu_e2e::util::{random_hex, unique_name};
use wuhu_e2e::{Api, FakeHttp, HttpReply, Stack, StackOptions};

const TURN: Duration = Duration::from_secs(60);
const MIB: usize = 1024 * 1024;
/// `WUHU_SANDBOX_MAX_STEPS` of the stack (the Worker's default is 1 000).
const MAX_STEPS: u64 = 5000;

struct Fixture {
    stack: Stack,
    /// On the egress allowlist (`127.0.0.1:<port>`).
    allowed: FakeHttp,
    /// Not on the allowlist: must never see a request.
    refused: FakeHttp,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let allowed = FakeHttp::start();
        let refused = FakeHttp::start();
        let stack = Stack::start_with(StackOptions {
            vars: vec![
                ("WUHU_SANDBOX_EGRESS_ALLOW".to_string(), allowed.host_port()),
                ("WUHU_SANDBOX_MAX_STEPS".to_string(), MAX_STEPS.to_string()),
            ],
            ..StackOptions::default()
        });
        Fixture {
            stack,
            allowed,
            refused,
        }
    })
}

fn stack() -> &'static Stack {
    &fixture().stack
}

/// A client in a fresh tenant.
fn client(prefix: &str) -> Api {
    stack().client("ana", &unique_name(prefix))
}

/// Runs `code` with the `js` tool in one turn.
#[track_caller]
fn js(api: &Api, session: &str, code: &str) -> ToolResult {
    api.run_tool(session, "js", json!({"code": code}), TURN)
}

/// The completion value and console text of a successful `js` result.
#[track_caller]
fn js_ok(result: &ToolResult) -> (Value, String) {
    assert!(
        !result.is_error,
        "js failed: {}\nwrangler log:\n{}",
        result.content,
        stack().log_tail(30)
    );
    let (value, console) = match result.content.split_once("\n\nconsole:\n") {
        Some((value, console)) => (value, console.to_string()),
        None => (result.content.as_str(), String::new()),
    };
    let value = serde_json::from_str(value)
        .unwrap_or_else(|e| panic!("js result is not JSON ({e}): {}", result.content));
    (value, console)
}

/// Panics unless `result` is a tool error starting with `prefix`.
#[track_caller]
fn assert_tool_error(result: &ToolResult, prefix: &str) {
    assert!(
        result.is_error && result.content.starts_with(prefix),
        "want a tool error starting with {prefix:?}, got is_error={} {:?}",
        result.is_error,
        result.content
    );
}

/// Every document path of the tenant.
fn doc_paths(api: &Api) -> Vec<String> {
    api.list_docs("")["docs"]
        .as_array()
        .expect("docs array")
        .iter()
        .map(|d| d["path"].as_str().expect("path").to_string())
        .collect()
}

#[test]
fn js_fetches_json_transforms_it_and_writes_a_workspace_doc_with_frontmatter() {
    let _guard = stack().guard();
    let server = &fixture().allowed;
    server.route(
        "/inventory",
        HttpReply::json(&json!({
            "currency": "EUR",
            "items": [
                {"sku": "b-2", "name": "Bolt", "price": 0.25, "qty": 400, "inStock": true},
                {"sku": "c-3", "name": "Crate", "price": 15.5, "qty": 0, "inStock": false},
                {"sku": "a-1", "name": "Anvil", "price": 120, "qty": 2, "inStock": true},
            ],
        })),
    );
    let api = client("fetch");
    let session = api.create_fake_session();
    let code = r##"
const url = "URL/inventory?warehouse=berlin";
const r = await fetch(url, { headers: { "x-wuhu-test": "inventory" } });
if (!r.ok) throw new Error("HTTP " + r.status);
const data = await r.json();
const items = data.items.filter((i) => i.inStock).sort((a, b) => a.name.localeCompare(b.name));
const value = items.reduce((sum, i) => sum + i.price * i.qty, 0);
const doc = [
  "---",
  "title: Inventory Berlin",
  "currency: " + data.currency,
  "count: " + items.length,
  "value: " + value,
  "tags: [inventory, generated]",
  "---",
  "# Inventory",
  "",
  ...items.map((i) => `- ${i.name} (${i.sku}): ${i.qty} × ${i.price}`),
  "",
].join("\n");
const saved = await wuhu.workspace.write("wuhu://workspace/notes/result.md", doc);
console.log("fetched", r.status, r.headers.get("content-type"));
const listed = await wuhu.workspace.list("notes/");
const readBack = await wuhu.workspace.read("notes/result.md");
({ count: items.length, value, saved, listed: listed.map((d) => d.path), sameText: readBack === doc })
"##
    .replace("URL", &server.base_url());
    let result = js(&api, &session.id, &code);
    let (value, console) = js_ok(&result);
    assert_eq!(value["count"], 2, "{value}");
    assert_eq!(value["value"], 340, "{value}");
    assert_eq!(value["listed"], json!(["notes/result.md"]), "{value}");
    assert_eq!(value["sameText"], true, "{value}");
    assert_eq!(value["saved"]["path"], "notes/result.md", "{value}");
    assert!(
        console.starts_with("fetched 200 application/json"),
        "{console:?}"
    );

    // The script's request reached the server as sent.
    let requests = server.requests_to("/inventory");
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].path, "/inventory?warehouse=berlin");
    assert_eq!(requests[0].header("x-wuhu-test"), Some("inventory"));

    // The document is readable through the API, frontmatter parsed.
    let response = api.get_doc("notes/result.md");
    response.expect_status(200);
    let doc = response.json();
    let frontmatter = json!({
        "title": "Inventory Berlin",
        "currency": "EUR",
        "count": 2,
        "value": 340,
        "tags": ["inventory", "generated"],
    });
    assert_eq!(doc["path"], "notes/result.md", "{doc}");
    assert_eq!(doc["frontmatter"], frontmatter, "{doc}");
    assert_eq!(
        doc["body"], "# Inventory\n\n- Anvil (a-1): 2 × 120\n- Bolt (b-2): 400 × 0.25\n",
        "{doc}"
    );
    let content = doc["content"].as_str().expect("content");
    assert!(
        content.starts_with("---\ntitle: Inventory Berlin\n"),
        "{doc}"
    );
    assert!(content.ends_with(doc["body"].as_str().unwrap()), "{doc}");
    assert_eq!(doc["size"], content.len(), "size counts bytes: {doc}");
    assert_eq!(
        doc["version"], value["saved"]["version"],
        "{doc} vs {value}"
    );
    let listing = api.list_docs("prefix=notes/");
    let docs = listing["docs"].as_array().expect("docs");
    assert_eq!(docs.len(), 1, "{listing}");
    assert_eq!(docs[0]["path"], "notes/result.md");
    assert_eq!(docs[0]["frontmatter"], frontmatter, "{listing}");
    assert_eq!(docs[0]["version"], doc["version"], "{listing}");

    // The transcript shows the code and the result like any tool call.
    let transcript = api.transcript(&session.id);
    let call = assistants(&transcript)
        .iter()
        .flat_map(|m| m.tool_calls())
        .find(|c| c.name == "js")
        .cloned()
        .unwrap_or_else(|| panic!("{}", describe(&transcript)));
    assert_eq!(call.arguments["code"], code);
}

#[test]
fn fetch_to_non_allowlisted_or_private_addresses_is_refused_before_any_request() {
    let _guard = stack().guard();
    let Fixture {
        allowed, refused, ..
    } = fixture();
    let api = client("egress");
    let session = api.create_fake_session();
    let cases: Vec<(String, &str)> = vec![
        (
            refused.url("/secret"),
            "egress refused: 127.0.0.1 is a private, loopback or link-local address (allow it with WUHU_SANDBOX_EGRESS_ALLOW)",
        ),
        (
            format!("http://localhost:{}/refused", allowed.port()),
            "egress refused: localhost is a private, loopback or link-local address",
        ),
        (
            format!("http://[::ffff:127.0.0.1]:{}/refused", allowed.port()),
            "is a private, loopback or link-local address",
        ),
        (
            "http://10.0.0.1/".into(),
            "egress refused: 10.0.0.1 is a private, loopback or link-local address",
        ),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            "egress refused: 169.254.169.254 is a private, loopback or link-local address",
        ),
        (
            "http://example.com:8080/".into(),
            "egress refused: port 8080 is not a standard port (allow it with WUHU_SANDBOX_EGRESS_ALLOW)",
        ),
        (
            "file:///etc/passwd".into(),
            "egress refused: scheme \"file\" is not allowed (http and https only)",
        ),
    ];
    let calls: Vec<(&str, Value)> = cases
        .iter()
        .map(|(url, _)| {
            (
                "js",
                json!({"code": format!("const r = await fetch({url:?}); r.status")}),
            )
        })
        .collect();
    let results = api.run_tool_calls(&session.id, &calls, TURN);
    for ((url, rule), result) in cases.iter().zip(&results) {
        assert!(
            result.is_error
                && result
                    .content
                    .starts_with("exception error: Error: egress refused")
                && result.content.contains(rule),
            "{url}: want a tool error naming {rule:?}, got is_error={} {:?}",
            result.is_error,
            result.content
        );
    }
    assert!(
        refused.requests().is_empty(),
        "the non-allowlisted server was reached: {:?}",
        refused.requests()
    );
    assert!(
        allowed.requests_to("/refused").is_empty(),
        "a refused URL reached the allowlisted server: {:?}",
        allowed.requests_to("/refused")
    );

    // The session keeps working, and the allowlisted server is reachable from it.
    allowed.route("/ping", HttpReply::json(&json!({"pong": true})));
    let (value, _) = js_ok(&js(
        &api,
        &session.id,
        &format!(
            "(await fetch({:?}).then((r) => r.json())).pong",
            allowed.url("/ping")
        ),
    ));
    assert_eq!(value, true);
}

#[test]
fn fetch_limits_requests_and_response_bytes_per_call_and_does_not_follow_redirects() {
    let _guard = stack().guard();
    let server = &fixture().allowed;
    let tag = unique_name("limits");
    server.route(&format!("/{tag}/count"), HttpReply::json(&json!({"ok": 1})));
    server.route(
        &format!("/{tag}/moved"),
        HttpReply::text(302, "").with_header("Location", format!("/{tag}/target")),
    );
    // Two of these exceed the 5 MiB of responses one call may read.
    server.route(
        &format!("/{tag}/big"),
        HttpReply::text(200, "x".repeat(MIB * 11 / 4)),
    );
    let api = client("limits");
    let session = api.create_fake_session();

    let code = r#"
let ok = 0, error = null;
for (let i = 0; i < 25; i++) {
  try { await fetch("URL/count?i=" + i); ok++; } catch (e) { error = e.message; break; }
}
({ ok, error })
"#
    .replace("URL", &server.url(&format!("/{tag}")));
    let (value, _) = js_ok(&js(&api, &session.id, &code));
    assert_eq!(value["ok"], 20, "{value}");
    assert_eq!(
        value["error"], "egress refused: at most 20 requests per js call",
        "{value}"
    );
    assert_eq!(server.requests_to(&format!("/{tag}/count")).len(), 20);

    let code = r#"
const first = (await (await fetch("URL/big")).text()).length;
let error = null;
try { await fetch("URL/big"); } catch (e) { error = e.message; }
({ first, error })
"#
    .replace("URL", &server.url(&format!("/{tag}")));
    let (value, _) = js_ok(&js(&api, &session.id, &code));
    assert_eq!(value["first"], MIB * 11 / 4, "{value}");
    assert!(
        value["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("egress refused: responses exceed 5242880 bytes")),
        "{value}"
    );

    let code = r#"
const r = await fetch("URL/moved");
({ status: r.status, location: r.headers.get("location") })
"#
    .replace("URL", &server.url(&format!("/{tag}")));
    let (value, _) = js_ok(&js(&api, &session.id, &code));
    assert_eq!(
        value,
        json!({"status": 302, "location": format!("/{tag}/target")})
    );
    assert!(
        server.requests_to(&format!("/{tag}/target")).is_empty(),
        "the redirect was followed"
    );
}

#[test]
fn runaway_scripts_end_as_tool_errors_and_the_session_keeps_working() {
    let _guard = stack().guard();
    let api = client("runaway");
    let session = api.create_fake_session();
    let budget =
        format!("timeout error: script exceeded its execution budget of {MAX_STEPS} steps");
    let cases = [
        ("infinite loop", "while (true) {}", budget.as_str()),
        (
            "a loop that catches",
            "for (;;) { try { for (;;) {} } catch (e) {} finally { 1 } }",
            budget.as_str(),
        ),
        (
            "a wait longer than the time limit",
            "await new Promise((resolve) => setTimeout(resolve, 60000))",
            "timeout error: script exceeded the 5000 ms time limit",
        ),
        (
            "memory bomb",
            "const hog = []; for (;;) hog.push(new Array(1 << 20).fill(hog.length));",
            "out_of_memory error: script exceeded the 32 MiB memory limit",
        ),
        (
            "runaway recursion",
            "function down(n) { return down(n + 1) + 1; } down(0)",
            "stack_overflow error: RangeError: Maximum call stack size exceeded",
        ),
        (
            "eval",
            "eval('1 + 1')",
            "exception error: EvalError: eval: code generation from strings is disabled",
        ),
        (
            "deep JSON",
            "JSON.parse('['.repeat(600) + ']'.repeat(600))",
            "exception error: RangeError: JSON nested deeper than 512 levels",
        ),
    ];
    for (what, code, prefix) in cases {
        let result = js(&api, &session.id, code);
        assert_tool_error(&result, prefix);
        // The next turn succeeds.
        let (value, _) = js_ok(&js(&api, &session.id, "[1, 2, 3].map((x) => x * 2)"));
        assert_eq!(value, json!([2, 4, 6]), "after the {what}");
    }
    api.enqueue(&session.id, "followUp", "still there?");
    api.wait_idle(&session.id, TURN);
    let transcript = api.transcript(&session.id);
    assert_eq!(
        assistants(&transcript).last().map(|m| m.text()).as_deref(),
        Some("echo: still there?"),
        "{}",
        describe(&transcript)
    );
}

#[test]
fn global_context_entry_appears_at_session_start() {
    let _guard = stack().guard();
    let tenant = unique_name("context");
    let ana = stack().client("ana", &tenant);
    let bob = stack().client("bob", &tenant);
    let text = "---\nrole: staff engineer\n---\nAna works on Wuhu. Notes live in wuhu://workspace/notes/.\n";
    let put = ana.put_doc("users/ana/context.md", text);
    put.expect_status(200);
    let version = put.json()["version"].as_str().expect("version").to_string();

    let session = ana.create_fake_session();
    assert_eq!(session.last_cursor, 2, "header and the context entry");
    let transcript = ana.transcript(&session.id);
    assert_eq!(transcript.len(), 2, "{}", describe(&transcript));
    assert!(matches!(transcript[0].payload, EntryPayload::Header(_)));
    assert_eq!(transcript[1].cursor, 2);
    let EntryPayload::Message {
        message:
            Message::CustomMessage {
                custom_type,
                content,
                details,
            },
    } = &transcript[1].payload
    else {
        panic!("entry 2 is not a custom_message: {}", describe(&transcript));
    };
    assert_eq!(custom_type, custom_types::GLOBAL_CONTEXT);
    assert_eq!(
        *content,
        format!(
            "Global context of the user (wuhu://workspace/users/ana/context.md, version {version}):\n\n{text}"
        )
    );
    assert_eq!(
        details.as_ref(),
        Some(&json!({"path": "wuhu://workspace/users/ana/context.md", "version": version}))
    );
    // The LLM sees it: the fake provider answers the last message it was sent.
    ana.enqueue(&session.id, "followUp", "hello");
    ana.wait_idle(&session.id, TURN);

    // Another user of the tenant without a context document: no entry.
    let plain = bob.create_fake_session();
    assert_eq!(plain.last_cursor, 1);
    let transcript = bob.transcript(&plain.id);
    assert_eq!(transcript.len(), 1, "{}", describe(&transcript));
    // The same user in another tenant: that tenant's workspace has no document.
    let elsewhere = stack().client("ana", &unique_name("context"));
    assert_eq!(elsewhere.create_fake_session().last_cursor, 1);

    // A changed document is what new sessions see; the old session keeps its version.
    let put = ana.put_doc("users/ana/context.md", "Ana moved to the billing team.\n");
    put.expect_status(200);
    let new_version = put.json()["version"].as_str().unwrap().to_string();
    assert_ne!(new_version, version);
    let next = ana.create_fake_session();
    let transcript = ana.transcript(&next.id);
    let EntryPayload::Message {
        message: Message::CustomMessage {
            content, details, ..
        },
    } = &transcript[1].payload
    else {
        panic!("{}", describe(&transcript));
    };
    assert!(
        content.ends_with("\n\nAna moved to the billing team.\n"),
        "{content:?}"
    );
    assert_eq!(details.as_ref().unwrap()["version"], new_version);
    let old = ana.transcript(&session.id);
    assert!(
        matches!(&old[1].payload, EntryPayload::Message { message: Message::CustomMessage { details, .. } } if details.as_ref().unwrap()["version"] == version)
    );
}

#[test]
fn workspace_api_refuses_path_traversal_and_writes_nothing() {
    let _guard = stack().guard();
    let victim_tenant = unique_name("victim");
    let victim = stack().client("ana", &victim_tenant);
    victim
        .put_doc("secret.md", "the victim's secret\n")
        .expect_status(200);
    let api = client("traversal");

    // Encoded `..` and friends reach the path validator (400). Literal or `%2e%2e` dot segments
    // are resolved by URL normalisation before the Worker sees the path, which then lies outside
    // `/v1/workspace/docs/` and misses every route (404).
    let parent = "path must not contain '..'";
    let no_route = "no such route";
    let attempts: Vec<(String, u16, &str)> = vec![
        ("..%2Fescape.md".into(), 400, parent),
        ("notes%2F..%2F..%2Fescape.md".into(), 400, parent),
        ("%2e%2e%2Fescape.md".into(), 400, parent),
        ("notes/%2e%2e%2F%2e%2e%2Fescape.md".into(), 400, parent),
        (
            format!("..%2F..%2F{victim_tenant}%2Fworkspace%2Fsecret.md"),
            400,
            parent,
        ),
        ("%2e%2e/escape.md".into(), 404, no_route),
        ("notes/%2e%2e/%2e%2e/escape.md".into(), 404, no_route),
        ("notes/../../escape.md".into(), 404, no_route),
        (
            format!("%2e%2e/%2e%2e/{victim_tenant}/workspace/secret.md"),
            404,
            no_route,
        ),
        ("%2Fetc%2Fpasswd".into(), 400, "path must be relative"),
        (
            "notes%5C..%5Cescape.md".into(),
            400,
            "control characters or backslashes",
        ),
        ("notes//escape.md".into(), 400, "empty segments"),
        (
            "notes/%00escape.md".into(),
            400,
            "control characters or backslashes",
        ),
        (
            "notes/a%0Aescape.md".into(),
            400,
            "control characters or backslashes",
        ),
        ("notes/%E0%A4%A".into(), 400, "invalid percent-encoding"),
        (
            "%C0%AE%C0%AE%2Fescape.md".into(),
            400,
            "invalid percent-encoding",
        ),
    ];
    let mut report = String::new();
    for (path, status, fragment) in &attempts {
        for method in ["PUT", "GET", "DELETE"] {
            let response = match method {
                "PUT" => api.put_doc(path, "pwned\n"),
                "GET" => api.get_doc(path),
                _ => api.delete_doc(path),
            };
            report.push_str(&format!("{method} {path} -> {response}\n"));
            let error = response.expect_error(*status);
            assert!(
                error.message.contains(fragment),
                "{method} {path}: want {status} naming {fragment:?}, got {response}"
            );
        }
    }
    eprintln!("{report}");
    for prefix in ["prefix=..%2F", "prefix=notes%2F..%2F..%2F", "prefix=%2Fetc"] {
        api.get(&format!("/v1/workspace/docs?{prefix}"))
            .expect_error(400);
    }
    assert_eq!(doc_paths(&api), Vec::<String>::new(), "nothing was written");
    assert_eq!(
        doc_paths(&victim),
        ["secret.md"],
        "the victim's doc is intact"
    );
    let secret = victim.get_doc("secret.md");
    secret.expect_status(200);
    assert_eq!(secret.json()["content"], "the victim's secret\n");
}

#[test]
fn read_and_write_tools_refuse_traversal_and_plain_paths() {
    let _guard = stack().guard();
    let api = client("tooltraversal");
    let session = api.create_fake_session();
    let no_env = "No environment is attached to this session";
    let cases = [
        (
            "wuhu://workspace/../escape.md",
            "path must not contain '..'",
        ),
        (
            "wuhu://workspace/notes/../../escape.md",
            "path must not contain '..'",
        ),
        ("wuhu://workspace//etc/passwd", "path must be relative"),
        (
            "wuhu://workspace/notes\\..\\escape.md",
            "control characters or backslashes",
        ),
        (
            "wuhu://workspace/notes/\u{0}escape.md",
            "control characters or backslashes",
        ),
        ("wuhu://workspace/notes//escape.md", "empty segments"),
        (
            "wuhu://config/../workspace/escape.md",
            "path must not contain '..'",
        ),
        (
            "wuhu://env/box/../../etc/passwd",
            "path must not contain '..'",
        ),
        ("wuhu://elsewhere/escape.md", "unknown wuhu:// location"),
        ("/etc/passwd", no_env),
        ("../../etc/passwd", no_env),
        ("wuhu://env/box/etc/passwd", no_env),
    ];
    let mut calls: Vec<(&str, Value)> = Vec::new();
    for (path, _) in &cases {
        calls.push(("read", json!({"path": path})));
        calls.push(("write", json!({"path": path, "content": "pwned\n"})));
    }
    let results = api.run_tool_calls(&session.id, &calls, TURN);
    for (i, result) in results.iter().enumerate() {
        let (path, rule) = cases[i / 2];
        assert!(
            result.is_error && result.content.contains(rule),
            "{} {path:?}: want a tool error containing {rule:?}, got is_error={} {:?}",
            calls[i].0,
            result.is_error,
            result.content
        );
    }

    // The same through the js host API.
    let code = r#"
const attempts = [
  () => wuhu.workspace.write("../escape.md", "pwned"),
  () => wuhu.workspace.write("wuhu://workspace/notes/../../escape.md", "pwned"),
  () => wuhu.workspace.read("wuhu://workspace/../escape.md"),
  () => wuhu.workspace.list("../"),
  () => wuhu.workspace.remove("/etc/passwd"),
  () => wuhu.workspace.write("wuhu://config/server.json", "{}"),
];
const errors = [];
for (const attempt of attempts) {
  try { await attempt(); errors.push(null); } catch (e) { errors.push(e.message); }
}
errors
"#;
    let (value, _) = js_ok(&js(&api, &session.id, code));
    let errors = value.as_array().expect("array");
    assert_eq!(errors.len(), 6, "{value}");
    for (i, error) in errors.iter().enumerate() {
        assert!(error.is_string(), "attempt {i} was not refused: {value}");
    }
    assert!(
        errors[5]
            .as_str()
            .unwrap()
            .contains("is not a workspace path"),
        "{value}"
    );
    assert_eq!(doc_paths(&api), Vec::<String>::new(), "nothing was written");
}

#[test]
fn read_and_write_tools_round_trip_and_page_long_docs_with_a_continuation_hint() {
    let _guard = stack().guard();
    let api = client("paging");
    let session = api.create_fake_session();
    let short: String = (1..=3000).map(|i| format!("line {i:04}\n")).collect();
    let wide_line = "w".repeat(99);
    let wide: String = (1..=1000)
        .map(|i| format!("{i:04} {wide_line}\n"))
        .collect();
    let results = api.run_tool_calls(
        &session.id,
        &[
            (
                "write",
                json!({"path": "wuhu://workspace/notes/long.md", "content": short}),
            ),
            (
                "write",
                json!({"path": "wuhu://workspace/notes/wide.md", "content": wide}),
            ),
            ("read", json!({"path": "wuhu://workspace/notes/long.md"})),
            (
                "read",
                json!({"path": "wuhu://workspace/notes/long.md", "offset": 2001, "limit": 500}),
            ),
            (
                "read",
                json!({"path": "wuhu://workspace/notes/long.md", "offset": 2501}),
            ),
            ("read", json!({"path": "wuhu://workspace/notes/wide.md"})),
            ("read", json!({"path": "wuhu://workspace/notes/"})),
            ("read", json!({"path": "wuhu://workspace/notes/missing.md"})),
        ],
        TURN,
    );
    for result in &results[..7] {
        assert!(!result.is_error, "{result:?}");
    }
    assert!(
        results[0]
            .content
            .starts_with("Wrote wuhu://workspace/notes/long.md (30000 bytes, version "),
        "{:?}",
        results[0].content
    );
    let lines = |from: usize, to: usize| -> String {
        (from..=to).map(|i| format!("line {i:04}\n")).collect()
    };
    assert_eq!(
        results[2].content,
        format!(
            "{}[1000 more lines: call read with offset=2001]\n",
            lines(1, 2000)
        )
    );
    assert_eq!(
        results[3].content,
        format!(
            "{}[500 more lines: call read with offset=2501]\n",
            lines(2001, 2500)
        )
    );
    assert_eq!(results[4].content, lines(2501, 3000));

    // The 50 KB cut applies too, at a line boundary, with the offset that continues.
    let wide_read = &results[5].content;
    let (shown, hint) = wide_read
        .trim_end()
        .rsplit_once('\n')
        .expect("text and a hint line");
    let shown_lines = shown.lines().count();
    assert!(shown.len() <= 50 * 1024, "{} bytes shown", shown.len());
    assert!(shown_lines < 1000);
    assert_eq!(format!("{shown}\n"), wide[..shown.len() + 1]);
    assert_eq!(
        hint,
        format!(
            "[{} more lines: call read with offset={}]",
            1000 - shown_lines,
            shown_lines + 1
        )
    );
    assert_eq!(
        results[6].content,
        "wuhu://workspace/notes/long.md (30000 bytes)\nwuhu://workspace/notes/wide.md (105000 bytes)\n"
    );
    assert_tool_error(
        &results[7],
        "No document at wuhu://workspace/notes/missing.md",
    );

    // What the tool wrote is what the API serves.
    let doc = api.get_doc("notes/long.md");
    doc.expect_status(200);
    assert_eq!(doc.json()["content"], short);
    assert_eq!(doc.json()["frontmatter"], Value::Null);
}

#[test]
fn config_server_json_is_readable_but_not_writable() {
    let _guard = stack().guard();
    let tenant = unique_name("config");
    let api = stack().client("ana", &tenant);
    let session = api.create_fake_session();
    let results = api.run_tool_calls(
        &session.id,
        &[
            ("read", json!({"path": "wuhu://config/server.json"})),
            (
                "write",
                json!({"path": "wuhu://config/server.json", "content": "{}"}),
            ),
            ("read", json!({"path": "wuhu://config/secrets.json"})),
        ],
        TURN,
    );
    assert!(!results[0].is_error, "{:?}", results[0]);
    let settings: Value = serde_json::from_str(&results[0].content)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", results[0].content));
    assert_eq!(settings["tenant"], tenant, "{settings}");
    assert_eq!(settings["workspace"], "wuhu://workspace/", "{settings}");
    assert_eq!(settings["openaiBaseUrl"], stack().openai().base_url());
    assert_eq!(settings["openaiKeyConfigured"], true, "{settings}");
    assert!(
        !results[0].content.contains(stack().secret())
            && !results[0]
                .content
                .contains(wuhu_e2e::stack::OPENAI_TEST_KEY),
        "secrets leak: {}",
        results[0].content
    );
    assert_tool_error(&results[1], "wuhu://config/ is read-only");
    assert_tool_error(&results[2], "No config document \"secrets.json\"");
    assert_eq!(doc_paths(&api), Vec::<String>::new());
}

#[test]
fn workspace_api_limits_size_validates_frontmatter_and_deletes() {
    let _guard = stack().guard();
    let api = client("limits");
    let too_big = api.put_doc("big.md", "x".repeat(MIB + 1));
    assert_eq!(too_big.expect_error(413).code, "payload_too_large");
    let exact = api.put_doc("exact.md", "y".repeat(MIB));
    exact.expect_status(200);
    assert_eq!(exact.json()["size"], MIB);

    let bad = api.put_doc("bad.md", "---\ntitle: [unclosed\n---\nbody\n");
    let error = bad.expect_error(400);
    assert!(
        error.message.contains("invalid yaml frontmatter"),
        "{error:?}"
    );
    api.get_doc("big.md").expect_error(404);
    api.get_doc("bad.md").expect_error(404);

    let session = api.create_fake_session();
    let results = api.run_tool_calls(
        &session.id,
        &[
            ("write", json!({"path": "wuhu://workspace/bad.md", "content": "---\n: [\n---\n"})),
            (
                "js",
                json!({"code": "await wuhu.workspace.write('big.md', 'z'.repeat(1024 * 1024 + 1))"}),
            ),
        ],
        TURN,
    );
    assert_tool_error(&results[0], "invalid yaml frontmatter");
    assert_tool_error(
        &results[1],
        "exception error: Error: document exceeds 1048576 bytes",
    );
    assert_eq!(doc_paths(&api), ["exact.md"]);

    let good = "---\ntitle: Plan\nsteps: 3\n---\nBody.\n";
    api.put_doc("plan.md", good).expect_status(200);
    let doc = api.get_doc("plan.md").json();
    assert_eq!(doc["frontmatter"], json!({"title": "Plan", "steps": 3}));
    assert_eq!(doc["body"], "Body.\n");
    assert_eq!(api.delete_doc("plan.md").status, 204);
    api.get_doc("plan.md").expect_error(404);
    api.delete_doc("plan.md").expect_error(404);
}

#[test]
fn js_sessions_api_sees_only_the_same_tenant() {
    let _guard = stack().guard();
    let api = client("sessions");
    let other = client("sessions");
    let mine: BTreeSet<String> = (0..3)
        .map(|i| api.create_session(json!({"title": format!("mine {i}")})).id)
        .collect();
    let sibling = mine.iter().next().unwrap().clone();
    api.enqueue(&sibling, "followUp", "a message in the sibling");
    api.wait_idle(&sibling, TURN);
    let foreign = other.create_session(json!({"title": "someone else's"})).id;
    let runner = mine.iter().last().unwrap().clone();
    let code = r#"
const page = await wuhu.sessions.list({ limit: 50 });
const sibling = await wuhu.sessions.get("SIBLING");
const own = await wuhu.sessions.get("RUNNER");
let foreign;
try { await wuhu.sessions.get("FOREIGN"); foreign = "visible"; } catch (e) { foreign = e.message; }
({
  ids: page.sessions.map((s) => s.id),
  siblingTexts: sibling.transcript.filter((e) => e.message?.role === "user").map((e) => e.message.content),
  foreign,
  ownHeader: own.transcript[0].type,
})
"#
    .replace("SIBLING", &sibling)
    .replace("FOREIGN", &foreign)
    .replace("RUNNER", &runner);
    let (value, _) = js_ok(&js(&api, &runner, &code));
    let ids: BTreeSet<String> = value["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, mine, "{value}");
    assert_eq!(value["ownHeader"], "header", "its own session too: {value}");
    assert_eq!(
        value["siblingTexts"],
        json!(["a message in the sibling"]),
        "{value}"
    );
    assert!(
        value["foreign"]
            .as_str()
            .is_some_and(|m| m != "visible" && m.contains("not found")),
        "{value}"
    );
}

/// A secret referenced in a `fetch` header (issue 32): sent only to the hosts it names, and
/// what comes back reaches the script masked, so the script cannot turn an echoed value into
/// something the masker would miss.
#[test]
fn a_secret_goes_into_a_fetch_header_only_for_its_hosts_and_comes_back_masked() {
    let _guard = stack().guard();
    let server = &fixture().allowed;
    let value = format!("api-{}", random_hex(16));
    server.route("/whoami", HttpReply::json(&json!({"echo": value})));
    let api = client("fetch-secret");
    for (name, body) in [
        ("API_KEY", json!({"value": value, "hosts": ["127.0.0.1"]})),
        ("NO_HOSTS", json!({"value": "other-value-1"})),
    ] {
        let set = api.send(
            api.request("PUT", &format!("/v1/secrets/{name}"))
                .json(&body),
        );
        assert_eq!(set.status, 200, "{set}");
    }
    let session = api.create_fake_session();
    let code = r#"
const r = await fetch("URL/whoami", { headers: { authorization: "Bearer {{secret:API_KEY}}" } });
const body = await r.text();
let refused = null;
try { await fetch("URL/whoami", { headers: { "x-key": "{{secret:NO_HOSTS}}" } }); } catch (e) { refused = e.message; }
let unknown = null;
try { await fetch("URL/whoami", { headers: { "x-key": "{{secret:NOBODY}}" } }); } catch (e) { unknown = e.message; }
({ body, reversed: body.split("").reverse().join(""), refused, unknown })
"#
    .replace("URL", &server.base_url());
    let (result, _) = js_ok(&js(&api, &session.id, &code));
    let requests = server.requests_to("/whoami");
    assert_eq!(
        requests.len(),
        1,
        "the refused fetches were sent: {requests:?}"
    );
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {value}").as_str())
    );
    let body = result["body"].as_str().unwrap();
    assert!(
        body.contains("[secret:API_KEY]") && !body.contains(&value),
        "{result}"
    );
    let reversed: String = value.chars().rev().collect();
    assert!(
        !result["reversed"].as_str().unwrap().contains(&reversed),
        "{result}"
    );
    assert!(
        result["refused"]
            .as_str()
            .unwrap()
            .contains("secret NO_HOSTS may not be sent to 127.0.0.1"),
        "{result}"
    );
    assert!(
        result["unknown"]
            .as_str()
            .unwrap()
            .contains("no secret NOBODY is available to this turn"),
        "{result}"
    );
}
