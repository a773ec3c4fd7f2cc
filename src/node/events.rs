//! Journal events with stable `MESSAGE_ID`s, so that `journalctl MESSAGE_ID=<id>` finds every
//! pivot start, no-op, new deployment, reboot, failure and next-boot verdict across a fleet. Each
//! carries `PIVOT_IMAGE`, `PIVOT_DIGEST`, `PIVOT_COMMIT` and `PIVOT_VERSION` where known (empty
//! otherwise), and [`FINISHED`] `PIVOT_OUTCOME` too. The ids never change; new events get new
//! ids.

use crate::api::outcome::Outcome;

/// A pivot starts pulling a target (after resolving its digest).
pub const STARTED: &str = "6573114ca766429c8cbddb01be8c0cb0";
/// The target is already deployed: nothing to do.
pub const UNCHANGED: &str = "e34e5c10ae5441f9b5a905ebbb5b6d5d";
/// A new deployment was staged (booted system) or written (another sysroot).
pub const DEPLOYED: &str = "2e1f53cadc964a9fbbdd26f5f785c6c4";
/// pivot asks systemd to reboot into the new deployment.
pub const REBOOTING: &str = "caf191e0b5814a07adf939787d718ab4";
/// A pivot failed; the message holds the whole error chain.
pub const FAILED: &str = "8fe7f719e77e44e7b601232f466d4ced";
/// At boot, `pivot confirm` found the node running (or not running) what pivot deployed.
pub const CONFIRMED: &str = "4b15d57b6bed4ef3bd2d3b7f8f176683";
pub const NOT_CONFIRMED: &str = "baf39e18075840dcb272a415d00a499d";
/// `pivot rollback` made the previous deployment the default (`PIVOT_COMMIT`: the one now).
pub const ROLLED_BACK: &str = "11006b664a1a451daee840bdfe58f3d3";
/// `pivot confirm`: a health check failed on the target pivot deployed (`PIVOT_CHECK` names
/// it; the message says whether the node rolls back).
pub const HEALTH_FAILED: &str = "d7baf674708f46c7b0fcf27da152b6c2";
/// `pivot confirm`, at the boot after pivot took the node back by itself (a failed health
/// check, or GRUB's fallback from a target that never came up): the node runs the previous
/// deployment (`PIVOT_COMMIT`: the target it left).
pub const AUTO_ROLLED_BACK: &str = "eb1d269a9c90402fb66fbbb12808bf54";
/// A pivot run ended (every run, whatever became of it): `PIVOT_OUTCOME` is its
/// [`Outcome`], spelled as in the state file and the progress stream.
pub const FINISHED: &str = "687702fcdd384f08810e7896cb57e3a7";
/// A bug in pivot (a panic): the message says where (see [`crate::node::panics`]).
pub const INTERNAL_ERROR: &str = "a73cd7f30d4840d69e33f618fc493989";

/// What an event says about the image; empty strings where not known (yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// `host/path` of the image.
    pub image: String,
    pub digest: String,
    pub commit: String,
    pub version: String,
}

/// One event at `level`, with the target's fields and any more `pivot_*` fields.
macro_rules! event {
    ($level:expr, $id:expr, $target:expr, $message:expr $(, $field:ident = $value:expr)*) => {
        tracing::event!(
            $level,
            message_id = $id,
            pivot_image = $target.image.as_str(),
            pivot_digest = $target.digest.as_str(),
            pivot_commit = $target.commit.as_str(),
            pivot_version = $target.version.as_str(),
            $($field = $value,)*
            "{}",
            $message
        )
    };
}

pub fn info(id: &str, target: &Target, message: &str) {
    event!(tracing::Level::INFO, id, target, message);
}

pub fn warn(id: &str, target: &Target, message: &str) {
    event!(tracing::Level::WARN, id, target, message);
}

pub fn error(id: &str, target: &Target, message: &str) {
    event!(tracing::Level::ERROR, id, target, message);
}

/// The [`HEALTH_FAILED`] event: `check` in `PIVOT_CHECK`.
pub fn health_failed(target: &Target, check: &str, message: &str) {
    event!(
        tracing::Level::ERROR,
        HEALTH_FAILED,
        target,
        message,
        pivot_check = check
    );
}

/// The [`FINISHED`] event of a run that ended with `outcome`.
pub fn finished(target: &Target, outcome: Outcome) {
    event!(
        tracing::Level::INFO,
        FINISHED,
        target,
        format!("pivot run ended: {outcome}"),
        pivot_outcome = outcome.as_str()
    );
}

/// An error already written to the log as a [`FAILED`] event, so `main` does not repeat it.
#[derive(Debug)]
pub struct Reported(pub anyhow::Error);

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for Reported {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::{Context, SubscriberExt};

    /// One event's fields, as journald would receive them.
    type Event = Vec<(String, String)>;

    /// Records each event's fields.
    #[derive(Clone, Default)]
    struct Fields(Arc<Mutex<Vec<Event>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Fields {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            struct Visit(Vec<(String, String)>);
            impl tracing::field::Visit for Visit {
                fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                    self.0.push((field.name().into(), value.into()));
                }
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    self.0.push((field.name().into(), format!("{value:?}")));
                }
            }
            let mut visit = Visit(Vec::new());
            event.record(&mut visit);
            self.0.lock().unwrap().push(visit.0);
        }
    }

    #[test]
    fn the_finished_event_carries_every_outcome_as_the_state_spells_it() {
        let fields = Fields::default();
        let subscriber = tracing_subscriber::registry().with(fields.clone());
        tracing::subscriber::with_default(subscriber, || {
            for outcome in Outcome::ALL {
                finished(&Target::default(), outcome);
            }
        });
        let events = fields.0.lock().unwrap();
        assert_eq!(events.len(), Outcome::ALL.len());
        for (event, outcome) in events.iter().zip(Outcome::ALL) {
            let field = |name: &str| {
                event
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(field("message_id").as_deref(), Some(FINISHED));
            let spelled = serde_json::to_value(outcome).unwrap();
            assert_eq!(field("pivot_outcome").as_deref(), spelled.as_str());
        }
    }
}
