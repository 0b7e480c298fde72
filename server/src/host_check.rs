//! Every request must be addressed to this server. A page on any web site can point its own host
//! name at this machine (DNS rebinding: at 127.0.0.1, or at the address a server bound beyond
//! loopback listens on) and then read this API's answers as its own origin: the browser connects
//! to us but sends the site's name in `Host`. So whoever the peer is, `Host` must be a loopback
//! name (`localhost`, a name under `.localhost`, `127.x.x.x`, `[::1]`), the address the
//! connection came in on, or a name the user listed (`--allowed-host`); any port. A request with
//! no `Host` at all is refused too: the check fails closed.

use crate::error::ApiError;
use crate::App;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::HOST;
use axum::middleware::Next;
use axum::response::Response;
use axum::serve::IncomingStream;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// Both ends of a connection: the address the client reached (which `Host` may name) and the
/// client's.
#[derive(Debug, Clone, Copy)]
pub struct Connection {
    pub local: Option<SocketAddr>,
    pub peer: SocketAddr,
}

impl axum::extract::connect_info::Connected<IncomingStream<'_, tokio::net::TcpListener>> for Connection {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Self { local: stream.io().local_addr().ok(), peer: *stream.remote_addr() }
    }
}

pub async fn require_own_host(State(app): State<Arc<App>>, req: Request, next: Next) -> Result<Response, ApiError> {
    let connection = req.extensions().get::<ConnectInfo<Connection>>().map(|c| c.0);
    let local = connection.and_then(|c| c.local).map(|a| a.ip());
    let named =
        req.headers().get(HOST).map(|h| h.to_str().unwrap_or("")).or_else(|| req.uri().authority().map(|a| a.as_str()));
    match named {
        Some(host) if names_this_server(host, local, &app.config.allowed_hosts) => Ok(next.run(req).await),
        refused => {
            let host = refused.unwrap_or("(none)");
            tracing::warn!(host, peer = ?connection.map(|c| c.peer), "refused a request addressed to another host");
            Err(ApiError::foreign_host(host))
        }
    }
}

/// Whether `host` (a `Host` header: a name or address, perhaps with a port) names this server:
/// over loopback, as the address `local` the connection came in on, or as one of `listed`.
fn names_this_server(host: &str, local: Option<IpAddr>, listed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
    };
    let name = name.to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    match name.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || local.is_some_and(|l| l.to_canonical() == ip.to_canonical()),
        Err(_) => !name.is_empty() && listed.iter().any(|l| l.eq_ignore_ascii_case(&name)),
    }
}

#[cfg(test)]
mod tests {
    use super::names_this_server;
    use std::net::IpAddr;

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
            assert!(names_this_server(host, None, &[]), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "192.168.1.5:8080",
            "[::2]:80",
            "",
            ":8080",
            "127.0.0.1.evil.example",
        ] {
            assert!(!names_this_server(host, None, &[]), "{host}");
        }
    }

    #[test]
    fn the_address_a_connection_came_in_on_and_listed_names_pass() {
        let lan: IpAddr = "192.168.1.5".parse().unwrap();
        assert!(names_this_server("192.168.1.5:8080", Some(lan), &[]));
        // A dual-stack listener sees the IPv4 address it was reached on as IPv4-mapped IPv6.
        assert!(names_this_server("192.168.1.5", Some("::ffff:192.168.1.5".parse().unwrap()), &[]));
        assert!(!names_this_server("192.168.1.6:8080", Some(lan), &[]));
        // A rebinding page sends its own name, whatever address it made the browser connect to.
        assert!(!names_this_server("evil.example:8080", Some(lan), &[]));
        let listed = ["studio.lan".to_string()];
        assert!(names_this_server("Studio.LAN:8080", Some(lan), &listed));
        assert!(!names_this_server("studio.lan.evil.example", Some(lan), &listed));
    }
}
