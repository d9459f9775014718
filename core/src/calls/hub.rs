//! The calls a tenant's runner hub (`RunnerHub`, one per tenant) answers: runners' WebSocket
//! connections, the runner list, environment definitions, resolving `request_environment`,
//! requests to a runner, workspaces to discard, and revoked runner tokens.

use serde::{Deserialize, Serialize};

use super::{CallError, Empty, Method, Streamed, Target, Upgrade, call, call_enum, decode_body};
use crate::wire::runner::{DiscardWorkspacesRequest, DiscardWorkspacesResponse};
use crate::wire::{
    CreateEnvironmentRequest, EnvironmentDefinition, ListEnvironmentsResponse, ListRunnersResponse,
    ResolveEnvironmentRequest, ResolveEnvironmentResponse, RunnerCallRequest, RunnerCallResponse,
    UpdateEnvironmentRequest,
};

/// The tenant's runner hub.
#[derive(Debug)]
pub struct Hub;

impl Target for Hub {
    const HOST: &'static str = "hub";
}

/// `GET /v1/runners/connect`: a runner's WebSocket (an upgrade).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Connect {
    /// The runner token's `jti`, when it is revocable: revoking it closes the socket.
    pub jti: Option<String>,
}
call!(Connect => Hub, "connect", Streamed);
impl Upgrade for Connect {}

/// `GET /v1/runners`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct ListRunners;
call!(ListRunners => Hub, "runners", ListRunnersResponse);

/// `DELETE /v1/runners/:owner/:name`: frees a runner name.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FreeRunner {
    /// The name's owner.
    pub owner: String,
    /// The name.
    pub name: String,
}
call!(FreeRunner => Hub, "free_runner", Empty);

/// `GET /v1/environments`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct ListEnvironments;
call!(ListEnvironments => Hub, "environments", ListEnvironmentsResponse);

/// `POST /v1/environments`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CreateEnvironment(pub CreateEnvironmentRequest);
call!(CreateEnvironment => Hub, "create_environment", EnvironmentDefinition);

/// `GET /v1/environments/:idOrName`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GetEnvironment {
    /// Id or name.
    pub key: String,
}
call!(GetEnvironment => Hub, "environment", EnvironmentDefinition);

/// `PATCH /v1/environments/:idOrName`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct UpdateEnvironment {
    /// Id or name.
    pub key: String,
    /// The change.
    pub request: UpdateEnvironmentRequest,
}
call!(UpdateEnvironment => Hub, "update_environment", EnvironmentDefinition);

/// `DELETE /v1/environments/:idOrName`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DeleteEnvironment {
    /// Id or name.
    pub key: String,
}
call!(DeleteEnvironment => Hub, "delete_environment", Empty);

/// Which environment, on which runner, a session's `request_environment` gets.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Resolve(pub ResolveEnvironmentRequest);
call!(Resolve => Hub, "resolve", ResolveEnvironmentResponse);

/// Sends a request frame to a runner and waits for its answer.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CallRunner(pub RunnerCallRequest);
call!(CallRunner => Hub, "call", RunnerCallResponse);

/// A deleted session's workspaces on runners: sent now, or at the runner's next hello.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Discard(pub DiscardWorkspacesRequest);
call!(Discard => Hub, "discard", DiscardWorkspacesResponse);

/// Runner tokens were revoked (one, its tree, or everything of a user): the sockets that
/// connected with any of them close. At most `wuhu_core::tokens::MAX_CREDENTIALS_PER_TENANT`
/// (the registry's bound), so one call carries a whole revocation.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Revoked {
    /// The tokens' `jti`s.
    pub jtis: Vec<String>,
}
call!(Revoked => Hub, "revoked", Closed);

/// How many sockets [`Revoked`] closed.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    /// Sockets closed.
    pub closed: usize,
}

call_enum! {
    /// Every call a tenant's runner hub answers.
    pub enum HubCall for Hub {
        Connect(Connect),
        ListRunners(ListRunners),
        FreeRunner(FreeRunner),
        ListEnvironments(ListEnvironments),
        CreateEnvironment(CreateEnvironment),
        GetEnvironment(GetEnvironment),
        UpdateEnvironment(UpdateEnvironment),
        DeleteEnvironment(DeleteEnvironment),
        Resolve(Resolve),
        CallRunner(CallRunner),
        Discard(Discard),
        Revoked(Revoked),
    }
}

/// Decodes the public routes the hub answers (`route` is the path under `/v1`, its segments
/// percent-decoded): `GET /v1/runners`, `DELETE /v1/runners/:owner/:name`, and
/// `/v1/environments[/:idOrName]`. The runner's `connect` is decoded by the router itself
/// (a runner token, an upgrade).
///
/// # Errors
/// A [`CallError`] for an unknown route or method, or a body that is not the route's JSON.
pub fn decode_public(method: Method, route: &[&str], body: &[u8]) -> Result<HubCall, CallError> {
    Ok(match (route, method) {
        (["runners"], Method::Get) => ListRunners.into(),
        (["runners", owner, name], Method::Delete) => FreeRunner {
            owner: (*owner).to_string(),
            name: (*name).to_string(),
        }
        .into(),
        (["environments"], Method::Get) => ListEnvironments.into(),
        (["environments"], Method::Post) => CreateEnvironment(decode_body(body)?).into(),
        (["environments", key], Method::Get) => GetEnvironment {
            key: (*key).to_string(),
        }
        .into(),
        (["environments", key], Method::Patch) => UpdateEnvironment {
            key: (*key).to_string(),
            request: decode_body(body)?,
        }
        .into(),
        (["environments", key], Method::Delete) => DeleteEnvironment {
            key: (*key).to_string(),
        }
        .into(),
        (["runners"] | ["runners", _, _] | ["environments"] | ["environments", _], _) => {
            return Err(CallError::MethodNotAllowed);
        }
        _ => return Err(CallError::UnknownRoute),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_routes() {
        let cases: [(Method, &[&str], &str, &str); 10] = [
            (Method::Get, &["runners"], "", "runners"),
            (
                Method::Delete,
                &["runners", "alice", "mac"],
                "",
                "free_runner",
            ),
            (Method::Post, &["runners"], "", "405"),
            (Method::Get, &["runners", "connect"], "", "404"),
            (Method::Get, &["environments"], "", "environments"),
            (Method::Post, &["environments"], "{", "400"),
            (Method::Get, &["environments", "api"], "", "environment"),
            (
                Method::Patch,
                &["environments", "api"],
                "{}",
                "update_environment",
            ),
            (
                Method::Delete,
                &["environments", "api"],
                "",
                "delete_environment",
            ),
            (Method::Put, &["environments", "api"], "", "405"),
        ];
        for (method, route, body, want) in cases {
            let got = match decode_public(method, route, body.as_bytes()) {
                Ok(call) => call.name().to_string(),
                Err(e) => e.status_and_code().0.to_string(),
            };
            assert_eq!(got, want, "{method:?} {route:?}");
        }
    }
}
