//! A pool of nodes pulling at once from a registry that rate-limits, as a pool booting together
//! meets it: `429 Too Many Requests` with `Retry-After`, and `503` now and then. Every node lands
//! its target, and none asks again sooner than it was told to.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::*;
use pivot_testkit::{
    write_auth_json, Fault, FaultKind, FaultProxy, ImageSpec, PushedImage, Registry, TokenServer,
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

    // No request for a path came sooner than the 429 before it allowed.
    let log = proxy.requests();
    let mut told = 0;
    for (i, refused) in log.iter().enumerate() {
        let Some(FaultKind::Status {
            code: 429,
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
            "{} asked again after {waited:?}, told Retry-After: {seconds}",
            refused.path
        );
    }
    assert_eq!(told, 14);
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
