//! Performing a committed drain's effects: the context window and counters, followers, tasks,
//! archive flushes, the alarm and the tenant index.

use std::rc::Rc;
use std::time::Duration;

use wasm_bindgen_futures::spawn_local;
use worker::Delay;
use wuhu_core::bookkeeping::{self, IdleFlush};
use wuhu_core::session::{Effect, Millis};
use wuhu_core::wire::{Status, StreamEvent};

use super::persist::Batch;
use super::{Actor, WATCHDOG, archive, info_tenant, now, tasks};
use crate::tenant_index;

impl Actor {
    /// Performs a committed batch's effects: hot tail and counters, followers, tasks, alarm.
    pub(super) fn perform(self: &Rc<Self>, batch: Batch) {
        let Batch {
            effects,
            sizes,
            deadline,
            status,
            outbox_written,
            children,
            ..
        } = batch;
        {
            let mut tail = self.turn.tail.borrow_mut();
            let appended = effects.iter().filter_map(|e| match e {
                Effect::AppendEntry(entry) => Some(entry),
                _ => None,
            });
            for (entry, (row_bytes, entry_bytes)) in appended.zip(sizes) {
                if let Some(tail) = tail.as_mut() {
                    tail.push(entry.clone(), entry_bytes);
                }
                if let Some((n, total)) = self.writes.unarchived.get() {
                    self.writes
                        .unarchived
                        .set(Some((n + 1, total + row_bytes as u64)));
                }
            }
        }
        // A child tells its parent what the drain means (running, idle, failed, stopped): the
        // events are in its outbox, committed; the alarm is the safety net of their delivery.
        if outbox_written {
            self.arm_alarm_by(Millis(now().0 + wuhu_core::lifecycle::FIRST_RETRY_MS));
            self.kick_outbox();
        }
        // A parent's records of its children, committed: shown to followers.
        for child in children {
            self.broadcast(StreamEvent::ChildStatus { child });
        }
        let mut flush = false;
        let mut index = false;
        let mut usage = false;
        for effect in effects {
            match effect {
                Effect::AppendEntry(entry) => {
                    usage |=
                        !wuhu_core::tenant_usage::records(std::slice::from_ref(&entry)).is_empty();
                    self.broadcast(StreamEvent::EntryAppended { entry })
                }
                Effect::StatusChanged(status) => {
                    index = true;
                    if status == Status::Running {
                        self.bookkeeping.idle_since.set(None);
                    }
                    self.broadcast(StreamEvent::Status { status });
                    self.observe_turn(status);
                }
                Effect::Infer { step } => tasks::spawn_inference(self, step),
                Effect::RunTools { step, calls } => {
                    for call in calls {
                        tasks::spawn_tool(self, step, call);
                    }
                }
                Effect::CancelInference { step } => tasks::cancel_inference(self, step),
                Effect::CancelTools { step } => tasks::cancel_tools(self, step),
                // Written with the batch.
                // Every viewer sees the queue change (the rows were written in the drain's
                // commit); the internal system lane is not shown.
                Effect::QueueInsert(item) => {
                    if item.lane != wuhu_core::wire::Lane::System {
                        self.broadcast(StreamEvent::QueueItemAdded {
                            preview: item
                                .content
                                .chars()
                                .take(wuhu_core::wire::QUEUE_PREVIEW_CHARS)
                                .collect(),
                            id: item.id,
                            lane: item.lane,
                            author: item.author,
                        });
                    }
                }
                Effect::QueueDelete { id, reason } => {
                    self.broadcast(StreamEvent::QueueItemRemoved { id, reason });
                }
                Effect::Idle => {
                    flush = true;
                    self.bookkeeping.idle_since.set(Some(now().0));
                    // Catches up on a report that failed earlier.
                    usage = true;
                    self.broadcast(StreamEvent::Idle);
                }
            }
        }
        if let Some(deadline) = deadline {
            self.arm_alarm(deadline);
        } else if status == Status::Running && self.bookkeeping.alarm_armed_for.get().is_none() {
            self.arm_alarm(Millis(now().0 + WATCHDOG.as_millis() as u64));
        }
        if index {
            self.schedule_index_update();
        }
        if usage {
            self.schedule_usage_report();
        }
        if self.unarchived_over_threshold() {
            spawn_local(archive::flush(self.clone()));
        } else if flush {
            self.schedule_idle_flush();
        }
    }

    /// Archives an idle session's entries once it has stayed idle for
    /// `bookkeeping::IDLE_FLUSH_DELAY_MS`: a turn that follows closely does not wait for the
    /// last one's segment write. One timer at a time; it sleeps again when the session went
    /// idle again meanwhile and stops when a turn runs (that turn's end schedules it again).
    fn schedule_idle_flush(self: &Rc<Self>) {
        if self.bookkeeping.idle_flush_timer.replace(true) {
            return;
        }
        let actor = self.clone();
        spawn_local(async move {
            loop {
                match bookkeeping::idle_flush_wait(actor.bookkeeping.idle_since.get(), now().0) {
                    IdleFlush::Wait(ms) => Delay::from(Duration::from_millis(ms)).await,
                    IdleFlush::Now => {
                        actor.bookkeeping.idle_flush_timer.set(false);
                        // A session being deleted writes nothing more (its objects step waits
                        // for a flush under way, not for one that has not started).
                        if !actor.deletion.deleting.get() {
                            archive::flush(actor).await;
                        }
                        return;
                    }
                    IdleFlush::Stop => break,
                }
            }
            actor.bookkeeping.idle_flush_timer.set(false);
        });
    }

    /// Notes when a turn starts and logs one line when it ends (`observe::TurnLine`).
    pub(super) fn observe_turn(&self, status: Status) {
        if status == Status::Running {
            self.turn.turn_started_at.set(Some(now().0));
            self.turn.turn_image_loads.take();
            return;
        }
        let started = self.turn.turn_started_at.take();
        let images = self.turn.turn_image_loads.take();
        let Some((session, tenant, step, last_cursor)) = self.with_loaded(|l| {
            (
                l.meta.id.clone(),
                l.meta.tenant.clone(),
                l.session.checkpoint().step,
                l.session.last_cursor(),
            )
        }) else {
            return;
        };
        crate::observe::TurnLine {
            tenant: &tenant,
            session: &session,
            status: status.as_str(),
            step,
            last_cursor,
            duration_ms: started.map(|t| now().0.saturating_sub(t)),
            images_cached: images.hits,
            images_read: images.misses,
            image_cache_bytes: crate::blob_store::cached_image_bytes(),
        }
        .emit();
    }

    /// Counts a request's image loads for the turn log line.
    pub(super) fn note_image_loads(&self, loads: crate::blob_store::ImageLoads) {
        let mut turn = self.turn.turn_image_loads.get();
        turn.hits += loads.hits;
        turn.misses += loads.misses;
        self.turn.turn_image_loads.set(turn);
    }

    pub(super) fn unarchived_over_threshold(&self) -> bool {
        let counts = match self.writes.unarchived.get() {
            Some(counts) => counts,
            None => {
                let Ok(counts) = self.store().and_then(|s| Ok(s.unarchived()?)) else {
                    return false;
                };
                self.writes.unarchived.set(Some(counts));
                counts
            }
        };
        wuhu_core::archive::should_flush(counts.0, counts.1, false)
    }

    /// Forgets the unarchived counters (after a flush changed them).
    pub(crate) fn invalidate_unarchived(&self) {
        self.writes.unarchived.set(None);
    }

    pub(super) fn arm_alarm(self: &Rc<Self>, at: Millis) {
        // One alarm serves the loop and approval expiry: never later than the next expiry.
        let at = match self.approval_store().map(|s| s.next_expiry()) {
            Ok(Ok(Some(expiry))) if expiry < at => expiry,
            _ => at,
        };
        // ... nor than the next attempt at a child's lifecycle events,
        let at = match self.lifecycle.outbox_next_at.get() {
            Some(next) if next < at.0 => Millis(next.max(now().0 + 1)),
            _ => at,
        };
        // ... and never later than the next poll of running background jobs (an overdue poll
        // a second from now: the alarm that runs it is on its way).
        let at = match self
            .jobs
            .job_poll_at
            .get()
            .map(|poll| poll.max(now().0 + 1000))
        {
            Some(poll) if poll < at.0 => Millis(poll),
            _ => at,
        };
        if self.bookkeeping.alarm_armed_for.get() == Some(at.0) {
            return;
        }
        self.bookkeeping.alarm_armed_for.set(Some(at.0));
        let storage = self.state.storage();
        spawn_local(async move {
            // An offset from now: the alarm API takes either an offset or a chrono date.
            let offset_ms = at.0.saturating_sub(now().0).max(1) as i64;
            if let Err(e) = storage.set_alarm(offset_ms).await {
                worker::console_error!("setting the alarm failed: {e}");
            }
        });
    }

    /// Arms the alarm for `at` unless it is armed for earlier already.
    pub(crate) fn arm_alarm_by(self: &Rc<Self>, at: Millis) {
        if self
            .bookkeeping
            .alarm_armed_for
            .get()
            .is_none_or(|armed| armed > at.0)
        {
            self.arm_alarm(at);
        }
    }

    /// Reports the usage recorded since the last report to the tenant index; one report at a
    /// time, coalesced. A failed report is sent again at the next one (the index counts each
    /// entry once). While the session's steps need no report before their requests
    /// (`tenant_usage::unlimited_and_told`), it waits `USAGE_REPORT_DELAY_MS` first, so that a
    /// quick run of steps is one report: one index commit, not one per turn.
    pub(crate) fn schedule_usage_report(self: &Rc<Self>) {
        self.bookkeeping.usage_dirty.set(true);
        if self.bookkeeping.usage_sending.get() {
            return;
        }
        self.bookkeeping.usage_sending.set(true);
        let delay = self.usage_report_delay_ms();
        // Set before the task first runs: a step spawned in the same drain can wake it.
        let woken = (delay > 0).then(|| {
            let (wake, woken) = futures::channel::oneshot::channel();
            *self.bookkeeping.usage_wake.borrow_mut() = Some(wake);
            woken
        });
        let actor = self.clone();
        spawn_local(async move {
            if let Some(woken) = woken {
                let sleep = Delay::from(Duration::from_millis(delay));
                futures::future::select(sleep, woken).await;
                actor.bookkeeping.usage_wake.borrow_mut().take();
            }
            while actor.bookkeeping.usage_dirty.replace(false) {
                if let Err(e) = actor.report_usage().await {
                    worker::console_error!(
                        "reporting usage to the tenant index failed: {}",
                        e.message
                    );
                    break;
                }
            }
            actor.bookkeeping.usage_sending.set(false);
            for waiter in actor.bookkeeping.usage_waiters.take() {
                let _ = waiter.send(());
            }
        });
    }

    /// How long a report waits before it is sent (`tenant_usage::usage_report_delay_ms`).
    fn usage_report_delay_ms(&self) -> u64 {
        wuhu_core::tenant_usage::usage_report_delay_ms(
            self.bookkeeping.known_budget.get().as_ref(),
            self.tenant_settings.settings.borrow().held_generation(),
            now().0,
        )
    }

    /// Waits until no report is in flight, waking one that waits out its delay. A step waits
    /// for the one the previous step's end sent instead of sending the same records again: a
    /// second round trip, and a second write for the index to commit, for an answer the first
    /// brings.
    pub(crate) async fn usage_report_sent(&self) {
        if !self.bookkeeping.usage_sending.get() {
            return;
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        self.bookkeeping.usage_waiters.borrow_mut().push(tx);
        if let Some(wake) = self.bookkeeping.usage_wake.borrow_mut().take() {
            let _ = wake.send(());
        }
        let _ = rx.await;
    }

    /// Reports the usage of the entries committed since the last report. Entries without usage
    /// (a user's message, tool results) only move this session's own cursor: no round trip to
    /// the index. Each answer carries the tenant's budget with the report counted: it becomes
    /// `known_budget` before the cursor moves, so the known state always counts every request
    /// of this session that is marked reported.
    pub(crate) async fn report_usage(self: &Rc<Self>) -> crate::http::ApiResult<()> {
        use wuhu_core::tenant_usage::{self, KnownBudget, UsageReport};
        let Some((session, fork_cursor)) = self.with_loaded(|l| {
            (
                l.meta.id.clone(),
                l.meta.forked_from.as_ref().map_or(0, |f| f.cursor),
            )
        }) else {
            return Ok(());
        };
        // A fork reports its own requests only: its history is its parent's. Entries looked at
        // without finding usage move only the cursor in memory: a write here would hold the
        // step's provider request behind its commit (the output gate). The stored cursor may
        // lag; those entries are looked at again after a restart, and the index counts a
        // record once.
        let mut through = self
            .store()?
            .usage_reported_through()?
            .unwrap_or(0)
            .max(fork_cursor)
            .max(self.bookkeeping.usage_scanned_through.get());
        while through < self.committed_cursor() {
            let (entries, _) =
                archive::read_page(self, through, tenant_usage::MAX_REPORT_RECORDS).await?;
            let Some(last) = entries.last().map(|e| e.cursor) else {
                break;
            };
            let records = tenant_usage::records(&entries);
            let mcp = tenant_usage::mcp_records(&entries);
            if !records.is_empty() || !mcp.is_empty() {
                let report = UsageReport {
                    session: session.clone(),
                    user: self.owner(),
                    through: last,
                    records,
                    mcp,
                };
                // Taken as the report leaves: a forget that overtakes the answer makes it
                // count as asked before the change.
                let asked_while_held = self.tenant_settings.settings.borrow().held_generation();
                let answer =
                    tenant_index::report_usage(&self.env, &info_tenant(self), &report).await?;
                self.bookkeeping.known_budget.set(Some(KnownBudget {
                    state: answer.budget,
                    at: now().0,
                    asked_while_held,
                }));
                self.bookkeeping.usage_reported_unsaved.set(Some(last));
            }
            self.bookkeeping.usage_scanned_through.set(last);
            through = last;
        }
        Ok(())
    }

    /// Sends the latest session info to the tenant index `bookkeeping::INDEX_ROW_DELAY_MS` after
    /// a change; one send at a time, coalesced.
    pub(crate) fn schedule_index_update(self: &Rc<Self>) {
        self.bookkeeping.index_dirty.set(true);
        if self.bookkeeping.index_sending.get() {
            return;
        }
        self.bookkeeping.index_sending.set(true);
        let actor = self.clone();
        spawn_local(async move {
            // Changes made while this waits go in the same update (`wuhu_core::bookkeeping`).
            Delay::from(Duration::from_millis(bookkeeping::INDEX_ROW_DELAY_MS)).await;
            while actor.bookkeeping.index_dirty.replace(false) {
                let Ok(info) = actor.info() else { break };
                if let Err(e) = tenant_index::upsert(&actor.env, &info_tenant(&actor), &info).await
                {
                    worker::console_error!("updating the session index failed: {}", e.message);
                }
            }
            actor.bookkeeping.index_sending.set(false);
        });
    }
}
