//! A tenant's settings: the workspace documents under `config/`, which only admins write
//! (`crate::authority::is_tenant_config`).
//!
//! * `config/models.json`: rows over the built-in model table (`crate::llm::models::ModelTable`);
//! * `config/tenant.json`: [`TenantConfig`] (request logs and their retention).
//!
//! Both are checked when written ([`check_document`]) and when read: an invalid document is an
//! error the reader shows, never a silent fallback to the defaults.

use serde::Deserialize;

use crate::llm::models::{ModelTable, TENANT_TABLE_PATH};

/// Where [`TenantConfig`] lives in the workspace.
pub const TENANT_CONFIG_PATH: &str = "config/tenant.json";

/// Days request logs are kept when `llmRequestLogDays` is not set.
pub const DEFAULT_LOG_DAYS: u32 = 14;

/// Longest retention a tenant may set, in days.
pub const MAX_LOG_DAYS: u32 = 90;

/// `config/tenant.json`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantConfig {
    /// Whether each provider request and response of the tenant's sessions is written to R2
    /// (redacted, see `crate::llm::request_log`).
    #[serde(default)]
    pub llm_request_logs: bool,
    /// Days a request log is kept (1 to [`MAX_LOG_DAYS`]; default [`DEFAULT_LOG_DAYS`]).
    #[serde(default = "default_log_days")]
    pub llm_request_log_days: u32,
}

fn default_log_days() -> u32 {
    DEFAULT_LOG_DAYS
}

impl Default for TenantConfig {
    fn default() -> TenantConfig {
        TenantConfig {
            llm_request_logs: false,
            llm_request_log_days: DEFAULT_LOG_DAYS,
        }
    }
}

/// Why `config/tenant.json` was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("wuhu://workspace/config/tenant.json is not valid: {0}")]
pub struct TenantConfigError(pub String);

impl TenantConfig {
    /// The settings in `text` (`None`: no document, the defaults).
    ///
    /// # Errors
    /// [`TenantConfigError`] for a document that is not valid.
    pub fn parse(text: Option<&str>) -> Result<TenantConfig, TenantConfigError> {
        let Some(text) = text else {
            return Ok(TenantConfig::default());
        };
        let config: TenantConfig =
            serde_json::from_str(text).map_err(|e| TenantConfigError(e.to_string()))?;
        if !(1..=MAX_LOG_DAYS).contains(&config.llm_request_log_days) {
            return Err(TenantConfigError(format!(
                "llmRequestLogDays must be 1 to {MAX_LOG_DAYS}"
            )));
        }
        Ok(config)
    }
}

/// Checks a document about to be written at `path` (normalised) under `config/`: the two
/// documents above must be valid, and nothing else lives there.
///
/// # Errors
/// A message for a 400.
pub fn check_document(path: &str, text: &str) -> Result<(), String> {
    match path {
        TENANT_TABLE_PATH => ModelTable::with_tenant(Some(text))
            .map(drop)
            .map_err(|e| e.to_string()),
        TENANT_CONFIG_PATH => TenantConfig::parse(Some(text))
            .map(drop)
            .map_err(|e| e.to_string()),
        _ => Err(format!(
            "config/ holds only {TENANT_TABLE_PATH} and {TENANT_CONFIG_PATH}, not {path}"
        )),
    }
}

/// The two settings documents as read from the tenant's storage (`None`: no document), kept by
/// a session actor between steps.
///
/// A step does not wait for these reads before its provider request: it sends with the
/// documents its actor read last and reads them again meanwhile ([`confirm_settings`]). Nothing
/// of the reply is shown or kept before the new reading answers, so a step still runs with the
/// settings as they are when its request goes out, and a change made since the last step costs
/// only a request sent again.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SettingsDocs {
    /// `config/models.json`.
    pub models: Option<String>,
    /// `config/tenant.json`.
    pub tenant: Option<String>,
}

/// What a step that sent with `used` does once the documents are read again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingsCheck {
    /// The reading matches: the request stands.
    Keep,
    /// The documents changed, or could not be read: the request is dropped and the step goes
    /// on with the new reading (or fails with the read's error, as a step without a kept
    /// reading would).
    Redo,
}

/// Compares what a step sent with against what was read meanwhile (`None`: the read failed).
#[must_use]
pub fn confirm_settings(used: &SettingsDocs, read: Option<&SettingsDocs>) -> SettingsCheck {
    match read {
        Some(read) if read == used => SettingsCheck::Keep,
        _ => SettingsCheck::Redo,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_under_config_are_checked_when_written() {
        let cases = [
            ("config/tenant.json", "{}", Ok(())),
            ("config/tenant.json", r#"{"llmRequestLogs":true}"#, Ok(())),
            (
                "config/tenant.json",
                r#"{"llmRequestLogs":true,"llmRequestLogDays":90}"#,
                Ok(()),
            ),
            (
                "config/tenant.json",
                r#"{"llmRequestLogDays":0}"#,
                Err(
                    "wuhu://workspace/config/tenant.json is not valid: llmRequestLogDays must be 1 to 90",
                ),
            ),
            (
                "config/tenant.json",
                r#"{"llmRequestLogs":"yes"}"#,
                Err(
                    "wuhu://workspace/config/tenant.json is not valid: invalid type: string \"yes\", expected a boolean at line 1 column 23",
                ),
            ),
            (
                "config/tenant.json",
                r#"{"requestLogs":true}"#,
                Err(
                    "wuhu://workspace/config/tenant.json is not valid: unknown field `requestLogs`, expected `llmRequestLogs` or `llmRequestLogDays` at line 1 column 14",
                ),
            ),
            ("config/models.json", r#"{"models":[]}"#, Ok(())),
            (
                "config/models.json",
                "not json",
                Err(
                    "wuhu://workspace/config/models.json is not a valid model table: expected ident at line 1 column 2",
                ),
            ),
            (
                "config/notes.md",
                "hello",
                Err(
                    "config/ holds only config/models.json and config/tenant.json, not config/notes.md",
                ),
            ),
        ];
        for (path, text, want) in cases {
            assert_eq!(
                check_document(path, text),
                want.map_err(str::to_string),
                "{path} {text}"
            );
        }
        assert_eq!(TenantConfig::parse(None), Ok(TenantConfig::default()));
        assert_eq!(
            TenantConfig::default().llm_request_log_days,
            DEFAULT_LOG_DAYS
        );
    }

    #[test]
    fn a_step_keeps_its_request_only_when_the_documents_read_again_are_the_same() {
        let docs = |models: Option<&str>, tenant: Option<&str>| SettingsDocs {
            models: models.map(str::to_string),
            tenant: tenant.map(str::to_string),
        };
        let used = docs(Some("{\"models\":[]}"), None);
        let cases = [
            (
                "the same documents",
                Some(used.clone()),
                SettingsCheck::Keep,
            ),
            ("the read failed", None, SettingsCheck::Redo),
            (
                "the model table changed",
                Some(docs(Some("{\"models\":[{}]}"), None)),
                SettingsCheck::Redo,
            ),
            (
                "the model table was deleted",
                Some(docs(None, None)),
                SettingsCheck::Redo,
            ),
            (
                "request logs were turned on",
                Some(docs(
                    Some("{\"models\":[]}"),
                    Some("{\"llmRequestLogs\":true}"),
                )),
                SettingsCheck::Redo,
            ),
        ];
        for (name, read, want) in cases {
            assert_eq!(confirm_settings(&used, read.as_ref()), want, "{name}");
        }
        assert_eq!(
            confirm_settings(&SettingsDocs::default(), Some(&SettingsDocs::default())),
            SettingsCheck::Keep,
            "no documents, still none"
        );
    }
}
