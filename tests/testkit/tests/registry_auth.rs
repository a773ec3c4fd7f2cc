//! htpasswd auth, TLS and client certificates on the real registry, checked
//! with skopeo and curl as independent peer clients.

use anyhow::{Context, Result};
use pivot_testkit::{
    push_oscontainer, write_auth_json, ImageSpec, PushedImage, Registry, TestCa, Tree,
};
use std::path::Path;
use std::process::Command;

/// Runs a command with an empty auth file; returns (success, stdout + stderr).
fn run(cmd: &str, args: &[&str]) -> Result<(bool, String)> {
    let empty_auth = tempfile::tempdir()?;
    let out = Command::new(cmd)
        .args(args)
        .env("REGISTRY_AUTH_FILE", empty_auth.path().join("auth.json"))
        .output()
        .with_context(|| format!("running {cmd}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

/// `skopeo inspect` with optional `--creds` and `--cert-dir` (else plain HTTP).
fn inspect(
    reference: &str,
    creds: Option<&str>,
    cert_dir: Option<&Path>,
) -> Result<(bool, String)> {
    let mut args = vec!["inspect".to_string()];
    match cert_dir {
        Some(dir) => args.push(format!("--cert-dir={}", dir.display())),
        None => args.push("--tls-verify=false".into()),
    }
    if let Some(c) = creds {
        args.push(format!("--creds={c}"));
    }
    args.push(format!("docker://{reference}"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run("skopeo", &args)
}

/// HTTP status of `curl <url>` with extra args.
fn curl_status(url: &str, extra: &[&str]) -> Result<String> {
    let mut args = vec!["-s", "-o", "/dev/null", "-w", "%{http_code}"];
    args.extend(extra);
    args.push(url);
    Ok(run("curl", &args)?.1)
}

fn push(reg: &Registry, tag: &str) -> Result<PushedImage> {
    let tree = Tree::default().with_file("usr/lib/os-release", 0o644, "ID=pivot-test\n");
    push_oscontainer(reg, "os/pivot", tag, &ImageSpec::new(tree, tag))
}

#[test]
fn htpasswd_refuses_anonymous_and_wrong_password() -> Result<()> {
    let reg = Registry::builder().htpasswd("alice", "s3cret").start()?;
    assert_eq!(reg.credentials(), Some(("alice".into(), "s3cret".into())));
    let v2 = format!("{}/v2/", reg.url());
    assert_eq!(curl_status(&v2, &[])?, "401");
    assert_eq!(curl_status(&v2, &["-u", "alice:wrong"])?, "401");
    assert_eq!(curl_status(&v2, &["-u", "alice:s3cret"])?, "200");
    let (_, headers) = run("curl", &["-s", "-D", "-", "-o", "/dev/null", &v2])?;
    assert!(
        headers.contains("Www-Authenticate: Basic realm=\"pivot-testkit\""),
        "{headers}"
    );

    // The kit's own push authenticates.
    let image = push(&reg, "v1")?;
    let (ok, out) = inspect(&image.by_tag, Some("alice:s3cret"), None)?;
    assert!(ok, "{out}");
    assert!(out.contains(&image.digest), "{out}");
    let (ok, out) = inspect(&image.by_tag, Some("alice:wrong"), None)?;
    assert!(!ok && out.contains("unauthorized"), "{out}");
    let (ok, out) = inspect(&image.by_tag, None, None)?;
    assert!(!ok && out.contains("unauthorized"), "{out}");
    Ok(())
}

#[test]
fn auth_json_is_read_by_skopeo() -> Result<()> {
    let reg = Registry::builder().htpasswd("alice", "s3cret").start()?;
    let image = push(&reg, "v1")?;
    let dir = tempfile::tempdir()?;
    let good = dir.path().join("good/auth.json");
    let bad = dir.path().join("bad/auth.json");
    write_auth_json(
        &good,
        &[
            (&reg.host(), "alice", "s3cret"),
            ("example.invalid", "x", "y"),
        ],
    )?;
    write_auth_json(&bad, &[(&reg.host(), "alice", "wrong")])?;
    let text = std::fs::read_to_string(&good)?;
    assert!(text.contains("\"auths\""), "{text}");
    for (file, expect) in [(&good, true), (&bad, false)] {
        let authfile = format!("--authfile={}", file.display());
        let image_ref = format!("docker://{}", image.by_tag);
        let (ok, out) = run(
            "skopeo",
            &["inspect", "--tls-verify=false", &authfile, &image_ref],
        )?;
        assert_eq!(ok, expect, "{out}");
    }
    Ok(())
}

#[test]
fn tls_registry_is_trusted_with_its_ca_only() -> Result<()> {
    let ca = TestCa::new("pivot registry CA")?;
    let reg = Registry::builder()
        .tls(&ca)?
        .htpasswd("alice", "s3cret")
        .start()?;
    assert!(reg.is_tls());
    assert_eq!(reg.url(), format!("https://{}", reg.host()));
    let image = push(&reg, "v1")?;

    let certs = tempfile::tempdir()?;
    let host_dir = reg.write_certs_d(certs.path())?;
    assert_eq!(host_dir, ca.write_certs_d(certs.path(), &reg.host())?);
    let (ok, out) = inspect(&image.by_tag, Some("alice:s3cret"), Some(&host_dir))?;
    assert!(ok, "{out}");
    assert!(out.contains(&image.digest), "{out}");

    // A CA that did not sign the server certificate is refused.
    let stranger = TestCa::new("unrelated CA")?;
    let other = tempfile::tempdir()?;
    let other_dir = stranger.write_certs_d(other.path(), &reg.host())?;
    let (ok, out) = inspect(&image.by_tag, Some("alice:s3cret"), Some(&other_dir))?;
    assert!(
        !ok && out.contains("certificate signed by unknown authority"),
        "{out}"
    );

    let ca_file = host_dir.join("ca.crt");
    let v2 = format!("{}/v2/", reg.url());
    let ca_arg = ca_file.display().to_string();
    assert_eq!(
        curl_status(&v2, &["--cacert", &ca_arg, "-u", "alice:s3cret"])?,
        "200"
    );
    // curl's 000 is "no HTTP response": the handshake failed.
    assert_eq!(curl_status(&v2, &["-u", "alice:s3cret"])?, "000");
    Ok(())
}

#[test]
fn client_certificate_required_when_configured() -> Result<()> {
    let ca = TestCa::new("pivot registry CA")?;
    let clients = TestCa::new("pivot client CA")?;
    let reg = Registry::builder().tls(&ca)?.client_ca(&clients).start()?;
    assert!(reg.requires_client_cert());
    // Pushed through a plain side registry on the same storage.
    let image = push(&reg, "v1")?;

    let certs = tempfile::tempdir()?;
    let host_dir = reg.write_certs_d(certs.path())?;
    let (ok, out) = inspect(&image.by_tag, None, Some(&host_dir))?;
    assert!(
        !ok && out.contains("bad certificate"),
        "no client certificate, yet: {out}"
    );

    let client = clients.client_cert("pivot-node")?;
    client.write_client_certs_d(certs.path(), &reg.host())?;
    let (ok, out) = inspect(&image.by_tag, None, Some(&host_dir))?;
    assert!(ok, "{out}");
    assert!(out.contains(&image.digest), "{out}");

    // A client certificate from another CA is refused too.
    let wrong = ca.client_cert("intruder")?;
    wrong.write_client_certs_d(certs.path(), &reg.host())?;
    let (ok, out) = inspect(&image.by_tag, None, Some(&host_dir))?;
    assert!(
        !ok && out.contains("bad certificate"),
        "foreign client certificate accepted: {out}"
    );
    Ok(())
}

#[test]
fn storage_shared_or_copied() -> Result<()> {
    let primary = Registry::start()?;
    let first = push(&primary, "v1")?;
    let shared = Registry::builder().shared_storage(&primary).start()?;
    let copied = Registry::builder().storage_copied_from(&primary).start()?;
    let on = |reg: &Registry, tag: &str| format!("{}/os/pivot:{tag}", reg.host());

    for reg in [&shared, &copied] {
        let (ok, out) = inspect(&on(reg, "v1"), None, None)?;
        assert!(ok && out.contains(&first.digest), "{out}");
    }
    // Later pushes: shared storage sees them, a copy does not.
    push(&primary, "v2")?;
    assert!(inspect(&on(&shared, "v2"), None, None)?.0);
    assert!(!inspect(&on(&copied, "v2"), None, None)?.0);
    push(&copied, "v3")?;
    assert!(!inspect(&on(&primary, "v3"), None, None)?.0);

    // Image builds are reproducible: pushing the same spec to an independent
    // registry (a mirror) yields the same digests.
    let mirror = Registry::start()?;
    let again = push(&mirror, "v1")?;
    assert_eq!(again.digest, first.digest);
    assert_eq!(again.layer_digests, first.layer_digests);
    Ok(())
}
