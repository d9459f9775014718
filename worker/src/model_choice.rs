//! The host's side of `wuhu_core::llm::choice`: whether this server allows the `fake` provider
//! (its variable), and the `400`s of a refused provider or an unpriced model.

use worker::Env;
use wuhu_core::llm::choice::{self, ProviderRefused, UnpricedModel};

use crate::http::ApiError;

/// Whether `WUHU_ENABLE_FAKE_PROVIDER=1` is set (`scripts/dev` and the end-to-end tests set it;
/// `wrangler.toml` does not, so a deployed server refuses `fake`).
pub(crate) fn fake_enabled(env: &Env) -> bool {
    let var = env
        .var(choice::FAKE_PROVIDER_VAR)
        .ok()
        .map(|v| v.to_string());
    choice::fake_enabled(var.as_deref())
}

/// `400 fake_provider_disabled` / `400 provider_required`.
pub(crate) fn provider_refused(refused: ProviderRefused) -> ApiError {
    ApiError::new(400, refused.code(), refused.to_string())
}

/// `400 unpriced_model`.
pub(crate) fn unpriced(refused: UnpricedModel) -> ApiError {
    ApiError::new(400, UnpricedModel::CODE, refused.to_string())
}
