//! pivot: move an OSTree node onto the OS inside an oscontainer image.
//!
//! The tree is the pipeline, one folder per stage:
//!
//! 1. [`fetch`]: the pullspec, where the image comes from (a registry, as the admins' container
//!    configuration says, or an OCI layout), its manifest and config, and layer bytes that are
//!    verified as they arrive, retried and spooled for a killed run's successor.
//! 2. [`trust`]: whether the image may be pulled at all: the signature policy admins write for
//!    the containers tools, checked on the manifest digest before any layer is fetched.
//! 3. [`import`]: the OSTree commit the layers carry, streamed into the sysroot's repo, and
//!    ostree-rs-ext's container store (the refs and merge commit rpm-ostree and bootc read).
//! 4. [`sysroot`]: deployments, kernel arguments, free space, the deployment itself and the
//!    prune after it.
//! 5. [`node`]: what the node records and tells: the state file, `pivot status`, the next-boot
//!    confirmation, journal events, progress, the reboot.
//! 6. [`fleet`]: when the node reboots into what it staged: at once, when a FleetLock server
//!    grants a slot, or left to kured or the machine-config daemon.
//!
//! [`run`] drives one pivot through the stages; [`cli`] is the command; [`api`] holds the
//! documents other programs read (`pivot status --json`, the `--progress-fd` stream, outcomes),
//! whose JSON Schemas are generated from its types.
//!
//! Only [`api`] and [`cli`] are public. The stages are the crate's internals: the integration
//! tests and fuzz targets reach them through the `internal-testing-api` feature, which changes
//! visibility only, never behaviour.
// These docs are for the people working on pivot (built with --document-private-items):
// they link the internals they explain.
#![allow(rustdoc::private_intra_doc_links)]

pub mod api;
pub mod cli;

/// Declares the stage modules: `pub` for the tests and fuzz targets (`internal-testing-api`),
/// crate-private otherwise.
macro_rules! stages {
    ($($name:ident),* $(,)?) => {
        $(
            #[cfg(feature = "internal-testing-api")]
            pub mod $name;
            #[cfg(not(feature = "internal-testing-api"))]
            mod $name;
        )*
    };
}

stages!(fetch, trust, import, sysroot, node, fleet, run);
