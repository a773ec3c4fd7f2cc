//! A pool of nodes pulling at once from a registry that rate-limits, as a pool booting together
//! meets it: `429 Too Many Requests` with `Retry-After`, and `503` now and then, on any request
//! (the `/v2/` ping and the token service included). Every node lands its target, and none asks
//! again sooner than it was told to.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::*;
use pivot_testkit::{
    push_oscontainer, write_auth_json, Fault, FaultKind, FaultProxy, ImageSpec, ProxiedRequest,
    PushedImage, Registry, TokenServer,
};

#[test]
fn eight_pivots_at_once_wait_out_a_rate_limiting_registry() {
    let env = Env::new();
    // One image per node: every manifest and blob path is then one node's, so what the registry
    // told a node is checked against that node's own next request.
    let images: Vec<PushedImage> = (0..8)
        .map(|n| {
            let tree = fixture("os-v2").with_file(&format!("usr/share/node-{n}"), 0o644, "x\n");
            env.push(&format!("node-{n}"), &ImageSpec::new(tree, "2"))
        })
        .collect();
    let blobs: Vec<&String> = images
        .iter()
        .flat_map(|i| std::iter::once(&i.config_digest).chain(&i.layer_digests))
        .collect();
    assert_eq!(
        blobs.iter().collect::<BTreeSet<_>>().len(),
        blobs.len(),
        "the nodes' images share a blob"
    );

    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    proxy.add_fault(Fault::too_many_requests("/manifests/", Some(3)).times(6));
    proxy.add_fault(Fault::status("/manifests/", 503).times(2));
    proxy.add_fault(Fault::too_many_requests("/blobs/", Some(2)).times(8));
    proxy.add_fault(Fault::status("/blobs/", 503).times(3));

    let nodes: Vec<Env> = (0..8)
        .map(|_| {
            let mut node = Env::new();
            insecure_via(&mut node, &proxy);
            node
        })
        .collect();
    let children: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(n, node)| {
            let pullspec = format!("{}/pivot/os:node-{n}", proxy.host());
            node.spawn_pivot(&["--retry-timeout", "60", &pullspec])
        })
        .collect();
    for ((n, child), node) in children.into_iter().enumerate().zip(&nodes) {
        let out = child.wait_with_output().unwrap();
        assert_success(&out);
        assert_eq!(node.deployed_images()[0], images[n].commit, "node {n}");
    }
    assert_eq!(proxy.pending_faults(), 0, "not every fault was met");

    assert_eq!(waited_out(&proxy.requests()), 14);
}

/// Checks that no request for a path came sooner than the refusal before it allowed (its
/// `Retry-After`); returns how many refusals said when to come back. Each path must be one
/// node's for the check to mean anything.
fn waited_out(log: &[ProxiedRequest]) -> usize {
    let mut told = 0;
    for (i, refused) in log.iter().enumerate() {
        let Some(FaultKind::Status {
            code,
            retry_after: Some(seconds),
        }) = &refused.fault
        else {
            continue;
        };
        told += 1;
        let next = log[i + 1..]
            .iter()
            .find(|r| r.path == refused.path)
            .unwrap_or_else(|| panic!("{} was never asked for again", refused.path));
        let waited = next.at.duration_since(refused.at);
        assert!(
            waited >= Duration::from_secs(*seconds),
            "{} asked again after {waited:?}, told {code} with Retry-After: {seconds}",
            refused.path
        );
    }
    told
}

/// The registry's `/v2/` ping and its token service rate-limit too. Every node pings twice
/// before its first manifest (pivot, to tell TLS from plain HTTP, as the registry is insecure;
/// then oci-client, to read the token challenge) and asks the token service once: each of
/// these is refused once with `Retry-After`, and none is sent again sooner.
#[test]
fn eight_pivots_at_once_wait_out_a_rate_limited_ping_and_token_service() {
    let tokens = TokenServer::builder()
        .user("node", "secret")
        .start()
        .unwrap();
    let token_proxy = FaultProxy::start(&tokens.host()).unwrap();
    let registry = Registry::builder()
        .token_auth_through(&tokens, &token_proxy.host())
        .start()
        .unwrap();
    let env = Env::with_registry(registry);
    // One repository per node: the token requests then differ by their scope, and what the
    // token service told a node is checked against that node's own next request.
    let spec = ImageSpec::new(fixture("os-v2"), "2");
    let images: Vec<PushedImage> = (0..8)
        .map(|n| push_oscontainer(&env.registry, &format!("pivot/node-{n}"), "v2", &spec).unwrap())
        .collect();
    // The ping's path is every node's: each node reaches the registry through a proxy of its
    // own, so that what the registry told a node is checked against that node's next ping.
    let proxies: Vec<FaultProxy> = (0..8)
        .map(|_| FaultProxy::start(&env.registry.host()).unwrap())
        .collect();
    for (n, proxy) in proxies.iter().enumerate() {
        // pivot's ping is refused, then answered; oci-client's is refused, then answered.
        proxy.add_fault(Fault::too_many_requests("/v2/", Some(2)).exact());
        proxy.add_fault(Fault::pass("/v2/").exact());
        proxy.add_fault(
            Fault::new(
                "/v2/",
                FaultKind::Status {
                    code: 503,
                    retry_after: Some(2),
                },
            )
            .exact(),
        );
        token_proxy.add_fault(Fault::too_many_requests(&format!("node-{n}"), Some(2)));
    }

    let nodes: Vec<Env> = proxies
        .iter()
        .map(|proxy| {
            let mut node = Env::new();
            insecure_via(&mut node, proxy);
            let auth = node.dir().join("auth.json");
            write_auth_json(&auth, &[(&proxy.host(), "node", "secret")]).unwrap();
            node
        })
        .collect();
    let children: Vec<_> = nodes
        .iter()
        .zip(&proxies)
        .enumerate()
        .map(|(n, (node, proxy))| {
            let pullspec = format!("{}/pivot/node-{n}:v2", proxy.host());
            let auth = node.dir().join("auth.json");
            let auth = auth.to_str().unwrap();
            node.spawn_pivot(&["--retry-timeout", "60", "--authfile", auth, &pullspec])
        })
        .collect();
    for ((n, child), node) in children.into_iter().enumerate().zip(&nodes) {
        let out = child.wait_with_output().unwrap();
        assert_success(&out);
        assert_eq!(node.deployed_images()[0], images[n].commit, "node {n}");
    }
    for (n, proxy) in proxies.iter().enumerate() {
        assert_eq!(
            proxy.pending_faults(),
            0,
            "node {n}: not every fault was met"
        );
        assert_eq!(waited_out(&proxy.requests()), 2, "node {n}");
    }
    assert_eq!(
        token_proxy.pending_faults(),
        0,
        "not every token fault was met"
    );
    assert_eq!(waited_out(&token_proxy.requests()), 8);
}

/// The token service rate-limits too: its 429 is a wait, not a refusal of the credentials.
#[test]
fn a_rate_limited_token_service_is_waited_out() {
    let tokens = TokenServer::builder()
        .user("node", "secret")
        .start()
        .unwrap();
    let proxy = FaultProxy::start(&tokens.host()).unwrap();
    let registry = Registry::builder()
        .token_auth_through(&tokens, &proxy.host())
        .start()
        .unwrap();
    let env = Env::with_registry(registry);
    let v2 = env.push_v2();
    let auth = env.dir().join("auth.json");
    write_auth_json(&auth, &[(&env.registry.host(), "node", "secret")]).unwrap();
    proxy.add_fault(Fault::too_many_requests("/", Some(2)).times(2));
    // The push got its tokens through the proxy too.
    let pushed = proxy.requests().len();

    let out = env.pivot(&[
        "--retry-timeout",
        "60",
        "--authfile",
        auth.to_str().unwrap(),
        &v2.by_tag,
    ]);
    assert_success(&out);
    assert_eq!(env.deployed_images()[0], v2.commit);
    let log = proxy.requests()[pushed..].to_vec();
    assert!(log.len() >= 3, "{log:#?}");
    assert_eq!(log[0].status, Some(429));
    assert_eq!(log[1].status, Some(429));
    for pair in log[..3].windows(2) {
        let waited = pair[1].at.duration_since(pair[0].at);
        assert!(
            waited >= Duration::from_secs(2),
            "asked again after {waited:?}"
        );
    }
}

/// A pool booting together reads its target from the pullspec file at the same moment: the
/// first requests to the registry come spread over seconds, not in the same instant.
#[test]
fn a_pool_booting_together_reaches_the_registry_spread_out() {
    let env = Env::new();
    let v2 = env.push_v2();
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    let pullspec = format!("{}/pivot/os:v2", proxy.host());
    let nodes: Vec<Env> = (0..6)
        .map(|_| {
            let mut node = Env::new();
            insecure_via(&mut node, &proxy);
            let etc = node.default_etc();
            std::fs::create_dir_all(etc.join("pivot")).unwrap();
            std::fs::write(etc.join("pivot/image-pullspec"), format!("{pullspec}\n")).unwrap();
            node
        })
        .collect();
    let children: Vec<_> = nodes.iter().map(|node| node.spawn_pivot(&[])).collect();
    for (child, node) in children.into_iter().zip(&nodes) {
        assert_success(&child.wait_with_output().unwrap());
        assert_eq!(node.deployed_images()[0], v2.commit);
    }
    let firsts: Vec<std::time::Instant> = proxy
        .requests()
        .iter()
        .filter(|r| r.path.contains("/manifests/"))
        .map(|r| r.at)
        .collect();
    assert_eq!(firsts.len(), 6, "one manifest request a node");
    let (earliest, latest) = (firsts.iter().min().unwrap(), firsts.iter().max().unwrap());
    // Spread uniformly over 5 s, six nodes all land within 0.5 s with a chance of about 1 in 20,000.
    assert!(
        latest.duration_since(*earliest) > Duration::from_millis(500),
        "the pool reached the registry within {:?}",
        latest.duration_since(*earliest)
    );
}

/// A pull token that expires mid-pull is renewed by oci-client before its next blob request (it
/// knows the token's `exp`), pinging `/v2/` first: a 429 there is waited out as well, not
/// answered by sending the blob request without a token, which the registry refuses and which
/// has pivot ask for a token, ping included, at once.
#[test]
fn a_rate_limited_ping_renewing_an_expired_token_is_waited_out() {
    let tokens = TokenServer::builder()
        .user("node", "secret")
        .lifetime(Duration::from_secs(2))
        .start()
        .unwrap();
    let registry = Registry::builder().token_auth(&tokens).start().unwrap();
    let mut env = Env::with_registry(registry);
    let v2 = env.push_v2();
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    let auth = env.dir().join("auth.json");
    write_auth_json(&auth, &[(&proxy.host(), "node", "secret")]).unwrap();
    insecure_via(&mut env, &proxy);
    // The config takes 5 s to arrive: the token has expired when the layer is asked for.
    let config = std::fs::metadata(env.registry.blob_data_path(&v2.config_digest))
        .unwrap()
        .len();
    let config_path = format!("/blobs/{}", v2.config_digest);
    proxy.add_fault(Fault::throttle(&config_path, (config / 5).max(1)));
    // pivot's ping and oci-client's are answered; the next one, renewing the token, is refused.
    proxy.add_fault(Fault::pass("/v2/").exact().times(2));
    proxy.add_fault(Fault::too_many_requests("/v2/", Some(2)).exact());

    let pullspec = format!("{}/pivot/os:v2", proxy.host());
    let out = env.pivot(&[
        "--retry-timeout",
        "60",
        "--authfile",
        auth.to_str().unwrap(),
        &pullspec,
    ]);
    assert_success(&out);
    assert_eq!(env.deployed_images()[0], v2.commit);
    assert_eq!(proxy.pending_faults(), 0, "not every fault was met");
    assert_eq!(waited_out(&proxy.requests()), 1);
}
