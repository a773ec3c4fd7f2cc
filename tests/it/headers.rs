//! What a registry (or a proxy in front of it) sends in its headers, at its limits: every value
//! ends in a pull, a wait, or one clear error, never a panic, and a failed pull leaves the
//! sysroot as it was. The parsers themselves are fuzzed (`fuzz/fuzz_targets/`) and
//! property-tested here and in their modules (`src/fetch/content_range.rs`,
//! `src/fetch/retry_after.rs`, `src/fleet/fleet_lock.rs`); pivot reads no `Link` header (it
//! never lists tags) and leaves `Location` to reqwest's redirect handling, which
//! [`hostile_redirects_of_a_blob_end_in_a_pull_or_one_error`] drives.

use std::process::Output;

use proptest::prelude::*;

use crate::common::*;
use pivot_testkit::{Fault, FaultProxy};

/// An environment whose registry is reached through a fault-injecting proxy, and the pullspec
/// of its v2 image there.
fn proxied() -> (Env, FaultProxy, String) {
    let mut env = Env::new();
    // A layer of some 200 KiB: its download can be cut, and resumed.
    let tree = fixture("os-v2").with_file("usr/share/noise", 0o644, &noise(400 << 10));
    env.push("v2", &pivot_testkit::ImageSpec::new(tree, "2"));
    let proxy = FaultProxy::start(&env.registry.host()).unwrap();
    insecure_via(&mut env, &proxy);
    let pullspec = format!("{}/pivot/os:v2", proxy.host());
    (env, proxy, pullspec)
}

/// One pivot run under whatever the proxy now injects: it pulls, finds nothing to do, or fails
/// with one error line leaving the sysroot as it was; never a panic ([`Env::pivot`] checks).
fn run(env: &Env, pullspec: &str, what: &str) -> Output {
    let before = env.sysroot.snapshot().unwrap();
    let files = sysroot_files(env);
    let out = env.pivot(&[pullspec]);
    let err = stderr(&out);
    match out.status.code() {
        Some(0 | 77) => {}
        Some(1) => {
            let errors = err.lines().filter(|l| l.contains("ERROR")).count();
            assert_eq!(errors, 1, "{what}: not one error line:\n{err}");
            assert_eq!(
                env.sysroot.snapshot().unwrap(),
                before,
                "{what}: the sysroot changed"
            );
            assert_eq!(sysroot_files(env), files, "{what}: files changed");
        }
        _ => panic!("{what}: exit {}:\n{err}", out.status),
    }
    out
}

/// A resumed layer download whose `206` names another range than the one asked for (or no
/// valid one) is refused at once, as containers/image refuses it: its bytes are never joined
/// to those already read (RFC 9110 §14.4).
#[test]
fn a_resumed_layer_with_an_unusable_content_range_is_refused() {
    let (env, proxy, pullspec) = proxied();
    let layer = "/blobs/sha256:";
    for value in [
        &b"bytes 0-9/10"[..],
        b"bytes x-1/2",
        b"",
        b"bytes 5-1/9",
        b"\xff\xfe",
        b"bytes 1-99999999999999999999/*",
    ] {
        proxy.clear_faults();
        // The config is read whole first; the layer's first answer is cut, its resume
        // answered with `value`.
        proxy.add_fault(Fault::pass(layer));
        proxy.add_fault(Fault::drop_after(layer, 4096));
        proxy.add_fault(Fault::set_header(layer, "Content-Range", value));
        let what = String::from_utf8_lossy(value).into_owned();
        let out = run(&env, &pullspec, &what);
        assert_fails_with(&out, &["unusable Content-Range"]);
    }
}

/// `Retry-After` at its limits, on a rate-limited manifest: a wait longer than the retry budget
/// ends the pull at once, saying so; a value that is no wait (malformed, negative, not text) is
/// passed over for pivot's own backoff, and the pull succeeds.
#[test]
fn retry_after_at_its_limits_is_waited_or_passed_over() {
    let (env, proxy, pullspec) = proxied();
    let limited = |value: &[u8]| {
        proxy.clear_faults();
        proxy.add_fault(Fault::answer(
            "/manifests/",
            429,
            &[
                ("Retry-After", value),
                ("Content-Type", b"application/json"),
            ],
            br#"{"errors":[{"code":"TOOMANYREQUESTS","message":"slow down"}]}"#,
        ));
    };
    for value in [
        &b"99999999999999999999"[..],
        b"18446744073709551616",
        b"Fri, 31 Dec 9999 23:59:59 GMT",
        b"Sun, 06 Nov 1994 08:49:37 GMT, 999999",
    ] {
        limited(value);
        let what = String::from_utf8_lossy(value).into_owned();
        let out = run(&env, &pullspec, &what);
        if value.starts_with(b"Sun") {
            continue; // Not a date: passed over (and pulled), or a past date: no wait.
        }
        assert_fails_with(&out, &["Retry-After"]);
    }
    for value in [
        &b"-1"[..],
        b"1e3",
        b"",
        b"\xff\xfe",
        b"0x10",
        b"Sun, 06 Nov 1994 08:49:37 GMT",
    ] {
        limited(value);
        let what = String::from_utf8_lossy(value).into_owned();
        let out = run(&env, &pullspec, &what);
        assert!(
            matches!(out.status.code(), Some(0 | 77)),
            "{what}: {}",
            stderr(&out)
        );
    }
}

/// `WWW-Authenticate` challenges a registry should never send (no realm, a realm that is no
/// URL or not http, bytes that are not text, a huge one): a pull, or one error.
#[test]
fn hostile_challenges_end_in_a_pull_or_one_error() {
    let (env, proxy, pullspec) = proxied();
    let huge = format!(
        "Bearer realm=\"http://127.0.0.1:1/{}\"",
        "a".repeat(16 * 1024)
    );
    for value in [
        &b"Bearer realm=\"file:///etc/passwd\""[..],
        b"Bearer realm=\"\"",
        b"Bearer",
        b"Bearer realm=\"http://[::1\"",
        b"Bearer realm=http://127.0.0.1:1/token,service=\"x\\\"",
        b"\xff\xfe",
        b"Basic realm=\"registry\"",
        huge.as_bytes(),
    ] {
        proxy.clear_faults();
        proxy.add_fault(
            Fault::answer("/v2/", 401, &[("WWW-Authenticate", value)], b"{}")
                .exact()
                .always(),
        );
        run(&env, &pullspec, &String::from_utf8_lossy(value));
    }
}

/// A blob redirected (`307`) to where no blob can be: no `Location`, an empty or unparsable
/// one, another scheme, a closed port. A pull (once the retries reach the real blob), or one
/// error; never a request outside HTTP.
#[test]
fn hostile_redirects_of_a_blob_end_in_a_pull_or_one_error() {
    let (env, proxy, pullspec) = proxied();
    for value in [
        None,
        Some(&b""[..]),
        Some(b"file:///etc/passwd"),
        Some(b"http://[::1"),
        Some(b"\xff\xfe"),
        Some(b"//"),
        Some(b"http://127.0.0.1:1/nothing"),
    ] {
        proxy.clear_faults();
        let headers: Vec<(&str, &[u8])> = value.map(|v| ("Location", v)).into_iter().collect();
        proxy.add_fault(Fault::answer("/blobs/sha256:", 307, &headers, b""));
        let what = value.map_or("no Location".into(), |v| {
            String::from_utf8_lossy(v).into_owned()
        });
        run(&env, &pullspec, &what);
    }
}

/// `Docker-Content-Digest` on a blob answer that is not the blob's (malformed, another
/// algorithm, not text): oci-client verifies the bytes against it too, so the pull fails in
/// one line or (where the value is no digest at all) is refused the same way.
#[test]
fn a_blob_answer_naming_another_digest_ends_in_one_error() {
    let (env, proxy, pullspec) = proxied();
    let zeros = format!("sha512:{}", "0".repeat(128));
    for value in [
        &b"sha256:0000"[..],
        b"md5:abc",
        b"garbage",
        b"\xff",
        zeros.as_bytes(),
    ] {
        proxy.clear_faults();
        proxy.add_fault(
            Fault::set_header("/blobs/sha256:", "Docker-Content-Digest", value).always(),
        );
        let out = run(&env, &pullspec, &String::from_utf8_lossy(value));
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    }
}

proptest! {
    /// oci-client's reading of a `WWW-Authenticate` value: any bytes, a challenge or an error.
    #[test]
    fn any_challenge_is_read_or_refused(value in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok((realm, service)) = oci_client::client::parse_bearer_challenge(&value) {
            prop_assert!(realm.len() <= value.len());
            prop_assert!(service.is_none_or(|s| s.len() <= value.len()));
        }
    }

    /// Challenges shaped like real ones, with any realm and service text.
    #[test]
    fn bearer_challenges_keep_their_realm(realm in "[ -~]{0,80}", service in "[ -~]{0,40}") {
        let value = format!(
            "Bearer realm=\"{}\",service=\"{}\"",
            realm.replace('\\', "\\\\").replace('"', "\\\""),
            service.replace('\\', "\\\\").replace('"', "\\\"")
        );
        let (got, got_service) = oci_client::client::parse_bearer_challenge(value.as_bytes())
            .map_err(|e| TestCaseError::fail(format!("{value}: {e}")))?;
        prop_assert_eq!(got, realm);
        prop_assert_eq!(got_service, Some(service));
    }

    /// A blob answer's `Docker-Content-Digest`: nothing, a digest of a known algorithm, or an
    /// error, whatever the bytes.
    #[test]
    fn any_digest_header_is_read_or_refused(value in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(Some(digest)) = oci_client::client::parse_digest_header(&value) {
            let algorithm = digest.split_once(':').map(|(a, _)| a);
            prop_assert!(matches!(algorithm, Some("sha256" | "sha384" | "sha512")), "{}", digest);
        }
    }

    /// A token service's answer: any text is a token or an error, and no token is cached for
    /// longer than a day, whatever its `exp` claim.
    #[test]
    fn any_token_answer_is_read_or_refused(
        body in "\\PC{0,200}",
        exp in any::<u64>(),
        payload in "[A-Za-z0-9_-]{0,40}",
    ) {
        let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let day = 24 * 3600 + 5;
        if let Ok((_, until)) = oci_client::token_cache::parse_token_response(&body) {
            prop_assert!(until.is_none_or(|t| t <= now() + day));
        }
        use base64::Engine;
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!("{{\"exp\":{exp}}}"));
        for token in [format!("h.{claims}.s"), format!("h.{payload}.s"), payload.clone()] {
            let body = serde_json::json!({ "token": token }).to_string();
            let (_, until) = oci_client::token_cache::parse_token_response(&body)
                .map_err(|e| TestCaseError::fail(format!("{body}: {e}")))?;
            prop_assert!(until.is_none_or(|t| t <= now() + day), "{} cached until {:?}", body, until);
        }
    }

    /// `Retry-After` as pivot reads it, any text at any moment: nothing, or a wait that the
    /// retry policy bounds without overflowing.
    #[test]
    fn any_retry_after_is_a_bounded_wait(value in "\\PC{0,40}", now in any::<u32>()) {
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::from(now) * 8);
        let asked = pivot::fetch::retry_after::parse(&value, now);
        let policy = pivot::fetch::retry::RetryPolicy::new(std::time::Duration::from_secs(120));
        if let Some(delay) = policy.next_delay(1, std::time::Instant::now(), asked) {
            prop_assert!(delay < std::time::Duration::from_secs(120));
        }
    }
}
