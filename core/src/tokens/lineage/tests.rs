use super::*;
use crate::access::{AccessVars, TenantRule};
use crate::wire::CredentialKind;

const NOW: i64 = 1_000_000;

fn record(jti: &str, sub: &str, parent: Option<&str>, root: LineageRoot) -> CredentialRecord {
    CredentialRecord {
        jti: jti.into(),
        sub: sub.into(),
        kind: CredentialKind::User,
        name: jti.into(),
        role: Role::Member,
        runner_kind: None,
        created_by: sub.into(),
        created_at: NOW - 10,
        expires_at: NOW + 1_000,
        parent: parent.map(str::to_string),
        root,
    }
}

fn access(email: &str) -> LineageRoot {
    LineageRoot::Access {
        email: email.into(),
    }
}

#[test]
fn what_each_credential_may_make() {
    use Making::Token;
    use Presented::{Access, Operator, Registered};
    let minted = Registered {
        jti: "t1",
        expires_at: NOW + 500,
    };
    let parent = Ok(Source::Parent {
        jti: "t1".into(),
        expires_at: NOW + 500,
    });
    let at = |iat: Option<i64>| Access {
        email: "ana@acme.com",
        issued_at: iat,
    };
    let ana = Ok(Source::Root(access("ana@acme.com")));
    let cases: Vec<(Presented<'_>, Making, Result<Source, u16>)> = vec![
        (minted, Token, parent.clone()),
        (minted, Making::CookieSession, parent),
        (Operator, Token, Ok(Source::Root(LineageRoot::Operator))),
        (
            Operator,
            Making::CookieSession,
            Ok(Source::Root(LineageRoot::Operator)),
        ),
        // A cookie session never mints: the browser re-presents its token instead.
        (Presented::CookieSession, Token, Err(403)),
        (Presented::CookieSession, Making::CookieSession, Err(400)),
        // Access mints only right after a sign-in, at every bound.
        (at(Some(NOW)), Token, ana.clone()),
        (at(Some(NOW - ACCESS_REAUTH_SECS)), Token, ana.clone()),
        (at(Some(NOW - ACCESS_REAUTH_SECS - 1)), Token, Err(403)),
        (at(Some(NOW - 86_400)), Token, Err(403)),
        (at(Some(NOW + ISSUED_AT_SKEW_SECS)), Token, ana.clone()),
        (at(Some(NOW + ISSUED_AT_SKEW_SECS + 1)), Token, Err(403)),
        (at(None), Token, Err(403)),
        // A cookie session from Access is a browser convenience, capped by the Access token.
        (at(None), Making::CookieSession, ana.clone()),
        (at(Some(NOW - 86_400)), Making::CookieSession, ana),
    ];
    for (presented, making, want) in cases {
        let got = source(presented, making, NOW).map_err(|e| e.status_code().0);
        assert_eq!(got, want, "{presented:?} making {making:?}");
    }
    let stale = source(at(Some(NOW - 3_600)), Token, NOW).unwrap_err();
    assert_eq!(stale.status_code(), (403, "reauthentication_required"));
    assert!(
        stale.to_string().contains("60 minutes old") && stale.to_string().contains("sign in again"),
        "{stale}"
    );
    let cookie = source(Presented::CookieSession, Token, NOW).unwrap_err();
    assert!(
        cookie.to_string().contains("Authorization: Bearer"),
        "{cookie}"
    );
}

#[test]
fn a_child_never_outlives_its_parent() {
    let parent = Source::Parent {
        jti: "p".into(),
        expires_at: NOW + 100,
    };
    assert_eq!(parent.cap(NOW + 99), NOW + 99);
    assert_eq!(parent.cap(NOW + 100), NOW + 100);
    assert_eq!(parent.cap(NOW + 30 * 86_400), NOW + 100);
    let root = Source::Root(LineageRoot::Operator);
    assert_eq!(root.cap(NOW + 400 * 86_400), NOW + 400 * 86_400);
    assert_eq!(
        parent.lineage(),
        (Some("p".into()), LineageRoot::Unrecorded)
    );
    assert_eq!(root.lineage(), (None, LineageRoot::Operator));
}

#[test]
fn registration_adopts_the_parents_root_and_refuses_a_parent_that_is_gone() {
    let parent = CredentialRecord {
        expires_at: NOW + 50,
        ..record("p", "ana", None, access("boss@acme.com"))
    };
    let child = CredentialRecord {
        expires_at: NOW + 90 * 86_400,
        ..record("c", "ana", Some("p"), LineageRoot::Unrecorded)
    };
    // Adopted: the parent's root, capped at its expiry.
    let adopted = adopt(child.clone(), Some(&parent), NOW).unwrap();
    assert_eq!(adopted.root, access("boss@acme.com"));
    assert_eq!(adopted.expires_at, NOW + 50);
    // A root is registered as it is.
    let rooted = record("r", "ana", None, LineageRoot::Operator);
    assert_eq!(adopt(rooted.clone(), None, NOW), Ok(rooted));
    // Refused when the parent is gone, expired, someone else's, or another row.
    let expired = CredentialRecord {
        expires_at: NOW,
        ..parent.clone()
    };
    let bobs = CredentialRecord {
        sub: "bob".into(),
        ..parent.clone()
    };
    let other = CredentialRecord {
        jti: "q".into(),
        ..parent.clone()
    };
    for (what, row) in [
        ("gone", None),
        ("expired", Some(&expired)),
        ("someone else's", Some(&bobs)),
        ("another row", Some(&other)),
    ] {
        let refused = adopt(child.clone(), row, NOW).unwrap_err();
        assert_eq!(refused.status_code(), (401, "unauthorized"), "{what}");
    }
}

/// A small tenant: alice's tree on an operator token (one token minted for bob inside it), bob's
/// own tree, carol's Access identity with what she minted for herself and for bob, and a cycle
/// (which registration cannot make, but a walk must survive).
fn forest() -> Vec<CredentialRecord> {
    let op = LineageRoot::Operator;
    let carol = access("carol@acme.com");
    vec![
        record("a1", "alice", None, op.clone()),
        record("a2", "alice", Some("a1"), op.clone()),
        record("a2-session", "alice", Some("a2"), op.clone()),
        record("a3-for-bob", "bob", Some("a1"), op.clone()),
        record("a4", "bob", Some("a3-for-bob"), op.clone()),
        record("b1", "bob", None, op.clone()),
        record("b2", "bob", Some("b1"), op.clone()),
        record("c1", "carol@acme.com", None, carol.clone()),
        record("c1-child", "carol@acme.com", Some("c1"), carol.clone()),
        record("c2-for-bob", "bob", None, carol.clone()),
        record("c3", "bob", Some("c2-for-bob"), carol),
        record("x1", "zed", Some("x2"), op.clone()),
        record("x2", "zed", Some("x1"), op),
    ]
}

#[test]
fn revocation_reaches_the_whole_tree_and_nothing_else() {
    let rows = forest();
    let nodes: Vec<Node<'_>> = rows.iter().map(Node::from).collect();
    let cases: Vec<(Revocation<'_>, Vec<&str>)> = vec![
        (
            Revocation::One("a1"),
            vec!["a1", "a2", "a3-for-bob", "a2-session", "a4"],
        ),
        (Revocation::One("a2"), vec!["a2", "a2-session"]),
        (Revocation::One("a2-session"), vec!["a2-session"]),
        (Revocation::One("b1"), vec!["b1", "b2"]),
        (Revocation::One("c2-for-bob"), vec!["c2-for-bob", "c3"]),
        (Revocation::One("nope"), vec![]),
        (Revocation::One("x1"), vec!["x1", "x2"]),
        // All of alice's: her tree, the token she minted for bob in it included.
        (
            Revocation::AllOf("alice"),
            vec!["a1", "a2", "a2-session", "a3-for-bob", "a4"],
        ),
        // All of bob's: his own, the one alice minted for him, what carol minted for him.
        (
            Revocation::AllOf("bob"),
            vec!["a3-for-bob", "a4", "b1", "b2", "c2-for-bob", "c3"],
        ),
        // All of carol's: hers, and everything resting on her Access identity.
        (
            Revocation::AllOf("carol@acme.com"),
            vec!["c1", "c1-child", "c2-for-bob", "c3"],
        ),
        (Revocation::AllOf("nobody"), vec![]),
    ];
    for (what, want) in cases {
        let got = revocation_set(&nodes, what);
        let unique: HashSet<&String> = got.iter().collect();
        assert_eq!(unique.len(), got.len(), "{what:?}: each once: {got:?}");
        let mut sorted = got.clone();
        sorted.sort();
        let mut want: Vec<String> = want.into_iter().map(str::to_string).collect();
        want.sort();
        assert_eq!(sorted, want, "{what:?}");
    }
    // What is named comes first, then each generation.
    assert_eq!(
        revocation_set(&nodes, Revocation::One("a1")),
        ["a1", "a2", "a3-for-bob", "a2-session", "a4"]
    );
}

/// Many random forests: revoking any credential ends exactly the credentials that have it as
/// an ancestor (or are it), as found by walking up the parent links.
#[test]
fn revocation_equals_the_descendants_in_random_forests() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |bound: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % bound as u64) as usize
    };
    for size in [1, 2, 3, 10, 60, 300] {
        for _ in 0..20 {
            // Each row's parent is an earlier row or none, as registration makes them.
            let rows: Vec<CredentialRecord> = (0..size)
                .map(|i| {
                    let parent = (i > 0 && next(4) > 0).then(|| format!("j{}", next(i)));
                    record(
                        &format!("j{i}"),
                        ["alice", "bob", "carol"][next(3)],
                        parent.as_deref(),
                        LineageRoot::Operator,
                    )
                })
                .collect();
            let nodes: Vec<Node<'_>> = rows.iter().map(Node::from).collect();
            let parent_of: HashMap<&str, &str> = rows
                .iter()
                .filter_map(|r| r.parent.as_deref().map(|p| (r.jti.as_str(), p)))
                .collect();
            let descends = |jti: &str, from: &str| {
                let mut at = Some(jti);
                while let Some(j) = at {
                    if j == from {
                        return true;
                    }
                    at = parent_of.get(j).copied();
                }
                false
            };
            let target = format!("j{}", next(size));
            let got: HashSet<String> = revocation_set(&nodes, Revocation::One(&target))
                .into_iter()
                .collect();
            let want: HashSet<String> = rows
                .iter()
                .filter(|r| descends(&r.jti, &target))
                .map(|r| r.jti.clone())
                .collect();
            assert_eq!(got, want, "size {size}, revoking {target}");
            let sub = ["alice", "bob", "carol"][next(3)];
            let got: HashSet<String> = revocation_set(&nodes, Revocation::AllOf(sub))
                .into_iter()
                .collect();
            let want: HashSet<String> = rows
                .iter()
                .filter(|r| {
                    rows.iter()
                        .any(|owned| owned.sub == sub && descends(&r.jti, &owned.jti))
                })
                .map(|r| r.jti.clone())
                .collect();
            assert_eq!(got, want, "size {size}, all of {sub}");
        }
    }
}

fn access_config(admins: &str) -> AccessConfig {
    AccessConfig::from_vars(&AccessVars {
        team_domain: Some("https://acme.cloudflareaccess.com"),
        audience: Some("aud"),
        tenant: Some("acme"),
        tenant_domains: None,
        admins: Some(admins),
    })
    .unwrap()
    .unwrap()
}

#[test]
fn standing_at_use() {
    let with_boss = access_config("boss@acme.com");
    let without_boss = access_config("other@acme.com");
    let by_domain = AccessConfig {
        tenant: TenantRule::ByDomain(vec![("acme.com".into(), "beta".into())]),
        ..with_boss.clone()
    };
    let unmapped = AccessConfig {
        tenant: TenantRule::ByDomain(vec![("else.com".into(), "acme".into())]),
        ..with_boss.clone()
    };
    let boss = access("boss@acme.com");
    let admin = |r: CredentialRecord| CredentialRecord {
        role: Role::Admin,
        ..r
    };
    let cloud = |r: CredentialRecord| CredentialRecord {
        kind: CredentialKind::Runner,
        runner_kind: Some(crate::wire::runner::RunnerKind::Cloud),
        ..r
    };
    let own_admin = admin(record("t", "boss@acme.com", None, boss.clone()));
    let own_member = record("t", "boss@acme.com", None, boss.clone());
    let for_bob = record("t", "bob", None, boss.clone());
    let cloud_runner = cloud(record("t", "boss@acme.com", None, boss.clone()));
    let operator_admin = admin(record("t", "ana", None, LineageRoot::Operator));
    let legacy = record("t", "ana", None, LineageRoot::Unrecorded);
    let expired = CredentialRecord {
        expires_at: NOW,
        ..legacy.clone()
    };
    use Role::*;
    type Case<'a> = (
        &'static str,
        Option<&'a CredentialRecord>,
        &'static str,
        Option<&'a AccessConfig>,
        Result<Role, &'static str>,
    );
    let cases: Vec<Case<'_>> = vec![
        ("no row", None, "ana", None, Err("revoked")),
        ("expired", Some(&expired), "ana", None, Err("revoked")),
        ("another's", Some(&legacy), "bob", None, Err("revoked")),
        ("legacy", Some(&legacy), "ana", None, Ok(Member)),
        (
            "operator root",
            Some(&operator_admin),
            "ana",
            None,
            Ok(Admin),
        ),
        (
            "operator root, access irrelevant",
            Some(&operator_admin),
            "ana",
            Some(&without_boss),
            Ok(Admin),
        ),
        (
            "admin, still admin",
            Some(&own_admin),
            "boss@acme.com",
            Some(&with_boss),
            Ok(Admin),
        ),
        (
            "admin, demoted",
            Some(&own_admin),
            "boss@acme.com",
            Some(&without_boss),
            Ok(Member),
        ),
        (
            "member token, admin root",
            Some(&own_member),
            "boss@acme.com",
            Some(&with_boss),
            Ok(Member),
        ),
        (
            "for another user, minter still admin",
            Some(&for_bob),
            "bob",
            Some(&with_boss),
            Ok(Member),
        ),
        (
            "for another user, minter demoted",
            Some(&for_bob),
            "bob",
            Some(&without_boss),
            Err("no longer an admin"),
        ),
        (
            "cloud runner, minter still admin",
            Some(&cloud_runner),
            "boss@acme.com",
            Some(&with_boss),
            Ok(Member),
        ),
        (
            "cloud runner, minter demoted",
            Some(&cloud_runner),
            "boss@acme.com",
            Some(&without_boss),
            Err("no longer an admin"),
        ),
        (
            "access turned off",
            Some(&own_admin),
            "boss@acme.com",
            None,
            Err("no longer configured"),
        ),
        (
            "email now maps to another tenant",
            Some(&own_admin),
            "boss@acme.com",
            Some(&by_domain),
            Err("no longer admitted"),
        ),
        (
            "email's domain no longer mapped",
            Some(&own_admin),
            "boss@acme.com",
            Some(&unmapped),
            Err("no longer admitted"),
        ),
    ];
    for (what, row, sub, config, want) in cases {
        match (standing(row, sub, "acme", NOW, config), want) {
            (Standing::Live { role }, Ok(want)) => assert_eq!(role, want, "{what}"),
            (Standing::Refused(why), Err(want)) => assert!(why.contains(want), "{what}: {why}"),
            (got, want) => panic!("{what}: {got:?}, wanted {want:?}"),
        }
    }
}

#[test]
fn rows_registered_before_lineage_still_read() {
    let old = serde_json::json!({
        "jti": "j", "sub": "ana", "kind": "session", "name": "browser session (token)",
        "role": "member", "runnerKind": null, "createdBy": "ana", "createdAt": 1,
        "expiresAt": 2, "parent": "p"
    });
    let record: CredentialRecord = serde_json::from_value(old).unwrap();
    assert_eq!(record.parent.as_deref(), Some("p"));
    assert_eq!(record.root, LineageRoot::Unrecorded);
    let info = serde_json::to_value(record.info_for(Some("j"))).unwrap();
    assert_eq!(info["root"], serde_json::json!({"kind": "unrecorded"}));
    assert_eq!(info["current"], true);
    assert_eq!(info["parent"], "p");
}
