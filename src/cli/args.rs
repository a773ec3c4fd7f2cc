//! The command line's definition: its arguments, their help, the exit codes.
//!
//! Nothing here names another module of the crate: build.rs compiles this file too, to write
//! the man pages and shell completions at build time (packaging never runs the built binary,
//! which a cross-built image could not). The two things it needs from the crate come from its
//! parent module: `karg`, the kernel-argument check, and the retry budget's default below.
// The doc comments of the arguments are clap's help text, written for a terminal: brackets
// there are optional parts, `<name>` placeholders, not rustdoc links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Seconds of `--retry-timeout` by default: `fetch::retry::DEFAULT_BUDGET` (a unit test holds
/// them equal; this file cannot name it).
pub const RETRY_TIMEOUT_DEFAULT: u64 = 120;

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
    /// Under the reboot strategy fleet_lock only with `--reboot`: the FleetLock slot is taken
    /// first, and given back if the unlock or the reboot fails.
    Finalize(FinalizeArgs),
    /// Show the packages added, removed, upgraded and downgraded between two deployments,
    /// commits or refs, as `rpm-ostree db diff` does.
    ///
    /// The arguments are rpm-ostree's: `pivot diff FROM TO` compares FROM with TO; `pivot diff
    /// TO` the booted deployment with TO; `pivot diff` the booted deployment with the update
    /// waiting (the staged deployment, else the newest download (--download-only), else the
    /// default deployment), or when none waits the rollback deployment with the booted one. On
    /// a sysroot that is not booted, its default deployment stands for the booted one. Each is
    /// a deployment by index (as `pivot status` lists them), a commit by checksum (or a unique
    /// prefix of a deployment's) or a ref. Package lists are read from the commit's
    /// rpmostree.rpmdb.pkglist metadata, else from the tree's dpkg status file; packages are
    /// paired by name and architecture, as rpm-ostree pairs them.
    Diff(DiffArgs),
    /// Show the configuration in effect: each key, its value, and the drop-in that set it.
    ///
    /// Drop-ins are read from /usr/lib/pivot/config.d (the image's defaults) and
    /// /etc/pivot/config.d (the admin's, replacing or masking the image's by name); health
    /// checks from /usr/lib/pivot/health.d and /etc/pivot/health.d, the same way.
    Config(ConfigArgs),
    /// Give the node's FleetLock reboot slot back (pivot-steady-state.service, at boot).
    ///
    /// Tells the server the slot an earlier boot asked for (/var/lib/pivot/fleet-lock.json) is
    /// free again, asking until it says yes, with nothing but that record; then, under the
    /// reboot strategy fleet_lock, reports the node steady to the configured server, as zincati
    /// does at every start. Nothing is sent while this boot holds a slot for a reboot still to
    /// come. Exits 1 when the configuration does not load (after giving a recorded slot back).
    SteadyState(SteadyStateArgs),
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
    /// Reboot (through systemd) into the deployment made the default; under the reboot
    /// strategy fleet_lock once a FleetLock slot is granted.
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
pub struct DiffArgs {
    /// With TO: the deployment (index), commit or ref to compare from. Alone: the one to
    /// compare the booted deployment with (TO), as `rpm-ostree db diff REV` takes it.
    pub from: Option<String>,
    /// The deployment (index), commit or ref to compare to.
    pub to: Option<String>,
    /// The OSTree sysroot whose deployments and repo are read.
    #[arg(long, value_name = "PATH", default_value = "/")]
    pub sysroot: PathBuf,
    /// Print pivot's JSON document (PivotPackageDiff, schema in docs/diff.schema.json).
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Output format, as rpm-ostree db diff's: block (the default, for people), diff (+, -, !
    /// and = lines, for scripts) or json (rpm-ostree's document: ostree-commit-from,
    /// ostree-commit-to and pkgdiff).
    #[arg(short = 'F', long, value_name = "FORMAT", value_enum, default_value_t = DiffFormat::Block)]
    pub format: DiffFormat,
}

/// `pivot diff --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffFormat {
    Block,
    Diff,
    Json,
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
    #[arg(long, value_name = "SECONDS", env = "PIVOT_RETRY_TIMEOUT", default_value_t = RETRY_TIMEOUT_DEFAULT)]
    pub retry_timeout: u64,
    /// Keep the downloaded bytes of the layers in flight on disk (of a gzip layer, those since
    /// its last checkpoint), so that a killed pivot resumes them (--partial-downloads=false
    /// saves that space: a few MiB per layer in flight, whole zstd layers; pivot also does
    /// without them when the repo has room for the objects only).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub partial_downloads: bool,
    /// Add a kernel argument to the new deployment (repeatable; whole-token match, see
    /// /etc/pivot/kernel-args in docs/usage.md).
    #[arg(long, value_name = "ARG", value_parser = super::karg)]
    pub karg_append: Vec<String>,
    /// Remove a kernel argument from the new deployment (repeatable; whole-token match).
    #[arg(long, value_name = "ARG", value_parser = super::karg)]
    pub karg_delete: Vec<String>,
    /// Only check: fetch the manifest and config, print what a pivot would change (version,
    /// commit, creation time, kernel, bytes to download), write nothing. Exits 0 if there is an
    /// update, 77 if not.
    #[arg(long, conflicts_with = "reboot")]
    pub check: bool,
    /// With --check: also download the update (as --download-only does, kept for the pivot
    /// that follows) and print its package changes against the running deployment (the one
    /// the check calls "now"). When the running commit carries no package list nothing is
    /// downloaded, and the packages are said to be unknown.
    #[arg(long, requires = "check")]
    pub diff: bool,
    /// With --check: print the result as JSON (schema in docs/update-check.schema.json).
    #[arg(long, requires = "check")]
    pub json: bool,
    /// Pull and import the image, deploy nothing. The commit is kept (refs pivot/<repository>
    /// and pivot/downloaded/[native/]<digest>), and a later `pivot host/path@<digest>` deploys it
    /// without contacting the registry.
    #[arg(long, conflicts_with_all = ["reboot", "check"])]
    pub download_only: bool,
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
