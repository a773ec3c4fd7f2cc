//! pivot's integration tests on this host: real registries, real libostree sysroots, real
//! proxies and keys, one module per concern. They are one test binary, so the library and the
//! test kit are linked once (docs/testing.md has the measurement); the QEMU suite
//! (`tests/vm.rs`) stays its own binary, run alone. One module: `cargo test --test it crash::`.

mod check;
mod cli;
mod commit_signatures;
mod common;
mod confirm;
mod containers_image;
mod crash;
mod diff;
mod download_only;
mod fleet;
mod greenboot;
mod handover;
mod headers;
mod health;
mod hostile;
mod kargs;
mod native;
mod network;
mod offline;
mod outcomes;
mod packaging;
mod packaging_deb;
mod pivots;
mod proxies;
mod prune;
mod rate_limits;
mod reboot;
mod refusals;
mod rollback;
mod signature_sources;
mod signatures;
mod signatures_key_validity;
mod sigstore_keys;
mod space;
