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
mod gateway;

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

#[durable_object]
pub struct ChannelActor {
    actor: Rc<Actor>,
}

/// The actor's state, shared with the work a hook hands over (`State::wait_until`).
struct Actor {
    sql: SqlStorage,
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

#[derive(Deserialize)]
struct DueRow {
    due: f64,
}

impl DurableObject for ChannelActor {
    fn new(state: State, env: Env) -> Self {
        let sql = state.storage().sql();
        for ddl in [
            // Registry instances.
            "CREATE TABLE IF NOT EXISTS registry (id TEXT PRIMARY KEY, body TEXT NOT NULL, masked TEXT NOT NULL, created_at INTEGER NOT NULL)",
            // Binding instances.
            "CREATE TABLE IF NOT EXISTS binding (k INTEGER PRIMARY KEY CHECK (k = 1), body TEXT NOT NULL, sealed TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS seen (key TEXT PRIMARY KEY, at INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS threads (key TEXT PRIMARY KEY, session TEXT NOT NULL, target TEXT NOT NULL, replied INTEGER NOT NULL, used_at INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS watches (session TEXT PRIMARY KEY, thread TEXT NOT NULL, target TEXT NOT NULL, author TEXT NOT NULL, scan TEXT NOT NULL, started INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, body TEXT NOT NULL, attempts INTEGER NOT NULL, due INTEGER NOT NULL, sent INTEGER NOT NULL DEFAULT 0, ref TEXT)",
            // Approval requests this binding posted: a click names only the approval.
            // Outboxes made before edits were tracked (fails harmlessly once the column exists).
            "ALTER TABLE outbox ADD COLUMN ref TEXT",
            // A try whose outcome is not known (started, no answer yet or a 5xx): before the
            // next try the platform is asked whether it was posted (where it can tell).
            "ALTER TABLE outbox ADD COLUMN uncertain INTEGER NOT NULL DEFAULT 0",
            // When it was first tried (unix seconds): where a lookup starts.
            "ALTER TABLE outbox ADD COLUMN first_try INTEGER",
            // The session the message is about, told when the message is given up.
            "ALTER TABLE outbox ADD COLUMN session TEXT",
            "CREATE TABLE IF NOT EXISTS approvals (approval_id TEXT PRIMARY KEY, session TEXT NOT NULL, target TEXT NOT NULL, at INTEGER NOT NULL)",
            // Platform users mapped to Wuhu people (at most `MAX_MEMBERS_PER_BINDING`).
            "CREATE TABLE IF NOT EXISTS members (user TEXT PRIMARY KEY, sub TEXT NOT NULL)",
            // Messages a hook accepted and not yet delivered to their session (at most
            // `channels::MAX_INBOX`): stored with the dedupe keys before the hook answers, so
            // nothing acknowledged is lost. `due`: when the alarm takes it (should its hook's
            // own delivery not finish), or tries it again.
            "CREATE TABLE IF NOT EXISTS inbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, due INTEGER NOT NULL)",
            // A Discord binding's Gateway connection: `channels::gateway::Saved` as JSON.
            "CREATE TABLE IF NOT EXISTS gateway (k INTEGER PRIMARY KEY CHECK (k = 1), saved TEXT NOT NULL)",
            // Guests' admitted messages of the last hour (`session` 1: it started one), counted
            // against the binding's guest quota; at most the quota's all-guests bounds.
            "CREATE TABLE IF NOT EXISTS guest_usage (seq INTEGER PRIMARY KEY AUTOINCREMENT, user TEXT NOT NULL, session INTEGER NOT NULL, at INTEGER NOT NULL)",
            // Whom the binding told it refused (`refused:<user>`, `quota:<user>`) in the last
            // hour: told once an hour at most (at most `admit::MAX_NOTICED` rows).
            "CREATE TABLE IF NOT EXISTS told (key TEXT PRIMARY KEY, at INTEGER NOT NULL)",
        ] {
            let _ = sql.exec(ddl, None);
        }
        ChannelActor {
            actor: Rc::new(Actor {
                sql,
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

    // -----------------------------------------------------------------------------------------
    // Registry

    fn listed(&self, id: &str) -> ApiResult<Listed> {
        let rows: Vec<RegistryRow> = self
            .sql
            .exec(
                "SELECT body, masked FROM registry WHERE id = ?",
                vec![id.into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::not_found("no such channel"))?;
        Ok(Listed {
            binding: from_json(&row.body)?,
            masked: from_json(&row.masked)?,
        })
    }

    fn registry_list(&self, origin: &str) -> ApiResult<ListChannelsResponse> {
        let rows: Vec<RegistryRow> = self
            .sql
            .exec(
                "SELECT body, masked FROM registry ORDER BY created_at, id",
                None,
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let mut channels = Vec::with_capacity(rows.len());
        for row in rows {
            let listed = Listed {
                binding: from_json(&row.body)?,
                masked: from_json(&row.masked)?,
            };
            channels.push(view(origin, &listed));
        }
        Ok(ListChannelsResponse { channels })
    }

    async fn registry_create(
        &self,
        origin: &str,
        identity: &Identity,
        request: CreateChannelRequest,
    ) -> ApiResult<ChannelView> {
        let id = uuid::Uuid::new_v4().to_string();
        let (binding, credentials) = request
            .into_binding(
                id.clone(),
                identity.tenant.clone(),
                identity.sub.clone(),
                now_secs(),
            )
            .map_err(ApiError::bad_request)?;
        binding
            .defaults
            .check_provider_allowed(crate::model_choice::fake_enabled(&self.env))
            .map_err(crate::model_choice::provider_refused)?;
        let count: Vec<CountRow> = self
            .sql
            .exec("SELECT COUNT(*) AS n FROM registry", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        if count.first().map_or(0, |c| c.n as usize) >= MAX_BINDINGS_PER_TENANT {
            return Err(ApiError::new(
                409,
                "too_many_channels",
                format!("a tenant may have at most {MAX_BINDINGS_PER_TENANT} channels"),
            ));
        }
        let listed = Listed {
            masked: credentials.masked(),
            binding: binding.clone(),
        };
        // Reserved before the binding's actor is called, so concurrent creates cannot pass the
        // bound together (handlers interleave at awaits).
        self.sql
            .exec(
                "INSERT INTO registry (id, body, masked, created_at) VALUES (?, ?, ?, ?)",
                vec![
                    id.clone().into(),
                    to_json(&listed.binding)?.into(),
                    to_json(&listed.masked)?.into(),
                    (now_ms() as i64).into(),
                ],
            )
            .map_err(sql_err)?;
        let init = channel_calls::InitBinding {
            binding,
            credentials,
        };
        let result = send_binding(&self.env, &identity.tenant, &id, &init).await;
        if let Err(e) = result {
            let _ = self
                .sql
                .exec("DELETE FROM registry WHERE id = ?", vec![id.into()]);
            return Err(e);
        }
        Ok(view(origin, &listed))
    }

    // -----------------------------------------------------------------------------------------
    // Binding

    fn binding_init(&self, init: &channel_calls::InitBinding) -> ApiResult<()> {
        if self.load_binding()?.is_some() {
            return Err(ApiError::new(409, "conflict", "binding exists"));
        }
        let sealed = self.seal(&init.binding.id, &init.credentials)?;
        self.sql
            .exec(
                "INSERT INTO binding (k, body, sealed) VALUES (1, ?, ?)",
                vec![to_json(&init.binding)?.into(), sealed.into()],
            )
            .map_err(sql_err)?;
        Ok(())
    }

    fn binding_patch(&self, patch: &PatchChannelRequest) -> ApiResult<Listed> {
        let (binding, credentials) = self
            .load_binding()?
            .ok_or_else(|| ApiError::not_found("no such channel"))?;
        let (next, new_credentials) = patch
            .clone()
            .apply(&binding, now_secs())
            .map_err(ApiError::bad_request)?;
        next.defaults
            .check_provider_allowed(crate::model_choice::fake_enabled(&self.env))
            .map_err(crate::model_choice::provider_refused)?;
        let credentials = new_credentials.unwrap_or(credentials);
        let sealed = self.seal(&next.id, &credentials)?;
        self.sql
            .exec(
                "UPDATE binding SET body = ?, sealed = ? WHERE k = 1",
                vec![to_json(&next)?.into(), sealed.into()],
            )
            .map_err(sql_err)?;
        Ok(Listed {
            binding: next,
            masked: credentials.masked(),
        })
    }

    /// After a create or patch: a Discord binding's Gateway connection starts afresh (the token
    /// may be new), watched by the alarm.
    async fn binding_changed(self: &Rc<Self>) -> ApiResult<()> {
        let (binding, _) = self
            .load_binding()?
            .ok_or_else(|| ApiError::not_found("no such channel"))?;
        if binding.platform == Platform::Discord {
            self.gateway_restart(&binding);
            self.arm_by(now_ms() + channels::gateway::WATCHDOG_MS).await;
        }
        Ok(())
    }

    /// Every mapped member, in user order.
    fn members(&self) -> ApiResult<Members> {
        let members: Vec<Member> = self
            .sql
            .exec("SELECT user, sub FROM members ORDER BY user", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        Ok(Members { members })
    }

    /// Replaces the member list with a checked one.
    fn put_members(&self, next: &Members) -> ApiResult<Members> {
        let (binding, _) = self
            .load_binding()?
            .ok_or_else(|| ApiError::not_found("no such channel"))?;
        members::check(binding.platform, next).map_err(ApiError::bad_request)?;
        // One synchronous block: no await between the delete and the inserts, so no hook sees
        // a half-written list.
        self.sql
            .exec("DELETE FROM members", None)
            .map_err(sql_err)?;
        for member in &next.members {
            self.sql
                .exec(
                    "INSERT INTO members (user, sub) VALUES (?, ?)",
                    vec![member.user.clone().into(), member.sub.clone().into()],
                )
                .map_err(sql_err)?;
        }
        self.members()
    }

    /// Who platform user `user` is in Wuhu: their mapped `sub`, else `<platform>:<id>`.
    fn who(&self, binding: &ChannelBinding, user: &str) -> ApiResult<String> {
        Ok(members::identity(
            binding.platform,
            user,
            self.mapped_sub(user)?.as_deref(),
        ))
    }

    /// The `sub` an admin mapped platform user `user` to, if any.
    fn mapped_sub(&self, user: &str) -> ApiResult<Option<String>> {
        let mapped: Vec<Member> = self
            .sql
            .exec(
                "SELECT user, sub FROM members WHERE user = ?",
                vec![user.into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        Ok(mapped.into_iter().next().map(|m| m.sub))
    }

    fn seal(&self, id: &str, credentials: &Credentials) -> ApiResult<String> {
        let key = super::channel_key(&self.env)?;
        let mut nonce = [0u8; NONCE_BYTES];
        getrandom::getrandom(&mut nonce)
            .map_err(|_| ApiError::internal("no randomness for a nonce"))?;
        let plain =
            serde_json::to_vec(credentials).map_err(|e| ApiError::internal(e.to_string()))?;
        Ok(key.seal(id, nonce, &plain))
    }

    /// The binding and its opened credentials, if this actor holds one.
    fn load_binding(&self) -> ApiResult<Option<(ChannelBinding, Credentials)>> {
        let rows: Vec<BindingRow> = self
            .sql
            .exec("SELECT body, sealed FROM binding WHERE k = 1", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let binding: ChannelBinding = from_json(&row.body)?;
        let key = super::channel_key(&self.env)?;
        let plain = key
            .open(&binding.id, &row.sealed)
            .map_err(|e| ApiError::new(500, "server_misconfigured", e.to_string()))?;
        let credentials: Credentials = serde_json::from_slice(&plain)
            .map_err(|_| ApiError::internal("sealed credentials are not credentials"))?;
        Ok(Some((binding, credentials)))
    }

    // -----------------------------------------------------------------------------------------
    // Hooks

    async fn hook(self: &Rc<Self>, hook: &channel_calls::Hook) -> ApiResult<Response> {
        let platform = Some(hook.platform);
        let body = hook.body.as_bytes();
        let refused = || ApiError::unauthorized("unknown binding or bad signature");
        let Some((mut binding, credentials)) = self.load_binding()? else {
            return Err(refused());
        };
        if platform != Some(binding.platform) {
            return Err(refused());
        }
        let mut origin = Origin::default();
        let header = |name: &str| hook.header(name).map(str::to_string);
        let unauthorized = |e: VerifyError| ApiError::unauthorized(e.to_string());
        let delivery = match &credentials {
            Credentials::Slack { signing_secret, .. } => {
                verify::slack(
                    signing_secret,
                    header("x-slack-request-timestamp").as_deref(),
                    header("x-slack-signature").as_deref(),
                    body,
                    now_secs(),
                )
                .map_err(unauthorized)?;
                let content_type = header("content-type").unwrap_or_default();
                origin = slack::origin(&content_type, body);
                slack::parse(&content_type, body)
            }
            Credentials::Telegram { secret_token, .. } => {
                verify::telegram(
                    secret_token,
                    header("x-telegram-bot-api-secret-token").as_deref(),
                )
                .map_err(unauthorized)?;
                origin = telegram::origin(body);
                telegram::parse(body)
            }
            Credentials::Discord { public_key, .. } => {
                let check = verify::discord(
                    public_key,
                    header("x-signature-timestamp").as_deref(),
                    header("x-signature-ed25519").as_deref(),
                    body,
                    now_secs(),
                )
                .map_err(unauthorized)?;
                let valid = crate::webcrypto::verify_ed25519(
                    &check.public_key,
                    &check.signature,
                    &check.message,
                )
                .await
                .unwrap_or(false);
                check.verdict(valid).map_err(unauthorized)?;
                origin = discord::origin(body);
                discord::parse(body, now_secs())
            }
            Credentials::Generic { secret, .. } => {
                let signature = header("x-wuhu-signature");
                verify::generic(
                    secret,
                    header("x-wuhu-timestamp").as_deref(),
                    signature.as_deref(),
                    body,
                    now_secs(),
                )
                .map_err(unauthorized)?;
                generic::parse(body, signature.as_deref().unwrap_or_default())
            }
        }
        .map_err(ApiError::bad_request)?;
        // A Slack binding serves its own workspace and app only (decision 0035).
        let acts = !matches!(delivery, Delivery::Answer(_) | Delivery::Ignored(_));
        if let Err(why) = self.check_pin(&mut binding, &origin, acts).await {
            worker::console_log!("channel {}: refused {why}", binding.id);
            return Ok(match delivery {
                // Slack shows a slash command's body to the person: nothing, then.
                Delivery::Command(_) => Response::empty()?.with_status(200),
                _ => json_response(
                    200,
                    &channels::hook_answer(binding.platform, &HookOutcome::Ignored(why)),
                ),
            });
        }
        // A Discord binding made before the Gateway was held (no watchdog alarm yet) starts it
        // at its first verified interaction.
        if self.gateway_watchdog(&binding) {
            self.arm_by(now_ms() + channels::gateway::WATCHDOG_MS).await;
        }
        let outcome = match delivery {
            Delivery::Answer(answer) => return Ok(json_response(200, &answer)),
            Delivery::Ignored(why) => HookOutcome::Ignored(why.to_string()),
            Delivery::Message(inbound) => self.message(&binding, inbound, &origin).await?,
            // A slash command is acknowledged with an empty 200 (Slack shows a body as a
            // message); its note follows through the `response_url`.
            Delivery::Command(command) if command.response_url.is_some() => {
                self.command(&binding, command, &origin).await?;
                return Ok(Response::empty()?.with_status(200));
            }
            Delivery::Command(command) => self.command(&binding, command, &origin).await?,
            Delivery::Approval(click) => self.click(&binding, click, &origin).await?,
        };
        Ok(json_response(
            200,
            &channels::hook_answer(binding.platform, &outcome),
        ))
    }

    /// Tells the person how a command or click went: as the hook's answer on platforms that
    /// answer inline (the returned outcome), else posted to `target` (and, for a Telegram
    /// click, as the clicker's notice).
    async fn note(
        &self,
        binding: &ChannelBinding,
        key: &str,
        target: Option<ReplyTarget>,
        callback: Option<&str>,
        ok: bool,
        line: String,
    ) -> ApiResult<HookOutcome> {
        if !channels::answers_inline(binding.platform) {
            if let (Some(callback), Some(target)) = (callback, &target) {
                self.queue(
                    None,
                    &format!("ack:{key}"),
                    &Outbound::CallbackAnswer {
                        target: target.clone(),
                        callback_id: callback.to_string(),
                        text: line.chars().take(200).collect(),
                    },
                )?;
            }
            if let Some(target) = target {
                self.queue(
                    None,
                    &format!("note:{key}"),
                    &Outbound::text(
                        target.thread_only(),
                        text::render_one(binding.platform, &line),
                    ),
                )?;
            }
            self.arm_by(now_ms() + 50).await;
        }
        Ok(HookOutcome::Note { ok, text: line })
    }

    /// Records the delivery's keys; false when any was seen before (a retry or a replay).
    fn first_delivery(&self, keys: &[String]) -> ApiResult<bool> {
        for key in keys {
            let rows: Vec<CountRow> = self
                .sql
                .exec(
                    "SELECT COUNT(*) AS n FROM seen WHERE key = ?",
                    vec![key.clone().into()],
                )
                .map_err(sql_err)?
                .to_array()
                .map_err(sql_err)?;
            if rows.first().is_some_and(|r| r.n > 0.0) {
                return Ok(false);
            }
        }
        let t = now_secs();
        for key in keys {
            self.sql
                .exec(
                    "INSERT OR IGNORE INTO seen (key, at) VALUES (?, ?)",
                    vec![key.clone().into(), t.into()],
                )
                .map_err(sql_err)?;
        }
        // Bounded: keys past their time, then the oldest past the count.
        let _ = self.sql.exec(
            "DELETE FROM seen WHERE at < ?",
            vec![(t - channels::DEDUPE_TTL_SECS).into()],
        );
        let _ = self.sql.exec(
            "DELETE FROM seen WHERE key IN (SELECT key FROM seen ORDER BY at DESC LIMIT -1 OFFSET ?)",
            vec![(channels::MAX_DEDUPE_KEYS as i64).into()],
        );
        Ok(true)
    }

    fn forget_delivery(&self, keys: &[String]) {
        for key in keys {
            let _ = self
                .sql
                .exec("DELETE FROM seen WHERE key = ?", vec![key.clone().into()]);
        }
    }

    fn thread(&self, key: &str) -> ApiResult<Option<ThreadRow>> {
        let rows: Vec<ThreadRow> = self
            .sql
            .exec(
                "SELECT session, replied, target FROM threads WHERE key = ?",
                vec![key.into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        Ok(rows.into_iter().next())
    }

    /// A person's message: stored in the inbox with its dedupe keys (one synchronous section,
    /// so one transaction, durable before the answer leaves), then delivered to its session by
    /// a task the hook waits for at most `channels::HOOK_WAIT_MS`: a slow delivery (a session
    /// being created) is answered "accepted" in time and finishes after the answer; should the
    /// instance die first, the alarm delivers the row after `channels::INBOX_LEASE_MS`.
    async fn message(
        self: &Rc<Self>,
        binding: &ChannelBinding,
        inbound: Inbound,
        origin: &Origin,
    ) -> ApiResult<HookOutcome> {
        let due = now_ms() + channels::INBOX_LEASE_MS;
        let seq = match self.store_inbound(binding, &inbound, origin, due)? {
            Stored::Inbox(seq) => seq,
            Stored::Duplicate => return Ok(HookOutcome::Duplicate),
            Stored::Refused(outcome) => {
                // A refusal may have been queued.
                self.arm_by(now_ms() + 50).await;
                return Ok(outcome);
            }
        };
        self.arm_by(due).await;
        self.delivering.borrow_mut().insert(seq);
        let (tx, rx) = oneshot::channel();
        let actor = self.clone();
        let for_task = binding.clone();
        self.state.wait_until(async move {
            let outcome = actor.deliver_inbox(seq, &for_task, &inbound).await;
            let _ = tx.send(outcome);
        });
        // `WUHU_CHANNEL_HOOK_WAIT_MS` (0 to the default) lets tests answer before delivery.
        let wait_ms = self
            .env
            .var("WUHU_CHANNEL_HOOK_WAIT_MS")
            .ok()
            .and_then(|v| v.to_string().parse::<u64>().ok())
            .map_or(channels::HOOK_WAIT_MS, |ms| ms.min(channels::HOOK_WAIT_MS));
        if wait_ms == 0 {
            return Ok(HookOutcome::Accepted);
        }
        let wait = worker::Delay::from(std::time::Duration::from_millis(wait_ms));
        match futures::future::select(rx, wait).await {
            futures::future::Either::Left((Ok(outcome), _)) => outcome,
            // Not delivered yet: accepted (stored); the task or the alarm finishes it.
            _ => Ok(HookOutcome::Accepted),
        }
    }

    /// Stores a person's message in the inbox with its dedupe keys (synchronous: one
    /// transaction), due for the alarm at `due`, once it is admitted (`Actor::admit_message`:
    /// a stranger's or an over-quota guest's message is refused, never stored). Past
    /// `channels::MAX_INBOX` waiting messages: 503.
    fn store_inbound(
        &self,
        binding: &ChannelBinding,
        inbound: &Inbound,
        origin: &Origin,
        due: u64,
    ) -> ApiResult<Stored> {
        if !self.first_delivery(&inbound.dedupe_keys)? {
            return Ok(Stored::Duplicate);
        }
        if self.inbox_len() >= channels::MAX_INBOX {
            // Back-pressure: the platform retries later (its retry is not a duplicate).
            self.forget_delivery(&inbound.dedupe_keys);
            return Err(ApiError::new(
                503,
                "busy",
                format!(
                    "{} messages wait for their sessions; try again later",
                    channels::MAX_INBOX
                ),
            ));
        }
        if let Some(refused) = self.admit_message(binding, inbound, origin)? {
            return Ok(Stored::Refused(refused));
        }
        let seq = self
            .sql
            .exec(
                "INSERT INTO inbox (body, due) VALUES (?, ?) RETURNING seq",
                vec![to_json(inbound)?.into(), (due as i64).into()],
            )
            .map_err(sql_err)?
            .to_array::<SeqRow>()
            .map_err(sql_err)?
            .first()
            .map(|r| r.seq as i64)
            .ok_or_else(|| ApiError::internal("inbox insert returned no row"))?;
        Ok(Stored::Inbox(seq))
    }

    /// Messages waiting in the inbox.
    fn inbox_len(&self) -> usize {
        self.sql
            .exec("SELECT COUNT(*) AS n FROM inbox", None)
            .and_then(|c| c.to_array::<CountRow>())
            .ok()
            .and_then(|rows| rows.first().map(|c| c.n as usize))
            .unwrap_or(0)
    }

    /// Whether an inbox row is due now that no task of this instance delivers.
    fn inbox_due_now(&self) -> bool {
        let rows: Vec<SeqRow> = self
            .sql
            .exec(
                "SELECT seq FROM inbox WHERE due <= ? ORDER BY seq LIMIT 100",
                vec![(now_ms() as i64).into()],
            )
            .and_then(|c| c.to_array())
            .unwrap_or_default();
        let delivering = self.delivering.borrow();
        rows.iter().any(|r| !delivering.contains(&(r.seq as i64)))
    }

    /// Delivers inbox row `seq`: removed once its message is in the session's queue (or
    /// refused for good: a 4xx, then the platform's retry may try again); kept for the alarm
    /// after a failure that may pass (then the hook answers "accepted").
    async fn deliver_inbox(
        &self,
        seq: i64,
        binding: &ChannelBinding,
        inbound: &Inbound,
    ) -> ApiResult<HookOutcome> {
        let result = self.deliver(binding, inbound, None).await;
        self.delivering.borrow_mut().remove(&seq);
        let done = || {
            self.sql
                .exec("DELETE FROM inbox WHERE seq = ?", vec![seq.into()])
                .map_err(sql_err)
        };
        match result {
            Ok(outcome) => {
                done()?;
                Ok(outcome)
            }
            Err(e) if e.status < 500 => {
                done()?;
                self.forget_delivery(&inbound.dedupe_keys);
                Err(e)
            }
            Err(e) => {
                let attempts: Vec<CountRow> = self
                    .sql
                    .exec(
                        "UPDATE inbox SET attempts = attempts + 1 WHERE seq = ? RETURNING attempts AS n",
                        vec![seq.into()],
                    )
                    .map_err(sql_err)?
                    .to_array()
                    .map_err(sql_err)?;
                let attempts = attempts.first().map_or(1, |c| c.n as u32);
                match outbox::next_try_in_ms(attempts, None, js_sys::Math::random()) {
                    Some(wait) => {
                        worker::console_error!(
                            "channel {}: delivering a message failed ({}); again in {wait} ms",
                            binding.id,
                            e.message
                        );
                        self.sql
                            .exec(
                                "UPDATE inbox SET due = ? WHERE seq = ?",
                                vec![((now_ms() + wait) as i64).into(), seq.into()],
                            )
                            .map_err(sql_err)?;
                        self.arm_by(now_ms() + wait).await;
                    }
                    None => {
                        worker::console_error!(
                            "channel {}: gave up delivering a message after {attempts} tries ({})",
                            binding.id,
                            e.message
                        );
                        done()?;
                    }
                }
                Ok(HookOutcome::Accepted)
            }
        }
    }

    /// The alarm's part of the inbox: rows due (their hook's delivery did not finish, or a
    /// retry), oldest first, one at a time.
    async fn drain_inbox(&self, binding: &ChannelBinding) -> ApiResult<()> {
        let rows: Vec<InboxRow> = self
            .sql
            .exec(
                "SELECT seq, body FROM inbox WHERE due <= ? ORDER BY seq LIMIT 50",
                vec![(now_ms() as i64).into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        for row in rows {
            let seq = row.seq as i64;
            if !self.delivering.borrow_mut().insert(seq) {
                continue;
            }
            let inbound: Inbound = match from_json(&row.body) {
                Ok(inbound) => inbound,
                Err(e) => {
                    self.delivering.borrow_mut().remove(&seq);
                    worker::console_error!("dropping a corrupt inbox row: {}", e.message);
                    let _ = self
                        .sql
                        .exec("DELETE FROM inbox WHERE seq = ?", vec![seq.into()]);
                    continue;
                }
            };
            if let Err(e) = self.deliver_inbox(seq, binding, &inbound).await {
                worker::console_error!(
                    "channel {}: a stored message was refused: {}",
                    binding.id,
                    e.message
                );
            }
        }
        Ok(())
    }

    /// Enqueues a message in its thread's session (created on a first message that may start
    /// one) on `lane`, or the binding's lane, and watches the session for the answer.
    async fn deliver(
        &self,
        binding: &ChannelBinding,
        inbound: &Inbound,
        lane: Option<&str>,
    ) -> ApiResult<HookOutcome> {
        let author = self.who(binding, &inbound.user)?;
        let (session, replied) = loop {
            if let Some(row) = self.thread(&inbound.thread_key)? {
                break (row.session, row.replied as u64);
            }
            // One creation per thread at a time: a delivery that finds one under way waits for
            // it and looks again (then the thread has its session; had the creation failed,
            // this delivery creates). A message that may not start one waits too: it continues
            // the session being made.
            let waiting = {
                let mut creating = self.creating.borrow_mut();
                match creating.get_mut(&inbound.thread_key) {
                    Some(waiters) => {
                        let (tx, rx) = oneshot::channel();
                        waiters.push(tx);
                        Some(rx)
                    }
                    None if !inbound.may_start => {
                        return Ok(HookOutcome::Ignored(
                            "not a mention in an unbound thread".into(),
                        ));
                    }
                    None => {
                        creating.insert(inbound.thread_key.clone(), Vec::new());
                        None
                    }
                }
            };
            if let Some(rx) = waiting {
                let _ = rx.await;
                continue;
            }
            let _creating = Creating {
                creating: &self.creating,
                thread_key: inbound.thread_key.clone(),
            };
            // Sessions a channel starts are rate-limited per binding and per tenant: a thread
            // over the limit gets a short note and starts nothing.
            if let Err(limited) = crate::rate_limit::check(
                &self.env,
                wuhu_core::rate_limits::RateAction::ChannelSession,
                &binding.tenant,
                &binding.id,
            )
            .await
            {
                if limited.status != 429 {
                    return Err(limited);
                }
                let key = inbound.dedupe_keys.first().map_or("", String::as_str);
                return self
                    .note(
                        binding,
                        &format!("limited:{key}"),
                        Some(inbound.reply_to.clone()),
                        None,
                        false,
                        limited.message,
                    )
                    .await;
            }
            let id = channels::session_id_for(
                &binding.id,
                &inbound.thread_key,
                inbound.dedupe_keys.first().map_or("", String::as_str),
            );
            let info = self
                .create_session(binding, &id, &author, &inbound.text)
                .await?;
            self.sql
                .exec(
                    "INSERT OR REPLACE INTO threads (key, session, target, replied, used_at) VALUES (?, ?, ?, ?, ?)",
                    vec![
                        inbound.thread_key.clone().into(),
                        info.id.clone().into(),
                        to_json(&inbound.reply_to.thread_only())?.into(),
                        (info.last_cursor as i64).into(),
                        (now_ms() as i64).into(),
                    ],
                )
                .map_err(sql_err)?;
            let _ = self.sql.exec(
                "DELETE FROM threads WHERE key IN (SELECT key FROM threads ORDER BY used_at DESC LIMIT -1 OFFSET ?)",
                vec![(channels::MAX_THREADS as i64).into()],
            );
            break (info.id, info.last_cursor);
        };
        let lane = lane.unwrap_or(match channels::lane_for(&binding.options) {
            wuhu_core::wire::Lane::Steer => "steer",
            _ => "followUp",
        });
        let queued = self
            .enqueue(
                binding,
                &session,
                &author,
                lane,
                &inbound.text,
                inbound.dedupe_keys.first().map(String::as_str),
            )
            .await?;
        self.sql
            .exec(
                "UPDATE threads SET used_at = ? WHERE key = ?",
                vec![(now_ms() as i64).into(), inbound.thread_key.clone().into()],
            )
            .map_err(sql_err)?;
        let scan = Scan {
            through: replied,
            ..Scan::default()
        };
        let watched = self
            .sql
            .exec(
                "INSERT OR IGNORE INTO watches (session, thread, target, author, scan, started) VALUES (?, ?, ?, ?, ?, ?)",
                vec![
                    session.clone().into(),
                    inbound.thread_key.clone().into(),
                    to_json(&inbound.reply_to)?.into(),
                    author.into(),
                    to_json(&scan)?.into(),
                    (now_ms() as i64).into(),
                ],
            )
            .map_err(sql_err)?
            .rows_written();
        if watched == 0 && inbound.reply_to != inbound.reply_to.thread_only() {
            // A turn is already watched and answers through an earlier interaction: this one's
            // deferred response is resolved now (Discord shows an error if it never is).
            self.queue(
                Some(&session),
                &format!("joined:{}", inbound.dedupe_keys.join(" ")),
                &Outbound::text(
                    inbound.reply_to.clone(),
                    text::render_one(
                        binding.platform,
                        "Added to the conversation; the answer follows in this channel.",
                    ),
                ),
            )?;
        }
        self.arm_by(now_ms() + 200).await;
        Ok(HookOutcome::Queued {
            session,
            queued: queued.id,
        })
    }

    async fn enqueue(
        &self,
        binding: &ChannelBinding,
        session: &str,
        author: &str,
        lane: &str,
        content: &str,
        message_key: Option<&str>,
    ) -> ApiResult<EnqueueResponse> {
        let lane = Lane::parse_public(lane)
            .ok_or_else(|| ApiError::internal(format!("a channel enqueues on lane {lane:?}")))?;
        let call = session_calls::Enqueue {
            lane,
            request: EnqueueRequest {
                content: content.to_string(),
                key: None,
            },
            item_key: message_key.map(str::to_string),
        };
        let stub = crate::session_client::stub(&self.env, &binding.tenant, session)?;
        internal::call(&stub, &person(&binding.tenant, author), &call).await
    }

    /// A native command: stop, new, status, steer. A stranger's is refused; a guest's steer
    /// counts against its quota like a message.
    async fn command(
        &self,
        binding: &ChannelBinding,
        command: Command,
        origin: &Origin,
    ) -> ApiResult<HookOutcome> {
        if !self.first_delivery(&command.dedupe_keys)? {
            return Ok(HookOutcome::Duplicate);
        }
        let standing = self.standing(binding, &command.user, origin)?;
        if standing == Standing::Stranger {
            let to = admission::Refusal {
                kind: admission::REFUSED,
                user: &command.user,
                delivery: command.dedupe_keys.first().map_or("", String::as_str),
                target: &command.reply_to,
                response_url: command.response_url.as_deref(),
            };
            let refused = self.refuse(binding, &to, &binding.refusal)?;
            self.arm_by(now_ms() + 50).await;
            return Ok(refused);
        }
        if let (CommandKind::Steer(_), Standing::Guest) = (&command.kind, standing)
            && let Err(over) = self.spend_guest_quota(binding, &command.user, false)?
        {
            return self
                .command_note(binding, &command, false, over.text())
                .await;
        }
        let who = self.who(binding, &command.user)?;
        let Some((thread_key, thread)) = self.command_thread(&command)? else {
            let line = match command.kind {
                CommandKind::New => "The next message starts a new session.",
                _ => "No session in this thread yet: mention me to start one.",
            };
            return self
                .command_note(binding, &command, true, line.into())
                .await;
        };
        let stub = crate::session_client::stub(&self.env, &binding.tenant, &thread.session)?;
        let (ok, line) = match &command.kind {
            CommandKind::Stop => {
                match internal::call(&stub, &person(&binding.tenant, &who), &session_calls::Stop)
                    .await
                {
                    Ok(_) => (true, format!("{who} stopped the turn.")),
                    Err(e) => (false, format!("{who} could not stop: {}", e.message)),
                }
            }
            CommandKind::New => {
                // The session stays (readable in Wuhu); the thread forgets it.
                for sql in [
                    "DELETE FROM threads WHERE key = ?",
                    "DELETE FROM watches WHERE thread = ?",
                ] {
                    self.sql
                        .exec(sql, vec![thread_key.clone().into()])
                        .map_err(sql_err)?;
                }
                (true, "The next message starts a new session.".to_string())
            }
            CommandKind::Status => {
                let viewer = Identity {
                    sub: who.clone(),
                    tenant: binding.tenant.clone(),
                    role: Role::Member,
                    runner_kind: None,
                };
                match crate::session_client::transcript(
                    &self.env,
                    &viewer,
                    &thread.session,
                    thread.replied as u64,
                    1,
                )
                .await
                {
                    Ok(page) => (
                        true,
                        turn::status_line(&thread.session, page.session.status, page.queue.len()),
                    ),
                    Err(e) => (
                        false,
                        format!("{who} cannot see the session: {}", e.message),
                    ),
                }
            }
            CommandKind::Steer(content) => {
                // Watched like a message (an idle session starts a turn on it); the answer goes
                // to the thread, not to this command's own response.
                let inbound = Inbound {
                    dedupe_keys: command.dedupe_keys.clone(),
                    thread_key: thread_key.clone(),
                    reply_to: from_json::<ReplyTarget>(&thread.target)?.thread_only(),
                    user: command.user.clone(),
                    text: content.clone(),
                    may_start: false,
                };
                match self.deliver(binding, &inbound, Some("steer")).await {
                    Ok(_) => (true, format!("{who} steered the turn.")),
                    Err(e) => (false, format!("{who} could not steer: {}", e.message)),
                }
            }
        };
        self.command_note(binding, &command, ok, line).await
    }

    /// The thread a command is about and its row: the one it names, else (a Slack slash
    /// command in a channel) the most recently active thread under its prefix.
    fn command_thread(&self, command: &Command) -> ApiResult<Option<(String, ThreadRow)>> {
        if let Some(row) = self.thread(&command.thread_key)? {
            return Ok(Some((command.thread_key.clone(), row)));
        }
        let Some(prefix) = &command.latest_thread_under else {
            return Ok(None);
        };
        // `LIKE` would read `_` and `%` in the prefix as patterns: compare the start instead.
        let rows: Vec<BodyRow> = self
            .sql
            .exec(
                "SELECT key AS body FROM threads WHERE substr(key, 1, ?) = ? ORDER BY used_at DESC LIMIT 1",
                vec![(prefix.len() as i64).into(), prefix.clone().into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let Some(key) = rows.into_iter().next().map(|row| row.body) else {
            return Ok(None);
        };
        Ok(self.thread(&key)?.map(|row| (key, row)))
    }

    /// Tells the person how a command went: through a Slack slash command's `response_url`
    /// (to the channel when it changed the shared session), else as [`Self::note`] does.
    async fn command_note(
        &self,
        binding: &ChannelBinding,
        command: &Command,
        ok: bool,
        line: String,
    ) -> ApiResult<HookOutcome> {
        let key = command.dedupe_keys.join(" ");
        let Some(response_url) = &command.response_url else {
            return self
                .note(
                    binding,
                    &key,
                    Some(command.reply_to.clone()),
                    None,
                    ok,
                    line,
                )
                .await;
        };
        self.queue(
            None,
            &format!("note:{key}"),
            &Outbound::CommandResponse {
                target: command.reply_to.clone(),
                response_url: response_url.clone(),
                text: text::render_one(binding.platform, &line),
                in_channel: slack::slash_note_in_channel(&command.kind, ok),
            },
        )?;
        self.arm_by(now_ms() + 50).await;
        Ok(HookOutcome::Note { ok, text: line })
    }

    /// A session for a new thread: the binding's defaults, created by the first author, open to
    /// the whole tenant (a group chat).
    /// `id` is [`channels::session_id_for`] the message: a session an earlier try of it made
    /// (`/init` answers 409) is taken as it is.
    async fn create_session(
        &self,
        binding: &ChannelBinding,
        id: &str,
        author: &str,
        first_text: &str,
    ) -> ApiResult<SessionInfo> {
        let system_prompt = match (
            &binding.defaults.system_prompt,
            &binding.defaults.environment,
        ) {
            (prompt, Some(environment)) => Some(format!(
                "{}\n\nWhen you need an environment, request `{environment}`.",
                prompt.as_deref().unwrap_or(channels::DEFAULT_SYSTEM_PROMPT)
            )),
            (prompt, None) => Some(
                prompt
                    .clone()
                    .unwrap_or_else(|| channels::DEFAULT_SYSTEM_PROMPT.to_string()),
            ),
        };
        // Whoever starts the thread writes the title other people see in their lists: cleaned
        // of invisible characters and cut like any title (`wuhu_core::text`).
        let title = wuhu_core::text::bounded_title(
            &format!("{}: {first_text}", binding.name),
            channels::THREAD_TITLE_CHARS,
        );
        let init = session_calls::SessionInit {
            id: id.to_string(),
            tenant: binding.tenant.clone(),
            created_by: author.to_string(),
            provider: binding.defaults.provider.clone(),
            model: binding.defaults.model.clone(),
            system_prompt,
            title,
            global_context: None,
            budget: None,
            // Its guests' workspace folder is `channels/<binding id>/` (decision 0035).
            channel: Some(binding.id.clone()),
        };
        let stub = crate::session_client::stub(&self.env, &binding.tenant, id)?;
        let who = person(&binding.tenant, author);
        match internal::call(&stub, &who, &session_calls::Create(init)).await {
            Ok(_) => {}
            Err(e) if e.status == 409 => {}
            Err(e) => return Err(e),
        }
        let open = PatchSessionRequest {
            access: Some(Access::Tenant),
            ..PatchSessionRequest::default()
        };
        internal::call(&stub, &who, &session_calls::Patch(open)).await
    }

    async fn click(
        &self,
        binding: &ChannelBinding,
        click: ApprovalClick,
        origin: &Origin,
    ) -> ApiResult<HookOutcome> {
        if !self.first_delivery(std::slice::from_ref(&click.dedupe_key))? {
            return Ok(HookOutcome::Duplicate);
        }
        // A stranger's click answers nothing (the session would refuse it too).
        if self.standing(binding, &click.user, origin)? == Standing::Stranger {
            return Ok(HookOutcome::Ignored(admission::NOT_ADMITTED.into()));
        }
        // Only approvals this binding posted (or, for Slack buttons posted before the binding
        // kept a list, sessions of its threads) take clicks through it.
        let posted: Vec<ApprovalRow> = self
            .sql
            .exec(
                "SELECT session, target FROM approvals WHERE approval_id = ?",
                vec![click.approval_id.clone().into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let found = match posted.into_iter().next() {
            Some(row) => Some((row.session, row.target)),
            None => match &click.session {
                Some(session) => self
                    .sql
                    .exec(
                        "SELECT target AS body FROM threads WHERE session = ? LIMIT 1",
                        vec![session.clone().into()],
                    )
                    .map_err(sql_err)?
                    .to_array::<BodyRow>()
                    .map_err(sql_err)?
                    .into_iter()
                    .next()
                    .map(|row| (session.clone(), row.body)),
                None => None,
            },
        };
        let Some((session, target)) = found else {
            return Ok(HookOutcome::Ignored(
                "not an approval of this channel".into(),
            ));
        };
        let target: ReplyTarget = from_json(&target)?;
        let who = self.who(binding, &click.user)?;
        let call = session_calls::AnswerApproval {
            approval_id: click.approval_id.clone(),
            answer: AnswerApprovalRequest {
                decision: click.decision.clone(),
            },
        };
        let stub = crate::session_client::stub(&self.env, &binding.tenant, &session)?;
        let result = internal::call(&stub, &person(&binding.tenant, &who), &call).await;
        let (ok, line) = match &result {
            Ok(_) => (true, format!("{who} answered: {}", click.decision)),
            Err(e) => (false, format!("{who} could not answer: {}", e.message)),
        };
        self.note(
            binding,
            &format!("click:{}", click.dedupe_key),
            Some(target),
            click.callback.as_deref(),
            ok,
            line,
        )
        .await
    }

    // -----------------------------------------------------------------------------------------
    // Background: watches and the outbox

    /// Queues `message` under an idempotency `key` (a key queued before is ignored: a reply is
    /// never posted twice however often a scan finds it). `session`: the session it is about,
    /// told should the message be given up. A full outbox refuses it (logged): callers that can
    /// wait check [`ChannelActor::room`] first.
    fn queue(&self, session: Option<&str>, key: &str, message: &Outbound) -> ApiResult<()> {
        if !self.room(1)? {
            worker::console_error!(
                "channel outbox full ({} waiting); gave up the message {key}",
                outbox::MAX_PENDING
            );
            return Ok(());
        }
        let session: worker::SqlStorageValue = match session {
            Some(s) => s.into(),
            None => worker::SqlStorageValue::Null,
        };
        self.sql
            .exec(
                "INSERT OR IGNORE INTO outbox (key, body, attempts, due, session) VALUES (?, ?, 0, ?, ?)",
                vec![
                    key.into(),
                    to_json(message)?.into(),
                    (now_ms() as i64).into(),
                    session,
                ],
            )
            .map_err(sql_err)?;
        Ok(())
    }

    /// Whether `n` more messages fit in the outbox.
    fn room(&self, n: usize) -> ApiResult<bool> {
        let pending: Vec<CountRow> = self
            .sql
            .exec("SELECT COUNT(*) AS n FROM outbox WHERE sent = 0", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        Ok(pending.first().map_or(0, |c| c.n as usize) + n <= outbox::MAX_PENDING)
    }

    async fn background(self: &Rc<Self>) -> ApiResult<()> {
        let Some((binding, credentials)) = self.load_binding()? else {
            return Ok(());
        };
        self.gateway_watchdog(&binding);
        if let Err(e) = self.drain_inbox(&binding).await {
            worker::console_error!("channel inbox: {}", e.message);
        }
        let watches: Vec<WatchRow> = self
            .sql
            .exec(
                "SELECT session, thread, target, author, scan, started FROM watches",
                None,
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        for watch in watches {
            if let Err(e) = self.poll(&binding, &watch).await {
                worker::console_error!("polling a channel session failed: {}", e.message);
                if e.status == 404
                    || now_ms().saturating_sub(watch.started as u64) > turn::MAX_WATCH_MS
                {
                    let _ = self.sql.exec(
                        "DELETE FROM watches WHERE session = ?",
                        vec![watch.session.into()],
                    );
                }
            }
        }
        self.flush(&binding, &credentials).await
    }

    /// Reads what the watched session did since the last look; queues approvals, and the reply
    /// once the turn is over.
    async fn poll(&self, binding: &ChannelBinding, watch: &WatchRow) -> ApiResult<()> {
        // Back-pressure: with the outbox (nearly) full the session is looked at later, when
        // there is room for what it may have to post (a reply is at most 10 pieces, plus its
        // progress line and approvals).
        if !self.room(32)? {
            worker::console_error!(
                "channel outbox full; session {} waits for room",
                watch.session
            );
            return Ok(());
        }
        let mut scan: Scan = from_json(&watch.scan)?;
        let target: ReplyTarget = from_json(&watch.target)?;
        let viewer = Identity {
            sub: watch.author.clone(),
            tenant: binding.tenant.clone(),
            role: Role::Member,
            runner_kind: None,
        };
        let known: HashSet<String> = scan.approvals.iter().map(|(id, _)| id.clone()).collect();
        let mut page: GetSessionResponse;
        let mut pages = 0;
        loop {
            page = crate::session_client::transcript(
                &self.env,
                &viewer,
                &watch.session,
                scan.through,
                wuhu_core::archive::MAX_PAGE as u64,
            )
            .await?;
            turn::scan(&mut scan, &page.transcript);
            pages += 1;
            if page.next_cursor.is_none() || pages >= 10 {
                break;
            }
        }
        for (id, request) in &scan.approvals {
            if known.contains(id) {
                continue;
            }
            self.sql
                .exec(
                    "INSERT OR IGNORE INTO approvals (approval_id, session, target, at) VALUES (?, ?, ?, ?)",
                    vec![
                        id.clone().into(),
                        watch.session.clone().into(),
                        to_json(&target.thread_only())?.into(),
                        (now_ms() as i64).into(),
                    ],
                )
                .map_err(sql_err)?;
            let _ = self.sql.exec(
                "DELETE FROM approvals WHERE approval_id IN (SELECT approval_id FROM approvals ORDER BY at DESC LIMIT -1 OFFSET ?)",
                vec![(channels::MAX_THREADS as i64).into()],
            );
            self.queue(
                Some(&watch.session),
                &format!("approval:{id}"),
                &Outbound::Approval {
                    target: target.thread_only(),
                    session: watch.session.clone(),
                    approval_id: id.clone(),
                    text: text::render_one(binding.platform, request),
                },
            )?;
        }
        let over =
            page.next_cursor.is_none() && turn::turn_over(page.session.status, page.queue.len());
        // The progress line: posted at the first tool call, edited as more come, closed when
        // the turn is over (on Discord it is the interaction's response, which the reply
        // replaces).
        let progress_key = format!("progress:{}:{}", watch.session, watch.started as u64);
        let progress_edit = |line: String| Outbound::Text {
            target: target.clone(),
            text: text::render_one(binding.platform, &line),
            edit: None,
            edit_of: Some(progress_key.clone()),
        };
        if binding.options.progress && scan.tool_calls.len() > scan.progress_shown {
            let line = turn::progress_text(&scan.tool_calls);
            if scan.progress_shown == 0 {
                self.queue(
                    Some(&watch.session),
                    &progress_key,
                    &Outbound::text(target.clone(), text::render_one(binding.platform, &line)),
                )?;
            } else if !over {
                self.queue(
                    Some(&watch.session),
                    &format!("{progress_key}:{}", scan.tool_calls.len()),
                    &progress_edit(line),
                )?;
            }
            scan.progress_shown = scan.tool_calls.len();
        }
        if over {
            let interaction = target != target.thread_only();
            if scan.progress_shown > 0 && !interaction {
                self.queue(
                    Some(&watch.session),
                    &format!("{progress_key}:done"),
                    &progress_edit(turn::progress_done_text(scan.tool_calls.len())),
                )?;
            }
            // A Discord interaction waits for an answer even when the turn had no text.
            let reply = turn::reply(&scan, page.session.status)
                .or_else(|| interaction.then(|| "Done.".to_string()));
            if let Some(reply) = reply {
                for (i, piece) in text::render(binding.platform, &reply)
                    .into_iter()
                    .enumerate()
                {
                    // The first piece answers the interaction (Discord), the rest are
                    // messages in the thread.
                    let to = if i == 0 {
                        target.clone()
                    } else {
                        target.thread_only()
                    };
                    self.queue(
                        Some(&watch.session),
                        &format!("reply:{}:{}:{i}", watch.session, scan.through),
                        &Outbound::text(to, piece),
                    )?;
                }
            }
            self.sql
                .exec(
                    "UPDATE threads SET replied = ? WHERE key = ?",
                    vec![(scan.through as i64).into(), watch.thread.clone().into()],
                )
                .map_err(sql_err)?;
            self.sql
                .exec(
                    "DELETE FROM watches WHERE session = ?",
                    vec![watch.session.clone().into()],
                )
                .map_err(sql_err)?;
        } else {
            // Approvals already queued are remembered; the reply text is found again later.
            self.sql
                .exec(
                    "UPDATE watches SET scan = ? WHERE session = ?",
                    vec![to_json(&scan)?.into(), watch.session.clone().into()],
                )
                .map_err(sql_err)?;
        }
        Ok(())
    }

    /// Posts due messages in order; stops at the first that must wait (replies keep order).
    ///
    /// Exactly once where the platform allows it: before each try the row is marked
    /// `uncertain` (stored before the request leaves), and only an answer that says for sure
    /// takes the mark off. A row found marked (the Worker died mid-try, the connection dropped
    /// after the platform took the message, a 5xx) is looked up first where the platform can
    /// tell (Slack: the metadata); Discord recognises the repeat by its nonce; Telegram may
    /// show it twice (docs/channels.md, "Delivery").
    async fn flush(&self, binding: &ChannelBinding, credentials: &Credentials) -> ApiResult<()> {
        let rows: Vec<OutboxRow> = self
            .sql
            .exec(
                "SELECT seq, key, body, attempts, due, uncertain, first_try, session FROM outbox WHERE sent = 0 ORDER BY seq LIMIT 20",
                None,
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        for row in rows {
            if row.due as u64 > now_ms() {
                break;
            }
            let mut message: Outbound = from_json(&row.body)?;
            if let Outbound::Text { edit, edit_of, .. } = &mut message
                && let Some(key) = edit_of.take()
            {
                // Messages post in order, so the one to edit went before; without a reference
                // (refused, dropped, or a platform that gave none) there is nothing to edit.
                let posted: Vec<RefRow> = self
                    .sql
                    .exec(
                        "SELECT ref FROM outbox WHERE key = ? AND ref IS NOT NULL",
                        vec![key.into()],
                    )
                    .map_err(sql_err)?
                    .to_array()
                    .map_err(sql_err)?;
                match posted.into_iter().next() {
                    Some(row) => *edit = Some(row.r#ref),
                    None => {
                        self.mark_sent(row.seq, None)?;
                        continue;
                    }
                }
            }
            let first_try = row.first_try.map_or(now_secs(), |t| t as i64);
            if row.uncertain > 0.0
                && let Some(call) =
                    outbox::lookup(&binding.api_base_url, credentials, &message, first_try)
            {
                let (status, body) = match send_call(&call).await {
                    Some((status, _, body)) => (status, body),
                    None => (0, Value::Null),
                };
                match outbox::read_lookup(status, &body, &outbox::nonce(&row.key)) {
                    outbox::Found::Posted(reference) => {
                        worker::console_log!(
                            "channel message {} was posted by an earlier try; not posted again",
                            row.key
                        );
                        self.mark_sent(row.seq, reference)?;
                        continue;
                    }
                    outbox::Found::Absent => {}
                    outbox::Found::Unknown => {
                        if !self.retry_later(binding, &row, None).await? {
                            continue;
                        }
                        break;
                    }
                }
            }
            // The intent, stored before the request leaves: should no answer come back, the
            // next try knows the message may be there.
            self.sql
                .exec(
                    "UPDATE outbox SET uncertain = 1, first_try = ? WHERE seq = ?",
                    vec![first_try.into(), row.seq.into()],
                )
                .map_err(sql_err)?;
            let (mut attempt, mut known) = post(binding, credentials, &message, &row.key).await;
            if let Attempt::Refused(why) = &attempt
                && let Some(instead) = outbox::fallback(&message)
            {
                // A Discord interaction's token refused (expired, unknown): the answer goes
                // to the channel. Stored first, so a retry of it goes there too.
                worker::console_log!(
                    "an interaction answer was refused ({why}); posting it in the channel"
                );
                self.sql
                    .exec(
                        "UPDATE outbox SET body = ? WHERE seq = ?",
                        vec![to_json(&instead)?.into(), row.seq.into()],
                    )
                    .map_err(sql_err)?;
                message = instead;
                (attempt, known) = post(binding, credentials, &message, &row.key).await;
            }
            if known {
                self.sql
                    .exec(
                        "UPDATE outbox SET uncertain = 0 WHERE seq = ?",
                        vec![row.seq.into()],
                    )
                    .map_err(sql_err)?;
            }
            match attempt {
                Attempt::Sent(reference) => self.mark_sent(row.seq, reference)?,
                Attempt::Refused(why) => {
                    self.give_up(binding, &row, &format!("refused: {why}"))
                        .await?;
                }
                Attempt::Retry { retry_after_ms } => {
                    if self.retry_later(binding, &row, retry_after_ms).await? {
                        break;
                    }
                }
            }
        }
        // Sent rows stay a day as idempotency keys, then go.
        let _ = self.sql.exec(
            "DELETE FROM outbox WHERE sent > 0 AND sent < ?",
            vec![((now_ms() as i64) - channels::DEDUPE_TTL_SECS * 1000).into()],
        );
        Ok(())
    }

    /// Schedules the next try of `row` (true), or gives it up after [`outbox::MAX_ATTEMPTS`]
    /// tries (false).
    async fn retry_later(
        &self,
        binding: &ChannelBinding,
        row: &OutboxRow,
        retry_after_ms: Option<u64>,
    ) -> ApiResult<bool> {
        let attempts = row.attempts as u32 + 1;
        match outbox::next_try_in_ms(attempts, retry_after_ms, js_sys::Math::random()) {
            Some(wait) => {
                self.sql
                    .exec(
                        "UPDATE outbox SET attempts = ?, due = ? WHERE seq = ?",
                        vec![
                            (attempts as i64).into(),
                            ((now_ms() + wait) as i64).into(),
                            row.seq.into(),
                        ],
                    )
                    .map_err(sql_err)?;
                Ok(true)
            }
            None => {
                self.give_up(binding, row, &format!("failed {attempts} tries"))
                    .await?;
                Ok(false)
            }
        }
    }

    /// Gives a message up: a log line, and a notice in its session's transcript (when it is
    /// about one), so nothing is dropped silently.
    async fn give_up(
        &self,
        binding: &ChannelBinding,
        row: &OutboxRow,
        reason: &str,
    ) -> ApiResult<()> {
        worker::console_error!(
            "channel {}: gave up the message {} ({reason})",
            binding.id,
            row.key
        );
        self.mark_sent(row.seq, None)?;
        if let Some(session) = &row.session {
            let call = session_calls::Notice {
                channel: binding.id.clone(),
                key: row.key.clone(),
                reason: reason.to_string(),
            };
            let who = person(&binding.tenant, &format!("channel:{}", binding.id));
            let sent = match crate::session_client::stub(&self.env, &binding.tenant, session) {
                Ok(stub) => internal::call(&stub, &who, &call).await.map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                worker::console_error!(
                    "channel {}: telling session {session} failed: {}",
                    binding.id,
                    e.message
                );
            }
        }
        Ok(())
    }

    /// Done with an outbox row: its body (which may hold a Discord interaction token) goes,
    /// its key stays as an idempotency key, with the platform's reference for later edits.
    fn mark_sent(&self, seq: f64, reference: Option<String>) -> ApiResult<()> {
        let reference: worker::SqlStorageValue = match reference {
            Some(r) => r.into(),
            None => worker::SqlStorageValue::Null,
        };
        self.sql
            .exec(
                "UPDATE outbox SET sent = ?, body = '', ref = ? WHERE seq = ?",
                vec![(now_ms() as i64).into(), reference, seq.into()],
            )
            .map_err(sql_err)?;
        Ok(())
    }

    /// Arms the alarm for the next background work: a watched session's next look, or the
    /// outbox's next due message.
    async fn rearm(&self) {
        let watches: Vec<DueRow> = self
            .sql
            .exec("SELECT MIN(started) AS due FROM watches", None)
            .and_then(|c| c.to_array())
            .unwrap_or_default();
        let outbox: Vec<DueRow> = self
            .sql
            .exec("SELECT MIN(due) AS due FROM outbox WHERE sent = 0", None)
            .and_then(|c| c.to_array())
            .unwrap_or_default();
        let inbox: Vec<DueRow> = self
            .sql
            .exec("SELECT MIN(due) AS due FROM inbox", None)
            .and_then(|c| c.to_array())
            .unwrap_or_default();
        let now = now_ms();
        let mut next: Option<u64> = inbox.first().map(|i| i.due as u64);
        if let Some(started) = watches.first().map(|w| w.due as u64) {
            let at = now + turn::poll_interval_ms(now.saturating_sub(started));
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        if let Some(due) = outbox.first().map(|o| o.due as u64) {
            next = Some(next.map_or(due, |n| n.min(due)));
        }
        if self.gateway_wanted() {
            // The watchdog of the Discord Gateway connection.
            let at = now + channels::gateway::WATCHDOG_MS;
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        if let Some(at) = next {
            self.set_alarm_at(at.max(now + 10)).await;
        }
    }

    async fn arm_by(&self, at: u64) {
        let storage = self.state.storage();
        let current = storage.get_alarm().await.ok().flatten();
        if current.is_none_or(|c| c as u64 > at) {
            self.set_alarm_at(at).await;
        }
    }

    async fn set_alarm_at(&self, at: u64) {
        let offset = at.saturating_sub(now_ms()).max(1) as i64;
        if let Err(e) = self.state.storage().set_alarm(offset).await {
            worker::console_error!("setting the channel alarm failed: {e}");
        }
    }
}

/// One delivery attempt of `message` (outbox key `key`), and whether its outcome is known
/// ([`outbox::outcome_known`]).
async fn post(
    binding: &ChannelBinding,
    credentials: &Credentials,
    message: &Outbound,
    key: &str,
) -> (Attempt, bool) {
    let call: HttpCall =
        outbox::request(&binding.api_base_url, credentials, message, now_secs(), key);
    match send_call(&call).await {
        Some((status, retry_after, body)) => (
            outbox::read_answer(binding.platform, status, retry_after.as_deref(), &body),
            outbox::outcome_known(Some(status)),
        ),
        None => (
            Attempt::Retry {
                retry_after_ms: None,
            },
            false,
        ),
    }
}

/// Sends `call`: its status, `Retry-After` and JSON body (`Null` when not JSON), or `None`
/// when no answer came (never log a call: it may hold a token).
async fn send_call(call: &HttpCall) -> Option<(u16, Option<String>, Value)> {
    let headers = Headers::new();
    for (name, value) in &call.headers {
        let _ = headers.set(name, value);
    }
    let method = match call.method.as_str() {
        "PATCH" => Method::Patch,
        "GET" => Method::Get,
        _ => Method::Post,
    };
    let mut init = RequestInit::new();
    init.with_method(method).with_headers(headers);
    if call.method != "GET" {
        init.with_body(Some(wasm_bindgen::JsValue::from_str(&call.body)));
    }
    let request = Request::new_with_init(&call.url, &init).ok()?;
    let mut response = Fetch::Request(request).send().await.ok()?;
    let status = response.status_code();
    let retry_after = response.headers().get("retry-after").ok().flatten();
    // A body cut off mid-way is no answer.
    let text = response.text().await.ok()?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    Some((status, retry_after, body))
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
