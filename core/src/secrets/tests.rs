use super::*;
use crate::authority::Role;
use crate::channels::seal::ChannelKey;

fn principal(sub: &str, role: Role) -> Principal {
    Principal {
        sub: sub.into(),
        tenant: "acme".into(),
        role,
    }
}

fn secret(
    name: &str,
    scope: SecretScope,
    owner: Option<&str>,
    environments: &[&str],
) -> SealedSecret {
    SealedSecret {
        info: SecretInfo {
            name: name.into(),
            scope,
            owner: owner.map(String::from),
            hosts: vec![],
            environments: environments.iter().map(|e| e.to_string()).collect(),
            set_by: owner.unwrap_or("root").into(),
            set_at: 1,
        },
        sealed: format!("sealed-{name}-{}", owner.unwrap_or("tenant")),
    }
}

#[test]
fn names() {
    for good in ["A", "GITHUB_TOKEN", "_X", "NPM_TOKEN_2", &"A".repeat(64)] {
        assert_eq!(check_name(good), Ok(()), "{good}");
    }
    for bad in [
        "",
        "a",
        "github_token",
        "1A",
        "A-B",
        "A B",
        "Ä",
        &"A".repeat(65),
        "WUHU_TOKEN",
    ] {
        assert!(check_name(bad).is_err(), "{bad}");
    }
}

fn put(value: &str, hosts: &[&str], environments: &[&str]) -> PutSecretRequest {
    PutSecretRequest {
        value: value.into(),
        scope: SecretScope::User,
        hosts: hosts.iter().map(|h| h.to_string()).collect(),
        environments: environments.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn bodies() {
    let max = "v".repeat(MAX_VALUE_BYTES);
    let over = "v".repeat(MAX_VALUE_BYTES + 1);
    let many: Vec<String> = (0..=MAX_TARGETS)
        .map(|i| format!("h{i}.example.com"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let cases: Vec<(PutSecretRequest, Result<(), &str>)> = vec![
        (put("x", &[], &[]), Ok(())),
        (
            put(&max, &["api.github.com", "*.npmjs.org"], &["api"]),
            Ok(()),
        ),
        (put("", &[], &[]), Err("value must not be empty")),
        (
            put(&over, &[], &[]),
            Err("value is 16385 bytes; at most 16384"),
        ),
        (put("a\0b", &[], &[]), Err("NUL")),
        (put("x", &["GitHub.com"], &[]), Err("not a host name")),
        (
            put("x", &["https://github.com"], &[]),
            Err("not a host name"),
        ),
        (put("x", &["*."], &[]), Err("not a host name")),
        (put("x", &["-a.com"], &[]), Err("not a host name")),
        (put("x", &many[..MAX_TARGETS], &[]), Ok(())),
        (put("x", &many, &[]), Err("hosts has 33 entries")),
        (put("x", &[], &["bad name"]), Err("environments")),
    ];
    for (request, expected) in cases {
        let got = check_put(&request);
        match expected {
            Ok(()) => assert_eq!(got, Ok(()), "{request:?}"),
            Err(part) => {
                let message = got.expect_err(&format!("{request:?} should be refused"));
                assert!(message.contains(part), "{message:?} lacks {part:?}");
            }
        }
    }
}

#[test]
fn a_request_never_prints_its_value() {
    let request = put("hunter2-very-secret", &[], &[]);
    assert!(!format!("{request:?}").contains("hunter2"));
    let sealed = secret("A", SecretScope::User, Some("alice"), &[]);
    assert!(!format!("{sealed:?}").contains("sealed-"));
}

#[test]
fn who_writes_and_who_sees() {
    let admin = principal("root", Role::Admin);
    let alice = principal("alice", Role::Member);
    let guest = principal("slack:T1:U2", Role::Member);
    assert_eq!(may_write(&admin, SecretScope::Tenant), Ok(()));
    assert_eq!(may_write(&admin, SecretScope::User), Ok(()));
    assert_eq!(may_write(&alice, SecretScope::User), Ok(()));
    assert!(may_write(&alice, SecretScope::Tenant).is_err());
    assert!(may_write(&guest, SecretScope::User).is_err());

    let book = [
        secret("DEPLOY", SecretScope::Tenant, None, &["prod"]),
        secret("GITHUB_TOKEN", SecretScope::User, Some("alice"), &[]),
        secret("GITHUB_TOKEN", SecretScope::User, Some("bob"), &[]),
    ];
    let names = |who: &Principal| {
        listing(&book, who)
            .secrets
            .iter()
            .map(|s| format!("{}:{}", s.scope.as_str(), s.owner.as_deref().unwrap_or("")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(names(&alice), "tenant: user:alice");
    assert_eq!(names(&principal("bob", Role::Member)), "tenant: user:bob");
    // Admins see the tenant's secrets and their own, not other users' (names are theirs).
    assert_eq!(names(&admin), "tenant:");
    assert_eq!(names(&guest), "");
}

#[test]
fn sealed_values_open_only_where_they_were_sealed() {
    let key = ChannelKey::parse(Some(
        "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
    ))
    .unwrap();
    let here = aad("acme", SecretScope::User, Some("alice"), "GITHUB_TOKEN");
    let sealed = key.seal(&here, [7; 12], b"ghp_value");
    assert_eq!(key.open(&here, &sealed).unwrap(), b"ghp_value");
    for elsewhere in [
        aad("other", SecretScope::User, Some("alice"), "GITHUB_TOKEN"),
        aad("acme", SecretScope::Tenant, None, "GITHUB_TOKEN"),
        aad("acme", SecretScope::User, Some("bob"), "GITHUB_TOKEN"),
        aad("acme", SecretScope::User, Some("alice"), "NPM_TOKEN"),
    ] {
        assert!(key.open(&elsewhere, &sealed).is_err(), "{elsewhere}");
    }
}

/// names, definition, runner owner, acting for → the sealed values chosen, or `ERR` and the
/// error's gist.
type Case<'a> = (
    &'a [&'a str],
    Option<&'a str>,
    &'a str,
    &'a [&'a str],
    &'a str,
);

/// Who gets which value: every combination of whom the turn acts for, whose runner, and where
/// the secrets say they may go.
#[test]
fn choosing_the_value_for_a_call() {
    let book = [
        secret("DEPLOY", SecretScope::Tenant, None, &["prod"]),
        secret("SHARED", SecretScope::Tenant, None, &["prod", "dev"]),
        secret("GITHUB_TOKEN", SecretScope::User, Some("alice"), &[]),
        secret("GITHUB_TOKEN", SecretScope::Tenant, None, &["prod"]),
        secret("NPM_TOKEN", SecretScope::User, Some("alice"), &["ci"]),
        secret("BOB_ONLY", SecretScope::User, Some("bob"), &[]),
    ];
    let cases: &[Case] = &[
        // names, definition, runner owner, acting for → chosen sealed values or the error's gist
        (
            &["DEPLOY"],
            Some("prod"),
            "ops",
            &["alice"],
            "sealed-DEPLOY-tenant",
        ),
        (
            &["DEPLOY"],
            Some("dev"),
            "ops",
            &["alice"],
            "ERR does not name the environment \"dev\"",
        ),
        (
            &["DEPLOY"],
            None,
            "alice",
            &["alice"],
            "ERR does not name the environment",
        ),
        (
            &["DEPLOY", "SHARED"],
            Some("prod"),
            "ops",
            &["alice", "bob"],
            "sealed-DEPLOY-tenant sealed-SHARED-tenant",
        ),
        // Alice's own token on her own runner, acting for her alone.
        (
            &["GITHUB_TOKEN"],
            Some("dev"),
            "alice",
            &["alice"],
            "sealed-GITHUB_TOKEN-alice",
        ),
        (
            &["GITHUB_TOKEN"],
            None,
            "alice",
            &["alice"],
            "sealed-GITHUB_TOKEN-alice",
        ),
        // On someone else's runner: only where the secret says.
        (
            &["GITHUB_TOKEN"],
            Some("dev"),
            "ops",
            &["alice"],
            "ERR your secret GITHUB_TOKEN goes only to your own runners",
        ),
        (
            &["NPM_TOKEN"],
            Some("ci"),
            "ops",
            &["alice"],
            "sealed-NPM_TOKEN-alice",
        ),
        // A group turn never uses a user's secret: the tenant's of that name where it may go.
        (
            &["GITHUB_TOKEN"],
            Some("prod"),
            "alice",
            &["alice", "bob"],
            "sealed-GITHUB_TOKEN-tenant",
        ),
        (
            &["GITHUB_TOKEN"],
            Some("dev"),
            "alice",
            &["alice", "bob"],
            "ERR does not name the environment \"dev\"",
        ),
        (
            &["NPM_TOKEN"],
            Some("ci"),
            "alice",
            &["alice", "bob"],
            "ERR asks for secret NPM_TOKEN, which is not set (a user's own secret is used only in turns that act for that user alone; this turn acts for alice, bob)",
        ),
        (
            &["NPM_TOKEN"],
            Some("ci"),
            "alice",
            &["alice", "slack:T1:U9"],
            "ERR used only in turns that act for that user alone",
        ),
        // Bob's secret, in a turn for alice: as if it did not exist (nothing says bob has one).
        (
            &["BOB_ONLY"],
            Some("dev"),
            "alice",
            &["alice"],
            "ERR asks for secret BOB_ONLY, which is not set",
        ),
        (
            &["BOB_ONLY"],
            Some("dev"),
            "bob",
            &["bob"],
            "sealed-BOB_ONLY-bob",
        ),
        (
            &["MISSING"],
            Some("prod"),
            "ops",
            &["alice"],
            "ERR which is not set",
        ),
        (&[], Some("prod"), "ops", &[], ""),
    ];
    for (names, definition, runner_owner, acting_for, expected) in cases {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let acting_for: Vec<String> = acting_for.iter().map(|n| n.to_string()).collect();
        let got = match choose(
            &book,
            Wanted {
                names: &names,
                definition: *definition,
                runner_owner,
                acting_for: &acting_for,
            },
        ) {
            Ok(chosen) => chosen
                .iter()
                .map(|s| s.sealed.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            Err(e) => format!("ERR {e}"),
        };
        if let Some(gist) = expected.strip_prefix("ERR ") {
            assert!(
                got.starts_with("ERR ") && got.contains(gist),
                "{names:?} {definition:?} on {runner_owner}'s runner for {acting_for:?}: {got}"
            );
        } else {
            assert_eq!(
                &got, expected,
                "{names:?} {definition:?} on {runner_owner}'s runner for {acting_for:?}"
            );
        }
    }
}

#[test]
fn keys_rotate() {
    let one = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    let two = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";
    assert_eq!(
        SecretKeys::parse(None, None).unwrap_err(),
        "WUHU_SECRETS_KEY is not set"
    );
    assert_eq!(
        SecretKeys::parse(Some("00"), None).unwrap_err(),
        "WUHU_SECRETS_KEY must be 32 bytes as 64 hex characters"
    );
    assert_eq!(
        SecretKeys::parse(Some(one), Some("zz")).unwrap_err(),
        "WUHU_SECRETS_KEY_PREVIOUS must be 32 bytes as 64 hex characters"
    );
    let aad = aad("acme", SecretScope::Tenant, None, "DEPLOY");
    let before = SecretKeys::parse(Some(one), None).unwrap();
    let sealed = before.seal(&aad, [1; 12], "v-1");
    assert_eq!(
        before.open(&aad, &sealed).unwrap(),
        ("v-1".to_string(), false)
    );
    // Rotated: the new key with the old one kept opens it and says to seal it again.
    let rotated = SecretKeys::parse(Some(two), Some(one)).unwrap();
    assert_eq!(
        rotated.open(&aad, &sealed).unwrap(),
        ("v-1".to_string(), true)
    );
    let resealed = rotated.seal(&aad, [2; 12], "v-1");
    assert_eq!(
        rotated.open(&aad, &resealed).unwrap(),
        ("v-1".to_string(), false)
    );
    // Rotated with the old key dropped: what was not sealed again no longer opens.
    let dropped = SecretKeys::parse(Some(two), Some("")).unwrap();
    assert!(dropped.open(&aad, &sealed).unwrap_err().contains("rotated"));
    assert!(dropped.open(&aad, &resealed).is_ok());
    assert!(!format!("{rotated:?}").contains(one));
}

#[test]
fn references_in_headers() {
    assert_eq!(references("Bearer {{secret:GH}}").unwrap(), ["GH"]);
    assert_eq!(
        references("{{secret:A}}:{{secret:B}} {{secret:A}}").unwrap(),
        ["A", "B"]
    );
    assert_eq!(
        references("no reference, {{not one}}").unwrap(),
        Vec::<String>::new()
    );
    assert!(
        references("Bearer {{secret:GH")
            .unwrap_err()
            .contains("unclosed")
    );
    assert!(references("{{secret:gh}}").is_err());
    assert_eq!(
        substitute(
            "token {{secret:A}} and {{secret:A}}",
            &[("A".into(), "v".into())]
        ),
        "token v and v"
    );
}

#[test]
fn hosts_match_exactly_or_below_a_wildcard() {
    let hosts = vec!["api.github.com".to_string(), "*.npmjs.org".to_string()];
    for (host, allowed) in [
        ("api.github.com", true),
        ("API.GitHub.com.", true),
        ("github.com", false),
        ("evil-api.github.com", false),
        ("registry.npmjs.org", true),
        ("a.b.npmjs.org", true),
        ("npmjs.org", false),
        ("evilnpmjs.org", false),
        ("npmjs.org.evil.com", false),
    ] {
        assert_eq!(host_allowed(&hosts, host), allowed, "{host}");
    }
    assert!(!host_allowed(&[], "api.github.com"));
}

#[test]
fn choosing_a_secret_for_a_fetch() {
    let mut tenant = secret("API", SecretScope::Tenant, None, &[]);
    tenant.info.hosts = vec!["api.example.com".into()];
    let mut own = secret("API", SecretScope::User, Some("alice"), &[]);
    own.info.hosts = vec!["*.example.com".into()];
    let mut nowhere = secret("LOCAL", SecretScope::User, Some("alice"), &[]);
    nowhere.info.hosts = vec![];
    let book = [tenant, own, nowhere];
    let alice = ["alice".to_string()];
    let both = ["alice".to_string(), "bob".to_string()];
    let pick = |name: &str, host: &str, acting_for: &[String]| match for_fetch(
        &book, name, host, acting_for,
    ) {
        Ok(s) => s.sealed.clone(),
        Err(e) => format!("ERR {e}"),
    };
    assert_eq!(pick("API", "x.example.com", &alice), "sealed-API-alice");
    assert_eq!(pick("API", "api.example.com", &both), "sealed-API-tenant");
    assert_eq!(
        pick("API", "x.example.com", &both),
        "ERR secret API may not be sent to x.example.com (its hosts do not list it)"
    );
    assert_eq!(
        pick("LOCAL", "x.example.com", &alice),
        "ERR secret LOCAL may not be sent to x.example.com (its hosts do not list it)"
    );
    assert_eq!(
        pick("LOCAL", "x.example.com", &both),
        "ERR no secret LOCAL is available to this turn"
    );
    assert_eq!(
        pick("NONE", "api.example.com", &alice),
        "ERR no secret NONE is available to this turn"
    );
}

#[test]
fn known_values_are_masked_in_json_without_the_detector() {
    let masker = crate::masking::Masker::new([("API", "api-value-123")]);
    let mut value = serde_json::json!({
        "body": "{\"echo\":\"api-value-123\"}",
        "list": ["api-value-123", 7],
        "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJlLXZhbHVl",
    });
    mask_known_json(&masker, &mut value);
    assert_eq!(value["body"], "{\"echo\":\"[secret:API]\"}");
    assert_eq!(value["list"][0], "[secret:API]");
    assert_eq!(value["list"][1], 7);
    assert!(value["jwt"].as_str().unwrap().starts_with("eyJ"), "{value}");
}
