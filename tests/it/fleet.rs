//! Fleets: the reboot strategy from `/etc/pivot/config.d`, and pivot's FleetLock client against
//! the test kit's server, which follows the published protocol. The reboot itself (waiting for
//! a slot, rebooting, giving it back at the next boot) is proven in the VM suite.

use std::process::Command;

use crate::common::*;
use pivot::fleet::config::FleetLock;
use pivot::fleet::fleet_lock::{Answer, Client};
use pivot::fleet::machine_id;
use pivot_testkit::FleetLockServer;

fn lock(server: &FleetLockServer, group: &str) -> FleetLock {
    FleetLock {
        base_url: server.base_url(),
        group: group.into(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn the_client_takes_and_gives_back_slots_as_the_protocol_says() {
    let server = FleetLockServer::start(1).unwrap();
    let rt = runtime();
    let a = Client::new(&lock(&server, "workers"), "node-a".into()).unwrap();
    let b = Client::new(&lock(&server, "workers"), "node-b".into()).unwrap();
    let canary = Client::new(&lock(&server, "canary"), "node-c".into()).unwrap();

    assert_eq!(rt.block_on(a.pre_reboot()).unwrap(), Answer::Granted);
    // Recursive: asking again while holding it is granted again.
    assert_eq!(rt.block_on(a.pre_reboot()).unwrap(), Answer::Granted);
    let refused = rt.block_on(b.pre_reboot()).unwrap();
    match &refused {
        Answer::Refused {
            status: 409,
            kind: Some(kind),
            why,
        } => {
            assert_eq!(kind, "failed_lock_semaphore_full");
            assert!(why.contains("semaphore currently full"), "{why}");
        }
        other => panic!("expected a full semaphore, got {other:?}"),
    }
    assert!(refused.to_string().contains("HTTP 409"), "{refused}");
    // Groups are separate semaphores.
    assert_eq!(rt.block_on(canary.pre_reboot()).unwrap(), Answer::Granted);
    assert_eq!(server.holders("workers"), ["node-a"]);

    // Giving back a slot one does not hold changes nothing; the holder's frees it.
    assert_eq!(rt.block_on(b.steady_state()).unwrap(), Answer::Granted);
    assert_eq!(server.holders("workers"), ["node-a"]);
    assert_eq!(rt.block_on(a.steady_state()).unwrap(), Answer::Granted);
    assert_eq!(rt.block_on(b.pre_reboot()).unwrap(), Answer::Granted);
    assert_eq!(server.holders("workers"), ["node-b"]);

    // Every request carried the header and body the server requires (it answers 400 without).
    let requests = server.requests();
    assert_eq!(requests.len(), 7);
    assert!(requests.iter().all(|r| r.status != 400), "{requests:#?}");
}

#[test]
fn an_unreachable_server_is_an_error_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let lock = FleetLock {
        base_url: format!("http://127.0.0.1:{port}"),
        group: "default".into(),
    };
    let client = Client::new(&lock, "node-a".into()).unwrap();
    let err = format!("{:#}", runtime().block_on(client.pre_reboot()).unwrap_err());
    assert!(
        err.contains(&format!("POST http://127.0.0.1:{port}/v1/pre-reboot")),
        "{err}"
    );
}

#[test]
fn the_node_id_is_zincatis_app_specific_machine_id() {
    // systemd-id128 reads /etc/machine-id; without it this comparison cannot be made.
    assert!(
        std::path::Path::new("/etc/machine-id").exists(),
        "this test compares with systemd-id128, which reads /etc/machine-id"
    );
    // zincati's application ID, spelled out: the id must be the one zincati sends.
    let out = Command::new("systemd-id128")
        .args([
            "machine-id",
            "--app-specific",
            "de35106b6ec24688b63afddaa156679b",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let systemd = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        machine_id::of_etc(std::path::Path::new("/etc")).unwrap(),
        systemd
    );
}

/// Writes `text` as a drop-in of the default deployment's /etc/pivot/config.d.
fn drop_in(env: &Env, name: &str, text: &str) {
    let dir = env.default_etc().join("pivot/config.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn confirm_gives_the_nodes_slot_back_at_every_boot() {
    let env = Env::new();
    let server = FleetLockServer::start(1).unwrap();
    let machine = "0123456789abcdef0123456789abcdef";
    std::fs::write(env.default_etc().join("machine-id"), format!("{machine}\n")).unwrap();
    drop_in(
        &env,
        "50-fleet.toml",
        &format!(
            "[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"{}/\"\ngroup = \"workers\"\n",
            server.base_url()
        ),
    );
    let id = machine_id::app_specific(machine, machine_id::APP_ID).unwrap();
    server.hold("workers", &id);

    assert_success(&env.subcommand("confirm", &[]));
    assert_eq!(server.holders("workers"), Vec::<String>::new());
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    assert_eq!(requests[0].operation, "steady-state");
    assert_eq!(
        (requests[0].id.as_str(), requests[0].group.as_str()),
        (id.as_str(), "workers")
    );

    // A server that answers otherwise is retried, then named in the failure.
    drop_in(
        &env,
        "90-local.toml",
        "[reboot.fleet_lock]\nbase_url = \"http://127.0.0.1:9/fleetlock\"\n",
    );
    let out = env.subcommand("confirm", &["--retry-timeout", "3"]);
    assert_fails_with(
        &out,
        &[
            "could not report steady state to the FleetLock server http://127.0.0.1:9/fleetlock",
            "within 3 s",
        ],
    );
}

#[test]
fn a_mistake_in_the_configuration_fails_the_pivot_before_anything_is_pulled() {
    let env = Env::new();
    let v2 = env.push_v2();
    drop_in(
        &env,
        "50-fleet.toml",
        "[reboot]\nstrategy = \"fleetlock\"\n",
    );
    let before = env.sysroot.snapshot().unwrap();
    assert_fails_with(&env.pivot(&[&v2.by_tag]), &["50-fleet.toml", "fleetlock"]);
    assert_eq!(env.registry.count_requests("GET", "/manifests/"), 0);
    assert_eq!(env.sysroot.snapshot().unwrap(), before);

    drop_in(
        &env,
        "50-fleet.toml",
        "[reboot]\nstrategy = \"fleet_lock\"\n",
    );
    assert_fails_with(
        &env.pivot(&[&v2.by_tag]),
        &[
            "reboot.strategy is fleet_lock",
            "reboot.fleet_lock.base_url",
        ],
    );
    // A valid one is read and the pivot goes on (this sysroot is not booted: no reboot).
    drop_in(&env, "50-fleet.toml", "[reboot]\nstrategy = \"sentinel\"\n");
    assert_success(&env.pivot(&[&v2.by_tag]));
    assert_eq!(env.deployed_images()[0], v2.commit);
}

/// `pivot-confirm.service` reads the proxy files `pivot.service` reads, and `pivot confirm` gives
/// the slot back through the proxy the environment names (a real tinyproxy), as the pull goes.
#[test]
fn the_slot_is_given_back_through_the_proxy_the_units_name() {
    let environment_files = |unit: &str| -> Vec<String> {
        let path = format!("{}/systemd/{unit}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("EnvironmentFile="))
            .map(str::to_string)
            .collect()
    };
    let confirm = environment_files("pivot-confirm.service");
    assert_eq!(confirm, environment_files("pivot.service"));
    assert!(
        confirm
            .iter()
            .any(|l| l == "EnvironmentFile=-/etc/mco/proxy.env"),
        "{confirm:?}"
    );

    let env = Env::new();
    let server = FleetLockServer::start(1).unwrap();
    let proxy = pivot_testkit::Tinyproxy::start().unwrap();
    let machine = "0123456789abcdef0123456789abcdef";
    std::fs::write(env.default_etc().join("machine-id"), format!("{machine}\n")).unwrap();
    drop_in(
        &env,
        "50-fleet.toml",
        &format!(
            "[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"{}/\"\n",
            server.base_url()
        ),
    );
    let out = env.subcommand_with_env("confirm", &[], &[("HTTP_PROXY", &proxy.url())]);
    assert_success(&out);
    assert_eq!(server.requests().len(), 1);
    let base = server.base_url();
    let host = base
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let carried = proxy.requests_to(&host);
    assert!(
        carried.iter().any(|r| r.contains("/v1/steady-state")),
        "steady-state did not go through the proxy: {carried:?}\n{}",
        proxy.log()
    );
}
