//! Real-world registries: authentication, TLS with a private CA, mirrors, blocked registries,
//! transient faults, resumed downloads. Every server is real and on loopback: docker-registry
//! (htpasswd, TLS, token auth), a bearer-token server and a fault-injecting proxy.

use std::process::Output;
use std::time::{Duration, Instant};

use crate::common::*;
use pivot_testkit::{
    write_auth_json, CertKey, Fault, FaultProxy, ImageSpec, Registry, TestCa, TokenServer,
};

const SECRET: &str = "Sup3r-s3cret-pa55word";

/// v2 with 1 MiB of poorly compressible text, so a blob has a middle worth cutting at.
fn push_big_v2(env: &Env) -> pivot_testkit::PushedImage {
    let tree = fixture("os-v2").with_file("usr/share/pivot/payload", 0o644, &noise(1 << 20));
    env.push("v2", &ImageSpec::new(tree, "2"))
}

/// The first layer's digest and its size on the registry's disk.
fn first_layer<'i>(env: &Env, image: &'i pivot_testkit::PushedImage) -> (&'i String, u64) {
    let blob = &image.layer_digests[0];
    let size = std::fs::metadata(env.registry.blob_data_path(blob))
        .unwrap()
        .len();
    (blob, size)
}

/// A resumed download transfers the blob about once (≤ 1.1×), not twice.
fn assert_sent_at_most_once(proxy: &FaultProxy, blob: &str, size: u64) {
    let sent = proxy.body_bytes_sent(blob);
    assert!(
        sent as f64 <= size as f64 * 1.1,
        "{sent} bytes sent for a {size}-byte blob"
    );
}

fn through(proxy: &FaultProxy, tag: &str) -> String {
    format!("{}/pivot/os:{tag}", proxy.host())
}

/// The pivot's stderr, the status JSON and the state file must never hold `secret`.
fn assert_secret_absent(env: &Env, out: &std::process::Output, secret: &str) {
    assert!(
        !stderr(out).contains(secret),
        "secret leaked in stderr:\n{}",
        stderr(out)
    );
    let status = env.status_json().to_string();
    assert!(
        !status.contains(secret),
        "secret leaked in status: {status}"
    );
    let state = env.sysroot.path.join(format!(
        "ostree/deploy/{STATEROOT}/var/lib/pivot/state.json"
    ));
    if state.exists() {
        assert!(
            !read(&state).contains(secret),
            "secret leaked in state.json"
        );
    }
}

#[test]
fn htpasswd_registry_is_pulled_with_authfile_credentials_and_refused_without() {
    let registry = Registry::builder()
        .htpasswd("node", SECRET)
        .start()
        .unwrap();
    let env = Env::with_registry(registry);
    let v2 = env.push_v2();

    // Anonymous: refused at once (401 is permanent), even with a long retry budget.
    let started = Instant::now();
    let out = env.pivot(&["--retry-timeout", "60", &v2.by_tag]);
    assert_fails_with(
        &out,
        &[
            "fetching manifest",
            "requires credentials and no auth file has any",
            "Not authorized",
        ],
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a 401 was retried"
    );

    // Wrong password: a clear error that does not echo it.
    let wrong = env.dir().join("wrong.json");
    write_auth_json(
        &wrong,
        &[(&env.registry.host(), "node", "wrong-password-123")],
    )
    .unwrap();
    let out = env.pivot(&["--authfile", wrong.to_str().unwrap(), &v2.by_tag]);
    assert_fails_with(
        &out,
        &[
            "fetching manifest",
            "refused the credentials",
            "wrong.json",
            "Not authorized",
        ],
    );
    assert_secret_absent(&env, &out, "wrong-password-123");

    // Right credentials, from --authfile.
    let right = env.dir().join("auth.json");
    write_auth_json(&right, &[(&env.registry.host(), "node", SECRET)]).unwrap();
    let out = env.pivot(&["--authfile", right.to_str().unwrap(), &v2.by_tag]);
    assert_success(&out);
    assert!(
        stderr(&out).contains("using credentials from"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        v2.commit.as_str()
    );
    assert_secret_absent(&env, &out, SECRET);
}

#[test]
fn registry_auth_file_is_used_and_authfile_takes_precedence() {
    let registry = Registry::builder()
        .htpasswd("node", SECRET)
        .start()
        .unwrap();
    let env = Env::with_registry(registry);
    let v2 = env.push_v2();
    let right = env.dir().join("right.json");
    write_auth_json(
        &right,
        &[(&format!("{}/pivot", env.registry.host()), "node", SECRET)],
    )
    .unwrap();
    let wrong = env.dir().join("wrong.json");
    write_auth_json(&wrong, &[(&env.registry.host(), "node", "nope")]).unwrap();

    // --authfile alone is consulted: its wrong entry wins over $REGISTRY_AUTH_FILE's right one.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pivot"));
    let with_env = |cmd: &mut std::process::Command| {
        cmd.env("CONTAINERS_REGISTRIES_CONF", &env.registries_conf)
            .env("REGISTRY_AUTH_FILE", &right)
            .env("PIVOT_RETRY_TIMEOUT", "2")
            .envs(pivot_testkit::pivot_test_env())
            .arg("--sysroot")
            .arg(&env.sysroot.path);
    };
    with_env(&mut cmd);
    let out = cmd
        .args(["--authfile", wrong.to_str().unwrap(), &v2.by_tag])
        .output()
        .unwrap();
    assert_fails_with(&out, &["refused the credentials", "wrong.json"]);

    // Without --authfile, $REGISTRY_AUTH_FILE's namespace entry (host/pivot) applies.
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pivot"));
    with_env(&mut cmd);
    let out = cmd.arg(&v2.by_tag).output().unwrap();
    assert_success(&out);
    assert!(
        stderr(&out).contains(&right.display().to_string()),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bearer_token_flow_gets_a_token_with_the_credentials() {
    let TokenEnv {
        tokens,
        env,
        v2,
        auth,
    } = TokenEnv::new(SECRET);

    let out = env.pivot(&["--authfile", auth.to_str().unwrap(), &v2.by_tag]);
    assert_success(&out);
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        v2.commit.as_str()
    );
    let granted = tokens.requests().iter().any(|r| {
        r.authorized
            && r.account.as_deref() == Some("node")
            && r.scopes.iter().any(|s| s.contains("pivot/os:pull"))
    });
    assert!(
        granted,
        "no authorized pull token was issued: {:?}",
        tokens.requests()
    );
    assert_secret_absent(&env, &out, SECRET);
}

#[test]
fn tokens_that_expire_during_a_long_pull_are_renewed() {
    let tokens = TokenServer::builder()
        .user("node", SECRET)
        .lifetime(Duration::from_secs(2))
        .start()
        .unwrap();
    let registry = Registry::builder().token_auth(&tokens).start().unwrap();
    let mut env = Env::with_registry(registry);
    let v2 = push_big_v2(&env);
    let auth = env.dir().join("auth.json");
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    write_auth_json(&auth, &[(&proxy.host(), "node", SECRET)]).unwrap();
    // Every blob at 64 KiB/s: the pull takes several token lifetimes.
    proxy.add_fault(Fault::throttle("/blobs/", 64 << 10).always());
    insecure_via(&mut env, &proxy);

    let started = Instant::now();
    let out = env.pivot(&["--authfile", auth.to_str().unwrap(), &through(&proxy, "v2")]);
    assert_success(&out);
    assert!(
        started.elapsed() > Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        v2.commit.as_str()
    );
    assert!(
        tokens.issued_count() > 1,
        "one token for the whole pull: {:?}",
        tokens.requests()
    );
    assert_secret_absent(&env, &out, SECRET);
}

/// A token-auth registry behind a fault proxy that answers the first `refusals` GETs of the
/// first layer 401 with a Bearer challenge, as a registry does for a token it no longer
/// accepts, and the pivot through it.
struct RefusedToken {
    env: Env,
    v2: pivot_testkit::PushedImage,
    out: Output,
    /// Tokens the token service issued.
    issued: usize,
    /// GETs of the first layer.
    gets: usize,
}

fn pull_with_refused_token(refusals: u32) -> RefusedToken {
    let tokens = TokenServer::builder().user("node", SECRET).start().unwrap();
    let registry = Registry::builder().token_auth(&tokens).start().unwrap();
    let mut env = Env::with_registry(registry);
    let v2 = env.push_v2();
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    let auth = env.dir().join("auth.json");
    write_auth_json(&auth, &[(&proxy.host(), "node", SECRET)]).unwrap();
    let layer = format!("/blobs/{}", v2.layer_digests[0]);
    proxy.add_fault(Fault::status(&layer, 401).method("GET").times(refusals));
    insecure_via(&mut env, &proxy);
    let out = env.pivot(&[
        "--retry-timeout",
        "60",
        "--authfile",
        auth.to_str().unwrap(),
        &through(&proxy, "v2"),
    ]);
    RefusedToken {
        issued: tokens.issued_count(),
        gets: proxy.count_requests("GET", &layer),
        env,
        v2,
        out,
    }
}

#[test]
fn a_token_the_registry_stops_accepting_is_replaced_and_the_request_sent_again() {
    let run = pull_with_refused_token(1);
    assert_success(&run.out);
    assert!(
        stderr(&run.out).contains("refused the pull token"),
        "{}",
        stderr(&run.out)
    );
    assert!(run.issued >= 2, "{} tokens issued", run.issued);
    assert_eq!(run.gets, 2);
    assert_eq!(
        run.env.status_json()["deployments"][0]["checksum"],
        run.v2.commit.as_str()
    );
}

#[test]
fn a_new_token_refused_too_is_the_credentials_fault_and_fails_at_once() {
    let run = pull_with_refused_token(2);
    assert_fails_with(
        &run.out,
        &[
            "refused a newly issued token as well",
            "the credentials from",
            "may not pull",
        ],
    );
    // Not retried: once with the old token, once with the new one.
    assert_eq!(run.gets, 2);
    assert_secret_absent(&run.env, &run.out, SECRET);
}

/// Runs pivot with a long retry budget and asserts it fails at once (a TLS refusal is not
/// retried), with every one of `needles` in its message and the sysroot untouched.
fn assert_refused_at_once(env: &Env, args: &[&str], needles: &[&str]) {
    let before = env.sysroot.snapshot().unwrap();
    let started = Instant::now();
    let out = env.pivot(&[&["--retry-timeout", "60"], args].concat());
    assert_fails_with(&out, needles);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a TLS refusal was retried:\n{}",
        stderr(&out)
    );
    assert_eq!(env.sysroot.snapshot().unwrap(), before);
}

#[test]
fn tls_registry_is_trusted_with_its_ca_and_refused_without() {
    let ca = TestCa::new("pivot test CA").unwrap();
    let registry = Registry::builder().tls(&ca).unwrap().start().unwrap();
    let env = Env::with_registry(registry);
    let v2 = env.push_v2();

    // Unknown CA: refused at once, naming the certificate problem.
    assert_refused_at_once(&env, &[&v2.by_tag], &["fetching manifest", "certificate"]);
    let snapshot = env.sysroot.snapshot().unwrap();

    // --tls-verify=false gets through, with a warning.
    let out = env.pivot(&["--tls-verify=false", "--unchanged-exit-77", &v2.by_digest]);
    assert!(
        stderr(&out).contains("verification is off"),
        "{}",
        stderr(&out)
    );
    assert_success(&out);
    assert_ne!(env.sysroot.snapshot().unwrap(), snapshot);

    // The CA in a certs.d-style --cert-dir makes it trusted.
    let certs = env.dir().join("certs.d");
    let host_dir = ca.write_certs_d(&certs, &env.registry.host()).unwrap();
    let out = env.pivot(&[
        "--cert-dir",
        host_dir.to_str().unwrap(),
        "--unchanged-exit-77",
        &v2.by_tag,
    ]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));

    // So does the system's /etc/containers/certs.d/<host:port>/ (unique per test: a fresh port).
    let system = ca
        .write_certs_d(
            std::path::Path::new("/etc/containers/certs.d"),
            &env.registry.host(),
        )
        .unwrap();
    let _cleanup = RemoveOnDrop(system.clone());
    let out = env.pivot(&["--unchanged-exit-77", &v2.by_tag]);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
}

#[test]
fn an_insecure_entry_reaches_a_tls_registry_with_an_unknown_ca_and_nothing_else_does() {
    let ca = TestCa::new("pivot test CA").unwrap();
    let registry = Registry::builder().tls(&ca).unwrap().start().unwrap();
    let mut env = Env::with_registry(registry);
    let v2 = env.push_v2();
    assert_refused_at_once(&env, &[&v2.by_tag], &["fetching manifest", "certificate"]);

    // containers-registries.conf(5): insecure allows TLS without verification, tried first.
    env.set_registries_conf(&format!(
        "[[registry]]\nlocation = \"{}\"\ninsecure = true\n",
        env.registry.host()
    ));
    let out = env.pivot(&[&v2.by_tag]);
    assert_success(&out);
    assert!(
        stderr(&out).contains("marked insecure: its TLS certificate is not verified"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        v2.commit.as_str()
    );

    // The entry names this registry only: another port of the same host is still verified.
    env.set_registries_conf("[[registry]]\nlocation = \"127.0.0.1:1\"\ninsecure = true\n");
    assert_refused_at_once(&env, &[&v2.by_tag], &["certificate"]);
}

struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A TLS registry that demands a client certificate issued by `clients`, with v2 pushed.
struct ClientCertRegistry {
    env: Env,
    clients: TestCa,
    v2: pivot_testkit::PushedImage,
}

impl ClientCertRegistry {
    fn start() -> ClientCertRegistry {
        let ca = TestCa::new("pivot test CA").unwrap();
        let clients = TestCa::new("pivot client CA").unwrap();
        let registry = Registry::builder()
            .tls(&ca)
            .unwrap()
            .client_ca(&clients)
            .start()
            .unwrap();
        assert!(registry.requires_client_cert());
        let env = Env::with_registry(registry);
        let v2 = env.push_v2();
        ClientCertRegistry { env, clients, v2 }
    }

    /// A certs.d-style `--cert-dir` that trusts the registry's CA, holding `client` if given.
    fn cert_dir(&self, client: Option<&CertKey>) -> String {
        let root = self.env.dir().join("certs.d");
        let host_dir = self.env.registry.write_certs_d(&root).unwrap();
        if let Some(client) = client {
            client
                .write_client_certs_d(&root, &self.env.registry.host())
                .unwrap();
        }
        host_dir.display().to_string()
    }

    /// Pivots to v2 with `--cert-dir dir` and checks v2 is what boots next.
    fn assert_deploys_v2_with(&self, dir: &str) {
        let out = self.env.pivot(&["--cert-dir", dir, &self.v2.by_tag]);
        assert_success(&out);
        assert_eq!(
            self.env.status_json()["deployments"][0]["checksum"],
            self.v2.commit.as_str()
        );
    }
}

#[test]
fn registry_requiring_a_client_certificate_accepts_the_one_in_certs_d() {
    let reg = ClientCertRegistry::start();
    let env = &reg.env;
    let client = reg.clients.client_cert("pivot-node").unwrap();
    // The system's /etc/containers/certs.d/<host:port>/ (unique per test: a fresh port): the
    // registry's CA and the client pair, found without --cert-dir.
    let certs_d = std::path::Path::new(pivot::fetch::config::certs::CERTS_D[0]);
    let system = env.registry.write_certs_d(certs_d).unwrap();
    let _cleanup = RemoveOnDrop(system.clone());
    client
        .write_client_certs_d(certs_d, &env.registry.host())
        .unwrap();

    let out = env.pivot_with_env(&[("PIVOT_LOG", "warn,pivot=debug")], &[&reg.v2.by_tag]);
    assert_success(&out);
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        reg.v2.commit.as_str()
    );
    let presented = format!(
        "presenting client certificate {}",
        system.join("client.cert").display()
    );
    assert!(stderr(&out).contains(&presented), "{}", stderr(&out));
}

#[test]
fn registry_requiring_a_client_certificate_refuses_a_pivot_without_one_and_says_why() {
    let reg = ClientCertRegistry::start();
    let dir = reg.cert_dir(None);
    let hint = format!("(put <name>.cert and <name>.key in {dir})");
    assert_refused_at_once(
        &reg.env,
        &["--cert-dir", &dir, &reg.v2.by_tag],
        &[
            "fetching manifest",
            "the registry refused the TLS handshake: it requires a client certificate",
            &hint,
            "alert bad certificate",
        ],
    );
}

#[test]
fn registry_requiring_a_client_certificate_refuses_one_from_another_ca_and_names_it() {
    let reg = ClientCertRegistry::start();
    let stranger = TestCa::new("some other CA").unwrap();
    let dir = reg.cert_dir(Some(&stranger.client_cert("intruder").unwrap()));
    let named = format!("it did not accept the client certificate {dir}/client.cert");
    assert_refused_at_once(
        &reg.env,
        &["--cert-dir", &dir, &reg.v2.by_tag],
        &["the registry refused the TLS handshake", &named],
    );
}

#[test]
fn registry_requiring_a_client_certificate_accepts_a_pkcs1_rsa_key() {
    let reg = ClientCertRegistry::start();
    let client = reg.clients.client_cert_rsa_pkcs1("pivot-node").unwrap();
    assert!(client
        .key_pem
        .starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    reg.assert_deploys_v2_with(&reg.cert_dir(Some(&client)));
}

#[test]
fn mirror_serves_the_image_when_the_primary_is_down_and_is_verified_the_same() {
    let mut primary = Registry::start().unwrap();
    let mirror = Registry::start().unwrap();
    let mut env = Env::with_registry(Registry::start().unwrap());
    let spec = ImageSpec::new(fixture("os-v2"), "2");
    let on_primary = pivot_testkit::push_oscontainer(&primary, "pivot/os", "v2", &spec).unwrap();
    let on_mirror = pivot_testkit::push_oscontainer(&mirror, "mirrored/os", "v2", &spec).unwrap();
    assert_eq!(on_primary.digest, on_mirror.digest);
    primary.stop();
    env.set_registries_conf(&format!(
        "[[registry]]\nprefix = \"{p}/pivot\"\nlocation = \"{p}/pivot\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{m}/mirrored\"\ninsecure = true\n",
        p = primary.host(),
        m = mirror.host()
    ));

    let out = env.pivot(&[&on_primary.by_digest]);
    assert_success(&out);
    assert!(
        stderr(&out).contains(&format!("from mirror {}/mirrored/os", mirror.host())),
        "{}",
        stderr(&out)
    );
    // The origin names the image as asked for, not the mirror it came from.
    let status = env.status_json();
    assert_eq!(
        status["deployments"][0]["image"],
        format!("{}/pivot/os@{}", primary.host(), on_primary.digest).as_str()
    );
    assert!(mirror.count_requests("GET", "/v2/mirrored/os/blobs/") > 0);

    // A mirror serving bytes that do not match the digest is not trusted either.
    let env2 = {
        let mut e = Env::with_registry(Registry::start().unwrap());
        e.set_registries_conf(&format!(
            "[[registry]]\nprefix = \"{p}/pivot\"\nlocation = \"{p}/pivot\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{m}/mirrored\"\ninsecure = true\n",
            p = primary.host(),
            m = mirror.host()
        ));
        e
    };
    let layer = mirror.blob_data_path(&on_mirror.layer_digests[0]);
    let mut bytes = std::fs::read(&layer).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&layer, bytes).unwrap();
    let before = env2.sysroot.snapshot().unwrap();
    let out = env2.pivot(&[&on_primary.by_digest]);
    assert_fails_with(&out, &["digest mismatch"]);
    assert_eq!(env2.sysroot.snapshot().unwrap(), before);
}

#[test]
fn blocked_registry_is_refused_without_contacting_it() {
    let mut env = Env::new();
    let v2 = env.push_v2();
    env.set_registries_conf(&format!(
        "[[registry]]\nlocation = \"{}\"\ninsecure = true\nblocked = true\n",
        env.registry.host()
    ));
    let before = env.registry.requests().len();
    let out = env.pivot(&[&v2.by_tag]);
    assert_fails_with(&out, &["blocked in registries.conf"]);
    assert_eq!(
        env.registry.requests().len(),
        before,
        "a blocked registry was contacted"
    );
}

#[test]
fn transient_503_and_429_are_retried_until_they_pass() {
    let env = Env::new();
    let v2 = env.push_v2();
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    proxy.add_fault(Fault::status("/manifests/", 503).times(2));
    proxy.add_fault(Fault::too_many_requests("/blobs/", None).times(1));
    let mut env = env;
    insecure_via(&mut env, &proxy);

    let out = env.pivot(&["--retry-timeout", "60", &through(&proxy, "v2")]);
    assert_success(&out);
    assert!(stderr(&out).contains("retrying in"), "{}", stderr(&out));
    assert_eq!(proxy.pending_faults(), 0);
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        v2.commit.as_str()
    );
}

#[test]
fn not_found_fails_at_once_with_the_registry_message() {
    let env = Env::new();
    env.push_v2();
    let started = Instant::now();
    let missing = format!("{}/pivot/os:no-such-tag", env.registry.host());
    let out = env.pivot(&["--retry-timeout", "60", &missing]);
    assert_fails_with(&out, &["manifest unknown"]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a 404 was retried"
    );
}

#[test]
fn unreachable_registry_is_retried_within_the_budget_then_reported() {
    let mut env = Env::new();
    let v2 = env.push_v2();
    env.registry.stop();
    let started = Instant::now();
    let out = env.pivot(&["--retry-timeout", "4", &v2.by_tag]);
    let took = started.elapsed();
    assert_fails_with(
        &out,
        &[
            &format!("pulling {}", v2.by_tag),
            "Connection refused",
            "gave up after",
            "4 s without progress",
        ],
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(15),
        "took {took:?}"
    );
}

#[test]
fn a_blob_cut_halfway_resumes_with_a_range_request() {
    let mut env = Env::new();
    let v2 = push_big_v2(&env);
    let (blob, size) = first_layer(&env, &v2);
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    proxy.add_fault(
        Fault::drop_after(&format!("/blobs/{blob}"), size / 2)
            .method("GET")
            .times(1),
    );
    insecure_via(&mut env, &proxy);

    let out = env.pivot(&["--retry-timeout", "60", &through(&proxy, "v2")]);
    assert_success(&out);
    let gets: Vec<_> = proxy
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.contains(blob.as_str()))
        .collect();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(
        gets[1].range.as_deref(),
        Some(format!("bytes={}-", size / 2).as_str()),
        "{gets:?}"
    );
    assert_sent_at_most_once(&proxy, blob, size);
}

#[test]
fn a_long_throttled_pull_cut_near_its_end_resumes_whatever_the_run_has_lasted() {
    let mut env = Env::new();
    let v2 = push_big_v2(&env);
    let (blob, size) = first_layer(&env, &v2);
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    // A slow link: the first 90 % take about 10 s, then the connection drops. The retry budget
    // is 2 s: a fault is retried for that long after the last byte, whatever came before.
    let cut = size * 9 / 10;
    proxy.add_fault(
        Fault::throttle_then_drop(&format!("/blobs/{blob}"), cut / 10, cut)
            .method("GET")
            .times(1),
    );
    insecure_via(&mut env, &proxy);

    let started = Instant::now();
    let out = env.pivot(&["--retry-timeout", "2", &through(&proxy, "v2")]);
    assert_success(&out);
    assert!(
        started.elapsed() > Duration::from_secs(6),
        "the pull outlived the retry budget only {:?}",
        started.elapsed()
    );
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        v2.commit.as_str()
    );
    let gets: Vec<_> = proxy
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.contains(blob.as_str()))
        .collect();
    assert_eq!(gets.len(), 2, "{gets:?}");
    assert_eq!(
        gets[1].range.as_deref(),
        Some(format!("bytes={cut}-").as_str()),
        "{gets:?}"
    );
    assert_sent_at_most_once(&proxy, blob, size);
}

#[test]
fn a_stalled_transfer_is_cut_and_resumed() {
    let mut env = Env::new();
    let v2 = push_big_v2(&env);
    let (blob, size) = first_layer(&env, &v2);
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    // Longer than pivot's 30 s stall timeout: pivot must give up on it, not wait it out.
    proxy.add_fault(
        Fault::stall_after(
            &format!("/blobs/{blob}"),
            size / 3,
            Duration::from_secs(300),
        )
        .method("GET")
        .times(1),
    );
    insecure_via(&mut env, &proxy);

    let started = Instant::now();
    let out = env.pivot(&["--retry-timeout", "120", &through(&proxy, "v2")]);
    assert_success(&out);
    assert!(
        started.elapsed() < Duration::from_secs(100),
        "took {:?}",
        started.elapsed()
    );
    assert_sent_at_most_once(&proxy, blob, size);
}

#[test]
fn a_killed_pivot_resumes_its_download_on_the_next_run() {
    let mut env = Env::new();
    let v2 = push_big_v2(&env);
    let (blob, size) = first_layer(&env, &v2);
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    proxy.add_fault(
        Fault::stall_after(
            &format!("/blobs/{blob}"),
            size / 2,
            Duration::from_secs(300),
        )
        .method("GET")
        .times(1),
    );
    insecure_via(&mut env, &proxy);
    let before = env.sysroot.snapshot().unwrap();

    // Kill -9 while half the blob is in and the rest is stalled.
    let mut child = env.spawn_pivot(&["--retry-timeout", "120", &through(&proxy, "v2")]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.body_bytes_sent(blob) < size / 2 {
        assert!(Instant::now() < deadline, "the first half never arrived");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        env.sysroot.snapshot().unwrap(),
        before,
        "a killed pivot changed the sysroot"
    );

    let out = env.pivot(&["--retry-timeout", "60", &through(&proxy, "v2")]);
    assert_success(&out);
    assert!(
        stderr(&out).contains(&format!("resuming {blob} at byte")),
        "{}",
        stderr(&out)
    );
    assert_sent_at_most_once(&proxy, blob, size);
    assert_eq!(
        env.status_json()["deployments"][0]["checksum"],
        v2.commit.as_str()
    );
    // The downloads are gone once the run ended.
    assert!(!env.downloads().exists());
}

/// A registry whose bearer tokens a token service grants to `node` with `secret`, v2 pushed to
/// it, and an auth file holding those credentials.
pub(crate) struct TokenEnv {
    pub(crate) tokens: TokenServer,
    pub(crate) env: Env,
    pub(crate) v2: pivot_testkit::PushedImage,
    pub(crate) auth: std::path::PathBuf,
}

impl TokenEnv {
    pub(crate) fn new(secret: &str) -> TokenEnv {
        let tokens = TokenServer::builder().user("node", secret).start().unwrap();
        let registry = Registry::builder().token_auth(&tokens).start().unwrap();
        let env = Env::with_registry(registry);
        let v2 = env.push_v2();
        let auth = env.dir().join("auth.json");
        write_auth_json(&auth, &[(&env.registry.host(), "node", secret)]).unwrap();
        TokenEnv {
            tokens,
            env,
            v2,
            auth,
        }
    }
}
