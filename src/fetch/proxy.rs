//! Proxies: every request pivot makes (registries, token services, lookasides) goes through the
//! proxy the environment names, as curl and the containers tools read it: `HTTPS_PROXY` for
//! `https://` URLs, `HTTP_PROXY` for `http://` ones (`ALL_PROXY` for both), lower-case
//! spellings too, and `NO_PROXY` (host names, domain suffixes, IP addresses and CIDR ranges, `*`)
//! for hosts reached directly. reqwest applies those rules itself; this module asks the very
//! same matcher (hyper-util's, which reqwest uses) which proxy a failed request went through, so
//! that a proxy that is down or refuses is reported as the proxy's fault, by its address and
//! without the credentials its URL may carry.

use hyper_util::client::proxy::matcher::Matcher;

/// The proxy requests to `url` go through, as `scheme://host:port` (no credentials), if any.
pub fn for_url(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let proxy = Matcher::from_env().intercept(&uri)?;
    Some(without_credentials(&proxy.uri().to_string()))
}

/// `url` with any `user:password@` removed.
fn without_credentials(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("http", url));
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let path = if path == "/" { "" } else { path };
    format!("{scheme}://{host}{path}")
}

/// How a request that could not connect failed, when it went through a proxy: the proxy is
/// named (a dead proxy otherwise reads like a dead registry).
pub fn connect_failure(e: &reqwest::Error) -> Option<String> {
    if !e.is_connect() {
        return None;
    }
    let url = e.url()?;
    let proxy = for_url(url.as_str())?;
    let host = url.host_str().unwrap_or_default();
    Some(format!("through the proxy {proxy} (from the environment) for {host}"))
}

#[cfg(test)]
mod tests {
    use super::without_credentials;

    #[test]
    fn credentials_never_appear_in_a_proxy_named_in_a_message() {
        for (url, shown) in [
            ("http://user:secret@proxy.corp:3128/", "http://proxy.corp:3128"),
            ("http://proxy.corp:3128", "http://proxy.corp:3128"),
            ("https://a@b@proxy.corp", "https://proxy.corp"),
            ("proxy.corp:8080", "http://proxy.corp:8080"),
        ] {
            assert_eq!(without_credentials(url), shown, "{url}");
        }
    }
}
