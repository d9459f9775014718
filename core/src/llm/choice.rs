//! Which provider and model a session may use: the `fake` provider's gate, the tenant's default,
//! and prices while a USD budget is set. One rule for every way a model is chosen: creating a
//! session (`POST /v1/sessions`, a chat thread, `spawn_session`), switching (`PATCH {provider,
//! model}`, `set_model`, js `wuhu.session.setModel`) and, because a budget or a price can change
//! after the choice, every step's request.
//!
//! * **`fake` is for development** ([`FAKE_PROVIDER_VAR`]): it replies with whatever tool calls
//!   a prompt spells out (`@fake {…}`), so on a server that others use it would turn every prompt
//!   into exact commands, with no model in between to refuse. It is allowed only where the
//!   server sets `WUHU_ENABLE_FAKE_PROVIDER=1` (`scripts/dev` and the end-to-end tests do).
//! * **The default** ([`choose`]): a session that names no provider gets the tenant's
//!   `defaultProvider` / `defaultModel` (`wuhu://workspace/config/tenant.json`), else `fake`
//!   where it is allowed, else it is refused, naming both ways out.
//! * **Budgets see every model** ([`check_priced`]): while a USD limit applies to a session (its
//!   own budget, an ancestor's when it was spawned, or the tenant's), a model without a price in
//!   the model table is refused (`400 unpriced_model`), and a step on one ends its turn. Its
//!   requests would cost nothing against the limit, so the limit would not hold. The way out is
//!   a price: a row in `wuhu://workspace/config/models.json`. There is no fallback price: a
//!   guessed price would be wrong in both directions, and an admin who knows the model's price
//!   can write it in one line. `fake` costs nothing (no request leaves the server), so it is
//!   priced at zero.

use super::models::ModelTable;
use crate::tenant_config::TenantConfig;

/// The variable that allows the `fake` provider: exactly `1`.
pub const FAKE_PROVIDER_VAR: &str = "WUHU_ENABLE_FAKE_PROVIDER";

/// Whether [`FAKE_PROVIDER_VAR`] (its value, `None` when unset) allows `fake`.
pub fn fake_enabled(var: Option<&str>) -> bool {
    var.map(str::trim) == Some("1")
}

/// Why a provider was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProviderRefused {
    /// `fake` on a server that does not allow it (`400 fake_provider_disabled`).
    #[error(
        "the fake provider is for development and this server does not allow it (set {FAKE_PROVIDER_VAR}=1 on the server to allow it): name a provider, such as \"provider\":\"anthropic\" or \"openai\""
    )]
    FakeDisabled,
    /// No provider named, no tenant default, and `fake` not allowed (`400 provider_required`).
    #[error(
        "name a provider (\"provider\": one of {providers}), or have an admin set \"defaultProvider\" in wuhu://workspace/config/tenant.json; the fake provider, the development default, needs {FAKE_PROVIDER_VAR}=1 on the server"
    )]
    NoProvider {
        /// The providers a session may name.
        providers: String,
    },
}

impl ProviderRefused {
    /// The error code of the `400`.
    pub fn code(&self) -> &'static str {
        match self {
            ProviderRefused::FakeDisabled => "fake_provider_disabled",
            ProviderRefused::NoProvider { .. } => "provider_required",
        }
    }
}

/// Checks that `provider` may be used on this server.
///
/// # Errors
/// [`ProviderRefused::FakeDisabled`] for `fake` when `fake_enabled` is false.
pub fn check_provider(provider: &str, fake_enabled: bool) -> Result<(), ProviderRefused> {
    if provider == super::fake::PROVIDER && !fake_enabled {
        return Err(ProviderRefused::FakeDisabled);
    }
    Ok(())
}

/// The provider and model of a new session that named `provider` and `model` (either may be
/// missing), given the tenant's settings: a named provider; else the tenant's default; else
/// `fake` where allowed. The model: the one named; else the tenant's default model when the
/// provider is the tenant's default provider; else the provider's own default.
///
/// # Errors
/// [`ProviderRefused`] when no provider may be used.
pub fn choose(
    provider: Option<&str>,
    model: Option<&str>,
    tenant: &TenantConfig,
    fake_enabled: bool,
) -> Result<(String, String), ProviderRefused> {
    let provider = match (provider, tenant.default_provider.as_deref()) {
        (Some(named), _) => named,
        (None, Some(default)) => default,
        (None, None) if fake_enabled => super::fake::PROVIDER,
        (None, None) => {
            return Err(ProviderRefused::NoProvider {
                providers: super::PROVIDERS
                    .iter()
                    .filter(|p| **p != super::fake::PROVIDER)
                    .map(|p| format!("{p:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    };
    check_provider(provider, fake_enabled)?;
    let model = match model {
        Some(model) => model.to_string(),
        None => tenant
            .default_model
            .as_deref()
            .filter(|_| tenant.default_provider.as_deref() == Some(provider))
            .unwrap_or_else(|| super::default_model(provider))
            .to_string(),
    };
    Ok((provider.to_string(), model))
}

/// Which USD limits apply to a session's requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdLimits {
    /// The session's own budget has `maxUsd`.
    pub session: bool,
    /// An ancestor's budget had `maxUsd` when the session was spawned (a child's spending counts
    /// against its ancestors' budgets).
    pub ancestor: bool,
    /// The tenant's budget has `maxUsd`.
    pub tenant: bool,
}

impl UsdLimits {
    /// Whether any applies.
    pub fn any(self) -> bool {
        self.session || self.ancestor || self.tenant
    }

    fn names(self) -> String {
        let names: Vec<&str> = [
            (self.session, "the session's"),
            (self.ancestor, "a parent session's"),
            (self.tenant, "the tenant's"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
        names.join(" and ")
    }
}

/// A model without a price while a USD limit applies (`400 unpriced_model`; a step's
/// `wuhu_unpriced_model_v1` notice).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "model {model:?} ({provider}) has no price in the model table, and {limits} budget sets a USD limit, which its requests would not count against: an admin can add its price as a row {{\"id\":{model:?},\"provider\":{provider:?},\"inputPerMtok\":…,\"outputPerMtok\":…}} in wuhu://workspace/config/models.json (the table in effect: wuhu://config/models.json), or choose a priced model"
)]
pub struct UnpricedModel {
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// Whose budgets set the limit, as words.
    pub limits: String,
}

impl UnpricedModel {
    /// The error code of the `400`.
    pub const CODE: &'static str = "unpriced_model";
}

/// Whether `model` on `provider` has a price in `table` (`fake`: always, at zero).
pub fn is_priced(table: &ModelTable, provider: &str, model: &str) -> bool {
    provider == super::fake::PROVIDER || table.lookup(model).is_some_and(|row| row.prices.is_some())
}

/// Whether `model` on `provider` is priced by the built-in table alone: a tenant's table never
/// takes a built-in price away, so then neither the tenant's table nor its budget need be read.
pub fn is_priced_builtin(provider: &str, model: &str) -> bool {
    is_priced(&ModelTable::builtin(), provider, model)
}

/// Checks that requests to `model` on `provider` count against the USD `limits` that apply.
///
/// # Errors
/// [`UnpricedModel`] when a limit applies and `table` has no price for the model.
pub fn check_priced(
    table: &ModelTable,
    provider: &str,
    model: &str,
    limits: UsdLimits,
) -> Result<(), UnpricedModel> {
    if !limits.any() || is_priced(table, provider, model) {
        return Ok(());
    }
    Err(UnpricedModel {
        provider: provider.to_string(),
        model: model.to_string(),
        limits: limits.names(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(provider: Option<&str>, model: Option<&str>) -> TenantConfig {
        TenantConfig {
            default_provider: provider.map(str::to_string),
            default_model: model.map(str::to_string),
            ..TenantConfig::default()
        }
    }

    #[test]
    fn the_fake_provider_needs_its_variable() {
        for (var, enabled) in [
            (None, false),
            (Some(""), false),
            (Some("0"), false),
            (Some("true"), false),
            (Some("yes"), false),
            (Some("11"), false),
            (Some("1"), true),
            (Some(" 1 "), true),
        ] {
            assert_eq!(fake_enabled(var), enabled, "{var:?}");
        }
        assert_eq!(check_provider("fake", true), Ok(()));
        assert_eq!(
            check_provider("fake", false),
            Err(ProviderRefused::FakeDisabled)
        );
        for provider in ["openai", "openai-compatible", "anthropic"] {
            assert_eq!(check_provider(provider, false), Ok(()));
        }
        let message = ProviderRefused::FakeDisabled.to_string();
        assert!(message.contains("WUHU_ENABLE_FAKE_PROVIDER=1"), "{message}");
    }

    #[test]
    fn a_session_gets_the_named_provider_else_the_tenants_default_else_fake_where_allowed() {
        // (named provider, named model, tenant default, fake allowed) -> chosen or error code
        type Case = (
            Option<&'static str>,
            Option<&'static str>,
            (Option<&'static str>, Option<&'static str>),
            bool,
            Result<(&'static str, &'static str), &'static str>,
        );
        let cases: Vec<Case> = vec![
            // Development: nothing named, no default: fake.
            (None, None, (None, None), true, Ok(("fake", "fake-echo"))),
            (None, Some("m"), (None, None), true, Ok(("fake", "m"))),
            // Production: nothing named, no default: refused.
            (None, None, (None, None), false, Err("provider_required")),
            (
                None,
                Some("gpt-5"),
                (None, None),
                false,
                Err("provider_required"),
            ),
            // fake named: only where allowed.
            (
                Some("fake"),
                None,
                (None, None),
                false,
                Err("fake_provider_disabled"),
            ),
            (
                Some("fake"),
                None,
                (Some("anthropic"), None),
                false,
                Err("fake_provider_disabled"),
            ),
            (
                Some("fake"),
                None,
                (Some("anthropic"), None),
                true,
                Ok(("fake", "fake-echo")),
            ),
            // The tenant's default, with its model.
            (
                None,
                None,
                (Some("anthropic"), Some("claude-haiku-4-5")),
                false,
                Ok(("anthropic", "claude-haiku-4-5")),
            ),
            (
                None,
                None,
                (Some("anthropic"), Some("claude-haiku-4-5")),
                true,
                Ok(("anthropic", "claude-haiku-4-5")),
            ),
            (
                None,
                None,
                (Some("openai"), None),
                false,
                Ok(("openai", "gpt-5-mini")),
            ),
            // A named model goes with the default provider.
            (
                None,
                Some("gpt-5"),
                (Some("openai"), Some("gpt-4o")),
                false,
                Ok(("openai", "gpt-5")),
            ),
            // The default model belongs to the default provider only.
            (
                Some("openai"),
                None,
                (Some("anthropic"), Some("claude-haiku-4-5")),
                false,
                Ok(("openai", "gpt-5-mini")),
            ),
            (
                Some("anthropic"),
                None,
                (Some("anthropic"), Some("claude-haiku-4-5")),
                false,
                Ok(("anthropic", "claude-haiku-4-5")),
            ),
            // A tenant default of fake follows the same gate.
            (
                None,
                None,
                (Some("fake"), None),
                false,
                Err("fake_provider_disabled"),
            ),
            (
                None,
                None,
                (Some("fake"), Some("fake-window-4000")),
                true,
                Ok(("fake", "fake-window-4000")),
            ),
        ];
        for (provider, model, (dp, dm), fake, want) in cases {
            let got = choose(provider, model, &tenant(dp, dm), fake);
            let got = got
                .as_ref()
                .map(|(p, m)| (p.as_str(), m.as_str()))
                .map_err(ProviderRefused::code);
            assert_eq!(
                got, want,
                "{provider:?} {model:?} default {dp:?}/{dm:?} fake {fake}"
            );
        }
        let refused = choose(None, None, &TenantConfig::default(), false).unwrap_err();
        let message = refused.to_string();
        assert!(message.contains("WUHU_ENABLE_FAKE_PROVIDER=1"), "{message}");
        assert!(message.contains("config/tenant.json"), "{message}");
        assert!(!message.contains("\"fake\""), "{message}");
    }

    #[test]
    fn a_usd_limit_refuses_models_without_a_price() {
        let builtin = ModelTable::builtin();
        let tenant_table = ModelTable::with_tenant(Some(
            r#"{"models":[{"id":"o3","provider":"openai","inputPerMtok":2,"outputPerMtok":8},{"id":"local-llama","provider":"openai-compatible"}]}"#,
        ))
        .unwrap();
        let none = UsdLimits::default();
        let session = UsdLimits {
            session: true,
            ..none
        };
        let ancestor = UsdLimits {
            ancestor: true,
            ..none
        };
        let tenant = UsdLimits {
            tenant: true,
            ..none
        };
        let all = UsdLimits {
            session: true,
            ancestor: true,
            tenant: true,
        };
        // (table, provider, model, limits, priced?)
        let cases: Vec<(&ModelTable, &str, &str, UsdLimits, bool)> = vec![
            // No USD limit: anything goes (a token limit counts every model).
            (&builtin, "openai", "o3", none, true),
            (&builtin, "openai", "gpt-4-turbo", none, true),
            // Any USD limit: an unpriced model is refused, whoever set it.
            (&builtin, "openai", "o3", session, false),
            (&builtin, "openai", "o3", ancestor, false),
            (&builtin, "openai", "o3", tenant, false),
            (&builtin, "openai", "gpt-4-turbo", all, false),
            (&builtin, "anthropic", "claude-3-opus", tenant, false),
            // Priced models, and their dated snapshots, pass.
            (&builtin, "openai", "gpt-4o", all, true),
            (&builtin, "openai", "gpt-4o-2024-08-06", all, true),
            (
                &builtin,
                "anthropic",
                "claude-sonnet-4-5-20250929",
                all,
                true,
            ),
            // A price in the tenant's table is a price.
            (&tenant_table, "openai", "o3", all, true),
            // A tenant row without a price is still unpriced.
            (
                &tenant_table,
                "openai-compatible",
                "local-llama",
                tenant,
                false,
            ),
            (
                &tenant_table,
                "openai-compatible",
                "local-llama",
                none,
                true,
            ),
            // fake costs nothing.
            (&builtin, "fake", "fake", all, true),
            (&builtin, "fake", "anything", all, true),
        ];
        for (table, provider, model, limits, priced) in cases {
            let got = check_priced(table, provider, model, limits);
            assert_eq!(
                got.is_ok(),
                priced,
                "{provider} {model} {limits:?}: {got:?}"
            );
        }
        let refused = check_priced(
            &builtin,
            "openai",
            "o3",
            UsdLimits {
                session: true,
                tenant: true,
                ..none
            },
        )
        .unwrap_err();
        expect_test::expect![[r#"model "o3" (openai) has no price in the model table, and the session's and the tenant's budget sets a USD limit, which its requests would not count against: an admin can add its price as a row {"id":"o3","provider":"openai","inputPerMtok":…,"outputPerMtok":…} in wuhu://workspace/config/models.json (the table in effect: wuhu://config/models.json), or choose a priced model"#]]
            .assert_eq(&refused.to_string());
        assert!(is_priced_builtin("openai", "gpt-5"));
        assert!(is_priced_builtin("fake", "fake"));
        assert!(!is_priced_builtin("openai", "o3"));
    }
}
