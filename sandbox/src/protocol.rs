//! The messages between an embedder and a sandbox *guest*: a separate WebAssembly instance
//! that runs [`run`](crate::run) and leaves every effect to the embedder.
//!
//! A trap or a stack overflow inside QuickJS ends the WebAssembly instance it happens in.
//! Running each script in its own instance (the `wuhu-sandbox-guest` crate, driven by
//! [`drive_guest`](crate::drive_guest)) confines that to the one script.
//!
//! The guest is a state machine with two entry points, both JSON in, JSON out:
//!
//! 1. `start(`[`GuestInput`]`)` runs the script until it finishes or waits on the host.
//! 2. `resume(`[`GuestResume`]`)` delivers finished host calls and timers and runs on.
//!
//! Each answers a [`GuestStep`]: either [`GuestStep::Done`] with the [`Outcome`], or
//! [`GuestStep::Pending`] with the [`GuestRequest`]s made since the last answer (host calls
//! to start, timers to set, and earlier requests the guest no longer wants).
//! The embedder performs them and resumes the guest with a [`GuestResult`] for each one that
//! finishes, in any order, several at once if they are ready together.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Limits, Outcome};

/// What `start` takes: the script, the host's prelude and the limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuestInput {
    /// The user's script.
    pub code: String,
    /// The host's trusted prelude (see [`Host::prelude`](crate::Host::prelude)).
    pub prelude: String,
    /// The limits of the run.
    pub limits: GuestLimits,
}

/// [`Limits`] on the wire (durations in milliseconds); zero means "the default".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestLimits {
    /// [`Limits::memory_bytes`].
    pub memory_bytes: u64,
    /// [`Limits::time`] in milliseconds.
    pub time_ms: u64,
    /// [`Limits::max_steps`].
    pub max_steps: u64,
    /// [`Limits::max_stack_bytes`].
    pub max_stack_bytes: u64,
    /// [`Limits::console_bytes`].
    pub console_bytes: u64,
}

impl From<&Limits> for GuestLimits {
    fn from(limits: &Limits) -> Self {
        GuestLimits {
            memory_bytes: limits.memory_bytes as u64,
            time_ms: u64::try_from(limits.time.as_millis()).unwrap_or(u64::MAX),
            max_steps: limits.max_steps,
            max_stack_bytes: limits.max_stack_bytes as u64,
            console_bytes: limits.console_bytes as u64,
        }
    }
}

impl From<GuestLimits> for Limits {
    fn from(limits: GuestLimits) -> Self {
        let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Limits {
            memory_bytes: size(limits.memory_bytes),
            time: std::time::Duration::from_millis(limits.time_ms),
            max_steps: limits.max_steps,
            max_stack_bytes: size(limits.max_stack_bytes),
            console_bytes: size(limits.console_bytes),
        }
    }
}

/// One thing the guest asks of the embedder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum GuestRequest {
    /// Start the host function `name` with `arg` ([`Host::call`](crate::Host::call)).
    Host {
        /// Names this request in its [`GuestResult`] and in a later [`GuestRequest::Cancel`].
        id: u64,
        /// The host function.
        name: String,
        /// Its JSON argument.
        arg: Value,
    },
    /// Answer [`GuestResult::Timer`] after `ms` milliseconds ([`Clock::sleep`](crate::Clock::sleep)).
    Sleep {
        /// Names this request.
        id: u64,
        /// How long, in milliseconds (finite and non-negative when the guest sends it).
        ms: f64,
    },
    /// The guest no longer waits for request `id`: drop it and do not answer it.
    Cancel {
        /// The request to drop.
        id: u64,
    },
}

/// A finished request, delivered by `resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum GuestResult {
    /// A host call's JSON result or error message.
    Host {
        /// The [`GuestRequest::Host`] it answers.
        id: u64,
        /// The result; an error rejects the script's promise with this message.
        result: Result<Value, String>,
    },
    /// A timer fired.
    Timer {
        /// The [`GuestRequest::Sleep`] it answers.
        id: u64,
    },
}

/// What `resume` takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuestResume {
    /// The requests that finished since the last call.
    pub results: Vec<GuestResult>,
}

/// The guest's answer to `start` and `resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum GuestStep {
    /// The script waits on the host: perform these requests, then resume.
    Pending {
        /// The requests made since the last answer, in order.
        requests: Vec<GuestRequest>,
    },
    /// The run is over; the guest must not be called again.
    Done {
        /// The result of the run.
        outcome: Outcome,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits_round_trip_through_the_wire_form() {
        let limits = Limits {
            memory_bytes: 1 << 20,
            time: std::time::Duration::from_millis(1500),
            max_steps: 77,
            max_stack_bytes: 1 << 16,
            console_bytes: 99,
        };
        assert_eq!(Limits::from(GuestLimits::from(&limits)), limits);
    }

    #[test]
    fn messages_have_a_stable_json_shape() {
        let step = GuestStep::Pending {
            requests: vec![
                GuestRequest::Host {
                    id: 1,
                    name: "fetch".into(),
                    arg: json!({"url": "https://example.com"}),
                },
                GuestRequest::Sleep { id: 2, ms: 10.0 },
                GuestRequest::Cancel { id: 2 },
            ],
        };
        assert_eq!(
            serde_json::to_value(&step).unwrap(),
            json!({"state": "pending", "requests": [
                {"op": "host", "id": 1, "name": "fetch", "arg": {"url": "https://example.com"}},
                {"op": "sleep", "id": 2, "ms": 10.0},
                {"op": "cancel", "id": 2},
            ]})
        );
        let resume = GuestResume {
            results: vec![
                GuestResult::Host {
                    id: 1,
                    result: Err("nope".into()),
                },
                GuestResult::Timer { id: 3 },
            ],
        };
        let text = serde_json::to_string(&resume).unwrap();
        assert_eq!(
            serde_json::from_str::<GuestResume>(&text).unwrap(),
            resume,
            "{text}"
        );
    }
}
