//! What a cell's network may reach: `none` (a network namespace with loopback only), an allow
//! list (the namespace's only way out is the runner's proxy, which asks [`AllowList::check_host`]
//! and [`AllowList::check_address`] before every connection), or `open` (the runner's own
//! network).
//!
//! Allow-list entries ([`AllowList::parse`]):
//! * `example.com`: that host name, any port; `example.com:443`: that port only.
//! * `*.example.com`: every name below `example.com` (not `example.com` itself).
//! * `203.0.113.7`, `[2001:db8::1]`, `10.0.0.0/8`, `fd00::/8` (optionally `:port` after a
//!   single address): addresses a name may resolve to or a client may name directly.
//!
//! A name on the list is resolved by the proxy, and every address it resolves to must be public
//! or itself on the list, so a listed name that resolves (or is rebound) to a private address is
//! refused; the proxy connects to the address it checked, never resolving again. A client that
//! names an address (an IP literal) needs that address on the list, public or not.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Most allow-list entries a definition may carry.
pub const MAX_ALLOW_ENTRIES: usize = 256;
/// Longest allow-list entry, in bytes.
pub const MAX_ALLOW_ENTRY_BYTES: usize = 253 + 6;

/// The `allow` list a `folder-template` environment on a cloud runner gets when its definition
/// names no `network`: package registries and git hosts (docs/security.md lists it; a
/// definition's `network` replaces it).
pub const DEFAULT_ALLOW: &[&str] = &[
    // npm, Yarn
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    // PyPI
    "pypi.org",
    "files.pythonhosted.org",
    // crates.io
    "crates.io",
    "index.crates.io",
    "static.crates.io",
    // Go modules
    "proxy.golang.org",
    "sum.golang.org",
    // RubyGems, Maven Central
    "rubygems.org",
    "repo.maven.apache.org",
    "repo1.maven.org",
    // Git hosts
    "github.com",
    "codeload.github.com",
    "objects.githubusercontent.com",
    "raw.githubusercontent.com",
    "gitlab.com",
    "bitbucket.org",
];

/// A cell's network, as a definition names it: `"none"`, `"open"` or `{"allow": [...]}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// A network namespace with loopback only.
    None,
    /// The runner's own network, unfiltered.
    Open,
    /// Only through the runner's proxy, to the hosts listed (see the module docs).
    Allow(Vec<String>),
}

impl Network {
    /// The network a cell gets when its definition names none: `open` for a person's own
    /// machine (a `local` runner, or any `local` environment), the [`DEFAULT_ALLOW`] list for
    /// everything a cloud runner copies per session (`folder-template`, `worktree`).
    pub fn default_for(cloud_runner: bool, local_environment: bool) -> Network {
        if cloud_runner && !local_environment {
            Network::Allow(DEFAULT_ALLOW.iter().map(|h| h.to_string()).collect())
        } else {
            Network::Open
        }
    }

    /// `none`, `open` or `allow (N hosts)`, for transcripts and logs.
    pub fn describe(&self) -> String {
        match self {
            Network::None => String::from("none"),
            Network::Open => String::from("open"),
            Network::Allow(list) => format!(
                "allow ({} entr{})",
                list.len(),
                if list.len() == 1 { "y" } else { "ies" }
            ),
        }
    }

    /// Checks the entries of an `allow` list.
    ///
    /// # Errors
    /// A message for a 400 naming the first bad entry.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Network::Allow(list) => AllowList::parse(list).map(|_| ()),
            Network::None | Network::Open => Ok(()),
        }
    }
}

/// One parsed allow-list entry.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Entry {
    /// A host name (lowercase, no trailing dot).
    Name { name: String, port: Option<u16> },
    /// Every name strictly below this suffix.
    Below { suffix: String, port: Option<u16> },
    /// An address range (a single address is a full-length prefix).
    Range {
        base: IpAddr,
        prefix: u8,
        port: Option<u16>,
    },
}

/// A parsed allow list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

/// Why the proxy refused a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The name (or name and port) is not on the list.
    NotListed,
    /// The client named an address that is not on the list.
    AddressNotListed,
    /// A listed name resolved to a private, loopback or link-local address that is not on the
    /// list (DNS rebinding, or an internal name).
    ResolvesToPrivate(IpAddr),
    /// The name did not resolve.
    Unresolved,
    /// Not a host name or address at all.
    BadHost,
}

impl Refusal {
    /// The words in parentheses of the blocked line.
    pub fn reason(&self) -> String {
        match self {
            Refusal::NotListed => String::from("not in allow list"),
            Refusal::AddressNotListed => String::from("an IP address not in allow list"),
            Refusal::ResolvesToPrivate(ip) => {
                format!("resolves to {ip}, a private address not in allow list")
            }
            Refusal::Unresolved => String::from("the name does not resolve"),
            Refusal::BadHost => String::from("not a host name"),
        }
    }
}

/// What the proxy does with a requested host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostDecision {
    /// A listed name: resolve it, then check every address with [`AllowList::check_address`].
    Resolve,
    /// A listed address: connect to it.
    Connect(IpAddr),
    /// Refuse.
    Refuse(Refusal),
}

/// The line a cell's `bash` output ends with for each refused connection:
/// `wuhu: blocked connect to evil.example:443 (not in allow list)`.
pub fn blocked_line(host: &str, port: u16, refusal: &Refusal) -> String {
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    format!(
        "wuhu: blocked connect to {host}:{port} ({})",
        refusal.reason()
    )
}

impl AllowList {
    /// Parses allow-list entries (case-insensitive; see the module docs).
    ///
    /// # Errors
    /// A message naming the first entry that is not a host name, `*.suffix`, address or range.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, String> {
        if entries.len() > MAX_ALLOW_ENTRIES {
            return Err(format!(
                "network allow lists at most {MAX_ALLOW_ENTRIES} entries"
            ));
        }
        let mut parsed = Vec::with_capacity(entries.len());
        for raw in entries {
            let raw = raw.as_ref();
            let bad = |why: &str| format!("network allow entry {raw:?} {why}");
            if raw.is_empty() || raw.len() > MAX_ALLOW_ENTRY_BYTES {
                return Err(bad(&format!("must be 1 to {MAX_ALLOW_ENTRY_BYTES} bytes")));
            }
            parsed.push(parse_entry(&raw.to_ascii_lowercase()).map_err(|why| bad(&why))?);
        }
        Ok(AllowList { entries: parsed })
    }

    /// What to do with a connection the client asked for by `host` (a name or an address
    /// literal, IPv6 with or without brackets) and `port`.
    pub fn check_host(&self, host: &str, port: u16) -> HostDecision {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return if self.lists_address(ip, port) {
                HostDecision::Connect(ip)
            } else {
                HostDecision::Refuse(Refusal::AddressNotListed)
            };
        }
        if !is_host_name(bare) {
            return HostDecision::Refuse(Refusal::BadHost);
        }
        let listed = self.entries.iter().any(|entry| match entry {
            Entry::Name { name, port: p } => name == bare && p.is_none_or(|p| p == port),
            Entry::Below { suffix, port: p } => {
                bare.len() > suffix.len() + 1
                    && bare.ends_with(suffix.as_str())
                    && bare.as_bytes()[bare.len() - suffix.len() - 1] == b'.'
                    && p.is_none_or(|p| p == port)
            }
            Entry::Range { .. } => false,
        });
        if listed {
            HostDecision::Resolve
        } else {
            HostDecision::Refuse(Refusal::NotListed)
        }
    }

    /// Whether the proxy may connect to `ip`, one of the addresses a listed name resolved to:
    /// public addresses may, private ones only when listed.
    ///
    /// # Errors
    /// [`Refusal::ResolvesToPrivate`].
    pub fn check_address(&self, ip: IpAddr, port: u16) -> Result<(), Refusal> {
        if is_private(ip) && !self.lists_address(ip, port) {
            Err(Refusal::ResolvesToPrivate(ip))
        } else {
            Ok(())
        }
    }

    fn lists_address(&self, ip: IpAddr, port: u16) -> bool {
        self.entries.iter().any(|entry| match entry {
            Entry::Range {
                base,
                prefix,
                port: p,
            } => in_range(ip, *base, *prefix) && p.is_none_or(|p| p == port),
            _ => false,
        })
    }
}

fn parse_entry(entry: &str) -> Result<Entry, String> {
    // `a.b.c.d/N`, `v6/N`
    if let Some((base, prefix)) = entry.split_once('/') {
        let base: IpAddr = base
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| String::from("is not an address range like 10.0.0.0/8"))?;
        let max = if base.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("has a prefix length over {max}"))?;
        return Ok(Entry::Range {
            base,
            prefix,
            port: None,
        });
    }
    // `[v6]` or `[v6]:port`
    if let Some(rest) = entry.strip_prefix('[') {
        let (addr, tail) = rest
            .split_once(']')
            .ok_or_else(|| String::from("has an unclosed ["))?;
        let base: IpAddr = addr
            .parse()
            .map_err(|_| String::from("is not an IPv6 address"))?;
        let port = match tail {
            "" => None,
            tail => Some(parse_port(tail.strip_prefix(':').unwrap_or("x"))?),
        };
        return Ok(Entry::Range {
            base,
            prefix: 128,
            port,
        });
    }
    if let Ok(ip) = entry.parse::<IpAddr>() {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        return Ok(Entry::Range {
            base: ip,
            prefix,
            port: None,
        });
    }
    let (host, port) = match entry.rsplit_once(':') {
        Some((host, port)) => (host, Some(parse_port(port)?)),
        None => (entry, None),
    };
    if let Ok(ip) = host.parse::<std::net::Ipv4Addr>() {
        return Ok(Entry::Range {
            base: IpAddr::V4(ip),
            prefix: 32,
            port,
        });
    }
    let host = host.trim_end_matches('.');
    if let Some(suffix) = host.strip_prefix("*.") {
        if !is_host_name(suffix) || !suffix.contains('.') {
            return Err(String::from(
                "must name a domain with a dot below the * (like *.example.com)",
            ));
        }
        return Ok(Entry::Below {
            suffix: suffix.to_string(),
            port,
        });
    }
    if !is_host_name(host) {
        return Err(String::from(
            "is not a host name, *.domain, address or address range",
        ));
    }
    Ok(Entry::Name {
        name: host.to_string(),
        port,
    })
}

fn parse_port(text: &str) -> Result<u16, String> {
    text.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| String::from("has a port that is not 1-65535"))
}

/// Letters, digits, `-` and `_` in dot-separated labels of 1-63 bytes, 253 bytes at most.
fn is_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn in_range(ip: IpAddr, base: IpAddr, prefix: u8) -> bool {
    match (canonical(ip), canonical(base)) {
        (IpAddr::V4(ip), IpAddr::V4(base)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(base) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(base)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(base) & mask
        }
        _ => false,
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether the proxy treats `ip` as private: [`crate::egress::is_internal_ip`], plus IPv6
/// addresses that carry an IPv4 address (IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96`,
/// 6to4 `2002::/16`, Teredo `2001::/32`) whose IPv4 address is, and site-local `fec0::/10`.
pub fn is_private(ip: IpAddr) -> bool {
    if crate::egress::is_internal_ip(ip) {
        return true;
    }
    let IpAddr::V6(v6) = ip else {
        return false;
    };
    let bits = u128::from(v6);
    let seg = v6.segments();
    let embedded_v4 = |v4: u32| crate::egress::is_internal_ip(IpAddr::V4(v4.into()));
    (seg[0] & 0xffc0) == 0xfec0
        || (bits >> 32 == 0 && embedded_v4(bits as u32))
        || (bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 && embedded_v4(bits as u32))
        || (seg[0] == 0x2002 && embedded_v4((bits >> 80) as u32))
        // Teredo: the client's address is stored inverted in the last 32 bits.
        || (seg[0] == 0x2001 && seg[1] == 0 && embedded_v4(!(bits as u32)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(entries).unwrap()
    }

    #[test]
    fn hosts_by_the_list() {
        let allow = list(&[
            "github.com",
            "*.npmjs.org",
            "registry.example:8443",
            "127.0.0.1:4873",
            "10.1.0.0/16",
            "[::1]:9000",
        ]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cases: &[(&str, u16, HostDecision)] = &[
            ("github.com", 443, HostDecision::Resolve),
            ("GitHub.com.", 22, HostDecision::Resolve),
            (
                "api.github.com",
                443,
                HostDecision::Refuse(Refusal::NotListed),
            ),
            ("registry.npmjs.org", 443, HostDecision::Resolve),
            ("a.b.npmjs.org", 80, HostDecision::Resolve),
            // The suffix itself is not below itself, and a look-alike is not below it.
            ("npmjs.org", 443, HostDecision::Refuse(Refusal::NotListed)),
            (
                "evilnpmjs.org",
                443,
                HostDecision::Refuse(Refusal::NotListed),
            ),
            ("registry.example", 8443, HostDecision::Resolve),
            (
                "registry.example",
                443,
                HostDecision::Refuse(Refusal::NotListed),
            ),
            (
                "evil.example",
                443,
                HostDecision::Refuse(Refusal::NotListed),
            ),
            // Addresses need to be listed, public or private.
            ("127.0.0.1", 4873, HostDecision::Connect(ip("127.0.0.1"))),
            (
                "127.0.0.1",
                22,
                HostDecision::Refuse(Refusal::AddressNotListed),
            ),
            ("10.1.2.3", 80, HostDecision::Connect(ip("10.1.2.3"))),
            (
                "10.2.0.1",
                80,
                HostDecision::Refuse(Refusal::AddressNotListed),
            ),
            (
                "93.184.216.34",
                443,
                HostDecision::Refuse(Refusal::AddressNotListed),
            ),
            ("[::1]", 9000, HostDecision::Connect(ip("::1"))),
            ("::1", 9000, HostDecision::Connect(ip("::1"))),
            (
                "::ffff:127.0.0.1",
                4873,
                HostDecision::Connect(ip("::ffff:127.0.0.1")),
            ),
            ("", 80, HostDecision::Refuse(Refusal::BadHost)),
            ("a b", 80, HostDecision::Refuse(Refusal::BadHost)),
            ("x..y", 80, HostDecision::Refuse(Refusal::BadHost)),
        ];
        for (host, port, want) in cases {
            assert_eq!(&allow.check_host(host, *port), want, "{host}:{port}");
        }
    }

    #[test]
    fn resolved_addresses_must_be_public_unless_listed() {
        let allow = list(&["localhost", "rebind.example", "10.1.0.0/16", "[fd00::5]"]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cases: &[(&str, bool)] = &[
            ("93.184.216.34", true),
            ("2606:2800:220:1::1", true),
            ("127.0.0.1", false),
            ("10.0.0.1", false),
            ("10.1.9.9", true),
            ("192.168.1.1", false),
            ("169.254.169.254", false),
            ("100.64.0.1", false),
            ("0.0.0.0", false),
            ("::1", false),
            ("fd00::5", true),
            ("fd00::6", false),
            ("fe80::1", false),
            ("fec0::1", false),
            ("::ffff:127.0.0.1", false),
            ("::127.0.0.1", false),
            ("64:ff9b::10.0.0.1", false),
            ("64:ff9b::93.184.216.34", true),
            ("2002:0a00:0001::", false),
            ("2001:0:4136:e378:8000:63bf:f5ff:fffe", false), // Teredo for 10.0.0.1
        ];
        for (addr, ok) in cases {
            assert_eq!(allow.check_address(ip(addr), 443).is_ok(), *ok, "{addr}");
        }
    }

    #[test]
    fn bad_entries_are_refused_with_their_name() {
        for bad in [
            "",
            "*.com",
            "*",
            "a/b",
            "10.0.0.0/33",
            "[::1",
            "[::1]x",
            "h:0",
            "h:99999",
            "bad host",
            "*.*.example.com",
        ] {
            let err = AllowList::parse(&[bad]).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
        let many: Vec<String> = (0..=MAX_ALLOW_ENTRIES)
            .map(|i| format!("h{i}.example"))
            .collect();
        assert!(AllowList::parse(&many).is_err());
        assert!(AllowList::parse(DEFAULT_ALLOW).is_ok());
    }

    #[test]
    fn wire_shapes_and_defaults() {
        let cases = [
            (Network::None, r#""none""#),
            (Network::Open, r#""open""#),
            (
                Network::Allow(vec![String::from("github.com")]),
                r#"{"allow":["github.com"]}"#,
            ),
        ];
        for (network, json) in cases {
            assert_eq!(serde_json::to_string(&network).unwrap(), json);
            assert_eq!(serde_json::from_str::<Network>(json).unwrap(), network);
        }
        assert!(serde_json::from_str::<Network>(r#""closed""#).is_err());
        assert_eq!(Network::default_for(false, false), Network::Open);
        assert_eq!(Network::default_for(true, true), Network::Open);
        assert!(
            matches!(Network::default_for(true, false), Network::Allow(l) if l.len() == DEFAULT_ALLOW.len())
        );
    }

    #[test]
    fn blocked_lines() {
        assert_eq!(
            blocked_line("evil.example", 443, &Refusal::NotListed),
            "wuhu: blocked connect to evil.example:443 (not in allow list)"
        );
        assert_eq!(
            blocked_line("::1", 80, &Refusal::AddressNotListed),
            "wuhu: blocked connect to [::1]:80 (an IP address not in allow list)"
        );
        assert_eq!(
            blocked_line(
                "localhost",
                8080,
                &Refusal::ResolvesToPrivate("127.0.0.1".parse().unwrap())
            ),
            "wuhu: blocked connect to localhost:8080 (resolves to 127.0.0.1, a private address not in allow list)"
        );
    }
}
