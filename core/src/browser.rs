//! What a browser may do: the cross-site request check for ambient credentials (cookies,
//! Cloudflare Access) and CORS for the origins in `WUHU_ALLOWED_ORIGINS`. Pure functions; the
//! Worker reads headers and writes the answers. `docs/api.md` ("Browsers") and
//! `docs/security.md` say the same in prose.

/// Why a request authenticated by an ambient credential is refused (403 `forbidden`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CrossSiteRefusal {
    /// `Sec-Fetch-Site` says the request came from another site or origin.
    #[error(
        "cross-origin request refused (Sec-Fetch-Site: {0}); cookie sessions only work from this origin"
    )]
    FetchSite(String),
    /// `Origin` names another origin.
    #[error(
        "cross-origin request refused (Origin: {0}); cookie sessions only work from this origin"
    )]
    Origin(String),
}

/// Whether a request whose credential the browser attaches by itself (the session cookie,
/// Cloudflare Access) may proceed. `host` is the request's own `host[:port]`.
///
/// Safe methods (`GET`, `HEAD`, `OPTIONS`) always may: they change nothing, and a foreign page
/// cannot read the answer (no CORS grant is ever given with credentials). Otherwise, as Go's
/// `net/http.CrossOriginProtection` does: `Sec-Fetch-Site: same-origin` or `none` passes, any
/// other value is refused; without it, an `Origin` whose host differs from `host` is refused,
/// and a request with neither header is not from a browser (so it cannot be a forged
/// cross-site request) and passes.
///
/// # Errors
/// A [`CrossSiteRefusal`].
pub fn check_cross_site(
    method: &str,
    sec_fetch_site: Option<&str>,
    origin: Option<&str>,
    host: &str,
) -> Result<(), CrossSiteRefusal> {
    if matches!(method, "GET" | "HEAD" | "OPTIONS") {
        return Ok(());
    }
    if let Some(site) = sec_fetch_site {
        return match site {
            "same-origin" | "none" => Ok(()),
            other => Err(CrossSiteRefusal::FetchSite(other.to_string())),
        };
    }
    match origin {
        None => Ok(()),
        Some(origin) if origin_host(origin).is_some_and(|h| h.eq_ignore_ascii_case(host)) => Ok(()),
        Some(origin) => Err(CrossSiteRefusal::Origin(truncate(origin))),
    }
}

/// The method the cross-site check sees for a request: a WebSocket upgrade (`Upgrade:
/// websocket`, a `GET`) counts as state-changing (`WEBSOCKET`), because the socket it opens
/// carries actions and a foreign page can read what it sends (WebSockets have no CORS): a cookie
/// or Access upgrade from another origin is cross-site WebSocket hijacking and is refused.
pub fn cross_site_method<'a>(method: &'a str, upgrade: Option<&str>) -> &'a str {
    if upgrade.is_some_and(|u| u.trim().eq_ignore_ascii_case("websocket")) {
        "WEBSOCKET"
    } else {
        method
    }
}

/// The `host[:port]` of an origin such as `https://app.example.com:8443`; `None` for `null`
/// or anything without a scheme.
fn origin_host(origin: &str) -> Option<&str> {
    let (_, rest) = origin.split_once("://")?;
    Some(rest.trim_end_matches('/'))
}

fn truncate(text: &str) -> String {
    text.chars().take(200).collect()
}

/// Methods a CORS preflight may ask for.
pub const CORS_ALLOW_METHODS: &str = "GET, POST, PUT, PATCH, DELETE";
/// Request headers a cross-origin page may send.
pub const CORS_ALLOW_HEADERS: &str = "authorization, content-type, last-event-id";
/// Response headers a cross-origin page may read.
pub const CORS_EXPOSE_HEADERS: &str = "x-request-id";
/// How long a browser may cache a preflight answer, in seconds.
pub const CORS_MAX_AGE_SECS: u32 = 600;
/// Most origins `WUHU_ALLOWED_ORIGINS` may list.
pub const MAX_ALLOWED_ORIGINS: usize = 64;

/// The origins other pages may call the API from (`WUHU_ALLOWED_ORIGINS`): exact
/// `scheme://host[:port]` strings, compared exactly (after removing a trailing `/`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedOrigins(Vec<String>);

impl AllowedOrigins {
    /// Parses a comma- or whitespace-separated list.
    ///
    /// # Errors
    /// A message naming an entry that is not `http(s)://host[:port]`, a `*`, or more than
    /// [`MAX_ALLOWED_ORIGINS`] entries: a bad list is a misconfiguration, not "allow nothing".
    pub fn parse(text: &str) -> Result<AllowedOrigins, String> {
        let mut origins = Vec::new();
        for entry in text.split([',', ' ', '\n', '\t']).filter(|e| !e.is_empty()) {
            let entry = entry.trim_end_matches('/');
            let ok = (entry.starts_with("https://") || entry.starts_with("http://"))
                && origin_host(entry).is_some_and(|h| {
                    !h.is_empty()
                        && h.bytes().all(|b| {
                            b.is_ascii_alphanumeric()
                                || matches!(b, b'.' | b'-' | b':' | b'[' | b']')
                        })
                });
            if !ok {
                return Err(format!(
                    "WUHU_ALLOWED_ORIGINS: {:?} is not an origin like https://app.example.com",
                    truncate(entry)
                ));
            }
            origins.push(entry.to_ascii_lowercase());
        }
        if origins.len() > MAX_ALLOWED_ORIGINS {
            return Err(format!(
                "WUHU_ALLOWED_ORIGINS lists more than {MAX_ALLOWED_ORIGINS} origins"
            ));
        }
        Ok(AllowedOrigins(origins))
    }

    /// Whether `origin` (an `Origin` header) is listed.
    pub fn allows(&self, origin: &str) -> bool {
        let origin = origin.trim_end_matches('/');
        self.0.iter().any(|o| o.eq_ignore_ascii_case(origin))
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Headers for a response to a request from an allowed `origin` (never with credentials:
/// cross-origin pages authenticate with a bearer token).
pub fn cors_response_headers(origin: &str) -> Vec<(&'static str, String)> {
    vec![
        ("access-control-allow-origin", origin.to_string()),
        (
            "access-control-expose-headers",
            CORS_EXPOSE_HEADERS.to_string(),
        ),
        ("vary", "Origin".to_string()),
    ]
}

/// Headers for the answer (204) to a preflight from an allowed `origin`.
pub fn cors_preflight_headers(origin: &str) -> Vec<(&'static str, String)> {
    vec![
        ("access-control-allow-origin", origin.to_string()),
        (
            "access-control-allow-methods",
            CORS_ALLOW_METHODS.to_string(),
        ),
        (
            "access-control-allow-headers",
            CORS_ALLOW_HEADERS.to_string(),
        ),
        ("access-control-max-age", CORS_MAX_AGE_SECS.to_string()),
        ("vary", "Origin".to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_upgrades_are_checked_like_state_changing_requests() {
        let host = "127.0.0.1:8787";
        // (upgrade header, Sec-Fetch-Site, Origin, allowed)
        type Case = (
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
            bool,
        );
        let cases: [Case; 8] = [
            (None, None, Some("https://evil.example"), true),
            (Some("websocket"), None, Some("https://evil.example"), false),
            (Some("WebSocket"), None, Some("https://evil.example"), false),
            (Some("websocket"), Some("cross-site"), None, false),
            (Some("websocket"), None, Some("http://127.0.0.1:8787"), true),
            (Some("websocket"), Some("same-origin"), None, true),
            (Some("websocket"), None, None, true),
            (Some("h2c"), None, Some("https://evil.example"), true),
        ];
        for (upgrade, site, origin, allowed) in cases {
            let method = cross_site_method("GET", upgrade);
            assert_eq!(
                check_cross_site(method, site, origin, host).is_ok(),
                allowed,
                "{upgrade:?} {site:?} {origin:?}"
            );
        }
    }

    #[test]
    fn cross_site_table() {
        let host = "127.0.0.1:8787";
        type Case = (
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            bool,
        );
        let cases: [Case; 16] = [
            (
                "GET",
                Some("cross-site"),
                Some("https://evil.example"),
                true,
            ),
            ("HEAD", None, Some("https://evil.example"), true),
            ("OPTIONS", None, Some("https://evil.example"), true),
            ("POST", None, Some("http://127.0.0.1:8787"), true),
            ("POST", None, Some("http://127.0.0.1:8787/"), true),
            ("POST", None, Some("https://127.0.0.1:8787"), true),
            ("POST", None, Some("http://127.0.0.1:9999"), false),
            ("POST", None, Some("https://evil.example"), false),
            ("DELETE", None, Some("null"), false),
            (
                "PATCH",
                None,
                Some("http://127.0.0.1:8787.evil.example"),
                false,
            ),
            ("POST", None, None, true),
            ("POST", Some("same-origin"), None, true),
            ("POST", Some("none"), None, true),
            (
                "POST",
                Some("same-site"),
                Some("http://127.0.0.1:8787"),
                false,
            ),
            ("PUT", Some("cross-site"), None, false),
            (
                "POST",
                Some("cross-site"),
                Some("http://127.0.0.1:8787"),
                false,
            ),
        ];
        for (method, site, origin, ok) in cases {
            assert_eq!(
                check_cross_site(method, site, origin, host).is_ok(),
                ok,
                "{method} {site:?} {origin:?}"
            );
        }
    }

    #[test]
    fn allowed_origins() {
        let list =
            AllowedOrigins::parse("https://app.example.com, http://127.0.0.1:5173/").unwrap();
        assert!(list.allows("https://app.example.com"));
        assert!(list.allows("HTTPS://APP.example.com"));
        assert!(list.allows("http://127.0.0.1:5173"));
        assert!(!list.allows("http://127.0.0.1:5174"));
        assert!(!list.allows("https://app.example.com.evil.example"));
        assert!(!list.allows("null"));
        assert!(AllowedOrigins::parse("").unwrap().is_empty());
        for bad in [
            "*",
            "app.example.com",
            "https://",
            "https://a.example/path",
            "ftp://x",
        ] {
            assert!(AllowedOrigins::parse(bad).is_err(), "{bad}");
        }
        let many = (0..=MAX_ALLOWED_ORIGINS)
            .map(|i| format!("https://a{i}.example"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(AllowedOrigins::parse(&many).is_err());
        let headers = cors_preflight_headers("https://app.example.com");
        assert!(
            headers
                .iter()
                .any(|(k, v)| *k == "access-control-allow-headers" && v.contains("authorization"))
        );
        assert!(
            !cors_response_headers("x")
                .iter()
                .any(|(k, _)| k.contains("credentials"))
        );
    }
}
