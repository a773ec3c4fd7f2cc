//! Runs pivot's main job end to end on an embedded default: a loopback registry
//! serving the os-v2 oscontainer and a throwaway sysroot deployed with os-v1.

use anyhow::{bail, Context, Result};
use pivot_testkit::{pivot_test_env, push_oscontainer, ImageSpec, Registry, TestSysroot, Tree};
use std::path::PathBuf;
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: pivot-demo [--keep-dir]

Starts a loopback docker-registry, pushes the os-v2 oscontainer, makes a
throwaway OSTree sysroot deployed with os-v1, then runs
`pivot --sysroot <sysroot> <image>` and `pivot status --sysroot <sysroot>`.
The pivot binary is $PIVOT_BIN, else `pivot` next to this program.
--keep-dir keeps the sysroot and registry directories and prints their paths.";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("pivot-demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode> {
    let mut keep = false;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--keep-dir" => keep = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let pivot = pivot_bin()?;

    let registry = Registry::start()?;
    println!(
        "registry: docker-registry serving http://{}",
        registry.host()
    );
    let image = push_oscontainer(
        &registry,
        "pivot/os",
        "v2",
        &ImageSpec::new(Tree::fixture("os-v2")?, "2"),
    )?;
    println!("image:    {} ({})", image.by_tag, image.digest);
    println!("          ostree commit {}", image.commit);

    let tree = Tree::fixture("os-v1")?;
    let sysroot = TestSysroot::new("pivot-demo", &tree, "1", &["console=ttyS0", "pivot.demo=1"])?;
    println!(
        "sysroot:  {} (os-v1, commit {})",
        sysroot.path.display(),
        sysroot.commit_v1()
    );
    // registries.conf lives beside the sysroot, inside the sysroot's temp dir.
    let conf_dir = sysroot.path.parent().context("sysroot has no parent")?;
    let conf = registry.registries_conf(conf_dir)?;

    let sysroot_arg = sysroot.path.clone();
    let step = |args: &[&std::ffi::OsStr]| -> Result<Option<ExitCode>> {
        println!("\n$ {} {}", pivot.display(), shell_words(args));
        let status = Command::new(&pivot)
            .args(args)
            .env("CONTAINERS_REGISTRIES_CONF", &conf)
            .envs(pivot_test_env())
            .status()
            .with_context(|| format!("running {}", pivot.display()))?;
        if status.success() {
            return Ok(None);
        }
        eprintln!("pivot-demo: pivot failed: {status}");
        let code = status
            .code()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(1);
        Ok(Some(ExitCode::from(code.max(1))))
    };
    let mut result = step(&[
        "--sysroot".as_ref(),
        sysroot_arg.as_os_str(),
        image.by_tag.as_ref(),
    ])?;
    if result.is_none() {
        result = step(&[
            "status".as_ref(),
            "--sysroot".as_ref(),
            sysroot_arg.as_os_str(),
        ])?;
    }

    if keep {
        let sysroot_dir = sysroot.into_kept_path();
        let registry_dir = registry.into_kept_dir();
        println!("\nkept sysroot:  {}", sysroot_dir.display());
        println!("kept registries.conf: {}", conf.display());
        println!(
            "kept registry: {} (storage/, registry.log, config.yml)",
            registry_dir.display()
        );
    }
    Ok(result.unwrap_or(ExitCode::SUCCESS))
}

/// $PIVOT_BIN, else the `pivot` built into the same target dir as this program.
fn pivot_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PIVOT_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locating pivot-demo")?;
    let pivot = exe.with_file_name("pivot");
    if !pivot.exists() {
        bail!(
            "{} not found; build it (cargo build --bin pivot) or set PIVOT_BIN",
            pivot.display()
        );
    }
    Ok(pivot)
}

fn shell_words(args: &[&std::ffi::OsStr]) -> String {
    args.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
