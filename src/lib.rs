//! pivot: move an OSTree node onto the OS inside an oscontainer image.
//!
//! One module per stage: [`reference`](mod@reference) → [`source`] ([`registry`] or [`layout`]) → [`image`] → [`import`] → [`deploy`] →
//! [`state`]; [`store`] keeps ostree-rs-ext's container store (the refs and merge commit rpm-ostree
//! and bootc read); [`space`] checks free space before the import and the deployment; [`status`]
//! reads deployments and state, [`confirm`] checks at boot that a pivot took effect; [`cli`],
//! [`logging`], [`events`] and [`reboot`] are the
//! edges to people, journald and systemd.
// These docs are for the people working on pivot (built with --document-private-items):
// they link the internals they explain.
#![allow(rustdoc::private_intra_doc_links)]

pub mod blob_reader;
pub mod cli;
pub mod commit_walk;
pub mod config;
pub mod confirm;
pub mod deploy;
pub mod deployments;
pub mod events;
pub mod image;
pub mod import;
mod job;
pub use job::PARALLEL_LAYERS;
pub mod kargs;
pub mod layout;
pub mod logging;
pub mod memory;
pub mod outcome;
pub mod pivot;
pub mod progress;
pub mod prune;
pub mod reboot;
pub mod reference;
pub mod registry;
pub mod retry;
pub mod sha256_state;
pub mod source;
pub mod space;
mod spools;
pub mod state;
pub mod status;
pub mod store;
