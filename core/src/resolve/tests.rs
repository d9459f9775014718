use super::*;
use crate::authority::Role;

fn runner(owner: &str, name: &str, kind: RunnerKind, connected: bool) -> RunnerView {
    RunnerView {
        owner: owner.into(),
        name: name.into(),
        kind,
        os: "Linux".into(),
        environments: vec![OfferedEnvironment {
            name: "api".into(),
            path: format!("/{owner}/{name}/api"),
        }],
        capabilities: vec![],
        connected,
    }
}

fn definition(name: &str, owner: Option<&str>, json: serde_json::Value) -> EnvironmentDefinition {
    let request: crate::wire::CreateEnvironmentRequest = serde_json::from_value(json).unwrap();
    let mut d = request.into_definition(format!("id-{name}"), 0).unwrap();
    d.name = name.into();
    d.owner = owner.map(str::to_string);
    d
}

fn local(name: &str, owner: Option<&str>, runner: &str) -> EnvironmentDefinition {
    definition(
        name,
        owner,
        serde_json::json!({"name": name, "kind": "local", "runner": runner, "path": "/p"}),
    )
}

fn template(name: &str, owner: &str) -> EnvironmentDefinition {
    definition(
        name,
        Some(owner),
        serde_json::json!({"name": name, "kind": "folder-template", "templatePath": "/t"}),
    )
}

fn who(sub: &str, role: Role) -> Principal {
    Principal {
        sub: sub.into(),
        tenant: "acme".into(),
        role,
    }
}

fn request(spec: &str, preference: RunnerPreference) -> ResolveEnvironmentRequest {
    serde_json::from_value(serde_json::json!({"spec": spec, "preference": preference.as_str()}))
        .unwrap()
}

use RunnerKind::{Cloud, Local};

#[test]
fn binding_a_runner() {
    let runners = vec![
        runner("alice", "mac", Local, true),
        runner("bob", "bob-mac", Local, true),
        runner("ops", "build", Cloud, false),
        runner("bob", "twin", Local, true),
        runner("carol", "twin", Local, true),
    ];
    let alice = who("alice", Role::Member);
    let bob = who("bob", Role::Member);
    let admin = who("root", Role::Admin);
    // (who, definition owner, runner, runnerOwner asked) → Ok((runnerOwner, grantedBy)) | Err(kind)
    type Case<'a> = (
        &'a Principal,
        &'a str,
        &'a str,
        Option<&'a str>,
        Result<(&'a str, Option<&'a str>), ResolveErrorKind>,
    );
    let cases: Vec<Case<'_>> = vec![
        (&alice, "alice", "mac", None, Ok(("alice", None))),
        // Never connected yet: the owner's own future runner.
        (&alice, "alice", "new-box", None, Ok(("alice", None))),
        (&alice, "alice", "build", None, Ok(("ops", None))),
        (
            &alice,
            "alice",
            "bob-mac",
            None,
            Err(ResolveErrorKind::Forbidden),
        ),
        (
            &alice,
            "alice",
            "bob-mac",
            Some("bob"),
            Err(ResolveErrorKind::Forbidden),
        ),
        (
            &alice,
            "alice",
            "new-box",
            Some("bob"),
            Err(ResolveErrorKind::Forbidden),
        ),
        (
            &alice,
            "alice",
            "twin",
            None,
            Err(ResolveErrorKind::BadRequest),
        ),
        (&bob, "bob", "twin", None, Ok(("bob", None))),
        (&bob, "bob", "mac", None, Err(ResolveErrorKind::Forbidden)),
        // An admin may name any runner, and it is recorded.
        (&admin, "alice", "bob-mac", None, Ok(("bob", Some("root")))),
        (
            &admin,
            "root",
            "mac",
            Some("alice"),
            Ok(("alice", Some("root"))),
        ),
        (&admin, "root", "build", None, Ok(("ops", None))),
        (&admin, "alice", "mac", None, Ok(("alice", None))),
    ];
    for (principal, owner, runner_name, asked, want) in cases {
        let mut d = local("api", Some(owner), runner_name);
        d.runner_owner = asked.map(str::to_string);
        let got = bind_runner(principal, &mut d, &runners)
            .map(|()| (d.runner_owner.clone().unwrap(), d.runner_granted_by.clone()));
        let want = want.map(|(o, g)| (o.to_string(), g.map(str::to_string)));
        assert_eq!(
            got.map_err(|e| e.kind),
            want,
            "{} binds {runner_name} ({asked:?}) in {owner}'s definition",
            principal.sub
        );
    }
    // No runner: nothing bound.
    let mut d = template("web", "alice");
    d.runner_owner = Some("x".into());
    bind_runner(&alice, &mut d, &runners).unwrap();
    assert_eq!((d.runner_owner, d.runner_granted_by), (None, None));
}

#[test]
fn definitions_resolve_by_runner_owner_and_name() {
    let bound = |mut d: EnvironmentDefinition, runner_owner: &str| {
        d.runner_owner = Some(runner_owner.into());
        d
    };
    let mut granted = bound(local("granted", Some("root"), "mac"), "alice");
    granted.runner_granted_by = Some("root".into());
    let definitions = vec![
        bound(local("mine", Some("alice"), "mac"), "alice"),
        // Bob's "mac" exists too (an old row): alice's definition never lands on it.
        bound(local("bobs", Some("bob"), "mac"), "bob"),
        bound(local("on-build", Some("alice"), "build"), "ops"),
        // Bound to a runner that was cloud, now connected with a local token.
        bound(local("was-cloud", Some("alice"), "turned"), "ops"),
        // Stored before owners: the session owner's runner of that name.
        local("legacy", None, "mac"),
        granted,
        template("web", "alice"),
    ];
    let runners = vec![
        runner("alice", "mac", Local, true),
        runner("bob", "mac", Local, true),
        runner("ops", "build", Cloud, true),
        runner("ops", "turned", Local, true),
        runner("zed", "aaa", Local, true),
        runner("ops", "zzz-cloud", Cloud, true),
    ];
    type Case<'a> = (
        &'a str,
        &'a str,
        RunnerPreference,
        Result<(&'a str, &'a str), ResolveErrorKind>,
    );
    use RunnerPreference as P;
    let cases: Vec<Case<'_>> = vec![
        ("alice", "mine", P::Any, Ok(("alice", "mac"))),
        ("alice", "id-mine", P::Any, Ok(("alice", "mac"))),
        (
            "alice",
            "mine",
            P::Cloud,
            Err(ResolveErrorKind::Unavailable),
        ),
        // Bob's session: alice's local runner is not eligible.
        ("bob", "mine", P::Any, Err(ResolveErrorKind::Unavailable)),
        ("bob", "bobs", P::Any, Ok(("bob", "mac"))),
        ("alice", "bobs", P::Any, Err(ResolveErrorKind::Unavailable)),
        ("bob", "on-build", P::Any, Ok(("ops", "build"))),
        ("ops", "was-cloud", P::Any, Err(ResolveErrorKind::Forbidden)),
        ("alice", "legacy", P::Any, Ok(("alice", "mac"))),
        ("bob", "legacy", P::Any, Ok(("bob", "mac"))),
        ("alice", "granted", P::Any, Ok(("alice", "mac"))),
        // A folder-template without runner: cloud runners only, never zed's "aaa".
        ("zed", "web", P::Any, Ok(("ops", "build"))),
        ("zed", "web", P::Local, Err(ResolveErrorKind::Unavailable)),
        ("alice", "web", P::Cloud, Ok(("ops", "build"))),
        // Offered environments: own local first, then cloud; never another user's local.
        ("alice", "api", P::Any, Ok(("alice", "mac"))),
        ("alice", "mac:api", P::Any, Ok(("alice", "mac"))),
        ("alice", "api", P::Cloud, Ok(("ops", "build"))),
        ("carol", "api", P::Any, Ok(("ops", "build"))),
        ("carol", "aaa:api", P::Any, Err(ResolveErrorKind::NotFound)),
        ("carol", "nothing", P::Any, Err(ResolveErrorKind::NotFound)),
        ("carol", " ", P::Any, Err(ResolveErrorKind::BadRequest)),
    ];
    for (sub, spec, preference, want) in cases {
        let got = resolve(sub, &request(spec, preference), &definitions, &runners)
            .map(|r| (r.runner_owner, r.runner))
            .map_err(|e| e.kind);
        let want = want.map(|(o, n)| (o.to_string(), n.to_string()));
        assert_eq!(got, want, "{sub} resolves {spec:?} ({preference:?})");
    }
}

#[test]
fn the_template_without_runner_waits_for_a_cloud_runner() {
    let definitions = vec![template("web", "alice")];
    let runners = vec![
        runner("alice", "mac", Local, true),
        runner("ops", "c", Cloud, false),
    ];
    let err = resolve(
        "alice",
        &request("web", RunnerPreference::Any),
        &definitions,
        &runners,
    )
    .unwrap_err();
    assert_eq!((err.status(), err.code()), (409, "runner_unavailable"));
    assert!(err.message.contains("cloud runner"), "{}", err.message);
}

#[test]
fn error_codes() {
    let e = |kind| ResolveError::new(kind, "x");
    assert_eq!(
        (
            e(ResolveErrorKind::BadRequest).status(),
            e(ResolveErrorKind::BadRequest).code()
        ),
        (400, "bad_request")
    );
    assert_eq!(
        (
            e(ResolveErrorKind::Forbidden).status(),
            e(ResolveErrorKind::Forbidden).code()
        ),
        (403, "forbidden")
    );
    assert_eq!(
        (
            e(ResolveErrorKind::NotFound).status(),
            e(ResolveErrorKind::NotFound).code()
        ),
        (404, "not_found")
    );
    assert_eq!(
        (
            e(ResolveErrorKind::Unavailable).status(),
            e(ResolveErrorKind::Unavailable).code()
        ),
        (409, "runner_unavailable")
    );
}
