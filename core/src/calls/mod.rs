//! Typed calls between Wuhu's Durable Objects, and the public routes that become them.
//!
//! Every request one Durable Object (or the router) sends another is a value of a type here:
//! one struct per route, implementing [`Call`] with the reply it gets, and one enum per
//! Durable Object class ([`session::SessionCall`], [`index::IndexCall`], [`hub::HubCall`],
//! [`tokens::TokensCall`], [`channels::RegistryCall`], [`channels::BindingCall`]) that the
//! callee decodes and matches on. The host sends a call with one function (the Worker's
//! `internal::call`) and decodes it with one (`XCall::decode`); no path is spelled out
//! anywhere else, and "go to definition" leads from a caller to the callee's `match` arm.
//!
//! # How a call travels
//!
//! As an HTTP request to the callee's stub (`https://<host>/<name>`, where `host` is the
//! target's [`Target::HOST`] and `name` the call's [`Call::NAME`]), because that is what a
//! Durable Object stub carries:
//! - a `POST` with the call as its JSON body;
//! - a WebSocket upgrade ([`Upgrade`]) keeps the client's `GET` and its upgrade headers, and
//!   the call travels as JSON in [`CALL_HEADER`];
//! - the caller's verified identity travels in the `x-wuhu-*` headers, as before.
//!
//! A reply is JSON ([`Call::Reply`]); an error is `{"error":{"code","message"}}` with its
//! status, decoded back into the caller's error with the callee's code. A [`Streamed`] reply
//! (a follow stream, an accepted WebSocket) is the callee's response, passed through.
//!
//! Public routes (`/v1/sessions/:id/...`) are decoded here too ([`session::decode_public`]):
//! the router validates a request once, before any actor wakes, and the actor receives the
//! typed call. What each call needs of its caller is table-tested next to it
//! ([`session::SessionCall::needs`]).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub mod channels;
pub mod hub;
pub mod index;
pub mod session;
pub mod tokens;

/// A Durable Object class that answers calls.
pub trait Target {
    /// The host of its internal URLs (`https://<HOST>/<name>`), for logs and errors.
    const HOST: &'static str;
}

/// One route of a Durable Object, as a value.
pub trait Call: Serialize + DeserializeOwned {
    /// Which class answers it.
    type Target: Target;
    /// What it answers with.
    type Reply: Serialize + DeserializeOwned;
    /// Its name: the path it travels under (`/<NAME>`).
    const NAME: &'static str;
}

/// The enum of one Durable Object's calls (declared with `call_enum!`): any of its calls, to
/// send as it is (the router relays a decoded public call without naming its type again).
pub trait CallEnum {
    /// Which class answers them.
    type Target: Target;
    /// The call's name.
    fn name(&self) -> &'static str;
    /// The call's JSON (its body on the wire).
    ///
    /// # Errors
    /// serde's, should a value not serialise.
    fn to_json(&self) -> serde_json::Result<String>;
}

/// A call that is a WebSocket upgrade: it travels as the client's `GET` with its upgrade
/// headers, and the call itself in [`CALL_HEADER`].
pub trait Upgrade: Call<Reply = Streamed> {}

/// The reply of a call whose answer is not JSON (a stream, an accepted WebSocket): the
/// callee's response passes through to whoever asked. Never serialised.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streamed;

/// The header an [`Upgrade`] call travels in.
pub const CALL_HEADER: &str = "x-wuhu-call";

/// The methods of the public API (the router's view of a request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET` (and `HEAD`).
    Get,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
    /// `PATCH`.
    Patch,
    /// `DELETE`.
    Delete,
    /// Anything else.
    Other,
}

/// Why a request could not become a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No call has this name (internal) or no route this path (public): `404 not_found`.
    #[error("no such route")]
    UnknownRoute,
    /// The route exists, not with this method: `405 method_not_allowed`.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// The body is not the call's JSON: `400 bad_request`.
    #[error("invalid json body: {0}")]
    InvalidJson(String),
    /// A value is out of its bounds or malformed: `400 bad_request`, with the reason.
    #[error("{0}")]
    BadRequest(String),
}

impl CallError {
    /// The status and code the API answers this error with.
    pub fn status_and_code(&self) -> (u16, &'static str) {
        match self {
            CallError::UnknownRoute => (404, "not_found"),
            CallError::MethodNotAllowed => (405, "method_not_allowed"),
            CallError::InvalidJson(_) | CallError::BadRequest(_) => (400, "bad_request"),
        }
    }
}

/// Decodes a call's JSON body.
///
/// # Errors
/// [`CallError::InvalidJson`] with serde's reason.
pub fn decode_body<C: DeserializeOwned>(body: &[u8]) -> Result<C, CallError> {
    serde_json::from_slice(body).map_err(|e| CallError::InvalidJson(e.to_string()))
}

/// Decodes an optional JSON body: an empty (or all-whitespace) body is the default.
///
/// # Errors
/// [`CallError::InvalidJson`] for a body that is not the type's JSON.
pub fn decode_optional_body<C: DeserializeOwned + Default>(body: &[u8]) -> Result<C, CallError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(C::default());
    }
    decode_body(body)
}

/// One query parameter of a public request.
pub(crate) fn query<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// A numeric query parameter; a present but malformed value is a 400 (an empty one is absent).
///
/// # Errors
/// [`CallError::BadRequest`] naming the parameter.
pub fn query_u64(pairs: &[(String, String)], name: &str) -> Result<Option<u64>, CallError> {
    match query(pairs, name) {
        None | Some("") => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            CallError::BadRequest(format!(
                "query parameter {name} must be a non-negative integer"
            ))
        }),
    }
}

/// A text query parameter, absent when empty.
pub fn query_text(pairs: &[(String, String)], name: &str) -> Option<String> {
    query(pairs, name)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// Declares the enum of one Durable Object's calls: a variant per call struct, `decode` by
/// name, `name()`, and `From` each struct. Every struct's `Call::Target` must be `$target`.
macro_rules! call_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident for $target:ty {
            $( $(#[$vmeta:meta])* $variant:ident($call:ty), )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug)]
        pub enum $name {
            $(
                $(#[$vmeta])*
                #[doc = concat!("[`", stringify!($call), "`]")]
                $variant($call),
            )+
        }

        impl $name {
            /// Decodes a call from its name (the request's path without the leading `/`) and
            /// its JSON.
            ///
            /// # Errors
            /// [`CallError::UnknownRoute`] for a name no call has, [`CallError::InvalidJson`]
            /// for a body that is not that call's JSON.
            pub fn decode(name: &str, body: &[u8]) -> Result<Self, $crate::calls::CallError> {
                let name = name.strip_prefix('/').unwrap_or(name);
                $(
                    if name == <$call as $crate::calls::Call>::NAME {
                        return $crate::calls::decode_body::<$call>(body).map($name::$variant);
                    }
                )+
                Err($crate::calls::CallError::UnknownRoute)
            }

            /// The call's name.
            pub fn name(&self) -> &'static str {
                match self {
                    $( $name::$variant(_) => <$call as $crate::calls::Call>::NAME, )+
                }
            }

            /// Every call's name, in declaration order (for the tests of uniqueness).
            pub const NAMES: &'static [&'static str] =
                &[ $( <$call as $crate::calls::Call>::NAME, )+ ];
        }

        impl $crate::calls::CallEnum for $name {
            type Target = $target;

            fn name(&self) -> &'static str {
                $name::name(self)
            }

            fn to_json(&self) -> serde_json::Result<String> {
                match self {
                    $( $name::$variant(call) => serde_json::to_string(call), )+
                }
            }
        }

        $(
            impl From<$call> for $name {
                fn from(call: $call) -> Self {
                    $name::$variant(call)
                }
            }

            const _: fn() = || {
                fn same_target<C: $crate::calls::Call<Target = $target>>() {}
                same_target::<$call>();
            };
        )+
    };
}
pub(crate) use call_enum;

/// Implements [`Call`] for a struct: `call!(Struct => Target, "name", Reply);`.
macro_rules! call {
    ($call:ty => $target:ty, $name:literal, $reply:ty) => {
        impl $crate::calls::Call for $call {
            type Target = $target;
            type Reply = $reply;
            const NAME: &'static str = $name;
        }
    };
}
pub(crate) use call;

/// `{}` on the wire: a call with nothing to say, or a reply with nothing to say.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct Empty;

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Durable Object's call names are unique, so `decode` is unambiguous.
    #[test]
    fn call_names_are_unique_per_target() {
        for names in [
            session::SessionCall::NAMES,
            index::IndexCall::NAMES,
            hub::HubCall::NAMES,
            tokens::TokensCall::NAMES,
            channels::RegistryCall::NAMES,
            channels::BindingCall::NAMES,
        ] {
            let mut sorted = names.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), names.len(), "{names:?}");
            for name in names {
                assert!(
                    !name.is_empty()
                        && name
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'/'),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn errors_answer_with_their_status() {
        let cases = [
            (CallError::UnknownRoute, 404, "not_found"),
            (CallError::MethodNotAllowed, 405, "method_not_allowed"),
            (CallError::InvalidJson("x".into()), 400, "bad_request"),
            (CallError::BadRequest("x".into()), 400, "bad_request"),
        ];
        for (error, status, code) in cases {
            assert_eq!(error.status_and_code(), (status, code), "{error:?}");
        }
    }

    #[test]
    fn optional_bodies_default_when_blank() {
        #[derive(Deserialize, Default, Debug, PartialEq)]
        struct B {
            x: Option<u8>,
        }
        assert_eq!(decode_optional_body::<B>(b"  \n").unwrap(), B::default());
        assert_eq!(
            decode_optional_body::<B>(br#"{"x":3}"#).unwrap(),
            B { x: Some(3) }
        );
        assert!(matches!(
            decode_optional_body::<B>(b"[").unwrap_err(),
            CallError::InvalidJson(_)
        ));
    }

    #[test]
    fn numeric_query_parameters() {
        let pairs = |v: &str| vec![("n".to_string(), v.to_string())];
        assert_eq!(query_u64(&pairs("7"), "n"), Ok(Some(7)));
        assert_eq!(query_u64(&pairs(""), "n"), Ok(None));
        assert_eq!(query_u64(&[], "n"), Ok(None));
        assert!(matches!(
            query_u64(&pairs("-1"), "n"),
            Err(CallError::BadRequest(_))
        ));
    }
}
