//! Requests from this machine must be addressed to it. A page on any web site can point its own
//! host name at 127.0.0.1 (DNS rebinding) and then read this API's answers as its own origin:
//! the browser connects over loopback but sends the site's name in `Host`. So a request whose
//! peer is loopback must name a loopback host (`localhost`, a name under `.localhost`,
//! `127.x.x.x` or `[::1]`, any port), or none. Requests from other machines reach the server
//! only when it was bound beyond loopback on purpose; the API key is what guards those.

use crate::error::ApiError;
use axum::extract::{ConnectInfo, Request};
use axum::http::header::HOST;
use axum::middleware::Next;
use axum::response::Response;
use std::net::{IpAddr, SocketAddr};

pub async fn require_local_host(req: Request, next: Next) -> Result<Response, ApiError> {
    let from_loopback = req.extensions().get::<ConnectInfo<SocketAddr>>().is_some_and(|peer| is_loopback(peer.0.ip()));
    let named =
        req.headers().get(HOST).map(|h| h.to_str().unwrap_or("")).or_else(|| req.uri().authority().map(|a| a.as_str()));
    match named {
        Some(host) if from_loopback && !names_loopback(host) => Err(ApiError::foreign_host(host)),
        _ => Ok(next.run(req).await),
    }
}

/// Whether a peer is this machine. A server bound to `::` sees IPv4 clients as IPv4-mapped IPv6
/// addresses (`::ffff:127.0.0.1`), which `is_loopback` alone does not count.
fn is_loopback(peer: IpAddr) -> bool {
    peer.to_canonical().is_loopback()
}

/// Whether `host` (a `Host` header: a name or address, perhaps with a port) names this machine
/// over loopback.
fn names_loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    let name = name.to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::{is_loopback, names_loopback};
    use std::net::IpAddr;

    #[test]
    fn ipv4_clients_of_a_dual_stack_server_are_loopback_peers() {
        for peer in ["127.0.0.1", "::1", "::ffff:127.0.0.1", "::ffff:127.8.0.1"] {
            assert!(is_loopback(peer.parse::<IpAddr>().unwrap()), "{peer}");
        }
        for peer in ["192.168.1.5", "::ffff:192.168.1.5", "fe80::1"] {
            assert!(!is_loopback(peer.parse::<IpAddr>().unwrap()), "{peer}");
        }
    }

    #[test]
    fn loopback_names_and_addresses_pass_and_others_do_not() {
        for host in [
            "localhost",
            "localhost:8080",
            "LocalHost:1",
            "app.localhost:3000",
            "127.0.0.1",
            "127.0.0.1:11434",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(names_loopback(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "192.168.1.5:8080",
            "[::2]:80",
            "",
            "127.0.0.1.evil.example",
        ] {
            assert!(!names_loopback(host), "{host}");
        }
    }
}
