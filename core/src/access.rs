//! Cloudflare Access: which Access identities are accepted, who they become, and when the
//! team's signing keys (JWKS) are fetched again.
//!
//! The Worker verifies the RS256 signature with a key from [`JwksCache`] and hands the payload
//! to [`check_access_claims`]; it only performs the fetches [`JwksCache::lookup`] asks for.
//! Configuration: `WUHU_ACCESS_TEAM_DOMAIN` (a URL with its scheme; `iss` must equal it),
//! `WUHU_ACCESS_AUD` (the application's audience tag), and either `WUHU_ACCESS_TENANT` (one
//! tenant for everybody) or `WUHU_ACCESS_TENANT_DOMAINS` (`example.com=acme,corp.example=beta`:
//! the tenant by the email's domain). `WUHU_ACCESS_ADMINS` lists emails that get `role: admin`.

use serde::Deserialize;

use crate::authority::{Principal, Role, valid_name};

/// A fetched key set is used this long before it is fetched again, in seconds.
pub const JWKS_TTL_SECS: i64 = 3_600;
/// At most one fetch triggered by an unknown `kid` per this many seconds (per isolate): a
/// stream of tokens with made-up `kid`s costs one fetch per period, not one per request.
pub const JWKS_UNKNOWN_KID_REFRESH_SECS: i64 = 10;
/// After a failed fetch, no new attempt for this many seconds (a stale key set keeps serving).
pub const JWKS_RETRY_AFTER_FAILURE_SECS: i64 = 5;
/// The oldest key set ever used, in seconds since it was fetched: while fetches keep failing a
/// stale set keeps serving up to here (an outage of the team domain does not sign everyone
/// out at once), and past it Access sign-ins are `503` until a fetch succeeds. Without a bound
/// a key the team rotated out (perhaps because it leaked) would stay trusted for as long as
/// the isolate lives and the team domain is unreachable from it.
pub const JWKS_MAX_AGE_SECS: i64 = 6 * 3_600;
/// Largest key-set response read, in bytes.
pub const MAX_JWKS_BYTES: usize = 64 * 1024;
/// Most keys kept from one response.
pub const MAX_JWKS_KEYS: usize = 16;
/// Most entries of `WUHU_ACCESS_TENANT_DOMAINS` and of `WUHU_ACCESS_ADMINS`.
pub const MAX_CONFIG_ENTRIES: usize = 256;

/// Where an Access identity's tenant comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantRule {
    /// Everybody is in this tenant (`WUHU_ACCESS_TENANT`).
    Fixed(String),
    /// By the email's domain, lowercased (`WUHU_ACCESS_TENANT_DOMAINS`); other domains are refused.
    ByDomain(Vec<(String, String)>),
}

/// Access settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessConfig {
    /// `https://<team>.cloudflareaccess.com` (no trailing `/`): the issuer and the JWKS host.
    pub team_domain: String,
    /// The application audience tag the token's `aud` must contain.
    pub audience: String,
    /// The tenant rule.
    pub tenant: TenantRule,
    /// Lowercased emails that are admins.
    pub admins: Vec<String>,
}

/// The settings as read from the environment (unset or empty variables are `None`).
#[derive(Clone, Debug, Default)]
pub struct AccessVars<'a> {
    /// `WUHU_ACCESS_TEAM_DOMAIN`.
    pub team_domain: Option<&'a str>,
    /// `WUHU_ACCESS_AUD`.
    pub audience: Option<&'a str>,
    /// `WUHU_ACCESS_TENANT`.
    pub tenant: Option<&'a str>,
    /// `WUHU_ACCESS_TENANT_DOMAINS`.
    pub tenant_domains: Option<&'a str>,
    /// `WUHU_ACCESS_ADMINS`.
    pub admins: Option<&'a str>,
}

impl AccessConfig {
    /// `Ok(None)` when Access is not configured (neither team domain nor audience set).
    ///
    /// # Errors
    /// A message naming the variable that is wrong: only one of the two set, a team domain
    /// without `https://` / `http://`, no tenant rule, a malformed mapping.
    pub fn from_vars(vars: &AccessVars<'_>) -> Result<Option<AccessConfig>, String> {
        let (team, audience) = match (vars.team_domain, vars.audience) {
            (None, None) => return Ok(None),
            (Some(t), Some(a)) => (t.trim().trim_end_matches('/'), a.trim()),
            _ => {
                return Err(
                    "set both WUHU_ACCESS_TEAM_DOMAIN and WUHU_ACCESS_AUD, or neither".into(),
                );
            }
        };
        let (host, https) = match (team.strip_prefix("https://"), team.strip_prefix("http://")) {
            (Some(host), _) => (host, true),
            (None, Some(host)) => (host, false),
            (None, None) => ("", false),
        };
        if host.is_empty() || host.contains(['/', '?', '#', ' ', '@']) {
            return Err(format!(
                "WUHU_ACCESS_TEAM_DOMAIN must be a URL with its scheme, like https://acme.cloudflareaccess.com (got {team:?})"
            ));
        }
        // The key set that decides who anyone is comes from this URL: over plain http, whoever
        // is on the path could serve their own keys and sign any identity. Loopback only is
        // allowed (a local key-set server in tests never leaves the machine).
        if !https && !is_loopback_host(host) {
            return Err(format!(
                "WUHU_ACCESS_TEAM_DOMAIN must be https:// (the Access keys are fetched from it; http:// is accepted only for a loopback address, in tests), like https://acme.cloudflareaccess.com (got {team:?})"
            ));
        }
        if audience.is_empty() {
            return Err("WUHU_ACCESS_AUD is empty".into());
        }
        let entries = |text: &str| -> Vec<String> {
            text.split([',', ' ', '\n'])
                .filter(|e| !e.is_empty())
                .map(|e| e.trim().to_ascii_lowercase())
                .collect()
        };
        let tenant = match (vars.tenant, vars.tenant_domains) {
            (Some(t), _) => {
                let t = t.trim();
                if !valid_name(t) {
                    return Err(format!(
                        "WUHU_ACCESS_TENANT {t:?} is not a valid tenant name"
                    ));
                }
                TenantRule::Fixed(t.to_string())
            }
            (None, Some(map)) => {
                let mut rules = Vec::new();
                for entry in entries(map) {
                    let Some((domain, tenant)) = entry.split_once('=') else {
                        return Err(format!(
                            "WUHU_ACCESS_TENANT_DOMAINS entry {entry:?} is not domain=tenant"
                        ));
                    };
                    if domain.is_empty() || !valid_name(tenant) {
                        return Err(format!(
                            "WUHU_ACCESS_TENANT_DOMAINS entry {entry:?} is not domain=tenant"
                        ));
                    }
                    rules.push((domain.to_string(), tenant.to_string()));
                }
                if rules.is_empty() || rules.len() > MAX_CONFIG_ENTRIES {
                    return Err(format!(
                        "WUHU_ACCESS_TENANT_DOMAINS must list 1 to {MAX_CONFIG_ENTRIES} domain=tenant entries"
                    ));
                }
                TenantRule::ByDomain(rules)
            }
            (None, None) => {
                return Err("Access needs WUHU_ACCESS_TENANT or WUHU_ACCESS_TENANT_DOMAINS".into());
            }
        };
        let admins = vars.admins.map(entries).unwrap_or_default();
        if admins.len() > MAX_CONFIG_ENTRIES {
            return Err(format!(
                "WUHU_ACCESS_ADMINS lists more than {MAX_CONFIG_ENTRIES} emails"
            ));
        }
        Ok(Some(AccessConfig {
            team_domain: team.to_string(),
            audience: audience.to_string(),
            tenant,
            admins,
        }))
    }

    /// `<team>/cdn-cgi/access/certs`.
    pub fn certs_url(&self) -> String {
        format!("{}/cdn-cgi/access/certs", self.team_domain)
    }

    /// Who a lowercased `email` is under these settings now: its tenant by the rule, and
    /// admin when listed. Used when an Access token is checked, and again at every use of a
    /// credential whose lineage rests on an Access identity (`crate::tokens::standing`), so a
    /// change to the settings reaches what was minted before it.
    ///
    /// # Errors
    /// [`AccessError::NoEmail`] for an unusable email, [`AccessError::NoTenant`] when its
    /// domain maps to no tenant.
    pub fn principal_for(&self, email: &str) -> Result<Principal, AccessError> {
        let email = email.to_ascii_lowercase();
        let usable = valid_name(&email)
            && email
                .split_once('@')
                .is_some_and(|(l, d)| !l.is_empty() && !d.is_empty());
        if !usable {
            return Err(AccessError::NoEmail);
        }
        let tenant = match &self.tenant {
            TenantRule::Fixed(t) => t.clone(),
            TenantRule::ByDomain(rules) => {
                let domain = email.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
                rules
                    .iter()
                    .find(|(d, _)| d == domain)
                    .map(|(_, t)| t.clone())
                    .ok_or(AccessError::NoTenant)?
            }
        };
        let role = if self.admins.contains(&email) {
            Role::Admin
        } else {
            Role::Member
        };
        Ok(Principal {
            sub: email,
            tenant,
            role,
        })
    }
}

/// Whether `host` (`name[:port]` or `[v6][:port]`) is a loopback address: `localhost`,
/// `127.0.0.0/8` or `[::1]`.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((inside, port)) if port.is_empty() || port.starts_with(':') => inside,
            _ => return false,
        },
        None => host.split(':').next().unwrap_or_default(),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The claims of an Access application token that matter here.
#[derive(Deserialize, Clone, Debug, PartialEq)]
pub struct AccessClaims {
    /// A string or an array of strings.
    #[serde(default)]
    pub aud: serde_json::Value,
    /// The signed-in person's email (absent for service tokens).
    #[serde(default)]
    pub email: Option<String>,
    /// Expiry, unix seconds.
    pub exp: i64,
    /// Not before, unix seconds.
    #[serde(default)]
    pub nbf: Option<i64>,
    /// Issuer: the team domain.
    #[serde(default)]
    pub iss: Option<String>,
    /// Issued at, unix seconds: when Access signed the person in to this application (a new
    /// sign-in issues a new token). Minting a token needs a recent one
    /// (`crate::tokens::ACCESS_REAUTH_SECS`).
    #[serde(default)]
    pub iat: Option<i64>,
}

/// Why an Access token is refused (a 401's message).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// `iss` is not the configured team domain.
    #[error("access token issuer is not the configured team domain")]
    Issuer,
    /// `aud` does not contain the configured audience.
    #[error("access token audience is not this application")]
    Audience,
    /// `exp` passed.
    #[error("access token expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("access token not valid yet")]
    NotYetValid,
    /// No usable email (service tokens have none).
    #[error("access token has no usable email (service tokens are not accepted)")]
    NoEmail,
    /// The email's domain maps to no tenant.
    #[error("no tenant is configured for this email domain")]
    NoTenant,
}

/// An accepted Access identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessGrant {
    /// `sub` = the lowercased email; the tenant by the rule; admin when listed.
    pub principal: Principal,
    /// The Access token's expiry.
    pub expires_at: i64,
    /// The Access token's `iat`: when this sign-in happened.
    pub issued_at: Option<i64>,
}

/// Checks an Access token's claims (its RS256 signature is already verified) at `now`.
///
/// # Errors
/// The first [`AccessError`] that applies.
pub fn check_access_claims(
    claims: &AccessClaims,
    config: &AccessConfig,
    now: i64,
) -> Result<AccessGrant, AccessError> {
    if claims.iss.as_deref().map(|i| i.trim_end_matches('/')) != Some(config.team_domain.as_str()) {
        return Err(AccessError::Issuer);
    }
    let audience_ok = match &claims.aud {
        serde_json::Value::String(a) => *a == config.audience,
        serde_json::Value::Array(list) => list.iter().any(|a| a.as_str() == Some(&config.audience)),
        _ => false,
    };
    if !audience_ok {
        return Err(AccessError::Audience);
    }
    if claims.exp <= now {
        return Err(AccessError::Expired);
    }
    if claims.nbf.is_some_and(|nbf| nbf > now) {
        return Err(AccessError::NotYetValid);
    }
    let principal = config.principal_for(claims.email.as_deref().unwrap_or_default())?;
    Ok(AccessGrant {
        principal,
        expires_at: claims.exp,
        issued_at: claims.iat,
    })
}

/// One RSA key of the team's key set.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Jwk {
    /// Key id (the token header's `kid`).
    pub kid: String,
    /// `RSA`.
    pub kty: String,
    /// Modulus, base64url.
    pub n: String,
    /// Exponent, base64url.
    pub e: String,
}

/// Parses a `/cdn-cgi/access/certs` body: the RSA keys of its `keys` (others ignored), at
/// most [`MAX_JWKS_KEYS`].
///
/// # Errors
/// A message when the body is not a key set or holds no RSA key.
pub fn parse_jwks(body: &[u8]) -> Result<Vec<Jwk>, String> {
    #[derive(Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    if body.len() > MAX_JWKS_BYTES {
        return Err(format!("key set larger than {MAX_JWKS_BYTES} bytes"));
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| format!("key set: {e}"))?;
    let keys: Vec<Jwk> = set
        .keys
        .into_iter()
        .filter_map(|k| serde_json::from_value::<Jwk>(k).ok())
        .filter(|k| k.kty == "RSA")
        .take(MAX_JWKS_KEYS)
        .collect();
    if keys.is_empty() {
        return Err("key set holds no RSA key".into());
    }
    Ok(keys)
}

/// The team's key set as one isolate remembers it.
#[derive(Clone, Debug, Default)]
pub struct JwksCache {
    keys: Vec<Jwk>,
    fetched_at: Option<i64>,
    last_unknown_kid_refresh: Option<i64>,
    last_failure: Option<i64>,
}

/// What to do for a token's `kid`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyLookup {
    /// Verify with this key.
    Use(Jwk),
    /// Fetch the key set, [`JwksCache::store`] or [`JwksCache::failed`], then look up again.
    Fetch,
    /// The `kid` is unknown and a refresh is not allowed yet: refuse the token (401).
    Unknown,
    /// No key set and the last fetch failed moments ago: 503.
    Unavailable,
}

impl JwksCache {
    /// Decides for `kid` at `now`. A missing or expired key set is fetched; an unknown `kid`
    /// triggers a fetch at most once per [`JWKS_UNKNOWN_KID_REFRESH_SECS`]; after a failure,
    /// nothing is fetched for [`JWKS_RETRY_AFTER_FAILURE_SECS`] and a stale set keeps serving,
    /// until it is [`JWKS_MAX_AGE_SECS`] old.
    pub fn lookup(&self, kid: &str, now: i64) -> KeyLookup {
        let found = self.keys.iter().find(|k| k.kid == kid).cloned();
        let backing_off = self
            .last_failure
            .is_some_and(|t| now - t < JWKS_RETRY_AFTER_FAILURE_SECS);
        let age = self.fetched_at.map(|t| now - t).filter(|age| *age >= 0);
        let fresh = age.is_some_and(|age| age < JWKS_TTL_SECS);
        let usable = age.is_some_and(|age| age < JWKS_MAX_AGE_SECS);
        if !fresh {
            return match (backing_off, found) {
                (false, _) => KeyLookup::Fetch,
                (true, _) if !usable => KeyLookup::Unavailable,
                (true, Some(key)) => KeyLookup::Use(key),
                (true, None) => KeyLookup::Unknown,
            };
        }
        if let Some(key) = found {
            return KeyLookup::Use(key);
        }
        let may_refresh = !backing_off
            && self
                .last_unknown_kid_refresh
                .is_none_or(|t| now - t >= JWKS_UNKNOWN_KID_REFRESH_SECS || now < t);
        if may_refresh {
            KeyLookup::Fetch
        } else {
            KeyLookup::Unknown
        }
    }

    /// Records a fetch that [`lookup`](Self::lookup) asked for while the set was fresh (an
    /// unknown `kid`): call before fetching.
    pub fn note_refresh(&mut self, now: i64) {
        if self.fetched_at.is_some_and(|t| now - t < JWKS_TTL_SECS) {
            self.last_unknown_kid_refresh = Some(now);
        }
    }

    /// Stores a fetched key set.
    pub fn store(&mut self, keys: Vec<Jwk>, now: i64) {
        self.keys = keys;
        self.fetched_at = Some(now);
        self.last_failure = None;
    }

    /// Records a failed fetch.
    pub fn failed(&mut self, now: i64) {
        self.last_failure = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> AccessConfig {
        AccessConfig::from_vars(&AccessVars {
            team_domain: Some("https://acme.cloudflareaccess.com/"),
            audience: Some("aud-1"),
            tenant: Some("acme"),
            tenant_domains: None,
            admins: Some("Boss@Acme.com"),
        })
        .unwrap()
        .unwrap()
    }

    #[test]
    fn config_table() {
        let vars =
            |team: Option<&'static str>, aud: Option<&'static str>, tenant, domains| AccessVars {
                team_domain: team,
                audience: aud,
                tenant,
                tenant_domains: domains,
                admins: None,
            };
        assert_eq!(
            AccessConfig::from_vars(&vars(None, None, None, None)),
            Ok(None)
        );
        let bad = [
            vars(Some("https://a.example"), None, Some("t"), None),
            vars(None, Some("aud"), Some("t"), None),
            vars(
                Some("acme.cloudflareaccess.com"),
                Some("aud"),
                Some("t"),
                None,
            ),
            vars(Some("https://"), Some("aud"), Some("t"), None),
            vars(Some("https://a.example/x"), Some("aud"), Some("t"), None),
            vars(Some("https://a.example"), Some("  "), Some("t"), None),
            vars(Some("https://a.example"), Some("aud"), None, None),
            vars(Some("https://a.example"), Some("aud"), Some("a/b"), None),
            vars(
                Some("https://a.example"),
                Some("aud"),
                None,
                Some("example.com"),
            ),
            vars(
                Some("https://a.example"),
                Some("aud"),
                None,
                Some("example.com=.."),
            ),
        ];
        for v in bad {
            assert!(AccessConfig::from_vars(&v).is_err(), "{v:?}");
        }
        // Plain http lets whoever is on the path serve the keys: only loopback is allowed.
        for team in [
            "http://acme.cloudflareaccess.com",
            "http://10.0.0.1",
            "http://127.0.0.1.evil.example",
            "http://localhost.evil.example:80",
            "http://[::2]:9000",
            "http://[::1]x",
            "ftp://acme.cloudflareaccess.com",
            "HTTPS://acme.cloudflareaccess.com",
        ] {
            let refused = AccessConfig::from_vars(&vars(Some(team), Some("aud"), Some("t"), None));
            let message = refused.expect_err(team);
            assert!(
                message.contains("WUHU_ACCESS_TEAM_DOMAIN"),
                "{team}: {message}"
            );
        }
        assert!(
            AccessConfig::from_vars(&vars(
                Some("http://a.example"),
                Some("aud"),
                Some("t"),
                None
            ))
            .unwrap_err()
            .contains("https://"),
            "the refusal says what is wanted"
        );
        for team in [
            "https://acme.cloudflareaccess.com",
            "https://acme.cloudflareaccess.com:8443",
            "http://127.0.0.1:9000",
            "http://127.1.2.3",
            "http://localhost:9000",
            "http://LOCALHOST",
            "http://[::1]:9000",
            "http://[::1]",
        ] {
            let accepted = AccessConfig::from_vars(&vars(Some(team), Some("aud"), Some("t"), None));
            assert!(matches!(accepted, Ok(Some(_))), "{team}: {accepted:?}");
        }
        let ok = AccessConfig::from_vars(&vars(
            Some("http://127.0.0.1:9000"),
            Some("aud"),
            None,
            Some("Example.com=acme, corp.example=beta"),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(ok.certs_url(), "http://127.0.0.1:9000/cdn-cgi/access/certs");
        assert_eq!(
            ok.tenant,
            TenantRule::ByDomain(vec![
                ("example.com".into(), "acme".into()),
                ("corp.example".into(), "beta".into())
            ])
        );
    }

    #[test]
    fn claims_table() {
        let now = 1_000_000;
        let cfg = config();
        let base = json!({
            "aud": ["aud-1"], "email": "Ana@acme.com", "exp": now + 60,
            "iss": "https://acme.cloudflareaccess.com", "sub": "uuid", "type": "app"
        });
        let with = |patch: serde_json::Value| {
            let mut c = base.clone();
            for (k, v) in patch.as_object().unwrap() {
                if v.is_null() {
                    c.as_object_mut().unwrap().remove(k);
                } else {
                    c[k] = v.clone();
                }
            }
            serde_json::from_value::<AccessClaims>(c).unwrap()
        };
        use AccessError::*;
        type Case = (
            serde_json::Value,
            Result<(&'static str, &'static str, Role), AccessError>,
        );
        let cases: Vec<Case> = vec![
            (json!({}), Ok(("ana@acme.com", "acme", Role::Member))),
            (
                json!({"aud": "aud-1"}),
                Ok(("ana@acme.com", "acme", Role::Member)),
            ),
            (
                json!({"aud": ["x", "aud-1"]}),
                Ok(("ana@acme.com", "acme", Role::Member)),
            ),
            (
                json!({"email": "boss@acme.com"}),
                Ok(("boss@acme.com", "acme", Role::Admin)),
            ),
            (
                json!({"iss": "https://acme.cloudflareaccess.com/"}),
                Ok(("ana@acme.com", "acme", Role::Member)),
            ),
            (json!({"aud": ["aud-2"]}), Err(Audience)),
            (json!({"aud": "aud-10"}), Err(Audience)),
            (json!({"aud": null}), Err(Audience)),
            (json!({"aud": 5}), Err(Audience)),
            (
                json!({"iss": "https://evil.cloudflareaccess.com"}),
                Err(Issuer),
            ),
            (
                json!({"iss": "http://acme.cloudflareaccess.com"}),
                Err(Issuer),
            ),
            (json!({"iss": null}), Err(Issuer)),
            (json!({"exp": now}), Err(Expired)),
            (json!({"exp": now - 1}), Err(Expired)),
            (json!({"nbf": now + 1}), Err(NotYetValid)),
            (
                json!({"nbf": now}),
                Ok(("ana@acme.com", "acme", Role::Member)),
            ),
            (json!({"email": null}), Err(NoEmail)),
            (json!({"email": ""}), Err(NoEmail)),
            (json!({"email": "no-at-sign"}), Err(NoEmail)),
            (json!({"email": "a b@acme.com"}), Err(NoEmail)),
            (
                json!({"email": "a@b@c"}),
                Ok(("a@b@c", "acme", Role::Member)),
            ),
        ];
        for (patch, want) in cases {
            let got = check_access_claims(&with(patch.clone()), &cfg, now)
                .map(|g| (g.principal.sub, g.principal.tenant, g.principal.role));
            let want = want.map(|(s, t, r)| (s.to_string(), t.to_string(), r));
            assert_eq!(got, want, "{patch}");
        }
        let by_domain = AccessConfig {
            tenant: TenantRule::ByDomain(vec![("acme.com".into(), "acme".into())]),
            ..cfg
        };
        assert_eq!(
            check_access_claims(&with(json!({})), &by_domain, now).map(|g| g.principal.tenant),
            Ok("acme".into())
        );
        assert_eq!(
            check_access_claims(&with(json!({"email": "x@other.com"})), &by_domain, now),
            Err(NoTenant)
        );
        assert_eq!(
            check_access_claims(&with(json!({"email": "x@sub.acme.com"})), &by_domain, now),
            Err(NoTenant)
        );
    }

    fn key(kid: &str) -> Jwk {
        Jwk {
            kid: kid.into(),
            kty: "RSA".into(),
            n: "n".into(),
            e: "AQAB".into(),
        }
    }

    #[test]
    fn jwks_cache_fetches_only_when_it_should() {
        let mut cache = JwksCache::default();
        assert_eq!(cache.lookup("k1", 100), KeyLookup::Fetch);
        cache.note_refresh(100); // the first fetch is not an unknown-kid refresh
        cache.store(vec![key("k1")], 100);
        assert_eq!(cache.lookup("k1", 101), KeyLookup::Use(key("k1")));
        // The team rotated: an unknown kid refreshes at once...
        assert_eq!(cache.lookup("k2", 102), KeyLookup::Fetch);
        cache.note_refresh(102);
        cache.store(vec![key("k1"), key("k2")], 102);
        assert_eq!(cache.lookup("k2", 102), KeyLookup::Use(key("k2")));
        // ...but made-up kids cost one fetch per period, not one per request.
        assert_eq!(cache.lookup("bogus", 103), KeyLookup::Unknown);
        assert_eq!(
            cache.lookup("bogus", 102 + JWKS_UNKNOWN_KID_REFRESH_SECS - 1),
            KeyLookup::Unknown
        );
        assert_eq!(
            cache.lookup("bogus", 102 + JWKS_UNKNOWN_KID_REFRESH_SECS),
            KeyLookup::Fetch
        );
        // Known kids never wait for the period.
        assert_eq!(cache.lookup("k1", 104), KeyLookup::Use(key("k1")));
        // The set expires after the TTL and is fetched again.
        assert_eq!(cache.lookup("k1", 102 + JWKS_TTL_SECS), KeyLookup::Fetch);
        // A failed fetch of an expired set: the stale set serves, no new fetch for a while.
        let later = 102 + JWKS_TTL_SECS;
        cache.failed(later);
        assert_eq!(cache.lookup("k1", later + 1), KeyLookup::Use(key("k1")));
        assert_eq!(cache.lookup("k9", later + 1), KeyLookup::Unknown);
        assert_eq!(
            cache.lookup("k1", later + JWKS_RETRY_AFTER_FAILURE_SECS),
            KeyLookup::Fetch
        );
        // Fetches keep failing: the stale set serves until it is JWKS_MAX_AGE_SECS old, then
        // nothing is trusted (503) until a fetch succeeds, known kid or not.
        let fetched = 102 + JWKS_TTL_SECS; // the last successful fetch below
        cache.store(vec![key("k1")], fetched);
        let mut at = fetched + JWKS_TTL_SECS;
        while at < fetched + JWKS_MAX_AGE_SECS + 3 * JWKS_RETRY_AFTER_FAILURE_SECS {
            assert_eq!(
                cache.lookup("k1", at),
                KeyLookup::Fetch,
                "at +{}",
                at - fetched
            );
            cache.failed(at);
            let want = if at + 1 - fetched < JWKS_MAX_AGE_SECS {
                KeyLookup::Use(key("k1"))
            } else {
                KeyLookup::Unavailable
            };
            assert_eq!(cache.lookup("k1", at + 1), want, "at +{}", at + 1 - fetched);
            at += JWKS_RETRY_AFTER_FAILURE_SECS;
        }
        assert_eq!(
            cache.lookup("k1", fetched + JWKS_MAX_AGE_SECS - 1),
            KeyLookup::Use(key("k1")),
            "the last second of the bound still serves (while backing off)"
        );
        assert_eq!(
            cache.lookup("k1", fetched + JWKS_MAX_AGE_SECS),
            KeyLookup::Unavailable
        );
        // A success ends it.
        let later = fetched + JWKS_MAX_AGE_SECS + 60;
        assert_eq!(cache.lookup("k1", later), KeyLookup::Fetch);
        cache.store(vec![key("k1")], later);
        assert_eq!(cache.lookup("k1", later + 1), KeyLookup::Use(key("k1")));
        // A clock that went back does not make an old set young.
        assert_eq!(cache.lookup("k1", later - 10), KeyLookup::Fetch);

        // Never fetched and the fetch failed: unavailable, then retried.
        let mut empty = JwksCache::default();
        empty.failed(10);
        assert_eq!(empty.lookup("k1", 11), KeyLookup::Unavailable);
        assert_eq!(
            empty.lookup("k1", 10 + JWKS_RETRY_AFTER_FAILURE_SECS),
            KeyLookup::Fetch
        );
    }

    #[test]
    fn jwks_parsing() {
        let body = json!({"keys": [
            {"kid": "a", "kty": "RSA", "alg": "RS256", "use": "sig", "n": "xyz", "e": "AQAB"},
            {"kid": "b", "kty": "EC", "crv": "P-256", "x": "1", "y": "2"},
            {"kty": "RSA", "n": "no-kid", "e": "AQAB"}
        ], "public_cert": {"kid": "a", "cert": "..."}});
        let keys = parse_jwks(body.to_string().as_bytes()).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].kid, "a");
        assert!(parse_jwks(b"{}").is_err());
        assert!(parse_jwks(br#"{"keys":[]}"#).is_err());
        assert!(parse_jwks(&vec![b' '; MAX_JWKS_BYTES + 1]).is_err());
    }
}
