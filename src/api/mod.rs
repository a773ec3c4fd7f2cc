//! The documents other programs read from pivot, as types: `pivot status --json`
//! ([`status::Status`]), `pivot --check --json` ([`status::UpdateCheck`]), `pivot diff --json`
//! ([`diff::PackageDiff`]), the `--progress-fd` stream ([`progress::Event`]) and the
//! [`outcome::Outcome`] vocabulary they share with the state file and the journal. Each document
//! names its shape with `apiVersion` and `kind`; `docs/*.schema.json` are generated from these
//! types (a test keeps them the same, `PIVOT_BLESS=1` rewrites them). Fields are only added; a
//! change of meaning gets a new format version.

pub mod diff;
pub mod outcome;
pub mod progress;
pub mod status;

/// The `apiVersion` of every document pivot publishes.
pub const API_VERSION: &str = "pivot.openshift.io/v1";

#[cfg(test)]
mod schema_tests;
