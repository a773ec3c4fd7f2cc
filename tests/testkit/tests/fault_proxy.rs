//! The fault-injecting proxy in front of the real registry, driven with curl,
//! skopeo and oci-client.

use anyhow::{ensure, Context, Result};
use pivot_testkit::{
    push_oscontainer, sha256_digest, Compression, Fault, FaultKind, FaultProxy, ImageSpec,
    PushedImage, Registry, Tree,
};
use std::process::Command;
use std::time::{Duration, Instant};

struct Curl {
    code: i32,
    body: Vec<u8>,
    /// `-w` output written to stderr: "<status> <header dump>".
    info: String,
}

/// curl through the proxy; the body to stdout, status and headers to stderr.
fn curl(url: &str, extra: &[&str]) -> Result<Curl> {
    let out = Command::new("curl")
        .args(["-s", "-D", "/dev/stderr", "-w", "%{stderr}%{http_code}"])
        .args(extra)
        .arg(url)
        .output()
        .context("running curl")?;
    Ok(Curl {
        code: out.status.code().unwrap_or(-1),
        body: out.stdout,
        info: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A registry holding an image with one incompressible-ish ~300 KB layer.
fn setup() -> Result<(Registry, PushedImage, Vec<u8>)> {
    let reg = Registry::start()?;
    let mut text = String::new();
    let mut seed = b"pivot".to_vec();
    while text.len() < 600_000 {
        seed = sha256_digest(&seed).into_bytes();
        text.push_str(&String::from_utf8_lossy(&seed[7..]));
    }
    let tree = Tree::default().with_file("usr/share/big", 0o644, &text);
    let mut spec = ImageSpec::new(tree, "1");
    spec.compression = Compression::None;
    let image = push_oscontainer(&reg, "os/pivot", "v1", &spec)?;
    let blob = std::fs::read(reg.blob_data_path(&image.layer_digests[0]))?;
    ensure!(blob.len() > 200_000, "layer only {} bytes", blob.len());
    Ok((reg, image, blob))
}

fn blob_url(proxy: &FaultProxy, image: &PushedImage) -> String {
    format!(
        "{}/v2/{}/blobs/{}",
        proxy.url(),
        image.repository,
        image.layer_digests[0]
    )
}

#[test]
fn passes_get_head_and_range_through_and_counts_bytes() -> Result<()> {
    let (reg, image, blob) = setup()?;
    let proxy = FaultProxy::start(&reg.host())?;
    assert_eq!(proxy.upstream(), reg.host());
    let url = blob_url(&proxy, &image);

    let full = curl(&url, &[])?;
    assert_eq!(full.code, 0, "{}", full.info);
    assert!(full.info.contains("Connection: close"), "{}", full.info);
    assert_eq!(sha256_digest(&full.body), image.layer_digests[0]);
    assert_eq!(proxy.body_bytes_sent("/blobs/"), blob.len() as u64);

    let head = curl(&url, &["-I"])?;
    assert_eq!(head.code, 0, "{}", head.info);
    let length = format!("Content-Length: {}", blob.len());
    assert!(head.info.contains(&length), "{}", head.info);

    let part = curl(&url, &["-r", "100-1099"])?;
    assert!(part.info.ends_with("206"), "{}", part.info);
    assert!(
        part.info.contains("Content-Range: bytes 100-1099/"),
        "{}",
        part.info
    );
    assert_eq!(part.body, blob[100..1100]);

    let reqs = proxy.requests();
    let summary: Vec<_> = reqs
        .iter()
        .map(|r| {
            (
                r.method.as_str(),
                r.range.as_deref(),
                r.status,
                r.body_bytes,
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            ("GET", None, Some(200), blob.len() as u64),
            ("HEAD", None, Some(200), 0),
            ("GET", Some("bytes=100-1099"), Some(206), 1000),
        ]
    );
    assert_eq!(proxy.body_bytes_sent(""), blob.len() as u64 + 1000);
    assert_eq!(proxy.count_requests("HEAD", "/blobs/"), 1);
    // Each request reached the registry once.
    assert_eq!(reg.count_requests("GET", &image.layer_digests[0]), 2);

    // A real client with keep-alive and manifest negotiation works through it.
    let out = Command::new("skopeo")
        .args(["inspect", "--tls-verify=false"])
        .arg(format!("docker://{}/os/pivot:v1", proxy.host()))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&image.digest), "{text}");
    Ok(())
}

#[test]
fn drop_after_cuts_the_body_then_a_range_resumes() -> Result<()> {
    let (reg, image, blob) = setup()?;
    let proxy = FaultProxy::start(&reg.host())?;
    let url = blob_url(&proxy, &image);
    proxy.add_fault(Fault::drop_after("/blobs/", 100_000));
    assert_eq!(proxy.pending_faults(), 1);

    let cut = curl(&url, &[])?;
    // 18: "transfer closed with outstanding read data remaining".
    assert_eq!(cut.code, 18, "{}", cut.info);
    assert_eq!(cut.body, blob[..100_000]);
    assert_eq!(proxy.pending_faults(), 0);

    let rest = curl(&url, &["-r", "100000-"])?;
    assert_eq!(rest.code, 0, "{}", rest.info);
    assert_eq!(rest.body, blob[100_000..]);
    let sent = proxy.body_bytes_sent("/blobs/");
    assert_eq!(sent, blob.len() as u64);
    let reqs = proxy.requests();
    assert_eq!(reqs[0].fault, Some(FaultKind::DropAfter(100_000)));
    assert_eq!(reqs[1].range.as_deref(), Some("bytes=100000-"));
    assert_eq!(reqs[1].fault, None);
    Ok(())
}

#[test]
fn injected_statuses_never_reach_the_registry() -> Result<()> {
    let (reg, image, _) = setup()?;
    let proxy = FaultProxy::start(&reg.host())?;
    let url = blob_url(&proxy, &image);
    let before = reg.count_requests("GET", "/blobs/");
    proxy.add_fault(Fault::status("/blobs/", 503).times(2));
    proxy.add_fault(Fault::too_many_requests("/blobs/", Some(7)));

    for _ in 0..2 {
        let r = curl(&url, &[])?;
        assert!(r.info.ends_with("503"), "{}", r.info);
        assert!(String::from_utf8_lossy(&r.body).contains("\"UNAVAILABLE\""));
    }
    let r = curl(&url, &[])?;
    assert!(r.info.ends_with("429"), "{}", r.info);
    assert!(r.info.contains("Retry-After: 7"), "{}", r.info);
    assert!(String::from_utf8_lossy(&r.body).contains("\"TOOMANYREQUESTS\""));
    assert_eq!(reg.count_requests("GET", "/blobs/"), before);

    let ok = curl(&url, &[])?;
    assert!(ok.info.ends_with("200"), "{}", ok.info);
    assert_eq!(reg.count_requests("GET", "/blobs/"), before + 1);
    let statuses: Vec<_> = proxy.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![Some(503), Some(503), Some(429), Some(200)]);
    Ok(())
}

#[test]
fn stall_reset_delay_and_method_filter() -> Result<()> {
    let (reg, image, blob) = setup()?;
    let proxy = FaultProxy::start(&reg.host())?;
    let url = blob_url(&proxy, &image);

    // A client timeout cuts a stalled transfer.
    proxy.add_fault(Fault::stall_after("/blobs/", 5000, Duration::from_secs(30)));
    let t = Instant::now();
    let r = curl(&url, &["--max-time", "1"])?;
    assert_eq!(r.code, 28, "{}", r.info);
    assert_eq!(r.body, blob[..5000]);
    assert!(t.elapsed() < Duration::from_secs(5));

    // Without one, the proxy closes after the stall.
    proxy.add_fault(Fault::stall_after(
        "/blobs/",
        10,
        Duration::from_millis(300),
    ));
    let t = Instant::now();
    let r = curl(&url, &[])?;
    assert_eq!((r.code, r.body.len()), (18, 10), "{}", r.info);
    assert!(t.elapsed() >= Duration::from_millis(300));

    proxy.add_fault(Fault::reset("/blobs/"));
    let r = curl(&url, &[])?;
    // 56: "Recv failure: Connection reset by peer".
    assert_eq!(r.code, 56, "{}", r.info);
    assert_eq!(proxy.requests().last().map(|r| r.status), Some(None));

    proxy.add_fault(Fault::delay("/blobs/", Duration::from_millis(400)));
    let t = Instant::now();
    let r = curl(&url, &[])?;
    assert_eq!((r.code, r.body.len()), (0, blob.len()), "{}", r.info);
    assert!(t.elapsed() >= Duration::from_millis(400));

    // A GET-only fault lets HEAD through and hits the next GET.
    proxy.add_fault(Fault::status("/blobs/", 500).method("GET"));
    assert!(curl(&url, &["-I"])?.info.contains("200"));
    assert!(curl(&url, &[])?.info.ends_with("500"));
    assert_eq!(proxy.pending_faults(), 0);
    Ok(())
}

#[test]
fn throttle_slows_bodies_to_the_rate_and_keeps_them_intact() -> Result<()> {
    let (reg, image, blob) = setup()?;
    let proxy = FaultProxy::start(&reg.host())?;
    let url = blob_url(&proxy, &image);
    let rate = blob.len() as u64 * 2; // half a second for the blob
    proxy.add_fault(Fault::throttle("/blobs/", rate).times(2));
    let t = Instant::now();
    let r = curl(&url, &[])?;
    let took = t.elapsed();
    assert_eq!((r.code, r.body == blob), (0, true), "{}", r.info);
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "took {took:?}"
    );
    // A range is throttled too, and only its bytes are counted.
    let t = Instant::now();
    let r = curl(&url, &["-r", &format!("{}-", blob.len() / 2)])?;
    assert_eq!(r.body, blob[blob.len() / 2..]);
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        proxy.body_bytes_sent("/blobs/"),
        (blob.len() + blob.len() - blob.len() / 2) as u64
    );
    Ok(())
}

#[test]
fn oci_client_sees_the_cut_and_a_clean_retry() -> Result<()> {
    use oci_client::client::{ClientConfig, ClientProtocol};
    use oci_client::{Client, Reference};
    let (reg, image, blob) = setup()?;
    let proxy = FaultProxy::start(&reg.host())?;
    proxy.add_fault(Fault::drop_after("/blobs/", 50_000));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let reference: Reference = format!("{}/os/pivot:v1", proxy.host()).parse()?;
    let digest = image.layer_digests[0].as_str();
    let mut first = Vec::new();
    let cut = rt.block_on(client.pull_blob(&reference, digest, &mut first));
    assert!(cut.is_err(), "cut transfer reported success");
    let mut second = Vec::new();
    rt.block_on(client.pull_blob(&reference, digest, &mut second))?;
    assert_eq!(second, blob);
    // Client-side buffering may hide some of the cut bytes; the proxy counts what it sent.
    assert_eq!(proxy.body_bytes_sent(digest), 50_000 + blob.len() as u64);
    Ok(())
}

#[test]
fn refuses_connections_for_a_while_then_serves_again() -> Result<()> {
    let reg = Registry::start()?;
    let proxy = FaultProxy::start(&reg.host())?;
    let url = format!("{}/v2/", proxy.url());
    assert!(curl(&url, &[])?.info.ends_with("200"));

    let t = Instant::now();
    proxy.refuse_connections_for(Duration::from_millis(800))?;
    let r = curl(&url, &[])?;
    // 7: "Failed to connect ... Connection refused".
    assert_eq!(r.code, 7, "{}", r.info);
    while t.elapsed() < Duration::from_millis(1200) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = curl(&url, &[])?;
    assert!(r.info.ends_with("200"), "{}", r.info);
    assert_eq!(proxy.count_requests("GET", "/v2/"), 2);
    Ok(())
}
