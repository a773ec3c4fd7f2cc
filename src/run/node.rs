//! What a run needs of the node beyond its sysroot: the node as its fleet sees it
//! ([`crate::fleet`]), and the spread of a pool's first requests.

use std::path::Path;

use anyhow::Result;

use super::local::Local;

/// The node on `sysroot` as its fleet sees it, and its configuration (`/etc/pivot/config.d`).
pub fn fleet_node(sysroot: &Path) -> Result<(crate::fleet::Node, crate::fleet::config::Config)> {
    let (node, config) = fleet_node_and_config(sysroot)?;
    Ok((node, config?))
}

/// The node on `sysroot`, and its configuration or why it does not load: giving a FleetLock
/// slot back needs only the node's slot record, never the configuration.
pub fn fleet_node_and_config(
    sysroot: &Path,
) -> Result<(crate::fleet::Node, Result<crate::fleet::config::Config>)> {
    let local = Local::inspect(sysroot, None)?;
    let config = crate::fleet::config::Config::load(&local.etc);
    Ok((node_of(sysroot, &local), config))
}

pub(super) fn node_of(sysroot: &Path, local: &Local) -> crate::fleet::Node {
    crate::fleet::Node {
        etc: local.etc.clone(),
        sysroot: sysroot.to_path_buf(),
        state_dir: local.state_dir(sysroot),
    }
}

/// The pullspec file is the first boot's: a whole pool boots at once and would reach its
/// registry in the same second, which rate-limits exactly that. The first request waits a
/// moment chosen at random, so the pool arrives spread over [`SPREAD`]; at a boot that takes
/// minutes, a few seconds are not noticed.
pub(super) async fn spread_first_request() {
    let wait = SPREAD.mul_f64(crate::fetch::retry::jitter());
    tracing::debug!(
        "waiting {:.1} s before the first request (a pool booting at once is spread)",
        wait.as_secs_f64()
    );
    tokio::time::sleep(wait).await;
}

/// Over how long the first requests of a pool booting at once are spread.
const SPREAD: std::time::Duration = std::time::Duration::from_secs(5);
