use super::*;

const SECRET: &[u8] = b"a-secret-of-at-least-thirty-two-bytes!!";

fn claims(exp: i64) -> Claims {
    Claims {
        sub: "alice".into(),
        tenant: "acme".into(),
        exp,
        typ: None,
        role: Some("admin".into()),
        nbf: None,
        runner_kind: None,
        jti: Some("t1".into()),
        iat: Some(1),
        iss: None,
        aud: None,
    }
}

#[test]
fn base64url_round_trips_and_has_one_encoding_per_value() {
    let mut rng = crate::SplitMix64::new(7);
    for len in 0..70 {
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let text = base64url_encode(&bytes);
        assert!(!text.contains(['=', '+', '/']), "{text}");
        assert_eq!(base64url_decode(&text).unwrap(), bytes, "{len}");
    }
    // RFC 4648 §10 vectors (url alphabet, no padding).
    for (plain, encoded) in [
        ("", ""),
        ("f", "Zg"),
        ("fo", "Zm8"),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg"),
        ("fooba", "Zm9vYmE"),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64url_encode(plain.as_bytes()), encoded);
        assert_eq!(base64url_decode(encoded).unwrap(), plain.as_bytes());
    }
    assert_eq!(base64url_decode("-_8").unwrap(), [0xfb, 0xff]);
    // Padding, the standard alphabet, impossible lengths, stray bits: refused.
    for bad in [
        "Zg==", "Zm9v+", "a/b", "Z", "Zm9vY", "Zh", "Zm9", "Zm-", " Zg",
    ] {
        assert_eq!(base64url_decode(bad), Err(JwtError::Malformed), "{bad}");
    }
}

#[test]
fn rfc_7515_hs256_example_verifies() {
    // RFC 7515 appendix A.1.
    let key = base64url_decode(
        "AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow",
    )
    .unwrap();
    let token = "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ.dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    let jws = Jws::parse(token).unwrap();
    assert_eq!(jws.alg, "HS256");
    jws.verify_hs256(&key).unwrap();
    let payload: serde_json::Value = jws.claims().unwrap();
    assert_eq!(payload["iss"], "joe");
    assert_eq!(jws.verify_hs256(b"another key"), Err(JwtError::Signature));
}

#[test]
fn signed_tokens_verify_and_read_back() {
    let token = sign_hs256(&claims(2_000), SECRET);
    let jws = Jws::parse(&token).unwrap();
    jws.verify_hs256(SECRET).unwrap();
    assert_eq!(jws.claims::<Claims>().unwrap(), claims(2_000));
    assert_eq!(jws.kid, None);
    assert_eq!(jws.signature().len(), 32);
    assert!(token.starts_with(&String::from_utf8_lossy(jws.signing_input()).into_owned()));
}

/// Every token that differs from a signed one in one character is refused: as malformed or as
/// a bad signature, never accepted.
#[test]
fn any_changed_character_is_refused() {
    let token = sign_hs256(&claims(2_000), SECRET);
    for i in 0..token.len() {
        for replacement in ['A', 'b', '-', '.', '9'] {
            let mut changed = token.clone().into_bytes();
            if changed[i] == replacement as u8 {
                continue;
            }
            changed[i] = replacement as u8;
            let changed = String::from_utf8(changed).unwrap();
            let verdict = Jws::parse(&changed).and_then(|j| j.verify_hs256(SECRET));
            assert!(verdict.is_err(), "accepted {changed}");
        }
    }
    for bad in ["", "a.b", "a.b.c.d", &format!("{token}.")] {
        assert!(Jws::parse(bad).is_err(), "{bad}");
    }
}

/// A token whose header names another algorithm is refused even with a valid HMAC over it
/// (`none`, RS256 with the secret as an "RSA key", …).
#[test]
fn only_hs256_verifies() {
    for alg in ["none", "RS256", "HS512", "hs256", ""] {
        let header = base64url_encode(format!(r#"{{"alg":"{alg}"}}"#).as_bytes());
        let payload = base64url_encode(&serde_json::to_vec(&claims(2_000)).unwrap());
        let input = format!("{header}.{payload}");
        let mut mac = hmac_sha256(SECRET);
        mac.update(input.as_bytes());
        let signature = base64url_encode(&mac.finalize().into_bytes());
        let token = format!("{input}.{signature}");
        let jws = Jws::parse(&token).unwrap();
        assert_eq!(jws.verify_hs256(SECRET), Err(JwtError::Algorithm), "{alg}");
    }
    let unsigned = format!(
        "{}.{}.",
        base64url_encode(br#"{"alg":"none"}"#),
        base64url_encode(b"{}")
    );
    assert_eq!(
        Jws::parse(&unsigned).unwrap().verify_hs256(SECRET),
        Err(JwtError::Algorithm)
    );
}

#[test]
fn tokens_interoperate_with_jsonwebtoken() {
    use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
    let theirs = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims(4_000_000_000),
        &EncodingKey::from_secret(SECRET),
    )
    .unwrap();
    let jws = Jws::parse(&theirs).unwrap();
    jws.verify_hs256(SECRET).unwrap();
    assert_eq!(jws.claims::<Claims>().unwrap(), claims(4_000_000_000));
    assert_eq!(theirs, sign_hs256(&claims(4_000_000_000), SECRET));

    let ours = sign_hs256(&claims(4_000_000_000), SECRET);
    let mut validation = Validation::new(Algorithm::HS256);
    validation.validate_aud = false;
    let data =
        jsonwebtoken::decode::<Claims>(&ours, &DecodingKey::from_secret(SECRET), &validation)
            .unwrap();
    assert_eq!(data.claims, claims(4_000_000_000));
}

#[test]
fn missing_required_claims() {
    for payload in [r#"{"tenant":"t","exp":5}"#, r#"{"sub":"s","tenant":"t"}"#] {
        let token = format!(
            "{}.{}.",
            base64url_encode(br#"{"alg":"HS256"}"#),
            base64url_encode(payload.as_bytes())
        );
        assert_eq!(
            Jws::parse(&token).unwrap().claims::<Claims>(),
            Err(JwtError::MissingClaim),
            "{payload}"
        );
    }
    let token = format!(
        "{}.{}.",
        base64url_encode(br#"{"alg":"HS256"}"#),
        base64url_encode(br#"{"sub":"s","tenant":"t","exp":"soon"}"#)
    );
    assert_eq!(
        Jws::parse(&token).unwrap().claims::<Claims>(),
        Err(JwtError::Malformed)
    );
}

#[test]
fn registered_claims() {
    let now = 1_000;
    let with = |f: &dyn Fn(&mut Claims)| {
        let mut c = claims(now + 60);
        f(&mut c);
        c
    };
    let none = Expect::default();
    let configured = Expect {
        issuer: Some("https://wuhu.example"),
        audience: Some("wuhu"),
    };
    let s = |t: &str| Some(t.to_string());
    let aud = |v: serde_json::Value| Some(v);
    let cases: Vec<(&str, Claims, Expect<'_>, Result<(), JwtError>)> = vec![
        ("plain", with(&|_| {}), none, Ok(())),
        (
            "exp now",
            with(&|c| c.exp = now),
            none,
            Err(JwtError::Expired),
        ),
        (
            "exp past",
            with(&|c| c.exp = now - 1),
            none,
            Err(JwtError::Expired),
        ),
        ("nbf now", with(&|c| c.nbf = Some(now)), none, Ok(())),
        (
            "nbf future",
            with(&|c| c.nbf = Some(now + 1)),
            none,
            Err(JwtError::NotYetValid),
        ),
        ("iss ignored", with(&|c| c.iss = s("x")), none, Ok(())),
        (
            "aud ignored",
            with(&|c| c.aud = aud("x".into())),
            none,
            Ok(()),
        ),
        (
            "both right",
            with(&|c| {
                c.iss = s("https://wuhu.example");
                c.aud = aud("wuhu".into());
            }),
            configured,
            Ok(()),
        ),
        (
            "aud in a list",
            with(&|c| {
                c.iss = s("https://wuhu.example");
                c.aud = aud(serde_json::json!(["other", "wuhu"]));
            }),
            configured,
            Ok(()),
        ),
        (
            "aud list without it",
            with(&|c| {
                c.iss = s("https://wuhu.example");
                c.aud = aud(serde_json::json!(["other"]));
            }),
            configured,
            Err(JwtError::Audience),
        ),
        (
            "aud wrong",
            with(&|c| {
                c.iss = s("https://wuhu.example");
                c.aud = aud("wuhu2".into());
            }),
            configured,
            Err(JwtError::Audience),
        ),
        (
            "aud not a string",
            with(&|c| {
                c.iss = s("https://wuhu.example");
                c.aud = aud(serde_json::json!(1));
            }),
            configured,
            Err(JwtError::Audience),
        ),
        (
            "iss wrong",
            with(&|c| {
                c.iss = s("https://wuhu.example/");
                c.aud = aud("wuhu".into());
            }),
            configured,
            Err(JwtError::Issuer),
        ),
        (
            "iss missing",
            with(&|c| c.aud = aud("wuhu".into())),
            configured,
            Err(JwtError::MissingClaim),
        ),
        (
            "aud missing",
            with(&|c| c.iss = s("https://wuhu.example")),
            configured,
            Err(JwtError::MissingClaim),
        ),
    ];
    for (name, c, expect, want) in cases {
        assert_eq!(check_registered(&c, expect, now), want, "{name}");
    }
}
