//! The `--progress-fd` stream: JSON Lines, one [`Event`] per line, tagged by `event`. The first
//! line is always the [`Event::Stream`] that names the shape (`apiVersion`, `kind`), so a reader
//! knows what follows before it reads it. Its JSON Schema, generated from these types, is
//! `docs/progress.schema.json`. Events and fields are only added.

use serde::{Deserialize, Serialize};

use super::outcome::Outcome;

/// `kind` of the progress stream, named by its first event.
pub const KIND: &str = "PivotProgress";

/// One line of the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Event {
    /// The first line: which shape the stream has.
    Stream {
        /// `pivot.openshift.io/v1`.
        #[serde(rename = "apiVersion")]
        api_version: String,
        /// `PivotProgress`.
        kind: String,
    },
    /// The run entered a step.
    Step { step: Step },
    /// The layers about to be fetched.
    Start {
        /// The pullspec, as pivot resolved it.
        image: String,
        /// The manifest digest.
        digest: String,
        /// Bytes of all layers.
        total: u64,
        layers: Vec<LayerSize>,
    },
    /// Bytes of a layer arrived: at most every 250 ms per layer, and when a layer completes.
    Bytes {
        /// The layer's index in the manifest, from 0.
        layer: usize,
        digest: String,
        /// Bytes of this layer so far.
        done: u64,
        /// Bytes of this layer.
        size: u64,
        /// Bytes of all layers so far.
        total_done: u64,
        /// Bytes of all layers.
        total: u64,
    },
    /// The last line: how the run ended.
    Done {
        outcome: Outcome,
        /// Layer bytes fetched by this run.
        bytes: u64,
        /// Seconds from the start event (or the stream's opening) to the end.
        seconds: f64,
    },
}

/// The steps of a run, in order (a run may end before any of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Step {
    /// Reading the manifest and config, checking space.
    Pulling,
    /// Fetching and importing the layers.
    Importing,
    /// Writing the deployment.
    Deploying,
}

/// A layer in the [`Event::Start`] event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LayerSize {
    pub digest: String,
    pub size: u64,
}
