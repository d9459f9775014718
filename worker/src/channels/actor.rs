//! `ChannelActor`: one Durable Object per binding (`binding:<id>`) and one per tenant
//! (`registry:<tenant>`, the list of its bindings). See the module docs of `channels`.
//!
//! A registry answers `wuhu_core::calls::channels::RegistryCall` (from the router, which allowed
//! admins only; the public origin hook URLs are built on travels in the call). A binding answers
//! `BindingCall`: from its registry, and `Hook` from the router (authenticated here by the
//! platform's signature).
//!
//! A binding's alarm does its background work: it polls the sessions whose turns a thread waits
//! for (`watches`), queues what to post (`outbox`), and posts it with retries. A hook answers as
//! soon as the message is enqueued in the session.

mod admission;
mod commands;
mod gateway;
mod hooks;
mod posting;
mod registry;

use posting::send_call;

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use futures::channel::oneshot;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use worker::{
    Date, DurableObject, Env, Fetch, Headers, Method, Request, RequestInit, Response, SqlStorage,
    State, durable_object,
};
use wuhu_core::authority::Access;
use wuhu_core::authority::Role;
use wuhu_core::calls::Empty;
use wuhu_core::calls::channels::{
    self as channel_calls, BindingCall, Listed, MembersChange, RegistryCall,
};
use wuhu_core::calls::session as session_calls;
use wuhu_core::channels::ChannelView;
use wuhu_core::channels::admit::{Origin, Standing};
use wuhu_core::channels::binding::{self, MAX_BINDINGS_PER_TENANT};
use wuhu_core::channels::members::{self, Member, Members};
use wuhu_core::channels::outbox::{self, Attempt, HttpCall, Outbound};
use wuhu_core::channels::seal::NONCE_BYTES;
use wuhu_core::channels::turn::{self, Scan};
use wuhu_core::channels::verify::{self, VerifyError};
use wuhu_core::channels::{
    self, ApprovalClick, ChannelBinding, Command, CommandKind, CreateChannelRequest, Credentials,
    Delivery, HookOutcome, Inbound, ListChannelsResponse, PatchChannelRequest, Platform,
    ReplyTarget, discord, generic, slack, telegram, text,
};
use wuhu_core::wire::{
    AnswerApprovalRequest, EnqueueRequest, EnqueueResponse, GetSessionResponse, Lane,
    PatchSessionRequest, SessionInfo,
};

use crate::auth::Identity;
use crate::http::{ApiError, ApiResult, json_response};
use crate::internal::{self, reply};
use crate::schema::{Migration, migrate};

#[durable_object]
pub struct ChannelActor {
    actor: Rc<Actor>,
}

/// The actor's state, shared with the work a hook hands over (`State::wait_until`).
struct Actor {
    sql: SqlStorage,
    /// Whether the schema migrated; every call answers its error otherwise.
    schema: Result<(), String>,
    state: State,
    env: Env,
    /// Threads whose session is being created, with the deliveries waiting for it: a thread's
    /// first messages arriving together (handlers interleave at every await) make one session.
    /// Borrows never cross an await.
    creating: RefCell<HashMap<String, Vec<oneshot::Sender<()>>>>,
    /// Inbox rows being delivered by this instance (the alarm leaves them alone).
    delivering: RefCell<HashSet<i64>>,
    /// Whether a task delivers Gateway messages from the inbox (one at a time, in order).
    draining: Cell<bool>,
    /// The Discord Gateway connection (Discord bindings only; decision 0018).
    gateway: RefCell<gateway::GatewayHandle>,
}

/// What became of a person's message at the hook ([`Actor::store_inbound`]).
enum Stored {
    /// In the inbox, row `seq`, on its way to its session.
    Inbox(i64),
    /// Seen before.
    Duplicate,
    /// Not admitted: what the hook answers (nothing stored).
    Refused(HookOutcome),
}

/// Marks a thread's session as being created until dropped; dropping wakes the deliveries
/// waiting for it (also when the creation failed or its request went away), which then look
/// the thread up again.
struct Creating<'a> {
    creating: &'a RefCell<HashMap<String, Vec<oneshot::Sender<()>>>>,
    thread_key: String,
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        // Dropping the senders wakes the waiters.
        self.creating.borrow_mut().remove(&self.thread_key);
    }
}

fn now_ms() -> u64 {
    Date::now().as_millis()
}

fn now_secs() -> i64 {
    (now_ms() / 1000) as i64
}

fn sql_err(e: worker::Error) -> ApiError {
    ApiError::internal(format!("storage: {e}"))
}

#[derive(Deserialize)]
struct BodyRow {
    body: String,
}

#[derive(Deserialize)]
struct BindingRow {
    body: String,
    sealed: String,
}

#[derive(Deserialize)]
struct RegistryRow {
    body: String,
    masked: String,
}

#[derive(Deserialize)]
struct CountRow {
    n: f64,
}

#[derive(Deserialize)]
struct ThreadRow {
    session: String,
    replied: f64,
    target: String,
}

#[derive(Deserialize)]
struct WatchRow {
    session: String,
    thread: String,
    target: String,
    author: String,
    scan: String,
    started: f64,
}

#[derive(Deserialize)]
struct OutboxRow {
    seq: f64,
    key: String,
    body: String,
    attempts: f64,
    due: f64,
    uncertain: f64,
    first_try: Option<f64>,
    session: Option<String>,
}

#[derive(Deserialize)]
struct RefRow {
    #[serde(rename = "ref")]
    r#ref: String,
}

#[derive(Deserialize)]
struct ApprovalRow {
    session: String,
    target: String,
}

#[derive(Deserialize)]
struct SeqRow {
    seq: f64,
}

#[derive(Deserialize)]
struct InboxRow {
    seq: f64,
    body: String,
}

/// The actor's schema, in order (numbered from 1 by position; never reorder or remove one): a
/// registry instance uses `registry`, a binding instance the rest. The first steps are the
/// statements run before migrations were numbered, harmless over tables they made.
const MIGRATIONS: &[Migration] = &[
    // Registry instances.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS registry (id TEXT PRIMARY KEY, body TEXT NOT NULL, masked TEXT NOT NULL, created_at INTEGER NOT NULL)",
    ),
    // Binding instances.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS binding (k INTEGER PRIMARY KEY CHECK (k = 1), body TEXT NOT NULL, sealed TEXT NOT NULL)",
    ),
    Migration::Sql("CREATE TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY, at INTEGER NOT NULL)"),
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS threads (key TEXT PRIMARY KEY, session TEXT NOT NULL, target TEXT NOT NULL, replied INTEGER NOT NULL, used_at INTEGER NOT NULL)",
    ),
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS watches (session TEXT PRIMARY KEY, thread TEXT NOT NULL, target TEXT NOT NULL, author TEXT NOT NULL, scan TEXT NOT NULL, started INTEGER NOT NULL)",
    ),
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, body TEXT NOT NULL, attempts INTEGER NOT NULL, due INTEGER NOT NULL, sent INTEGER NOT NULL DEFAULT 0, ref TEXT)",
    ),
    // Approval requests this binding posted: a click names only the approval.
    // Outboxes made before edits were tracked.
    Migration::AddColumn {
        table: "outbox",
        column: "ref",
        definition: "TEXT",
    },
    // A try whose outcome is not known (started, no answer yet or a 5xx): before the
    // next try the platform is asked whether it was posted (where it can tell).
    Migration::AddColumn {
        table: "outbox",
        column: "uncertain",
        definition: "INTEGER NOT NULL DEFAULT 0",
    },
    // When it was first tried (unix seconds): where a lookup starts.
    Migration::AddColumn {
        table: "outbox",
        column: "first_try",
        definition: "INTEGER",
    },
    // The session the message is about, told when the message is given up.
    Migration::AddColumn {
        table: "outbox",
        column: "session",
        definition: "TEXT",
    },
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS approvals (approval_id TEXT PRIMARY KEY, session TEXT NOT NULL, target TEXT NOT NULL, at INTEGER NOT NULL)",
    ),
    // Platform users mapped to Wuhu people (at most `MAX_MEMBERS_PER_BINDING`).
    Migration::Sql("CREATE TABLE IF NOT EXISTS members (user TEXT PRIMARY KEY, sub TEXT NOT NULL)"),
    // Messages a hook accepted and not yet delivered to their session (at most
    // `channels::MAX_INBOX`): stored with the dedupe keys before the hook answers, so
    // nothing acknowledged is lost. `due`: when the alarm takes it (should its hook's
    // own delivery not finish), or tries it again.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS inbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, due INTEGER NOT NULL)",
    ),
    // A Discord binding's Gateway connection: `channels::gateway::Saved` as JSON.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS gateway (k INTEGER PRIMARY KEY CHECK (k = 1), saved TEXT NOT NULL)",
    ),
    // Guests' admitted messages of the last hour (`session` 1: it started one), counted
    // against the binding's guest quota; at most the quota's all-guests bounds.
    Migration::Sql(
        "CREATE TABLE IF NOT EXISTS guest_usage (seq INTEGER PRIMARY KEY AUTOINCREMENT, user TEXT NOT NULL, session INTEGER NOT NULL, at INTEGER NOT NULL)",
    ),
    // Whom the binding told it refused (`refused:<user>`, `quota:<user>`) in the last
    // hour: told once an hour at most (at most `admit::MAX_NOTICED` rows).
    Migration::Sql("CREATE TABLE IF NOT EXISTS told (key TEXT PRIMARY KEY, at INTEGER NOT NULL)"),
];

#[derive(Deserialize)]
struct DueRow {
    due: f64,
}

impl DurableObject for ChannelActor {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        let schema = migrate(&sql, "channel", MIGRATIONS);
        if let Err(e) = &schema {
            worker::console_error!("channel actor: {e}");
        }
        ChannelActor {
            actor: Rc::new(Actor {
                sql,
                schema,
                state,
                env,
                creating: RefCell::new(HashMap::new()),
                delivering: RefCell::new(HashSet::new()),
                draining: Cell::new(false),
                gateway: RefCell::new(gateway::GatewayHandle::default()),
            }),
        }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        Ok(match self.actor.route(req).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        })
    }

    async fn alarm(&self) -> worker::Result<Response> {
        if let Err(e) = self.actor.background().await {
            worker::console_error!("channel background work failed: {}", e.message);
        }
        self.actor.rearm().await;
        Response::ok("ok")
    }
}

impl Actor {
    /// Decodes the call `req` carries (one of the registry's or one of a binding's: the
    /// actor's name says which it is) and answers it.
    async fn route(self: &Rc<Self>, mut req: Request) -> ApiResult<Response> {
        if let Err(e) = &self.schema {
            return Err(ApiError::new(500, "storage_failed", e.clone()));
        }
        let (name, body) = internal::call_parts(&mut req).await?;
        if let Ok(call) = RegistryCall::decode(&name, &body) {
            let identity = Identity::from_headers(&req)?;
            return self.registry_call(&identity, call).await;
        }
        let call = BindingCall::decode(&name, &body).map_err(internal::call_error)?;
        self.binding_call(call).await
    }

    async fn registry_call(
        self: &Rc<Self>,
        identity: &Identity,
        call: RegistryCall,
    ) -> ApiResult<Response> {
        match call {
            RegistryCall::ListBindings(c) => Ok(reply(&c, &self.registry_list(&c.origin)?)),
            RegistryCall::CreateBinding(c) => {
                let created = self
                    .registry_create(&c.origin, identity, c.request.clone())
                    .await?;
                Ok(reply(&c, &created))
            }
            RegistryCall::GetBinding(c) => {
                let listed = self.listed(&c.id)?;
                let mut view = view(&c.origin, &listed);
                if listed.binding.platform == Platform::Discord {
                    view.gateway =
                        send_binding(&self.env, &identity.tenant, &c.id, &channel_calls::Gateway)
                            .await
                            .ok();
                }
                Ok(reply(&c, &view))
            }
            RegistryCall::PatchBinding(c) => {
                self.listed(&c.id)?;
                let change = channel_calls::ChangeBinding(c.request.clone());
                let listed = send_binding(&self.env, &identity.tenant, &c.id, &change).await?;
                self.sql
                    .exec(
                        "UPDATE registry SET body = ?, masked = ? WHERE id = ?",
                        vec![
                            to_json(&listed.binding)?.into(),
                            to_json(&listed.masked)?.into(),
                            c.id.clone().into(),
                        ],
                    )
                    .map_err(sql_err)?;
                Ok(reply(&c, &view(&c.origin, &listed)))
            }
            RegistryCall::DeleteBinding(c) => {
                self.listed(&c.id)?;
                send_binding(&self.env, &identity.tenant, &c.id, &channel_calls::Forget).await?;
                self.sql
                    .exec(
                        "DELETE FROM registry WHERE id = ?",
                        vec![c.id.clone().into()],
                    )
                    .map_err(sql_err)?;
                Ok(reply(&c, &Empty))
            }
            RegistryCall::BindingMembers(c) => {
                self.listed(&c.id)?;
                let change = channel_calls::ChangeMembers(c.change.clone());
                let members = send_binding(&self.env, &identity.tenant, &c.id, &change).await?;
                Ok(reply(&c, &members))
            }
            RegistryCall::SlackPinned(c) => {
                let mut listed = self.listed(&c.id)?;
                // Only a pin the copy lacks: a PATCH that pinned meanwhile stays.
                if listed.binding.team_id.is_none() {
                    listed.binding.team_id = Some(c.team_id.clone());
                    listed.binding.api_app_id = Some(c.api_app_id.clone());
                    listed.binding.enterprise_id = c.enterprise_id.clone();
                    self.sql
                        .exec(
                            "UPDATE registry SET body = ? WHERE id = ?",
                            vec![to_json(&listed.binding)?.into(), c.id.clone().into()],
                        )
                        .map_err(sql_err)?;
                }
                Ok(reply(&c, &Empty))
            }
        }
    }

    async fn binding_call(self: &Rc<Self>, call: BindingCall) -> ApiResult<Response> {
        match call {
            BindingCall::ChangeMembers(c) => {
                let members = match &c.0 {
                    MembersChange::Get => self.members()?,
                    MembersChange::Put { members } => self.put_members(members)?,
                    MembersChange::Delete => {
                        self.sql
                            .exec("DELETE FROM members", None)
                            .map_err(sql_err)?;
                        self.members()?
                    }
                };
                Ok(reply(&c, &members))
            }
            BindingCall::InitBinding(c) => {
                self.binding_init(&c)?;
                self.binding_changed().await?;
                Ok(reply(&c, &Empty))
            }
            BindingCall::ChangeBinding(c) => {
                let listed = self.binding_patch(&c.0)?;
                self.binding_changed().await?;
                Ok(reply(&c, &listed))
            }
            BindingCall::Gateway(c) => Ok(reply(&c, &self.gateway_status())),
            BindingCall::Forget(c) => {
                for table in [
                    "binding",
                    "seen",
                    "threads",
                    "watches",
                    "outbox",
                    "approvals",
                    "members",
                    "gateway",
                    "guest_usage",
                    "told",
                ] {
                    self.sql
                        .exec(&format!("DELETE FROM {table}"), None)
                        .map_err(sql_err)?;
                }
                self.gateway_stop();
                let _ = self.state.storage().delete_alarm().await;
                Ok(reply(&c, &Empty))
            }
            BindingCall::Hook(c) => self.hook(&c).await,
        }
    }
}

/// A binding's view for a reader of `req` (the webhook URL on the public origin).
fn view(origin: &str, listed: &Listed) -> ChannelView {
    binding::view(&listed.binding, &listed.masked, origin)
}

/// Sends `call` to binding `id`'s actor.
async fn send_binding<C: wuhu_core::calls::Call>(
    env: &Env,
    tenant: &str,
    id: &str,
    call: &C,
) -> ApiResult<C::Reply> {
    let stub = super::stub(env, &format!("binding:{id}"))?;
    internal::call(&stub, &Identity::system(tenant), call).await
}

/// A person of the binding's tenant, as the session calls made for them carry it (a member's
/// rights: the session's rules decide the rest).
fn person(tenant: &str, sub: &str) -> Identity {
    Identity {
        sub: sub.to_string(),
        ..Identity::system(tenant)
    }
}

fn to_json<T: Serialize>(value: &T) -> ApiResult<String> {
    serde_json::to_string(value).map_err(|e| ApiError::internal(e.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> ApiResult<T> {
    serde_json::from_str(text).map_err(|e| ApiError::internal(format!("corrupt channel row: {e}")))
}
