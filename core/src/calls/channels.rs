//! The calls a chat channel's actors answer (`ChannelActor`, one class in two roles): the
//! tenant's registry (`registry:<tenant>`, the list of bindings behind `/v1/channels`) and each
//! binding (`binding:<id>`: its sealed credentials, members, threads, outbox, and the
//! platform's hooks).

use serde::{Deserialize, Serialize};

use super::{CallError, Empty, Method, Streamed, Target, call, call_enum, decode_body};
use crate::channels::gateway::GatewayStatus;
use crate::channels::members::Members;
use crate::channels::{
    ChannelBinding, ChannelView, CreateChannelRequest, Credentials, ListChannelsResponse,
    PatchChannelRequest, Platform,
};

/// A channel actor (the registry or a binding: one class).
#[derive(Debug)]
pub struct Channels;

impl Target for Channels {
    const HOST: &'static str = "channels";
}

/// `GET /v1/channels`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ListBindings {
    /// The public origin hook URLs are built on.
    pub origin: String,
}
call!(ListBindings => Channels, "registry_list", ListChannelsResponse);

/// `POST /v1/channels`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CreateBinding {
    /// The public origin hook URLs are built on.
    pub origin: String,
    /// The binding.
    pub request: CreateChannelRequest,
}
call!(CreateBinding => Channels, "registry_create", ChannelView);

/// `GET /v1/channels/:id`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GetBinding {
    /// The public origin hook URLs are built on.
    pub origin: String,
    /// The binding.
    pub id: String,
}
call!(GetBinding => Channels, "registry_get", ChannelView);

/// `PATCH /v1/channels/:id`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PatchBinding {
    /// The public origin hook URLs are built on.
    pub origin: String,
    /// The binding.
    pub id: String,
    /// The change.
    pub request: PatchChannelRequest,
}
call!(PatchBinding => Channels, "registry_patch", ChannelView);

/// `DELETE /v1/channels/:id`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct DeleteBinding {
    /// The binding.
    pub id: String,
}
call!(DeleteBinding => Channels, "registry_delete", Empty);

/// `GET|PUT|DELETE /v1/channels/:id/members`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BindingMembers {
    /// The binding.
    pub id: String,
    /// What to do with its members.
    pub change: MembersChange,
}
call!(BindingMembers => Channels, "registry_members", Members);

/// What a members call does.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum MembersChange {
    /// Reads them.
    Get,
    /// Replaces them with a checked list.
    Put {
        /// The new list.
        members: Members,
    },
    /// Removes every mapping.
    Delete,
}

/// A binding's actor tells its registry the Slack workspace and app it pinned at its first
/// verified delivery (a binding stored before pins existed): the registry's copy shows them.
/// Never a public route. The registry fills only a pin its copy lacks, so a PATCH racing it
/// is not undone.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SlackPinned {
    /// The binding.
    pub id: String,
    /// `team_id`.
    pub team_id: String,
    /// `api_app_id`.
    pub api_app_id: String,
    /// `enterprise_id`.
    pub enterprise_id: Option<String>,
}
call!(SlackPinned => Channels, "registry_slack_pinned", Empty);

call_enum! {
    /// Every call a tenant's channel registry answers.
    pub enum RegistryCall for Channels {
        ListBindings(ListBindings),
        CreateBinding(CreateBinding),
        GetBinding(GetBinding),
        PatchBinding(PatchBinding),
        DeleteBinding(DeleteBinding),
        BindingMembers(BindingMembers),
        SlackPinned(SlackPinned),
    }
}

/// A new binding's actor keeps its binding and seals its credentials.
#[derive(Serialize, Deserialize, Clone, PartialEq)]
pub struct InitBinding {
    /// The binding.
    pub binding: ChannelBinding,
    /// Its credentials (sealed by the binding's actor, never stored in the clear).
    pub credentials: Credentials,
}
call!(InitBinding => Channels, "binding_init", Empty);

impl std::fmt::Debug for InitBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitBinding")
            .field("binding", &self.binding.id)
            .finish_non_exhaustive()
    }
}

/// A binding's actor applies a change.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ChangeBinding(pub PatchChannelRequest);
call!(ChangeBinding => Channels, "binding_patch", Listed);

/// What a registry keeps of each binding (no secret, not even sealed).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Listed {
    /// The binding.
    pub binding: ChannelBinding,
    /// Its credentials, masked.
    pub masked: serde_json::Map<String, serde_json::Value>,
}

/// A Discord binding's Gateway connection.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Gateway;
call!(Gateway => Channels, "binding_gateway", GatewayStatus);

/// The binding's actor forgets everything (its registry row goes too).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Forget;
call!(Forget => Channels, "binding_delete", Empty);

/// The binding's members (see [`MembersChange`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ChangeMembers(pub MembersChange);
call!(ChangeMembers => Channels, "binding_members", Members);

/// `POST /hooks/<platform>/:id`: a platform's delivery, verified by the binding's actor with
/// its secret. The answer is the platform's (passed through).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Hook {
    /// The platform the URL names.
    pub platform: Platform,
    /// The request's headers, lowercased (signatures and timestamps are among them; no
    /// `x-wuhu-*` header, which the router drops).
    pub headers: Vec<(String, String)>,
    /// The body, exactly as it came (the signature covers it).
    pub body: String,
}
call!(Hook => Channels, "binding_hook", Streamed);

impl Hook {
    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

call_enum! {
    /// Every call a binding's actor answers.
    pub enum BindingCall for Channels {
        InitBinding(InitBinding),
        ChangeBinding(ChangeBinding),
        Gateway(Gateway),
        Forget(Forget),
        ChangeMembers(ChangeMembers),
        Hook(Hook),
    }
}

/// Whether `id` looks like a binding id (a UUID).
pub fn valid_binding_id(id: &str) -> bool {
    id.len() == 36 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Decodes `/v1/channels[/:id[/members]]` (`route` is the path under `/v1`) into a registry
/// call; `origin` is the public origin hook URLs are built on.
///
/// # Errors
/// A [`CallError`] for an unknown route or method (an id that is no binding id is not found),
/// or a body that is not the route's JSON.
pub fn decode_public(
    method: Method,
    route: &[&str],
    body: &[u8],
    origin: &str,
) -> Result<RegistryCall, CallError> {
    let origin = origin.to_string();
    if let ["channels", id, ..] = route
        && !valid_binding_id(id)
    {
        return Err(CallError::UnknownRoute);
    }
    Ok(match (route, method) {
        (["channels"], Method::Get) => ListBindings { origin }.into(),
        (["channels"], Method::Post) => CreateBinding {
            origin,
            request: decode_body(body)?,
        }
        .into(),
        (["channels", id], Method::Get) => GetBinding {
            origin,
            id: (*id).to_string(),
        }
        .into(),
        (["channels", id], Method::Patch) => PatchBinding {
            origin,
            id: (*id).to_string(),
            request: decode_body(body)?,
        }
        .into(),
        (["channels", id], Method::Delete) => DeleteBinding {
            id: (*id).to_string(),
        }
        .into(),
        (["channels", id, "members"], method @ (Method::Get | Method::Put | Method::Delete)) => {
            let change = match method {
                Method::Get => MembersChange::Get,
                Method::Put => MembersChange::Put {
                    members: decode_body(body)?,
                },
                _ => MembersChange::Delete,
            };
            BindingMembers {
                id: (*id).to_string(),
                change,
            }
            .into()
        }
        (["channels"] | ["channels", _] | ["channels", _, "members"], _) => {
            return Err(CallError::MethodNotAllowed);
        }
        _ => return Err(CallError::UnknownRoute),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0b8a5c1e-2f3d-4e5f-8a9b-0c1d2e3f4a5b";

    #[test]
    fn public_routes() {
        let cases: [(Method, Vec<&str>, &str, &str); 9] = [
            (Method::Get, vec!["channels"], "", "registry_list"),
            (Method::Post, vec!["channels"], "{", "400"),
            (Method::Get, vec!["channels", ID], "", "registry_get"),
            (Method::Delete, vec!["channels", ID], "", "registry_delete"),
            (Method::Get, vec!["channels", "nope"], "", "404"),
            (
                Method::Put,
                vec!["channels", ID, "members"],
                r#"{"members":[]}"#,
                "registry_members",
            ),
            (Method::Post, vec!["channels", ID, "members"], "", "405"),
            (Method::Put, vec!["channels"], "", "405"),
            (Method::Get, vec!["channels", ID, "other"], "", "404"),
        ];
        for (method, route, body, want) in cases {
            let got = match decode_public(method, &route, body.as_bytes(), "https://w") {
                Ok(call) => call.name().to_string(),
                Err(e) => e.status_and_code().0.to_string(),
            };
            assert_eq!(got, want, "{method:?} {route:?}");
        }
    }

    #[test]
    fn registry_and_binding_names_do_not_collide() {
        for name in RegistryCall::NAMES {
            assert!(!BindingCall::NAMES.contains(name), "{name}");
        }
    }
}

#[cfg(test)]
mod hook_roundtrip {
    use super::*;
    use crate::calls::Call;

    #[test]
    fn a_hook_keeps_its_headers_and_body() {
        let hook = Hook {
            platform: Platform::Slack,
            headers: vec![("x-slack-signature".into(), "v0=ab".into())],
            body: "{\"a\":1}".into(),
        };
        let json = serde_json::to_vec(&hook).unwrap();
        let BindingCall::Hook(back) = BindingCall::decode(Hook::NAME, &json).unwrap() else {
            panic!("not a hook");
        };
        assert_eq!(back, hook);
        assert_eq!(back.header("x-slack-signature"), Some("v0=ab"));
    }
}
