//! Which `Host` headers the control API answers (pure), and whether its bind address
//! may be reached from other hosts.
//!
//! A browser tab on any web site can send requests to `127.0.0.1` after a DNS rebinding
//! (the attacker's name first resolves to their server, then to loopback); the request
//! then carries the attacker's name in `Host`. Answering only the names a local client
//! uses — `localhost`, `127.0.0.1`, `[::1]` and the bound address, each with the bound
//! port — refuses such a request with 421 before any handler (and any token check) runs.
//! `control.allowed_hosts` adds names (a remote bind reached by name). A TLS proxy in
//! front must forward one of them (nginx's default `proxy_set_header Host $proxy_host`,
//! the upstream's address, does).
//!
//! What it must not do: resolve names, or read anything but the header it is given.

use std::net::SocketAddr;

/// The `Host` values one control server answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCheck {
    allowed: Vec<String>,
}

impl HostCheck {
    /// For a server bound to `bound` (the address actually bound, port included), also
    /// answering the `extra` values (`control.allowed_hosts`).
    pub fn new(bound: SocketAddr, extra: &[String]) -> Self {
        let mut check = Self::for_bound(bound);
        check.allowed.extend(extra.iter().map(|h| h.trim().to_string()).filter(|h| !h.is_empty()));
        check
    }

    /// For a server bound to `bound` (the address actually bound, port included).
    pub fn for_bound(bound: SocketAddr) -> Self {
        let port = bound.port();
        let mut allowed = vec![format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("[::1]:{port}")];
        if !bound.ip().is_unspecified() {
            let own = bound.to_string(); // `[v6]:port` or `v4:port`
            if !allowed.contains(&own) {
                allowed.push(own);
            }
        }
        Self { allowed }
    }

    /// Is a request with this `Host` header (raw bytes; `None` when absent) answered?
    /// Names compare without regard to ASCII case; a trailing dot is not accepted.
    pub fn admits(&self, host: Option<&[u8]>) -> bool {
        let Some(host) = host.and_then(|h| std::str::from_utf8(h).ok()) else { return false };
        self.allowed.iter().any(|a| a.eq_ignore_ascii_case(host.trim()))
    }

    /// The error body of a refused request (names what is accepted, not what was sent).
    pub fn refusal(&self) -> String {
        format!(
            "this Host is not served (DNS rebinding protection): use http://{}/ (accepted Host values: {})",
            self.allowed[1],
            self.allowed.join(", ")
        )
    }
}

/// Why a bind address is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "control.bind {0}: not a loopback address, so the control API and its bearer token (sent in clear text) \
     would be reachable from other hosts; bind 127.0.0.1 or [::1], or set control.allow_remote = true behind \
     a TLS proxy"
)]
pub struct RemoteBindRefused(pub SocketAddr);

/// A loopback bind is always allowed; any other only with `control.allow_remote`.
pub fn check_bind(bind: SocketAddr, allow_remote: bool) -> Result<(), RemoteBindRefused> {
    if bind.ip().is_loopback() || allow_remote {
        Ok(())
    } else {
        Err(RemoteBindRefused(bind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_names_with_the_bound_port_are_admitted() {
        let check = HostCheck::for_bound("127.0.0.1:7433".parse().unwrap());
        for host in ["127.0.0.1:7433", "localhost:7433", "LOCALHOST:7433", "[::1]:7433"] {
            assert!(check.admits(Some(host.as_bytes())), "{host}");
        }
    }

    #[test]
    fn a_rebound_name_another_port_or_no_host_is_refused() {
        let check = HostCheck::for_bound("127.0.0.1:7433".parse().unwrap());
        for host in
            ["evil.example:7433", "evil.example", "127.0.0.1", "127.0.0.1:80", "localhost.:7433", "127.0.0.1:7433@x"]
        {
            assert!(!check.admits(Some(host.as_bytes())), "{host}");
        }
        assert!(!check.admits(None));
        assert!(!check.admits(Some(b"\xff:7433")));
        assert!(check.refusal().contains("127.0.0.1:7433"));
    }

    #[test]
    fn a_specific_remote_bind_admits_its_own_address() {
        let check = HostCheck::for_bound("10.1.2.3:7433".parse().unwrap());
        assert!(check.admits(Some(b"10.1.2.3:7433")));
        assert!(!check.admits(Some(b"10.1.2.4:7433")));
    }

    #[test]
    fn configured_names_are_admitted_too() {
        let check = HostCheck::new("0.0.0.0:7433".parse().unwrap(), &["shepherd.internal:7433".into()]);
        assert!(check.admits(Some(b"shepherd.internal:7433")));
        assert!(check.admits(Some(b"127.0.0.1:7433")));
        assert!(!check.admits(Some(b"0.0.0.0:7433")));
        assert!(!check.admits(Some(b"other.internal:7433")));
    }

    #[test]
    fn a_non_loopback_bind_needs_allow_remote() {
        let any: SocketAddr = "0.0.0.0:7433".parse().unwrap();
        assert_eq!(check_bind(any, false), Err(RemoteBindRefused(any)));
        assert_eq!(check_bind(any, true), Ok(()));
        assert_eq!(check_bind("[::1]:7433".parse().unwrap(), false), Ok(()));
        assert!(RemoteBindRefused(any).to_string().contains("control.allow_remote = true"));
    }
}
