//! Fleets: the reboot strategy from `/etc/pivot/config.d`, and pivot's FleetLock client against
//! the test kit's servers, which answer as airlock and poseidon/fleetlock do (see the test kit's
//! `fleet_lock.rs` for where in their source). The reboot itself (staged locked, waiting for a
//! slot, rebooting, giving it back at the next boot beside kubelet) is proven in the VM suite.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use pivot::fleet::config::FleetLock;
use pivot::fleet::fleet_lock::{Answer, Client};
use pivot::fleet::machine_id;
use pivot::fleet::slot::{Records, Slot, RECORD};
use pivot_testkit::FleetLockServer;

/// `server`'s group `group`, asked every second (zincati's 300 s would make long tests).
fn lock(server: &FleetLockServer, group: &str) -> FleetLock {
    FleetLock {
        interval: INTERVAL,
        ..FleetLock::new(&server.base_url(), group)
    }
}

const INTERVAL: Duration = Duration::from_secs(1);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn the_client_takes_and_gives_back_slots_as_airlock_answers() {
    let server = FleetLockServer::airlock(&[("workers", 1), ("canary", 1)]).unwrap();
    let rt = runtime();
    let a = Client::new(&lock(&server, "workers"), "node-a".into()).unwrap();
    let b = Client::new(&lock(&server, "workers"), "node-b".into()).unwrap();
    let canary = Client::new(&lock(&server, "canary"), "node-c".into()).unwrap();

    assert_eq!(rt.block_on(a.pre_reboot()).unwrap(), Answer::Granted);
    // Recursive: asking again while holding it is granted again.
    assert_eq!(rt.block_on(a.pre_reboot()).unwrap(), Answer::Granted);
    // A full semaphore is airlock's 500 failed_lock: not now, ask again later.
    let refused = rt.block_on(b.pre_reboot()).unwrap();
    match &refused {
        Answer::Refused {
            status: 500,
            kind: Some(kind),
            why,
            ..
        } => {
            assert_eq!(kind, "failed_lock");
            assert!(
                why.contains("all 1 semaphore slots currently locked"),
                "{why}"
            );
        }
        other => panic!("expected a full semaphore, got {other:?}"),
    }
    assert!(!refused.is_misconfiguration());
    assert!(refused.to_string().contains("HTTP 500"), "{refused}");
    // Groups are separate semaphores.
    assert_eq!(rt.block_on(canary.pre_reboot()).unwrap(), Answer::Granted);
    assert_eq!(server.holders("workers"), ["node-a"]);

    // Giving back a slot one does not hold changes nothing; the holder's frees it.
    assert_eq!(rt.block_on(b.steady_state()).unwrap(), Answer::Granted);
    assert_eq!(server.holders("workers"), ["node-a"]);
    assert_eq!(rt.block_on(a.steady_state()).unwrap(), Answer::Granted);
    assert_eq!(rt.block_on(b.pre_reboot()).unwrap(), Answer::Granted);
    assert_eq!(server.holders("workers"), ["node-b"]);

    // A group airlock is not configured for is a refusal for good.
    let stray = Client::new(&lock(&server, "nobody"), "node-d".into()).unwrap();
    let unknown = rt.block_on(stray.pre_reboot()).unwrap();
    assert!(unknown.is_misconfiguration(), "{unknown}");
    assert!(unknown.to_string().contains("unknown group"), "{unknown}");

    // Every request carried the header and body the server requires (it answers 400 without).
    let requests = server.requests();
    assert_eq!(requests.len(), 8);
    assert!(
        requests[..7].iter().all(|r| r.status != 400),
        "{requests:#?}"
    );
}

#[test]
fn an_unreachable_server_is_an_error_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let lock = FleetLock::new(&format!("http://127.0.0.1:{port}"), "default");
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

const MACHINE: &str = "0123456789abcdef0123456789abcdef";

/// A node on `env` whose machine ID is [`MACHINE`] and whose reboot strategy is `fleet_lock` at
/// `server`, group `group`.
fn fleet_node(env: &Env, server: &FleetLockServer, group: &str) -> pivot::fleet::Node {
    std::fs::write(env.default_etc().join("machine-id"), format!("{MACHINE}\n")).unwrap();
    drop_in(
        env,
        "50-fleet.toml",
        &format!(
            "[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"{}\"\ngroup = \"{group}\"\ninterval = {}\n",
            server.base_url(),
            INTERVAL.as_secs()
        ),
    );
    pivot::run::fleet_node(&env.sysroot.path).unwrap().0
}

/// The record pivot writes when it asks `lock` for a slot for `id`, as an earlier boot left it.
fn recorded_in_an_earlier_boot(node: &pivot::fleet::Node, lock: &FleetLock, id: &str) {
    let records = Records::lock(&node.state_dir).unwrap();
    records
        .write(&Slot::new(lock, id, "an-earlier-boot"))
        .unwrap();
}

/// The node reboots: the record of the slot it took now comes from an earlier boot. (The test
/// process cannot reboot; the record's boot id is what says which boot asked.)
fn reboot(node: &pivot::fleet::Node) {
    let records = Records::lock(&node.state_dir).unwrap();
    let mut slot: Slot = records.read().unwrap().expect("a slot was recorded");
    slot.boot_id = "an-earlier-boot".into();
    records.write(&slot).unwrap();
}

/// The whole cycle against poseidon/fleetlock: pivot takes the group's lease under zincati's id
/// (the server finds the Kubernetes node by it and drains it), the node reboots, and `pivot
/// steady-state` gives the lease back and uncordons the node: the next node can go.
#[test]
fn the_poseidon_group_is_free_again_after_the_nodes_reboot() {
    let env = Env::new();
    let server = FleetLockServer::poseidon().unwrap();
    server.add_node("worker-0", MACHINE);
    let node = fleet_node(&env, &server, "workers");
    let id = pivot_testkit::zincati_id(MACHINE).unwrap();

    let lock = lock(&server, "workers");
    runtime()
        .block_on(pivot::fleet::take_slot(&lock, &node))
        .unwrap();
    assert_eq!(server.holders("workers"), [id.as_str()]);
    let drained = server.node("worker-0").unwrap();
    assert!(drained.unschedulable && drained.drains == 1, "{drained:?}");
    // Not yet rebooted: nothing is given back.
    let out = env.subcommand("steady-state", &[]);
    assert_success(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("asked for in this boot"));
    assert_eq!(server.holders("workers"), [id.as_str()]);

    reboot(&node);
    let out = env.subcommand("steady-state", &[]);
    assert_success(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("gave the reboot slot of {id} back")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(server.holders("workers").is_empty());
    assert!(!server.node("worker-0").unwrap().unschedulable);
    assert!(!node.state_dir.join(RECORD).exists());
    // The next node of the group gets the lease.
    let next = Client::new(&lock, "another-node".into()).unwrap();
    assert_eq!(
        runtime().block_on(next.pre_reboot()).unwrap(),
        Answer::Granted
    );

    // (That node is not in the cluster: poseidon cannot uncordon it, so it is let go by hand.)
    server.release("workers", "another-node");
    // Nothing recorded: the node is reported steady under its id all the same, as zincati
    // reports at every start; poseidon answers that the lease is not held.
    let asked = server.requests().len();
    let out = env.subcommand("steady-state", &[]);
    assert_success(&out);
    let requests = server.requests();
    assert_eq!(requests.len(), asked + 1);
    let last = requests.last().unwrap();
    assert_eq!(
        (last.operation.as_str(), last.id.as_str(), last.status),
        ("steady-state", id.as_str(), 200)
    );
}

/// poseidon/fleetlock answers `423 lock_held` to a steady-state while another node holds the
/// group's lease: not a failure but a wait, until that node is done.
#[test]
fn steady_state_waits_out_another_nodes_poseidon_lease() {
    let env = Env::new();
    let server = FleetLockServer::poseidon().unwrap();
    server.add_node("worker-0", MACHINE);
    let node = fleet_node(&env, &server, "workers");
    let id = pivot_testkit::zincati_id(MACHINE).unwrap();
    recorded_in_an_earlier_boot(&node, &lock(&server, "workers"), &id);
    server.hold("workers", "another-node");
    let mut child = env.spawn_subcommand("steady-state");
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        child.try_wait().unwrap().is_none(),
        "steady-state gave up on a 423"
    );
    server.release("workers", "another-node");
    let status = wait_for(&mut child, Duration::from_secs(40));
    assert!(status.success());
    let answers: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert!(
        answers.starts_with(&[423]) && answers.ends_with(&[200]),
        "{answers:?}"
    );
}

/// A server that is down after the reboot still gets the node's steady-state once it is back
/// (within one interval, jittered), whatever the configuration says now: the record names the
/// server and the cadence it was asked at. Nothing else waits for it (kubelet's side of that is
/// in the VM suite's fleet scenario).
#[test]
fn a_server_that_is_down_gets_its_steady_state_once_back() {
    let (env, server, node, id) = airlock_node();
    server.hold("workers", &id);
    recorded_in_an_earlier_boot(&node, &lock(&server, "workers"), &id);
    // The admin moved the node to another strategy since: the slot is given back all the same.
    drop_in(&env, "50-fleet.toml", "[reboot]\nstrategy = \"never\"\n");

    let down = Duration::from_secs(6);
    server.down_for(down).unwrap();
    let started = Instant::now();
    let mut child = env.spawn_subcommand("steady-state");
    let status = wait_for(&mut child, down + Duration::from_secs(30));
    let took = started.elapsed();
    assert!(status.success());
    assert!(
        took >= down,
        "done after {took:?}, while the server was down"
    );
    assert!(took < down + Duration::from_secs(3), "took {took:?}");
    assert!(server.holders("workers").is_empty());
    assert!(!node.state_dir.join(RECORD).exists());
}

/// A refusal only a change of configuration can turn into a yes (here airlock's
/// `400 unknown_group`) is loud, in the server's words, and asked again slowly, not abandoned
/// until the next boot: once the admin adds the group, the slot is given back.
#[test]
fn a_misconfigured_group_is_loud_and_asked_again_slowly() {
    let env = Env::new();
    let server = FleetLockServer::airlock(&[("workers", 1)]).unwrap();
    let node = fleet_node(&env, &server, "wrokers");
    let id = pivot_testkit::zincati_id(MACHINE).unwrap();
    recorded_in_an_earlier_boot(&node, &lock(&server, "wrokers"), &id);
    let mut child = env.spawn_subcommand("steady-state");
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        child.try_wait().unwrap().is_none(),
        "steady-state gave up on a 400"
    );
    // Slowly: six intervals, not one.
    assert_eq!(server.requests().len(), 1, "{:?}", server.requests());
    server.add_group("wrokers", 1);
    let status = wait_for(&mut child, Duration::from_secs(15));
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("unknown group \"wrokers\"") && stderr.contains("HTTP 400"),
        "{stderr}"
    );
    let statuses: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert!(statuses.starts_with(&[400, 200]), "{statuses:?}");
    assert!(!node.state_dir.join(RECORD).exists());
}

/// `pivot confirm` no longer talks to the FleetLock server: it runs before kubelet, and giving
/// the slot back may take as long as the server is away.
#[test]
fn confirm_leaves_the_slot_to_steady_state() {
    let env = Env::new();
    let server = FleetLockServer::start(1).unwrap();
    let node = fleet_node(&env, &server, "default");
    let id = pivot_testkit::zincati_id(MACHINE).unwrap();
    recorded_in_an_earlier_boot(&node, &lock(&server, "default"), &id);
    assert_success(&env.subcommand("confirm", &[]));
    assert!(server.requests().is_empty(), "{:?}", server.requests());

    let unit = |name: &str| {
        std::fs::read_to_string(format!("{}/systemd/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
    };
    let steady = unit("pivot-steady-state.service");
    for line in [
        "Type=exec",
        "After=network-online.target pivot-confirm.service",
        "ExecStart=/usr/bin/pivot steady-state",
    ] {
        assert!(
            steady.lines().any(|l| l == line),
            "{line} missing:\n{steady}"
        );
    }
    assert!(
        !steady.contains("Before="),
        "nothing may wait for it:\n{steady}"
    );
    // It runs at every boot, as zincati reports steady at every start, record or not.
    assert!(
        !steady.contains("ConditionPathExists=/var/lib/pivot/fleet-lock.json"),
        "{steady}"
    );
}

fn wait_for(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `pivot-steady-state.service` reads the proxy files `pivot.service` reads, and `pivot
/// steady-state` gives the slot back through the proxy the environment names (a real
/// tinyproxy), as the pull goes.
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
    let steady = environment_files("pivot-steady-state.service");
    assert_eq!(steady, environment_files("pivot.service"));
    assert!(
        steady
            .iter()
            .any(|l| l == "EnvironmentFile=-/etc/mco/proxy.env"),
        "{steady:?}"
    );

    let env = Env::new();
    let server = FleetLockServer::start(1).unwrap();
    let proxy = pivot_testkit::Tinyproxy::start().unwrap();
    let node = fleet_node(&env, &server, "default");
    let id = pivot_testkit::zincati_id(MACHINE).unwrap();
    server.hold("default", &id);
    recorded_in_an_earlier_boot(&node, &lock(&server, "default"), &id);
    let out = env.subcommand_with_env("steady-state", &[], &[("HTTP_PROXY", &proxy.url())]);
    assert_success(&out);
    // The record's release, then the report under the node's id (the same here).
    assert_eq!(server.requests().len(), 2);
    assert!(server.holders("default").is_empty());
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

/// `pivot finalize --reboot` with nothing staged asks no server for a slot it would not use.
#[test]
fn finalize_with_nothing_staged_takes_no_slot() {
    let env = Env::new();
    let server = FleetLockServer::start(1).unwrap();
    let node = fleet_node(&env, &server, "default");
    assert_fails_with(
        &env.subcommand("finalize", &["--reboot"]),
        &["no deployment is staged"],
    );
    assert!(server.requests().is_empty(), "{:?}", server.requests());
    assert!(!node.state_dir.join(RECORD).exists());
}

/// `pivot config` shows each key with the drop-in that set it: the image's
/// (`/usr/lib/pivot/config.d`), the admin's (`/etc/pivot/config.d`) or the default.
#[test]
fn config_shows_where_each_value_comes_from() {
    let env = Env::new();
    let root = env.deployment(0);
    let vendor = root.join("usr/lib/pivot/config.d");
    std::fs::create_dir_all(&vendor).unwrap();
    std::fs::write(
        vendor.join("10-fleet.toml"),
        "[reboot]\nstrategy = \"fleet_lock\"\n[reboot.fleet_lock]\nbase_url = \"http://lock:8080/\"\n",
    )
    .unwrap();
    drop_in(
        &env,
        "50-group.toml",
        "[reboot.fleet_lock]\ngroup = \"canary\"\n",
    );
    let checks = root.join("usr/lib/pivot/health.d");
    std::fs::create_dir_all(&checks).unwrap();
    std::fs::write(checks.join("10-runtime"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        checks.join("10-runtime"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    let out = env.subcommand("config", &[]);
    assert_success(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
            .to_string()
    };
    assert!(line("reboot.strategy").contains("fleet_lock"));
    assert!(line("reboot.strategy").ends_with("usr/lib/pivot/config.d/10-fleet.toml"));
    assert!(line("reboot.fleet_lock.group").ends_with("etc/pivot/config.d/50-group.toml"));
    assert!(line("health.timeout").ends_with("# (default)"), "{text}");
    assert!(line("boot.tries").starts_with("boot.tries = 3 "), "{text}");
    assert!(text.contains("usr/lib/pivot/health.d/10-runtime"), "{text}");

    // Masked by the admin: the default again, and the check gone.
    let etc_checks = env.default_etc().join("pivot/health.d");
    std::fs::create_dir_all(&etc_checks).unwrap();
    std::os::unix::fs::symlink("/dev/null", etc_checks.join("10-runtime")).unwrap();
    std::os::unix::fs::symlink(
        "/dev/null",
        env.default_etc().join("pivot/config.d/10-fleet.toml"),
    )
    .unwrap();
    let text = String::from_utf8_lossy(&env.subcommand("config", &[]).stdout).into_owned();
    assert!(text.contains("reboot.strategy = immediate"), "{text}");
    assert!(text.contains("health checks: none"), "{text}");
}

/// The deadlock zincati's id avoids, as poseidon/fleetlock makes it: an id that matches no
/// Kubernetes node still gets the lease (the drain's failure is ignored), but its steady-state
/// is refused with 500 for good, and the group stays locked.
#[test]
fn an_id_poseidon_cannot_match_to_a_node_never_gives_the_lease_back() {
    let server = FleetLockServer::poseidon().unwrap();
    server.add_node("worker-0", MACHINE);
    let rt = runtime();
    let stranger = Client::new(
        &lock(&server, "workers"),
        "0123456789abcdef0123456789abcdef".into(),
    )
    .unwrap();
    assert_eq!(rt.block_on(stranger.pre_reboot()).unwrap(), Answer::Granted);
    assert_eq!(
        server.node("worker-0").unwrap().drains,
        0,
        "the wrong node was drained"
    );
    let refused = rt.block_on(stranger.steady_state()).unwrap();
    assert!(
        matches!(&refused, Answer::Refused { status: 500, kind: Some(k), .. } if k == "internal_error"),
        "{refused:?}"
    );
    assert!(
        !refused.is_misconfiguration(),
        "a 500 is waited out, as zincati does"
    );
    assert_eq!(
        server.holders("workers"),
        ["0123456789abcdef0123456789abcdef"]
    );
    // The node's real id is zincati's, which the server matches.
    let node = Client::new(
        &lock(&server, "canary"),
        pivot_testkit::zincati_id(MACHINE).unwrap(),
    )
    .unwrap();
    assert_eq!(rt.block_on(node.pre_reboot()).unwrap(), Answer::Granted);
    assert_eq!(server.node("worker-0").unwrap().drains, 1);
    assert_eq!(rt.block_on(node.steady_state()).unwrap(), Answer::Granted);
    assert!(server.holders("canary").is_empty());
}

/// A node of group `workers` at an airlock with one slot there, and its FleetLock id.
fn airlock_node() -> (Env, FleetLockServer, pivot::fleet::Node, String) {
    let env = Env::new();
    let server = FleetLockServer::airlock(&[("workers", 1)]).unwrap();
    let node = fleet_node(&env, &server, "workers");
    (
        env,
        server,
        node,
        pivot_testkit::zincati_id(MACHINE).unwrap(),
    )
}

/// The record as it stands in `node`'s state directory.
fn recorded(node: &pivot::fleet::Node) -> Option<Slot> {
    Records::lock(&node.state_dir).unwrap().read().unwrap()
}

/// A step after the grant fails (the unlock, marking the reboot, `systemctl reboot`): no
/// reboot follows, so the slot is given back at once, and the step's own error is the one
/// reported.
#[test]
fn every_failure_after_the_grant_gives_the_slot_back() {
    let (env, server, node, id) = airlock_node();
    let lock = lock(&server, "workers");
    let err = runtime()
        .block_on(pivot::fleet::with_slot(&lock, &node, async {
            anyhow::bail!("systemctl reboot failed: exit status: 1")
        }))
        .unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("systemctl reboot failed") && err.contains("given back"),
        "{err}"
    );
    assert!(server.holders("workers").is_empty(), "the slot leaked");
    assert!(recorded(&node).is_none(), "{:?}", recorded(&node));

    let ops: Vec<(String, u16)> = server
        .requests()
        .iter()
        .map(|r| (r.operation.clone(), r.status))
        .collect();
    assert_eq!(
        ops,
        [
            ("pre-reboot".to_string(), 200),
            ("steady-state".to_string(), 200)
        ]
    );

    // A bug in a step (a panic) is a failure like any other: the slot goes back too.
    let err = runtime()
        .block_on(pivot::fleet::with_slot(&lock, &node, async {
            let steps: Vec<u8> = Vec::new();
            Ok(std::hint::black_box(steps)[0]).map(|_| ())
        }))
        .unwrap_err();
    let err = format!("{err:#}");
    assert!(
        err.contains("internal error (a bug in pivot)") && err.contains("given back"),
        "{err}"
    );
    let ops: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.operation.clone())
        .collect();
    assert_eq!(
        ops[2..],
        ["pre-reboot", "steady-state"],
        "granted, then given back"
    );
    assert!(server.holders("workers").is_empty(), "the slot leaked");
    assert!(recorded(&node).is_none(), "{:?}", recorded(&node));

    // The server is gone when the step fails: the record says "give it back now", and the
    // next `pivot steady-state` of this same boot does, once the server is back.
    let err = runtime().block_on(pivot::fleet::with_slot(&lock, &node, async {
        // (From a thread of its own: the test kit's server blocks on its own runtime.)
        std::thread::scope(|t| {
            t.spawn(|| server.down_for(Duration::from_secs(3)).unwrap())
                .join()
                .unwrap()
        });
        anyhow::bail!("unlocking the staged deployment: no such file")
    }));
    assert!(err.is_err());
    assert_eq!(server.holders("workers"), [id.as_str()]);
    let slot = recorded(&node).expect("the slot is still recorded");
    assert!(slot.give_back && slot.may_hold, "{slot:?}");
    let out = env.subcommand("steady-state", &[]);
    assert_success(&out);
    assert!(server.holders("workers").is_empty(), "the slot leaked");
    assert!(recorded(&node).is_none());
}

/// A gateway in front of the server loses the grant's answer (502): the server holds the slot
/// for this node, so the record keeps "may hold", and the next boot gives it back.
#[test]
fn a_grant_whose_answer_was_lost_is_given_back() {
    let (env, server, node, id) = airlock_node();
    server.gateway(&[pivot_testkit::FleetLockGateway::LoseAnswer]);
    // The run ends (the node is rebooted by someone else, say) before asking again.
    let rt = runtime();
    let taken = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(700),
            pivot::fleet::take_slot(&lock(&server, "workers"), &node),
        )
        .await
    });
    assert!(
        taken.is_err(),
        "the slot was granted without a second request"
    );
    assert_eq!(server.holders("workers"), [id.as_str()]);
    assert!(recorded(&node).unwrap().may_hold);
    reboot(&node);
    assert_success(&env.subcommand("steady-state", &[]));
    assert!(server.holders("workers").is_empty(), "the slot leaked");
}

/// `Retry-After` from a gateway in front of the server is honoured: the next pre-reboot waits
/// at least that long, though the interval is shorter.
#[test]
fn a_rate_limited_fleetlock_request_waits_out_retry_after() {
    let env = Env::new();
    let server = FleetLockServer::airlock(&[("workers", 1)]).unwrap();
    let node = fleet_node(&env, &server, "workers");
    server.gateway(&[pivot_testkit::FleetLockGateway::RateLimit { retry_after: 3 }]);
    runtime()
        .block_on(pivot::fleet::take_slot(&lock(&server, "workers"), &node))
        .unwrap();
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0].status, 429);
    let waited = requests[1].at - requests[0].at;
    assert!(
        waited >= Duration::from_secs(3),
        "asked again after {waited:?}"
    );
}

/// A slot this boot asked of another server or group (the configuration changed since) is
/// given back there before the new one is asked for: the record of it is never overwritten.
#[test]
fn a_slot_asked_of_another_server_in_this_boot_is_given_back_there_first() {
    let env = Env::new();
    let old = FleetLockServer::airlock(&[("workers", 1)]).unwrap();
    let new = FleetLockServer::airlock(&[("workers", 1)]).unwrap();
    let node = fleet_node(&env, &new, "workers");
    let id = pivot_testkit::zincati_id(MACHINE).unwrap();
    let rt = runtime();
    rt.block_on(pivot::fleet::take_slot(&lock(&old, "workers"), &node))
        .unwrap();
    assert_eq!(old.holders("workers"), [id.as_str()]);
    rt.block_on(pivot::fleet::take_slot(&lock(&new, "workers"), &node))
        .unwrap();
    assert!(old.holders("workers").is_empty(), "the old slot leaked");
    assert_eq!(new.holders("workers"), [id.as_str()]);
    assert_eq!(recorded(&node).unwrap().base_url, new.base_url());
}

/// Giving a slot back needs nothing but its record: a configuration this pivot cannot read (a
/// key of a newer pivot, on a node rolled back) fails the unit, after the slot is given back.
#[test]
fn the_slot_is_given_back_whatever_the_configuration_says() {
    let (env, server, node, id) = airlock_node();
    server.hold("workers", &id);
    recorded_in_an_earlier_boot(&node, &lock(&server, "workers"), &id);
    drop_in(
        &env,
        "60-newer.toml",
        "[reboot.fleet_lock]\nsomething_newer = 1\n",
    );
    let out = env.subcommand("steady-state", &[]);
    assert_fails_with(&out, &["60-newer.toml", "something_newer"]);
    assert!(server.holders("workers").is_empty(), "the slot leaked");
    assert!(recorded(&node).is_none());
}

/// After a machine-ID change the slot is given back under the id it was taken as (airlock
/// frees it), and the change is named: poseidon cannot match the old id to a node.
#[test]
fn a_slot_taken_before_a_machine_id_change_is_given_back_under_its_id() {
    let env = Env::new();
    let server = FleetLockServer::airlock(&[("workers", 1)]).unwrap();
    let node = fleet_node(&env, &server, "workers");
    let old_id = pivot_testkit::zincati_id("fedcba9876543210fedcba9876543210").unwrap();
    server.hold("workers", &old_id);
    recorded_in_an_earlier_boot(&node, &lock(&server, "workers"), &old_id);
    let out = env.subcommand("steady-state", &[]);
    assert_success(&out);
    assert!(server.holders("workers").is_empty(), "the slot leaked");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("machine ID changed") && stderr.contains(&old_id),
        "{stderr}"
    );
    // Then the node is reported steady under its id now, as zincati would.
    let id = pivot_testkit::zincati_id(MACHINE).unwrap();
    let last = server.requests().last().cloned().unwrap();
    assert_eq!(
        (last.operation.as_str(), last.id.as_str()),
        ("steady-state", id.as_str())
    );
}

/// As zincati at every start: a slot another agent took under this node's id (zincati before
/// pivot, or pivot's record lost) is released by the next `pivot steady-state`.
#[test]
fn steady_state_is_reported_at_every_start_as_zincati_does() {
    let (env, server, node, id) = airlock_node();
    server.hold("workers", &id);
    assert!(recorded(&node).is_none());
    assert_success(&env.subcommand("steady-state", &[]));
    assert!(server.holders("workers").is_empty());

    // Not while this boot holds a slot for a reboot still to come: that would undo its grant.
    runtime()
        .block_on(pivot::fleet::take_slot(&lock(&server, "workers"), &node))
        .unwrap();
    let asked = server.requests().len();
    assert_success(&env.subcommand("steady-state", &[]));
    assert_eq!(server.requests().len(), asked);
    assert_eq!(server.holders("workers"), [id.as_str()]);
}

/// poseidon/fleetlock drains the node inside the pre-reboot request: pivot waits for its
/// answer (zincati allows 30 minutes) instead of timing out and asking again.
#[test]
fn poseidon_is_given_the_time_its_drain_takes() {
    let env = Env::new();
    let server = FleetLockServer::poseidon().unwrap();
    server.add_node("worker-0", MACHINE);
    server.set_drain_time(Duration::from_secs(3));
    let node = fleet_node(&env, &server, "workers");
    let started = Instant::now();
    runtime()
        .block_on(pivot::fleet::take_slot(&lock(&server, "workers"), &node))
        .unwrap();
    assert!(started.elapsed() >= Duration::from_secs(3));
    assert_eq!(server.requests().len(), 1, "{:?}", server.requests());
    assert_eq!(server.node("worker-0").unwrap().drains, 1);
}

/// The base URL is resolved as zincati resolves it: without a trailing `/` its last segment
/// is replaced, so `http://host/fleetlock` asks `http://host/v1/pre-reboot`.
#[test]
fn the_base_url_is_joined_as_zincati_joins_it() {
    let server = FleetLockServer::start(1).unwrap();
    let rt = runtime();
    let root = server.base_url();
    let no_slash = FleetLock::new(&format!("{root}fleetlock"), "default");
    let client = Client::new(&no_slash, "node-a".into()).unwrap();
    assert_eq!(rt.block_on(client.pre_reboot()).unwrap(), Answer::Granted);
    let slash = FleetLock::new(&format!("{root}fleetlock/"), "default");
    let client = Client::new(&slash, "node-a".into()).unwrap();
    let refused = rt.block_on(client.steady_state()).unwrap();
    assert!(
        matches!(refused, Answer::Refused { status: 404, .. }) && refused.is_misconfiguration(),
        "{refused:?}"
    );
}

/// Under fleet_lock, plain `pivot finalize` (which would leave an unlocked deployment for any
/// later reboot to apply) refuses, naming the command that takes a slot.
#[test]
fn plain_finalize_under_fleet_lock_refuses() {
    let env = Env::new();
    let server = FleetLockServer::start(1).unwrap();
    fleet_node(&env, &server, "default");
    assert_fails_with(
        &env.subcommand("finalize", &[]),
        &["fleet_lock", "pivot finalize --reboot"],
    );
    assert!(server.requests().is_empty());
}

/// `pivot.service` (ordered before kubelet) asks for the slot once: granted, the reboot
/// follows at once; refused, the wait goes to `pivot-reboot.service`, which nothing waits for.
/// A slot of an earlier boot still to be given back is left to that unit, without a request.
#[test]
fn the_boot_unit_asks_once_and_leaves_the_wait_to_the_background() {
    let (_env, server, node, id) = airlock_node();
    let rt = runtime();
    server.hold("workers", "another-node");
    assert!(!rt
        .block_on(pivot::fleet::ask_once(&lock(&server, "workers"), &node))
        .unwrap());
    assert_eq!(server.requests().len(), 1);
    let slot = recorded(&node).unwrap();
    assert!(!slot.may_hold, "refused by the server itself: {slot:?}");
    server.release("workers", "another-node");
    assert!(rt
        .block_on(pivot::fleet::ask_once(&lock(&server, "workers"), &node))
        .unwrap());
    assert_eq!(server.holders("workers"), [id.as_str()]);

    // An earlier boot's slot is not given back here (that may take as long as its server is
    // away): no request at all.
    reboot(&node);
    let asked = server.requests().len();
    assert!(!rt
        .block_on(pivot::fleet::ask_once(&lock(&server, "workers"), &node))
        .unwrap());
    assert_eq!(server.requests().len(), asked);
    assert_eq!(recorded(&node).unwrap().boot_id, "an-earlier-boot");

    // The unit that waits: after pivot.service, before nothing, only with a staged update, and
    // started by pivot alone.
    let unit = std::fs::read_to_string(format!(
        "{}/systemd/pivot-reboot.service",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    for line in [
        "ExecStart=/usr/bin/pivot finalize --reboot",
        "ConditionPathExists=/run/ostree/staged-deployment",
        "After=network-online.target pivot.service pivot-confirm.service",
        "Restart=on-failure",
    ] {
        assert!(unit.lines().any(|l| l == line), "{line} missing:\n{unit}");
    }
    assert!(
        !unit
            .lines()
            .any(|l| l.starts_with("Before=") || l == "[Install]"),
        "{unit}"
    );
    let boot_unit = std::fs::read_to_string(format!(
        "{}/systemd/pivot.service",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    assert!(
        boot_unit.contains("Before=kubelet.service") && !boot_unit.contains("pivot-reboot"),
        "{boot_unit}"
    );
}

/// A rollback's reboot holds a slot too: the one the update was granted, kept through this
/// boot when the node goes down again for it (a health check failed), else a new one (another
/// agent rebooted the node into the update); under another strategy, none.
#[test]
fn a_rollback_reboot_holds_a_slot() {
    let (env, server, node, id) = airlock_node();
    let rt = runtime();
    let config = pivot::run::fleet_node(&env.sysroot.path).unwrap().1;
    // No slot held: one is taken.
    rt.block_on(pivot::fleet::slot_for_reboot(&config, &node))
        .unwrap();
    assert_eq!(server.holders("workers"), [id.as_str()]);
    let requests = server.requests().len();
    assert_eq!(requests, 1);

    // The update's slot, from the boot before: kept for this reboot, nothing asked.
    reboot(&node);
    rt.block_on(pivot::fleet::slot_for_reboot(&config, &node))
        .unwrap();
    assert_eq!(server.requests().len(), requests);
    let slot = recorded(&node).unwrap();
    assert_ne!(
        slot.boot_id, "an-earlier-boot",
        "not kept through this boot"
    );
    // ... and given back by the boot after, not by this one's steady-state.
    assert_success(&env.subcommand("steady-state", &[]));
    assert_eq!(server.holders("workers"), [id.as_str()]);

    // Another strategy: nothing to hold.
    std::fs::remove_file(node.state_dir.join(RECORD)).unwrap();
    drop_in(
        &env,
        "50-fleet.toml",
        "[reboot]\nstrategy = \"immediate\"\n",
    );
    let config = pivot::run::fleet_node(&env.sysroot.path).unwrap().1;
    rt.block_on(pivot::fleet::slot_for_reboot(&config, &node))
        .unwrap();
    assert_eq!(server.requests().len(), requests);
    assert!(recorded(&node).is_none());
}
