//! The egress policy of the `js` tool's `fetch`: which URLs a sandboxed script may reach.
//!
//! * Only `http` and `https`.
//! * No loopback, private, link-local, shared (CGNAT), unspecified or multicast addresses, and
//!   no `localhost`/`*.localhost`/`*.local`/`*.internal` names.
//! * Only the standard port of the scheme (80, 443).
//! * Entries of `WUHU_SANDBOX_EGRESS_ALLOW` (comma-separated `host` or `host:port`) lift the
//!   address and port rules for that host (any port for a bare `host`).
//!
//! Names are not resolved (a Worker cannot resolve DNS), so a public name that points at a
//! private address is not caught here; the platform's own egress rules apply to it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Requests one `js` call may make.
pub const MAX_REQUESTS_PER_CALL: u32 = 20;
/// Response bytes one `js` call may read, in all.
pub const MAX_RESPONSE_BYTES_PER_CALL: usize = 5 * 1024 * 1024;

/// Why a URL was refused. The message names the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    /// Not a URL.
    #[error("invalid url {0:?}")]
    InvalidUrl(String),
    /// Not http or https.
    #[error("egress refused: scheme {0:?} is not allowed (http and https only)")]
    Scheme(String),
    /// A private, loopback or otherwise internal address or name.
    #[error(
        "egress refused: {0} is a private, loopback or link-local address (allow it with WUHU_SANDBOX_EGRESS_ALLOW)"
    )]
    PrivateAddress(String),
    /// A port other than 80/443.
    #[error(
        "egress refused: port {0} is not a standard port (allow it with WUHU_SANDBOX_EGRESS_ALLOW)"
    )]
    Port(u16),
}

/// A parsed allowlist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allow: Vec<(String, Option<u16>)>,
}

impl EgressPolicy {
    /// Parses `host[:port],host[:port],…` (blank entries ignored; IPv6 as `[::1]:8080`).
    pub fn from_allowlist(list: &str) -> EgressPolicy {
        let allow = list
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let entry = entry.to_ascii_lowercase();
                if let Some(rest) = entry.strip_prefix('[') {
                    let (host, tail) = rest.split_once(']').unwrap_or((rest, ""));
                    let port = tail.strip_prefix(':').and_then(|p| p.parse().ok());
                    (host.to_string(), port)
                } else {
                    match entry.rsplit_once(':') {
                        Some((host, port)) if port.parse::<u16>().is_ok() => {
                            (host.to_string(), port.parse().ok())
                        }
                        _ => (entry, None),
                    }
                }
            })
            .collect();
        EgressPolicy { allow }
    }

    /// Checks a URL; returns it normalised.
    ///
    /// # Errors
    /// An [`EgressError`] naming the rule that refused it.
    pub fn check(&self, url: &str) -> Result<String, EgressError> {
        let parsed = url::Url::parse(url)
            .map_err(|_| EgressError::InvalidUrl(url.chars().take(200).collect()))?;
        let scheme = parsed.scheme();
        if scheme != "http" && scheme != "https" {
            return Err(EgressError::Scheme(scheme.to_string()));
        }
        let host = match parsed.host() {
            Some(url::Host::Domain(d)) => d.to_ascii_lowercase(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(EgressError::InvalidUrl(url.chars().take(200).collect())),
        };
        let port = parsed.port_or_known_default().unwrap_or(0);
        let allowed = self
            .allow
            .iter()
            .any(|(h, p)| *h == host && p.is_none_or(|p| p == port));
        if allowed {
            return Ok(parsed.to_string());
        }
        if internal_host(parsed.host()) {
            return Err(EgressError::PrivateAddress(host));
        }
        if parsed
            .port()
            .is_some_and(|p| Some(p) != default_port(scheme))
        {
            return Err(EgressError::Port(port));
        }
        Ok(parsed.to_string())
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

fn internal_host(host: Option<url::Host<&str>>) -> bool {
    match host {
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost"
                || [".localhost", ".local", ".internal"]
                    .iter()
                    .any(|s| d.ends_with(s))
        }
        Some(url::Host::Ipv4(ip)) => internal_v4(ip),
        Some(url::Host::Ipv6(ip)) => internal_v6(ip),
        None => true,
    }
}

fn internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || a == 0
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || a >= 240
}

fn internal_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return internal_v4(v4);
    }
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local
        || (first & 0xffc0) == 0xfe80 // link local
}

/// Whether `ip` is internal by the rules above (for hosts that resolve names themselves).
pub fn is_internal_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => internal_v6(v6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_table() {
        let policy = EgressPolicy::from_allowlist("127.0.0.1:8123, api.internal ,[::1]:9000");
        let cases: &[(&str, Result<(), &str>)] = &[
            ("https://example.com/x", Ok(())),
            ("http://example.com:80/", Ok(())),
            ("https://example.com:8443/", Err("port 8443")),
            ("ftp://example.com/", Err("scheme \"ftp\"")),
            ("file:///etc/passwd", Err("scheme \"file\"")),
            ("http://127.0.0.1:8123/data", Ok(())),
            ("http://127.0.0.1:8124/data", Err("127.0.0.1 is a private")),
            ("http://localhost/", Err("localhost is a private")),
            ("http://10.1.2.3/", Err("10.1.2.3 is a private")),
            ("http://192.168.1.1/", Err("private")),
            ("http://172.16.0.1/", Err("private")),
            (
                "http://169.254.169.254/latest/meta-data",
                Err("169.254.169.254 is a private"),
            ),
            ("http://100.64.0.1/", Err("private")),
            ("http://0.0.0.0/", Err("private")),
            ("http://[::1]/", Err("private")),
            ("http://[::1]:9000/", Ok(())),
            ("http://[fe80::1]/", Err("private")),
            ("http://[fd00::1]/", Err("private")),
            ("http://[::ffff:10.0.0.1]/", Err("private")),
            ("http://2130706433/", Err("127.0.0.1 is a private")), // decimal IPv4 form
            ("http://0x7f.1/", Err("127.0.0.1 is a private")),
            ("http://api.internal:7000/", Ok(())),
            ("http://db.internal/", Err("db.internal is a private")),
            ("not a url", Err("invalid url")),
        ];
        for (url, want) in cases {
            let got = policy.check(url);
            match (want, &got) {
                (Ok(()), Ok(_)) => {}
                (Err(fragment), Err(e)) => assert!(e.to_string().contains(fragment), "{url}: {e}"),
                _ => panic!("{url}: want {want:?}, got {got:?}"),
            }
        }
    }
}
