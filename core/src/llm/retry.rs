//! When a failed LLM request is tried again, and after how long. Sans-IO: the session asks
//! [`RetryPolicy::delay_ms`] with the failure and the attempt number, the host only waits.
//!
//! * A non-retryable failure (a 4xx other than 408/409/429, a bad request) is never retried.
//! * A provider that says how long to wait (`retry-after-ms`, or `retry-after` in seconds) is
//!   honoured exactly, up to [`RetryPolicy::max_retry_after_ms`]; asked to wait longer, we give
//!   up instead of holding the turn. An HTTP-date `retry-after` is ignored (backoff applies).
//! * Otherwise (5xx, Anthropic's 529 `overloaded_error`, network failures, cut streams) the wait
//!   is an exponential backoff with "equal jitter": attempt `n` waits between half and all of
//!   `min(max_delay, base × 2^(n-1))`, so sessions that failed together do not retry together.
//! * At most [`RetryPolicy::max_attempts`] attempts per step (the first one included).

use super::LlmFailure;

/// Default attempts per step (the first one included).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The most attempts a deployment may configure.
pub const MAX_ATTEMPTS_LIMIT: u32 = 10;

/// The retry rules of one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per step, the first one included (at least 1).
    pub max_attempts: u32,
    /// Backoff of the first retry, before jitter.
    pub base_delay_ms: u64,
    /// Largest backoff, before jitter.
    pub max_delay_ms: u64,
    /// The longest provider-requested wait we honour; longer requests end the turn.
    pub max_retry_after_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base_delay_ms: 1_000,
            max_delay_ms: 30_000,
            max_retry_after_ms: 120_000,
        }
    }
}

impl RetryPolicy {
    /// The default policy with `max_attempts` from configuration text (such as the
    /// `WUHU_LLM_MAX_ATTEMPTS` variable): a number, clamped to `1..=MAX_ATTEMPTS_LIMIT`;
    /// anything else keeps the default.
    pub fn with_max_attempts_text(text: Option<&str>) -> RetryPolicy {
        let max_attempts = text
            .and_then(|t| t.trim().parse::<u32>().ok())
            .map_or(DEFAULT_MAX_ATTEMPTS, |n| n.clamp(1, MAX_ATTEMPTS_LIMIT));
        RetryPolicy {
            max_attempts,
            ..RetryPolicy::default()
        }
    }

    /// How long to wait before attempt `attempt + 1`, after attempt `attempt` (1-based) failed
    /// with `failure`; `None`: do not retry. `jitter` is any random number.
    pub fn delay_ms(&self, failure: &LlmFailure, attempt: u32, jitter: u64) -> Option<u64> {
        if !failure.retryable || attempt >= self.max_attempts {
            return None;
        }
        if let Some(wait) = failure.retry_after_ms {
            return (wait <= self.max_retry_after_ms).then_some(wait);
        }
        let exponent = attempt.saturating_sub(1).min(32);
        let ceiling = self
            .base_delay_ms
            .saturating_mul(1u64 << exponent)
            .min(self.max_delay_ms);
        let half = ceiling / 2;
        Some(ceiling - half + jitter % (half + 1))
    }
}

/// The wait a provider asked for, in milliseconds: `retry-after-ms` (OpenAI; a number of
/// milliseconds) wins over `retry-after` (a number of seconds). Negative, non-finite or
/// HTTP-date values are ignored.
pub fn parse_retry_after(retry_after_ms: Option<&str>, retry_after: Option<&str>) -> Option<u64> {
    let number = |text: &str| {
        text.trim()
            .parse::<f64>()
            .ok()
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    if let Some(ms) = retry_after_ms.and_then(number) {
        return Some(ms.ceil().min(u64::MAX as f64) as u64);
    }
    retry_after
        .and_then(number)
        .map(|seconds| (seconds * 1000.0).ceil().min(u64::MAX as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(retryable: bool, retry_after_ms: Option<u64>) -> LlmFailure {
        LlmFailure {
            status: Some(503),
            message: "x".into(),
            retryable,
            retry_after_ms,
        }
    }

    #[test]
    fn backoff_stays_within_half_and_all_of_the_doubling_ceiling() {
        let policy = RetryPolicy {
            max_attempts: 10,
            ..RetryPolicy::default()
        };
        let mut rng = crate::rng::SplitMix64::new(7);
        for attempt in 1..10 {
            let ceiling = (1000u64 << (attempt - 1)).min(30_000);
            let mut seen = std::collections::BTreeSet::new();
            for jitter in [0, u64::MAX, ceiling / 2, ceiling / 2 + 1]
                .into_iter()
                .chain((0..200).map(|_| rng.next_u64()))
            {
                let delay = policy
                    .delay_ms(&failure(true, None), attempt, jitter)
                    .expect("retried");
                assert!(
                    (ceiling / 2..=ceiling).contains(&delay),
                    "attempt {attempt}: {delay} not in [{}, {ceiling}]",
                    ceiling / 2
                );
                seen.insert(delay);
            }
            assert!(
                seen.len() > 50,
                "attempt {attempt}: jitter spreads ({})",
                seen.len()
            );
        }
    }

    #[test]
    fn attempts_retry_after_and_retryability() {
        let policy = RetryPolicy::default();
        // (failure, attempt, expected)
        let cases = [
            (failure(false, None), 1, None),
            (failure(false, Some(10)), 1, None),
            (failure(true, Some(2_500)), 1, Some(2_500)),
            (failure(true, Some(0)), 2, Some(0)),
            (failure(true, Some(120_000)), 1, Some(120_000)),
            (failure(true, Some(120_001)), 1, None),
            (failure(true, None), DEFAULT_MAX_ATTEMPTS, None),
            (failure(true, Some(5)), DEFAULT_MAX_ATTEMPTS, None),
            (failure(true, None), u32::MAX, None),
        ];
        for (failure, attempt, want) in cases {
            assert_eq!(
                policy.delay_ms(&failure, attempt, 0),
                want,
                "{failure:?} attempt {attempt}"
            );
        }
    }

    #[test]
    fn max_attempts_from_configuration() {
        for (text, want) in [
            (None, 3),
            (Some("5"), 5),
            (Some(" 1 "), 1),
            (Some("0"), 1),
            (Some("99"), MAX_ATTEMPTS_LIMIT),
            (Some("-2"), 3),
            (Some("many"), 3),
        ] {
            assert_eq!(
                RetryPolicy::with_max_attempts_text(text).max_attempts,
                want,
                "{text:?}"
            );
        }
        let one = RetryPolicy::with_max_attempts_text(Some("1"));
        assert_eq!(one.delay_ms(&failure(true, None), 1, 0), None);
    }

    #[test]
    fn retry_after_headers() {
        let cases = [
            (None, None, None),
            (None, Some("2"), Some(2_000)),
            (None, Some(" 1.5 "), Some(1_500)),
            (Some("250"), Some("9"), Some(250)),
            (Some("12.2"), None, Some(13)),
            (Some("soon"), Some("3"), Some(3_000)),
            (None, Some("Wed, 21 Oct 2026 07:28:00 GMT"), None),
            (None, Some("-1"), None),
            (None, Some("NaN"), None),
            (None, Some("inf"), None),
            (None, Some("1e300"), Some(u64::MAX)),
        ];
        for (ms, secs, want) in cases {
            assert_eq!(parse_retry_after(ms, secs), want, "{ms:?} {secs:?}");
        }
    }

    #[test]
    fn failures_from_responses_read_retry_headers() {
        let headers = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        };
        let overloaded =
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
        let failure = LlmFailure::from_response(529, &headers(&[("Retry-After", "3")]), overloaded);
        assert_eq!(
            failure,
            LlmFailure {
                status: Some(529),
                message: "provider returned http 529: Overloaded".into(),
                retryable: true,
                retry_after_ms: Some(3_000),
            }
        );
        let failure = LlmFailure::from_response(
            400,
            &headers(&[("x-should-retry", "true")]),
            r#"{"error":{"message":"bad"}}"#,
        );
        assert!(failure.retryable);
        let failure =
            LlmFailure::from_response(503, &headers(&[("x-should-retry", "false")]), "down");
        assert!(!failure.retryable);
        for (status, retryable) in [
            (400, false),
            (401, false),
            (404, false),
            (408, true),
            (409, true),
            (413, false),
            (429, true),
            (500, true),
            (529, true),
        ] {
            assert_eq!(
                LlmFailure::from_response(status, &[], "").retryable,
                retryable,
                "{status}"
            );
        }
    }
}
