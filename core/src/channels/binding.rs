//! Channel bindings: what `POST|PATCH /v1/channels` accept, what is stored, what reads show.
//!
//! Credentials are validated here, sealed by the host ([`super::seal`]) and never part of a
//! read: [`ChannelView`] carries them masked ([`mask`]).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::admit::{self, Admit, GuestQuota};
use crate::wire::Lane;

/// Most bindings one tenant may have.
pub const MAX_BINDINGS_PER_TENANT: usize = 50;
/// Longest binding name, in characters.
pub const MAX_NAME_CHARS: usize = 100;
/// Longest credential field, in bytes.
pub const MAX_CREDENTIAL_BYTES: usize = 512;
/// Longest default system prompt, in bytes.
pub const MAX_SYSTEM_PROMPT_BYTES: usize = 32 * 1024;
/// Longest URL (`apiBaseUrl`, `replyUrl`), in bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// A chat platform.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    /// Slack Events API + Interactivity.
    Slack,
    /// A Telegram bot webhook.
    Telegram,
    /// A Discord application's Interactions endpoint.
    Discord,
    /// Any system that signs its POSTs with a shared secret (see `docs/channels.md`).
    Generic,
}

impl Platform {
    /// The wire name, also the hook path segment (`/hooks/<name>/:id`).
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Slack => "slack",
            Platform::Telegram => "telegram",
            Platform::Discord => "discord",
            Platform::Generic => "generic",
        }
    }

    /// Parses the wire name.
    pub fn parse(text: &str) -> Option<Platform> {
        match text {
            "slack" => Some(Platform::Slack),
            "telegram" => Some(Platform::Telegram),
            "discord" => Some(Platform::Discord),
            "generic" => Some(Platform::Generic),
            _ => None,
        }
    }

    /// The platform's Web API, used when a binding has no `apiBaseUrl`.
    pub fn default_api_base_url(self) -> &'static str {
        match self {
            Platform::Slack => "https://slack.com/api",
            Platform::Telegram => "https://api.telegram.org",
            Platform::Discord => "https://discord.com/api/v10",
            Platform::Generic => "",
        }
    }
}

/// Settings of the sessions a binding creates.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChannelDefaults {
    /// The provider of the binding's sessions; the server's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(test, schemars(schema_with = "crate::llm::optional_provider_schema"))]
    pub provider: Option<String>,
    /// Model name; the provider's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// System prompt; the built-in one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// A hint appended to the system prompt: which environment the agent should request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
}

/// How a binding behaves.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChannelOptions {
    /// The lane of a message that arrives while a turn runs: `followUp` (default: answered
    /// after the current turn) or `steer` (delivered at the next step boundary).
    #[serde(default = "default_lane")]
    pub busy_lane: Lane,
    /// Whether one progress message should be posted and edited while a turn runs.
    /// Stored and returned, not acted on yet (docs/api.md says so).
    #[serde(default)]
    pub progress: bool,
}

fn default_lane() -> Lane {
    Lane::FollowUp
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions {
            busy_lane: Lane::FollowUp,
            progress: false,
        }
    }
}

/// `POST /v1/channels`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateChannelRequest {
    /// The platform.
    pub platform: Platform,
    /// A name people recognise.
    pub name: String,
    /// Platform credentials; see [`Credentials::parse`].
    #[cfg_attr(test, schemars(with = "CredentialFields"))]
    pub credentials: Value,
    /// Another API host for the platform (tests point it at local fakes).
    #[serde(default)]
    pub api_base_url: Option<String>,
    /// Settings of new sessions.
    #[serde(default)]
    pub defaults: Option<ChannelDefaults>,
    /// Behaviour.
    #[serde(default)]
    pub options: Option<ChannelOptions>,
    /// Whom the binding admits besides mapped members (`mapped` when absent).
    #[serde(default)]
    pub admit: Option<Admit>,
    /// With `admit: allowlist`: the Telegram chat ids, Discord guild ids or Slack team ids
    /// whose unmapped users are guests.
    #[serde(default)]
    pub allowlist: Option<Vec<String>>,
    /// What a stranger who addresses the bot is told (once an hour at most).
    #[serde(default)]
    pub refusal: Option<String>,
    /// How much guests may do per hour.
    #[serde(default)]
    pub guest_quota: Option<GuestQuota>,
    /// Slack (required): the workspace the app is installed in (`team_id`, `T…`); deliveries
    /// for any other are refused.
    #[serde(default)]
    pub team_id: Option<String>,
    /// Slack (required): the app (`api_app_id`, `A…`); deliveries for any other are refused.
    #[serde(default)]
    pub api_app_id: Option<String>,
    /// Slack, optional: the Enterprise Grid organisation (`enterprise_id`, `E…`); when set,
    /// deliveries for any other are refused.
    #[serde(default)]
    pub enterprise_id: Option<String>,
}

/// `PATCH /v1/channels/:id`: every field optional; `credentials` replaces all of them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchChannelRequest {
    /// New name.
    #[serde(default)]
    pub name: Option<String>,
    /// New credentials (all fields of the platform).
    #[serde(default)]
    #[cfg_attr(test, schemars(with = "Option<CredentialFields>"))]
    pub credentials: Option<Value>,
    /// New API host.
    #[serde(default)]
    pub api_base_url: Option<String>,
    /// New defaults (replace the old ones).
    #[serde(default)]
    pub defaults: Option<ChannelDefaults>,
    /// New options (replace the old ones).
    #[serde(default)]
    pub options: Option<ChannelOptions>,
    /// New `admit`.
    #[serde(default)]
    pub admit: Option<Admit>,
    /// New allowlist (replaces the old one).
    #[serde(default)]
    pub allowlist: Option<Vec<String>>,
    /// New refusal.
    #[serde(default)]
    pub refusal: Option<String>,
    /// New guest quota (replaces the old one; absent fields take their defaults).
    #[serde(default)]
    pub guest_quota: Option<GuestQuota>,
    /// Slack: pins another workspace (a pin is never removed).
    #[serde(default)]
    pub team_id: Option<String>,
    /// Slack: pins another app.
    #[serde(default)]
    pub api_app_id: Option<String>,
    /// Slack: pins an Enterprise Grid organisation.
    #[serde(default)]
    pub enterprise_id: Option<String>,
}

/// A binding as stored, without its credentials.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChannelBinding {
    /// Opaque id (a UUID); part of the webhook URL.
    pub id: String,
    /// The tenant whose sessions it creates.
    pub tenant: String,
    /// The platform.
    pub platform: Platform,
    /// Name.
    pub name: String,
    /// The platform's API host.
    pub api_base_url: String,
    /// Settings of new sessions.
    pub defaults: ChannelDefaults,
    /// Behaviour.
    pub options: ChannelOptions,
    /// Whom it admits besides mapped members (`mapped` for bindings stored before it existed).
    #[serde(default)]
    pub admit: Admit,
    /// With `admit: allowlist`: the chats, guilds or teams whose unmapped users are guests.
    #[serde(default)]
    pub allowlist: Vec<String>,
    /// What a stranger who addresses the bot is told (once an hour at most).
    #[serde(default = "admit::default_refusal")]
    pub refusal: String,
    /// How much guests may do per hour.
    #[serde(default)]
    pub guest_quota: GuestQuota,
    /// Slack: the workspace it serves (`team_id`). A binding stored before pins existed pins
    /// the first verified delivery's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
    /// Slack: the app it is (`api_app_id`), pinned with `team_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_app_id: Option<String>,
    /// Slack: the Enterprise Grid organisation it serves, when pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enterprise_id: Option<String>,
    /// The admin who created it.
    pub created_by: String,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds.
    pub updated_at: i64,
}

/// A binding as reads show it: credentials masked, plus where to paste what.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChannelView {
    /// The binding.
    #[serde(flatten)]
    pub binding: ChannelBinding,
    /// Each credential field, masked ([`mask`]); public values (Discord application id and
    /// public key) in full.
    pub credentials: serde_json::Map<String, Value>,
    /// The URL the platform must call.
    pub webhook_url: String,
    /// What to paste where, in order.
    pub setup: Vec<String>,
    /// Discord only: the binding's Gateway connection (how mentions and plain messages
    /// arrive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<super::gateway::GatewayStatus>,
}

/// `GET /v1/channels`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
pub struct ListChannelsResponse {
    /// Oldest first.
    pub channels: Vec<ChannelView>,
}

/// A binding's credentials, one variant per platform.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq)]
#[serde(tag = "platform", rename_all = "lowercase")]
pub enum Credentials {
    /// Slack.
    #[serde(rename_all = "camelCase")]
    Slack {
        /// The app's signing secret (verifies `X-Slack-Signature`).
        signing_secret: String,
        /// The bot token (`xoxb-…`) for `chat.postMessage`.
        bot_token: String,
    },
    /// Telegram.
    #[serde(rename_all = "camelCase")]
    Telegram {
        /// The bot token from BotFather.
        bot_token: String,
        /// The `secret_token` given to `setWebhook`.
        secret_token: String,
    },
    /// Discord.
    #[serde(rename_all = "camelCase")]
    Discord {
        /// The application id.
        application_id: String,
        /// The application's Ed25519 public key, hex.
        public_key: String,
        /// The bot token.
        bot_token: String,
    },
    /// Generic webhooks.
    #[serde(rename_all = "camelCase")]
    Generic {
        /// The shared HMAC secret.
        secret: String,
        /// Where replies are POSTed (signed with the same secret).
        reply_url: String,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret, not even in a panic message.
        write!(f, "Credentials({:?}, ..)", self.platform())
    }
}

/// The schema of `credentials` in create and patch bodies: exactly the fields of the binding's
/// platform (what [`Credentials::parse`] accepts).
#[cfg(test)]
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum CredentialFields {
    Slack(SlackFields),
    Telegram(TelegramFields),
    Discord(DiscordFields),
    Generic(GenericFields),
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SlackFields {
    signing_secret: String,
    bot_token: String,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TelegramFields {
    bot_token: String,
    secret_token: String,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DiscordFields {
    application_id: String,
    public_key: String,
    bot_token: String,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GenericFields {
    secret: String,
    reply_url: String,
}

fn fields<T: serde::de::DeserializeOwned>(platform: Platform, value: &Value) -> Result<T, String> {
    serde_json::from_value(value.clone()).map_err(|e| {
        // serde's message names the field, never its value.
        format!("credentials for {}: {e}", platform.as_str())
    })
}

fn check_token(name: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || value.len() > MAX_CREDENTIAL_BYTES {
        return Err(format!(
            "credentials.{name} must be 1 to {MAX_CREDENTIAL_BYTES} bytes"
        ));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "credentials.{name} must be printable ASCII without spaces"
        ));
    }
    Ok(())
}

impl Credentials {
    /// Reads and checks the `credentials` object of `platform` (exactly its fields).
    ///
    /// # Errors
    /// A message for a 400 that names the field, never a value.
    pub fn parse(platform: Platform, value: &Value) -> Result<Credentials, String> {
        let credentials = match platform {
            Platform::Slack => {
                let f: SlackFields = fields(platform, value)?;
                Credentials::Slack {
                    signing_secret: f.signing_secret,
                    bot_token: f.bot_token,
                }
            }
            Platform::Telegram => {
                let f: TelegramFields = fields(platform, value)?;
                Credentials::Telegram {
                    bot_token: f.bot_token,
                    secret_token: f.secret_token,
                }
            }
            Platform::Discord => {
                let f: DiscordFields = fields(platform, value)?;
                Credentials::Discord {
                    application_id: f.application_id,
                    public_key: f.public_key,
                    bot_token: f.bot_token,
                }
            }
            Platform::Generic => {
                let f: GenericFields = fields(platform, value)?;
                Credentials::Generic {
                    secret: f.secret,
                    reply_url: f.reply_url,
                }
            }
        };
        credentials.check()?;
        Ok(credentials)
    }

    fn check(&self) -> Result<(), String> {
        match self {
            Credentials::Slack {
                signing_secret,
                bot_token,
            } => {
                check_token("signingSecret", signing_secret)?;
                check_token("botToken", bot_token)
            }
            Credentials::Telegram {
                bot_token,
                secret_token,
            } => {
                check_token("botToken", bot_token)?;
                // Telegram's own rule for `secret_token`: 1-256 of A-Z a-z 0-9 _ -.
                if secret_token.is_empty()
                    || secret_token.len() > 256
                    || !secret_token
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
                {
                    return Err(
                        "credentials.secretToken must be 1 to 256 of A-Z a-z 0-9 _ -".into(),
                    );
                }
                Ok(())
            }
            Credentials::Discord {
                application_id,
                public_key,
                bot_token,
            } => {
                check_token("applicationId", application_id)?;
                check_token("botToken", bot_token)?;
                if super::verify::discord_key(public_key).is_none() {
                    return Err(
                        "credentials.publicKey must be an Ed25519 public key as 64 hex characters"
                            .into(),
                    );
                }
                Ok(())
            }
            Credentials::Generic { secret, reply_url } => {
                check_token("secret", secret)?;
                if secret.len() < 16 {
                    return Err("credentials.secret must be at least 16 bytes".into());
                }
                check_url("credentials.replyUrl", reply_url).map(|_| ())
            }
        }
    }

    /// The platform these credentials are for.
    pub fn platform(&self) -> Platform {
        match self {
            Credentials::Slack { .. } => Platform::Slack,
            Credentials::Telegram { .. } => Platform::Telegram,
            Credentials::Discord { .. } => Platform::Discord,
            Credentials::Generic { .. } => Platform::Generic,
        }
    }

    /// The fields as reads show them: secrets masked, public values in full.
    pub fn masked(&self) -> serde_json::Map<String, Value> {
        let mut map = serde_json::Map::new();
        let mut put = |k: &str, v: String| {
            map.insert(k.to_string(), Value::String(v));
        };
        match self {
            Credentials::Slack {
                signing_secret,
                bot_token,
            } => {
                put("signingSecret", mask(signing_secret));
                put("botToken", mask(bot_token));
            }
            Credentials::Telegram {
                bot_token,
                secret_token,
            } => {
                put("botToken", mask(bot_token));
                put("secretToken", mask(secret_token));
            }
            Credentials::Discord {
                application_id,
                public_key,
                bot_token,
            } => {
                put("applicationId", application_id.clone());
                put("publicKey", public_key.clone());
                put("botToken", mask(bot_token));
            }
            Credentials::Generic { secret, reply_url } => {
                put("secret", mask(secret));
                put("replyUrl", mask_url(reply_url));
            }
        }
        map
    }
}

/// A secret as reads show it: `••••` and, for secrets of at least 16 characters, their last 4
/// (enough to tell two apart, far too little to guess the rest).
pub fn mask(secret: &str) -> String {
    let chars: Vec<char> = secret.chars().collect();
    if chars.len() >= 16 {
        let tail: String = chars[chars.len() - 4..].iter().collect();
        format!("••••{tail}")
    } else {
        "••••".to_string()
    }
}

/// A URL as reads show it: scheme and host only (a path or query may hold a token).
pub fn mask_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) => format!(
            "{}://{}/…",
            parsed.scheme(),
            parsed.host_str().unwrap_or_default()
        ),
        Err(_) => "••••".to_string(),
    }
}

/// Checks a URL the server will call with a binding's credentials: `https`, or `http` to a
/// loopback host only (local fakes, development); no userinfo, no fragment. Returns it without
/// a trailing slash.
///
/// # Errors
/// A message for a 400.
pub fn check_url(field: &str, text: &str) -> Result<String, String> {
    if text.len() > MAX_URL_BYTES {
        return Err(format!("{field} must be at most {MAX_URL_BYTES} bytes"));
    }
    let url = url::Url::parse(text).map_err(|_| format!("{field} must be an absolute URL"))?;
    let loopback = matches!(
        url.host_str(),
        Some("localhost" | "127.0.0.1" | "[::1]" | "::1")
    );
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        _ => {
            return Err(format!(
                "{field} must be https (http only to a loopback host)"
            ));
        }
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{field} must name a host"));
    }
    if !url.username().is_empty() || url.password().is_some() || url.fragment().is_some() {
        return Err(format!("{field} must not have userinfo or a fragment"));
    }
    Ok(text.trim_end_matches('/').to_string())
}

fn check_name(name: &str) -> Result<String, String> {
    let name = name.trim();
    if name.is_empty()
        || name.chars().count() > MAX_NAME_CHARS
        || name.chars().any(char::is_control)
    {
        return Err(format!(
            "name must be 1 to {MAX_NAME_CHARS} characters without control characters"
        ));
    }
    Ok(name.to_string())
}

impl ChannelDefaults {
    /// Checks the default provider against what this server allows (`fake` only with
    /// `WUHU_ENABLE_FAKE_PROVIDER=1`, `crate::llm::choice`): a binding cannot make every chat
    /// thread a session on a provider that would be refused through the API.
    ///
    /// # Errors
    /// The refusal, for a 400.
    pub fn check_provider_allowed(
        &self,
        fake_enabled: bool,
    ) -> Result<(), crate::llm::choice::ProviderRefused> {
        match &self.provider {
            Some(provider) => crate::llm::choice::check_provider(provider, fake_enabled),
            None => Ok(()),
        }
    }
}

fn check_defaults(defaults: &ChannelDefaults) -> Result<(), String> {
    if let Some(provider) = &defaults.provider
        && !crate::llm::PROVIDERS.contains(&provider.as_str())
    {
        return Err(format!(
            "defaults.provider must be one of {}",
            crate::llm::PROVIDERS.join(", ")
        ));
    }
    if defaults
        .model
        .as_deref()
        .is_some_and(|m| m.trim().is_empty() || m.len() > 200)
    {
        return Err("defaults.model must be 1 to 200 characters".into());
    }
    if defaults
        .system_prompt
        .as_deref()
        .is_some_and(|p| p.len() > MAX_SYSTEM_PROMPT_BYTES)
    {
        return Err(format!(
            "defaults.systemPrompt must be at most {MAX_SYSTEM_PROMPT_BYTES} bytes"
        ));
    }
    if defaults
        .environment
        .as_deref()
        .is_some_and(|e| e.trim().is_empty() || e.len() > 200)
    {
        return Err("defaults.environment must be 1 to 200 characters".into());
    }
    Ok(())
}

fn check_options(options: &ChannelOptions) -> Result<(), String> {
    if options.busy_lane == Lane::System {
        return Err("options.busyLane must be steer or followUp".into());
    }
    Ok(())
}

/// Checks what a binding admits, as a whole: an allowlist shaped as the platform's ids and not
/// empty when `admit` is `allowlist`, a quota in bounds, a Slack pin shaped as Slack's ids (and
/// no pin on another platform).
fn check_admission(binding: &ChannelBinding) -> Result<(), String> {
    admit::check_allowlist(binding.platform, &binding.allowlist)?;
    if binding.admit == Admit::Allowlist && binding.allowlist.is_empty() {
        return Err(match binding.platform {
            Platform::Generic => {
                "a generic binding has no allowlist: use admit mapped or anyone".into()
            }
            _ => "admit allowlist needs the ids to admit in allowlist".into(),
        });
    }
    binding.guest_quota.check()?;
    if binding.team_id.is_some() != binding.api_app_id.is_some() {
        return Err("teamId and apiAppId are pinned together: give both".into());
    }
    let pin = [
        ("teamId", &binding.team_id, 'T'),
        ("apiAppId", &binding.api_app_id, 'A'),
        ("enterpriseId", &binding.enterprise_id, 'E'),
    ];
    for (name, value, prefix) in pin {
        let Some(value) = value else { continue };
        if binding.platform != Platform::Slack {
            return Err(format!("{name} is for Slack bindings only"));
        }
        if !admit::slack_id(value, &[prefix]) {
            return Err(format!(
                "{name} must be a Slack id: {prefix} then upper-case letters and digits"
            ));
        }
    }
    Ok(())
}

fn api_base(platform: Platform, given: Option<&str>) -> Result<String, String> {
    match given {
        Some(url) => check_url("apiBaseUrl", url),
        None => Ok(platform.default_api_base_url().to_string()),
    }
}

impl CreateChannelRequest {
    /// Checks the request and builds the stored binding and its credentials.
    ///
    /// # Errors
    /// A message for a 400.
    pub fn into_binding(
        self,
        id: String,
        tenant: String,
        created_by: String,
        now_secs: i64,
    ) -> Result<(ChannelBinding, Credentials), String> {
        let credentials = Credentials::parse(self.platform, &self.credentials)?;
        let defaults = self.defaults.unwrap_or_default();
        check_defaults(&defaults)?;
        let options = self.options.unwrap_or_default();
        check_options(&options)?;
        if self.platform == Platform::Slack && (self.team_id.is_none() || self.api_app_id.is_none())
        {
            return Err("a Slack binding needs teamId (the workspace, T…) and apiAppId (Basic Information → App ID, A…): deliveries for any other workspace or app are refused".into());
        }
        let refusal = match self.refusal.as_deref() {
            Some(text) => admit::check_refusal(text)?,
            None => admit::default_refusal(),
        };
        let binding = ChannelBinding {
            id,
            tenant,
            platform: self.platform,
            name: check_name(&self.name)?,
            api_base_url: api_base(self.platform, self.api_base_url.as_deref())?,
            defaults,
            options,
            admit: self.admit.unwrap_or_default(),
            allowlist: self.allowlist.unwrap_or_default(),
            refusal,
            guest_quota: self.guest_quota.unwrap_or_default(),
            team_id: self.team_id,
            api_app_id: self.api_app_id,
            enterprise_id: self.enterprise_id,
            created_by,
            created_at: now_secs,
            updated_at: now_secs,
        };
        check_admission(&binding)?;
        Ok((binding, credentials))
    }
}

impl PatchChannelRequest {
    /// Applies the patch to `binding`; returns new credentials when the patch has them.
    ///
    /// # Errors
    /// A message for a 400 (nothing is changed then).
    pub fn apply(
        self,
        binding: &ChannelBinding,
        now_secs: i64,
    ) -> Result<(ChannelBinding, Option<Credentials>), String> {
        if self == PatchChannelRequest::default() {
            return Err(
                "patch needs at least one of name, credentials, apiBaseUrl, defaults, options, admit, allowlist, refusal, guestQuota, teamId, apiAppId, enterpriseId"
                    .into(),
            );
        }
        let mut next = binding.clone();
        if let Some(name) = &self.name {
            next.name = check_name(name)?;
        }
        if let Some(url) = &self.api_base_url {
            next.api_base_url = api_base(binding.platform, Some(url))?;
        }
        if let Some(defaults) = self.defaults {
            check_defaults(&defaults)?;
            next.defaults = defaults;
        }
        if let Some(options) = self.options {
            check_options(&options)?;
            next.options = options;
        }
        if let Some(how) = self.admit {
            next.admit = how;
        }
        if let Some(allowlist) = self.allowlist {
            next.allowlist = allowlist;
        }
        if let Some(text) = &self.refusal {
            next.refusal = admit::check_refusal(text)?;
        }
        if let Some(quota) = self.guest_quota {
            next.guest_quota = quota;
        }
        for (given, pinned) in [
            (self.team_id, &mut next.team_id),
            (self.api_app_id, &mut next.api_app_id),
            (self.enterprise_id, &mut next.enterprise_id),
        ] {
            if given.is_some() {
                *pinned = given;
            }
        }
        check_admission(&next)?;
        let credentials = match &self.credentials {
            Some(value) => Some(Credentials::parse(binding.platform, value)?),
            None => None,
        };
        next.updated_at = now_secs;
        Ok((next, credentials))
    }
}

/// The webhook path of a binding.
pub fn webhook_path(platform: Platform, id: &str) -> String {
    format!("/hooks/{}/{id}", platform.as_str())
}

/// What to paste where for a binding whose webhook URL is `url`.
pub fn setup_steps(platform: Platform, url: &str) -> Vec<String> {
    match platform {
        Platform::Slack => vec![
            format!("Event Subscriptions → Request URL: {url} (subscribe to the bot events app_mention, message.channels, message.groups, message.im)"),
            format!("Interactivity & Shortcuts → Request URL: {url}"),
            format!("Slash Commands → /wuhu → Request URL: {url}"),
            "OAuth & Permissions → bot scopes: app_mentions:read, chat:write, channels:history, groups:history, im:history, commands".into(),
        ],
        Platform::Telegram => vec![format!(
            "POST https://api.telegram.org/bot<botToken>/setWebhook with {{\"url\":\"{url}\",\"secret_token\":\"<secretToken>\",\"allowed_updates\":[\"message\",\"callback_query\"]}}"
        )],
        Platform::Discord => vec![
            format!("Developer Portal → your application → General Information → Interactions Endpoint URL: {url}"),
            "Register the /wuhu application command (options: text) for your application".into(),
            "Developer Portal → Bot → Privileged Gateway Intents: enable MESSAGE CONTENT (mentions, direct messages and plain messages arrive over the Gateway connection this binding keeps open)".into(),
        ],
        Platform::Generic => vec![format!(
            "POST {url} with body {{\"thread\",\"user\",\"text\",\"id\"}} (id: your message id, optional), headers X-Wuhu-Timestamp: <unix seconds> and X-Wuhu-Signature: sha256=<hex HMAC-SHA256(secret, \"<timestamp>.<body>\")>; replies arrive at replyUrl signed the same way"
        )],
    }
}

/// The view of `binding` with its masked credentials ([`Credentials::masked`]), reachable at
/// `origin` (`https://host`).
pub fn view(
    binding: &ChannelBinding,
    masked: &serde_json::Map<String, Value>,
    origin: &str,
) -> ChannelView {
    let url = format!(
        "{}{}",
        origin.trim_end_matches('/'),
        webhook_path(binding.platform, &binding.id)
    );
    ChannelView {
        binding: binding.clone(),
        credentials: masked.clone(),
        setup: setup_steps(binding.platform, &url),
        webhook_url: url,
        gateway: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn create(body: Value) -> Result<(ChannelBinding, Credentials), String> {
        let request: CreateChannelRequest =
            serde_json::from_value(body).map_err(|e| e.to_string())?;
        request.into_binding("id1".into(), "acme".into(), "root".into(), 100)
    }

    const DISCORD_KEY: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

    #[test]
    fn create_bodies_of_the_issue() {
        let cases = [
            json!({"platform":"slack","name":"S","credentials":{"signingSecret":"abc","botToken":"xoxb-1"},"teamId":"T1","apiAppId":"A1"}),
            json!({"platform":"telegram","name":"T","credentials":{"botToken":"1:AA","secretToken":"s_-1"}}),
            json!({"platform":"discord","name":"D","credentials":{"applicationId":"1","publicKey":DISCORD_KEY,"botToken":"t"}}),
            json!({"platform":"generic","name":"G","credentials":{"secret":"0123456789abcdef","replyUrl":"https://example.com/r"}}),
        ];
        for body in cases {
            let (binding, credentials) = create(body.clone()).expect("valid");
            assert_eq!(credentials.platform(), binding.platform, "{body}");
            assert_eq!(
                binding.api_base_url,
                binding.platform.default_api_base_url()
            );
        }
    }

    #[test]
    fn bad_bodies_name_the_problem_never_the_secret() {
        let cases = [
            (
                json!({"platform":"slack","name":"S","credentials":{"signingSecret":"SECRETVALUE"}}),
                "botToken",
            ),
            (
                json!({"platform":"slack","name":"S","credentials":{"signingSecret":"SECRETVALUE","botToken":"x","extra":1}}),
                "extra",
            ),
            (json!({"platform":"irc","name":"S","credentials":{}}), "irc"),
            (
                json!({"platform":"slack","name":"","teamId":"T1","apiAppId":"A1","credentials":{"signingSecret":"SECRETVALUE","botToken":"x"}}),
                "name",
            ),
            (
                json!({"platform":"slack","name":"S","credentials":{"signingSecret":"SECRET VALUE","botToken":"x"}}),
                "signingSecret",
            ),
            (
                json!({"platform":"slack","name":"S","teamId":"T1","apiAppId":"A1","credentials":{"signingSecret":"SECRETVALUE","botToken":"x"},"apiBaseUrl":"http://example.com"}),
                "apiBaseUrl",
            ),
            (
                json!({"platform":"slack","name":"S","teamId":"T1","apiAppId":"A1","credentials":{"signingSecret":"SECRETVALUE","botToken":"x"},"apiBaseUrl":"https://u:p@example.com"}),
                "userinfo",
            ),
            (
                json!({"platform":"telegram","name":"T","credentials":{"botToken":"1:AA","secretToken":"SECRET VALUE"}}),
                "secretToken",
            ),
            (
                json!({"platform":"discord","name":"D","credentials":{"applicationId":"1","publicKey":"SECRETVALUE","botToken":"t"}}),
                "publicKey",
            ),
            (
                json!({"platform":"generic","name":"G","credentials":{"secret":"SECRETVALUE","replyUrl":"https://e.com"}}),
                "16 bytes",
            ),
            (
                json!({"platform":"generic","name":"G","credentials":{"secret":"SECRETVALUE-long-enough","replyUrl":"ftp://e.com"}}),
                "replyUrl",
            ),
            (
                json!({"platform":"slack","name":"S","teamId":"T1","apiAppId":"A1","credentials":{"signingSecret":"SECRETVALUE","botToken":"x"},"options":{"busyLane":"system"}}),
                "busyLane",
            ),
            (
                json!({"platform":"slack","name":"S","teamId":"T1","apiAppId":"A1","credentials":{"signingSecret":"SECRETVALUE","botToken":"x"},"defaults":{"provider":"x"}}),
                "provider",
            ),
        ];
        for (body, want) in cases {
            let err = create(body.clone()).expect_err("invalid");
            assert!(err.contains(want), "{body}: {err}");
            assert!(!err.contains("SECRETVALUE"), "{body}: {err}");
        }
    }

    /// `admit`, its allowlist, the refusal, the quota and Slack's pin are checked at create
    /// and patch alike; a Slack binding must name its workspace and app; a binding stored
    /// before them reads as `mapped` with the default refusal and quota, unpinned.
    #[test]
    fn admission_is_checked_at_create_and_patch() {
        let slack = |extra: Value| {
            let mut body = json!({"platform":"slack","name":"S","credentials":{"signingSecret":"abc","botToken":"x"}});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            create(body)
        };
        let telegram = |extra: Value| {
            let mut body = json!({"platform":"telegram","name":"T","credentials":{"botToken":"1:AA","secretToken":"s"}});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            create(body)
        };
        let pinned = json!({"teamId":"T1","apiAppId":"A1"});
        let with = |base: &Value, extra: Value| {
            let mut body = base.clone();
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            body
        };
        // (result, error fragment or None)
        let cases = [
            (slack(json!({})), Some("needs teamId")),
            (slack(json!({"teamId":"T1"})), Some("needs teamId")),
            (slack(pinned.clone()), None),
            (slack(with(&pinned, json!({"enterpriseId":"E1"}))), None),
            (
                slack(json!({"teamId":"C1","apiAppId":"A1"})),
                Some("teamId must be a Slack id"),
            ),
            (
                slack(json!({"teamId":"T1","apiAppId":"T1"})),
                Some("apiAppId must be a Slack id"),
            ),
            (
                slack(with(&pinned, json!({"enterpriseId":"e1"}))),
                Some("enterpriseId"),
            ),
            (
                slack(with(
                    &pinned,
                    json!({"admit":"allowlist","allowlist":["T1","E2"]}),
                )),
                None,
            ),
            (
                slack(with(&pinned, json!({"admit":"allowlist"}))),
                Some("needs the ids"),
            ),
            (
                slack(with(
                    &pinned,
                    json!({"admit":"allowlist","allowlist":["-100"]}),
                )),
                Some("Slack team id"),
            ),
            (
                slack(with(&pinned, json!({"admit":"everyone"}))),
                Some("unknown variant"),
            ),
            (telegram(json!({"admit":"anyone"})), None),
            (
                telegram(json!({"admit":"allowlist","allowlist":["-1001234"]})),
                None,
            ),
            (
                telegram(json!({"teamId":"T1","apiAppId":"A1"})),
                Some("for Slack bindings only"),
            ),
            (telegram(json!({"refusal":""})), Some("refusal must be")),
            (
                telegram(json!({"guestQuota":{"messagesPerHour":10001}})),
                Some("messagesPerHour"),
            ),
            (telegram(json!({"guestQuota":{"sessionsPerHour":0}})), None),
        ];
        for (i, (result, want)) in cases.into_iter().enumerate() {
            match want {
                None => assert!(result.is_ok(), "case {i}: {result:?}"),
                Some(text) => {
                    let e = result.expect_err(&format!("case {i}"));
                    assert!(e.contains(text), "case {i}: {e}");
                }
            }
        }
        let (binding, _) =
            telegram(json!({"refusal":" Go away. ","guestQuota":{"sessionsPerHour":1}})).unwrap();
        assert_eq!(binding.admit, Admit::Mapped);
        assert_eq!(binding.refusal, "Go away.");
        assert_eq!(binding.guest_quota.sessions_per_hour, 1);
        assert_eq!(binding.guest_quota.messages_per_hour, 20);
        // Patches: each field alone, checked as a whole.
        let patch = |v: Value| serde_json::from_value::<PatchChannelRequest>(v).unwrap();
        let (next, _) = patch(json!({"admit":"anyone"})).apply(&binding, 2).unwrap();
        assert_eq!(
            (next.admit, next.refusal.as_str()),
            (Admit::Anyone, "Go away.")
        );
        assert!(
            patch(json!({"admit":"allowlist"}))
                .apply(&binding, 2)
                .unwrap_err()
                .contains("needs the ids")
        );
        let (next, _) = patch(json!({"admit":"allowlist","allowlist":["42"]}))
            .apply(&binding, 2)
            .unwrap();
        assert_eq!(next.allowlist, vec!["42".to_string()]);
        assert!(patch(json!({"allowlist":[]})).apply(&next, 2).is_err());
        assert!(
            patch(json!({"teamId":"T1","apiAppId":"A1"}))
                .apply(&binding, 2)
                .is_err()
        );
        // A binding stored before admission existed: mapped, the default refusal and quota,
        // and (Slack) no pin until its first delivery.
        let mut old = serde_json::to_value(&binding).unwrap();
        for field in ["admit", "allowlist", "refusal", "guestQuota"] {
            old.as_object_mut().unwrap().remove(field);
        }
        let old: ChannelBinding = serde_json::from_value(old).unwrap();
        assert_eq!(old.admit, Admit::Mapped);
        assert_eq!(old.refusal, admit::DEFAULT_REFUSAL);
        assert_eq!(old.guest_quota, GuestQuota::default());
        let (slack_binding, _) = slack(pinned.clone()).unwrap();
        let mut unpinned = slack_binding.clone();
        unpinned.team_id = None;
        unpinned.api_app_id = None;
        // Patching an unpinned Slack binding's other fields works; a half pin does not.
        assert!(patch(json!({"name":"n"})).apply(&unpinned, 2).is_ok());
        assert!(
            patch(json!({"teamId":"T9"}))
                .apply(&unpinned, 2)
                .unwrap_err()
                .contains("together")
        );
        let (repinned, _) = patch(json!({"teamId":"T9","apiAppId":"A9"}))
            .apply(&slack_binding, 2)
            .unwrap();
        assert_eq!(repinned.team_id.as_deref(), Some("T9"));
        let view = view(&repinned, &serde_json::Map::new(), "https://w");
        let shown = serde_json::to_value(&view).unwrap();
        assert_eq!(shown["teamId"], "T9");
        assert_eq!(shown["admit"], "mapped");
        assert_eq!(shown["guestQuota"]["allGuestsMessagesPerHour"], 200);
    }

    #[test]
    fn loopback_http_is_allowed_for_local_fakes() {
        for (url, ok) in [
            ("http://127.0.0.1:9999/api", true),
            ("http://localhost:1/", true),
            ("https://slack.example/api/", true),
            ("http://10.0.0.1/api", false),
            ("http://127.0.0.1.evil.com/api", false),
            ("file:///etc/passwd", false),
        ] {
            assert_eq!(check_url("u", url).is_ok(), ok, "{url}");
        }
        assert_eq!(
            check_url("u", "https://slack.example/api/").unwrap(),
            "https://slack.example/api"
        );
    }

    #[test]
    fn reads_mask_every_secret() {
        let (binding, credentials) = create(json!({"platform":"slack","name":"S","teamId":"T1","apiAppId":"A1","credentials":{"signingSecret":"8f742231b10e8888abcd","botToken":"xoxb-short"}})).unwrap();
        let view = view(&binding, &credentials.masked(), "https://w.example/");
        let text = serde_json::to_string(&view).unwrap();
        assert!(!text.contains("8f742231b10e8888abcd"), "{text}");
        assert!(!text.contains("xoxb-short"), "{text}");
        assert_eq!(view.credentials["signingSecret"], "••••abcd");
        assert_eq!(view.credentials["botToken"], "••••");
        assert_eq!(view.webhook_url, "https://w.example/hooks/slack/id1");
        assert!(view.setup.iter().any(|s| s.contains("Interactivity")));
        assert_eq!(format!("{credentials:?}"), "Credentials(Slack, ..)");
        assert_eq!(
            mask_url("https://hooks.example/x/SECRET?t=1"),
            "https://hooks.example/…"
        );
    }

    #[test]
    fn patch_checks_like_create() {
        let (binding, _) = create(json!({"platform":"slack","name":"S","teamId":"T1","apiAppId":"A1","credentials":{"signingSecret":"abc","botToken":"x"}})).unwrap();
        let patch = |v: Value| serde_json::from_value::<PatchChannelRequest>(v).unwrap();
        assert!(patch(json!({})).apply(&binding, 200).is_err());
        let (next, creds) = patch(json!({"name":" New "})).apply(&binding, 200).unwrap();
        assert_eq!(
            (next.name.as_str(), next.updated_at, creds),
            ("New", 200, None)
        );
        assert!(
            patch(json!({"credentials":{"botToken":"x"}}))
                .apply(&binding, 200)
                .is_err()
        );
        let (_, creds) = patch(json!({"credentials":{"signingSecret":"n","botToken":"m"}}))
            .apply(&binding, 200)
            .unwrap();
        assert_eq!(creds.unwrap().platform(), Platform::Slack);
        assert!(
            patch(json!({"apiBaseUrl":"http://evil.example"}))
                .apply(&binding, 200)
                .is_err()
        );
    }
}
