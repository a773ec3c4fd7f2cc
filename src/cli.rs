//! Command-line interface, compatible with openshift/pivot's flags.
// The doc comments of the arguments are clap's help text, written for a terminal: brackets
// there are optional parts, `<name>` placeholders, not rustdoc links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::fetch::config::auth::AuthFiles;
use crate::fetch::registry::Access;
use crate::fetch::retry::{self, RetryPolicy};
use crate::fleet::config::{Config, Strategy};
use crate::fleet::{self, Released};
use crate::node::confirm::Verdict;
use crate::node::events;
use crate::node::progress::Progress;
use crate::node::{logging, reboot, status};
use crate::run::confirm::Done;
use crate::run::{self, Outcome};
use crate::sysroot::kargs::Edit;

/// Exit codes, in one place: `--help`, the man page and docs/usage.md say the same.
pub const EXIT_STATUS: &str = "\
Exit status:
  0   done: a deployment was made, or nothing was to be done; with --check, an update is available
  1   failed: the message names the step and the cause (pivot confirm: the last pivot did not take effect, or a health check failed)
  2   usage error
  77  nothing to do, with --unchanged-exit-77 or --check";

/// Move this OSTree system to the OS in an oscontainer image.
///
/// With no PULLSPEC, the pullspec is read from /etc/pivot/image-pullspec (first boot).
#[derive(Debug, Parser)]
#[command(
    name = "pivot",
    version,
    args_conflicts_with_subcommands = true,
    after_long_help = EXIT_STATUS
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub pivot: PivotArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the deployments and pivot's last attempt.
    Status(StatusArgs),
    /// At boot: record whether the node runs what the last pivot deployed (pivot-confirm.service).
    ///
    /// On the first boot of a target, runs the health checks in /etc/pivot/health.d; when one
    /// fails, makes the previous deployment the default and reboots into it (once per target).
    /// Exits 1 when the node does not run the target, or a check failed, with the reason, which
    /// `pivot status` then shows too.
    Confirm(ConfirmArgs),
    /// Make the previous deployment the default again (an update pending on the booted system
    /// is dropped instead), as `rpm-ostree rollback` does.
    ///
    /// The pullspec file's target is then held: the first-boot pivot does not move the node
    /// back to it until /etc/pivot/image-pullspec names another image.
    Rollback(RollbackArgs),
    /// Let the next reboot apply the deployment `--lock-finalization` staged.
    ///
    /// With `--reboot` under the reboot strategy fleet_lock, the FleetLock slot is taken first.
    Finalize(FinalizeArgs),
    /// Show the configuration in effect: each key, its value, and the drop-in that set it.
    ///
    /// Drop-ins are read from /usr/lib/pivot/config.d (the image's defaults) and
    /// /etc/pivot/config.d (the admin's, replacing or masking the image's by name); health
    /// checks from /usr/lib/pivot/health.d and /etc/pivot/health.d, the same way.
    Config(ConfigArgs),
    /// Give the node's FleetLock reboot slot back (pivot-steady-state.service, at boot).
    ///
    /// Tells the server the slot an earlier boot asked for (/var/lib/pivot/fleet-lock.json) is
    /// free again, asking until it says yes; nothing to do when no slot was asked for, or only
    /// in this boot. Exits 1 only when the server refuses for good (a 4xx other than 408, 423
    /// and 429); the record then stays for the next try.
    SteadyState(SteadyStateArgs),
    /// Print the man page (roff) generated from this command line, for packaging.
    #[command(hide = true)]
    Man,
    /// Print shell completions (bash, zsh, fish, …), for packaging.
    #[command(hide = true)]
    Completions { shell: clap_complete::Shell },
}

#[derive(Debug, Args)]
pub struct FinalizeArgs {
    /// Then reboot into it, as the reboot strategy (/etc/pivot/config.d) allows.
    #[arg(short, long)]
    pub reboot: bool,
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub sysroot: PathBuf,
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// Reboot (through systemd) into the deployment made the default.
    #[arg(short, long)]
    pub reboot: bool,
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub sysroot: PathBuf,
}

#[derive(Debug, Args)]
pub struct ConfirmArgs {
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub sysroot: PathBuf,
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub sysroot: PathBuf,
}

#[derive(Debug, Args)]
pub struct SteadyStateArgs {
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub sysroot: PathBuf,
}

#[derive(Debug, Args)]
pub struct PivotArgs {
    /// Image to move to: [docker://]host[:port]/path[:tag][@sha256:<digest>], or an OCI layout
    /// on this machine: oci:DIR[:tag] or oci-archive:FILE[:tag].
    pub pullspec: Option<String>,
    /// Reboot (through systemd) if a new deployment was staged, or one is still pending.
    #[arg(short, long)]
    pub reboot: bool,
    /// Also keep the imported commit under the ref pivot/<repository>, so it survives the
    /// removal of its deployment.
    #[arg(short, long)]
    pub keep: bool,
    /// Exit with 77 instead of 0 when the system is already at the target.
    #[arg(long = "unchanged-exit-77")]
    pub unchanged_exit_77: bool,
    /// The OSTree sysroot to act on; a sysroot that is not the booted system is deployed to
    /// directly instead of staged.
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub sysroot: PathBuf,
    /// Stateroot (osname) to deploy to; default: that of the booted (or default) deployment.
    #[arg(long, value_name = "NAME")]
    pub stateroot: Option<String>,
    /// Registry credentials (containers-auth.json); default: $REGISTRY_AUTH_FILE, then
    /// /run/ostree/auth.json, /etc/ostree/auth.json, /usr/lib/ostree/auth.json and
    /// /var/lib/kubelet/config.json.
    #[arg(long, value_name = "PATH")]
    pub authfile: Option<PathBuf>,
    /// Directory of *.crt CAs to trust and a *.cert/*.key client certificate to present, to use
    /// instead of /etc/containers/certs.d/<host[:port]>/.
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Signature policy (containers-policy.json) images must satisfy before any layer is
    /// fetched; default: /etc/containers/policy.json, and without it no signature is checked.
    #[arg(long, value_name = "PATH")]
    pub policy: Option<PathBuf>,
    /// Directory of containers-registries.d *.yaml files naming where signatures are kept;
    /// default: /etc/containers/registries.d.
    #[arg(long = "registries.d", value_name = "DIR")]
    pub registries_d: Option<PathBuf>,
    /// The image's OSTree commit must be signed by a key of this OSTree remote of the sysroot's
    /// repo (its gpg-verify keys, or sign-verify ed25519 keys), checked before it is deployed.
    #[arg(long, value_name = "NAME")]
    pub ostree_remote: Option<String>,
    /// Stage the deployment locked: a reboot applies it only after `pivot finalize` (an
    /// unplanned reboot keeps the current OS, and the update is staged again at boot).
    #[arg(long, conflicts_with_all = ["reboot", "check", "download_only"])]
    pub lock_finalization: bool,
    /// Verify registries' TLS certificates (--tls-verify=false turns it off, with a warning).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub tls_verify: bool,
    /// Write progress as JSON Lines to this open file descriptor (shape in docs/usage.md).
    #[arg(long, value_name = "FD")]
    pub progress_fd: Option<i32>,
    /// Seconds one transient registry fault may be retried, counted from the last progress (a
    /// byte that arrived): a long pull survives any number of drops, a registry that stays
    /// down fails the run after this long.
    #[arg(long, value_name = "SECONDS", env = "PIVOT_RETRY_TIMEOUT", default_value_t = retry::DEFAULT_BUDGET.as_secs())]
    pub retry_timeout: u64,
    /// Keep the downloaded bytes of the layers in flight on disk (of a gzip layer, those since
    /// its last checkpoint), so that a killed pivot resumes them (--partial-downloads=false
    /// saves that space: a few MiB per layer in flight, whole zstd layers; pivot also does
    /// without them when the repo has room for the objects only).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub partial_downloads: bool,
    /// Add a kernel argument to the new deployment (repeatable; whole-token match, see
    /// /etc/pivot/kernel-args in docs/usage.md).
    #[arg(long, value_name = "ARG", value_parser = karg)]
    pub karg_append: Vec<String>,
    /// Remove a kernel argument from the new deployment (repeatable; whole-token match).
    #[arg(long, value_name = "ARG", value_parser = karg)]
    pub karg_delete: Vec<String>,
    /// Only check: fetch the manifest and config, print what a pivot would change (version,
    /// commit, bytes to download), write nothing. Exits 0 if there is an update, 77 if not.
    #[arg(long, conflicts_with = "reboot")]
    pub check: bool,
    /// Pull and import the image, deploy nothing. The commit is kept (refs pivot/<repository>
    /// and pivot/downloaded/[native/]<digest>), and a later `pivot host/path@<digest>` deploys it
    /// without contacting the registry.
    #[arg(long, conflicts_with_all = ["reboot", "check"])]
    pub download_only: bool,
}

fn karg(arg: &str) -> Result<String, String> {
    crate::sysroot::kargs::check_arg(arg).map_err(|e| e.to_string())
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub sysroot: PathBuf,
    /// Print JSON (shape in docs/usage.md, schema in docs/status.schema.json).
    #[arg(long)]
    pub json: bool,
    /// The JSON shape to print: 1 (the only one so far; `apiVersion` pivot.openshift.io/v1).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1))]
    pub format_version: u32,
    /// Show only the booted deployment.
    #[arg(long)]
    pub booted: bool,
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
    match runtime.block_on(run(cli, progress)) {
        Ok(exit) => ExitCode::from(exit as u8),
        Err(e) => {
            // A failed pivot was already logged as a journal event, with its fields.
            if e.downcast_ref::<events::Reported>().is_none() {
                tracing::error!("{e:#}");
            }
            ExitCode::from(Exit::Failure as u8)
        }
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
            let staged = crate::sysroot::deployments::open_sysroot(&args.sysroot)?
                .staged_deployment()
                .is_some();
            if !staged {
                bail!("{NOTHING_STAGED}");
            }
            // The slot before the unlock: an unlocked deployment is applied by any reboot.
            let fleet = match args.reboot {
                true => Some(run::fleet_node(&args.sysroot)?),
                false => None,
            };
            if let Some((
                node,
                Config {
                    strategy: Strategy::FleetLock(lock),
                    ..
                },
            )) = &fleet
            {
                fleet::take_slot(lock, node).await?;
            }
            let sysroot = args.sysroot.clone();
            let unlocked = tokio::task::spawn_blocking(move || fleet::unlock(&sysroot))
                .await??
                .ok_or_else(|| anyhow::anyhow!("{NOTHING_STAGED}"))?;
            match unlocked.was_locked {
                true => println!("unlocked: the next reboot applies {}", unlocked.commit),
                false => println!(
                    "{} was not locked: the next reboot applies it",
                    unlocked.commit
                ),
            }
            if let Some((node, config)) = fleet {
                let target = events::Target {
                    commit: unlocked.commit,
                    ..Default::default()
                };
                match &config.strategy {
                    // The slot is held and the deployment unlocked: only the reboot is left.
                    Strategy::FleetLock(_) => reboot::reboot(&target, fleet::SLOT_GRANTED_REBOOT)?,
                    strategy => fleet::reboot(strategy, &node, &target).await?,
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
            let (node, _) = run::fleet_node(&args.sysroot)?;
            match fleet::steady_state(&node.state_dir).await? {
                Released::Nothing => println!("no FleetLock reboot slot was asked for: nothing to give back"),
                Released::ThisBoot => println!("the FleetLock reboot slot was asked for in this boot: it is given back after the reboot it is for"),
                Released::GivenBack { base_url, id } => println!("gave the reboot slot of {id} back to {base_url}"),
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
                    reboot::reboot(&target, "rebooting into the previous deployment")?;
                } else {
                    tracing::warn!(
                        "not rebooting: {} is not the booted system",
                        args.sysroot.display()
                    );
                }
            }
            Ok(Exit::Success)
        }
        Some(Command::Man) => {
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            Ok(Exit::Success)
        }
        Some(Command::Completions { shell }) => {
            clap_complete::generate(shell, &mut Cli::command(), "pivot", &mut std::io::stdout());
            Ok(Exit::Success)
        }
        None => run_pivot(cli.pivot, progress).await,
    }
}

const NOTHING_STAGED: &str = "no deployment is staged: there is nothing to finalize";

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
                        // Still down for the update: the FleetLock slot is kept until the
                        // node runs the previous deployment.
                        if let Ok((node, _)) = &loaded {
                            if let Err(e) = fleet::hold_through_this_boot(&node.state_dir) {
                                tracing::warn!(
                                    "keeping the FleetLock slot through the rollback: {e:#}"
                                );
                            }
                        }
                        reboot::reboot(&target, "rebooting into the previous deployment")?;
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
    let report = run::run(&opts).await?;
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
            fleet::reboot(&report.strategy, &report.node, &report.target).await?;
        } else {
            tracing::warn!(
                "not rebooting: {} is not the booted system",
                opts.sysroot.display()
            );
        }
    }
    if !args.reboot && report.outcome == Outcome::Staged {
        if let Strategy::FleetLock(lock) = &report.strategy {
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
