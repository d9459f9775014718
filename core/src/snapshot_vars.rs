//! Which environment variables an environment snapshot may capture (seed 004). A snapshot's
//! variables go into the transcript (the attach notice, every tool call's context) and object
//! storage, where every reader of the session sees them, so credentials must never be captured.
//!
//! A variable is captured only when its name is on [`SNAPSHOT_WHITELIST`] or in the
//! definition's `extraEnvVars`, **and** neither its name ([`is_secret_name`]) nor its value
//! ([`looks_like_credential`]) looks like a credential. `extraEnvVars` cannot lift either
//! rule. The rules are deliberately eager: a dropped harmless variable costs little, a captured
//! credential leaks.

/// Variables captured when present, plus the names an environment definition adds.
pub const SNAPSHOT_WHITELIST: [&str; 15] = [
    "PATH",
    "VIRTUAL_ENV",
    "NODE_ENV",
    "SHELL",
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TERM",
    "EDITOR",
    "PYTHONPATH",
    "NODE_PATH",
    "GOPATH",
    "CARGO_HOME",
    "RUSTUP_HOME",
];

/// Shortest word [`looks_like_credential`] judges by its entropy.
pub const MIN_SECRET_WORD_LEN: usize = crate::masking::MIN_RANDOM_WORD_LEN;
/// Bits per character (Shannon, over the word's own characters) from which a long word counts
/// as random. Random hex of 20+ characters measures about 3.7, random base64 about 4.3+;
/// English words and paths stay lower, and paths are not judged (they start with `/`).
pub const MIN_SECRET_WORD_ENTROPY: f64 = crate::masking::MIN_RANDOM_WORD_ENTROPY;

/// Whether a variable name looks like it holds a secret, case-insensitive: it contains `KEY`,
/// `SECRET`, `TOKEN`, `PASSWORD`, `PASSWD`, `CREDENTIAL` or `PRIVATE`, or one of its
/// `_`-separated parts is `PASS`, `PWD` (but not the shell's `PWD`/`OLDPWD`), `AUTH`, `COOKIE`,
/// `SESSION`, `DSN`, `JWT`, `PAT` or `CERT`.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if [
        "KEY",
        "SECRET",
        "TOKEN",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "PRIVATE",
    ]
    .iter()
    .any(|needle| upper.contains(needle))
    {
        return true;
    }
    if upper == "PWD" || upper == "OLDPWD" {
        return false;
    }
    upper.split('_').any(|part| {
        matches!(
            part,
            "PASS" | "PWD" | "AUTH" | "COOKIE" | "SESSION" | "DSN" | "JWT" | "PAT" | "CERT"
        )
    })
}

/// Whether a value looks like a credential: whatever the detector all masking shares finds
/// ([`crate::masking::contains_secret`]: private-key blocks, provider tokens, JWTs, URL
/// passwords, high-entropy words, …), and, more eagerly than masking (a dropped variable costs
/// little, and a value is judged alone): a URL with any userinfo (`scheme://user@host`), and any
/// word (split at dots, and at slashes in a URL) that [`is_random_word`] judges random, hex and
/// words of two character classes included.
pub fn looks_like_credential(value: &str) -> bool {
    if crate::masking::contains_secret(value) || has_url_userinfo(value) {
        return true;
    }
    // Dots separate version numbers and host names, never parts of one random token.
    let random = |w: &str| w.split('.').any(is_random_word);
    words(value).any(|word| {
        if word.starts_with("//") {
            // The rest of a URL (`//host/path`): judge each path segment.
            return word.split('/').any(random);
        }
        // Plain paths (`/x/y`, `~/x`, `./x`) are not judged: store paths with hashes are
        // common and harmless.
        !word.starts_with(['/', '~', '.']) && random(word)
    })
}

/// Whether any `scheme://authority` in `value` has userinfo (an `@` before the host).
fn has_url_userinfo(value: &str) -> bool {
    value.match_indices("://").any(|(at, sep)| {
        let rest = &value[at + sep.len()..];
        let authority = rest
            .split(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .next()
            .unwrap_or_default();
        authority.contains('@')
    })
}

/// Runs of token characters (`A-Z a-z 0-9 + / _ - . ~`).
fn words(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(|c: char| {
            !(c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '_' | '-' | '.' | '~'))
        })
        .filter(|w| !w.is_empty())
}

/// A word that looks random to a snapshot, more eagerly than to masking
/// ([`crate::masking::is_random_word`], which also counts): at least [`MIN_SECRET_WORD_LEN`]
/// characters of any length, not a path (does not start with `/`, `.` or `~`), at least two of
/// lowercase/uppercase/digits (so 40-character hex, a classic GitHub token, counts), and at
/// least [`MIN_SECRET_WORD_ENTROPY`] bits of entropy per character.
pub fn is_random_word(word: &str) -> bool {
    if crate::masking::is_random_word(word) {
        return true;
    }
    if word.len() < MIN_SECRET_WORD_LEN || word.starts_with(['/', '.', '~']) {
        return false;
    }
    let lower = word.bytes().any(|b| b.is_ascii_lowercase());
    let upper = word.bytes().any(|b| b.is_ascii_uppercase());
    let digit = word.bytes().any(|b| b.is_ascii_digit());
    if usize::from(lower) + usize::from(upper) + usize::from(digit) < 2 {
        return false;
    }
    crate::masking::entropy_per_char(word) >= MIN_SECRET_WORD_ENTROPY
}

/// Whether a snapshot captures variable `name` with `value`, given the definition's
/// `extra` names: whitelisted or listed, and neither name nor value looks like a credential.
pub fn may_capture(name: &str, value: &str, extra: &[String]) -> bool {
    (SNAPSHOT_WHITELIST.contains(&name) || extra.iter().any(|e| e == name))
        && !is_secret_name(name)
        && !looks_like_credential(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names() {
        for name in [
            "API_KEY",
            "apikey",
            "Secret",
            "x_token_y",
            "PASSWORD",
            "KEYCHAIN",
            "MYSQL_PWD",
            "DB_PASS",
            "NPM_CONFIG__AUTH",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "GH_PAT",
            "CI_JOB_JWT",
            "SESSION_COOKIE",
            "SENTRY_DSN",
            "SSH_PRIVATE",
            "CLIENT_CERT",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "PATH", "HOME", "TERM", "EDITOR", "PWD", "OLDPWD", "PATHEXT", "AUTHOR", "PASSAGE",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn credential_values() {
        let credentials = [
            "postgres://u:p@h/db",
            "https://user:pw@example.com",
            "redis://:hunter2@cache:6379/0",
            "mongodb+srv://ana@cluster0.example.net/?retryWrites=true",
            "http://proxy-user:secret@proxy:3128",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbmEifQ.c2lnbmF0dXJl",
            "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbmEifQ.c2lnbmF0dXJl",
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
            // 40 random alphanumerics; 40 hex (a classic GitHub token); AWS-style secret.
            "Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3Jf5Gs0Ay8Ue2Io4Q",
            "3f9a1c7e5b2d8f0a4c6e1b3d5f7a9c0e2b4d6f8a",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
            "https://hooks.example.com/services/T0AB12CD3/B0CD45EF6/Xy7Zq1Wv3Ut5Sr7Qp9On1Ml3",
            "sk-proj-4f8Hq2Zt9Lm3Xw7Rv1Bn6Kc0Jd5Gs8Py",
            // The shared detector's token shapes (crate::masking).
            "xoxb-1234-5678-abcdefghijkl",
            "AKIAIOSFODNN7EXAMPLE",
            "glpat-xYz12AbC-dEf34GhI56jK",
        ];
        for value in credentials {
            assert!(
                looks_like_credential(value),
                "{value:?} should look like a credential"
            );
        }
        let harmless = [
            "/usr/local/bin:/usr/bin:/bin",
            "/home/ana/.local/share/virtualenvs/api-Xq3v9ZpL/bin:/usr/bin",
            "/Users/ana/src/api/.venv",
            "en_US.UTF-8",
            "xterm-256color",
            "development",
            "vim",
            "/bin/zsh",
            "ana",
            "",
            "https://registry.npmjs.org/",
            "git@github.com:org/repo.git",
            "some words that are quite ordinary and long enough",
            "node-v18.17.1-linux-x64",
            "ec2-54-123-45-67.eu-west-1.compute.amazonaws.com",
            "C:\\Program Files\\Java\\jdk-17",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1",
        ];
        for value in harmless {
            assert!(
                !looks_like_credential(value),
                "{value:?} should not look like a credential"
            );
        }
    }

    #[test]
    fn word_bounds() {
        // Exactly at the length bound: judged; one shorter: not.
        let random = "Zx8Kq2Lm9Pw4Rt7Vn1Bc";
        assert_eq!(random.len(), MIN_SECRET_WORD_LEN);
        assert!(is_random_word(random));
        assert!(!is_random_word(&random[1..]));
        // A path of the same characters is not judged.
        assert!(!is_random_word(&format!("/{random}")));
    }

    #[test]
    fn capture_table() {
        let extra = vec![
            String::from("DATABASE_URL"),
            String::from("JAVA_HOME"),
            String::from("GITHUB_TOKEN"),
            String::from("SOME_ID"),
            String::from("CI_JOB_JWT"),
        ];
        let cases = [
            ("PATH", "/usr/bin", true),
            ("HOME", "/home/ana", true),
            ("JAVA_HOME", "/opt/jdk", true),
            ("RANDOM_THING", "x", false),
            // Listed, but the value is a credential: never.
            ("DATABASE_URL", "postgres://u:p@h/db", false),
            ("SOME_ID", "Zx8Kq2Lm9Pw4Rt7Vn1Bc6Hd3Jf5Gs0Ay8Ue2Io4Q", false),
            // Listed, but the name is secret-looking: never.
            ("GITHUB_TOKEN", "t", false),
            ("CI_JOB_JWT", "x", false),
            // Whitelisted, but the value is a credential.
            ("HOME", "https://u:p@h", false),
            ("DATABASE_URL", "postgres://h/db", true),
        ];
        for (name, value, want) in cases {
            assert_eq!(may_capture(name, value, &extra), want, "{name}={value}");
        }
    }
}
