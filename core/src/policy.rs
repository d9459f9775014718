//! The policy engine (issue 32, decision 0038): what an agent may do, asked or refused before it
//! happens, in rules a tenant's admins and each user write.
//!
//! **Documents.** `config/policy.json` (the tenant's, [`TENANT_POLICY_PATH`], admins) and
//! `users/<sub>/policy.json` (a user's, for work on **their own runners**, [`user_policy_path`]):
//! `{"rules": [{"id"?, "match": {…}, "decision": "allow" | "ask" | "deny", "reason"?}]}`.
//! A rule's `match` holds any of `tool`, `environment`, `runner`, `command`, `path`, `host`, `mcp`
//! (globs: `*` any run of characters, `/` and spaces included; `?` one character; or, written
//! `/…/`, a regular expression in `regex-lite`'s syntax, searched unanchored unless it anchors
//! itself) and `costUsdOver` (a number); a rule matches a call when every field it names
//! matches. A call
//! without the fact a field asks about (`command` of a `read`) does not match it.
//!
//! **Which rule decides** ([`evaluate`]), for one call:
//! 1. the tenant's first matching rule, when it is `deny`: a user's rule cannot undo it;
//! 2. else the first matching rule of the runner owner's own policy (calls on a runner only);
//! 3. else the tenant's first matching rule;
//! 4. else no rule: the call runs, subject to the approvals that hold without any policy (a
//!    person's machine on someone else's prompt, a definition's `"approval": "ask"`).
//!
//! `ask` waits for a person like every approval (`crate::approvals`): a tenant rule's for the
//! session's owner, a user rule's for that user. `deny` is a tool error naming the rule. Each
//! decision a rule makes is a `wuhu_policy_decision_v1` entry in the transcript.
//!
//! **Commands** (`bash`) are matched per simple command ([`shell`]): a deny or ask rule when any
//! of them matches, an allow rule only when all do. `path` is a file tool's `path` (and the files
//! a `bash` command redirects output to), normalised; `host` is a `js` `fetch`'s host (or an MCP
//! server's); `mcp` is an MCP tool as `<server>/<tool>` (`mcp_call`, tool `mcp_call`); the cost
//! is the estimate a call carries (an environment's `costPerHourUsd` for an hour).
//!
//! Pure: the host reads the documents, supplies the call's facts and performs the decision.

pub mod shell;

use serde::{Deserialize, Serialize};
use wildmatch::WildMatch;

/// The tenant's policy (admins write it; see `crate::authority::is_tenant_config`).
pub const TENANT_POLICY_PATH: &str = "config/policy.json";
/// The tool name a `js` script's `fetch` is matched as.
pub const JS_FETCH: &str = "js_fetch";
/// Most rules in one policy document.
pub const MAX_RULES: usize = 200;
/// Longest pattern, in characters.
pub const MAX_PATTERN_CHARS: usize = 512;
/// Longest `reason`, in characters.
pub const MAX_REASON_CHARS: usize = 500;
/// Longest rule `id`, in characters.
pub const MAX_ID_CHARS: usize = 64;

/// Where `sub`'s own policy lives in the workspace.
pub fn user_policy_path(sub: &str) -> String {
    format!("users/{sub}/policy.json")
}

/// Whether `path` (normalised) is a policy document: the tenant's, or a user's. A session's
/// tools never write one (an agent must not relax the rules it runs under,
/// `crate::authority::WorkspaceWriter`), and a change is told to running sessions like a
/// change of the tenant's settings.
pub fn is_policy_document(path: &str) -> bool {
    path == TENANT_POLICY_PATH || policy_user(path).is_some()
}

/// The user whose policy `path` is (`users/<sub>/policy.json`).
pub fn policy_user(path: &str) -> Option<&str> {
    let sub = path.strip_prefix("users/")?.strip_suffix("/policy.json")?;
    (!sub.is_empty() && !sub.contains('/')).then_some(sub)
}

/// What a rule decides.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run it without asking (the approvals that hold without policy still hold).
    Allow,
    /// Wait for a person.
    Ask,
    /// Refuse it: a tool error naming the rule.
    Deny,
}

impl Decision {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Ask => "ask",
            Decision::Deny => "deny",
        }
    }
}

/// A policy document as written.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyDocument {
    /// The rules, in order: the first that matches decides.
    pub rules: Vec<RuleDocument>,
}

/// One rule as written.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleDocument {
    /// A name for the rule (letters, digits, `-`, `_`, `.`), shown with its decisions; its
    /// position when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// What calls it applies to (`{}`: every call).
    #[serde(rename = "match", default)]
    pub matches: MatchDocument,
    /// What it decides.
    pub decision: Decision,
    /// Why: shown to the person asked and in the agent's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The facts a rule matches, as written (each optional).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MatchDocument {
    /// The tool's name (`bash`, `write`, `spawn_session`, `js_fetch` for a `js` script's
    /// `fetch`, `request_environment`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The environment's name in the session, or the definition a `request_environment` asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
    /// The runner's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
    /// A `bash` command, matched per simple command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// A file path (a file tool's `path`, a file a command writes to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The host a `js` `fetch` (or an `mcp_call`) goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// An MCP tool, as `<server>/<tool>` (`mcp_call`, js `wuhu.mcp.call`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<String>,
    /// Matches calls whose cost estimate is above this many US dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd_over: Option<f64>,
}

/// Whose policy a rule is in.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(tag = "source", content = "user", rename_all = "snake_case")]
pub enum Source {
    /// `config/policy.json`.
    Tenant,
    /// `users/<sub>/policy.json`.
    User(String),
}

/// A compiled pattern of a rule's `match`.
#[derive(Clone, Debug)]
enum Pattern {
    /// `*` and `?`.
    Glob(WildMatch),
    /// `/…/`.
    Regex(regex_lite::Regex),
}

impl Pattern {
    /// `/…/` is a regular expression; anything else a glob.
    fn compile(text: &str) -> Result<Pattern, String> {
        match text
            .strip_prefix('/')
            .and_then(|rest| rest.strip_suffix('/'))
            .filter(|inner| !inner.is_empty())
        {
            Some(inner) => regex_lite::RegexBuilder::new(inner)
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map(Pattern::Regex)
                .map_err(|e| format!("not a regular expression: {e}")),
            None => Ok(Pattern::Glob(WildMatch::new(text))),
        }
    }

    fn matches(&self, text: &str) -> bool {
        match self {
            Pattern::Glob(glob) => glob.matches(text),
            Pattern::Regex(regex) => regex.is_match(text),
        }
    }
}

/// Most bytes one compiled regular expression may take (`regex-lite`'s size limit).
const REGEX_SIZE_LIMIT: usize = 256 * 1024;

/// A compiled rule.
#[derive(Clone, Debug)]
struct Rule {
    id: Option<String>,
    decision: Decision,
    reason: Option<String>,
    tool: Option<Pattern>,
    environment: Option<Pattern>,
    runner: Option<Pattern>,
    command: Option<Pattern>,
    path: Option<Pattern>,
    host: Option<Pattern>,
    mcp: Option<Pattern>,
    cost_usd_over: Option<f64>,
}

/// A checked policy document, ready to evaluate.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    rules: Vec<Rule>,
}

/// Why a policy document was refused (the writer's 400, or the error a reader shows).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct PolicyError {
    /// The document.
    pub path: String,
    /// What is wrong, naming the rule.
    pub message: String,
}

impl Policy {
    /// Parses and checks the document at `path` (`None`: no document, no rules).
    ///
    /// # Errors
    /// A [`PolicyError`] naming the first rule and field that is wrong.
    pub fn parse(path: &str, text: Option<&str>) -> Result<Policy, PolicyError> {
        let Some(text) = text else {
            return Ok(Policy::default());
        };
        let fail = |message: String| PolicyError {
            path: path.to_string(),
            message,
        };
        let document: PolicyDocument =
            serde_json::from_str(text).map_err(|e| fail(format!("not a policy document: {e}")))?;
        Policy::compile(&document).map_err(fail)
    }

    fn compile(document: &PolicyDocument) -> Result<Policy, String> {
        if document.rules.len() > MAX_RULES {
            return Err(format!(
                "{} rules; a policy holds at most {MAX_RULES}",
                document.rules.len()
            ));
        }
        let mut ids: Vec<&str> = Vec::new();
        let mut rules = Vec::with_capacity(document.rules.len());
        for (i, rule) in document.rules.iter().enumerate() {
            let at = |message: String| format!("rule {}: {message}", i + 1);
            if let Some(id) = &rule.id {
                let fine = !id.is_empty()
                    && id.chars().count() <= MAX_ID_CHARS
                    && id
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                if !fine {
                    return Err(at(format!(
                        "id {id:?} must be 1 to {MAX_ID_CHARS} letters, digits, '-', '_' or '.'"
                    )));
                }
                if ids.contains(&id.as_str()) {
                    return Err(at(format!("id {id:?} is used by an earlier rule")));
                }
                ids.push(id);
            }
            if let Some(reason) = &rule.reason
                && reason.chars().count() > MAX_REASON_CHARS
            {
                return Err(at(format!(
                    "reason is longer than {MAX_REASON_CHARS} characters"
                )));
            }
            let m = &rule.matches;
            let pattern = |field: &str, p: &Option<String>| -> Result<Option<Pattern>, String> {
                match p {
                    None => Ok(None),
                    Some(p) if p.is_empty() || p.chars().count() > MAX_PATTERN_CHARS => Err(at(
                        format!("match.{field} must be 1 to {MAX_PATTERN_CHARS} characters"),
                    )),
                    Some(p) => Pattern::compile(p)
                        .map(Some)
                        .map_err(|e| at(format!("match.{field}: {e}"))),
                }
            };
            if let Some(cost) = m.cost_usd_over
                && !(cost.is_finite() && cost >= 0.0)
            {
                return Err(at(
                    "match.costUsdOver must be a number of dollars, 0 or more".into(),
                ));
            }
            rules.push(Rule {
                id: rule.id.clone(),
                decision: rule.decision,
                reason: rule.reason.clone(),
                tool: pattern("tool", &m.tool)?,
                environment: pattern("environment", &m.environment)?,
                runner: pattern("runner", &m.runner)?,
                command: pattern("command", &m.command)?,
                path: pattern("path", &m.path)?,
                host: pattern("host", &m.host)?,
                mcp: pattern("mcp", &m.mcp)?,
                cost_usd_over: m.cost_usd_over,
            });
        }
        Ok(Policy { rules })
    }

    /// Whether it has no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// What the host knows of a call when it is about to run.
#[derive(Clone, Debug, Default)]
pub struct Call<'a> {
    /// The tool (`js_fetch` for a script's `fetch`).
    pub tool: &'a str,
    /// The environment's name (or the definition `request_environment` asks for).
    pub environment: Option<&'a str>,
    /// The runner it runs on.
    pub runner: Option<&'a str>,
    /// That runner's owner: whose own policy applies as well.
    pub runner_owner: Option<&'a str>,
    /// A `bash` command.
    pub command: Option<&'a str>,
    /// The file paths it names (a file tool's `path`).
    pub paths: Vec<String>,
    /// The host of a fetch (or of an MCP server).
    pub host: Option<&'a str>,
    /// The MCP tool called, as `<server>/<tool>`.
    pub mcp: Option<&'a str>,
    /// Its cost estimate in US dollars.
    pub cost_usd: Option<f64>,
}

/// The rule that decided.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RuleRef {
    /// Whose policy.
    #[serde(flatten)]
    pub source: Source,
    /// Its position, from 1.
    pub index: usize,
    /// Its `id`, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl RuleRef {
    /// `tenant rule "no-push"`, `alice's rule 2`.
    pub fn describe(&self) -> String {
        let whose = match &self.source {
            Source::Tenant => "tenant".to_string(),
            Source::User(sub) => format!("{sub}'s"),
        };
        match &self.id {
            Some(id) => format!("{whose} rule {id:?}"),
            None => format!("{whose} rule {}", self.index),
        }
    }
}

/// A rule's decision on a call.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// What it decided.
    pub decision: Decision,
    /// The rule.
    pub rule: RuleRef,
    /// The rule's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What it matched: the simple command, path or host (the tool's name when it named none
    /// of those).
    pub subject: String,
}

impl Verdict {
    /// The tool error of a `deny`: which rule, why, what it matched.
    pub fn deny_text(&self) -> String {
        let why = self
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        format!(
            "Refused by policy ({}{why}). It matched {:?}; the call did not run. Do something else, or ask a person to change the policy.",
            self.rule.describe(),
            self.subject
        )
    }

    /// The approval request's description of what waits (`crate::approvals::Action::Policy`).
    pub fn ask_text(&self) -> String {
        let why = self
            .reason
            .as_deref()
            .map(|r| format!(", {r}"))
            .unwrap_or_default();
        format!("{} ({}{why})", self.subject, self.rule.describe())
    }
}

/// The rule that decides `call` (see the module docs), or `None` when none matches. `user` is
/// the runner owner's policy, used only when `call.runner_owner` names that user.
///
/// A `bash` call is decided **per simple command** (and once more for its opaque part, if it
/// has one), each by the order above; the call gets the strictest: the first `deny`, else the
/// first `ask`, else nothing when some command no rule decided, else `allow` (every command
/// allowed). So `ls && rm -rf /` is not allowed by `ls*`, and a user's `allow` of
/// `git push origin main` covers that command inside any line.
pub fn evaluate(
    tenant: &Policy,
    user: Option<(&str, &Policy)>,
    call: &Call<'_>,
) -> Option<Verdict> {
    let parsed = call.command.map(shell::parse);
    let facts = Facts::of(call, parsed.as_ref());
    let user = user.filter(|(sub, _)| call.runner_owner == Some(*sub));
    let units: Vec<Unit<'_>> = match &parsed {
        None => vec![Unit::Call],
        Some(p) => p
            .commands
            .iter()
            .map(Unit::Command)
            .chain((p.opaque || p.commands.is_empty()).then_some(Unit::Opaque))
            .collect(),
    };
    let verdicts: Vec<Option<Verdict>> = units
        .iter()
        .map(|unit| decide(tenant, user, &facts, unit))
        .collect();
    for decision in [Decision::Deny, Decision::Ask] {
        if let Some(v) = verdicts.iter().flatten().find(|v| v.decision == decision) {
            return Some(v.clone());
        }
    }
    if verdicts.iter().any(Option::is_none) {
        return None;
    }
    let mut allowed = verdicts.into_iter().flatten().next()?;
    if let Some(parsed) = &parsed {
        allowed.subject = parsed.source.clone();
    }
    Some(allowed)
}

/// One part of a call that is decided on its own.
enum Unit<'a> {
    /// A call without a command.
    Call,
    /// One simple command of a `bash` call.
    Command(&'a shell::SimpleCommand),
    /// What of a `bash` call cannot be read statically (or a line with no command at all):
    /// only its source text is matched, and no rule allows it.
    Opaque,
}

/// The order of the module docs, for one unit.
fn decide(
    tenant: &Policy,
    user: Option<(&str, &Policy)>,
    facts: &Facts<'_>,
    unit: &Unit<'_>,
) -> Option<Verdict> {
    let tenant_first = first_match(tenant, &Source::Tenant, facts, unit);
    if let Some(v) = &tenant_first
        && v.decision == Decision::Deny
    {
        return tenant_first;
    }
    if let Some((sub, policy)) = user
        && let Some(v) = first_match(policy, &Source::User(sub.to_string()), facts, unit)
    {
        return Some(v);
    }
    tenant_first
}

/// The simple commands of `command` as the engine reads them (`GET /v1/policy/check` shows them).
pub fn simple_commands(command: &str) -> (Vec<String>, bool) {
    let parsed = shell::parse(command);
    (
        parsed.commands.into_iter().map(|c| c.text).collect(),
        parsed.opaque,
    )
}

/// `GET /v1/policy/check`'s query: the call to decide, as `tool`, `environment`, `runner`,
/// `runnerOwner`, `command`, `path`, `host`, `mcp`, `costUsd`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckQuery {
    /// The tool (required).
    pub tool: String,
    /// See [`Call::environment`].
    pub environment: Option<String>,
    /// See [`Call::runner`].
    pub runner: Option<String>,
    /// See [`Call::runner_owner`]: whose own policy is read as well.
    pub runner_owner: Option<String>,
    /// See [`Call::command`].
    pub command: Option<String>,
    /// See [`Call::paths`].
    pub path: Option<String>,
    /// See [`Call::host`].
    pub host: Option<String>,
    /// See [`Call::mcp`].
    pub mcp: Option<String>,
    /// See [`Call::cost_usd`].
    pub cost_usd: Option<f64>,
}

/// Longest value of a `GET /v1/policy/check` parameter, in bytes (a command, mostly).
pub const MAX_CHECK_PARAM_BYTES: usize = 16 * 1024;

impl CheckQuery {
    /// Reads the query's pairs.
    ///
    /// # Errors
    /// A message for a 400: no `tool`, an unknown parameter, a value too long, a bad number.
    pub fn parse(pairs: &[(String, String)]) -> Result<CheckQuery, String> {
        let mut q = CheckQuery::default();
        for (name, value) in pairs {
            if value.len() > MAX_CHECK_PARAM_BYTES {
                return Err(format!("{name} exceeds {MAX_CHECK_PARAM_BYTES} bytes"));
            }
            let v = Some(value.clone());
            match name.as_str() {
                "tool" => q.tool = value.clone(),
                "environment" => q.environment = v,
                "runner" => q.runner = v,
                "runnerOwner" => q.runner_owner = v,
                "command" => q.command = v,
                "path" => q.path = v,
                "host" => q.host = v,
                "mcp" => q.mcp = v,
                "costUsd" => {
                    let cost: f64 = value
                        .parse()
                        .ok()
                        .filter(|c: &f64| c.is_finite() && *c >= 0.0)
                        .ok_or("costUsd must be a number of dollars, 0 or more")?;
                    q.cost_usd = Some(cost);
                }
                other => {
                    return Err(format!(
                        "unknown parameter {other:?} (tool, environment, runner, runnerOwner, command, path, host, mcp, costUsd)"
                    ));
                }
            }
        }
        if q.tool.is_empty() {
            return Err("tool is required (bash, write, js_fetch, request_environment, …)".into());
        }
        Ok(q)
    }

    /// The call it describes.
    pub fn call(&self) -> Call<'_> {
        Call {
            tool: &self.tool,
            environment: self.environment.as_deref(),
            runner: self.runner.as_deref(),
            runner_owner: self.runner_owner.as_deref(),
            command: self.command.as_deref(),
            paths: self.path.iter().cloned().collect(),
            host: self.host.as_deref(),
            mcp: self.mcp.as_deref(),
            cost_usd: self.cost_usd,
        }
    }
}

/// `GET /v1/policy/check`'s answer: what the policies would decide, and how the command reads.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CheckResponse {
    /// `allow` when no rule matched (the approvals that hold without policy still apply).
    pub decision: Decision,
    /// The rule that decided; `null` when none matched.
    pub verdict: Option<Verdict>,
    /// The simple commands of `command`, as matched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands: Vec<String>,
    /// Whether part of `command` cannot be read statically (allow rules never match it).
    #[serde(default)]
    pub opaque: bool,
}

/// Answers a dry run.
pub fn check(tenant: &Policy, user: Option<(&str, &Policy)>, query: &CheckQuery) -> CheckResponse {
    let verdict = evaluate(tenant, user, &query.call());
    let (commands, opaque) = query
        .command
        .as_deref()
        .map(simple_commands)
        .unwrap_or_default();
    CheckResponse {
        decision: verdict.as_ref().map_or(Decision::Allow, |v| v.decision),
        verdict,
        commands,
        opaque,
    }
}

struct Facts<'a> {
    call: &'a Call<'a>,
    parsed: Option<&'a shell::Parsed>,
    paths: Vec<String>,
}

impl<'a> Facts<'a> {
    fn of(call: &'a Call<'a>, parsed: Option<&'a shell::Parsed>) -> Facts<'a> {
        let mut paths: Vec<String> = call.paths.iter().map(|p| normalize_path(p)).collect();
        if let Some(parsed) = parsed {
            paths.extend(parsed.written_paths.iter().map(|p| normalize_path(p)));
        }
        Facts {
            call,
            parsed,
            paths,
        }
    }
}

fn first_match(
    policy: &Policy,
    source: &Source,
    facts: &Facts<'_>,
    unit: &Unit<'_>,
) -> Option<Verdict> {
    policy.rules.iter().enumerate().find_map(|(i, rule)| {
        let subject = matches(rule, facts, unit)?;
        Some(Verdict {
            decision: rule.decision,
            rule: RuleRef {
                source: source.clone(),
                index: i + 1,
                id: rule.id.clone(),
            },
            reason: rule.reason.clone(),
            subject,
        })
    })
}

/// What `rule` matched in `unit` of the call (`None`: it does not apply).
fn matches(rule: &Rule, facts: &Facts<'_>, unit: &Unit<'_>) -> Option<String> {
    let call = facts.call;
    let one = |pattern: &Option<Pattern>, value: Option<&str>| match pattern {
        None => true,
        Some(p) => value.is_some_and(|v| p.matches(v)),
    };
    if !one(&rule.tool, Some(call.tool))
        || !one(&rule.environment, call.environment)
        || !one(&rule.runner, call.runner)
        || !one(&rule.host, call.host)
        || !one(&rule.mcp, call.mcp)
    {
        return None;
    }
    if let Some(over) = rule.cost_usd_over
        && !call.cost_usd.is_some_and(|cost| cost > over)
    {
        return None;
    }
    let allow = rule.decision == Decision::Allow;
    let mut subject = None;
    if let Some(pattern) = &rule.path {
        if facts.paths.is_empty() {
            return None;
        }
        let mut hits = facts.paths.iter().filter(|p| pattern.matches(p));
        if allow {
            if !facts.paths.iter().all(|p| pattern.matches(p)) {
                return None;
            }
            subject = facts.paths.first().cloned();
        } else {
            subject = Some(hits.next()?.clone());
        }
    }
    if let Some(pattern) = &rule.command {
        let parsed = facts.parsed?;
        let whole = || pattern.matches(&parsed.source);
        subject = Some(match unit {
            Unit::Call => return None,
            Unit::Command(c) if allow => {
                if !c.allow_views.iter().any(|v| pattern.matches(v)) {
                    return None;
                }
                c.text.clone()
            }
            Unit::Command(c) => {
                if !(c.views.iter().any(|v| pattern.matches(v)) || whole()) {
                    return None;
                }
                c.text.clone()
            }
            Unit::Opaque if allow || !whole() => return None,
            Unit::Opaque => parsed.source.clone(),
        });
    }
    Some(
        subject
            .or_else(|| call.mcp.map(str::to_string))
            .or_else(|| call.host.map(str::to_string))
            .or_else(|| call.command.map(str::to_string))
            .or_else(|| facts.paths.first().cloned())
            .unwrap_or_else(|| call.tool.to_string()),
    )
}

/// The rule an "always" answer to `verdict`'s ask adds to `approver`'s own policy: allow this
/// exact command (or path, or host) of this tool on their machines. `None` when it is not
/// offered: the call does not run on the approver's runner (their policy covers only their
/// machines), or what matched is not one simple command, path or host, or holds `*` or `?`
/// (a glob would allow more than was asked).
pub fn always_rule(verdict: &Verdict, call: &Call<'_>, approver: &str) -> Option<RuleDocument> {
    if verdict.decision != Decision::Ask || call.runner_owner != Some(approver) {
        return None;
    }
    let subject = verdict.subject.as_str();
    if subject.is_empty() || subject.contains(['*', '?']) {
        return None;
    }
    let mut matches = MatchDocument {
        tool: Some(call.tool.to_string()),
        ..MatchDocument::default()
    };
    if let Some(command) = call.command {
        // The command as an allow rule reads it: without its wrappers (`sudo`, `env A=1`).
        let parsed = shell::parse(command);
        let one = parsed.commands.iter().find(|c| c.text == subject)?;
        // `/bin/ls /` would read as a regular expression: the base-name form then.
        let inner = one
            .allow_views
            .iter()
            .find(|v| !(v.len() > 1 && v.starts_with('/') && v.ends_with('/')))?;
        if parsed.opaque || inner.contains(['*', '?']) {
            return None;
        }
        matches.command = Some(inner.clone());
    } else if call.mcp == Some(subject) {
        matches.mcp = Some(subject.to_string());
    } else if call.host == Some(subject) {
        matches.host = Some(subject.to_string());
    } else if call.paths.iter().any(|p| normalize_path(p) == subject) {
        matches.path = Some(subject.to_string());
    } else {
        return None;
    }
    Some(RuleDocument {
        id: None,
        matches,
        decision: Decision::Allow,
        reason: Some(format!("{approver} answered \"always\"")),
    })
}

/// `text` (the document at `path`, `None`: none yet) with `rule` first, checked: the next call
/// meets it before any other rule of the document. A rule already there is not added twice.
///
/// # Errors
/// The document is invalid, or already holds [`MAX_RULES`].
pub fn add_rule_first(
    path: &str,
    text: Option<&str>,
    rule: RuleDocument,
) -> Result<String, PolicyError> {
    let fail = |message: String| PolicyError {
        path: path.to_string(),
        message,
    };
    let mut document: PolicyDocument = match text {
        Some(text) => {
            serde_json::from_str(text).map_err(|e| fail(format!("not a policy document: {e}")))?
        }
        None => PolicyDocument::default(),
    };
    if !document.rules.contains(&rule) {
        document.rules.insert(0, rule);
    }
    Policy::compile(&document).map_err(fail)?;
    serde_json::to_string_pretty(&document).map_err(|e| fail(e.to_string()))
}

/// How long a call that starts something is assumed to keep it when it says nothing: an
/// attached environment, a job without a `timeout`.
pub const DEFAULT_COST_SECONDS: f64 = 3600.0;

/// A call's cost estimate: `seconds` of an environment that costs `per_hour` US dollars an hour
/// (its definition's `costPerHourUsd`; `None`: unknown, and no cost rule applies).
pub fn cost_estimate(per_hour: Option<&serde_json::Number>, seconds: f64) -> Option<f64> {
    per_hour
        .and_then(serde_json::Number::as_f64)
        .map(|per_hour| per_hour * seconds.max(0.0) / 3600.0)
}

/// `path` without `.` segments, doubled or trailing slashes, and with `..` applied where it
/// can be (`./src//a/../b/` → `src/b`), so `infra/*` sees `./infra/x` too.
pub fn normalize_path(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            ".." if absolute => {}
            s => parts.push(s),
        }
    }
    let joined = parts.join("/");
    if absolute {
        format!("/{joined}")
    } else {
        joined
    }
}

/// The `data` of a `wuhu_policy_decision_v1` entry: the verdict, the tool and its call.
pub fn decision_entry(verdict: &Verdict, tool: &str, call_id: &str) -> serde_json::Value {
    let mut data = serde_json::to_value(verdict).unwrap_or_default();
    data["tool"] = serde_json::json!(tool);
    data["toolCallId"] = serde_json::json!(call_id);
    data["text"] = serde_json::json!(match verdict.decision {
        Decision::Allow => format!(
            "Policy allowed {tool}: {:?} ({}).",
            verdict.subject,
            verdict.rule.describe()
        ),
        Decision::Ask => format!(
            "Policy asks before {tool}: {:?} ({}).",
            verdict.subject,
            verdict.rule.describe()
        ),
        Decision::Deny => format!(
            "Policy refused {tool}: {:?} ({}).",
            verdict.subject,
            verdict.rule.describe()
        ),
    });
    data
}

#[cfg(test)]
mod tests;
