//! Sign-in and browser auth on the real Worker: Cloudflare Access tokens verified against a
//! local key-set server with RSA keys generated here; tokens minted, listed and revoked through
//! `/v1/tokens` (a revoked token refused everywhere at once: API, follow, cookie sessions made
//! from it, runner connect); the cookie session with its cross-site check; CORS for listed
//! origins only. One stack for the file.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rsa::pkcs1v15::SigningKey;
use rsa::signature::{SignatureEncoding, Signer};
use rsa::traits::PublicKeyParts;
use rsa::{RsaPrivateKey, RsaPublicKey};
use serde_json::{Value, json};
use sha2::Sha256;
use wuhu_core::wire::runner::{RunnerKind, ServerMessage};
use wuhu_e2e::runner::RawRunner;
use wuhu_e2e::util::{unique_name, unix_now};
use wuhu_e2e::{Api, FakeHttp, HttpReply, Request, Response, Stack, StackOptions};

const CERTS: &str = "/cdn-cgi/access/certs";
const AUD: &str = "wuhu-app-aud";
const TENANT: &str = "accessco";
const ALLOWED: &str = "https://app.example.com";
const WAIT: Duration = Duration::from_secs(20);

struct Env {
    stack: Stack,
    jwks: FakeHttp,
    keys: Vec<(String, RsaPrivateKey)>,
}

/// The stack, Access pointing at a local key-set server that serves the first key only.
fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        // Three 2048-bit keys, generated in parallel: k1 served from the start, k2 after a
        // rotation, k3 never (a forger's key).
        let handles: Vec<_> = (1..=3)
            .map(|i| {
                std::thread::spawn(move || {
                    let key = RsaPrivateKey::new(&mut rand::thread_rng(), 2048).expect("rsa key");
                    (format!("k{i}"), key)
                })
            })
            .collect();
        let keys: Vec<(String, RsaPrivateKey)> =
            handles.into_iter().map(|h| h.join().unwrap()).collect();
        let jwks = FakeHttp::start();
        jwks.route(CERTS, HttpReply::json(&key_set(&keys[..1])));
        let stack = Stack::start_with(StackOptions {
            fake_delay_ms: Some(0),
            vars: vec![
                ("WUHU_ACCESS_TEAM_DOMAIN".into(), jwks.base_url()),
                ("WUHU_ACCESS_AUD".into(), AUD.into()),
                ("WUHU_ACCESS_TENANT".into(), TENANT.into()),
                ("WUHU_ACCESS_ADMINS".into(), "boss@example.com".into()),
                (
                    "WUHU_ALLOWED_ORIGINS".into(),
                    format!("{ALLOWED},http://localhost:5173"),
                ),
            ],
            ..StackOptions::default()
        });
        Env { stack, jwks, keys }
    })
}

fn stack() -> &'static Stack {
    &env().stack
}

fn key_set(keys: &[(String, RsaPrivateKey)]) -> Value {
    let keys: Vec<Value> = keys
        .iter()
        .map(|(kid, key)| {
            let public = RsaPublicKey::from(key);
            json!({
                "kid": kid, "kty": "RSA", "alg": "RS256", "use": "sig",
                "n": URL_SAFE_NO_PAD.encode(public.n().to_bytes_be()),
                "e": URL_SAFE_NO_PAD.encode(public.e().to_bytes_be()),
            })
        })
        .collect();
    json!({"keys": keys, "public_cert": {"kid": "k1", "cert": "-----BEGIN CERTIFICATE-----"}})
}

fn key(kid: &str) -> &'static RsaPrivateKey {
    &env().keys.iter().find(|(k, _)| k == kid).unwrap().1
}

fn b64(value: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap())
}

/// An RS256 token with header `kid`, signed by `signer`.
fn rs256(kid: &str, signer: &RsaPrivateKey, claims: &Value) -> String {
    let input = format!(
        "{}.{}",
        b64(&json!({"alg": "RS256", "kid": kid, "typ": "JWT"})),
        b64(claims)
    );
    let signature = SigningKey::<Sha256>::new(signer.clone()).sign(input.as_bytes());
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature.to_bytes()))
}

/// Access application claims as Cloudflare issues them.
fn access_claims(email: &str) -> Value {
    json!({
        "aud": [AUD], "email": email, "exp": unix_now() + 600, "iat": unix_now(),
        "nbf": unix_now() - 5, "iss": env().jwks.base_url(), "type": "app",
        "identity_nonce": "n", "sub": "5b3b9c1e-0000-4000-8000-000000000000", "country": "DE",
    })
}

fn access_token(email: &str) -> String {
    rs256("k1", key("k1"), &access_claims(email))
}

fn with(mut claims: Value, patch: Value) -> Value {
    for (k, v) in patch.as_object().unwrap() {
        claims[k] = v.clone();
    }
    claims
}

fn send(request: Request) -> Response {
    request.send().expect("request")
}

fn me_with_access(token: &str) -> Response {
    send(Request::new("GET", stack().url("/v1/auth/me")).header("Cf-Access-Jwt-Assertion", token))
}

fn fetches() -> usize {
    env().jwks.requests_to(CERTS).len()
}

#[track_caller]
fn refused(response: &Response, status: u16, what: &str) -> String {
    assert_eq!(response.status, status, "{what}: {response}");
    let body = response.json();
    assert!(body["error"]["code"].is_string(), "{what}: {body}");
    body["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn access_tokens_are_verified_against_the_teams_keys() {
    let env = env();
    let _guard = env.stack.guard();
    // A good token: the user is its email, lowercased, in the configured tenant.
    let ok = me_with_access(&access_token("Ana@Example.com"));
    assert_eq!(ok.status, 200, "{ok}");
    let me = ok.json();
    assert_eq!(
        (&me["sub"], &me["tenant"], &me["role"], &me["via"]),
        (
            &json!("ana@example.com"),
            &json!(TENANT),
            &json!("member"),
            &json!("access")
        ),
        "{me}"
    );
    // The same token in the CF_Authorization cookie; an admin by WUHU_ACCESS_ADMINS.
    let cookie = send(Request::new("GET", stack().url("/v1/auth/me")).header(
        "Cookie",
        format!("CF_Authorization={}", access_token("boss@example.com")),
    ));
    assert_eq!(cookie.json()["role"], "admin", "{cookie}");
    let initial = fetches();
    assert_eq!(initial, 1, "the key set is fetched once and cached");

    // Every broken token is a JSON 401 and never fetches the keys again.
    let base = access_claims("ana@example.com");
    let now = unix_now();
    let broken: Vec<(&str, String)> = vec![
        (
            "wrong aud",
            rs256(
                "k1",
                key("k1"),
                &with(base.clone(), json!({"aud": ["other-app"]})),
            ),
        ),
        (
            "aud as a prefix",
            rs256(
                "k1",
                key("k1"),
                &with(base.clone(), json!({"aud": "wuhu-app"})),
            ),
        ),
        (
            "wrong iss",
            rs256(
                "k1",
                key("k1"),
                &with(
                    base.clone(),
                    json!({"iss": "https://evil.cloudflareaccess.com"}),
                ),
            ),
        ),
        (
            "expired",
            rs256(
                "k1",
                key("k1"),
                &with(base.clone(), json!({"exp": now - 1})),
            ),
        ),
        (
            "not yet valid",
            rs256(
                "k1",
                key("k1"),
                &with(base.clone(), json!({"nbf": now + 600})),
            ),
        ),
        (
            "no email (service token)",
            rs256(
                "k1",
                key("k1"),
                &with(base.clone(), json!({"email": null, "common_name": "svc"})),
            ),
        ),
        (
            "signed by another key under k1",
            rs256("k1", key("k3"), &base),
        ),
        ("HS256 with the kid", {
            let input = format!("{}.{}", b64(&json!({"alg":"HS256","kid":"k1"})), b64(&base));
            format!("{input}.{}", wuhu_e2e::jwt::signature(b"anything", &input))
        }),
        ("alg none", wuhu_e2e::jwt::alg_none(&base)),
        ("garbage", "not.a.jwt".to_string()),
    ];
    for (what, token) in &broken {
        let message = refused(&me_with_access(token), 401, what);
        eprintln!("browser_auth: {what}: {message}");
    }
    assert_eq!(
        fetches(),
        initial,
        "known-kid failures never refetch the keys"
    );

    // The team rotates to k2: the first token with the unknown kid refreshes the key set.
    env.jwks
        .route(CERTS, HttpReply::json(&key_set(&env.keys[..2])));
    let rotated = me_with_access(&rs256("k2", key("k2"), &access_claims("ana@example.com")));
    assert_eq!(rotated.status, 200, "{rotated}");
    assert_eq!(fetches(), initial + 1);
    // A made-up kid right after: refused, and no second refresh (rate-limited).
    for _ in 0..3 {
        refused(
            &me_with_access(&rs256("k3", key("k3"), &base)),
            401,
            "unknown kid",
        );
    }
    assert_eq!(
        fetches(),
        initial + 1,
        "unknown kids refresh at most once per period"
    );
    // Both keys keep working without fetching.
    assert_eq!(me_with_access(&access_token("ana@example.com")).status, 200);
    assert_eq!(fetches(), initial + 1);

    // Access is an ambient credential: a state-changing request from a foreign page is 403
    // and changes nothing; from this origin it works.
    let token = access_token("carl@example.com");
    let list = |token: &str| {
        send(
            Request::new("GET", stack().url("/v1/sessions"))
                .header("Cf-Access-Jwt-Assertion", token),
        )
        .json()["sessions"]
            .as_array()
            .unwrap()
            .len()
    };
    let before = list(&token);
    let foreign = send(
        Request::new("POST", stack().url("/v1/sessions"))
            .header("Cf-Access-Jwt-Assertion", &token)
            .header("Origin", "https://evil.example")
            .json(&json!({"title": "forged"})),
    );
    refused(&foreign, 403, "foreign origin with access");
    assert_eq!(list(&token), before, "the refused request created nothing");
    let same = send(
        Request::new("POST", stack().url("/v1/sessions"))
            .header("Cf-Access-Jwt-Assertion", &token)
            .header("Origin", stack().base_url())
            .json(&json!({"title": "mine"})),
    );
    assert_eq!(same.status, 201, "{same}");
    assert_eq!(same.json()["createdBy"], "carl@example.com");
}

/// The `wuhu_session` cookie value of a `POST /v1/auth/session` answer.
#[track_caller]
fn session_cookie(response: &Response) -> String {
    assert_eq!(response.status, 200, "{response}");
    let set = response
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no set-cookie: {response}"));
    for attribute in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attribute), "{set}");
    }
    let value = set
        .split(';')
        .next()
        .and_then(|p| p.strip_prefix("wuhu_session="))
        .unwrap_or_else(|| panic!("{set}"));
    format!("wuhu_session={value}")
}

fn sign_in(bearer: &str) -> String {
    session_cookie(&send(
        Request::new("POST", stack().url("/v1/auth/session"))
            .bearer(bearer)
            .header("Origin", stack().base_url()),
    ))
}

/// A request carrying the cookie, from this origin unless `origin` says otherwise.
fn with_cookie(method: &str, path: &str, cookie: &str, origin: Option<&str>) -> Request {
    let request = Request::new(method, stack().url(path)).header("Cookie", cookie);
    match origin {
        Some(o) => request.header("Origin", o),
        None => request,
    }
}

#[test]
fn the_cookie_session_follows_like_an_event_source_and_refuses_foreign_origins() {
    let _guard = stack().guard();
    let tenant = unique_name("cookie");
    let alice = stack().client("alice", &tenant);
    let cookie = sign_in(alice.token().unwrap());
    let here = stack().base_url();
    let me = send(with_cookie("GET", "/v1/auth/me", &cookie, None));
    assert_eq!(
        (me.json()["sub"].clone(), me.json()["via"].clone()),
        (json!("alice"), json!("cookie")),
        "{me}"
    );

    // From this origin: create a session and prompt it.
    let created = send(
        with_cookie("POST", "/v1/sessions", &cookie, Some(&here)).json(&json!({"title": "c"})),
    );
    assert_eq!(created.status, 201, "{created}");
    let id = created.json()["id"].as_str().unwrap().to_string();
    let enqueue = |origin: Option<&str>, site: Option<&str>, text: &str| {
        let mut request = with_cookie(
            "POST",
            &format!("/v1/sessions/{id}/enqueue?lane=followUp"),
            &cookie,
            origin,
        )
        .json(&json!({"content": text}));
        if let Some(site) = site {
            request = request.header("Sec-Fetch-Site", site);
        }
        send(request)
    };
    assert_eq!(
        enqueue(Some(&here), Some("same-origin"), "hello").status,
        200
    );
    alice.wait_idle(&id, WAIT);
    let entries = alice.transcript(&id).len();

    // A foreign page's POSTs carry the cookie (same-site, or an old browser) but are refused,
    // and nothing is enqueued.
    for (origin, site) in [
        (Some("https://evil.example"), None),
        (Some("http://127.0.0.1:1"), None),
        (Some("null"), None),
        (None, Some("cross-site")),
        (None, Some("same-site")),
        (Some(here.as_str()), Some("cross-site")),
    ] {
        let response = enqueue(origin, site, "forged");
        refused(&response, 403, &format!("{origin:?} {site:?}"));
    }
    let forged_session = send(
        with_cookie(
            "POST",
            "/v1/sessions",
            &cookie,
            Some("https://evil.example"),
        )
        .json(&json!({"title": "forged"})),
    );
    refused(&forged_session, 403, "foreign create");
    std::thread::sleep(Duration::from_millis(300)); // a wrongly accepted enqueue would show by now
    let after = alice.transcript(&id);
    assert_eq!(
        after.len(),
        entries,
        "a refused request changed the transcript"
    );
    assert_eq!(
        alice.list_sessions("").sessions.len(),
        1,
        "a refused request created a session"
    );

    // Follow with the cookie alone, like an EventSource: a plain GET that resumes from
    // Last-Event-ID.
    let open = |last: Option<u64>| {
        let mut request = with_cookie(
            "GET",
            &format!("/v1/sessions/{id}/follow?stopAfterIdle=1"),
            &cookie,
            None,
        )
        .header("Accept", "text/event-stream");
        if let Some(last) = last {
            request = request.header("Last-Event-ID", last.to_string());
        }
        wuhu_e2e::SseStream::open(&request, WAIT).expect("open follow")
    };
    let events = open(None).expect_stream().collect_to_end(WAIT);
    let ids: Vec<u64> = events.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids.len(), entries, "{ids:?}");
    let resumed = open(Some(ids[1])).expect_stream().collect_to_end(WAIT);
    let resumed_ids: Vec<u64> = resumed.iter().filter_map(|e| e.id).collect();
    assert_eq!(resumed_ids, ids[2..].to_vec());

    // Logout from a foreign page is refused; the session keeps working.
    refused(
        &send(with_cookie(
            "POST",
            "/v1/auth/logout",
            &cookie,
            Some("https://evil.example"),
        )),
        403,
        "foreign logout",
    );
    assert_eq!(
        send(with_cookie("GET", "/v1/auth/me", &cookie, None)).status,
        200
    );
    // Logout from here ends it (the cookie is cleared, and refused if replayed).
    let out = send(with_cookie("POST", "/v1/auth/logout", &cookie, Some(&here)));
    assert_eq!(out.status, 200, "{out}");
    assert!(
        out.header("set-cookie")
            .is_some_and(|c| c.contains("Max-Age=0")),
        "{out}"
    );
    for path in [
        "/v1/auth/me",
        "/v1/sessions",
        &format!("/v1/sessions/{id}/follow"),
    ] {
        refused(&send(with_cookie("GET", path, &cookie, None)), 401, path);
    }
    // A bearer token is not a cookie session: logout with it is a 400; a cookie that holds a
    // plain token is refused.
    refused(
        &alice.post("/v1/auth/logout", &json!({})),
        400,
        "bearer logout",
    );
    let forged = format!("wuhu_session={}", alice.token().unwrap());
    refused(
        &send(with_cookie("GET", "/v1/auth/me", &forged, None)),
        401,
        "token in the cookie",
    );
}

fn mint(api: &Api, body: Value) -> Response {
    api.post("/v1/tokens", &body)
}

fn list(api: &Api, query: &str) -> Response {
    api.get(&format!("/v1/tokens{query}"))
}

/// The tokens of a `GET /v1/tokens` answer (its cookie sessions left out: `token_lineage`
/// tests those).
fn listed_jtis(response: &Response) -> Vec<String> {
    assert_eq!(response.status, 200, "{response}");
    response.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"] != "session")
        .map(|t| {
            assert!(
                t.get("token").is_none(),
                "a listed token shows the token: {t}"
            );
            t["jti"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn minted_tokens_are_listed_by_their_owner_and_refused_everywhere_once_revoked() {
    let _guard = stack().guard();
    let tenant = unique_name("tokens");
    let alice = stack().client("alice", &tenant);
    let bob = stack().client("bob", &tenant);
    let admin = stack().admin_client("root", &tenant);

    let minted = mint(
        &alice,
        json!({"name": "laptop", "kind": "user", "ttlDays": 7}),
    );
    assert_eq!(minted.status, 201, "{minted}");
    let body = minted.json();
    let jti = body["jti"].as_str().unwrap().to_string();
    let exp = body["expiresAt"].as_i64().unwrap();
    assert!((exp - (unix_now() + 7 * 86_400)).abs() < 60, "{body}");
    assert_eq!(
        (body["sub"].clone(), body["kind"].clone()),
        (json!("alice"), json!("user"))
    );
    let laptop = stack().client_with_token(Some(body["token"].as_str().unwrap().to_string()));
    assert_eq!(listed_jtis(&list(&alice, "")), vec![jti.clone()]);

    // The minted token works: sessions, follow, its own cookie session.
    let session = laptop.create_fake_session();
    laptop.enqueue(&session.id, "followUp", "hi");
    laptop.wait_idle(&session.id, WAIT);
    let mut follow = laptop.follow(&session.id, "");
    let cookie = sign_in(laptop.token().unwrap());
    assert_eq!(
        send(with_cookie("GET", "/v1/auth/me", &cookie, None)).status,
        200
    );

    // Another member sees none of alice's tokens and cannot revoke them; an admin can see them.
    assert!(listed_jtis(&list(&bob, "")).is_empty());
    refused(&list(&bob, "?sub=alice"), 403, "bob lists alice's");
    refused(&list(&bob, "?all=1"), 403, "bob lists all");
    refused(
        &bob.send(bob.request("DELETE", &format!("/v1/tokens/{jti}"))),
        404,
        "bob revokes alice's",
    );
    assert_eq!(
        laptop.get("/v1/sessions").status,
        200,
        "bob's attempt revoked nothing"
    );
    assert_eq!(listed_jtis(&list(&admin, "?sub=alice")), vec![jti.clone()]);
    // An admin mints for bob; bob sees it, alice does not.
    let for_bob = mint(
        &admin,
        json!({"name": "bob-ci", "kind": "user", "sub": "bob"}),
    );
    assert_eq!(for_bob.status, 201, "{for_bob}");
    assert_eq!(for_bob.json()["createdBy"], "root");
    let bob_jti = for_bob.json()["jti"].as_str().unwrap().to_string();
    assert_eq!(listed_jtis(&list(&bob, "")), vec![bob_jti.clone()]);
    assert_eq!(listed_jtis(&list(&admin, "?all=1")).len(), 2);
    refused(
        &mint(&bob, json!({"name": "x", "kind": "user", "sub": "alice"})),
        403,
        "bob mints for alice",
    );

    // A runner token of alice's connects a runner.
    let runner_minted = mint(
        &alice,
        json!({"name": "mac", "kind": "runner", "ttlDays": 30}),
    );
    assert_eq!(runner_minted.status, 201, "{runner_minted}");
    let runner_jti = runner_minted.json()["jti"].as_str().unwrap().to_string();
    let runner_token = runner_minted.json()["token"].as_str().unwrap().to_string();
    let mut raw = RawRunner::connect(&stack().base_url(), &runner_token).expect("runner connects");
    raw.send_text(&RawRunner::hello("mac", RunnerKind::Local));
    assert!(matches!(
        raw.next_message(WAIT),
        ServerMessage::Welcome { .. }
    ));
    refused(
        &stack()
            .client_with_token(Some(runner_token.clone()))
            .get("/v1/sessions"),
        401,
        "runner token on the user api",
    );

    // Alice revokes her user token: refused everywhere at once, and the cookie session made
    // from it ends too.
    let revoked = alice.send(alice.request("DELETE", &format!("/v1/tokens/{jti}")));
    assert_eq!(revoked.status, 200, "{revoked}");
    let at = Instant::now();
    refused(&laptop.get("/v1/sessions"), 401, "list after revoke");
    refused(
        &laptop.get(&format!("/v1/sessions/{}", session.id)),
        401,
        "read after revoke",
    );
    refused(
        &laptop.enqueue_raw(&session.id, "followUp", "again"),
        401,
        "enqueue after revoke",
    );
    refused(
        &laptop
            .follow_open(&session.id, "", None)
            .unwrap()
            .expect_rejected(),
        401,
        "follow after revoke",
    );
    refused(&laptop.get("/v1/tokens"), 401, "tokens after revoke");
    refused(
        &send(with_cookie("GET", "/v1/auth/me", &cookie, None)),
        401,
        "cookie made from it",
    );
    refused(
        &send(
            Request::new("POST", stack().url("/v1/auth/session")).bearer(laptop.token().unwrap()),
        ),
        401,
        "a new cookie from it",
    );
    eprintln!(
        "browser_auth: five refusals within {:?} of the revoke",
        at.elapsed()
    );
    assert!(!listed_jtis(&list(&alice, "")).contains(&jti));
    refused(
        &alice.send(alice.request("DELETE", &format!("/v1/tokens/{jti}"))),
        404,
        "revoke twice",
    );
    // Bob's token (minted by the admin) is untouched; the admin revokes it.
    let bob_ci =
        stack().client_with_token(Some(for_bob.json()["token"].as_str().unwrap().to_string()));
    assert_eq!(bob_ci.get("/v1/sessions").status, 200);
    assert_eq!(
        admin
            .send(admin.request("DELETE", &format!("/v1/tokens/{bob_jti}")))
            .status,
        200
    );
    refused(
        &bob_ci.get("/v1/sessions"),
        401,
        "bob's token revoked by the admin",
    );
    // The follow stream opened before the revoke ends too, with an `error` (within
    // CREDENTIAL_RECHECK_MS; `open_streams_and_runners_end_when_their_credential_is_revoked`
    // times it).
    let events = follow.collect_to_end(WAIT);
    let last = events.last().expect("the stream sent something");
    assert!(
        last.event == "error" && last.raw_data.contains("revoked"),
        "{}",
        wuhu_e2e::sse::summarize(&events)
    );

    // Revoking the runner token closes the runner's open connection, and it cannot connect
    // again. (A heartbeat first, so a slow run cannot have it dropped for silence instead.)
    raw.heartbeat();
    let revoked_runner = alice.send(alice.request("DELETE", &format!("/v1/tokens/{runner_jti}")));
    assert_eq!(revoked_runner.status, 200, "{revoked_runner}");
    assert_eq!(
        raw.wait_closed(WAIT),
        Ok(Some((1008, "token revoked".to_string()))),
        "the runner's socket is closed at once"
    );
    match RawRunner::connect(&stack().base_url(), &runner_token) {
        Ok(_) => panic!("a revoked runner token connected"),
        Err(e) => assert!(e.to_string().contains("401"), "{e}"),
    }
}

/// Revocation cuts what is already open, within a bound: a follow stream opened with a minted
/// token ends (an `error` event) within `CREDENTIAL_RECHECK_MS` of `DELETE /v1/tokens/:jti`, one
/// opened with a cookie session ends within it of logout, and a real runner connected with a
/// minted runner token is disconnected at once and, refused on reconnect (401), exits. Streams
/// and runners on other credentials are untouched.
#[test]
fn open_streams_and_runners_end_when_their_credential_is_revoked() {
    use wuhu_core::follow::CREDENTIAL_RECHECK_MS;
    use wuhu_e2e::runner::{Runner, RunnerConfig};
    let _guard = stack().guard();
    let tenant = unique_name("cut");
    let alice = stack().client("alice", &tenant);
    // The bound, with room for one registry round trip and a loaded machine.
    let bound = Duration::from_millis(CREDENTIAL_RECHECK_MS) + Duration::from_secs(10);

    let minted = mint(&alice, json!({"name": "stream", "kind": "user"}));
    assert_eq!(minted.status, 201, "{minted}");
    let jti = minted.json()["jti"].as_str().unwrap().to_string();
    let streamer = stack().client_with_token(Some(minted.json()["token"].as_str().unwrap().into()));
    let session = alice.create_fake_session();
    // Three open streams: the minted token's, a cookie session's, and the operator token's
    // (no `jti`: not revocable, the control).
    let mut by_token = streamer.follow(&session.id, "");
    let cookie = sign_in(alice.token().unwrap());
    let open_with_cookie = || {
        let request = with_cookie(
            "GET",
            &format!("/v1/sessions/{}/follow", session.id),
            &cookie,
            None,
        )
        .header("Accept", "text/event-stream");
        wuhu_e2e::SseStream::open(&request, WAIT)
            .expect("open follow")
            .expect_stream()
    };
    let mut by_cookie = open_with_cookie();
    let mut by_operator = alice.follow(&session.id, "");
    // All three see the session's entries live.
    alice.enqueue(&session.id, "followUp", "before");
    for stream in [&mut by_token, &mut by_cookie, &mut by_operator] {
        stream.collect_until(WAIT, |e| e.raw_data.contains("echo: before"));
    }

    // Revoke the minted token: its stream ends with an error; the others stay open.
    let revoked_at = Instant::now();
    let revoked = alice.send(alice.request("DELETE", &format!("/v1/tokens/{jti}")));
    assert_eq!(revoked.status, 200, "{revoked}");
    let events = by_token.collect_to_end(bound);
    let took = revoked_at.elapsed();
    let last = events.last().expect("an event before the end");
    assert!(
        last.event == "error" && last.raw_data.contains("revoked"),
        "{}",
        wuhu_e2e::sse::summarize(&events)
    );
    assert!(took <= bound, "the stream ended {took:?} after the revoke");
    eprintln!("browser_auth: a follow stream ended {took:?} after its token was revoked");
    alice.enqueue(&session.id, "followUp", "after the revoke");
    for stream in [&mut by_cookie, &mut by_operator] {
        let seen = stream.collect_until(WAIT, |e| e.raw_data.contains("echo: after the revoke"));
        assert!(
            seen.iter()
                .any(|e| e.raw_data.contains("echo: after the revoke")),
            "another credential's stream was cut: {}",
            wuhu_e2e::sse::summarize(&seen)
        );
    }

    // Log the cookie session out: its stream ends the same way; the operator's stays.
    let logged_out_at = Instant::now();
    let out = send(with_cookie(
        "POST",
        "/v1/auth/logout",
        &cookie,
        Some(&stack().base_url()),
    ));
    assert_eq!(out.status, 200, "{out}");
    let events = by_cookie.collect_to_end(bound);
    let took = logged_out_at.elapsed();
    assert!(
        events
            .last()
            .is_some_and(|e| e.event == "error" && e.raw_data.contains("revoked")),
        "{}",
        wuhu_e2e::sse::summarize(&events)
    );
    assert!(took <= bound, "the stream ended {took:?} after the logout");
    eprintln!("browser_auth: a cookie follow stream ended {took:?} after logout");
    refused(
        &open_with_cookie_raw(&session.id, &cookie),
        401,
        "following again with the logged-out cookie",
    );
    alice.enqueue(&session.id, "followUp", "after the logout");
    let seen = by_operator.collect_until(WAIT, |e| e.raw_data.contains("echo: after the logout"));
    assert!(
        seen.iter()
            .any(|e| e.raw_data.contains("echo: after the logout")),
        "the operator token's stream was cut: {}",
        wuhu_e2e::sse::summarize(&seen)
    );

    // A real runner on a minted runner token, next to one on an operator runner token.
    let runner_minted = mint(&alice, json!({"name": "box", "kind": "runner"}));
    assert_eq!(runner_minted.status, 201, "{runner_minted}");
    let runner_jti = runner_minted.json()["jti"].as_str().unwrap().to_string();
    let runner_token = runner_minted.json()["token"].as_str().unwrap().to_string();
    let mut minted_runner = Runner::start(
        RunnerConfig::new(stack(), "alice", &tenant, "box").token(runner_token.clone()),
    );
    let mut other_runner = Runner::start(RunnerConfig::new(stack(), "alice", &tenant, "other"));
    let connected = |name: &str| {
        alice.get("/v1/runners").json()["runners"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == name && r["connected"] == true)
    };
    assert!(connected("box") && connected("other"));
    let revoked_at = Instant::now();
    let revoked = alice.send(alice.request("DELETE", &format!("/v1/tokens/{runner_jti}")));
    assert_eq!(revoked.status, 200, "{revoked}");
    // Disconnected by the hub, refused on reconnect (401), the runner exits with 2.
    let status = minted_runner.wait_exit(WAIT).unwrap_or_else(|| {
        panic!(
            "the runner on a revoked token is still running:\n{}",
            minted_runner.log_tail(30)
        )
    });
    eprintln!(
        "browser_auth: the runner on a revoked token exited ({status}) {:?} after the revoke",
        revoked_at.elapsed()
    );
    assert_eq!(status.code(), Some(2), "{}", minted_runner.log_tail(30));
    assert!(
        minted_runner.log().contains("401"),
        "{}",
        minted_runner.log_tail(30)
    );
    assert!(!connected("box"), "the hub still lists the revoked runner");
    assert!(connected("other"), "the other runner was disconnected");
    match RawRunner::connect(&stack().base_url(), &runner_token) {
        Ok(_) => panic!("a revoked runner token connected"),
        Err(e) => assert!(e.to_string().contains("401"), "{e}"),
    }
    other_runner.stop(Duration::from_secs(5));
}

/// `GET /v1/sessions/:id/follow` with `cookie`, expecting a refusal.
fn open_with_cookie_raw(id: &str, cookie: &str) -> Response {
    let request = with_cookie("GET", &format!("/v1/sessions/{id}/follow"), cookie, None)
        .header("Accept", "text/event-stream");
    wuhu_e2e::SseStream::open(&request, WAIT)
        .expect("open follow")
        .expect_rejected()
}

#[test]
fn token_requests_are_checked_and_bounded() {
    let _guard = stack().guard();
    let tenant = unique_name("bounds");
    let carol = stack().client("carol", &tenant);
    let bad: Vec<(Value, u16)> = vec![
        (json!({}), 400),
        (json!({"name": "x"}), 400),
        (json!({"name": "x", "kind": "session"}), 400),
        (json!({"name": "x", "kind": "user", "ttlDays": 91}), 400),
        (json!({"name": "x", "kind": "user", "ttlDays": 0}), 400),
        (json!({"name": "x", "kind": "runner", "ttlDays": 401}), 400),
        (json!({"name": "x", "kind": "user", "extra": 1}), 400),
        (json!({"name": "", "kind": "user"}), 400),
        (
            json!({"name": "x", "kind": "runner", "runnerKind": "cloud"}),
            403,
        ),
        (json!({"name": "x", "kind": "user", "role": "admin"}), 403),
    ];
    for (body, status) in bad {
        refused(&mint(&carol, body.clone()), status, &body.to_string());
    }
    refused(
        &carol.send_raw("POST", "/v1/tokens", "{not json"),
        400,
        "malformed",
    );
    refused(&carol.send(carol.request("PUT", "/v1/tokens")), 405, "PUT");
    refused(
        &stack().client_with_token(None).get("/v1/tokens"),
        401,
        "no credential",
    );
    refused(
        &stack()
            .client_with_token(None)
            .post("/v1/auth/session", &json!({})),
        401,
        "no credential",
    );
    // At most 50 tokens per user: the 51st is 429; revoking one makes room.
    let mut first = String::new();
    for i in 0..50 {
        let minted = mint(
            &carol,
            json!({"name": format!("t{i}"), "kind": if i % 2 == 0 { "user" } else { "runner" }}),
        );
        assert_eq!(minted.status, 201, "token {i}: {minted}");
        if i == 0 {
            first = minted.json()["jti"].as_str().unwrap().to_string();
        }
    }
    let over = mint(&carol, json!({"name": "one too many", "kind": "user"}));
    assert!(!refused(&over, 429, "51st").is_empty());
    assert_eq!(over.json()["error"]["code"], "too_many_tokens");
    assert_eq!(
        carol
            .send(carol.request("DELETE", &format!("/v1/tokens/{first}")))
            .status,
        200
    );
    assert_eq!(
        mint(&carol, json!({"name": "fits again", "kind": "user"})).status,
        201
    );
    // Cookie sessions do not count against tokens.
    sign_in(carol.token().unwrap());
}

#[test]
fn cors_answers_listed_origins_only() {
    let _guard = stack().guard();
    let tenant = unique_name("cors");
    let dana = stack().client("dana", &tenant);
    let preflight = |origin: &str| {
        send(
            Request::new("OPTIONS", stack().url("/v1/sessions"))
                .header("Origin", origin)
                .header("Access-Control-Request-Method", "POST")
                .header(
                    "Access-Control-Request-Headers",
                    "authorization, content-type",
                ),
        )
    };
    let ok = preflight(ALLOWED);
    assert_eq!(ok.status, 204, "{ok}");
    assert_eq!(ok.header("access-control-allow-origin"), Some(ALLOWED));
    assert!(
        ok.header("access-control-allow-headers")
            .unwrap()
            .contains("authorization")
    );
    assert!(
        ok.header("access-control-allow-methods")
            .unwrap()
            .contains("POST")
    );
    assert!(ok.header("access-control-allow-credentials").is_none());
    let no = preflight("https://evil.example");
    refused(&no, 403, "unlisted preflight");
    assert!(no.header("access-control-allow-origin").is_none(), "{no}");

    // Bearer requests from a listed origin carry the grant; errors too; unlisted get nothing.
    let get =
        |origin: &str, api: &Api| send(api.request("GET", "/v1/sessions").header("Origin", origin));
    let listed = get(ALLOWED, &dana);
    assert_eq!(listed.status, 200);
    assert_eq!(listed.header("access-control-allow-origin"), Some(ALLOWED));
    assert_eq!(listed.header("vary"), Some("Origin"));
    let denied = get(ALLOWED, &stack().client_with_token(None));
    assert_eq!(denied.status, 401);
    assert_eq!(denied.header("access-control-allow-origin"), Some(ALLOWED));
    let unlisted = get("https://evil.example", &dana);
    assert!(
        unlisted.header("access-control-allow-origin").is_none(),
        "{unlisted}"
    );
    // A POST with a bearer token from a listed origin works (bearer tokens are not ambient).
    let created = send(
        dana.request("POST", "/v1/sessions")
            .header("Origin", ALLOWED)
            .json(&json!({})),
    );
    assert_eq!(created.status, 201, "{created}");
    let id = created.json()["id"].as_str().unwrap().to_string();
    // The follow stream is granted too.
    let stream = wuhu_e2e::SseStream::open(
        &dana
            .request("GET", &format!("/v1/sessions/{id}/follow?stopAfterIdle=1"))
            .header("Origin", "http://localhost:5173"),
        WAIT,
    )
    .unwrap()
    .expect_stream();
    let grant = stream
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("access-control-allow-origin"))
        .map(|(_, v)| v.as_str());
    assert_eq!(grant, Some("http://localhost:5173"));
}

/// Not a test of behaviour: prints what the registry check costs per request (run with
/// `--ignored --nocapture`).
#[test]
#[ignore]
fn registry_check_cost() {
    let tenant = unique_name("cost");
    let operator = stack().client("erin", &tenant);
    let minted = mint(&operator, json!({"name": "bench", "kind": "user"}));
    let registered =
        stack().client_with_token(Some(minted.json()["token"].as_str().unwrap().to_string()));
    let time = |api: &Api| {
        let mut samples: Vec<Duration> = (0..200)
            .map(|_| {
                let at = Instant::now();
                assert_eq!(api.get("/v1/auth/me").status, 200);
                at.elapsed()
            })
            .collect();
        samples.sort();
        (samples[100], samples[190])
    };
    for round in 0..3 {
        let (op50, op95) = time(&operator);
        let (re50, re95) = time(&registered);
        eprintln!(
            "round {round}: operator token p50 {op50:?} p95 {op95:?}; registered token p50 {re50:?} p95 {re95:?}"
        );
    }
}
