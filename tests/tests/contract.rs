//! The OpenAPI contract against the real Worker: `GET /v1/openapi.json` is `docs/openapi.json`
//! (which `wuhu-core`'s test keeps equal to what the wire types generate); every documented
//! operation is routed (a well-formed request gets one of its documented statuses, never the
//! router's fallback `404 no such route` or a 405); every other method on a documented path is
//! a `405`; an undocumented path under `/v1` is the JSON 404. One stack for the file.
//! `scripts/test` also fuzzes the document with schemathesis (`run_schemathesis`).

use serde_json::{Value, json};
use wuhu_e2e::stack::repo_root;
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Request, Response, Stack};

const TENANT: &str = "contract";
const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(wuhu_e2e::StackOptions::default)
}

fn committed() -> Value {
    let text = std::fs::read_to_string(repo_root().join("docs/openapi.json"))
        .expect("read docs/openapi.json");
    serde_json::from_str(&text).expect("docs/openapi.json is JSON")
}

/// `path` with each `{name}` replaced by a well-formed value that names nothing.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|segment| match segment {
            "{platform}" => "generic".to_string(),
            "{path}" => format!("contract/{}.md", unique_name("doc")),
            "{idOrName}" => unique_name("env"),
            s if s.starts_with('{') => "0b9e6a52-2a5e-4c8e-9d1f-5a3c2e1f0a7b".to_string(),
            s => s.to_string(),
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// A request for `method path` with a credential fit for the operation and a minimal body.
fn request(method: &str, path: &str, operation: Option<&Value>) -> Request {
    let stack = stack();
    let mut request = Request::new(&method.to_uppercase(), stack.url(&concrete(path)));
    request = if path == "/v1/runners/connect" {
        request.bearer(&stack.runner_token("ana", TENANT))
    } else {
        request.bearer(&stack.admin_token("ana", TENANT))
    };
    let content = operation.and_then(|op| op["requestBody"]["content"].as_object());
    match content {
        Some(content) if content.contains_key("text/plain") => request
            .header("content-type", "text/plain")
            .body("# probe\n"),
        Some(_) => request.json(&json!({})),
        None if method != "get" && method != "delete" => request.json(&json!({})),
        None => request,
    }
}

fn is_fallback(response: &Response) -> bool {
    let error = response.try_json().map(|v| v["error"].clone());
    let message = error.as_ref().and_then(|e| e["message"].as_str());
    response.status == 405 || (response.status == 404 && message == Some("no such route"))
}

#[test]
fn served_document_is_the_committed_one() {
    let stack = stack();
    let _guard = stack.guard();
    // Public: tools and client generators fetch it without a credential.
    let response = Request::new("GET", stack.url("/v1/openapi.json"))
        .send()
        .expect("GET /v1/openapi.json");
    response.expect_status(200);
    assert!(
        response
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/json")),
        "{response}"
    );
    let committed_bytes =
        std::fs::read(repo_root().join("docs/openapi.json")).expect("read docs/openapi.json");
    assert!(
        response.body == committed_bytes,
        "the Worker serves another document than docs/openapi.json: rebuild the Worker"
    );
    assert_eq!(response.json()["openapi"], "3.1.0");
}

#[test]
fn every_documented_operation_is_routed() {
    let stack = stack();
    let _guard = stack.guard();
    let document = committed();
    let paths = document["paths"].as_object().expect("paths");
    assert!(paths.len() >= 20, "suspiciously few paths: {}", paths.len());
    let mut checked = 0;
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("path item") {
            let response =
                stack
                    .client_with_token(None)
                    .send(request(method, path, Some(operation)));
            let documented = operation["responses"]
                .as_object()
                .expect("responses")
                .contains_key(&response.status.to_string());
            assert!(
                !is_fallback(&response) && documented,
                "{} {path} ({}) answered {}, which its operation does not document",
                method.to_uppercase(),
                concrete(path),
                response
            );
            // An error documented as an `ErrorBody` is one (the MCP endpoint's unreadable
            // messages are JSON-RPC errors instead, documented as such).
            let error_body = operation["responses"][response.status.to_string()]["content"]["application/json"]
                ["schema"]["$ref"]
                == "#/components/schemas/ErrorBody";
            if response.status >= 400 && error_body {
                response.expect_error(response.status);
            }
            checked += 1;
        }
    }
    assert!(checked >= 40, "only {checked} operations checked");
}

#[test]
fn undocumented_methods_are_405_and_undocumented_paths_404() {
    let stack = stack();
    let _guard = stack.guard();
    let document = committed();
    let paths = document["paths"].as_object().expect("paths");
    for (path, item) in paths {
        let item = item.as_object().expect("path item");
        for method in METHODS.iter().filter(|m| !item.contains_key(**m)) {
            let response = stack
                .client_with_token(None)
                .send(request(method, path, None));
            let error = response.expect_error(405);
            assert_eq!(error.code, "method_not_allowed", "{method} {path}");
        }
    }
    for path in [
        "/v1/contract-probe",
        "/v1/sessions/0b9e6a52-2a5e-4c8e-9d1f-5a3c2e1f0a7b/contract-probe",
        "/v1/auth/contract-probe",
        "/v1/runners/contract-probe",
    ] {
        assert!(!paths.contains_key(path), "{path} should be undocumented");
        let response = stack
            .client_with_token(None)
            .send(request("get", path, None));
        let error = response.expect_error(404);
        assert_eq!(error.code, "not_found", "{path}");
    }
}
