//! The test CA's certificates, checked by an independent peer (openssl).

use anyhow::{ensure, Context, Result};
use pivot_testkit::TestCa;
use std::fs;
use std::path::Path;
use std::process::Command;

/// Runs openssl; returns (success, stdout + stderr).
fn openssl(args: &[&str]) -> Result<(bool, String)> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok((out.status.success(), text))
}

fn write(dir: &Path, name: &str, text: &str) -> Result<String> {
    let path = dir.join(name);
    fs::write(&path, text)?;
    Ok(path.display().to_string())
}

#[test]
fn server_and_client_certs_chain_to_their_ca_only() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = TestCa::new("pivot test CA")?;
    let other = TestCa::new("some other CA")?;
    let ca_file = write(dir.path(), "ca.pem", &ca.ca_pem())?;
    let other_file = write(dir.path(), "other.pem", &other.ca_pem())?;

    let server = ca.server_cert(&["127.0.0.1", "localhost"])?;
    let server_file = write(dir.path(), "server.pem", &server.cert_pem)?;
    let (ok, text) = openssl(&[
        "verify",
        "-CAfile",
        &ca_file,
        "-purpose",
        "sslserver",
        "-verify_ip",
        "127.0.0.1",
        &server_file,
    ])?;
    ensure!(ok, "server cert does not verify: {text}");
    let (ok, text) = openssl(&["verify", "-CAfile", &other_file, &server_file])?;
    ensure!(!ok, "server cert verified against an unrelated CA: {text}");
    let (_, text) = openssl(&[
        "x509",
        "-noout",
        "-ext",
        "subjectAltName",
        "-in",
        &server_file,
    ])?;
    ensure!(
        text.contains("IP Address:127.0.0.1") && text.contains("DNS:localhost"),
        "{text}"
    );
    let key_file = write(dir.path(), "server.key", &server.key_pem)?;
    let (ok, text) = openssl(&["pkey", "-noout", "-in", &key_file])?;
    ensure!(ok, "server key unreadable: {text}");

    let client = ca.client_cert("pivot-client")?;
    let client_file = write(dir.path(), "client.pem", &client.cert_pem)?;
    let (ok, text) = openssl(&[
        "verify",
        "-CAfile",
        &ca_file,
        "-purpose",
        "sslclient",
        &client_file,
    ])?;
    ensure!(ok, "client cert does not verify: {text}");
    let (_, text) = openssl(&["x509", "-noout", "-subject", "-in", &client_file])?;
    ensure!(text.contains("CN = pivot-client"), "{text}");
    Ok(())
}

#[test]
fn certs_d_layout() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = TestCa::new("pivot test CA")?;
    let host_dir = ca.write_certs_d(dir.path(), "127.0.0.1:5000")?;
    assert_eq!(host_dir, dir.path().join("127.0.0.1:5000"));
    assert_eq!(fs::read_to_string(host_dir.join("ca.crt"))?, ca.ca_pem());
    let client = ca.client_cert("c")?;
    assert_eq!(
        client.write_client_certs_d(dir.path(), "127.0.0.1:5000")?,
        host_dir
    );
    assert_eq!(
        fs::read_to_string(host_dir.join("client.cert"))?,
        client.cert_pem
    );
    assert_eq!(
        fs::read_to_string(host_dir.join("client.key"))?,
        client.key_pem
    );
    Ok(())
}
