//! Retrying registry requests: transient faults (connection refused or reset, timeouts, 408, 429,
//! 5xx, a body cut short) are retried with exponential backoff and full jitter; permanent ones
//! (401, 403, 404, other 4xx, digest mismatches) fail at once with the registry's own message.
//!
//! The budget (`--retry-timeout`, default 120 s) bounds one fault, not the run: it counts from
//! the last progress (a request that succeeded, a byte of a blob that arrived), so a pull of
//! hours over a link that drops now and then resumes after every drop, while a registry that
//! stays down is given up on after the budget.
//!
//! A registry that rate-limits (429, or 503 while overloaded) says when to come back with
//! `Retry-After`, as delay-seconds or an HTTP-date: that request is not sent again sooner (plus a
//! little jitter, so that a pool told the same time does not return in lockstep). A wait the
//! budget cannot cover ends the retries at once, saying so, instead of asking early.

use std::future::Future;
use std::time::{Duration, Instant};

use oci_client::errors::{OciDistributionError, OciErrorCode};

pub const DEFAULT_BUDGET: Duration = Duration::from_secs(120);
const FIRST_DELAY: Duration = Duration::from_millis(500);
const MAX_DELAY: Duration = Duration::from_secs(15);

/// How long one fault may be retried: the time since the last progress.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    budget: Duration,
}

impl RetryPolicy {
    pub fn new(budget: Duration) -> RetryPolicy {
        RetryPolicy { budget }
    }

    /// The delay before retry number `attempt` (1-based) of a fault whose last progress was at
    /// `progress`, at least what the registry `asked` for (its `Retry-After`), or `None` once
    /// the retry would end after the budget.
    pub fn next_delay(
        &self,
        attempt: u32,
        progress: Instant,
        asked: Option<Duration>,
    ) -> Option<Duration> {
        let exp = FIRST_DELAY.saturating_mul(1 << attempt.saturating_sub(1).min(16));
        let cap = exp.min(MAX_DELAY);
        // Full jitter: many nodes retrying against one registry must not do so in lockstep.
        let mut delay = cap.mul_f64(0.5 + 0.5 * jitter());
        if let Some(asked) = asked {
            delay = delay.max(asked.saturating_add(asked.mul_f64(0.1 * jitter())));
        }
        // Saturating: an absurd `Retry-After` (years, u64::MAX seconds) is a wait no budget covers.
        (progress.elapsed().saturating_add(delay) < self.budget).then_some(delay)
    }

    pub fn budget(&self) -> Duration {
        self.budget
    }
}

/// A uniformly spread number in [0, 1) without a random-number crate: the standard library's
/// randomly keyed hasher over the current time.
pub(crate) fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// The error a response made, without the `Retry-After` it came with.
pub fn peel(e: &OciDistributionError) -> &OciDistributionError {
    match e {
        OciDistributionError::RetryAfter { error, .. } => peel(error),
        other => other,
    }
}

/// How long the registry asked to wait before asking again, if it said (`Retry-After`).
pub fn retry_after(e: &OciDistributionError) -> Option<Duration> {
    match e {
        OciDistributionError::RetryAfter { retry_after, .. } => {
            super::retry_after::parse(retry_after, std::time::SystemTime::now())
        }
        _ => None,
    }
}

pub fn is_transient(e: &OciDistributionError) -> bool {
    match peel(e) {
        // A certificate the client does not trust will not become trusted by asking again.
        OciDistributionError::RequestError(_) if is_tls_rejection(e) => false,
        OciDistributionError::RequestError(e) => {
            e.is_connect() || e.is_timeout() || e.is_request() || e.is_body() || e.is_decode()
        }
        OciDistributionError::ServerError { code, .. } => {
            *code >= 500 || *code == 429 || *code == 408
        }
        OciDistributionError::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|e| e.code == OciErrorCode::Toomanyrequests),
        OciDistributionError::IoError(_) => true,
        _ => false,
    }
}

fn is_tls_rejection(e: &OciDistributionError) -> bool {
    let text = describe(e).to_ascii_lowercase();
    // "wrong version number": TLS spoken to a plain-HTTP server, a configuration error.
    text.contains("certificate")
        || text.contains("wrong version number")
        || refusal_alert(&text).is_some()
}

/// TLS alerts by which a server refuses the handshake, as OpenSSL reports receiving them
/// ("sslv3 alert bad certificate", "tlsv13 alert certificate required"). All but the last are
/// about the client's certificate (or its absence); a handshake failure may be too.
const REFUSAL_ALERTS: [&str; 8] = [
    "alert certificate required",
    "alert bad certificate",
    "alert unknown ca",
    "alert certificate unknown",
    "alert certificate expired",
    "alert certificate revoked",
    "alert unsupported certificate",
    "alert handshake failure",
];

/// The refusal alert `text` reports receiving, if any.
pub fn refusal_alert(text: &str) -> Option<&'static str> {
    let text = text.to_ascii_lowercase();
    REFUSAL_ALERTS
        .into_iter()
        .find(|alert| text.contains(alert))
}

/// The error with all its causes, each said once: reqwest's own message omits the cause that
/// matters most (refused, certificate unknown, …).
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let request = match e.downcast_ref::<OciDistributionError>() {
        Some(OciDistributionError::RequestError(e)) => Some(e),
        _ => e.downcast_ref::<reqwest::Error>(),
    };
    if let Some(note) = request.and_then(super::proxy::connect_failure) {
        text = format!("{note}: {text}");
    }
    let mut source = e.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

/// Why retries of `err` end: the budget is spent, or the registry asked for a longer wait than
/// it leaves.
fn gave_up(
    err: &OciDistributionError,
    attempt: u32,
    asked: Option<Duration>,
    policy: &RetryPolicy,
) -> String {
    let budget = policy.budget().as_secs();
    match asked {
        Some(asked) => format!(
            "{} (the registry asks to wait {} s before trying again (Retry-After), more than the retry budget of {budget} s leaves; gave up after {attempt} attempts)",
            describe(err),
            asked.as_secs()
        ),
        None => format!(
            "{} (gave up after {attempt} attempts in {budget} s without progress, the retry budget)",
            describe(err)
        ),
    }
}

/// Runs `op` until it succeeds, fails permanently, or the budget is spent.
pub async fn retry<T, F, Fut>(policy: &RetryPolicy, what: &str, mut op: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, OciDistributionError>>,
{
    let mut attempt = 0;
    // One call is one fault: what came before it succeeded.
    let progress = Instant::now();
    loop {
        attempt += 1;
        let err = match op().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if !is_transient(&err) {
            return Err(anyhow::anyhow!("{}", describe(&err)));
        }
        let asked = retry_after(&err);
        match policy.next_delay(attempt, progress, asked) {
            Some(delay) => {
                tracing::warn!(
                    "{what}: {}; retrying in {:.1} s",
                    describe(&err),
                    delay.as_secs_f64()
                );
                tokio::time::sleep(delay).await;
            }
            None => return Err(anyhow::anyhow!("{}", gave_up(&err, attempt, asked, policy))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_stay_within_the_cap() {
        let policy = RetryPolicy::new(Duration::from_secs(3600));
        let first = policy.next_delay(1, Instant::now(), None).unwrap();
        assert!(
            first >= FIRST_DELAY / 2 && first <= FIRST_DELAY,
            "{first:?}"
        );
        let late = policy.next_delay(30, Instant::now(), None).unwrap();
        assert!(late >= MAX_DELAY / 2 && late <= MAX_DELAY, "{late:?}");
    }

    #[test]
    fn spent_budget_stops_retries() {
        let policy = RetryPolicy::new(Duration::from_millis(10));
        assert!(policy.next_delay(1, Instant::now(), None).is_none());
    }

    #[test]
    fn the_budget_counts_from_the_last_progress_not_from_the_start() {
        let policy = RetryPolicy::new(Duration::from_secs(60));
        let long_ago = Instant::now() - Duration::from_secs(3600);
        // A run that started an hour ago and made progress just now may retry…
        assert!(policy.next_delay(1, Instant::now(), None).is_some());
        // …one that has made none for an hour may not.
        assert!(policy.next_delay(1, long_ago, None).is_none());
    }

    #[test]
    fn the_registrys_retry_after_is_waited_out_within_the_budget() {
        let policy = RetryPolicy::new(Duration::from_secs(120));
        let asked = Duration::from_secs(30);
        for _ in 0..20 {
            let delay = policy.next_delay(1, Instant::now(), Some(asked)).unwrap();
            assert!(delay >= asked && delay <= asked.mul_f64(1.1), "{delay:?}");
        }
        // A wait longer than what the budget leaves ends the retries instead of asking early.
        assert!(policy
            .next_delay(1, Instant::now(), Some(Duration::from_secs(300)))
            .is_none());
        let limited = OciDistributionError::RetryAfter {
            error: Box::new(OciDistributionError::ServerError {
                code: 429,
                url: "u".into(),
                message: String::new(),
            }),
            retry_after: "300".into(),
        };
        assert!(is_transient(&limited));
        assert_eq!(retry_after(&limited), Some(Duration::from_secs(300)));
        let why = gave_up(&limited, 1, retry_after(&limited), &policy);
        assert!(why.contains("asks to wait 300 s"), "{why}");
    }

    #[test]
    fn an_absurd_retry_after_ends_the_retries_without_overflowing() {
        let policy = RetryPolicy::new(Duration::from_secs(120));
        let long_ago = Instant::now() - Duration::from_secs(60);
        for asked in [Duration::from_secs(u64::MAX), Duration::MAX] {
            for progress in [Instant::now(), long_ago] {
                assert!(policy.next_delay(40, progress, Some(asked)).is_none());
            }
        }
    }

    #[test]
    fn status_codes_are_classified() {
        let server = |code| OciDistributionError::ServerError {
            code,
            url: String::new(),
            message: String::new(),
        };
        assert!(is_transient(&server(503)));
        assert!(is_transient(&server(429)));
        assert!(!is_transient(&server(404)));
        assert!(!is_transient(&OciDistributionError::UnauthorizedError {
            url: String::new()
        }));
    }

    #[test]
    fn tls_refusal_alerts_are_recognised_as_openssl_reports_them() {
        let seen = "connection error: error:0A000412:SSL routines:ssl3_read_bytes:sslv3 alert bad certificate:../ssl/record/rec_layer_s3.c:1601:SSL alert number 42";
        assert_eq!(refusal_alert(seen), Some("alert bad certificate"));
        assert_eq!(
            refusal_alert("ssl3_read_bytes:tlsv13 alert certificate required"),
            Some("alert certificate required")
        );
        assert_eq!(
            refusal_alert("SSLV3 ALERT HANDSHAKE FAILURE"),
            Some("alert handshake failure")
        );
        // The client's own verdict on the server's certificate is no alert from the server.
        assert_eq!(
            refusal_alert("tls_post_process_server_certificate:certificate verify failed"),
            None
        );
    }

    #[tokio::test]
    async fn permanent_errors_fail_at_once() {
        let policy = RetryPolicy::new(Duration::from_secs(60));
        let mut calls = 0;
        let err = retry(&policy, "x", || {
            calls += 1;
            async { Err::<(), _>(OciDistributionError::UnauthorizedError { url: "u".into() }) }
        })
        .await
        .unwrap_err();
        assert_eq!(calls, 1);
        assert!(err.to_string().contains("u"));
    }
}
