//! Proxies from the environment (`HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`, lower-case too), through
//! a real forward proxy: Debian's `tinyproxy`, whose log shows what it carried. Registries,
//! token services and lookasides all go through it; a dead proxy is named as the fault.

use crate::common::*;
use crate::network::TokenEnv;
use pivot_testkit::{Registry, TestCa, Tinyproxy};

const SECRET: &str = "proxied-secret";

#[test]
fn registry_token_service_and_lookaside_requests_go_through_the_proxy() {
    let proxy = Tinyproxy::start().unwrap();

    // A registry and a signature lookaside, both plain HTTP.
    let env = Env::new();
    let v2 = env.push_v2();
    let signed = crate::signatures::signed_over_http(&env, &v2);
    let mut args: Vec<&str> = signed.args.iter().map(String::as_str).collect();
    args.push(&v2.by_tag);
    assert_success(&env.pivot_with_env(&[("HTTP_PROXY", &proxy.url())], &args));
    assert_eq!(env.deployed_images()[0], v2.commit);
    let registry = proxy.requests_to(&env.registry.host());
    for path in ["/manifests/v2", &format!("/blobs/{}", v2.layer_digests[0])] {
        assert!(
            registry
                .iter()
                .any(|r| r.starts_with("GET http://") && r.contains(path)),
            "no {path} through the proxy: {registry:#?}"
        );
    }
    assert!(
        proxy
            .requests_to(&signed.host)
            .iter()
            .any(|r| r.contains("/signature-1")),
        "the lookaside was not read through the proxy:\n{}",
        proxy.log()
    );

    // A registry whose token service is another host.
    let TokenEnv {
        tokens,
        env,
        v2,
        auth,
    } = TokenEnv::new(SECRET);
    let out = env.pivot_with_env(
        &[("HTTP_PROXY", &proxy.url())],
        &["--authfile", auth.to_str().unwrap(), &v2.by_tag],
    );
    assert_success(&out);
    assert!(
        !proxy.requests_to(&tokens.host()).is_empty(),
        "the token request did not go through the proxy:\n{}",
        proxy.log()
    );
}

#[test]
fn a_tls_registry_is_reached_through_connect_with_a_lower_case_https_proxy() {
    let ca = TestCa::new("pivot test CA").unwrap();
    let registry = Registry::builder().tls(&ca).unwrap().start().unwrap();
    let env = Env::with_registry(registry);
    let v2 = env.push_v2();
    let certs = ca
        .write_certs_d(&env.dir().join("certs.d"), &env.registry.host())
        .unwrap();
    let proxy = Tinyproxy::start().unwrap();

    let out = env.pivot_with_env(
        &[("https_proxy", &proxy.url())],
        &["--cert-dir", certs.to_str().unwrap(), &v2.by_tag],
    );
    assert_success(&out);
    assert_eq!(env.deployed_images()[0], v2.commit);
    let carried = proxy.requests_to(&env.registry.host());
    assert!(
        carried.iter().any(|r| r.starts_with("CONNECT ")),
        "no CONNECT tunnel to the registry: {carried:#?}"
    );
}

#[test]
fn hosts_in_no_proxy_are_reached_directly() {
    let env = Env::new();
    let v2 = env.push_v2();
    let proxy = Tinyproxy::start().unwrap();
    let out = env.pivot_with_env(
        &[
            ("HTTP_PROXY", &proxy.url()),
            ("NO_PROXY", "example.com,127.0.0.1"),
        ],
        &[&v2.by_tag],
    );
    assert_success(&out);
    assert_eq!(env.deployed_images()[0], v2.commit);
    assert_eq!(
        proxy.requests_to(&env.registry.host()),
        Vec::<String>::new()
    );
}

#[test]
fn a_dead_proxy_is_named_as_the_fault_without_its_credentials() {
    let env = Env::new();
    let v2 = env.push_v2();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let before = env.sysroot.snapshot().unwrap();
    let out = env.pivot_with_env(
        &[(
            "HTTP_PROXY",
            &format!("http://admin:{SECRET}@127.0.0.1:{port}"),
        )],
        &["--retry-timeout", "1", &v2.by_tag],
    );
    assert_fails_with(
        &out,
        &[&format!(
            "through the proxy http://127.0.0.1:{port} (from the environment) for 127.0.0.1"
        )],
    );
    assert!(!stderr(&out).contains(SECRET), "{}", stderr(&out));
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
}
