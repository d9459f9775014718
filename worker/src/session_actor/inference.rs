//! Runs one LLM step: builds the context, streams the provider's reply, forwards text deltas to
//! followers, and hands the finished message (or the failure) back to the session.

use std::rc::Rc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::{Either, select};
use worker::{AbortController, AbortSignal, Delay, Fetch, Headers, Method, Request, RequestInit};
use wuhu_core::archive::HOT_TAIL_KEEP;
use wuhu_core::compaction::{self, CompactionJob, StepPlan};
use wuhu_core::context::ContextWindow;
use wuhu_core::llm::masked_reply::MaskedReply;
use wuhu_core::llm::models::{ModelTable, TENANT_TABLE_PATH};
use wuhu_core::llm::request_log::{Exchange, KnownSecrets, MAX_LOGGED_BODY_BYTES};
use wuhu_core::llm::retry::RetryPolicy;
use wuhu_core::llm::{HttpProvider, LlmEvent, LlmFailure, LlmRequest, fake};
use wuhu_core::masking::Masker;
use wuhu_core::policy::{Policy, TENANT_POLICY_PATH};
use wuhu_core::secrets::SealedSecret;
use wuhu_core::tenant_config::{SettingsDocs, TENANT_CONFIG_PATH, TenantConfig};
use wuhu_core::tools::catalogue_for;
use wuhu_core::wire::{AssistantMessage, Compaction, CompactionReason, Entry, Header, StreamEvent};

use super::{Actor, archive, blob_io, now};

/// A provider that sends nothing for this long has failed.
const STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs as an actor task (see `session_actor::tasks`): aborting the task drops this future,
/// and with it the provider request (see [`AbortOnDrop`]).
pub(crate) async fn run(actor: Rc<Actor>, step: u64) {
    // Both are usually known in memory: then neither is a round trip.
    let (tenant_usd, settings) =
        futures::join!(tenant_budget_allows(&actor, step), settings(&actor));
    let Some(tenant_usd) = tenant_usd else {
        return;
    };
    if let Ok(settings) = &settings
        && let Err(refused) = actor.check_step_priced(&settings.models, tenant_usd)
    {
        // A USD limit set (or a price taken away) after the model was chosen: the request
        // would spend what the limit cannot count, so it is not sent.
        let ended = actor
            .with_session(|s| s.handle_unpriced_model(now(), step, &refused))
            .unwrap_or(false);
        if ended {
            actor.pump();
        }
        return;
    }
    if let Some(outcome) = infer(&actor, step, settings).await {
        actor.with_session(|s| s.handle_inference_done(now(), step, outcome));
        actor.pump();
    }
}

/// Before a step's request: when the tenant has no budget, its index last said so to this actor
/// while holding it as a settings holder, and no forget came since
/// (`wuhu_core::tenant_usage::unlimited_and_told`, decision 0022), the request goes at once:
/// setting a budget tells every holder before it is answered, as a settings change does.
/// Otherwise this session's usage is reported (settled) first; then the tenant's budget
/// (`wuhu_core::tenant_usage::TenantBudget`) is the state the index last answered this actor, or
/// asked when `tenant_usage::must_ask_budget` says so (none known, or a limit reached). A step
/// after a user's message or tool results has nothing to report and usually nothing to ask: no
/// round trip to the index before the provider request. A spent budget ends the turn
/// (`Session::handle_tenant_budget_exceeded`). An index that cannot be reached does not stop the
/// session (logged).
///
/// `None` when the turn ended; else whether the tenant's budget (as known) sets a USD limit.
async fn tenant_budget_allows(actor: &Rc<Actor>, step: u64) -> Option<bool> {
    use wuhu_core::tenant_usage::{self, KnownBudget};
    let held = || actor.tenant_settings.settings.borrow().held_generation();
    if tenant_usage::unlimited_and_told(
        actor.bookkeeping.known_budget.get().as_ref(),
        held(),
        now().0,
    ) {
        actor.bookkeeping.tenant_budget_spent.set(false);
        return Some(false);
    }
    actor.usage_report_sent().await;
    if let Err(e) = actor.report_usage().await {
        worker::console_error!("reporting usage before a request failed: {}", e.message);
    }
    let known = actor.bookkeeping.known_budget.get();
    let state = match known {
        Some(known) if !tenant_usage::must_ask_budget(Some((&known.state, known.at)), now().0) => {
            known.state
        }
        _ => {
            let asked_while_held = held();
            match crate::tenant_index::budget(&actor.env, &actor.tenant()).await {
                Ok(state) => {
                    actor.bookkeeping.known_budget.set(Some(KnownBudget {
                        state,
                        at: now().0,
                        asked_while_held,
                    }));
                    state
                }
                Err(e) => {
                    worker::console_error!("asking the tenant's budget failed: {}", e.message);
                    // The last answer's limit still holds for prices.
                    return Some(known.is_some_and(|k| k.state.usd_limited()));
                }
            }
        }
    };
    let Some(limit) = state.exceeded() else {
        actor.bookkeeping.tenant_budget_spent.set(false);
        return Some(state.usd_limited());
    };
    actor.bookkeeping.tenant_budget_spent.set(true);
    let ended = actor
        .with_session(|s| {
            s.handle_tenant_budget_exceeded(
                now(),
                step,
                limit,
                state.spent,
                state.budget.unwrap_or_default(),
            )
        })
        .unwrap_or(false);
    if ended {
        actor.pump();
    }
    None
}

/// What a provider request is for: a step's reply (streamed to followers) or a compaction's
/// summary (during a step, or outside one for a manual compaction).
#[derive(Clone, Copy)]
pub(crate) enum Purpose {
    Step(u64),
    Summary(Option<u64>),
}

impl Purpose {
    /// The step a request log is filed under (0: a manual compaction).
    fn step(self) -> u64 {
        match self {
            Purpose::Step(step) | Purpose::Summary(Some(step)) => step,
            Purpose::Summary(None) => 0,
        }
    }

    fn log_name(self) -> wuhu_core::llm::request_log::RequestPurpose {
        use wuhu_core::llm::request_log::RequestPurpose;
        match self {
            Purpose::Step(_) => RequestPurpose::Step,
            Purpose::Summary(_) => RequestPurpose::Summary,
        }
    }

    fn current(self, actor: &Actor) -> bool {
        match self {
            Purpose::Step(step) | Purpose::Summary(Some(step)) => actor.inference_current(step),
            Purpose::Summary(None) => true,
        }
    }
}

fn transcript_unreadable() -> LlmFailure {
    LlmFailure {
        status: None,
        message: "could not read the transcript for the llm context".into(),
        retryable: true,
        retry_after_ms: None,
    }
}

/// `None` when the step was cancelled (stop) while streaming.
///
/// The plan (`wuhu_core::compaction`) may ask to compact first; a provider's context-overflow
/// refusal compacts once and tries again. A step compacts at most once.
async fn infer(
    actor: &Rc<Actor>,
    step: u64,
    settings: Result<Rc<Settings>, LlmFailure>,
) -> Option<Result<AssistantMessage, LlmFailure>> {
    // The recursion guard: a session at the maximum depth is not offered the spawn tools.
    let may_spawn = wuhu_core::orchestration::may_spawn(
        actor.lineage().depth,
        &crate::session_client::orchestration_limits(&actor.env),
    );
    let settings = &match settings {
        Ok(settings) => settings,
        Err(failure) => return Some(Err(failure)),
    };
    let mut compacted = false;
    loop {
        let Some(header) = context_window(actor).await else {
            return Some(Err(transcript_unreadable()));
        };
        let group_chat_since = actor
            .with_loaded(|l| l.session.group_chat_since())
            .flatten();
        let plan = {
            let tail = actor.turn.tail.borrow();
            let Some(window) = tail.as_ref() else {
                continue;
            };
            compaction::plan_step(
                &header,
                &settings.models,
                window,
                group_chat_since,
                catalogue_for(may_spawn),
                !compacted,
            )
        };
        let request = match plan {
            StepPlan::Compact(job) => {
                compacted = true;
                match compact(actor, Purpose::Summary(Some(step)), &header, settings, job).await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return None,
                    Err(failure) => return Some(Err(failure)),
                }
            }
            StepPlan::Send { mut request, .. } => {
                request.reasoning = reasoning_plan(actor, &header, &settings.models);
                request
            }
        };
        match call(actor, Purpose::Step(step), &header, settings, &request).await {
            Ok(Some(message)) => return Some(Ok(message)),
            Ok(None) => return None,
            Err(failure) if failure.is_context_overflow() && !compacted => {
                compacted = true;
                let job = {
                    let tail = actor.turn.tail.borrow();
                    let Some(window) = tail.as_ref() else {
                        return Some(Err(failure));
                    };
                    compaction::plan_compaction(
                        &header,
                        &settings.models,
                        window,
                        group_chat_since,
                        &catalogue_for(may_spawn),
                        CompactionReason::Overflow,
                        None,
                    )
                };
                let Ok(job) = job else {
                    return Some(Err(failure));
                };
                match compact(actor, Purpose::Summary(Some(step)), &header, settings, job).await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return None,
                    Err(summary_failure) => return Some(Err(summary_failure)),
                }
            }
            Err(failure) => return Some(Err(failure)),
        }
    }
}

/// What a step's request asks of the model's reasoning: the turn's setting (a message's), else
/// the session's, planned for its model. A setting the model no longer takes (the tenant's
/// table changed since it was checked; a `set_model` switch removes a setting that does not
/// suit its model) is not sent: the step runs with the provider's default, as it would without
/// one, and the log says why.
fn reasoning_plan(
    actor: &Actor,
    header: &Header,
    models: &ModelTable,
) -> Option<wuhu_core::llm::reasoning::Plan> {
    let turn = actor.with_loaded(|l| l.session.turn_reasoning()).flatten();
    let setting = turn.or(header.reasoning)?;
    match wuhu_core::llm::reasoning::plan(models, &header.provider, &header.model, &setting) {
        Ok(plan) => Some(plan),
        Err(refused) => {
            worker::console_error!("the reasoning setting is not sent: {refused}");
            None
        }
    }
}

/// What a step reads of its tenant's settings before its requests.
pub(crate) struct Settings {
    /// The model table in effect (shared with the step's tools, `ModelRule`).
    pub(crate) models: Rc<ModelTable>,
    /// Days request logs are kept, when the tenant keeps them.
    pub(crate) log_days: Option<u32>,
    /// `config/tenant.json` (the default provider and model of new sessions).
    pub(crate) tenant: TenantConfig,
    /// The tenant's secrets, sealed (from its index; a change is told as a settings change):
    /// what the step's calls may use.
    pub(crate) secrets: Rc<[SealedSecret]>,
    /// Their masker, built at first use.
    masker: std::cell::OnceCell<Rc<Masker>>,
    /// `config/policy.json`, and each user's policy once a call needed it.
    pub(crate) policy: Rc<crate::policy_book::PolicyBook>,
}

impl Settings {
    /// The masker of the tenant's secrets as this reading has them (each value opened once
    /// per reading), over the detector of unknown ones.
    pub(crate) fn masker(&self, env: &worker::Env, tenant: &str) -> Rc<Masker> {
        self.masker
            .get_or_init(|| Rc::new(crate::secrets::masker(env, tenant, &self.secrets)))
            .clone()
    }
}

/// The tenant's settings as they are now (a step's, a manual compaction's): the reading this
/// actor keeps while the tenant's index holds it, or else the documents read from R2. An actor
/// the index does not hold yet asks it to alongside the reading, uses that reading, and keeps
/// only one begun once it is held (`wuhu_core::tenant_config::SettingsCache`: a change stored
/// after a kept reading began is told to this actor). An index that cannot be reached, or
/// cannot make room, costs only this: the documents are read before each step.
pub(crate) async fn settings(actor: &Rc<Actor>) -> Result<Rc<Settings>, LlmFailure> {
    let kept = actor.tenant_settings.settings.borrow().kept().cloned();
    if let Some(settings) = kept {
        *actor.tenant_settings.last_settings.borrow_mut() = Some(settings.clone());
        return Ok(settings);
    }
    let (since, needs_hold, ticket) = {
        let cache = actor.tenant_settings.settings.borrow();
        (
            cache.generation(),
            cache.needs_hold(),
            cache.begin_reading(),
        )
    };
    let hold = async {
        if !needs_hold {
            return;
        }
        match crate::tenant_index::hold_settings(&actor.env, &actor.tenant(), &actor.session_id())
            .await
        {
            Ok(true) => actor.tenant_settings.settings.borrow_mut().held(since),
            Ok(false) => {}
            Err(e) => worker::console_error!("holding the tenant's settings failed: {}", e.message),
        }
    };
    let ((), read) = futures::join!(hold, read_settings(actor));
    let settings = read
        .and_then(|(docs, secrets)| {
            let mut settings = parse_settings(&docs)?;
            settings.secrets = secrets.into();
            Ok(settings)
        })
        .map(Rc::new);
    actor
        .tenant_settings
        .settings
        .borrow_mut()
        .read(ticket, settings.as_ref().ok().cloned());
    if let Ok(reading) = &settings {
        *actor.tenant_settings.last_settings.borrow_mut() = Some(reading.clone());
    }
    settings
}

/// Reads both documents and the tenant's sealed secrets at once: each is a round trip (R2, the
/// tenant's index).
async fn read_settings(actor: &Rc<Actor>) -> Result<(SettingsDocs, Vec<SealedSecret>), LlmFailure> {
    let tenant = actor.tenant();
    let (docs, secrets) = futures::join!(
        read_settings_of(&actor.env, &tenant),
        crate::tenant_index::sealed_secrets(&actor.env, &tenant),
    );
    let secrets = secrets.map_err(|e| LlmFailure {
        status: None,
        message: format!("reading the tenant's secrets failed: {}", e.message),
        retryable: true,
        retry_after_ms: None,
    })?;
    Ok((docs?, secrets))
}

/// The tenant's settings read now, for a session that does not exist yet (its creation
/// chooses its provider and model with them); nothing is kept.
pub(crate) async fn settings_of(env: &worker::Env, tenant: &str) -> Result<Settings, LlmFailure> {
    parse_settings(&read_settings_of(env, tenant).await?)
}

async fn read_settings_of(env: &worker::Env, tenant: &str) -> Result<SettingsDocs, LlmFailure> {
    let tenant = tenant.to_string();
    let actor_env = env;
    let read_failed = |what: &str, e: crate::http::ApiError| LlmFailure {
        status: None,
        message: format!("reading the tenant's {what} failed: {}", e.message),
        retryable: true,
        retry_after_ms: None,
    };
    let (models, config, policy) = futures::join!(
        crate::workspace_io::read(actor_env, &tenant, TENANT_TABLE_PATH),
        crate::workspace_io::read(actor_env, &tenant, TENANT_CONFIG_PATH),
        crate::workspace_io::read(actor_env, &tenant, TENANT_POLICY_PATH),
    );
    Ok(SettingsDocs {
        models: models
            .map_err(|e| read_failed("model table", e))?
            .map(|d| d.content),
        tenant: config
            .map_err(|e| read_failed("settings", e))?
            .map(|d| d.content),
        policy: policy
            .map_err(|e| read_failed("policy", e))?
            .map(|d| d.content),
    })
}

/// The model table (the built-in one with `config/models.json` over it) and whether the tenant
/// keeps request logs (`config/tenant.json`), and for how many days. An invalid document fails
/// the step visibly (not retried: an admin fixes it); a failed read is retried.
fn parse_settings(docs: &SettingsDocs) -> Result<Settings, LlmFailure> {
    let invalid = |message: String| LlmFailure {
        status: None,
        message,
        retryable: false,
        retry_after_ms: None,
    };
    let models =
        ModelTable::with_tenant(docs.models.as_deref()).map_err(|e| invalid(e.to_string()))?;
    let config = TenantConfig::parse(docs.tenant.as_deref()).map_err(|e| invalid(e.to_string()))?;
    let policy = Policy::parse(TENANT_POLICY_PATH, docs.policy.as_deref())
        .map_err(|e| invalid(e.to_string()))?;
    Ok(Settings {
        models: Rc::new(models),
        log_days: config
            .llm_request_logs
            .then_some(config.llm_request_log_days),
        tenant: config,
        secrets: Rc::new([]),
        masker: Default::default(),
        policy: Rc::new(crate::policy_book::PolicyBook::new(policy)),
    })
}

/// Every provider key the Worker holds: none of them may reach a request log.
fn provider_keys(env: &worker::Env) -> Vec<String> {
    wuhu_core::llm::PROVIDERS
        .iter()
        .filter_map(|p| HttpProvider::named(p))
        .filter_map(|p| {
            env.secret(p.api_key_var)
                .map(|v| v.to_string())
                .or_else(|_| env.var(p.api_key_var).map(|v| v.to_string()))
                .ok()
        })
        .filter(|k| !k.is_empty())
        .collect()
}

/// Writes a request log, then (at most hourly per actor) deletes this session's expired ones.
/// A failure is logged and never fails the step.
pub(crate) async fn log_request(
    actor: &Rc<Actor>,
    step: u64,
    exchange: &Exchange,
    days: u32,
    masker: &Masker,
) {
    let keys = provider_keys(&actor.env);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let known = KnownSecrets {
        provider_keys: &keys,
        tenant: masker,
    };
    let (tenant, session) = (actor.tenant(), actor.session_id());
    if let Err(e) =
        crate::llm_logs::write(&actor.env, &tenant, &session, step, exchange, known).await
    {
        worker::console_error!("writing a request log failed: {}", e.message);
    }
    let now_ms = now().0;
    if now_ms.saturating_sub(actor.bookkeeping.llm_logs_swept_at.get()) >= LOG_SWEEP_EVERY_MS {
        actor.bookkeeping.llm_logs_swept_at.set(now_ms);
        if let Err(e) = crate::llm_logs::sweep_session(&actor.env, &tenant, &session, days).await {
            worker::console_error!("deleting expired request logs failed: {}", e.message);
        }
        // The tenant's sweep reaches the sessions that write no more.
        if let Err(e) = crate::tenant_index::llm_logs_written(&actor.env, &tenant).await {
            worker::console_error!("arming the request log sweep failed: {}", e.message);
        }
    }
}

/// How often a session deletes its expired request logs (while it writes new ones).
const LOG_SWEEP_EVERY_MS: u64 = 60 * 60 * 1000;

/// Makes one provider request. `Ok(None)` when its purpose lapsed (the step was stopped).
async fn call(
    actor: &Rc<Actor>,
    purpose: Purpose,
    header: &Header,
    settings: &Settings,
    request: &LlmRequest,
) -> Result<Option<AssistantMessage>, LlmFailure> {
    // The tenant's secrets are masked out of the reply as it streams: followers and the stored
    // message get the same masked text.
    let masker = settings.masker(&actor.env, &actor.tenant());
    let mut reply = MaskedReply::new((*masker).clone());
    let result = match header.provider.as_str() {
        fake::PROVIDER => run_fake(actor, purpose, request, &mut reply).await,
        other => match HttpProvider::named(other) {
            Some(provider) => {
                let mut exchange = settings.log_days.map(|_| Exchange {
                    provider: header.provider.clone(),
                    model: header.model.clone(),
                    purpose: purpose.log_name(),
                    started_at_ms: now().0,
                    ..Exchange::default()
                });
                let result = run_http(
                    actor,
                    purpose,
                    provider,
                    request,
                    &mut reply,
                    exchange.as_mut(),
                    settings.models.accepts_images(&header.model),
                )
                .await;
                if let (Some(days), Some(mut exchange)) = (settings.log_days, exchange) {
                    exchange.duration_ms = now().0.saturating_sub(exchange.started_at_ms);
                    if let Err(failure) = &result {
                        exchange.error = Some(failure.message.clone());
                    }
                    log_request(actor, purpose.step(), &exchange, days, &masker).await;
                }
                result
            }
            None => Err(LlmFailure {
                status: None,
                message: format!("unknown provider {other:?}"),
                retryable: false,
                retry_after_ms: None,
            }),
        },
    };
    match result {
        Ok(true) => {
            show(actor, purpose, reply.finish());
            let mut message = reply.build(&header.provider, &header.model);
            if let Some(usage) = message.usage.as_mut() {
                usage.cost_usd = settings.models.cost_usd(&header.model, usage);
            }
            Ok(Some(message))
        }
        Ok(false) => Ok(None),
        Err(failure) => Err(failure),
    }
}

/// Runs a compaction: the summary request, then the `compaction` entry, committed (so the
/// context window holds it). `Ok(None)` when the step it serves was stopped.
pub(crate) async fn compact(
    actor: &Rc<Actor>,
    purpose: Purpose,
    header: &Header,
    settings: &Settings,
    job: CompactionJob,
) -> Result<Option<(u64, Compaction)>, LlmFailure> {
    let summary_failed = |message: String| LlmFailure {
        status: None,
        message: format!("compacting the context failed: {message}"),
        retryable: true,
        retry_after_ms: None,
    };
    let reply = match call(actor, purpose, header, settings, &job.request).await {
        Ok(Some(reply)) => reply,
        Ok(None) => return Ok(None),
        Err(failure) => {
            return Err(LlmFailure {
                message: format!("compacting the context failed: {}", failure.message),
                ..failure
            });
        }
    };
    if !purpose.current(actor) {
        return Ok(None);
    }
    let Some(compaction) = job.finish(header, &reply) else {
        return Err(summary_failed("the summary was empty".into()));
    };
    let recorded = actor
        .with_session(|s| s.handle_compaction(now(), compaction.clone()))
        .ok_or_else(|| summary_failed("the session is not loaded".into()))?;
    let cursor = recorded.map_err(|e| summary_failed(e.to_string()))?;
    actor
        .pump()
        .wait()
        .await
        .map_err(|e| summary_failed(e.message))?;
    Ok(Some((cursor, compaction)))
}

/// Applies one event; returns false when the purpose lapsed.
fn apply(actor: &Actor, purpose: Purpose, reply: &mut MaskedReply, event: LlmEvent) -> bool {
    if !purpose.current(actor) {
        return false;
    }
    show(actor, purpose, reply.push(event));
    true
}

/// Sends followers what a step's reply shows of itself, masked: its text, thinking and tool
/// calls' arguments as they stream (none for a summary, or when nothing is safe to show yet).
fn show(actor: &Actor, purpose: Purpose, shown: Vec<StreamEvent>) {
    if matches!(purpose, Purpose::Step(_)) {
        for event in shown {
            actor.broadcast(event);
        }
    }
}

async fn run_fake(
    actor: &Rc<Actor>,
    purpose: Purpose,
    request: &LlmRequest,
    reply: &mut MaskedReply,
) -> Result<bool, LlmFailure> {
    // A session made while the server allowed `fake` (or before it was gated) does not go on
    // issuing exact tool calls once it does not.
    if let Err(refused) = wuhu_core::llm::choice::check_provider(
        fake::PROVIDER,
        crate::model_choice::fake_enabled(&actor.env),
    ) {
        return Err(LlmFailure {
            status: None,
            message: refused.to_string(),
            retryable: false,
            retry_after_ms: None,
        });
    }
    let scripted = fake::respond(request);
    let default_delay = actor
        .env
        .var("WUHU_FAKE_DELAY_MS")
        .ok()
        .and_then(|v| v.to_string().parse::<u64>().ok())
        .unwrap_or(0);
    let delay = if scripted.chunk_delay_ms > 0 {
        scripted.chunk_delay_ms
    } else {
        default_delay
    };
    let mut first_delta_sent = false;
    for event in scripted.events {
        if delay > 0 {
            Delay::from(Duration::from_millis(delay)).await;
        }
        let is_delta = matches!(event, LlmEvent::TextDelta(_));
        if !apply(actor, purpose, reply, event) {
            return Ok(false);
        }
        // Without a delay the whole reply is computed at once; yield to the event loop after the
        // first delta so followers get it before the rest of the turn runs, as with a real provider.
        if is_delta && !first_delta_sent && delay == 0 {
            first_delta_sent = true;
            Delay::from(Duration::ZERO).await;
        }
    }
    match scripted.failure {
        Some(failure) => Err(failure),
        None => Ok(purpose.current(actor)),
    }
}

/// The retry rules: `WUHU_LLM_MAX_ATTEMPTS` (attempts per step, 1 to 10; default 3).
pub(crate) fn retry_policy(env: &worker::Env) -> RetryPolicy {
    let attempts = env.var("WUHU_LLM_MAX_ATTEMPTS").ok().map(|v| v.to_string());
    RetryPolicy::with_max_attempts_text(attempts.as_deref())
}

/// Streams one step from an HTTP provider (Chat Completions or Anthropic Messages).
async fn run_http(
    actor: &Rc<Actor>,
    purpose: Purpose,
    provider: HttpProvider,
    request: &LlmRequest,
    reply: &mut MaskedReply,
    mut exchange: Option<&mut Exchange>,
    // The model takes images (the table marks text-only ones).
    accepts_images: bool,
) -> Result<bool, LlmFailure> {
    let base_url = actor
        .env
        .var(provider.base_url_var)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| provider.default_base_url.to_string());
    let api_key = actor
        .env
        .secret(provider.api_key_var)
        .map(|v| v.to_string())
        .or_else(|_| actor.env.var(provider.api_key_var).map(|v| v.to_string()))
        .ok();
    // Tool results' images: their bytes from R2, the newest within the per-request bounds;
    // none for a model the table marks as text-only.
    let chosen = wuhu_core::llm::inline_images::to_load(&request.messages);
    let with_images;
    let request = if chosen.is_empty() {
        request
    } else {
        with_images = LlmRequest {
            images: if accepts_images {
                let (images, loads) =
                    crate::blob_store::load_images(&actor.env, &actor.tenant(), &chosen).await;
                actor.note_image_loads(loads);
                images
            } else {
                wuhu_core::llm::inline_images::InlineImages::text_only()
            },
            ..request.clone()
        };
        &with_images
    };
    let http = provider.build_http_request(&base_url, api_key.as_deref(), request);
    if let Some(exchange) = exchange.as_deref_mut() {
        exchange.url = http.url.clone();
        exchange.request_headers = http.headers.clone();
        exchange.request_body = http.body.clone();
    }
    let headers = Headers::new();
    for (name, value) in &http.headers {
        let _ = headers.set(name, value);
    }
    let mut init = RequestInit::new();
    init.with_method(Method::Post)
        .with_headers(headers)
        .with_body(Some(wasm_bindgen::JsValue::from_str(&http.body)));
    let outgoing = Request::new_with_init(&http.url, &init)
        .map_err(|e| LlmFailure::network(format!("could not build the provider request: {e}")))?;
    let fetch = Fetch::Request(outgoing);
    // Aborting the task drops this future: the controller then aborts the provider request and
    // its body stream, so a stopped step stops costing tokens.
    let abort = AbortOnDrop(Some(AbortController::default()));
    let signal = abort.signal();
    let send = fetch.send_with_signal(&signal);
    let mut response = match select(Box::pin(send), Delay::from(STREAM_IDLE_TIMEOUT)).await {
        Either::Left((result, _)) => {
            result.map_err(|e| LlmFailure::network(format!("provider unreachable: {e}")))?
        }
        Either::Right(_) => {
            return Err(LlmFailure::network(format!(
                "provider did not answer within {} s",
                STREAM_IDLE_TIMEOUT.as_secs()
            )));
        }
    };
    let status = response.status_code();
    if let Some(exchange) = exchange.as_deref_mut() {
        exchange.status = Some(status);
        exchange.response_headers = response.headers().entries().collect();
    }
    if !(200..300).contains(&status) {
        let headers: Vec<(String, String)> = response.headers().entries().collect();
        let body = response.text().await.unwrap_or_default();
        if let Some(exchange) = exchange.as_deref_mut() {
            collect(exchange, body.as_bytes());
        }
        return Err(LlmFailure::from_response(status, &headers, &body));
    }
    let mut stream = response
        .stream()
        .map_err(|e| LlmFailure::network(format!("provider response has no body: {e}")))?;
    let mut decoder = provider.decoder();
    loop {
        let timer = Delay::from(STREAM_IDLE_TIMEOUT);
        let chunk = match select(stream.next(), timer).await {
            Either::Left((chunk, _)) => chunk,
            Either::Right(_) => {
                return Err(LlmFailure::network(format!(
                    "provider sent nothing for {} s",
                    STREAM_IDLE_TIMEOUT.as_secs()
                )));
            }
        };
        if let (Some(exchange), Some(Ok(bytes))) = (exchange.as_deref_mut(), &chunk) {
            collect(exchange, bytes);
        }
        let events = match chunk {
            Some(Ok(bytes)) => decoder.push(&bytes)?,
            Some(Err(e)) => return Err(LlmFailure::network(format!("provider stream broke: {e}"))),
            None => break,
        };
        for event in events {
            if !apply(actor, purpose, reply, event) {
                return Ok(false);
            }
        }
    }
    for event in decoder.finish()? {
        if !apply(actor, purpose, reply, event) {
            return Ok(false);
        }
    }
    Ok(purpose.current(actor))
}

/// Keeps the start of a response body for its request log (one byte past the logged bound, so
/// the record knows it was cut) and counts the rest.
fn collect(exchange: &mut Exchange, bytes: &[u8]) {
    let room = (MAX_LOGGED_BODY_BYTES + 1).saturating_sub(exchange.response_body.len());
    exchange
        .response_body
        .extend_from_slice(&bytes[..bytes.len().min(room)]);
    exchange.response_body_total += bytes.len();
}

/// Aborts its controller when dropped (the request's future was dropped mid-flight).
struct AbortOnDrop(Option<AbortController>);

impl AbortOnDrop {
    fn signal(&self) -> AbortSignal {
        self.0
            .as_ref()
            .map(AbortController::signal)
            .unwrap_or_else(AbortSignal::abort)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(controller) = self.0.take() {
            controller.abort();
        }
    }
}

/// Makes sure the context window is in memory (read from SQLite once: the anchored entries by
/// cursor, then the newest ones, with out-of-line entries put back). Returns the header.
pub(crate) async fn context_window(actor: &Rc<Actor>) -> Option<Header> {
    let header = actor.with_loaded(|l| l.meta.header.clone())?;
    while actor.turn.tail.borrow().is_none() {
        let commits = actor.writes.commits.get();
        let anchors = actor.with_loaded(|l| l.session.context_anchors().cursors())?;
        let rows = actor
            .store()
            .ok()?
            .newest_entries(HOT_TAIL_KEEP as usize)
            .ok()?;
        let entries: Vec<Entry> = rows.into_iter().map(|(entry, _)| entry).collect();
        let mut entries =
            blob_io::resolve(&actor.env, &actor.tenant(), &actor.session_id(), entries)
                .await
                .ok()?;
        // A young fork holds only its own entries: the newest of its history (read from the
        // session forked) complete the window.
        let fork = actor.with_loaded(|l| l.meta.forked_from.clone()).flatten();
        if let Some(fork) = fork
            && entries.len() < HOT_TAIL_KEEP as usize
            && entries.first().is_none_or(|e| e.cursor == fork.cursor + 1)
        {
            let want = HOT_TAIL_KEEP - entries.len() as u64;
            let mut since = fork.cursor.saturating_sub(want);
            let mut history = Vec::new();
            while since < fork.cursor {
                let (page, _) = archive::read_page(actor, since, wuhu_core::archive::MAX_PAGE)
                    .await
                    .ok()?;
                let last = page.last()?.cursor;
                history.extend(page.into_iter().filter(|e| e.cursor <= fork.cursor));
                since = last;
            }
            history.append(&mut entries);
            entries = history;
        }
        let oldest = entries.first().map_or(u64::MAX, |e| e.cursor);
        let mut anchored = Vec::new();
        for cursor in anchors.into_iter().filter(|c| *c < oldest) {
            let (page, _) = archive::read_page(actor, cursor - 1, 1).await.ok()?;
            anchored.extend(page.into_iter().filter(|e| e.cursor == cursor));
        }
        // A commit during the reads pushed nothing (no tail yet): read again.
        if actor.writes.commits.get() != commits {
            continue;
        }
        let mut loaded = ContextWindow::default();
        for entry in anchored {
            loaded.push_anchor(entry);
        }
        for entry in entries {
            let bytes = serde_json::to_string(&entry).map_or(0, |j| j.len());
            loaded.push(entry, bytes);
        }
        *actor.turn.tail.borrow_mut() = Some(loaded);
    }
    Some(header)
}
