//! Work a turn causes but does not wait on: refreshing the session's row in the tenant index and
//! archiving an idle session's entries. Both used to start the moment a turn changed status, and
//! each costs a storage commit somewhere (the index's SQLite, an R2 object and the actor's own
//! SQLite); a commit holds the actor's outgoing messages until it is confirmed, and under
//! `wrangler dev` every commit of every object blocks the one workerd thread for its `fsync`. So
//! a turn that followed the last one closely waited for the last one's bookkeeping, and a turn's
//! provider request waited for the "running" row update it had just sent.
//!
//! The rules: a row update waits [`INDEX_ROW_DELAY_MS`] so that a short turn's changes (running,
//! then idle) reach the index as one update; an idle session's entries are archived once it has
//! stayed idle for [`IDLE_FLUSH_DELAY_MS`] ([`idle_flush_wait`]). Neither delay holds anything a
//! reader needs: the index row is a listing (the session's own routes answer from the actor), and
//! unarchived entries stay readable in the actor's SQLite. The archive's size bounds are kept by
//! the threshold flush, which still runs at once (`archive::should_flush`).

/// How long a change waits before the session's row in the tenant index is refreshed. Changes
/// made meanwhile (a short turn's `running`, then `idle`) go in the same update.
pub const INDEX_ROW_DELAY_MS: u64 = 250;

/// How long a session stays idle before its unarchived entries are written to a segment.
pub const IDLE_FLUSH_DELAY_MS: u64 = 2_000;

/// What the idle-flush timer does when it wakes. `idle_since` is when the session last became
/// idle (`None` while a turn runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleFlush {
    /// Flush now: the session has been idle long enough.
    Now,
    /// Sleep this many more milliseconds (the session became idle again since the timer slept).
    Wait(u64),
    /// Stop: a turn is running; its end schedules the next flush.
    Stop,
}

/// See [`IdleFlush`].
pub fn idle_flush_wait(idle_since: Option<u64>, now_ms: u64) -> IdleFlush {
    match idle_since {
        None => IdleFlush::Stop,
        Some(since) => {
            let due = since.saturating_add(IDLE_FLUSH_DELAY_MS);
            if now_ms >= due {
                IdleFlush::Now
            } else {
                IdleFlush::Wait(due - now_ms)
            }
        }
    }
}

/// The tenant index's one alarm serves two timers: the sweep of expired request logs and the
/// reconciliation of the concurrency gate (`crate::orchestration::Gate::reconcile`). Each keeps
/// its own due time here (saved by the index); the alarm is set for the earlier, and a run does
/// what is due.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IndexAlarms {
    /// When the sweep runs next (unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_at: Option<u64>,
    /// When the gate is reconciled next (unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile_at: Option<u64>,
}

/// What an alarm run of the tenant index does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexAlarmRun {
    /// Sweep expired request logs.
    pub sweep: bool,
    /// Reconcile the gate.
    pub reconcile: bool,
}

impl IndexAlarms {
    /// When the alarm should fire: the earlier due time.
    pub fn next(&self) -> Option<u64> {
        match (self.sweep_at, self.reconcile_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The alarm fired at `now`: what is due, taken out (each timer sets its next time again).
    /// An alarm of an index saved before the timers were kept sweeps, as it did.
    pub fn take_due(&mut self, now: u64) -> IndexAlarmRun {
        let legacy = self.next().is_none();
        let sweep = legacy || self.sweep_at.is_some_and(|at| at <= now);
        let reconcile = legacy || self.reconcile_at.is_some_and(|at| at <= now);
        if sweep {
            self.sweep_at = None;
        }
        if reconcile {
            self.reconcile_at = None;
        }
        IndexAlarmRun { sweep, reconcile }
    }

    /// Sets the sweep's next time to `at` unless an earlier one is set (`keep_earlier`).
    pub fn sweep_by(&mut self, at: u64, keep_earlier: bool) {
        self.sweep_at = Some(match self.sweep_at {
            Some(current) if keep_earlier => current.min(at),
            _ => at,
        });
    }

    /// Sets the reconciliation's next time to `at` unless an earlier one is set.
    pub fn reconcile_by(&mut self, at: u64) {
        self.reconcile_at = Some(self.reconcile_at.map_or(at, |current| current.min(at)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_flush_waits_for_a_quiet_idle_session() {
        let d = IDLE_FLUSH_DELAY_MS;
        let table = [
            (None, 10_000, IdleFlush::Stop),
            (Some(10_000), 10_000, IdleFlush::Wait(d)),
            (Some(10_000), 10_000 + d - 1, IdleFlush::Wait(1)),
            (Some(10_000), 10_000 + d, IdleFlush::Now),
            (Some(10_000), 10_000 + 5 * d, IdleFlush::Now),
            // A clock that went backwards waits the whole delay, never flushes early.
            (Some(10_000), 9_000, IdleFlush::Wait(d + 1_000)),
            (Some(u64::MAX - 1), 0, IdleFlush::Wait(u64::MAX)),
        ];
        for (idle_since, now, want) in table {
            assert_eq!(
                idle_flush_wait(idle_since, now),
                want,
                "{idle_since:?} at {now}"
            );
        }
    }

    #[test]
    fn a_turn_that_started_since_stops_the_timer_at_any_moment() {
        for now in [0, 1, IDLE_FLUSH_DELAY_MS, u64::MAX] {
            assert_eq!(idle_flush_wait(None, now), IdleFlush::Stop);
        }
    }

    #[test]
    fn the_index_alarm_serves_the_sweep_and_the_reconciliation() {
        let mut alarms = IndexAlarms::default();
        alarms.sweep_by(60_000, true);
        alarms.reconcile_by(20_000);
        alarms.reconcile_by(40_000);
        assert_eq!(alarms.next(), Some(20_000));
        // At 20 s only the reconciliation is due.
        assert_eq!(
            alarms.take_due(20_000),
            IndexAlarmRun {
                sweep: false,
                reconcile: true
            }
        );
        assert_eq!(alarms.next(), Some(60_000));
        alarms.reconcile_by(80_000);
        assert_eq!(
            alarms.take_due(60_000),
            IndexAlarmRun {
                sweep: true,
                reconcile: false
            }
        );
        assert_eq!(alarms.next(), Some(80_000));
        // A later sweep replaces an earlier one when it is the sweep's own next run.
        alarms.sweep_by(10_000, true);
        alarms.sweep_by(90_000, false);
        assert_eq!(alarms.sweep_at, Some(90_000));
        // An alarm with nothing recorded (saved before the timers were kept) does both.
        assert_eq!(
            IndexAlarms::default().take_due(0),
            IndexAlarmRun {
                sweep: true,
                reconcile: true
            }
        );
    }
}
