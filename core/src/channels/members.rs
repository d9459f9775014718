//! Members: which platform user is which Wuhu person.
//!
//! An admin maps a platform user id (`U123` on Slack, a Telegram or Discord user id, a generic
//! `user`) to a Wuhu `sub` through `/v1/channels/:id/members`. A mapped person's messages are
//! authored as their `sub`, so the sessions they start are theirs (their own Mac runner counts
//! as theirs) and the approvals they click count as theirs. Everyone else stays
//! `<platform>:<id>` ([`super::platform_identity`]).

use serde::{Deserialize, Serialize};

use super::Platform;

/// At most this many members per binding (a `PUT` replaces the whole list).
pub const MAX_MEMBERS_PER_BINDING: usize = 1_000;

/// At most this many bytes in a platform user id.
pub const MAX_USER_ID_BYTES: usize = 128;

/// One platform user mapped to a Wuhu person.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The platform's user id.
    pub user: String,
    /// The Wuhu identity (a token's `sub`) the user acts as.
    pub sub: String,
}

/// The body of `PUT /v1/channels/:id/members` and of its `GET`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Members {
    /// Every mapped user.
    pub members: Vec<Member>,
}

/// Checks a `PUT` body for `platform`: bounded, no user twice, each `user` shaped as the
/// platform's ids are, each `sub` a valid Wuhu name. The error names the problem.
pub fn check(platform: Platform, members: &Members) -> Result<(), String> {
    if members.members.len() > MAX_MEMBERS_PER_BINDING {
        return Err(format!(
            "at most {MAX_MEMBERS_PER_BINDING} members per channel"
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for member in &members.members {
        check_user(platform, &member.user)?;
        if !crate::authority::valid_name(&member.sub) {
            return Err(format!(
                "member `{}`: `sub` must be a Wuhu name (letters, digits, `_.@+-`)",
                member.user
            ));
        }
        if !seen.insert(member.user.as_str()) {
            return Err(format!("member `{}` is listed twice", member.user));
        }
    }
    Ok(())
}

fn check_user(platform: Platform, user: &str) -> Result<(), String> {
    if user.is_empty() || user.len() > MAX_USER_ID_BYTES {
        return Err(format!(
            "a member's `user` must be 1 to {MAX_USER_ID_BYTES} bytes"
        ));
    }
    let shaped = match platform {
        // Slack ids are upper-case letters and digits (`U123`, `W123`).
        Platform::Slack => user
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()),
        // Telegram user ids and Discord snowflakes are numbers.
        Platform::Telegram | Platform::Discord => user.bytes().all(|b| b.is_ascii_digit()),
        // The generic hook takes the same characters as a token's `sub` (see `generic`).
        Platform::Generic => crate::authority::valid_name(user),
    };
    if shaped {
        Ok(())
    } else {
        Err(format!(
            "member `{}` is not a {} user id",
            user.escape_debug(),
            platform.as_str()
        ))
    }
}

/// Who a platform user is in Wuhu: the mapped `sub`, else `<platform>:<id>`.
pub fn identity(platform: Platform, user: &str, mapped: Option<&str>) -> String {
    match mapped {
        Some(sub) if crate::authority::valid_name(sub) => sub.to_string(),
        _ => super::platform_identity(platform, user),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(pairs: &[(&str, &str)]) -> Members {
        Members {
            members: pairs
                .iter()
                .map(|(user, sub)| Member {
                    user: user.to_string(),
                    sub: sub.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn identity_is_the_mapped_sub_else_the_platform_id() {
        let table: &[(Platform, &str, Option<&str>, &str)] = &[
            (Platform::Slack, "U1", Some("alice"), "alice"),
            (Platform::Slack, "U1", None, "slack:U1"),
            (
                Platform::Telegram,
                "1001",
                Some("bob@example.com"),
                "bob@example.com",
            ),
            (Platform::Telegram, "1001", None, "telegram:1001"),
            (Platform::Discord, "90001", Some("carol"), "carol"),
            (Platform::Discord, "90001", None, "discord:90001"),
            (Platform::Generic, "person1", Some("dan"), "dan"),
            (Platform::Generic, "person1", None, "generic:person1"),
            // A stored sub that is not a name (never written so) falls back, never widens.
            (Platform::Slack, "U1", Some("slack:U2"), "slack:U1"),
            (Platform::Slack, "U1", Some(""), "slack:U1"),
        ];
        for (platform, user, mapped, want) in table {
            assert_eq!(
                identity(*platform, user, *mapped),
                *want,
                "{platform:?} {user} {mapped:?}"
            );
        }
    }

    #[test]
    fn check_accepts_platform_ids_and_names_and_refuses_the_rest() {
        /// A platform, a member list, and the error it gives (`None`: accepted).
        type Case<'a> = (Platform, &'a [(&'a str, &'a str)], Option<&'a str>);
        let table: &[Case] = &[
            (Platform::Slack, &[("U123", "alice"), ("W9", "bob")], None),
            (Platform::Telegram, &[("1001", "alice")], None),
            (Platform::Discord, &[("900000000000000001", "alice")], None),
            (Platform::Generic, &[("person1", "alice")], None),
            (Platform::Slack, &[], None),
            (
                Platform::Slack,
                &[("u123", "alice")],
                Some("not a slack user id"),
            ),
            (
                Platform::Telegram,
                &[("@alice", "alice")],
                Some("not a telegram user id"),
            ),
            (
                Platform::Discord,
                &[("-1", "alice")],
                Some("not a discord user id"),
            ),
            (
                Platform::Generic,
                &[("a\nb", "alice")],
                Some("not a generic user id"),
            ),
            (Platform::Slack, &[("", "alice")], Some("1 to 128 bytes")),
            (
                Platform::Slack,
                &[("U1", "slack:U2")],
                Some("must be a Wuhu name"),
            ),
            (Platform::Slack, &[("U1", "")], Some("must be a Wuhu name")),
            (
                Platform::Slack,
                &[("U1", "a"), ("U1", "b")],
                Some("listed twice"),
            ),
        ];
        for (platform, pairs, want) in table {
            let result = check(*platform, &members(pairs));
            match want {
                None => assert_eq!(result, Ok(()), "{platform:?} {pairs:?}"),
                Some(text) => {
                    let error = result.expect_err(&format!("{platform:?} {pairs:?}"));
                    assert!(error.contains(text), "{platform:?} {pairs:?}: {error}");
                }
            }
        }
        let long = "1".repeat(MAX_USER_ID_BYTES + 1);
        assert!(check(Platform::Telegram, &members(&[(&long, "a")])).is_err());
        let at_bound: Vec<(String, String)> = (0..MAX_MEMBERS_PER_BINDING)
            .map(|i| (format!("U{i}"), format!("p{i}")))
            .collect();
        let mut list = Members {
            members: at_bound
                .iter()
                .map(|(user, sub)| Member {
                    user: user.clone(),
                    sub: sub.clone(),
                })
                .collect(),
        };
        assert_eq!(check(Platform::Slack, &list), Ok(()));
        list.members.push(Member {
            user: "UX".into(),
            sub: "x".into(),
        });
        assert!(
            check(Platform::Slack, &list)
                .unwrap_err()
                .contains("at most 1000")
        );
    }
}
