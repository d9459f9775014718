//! Secrets (issue 32): named values a tenant or a user stores once and sessions use **by
//! reference**, so a secret never has to be pasted into a message (and from there into the
//! transcript, the archive, the provider's logs and every follower's stream).
//!
//! - `PUT /v1/secrets/:name {value, scope, hosts, environments}` stores one; `GET /v1/secrets`
//!   lists names and who set them, never values; `DELETE /v1/secrets/:name?scope=` removes one.
//!   Tenant secrets are written by admins, user secrets by their user ([`may_write`]).
//! - The tenant's index keeps them sealed (AES-256-GCM under `WUHU_SECRETS_KEY`, with
//!   [`aad`] as associated data so a sealed value copied to another name, scope or tenant does
//!   not open).
//! - An environment definition lists the secrets its commands get as environment variables
//!   (`"secrets": ["GITHUB_TOKEN"]`); before each call the session decides which value each
//!   name stands for ([`choose`]) and the runner gets them with that call only, in memory.
//! - Values are masked (`crate::masking`) in everything the session stores or sends.
//!
//! **Who may use what** ([`choose`]), for a turn acting for a set of people (decision 0031):
//! - a **user secret** only in a turn that acts for its user alone, and only on that user's
//!   own runners, or in environments the secret names;
//! - a **tenant secret** only in environments the secret names (`environments`, definition
//!   names): an admin says where it may go, and the definition must ask for it too.
//!
//! A user's own secret comes first when both exist under one name.

pub mod name;
use serde::{Deserialize, Serialize};

use crate::authority::Principal;
use crate::channels::seal::{ChannelKey, NONCE_BYTES, SealError};

/// The secret holding the key that seals secrets at rest (64 hex characters).
pub const KEY_VAR: &str = "WUHU_SECRETS_KEY";
/// Most secrets a tenant keeps (tenant and user secrets together).
pub const MAX_SECRETS_PER_TENANT: usize = 200;
/// Longest value, in bytes.
pub const MAX_VALUE_BYTES: usize = 16 * 1024;
pub use name::{MAX_NAME_BYTES, check_name};
/// Most entries in `hosts`, and in `environments`.
pub const MAX_TARGETS: usize = 32;

/// Whose a secret is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum SecretScope {
    /// The tenant's: set by admins, used where it says.
    Tenant,
    /// One user's: used only in turns that act for that user alone.
    #[default]
    User,
}

impl SecretScope {
    /// `tenant` or `user`.
    pub fn as_str(self) -> &'static str {
        match self {
            SecretScope::Tenant => "tenant",
            SecretScope::User => "user",
        }
    }

    /// Parses `tenant` or `user`.
    pub fn parse(text: &str) -> Option<SecretScope> {
        match text {
            "tenant" => Some(SecretScope::Tenant),
            "user" => Some(SecretScope::User),
            _ => None,
        }
    }
}

/// `PUT /v1/secrets/:name`.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PutSecretRequest {
    /// The value (1 to 16 KiB, no NUL). Never returned.
    pub value: String,
    /// `user` (default) or `tenant` (admins).
    #[serde(default)]
    pub scope: SecretScope,
    /// Hosts `js` `fetch` may send it to (`{{secret:NAME}}` in a header): exact names or
    /// `*.example.com`. Empty: none.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Environment definitions (names) whose commands may get it. A tenant secret goes nowhere
    /// else; a user secret also goes to its user's own runners.
    #[serde(default)]
    pub environments: Vec<String>,
}

impl std::fmt::Debug for PutSecretRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutSecretRequest")
            .field("value", &"..")
            .field("scope", &self.scope)
            .field("hosts", &self.hosts)
            .field("environments", &self.environments)
            .finish()
    }
}

/// A secret as it is listed: everything but its value.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SecretInfo {
    /// Its name.
    pub name: String,
    /// `tenant` or `user`.
    pub scope: SecretScope,
    /// The user a user secret belongs to; `null` for a tenant secret.
    pub owner: Option<String>,
    /// See [`PutSecretRequest::hosts`].
    pub hosts: Vec<String>,
    /// See [`PutSecretRequest::environments`].
    pub environments: Vec<String>,
    /// Who set it last.
    pub set_by: String,
    /// When, in Unix seconds.
    pub set_at: i64,
}

/// `GET /v1/secrets`: the secrets the caller may see (the tenant's, and their own), by scope
/// then name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SecretList {
    /// The secrets.
    pub secrets: Vec<SecretInfo>,
}

/// A secret as sessions hold it: listed fields and the sealed value.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SealedSecret {
    /// Everything but the value.
    #[serde(flatten)]
    pub info: SecretInfo,
    /// The value, sealed (`crate::channels::seal` format) with [`aad`].
    pub sealed: String,
}

impl std::fmt::Debug for SealedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedSecret")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// The secret holding the key sealed values were sealed with before the last rotation; it
/// only opens them (and each is sealed again under [`KEY_VAR`] as it is read).
pub const PREVIOUS_KEY_VAR: &str = "WUHU_SECRETS_KEY_PREVIOUS";

/// The keys secrets are sealed with: the current one, and the one before a rotation.
#[derive(Clone, Debug)]
pub struct SecretKeys {
    current: ChannelKey,
    previous: Option<ChannelKey>,
}

impl SecretKeys {
    /// Parses [`KEY_VAR`] and [`PREVIOUS_KEY_VAR`] (64 hex characters each).
    ///
    /// # Errors
    /// Which variable is missing or malformed.
    pub fn parse(current: Option<&str>, previous: Option<&str>) -> Result<SecretKeys, String> {
        let parse = |var: &str, text: Option<&str>| {
            ChannelKey::parse(text).map_err(|e| match e {
                SealError::MissingKey => format!("{var} is not set"),
                _ => format!("{var} must be 32 bytes as 64 hex characters"),
            })
        };
        Ok(SecretKeys {
            current: parse(KEY_VAR, current)?,
            previous: match previous.map(str::trim).filter(|p| !p.is_empty()) {
                Some(text) => Some(parse(PREVIOUS_KEY_VAR, Some(text))?),
                None => None,
            },
        })
    }

    /// Seals `value` for `aad` under the current key (`nonce`: 12 fresh random bytes).
    pub fn seal(&self, aad: &str, nonce: [u8; NONCE_BYTES], value: &str) -> String {
        self.current.seal(aad, nonce, value.as_bytes())
    }

    /// Opens a value sealed for `aad`: with the current key, else the previous one (then the
    /// second field is `true`: seal it again).
    ///
    /// # Errors
    /// When neither key opens it (garbled, moved, or sealed under a key that is gone).
    pub fn open(&self, aad: &str, sealed: &str) -> Result<(String, bool), String> {
        let text = |bytes: Vec<u8>| {
            String::from_utf8(bytes).map_err(|_| String::from("a sealed secret is not UTF-8"))
        };
        if let Ok(bytes) = self.current.open(aad, sealed) {
            return Ok((text(bytes)?, false));
        }
        if let Some(previous) = &self.previous
            && let Ok(bytes) = previous.open(aad, sealed)
        {
            return Ok((text(bytes)?, true));
        }
        Err(format!(
            "a secret does not open with {KEY_VAR} (or {PREVIOUS_KEY_VAR}): was the key rotated without keeping the previous one?"
        ))
    }
}

/// Whether `host` is a host name or `*.` and one (lowercase letters, digits, `-`, `.`).
fn valid_host(host: &str) -> bool {
    let bare = host.strip_prefix("*.").unwrap_or(host);
    !bare.is_empty()
        && bare.len() <= 253
        && bare.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Checks a `PUT` body.
///
/// # Errors
/// What is wrong, for a 400.
pub fn check_put(request: &PutSecretRequest) -> Result<(), String> {
    if request.value.is_empty() {
        return Err("value must not be empty".into());
    }
    if request.value.len() > MAX_VALUE_BYTES {
        return Err(format!(
            "value is {} bytes; at most {MAX_VALUE_BYTES}",
            request.value.len()
        ));
    }
    if request.value.contains('\0') {
        return Err("value must not contain NUL (it becomes an environment variable)".into());
    }
    for (field, list) in [
        ("hosts", &request.hosts),
        ("environments", &request.environments),
    ] {
        if list.len() > MAX_TARGETS {
            return Err(format!(
                "{field} has {} entries; at most {MAX_TARGETS}",
                list.len()
            ));
        }
    }
    if let Some(bad) = request.hosts.iter().find(|h| !valid_host(h)) {
        return Err(format!(
            "hosts: {bad:?} is not a host name (lowercase, or *.example.com)"
        ));
    }
    for environment in &request.environments {
        crate::wire::check_name("environments", environment)?;
    }
    Ok(())
}

/// Whether `who` may set or delete a secret of `scope` (for a user secret: their own).
///
/// # Errors
/// The 403's message.
pub fn may_write(who: &Principal, scope: SecretScope) -> Result<(), String> {
    if crate::authority::is_guest(&who.sub) {
        return Err("a chat guest has no secrets".into());
    }
    match scope {
        SecretScope::Tenant if !who.is_admin() => {
            Err("only an admin may set or delete the tenant's secrets".into())
        }
        _ => Ok(()),
    }
}

/// Whether `who` sees `info` listed: every member sees the tenant's secrets (names, never
/// values), a user secret only its user.
pub fn visible_to(who: &Principal, info: &SecretInfo) -> bool {
    match info.scope {
        SecretScope::Tenant => !crate::authority::is_guest(&who.sub),
        SecretScope::User => info.owner.as_deref() == Some(who.sub.as_str()),
    }
}

/// The associated data a value is sealed with: the tenant, the scope, the owner and the
/// name, so a sealed value moved anywhere else does not open.
pub fn aad(tenant: &str, scope: SecretScope, owner: Option<&str>, name: &str) -> String {
    format!(
        "wuhu-secret/v1/{tenant}/{}/{}/{name}",
        scope.as_str(),
        owner.unwrap_or("")
    )
}

/// What a call asks of the secrets: the names its environment's definition lists, where it
/// runs, and whom the turn acts for.
#[derive(Clone, Copy, Debug)]
pub struct Wanted<'a> {
    /// The definition's `secrets`.
    pub names: &'a [String],
    /// The definition's name.
    pub definition: Option<&'a str>,
    /// The runner's owner.
    pub runner_owner: &'a str,
    /// Whom the turn acts for (decision 0031).
    pub acting_for: &'a [String],
}

/// Which stored secret each wanted name stands for, in the order asked.
///
/// # Errors
/// A message for the agent (a tool error) naming the first secret that may not be used here and
/// why. It never says whether another user has a secret of that name.
pub fn choose<'a>(
    book: &'a [SealedSecret],
    wanted: Wanted<'_>,
) -> Result<Vec<&'a SealedSecret>, String> {
    let alone = match wanted.acting_for {
        [one] => Some(one.as_str()),
        _ => None,
    };
    let listed = |secret: &SealedSecret| {
        wanted
            .definition
            .is_some_and(|d| secret.info.environments.iter().any(|e| e == d))
    };
    let mut chosen = Vec::with_capacity(wanted.names.len());
    for name in wanted.names {
        let own = alone.and_then(|user| {
            book.iter().find(|s| {
                s.info.scope == SecretScope::User
                    && s.info.owner.as_deref() == Some(user)
                    && &s.info.name == name
            })
        });
        if let Some(own) = own {
            let user = alone.unwrap_or_default();
            if wanted.runner_owner == user || listed(own) {
                chosen.push(own);
                continue;
            }
            return Err(format!(
                "your secret {name} goes only to your own runners and to the environments it names; this environment runs on {}'s runner (add it to the secret's environments to allow it)",
                wanted.runner_owner
            ));
        }
        let tenant = book
            .iter()
            .find(|s| s.info.scope == SecretScope::Tenant && &s.info.name == name);
        match tenant {
            Some(secret) if listed(secret) => chosen.push(secret),
            Some(_) => {
                return Err(format!(
                    "the tenant's secret {name} does not name the environment {:?} in its environments (an admin can add it)",
                    wanted.definition.unwrap_or("")
                ));
            }
            None => {
                let why = if alone.is_none() {
                    format!(
                        " (a user's own secret is used only in turns that act for that user alone; this turn acts for {})",
                        wanted.acting_for.join(", ")
                    )
                } else {
                    String::new()
                };
                return Err(format!(
                    "the environment's definition asks for secret {name}, which is not set{why}"
                ));
            }
        }
    }
    Ok(chosen)
}

/// Where a secret may be referenced in a `js` `fetch` header.
pub const REFERENCE_OPEN: &str = "{{secret:";
/// The end of a reference.
pub const REFERENCE_CLOSE: &str = "}}";

/// The names `text` references as `{{secret:NAME}}`, in order, each once.
///
/// # Errors
/// A reference that is not closed or does not hold a valid name.
pub fn references(text: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(REFERENCE_OPEN) {
        let after = &rest[start + REFERENCE_OPEN.len()..];
        let end = after
            .find(REFERENCE_CLOSE)
            .ok_or_else(|| String::from("an unclosed {{secret:…}} reference"))?;
        let name = &after[..end];
        check_name(name)?;
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
        rest = &after[end + REFERENCE_CLOSE.len()..];
    }
    Ok(names)
}

/// `text` with each `{{secret:NAME}}` replaced by its value in `values`.
pub fn substitute(text: &str, values: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (name, value) in values {
        out = out.replace(&format!("{REFERENCE_OPEN}{name}{REFERENCE_CLOSE}"), value);
    }
    out
}

/// Whether `host` is one of `hosts` (exact, or below a `*.domain` entry), ignoring case.
pub fn host_allowed(hosts: &[String], host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    hosts
        .iter()
        .any(|allowed| match allowed.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            None => *allowed == host,
        })
}

/// Which stored secret `{{secret:NAME}}` stands for in a `js` `fetch` to `host`: the user's own
/// (in a turn that acts for that user alone), else the tenant's; either only if its `hosts`
/// allow `host`.
///
/// # Errors
/// A message for the script: not set, or not for this host. It never says whether another user
/// has a secret of that name.
pub fn for_fetch<'a>(
    book: &'a [SealedSecret],
    name: &str,
    host: &str,
    acting_for: &[String],
) -> Result<&'a SealedSecret, String> {
    let alone = match acting_for {
        [one] => Some(one.as_str()),
        _ => None,
    };
    let own = alone.and_then(|user| {
        book.iter().find(|s| {
            s.info.scope == SecretScope::User
                && s.info.owner.as_deref() == Some(user)
                && s.info.name == name
        })
    });
    let candidate = own.or_else(|| {
        book.iter()
            .find(|s| s.info.scope == SecretScope::Tenant && s.info.name == name)
    });
    match candidate {
        Some(secret) if host_allowed(&secret.info.hosts, host) => Ok(secret),
        Some(_) => Err(format!(
            "secret {name} may not be sent to {host} (its hosts do not list it)"
        )),
        None => Err(format!("no secret {name} is available to this turn")),
    }
}

/// Every string in `value` with the known secrets of `masker` masked, not the detector: for
/// what a runner or a script is handed (the server applies the detector to what it stores).
pub fn mask_known_json(masker: &crate::masking::Masker, value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(text) => {
            if let std::borrow::Cow::Owned(masked) = masker.mask_known(text) {
                *text = masked;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| mask_known_json(masker, v)),
        Value::Object(map) => map.values_mut().for_each(|v| mask_known_json(masker, v)),
        _ => {}
    }
}

/// The tenant's secrets a principal may see, sorted (tenant first, then by name).
pub fn listing(book: &[SealedSecret], who: &Principal) -> SecretList {
    let mut secrets: Vec<SecretInfo> = book
        .iter()
        .map(|s| &s.info)
        .filter(|info| visible_to(who, info))
        .cloned()
        .collect();
    secrets.sort_by(|a, b| (a.scope, &a.name).cmp(&(b.scope, &b.name)));
    SecretList { secrets }
}

#[cfg(test)]
mod tests;
