//! Structured logs (docs/ARCHITECTURE.md, "Observability"): one JSON line per request with its
//! request id, one per turn; never a token, the secret or a message body.

use std::time::Duration;

use wuhu_e2e::Stack;
use wuhu_e2e::util::unique_name;

#[test]
fn every_request_and_turn_is_one_json_line_without_secrets() {
    let stack = Stack::start();
    let _guard = stack.guard();
    let tenant = unique_name("logs");
    let api = stack.client("alice", &tenant);
    let session = api.create_fake_session();
    let body = "a message body that must never reach the log";
    api.enqueue(&session.id, "followUp", body);
    api.wait_idle(&session.id, Duration::from_secs(60));
    let response = api.get(&format!("/v1/sessions/{}", session.id));
    let request_id = response
        .header("x-request-id")
        .unwrap_or_else(|| panic!("no x-request-id: {response}"))
        .to_string();
    let denied = stack
        .client("bob", &tenant)
        .get(&format!("/v1/sessions/{}", session.id));
    assert_eq!(denied.status, 404);

    let lines = wuhu_e2e::wait_for(
        "the request and turn lines",
        Duration::from_secs(20),
        || {
            let lines = stack.log_events();
            let has_request = lines
                .iter()
                .any(|l| l["event"] == "request" && l["requestId"] == request_id.as_str());
            let has_turn = lines
                .iter()
                .any(|l| l["event"] == "turn" && l["session"] == session.id.as_str());
            let has_refusal = lines
                .iter()
                .any(|l| l["event"] == "request" && l["sub"] == "bob" && l["status"] == 404);
            (has_request && has_turn && has_refusal).then_some(lines)
        },
    );
    let line = lines
        .iter()
        .find(|l| l["requestId"] == request_id.as_str())
        .unwrap();
    assert_eq!(line["method"], "GET");
    assert_eq!(line["status"], 200);
    assert_eq!(line["tenant"], tenant.as_str());
    assert_eq!(line["sub"], "alice");
    assert!(line["durationMs"].is_u64(), "{line}");
    let turn = lines
        .iter()
        .find(|l| l["event"] == "turn" && l["session"] == session.id.as_str())
        .unwrap();
    assert_eq!(turn["status"], "idle");
    assert_eq!(turn["tenant"], tenant.as_str());
    let log = std::fs::read_to_string(stack.log_path()).unwrap();
    assert!(!log.contains(stack.secret()), "the secret reached the log");
    assert!(
        !log.contains(api.token().unwrap()),
        "a token reached the log"
    );
    assert!(!log.contains(body), "a message body reached the log");
}
