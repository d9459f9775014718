//! Token lineage: what each registered credential was made from, what minting may be made
//! from at all, how far a revocation reaches, and what a credential may still do at each use.
//! Decision record: `docs/decisions/0032-token-lineage.md`.
//!
//! A credential is made from the credential of the request that made it:
//!
//! | made from | minting a token (`POST /v1/tokens`) | a cookie session (`POST /v1/auth/session`) |
//! |---|---|---|
//! | a minted token (`jti`) | its child: `parent = jti`, `exp` at most the parent's, the parent's root | same |
//! | an operator token (no `jti`) | a root: [`LineageRoot::Operator`] | same |
//! | a cookie session | refused: present the token you signed in with (`403 reauthentication_required`) | refused (`400`, sign out first) |
//! | a Cloudflare Access sign-in | only within [`ACCESS_REAUTH_SECS`] of it (`iat`); a root: [`LineageRoot::Access`] | a root: [`LineageRoot::Access`] |
//!
//! Revoking a credential revokes its whole tree ([`revocation_set`]); revoking all of a user's
//! credentials revokes every tree they hold or root. A credential resting on an Access
//! identity is re-checked at every use against the Access settings ([`standing`]). Every
//! function here is pure.

use std::collections::{HashMap, HashSet, VecDeque};

use super::{CredentialRecord, MintError, credential_live};
use crate::access::AccessConfig;
use crate::authority::Role;
use crate::wire::LineageRoot;

/// How recent an Access sign-in (its token's `iat`) must be to mint a token, in seconds. An
/// Access session lasts hours and rides along on every request the browser makes; minting
/// a credential that outlives it asks for a sign-in made for the purpose.
pub const ACCESS_REAUTH_SECS: i64 = 10 * 60;
/// How far in the future an `iat` may be and still count (clock skew between Access and
/// Cloudflare's edge), in seconds.
pub const ISSUED_AT_SKEW_SECS: i64 = 60;

/// The credential a request was authenticated with, as the lineage rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presented<'a> {
    /// A registered bearer token (minted by `POST /v1/tokens`).
    Registered {
        /// Its `jti`.
        jti: &'a str,
        /// Its `exp`.
        expires_at: i64,
    },
    /// A bearer token signed with the operator secret (no `jti`).
    Operator,
    /// The `wuhu_session` cookie.
    CookieSession,
    /// A Cloudflare Access sign-in.
    Access {
        /// The lowercased email (the `sub`).
        email: &'a str,
        /// The Access token's `iat`.
        issued_at: Option<i64>,
    },
}

/// What is being made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Making {
    /// A token (`POST /v1/tokens`).
    Token,
    /// A cookie session (`POST /v1/auth/session`).
    CookieSession,
}

/// What a new credential is made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A registered credential: the new one's parent. It never outlives it, ends with it, and
    /// takes its root when it is registered ([`adopt`]).
    Parent {
        /// The parent's `jti`.
        jti: String,
        /// The parent's `exp`.
        expires_at: i64,
    },
    /// Nothing registered: the line starts here.
    Root(LineageRoot),
}

impl Source {
    /// `expires_at` capped so the new credential never outlives its parent.
    pub fn cap(&self, expires_at: i64) -> i64 {
        match self {
            Source::Parent {
                expires_at: parent, ..
            } => expires_at.min(*parent),
            Source::Root(_) => expires_at,
        }
    }

    /// The record's `parent` and `root` (a child's root is its parent's, set by [`adopt`]).
    pub fn lineage(&self) -> (Option<String>, LineageRoot) {
        match self {
            Source::Parent { jti, .. } => (Some(jti.clone()), LineageRoot::Unrecorded),
            Source::Root(root) => (None, root.clone()),
        }
    }
}

/// What `presented` may make at `now`, and from what.
///
/// # Errors
/// [`MintError::Reauthenticate`] for a token from a cookie session, or from an Access sign-in
/// older than [`ACCESS_REAUTH_SECS`]; [`MintError::Bad`] for a cookie session from a cookie
/// session.
pub fn source(presented: Presented<'_>, making: Making, now: i64) -> Result<Source, MintError> {
    match (presented, making) {
        (Presented::Registered { jti, expires_at }, _) => Ok(Source::Parent {
            jti: jti.to_string(),
            expires_at,
        }),
        (Presented::Operator, _) => Ok(Source::Root(LineageRoot::Operator)),
        (Presented::CookieSession, Making::Token) => Err(MintError::Reauthenticate(
            "a browser's cookie session cannot mint tokens: send the request with the token you signed in with (Authorization: Bearer …); the web app asks for it"
                .into(),
        )),
        (Presented::CookieSession, Making::CookieSession) => Err(MintError::Bad(
            "already signed in with a cookie session; sign out first".into(),
        )),
        (Presented::Access { email, .. }, Making::CookieSession) => {
            Ok(Source::Root(LineageRoot::Access {
                email: email.to_string(),
            }))
        }
        (Presented::Access { email, issued_at }, Making::Token) => {
            let fresh = issued_at.is_some_and(|iat| {
                iat <= now + ISSUED_AT_SKEW_SECS && now - iat <= ACCESS_REAUTH_SECS
            });
            if !fresh {
                let age = issued_at.map_or_else(
                    || "of unknown age".to_string(),
                    |iat| format!("{} minutes old", (now - iat).max(0) / 60),
                );
                return Err(MintError::Reauthenticate(format!(
                    "minting a token needs a fresh Cloudflare Access sign-in (at most {} minutes old; this one is {age}): sign out at /cdn-cgi/access/logout, sign in again, and retry",
                    ACCESS_REAUTH_SECS / 60
                )));
            }
            Ok(Source::Root(LineageRoot::Access {
                email: email.to_string(),
            }))
        }
    }
}

/// The record to register, given its parent's row as the registry holds it now (`None`: not
/// found). A child takes its parent's root and never outlives it; a parent that is gone (revoked
/// between the request's check and now), expired, or someone else's is refused, so no child
/// is left behind by a revoke that raced its minting.
///
/// # Errors
/// [`MintError::Revoked`].
pub fn adopt(
    mut record: CredentialRecord,
    parent: Option<&CredentialRecord>,
    now: i64,
) -> Result<CredentialRecord, MintError> {
    let Some(parent_jti) = record.parent.as_deref() else {
        return Ok(record);
    };
    let parent = parent
        .filter(|p| p.jti == parent_jti && credential_live(Some(p), &record.created_by, now))
        .ok_or_else(|| {
            MintError::Revoked("the credential this was made from was revoked".into())
        })?;
    record.root = parent.root.clone();
    record.expires_at = record.expires_at.min(parent.expires_at);
    Ok(record)
}

/// One registered credential, as [`revocation_set`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node<'a> {
    /// Its `jti`.
    pub jti: &'a str,
    /// Its parent's `jti`.
    pub parent: Option<&'a str>,
    /// Whose.
    pub sub: &'a str,
    /// Its root.
    pub root: &'a LineageRoot,
}

impl<'a> From<&'a CredentialRecord> for Node<'a> {
    fn from(record: &'a CredentialRecord) -> Self {
        Node {
            jti: &record.jti,
            parent: record.parent.as_deref(),
            sub: &record.sub,
            root: &record.root,
        }
    }
}

/// What to revoke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revocation<'a> {
    /// One credential (`DELETE /v1/tokens/:jti`, a logout).
    One(&'a str),
    /// Every credential of a user (`POST /v1/tokens/revoke-all`): theirs, and those resting on
    /// their Access identity.
    AllOf(&'a str),
}

/// The `jti`s a revocation ends: what it names and every credential made from those, down the
/// whole tree, each once (what it names first, then by generation). `nodes` is the tenant's
/// registry; a cycle (which registration cannot make) ends the walk instead of looping.
pub fn revocation_set(nodes: &[Node<'_>], what: Revocation<'_>) -> Vec<String> {
    let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
    for node in nodes {
        if let Some(parent) = node.parent {
            children.entry(parent).or_default().push(node.jti);
        }
    }
    let seeds: Vec<&str> = match what {
        Revocation::One(jti) => nodes
            .iter()
            .filter(|n| n.jti == jti)
            .map(|n| n.jti)
            .collect(),
        Revocation::AllOf(sub) => nodes
            .iter()
            .filter(|n| {
                n.sub == sub || matches!(n.root, LineageRoot::Access { email } if email == sub)
            })
            .map(|n| n.jti)
            .collect(),
    };
    let mut seen: HashSet<&str> = HashSet::new();
    let mut order = Vec::new();
    let mut queue: VecDeque<&str> = seeds.into_iter().collect();
    while let Some(jti) = queue.pop_front() {
        if !seen.insert(jti) {
            continue;
        }
        order.push(jti.to_string());
        if let Some(kids) = children.get(jti) {
            queue.extend(kids.iter().copied());
        }
    }
    order
}

/// What a registered credential may do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Accepted, acting with at most this role.
    Live {
        /// The role its JWT's claim is capped at.
        role: Role,
    },
    /// Refused (401), with the reason.
    Refused(String),
}

/// Whether the credential `record` (the registry's row for a JWT's `jti`, `None` when there is
/// none), presented for `sub` in `tenant`, may be used at `now`, and with which role. Its row
/// must exist, be `sub`'s and not have expired ([`credential_live`]). One resting on an Access
/// identity is checked against `access` (the settings now; `None`: Access is not configured
/// any more): the identity must still be admitted to this tenant, and what it minted acts with
/// no more than it has now: its admin tokens act as members once it is no longer an admin, and
/// what only an admin could have minted (another user's token, a cloud runner token) ends.
pub fn standing(
    record: Option<&CredentialRecord>,
    sub: &str,
    tenant: &str,
    now: i64,
    access: Option<&AccessConfig>,
) -> Standing {
    let Some(record) = record.filter(|r| credential_live(Some(r), sub, now)) else {
        return Standing::Refused("token revoked".into());
    };
    let LineageRoot::Access { email } = &record.root else {
        return Standing::Live { role: record.role };
    };
    let Some(config) = access else {
        return Standing::Refused(format!(
            "this credential rests on the Cloudflare Access identity {email}, and Access is no longer configured"
        ));
    };
    let now_is = match config.principal_for(email) {
        Ok(p) if p.tenant == tenant => p,
        _ => {
            return Standing::Refused(format!(
                "the Cloudflare Access identity this credential rests on ({email}) is no longer admitted to this tenant"
            ));
        }
    };
    let needs_admin =
        record.sub != *email || record.runner_kind == Some(crate::wire::runner::RunnerKind::Cloud);
    if needs_admin && !now_is.is_admin() {
        return Standing::Refused(format!(
            "this credential was minted by {email}, who is no longer an admin (WUHU_ACCESS_ADMINS)"
        ));
    }
    Standing::Live {
        role: record.role.at_most(now_is.role),
    }
}

#[cfg(test)]
mod tests;
