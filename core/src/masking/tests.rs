//! Table tests of masking: every encoding at every alignment, streams split at every byte,
//! overlaps, bounds, and the detector's positive and negative tables.

use expect_test::{Expect, expect};

use super::*;

const TOKEN: &str = "s3cr3t/Value+With?Odd&Chars=1";

fn masker() -> Masker {
    Masker::new([("API_TOKEN", TOKEN)])
}

fn b64(bytes: &[u8], url: bool) -> String {
    base64_full(bytes, if url { BASE64_URL } else { BASE64_STANDARD })
}

#[test]
fn base64_encoder_matches_rfc_4648() {
    let cases = [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ];
    for (raw, want) in cases {
        assert_eq!(b64(raw.as_bytes(), false), want, "{raw}");
    }
    assert_eq!(b64(&[0xfb, 0xff], false), "+/8=");
    assert_eq!(b64(&[0xfb, 0xff], true), "-_8=");
}

fn check(masker: &Masker, cases: &[&str], expect: Expect) {
    let out: String = cases
        .iter()
        .map(|case| format!("{case}\n  => {}\n", masker.mask_known(case)))
        .collect();
    expect.assert_eq(&out);
}

#[test]
fn every_encoding_is_masked() {
    let json = serde_json::to_string(&serde_json::json!({"t": TOKEN})).unwrap();
    let cases = [
        format!("raw {TOKEN} end"),
        format!("json {json}"),
        format!("url {}", percent(TOKEN.as_bytes(), true, false, b"")),
        format!("url lower {}", percent(TOKEN.as_bytes(), false, false, b"")),
        format!("hex {}", hex::encode(TOKEN)),
        format!("HEX {}", hex::encode_upper(TOKEN)),
        format!("b64 {}", b64(TOKEN.as_bytes(), false)),
        format!("b64url {}", b64(TOKEN.as_bytes(), true)),
        format!(
            "b64 unpadded {}",
            b64(TOKEN.as_bytes(), false).trim_end_matches('=')
        ),
        format!(
            "echo | base64 {}",
            b64(format!("{TOKEN}\n").as_bytes(), false)
        ),
    ];
    let cases: Vec<&str> = cases.iter().map(String::as_str).collect();
    check(
        &masker(),
        &cases,
        expect![[r#"
        raw s3cr3t/Value+With?Odd&Chars=1 end
          => raw [secret:API_TOKEN] end
        json {"t":"s3cr3t/Value+With?Odd&Chars=1"}
          => json {"t":"[secret:API_TOKEN]"}
        url s3cr3t%2FValue%2BWith%3FOdd%26Chars%3D1
          => url [secret:API_TOKEN]
        url lower s3cr3t%2fValue%2bWith%3fOdd%26Chars%3d1
          => url lower [secret:API_TOKEN]
        hex 7333637233742f56616c75652b576974683f4f64642643686172733d31
          => hex [secret:API_TOKEN]
        HEX 7333637233742F56616C75652B576974683F4F64642643686172733D31
          => HEX [secret:API_TOKEN]
        b64 czNjcjN0L1ZhbHVlK1dpdGg/T2RkJkNoYXJzPTE=
          => b64 [secret:API_TOKEN]
        b64url czNjcjN0L1ZhbHVlK1dpdGg_T2RkJkNoYXJzPTE=
          => b64url [secret:API_TOKEN]
        b64 unpadded czNjcjN0L1ZhbHVlK1dpdGg/T2RkJkNoYXJzPTE
          => b64 unpadded [secret:API_TOKEN]
        echo | base64 czNjcjN0L1ZhbHVlK1dpdGg/T2RkJkNoYXJzPTEK
          => echo | base64 [secret:API_TOKEN]K
    "#]],
    );
}

#[test]
fn json_escapes_are_masked() {
    let value = "line1\n\"quoted\"\\back\tü-€";
    let masker = Masker::new([("MULTI", value)]);
    let serde = serde_json::to_string(value).unwrap();
    // Python's json.dumps (ensure_ascii): non-ASCII as \uXXXX.
    let python =
        "\"line1\\n\\\"quoted\\\"\\\\back\\tu\\u00fc-\\u20ac\"".replace("tu\\u00fc", "t\\u00fc");
    check(
        &masker,
        &[&serde, &python],
        expect![[r#"
        "line1\n\"quoted\"\\back\tü-€"
          => "[secret:MULTI]"
        "line1\n\"quoted\"\\back\t\u00fc-\u20ac"
          => "[secret:MULTI]"
    "#]],
    );
}

/// Base64 of `prefix + TOKEN + suffix` (both alphabets, padded or not) shows at most the
/// characters of the prefix and suffix around one placeholder, and a little of their edges.
#[test]
fn base64_at_every_alignment() {
    let masker = masker();
    let place = placeholder("API_TOKEN");
    for prefix in ["", "x", "xy", "xyz", "token: ", "ab\n"] {
        for suffix in ["", "\n", "z", "zz", "zzz", " trailing"] {
            for url in [false, true] {
                for padded in [true, false] {
                    let raw = format!("{prefix}{TOKEN}{suffix}");
                    let mut encoded = b64(raw.as_bytes(), url);
                    if !padded {
                        encoded = encoded.trim_end_matches('=').to_string();
                    }
                    let masked = masker.mask_known(&encoded);
                    let (before, after) = masked
                        .split_once(&place)
                        .unwrap_or_else(|| panic!("{raw:?} as {encoded}: {masked}"));
                    assert!(!after.contains(&place), "{raw:?}: {masked}");
                    // Characters that depend on the prefix (and at most one of the value).
                    assert!(
                        before.len() <= (prefix.len() * 8).div_ceil(6) + 1,
                        "{raw:?}: {masked}"
                    );
                    assert!(
                        after.len() <= (suffix.len() * 8).div_ceil(6) + 4,
                        "{raw:?}: {masked}"
                    );
                    // Inside a longer base64 text (a file's contents) too.
                    let long = format!("QUJD{encoded}");
                    if encoded.len().is_multiple_of(4) {
                        assert!(masker.mask_known(&long).contains(&place), "{long}");
                    }
                }
            }
        }
    }
}

#[test]
fn url_and_hex_forms() {
    let value = "pa ss/wörd!'()*~";
    let masker = Masker::new([("P", value)]);
    let cases = [
        percent(value.as_bytes(), true, false, b""),
        percent(value.as_bytes(), false, false, b""),
        percent(value.as_bytes(), true, true, b""),
        percent(value.as_bytes(), true, false, b"!'()*"),
        hex::encode(value),
        hex::encode_upper(value),
    ];
    for case in &cases {
        assert_eq!(masker.mask_known(case), "[secret:P]", "{case}");
    }
    check(
        &masker,
        &cases.iter().map(String::as_str).collect::<Vec<_>>(),
        expect![[r#"
            pa%20ss%2Fw%C3%B6rd%21%27%28%29%2A~
              => [secret:P]
            pa%20ss%2fw%c3%b6rd%21%27%28%29%2a~
              => [secret:P]
            pa+ss%2Fw%C3%B6rd%21%27%28%29%2A~
              => [secret:P]
            pa%20ss%2Fw%C3%B6rd!'()*~
              => [secret:P]
            70612073732f77c3b67264212728292a7e
              => [secret:P]
            70612073732F77C3B67264212728292A7E
              => [secret:P]
        "#]],
    );
}

#[test]
fn overlapping_and_duplicate_secrets() {
    let masker = Masker::new([
        ("A", "abcdef123456"),
        ("B", "123456ghijkl"),
        ("C", "token-value-1"),
        ("D", "token-value-1-extended"),
        ("Z_SAME", "shared-value-9"),
        ("E_SAME", "shared-value-9"),
    ]);
    check(
        &masker,
        &[
            // Overlapping: one region, the longest match names it (a tie: the smallest name).
            "abcdef123456ghijkl",
            "abcdef123456ghijklmn",
            // One inside the other: the longer.
            "x token-value-1-extended y",
            "x token-value-1 y",
            // One value under two names: the smallest name, always.
            "shared-value-9",
            // Adjacent, not overlapping: two.
            "abcdef123456token-value-1",
        ],
        expect![[r#"
            abcdef123456ghijkl
              => [secret:A]
            abcdef123456ghijklmn
              => [secret:A]mn
            x token-value-1-extended y
              => x [secret:D] y
            x token-value-1 y
              => x [secret:C] y
            shared-value-9
              => [secret:E_SAME]
            abcdef123456token-value-1
              => [secret:A][secret:C]
        "#]],
    );
}

#[test]
fn short_values_and_empty_maskers() {
    let masker = Masker::new([("SHORT", "abc12"), ("EMPTY", ""), ("OK", "abc123")]);
    assert_eq!(masker.mask_known("abc12 abc123"), "abc12 [secret:OK]");
    let only_short = Masker::new([("SHORT", "12345")]);
    assert!(only_short.is_empty());
    assert_eq!(only_short.longest(), 0);
    assert!(matches!(only_short.mask_known("12345"), Cow::Borrowed(_)));
    let none = Masker::default();
    assert!(none.is_empty());
    // The detector still runs.
    assert_eq!(
        none.mask("token ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"),
        "token [secret]"
    );
    assert!(matches!(none.mask("plain text"), Cow::Borrowed(_)));
    assert_eq!("abc123".len(), MIN_MASKED_LEN);
}

#[test]
fn debug_never_prints_values() {
    let masker = Masker::new([("DB_PASSWORD", "hunter2-very-secret")]);
    let mut stream = StreamMasker::new(masker.clone());
    assert_eq!(stream.push("the password hunter2-very-sec"), "");
    let debug = format!("{masker:?} {stream:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(debug.contains("DB_PASSWORD"), "{debug}");
}

#[test]
fn bounds() {
    // Past MAX_SECRETS, the rest (by name) are ignored and counted.
    let many: Vec<(String, String)> = (0..MAX_SECRETS + 3)
        .map(|i| (format!("S{i:05}"), format!("value-number-{i:05}")))
        .collect();
    let masker = Masker::new(many);
    assert_eq!(masker.ignored(), 3);
    assert_eq!(masker.mask_known("value-number-00000"), "[secret:S00000]");
    assert_eq!(
        masker.mask_known(&format!("value-number-{:05}", MAX_SECRETS + 2)),
        format!("value-number-{:05}", MAX_SECRETS + 2)
    );
    // A long value is masked in pieces; the longest pattern is a piece URL-encoded.
    let mut seed = 7u64;
    let long: String = (0..MAX_PIECE_LEN * 2 + 100)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            char::from(b'a' + ((seed >> 33) % 26) as u8)
        })
        .collect();
    let masker = Masker::new([("LONG", long.as_str())]);
    let masked = masker.mask_known(&long);
    assert!(!masked.contains(&long[..MIN_MASKED_LEN * 2]), "{masked}");
    assert_eq!(masked.matches("[secret:LONG]").count(), 3);
    assert!(masker.longest() <= 2 * (MAX_PIECE_LEN + MIN_MASKED_LEN));
    // 40-char values: the longest pattern is their URL encoding, hex (80 bytes) at most.
    let masker = Masker::new([("T", "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0")]);
    assert_eq!(masker.longest(), 80);
}

/// Splits `text` at `cuts` (byte positions, char boundaries), streams it, and checks the
/// concatenation against `mask(text)` and that no single output shows `secret`.
fn stream(masker: &Masker, text: &str, cuts: &[usize], secret: &str) -> String {
    let mut stream = StreamMasker::new(masker.clone());
    let mut out = String::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&text.len())) {
        let piece = stream.push(&text[at..cut]);
        assert!(!piece.contains(secret), "{cuts:?}: {piece}");
        out.push_str(&piece);
        // Held back: at most the hold-back bounds.
        at = cut;
    }
    let rest = stream.finish();
    assert!(!rest.contains(secret), "{cuts:?}: {rest}");
    out.push_str(&rest);
    assert!(!out.contains(secret), "{cuts:?}: {out}");
    assert_eq!(out, masker.mask(text), "{cuts:?}");
    out
}

fn boundaries(text: &str) -> Vec<usize> {
    (1..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect()
}

#[test]
fn streams_split_at_every_byte_in_two_and_three_chunks() {
    let masker = masker();
    let texts = [
        format!("curl -H 'x: {TOKEN}' → ok"),
        format!("日本語🔑{TOKEN}é and {}", hex::encode(TOKEN)),
        TOKEN.to_string(),
    ];
    for text in &texts {
        let cuts = boundaries(text);
        for &i in &cuts {
            stream(&masker, text, &[i], TOKEN);
            for &j in cuts.iter().filter(|&&j| j > i) {
                stream(&masker, text, &[i, j], TOKEN);
            }
        }
    }
}

#[test]
fn streams_of_a_value_with_spaces() {
    // More words than the stream keeps together: only the known-secret hold-back and the
    // rule never to cut inside a masked region keep it whole.
    let value = "correct horse battery staple 42";
    let masker = Masker::new([("PHRASE", value)]);
    let text = format!("say {value} twice: {value}.");
    let cuts = boundaries(&text);
    for &i in &cuts {
        stream(&masker, &text, &[i], value);
        for &j in cuts.iter().filter(|&&j| j > i) {
            stream(&masker, &text, &[i, j], "battery staple");
        }
    }
    stream(&masker, &text, &cuts, "battery staple");
}

#[test]
fn streams_keep_detector_words_together() {
    let masker = Masker::default();
    let texts = [
        "Authorization: Bearer abc.def-123 then more words",
        "export GH=ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8 && git push",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\nnext",
        "key:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\ndone",
    ];
    for text in texts {
        for &i in &boundaries(text) {
            stream(&masker, text, &[i], "A1b2C3d4E5f6");
        }
        // Byte by byte.
        let cuts = boundaries(text);
        stream(&masker, text, &cuts, "A1b2C3d4E5f6");
    }
    // A multibyte secret, streamed one char at a time.
    let value = "pässwörd-ünïcode-42";
    let masker = Masker::new([("U", value)]);
    let text = format!("→{value}← and {}", b64(value.as_bytes(), false));
    let out = stream(&masker, &text, &boundaries(&text), value);
    assert_eq!(out, "→[secret:U]← and [secret:U]");
}

#[test]
fn stream_holds_back_only_what_it_must() {
    let masker = masker();
    let mut stream = StreamMasker::new(masker.clone());
    let text = "one two three four five six seven eight nine ten eleven twelve ";
    let text = text.repeat(10);
    let shown = stream.push(&text);
    // Held: the last three words (the detector's), not a known secret's length: no end of
    // the text is the start of a known secret.
    let held = text.len() - shown.len();
    assert_eq!(held, "ten eleven twelve ".len(), "{held}");
    assert!(shown.ends_with(' '), "{shown}");
    assert_eq!(shown + &stream.finish(), text);
    // Known secrets alone: nothing is held unless the end could still become one, and then
    // from where that start begins (a live terminal shows its last line at once).
    let known = Masker::new([("TOKEN", "s3cr3t-value-42")]);
    for (text, shown) in [
        ("line one\n", "line one\n"),
        ("line s3cr3t-val", "line "),
        // Whole, it still waits: it may begin a longer pattern of it.
        ("line s3cr3t-value-42", "line "),
        ("line s3cr3t-value-42.", "line [secret:TOKEN]."),
        ("line s3", "line "),
        ("line s4", "line s4"),
        ("ss3", "s"),
    ] {
        let mut stream = StreamMasker::known_only(known.clone());
        assert_eq!(stream.push(text), shown, "{text}");
    }
    // A long word is held whole (the detector judges words), up to STREAM_WORD_HOLD.
    let mut stream = StreamMasker::new(Masker::default());
    let word = "w".repeat(STREAM_WORD_HOLD / 2);
    assert_eq!(stream.push(&format!("a b c {word}")), "a ");
    let long = "w".repeat(STREAM_WORD_HOLD * 2);
    assert_eq!(
        stream.push(&long).len(),
        "b c ".len() + word.len() + STREAM_WORD_HOLD
    );
    assert_eq!(stream.finish(), "w".repeat(STREAM_WORD_HOLD));
}

#[test]
fn json_values_and_keys() {
    let masker = masker();
    let mut value = serde_json::json!({
        "out": format!("token is {TOKEN}"),
        TOKEN: "as a key",
        "list": [TOKEN, 1, null, {"n": "Bearer abc.def-123"}],
        "count": 3,
    });
    masker.mask_json(&mut value);
    expect![[r#"
        {
          "[secret:API_TOKEN]": "as a key",
          "count": 3,
          "list": [
            "[secret:API_TOKEN]",
            1,
            null,
            {
              "n": "Bearer [secret]"
            }
          ],
          "out": "token is [secret:API_TOKEN]"
        }"#]]
    .assert_eq(&serde_json::to_string_pretty(&value).unwrap());
}

#[test]
fn detector_masks() {
    let cases = [
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----\nMIIE (cut short)",
        "Authorization: Bearer abc.def",
        "authorization: bearer xyz",
        "curl -H \"Authorization: Basic dXNlcjpwYXNz\"",
        "Bearer Zx8Kq2Lm9Pw4Rt7Vn1",
        "key sk-ant-api03-0123456789abcdef end",
        "OPENAI_API_KEY=sk-proj-4f8Hq2Zt9Lm3Xw7Rv1Bn6Kc0Jd5Gs8Py",
        "stripe sk_live_51HqLyjWDarjtT1zdp7dc",
        "AKIAIOSFODNN7EXAMPLE and ASIAY34FZKBOKMUTVV7A",
        "token=ghp_0123456789abcdefghij.",
        "gho_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8 ghs_A1b2C3d4E5f6G7h8I9j0K1 ghu_A1b2C3d4E5f6G7h8I9j0K1",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
        "glpat-xYz12AbC-dEf34GhI56jK",
        "xoxb-1234-5678-abcdefghijkl xoxp-1234-5678-abcdefghijkl xapp-1-A0123-4567-abcdef",
        "//registry.npmjs.org/:_authToken=npm_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
        "key=AIzaSyD-1234567890abcdefghijklmnopqrstu",
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
        "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl!",
        "discord MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs",
        "telegram 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0",
        "git clone https://ana:hunter2@git.example.com/repo.git",
        "redis://:p4ss@cache:6379/0",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        "\"SecretAccessKey\": \"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\"",
        "SESSION=Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3Jf5Gs0Ay8Ue2Io4Q",
        "https://hooks.example.com/services/T0AB12CD3/B0CD45EF6/Xy7Zq1Wv3Ut5Sr7Qp9On1Ml3",
    ];
    let out: String = cases
        .iter()
        .map(|case| format!("{case}\n  => {}\n", mask_generic(case)))
        .collect();
    expect![[r#"
        -----BEGIN RSA PRIVATE KEY-----
        MIIEpAIBAAKCAQEA
        -----END RSA PRIVATE KEY-----
          => [secret]
        -----BEGIN PRIVATE KEY-----
        MIIE (cut short)
          => [secret]
        Authorization: Bearer abc.def
          => Authorization: Bearer [secret]
        authorization: bearer xyz
          => authorization: bearer [secret]
        curl -H "Authorization: Basic dXNlcjpwYXNz"
          => curl -H "Authorization: Basic [secret]"
        Bearer Zx8Kq2Lm9Pw4Rt7Vn1
          => Bearer [secret]
        key sk-ant-api03-0123456789abcdef end
          => key [secret] end
        OPENAI_API_KEY=sk-proj-4f8Hq2Zt9Lm3Xw7Rv1Bn6Kc0Jd5Gs8Py
          => OPENAI_API_KEY=[secret]
        stripe sk_live_51HqLyjWDarjtT1zdp7dc
          => stripe [secret]
        AKIAIOSFODNN7EXAMPLE and ASIAY34FZKBOKMUTVV7A
          => [secret] and [secret]
        token=ghp_0123456789abcdefghij.
          => token=[secret].
        gho_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8 ghs_A1b2C3d4E5f6G7h8I9j0K1 ghu_A1b2C3d4E5f6G7h8I9j0K1
          => [secret] [secret] [secret]
        github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz
          => [secret]
        glpat-xYz12AbC-dEf34GhI56jK
          => [secret]
        xoxb-1234-5678-abcdefghijkl xoxp-1234-5678-abcdefghijkl xapp-1-A0123-4567-abcdef
          => [secret] [secret] [secret]
        //registry.npmjs.org/:_authToken=npm_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8
          => //registry.npmjs.org/:_authToken=[secret]
        key=AIzaSyD-1234567890abcdefghijklmnopqrstu
          => key=[secret]
        hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789
          => [secret]
        jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl!
          => jwt [secret]!
        discord MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs
          => discord [secret]
        telegram 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw0
          => telegram [secret]
        git clone https://ana:hunter2@git.example.com/repo.git
          => git clone https://ana:[secret]@git.example.com/repo.git
        redis://:p4ss@cache:6379/0
          => redis://:[secret]@cache:6379/0
        aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY
          => aws_secret_access_key = [secret]
        "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
          => "SecretAccessKey": "[secret]"
        SESSION=Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3Jf5Gs0Ay8Ue2Io4Q
          => SESSION=[secret]
        https://hooks.example.com/services/T0AB12CD3/B0CD45EF6/Xy7Zq1Wv3Ut5Sr7Qp9On1Ml3
          => https://hooks.example.com/services/T0AB12CD3/B0CD45EF6/[secret]
    "#]].assert_eq(&out);
    for case in cases {
        assert!(matches!(mask_generic(case), Cow::Owned(_)), "{case}");
    }
}

#[test]
fn detector_leaves_ordinary_output_alone() {
    let image: String = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg"
        .repeat(3);
    let wrapped: String = (0..4)
        .map(|i| {
            format!(
                "{}\n",
                &format!("Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3Jf5Gs0Ay8Ue2Io4Q{i}").repeat(2)[..76]
            )
        })
        .collect::<String>()
        + "Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3Jf5==\n";
    let cases = [
        "commit 3f9a1c7e5b2d8f0a4c6e1b3d5f7a9c0e2b4d6f8a",
        "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "id 123e4567-e89b-12d3-a456-426614174000 and 123E4567-E89B-12D3-A456-426614174000",
        "/home/ana/.cache/api-Xq3v9ZpLk8Rt7Vn1Bc6Hd3Jf5/bin/python",
        "~/src/Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3Jf5Gs0/x.rs",
        "\"integrity\": \"sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg==\"",
        "checksum = \"c982642fa9e8606056828ee9a8505737230110bb1099153c79efe865c59d12ba\"",
        "   Compiling wuhu-core v0.1.0 (/work/core)\n    Finished `release` profile [optimized] target(s) in 41.20s",
        "target/release/deps/libwuhu_core-1a2b3c4d5e6f7a8b.rlib",
        "warning: unused variable: `responseHeaderTimeout2`",
        "sk-learn-compatibility and sk-short",
        "a Bearer token is sent in the header",
        "ASIA is a continent; AKIA alone",
        "npm_config_cache_dir_2024",
        "https://registry.npmjs.org/ and git@github.com:org/repo.git",
        "https://ana@github.com/org/repo",
        "node-v18.17.1-linux-x64 ec2-54-123-45-67.eu-west-1.compute.amazonaws.com",
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----",
        "_ZN4core3fmt9Formatter3pad17h1a2b3c4d5e6f7a8bE",
        "to 0x5aAeb6053F3E94C9b9A09f33669435E7Ef1BeAed and 0xdbF03B407c01E7cD3CBea99509d93f8DDDC8C6FB",
        "PATH=/usr/local/bin:/usr/bin:/bin LANG=en_US.UTF-8",
        "eyJ alone",
        "[secret:API_TOKEN] stays",
        "{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"tool_use_id\":\"toolu_01A09q90qw90lq917835lq9\"}",
        "call_Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3 chatcmpl-Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3 req_011CQZx8Kq2Lm9Pw4Rt7",
        "https://user:[secret:PASS]@host/",
    ];
    for case in cases {
        assert_eq!(mask_generic(case), case, "{case}");
    }
    let blob = format!("data:image/png;base64,{image}");
    assert_eq!(mask_generic(&blob), blob);
    assert_eq!(mask_generic(&wrapped), wrapped);
}

#[test]
fn random_words() {
    let cases = [
        ("Zx8Kq2Lm9Pw4Rt7Vn1Bc", true),
        ("x8Kq2Lm9Pw4Rt7Vn1Bc", false),
        ("/Zx8Kq2Lm9Pw4Rt7Vn1Bc", false),
        ("zx8kq2lm9pw4rt7vn1bcx", false),
        ("ZXKQLMPWRTVNBCHDJFGSAYUEIOQ", false),
        ("3f9a1c7e5b2d8f0a4c6e1b3d5f7a9c0e2b4d6f8a", false),
        ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaA1", false),
        ("responseHeaderTimeout2", false),
        ("Base64ImageDecoderV2Impl", false),
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", true),
        // A label and a hex id, as tests and build systems print them; the same length of
        // random base62 is still random.
        ("MARK3f9a1c2e-00038001", false),
        ("BUILD1f2e3d4c5b6a_0007", false),
        ("MARK3f9a1c2E-00038001", true),
        ("Mz3f9a1c2eQ0003800Kx1", true),
    ];
    for (word, random) in cases {
        assert_eq!(is_random_word(word), random, "{word}");
    }
    assert_eq!("Zx8Kq2Lm9Pw4Rt7Vn1Bc".len(), MIN_RANDOM_WORD_LEN);
    let long = "Zx8Kq2Lm9Pw4Rt7Vn1Bc".repeat(7);
    assert!(long.len() > MAX_RANDOM_WORD_LEN);
    assert!(!is_random_word(&long));
}

#[test]
fn every_prefix_is_found() {
    for p in PREFIXES {
        let tail = if (p.tail)(b'a') {
            "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
        } else {
            "A1B2C3D4E5F6G7H8I9J0K1L2M3N4O5P6Q7R8"
        };
        let token = format!("{}{tail}", p.prefix);
        assert_eq!(prefixed_token(&token), Some(token.len()), "{token}");
    }
}
