//! A bug in pivot (a Rust panic) on a node. Panics unwind (the release profile keeps the
//! default), so that the run that hit one still ends as a failed run does:
//! - the hook logs it as one line, with [`events::INTERNAL_ERROR`] for the journal (Rust's own report,
//!   with a backtrace, only when `RUST_BACKTRACE` asks for it);
//! - a panic inside a pivot run becomes that run's error ([`caught`]): the attempt is recorded as
//!   failed, the `run ended` event is sent, and the exit status is 1, as for any failure;
//! - a panic after a FleetLock grant gives the slot back, as any failure there does
//!   ([`crate::fleet`]);
//! - a panic in a worker thread reaches its caller as that step's error.
//!
//! What the sysroot holds is then what an error (or, for a panic outside a run, a crash) at that
//! point leaves: the seeded crash tests kill pivot at every step and find the sysroot as it was
//! or the new deployment complete. An abort would leave the same sysroot, but record nothing
//! and keep a FleetLock slot.

use std::any::Any;
use std::panic::{AssertUnwindSafe, PanicHookInfo};

use futures_util::FutureExt;

use crate::node::events;

/// Logs every panic as one line (see the module docs).
pub fn install_hook() {
    let rust_report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info: &PanicHookInfo<'_>| {
        let place = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()));
        let line = report(message(info.payload()), place.as_deref());
        tracing::error!(message_id = events::INTERNAL_ERROR, "{line}");
        if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
            rust_report(info);
        }
    }));
}

/// The one line a panic with `message` at `place` is logged as.
pub fn report(message: &str, place: Option<&str>) -> String {
    let at = place.map(|p| format!(" at {p}")).unwrap_or_default();
    crate::node::logging::one_line(&format!(
        "internal error (a bug in pivot, please report it){at}: {message}"
    ))
}

/// A panic's message, when it has one.
pub fn message(payload: &(dyn Any + Send)) -> &str {
    match (
        payload.downcast_ref::<&str>(),
        payload.downcast_ref::<String>(),
    ) {
        (Some(text), _) => text,
        (_, Some(text)) => text,
        _ => "a panic without a message",
    }
}

/// The error a panic becomes; the hook has logged it already, with where it was.
#[derive(Debug)]
pub struct Panicked(String);

impl std::fmt::Display for Panicked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "internal error (a bug in pivot): {}", self.0)
    }
}

impl std::error::Error for Panicked {}

/// `work`'s result, or its panic as a [`Panicked`] error.
pub async fn caught<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => {
            Err(Panicked(crate::node::logging::one_line(message(payload.as_ref()))).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_one_line_naming_the_place() {
        assert_eq!(
            report("index out of bounds:\nthe len is 1", Some("src/x.rs:3")),
            "internal error (a bug in pivot, please report it) at src/x.rs:3: index out of bounds:; the len is 1"
        );
        assert_eq!(
            report("boom", None),
            "internal error (a bug in pivot, please report it): boom"
        );
    }

    #[test]
    fn a_panic_in_a_run_is_its_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let formatted = rt.block_on(caught(async {
            let v: Vec<u8> = Vec::new();
            #[allow(clippy::unnecessary_operation)]
            Ok::<u8, anyhow::Error>(v[usize::from(v.is_empty())])
        }));
        let e = formatted.unwrap_err().to_string();
        assert!(
            e.starts_with("internal error (a bug in pivot): index out of bounds"),
            "{e}"
        );
        let owned = rt.block_on(caught(async { Err::<(), _>(anyhow::anyhow!("plain")) }));
        assert_eq!(owned.unwrap_err().to_string(), "plain");
        let text = rt.block_on(caught::<()>(async { panic!("{}", String::from("owned")) }));
        assert!(text.unwrap_err().to_string().ends_with(": owned"));
    }
}
