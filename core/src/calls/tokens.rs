//! The calls a tenant's token registry (`TokenRegistry`, one per tenant) answers: whether a
//! credential is live, registering one, listing and revoking them.

use serde::{Deserialize, Serialize};

use super::{Target, call, call_enum};
use crate::tokens::CredentialRecord;
use crate::wire::{ListTokensResponse, RevokeTokenResponse, TokenInfo};

/// The tenant's token registry.
#[derive(Debug)]
pub struct Tokens;

impl Target for Tokens {
    const HOST: &'static str = "tokens";
}

/// Whether the caller's credential `jti` is live (registered, theirs, not expired).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Check {
    /// The credential.
    pub jti: String,
}
call!(Check => Tokens, "check", Live);

/// The answer to [`Check`].
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    /// Live.
    pub live: bool,
}

/// Registers a credential (`429 too_many_tokens` over the bounds).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Register(pub CredentialRecord);
call!(Register => Tokens, "register", TokenInfo);

/// `GET /v1/tokens[?sub=|?all=1]`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct List {
    /// Every user's (admins).
    pub all: bool,
    /// This user's (admins, or the user).
    pub sub: Option<String>,
}
call!(List => Tokens, "list", ListTokensResponse);

/// `DELETE /v1/tokens/:jti`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Revoke {
    /// The credential.
    pub jti: String,
}
call!(Revoke => Tokens, "revoke", RevokeTokenResponse);

call_enum! {
    /// Every call a tenant's token registry answers.
    pub enum TokensCall for Tokens {
        Check(Check),
        Register(Register),
        List(List),
        Revoke(Revoke),
    }
}
