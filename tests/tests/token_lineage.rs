//! Token lineage on the real Worker (issue 29, decision 0032): a token minted from a minted
//! token dies with it and never outlives it; a cookie session never mints (the browser
//! presents its token again); an Access sign-in mints only right after it happened, and what
//! it minted follows the Access settings at every use (demoted with its email's admin
//! status, ended with revoke-all of the email); `POST /v1/tokens/revoke-all` ends every
//! credential of a user, open runner sockets, follow streams and session sockets included, for
//! nobody else and in no other tenant; the Access team domain must be `https://` (loopback
//! `http` for tests). One stack for the file, Access pointing at a local key-set server; the
//! test that restarts it with other settings takes it alone.

use std::sync::{OnceLock, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::follow::CREDENTIAL_RECHECK_MS;
use wuhu_core::socket::CLOSE_REVOKED;
use wuhu_core::tokens::lineage::ACCESS_REAUTH_SECS;
use wuhu_core::wire::runner::{RunnerKind, ServerMessage};
use wuhu_e2e::access::AccessTeam;
use wuhu_e2e::runner::RawRunner;
use wuhu_e2e::socket::{SessionSocket, SocketAuth};
use wuhu_e2e::util::{unique_name, unix_now};
use wuhu_e2e::{Api, Request, Response, Stack, StackOptions};

const AUD: &str = "lineage-aud";
/// Every Access user's tenant.
const TENANT: &str = "lineage-access";
const BOSS: &str = "boss@example.com";
const WAIT: Duration = Duration::from_secs(20);

struct Env {
    stack: RwLock<Stack>,
    team: AccessTeam,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let team = AccessTeam::start(AUD);
        let stack = Stack::start_with(StackOptions {
            fake_delay_ms: Some(0),
            vars: access_vars(&team.domain(), BOSS),
            ..StackOptions::default()
        });
        Env {
            stack: RwLock::new(stack),
            team,
        }
    })
}

fn access_vars(team_domain: &str, admins: &str) -> Vec<(String, String)> {
    vec![
        ("WUHU_ACCESS_TEAM_DOMAIN".into(), team_domain.into()),
        ("WUHU_ACCESS_AUD".into(), AUD.into()),
        ("WUHU_ACCESS_TENANT".into(), TENANT.into()),
        ("WUHU_ACCESS_ADMINS".into(), admins.into()),
    ]
}

/// The shared stack, for a test that leaves its settings alone (the settings test restarts it
/// while holding it alone).
fn stack() -> RwLockReadGuard<'static, Stack> {
    env().stack.read().unwrap_or_else(|e| e.into_inner())
}

fn team() -> &'static AccessTeam {
    &env().team
}

fn send(request: Request) -> Response {
    request.send().expect("request")
}

#[track_caller]
fn refused(response: &Response, status: u16, what: &str) -> String {
    let error = std::panic::catch_unwind(|| response.expect_error(status))
        .unwrap_or_else(|_| panic!("{what}: {response}"));
    error.message
}

/// A `201` of `POST /v1/tokens`: its body, and a client with the token (on `stack`).
#[track_caller]
fn minted(stack: &Stack, response: Response) -> (Value, Api) {
    assert_eq!(response.status, 201, "{response}");
    let body = response.json();
    let api = Api::new(
        stack.base_url(),
        Some(body["token"].as_str().unwrap().to_string()),
    );
    (body, api)
}

fn mint(api: &Api, body: Value) -> Response {
    api.post("/v1/tokens", &body)
}

fn jti(body: &Value) -> String {
    body["jti"].as_str().unwrap().to_string()
}

/// `request` (a `POST /v1/auth/session` with a credential): the `wuhu_session=…` cookie.
#[track_caller]
fn sign_in(request: Request) -> String {
    let response = send(request);
    assert_eq!(response.status, 200, "{response}");
    response
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .and_then(|(_, v)| v.split(';').next().map(str::to_string))
        .unwrap_or_else(|| panic!("no cookie: {response}"))
}

/// A request with the cookie, from this origin.
fn with_cookie(stack: &Stack, method: &str, path: &str, cookie: &str) -> Request {
    Request::new(method, stack.url(path))
        .header("Cookie", cookie)
        .header("Origin", stack.base_url())
}

/// A request with an Access token, from this origin.
fn with_access(stack: &Stack, method: &str, path: &str, token: &str) -> Request {
    Request::new(method, stack.url(path))
        .header("Cf-Access-Jwt-Assertion", token)
        .header("Origin", stack.base_url())
}

/// The listed rows of `GET /v1/tokens…` as `(jti, kind, current)`.
#[track_caller]
fn listed(response: &Response) -> Vec<(String, String, bool)> {
    assert_eq!(response.status, 200, "{response}");
    response.json()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert!(
                t.get("token").is_none(),
                "a listed row shows its token: {t}"
            );
            (
                t["jti"].as_str().unwrap().to_string(),
                t["kind"].as_str().unwrap().to_string(),
                t["current"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// A token minted from a minted token is its child: it never outlives it (a longer lifetime is
/// capped at the parent's expiry), and revoking any ancestor ends the whole tree below it,
/// cookie sessions made from its members included. A cookie session never mints: the browser
/// presents its token again instead.
#[test]
fn minted_tokens_die_with_their_parent_and_never_outlive_it() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("lineage");
    let alice = stack.client("alice", &tenant);
    let (parent, parent_api) = minted(
        &stack,
        mint(
            &alice,
            json!({"name": "parent", "kind": "user", "ttlDays": 2}),
        ),
    );
    assert_eq!(parent["root"], json!({"kind": "operator"}), "{parent}");
    assert!(parent.get("parent").is_none(), "{parent}");
    let parent_exp = parent["expiresAt"].as_i64().unwrap();
    // A child asking for 30 days gets its parent's expiry; a runner token too.
    let (child, child_api) = minted(
        &stack,
        mint(
            &parent_api,
            json!({"name": "child", "kind": "user", "ttlDays": 30}),
        ),
    );
    assert_eq!(child["parent"], parent["jti"], "{child}");
    assert_eq!(child["root"], json!({"kind": "operator"}));
    assert_eq!(child["expiresAt"].as_i64(), Some(parent_exp), "{child}");
    let (grandchild, grandchild_api) = minted(
        &stack,
        mint(
            &child_api,
            json!({"name": "grandchild", "kind": "user", "ttlDays": 1}),
        ),
    );
    assert!(
        grandchild["expiresAt"].as_i64().unwrap() <= parent_exp,
        "{grandchild}"
    );
    let (runner, _) = minted(
        &stack,
        mint(
            &grandchild_api,
            json!({"name": "box", "kind": "runner", "ttlDays": 400}),
        ),
    );
    assert_eq!(
        runner["expiresAt"], grandchild["expiresAt"],
        "a runner token asking for 400 days lives as long as the token it came from: {runner}"
    );
    let runner_token = runner["token"].as_str().unwrap().to_string();
    // The JWT says what the list says: its `exp` is the capped one.
    let claims = wuhu_e2e::jwt::decode_claims(&runner_token);
    assert_eq!(claims["exp"], runner["expiresAt"], "{claims}");

    // A cookie session made from the child: listed with the tokens, marked as the caller's.
    let cookie = sign_in(
        Request::new("POST", stack.url("/v1/auth/session")).bearer(child_api.token().unwrap()),
    );
    let rows = listed(&send(with_cookie(&stack, "GET", "/v1/tokens", &cookie)));
    let sessions: Vec<_> = rows.iter().filter(|r| r.1 == "session").collect();
    assert_eq!(sessions.len(), 1, "{rows:?}");
    assert!(
        sessions[0].2,
        "the caller's own session is `current`: {rows:?}"
    );
    assert_eq!(
        rows.iter().filter(|r| r.2).count(),
        1,
        "only one row is current: {rows:?}"
    );
    assert_eq!(rows.len(), 5, "four tokens and the session: {rows:?}");
    // It cannot mint; the same request with the token it was made from can (what the web app
    // does: it asks for the token).
    let from_cookie = send(
        with_cookie(&stack, "POST", "/v1/tokens", &cookie)
            .json(&json!({"name": "x", "kind": "user"})),
    );
    let message = refused(&from_cookie, 403, "a cookie session mints");
    assert_eq!(
        from_cookie.json()["error"]["code"],
        "reauthentication_required"
    );
    assert!(message.contains("Authorization: Bearer"), "{message}");
    let (with_token, _) = minted(
        &stack,
        send(
            with_cookie(&stack, "POST", "/v1/tokens", &cookie)
                .bearer(child_api.token().unwrap())
                .json(&json!({"name": "from the page", "kind": "user"})),
        ),
    );
    assert_eq!(with_token["parent"], child["jti"]);

    // Revoking the child ends its tree: the grandchild, the runner token, the cookie session and
    // the page's token; the parent lives on.
    let revoked = alice.send(alice.request("DELETE", &format!("/v1/tokens/{}", jti(&child))));
    assert_eq!(revoked.status, 200, "{revoked}");
    assert_eq!(revoked.json()["alsoRevoked"], 4, "{revoked}");
    for (what, api) in [("child", &child_api), ("grandchild", &grandchild_api)] {
        refused(&api.get("/v1/sessions"), 401, what);
    }
    refused(
        &send(with_cookie(&stack, "GET", "/v1/auth/me", &cookie)),
        401,
        "the cookie made from the child",
    );
    match RawRunner::connect(&stack.base_url(), &runner_token) {
        Ok(_) => panic!("a runner token whose grandparent was revoked connected"),
        Err(e) => assert!(e.to_string().contains("401"), "{e}"),
    }
    assert_eq!(parent_api.get("/v1/sessions").status, 200);
    // Minting from a revoked token is refused, and leaves nothing registered.
    refused(
        &mint(&child_api, json!({"name": "late", "kind": "user"})),
        401,
        "minting from a revoked token",
    );
    let rows = listed(&alice.get("/v1/tokens"));
    assert_eq!(
        rows.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(),
        vec![jti(&parent).as_str()],
        "only the parent is left"
    );
}

/// Access mints only right after a sign-in (`iat` within `ACCESS_REAUTH_SECS`), never through
/// a cookie session made from it; what it mints rests on the Access identity (`root`), outlives
/// the Access token, and ends with revoke-all of the email.
#[test]
fn access_mints_only_right_after_a_sign_in() {
    let stack = stack();
    let _guard = stack.guard();
    let ana = "ana@example.com";
    let body = json!({"name": "ana-cli", "kind": "user", "ttlDays": 30});
    // An Access sign-in older than the bound: refused with how to get a fresh one.
    let stale = team().token(ana, ACCESS_REAUTH_SECS + 30);
    assert_eq!(
        send(with_access(&stack, "GET", "/v1/auth/me", &stale)).status,
        200,
        "the stale sign-in is still a sign-in"
    );
    let refusal = send(with_access(&stack, "POST", "/v1/tokens", &stale).json(&body));
    let message = refused(&refusal, 403, "a stale Access sign-in mints");
    assert_eq!(refusal.json()["error"]["code"], "reauthentication_required");
    assert!(message.contains("/cdn-cgi/access/logout"), "{message}");
    // Without `iat`: refused too.
    let mut claims = team().claims(ana, 0);
    claims.as_object_mut().unwrap().remove("iat");
    refused(
        &send(with_access(&stack, "POST", "/v1/tokens", &team().sign(&claims)).json(&body)),
        403,
        "an Access token without iat mints",
    );
    // A cookie session made from a fresh sign-in cannot mint either.
    let fresh = team().token(ana, 5);
    let cookie = sign_in(with_access(&stack, "POST", "/v1/auth/session", &fresh));
    refused(
        &send(with_cookie(&stack, "POST", "/v1/tokens", &cookie).json(&body)),
        403,
        "a cookie made from Access mints",
    );
    // A fresh sign-in mints: a token resting on the identity, living its 30 days (the Access
    // token itself expires in ten minutes).
    let (token, token_api) = minted(
        &stack,
        send(with_access(&stack, "POST", "/v1/tokens", &fresh).json(&body)),
    );
    assert_eq!(
        token["root"],
        json!({"kind": "access", "email": ana}),
        "{token}"
    );
    assert!(token.get("parent").is_none(), "{token}");
    assert!(
        token["expiresAt"].as_i64().unwrap() >= unix_now() + 29 * 86_400,
        "{token}"
    );
    let (child, child_api) = minted(
        &stack,
        mint(&token_api, json!({"name": "ana-child", "kind": "user"})),
    );
    assert_eq!(
        child["root"], token["root"],
        "a child rests on the same identity"
    );
    // Listed to Access with the cookie session made from it.
    let rows = listed(&send(with_access(&stack, "GET", "/v1/tokens", &fresh)));
    assert_eq!(
        rows.iter().filter(|r| r.1 == "session").count(),
        1,
        "{rows:?}"
    );

    // An admin ends everything resting on ana: her tokens and cookie sessions.
    let admin = stack.admin_client("root", TENANT);
    let ended = admin.post("/v1/tokens/revoke-all", &json!({"sub": ana}));
    assert_eq!(ended.status, 200, "{ended}");
    assert_eq!(
        (
            ended.json()["revoked"].clone(),
            ended.json()["sessions"].clone()
        ),
        (json!(3), json!(1)),
        "{ended}"
    );
    for (what, api) in [("token", &token_api), ("child", &child_api)] {
        refused(&api.get("/v1/sessions"), 401, what);
    }
    refused(
        &send(with_cookie(&stack, "GET", "/v1/auth/me", &cookie)),
        401,
        "ana's cookie",
    );
    // Access itself is not Wuhu's to end: the sign-in still works (docs/security.md).
    assert_eq!(
        send(with_access(&stack, "GET", "/v1/auth/me", &fresh)).status,
        200
    );
}

/// `POST /v1/tokens/revoke-all` ends every credential of the caller: requests with any of them
/// are 401, an open follow stream ends, an open session socket closes (4401), a runner socket
/// made with a revoked runner token closes (1008). Another member's credentials, and the same
/// name in another tenant, are untouched. A member cannot do it for someone else (403); an
/// admin can.
#[test]
fn revoke_all_ends_every_credential_and_what_is_open() {
    let stack = stack();
    let _guard = stack.guard();
    let tenant = unique_name("revoke-all");
    let alice = stack.client("alice", &tenant);
    let bob = stack.client("bob", &tenant);
    let admin = stack.admin_client("root", &tenant);
    let elsewhere = stack.client("alice", &unique_name("revoke-all-other"));
    let bound = Duration::from_millis(CREDENTIAL_RECHECK_MS) + Duration::from_secs(10);

    let (_, laptop) = minted(
        &stack,
        mint(&alice, json!({"name": "laptop", "kind": "user"})),
    );
    let (_, script) = minted(
        &stack,
        mint(&laptop, json!({"name": "script", "kind": "user"})),
    );
    let (runner, _) = minted(
        &stack,
        mint(&alice, json!({"name": "mac", "kind": "runner"})),
    );
    let runner_token = runner["token"].as_str().unwrap().to_string();
    let cookie = sign_in(
        Request::new("POST", stack.url("/v1/auth/session")).bearer(laptop.token().unwrap()),
    );
    let (_, bobs) = minted(
        &stack,
        mint(&bob, json!({"name": "bob-cli", "kind": "user"})),
    );
    let (_, other_tenant) = minted(
        &stack,
        mint(&elsewhere, json!({"name": "laptop", "kind": "user"})),
    );

    // What is open: a follow stream on the laptop token, a session socket on the cookie, a
    // runner on the runner token; and bob's stream, which must stay.
    let session = alice.create_fake_session();
    let patched = alice.patch(
        &format!("/v1/sessions/{}", session.id),
        &json!({"access": "tenant"}),
    );
    assert_eq!(patched.status, 200, "{patched}");
    let mut stream = laptop.follow(&session.id, "");
    let mut bobs_stream = bobs.follow(&session.id, "");
    let mut socket = SessionSocket::connect(
        &stack.base_url(),
        &session.id,
        "",
        &SocketAuth::Cookie(cookie.clone(), Some(stack.base_url())),
    )
    .expect("a socket on the cookie");
    let mut raw = RawRunner::connect(&stack.base_url(), &runner_token).expect("runner connects");
    raw.send_text(&RawRunner::hello("mac", RunnerKind::Local));
    assert!(matches!(
        raw.next_message(WAIT),
        ServerMessage::Welcome { .. }
    ));
    alice.enqueue(&session.id, "followUp", "before");
    for s in [&mut stream, &mut bobs_stream] {
        s.collect_until(WAIT, |e| e.raw_data.contains("echo: before"));
    }

    // Bob may not end alice's credentials; nothing is revoked.
    let forbidden = bob.post("/v1/tokens/revoke-all", &json!({"sub": "alice"}));
    refused(&forbidden, 403, "bob revokes all of alice's");
    refused(
        &bobs.post("/v1/tokens/revoke-all", &json!({"sub": "alice"})),
        403,
        "bob's minted token revokes all of alice's",
    );
    assert_eq!(laptop.get("/v1/sessions").status, 200);
    refused(
        &alice.send_raw("POST", "/v1/tokens/revoke-all", "{not json"),
        400,
        "malformed",
    );
    refused(
        &alice.post("/v1/tokens/revoke-all", &json!({"sub": "a/b"})),
        400,
        "bad sub",
    );
    refused(
        &alice.post("/v1/tokens/revoke-all", &json!({"extra": 1})),
        400,
        "unknown field",
    );

    // Alice ends everything of hers, with the session's own cookie: the cookie is cleared.
    raw.heartbeat();
    let at = Instant::now();
    let ended = send(with_cookie(
        &stack,
        "POST",
        "/v1/tokens/revoke-all",
        &cookie,
    ));
    assert_eq!(ended.status, 200, "{ended}");
    let body = ended.json();
    assert_eq!(body["sub"], "alice");
    assert_eq!(body["revoked"], 4, "laptop, script, runner, cookie: {body}");
    assert_eq!(body["sessions"], 1, "{body}");
    assert_eq!(body["runnerConnectionsClosed"], 1, "{body}");
    assert!(
        ended
            .header("set-cookie")
            .is_some_and(|c| c.contains("Max-Age=0")),
        "{ended}"
    );
    // Every request with any of them: 401.
    for (what, api) in [("laptop", &laptop), ("script", &script)] {
        refused(&api.get("/v1/sessions"), 401, what);
    }
    refused(
        &send(with_cookie(&stack, "GET", "/v1/auth/me", &cookie)),
        401,
        "the cookie",
    );
    // The runner socket closes at once; its token cannot connect again.
    assert_eq!(
        raw.wait_closed(WAIT),
        Ok(Some((1008, "token revoked".to_string())))
    );
    match RawRunner::connect(&stack.base_url(), &runner_token) {
        Ok(_) => panic!("a revoked runner token connected"),
        Err(e) => assert!(e.to_string().contains("401"), "{e}"),
    }
    // The follow stream ends with an error, the socket closes with 4401, within the bound.
    let events = stream.collect_to_end(bound);
    assert!(
        events
            .last()
            .is_some_and(|e| e.event == "error" && e.raw_data.contains("revoked")),
        "{}",
        wuhu_e2e::sse::summarize(&events)
    );
    let (frames, close) = socket.wait_closed(bound).expect("the socket closes");
    assert_eq!(close.map(|c| c.0), Some(CLOSE_REVOKED), "{frames:?}");
    eprintln!(
        "token_lineage: revoke-all closed the stream and the socket within {:?}",
        at.elapsed()
    );
    // The operator token (not registered) still works; bob, his stream and the other tenant's
    // alice are untouched.
    assert_eq!(alice.get("/v1/sessions").status, 200);
    assert_eq!(bobs.get("/v1/sessions").status, 200);
    assert_eq!(other_tenant.get("/v1/sessions").status, 200);
    alice.enqueue(&session.id, "followUp", "after");
    let seen = bobs_stream.collect_until(WAIT, |e| e.raw_data.contains("echo: after"));
    assert!(
        seen.iter().any(|e| e.raw_data.contains("echo: after")),
        "bob's stream was cut: {}",
        wuhu_e2e::sse::summarize(&seen)
    );

    // An admin ends bob's: his minted token is refused.
    let ended = admin.post("/v1/tokens/revoke-all", &json!({"sub": "bob"}));
    assert_eq!(ended.status, 200, "{ended}");
    assert_eq!(ended.json()["revoked"], 1, "{ended}");
    refused(
        &bobs.get("/v1/sessions"),
        401,
        "bob's token after the admin's revoke-all",
    );
    // Nothing left to end is not an error.
    let again = alice.post("/v1/tokens/revoke-all", &json!({}));
    assert_eq!(again.json()["revoked"], 0, "{again}");
    assert_eq!(other_tenant.get("/v1/sessions").status, 200);
}

/// The Access settings are checked at every use of what an Access identity minted: removed
/// from `WUHU_ACCESS_ADMINS`, its admin token acts as a member and what only an admin could
/// mint (another user's token, a cloud runner token) is refused. And a plain-http team domain
/// that is not loopback is refused as `server_misconfigured`. Restarts the stack (alone).
#[test]
fn access_settings_are_checked_at_use() {
    let mut stack = env().stack.write().unwrap_or_else(|e| e.into_inner());
    let team = team();
    let base = |stack: &Stack| stack.base_url();
    let admin_body = json!({"name": "boss-admin", "kind": "user", "role": "admin"});
    let fresh = team.token(BOSS, 0);
    let post = |stack: &Stack, body: &Value| {
        send(
            Request::new("POST", stack.url("/v1/tokens"))
                .header("Cf-Access-Jwt-Assertion", &fresh)
                .header("Origin", base(stack))
                .json(body),
        )
    };
    let token = |response: Response| {
        assert_eq!(response.status, 201, "{response}");
        response.json()["token"].as_str().unwrap().to_string()
    };
    let admin_token = token(post(&stack, &admin_body));
    let own_token = token(post(&stack, &json!({"name": "boss-cli", "kind": "user"})));
    let for_bob = token(post(
        &stack,
        &json!({"name": "bob-ci", "kind": "user", "sub": "bob"}),
    ));
    let cloud = token(post(
        &stack,
        &json!({"name": "vm", "kind": "runner", "runnerKind": "cloud"}),
    ));
    let api = |stack: &Stack, token: &str| Api::new(stack.base_url(), Some(token.to_string()));
    assert_eq!(
        api(&stack, &admin_token).get("/v1/tokens?all=1").status,
        200
    );
    {
        let _guard = stack.guard();
        let mut raw = RawRunner::connect(&stack.base_url(), &cloud).expect("cloud runner");
        raw.send_text(&RawRunner::hello("vm", RunnerKind::Cloud));
        assert!(matches!(
            raw.next_message(WAIT),
            ServerMessage::Welcome { .. }
        ));
    }

    // A team domain over plain http to a host that is not loopback: every Access request, and
    // every credential resting on Access, is a 500 naming the variable.
    stack.set_var(
        "WUHU_ACCESS_TEAM_DOMAIN",
        Some("http://acme.cloudflareaccess.com"),
    );
    stack.restart();
    {
        let _guard = stack.guard();
        for (what, request) in [
            (
                "an Access request",
                Request::new("GET", stack.url("/v1/auth/me"))
                    .header("Cf-Access-Jwt-Assertion", &fresh),
            ),
            (
                "a token resting on Access",
                Request::new("GET", stack.url("/v1/auth/me")).bearer(&own_token),
            ),
        ] {
            let response = send(request);
            let error = std::panic::catch_unwind(|| response.expect_error(500))
                .unwrap_or_else(|_| panic!("{what}: {response}"));
            assert_eq!(error.code, "server_misconfigured", "{what}");
            assert!(
                error.message.contains("WUHU_ACCESS_TEAM_DOMAIN")
                    && error.message.contains("https://"),
                "{what}: {}",
                error.message
            );
        }
        // Bearer tokens that do not rest on Access are not affected.
        let operator = stack.client("carl", TENANT);
        assert_eq!(operator.get("/v1/sessions").status, 200);
    }

    // The domain back, and boss no longer an admin.
    stack.set_var("WUHU_ACCESS_TEAM_DOMAIN", Some(&team.domain()));
    stack.set_var("WUHU_ACCESS_ADMINS", Some("someone-else@example.com"));
    stack.restart();
    let _guard = stack.guard();
    let me = api(&stack, &admin_token).get("/v1/auth/me");
    assert_eq!(me.status, 200, "{me}");
    assert_eq!(
        me.json()["role"],
        "member",
        "the admin token is demoted: {me}"
    );
    refused(
        &api(&stack, &admin_token).get("/v1/tokens?all=1"),
        403,
        "a demoted admin token lists everyone's",
    );
    assert_eq!(api(&stack, &own_token).get("/v1/sessions").status, 200);
    let message = refused(
        &api(&stack, &for_bob).get("/v1/sessions"),
        401,
        "bob's token minted by a former admin",
    );
    assert!(message.contains("no longer an admin"), "{message}");
    match RawRunner::connect(&stack.base_url(), &cloud) {
        Ok(_) => panic!("a cloud runner token minted by a former admin connected"),
        Err(e) => assert!(e.to_string().contains("401"), "{e}"),
    }
    // The Access sign-in itself is a member now, and cannot mint an admin token.
    let fresh = team.token(BOSS, 0);
    refused(
        &send(
            Request::new("POST", stack.url("/v1/tokens"))
                .header("Cf-Access-Jwt-Assertion", &fresh)
                .header("Origin", stack.base_url())
                .json(&admin_body),
        ),
        403,
        "a demoted Access sign-in mints an admin token",
    );
}
