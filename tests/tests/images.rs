//! Images a tool produced, through the real Worker and a real `wuhu-runner`: `read` of a PNG in
//! an environment uploads it as an image blob (found by its bytes, not its name), the result
//! refers to it with its media type and pixel size, `GET /v1/blobs/:id` serves it as
//! `image/png` to the session's readers and 404s for another tenant, and an image over the
//! 5 MiB limit is a clear tool error; `read` of the blob's URL attaches the image again. The
//! model is shown the image: the request after the `read`
//! carries it in each provider dialect (Anthropic Messages, OpenAI Responses, Chat Completions),
//! as the fake provider records.
//!
//! One `wrangler dev` for the file; every test uses its own tenant.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use wuhu_core::blobs;
use wuhu_core::wire::ToolResult;
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Reply, Stack};

const TURN: Duration = Duration::from_secs(120);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

#[track_caller]
fn run_tool(api: &Api, session: &str, name: &str, arguments: Value) -> ToolResult {
    let turn = ToolTurn::start(api, session, &[(name, arguments)]);
    turn.finish(api, TURN).0.pop().expect("one result")
}

#[test]
fn a_read_image_is_an_image_blob_served_to_readers_only() {
    let _guard = stack().guard();
    let tenant = unique_name("images");
    let api = stack().client("ana", &tenant);
    let dir = TempDir::new("wuhu-e2e-images");
    let project = dir.mkdir("api");
    let png = wuhu_e2e::png::solid(2, 3, [200, 30, 30, 255]);
    std::fs::write(project.join("shot.png"), &png).unwrap();
    // Named as text, but its bytes are a PNG: an image all the same.
    std::fs::write(project.join("shot.dat"), &png).unwrap();
    // Over the limit: a PNG head, then zeros to one byte past 5 MiB.
    let big = std::fs::File::create(project.join("big.png")).unwrap();
    std::io::Write::write_all(&mut &big, &png).unwrap();
    big.set_len(wuhu_core::images::MAX_IMAGE_BYTES + 1).unwrap();
    drop(big);
    let _mac = Runner::start(
        RunnerConfig::new(stack(), "ana", &tenant, "mac")
            .workspaces_root(dir.mkdir("workspaces"))
            .env("api", &project),
    );
    let session = api.create_fake_session().id;
    let attached = run_tool(
        &api,
        &session,
        "request_environment",
        json!({"spec": "api"}),
    );
    assert!(!attached.is_error, "{}", attached.content);

    for name in ["shot.png", "shot.dat"] {
        let result = run_tool(&api, &session, "read", json!({"path": name}));
        assert!(!result.is_error, "{name}: {}", result.content);
        assert_eq!(result.blobs.len(), 1, "{name}: one blob: {result:?}");
        let blob = &result.blobs[0];
        assert_eq!(blob.media_type, "image/png", "{name}");
        assert_eq!(blob.size, png.len() as u64, "{name}");
        assert_eq!((blob.width, blob.height), (Some(2), Some(3)), "{name}");
        assert_eq!(blob.preview, None, "{name}");
        // The model reads where the image is and its size; never its bytes.
        assert!(result.content.contains(&blob.uri), "{}", result.content);
        assert!(result.content.contains("2x3 pixels"), "{}", result.content);
        assert!(result.content.len() < 300, "{}", result.content);
        let id = blob
            .uri
            .strip_prefix(blobs::URI_PREFIX)
            .expect("a blob URI");

        // `read` of the blob's URL returns the image as the read of the file did: the same
        // reference attached (media type and pixel size from the stored bytes), not text.
        let again = run_tool(&api, &session, "read", json!({"path": blob.uri}));
        assert!(!again.is_error, "{name} by URL: {}", again.content);
        assert_eq!(again.blobs, vec![blob.clone()], "{name} by URL");
        assert!(again.content.contains("2x3 pixels"), "{}", again.content);
        assert!(
            again.content.contains("the image is attached"),
            "{}",
            again.content
        );
        assert!(again.content.len() < 300, "{}", again.content);

        let served = api.get(&format!("/v1/blobs/{id}"));
        assert_eq!(served.status, 200, "{}", served.text());
        assert_eq!(served.header("content-type"), Some("image/png"));
        assert_eq!(served.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(served.header("content-disposition"), None, "shown inline");
        assert_eq!(served.body, png, "{name}: the bytes the runner read");
        // Another tenant (same user name) and a member of the tenant while the session is
        // private: 404.
        for (who, client) in [
            (
                "another tenant",
                stack().client("ana", &unique_name("other")),
            ),
            ("a non-member", stack().client("bob", &tenant)),
        ] {
            let refused = client.get(&format!("/v1/blobs/{id}"));
            assert_eq!(refused.status, 404, "{who}: {}", refused.text());
        }
    }

    let refused = run_tool(&api, &session, "read", json!({"path": "big.png"}));
    assert!(refused.is_error, "{}", refused.content);
    assert!(refused.blobs.is_empty(), "{refused:?}");
    assert!(
        refused.content.contains("big.png")
            && refused
                .content
                .contains("over the 5242880 byte (5 MiB) limit for images"),
        "{}",
        refused.content
    );
}

/// Whether `value` holds `wanted` somewhere (itself or a nested value).
fn holds(value: &Value, wanted: &Value) -> bool {
    value == wanted
        || match value {
            Value::Array(items) => items.iter().any(|v| holds(v, wanted)),
            Value::Object(map) => map.values().any(|v| holds(v, wanted)),
            _ => false,
        }
}

/// The objects of `value` (itself or nested) whose `type` is `kind`.
fn of_type<'a>(value: &'a Value, kind: &str, out: &mut Vec<&'a Value>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| of_type(v, kind, out)),
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) == Some(kind) {
                out.push(value);
            }
            map.values().for_each(|v| of_type(v, kind, out));
        }
        _ => {}
    }
}

#[test]
fn the_model_is_shown_the_image_in_each_dialect() {
    let _guard = stack().guard();
    let tenant = unique_name("shown");
    let api = stack().client("ana", &tenant);
    let dir = TempDir::new("wuhu-e2e-shown");
    let project = dir.mkdir("api");
    let png = wuhu_e2e::png::solid(2, 2, [10, 200, 10, 255]);
    std::fs::write(project.join("shot.png"), &png).unwrap();
    let _mac = Runner::start(
        RunnerConfig::new(stack(), "ana", &tenant, "mac")
            .workspaces_root(dir.mkdir("workspaces"))
            .env("api", &project),
    );
    let data = base64::engine::general_purpose::STANDARD.encode(&png);
    let data_url = format!("data:image/png;base64,{data}");
    // A text-only model: the tenant's model table says `"images": false`.
    let text_only = unique_name("text-only");
    let table =
        json!({"models": [{"id": text_only, "provider": "openai-compatible", "images": false}]});
    let written = stack()
        .admin_client("root", &tenant)
        .put_doc("config/models.json", table.to_string());
    assert!(written.status < 300, "{written}");
    for provider in ["anthropic", "openai", "openai-compatible", "text-only"] {
        let (provider, model) = match provider {
            "text-only" => ("openai-compatible", text_only.clone()),
            p => (p, unique_name(&format!("vision-{p}"))),
        };
        let text_only_model = model == text_only;
        let session = api
            .create_session(json!({"provider": provider, "model": model}))
            .id;
        stack().openai().script(
            &model,
            [
                Reply::tool_calls([("request_environment", json!({"spec": "api"}))]),
                Reply::tool_calls([("read", json!({"path": "shot.png"}))]),
                Reply::text("A green square."),
            ],
        );
        let mut follow = api.follow(&session, "sinceCursor=0&timeoutSeconds=60");
        api.enqueue(&session, "followUp", "what is in shot.png?");
        follow.collect_until(TURN, |e| e.event == "idle");
        let requests = stack().openai().requests_for(&model);
        assert_eq!(requests.len(), 3, "{provider}: three steps");
        let after_read = &requests[2].body;
        match provider {
            "anthropic" => {
                let image = json!({"type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": data,
                }});
                let mut results = Vec::new();
                of_type(after_read, "tool_result", &mut results);
                assert!(
                    results.iter().any(|r| holds(r, &image)),
                    "{provider}: the image is in a tool_result: {after_read}"
                );
            }
            "openai" => {
                let image = json!({"type": "input_image", "image_url": data_url});
                let input = after_read["input"].as_array().expect("input");
                let at = input
                    .iter()
                    .position(|item| item["role"] == "user" && holds(item, &image))
                    .unwrap_or_else(|| panic!("{provider}: no input_image: {after_read}"));
                assert_eq!(
                    input[at - 1]["type"],
                    "function_call_output",
                    "{provider}: the image follows the function output"
                );
            }
            _ if text_only_model => {
                assert!(
                    !requests[2].raw_body.contains(&data),
                    "a text-only model gets no image: {after_read}"
                );
                let messages = after_read["messages"].as_array().expect("messages");
                let tool = messages
                    .iter()
                    .find(|m| {
                        m["role"] == "tool"
                            && m["content"].as_str().unwrap_or("").contains("shot.png")
                    })
                    .unwrap_or_else(|| panic!("no read result: {after_read}"));
                assert!(
                    tool["content"].as_str().unwrap().contains(
                        "is not shown: the model table marks this model as not accepting images"
                    ),
                    "{tool}"
                );
            }
            _ => {
                let image = json!({"type": "image_url", "image_url": {"url": data_url}});
                let messages = after_read["messages"].as_array().expect("messages");
                let at = messages
                    .iter()
                    .position(|m| m["role"] == "user" && holds(m, &image))
                    .unwrap_or_else(|| panic!("{provider}: no image_url: {after_read}"));
                assert_eq!(
                    messages[at - 1]["role"],
                    "tool",
                    "{provider}: the image follows the tool message"
                );
            }
        }
        // The request before the read had no image.
        assert!(
            !requests[1].raw_body.contains(&data),
            "{provider}: no image before the read"
        );
    }
}

/// The image cache (`wuhu_core::images::cache`, one per isolate): the first request that shows
/// an image reads it from R2, every later step of the session (the same turn and the next) finds
/// it in the cache and sends the same bytes; the turn log lines count both. Deleting the session
/// drops its cached image.
#[test]
fn a_later_step_finds_the_image_in_the_isolate_cache() {
    let _guard = stack().guard();
    let tenant = unique_name("cached");
    let api = stack().client("ana", &tenant);
    let dir = TempDir::new("wuhu-e2e-cached");
    let project = dir.mkdir("api");
    let png = wuhu_e2e::png::solid(3, 2, [10, 10, 200, 255]);
    std::fs::write(project.join("shot.png"), &png).unwrap();
    std::fs::write(project.join("note.txt"), "a note\n").unwrap();
    let _mac = Runner::start(
        RunnerConfig::new(stack(), "ana", &tenant, "mac")
            .workspaces_root(dir.mkdir("workspaces"))
            .env("api", &project),
    );
    let data = base64::engine::general_purpose::STANDARD.encode(&png);
    let model = unique_name("vision-cached");
    let session = api
        .create_session(json!({"provider": "openai-compatible", "model": model}))
        .id;
    stack().openai().script(
        &model,
        [
            Reply::tool_calls([("request_environment", json!({"spec": "api"}))]),
            Reply::tool_calls([("read", json!({"path": "shot.png"}))]),
            Reply::tool_calls([("read", json!({"path": "note.txt"}))]),
            Reply::text("A blue rectangle and a note."),
            Reply::text("Still a blue rectangle."),
        ],
    );
    let turn_lines = |n: usize| {
        wuhu_e2e::wait_for(
            &format!("{n} turn lines of {session}"),
            Duration::from_secs(20),
            || {
                let lines: Vec<Value> = stack()
                    .log_events()
                    .into_iter()
                    .filter(|l| l["event"] == "turn" && l["session"] == session.as_str())
                    .collect();
                (lines.len() >= n).then_some(lines)
            },
        )
    };
    let mut follow = api.follow(&session, "sinceCursor=0&timeoutSeconds=60");
    api.enqueue(&session, "followUp", "what is in shot.png?");
    follow.collect_until(TURN, |e| e.event == "idle");
    let first = turn_lines(1);
    api.enqueue(&session, "followUp", "and now?");
    api.wait_idle(&session, TURN);
    let lines = turn_lines(2);

    let requests = stack().openai().requests_for(&model);
    assert_eq!(requests.len(), 5, "five steps");
    // Every step after the read shows the same bytes, whether read from R2 or the cache.
    for (i, request) in requests.iter().enumerate() {
        assert_eq!(
            request.raw_body.contains(&data),
            i >= 2,
            "step {i} shows the image from the read on"
        );
    }
    // The first turn read the image from R2 once (the step after the read) and found it in the
    // cache at the next step; the second turn read nothing.
    assert_eq!(first[0]["imagesRead"], 1, "{}", first[0]);
    assert_eq!(first[0]["imagesCached"], 1, "{}", first[0]);
    assert_eq!(lines[1]["imagesRead"], 0, "{}", lines[1]);
    assert_eq!(lines[1]["imagesCached"], 1, "{}", lines[1]);
    assert!(
        lines[1]["imageCacheBytes"].as_u64().unwrap() >= png.len() as u64,
        "{}",
        lines[1]
    );

    let deleted = api.send(api.request("DELETE", &format!("/v1/sessions/{session}")));
    assert!(deleted.status < 300, "{deleted}");
    let dropped =
        format!("deleted the objects of session {session} of {tenant}; 1 cached images dropped");
    wuhu_e2e::wait_for("the deletion's log line", Duration::from_secs(30), || {
        std::fs::read_to_string(stack().log_path())
            .unwrap_or_default()
            .contains(&dropped)
            .then_some(())
    });
}
