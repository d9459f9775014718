//! A tenant's settings: the workspace documents under `config/`, which only admins write
//! (`crate::authority::is_tenant_config`).
//!
//! * `config/models.json`: rows over the built-in model table (`crate::llm::models::ModelTable`);
//! * `config/tenant.json`: [`TenantConfig`] (request logs and their retention, the default
//!   provider and model of new sessions);
//! * `config/policy.json`: the tenant's policy (`crate::policy`);
//! * `config/mcp.json`: the tenant's MCP servers (`crate::mcp_client::config`).
//!
//! Each is checked when written ([`check_document`]) and when read: an invalid document is an
//! error the reader shows, never a silent fallback to the defaults.

use serde::Deserialize;

use crate::llm::models::{ModelTable, TENANT_TABLE_PATH};
use crate::mcp_client::config::McpServers;
use crate::mcp_client::documents::TENANT_MCP_PATH;
use crate::policy::{Policy, TENANT_POLICY_PATH};

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
    /// The provider of a session that names none (`crate::llm::choice::choose`): one of
    /// `crate::llm::PROVIDERS`. Unset: `fake` where the server allows it, else such a session
    /// is refused.
    #[serde(default)]
    pub default_provider: Option<String>,
    /// The model of a session on the default provider that names none (1 to
    /// `crate::wire::MAX_MODEL_CHARS` characters); needs `defaultProvider`. Unset: the
    /// provider's own default.
    #[serde(default)]
    pub default_model: Option<String>,
}

fn default_log_days() -> u32 {
    DEFAULT_LOG_DAYS
}

impl Default for TenantConfig {
    fn default() -> TenantConfig {
        TenantConfig {
            llm_request_logs: false,
            llm_request_log_days: DEFAULT_LOG_DAYS,
            default_provider: None,
            default_model: None,
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
        if let Some(provider) = &config.default_provider
            && !crate::llm::PROVIDERS.contains(&provider.as_str())
        {
            return Err(TenantConfigError(format!(
                "defaultProvider must be one of {}, not {provider:?}",
                crate::llm::PROVIDERS.map(|p| format!("{p:?}")).join(", ")
            )));
        }
        if let Some(model) = &config.default_model {
            if config.default_provider.is_none() {
                return Err(TenantConfigError(
                    "defaultModel needs defaultProvider (the provider it is a model of)".into(),
                ));
            }
            if model.trim().is_empty()
                || model.trim() != model
                || model.chars().count() > crate::wire::MAX_MODEL_CHARS
            {
                return Err(TenantConfigError(format!(
                    "defaultModel must be 1 to {} characters, without spaces at the ends",
                    crate::wire::MAX_MODEL_CHARS
                )));
            }
        }
        Ok(config)
    }
}

/// Checks a document about to be written at `path` (normalised) under `config/`: the
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
        TENANT_POLICY_PATH => Policy::parse(path, Some(text))
            .map(drop)
            .map_err(|e| e.to_string()),
        TENANT_MCP_PATH => McpServers::parse(path, Some(text))
            .map(drop)
            .map_err(|e| e.to_string()),
        _ => Err(format!(
            "config/ holds only {TENANT_TABLE_PATH}, {TENANT_CONFIG_PATH}, {TENANT_POLICY_PATH} and {TENANT_MCP_PATH}, not {path}"
        )),
    }
}

/// The two settings documents as read from the tenant's storage (`None`: no document).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SettingsDocs {
    /// `config/models.json`.
    pub models: Option<String>,
    /// `config/tenant.json`.
    pub tenant: Option<String>,
    /// `config/policy.json`.
    pub policy: Option<String>,
}

/// Most sessions one tenant's index holds as keeping a reading of the settings (see
/// [`SettingsCache`]): what one change may have to tell. A hold past it lets go of the session
/// that held longest ago (told to forget its reading: it holds again at its next step).
/// `WUHU_MAX_SETTINGS_HOLDERS` sets another (1 to this), see [`max_settings_holders`].
pub const MAX_SETTINGS_HOLDERS: usize = 1_000;

/// The holders' bound from `WUHU_MAX_SETTINGS_HOLDERS` (unset, or not 1 to
/// [`MAX_SETTINGS_HOLDERS`]: the default, which is also the most).
#[must_use]
pub fn max_settings_holders(var: Option<&str>) -> usize {
    var.and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| (1..=MAX_SETTINGS_HOLDERS).contains(n))
        .unwrap_or(MAX_SETTINGS_HOLDERS)
}

/// How many holders the index tells at once when the settings change.
pub const SETTINGS_TELL_CONCURRENCY: usize = 16;

/// What a session actor keeps of its tenant's settings between steps (decision 0021): `T` is
/// the reading (the documents, or what the actor made of them).
///
/// Every write or delete under `config/` (API, tools, `js`) tells the tenant's index once the
/// document is stored, and the index tells each session that *holds* a reading to forget it
/// before the write is answered. So a step may use a kept reading without reading R2 again, and
/// still runs with the settings as they are when it starts: a change answered before the step
/// began has reached the actor.
///
/// The order that makes this hold: an actor asks the index to hold it **before** it reads the
/// documents it keeps, so a change either finds it among the holders (and is told), or was
/// stored before the kept reading began (and is read). Only a reading begun while held is kept
/// ([`begin_reading`](Self::begin_reading)): an actor's first reading asks no hold, its second
/// asks alongside and is used (it began after its step did, so after any change answered
/// before) but not kept; the next one is kept. A forget can overtake a hold's answer or a reading under way:
/// each counts from a [`generation`](Self::generation) taken before it, and one that a forget
/// overtook neither marks the actor held nor keeps what it read (the step still uses that
/// reading: it began before the change was answered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingsCache<T> {
    reading: Option<T>,
    held: bool,
    /// A reading finished since the actor started: only then is a hold worth its index write.
    read_before: bool,
    generation: u64,
}

impl<T> Default for SettingsCache<T> {
    fn default() -> Self {
        SettingsCache {
            reading: None,
            held: false,
            read_before: false,
            generation: 0,
        }
    }
}

impl<T> SettingsCache<T> {
    /// The reading a step may use without reading again: kept, and the index holds this actor.
    #[must_use]
    pub fn kept(&self) -> Option<&T> {
        self.reading.as_ref().filter(|_| self.held)
    }

    /// Whether a step asks the index to hold this actor (alongside its reading): not held, and
    /// it read before. An actor's first reading asks nothing: a session that takes one step
    /// (a one-off question, a burst of new sessions) costs the index no write.
    #[must_use]
    pub fn needs_hold(&self) -> bool {
        !self.held && self.read_before
    }

    /// The generation while the index holds this actor, `None` while it does not: what a
    /// request that relies on being told of changes records when it leaves (a forget since
    /// changes it; `tenant_usage::unlimited_and_told`).
    #[must_use]
    pub fn held_generation(&self) -> Option<u64> {
        self.held.then_some(self.generation)
    }

    /// Counts forgets: taken before a hold, given back with its answer.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// A reading about to begin, given back with its result ([`read`](Self::read)).
    #[must_use]
    pub fn begin_reading(&self) -> ReadingTicket {
        ReadingTicket {
            generation: self.generation,
            held: self.held,
        }
    }

    /// The index answered a hold asked at `since`.
    pub fn held(&mut self, since: u64) {
        if since == self.generation {
            self.held = true;
        }
    }

    /// A reading finished: kept when it began while the actor was held, no forget came since,
    /// and the documents are valid (`None`: invalid, or the read failed; then nothing is kept
    /// and the next step reads again).
    pub fn read(&mut self, ticket: ReadingTicket, reading: Option<T>) {
        self.read_before = true;
        if ticket.held && ticket.generation == self.generation {
            self.reading = reading;
        }
    }

    /// The index said the settings changed: nothing is kept, and the next step asks for a hold
    /// again (the index let go of this actor when it told it).
    pub fn forget(&mut self) {
        self.reading = None;
        self.held = false;
        self.generation += 1;
    }
}

/// What [`SettingsCache::read`] needs to know of when its reading began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadingTicket {
    generation: u64,
    held: bool,
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
                    "wuhu://workspace/config/tenant.json is not valid: unknown field `requestLogs`, expected one of `llmRequestLogs`, `llmRequestLogDays`, `defaultProvider`, `defaultModel` at line 1 column 14",
                ),
            ),
            (
                "config/tenant.json",
                r#"{"defaultProvider":"anthropic","defaultModel":"claude-haiku-4-5"}"#,
                Ok(()),
            ),
            (
                "config/tenant.json",
                r#"{"defaultProvider":"openai"}"#,
                Ok(()),
            ),
            (
                "config/tenant.json",
                r#"{"defaultProvider":"fake"}"#,
                Ok(()),
            ),
            (
                "config/tenant.json",
                r#"{"defaultProvider":"gpt"}"#,
                Err(
                    "wuhu://workspace/config/tenant.json is not valid: defaultProvider must be one of \"fake\", \"openai-compatible\", \"openai\", \"anthropic\", not \"gpt\"",
                ),
            ),
            (
                "config/tenant.json",
                r#"{"defaultModel":"gpt-5"}"#,
                Err(
                    "wuhu://workspace/config/tenant.json is not valid: defaultModel needs defaultProvider (the provider it is a model of)",
                ),
            ),
            (
                "config/tenant.json",
                r#"{"defaultProvider":"openai","defaultModel":" "}"#,
                Err(
                    "wuhu://workspace/config/tenant.json is not valid: defaultModel must be 1 to 200 characters, without spaces at the ends",
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
            ("config/policy.json", r#"{"rules":[]}"#, Ok(())),
            ("config/mcp.json", r#"{"servers":[]}"#, Ok(())),
            (
                "config/mcp.json",
                r#"{"servers":[{"name":"x","url":"gopher://x"}]}"#,
                Err(r#"config/mcp.json: server 1: url: scheme "gopher": http or https only"#),
            ),
            (
                "config/policy.json",
                r#"{"rules":[{"decision":"never"}]}"#,
                Err(
                    "config/policy.json: not a policy document: unknown variant `never`, expected one of `allow`, `ask`, `deny` at line 1 column 29",
                ),
            ),
            (
                "config/notes.md",
                "hello",
                Err(
                    "config/ holds only config/models.json, config/tenant.json, config/policy.json and config/mcp.json, not config/notes.md",
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
    fn the_holders_bound_is_the_default_unless_set_within_it() {
        for (var, want) in [
            (None, 1_000),
            (Some("3"), 3),
            (Some(" 1 "), 1),
            (Some("1000"), 1_000),
            (Some("0"), 1_000),
            (Some("1001"), 1_000),
            (Some("-2"), 1_000),
            (Some("many"), 1_000),
        ] {
            assert_eq!(max_settings_holders(var), want, "{var:?}");
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Event {
        /// A hold is asked: its generation is remembered under this slot.
        Hold(usize),
        /// The hold asked under the slot is answered.
        Held(usize),
        /// A reading begins: its ticket is remembered under this slot.
        Begin(usize),
        /// The reading begun under the slot finished (valid documents or not).
        Read(usize, bool),
        Forget,
    }

    #[test]
    fn the_held_generation_is_new_after_every_forget_and_none_while_not_held() {
        let mut cache: SettingsCache<()> = SettingsCache::default();
        assert_eq!(cache.held_generation(), None);
        let first = cache.generation();
        cache.held(first);
        assert_eq!(cache.held_generation(), Some(first));
        cache.forget();
        assert_eq!(cache.held_generation(), None);
        let second = cache.generation();
        cache.held(second);
        assert_eq!(cache.held_generation(), Some(second));
        assert_ne!(
            first, second,
            "what was asked before the forget no longer counts"
        );
        // A hold's answer that a forget overtook does not hold the actor.
        let third = cache.generation();
        cache.forget();
        cache.held(third);
        assert_eq!(cache.held_generation(), None);
    }

    #[test]
    fn a_reading_is_used_again_only_when_it_began_held_and_no_change_was_told_since() {
        use Event::*;
        let docs = SettingsDocs {
            models: Some("{\"models\":[]}".into()),
            tenant: None,
            policy: None,
        };
        // (name, events, kept afterwards, asks for a hold afterwards)
        let cases: &[(&str, &[Event], bool, bool)] = &[
            (
                "a new actor: its first reading asks no hold",
                &[],
                false,
                false,
            ),
            (
                "after its first reading it asks",
                &[Begin(0), Read(0, true)],
                false,
                true,
            ),
            (
                "held, then read",
                &[Hold(0), Held(0), Begin(0), Read(0, true)],
                true,
                false,
            ),
            (
                "an invalid reading is not kept",
                &[Hold(0), Held(0), Begin(0), Read(0, false)],
                false,
                false,
            ),
            (
                "a first step reads alongside its hold: that reading is not kept",
                &[Hold(0), Begin(0), Held(0), Read(0, true)],
                false,
                false,
            ),
            (
                "... the next step's is",
                &[
                    Hold(0),
                    Begin(0),
                    Held(0),
                    Read(0, true),
                    Begin(1),
                    Read(1, true),
                ],
                true,
                false,
            ),
            (
                "a refused hold: read before every step",
                &[Hold(0), Begin(0), Read(0, true)],
                false,
                true,
            ),
            (
                "told after the reading",
                &[Hold(0), Held(0), Begin(0), Read(0, true), Forget],
                false,
                true,
            ),
            (
                "told while reading: the reading began before the change was answered",
                &[Hold(0), Held(0), Begin(0), Forget, Read(0, true)],
                false,
                true,
            ),
            (
                "told before the hold's answer came: the index let go already",
                &[Hold(0), Forget, Held(0), Begin(0), Read(0, true)],
                false,
                true,
            ),
            (
                "held again after a change",
                &[
                    Hold(0),
                    Held(0),
                    Begin(0),
                    Read(0, true),
                    Forget,
                    Hold(1),
                    Held(1),
                    Begin(1),
                    Read(1, true),
                ],
                true,
                false,
            ),
            (
                "an old reading ends after a newer one",
                &[
                    Hold(0),
                    Held(0),
                    Begin(0),
                    Forget,
                    Hold(1),
                    Held(1),
                    Begin(1),
                    Read(1, true),
                    Read(0, true),
                ],
                true,
                false,
            ),
        ];
        for (name, events, kept, asks) in cases {
            let mut cache: SettingsCache<SettingsDocs> = SettingsCache::default();
            let mut holds = [0; 2];
            let mut readings = [cache.begin_reading(); 2];
            for event in *events {
                match *event {
                    Hold(slot) => holds[slot] = cache.generation(),
                    Held(slot) => cache.held(holds[slot]),
                    Begin(slot) => readings[slot] = cache.begin_reading(),
                    Read(slot, valid) => cache.read(readings[slot], valid.then(|| docs.clone())),
                    Forget => cache.forget(),
                }
            }
            assert_eq!(cache.kept().is_some(), *kept, "{name}: kept");
            assert_eq!(cache.needs_hold(), *asks, "{name}: asks for a hold");
        }
    }
}
