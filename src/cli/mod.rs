//! Command-line interface, compatible with openshift/pivot's flags: the definition is in
//! [`args`]; this module runs it.

pub mod args;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;

use crate::fetch::config::auth::AuthFiles;
use crate::fetch::registry::Access;
use crate::fetch::retry::RetryPolicy;
use crate::fleet::config::{Config, Strategy};
use crate::fleet::{self, Released};
use crate::node::confirm::Verdict;
use crate::node::events;
use crate::node::progress::Progress;
use crate::node::{diff, logging, reboot, status};
use crate::run::confirm::Done;
use crate::run::{self, Outcome};
use crate::sysroot::kargs::Edit;

pub use args::*;

/// The kernel-argument check of `--karg-append` and `--karg-delete` ([`args`] names it).
fn karg(arg: &str) -> Result<String, String> {
    crate::sysroot::kargs::check_arg(arg).map_err(|e| e.to_string())
}

/// Exit codes, as documented in docs/usage.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    Failure = 1,
    Unchanged = 77,
}

/// The `pivot` command: parses the arguments, sets up progress, logging and the async runtime,
/// runs, and turns the result into the exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // Claimed before anything else opens a descriptor that could take its number.
    let progress = match Progress::new(cli.pivot.progress_fd) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(Exit::Failure as u8);
        }
    };
    logging::init();
    crate::node::panics::install_hook();
    // Before the runtime's threads: see [`crate::sysroot::namespace`].
    if let Some(sysroot) = writes_sysroot(&cli) {
        match crate::sysroot::namespace::writable(sysroot) {
            Ok(remounted) if !remounted.is_empty() => tracing::info!(
                "{} read-write in pivot's own mount namespace",
                remounted.join(" and ")
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::error!("{e:#}");
                return ExitCode::from(Exit::Failure as u8);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("starting the async runtime: {e}");
            return ExitCode::from(Exit::Failure as u8);
        }
    };
    match runtime.block_on(crate::node::panics::caught(run(cli, progress))) {
        Ok(exit) => ExitCode::from(exit as u8),
        Err(e) => {
            // A failed pivot was already logged as a journal event, with its fields; a panic
            // by the hook.
            let logged = e.downcast_ref::<events::Reported>().is_some()
                || e.downcast_ref::<crate::node::panics::Panicked>().is_some();
            if !logged {
                tracing::error!("{e:#}");
            }
            ExitCode::from(Exit::Failure as u8)
        }
    }
}

/// The sysroot the command writes, if it writes one.
fn writes_sysroot(cli: &Cli) -> Option<&std::path::Path> {
    match &cli.command {
        // `--check --diff` downloads the update.
        None if !cli.pivot.check || cli.pivot.diff => Some(&cli.pivot.sysroot),
        Some(Command::Confirm(args)) => Some(&args.sysroot),
        Some(Command::Rollback(args)) => Some(&args.sysroot),
        Some(Command::Finalize(args)) => Some(&args.sysroot),
        _ => None,
    }
}

async fn run(cli: Cli, progress: Progress) -> Result<Exit> {
    match cli.command {
        Some(Command::Status(args)) => {
            let sysroot = args.sysroot.clone();
            let mut status = tokio::task::spawn_blocking(move || status::read(&sysroot)).await??;
            if args.booted {
                status.retain_booted();
            }
            if args.json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                print!("{}", status::render(&status));
            }
            Ok(Exit::Success)
        }
        Some(Command::Confirm(args)) => confirm(args).await,
        Some(Command::Finalize(args)) => {
            let (node, config) = run::fleet_node(&args.sysroot)?;
            // An unlocked deployment is applied by any reboot: under fleet_lock only the slot
            // may unlock it, and the reboot follows at once.
            if let (false, Strategy::FleetLock(lock)) = (args.reboot, &config.strategy) {
                bail!(
                    "the reboot strategy is fleet_lock: the staged deployment is unlocked only with a reboot slot from {}, and the reboot follows at once; run `pivot finalize --reboot`",
                    lock.base_url
                );
            }
            let staged = crate::sysroot::deployments::open_sysroot(&args.sysroot)?
                .staged_deployment()
                .is_some();
            if !staged {
                bail!("{NOTHING_STAGED}");
            }
            let finalize = async {
                let sysroot = args.sysroot.clone();
                let tries = config.boot_tries;
                let unlocked = tokio::task::spawn_blocking(move || fleet::unlock(&sysroot, tries))
                    .await??
                    .ok_or_else(|| anyhow::anyhow!("{NOTHING_STAGED}"))?;
                match unlocked.was_locked {
                    true => println!("unlocked: the next reboot applies {}", unlocked.commit),
                    false => println!(
                        "{} was not locked: the next reboot applies it",
                        unlocked.commit
                    ),
                }
                if args.reboot {
                    let target = events::Target {
                        commit: unlocked.commit,
                        ..Default::default()
                    };
                    match &config.strategy {
                        // The slot is held and the deployment unlocked: only the reboot is left.
                        Strategy::FleetLock(_) => {
                            reboot::reboot(&target, fleet::SLOT_GRANTED_REBOOT)?
                        }
                        _ => fleet::reboot(&config, &node, &target, fleet::Wait::Here).await?,
                    }
                }
                Ok(())
            };
            match &config.strategy {
                Strategy::FleetLock(lock) => fleet::with_slot(lock, &node, finalize).await?,
                _ => finalize.await?,
            }
            Ok(Exit::Success)
        }
        Some(Command::Diff(args)) => {
            // rpm-ostree's rule: a single argument is what to compare the booted deployment to.
            let (from, to) = match (args.from, args.to) {
                (Some(to), None) => (None, Some(to)),
                pair => pair,
            };
            let sysroot = args.sysroot;
            let diff = tokio::task::spawn_blocking(move || {
                diff::read(&sysroot, from.as_deref(), to.as_deref())
            })
            .await??;
            match (args.json, args.format) {
                (true, _) => println!("{}", serde_json::to_string_pretty(&diff)?),
                (false, DiffFormat::Block) => print!("{}", diff::render(&diff)),
                (false, DiffFormat::Diff) => print!("{}", diff::render_for_scripts(&diff)),
                (false, DiffFormat::Json) => {
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&diff::rpm_ostree_json(&diff))?
                    )
                }
            }
            Ok(Exit::Success)
        }
        Some(Command::Config(args)) => {
            let etc = run::system_etc(&args.sysroot)?;
            let config = Config::load(&etc)?;
            let checks = crate::node::health::list(&etc)?;
            print!("{}", render_config(&config, &checks));
            Ok(Exit::Success)
        }
        Some(Command::SteadyState(args)) => {
            let (node, config) = run::fleet_node_and_config(&args.sysroot)?;
            let id = crate::fleet::machine_id::of_etc(&node.etc).ok();
            // The record first: it needs nothing else, so a configuration that does not load
            // (a key of another pivot version) cannot keep a slot from being given back.
            let released = fleet::steady_state(&node.state_dir, id.as_deref()).await?;
            match &released {
                Released::Nothing => {}
                Released::ThisBoot => println!("the FleetLock reboot slot was asked for in this boot: it is given back after the reboot it is for"),
                Released::GivenBack { base_url, id } => println!("gave the reboot slot of {id} back to {base_url}"),
            }
            // Then, as zincati at every start, the node reports steady to the configured server.
            match (config?.strategy, &released) {
                (_, Released::ThisBoot) => {}
                (Strategy::FleetLock(lock), _) => {
                    if let Released::GivenBack { base_url, id } =
                        fleet::report_steady(&lock, &node).await?
                    {
                        println!("reported {id} steady to {base_url}");
                    }
                }
                (_, Released::Nothing) => {
                    println!("no FleetLock reboot slot was asked for: nothing to give back")
                }
                (_, Released::GivenBack { .. }) => {}
            }
            Ok(Exit::Success)
        }
        Some(Command::Rollback(args)) => {
            let sysroot = args.sysroot.clone();
            let report =
                tokio::task::spawn_blocking(move || run::rollback::run(&sysroot)).await??;
            println!(
                "{} is the default deployment now (was {})",
                report.done.to, report.done.from
            );
            if args.reboot {
                if let Some(why) = &report.unrecorded {
                    bail!("not rebooting: the rollback could not be recorded ({why}), and the first-boot pivot would move the node forward again; reboot by hand once the state file can be written");
                }
                if report.done.booted {
                    let target = events::Target {
                        commit: report.done.to.clone(),
                        ..Default::default()
                    };
                    let (node, config) = run::fleet_node(&args.sysroot)?;
                    let why = "rebooting into the previous deployment";
                    reboot_with_slot(&node, &config, &target, why).await?;
                } else {
                    tracing::warn!(
                        "not rebooting: {} is not the booted system",
                        args.sysroot.display()
                    );
                }
            }
            Ok(Exit::Success)
        }
        None => run_pivot(cli.pivot, progress).await,
    }
}

const NOTHING_STAGED: &str = "no deployment is staged: there is nothing to finalize";

/// A reboot pivot makes that is not into a staged update (a rollback's): under `fleet_lock` it
/// holds a slot too ([`fleet::slot_for_reboot`]), given back at the next boot, or at once if
/// the reboot fails.
async fn reboot_with_slot(
    node: &fleet::Node,
    config: &Config,
    target: &events::Target,
    why: &str,
) -> Result<()> {
    fleet::slot_for_reboot(config, node).await?;
    reboot_or_give_back(node, target, why).await
}

/// Reboots; if that fails, no reboot follows, so a slot held for one is given back.
async fn reboot_or_give_back(node: &fleet::Node, target: &events::Target, why: &str) -> Result<()> {
    if let Err(e) = reboot::reboot(target, why) {
        fleet::give_back(&node.state_dir).await;
        return Err(e);
    }
    Ok(())
}

/// `pivot config`: one line a key (value, then where it was set), then the health checks.
fn render_config(config: &Config, checks: &[PathBuf]) -> String {
    let keys = config.keys();
    let width = keys
        .iter()
        .map(|(k, v, _)| k.len() + v.len())
        .max()
        .unwrap_or(0)
        + 4;
    let mut out = String::new();
    for (key, value, from) in keys {
        let from = from.map_or("(default)".to_string(), |p| p.display().to_string());
        let pad = width - key.len() - value.len();
        out.push_str(&format!("{key} = {value}{:pad$}# {from}\n", ""));
    }
    match checks {
        [] => out.push_str("health checks: none\n"),
        _ => {
            out.push_str("health checks, in the order they run:\n");
            for check in checks {
                out.push_str(&format!("  {}\n", check.display()));
            }
        }
    }
    out
}

/// `pivot confirm`: the verdict, the health checks, and a rollback when they fail
/// ([`crate::run::confirm`]).
async fn confirm(args: ConfirmArgs) -> Result<Exit> {
    // A mistake in the configuration must not keep the verdict from being recorded: it fails
    // the unit after the verdict, with the checks bounded by the default.
    let loaded = run::fleet_node(&args.sysroot);
    let timeout = loaded
        .as_ref()
        .map(|(_, c)| c.health_timeout)
        .unwrap_or(crate::node::health::DEFAULT_TIMEOUT);
    let sysroot = args.sysroot.clone();
    let done =
        tokio::task::spawn_blocking(move || run::confirm::confirm(&sysroot, timeout)).await??;
    let exit = match done {
        Done::Verdict(Verdict::Confirmed { target }) => {
            let message = format!(
                "confirmed: the node runs {}, which pivot deployed",
                target.commit
            );
            events::info(events::CONFIRMED, &target, &message);
            Exit::Success
        }
        Done::Verdict(Verdict::NotRunning { target, reason }) => {
            let message = format!("the last pivot did not take effect: {reason}");
            events::error(events::NOT_CONFIRMED, &target, &message);
            Exit::Failure
        }
        Done::Verdict(Verdict::LockedDropped { target, pinned }) => {
            events::info(
                events::UNCHANGED,
                &target,
                &format!(
                    "the node rebooted before `pivot finalize`: staging {pinned} again, locked"
                ),
            );
            let opts = run::Options {
                pullspec: Some(pinned),
                lock_finalization: true,
                ..run::Options::offline(&args.sysroot)
            };
            run::run(&opts).await?;
            Exit::Success
        }
        Done::Verdict(Verdict::Nothing) => Exit::Success,
        Done::HealthFailed {
            target,
            failure,
            rolled_back_to,
            why_not,
            booted,
        } => {
            let what = failure.summary();
            match (&rolled_back_to, &why_not) {
                (Some(to), _) => {
                    events::health_failed(
                        &target,
                        &failure.check,
                        &format!("{what}: rolling back to {to}"),
                    );
                    if booted {
                        // Still down for the update: the FleetLock slot it was granted is kept
                        // until the node runs the previous deployment; without one (another
                        // agent rebooted the node into it), the rollback's reboot takes one
                        // ([`fleet::slot_for_reboot`]).
                        let why = "rebooting into the previous deployment";
                        match &loaded {
                            Ok((node, config)) => {
                                // A slot only a local fault keeps from being taken (a record
                                // that cannot be written): the remedy goes first.
                                if let Err(e) = fleet::slot_for_reboot(config, node).await {
                                    tracing::error!("rolling back without a FleetLock slot: {e:#}");
                                }
                                reboot_or_give_back(node, &target, why).await?;
                            }
                            // The configuration is unreadable (its error fails the unit): the
                            // remedy goes first.
                            Err(_) => reboot::reboot(&target, why)?,
                        }
                        return Ok(Exit::Failure);
                    }
                }
                (None, why) => events::health_failed(
                    &target,
                    &failure.check,
                    &format!(
                        "{what}; not rolling back: {}",
                        why.as_deref().unwrap_or("no deployment to go back to")
                    ),
                ),
            }
            Exit::Failure
        }
        Done::RolledBack { target, reason } => {
            events::warn(
                events::AUTO_ROLLED_BACK,
                &target,
                &format!("rolled back from {}: {reason}", target.commit),
            );
            Exit::Success
        }
    };
    // A configuration that does not load fails the unit, after the verdict. The slot a
    // FleetLock granted is given back by pivot-steady-state.service, which kubelet does not
    // wait for.
    loaded?;
    Ok(exit)
}

async fn run_pivot(args: PivotArgs, progress: Progress) -> Result<Exit> {
    let opts = run::Options {
        pullspec: args.pullspec,
        sysroot: args.sysroot,
        stateroot: args.stateroot,
        keep: args.keep,
        partial_downloads: args.partial_downloads,
        karg_edits: args
            .karg_append
            .into_iter()
            .map(Edit::Add)
            .chain(args.karg_delete.into_iter().map(Edit::Delete))
            .collect(),
        check: args.check,
        download_only: args.download_only,
        policy: args.policy,
        registries_d: args.registries_d,
        ostree_remote: args.ostree_remote,
        lock_finalization: args.lock_finalization,
        progress,
        access: Access {
            auth: AuthFiles::new(args.authfile.as_deref()),
            cert_dir: args.cert_dir,
            tls_verify: args.tls_verify,
            retry: RetryPolicy::new(Duration::from_secs(args.retry_timeout)),
        },
    };
    let mut report = run::run(&opts).await?;
    if let Some(mut check) = report.check.take() {
        if args.diff && check.update.is_some() {
            match download_and_diff(&opts, &check).await? {
                Ok(packages) => check.packages = Some(packages),
                Err(why) => check.packages_unknown = Some(why),
            }
        }
        match args.json {
            true => println!("{}", serde_json::to_string_pretty(&check)?),
            false => {
                print!("{}", status::render_check(&check));
                if let Some(packages) = &check.packages {
                    print!("{}", diff::render(packages));
                }
            }
        }
    }
    let reboot_owed = match report.outcome {
        Outcome::Staged | Outcome::Deployed => true,
        Outcome::Unchanged | Outcome::Confirmed => report.reboot_pending || reboot::is_needed(),
        // Named, so that a new outcome has to be decided here too.
        Outcome::UpdateAvailable
        | Outcome::Downloaded
        | Outcome::Running
        | Outcome::Failed
        | Outcome::RolledBack => false,
    };
    if args.reboot && reboot_owed {
        // The state file counts attempts so that a target that keeps failing is given up on;
        // a reboot this run could not count could be the first of a loop.
        if let Some(why) = &report.unrecorded {
            bail!(
                "not rebooting: this attempt could not be recorded ({why}), and without the record pivot cannot stop a reboot loop; the deployment is in place: reboot by hand once the state file can be written"
            );
        }
        if report.booted {
            // The pullspec file is pivot.service's (ordered before kubelet): it never waits
            // there for a slot. An admin's command does.
            let wait = match opts.pullspec {
                None => fleet::Wait::Background,
                Some(_) => fleet::Wait::Here,
            };
            fleet::reboot(&report.config, &report.node, &report.target, wait).await?;
        } else {
            tracing::warn!(
                "not rebooting: {} is not the booted system",
                opts.sysroot.display()
            );
        }
    }
    if !args.reboot && report.outcome == Outcome::Staged {
        if let Strategy::FleetLock(lock) = &report.config.strategy {
            tracing::info!(
                "staged with its finalization locked (reboot strategy fleet_lock): `pivot finalize --reboot` takes a reboot slot from {} and reboots into it; a reboot before that keeps the current OS",
                lock.base_url
            );
        }
    }
    Ok(match report.outcome {
        Outcome::Unchanged | Outcome::Confirmed if args.unchanged_exit_77 || args.check => {
            Exit::Unchanged
        }
        _ => Exit::Success,
    })
}

/// `--check --diff`: the update found is downloaded as `--download-only` does (by digest, so
/// what is compared is what was checked; kept for the pivot that follows), then compared with
/// the deployment the check calls "now" (`check.checksum`). A legacy image is downloaded whole,
/// and so is a native one: its package list is in its commit's metadata, but pivot imports an
/// image only whole. When the running commit carries no package list nothing is downloaded;
/// when either carries none, the packages are unknown: `Err` says why.
async fn download_and_diff(
    opts: &run::Options,
    check: &crate::api::status::UpdateCheck,
) -> Result<Result<crate::api::diff::PackageDiff, String>> {
    let update = check.update.as_ref().expect("an update");
    let (sysroot, now) = (opts.sysroot.clone(), check.checksum.clone());
    let unknown =
        tokio::task::spawn_blocking(move || diff::unknown_packages(&sysroot, &now)).await??;
    if let Some(why) = unknown {
        return Ok(Err(format!(
            "reading the packages of the running deployment: {why}"
        )));
    }
    let download = run::Options {
        pullspec: Some(update.image.clone()),
        check: false,
        download_only: true,
        ..opts.clone()
    };
    let report = run::run(&download).await?;
    let commit = report.target.commit;
    anyhow::ensure!(
        !commit.is_empty(),
        "the download of {} named no commit",
        update.image
    );
    let (sysroot, now) = (opts.sysroot.clone(), check.checksum.clone());
    let read = tokio::task::spawn_blocking(move || diff::read(&sysroot, Some(&now), Some(&commit)));
    match read.await? {
        Ok(packages) => Ok(Ok(packages)),
        Err(e) => diff::no_package_list(e).map(Err),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_documented_retry_default_is_the_budget() {
        assert_eq!(
            super::RETRY_TIMEOUT_DEFAULT,
            crate::fetch::retry::DEFAULT_BUDGET.as_secs()
        );
    }
}
