//! Bearer-token auth on the real registry through the kit's token server,
//! checked with skopeo and curl as independent peer clients.

use anyhow::{Context, Result};
use pivot_testkit::{
    basic_auth, push_oscontainer, ImageSpec, PushedImage, Registry, TestCa, TokenServer, Tree,
};
use serde_json::Value;
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

fn inspect(reference: &str, creds: &str, cert_dir: Option<&Path>) -> Result<(bool, String)> {
    let tls = match cert_dir {
        Some(dir) => format!("--cert-dir={}", dir.display()),
        None => "--tls-verify=false".into(),
    };
    let creds = format!("--creds={creds}");
    run(
        "skopeo",
        &["inspect", &tls, &creds, &format!("docker://{reference}")],
    )
}

fn push(reg: &Registry, tag: &str) -> Result<PushedImage> {
    let tree = Tree::default().with_file("usr/lib/os-release", 0o644, "ID=pivot-test\n");
    push_oscontainer(reg, "os/pivot", tag, &ImageSpec::new(tree, tag))
}

#[test]
fn registry_accepts_tokens_from_the_token_server() -> Result<()> {
    let tokens = TokenServer::builder()
        .user("alice", "s3cret")
        .user_with_actions("reader", "r34d", &["pull"])
        .start()?;
    let reg = Registry::builder().token_auth(&tokens).start()?;

    // Anonymous requests get the registry's Bearer challenge.
    let (_, headers) = run(
        "curl",
        &[
            "-s",
            "-D",
            "-",
            "-o",
            "/dev/null",
            &format!("{}/v2/", reg.url()),
        ],
    )?;
    let challenge = format!(
        "Www-Authenticate: Bearer realm=\"{}\",service=\"{}\"",
        tokens.realm(),
        tokens.service()
    );
    assert!(headers.contains(&challenge), "{headers}");

    // The kit's push fetched a pull,push token.
    let image = push(&reg, "v1")?;
    let pushes = tokens.requests();
    assert!(
        pushes.iter().any(|r| r.authorized
            && r.account.as_deref() == Some("alice")
            && r.granted
                .contains(&"repository:os/pivot:pull,push".to_string())),
        "{pushes:?}"
    );

    let before = tokens.request_count();
    let (ok, out) = inspect(&image.by_tag, "alice:s3cret", None)?;
    assert!(ok, "{out}");
    assert!(out.contains(&image.digest), "{out}");
    let seen = &tokens.requests()[before..];
    assert!(
        seen.iter().any(|r| r.status == 200
            && r.service.as_deref() == Some(tokens.service())
            && r.scopes.contains(&"repository:os/pivot:pull".to_string())),
        "{seen:?}"
    );

    let (ok, out) = inspect(&image.by_tag, "alice:wrong", None)?;
    assert!(!ok && out.contains("invalid username or password"), "{out}");
    let last = tokens.requests().pop().context("no token request")?;
    assert_eq!(
        (last.account.as_deref(), last.authorized, last.status),
        (Some("alice"), false, 401)
    );

    // A pull-only user reads but cannot push.
    let (ok, out) = inspect(&image.by_tag, "reader:r34d", None)?;
    assert!(ok, "{out}");
    let token = fetch_token(&tokens, "reader", "r34d", "repository:os/pivot:pull,push")?;
    let last = tokens.requests().pop().context("no token request")?;
    assert_eq!(last.granted, vec!["repository:os/pivot:pull".to_string()]);
    let uploads = format!("{}/v2/os/pivot/blobs/uploads/", reg.url());
    let auth = format!("Authorization: Bearer {token}");
    let (_, status) = run(
        "curl",
        &[
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            "POST",
            "-H",
            &auth,
            &uploads,
        ],
    )?;
    assert_eq!(status, "401");
    Ok(())
}

#[test]
fn token_endpoint_speaks_the_protocol() -> Result<()> {
    let tokens = TokenServer::start("alice", "s3cret")?;
    let url = format!(
        "{}?service={}&scope=repository%3Aos%2Fpivot%3Apull%2Cpush&scope=repository:other:delete",
        tokens.realm(),
        tokens.service()
    );
    let (ok, body) = run("curl", &["-sf", "-u", "alice:s3cret", &url])?;
    assert!(ok, "{body}");
    let reply: Value = serde_json::from_str(&body)?;
    assert_eq!(reply["token"], reply["access_token"]);
    assert_eq!(reply["expires_in"], 300);
    let token = reply["token"].as_str().context("token")?;
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3);
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header: Value = serde_json::from_slice(&b64.decode(parts[0])?)?;
    assert_eq!(header["alg"], "ES256");
    assert_eq!(header["x5c"].as_array().map(Vec::len), Some(1));
    let claims: Value = serde_json::from_slice(&b64.decode(parts[1])?)?;
    assert_eq!(claims["aud"], tokens.service());
    assert_eq!(claims["iss"], tokens.issuer());
    assert_eq!(claims["sub"], "alice");
    assert_eq!(
        claims["access"],
        serde_json::json!([
            { "type": "repository", "name": "os/pivot", "actions": ["pull", "push"] },
            { "type": "repository", "name": "other", "actions": ["delete"] },
        ])
    );

    let (_, status) = run(
        "curl",
        &["-s", "-o", "/dev/null", "-w", "%{http_code}", &url],
    )?;
    assert_eq!(status, "401");
    let auth = format!("Authorization: Basic {}", basic_auth("alice", "nope"));
    let (_, status) = run(
        "curl",
        &[
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            &auth,
            &url,
        ],
    )?;
    assert_eq!(status, "401");
    let log = tokens.requests();
    assert_eq!(log.len(), 3);
    assert_eq!(tokens.issued_count(), 1);
    assert_eq!(log[1].account, None);
    assert_eq!(
        (log[2].account.as_deref(), log[2].authorized),
        (Some("alice"), false)
    );
    Ok(())
}

/// A token from `server` for `scope`, fetched with curl.
fn fetch_token(server: &TokenServer, user: &str, pass: &str, scope: &str) -> Result<String> {
    let url = format!(
        "{}?service={}&scope={scope}",
        server.realm(),
        server.service()
    );
    let (ok, body) = run("curl", &["-sf", "-u", &format!("{user}:{pass}"), &url])?;
    anyhow::ensure!(ok, "token request failed: {body}");
    let reply: Value = serde_json::from_str(&body)?;
    Ok(reply["token"].as_str().context("token")?.to_string())
}

fn status_with_token(url: &str, token: &str) -> Result<String> {
    let auth = format!("Authorization: Bearer {token}");
    Ok(run(
        "curl",
        &[
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            &auth,
            url,
        ],
    )?
    .1)
}

#[test]
fn registry_verifies_signature_chain_and_scope() -> Result<()> {
    let tokens = TokenServer::start("alice", "s3cret")?;
    // Same service and issuer, but its signing chain is not in the registry's bundle.
    let impostor = TokenServer::start("alice", "s3cret")?;
    let reg = Registry::builder().token_auth(&tokens).start()?;
    push(&reg, "v1")?;
    let tags = format!("{}/v2/os/pivot/tags/list", reg.url());

    let good = fetch_token(&tokens, "alice", "s3cret", "repository:os/pivot:pull")?;
    assert_eq!(status_with_token(&tags, &good)?, "200");
    let forged = fetch_token(&impostor, "alice", "s3cret", "repository:os/pivot:pull")?;
    assert_eq!(status_with_token(&tags, &forged)?, "401");
    let elsewhere = fetch_token(&tokens, "alice", "s3cret", "repository:other:pull")?;
    assert_eq!(status_with_token(&tags, &elsewhere)?, "401");
    // Widening the other token's access in place breaks its signature.
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts: Vec<String> = elsewhere.split('.').map(str::to_string).collect();
    let mut claims: Value = serde_json::from_slice(&b64.decode(&parts[1])?)?;
    claims["access"][0]["name"] = "os/pivot".into();
    parts[1] = b64.encode(claims.to_string());
    assert_eq!(status_with_token(&tags, &parts.join("."))?, "401");
    assert!(reg.count_requests("GET", "/v2/os/pivot/tags/list") >= 4);
    let log = reg.log();
    assert!(log.contains("unable to verify certificate chain"), "{log}");
    assert!(log.contains("unable to verify token signature"), "{log}");
    Ok(())
}

#[test]
fn tls_registry_with_tls_token_realm() -> Result<()> {
    let ca = TestCa::new("pivot registry CA")?;
    let tokens = TokenServer::builder()
        .user("alice", "s3cret")
        .tls(&ca)?
        .start()?;
    assert!(tokens.realm().starts_with("https://127.0.0.1:"));
    let reg = Registry::builder().tls(&ca)?.token_auth(&tokens).start()?;
    let image = push(&reg, "v1")?;
    let certs = tempfile::tempdir()?;
    let host_dir = reg.write_certs_d(certs.path())?;
    let (ok, out) = inspect(&image.by_tag, "alice:s3cret", Some(&host_dir))?;
    assert!(ok, "{out}");
    assert!(out.contains(&image.digest), "{out}");
    Ok(())
}
