//! Test kit for `pivot`, built from real parts: fixture trees committed with
//! libostree, a real `docker-registry` on loopback, legacy oscontainers pushed
//! to it, and throwaway OSTree sysroots deployed by the ostree CLI.

mod commit;
mod layer;
mod oscontainer;
mod push;
mod registry;
mod sysroot;
mod tree;

pub use commit::{commit_tree, COMMIT_TIME};
pub use oscontainer::{
    push_oscontainer, CommitLabel, Compression, ImageSpec, ManifestFormat, PushedImage,
    COMMIT_LABEL, DECOY_COMMIT,
};
pub use push::sha256_digest;
pub use registry::{AccessLogEntry, Registry};
pub use sysroot::{pivot_test_env, TestSysroot};
pub use tree::{fixtures_dir, Entry, Tree};
