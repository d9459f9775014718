//! The runner hub's connection rules, sans IO: what to do with a `hello` (welcome, refuse,
//! replace an older connection), and which sockets the liveness sweep drops. The worker's
//! `RunnerHub` gathers the facts (open sockets, known runners, the verified token, the clock),
//! calls these functions and performs the decisions.
//!
//! * A runner's owner is its token's `sub`, and its kind is its token's (`runnerKind: cloud`, or
//!   `local`), never what `hello` says; a mismatch is welcomed as the token's kind with a
//!   notice ([`HelloDecision::Welcome::notice`]).
//! * A runner name belongs to one user per tenant: while another user's runner of that name is
//!   connected, or was seen less than [`NAME_RESERVED_MS`] ago, a `hello` with that name is
//!   refused ([`codes::NAME_TAKEN`], permanent).
//! * No takeover: while a connection of the same owner and name is alive (heard from within
//!   [`TAKEOVER_SILENCE_MS`]), another `hello` with that name is refused
//!   ([`codes::NAME_IN_USE`], transient), so a stolen runner token cannot replace the real
//!   runner. A `hello` with `replace` (`wuhu-runner register --replace`) takes over: the old
//!   connection is told [`codes::REPLACED`] and closed. An older connection silent for longer
//!   is replaced without asking (it died without the hub noticing yet).
//! * Every `hello` field is bounded and checked ([`check_hello`]) before anything is stored.
//! * Runner rows (name reservations) are bounded: a `hello` that would add a row past
//!   [`MAX_RUNNER_ROWS_PER_OWNER`] or [`MAX_RUNNER_ROWS_PER_TENANT`] is refused
//!   ([`codes::TOO_MANY_RUNNERS`], permanent). A row whose runner is not connected and was last
//!   seen [`NAME_RESERVED_MS`] or more ago has expired ([`reservation_expired`]): it never
//!   counts, and the hub deletes it ([`expired_rows`]) when a runner says hello, when runners
//!   are listed, and in its alarm.
//! * Environment definitions are bounded per owner and per tenant ([`admit_definition`]).

use std::collections::BTreeSet;

use crate::wire::runner::{
    AttachOutcome, DEFAULT_HEARTBEAT_SECONDS, HelloKey, OfferedEnvironment,
    RUNNER_PROTOCOL_VERSION, RunnerKind, RunnerMessage, ServerMessage, codes,
};
use crate::wire::{MAX_PATH_BYTES, check_name};

/// A runner silent for this long (three heartbeat periods) is dropped.
pub const SILENCE_LIMIT_MS: i64 = 3 * DEFAULT_HEARTBEAT_SECONDS as i64 * 1000;
/// A connection of the same owner and name heard from within this long is alive: a second
/// `hello` of that name is refused unless it says `replace` (one and a half heartbeat periods,
/// so a live runner always counts and a dead one stops counting soon).
pub const TAKEOVER_SILENCE_MS: i64 = DEFAULT_HEARTBEAT_SECONDS as i64 * 1500;
/// A connection that has not sent `hello` this long after connecting is dropped (heartbeats
/// alone do not keep it).
pub const HELLO_DEADLINE_MS: i64 = 30_000;
/// `last_seen` is written to storage at most this often per runner (besides connect/close).
pub const PERSIST_EVERY_MS: i64 = 10_000;
/// How long after it was last seen a runner name stays reserved for its owner: 30 days. After
/// that the reservation (the runner's row) expires: see [`reservation_expired`].
pub const NAME_RESERVED_MS: i64 = 30 * 86_400 * 1000;
/// Most runner rows (names, connected or reserved) one owner holds in a tenant.
pub const MAX_RUNNER_ROWS_PER_OWNER: usize = 64;
/// Most runner rows (names, connected or reserved) a tenant holds.
pub const MAX_RUNNER_ROWS_PER_TENANT: usize = 1024;
/// Most environment definitions one owner holds in a tenant.
pub const MAX_DEFINITIONS_PER_OWNER: usize = 100;
/// Most environment definitions a tenant holds.
pub const MAX_DEFINITIONS_PER_TENANT: usize = 500;

/// Whether a stored runner's name reservation has expired at `now_ms`: its runner is not
/// connected (`live`) and was last seen [`NAME_RESERVED_MS`] or more ago.
pub fn reservation_expired(now_ms: i64, last_seen_ms: i64, live: bool) -> bool {
    !live && now_ms.saturating_sub(last_seen_ms) >= NAME_RESERVED_MS
}

/// Whether `row`'s runner has an open, welcomed connection.
fn is_live(row: &KnownRunner<'_>, open: &[OpenConnection<'_>]) -> bool {
    open.iter()
        .any(|c| c.owner == row.owner && c.name == Some(row.name))
}

/// The indexes in `known` of the rows whose reservation expired at `now_ms` (to delete).
pub fn expired_rows(
    now_ms: i64,
    known: &[KnownRunner<'_>],
    open: &[OpenConnection<'_>],
) -> Vec<usize> {
    known
        .iter()
        .enumerate()
        .filter(|(_, row)| reservation_expired(now_ms, row.last_seen_ms, is_live(row, open)))
        .map(|(i, _)| i)
        .collect()
}

/// Whether `owner` may store one more environment definition, given the owners of the
/// tenant's definitions (`None` for a legacy definition without an owner).
///
/// # Errors
/// The message of a `409 too_many_environments`.
pub fn admit_definition<'a>(
    owner: &str,
    owners: impl IntoIterator<Item = Option<&'a str>>,
) -> Result<(), String> {
    let (mut all, mut own) = (0usize, 0usize);
    for other in owners {
        all += 1;
        own += usize::from(other == Some(owner));
    }
    if own >= MAX_DEFINITIONS_PER_OWNER {
        return Err(format!(
            "{owner} already has {MAX_DEFINITIONS_PER_OWNER} environment definitions in this tenant; delete one first"
        ));
    }
    if all >= MAX_DEFINITIONS_PER_TENANT {
        return Err(format!(
            "this tenant already has {MAX_DEFINITIONS_PER_TENANT} environment definitions; delete one first"
        ));
    }
    Ok(())
}

/// When a restarted session cancels a runner call its dead step left running and the runner is
/// not connected, the cancel is tried again after each of these pauses (about 30 s in all).
/// A runner kills what it runs when its connection drops, so this is for the runner that comes
/// back before it noticed (a half-open connection, or a restart of the Worker that the runner
/// rides out by reconnecting); after the last pause the call is forgotten.
pub const ORPHAN_CANCEL_RETRY_MS: &[u64] = &[250, 500, 1_000, 2_000, 4_000, 8_000, 16_000];

/// Most environments a `hello` may offer.
pub const MAX_OFFERED_ENVIRONMENTS: usize = 256;
/// Most capabilities a `hello` may list.
pub const MAX_CAPABILITIES: usize = 64;
/// Longest capability string, in bytes.
pub const MAX_CAPABILITY_BYTES: usize = 64;
/// Longest `os`, `arch` or `runnerVersion`, in bytes.
pub const MAX_LABEL_BYTES: usize = 64;

/// A `hello`, taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version.
    pub version: u32,
    /// Runner name.
    pub name: String,
    /// The kind the runner says it is (the token decides; see [`on_hello`]).
    pub claimed_kind: RunnerKind,
    /// OS display name.
    pub os: String,
    /// CPU architecture.
    pub arch: String,
    /// Capability strings.
    pub capabilities: Vec<String>,
    /// Offered environments.
    pub environments: Vec<OfferedEnvironment>,
    /// Runner software version.
    pub runner_version: Option<String>,
    /// Whether it takes its name over from a live connection (`register --replace`).
    pub replace: bool,
    /// Its key and signature over the connection's nonce, if it has one.
    pub key: Option<HelloKey>,
}

impl Hello {
    /// The fields of a `hello` message; `None` for any other message.
    pub fn from_message(message: RunnerMessage) -> Option<Hello> {
        match message {
            RunnerMessage::Hello {
                version,
                name,
                kind,
                os,
                arch,
                capabilities,
                environments,
                runner_version,
                replace,
                key,
            } => Some(Hello {
                version,
                name,
                claimed_kind: kind,
                os,
                arch,
                capabilities,
                environments,
                runner_version,
                replace,
                key,
            }),
            _ => None,
        }
    }
}

/// A label (`os`, `arch`, `runnerVersion`): 1–[`MAX_LABEL_BYTES`] bytes of printable ASCII.
fn check_label(field: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_LABEL_BYTES {
        return Err(format!("{field} must be 1 to {MAX_LABEL_BYTES} bytes"));
    }
    if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(format!("{field} must be printable ASCII"));
    }
    Ok(())
}

/// Checks every `hello` field against its bound and format. The message names the field.
///
/// # Errors
/// The first rule broken, as the message of a `refused` frame.
pub fn check_hello(hello: &Hello) -> Result<(), String> {
    if hello.version != RUNNER_PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {} is not supported; this server speaks version {RUNNER_PROTOCOL_VERSION}",
            hello.version
        ));
    }
    check_name("runner name", &hello.name)?;
    check_label("os", &hello.os)?;
    check_label("arch", &hello.arch)?;
    if let Some(version) = &hello.runner_version {
        check_label("runnerVersion", version)?;
    }
    if hello.capabilities.len() > MAX_CAPABILITIES {
        return Err(format!(
            "capabilities may list at most {MAX_CAPABILITIES} entries"
        ));
    }
    for capability in &hello.capabilities {
        let ok = !capability.is_empty()
            && capability.len() <= MAX_CAPABILITY_BYTES
            && capability
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'-' | b'.'));
        if !ok {
            return Err(format!(
                "capability {capability:?} must be 1 to {MAX_CAPABILITY_BYTES} of A-Z a-z 0-9 : _ - ."
            ));
        }
    }
    if hello.environments.len() > MAX_OFFERED_ENVIRONMENTS {
        return Err(format!(
            "a runner may offer at most {MAX_OFFERED_ENVIRONMENTS} environments (it offered {})",
            hello.environments.len()
        ));
    }
    let mut names = BTreeSet::new();
    for env in &hello.environments {
        check_name("offered environment name", &env.name)?;
        if !names.insert(env.name.as_str()) {
            return Err(format!(
                "offered environment {:?} is listed twice",
                env.name
            ));
        }
        if !env.path.starts_with('/')
            || env.path.len() > MAX_PATH_BYTES
            || env.path.chars().any(char::is_control)
        {
            return Err(format!(
                "offered environment {:?} needs an absolute path of at most {MAX_PATH_BYTES} bytes without control characters",
                env.name
            ));
        }
    }
    Ok(())
}

/// An open connection of the tenant, as the hello rules see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenConnection<'a> {
    /// Its connection epoch.
    pub epoch: u64,
    /// Its token's `sub`.
    pub owner: &'a str,
    /// Its runner name, once welcomed.
    pub name: Option<&'a str>,
    /// When it was last heard from, heartbeats included (ms).
    pub last_seen_ms: i64,
}

/// A runner the tenant has seen (a stored row).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownRunner<'a> {
    /// Its owner.
    pub owner: &'a str,
    /// Its name.
    pub name: &'a str,
    /// When it was last seen (ms).
    pub last_seen_ms: i64,
}

/// What to do with a `hello`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelloDecision {
    /// Register and welcome the runner.
    Welcome {
        /// The runner's kind: its token's, whatever `hello` said.
        kind: RunnerKind,
        /// Set when `hello` claimed another kind: logged, and sent in `welcome`.
        notice: Option<String>,
        /// Older connections of the same owner and name, to close (their calls fail): dead
        /// ones, or live ones when the `hello` said `replace` (then they are sent `refused`
        /// [`codes::REPLACED`] first).
        replace: Vec<u64>,
    },
    /// Send `refused` and close.
    Refuse {
        /// See [`codes`].
        code: &'static str,
        /// Shown to the person running the runner.
        message: String,
    },
}

/// Decides what to do with `hello` on connection `epoch` of `owner`, whose token allows
/// `token_kind`. `open` lists the tenant's open connections (this one included or not),
/// `known` all the tenant's stored runners (expired rows are ignored); `now_ms` is the hub's
/// clock.
pub fn on_hello(
    owner: &str,
    epoch: u64,
    token_kind: RunnerKind,
    hello: &Hello,
    open: &[OpenConnection<'_>],
    known: &[KnownRunner<'_>],
    now_ms: i64,
) -> HelloDecision {
    if hello.version != RUNNER_PROTOCOL_VERSION {
        return HelloDecision::Refuse {
            code: codes::UNSUPPORTED_VERSION,
            message: format!(
                "protocol version {} is not supported; this server speaks version {RUNNER_PROTOCOL_VERSION}",
                hello.version
            ),
        };
    }
    if let Err(message) = check_hello(hello) {
        return HelloDecision::Refuse {
            code: codes::INVALID_MESSAGE,
            message,
        };
    }
    let name = hello.name.as_str();
    let live_other = open
        .iter()
        .find(|c| c.epoch != epoch && c.owner != owner && c.name == Some(name));
    let recent_other = known.iter().find(|r| {
        r.owner != owner
            && r.name == name
            && !reservation_expired(now_ms, r.last_seen_ms, is_live(r, open))
    });
    if let Some(holder) = live_other
        .map(|c| c.owner)
        .or(recent_other.map(|r| r.owner))
    {
        return HelloDecision::Refuse {
            code: codes::NAME_TAKEN,
            message: format!(
                "runner name {name:?} belongs to {holder:?} in this tenant; start this runner with another --name (a name stays reserved for {} days after its runner was last seen)",
                NAME_RESERVED_MS / 86_400_000
            ),
        };
    }
    // A name new to this owner adds a row: bounded per owner and per tenant.
    if !known.iter().any(|r| r.owner == owner && r.name == name) {
        let kept = || {
            known
                .iter()
                .filter(|r| !reservation_expired(now_ms, r.last_seen_ms, is_live(r, open)))
        };
        let days = NAME_RESERVED_MS / 86_400_000;
        let refusal = if kept().filter(|r| r.owner == owner).count() >= MAX_RUNNER_ROWS_PER_OWNER {
            Some(format!(
                "{owner:?} already holds {MAX_RUNNER_ROWS_PER_OWNER} runner names in this tenant; reuse one with --name, or free one with DELETE /v1/runners/{owner}/NAME (a name is kept {days} days after its runner was last seen)"
            ))
        } else if kept().count() >= MAX_RUNNER_ROWS_PER_TENANT {
            Some(format!(
                "this tenant already holds {MAX_RUNNER_ROWS_PER_TENANT} runner names; reuse one with --name, or ask an admin to free one with DELETE /v1/runners/OWNER/NAME (a name is kept {days} days after its runner was last seen)"
            ))
        } else {
            None
        };
        if let Some(message) = refusal {
            return HelloDecision::Refuse {
                code: codes::TOO_MANY_RUNNERS,
                message,
            };
        }
    }
    let same: Vec<&OpenConnection<'_>> = open
        .iter()
        .filter(|c| c.epoch != epoch && c.owner == owner && c.name == Some(name))
        .collect();
    let alive = same
        .iter()
        .any(|c| now_ms.saturating_sub(c.last_seen_ms) < TAKEOVER_SILENCE_MS);
    if alive && !hello.replace {
        return HelloDecision::Refuse {
            code: codes::NAME_IN_USE,
            message: format!(
                "runner {name:?} is already connected and alive; this connection waits and retries (stop the other runner, or start this one with --replace to take over)"
            ),
        };
    }
    let replace = same.iter().map(|c| c.epoch).collect();
    let notice = (hello.claimed_kind != token_kind).then(|| {
        format!(
            "this runner said kind {:?} but its token allows only {:?}; it serves as a {} runner (a cloud runner needs a runner token with runnerKind: cloud, minted by an operator)",
            hello.claimed_kind.as_str(),
            token_kind.as_str(),
            token_kind.as_str()
        )
    });
    HelloDecision::Welcome {
        kind: token_kind,
        notice,
        replace,
    }
}

/// What the hub does about a `hello`'s key (decision 0024), given the key the name is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyDecision {
    /// Neither the name nor the `hello` has a key (a runner older than keys): welcome.
    Unbound,
    /// The name has no key yet: verify the signature with the presented key, then bind the
    /// name to it (its first registration, or the first since its name was freed).
    Bind {
        /// The raw public key.
        public_key: [u8; 32],
        /// The signature to verify over [`crate::wire::runner::hello_signing_input`].
        signature: [u8; 64],
    },
    /// The name's key: verify the signature with it.
    Verify {
        /// The raw public key.
        public_key: [u8; 32],
        /// The signature.
        signature: [u8; 64],
    },
    /// Send `refused` and close.
    Refuse {
        /// [`codes::KEY_REQUIRED`] or [`codes::KEY_MISMATCH`].
        code: &'static str,
        /// Shown to the person running the runner.
        message: String,
    },
}

/// Decides about the key of a `hello` for runner `name`, bound to `bound` (base64url) or not.
pub fn key_decision(bound: Option<&str>, presented: Option<&HelloKey>, name: &str) -> KeyDecision {
    let free = format!(
        "its owner or an admin can free the name (DELETE /v1/runners/OWNER/{name}) so the next runner binds its own key"
    );
    let decode = |key: &HelloKey| -> Option<([u8; 32], [u8; 64])> {
        let public_key = crate::jwt::base64url_decode(&key.public_key).ok()?;
        let signature = crate::jwt::base64url_decode(&key.signature).ok()?;
        Some((public_key.try_into().ok()?, signature.try_into().ok()?))
    };
    match (bound, presented) {
        (None, None) => KeyDecision::Unbound,
        (Some(_), None) => KeyDecision::Refuse {
            code: codes::KEY_REQUIRED,
            message: format!(
                "runner {name:?} is bound to the key it registered with, and this connection proves none (a token alone cannot pose as the runner); {free}"
            ),
        },
        (bound, Some(key)) => {
            let Some((public_key, signature)) = decode(key) else {
                return KeyDecision::Refuse {
                    code: codes::KEY_MISMATCH,
                    message: String::from(
                        "the hello's key is not a base64url Ed25519 public key (32 bytes) and signature (64 bytes)",
                    ),
                };
            };
            match bound {
                None => KeyDecision::Bind {
                    public_key,
                    signature,
                },
                Some(bound) if bound == key.public_key => KeyDecision::Verify {
                    public_key,
                    signature,
                },
                Some(_) => KeyDecision::Refuse {
                    code: codes::KEY_MISMATCH,
                    message: format!(
                        "runner {name:?} is bound to another key (~/.wuhu/runner-key of the machine it registered from); {free}"
                    ),
                },
            }
        }
    }
}

/// The refusal when a `hello`'s signature does not verify.
pub fn bad_signature(name: &str) -> (&'static str, String) {
    (
        codes::KEY_MISMATCH,
        format!("the signature of runner {name:?}'s hello does not verify with its key"),
    )
}

/// Liveness facts of one open connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// Its connection epoch.
    pub epoch: u64,
    /// When it connected (ms).
    pub connected_at_ms: i64,
    /// When it last sent anything, heartbeats included (ms).
    pub last_seen_ms: i64,
    /// When `last_seen` was last written to storage (ms).
    pub persisted_ms: i64,
    /// Whether it was welcomed (sent a valid `hello`).
    pub welcomed: bool,
}

/// Why the sweep drops a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Silent for [`SILENCE_LIMIT_MS`].
    Silent,
    /// No `hello` within [`HELLO_DEADLINE_MS`].
    NoHello,
}

impl DropReason {
    /// The close reason sent to the runner.
    pub fn close_reason(self) -> &'static str {
        match self {
            DropReason::Silent => "no heartbeat",
            DropReason::NoHello => "no hello",
        }
    }
}

/// What a sweep does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Connections to close, with why.
    pub drop: Vec<(u64, DropReason)>,
    /// Connections whose `last_seen` to write to storage now.
    pub persist: Vec<(u64, i64)>,
    /// When to sweep next (ms), if any connection remains.
    pub next_alarm_ms: Option<i64>,
}

/// Plans a liveness sweep at `now_ms`.
pub fn sweep(now_ms: i64, connections: &[Liveness]) -> SweepPlan {
    let mut plan = SweepPlan::default();
    for c in connections {
        if now_ms - c.last_seen_ms > SILENCE_LIMIT_MS {
            plan.drop.push((c.epoch, DropReason::Silent));
            continue;
        }
        if !c.welcomed && now_ms - c.connected_at_ms > HELLO_DEADLINE_MS {
            plan.drop.push((c.epoch, DropReason::NoHello));
            continue;
        }
        if c.welcomed && c.last_seen_ms > c.persisted_ms {
            plan.persist.push((c.epoch, c.last_seen_ms));
        }
        let mut due = c.last_seen_ms + SILENCE_LIMIT_MS;
        if !c.welcomed {
            due = due.min(c.connected_at_ms + HELLO_DEADLINE_MS);
        }
        plan.next_alarm_ms = Some(plan.next_alarm_ms.map_or(due, |n: i64| n.min(due)));
    }
    plan
}

/// Whether a frame at `now_ms` should also write `last_seen` (at most every
/// [`PERSIST_EVERY_MS`]).
pub fn should_persist(now_ms: i64, persisted_ms: i64) -> bool {
    now_ms - persisted_ms >= PERSIST_EVERY_MS
}

/// The request id a runner's answer carries, if it answers a request.
pub fn answer_id(message: &RunnerMessage) -> Option<&str> {
    match message {
        RunnerMessage::AttachResult { id, .. }
        | RunnerMessage::DetachResult { id, .. }
        | RunnerMessage::ValidateResult { id, .. }
        | RunnerMessage::ToolResult { id, .. } => Some(id),
        RunnerMessage::Error { id, .. } => id.as_deref(),
        _ => None,
    }
}

/// Most open runner sockets per hub (tenant); one more is refused with 429.
pub const MAX_SOCKETS_PER_HUB: usize = 512;
/// Most open runner sockets per owner; one more is refused with 429.
pub const MAX_SOCKETS_PER_OWNER: usize = 32;

/// Whether `owner` may open one more runner socket, given the owners of the hub's open sockets.
///
/// # Errors
/// The message of a `429 too_many_runners`.
pub fn admit_socket<'a>(
    owner: &str,
    open_owners: impl IntoIterator<Item = &'a str>,
) -> Result<(), String> {
    let (mut all, mut own) = (0usize, 0usize);
    for other in open_owners {
        all += 1;
        own += usize::from(other == owner);
    }
    if all >= MAX_SOCKETS_PER_HUB {
        return Err(format!(
            "this tenant already has {MAX_SOCKETS_PER_HUB} runner connections"
        ));
    }
    if own >= MAX_SOCKETS_PER_OWNER {
        return Err(format!(
            "{owner} already has {MAX_SOCKETS_PER_OWNER} runner connections"
        ));
    }
    Ok(())
}

// ---- calls (`POST /call`) ----------------------------------------------------------------

/// `/call` timeout when the caller gives none.
pub const DEFAULT_CALL_TIMEOUT_MS: u64 = 120_000;
/// Largest `/call` timeout; a larger one is clamped.
pub const MAX_CALL_TIMEOUT_MS: u64 = 3_600_000;

/// How the hub treats a message a session asks it to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// Send and wait for the answer with the same id (`attach`, `detach`, `validate`).
    Request,
    /// Send and wait; when the wait times out, also send `cancel` (the tool may still run).
    ToolCall,
    /// Send and answer at once: nothing answers a `cancel`, and it needs no waiting call (the
    /// session or the hub may have restarted since the tool call was sent).
    Cancel,
}

/// A message the hub may send on a session's behalf, taken apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutgoingCall<'a> {
    /// The request id the answer will carry.
    pub id: &'a str,
    /// How to wait for it.
    pub kind: CallKind,
    /// For `attach`: the environment name the session asked for.
    pub attach_name: Option<&'a str>,
}

/// Which messages a session may send through the hub, and how each is waited for.
///
/// # Errors
/// The message of a `400 bad_request`: another message type, or an empty id.
pub fn plan_call(message: &ServerMessage) -> Result<OutgoingCall<'_>, &'static str> {
    let (id, kind, attach_name) = match message {
        ServerMessage::Attach { id, spec, .. } => (id, CallKind::Request, Some(spec.name.as_str())),
        ServerMessage::Detach { id, .. } | ServerMessage::Validate { id, .. } => {
            (id, CallKind::Request, None)
        }
        ServerMessage::ToolCall { id, .. } => (id, CallKind::ToolCall, None),
        ServerMessage::Cancel { id } => (id, CallKind::Cancel, None),
        _ => return Err("message must be attach, detach, validate, tool_call or cancel"),
    };
    if id.is_empty() {
        return Err("message id must not be empty");
    }
    Ok(OutgoingCall {
        id,
        kind,
        attach_name,
    })
}

/// The wait of a `/call` that asked for `requested` ms: [`DEFAULT_CALL_TIMEOUT_MS`] by default,
/// between 1 ms and [`MAX_CALL_TIMEOUT_MS`].
pub fn call_timeout_ms(requested: Option<u64>) -> u64 {
    requested
        .unwrap_or(DEFAULT_CALL_TIMEOUT_MS)
        .clamp(1, MAX_CALL_TIMEOUT_MS)
}

/// Whether a session acting for `sub` may send to `owner`'s runner registered as `kind`: its
/// own runners, and cloud runners (another user's local runner is their machine).
pub fn may_call(sub: &str, owner: &str, kind: RunnerKind) -> bool {
    sub == owner || kind == RunnerKind::Cloud
}

/// A runner answers `attach` with the environment it made; its name is the one the session
/// asked for, whatever the runner says (a runner must not rename or shadow environments).
/// Returns the name the runner used when it differed.
pub fn keep_requested_name(
    attach_name: Option<&str>,
    answer: &mut RunnerMessage,
) -> Option<String> {
    let (
        Some(name),
        RunnerMessage::AttachResult {
            outcome: AttachOutcome::Ok { environment },
            ..
        },
    ) = (attach_name, answer)
    else {
        return None;
    };
    (environment.name != name).then(|| std::mem::replace(&mut environment.name, name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(name: &str, kind: RunnerKind) -> Hello {
        Hello {
            version: RUNNER_PROTOCOL_VERSION,
            name: name.into(),
            claimed_kind: kind,
            os: "Linux".into(),
            arch: "x86_64".into(),
            capabilities: vec!["bash".into(), "environment:local".into()],
            environments: vec![OfferedEnvironment {
                name: "api".into(),
                path: "/src/api".into(),
            }],
            runner_version: Some("0.1.0".into()),
            replace: false,
            key: None,
        }
    }

    const NOW: i64 = 1_000_000_000_000;

    #[test]
    fn kind_comes_from_the_token() {
        use RunnerKind::*;
        // (token kind, hello kind) → (welcomed kind, notice?)
        let cases = [
            (Local, Local, Local, false),
            (Local, Cloud, Local, true),
            (Cloud, Cloud, Cloud, false),
            (Cloud, Local, Cloud, true),
        ];
        for (token, claimed, want, notice) in cases {
            match on_hello("ana", 1, token, &hello("mac", claimed), &[], &[], NOW) {
                HelloDecision::Welcome {
                    kind, notice: n, ..
                } => {
                    assert_eq!(kind, want, "{token:?} {claimed:?}");
                    assert_eq!(n.is_some(), notice, "{token:?} {claimed:?}");
                    if let Some(n) = n {
                        assert!(n.contains("runnerKind: cloud"), "{n}");
                    }
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn names_belong_to_one_user_and_a_live_runner_is_never_taken_over() {
        // `quiet` ms since each connection was heard from.
        let open = |epoch, owner, name, quiet: i64| OpenConnection {
            epoch,
            owner,
            name: Some(name),
            last_seen_ms: NOW - quiet,
        };
        let known = |owner, name, ago: i64| KnownRunner {
            owner,
            name,
            last_seen_ms: NOW - ago,
        };
        let day = 86_400_000;
        let dead = TAKEOVER_SILENCE_MS;
        let alive = TAKEOVER_SILENCE_MS - 1;
        type Case<'a> = (
            bool,
            Vec<OpenConnection<'a>>,
            Vec<KnownRunner<'a>>,
            Result<Vec<u64>, &'static str>,
        );
        let cases: Vec<Case<'_>> = vec![
            // Nobody has the name.
            (false, vec![], vec![], Ok(vec![])),
            // Bob is connected as "mac": refused, never a takeover, even with --replace.
            (
                false,
                vec![open(1, "bob", "mac", 0)],
                vec![],
                Err(codes::NAME_TAKEN),
            ),
            (
                true,
                vec![open(1, "bob", "mac", 0)],
                vec![],
                Err(codes::NAME_TAKEN),
            ),
            // Bob's "mac" was seen yesterday: still his.
            (
                false,
                vec![],
                vec![known("bob", "mac", day)],
                Err(codes::NAME_TAKEN),
            ),
            // Bob's "mac" was last seen 31 days ago: free again.
            (
                false,
                vec![],
                vec![known("bob", "mac", 31 * day)],
                Ok(vec![]),
            ),
            // Bob's runner of another name does not matter.
            (
                false,
                vec![open(1, "bob", "vm", 0)],
                vec![known("bob", "vm", 0)],
                Ok(vec![]),
            ),
            // Ana's own connection of that name is alive: a second hello (a second runner, or
            // a stolen token) is refused, and may try again.
            (
                false,
                vec![open(1, "ana", "mac", alive), open(9, "ana", "vm", 0)],
                vec![known("ana", "mac", 0)],
                Err(codes::NAME_IN_USE),
            ),
            // ... unless it says --replace: the live one is replaced.
            (
                true,
                vec![open(1, "ana", "mac", 0), open(9, "ana", "vm", 0)],
                vec![known("ana", "mac", 0)],
                Ok(vec![1]),
            ),
            // Ana's older connections that went silent died unnoticed: replaced without asking.
            (
                false,
                vec![open(1, "ana", "mac", dead), open(2, "ana", "mac", 2 * dead)],
                vec![known("ana", "mac", 0)],
                Ok(vec![1, 2]),
            ),
            // One of them alive is enough to refuse.
            (
                false,
                vec![open(1, "ana", "mac", dead), open(2, "ana", "mac", 0)],
                vec![known("ana", "mac", 0)],
                Err(codes::NAME_IN_USE),
            ),
            // This very connection is not replaced.
            (false, vec![open(7, "ana", "mac", 0)], vec![], Ok(vec![])),
            // A connection that has not said hello yet holds no name.
            (
                false,
                vec![OpenConnection {
                    epoch: 3,
                    owner: "bob",
                    name: None,
                    last_seen_ms: NOW,
                }],
                vec![],
                Ok(vec![]),
            ),
        ];
        for (replace, open, known, want) in cases {
            let hello = Hello {
                replace,
                ..hello("mac", RunnerKind::Local)
            };
            let got = match on_hello("ana", 7, RunnerKind::Local, &hello, &open, &known, NOW) {
                HelloDecision::Welcome { replace, .. } => Ok(replace),
                HelloDecision::Refuse { code, message } => {
                    if code == codes::NAME_TAKEN {
                        assert!(
                            message.contains("\"bob\"") && message.contains("--name"),
                            "{message}"
                        );
                    }
                    if code == codes::NAME_IN_USE {
                        assert!(message.contains("--replace"), "{message}");
                    }
                    Err(code)
                }
            };
            assert_eq!(got, want, "replace {replace}: {open:?} {known:?}");
        }
        assert!(!codes::refusal_is_permanent(codes::NAME_IN_USE));
        assert!(codes::refusal_is_permanent(codes::NAME_TAKEN));
        assert!(codes::refusal_is_permanent(codes::REPLACED));
    }

    #[test]
    fn a_bound_name_needs_its_key() {
        let key = |public: &[u8], sig: &[u8]| HelloKey {
            public_key: crate::jwt::base64url_encode(public),
            signature: crate::jwt::base64url_encode(sig),
        };
        let mine = key(&[1; 32], &[2; 64]);
        let theirs = key(&[3; 32], &[2; 64]);
        let short = key(&[1; 31], &[2; 64]);
        let bound = Some(mine.public_key.as_str());
        let kind = |d: KeyDecision| match d {
            KeyDecision::Unbound => "unbound",
            KeyDecision::Bind { public_key, .. } if public_key == [1; 32] => "bind",
            KeyDecision::Verify { public_key, .. } if public_key == [1; 32] => "verify",
            KeyDecision::Refuse { code, message } => {
                assert!(
                    message.contains("mac") || message.contains("base64url"),
                    "{message}"
                );
                code
            }
            other => panic!("{other:?}"),
        };
        let cases = [
            (None, None, "unbound"),
            (None, Some(&mine), "bind"),
            (bound, Some(&mine), "verify"),
            // A copy of the token alone, or with another machine's key.
            (bound, None, codes::KEY_REQUIRED),
            (bound, Some(&theirs), codes::KEY_MISMATCH),
            (None, Some(&short), codes::KEY_MISMATCH),
        ];
        for (bound, presented, want) in cases {
            assert_eq!(
                kind(key_decision(bound, presented, "mac")),
                want,
                "{bound:?} {presented:?}"
            );
        }
        assert!(codes::refusal_is_permanent(codes::KEY_REQUIRED));
        assert!(codes::refusal_is_permanent(codes::KEY_MISMATCH));
        assert_eq!(
            crate::wire::runner::hello_signing_input("n0nce", "mac"),
            "wuhu-runner-hello-v1\nn0nce\nmac"
        );
    }

    #[test]
    fn a_reservation_expires_thirty_days_after_last_seen_unless_connected() {
        assert_eq!(NAME_RESERVED_MS, 30 * 24 * 3600 * 1000);
        let day = 86_400_000;
        // (last seen how long ago, live?) → expired?
        let cases = [
            (0, false, false),
            (day, false, false),
            (NAME_RESERVED_MS - 1, false, false),
            (NAME_RESERVED_MS, false, true),
            (NAME_RESERVED_MS + 1, false, true),
            (365 * day, false, true),
            // A connected runner's reservation never expires.
            (NAME_RESERVED_MS, true, false),
            (365 * day, true, false),
            // A clock that went backwards does not expire anything.
            (-day, false, false),
        ];
        for (ago, live, want) in cases {
            assert_eq!(
                reservation_expired(NOW, NOW - ago, live),
                want,
                "{ago} ms ago, live {live}"
            );
        }
        let known = [
            KnownRunner {
                owner: "ana",
                name: "old",
                last_seen_ms: NOW - NAME_RESERVED_MS,
            },
            KnownRunner {
                owner: "ana",
                name: "new",
                last_seen_ms: NOW - 1,
            },
            KnownRunner {
                owner: "bob",
                name: "old",
                last_seen_ms: NOW - 40 * day,
            },
            KnownRunner {
                owner: "bob",
                name: "up",
                last_seen_ms: NOW - 40 * day,
            },
        ];
        let open = [
            OpenConnection {
                epoch: 1,
                owner: "bob",
                name: Some("up"),
                last_seen_ms: NOW,
            },
            // Ana's connection that has not said hello holds nothing.
            OpenConnection {
                epoch: 2,
                owner: "ana",
                name: None,
                last_seen_ms: NOW,
            },
        ];
        assert_eq!(expired_rows(NOW, &known, &open), vec![0, 2]);
        // An expired name is free for another user.
        let decision = on_hello(
            "cy",
            9,
            RunnerKind::Local,
            &hello("old", RunnerKind::Local),
            &open,
            &known,
            NOW,
        );
        assert!(
            matches!(decision, HelloDecision::Welcome { .. }),
            "{decision:?}"
        );
    }

    #[test]
    fn runner_rows_are_capped_per_owner_and_tenant() {
        let names: Vec<String> = (0..MAX_RUNNER_ROWS_PER_TENANT + 1)
            .map(|i| format!("r{i}"))
            .collect();
        let bob_names: Vec<String> = (0..MAX_RUNNER_ROWS_PER_TENANT)
            .map(|i| format!("b{i}"))
            .collect();
        let day = 86_400_000;
        // `ana` rows of ana's, `others` rows of bob's; `stale` of ana's rows last seen 30 days
        // ago (expired); then ana says hello as `name`.
        let decide = |ana: usize, others: usize, stale: usize, name: &str| {
            let mut known: Vec<KnownRunner<'_>> = Vec::new();
            for (i, n) in names.iter().take(ana).enumerate() {
                let ago = if i < stale { NAME_RESERVED_MS } else { day };
                known.push(KnownRunner {
                    owner: "ana",
                    name: n,
                    last_seen_ms: NOW - ago,
                });
            }
            for n in bob_names.iter().take(others) {
                known.push(KnownRunner {
                    owner: "bob",
                    name: n,
                    last_seen_ms: NOW,
                });
            }
            match on_hello(
                "ana",
                7,
                RunnerKind::Local,
                &hello(name, RunnerKind::Local),
                &[],
                &known,
                NOW,
            ) {
                HelloDecision::Welcome { .. } => Ok(()),
                HelloDecision::Refuse { code, message } => Err((code, message)),
            }
        };
        let own = MAX_RUNNER_ROWS_PER_OWNER;
        let all = MAX_RUNNER_ROWS_PER_TENANT;
        // (ana's rows, bob's rows, of ana's expired, name) → welcomed?
        let cases = [
            (0, 0, 0, "fresh", true),
            (own - 1, 0, 0, "fresh", true),
            (own, 0, 0, "fresh", false),
            // A name ana already holds adds no row: always welcomed.
            (own, 0, 0, "r0", true),
            (own, all - own, 0, "r3", true),
            // Expired rows do not count.
            (own, 0, 1, "fresh", true),
            (own + 5, 0, 6, "fresh", true),
            (0, all - 1, 0, "fresh", true),
            (0, all, 0, "fresh", false),
            (1, all - 1, 0, "fresh", false),
            (1, all - 1, 1, "fresh", true),
        ];
        for (ana, bob, stale, name, welcomed) in cases {
            let got = decide(ana, bob, stale, name);
            match (&got, welcomed) {
                (Ok(()), true) => {}
                (Err((code, message)), false) => {
                    assert_eq!(*code, codes::TOO_MANY_RUNNERS, "{message}");
                    assert!(message.contains("DELETE /v1/runners/"), "{message}");
                    assert!(
                        message.contains(if ana >= own {
                            "64 runner names"
                        } else {
                            "1024 runner names"
                        }),
                        "{message}"
                    );
                    assert!(codes::refusal_is_permanent(code));
                }
                _ => panic!("ana {ana}, bob {bob}, stale {stale}, {name}: {got:?}"),
            }
        }
    }

    #[test]
    fn definitions_are_capped_per_owner_and_tenant() {
        let owners = |ana: usize, bob: usize, legacy: usize| -> Vec<Option<&'static str>> {
            let mut v = vec![Some("ana"); ana];
            v.extend(std::iter::repeat_n(Some("bob"), bob));
            v.extend(std::iter::repeat_n(None, legacy));
            v
        };
        let own = MAX_DEFINITIONS_PER_OWNER;
        let all = MAX_DEFINITIONS_PER_TENANT;
        // (ana's, bob's, legacy) → may ana add one?
        let cases = [
            (0, 0, 0, true),
            (own - 1, 0, 0, true),
            (own, 0, 0, false),
            (0, own, 0, true),
            (0, all - 1, 0, true),
            (0, all, 0, false),
            (1, all - 2, 1, false),
            (1, all - 3, 1, true),
        ];
        for (ana, bob, legacy, want) in cases {
            let got = admit_definition("ana", owners(ana, bob, legacy));
            assert_eq!(got.is_ok(), want, "{ana} {bob} {legacy}: {got:?}");
        }
    }

    #[test]
    fn hello_fields_are_bounded() {
        let ok = hello("mac", RunnerKind::Local);
        assert_eq!(check_hello(&ok), Ok(()));
        fn env(name: &str, path: &str) -> OfferedEnvironment {
            OfferedEnvironment {
                name: name.into(),
                path: path.into(),
            }
        }
        let many_envs: Vec<OfferedEnvironment> = (0..=MAX_OFFERED_ENVIRONMENTS)
            .map(|i| env(&format!("e{i}"), "/x"))
            .collect();
        type Mutation = Box<dyn Fn(&mut Hello)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|h| h.version = 2), "protocol version 2"),
            (Box::new(|h| h.name = "a b".into()), "runner name"),
            (Box::new(|h| h.name = String::new()), "runner name"),
            (Box::new(|h| h.name = "x".repeat(65)), "runner name"),
            (Box::new(|h| h.os = String::new()), "os"),
            (Box::new(|h| h.os = "x".repeat(65)), "os"),
            (Box::new(|h| h.os = "mac\nOS".into()), "os"),
            (Box::new(|h| h.arch = "é".into()), "arch"),
            (
                Box::new(|h| h.runner_version = Some(String::new())),
                "runnerVersion",
            ),
            (
                Box::new(|h| h.capabilities = vec!["x".into(); MAX_CAPABILITIES + 1]),
                "capabilities",
            ),
            (
                Box::new(|h| h.capabilities = vec!["a b".into()]),
                "capability",
            ),
            (
                Box::new(|h| h.capabilities = vec!["x".repeat(MAX_CAPABILITY_BYTES + 1)]),
                "capability",
            ),
            (
                Box::new(move |h| h.environments = many_envs.clone()),
                "at most 256",
            ),
            (
                Box::new(|h| h.environments = vec![env("a/b", "/x")]),
                "offered environment name",
            ),
            (
                Box::new(|h| h.environments = vec![env("a", "/x"), env("a", "/y")]),
                "twice",
            ),
            (
                Box::new(|h| h.environments = vec![env("a", "rel")]),
                "absolute",
            ),
            (
                Box::new(|h| {
                    h.environments = vec![env("a", &format!("/{}", "x".repeat(MAX_PATH_BYTES)))]
                }),
                "absolute",
            ),
        ];
        for (mutate, want) in cases {
            let mut h = ok.clone();
            mutate(&mut h);
            let err = check_hello(&h).expect_err(want);
            assert!(err.contains(want), "{err} should mention {want}");
            match on_hello("ana", 1, RunnerKind::Local, &h, &[], &[], NOW) {
                HelloDecision::Refuse { code, .. } => {
                    assert!(code == codes::INVALID_MESSAGE || code == codes::UNSUPPORTED_VERSION)
                }
                other => panic!("{other:?}"),
            }
        }
        // At the bounds: accepted.
        let mut h = ok.clone();
        h.name = "x".repeat(64);
        h.os = "x".repeat(MAX_LABEL_BYTES);
        h.capabilities = vec!["c".repeat(MAX_CAPABILITY_BYTES); MAX_CAPABILITIES];
        h.environments = (0..MAX_OFFERED_ENVIRONMENTS)
            .map(|i| env(&format!("e{i}"), "/x"))
            .collect();
        assert_eq!(check_hello(&h), Ok(()));
    }

    #[test]
    fn sockets_are_capped_per_hub_and_owner() {
        let owners = |ana: usize, others: usize| -> Vec<&'static str> {
            let mut v = vec!["ana"; ana];
            v.extend(std::iter::repeat_n("bob", others));
            v
        };
        // (ana's open sockets, others', admitted?)
        let cases = [
            (0, 0, true),
            (MAX_SOCKETS_PER_OWNER - 1, 0, true),
            (MAX_SOCKETS_PER_OWNER, 0, false),
            (0, MAX_SOCKETS_PER_HUB - 1, true),
            (0, MAX_SOCKETS_PER_HUB, false),
            (1, MAX_SOCKETS_PER_HUB - 1, false),
        ];
        for (ana, others, admitted) in cases {
            let got = admit_socket("ana", owners(ana, others));
            assert_eq!(got.is_ok(), admitted, "{ana} {others}: {got:?}");
        }
        // Another owner at their own cap does not limit ana.
        assert!(admit_socket("ana", owners(0, MAX_SOCKETS_PER_OWNER)).is_ok());
    }

    fn server(value: serde_json::Value) -> ServerMessage {
        serde_json::from_value(value).expect("server message")
    }

    fn context() -> serde_json::Value {
        serde_json::json!({"name": "api", "kind": "local", "root": "/src/api",
            "snapshot": {"cwd": "/src/api", "env": {}, "capturedAt": 1}})
    }

    #[test]
    fn calls_are_planned_by_message_type() {
        use serde_json::json;
        let spec = json!({"name": "api", "kind": "local", "path": "/src/api"});
        type Want = Result<(&'static str, CallKind, Option<&'static str>), &'static str>;
        let cases: Vec<(ServerMessage, Want)> = vec![
            (
                server(json!({"type": "attach", "id": "a1", "sessionId": "s", "spec": spec})),
                Ok(("a1", CallKind::Request, Some("api"))),
            ),
            (
                server(
                    json!({"type": "detach", "id": "d1", "sessionId": "s", "environment": context()}),
                ),
                Ok(("d1", CallKind::Request, None)),
            ),
            (
                server(
                    json!({"type": "validate", "id": "v1", "sessionId": "s", "environment": context()}),
                ),
                Ok(("v1", CallKind::Request, None)),
            ),
            (
                server(
                    json!({"type": "tool_call", "id": "t1", "sessionId": "s", "environment": context(),
                    "tool": "bash", "arguments": {"command": "true"}}),
                ),
                Ok(("t1", CallKind::ToolCall, None)),
            ),
            (
                server(json!({"type": "cancel", "id": "t1"})),
                Ok(("t1", CallKind::Cancel, None)),
            ),
            (server(json!({"type": "cancel", "id": ""})), Err("empty")),
            (
                server(json!({"type": "heartbeat_ack"})),
                Err("must be attach"),
            ),
            (
                server(json!({"type": "refused", "code": "x", "message": "y"})),
                Err("must be attach"),
            ),
            // Only the hub sends discards (to the runners a deleted session recorded): a
            // session's `/call` cannot.
            (
                server(json!({"type": "discard_workspaces", "id": "x", "sessionId": "s"})),
                Err("must be attach"),
            ),
        ];
        for (message, want) in cases {
            let got = plan_call(&message).map(|c| (c.id, c.kind, c.attach_name));
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{message:?}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{got}"),
                (got, want) => panic!("{message:?}: {got:?} != {want:?}"),
            }
        }
    }

    #[test]
    fn call_timeouts_and_who_may_call() {
        let cases = [
            (None, DEFAULT_CALL_TIMEOUT_MS),
            (Some(0), 1),
            (Some(1), 1),
            (Some(MAX_CALL_TIMEOUT_MS), MAX_CALL_TIMEOUT_MS),
            (Some(MAX_CALL_TIMEOUT_MS + 1), MAX_CALL_TIMEOUT_MS),
            (Some(u64::MAX), MAX_CALL_TIMEOUT_MS),
        ];
        for (requested, want) in cases {
            assert_eq!(call_timeout_ms(requested), want, "{requested:?}");
        }
        use RunnerKind::*;
        let cases = [
            ("ana", "ana", Local, true),
            ("ana", "ana", Cloud, true),
            ("ana", "bob", Cloud, true),
            ("ana", "bob", Local, false),
        ];
        for (sub, owner, kind, want) in cases {
            assert_eq!(may_call(sub, owner, kind), want, "{sub} {owner} {kind:?}");
        }
    }

    #[test]
    fn an_attach_keeps_the_requested_name() {
        use serde_json::json;
        let answer = |name: &str| -> RunnerMessage {
            serde_json::from_value(json!({"type": "attach_result", "id": "a1", "ok": {
                "environment": {"name": name, "kind": "local", "root": "/src/api", "os": "Linux",
                    "snapshot": {"cwd": "/src/api", "env": {}, "capturedAt": 1}}}}))
            .expect("attach_result")
        };
        let name_of = |m: &RunnerMessage| match m {
            RunnerMessage::AttachResult {
                outcome: AttachOutcome::Ok { environment },
                ..
            } => environment.name.clone(),
            other => panic!("{other:?}"),
        };
        let mut renamed = answer("prod");
        assert_eq!(
            keep_requested_name(Some("api"), &mut renamed),
            Some("prod".into())
        );
        assert_eq!(name_of(&renamed), "api");
        let mut same = answer("api");
        assert_eq!(keep_requested_name(Some("api"), &mut same), None);
        assert_eq!(name_of(&same), "api");
        // Not an attach: untouched.
        let mut other = answer("prod");
        assert_eq!(keep_requested_name(None, &mut other), None);
        assert_eq!(name_of(&other), "prod");
    }

    #[test]
    fn sweep_table() {
        let live =
            |epoch, connected_ago: i64, seen_ago: i64, persisted_ago: i64, welcomed| Liveness {
                epoch,
                connected_at_ms: NOW - connected_ago,
                last_seen_ms: NOW - seen_ago,
                persisted_ms: NOW - persisted_ago,
                welcomed,
            };
        let plan = sweep(
            NOW,
            &[
                // Silent past the limit: dropped.
                live(1, 100_000, SILENCE_LIMIT_MS + 1, 100_000, true),
                // Exactly at the limit: kept.
                live(2, 100_000, SILENCE_LIMIT_MS, SILENCE_LIMIT_MS, true),
                // Heartbeats but never hello: dropped after the deadline.
                live(3, HELLO_DEADLINE_MS + 1, 0, 0, false),
                // Not welcomed, within the deadline: kept, alarm at its deadline.
                live(4, 1_000, 0, 0, false),
                // Seen since persisted: persist.
                live(5, 100_000, 500, 20_000, true),
            ],
        );
        assert_eq!(
            plan.drop,
            vec![(1, DropReason::Silent), (3, DropReason::NoHello)]
        );
        assert_eq!(plan.persist, vec![(5, NOW - 500)]);
        assert_eq!(plan.next_alarm_ms, Some(NOW));
        assert_eq!(sweep(NOW, &[]).next_alarm_ms, None);
        let only_new = sweep(NOW, &[live(4, 1_000, 0, 0, false)]);
        assert_eq!(
            only_new.next_alarm_ms,
            Some(NOW - 1_000 + HELLO_DEADLINE_MS)
        );
        assert!(should_persist(NOW, NOW - PERSIST_EVERY_MS));
        assert!(!should_persist(NOW, NOW - PERSIST_EVERY_MS + 1));
    }
}
