//! Who a binding lets in: mapped members, guests, and strangers it refuses (decision 0035).
//!
//! Anyone who can message a bot can reach its binding, so a platform user is not a member of
//! the tenant just by writing. Each delivery is first checked against where it comes from
//! ([`Origin`]): a Slack binding serves one workspace and one app ([`check_pin`]). Then its
//! author is one of three ([`admit`]):
//!
//! - a **member**: a platform user an admin mapped to a person (`/v1/channels/:id/members`),
//!   with that person's rights, on every binding whatever its `admit`;
//! - a **guest**: an unmapped user the binding's [`Admit`] lets in (`allowlist`: the chat,
//!   guild or team is listed; `anyone`: everyone). A guest is `<platform>:<id>`
//!   ([`crate::authority::is_guest`]): no runner, no other session, the workspace only under
//!   `channels/<binding id>/`, no js egress (`authority::TurnRights`), and a quota of its own
//!   ([`GuestQuota`], [`within_quota`]);
//! - a **stranger**: everyone else. Their message starts and enqueues nothing; a message that
//!   addresses the bot is answered with the binding's `refusal`, at most once per person per
//!   [`NOTICE_INTERVAL_SECS`] ([`notice_due`]).
//!
//! Everything here is pure: the binding's actor looks up the facts (the member list, the
//! counts of the last hour) and performs what these rules decide.

use serde::{Deserialize, Serialize};

use super::Platform;

/// Whom a binding admits besides its mapped members.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Admit {
    /// Mapped members only (the default, also of bindings stored before `admit` existed).
    #[default]
    Mapped,
    /// Also the unmapped users of the chats, guilds or teams in the binding's `allowlist`, as
    /// guests.
    Allowlist,
    /// Also every unmapped user, as a guest: an explicit opt-in.
    Anyone,
}

impl Admit {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Admit::Mapped => "mapped",
            Admit::Allowlist => "allowlist",
            Admit::Anyone => "anyone",
        }
    }
}

/// Most ids in a binding's `allowlist`.
pub const MAX_ALLOWLIST: usize = 1_000;
/// Longest id in an `allowlist` (and a Slack `teamId`, `apiAppId`, `enterpriseId`), in bytes.
pub const MAX_PLACE_ID_BYTES: usize = 32;
/// Longest `refusal`, in characters.
pub const MAX_REFUSAL_CHARS: usize = 500;
/// How often one person is told they are refused (or over their quota): once an hour, so a
/// stranger writing a hundred messages gets one answer, and the bot cannot be made to spam.
pub const NOTICE_INTERVAL_SECS: i64 = 3_600;
/// Most people a binding remembers having told in the last [`NOTICE_INTERVAL_SECS`]; past it
/// nobody new is told until the oldest are forgotten (the answer is a courtesy; its bound keeps
/// strangers from growing the binding's storage or its outbox).
pub const MAX_NOTICED: usize = 10_000;
/// The window of a guest quota: an hour.
pub const QUOTA_WINDOW_SECS: i64 = 3_600;

/// What a stranger is told when the binding has no `refusal` of its own.
pub const DEFAULT_REFUSAL: &str = "Sorry, I only answer people an admin of this Wuhu has added. Ask one to map your account to theirs.";

/// The default `refusal` (serde's default for bindings stored before it existed).
pub fn default_refusal() -> String {
    DEFAULT_REFUSAL.to_string()
}

/// How much guests may do on one binding, per hour: each guest, and all of them together.
/// A message that starts a session counts as a session and as a message. Mapped members are
/// not counted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GuestQuota {
    /// Sessions one guest may start per hour (default 3).
    #[serde(default = "default_sessions")]
    pub sessions_per_hour: u32,
    /// Messages one guest may send per hour (default 20).
    #[serde(default = "default_messages")]
    pub messages_per_hour: u32,
    /// Sessions all guests together may start per hour (default 30).
    #[serde(default = "default_all_sessions")]
    pub all_guests_sessions_per_hour: u32,
    /// Messages all guests together may send per hour (default 200).
    #[serde(default = "default_all_messages")]
    pub all_guests_messages_per_hour: u32,
}

fn default_sessions() -> u32 {
    3
}
fn default_messages() -> u32 {
    20
}
fn default_all_sessions() -> u32 {
    30
}
fn default_all_messages() -> u32 {
    200
}

impl Default for GuestQuota {
    fn default() -> Self {
        GuestQuota {
            sessions_per_hour: default_sessions(),
            messages_per_hour: default_messages(),
            all_guests_sessions_per_hour: default_all_sessions(),
            all_guests_messages_per_hour: default_all_messages(),
        }
    }
}

/// Largest `sessionsPerHour` (each guest or all together).
pub const MAX_QUOTA_SESSIONS: u32 = 1_000;
/// Largest `messagesPerHour` (each guest or all together). With [`MAX_QUOTA_SESSIONS`] it
/// bounds what a binding keeps to count: one row per admitted guest message of the last hour.
pub const MAX_QUOTA_MESSAGES: u32 = 10_000;

impl GuestQuota {
    /// Checks the bounds.
    ///
    /// # Errors
    /// A message for a 400 naming the field.
    pub fn check(&self) -> Result<(), String> {
        for (name, value, max) in [
            (
                "guestQuota.sessionsPerHour",
                self.sessions_per_hour,
                MAX_QUOTA_SESSIONS,
            ),
            (
                "guestQuota.allGuestsSessionsPerHour",
                self.all_guests_sessions_per_hour,
                MAX_QUOTA_SESSIONS,
            ),
            (
                "guestQuota.messagesPerHour",
                self.messages_per_hour,
                MAX_QUOTA_MESSAGES,
            ),
            (
                "guestQuota.allGuestsMessagesPerHour",
                self.all_guests_messages_per_hour,
                MAX_QUOTA_MESSAGES,
            ),
        ] {
            if value > max {
                return Err(format!("{name} must be 0 to {max}"));
            }
        }
        Ok(())
    }
}

/// Where a delivery comes from, as the platform says: what a Slack binding's pin and any
/// binding's `allowlist` are checked against. Read from the verified body
/// (`slack::origin`, `telegram::origin`, `discord::origin`, `gateway::origin`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    /// Slack: the workspace the delivery is for (`team_id`).
    pub team: Option<String>,
    /// Slack: the app it is for (`api_app_id`).
    pub app: Option<String>,
    /// Slack: the Enterprise Grid organisation (`enterprise_id`), when there is one.
    pub enterprise: Option<String>,
    /// What an `allowlist` names: a Telegram chat id, a Discord guild id (none in a direct
    /// message), the Slack team of the person (`user_team`, else `team_id`: a Slack Connect
    /// guest's own workspace, not the host's).
    pub place: Option<String>,
}

/// What a Slack binding's pin says of a delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pin {
    /// From the pinned workspace and app (or not Slack, or a delivery that acts on nothing,
    /// like `url_verification`).
    Pass,
    /// A binding stored before pins existed: pin this delivery's workspace and app, then pass.
    PinFirst {
        /// `team_id`.
        team: String,
        /// `api_app_id`.
        app: String,
        /// `enterprise_id`.
        enterprise: Option<String>,
    },
    /// Another workspace or app (or one that does not say): refused, nothing done.
    Refuse(String),
}

/// The Slack pin of a binding: `(teamId, apiAppId, enterpriseId)`.
pub type SlackPin<'a> = (Option<&'a str>, Option<&'a str>, Option<&'a str>);

/// Whether a delivery with `origin` may act on a binding of `platform` pinned to `pin`;
/// `acts` says whether it would (a message, a command, a click: not `url_verification` or an
/// ignored event). Only Slack pins: its signing secret is the app's, so one app installed in
/// several workspaces (or reached through Slack Connect) signs them all alike. A delivery that
/// acts and does not name its workspace and app is refused (Slack always names them).
pub fn check_pin(platform: Platform, pin: SlackPin<'_>, origin: &Origin, acts: bool) -> Pin {
    if platform != Platform::Slack || !acts {
        return Pin::Pass;
    }
    let (team, app, enterprise) = pin;
    let (Some(team), Some(app)) = (team, app) else {
        return match (&origin.team, &origin.app) {
            (Some(team), Some(app)) => Pin::PinFirst {
                team: team.clone(),
                app: app.clone(),
                enterprise: origin.enterprise.clone(),
            },
            _ => Pin::Refuse("a Slack delivery without team_id or api_app_id".into()),
        };
    };
    if origin.team.as_deref() != Some(team) {
        return Pin::Refuse(format!(
            "a delivery for Slack workspace {:?}; this binding serves {team}",
            origin.team.as_deref().unwrap_or_default()
        ));
    }
    if origin.app.as_deref() != Some(app) {
        return Pin::Refuse(format!(
            "a delivery for Slack app {:?}; this binding is app {app}",
            origin.app.as_deref().unwrap_or_default()
        ));
    }
    if let Some(enterprise) = enterprise
        && origin.enterprise.as_deref() != Some(enterprise)
    {
        return Pin::Refuse(format!(
            "a delivery for Enterprise Grid {:?}; this binding serves {enterprise}",
            origin.enterprise.as_deref().unwrap_or_default()
        ));
    }
    Pin::Pass
}

/// Who a delivery's author is to the binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Mapped to a person of the tenant: that person's rights.
    Member,
    /// Unmapped, admitted by the binding's `admit`: a guest's rights and quota.
    Guest,
    /// Unmapped and not admitted: nothing is started or enqueued.
    Stranger,
}

/// The standing of a delivery's author: `mapped` says whether an admin mapped them; `admit`
/// and `allowlist` are the binding's.
pub fn admit(mapped: bool, admit: Admit, allowlist: &[String], origin: &Origin) -> Standing {
    if mapped {
        return Standing::Member;
    }
    let admitted = match admit {
        Admit::Mapped => false,
        Admit::Anyone => true,
        Admit::Allowlist => origin
            .place
            .as_ref()
            .is_some_and(|place| allowlist.iter().any(|listed| listed == place)),
    };
    if admitted {
        Standing::Guest
    } else {
        Standing::Stranger
    }
}

/// What guests did on a binding in the last [`QUOTA_WINDOW_SECS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestUsage {
    /// Sessions this guest started.
    pub sessions: u32,
    /// Messages this guest sent.
    pub messages: u32,
    /// Sessions all guests started.
    pub all_sessions: u32,
    /// Messages all guests sent.
    pub all_messages: u32,
}

/// Which part of a [`GuestQuota`] a message would go past.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OverQuota {
    /// This guest's sessions.
    Sessions(u32),
    /// This guest's messages.
    Messages(u32),
    /// All guests' sessions.
    AllSessions(u32),
    /// All guests' messages.
    AllMessages(u32),
}

impl OverQuota {
    /// What the guest is told (a short reply; nothing is enqueued).
    pub fn text(self) -> String {
        match self {
            OverQuota::Sessions(n) => format!(
                "You have started {n} conversations with me this hour, the most a guest may. Try again later, or ask an admin to add you."
            ),
            OverQuota::Messages(n) => format!(
                "You have sent me {n} messages this hour, the most a guest may. Try again later, or ask an admin to add you."
            ),
            OverQuota::AllSessions(_) | OverQuota::AllMessages(_) => {
                "Guests have used all I may answer here this hour. Try again later, or ask an admin to add you.".to_string()
            }
        }
    }
}

/// Whether a guest's message fits `quota` given `usage`; `starts_session` says whether it
/// would start one (a thread without a session). The guest's own bounds are checked first, so
/// one busy guest is told about their own use.
///
/// # Errors
/// Which bound it would pass.
pub fn within_quota(
    quota: &GuestQuota,
    usage: GuestUsage,
    starts_session: bool,
) -> Result<(), OverQuota> {
    if starts_session && usage.sessions >= quota.sessions_per_hour {
        return Err(OverQuota::Sessions(quota.sessions_per_hour));
    }
    if usage.messages >= quota.messages_per_hour {
        return Err(OverQuota::Messages(quota.messages_per_hour));
    }
    if starts_session && usage.all_sessions >= quota.all_guests_sessions_per_hour {
        return Err(OverQuota::AllSessions(quota.all_guests_sessions_per_hour));
    }
    if usage.all_messages >= quota.all_guests_messages_per_hour {
        return Err(OverQuota::AllMessages(quota.all_guests_messages_per_hour));
    }
    Ok(())
}

/// Whether a person last told at `last_told` (unix seconds) may be told again at `now`.
pub fn notice_due(last_told: Option<i64>, now: i64) -> bool {
    last_told.is_none_or(|at| now - at >= NOTICE_INTERVAL_SECS)
}

/// Checks an `allowlist` for `platform`: bounded, no id twice, each shaped as the platform's
/// ids are (Telegram chat ids are integers, negative for groups; Discord guild ids are
/// snowflakes; Slack ids name a workspace, `T…`, or an Enterprise Grid, `E…`). A generic
/// binding has nothing to list: its sender is trusted with its users.
///
/// # Errors
/// A message for a 400.
pub fn check_allowlist(platform: Platform, allowlist: &[String]) -> Result<(), String> {
    if allowlist.len() > MAX_ALLOWLIST {
        return Err(format!("allowlist holds at most {MAX_ALLOWLIST} ids"));
    }
    if platform == Platform::Generic && !allowlist.is_empty() {
        return Err(
            "a generic binding has no allowlist: use admit mapped or anyone (its sender vouches for its users)"
                .into(),
        );
    }
    let mut seen = std::collections::HashSet::new();
    for id in allowlist {
        let shaped = !id.is_empty()
            && id.len() <= MAX_PLACE_ID_BYTES
            && match platform {
                Platform::Telegram => id.parse::<i64>().is_ok_and(|n| n.to_string() == *id),
                Platform::Discord => id.parse::<u64>().is_ok_and(|n| n.to_string() == *id),
                Platform::Slack => slack_id(id, &['T', 'E']),
                Platform::Generic => false,
            };
        if !shaped {
            let what = match platform {
                Platform::Telegram => "a Telegram chat id",
                Platform::Discord => "a Discord guild id",
                Platform::Slack => "a Slack team id (T…) or Enterprise Grid id (E…)",
                Platform::Generic => "an id",
            };
            return Err(format!(
                "allowlist entry {:?} is not {what}",
                id.escape_debug().to_string()
            ));
        }
        if !seen.insert(id.as_str()) {
            return Err(format!("allowlist names {id} twice"));
        }
    }
    Ok(())
}

/// Whether `id` is a Slack id starting with one of `prefixes`: upper-case letters and digits.
pub fn slack_id(id: &str, prefixes: &[char]) -> bool {
    id.len() >= 2
        && id.len() <= MAX_PLACE_ID_BYTES
        && id.starts_with(prefixes)
        && id
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
}

/// Checks a `refusal`: 1 to [`MAX_REFUSAL_CHARS`] characters, no control characters but line
/// breaks. Returns it trimmed.
///
/// # Errors
/// A message for a 400.
pub fn check_refusal(text: &str) -> Result<String, String> {
    let text = text.trim();
    if text.is_empty()
        || text.chars().count() > MAX_REFUSAL_CHARS
        || text.chars().any(|c| c.is_control() && c != '\n')
    {
        return Err(format!(
            "refusal must be 1 to {MAX_REFUSAL_CHARS} characters without control characters"
        ));
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(team: Option<&str>, app: Option<&str>, enterprise: Option<&str>) -> Origin {
        Origin {
            team: team.map(str::to_string),
            app: app.map(str::to_string),
            enterprise: enterprise.map(str::to_string),
            place: team.map(str::to_string),
        }
    }

    /// A Slack binding serves its workspace and app only; one stored before pins its first
    /// delivery's; nothing that acts passes without naming them.
    #[test]
    fn slack_deliveries_pass_only_from_the_pinned_workspace_and_app() {
        let pinned: SlackPin = (Some("T1"), Some("A1"), None);
        let grid: SlackPin = (Some("T1"), Some("A1"), Some("E1"));
        let unpinned: SlackPin = (None, None, None);
        // (pin, origin, want: "pass" | "pin" | "refuse")
        let cases = [
            (pinned, origin(Some("T1"), Some("A1"), None), "pass"),
            (pinned, origin(Some("T1"), Some("A1"), Some("E9")), "pass"),
            (pinned, origin(Some("T2"), Some("A1"), None), "refuse"),
            (pinned, origin(Some("T1"), Some("A2"), None), "refuse"),
            (pinned, origin(None, Some("A1"), None), "refuse"),
            (pinned, origin(Some("T1"), None, None), "refuse"),
            (pinned, origin(Some("t1"), Some("A1"), None), "refuse"),
            (pinned, origin(None, None, None), "refuse"),
            (grid, origin(Some("T1"), Some("A1"), Some("E1")), "pass"),
            (grid, origin(Some("T1"), Some("A1"), None), "refuse"),
            (grid, origin(Some("T1"), Some("A1"), Some("E2")), "refuse"),
            (unpinned, origin(Some("T7"), Some("A7"), None), "pin"),
            (unpinned, origin(Some("T7"), None, None), "refuse"),
            (unpinned, origin(None, None, None), "refuse"),
        ];
        for (pin, origin, want) in cases {
            // Nothing that does not act is refused (`url_verification` names no workspace).
            assert_eq!(check_pin(Platform::Slack, pin, &origin, false), Pin::Pass);
            let got = match check_pin(Platform::Slack, pin, &origin, true) {
                Pin::Pass => "pass",
                Pin::PinFirst { .. } => "pin",
                Pin::Refuse(_) => "refuse",
            };
            assert_eq!(got, want, "{pin:?} {origin:?}");
        }
        assert_eq!(
            check_pin(
                Platform::Slack,
                unpinned,
                &origin(Some("T7"), Some("A7"), Some("E7")),
                true
            ),
            Pin::PinFirst {
                team: "T7".into(),
                app: "A7".into(),
                enterprise: Some("E7".into())
            }
        );
        for platform in [Platform::Telegram, Platform::Discord, Platform::Generic] {
            assert_eq!(
                check_pin(platform, unpinned, &origin(Some("T2"), None, None), true),
                Pin::Pass
            );
        }
    }

    /// Members are members on every binding; unmapped users are guests only where `admit`
    /// lets them in; a direct message names no guild, so a Discord allowlist never admits it.
    #[test]
    fn who_is_member_guest_or_stranger() {
        use Standing::*;
        let listed = vec!["-100".to_string(), "G1".to_string()];
        let place = |p: Option<&str>| Origin {
            place: p.map(str::to_string),
            ..Origin::default()
        };
        // (mapped, admit, origin's place, want)
        let cases = [
            (true, Admit::Mapped, None, Member),
            (true, Admit::Allowlist, Some("-999"), Member),
            (true, Admit::Anyone, None, Member),
            (false, Admit::Mapped, Some("-100"), Stranger),
            (false, Admit::Allowlist, Some("-100"), Guest),
            (false, Admit::Allowlist, Some("G1"), Guest),
            (false, Admit::Allowlist, Some("-1000"), Stranger),
            (false, Admit::Allowlist, Some("-10"), Stranger),
            (false, Admit::Allowlist, None, Stranger),
            (false, Admit::Anyone, None, Guest),
            (false, Admit::Anyone, Some("-999"), Guest),
        ];
        for (mapped, how, at, want) in cases {
            assert_eq!(
                admit(mapped, how, &listed, &place(at)),
                want,
                "{mapped} {how:?} {at:?}"
            );
        }
        assert_eq!(
            admit(false, Admit::Allowlist, &[], &place(Some("-100"))),
            Stranger
        );
    }

    /// Each bound of a quota at, below and above it; a message that continues a thread is not
    /// counted against sessions.
    #[test]
    fn quotas_hold_at_every_bound() {
        let quota = GuestQuota {
            sessions_per_hour: 2,
            messages_per_hour: 5,
            all_guests_sessions_per_hour: 3,
            all_guests_messages_per_hour: 8,
        };
        let usage = |sessions, messages, all_sessions, all_messages| GuestUsage {
            sessions,
            messages,
            all_sessions,
            all_messages,
        };
        use OverQuota::*;
        // (usage, starts a session, want)
        let cases = [
            (usage(0, 0, 0, 0), true, Ok(())),
            (usage(1, 4, 2, 7), true, Ok(())),
            (usage(2, 0, 2, 2), true, Err(Sessions(2))),
            (usage(2, 0, 2, 2), false, Ok(())),
            (usage(0, 5, 0, 5), false, Err(Messages(5))),
            (usage(0, 5, 0, 5), true, Err(Messages(5))),
            (usage(0, 0, 3, 3), true, Err(AllSessions(3))),
            (usage(0, 0, 3, 3), false, Ok(())),
            (usage(0, 0, 0, 8), false, Err(AllMessages(8))),
            // The guest's own bound is told first.
            (usage(2, 5, 3, 8), true, Err(Sessions(2))),
        ];
        for (usage, starts, want) in cases {
            assert_eq!(
                within_quota(&quota, usage, starts),
                want,
                "{usage:?} {starts}"
            );
        }
        let none = GuestQuota {
            sessions_per_hour: 0,
            messages_per_hour: 0,
            all_guests_sessions_per_hour: 0,
            all_guests_messages_per_hour: 0,
        };
        assert_eq!(
            within_quota(&none, GuestUsage::default(), false),
            Err(Messages(0))
        );
        assert!(Sessions(3).text().contains("3 conversations"));
        assert!(!AllMessages(200).text().contains("200"));
    }

    /// Where each platform's deliveries come from, read from what the platforms send.
    #[test]
    fn origins_of_every_platform() {
        use serde_json::json;
        let slack_event = json!({"type":"event_callback","team_id":"T1","api_app_id":"A1","enterprise_id":"E1",
            "event":{"type":"app_mention","user":"U1","channel":"C1","ts":"1.0","text":"hi","user_team":"T9"}});
        let slack_plain = json!({"type":"event_callback","team_id":"T1","api_app_id":"A1",
            "event":{"type":"message","user":"U1","channel":"C1","ts":"1.0","text":"hi"}});
        let interaction = json!({"type":"block_actions","team":{"id":"T1"},"api_app_id":"A1","enterprise":null,
            "user":{"id":"U1","team_id":"T8"},"actions":[]});
        let form = |pairs: &[(&str, &str)]| {
            url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(pairs)
                .finish()
        };
        let clicked = form(&[("payload", &interaction.to_string())]);
        let slash = form(&[
            ("command", "/wuhu"),
            ("team_id", "T1"),
            ("api_app_id", "A1"),
            ("enterprise_id", ""),
        ]);
        let o = |team: Option<&str>,
                 app: Option<&str>,
                 enterprise: Option<&str>,
                 place: Option<&str>| Origin {
            team: team.map(str::to_string),
            app: app.map(str::to_string),
            enterprise: enterprise.map(str::to_string),
            place: place.map(str::to_string),
        };
        let json_type = "application/json";
        let form_type = "application/x-www-form-urlencoded";
        let cases = [
            (
                super::super::slack::origin(json_type, slack_event.to_string().as_bytes()),
                o(Some("T1"), Some("A1"), Some("E1"), Some("T9")),
            ),
            (
                super::super::slack::origin(json_type, slack_plain.to_string().as_bytes()),
                o(Some("T1"), Some("A1"), None, Some("T1")),
            ),
            (
                super::super::slack::origin(form_type, clicked.as_bytes()),
                o(Some("T1"), Some("A1"), None, Some("T8")),
            ),
            (
                super::super::slack::origin(form_type, slash.as_bytes()),
                o(Some("T1"), Some("A1"), None, Some("T1")),
            ),
            (
                super::super::slack::origin(
                    json_type,
                    br#"{"type":"url_verification","challenge":"c"}"#,
                ),
                Origin::default(),
            ),
            (
                super::super::slack::origin(json_type, b"not json"),
                Origin::default(),
            ),
            (
                super::super::telegram::origin(
                    br#"{"update_id":1,"message":{"chat":{"id":-1001},"text":"x"}}"#,
                ),
                o(None, None, None, Some("-1001")),
            ),
            (
                super::super::telegram::origin(
                    br#"{"update_id":1,"callback_query":{"message":{"chat":{"id":7}}}}"#,
                ),
                o(None, None, None, Some("7")),
            ),
            (
                super::super::discord::origin(br#"{"type":2,"guild_id":"900"}"#),
                o(None, None, None, Some("900")),
            ),
            (
                super::super::discord::origin(br#"{"type":2,"user":{"id":"1"}}"#),
                Origin::default(),
            ),
            (
                super::super::gateway::origin(&json!({"guild_id":"901"})),
                o(None, None, None, Some("901")),
            ),
            (
                super::super::gateway::origin(&json!({"channel_id":"D1"})),
                Origin::default(),
            ),
        ];
        for (i, (got, want)) in cases.into_iter().enumerate() {
            assert_eq!(got, want, "case {i}");
        }
    }

    #[test]
    fn a_person_is_told_once_an_hour() {
        assert!(notice_due(None, 100));
        assert!(!notice_due(Some(100), 100));
        assert!(!notice_due(Some(100), 100 + NOTICE_INTERVAL_SECS - 1));
        assert!(notice_due(Some(100), 100 + NOTICE_INTERVAL_SECS));
    }

    #[test]
    fn allowlists_are_shaped_as_each_platforms_ids() {
        let list = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // (platform, ids, error fragment or None)
        let cases: [(Platform, Vec<String>, Option<&str>); 14] = [
            (Platform::Telegram, list(&["-1001234", "42"]), None),
            (
                Platform::Telegram,
                list(&["chat"]),
                Some("Telegram chat id"),
            ),
            (Platform::Telegram, list(&["+42"]), Some("Telegram chat id")),
            (Platform::Telegram, list(&["042"]), Some("Telegram chat id")),
            (Platform::Discord, list(&["900000000000000001"]), None),
            (Platform::Discord, list(&["-1"]), Some("Discord guild id")),
            (Platform::Slack, list(&["T0123", "E9"]), None),
            (Platform::Slack, list(&["C0123"]), Some("Slack team id")),
            (Platform::Slack, list(&["t0123"]), Some("Slack team id")),
            (Platform::Slack, list(&["T"]), Some("Slack team id")),
            (Platform::Slack, list(&["T1", "T1"]), Some("twice")),
            (Platform::Slack, list(&[""]), Some("not")),
            (Platform::Generic, list(&["x"]), Some("no allowlist")),
            (Platform::Generic, list(&[]), None),
        ];
        for (platform, ids, want) in cases {
            let got = check_allowlist(platform, &ids);
            match want {
                None => assert_eq!(got, Ok(()), "{platform:?} {ids:?}"),
                Some(text) => {
                    let e = got.expect_err(&format!("{platform:?} {ids:?}"));
                    assert!(e.contains(text), "{platform:?} {ids:?}: {e}");
                }
            }
        }
        let at_bound: Vec<String> = (0..MAX_ALLOWLIST).map(|i| i.to_string()).collect();
        assert_eq!(check_allowlist(Platform::Telegram, &at_bound), Ok(()));
        let mut over = at_bound;
        over.push("-1".into());
        assert!(check_allowlist(Platform::Telegram, &over).is_err());
        let long = format!("T{}", "1".repeat(MAX_PLACE_ID_BYTES));
        assert!(check_allowlist(Platform::Slack, &[long]).is_err());
    }

    #[test]
    fn refusals_and_quotas_are_bounded() {
        assert_eq!(
            check_refusal("  Not you.\nSorry. ").unwrap(),
            "Not you.\nSorry."
        );
        assert!(check_refusal("").is_err());
        assert!(check_refusal("a\u{7}b").is_err());
        assert!(check_refusal(&"x".repeat(MAX_REFUSAL_CHARS)).is_ok());
        assert!(check_refusal(&"x".repeat(MAX_REFUSAL_CHARS + 1)).is_err());
        assert_eq!(GuestQuota::default().check(), Ok(()));
        let over = GuestQuota {
            all_guests_messages_per_hour: MAX_QUOTA_MESSAGES + 1,
            ..GuestQuota::default()
        };
        assert!(
            over.check()
                .unwrap_err()
                .contains("allGuestsMessagesPerHour")
        );
        let quota: GuestQuota = serde_json::from_str(r#"{"sessionsPerHour":1}"#).unwrap();
        assert_eq!((quota.sessions_per_hour, quota.messages_per_hour), (1, 20));
        assert!(serde_json::from_str::<GuestQuota>(r#"{"perDay":1}"#).is_err());
    }
}
