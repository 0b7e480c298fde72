//! Where the remote engine is, and whether Hillside may talk to it there.

use std::net::IpAddr;

/// A remote engine's address, checked: HTTPS anywhere, plain HTTP only to this machine unless
/// the user allowed it (a key and every document would cross the network in the clear).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The OpenAI API's root, ending in `/v1`.
    pub api: String,
    /// The server's root (llama.cpp and vLLM keep `/tokenize` and `/props` there).
    pub root: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EndpointError {
    #[error("'{0}' is not an http:// or https:// URL")]
    NotHttp(String),
    #[error("'{0}' has no host")]
    NoHost(String),
    #[error("{0} is plain HTTP to another machine: documents and the API key would cross the network unencrypted. Use https://, or allow it with --allow-insecure-remote (allow_insecure = true under [remote] in the config file)")]
    Insecure(String),
    #[error("'{0}' carries a query, a fragment or credentials; give the key as the API key setting instead")]
    Extra(String),
}

impl Endpoint {
    /// Parses `url`, the API's root with or without its `/v1` (`http://127.0.0.1:8080`,
    /// `https://gpu.example/v1`).
    pub fn parse(url: &str, allow_insecure: bool) -> Result<Self, EndpointError> {
        let url = url.trim().trim_end_matches('/');
        let (scheme, rest) = url.split_once("://").ok_or_else(|| EndpointError::NotHttp(url.into()))?;
        let secure = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" => false,
            _ => return Err(EndpointError::NotHttp(url.into())),
        };
        if rest.contains(['?', '#', '@']) {
            return Err(EndpointError::Extra(url.into()));
        }
        let authority = rest.split('/').next().unwrap_or("");
        let host = host_of(authority);
        if host.is_empty() {
            return Err(EndpointError::NoHost(url.into()));
        }
        if !secure && !allow_insecure && !is_loopback(host) {
            return Err(EndpointError::Insecure(url.into()));
        }
        let (root, api) = match url.strip_suffix("/v1") {
            Some(root) => (root.to_string(), url.to_string()),
            None => (url.to_string(), format!("{url}/v1")),
        };
        Ok(Self { api, root })
    }
}

/// The host of `host[:port]` or `[v6]:port`.
fn host_of(authority: &str) -> &str {
    match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => authority.rsplit_once(':').map_or(authority, |(host, _)| host),
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_is_for_this_machine_unless_allowed() {
        let local = Endpoint::parse("http://127.0.0.1:8080/", false).unwrap();
        assert_eq!(local, Endpoint { api: "http://127.0.0.1:8080/v1".into(), root: "http://127.0.0.1:8080".into() });
        assert_eq!(Endpoint::parse("http://[::1]:8000/v1", false).unwrap().root, "http://[::1]:8000");
        assert!(Endpoint::parse("http://localhost/v1", false).is_ok());
        assert!(matches!(Endpoint::parse("http://10.0.0.5:8000/v1", false), Err(EndpointError::Insecure(_))));
        assert!(matches!(Endpoint::parse("http://127.0.0.1.evil.example/v1", false), Err(EndpointError::Insecure(_))));
        assert!(Endpoint::parse("http://10.0.0.5:8000/v1", true).is_ok());
        assert_eq!(Endpoint::parse("https://gpu.example/v1", false).unwrap().api, "https://gpu.example/v1");
        assert!(matches!(Endpoint::parse("ftp://gpu.example", false), Err(EndpointError::NotHttp(_))));
        assert!(matches!(Endpoint::parse("https://user:key@gpu.example", false), Err(EndpointError::Extra(_))));
        assert!(matches!(Endpoint::parse("https:///v1", false), Err(EndpointError::NoHost(_))));
    }
}
