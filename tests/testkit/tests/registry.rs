use anyhow::{Context, Result};
use pivot_testkit::Registry;
use std::io::{Read, Write};
use std::net::TcpStream;

/// One plain HTTP/1.0 GET; returns the status line.
fn get(host: &str, path: &str) -> Result<String> {
    let mut s = TcpStream::connect(host).context("connecting")?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out.lines().next().unwrap_or_default().to_string())
}

#[test]
fn registry_answers_v2_and_logs_requests() -> Result<()> {
    let mut reg = Registry::start()?;
    let host = reg.host();
    assert!(host.starts_with("127.0.0.1:"));
    assert!(get(&host, "/v2/")?.contains(" 200 "));
    assert!(get(&host, "/v2/nope/manifests/latest")?.contains(" 404 "));

    assert_eq!(reg.count_requests("GET", "/v2/nope/manifests/latest"), 1);
    assert_eq!(reg.count_requests("HEAD", "/v2/nope/manifests"), 0);
    let last = reg.requests().pop().context("no requests logged")?;
    assert_eq!((last.method.as_str(), last.status), ("GET", 404));
    // Readiness polling and our GET both hit /v2/.
    assert!(reg.count_requests("GET", "/v2/") >= 2);

    let dir = tempfile::tempdir()?;
    let conf = std::fs::read_to_string(reg.registries_conf(dir.path())?)?;
    assert!(conf.contains(&format!("location = \"{host}\"")), "{conf}");
    assert!(conf.contains("insecure = true"), "{conf}");

    assert!(reg
        .blob_data_path("sha256:abcdef")
        .ends_with("docker/registry/v2/blobs/sha256/ab/abcdef/data"));

    reg.stop();
    reg.stop();
    assert!(
        get(&host, "/v2/").is_err(),
        "registry still answering after stop"
    );
    reg.start_again()?;
    assert_eq!(reg.host(), host);
    assert!(get(&host, "/v2/")?.contains(" 200 "));
    // The log survives restarts, so counts are cumulative.
    assert_eq!(reg.count_requests("GET", "/v2/nope/"), 1);
    Ok(())
}

#[test]
fn drop_stops_the_process_and_removes_its_dir() -> Result<()> {
    let reg = Registry::start()?;
    let host = reg.host();
    let storage = reg.storage_dir();
    assert!(storage.parent().unwrap().join("config.yml").exists());
    drop(reg);
    assert!(get(&host, "/v2/").is_err());
    assert!(!storage.parent().unwrap().exists());
    Ok(())
}
