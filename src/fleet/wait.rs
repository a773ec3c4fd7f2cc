//! How long to wait before asking a FleetLock server again: zincati's jittered interval, longer
//! for a configuration to fix, never sooner than the answer's `Retry-After`.

use std::time::Duration;

use anyhow::Result;

use super::fleet_lock::Answer;

/// A refusal only a change of configuration can turn into a yes is asked again this many
/// intervals later: slowly, but not never (an admin may be adding the group right now).
const MISCONFIGURED_INTERVALS: u32 = 6;

/// zincati's spread of a period (`add_jitter`): up to a tenth more, so nodes of a group
/// asking together drift apart.
fn jittered(interval: Duration) -> Duration {
    interval.saturating_add(interval.mul_f64(0.1 * crate::fetch::retry::jitter()))
}

/// Waits after `answer`, a no or a failed request, saying why (`what` pivot is doing, and the
/// answer), for [`delay_after`]. A wait longer than a plain refusal's is logged as an error:
/// the node's group may stall on it.
pub(super) async fn wait_after(interval: Duration, answer: &Result<Answer>, what: &str) {
    let delay = delay_after(interval, answer);
    let why = match answer {
        Ok(refused) => refused.to_string(),
        Err(e) => format!("{e:#}"),
    };
    let message = format!(
        "{what}: {why}; asking again in {:.0} s",
        delay.as_secs_f64()
    );
    match delay > interval.saturating_add(interval / 10) {
        true => tracing::error!("{message}"),
        false => tracing::warn!("{message}"),
    }
    tokio::time::sleep(delay).await;
}

/// How long to wait after `answer`: the interval (jittered), slower for a configuration to fix,
/// and never less than the answer's `Retry-After` (bounded by the client). Saturates.
fn delay_after(interval: Duration, answer: &Result<Answer>) -> Duration {
    match answer {
        Ok(refused) => {
            let base = match refused.is_misconfiguration() {
                true => interval.saturating_mul(MISCONFIGURED_INTERVALS),
                false => interval,
            };
            jittered(base).max(refused.retry_after().unwrap_or_default())
        }
        Err(_) => jittered(interval),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{config, fleet_lock};
    use super::*;

    #[test]
    fn the_wait_after_an_answer_is_bounded_and_never_before_retry_after() {
        let refused = |status, retry_after| {
            Ok(Answer::Refused {
                status,
                kind: None,
                why: String::new(),
                retry_after,
            })
        };
        let interval = Duration::from_secs(300);
        let plain = delay_after(interval, &refused(423, None));
        assert!(
            (interval..=interval + interval / 10).contains(&plain),
            "{plain:?}"
        );
        let misconfigured = delay_after(interval, &refused(400, None));
        assert!(misconfigured >= interval * 6, "{misconfigured:?}");
        let asked = fleet_lock::MAX_RETRY_AFTER;
        assert_eq!(delay_after(interval, &refused(429, Some(asked))), asked);
        let failed = delay_after(interval, &Err(anyhow::anyhow!("connection refused")));
        assert!(failed <= interval + interval / 10);
        // At the configuration's limit, a slow retry does not overflow.
        let day = Duration::from_secs(config::MAX_SECONDS);
        assert!(delay_after(day, &refused(400, Some(asked))) >= day * 6);
    }
}
