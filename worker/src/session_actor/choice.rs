//! Which provider and model the session may use (`wuhu_core::llm::choice`): checked when it is
//! created, when a `PATCH` switches, and before every step's request (a USD budget set, or a
//! price taken away, after the model was chosen). The tools' own checks (`set_model`,
//! `spawn_session {model}`) use the [`ModelRule`] the actor hands them.

use worker::Env;
use wuhu_core::llm::LlmFailure;
use wuhu_core::llm::choice::{self, UnpricedModel, UsdLimits};
use wuhu_core::llm::models::ModelTable;
use wuhu_core::llm::reasoning::{self, Reasoning, ReasoningRefused};

use super::{Actor, inference};
use crate::http::{ApiError, ApiResult};
use crate::model_choice::{fake_enabled, provider_refused, unpriced};
use crate::tenant_index;
use crate::tool_context::ModelRule;

/// Checks a model chosen for a session of `tenant` (a creation, a `PATCH`): a provider this
/// server allows, and a price when a USD limit applies. `session_usd` and `ancestor_usd`: the
/// session's own budget and its lineage set one. The tenant's budget (a round trip to its
/// index) and model table (R2) are read only for a model the built-in table does not price.
///
/// # Errors
/// `400 fake_provider_disabled`, `400 unpriced_model`; the index's or storage's error when they
/// cannot be read (nothing is created or switched then).
pub(crate) async fn check_model(
    env: &Env,
    tenant: &str,
    provider: &str,
    model: &str,
    session_usd: bool,
    ancestor_usd: bool,
) -> ApiResult<()> {
    choice::check_provider(provider, fake_enabled(env)).map_err(provider_refused)?;
    if choice::is_priced_builtin(provider, model) {
        return Ok(());
    }
    let mut limits = UsdLimits {
        session: session_usd,
        ancestor: ancestor_usd,
        tenant: false,
    };
    limits.tenant = tenant_index::budget(env, tenant).await?.usd_limited();
    if !limits.any() {
        return Ok(());
    }
    let settings = inference::settings_of(env, tenant)
        .await
        .map_err(settings_error)?;
    choice::check_priced(&settings.models, provider, model, limits).map_err(unpriced)
}

/// Checks a reasoning setting for `model` on `provider` against `table` (the tenant's model
/// table as the caller read it: a creation's, a `PATCH`'s, an enqueue's).
///
/// # Errors
/// `400 invalid_reasoning`, naming what is wrong (`wuhu_core::llm::reasoning`).
pub(crate) fn check_reasoning(
    table: &ModelTable,
    provider: &str,
    model: &str,
    reasoning: &Reasoning,
) -> ApiResult<()> {
    reasoning::plan(table, provider, model, reasoning)
        .map(|_| ())
        .map_err(|refused| ApiError::new(400, ReasoningRefused::CODE, refused.to_string()))
}

/// The settings could not be read (`503`, retried by the caller) or are invalid (`400`: an
/// admin fixes them).
pub(crate) fn settings_error(failure: LlmFailure) -> ApiError {
    if failure.retryable {
        ApiError::new(503, "unavailable", failure.message)
    } else {
        ApiError::new(400, "invalid_tenant_settings", failure.message)
    }
}

impl Actor {
    /// The USD limits on this session's requests: its own budget, its lineage's, and the
    /// tenant's (`tenant`, as last known).
    pub(crate) fn usd_limits(&self, tenant: bool) -> UsdLimits {
        let (session, ancestor) = self
            .with_loaded(|l| {
                (
                    l.session.budget().is_some_and(|b| b.max_usd.is_some()),
                    l.meta.lineage.usd_budget_above,
                )
            })
            .unwrap_or_default();
        UsdLimits {
            session,
            ancestor,
            tenant,
        }
    }

    /// Before a step's request: its model must have a price in `table` while a USD limit
    /// applies (`tenant_usd`: the tenant's budget, as known, sets one).
    pub(crate) fn check_step_priced(
        &self,
        table: &ModelTable,
        tenant_usd: bool,
    ) -> Result<(), UnpricedModel> {
        let Some((provider, model)) =
            self.with_loaded(|l| (l.meta.header.provider.clone(), l.meta.header.model.clone()))
        else {
            return Ok(());
        };
        choice::check_priced(table, &provider, &model, self.usd_limits(tenant_usd))
    }

    /// The rule a tool call checks models against: the limits as this step knows them (the
    /// tenant's budget as the index last answered) and the model table the step read.
    pub(crate) fn model_rule(&self) -> ModelRule {
        let tenant = self
            .bookkeeping
            .known_budget
            .get()
            .is_some_and(|known| known.state.usd_limited());
        ModelRule {
            fake_enabled: fake_enabled(&self.env),
            limits: self.usd_limits(tenant),
            table: self
                .tenant_settings
                .last_settings
                .borrow()
                .as_ref()
                .map(|s| s.models.clone()),
        }
    }
}
