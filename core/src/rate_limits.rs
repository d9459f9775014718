//! Rate limits per tenant and per person: creating sessions, enqueueing messages, the js tool's
//! `fetch`, and sessions created by chat channels.
//!
//! Each limit is one of Cloudflare's Rate Limiting bindings (`[[ratelimits]]` in
//! `wrangler.toml`: a number of calls per 10 or 60 seconds, counted per key in each Cloudflare
//! location, with no Durable Object on the path). This module decides which bindings an action
//! consults and under which keys; the host asks each binding and refuses the action (`429
//! rate_limited`, `Retry-After`) when any says no. The limits and their periods are in
//! `wrangler.toml` and docs/api.md ("Rate limits").

/// What is limited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateAction {
    /// `POST /v1/sessions` (and a fork): a person creates a session.
    CreateSession,
    /// A message enqueued (HTTP, the session socket, a chat channel).
    Enqueue,
    /// One `fetch` of a `js` script.
    JsFetch,
    /// A session a chat channel creates for a thread.
    ChannelSession,
}

/// Whom a limit counts together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Everyone of the tenant.
    Tenant,
    /// One person of the tenant (or one chat binding, for channel sessions).
    User,
}

/// One limit: a Rate Limiting binding of the Worker, and its period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// The binding's name in `wrangler.toml`.
    pub binding: &'static str,
    /// Whom it counts together.
    pub scope: Scope,
    /// Its period in seconds (10 or 60): a refused caller may try again after it.
    pub period_secs: u32,
}

const fn limit(binding: &'static str, scope: Scope, period_secs: u32) -> RateLimit {
    RateLimit {
        binding,
        scope,
        period_secs,
    }
}

const CREATE_SESSION: [RateLimit; 2] = [
    limit("RL_CREATE_USER", Scope::User, 10),
    limit("RL_CREATE_TENANT", Scope::Tenant, 10),
];
const ENQUEUE: [RateLimit; 2] = [
    limit("RL_ENQUEUE_USER", Scope::User, 10),
    limit("RL_ENQUEUE_TENANT", Scope::Tenant, 10),
];
const JS_FETCH: [RateLimit; 2] = [
    limit("RL_FETCH_USER", Scope::User, 10),
    limit("RL_FETCH_TENANT", Scope::Tenant, 10),
];
const CHANNEL_SESSION: [RateLimit; 2] = [
    limit("RL_CHANNEL_SESSIONS_BINDING", Scope::User, 60),
    limit("RL_CHANNEL_SESSIONS_TENANT", Scope::Tenant, 60),
];

/// The limits `action` must pass, person first.
pub fn limits(action: RateAction) -> &'static [RateLimit] {
    match action {
        RateAction::CreateSession => &CREATE_SESSION,
        RateAction::Enqueue => &ENQUEUE,
        RateAction::JsFetch => &JS_FETCH,
        RateAction::ChannelSession => &CHANNEL_SESSION,
    }
}

/// The key a limit counts under: `t/<tenant>`, or `u/<tenant>/<who>` (a person's `sub`, or a
/// chat binding's id for channel sessions). Tenants and subs hold no `/`
/// (`authority::valid_name`), so keys of different tenants or people never meet.
pub fn key(limit: &RateLimit, tenant: &str, who: &str) -> String {
    match limit.scope {
        Scope::Tenant => format!("t/{tenant}"),
        Scope::User => format!("u/{tenant}/{who}"),
    }
}

/// The variable that turns the limits off (`WUHU_RATE_LIMITS=off`: the benchmarks and the
/// end-to-end harness, which drive thousands of calls as one person on purpose).
pub const SWITCH_VAR: &str = "WUHU_RATE_LIMITS";

/// Whether limits apply, from [`SWITCH_VAR`]'s value (on unless it says `off`).
pub fn enabled(var: Option<&str>) -> bool {
    !matches!(var.map(str::trim), Some("off"))
}

/// The `429 rate_limited` message for a refused `action`.
pub fn message(action: RateAction, limit: &RateLimit) -> String {
    let what = match action {
        RateAction::CreateSession => "sessions created",
        RateAction::Enqueue => "messages sent",
        RateAction::JsFetch => "js fetches",
        RateAction::ChannelSession => "sessions started from chat",
    };
    let whose = match (action, limit.scope) {
        (_, Scope::Tenant) => "the tenant",
        (RateAction::ChannelSession, Scope::User) => "this channel",
        (_, Scope::User) => "you",
    };
    format!(
        "too many {what} by {whose}: try again in {} seconds",
        limit.period_secs
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_action_counts_per_person_then_per_tenant_under_keys_that_never_meet() {
        let cases = [
            (
                RateAction::CreateSession,
                "RL_CREATE_USER",
                "RL_CREATE_TENANT",
            ),
            (RateAction::Enqueue, "RL_ENQUEUE_USER", "RL_ENQUEUE_TENANT"),
            (RateAction::JsFetch, "RL_FETCH_USER", "RL_FETCH_TENANT"),
            (
                RateAction::ChannelSession,
                "RL_CHANNEL_SESSIONS_BINDING",
                "RL_CHANNEL_SESSIONS_TENANT",
            ),
        ];
        for (action, user, tenant) in cases {
            let limits = limits(action);
            assert_eq!(limits.len(), 2, "{action:?}");
            assert_eq!((limits[0].binding, limits[0].scope), (user, Scope::User));
            assert_eq!(
                (limits[1].binding, limits[1].scope),
                (tenant, Scope::Tenant)
            );
            for limit in limits {
                assert!(matches!(limit.period_secs, 10 | 60), "{limit:?}");
            }
            assert_eq!(key(&limits[0], "acme", "alice"), "u/acme/alice");
            assert_eq!(key(&limits[1], "acme", "alice"), "t/acme");
            assert_ne!(
                key(&limits[0], "acme", "bob"),
                key(&limits[0], "acme", "alice")
            );
            assert_ne!(
                key(&limits[0], "acme2", "alice"),
                key(&limits[0], "acme", "alice")
            );
            assert!(message(action, &limits[0]).contains(&limits[0].period_secs.to_string()));
        }
    }

    /// Every binding named here is in `wrangler.toml`, with the same period.
    #[test]
    fn every_limit_is_a_binding_of_the_worker() {
        let config = include_str!("../../wrangler.toml");
        for action in [
            RateAction::CreateSession,
            RateAction::Enqueue,
            RateAction::JsFetch,
            RateAction::ChannelSession,
        ] {
            for limit in limits(action) {
                let block = config
                    .split("[[ratelimits]]")
                    .find(|block| block.contains(&format!("name = \"{}\"", limit.binding)))
                    .unwrap_or_else(|| panic!("{} is not in wrangler.toml", limit.binding));
                assert!(
                    block.contains(&format!("period = {} }}", limit.period_secs)),
                    "{}: {block}",
                    limit.binding
                );
            }
        }
    }

    #[test]
    fn limits_are_on_unless_switched_off() {
        for (var, on) in [
            (None, true),
            (Some(""), true),
            (Some("on"), true),
            (Some(" off "), false),
            (Some("off"), false),
        ] {
            assert_eq!(enabled(var), on, "{var:?}");
        }
    }
}
