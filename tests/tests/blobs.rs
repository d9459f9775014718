//! Blobs through the real Worker and a real `wuhu-runner`: a 10 MiB `bash` output goes from the
//! runner straight to storage with the upload URL issued for the call, the transcript keeps a
//! reference, `read` pages it by lines, `GET /v1/blobs/:id` serves it (whole or a range) to
//! whoever may read the session and 404s for anyone else; upload URLs that are expired,
//! tampered with or too small for the body are refused.
//!
//! One `wrangler dev` for the file; every test uses its own tenant.

use std::time::Duration;

use serde_json::{Value, json};
use wuhu_core::blobs::{self, UploadGrant};
use wuhu_core::wire::ToolResult;
use wuhu_e2e::http::Request;
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir, ToolTurn};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack};

const TURN: Duration = Duration::from_secs(120);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_fake_stack()
}

#[track_caller]
fn run_tool(api: &Api, session: &str, name: &str, arguments: Value) -> ToolResult {
    let turn = ToolTurn::start(api, session, &[(name, arguments)]);
    turn.finish(api, TURN).0.pop().expect("one result")
}

/// `line-0000000001\n` … `line-0000655360\n`: 16 bytes a line, 10 MiB in all.
const LINES: u64 = 655_360;
const LINE_BYTES: u64 = 16;

fn line(n: u64) -> String {
    format!("line-{n:010}\n")
}

#[test]
fn a_long_output_is_a_blob_paged_by_read_and_served_to_readers_only() {
    let tenant = unique_name("blobs");
    let api = stack().client("ana", &tenant);
    let dir = TempDir::new("wuhu-e2e-blobs");
    let project = dir.mkdir("api");
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

    let result = run_tool(
        &api,
        &session,
        "bash",
        json!({"command": format!("seq -f 'line-%010g' 1 {LINES}")}),
    );
    assert!(!result.is_error, "{}", result.content);
    assert_eq!(result.blobs.len(), 1, "one blob: {result:?}");
    let blob = &result.blobs[0];
    assert_eq!(blob.size, LINES * LINE_BYTES);
    assert_eq!(blob.media_type, "text/plain");
    assert!(
        blob.preview
            .as_deref()
            .unwrap_or_default()
            .starts_with(&line(1)),
        "{:?}",
        blob.preview
    );
    // The model sees the tail and where the rest is, not the runner's log path.
    assert!(result.content.contains(&blob.uri), "{}", result.content);
    assert!(result.content.contains(&line(LINES)), "the tail is kept");
    assert!(result.content.len() < 64 * 1024, "{}", result.content.len());
    let id = blob
        .uri
        .strip_prefix(blobs::URI_PREFIX)
        .expect("a wuhu://blob/ URI");

    // `read` pages it by lines, like a file.
    let page = run_tool(
        &api,
        &session,
        "read",
        json!({"path": blob.uri, "offset": 300_000, "limit": 3}),
    );
    assert!(!page.is_error, "{}", page.content);
    let expected = format!(
        "{}{}{}[{} more lines: call read with offset=300003]\n",
        line(300_000),
        line(300_001),
        line(300_002),
        LINES - 300_002
    );
    assert_eq!(page.content, expected);

    // Served whole, with its type and length, to the owner.
    let whole = api.get(&format!("/v1/blobs/{id}"));
    assert_eq!(whole.status, 200, "{}", whole.text());
    assert_eq!(whole.body.len() as u64, LINES * LINE_BYTES);
    assert_eq!(
        whole.header("content-length"),
        Some((LINES * LINE_BYTES).to_string().as_str())
    );
    assert_eq!(
        whole.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(whole.header("x-content-type-options"), Some("nosniff"));
    assert!(whole.body.starts_with(line(1).as_bytes()));
    assert!(whole.body.ends_with(line(LINES).as_bytes()));
    // A range.
    let range = api.send(
        api.request("GET", &format!("/v1/blobs/{id}"))
            .header("range", "bytes=16-31"),
    );
    assert_eq!(range.status, 206, "{}", range.text());
    assert_eq!(range.text(), line(2));
    assert_eq!(
        range.header("content-range"),
        Some(format!("bytes 16-31/{}", LINES * LINE_BYTES).as_str())
    );
    let past = api.send(
        api.request("GET", &format!("/v1/blobs/{id}"))
            .header("range", format!("bytes={}-", LINES * LINE_BYTES)),
    );
    assert_eq!(past.status, 416, "{}", past.text());

    // Nobody else: another tenant (same user name), a member of the tenant while the session
    // is private; a malformed id.
    let stranger = stack().client("ana", &unique_name("other"));
    let bob = stack().client("bob", &tenant);
    for (who, client) in [("another tenant", &stranger), ("a non-member", &bob)] {
        let refused = client.get(&format!("/v1/blobs/{id}"));
        assert_eq!(refused.status, 404, "{who}: {}", refused.text());
        assert_eq!(refused.json()["error"]["code"], "not_found", "{who}");
    }
    assert_eq!(api.get("/v1/blobs/not-a-blob").status, 404);
    // Shared with the tenant, the member may read it too.
    let shared = api.patch(
        &format!("/v1/sessions/{session}"),
        &json!({"access": "tenant"}),
    );
    assert_eq!(shared.status, 200, "{}", shared.text());
    let read_by_bob = bob.send(
        bob.request("GET", &format!("/v1/blobs/{id}"))
            .header("range", "bytes=0-15"),
    );
    assert_eq!(read_by_bob.status, 206, "{}", read_by_bob.text());
    assert_eq!(read_by_bob.text(), line(1));
    // And still not another tenant.
    assert_eq!(stranger.get(&format!("/v1/blobs/{id}")).status, 404);
}

#[test]
fn upload_urls_are_refused_when_expired_tampered_or_too_small() {
    let tenant = unique_name("uploads");
    let api = stack().client("ana", &tenant);
    let session = api.create_fake_session().id;
    let key = blobs::upload_key(stack().secret().as_bytes());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let put = |url: &str, body: &str| {
        Request::new("PUT", format!("{}{url}", stack().base_url()))
            .header("content-type", "text/plain")
            .body(body.as_bytes().to_vec())
            .send()
            .expect("PUT")
    };

    // A valid URL: stored, and served to the session's reader.
    let id = blobs::new_id(&session, [7; 16]);
    let grant = UploadGrant::issue(&tenant, &id, now_ms);
    let stored = put(&grant.relative_url(&key), "hello blob\n");
    assert_eq!(stored.status, 200, "{}", stored.text());
    let served = api.get(&format!("/v1/blobs/{id}"));
    assert_eq!(served.status, 200, "{}", served.text());
    assert_eq!(served.text(), "hello blob\n");

    // Expired a second ago.
    let expired = UploadGrant {
        expires_at_ms: now_ms - 1_000,
        ..UploadGrant::issue(&tenant, &blobs::new_id(&session, [8; 16]), now_ms)
    };
    let refused = put(&expired.relative_url(&key), "late");
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "forbidden");
    assert!(refused.text().contains("expired"), "{}", refused.text());

    // Tampered: another tenant, or a larger limit, under the same signature.
    let url = grant.relative_url(&key);
    for (from, to) in [
        (format!("tenant={tenant}"), "tenant=evil".to_string()),
        (
            format!("max={}", blobs::MAX_BLOB_BYTES),
            "max=99999999999".to_string(),
        ),
    ] {
        let tampered = url.replace(&from, &to);
        assert_ne!(tampered, url);
        let refused = put(&tampered, "overwrite");
        assert_eq!(refused.status, 403, "{}: {}", to, refused.text());
    }
    // Signed with another key.
    let forged = put(&grant.relative_url(b"not the server's key"), "forged");
    assert_eq!(forged.status, 403, "{}", forged.text());
    // The blob is unchanged.
    assert_eq!(api.get(&format!("/v1/blobs/{id}")).text(), "hello blob\n");

    // A body over the URL's limit.
    let small = UploadGrant {
        max_bytes: 4,
        ..UploadGrant::issue(&tenant, &blobs::new_id(&session, [9; 16]), now_ms)
    };
    let too_large = put(&small.relative_url(&key), "12345");
    assert_eq!(too_large.status, 413, "{}", too_large.text());
    // Other methods on the upload route.
    let get = Request::new("GET", format!("{}{url}", stack().base_url()))
        .send()
        .expect("GET");
    assert_eq!(get.status, 405, "{}", get.text());
}
