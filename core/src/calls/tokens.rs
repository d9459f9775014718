//! The calls a tenant's token registry (`TokenRegistry`, one per tenant) answers: whether a
//! credential may be used, registering one, listing and revoking them (one tree, or everything
//! of a user).

use serde::{Deserialize, Serialize};

use super::{Target, call, call_enum};
use crate::authority::Role;
use crate::tokens::CredentialRecord;
use crate::wire::{ListTokensResponse, RevokeAllResponse, RevokeTokenResponse, TokenInfo};

/// The tenant's token registry.
#[derive(Debug)]
pub struct Tokens;

impl Target for Tokens {
    const HOST: &'static str = "tokens";
}

/// Whether the caller's credential `jti` may be used now (`wuhu_core::tokens::lineage::standing`),
/// and with which role.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Check {
    /// The credential.
    pub jti: String,
}
call!(Check => Tokens, "check", Live);

/// The answer to [`Check`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Live {
    /// Accepted.
    pub live: bool,
    /// When live: the most the credential may act as (its claim is capped at it).
    #[serde(default)]
    pub role: Option<Role>,
    /// When refused: why (the 401's message).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Registers a credential (`429 too_many_tokens` over the bounds; `401` when the credential it
/// is made from is gone).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Register(pub CredentialRecord);
call!(Register => Tokens, "register", TokenInfo);

/// `GET /v1/tokens[?sub=|?all=1]`: tokens and cookie sessions.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct List {
    /// Every user's (admins).
    pub all: bool,
    /// This user's (admins, or the user).
    pub sub: Option<String>,
    /// The `jti` of the request's own credential, marked `current` in the list.
    #[serde(default)]
    pub current: Option<String>,
}
call!(List => Tokens, "list", ListTokensResponse);

/// `DELETE /v1/tokens/:jti`: the credential and everything made from it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Revoke {
    /// The credential.
    pub jti: String,
}
call!(Revoke => Tokens, "revoke", RevokeTokenResponse);

/// `POST /v1/tokens/revoke-all`: every credential of `sub` and everything made from them.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RevokeAll {
    /// Whose (the caller, or anyone for an admin).
    pub sub: String,
}
call!(RevokeAll => Tokens, "revoke_all", RevokeAllResponse);

call_enum! {
    /// Every call a tenant's token registry answers.
    pub enum TokensCall for Tokens {
        Check(Check),
        Register(Register),
        List(List),
        Revoke(Revoke),
        RevokeAll(RevokeAll),
    }
}
