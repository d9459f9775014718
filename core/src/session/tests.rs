//! Table-driven tests of the loop: each case is a script of inputs; the expectation is the
//! transcript and effects rendered one per line.

use super::*;
use crate::llm::LlmFailure;
use crate::wire::{ContentBlock, StopReason};

/// Drives a session from a compact script and renders what came out. It also plays the host's
/// storage: after every drain it commits the entries, the queue rows and the checkpoint as one
/// write (or, when told, fails that write and restores the session from what was committed).
struct Harness {
    session: Session,
    now: u64,
    log: Vec<String>,
    /// The committed checkpoint's JSON.
    saved_checkpoint: String,
    /// The committed queue rows, in insertion order.
    rows: Vec<QueueItem>,
    /// Cursors of the committed entries.
    stored: Vec<u64>,
    /// The next write fails as a whole.
    fail_next_write: bool,
    /// The next write stores entries and rows but not the checkpoint (the old bug).
    lose_next_checkpoint: bool,
}

impl Harness {
    fn new() -> Harness {
        let header = Header {
            system_prompt: "sys".into(),
            provider: "fake".into(),
            model: "m".into(),
            reasoning: None,
        };
        let mut h = Harness {
            session: Session::create(Millis(1_000), 7, header, vec![]),
            now: 1_000,
            log: vec![],
            saved_checkpoint: String::new(),
            rows: vec![],
            stored: vec![],
            fail_next_write: false,
            lose_next_checkpoint: false,
        };
        h.drain();
        h.log.clear();
        h
    }

    /// Performs the drained effects and commits their writes.
    fn drain(&mut self) {
        let mut entries = Vec::new();
        let mut rows = self.rows.clone();
        let mut drained = false;
        while let Some(effect) = self.session.poll_effect() {
            let line = match effect {
                Effect::AppendEntry(entry) => {
                    entries.push(entry.cursor);
                    format!("#{} {}", entry.cursor, render(&entry.payload))
                }
                Effect::QueueInsert(item) => {
                    let line = format!("queue+ {}", item.id);
                    assert!(rows.iter().all(|r| r.id != item.id), "{line} twice");
                    rows.push(item);
                    line
                }
                Effect::QueueDelete { id, reason } => {
                    let before = rows.len();
                    rows.retain(|r| r.id != id);
                    assert_eq!(rows.len() + 1, before, "queue- {id} without a row");
                    match reason {
                        crate::wire::QueueRemoval::Delivered => format!("queue- {id}"),
                        crate::wire::QueueRemoval::Cancelled => format!("queue- {id} cancelled"),
                    }
                }
                Effect::StatusChanged(s) => format!("status {}", s.as_str()),
                Effect::Infer { step } => match self.session.turn_reasoning() {
                    None => format!("infer {step}"),
                    Some(r) => format!("infer {step} (reasoning {})", r.effort.as_str()),
                },
                Effect::CancelInference { step } => format!("cancel-infer {step}"),
                Effect::RunTools { step, calls } => {
                    format!(
                        "run {step} {}",
                        calls
                            .iter()
                            .map(|c| c.id.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                }
                Effect::CancelTools { step } => format!("cancel-tools {step}"),
                Effect::Idle => "idle".into(),
            };
            self.log.push(line);
            drained = true;
        }
        if !drained {
            return; // Nothing to write.
        }
        if std::mem::take(&mut self.fail_next_write) {
            self.log.push("! write failed: reload".into());
            self.reload(Some("injected failure"));
            return;
        }
        self.rows = rows;
        self.stored.extend(entries);
        if std::mem::take(&mut self.lose_next_checkpoint) {
            self.log.push("! checkpoint lost".into());
        } else {
            self.saved_checkpoint = serde_json::to_string(self.session.checkpoint()).unwrap();
        }
        // The rows are the queue, and the checkpoint holds no item.
        let ids = |items: &[QueueItem]| items.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&self.rows), ids(self.session.queue()));
        assert!(!self.saved_checkpoint.contains("\"queue\""));
        assert_eq!(
            self.session.queue_bytes(),
            self.rows.iter().map(QueueItem::bytes).sum::<usize>()
        );
    }

    /// What the host does on load: restore from storage, check the cursors, note a failed
    /// write, resume.
    fn reload(&mut self, failure: Option<&str>) {
        let now = Millis(self.now);
        let checkpoint = serde_json::from_str(&self.saved_checkpoint).unwrap();
        self.session = Session::restore(checkpoint, self.rows.clone(), 99);
        let newest = self.stored.iter().copied().max().unwrap_or(0);
        if self.session.handle_stored_cursor(now, newest) {
            self.log.push("! cursor repaired".into());
        }
        if let Some(message) = failure {
            self.session.handle_storage_failure(now, message);
        }
        self.session.handle_resume(now);
        self.drain();
    }

    /// One script line: `steer [@AUTHOR] TEXT`, `follow [@AUTHOR] TEXT`, `cancel ID`, `stop`,
    /// `reply S TEXT`, `calls S tool:id ...`, `fail S STATUS`, `done S ID`, `tick MS`, `resume`
    /// (restore from what was committed), and the storage faults `failwrite` (the next drain's
    /// write fails) and `losecheckpoint` (the next drain writes everything but the checkpoint).
    fn run(&mut self, script: &str) -> String {
        for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
            self.now += 10;
            let now = Millis(self.now);
            let (cmd, rest) = line.split_once(' ').unwrap_or((line, ""));
            self.log.push(format!("> {line}"));
            match cmd {
                "steer" | "follow" | "system" => {
                    let lane = match cmd {
                        "steer" => Lane::Steer,
                        "follow" => Lane::FollowUp,
                        _ => Lane::System,
                    };
                    // `follow @bob TEXT`: enqueued by bob (default author: ana).
                    let (author, rest) = match rest.strip_prefix('@') {
                        Some(tail) => tail.split_once(' ').unwrap_or((tail, "")),
                        None => ("ana", rest),
                    };
                    let id = format!("q-{rest}");
                    self.session
                        .handle_enqueue(now, id, lane, author.into(), rest.into())
                        .unwrap();
                }
                "rsteer" | "rfollow" => {
                    // `rfollow EFFORT TEXT`: a message carrying a reasoning setting.
                    let lane = if cmd == "rsteer" {
                        Lane::Steer
                    } else {
                        Lane::FollowUp
                    };
                    let (effort, text) = rest.split_once(' ').unwrap();
                    let reasoning =
                        serde_json::from_value(serde_json::json!({"effort": effort})).unwrap();
                    let r = self.session.handle_enqueue_with_reasoning(
                        now,
                        format!("q-{text}"),
                        lane,
                        "ana".into(),
                        text.into(),
                        Some(reasoning),
                        true,
                    );
                    self.log.push(format!("enqueue -> {r:?}"));
                }
                "notify" => {
                    // `notify ID TEXT`: a server message (a child's report) on the system lane.
                    let (id, text) = rest.split_once(' ').unwrap();
                    let input = SystemInput {
                        custom_type: "wuhu_child_status_v1".into(),
                        details: Some(serde_json::json!({"id": id})),
                    };
                    let r = self.session.handle_system_message(
                        now,
                        format!("n-{id}"),
                        input,
                        text.into(),
                    );
                    self.log.push(format!("notify -> {r:?}"));
                }
                "cancel" => {
                    let r = self.session.handle_cancel(&format!("q-{rest}"));
                    self.log.push(format!("cancel -> {r:?}"));
                }
                "stop" => {
                    let n = self.session.handle_stop(now, "ana");
                    self.log.push(format!("stopped {n}"));
                }
                "reply" => {
                    let (step, text) = rest.split_once(' ').unwrap();
                    let msg = AssistantMessage {
                        content: vec![ContentBlock::Text { text: text.into() }],
                        ..Default::default()
                    };
                    self.session
                        .handle_inference_done(now, step.parse().unwrap(), Ok(msg));
                }
                "calls" => {
                    let mut parts = rest.split(' ');
                    let step = parts.next().unwrap().parse().unwrap();
                    let content = parts
                        .map(|p| {
                            let (name, id) = p.split_once(':').unwrap();
                            ContentBlock::ToolCall(ToolCall {
                                id: id.into(),
                                name: name.into(),
                                arguments: serde_json::json!({}),
                            })
                        })
                        .collect();
                    let msg = AssistantMessage {
                        content,
                        stop_reason: StopReason::ToolUse,
                        ..Default::default()
                    };
                    self.session.handle_inference_done(now, step, Ok(msg));
                }
                "fail" => {
                    let (step, status) = rest.split_once(' ').unwrap();
                    let status: u16 = status.parse().unwrap();
                    let failure =
                        LlmFailure::from_status(status, "{\"error\":{\"message\":\"nope\"}}");
                    self.session
                        .handle_inference_done(now, step.parse().unwrap(), Err(failure));
                }
                "done" => {
                    let (step, id) = rest.split_once(' ').unwrap();
                    self.session.handle_tool_done(
                        now,
                        step.parse().unwrap(),
                        id,
                        format!("out-{id}"),
                        false,
                    );
                }
                "tick" => {
                    self.now += rest.parse::<u64>().unwrap();
                    self.session.handle_timeout(Millis(self.now));
                }
                "resume" => {
                    self.reload(None);
                }
                "failwrite" => {
                    self.fail_next_write = true;
                }
                "losecheckpoint" => {
                    self.lose_next_checkpoint = true;
                }
                other => panic!("unknown script command {other}"),
            }
            self.drain();
        }
        self.log.join("\n")
    }
}

fn render(payload: &EntryPayload) -> String {
    match payload {
        EntryPayload::Header(h) => format!("header {}", h.model),
        EntryPayload::Custom { custom_type, .. } => format!("custom {custom_type}"),
        EntryPayload::Compaction(c) => format!("compaction from {}", c.first_kept_cursor),
        EntryPayload::Message { message } => match message {
            Message::User { content, lane, .. } => format!("user({lane:?}) {content}"),
            Message::Assistant(a) => {
                let calls: Vec<&str> = a.tool_calls().map(|c| c.id.as_str()).collect();
                if calls.is_empty() {
                    format!("assistant {}", a.text())
                } else {
                    format!("assistant calls {}", calls.join(","))
                }
            }
            Message::ToolResult(r) => {
                format!("result {} err={} {}", r.tool_call_id, r.is_error, r.content)
            }
            Message::CustomMessage {
                custom_type,
                content,
                ..
            } if custom_type != custom_types::SYSTEM_INPUT => {
                format!("system[{custom_type}] {content}")
            }
            Message::CustomMessage { content, .. } => format!("system {content}"),
        },
    }
}

fn check(script: &str, expect: expect_test::Expect) {
    let mut h = Harness::new();
    expect.assert_eq(&h.run(script));
}

use expect_test::expect;

#[test]
fn simple_turn_goes_idle() {
    check(
        "follow hi
         reply 1 hello",
        expect![[r#"
            > follow hi
            queue+ q-hi
            queue- q-hi
            #2 user(Some(FollowUp)) hi
            status running
            infer 1
            > reply 1 hello
            #3 assistant hello
            status idle
            idle"#]],
    );
}

/// A message's reasoning setting holds for its turn only: every step of it (after tool calls,
/// after a restart), a later message's setting in the same turn replaces it, and the next turn
/// without one has none. A message sent again by its key is not queued twice.
#[test]
fn a_messages_reasoning_holds_for_its_turn_only() {
    check(
        "rfollow high go
         rfollow high go
         calls 1 list_sessions:a
         resume
         done 1 a
         rsteer low now
         calls 2 list_sessions:b
         done 2 b
         reply 3 ok
         follow plain
         reply 4 fine",
        expect![[r#"
            > rfollow high go
            enqueue -> Ok(true)
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1 (reasoning high)
            > rfollow high go
            enqueue -> Ok(false)
            > calls 1 list_sessions:a
            #3 assistant calls a
            run 1 a
            > resume
            run 1 a
            > done 1 a
            #4 result a err=false out-a
            infer 2 (reasoning high)
            > rsteer low now
            enqueue -> Ok(true)
            queue+ q-now
            > calls 2 list_sessions:b
            #5 assistant calls b
            #6 result b err=true Tool call skipped: a new message arrived before it ran.
            queue- q-now
            #7 user(Some(Steer)) now
            infer 3 (reasoning low)
            > done 2 b
            > reply 3 ok
            #8 assistant ok
            status idle
            idle
            > follow plain
            queue+ q-plain
            queue- q-plain
            #9 user(Some(FollowUp)) plain
            status running
            infer 4
            > reply 4 fine
            #10 assistant fine
            status idle
            idle"#]],
    );
}

#[test]
fn tool_calls_run_in_parallel_batches_then_infer_again() {
    check(
        "steer go
         calls 1 list_sessions:a read_session:b
         done 1 b
         done 1 a
         reply 2 done",
        expect![[r#"
            > steer go
            queue+ q-go
            queue- q-go
            #2 user(Some(Steer)) go
            status running
            infer 1
            > calls 1 list_sessions:a read_session:b
            #3 assistant calls a,b
            run 1 a,b
            > done 1 b
            #4 result b err=false out-b
            > done 1 a
            #5 result a err=false out-a
            infer 2
            > reply 2 done
            #6 assistant done
            status idle
            idle"#]],
    );
}

#[test]
fn steer_mid_stream_skips_the_tool_calls_of_that_message() {
    check(
        "follow go
         steer wait
         calls 1 list_sessions:a
         reply 2 ok",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > steer wait
            queue+ q-wait
            > calls 1 list_sessions:a
            #3 assistant calls a
            #4 result a err=true Tool call skipped: a new message arrived before it ran.
            queue- q-wait
            #5 user(Some(Steer)) wait
            infer 2
            > reply 2 ok
            #6 assistant ok
            status idle
            idle"#]],
    );
}

#[test]
fn steer_while_tools_run_waits_for_the_running_batch() {
    check(
        "follow go
         calls 1 list_sessions:a
         steer more
         done 1 a",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > calls 1 list_sessions:a
            #3 assistant calls a
            run 1 a
            > steer more
            queue+ q-more
            > done 1 a
            #4 result a err=false out-a
            queue- q-more
            #5 user(Some(Steer)) more
            infer 2"#]],
    );
}

#[test]
fn follow_up_waits_until_the_agent_would_stop() {
    check(
        "follow one
         follow two
         calls 1 list_sessions:a
         done 1 a
         reply 2 first
         reply 3 second",
        expect![[r#"
            > follow one
            queue+ q-one
            queue- q-one
            #2 user(Some(FollowUp)) one
            status running
            infer 1
            > follow two
            queue+ q-two
            > calls 1 list_sessions:a
            #3 assistant calls a
            run 1 a
            > done 1 a
            #4 result a err=false out-a
            infer 2
            > reply 2 first
            #5 assistant first
            queue- q-two
            #6 user(Some(FollowUp)) two
            infer 3
            > reply 3 second
            #7 assistant second
            status idle
            idle"#]],
    );
}

#[test]
fn cancel_until_delivered() {
    check(
        "follow one
         follow two
         follow three
         cancel two
         cancel two
         cancel one
         reply 1 a",
        expect![[r#"
            > follow one
            queue+ q-one
            queue- q-one
            #2 user(Some(FollowUp)) one
            status running
            infer 1
            > follow two
            queue+ q-two
            > follow three
            queue+ q-three
            > cancel two
            cancel -> Ok(())
            queue- q-two cancelled
            > cancel two
            cancel -> Err(NotFound)
            > cancel one
            cancel -> Err(AlreadyDelivered)
            > reply 1 a
            #3 assistant a
            queue- q-three
            #4 user(Some(FollowUp)) three
            infer 2"#]],
    );
}

#[test]
fn stop_mid_tools_then_enqueue_resumes() {
    check(
        "follow go
         calls 1 list_sessions:a read_session:b
         done 1 a
         stop
         done 1 b
         follow again",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > calls 1 list_sessions:a read_session:b
            #3 assistant calls a,b
            run 1 a,b
            > done 1 a
            #4 result a err=false out-a
            > stop
            stopped 1
            cancel-tools 1
            #5 result b err=true Tool call stopped: the session was stopped before it finished.
            #6 custom wuhu_execution_stopped_v1
            status stopped
            > done 1 b
            > follow again
            queue+ q-again
            status idle
            queue- q-again
            #7 user(Some(FollowUp)) again
            status running
            infer 2"#]],
    );
}

#[test]
fn stop_mid_inference_ignores_the_late_reply() {
    check(
        "follow go
         stop
         reply 1 late",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > stop
            stopped 0
            cancel-infer 1
            #3 custom wuhu_execution_stopped_v1
            status stopped
            > reply 1 late"#]],
    );
}

#[test]
fn retryable_failures_retry_with_backoff_then_give_up() {
    check(
        // Attempt 1 waits 500..=1000 ms, attempt 2 1000..=2000 ms (jittered; each line adds 10).
        "follow go
         fail 1 429
         tick 480
         tick 600
         fail 1 503
         tick 980
         tick 1100
         fail 1 500",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > fail 1 429
            #3 custom wuhu_llm_error_v1
            > tick 480
            > tick 600
            infer 1
            > fail 1 503
            #4 custom wuhu_llm_error_v1
            > tick 980
            > tick 1100
            infer 1
            > fail 1 500
            #5 custom wuhu_llm_error_v1
            status idle
            idle"#]],
    );
}

#[test]
fn client_errors_are_not_retried() {
    check(
        "follow go
         fail 1 400",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > fail 1 400
            #3 custom wuhu_llm_error_v1
            status idle
            idle"#]],
    );
}

#[test]
fn unknown_tools_fail_without_reaching_the_host() {
    check(
        "follow go
         calls 1 rm_rf:x",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > calls 1 rm_rf:x
            #3 assistant calls x
            #4 result x err=true Unknown tool "rm_rf". Available tools: list_sessions, read_session, request_environment, detach_environment, bash, job_status, job_kill, edit, ls, find, grep, js, mcp_tools, mcp_call, set_model, spawn_session, send_to_session, wait_sessions, stop_session, read, write.
            infer 2"#]],
    );
}

#[test]
fn resume_reissues_in_flight_work() {
    check(
        "follow go
         resume
         calls 1 list_sessions:a
         resume
         done 1 a",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > resume
            infer 1
            > calls 1 list_sessions:a
            #3 assistant calls a
            run 1 a
            > resume
            run 1 a
            > done 1 a
            #4 result a err=false out-a
            infer 2"#]],
    );
}

#[test]
fn system_lane_is_delivered_like_steer() {
    check(
        "follow go
         system runner back
         reply 1 ok",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > system runner back
            queue+ q-runner back
            > reply 1 ok
            #3 assistant ok
            queue- q-runner back
            #4 system runner back
            infer 2"#]],
    );
}

#[test]
fn queue_is_bounded() {
    let mut h = Harness::new();
    h.session.handle_stop(Millis(2_000), "ana");
    for i in 0..MAX_QUEUE_ITEMS {
        // A stopped session resumes on enqueue, so stop again to keep items queued.
        h.session.handle_stop(Millis(2_000), "ana");
        let _ = h.session.handle_enqueue(
            Millis(2_000),
            format!("{i}"),
            Lane::Steer,
            "a".into(),
            "x".into(),
        );
        if h.session.queue().is_empty() {
            break;
        }
    }
    let full = (0..MAX_QUEUE_ITEMS + 1)
        .map(|i| {
            h.session.handle_enqueue(
                Millis(2_000),
                format!("f{i}"),
                Lane::FollowUp,
                "a".into(),
                "x".into(),
            )
        })
        .any(|r| r == Err(EnqueueError::QueueFull));
    assert!(full);
}

#[test]
fn group_chat_reminder_once_when_another_user_prompts() {
    check(
        "follow @ana hello
         reply 1 hi
         follow @ana again
         reply 2 ok
         follow @bob me too
         reply 3 sure
         follow @carol and me
         steer @ana x
         reply 4 fine",
        expect![[r#"
            > follow @ana hello
            queue+ q-hello
            queue- q-hello
            #2 user(Some(FollowUp)) hello
            status running
            infer 1
            > reply 1 hi
            #3 assistant hi
            status idle
            idle
            > follow @ana again
            queue+ q-again
            queue- q-again
            #4 user(Some(FollowUp)) again
            status running
            infer 2
            > reply 2 ok
            #5 assistant ok
            status idle
            idle
            > follow @bob me too
            queue+ q-me too
            queue- q-me too
            #6 system[wuhu_group_chat_reminder_v1] System reminder: this session is now a group chat. It belongs to ana; bob has joined. From now on every user message starts with `[username]:` naming its author. Answer the person who wrote each message, and act on requests with the owner's interests in mind.
            #7 user(Some(FollowUp)) me too
            status running
            infer 3
            > reply 3 sure
            #8 assistant sure
            status idle
            idle
            > follow @carol and me
            queue+ q-and me
            queue- q-and me
            #9 user(Some(FollowUp)) and me
            status running
            infer 4
            > steer @ana x
            queue+ q-x
            > reply 4 fine
            #10 assistant fine
            queue- q-x
            #11 user(Some(Steer)) x
            infer 5"#]],
    );
    let mut h = Harness::new();
    h.run("follow @bob first\nreply 1 a\nfollow @ana second");
    assert_eq!(
        h.session.owner(),
        Some("bob"),
        "the first prompter owns the session"
    );
    assert!(h.session.group_chat_since().is_some());
}

#[test]
fn queue_bytes_are_bounded_and_freed_by_delivery_and_cancel() {
    let mut h = Harness::new();
    // A running turn: follow-ups wait behind it.
    h.run("follow go");
    let quarter = MAX_QUEUE_BYTES / 4;
    let t = Millis(5_000);
    for i in 0..4 {
        h.session
            .handle_enqueue(
                t,
                format!("{i}"),
                Lane::FollowUp,
                "a".into(),
                "x".repeat(quarter),
            )
            .unwrap();
        h.drain();
    }
    assert_eq!(h.session.queue_bytes(), MAX_QUEUE_BYTES);
    assert_eq!(
        h.session
            .handle_enqueue(t, "over".into(), Lane::FollowUp, "a".into(), "y".into()),
        Err(EnqueueError::QueueBytes {
            queued: MAX_QUEUE_BYTES,
            item: 1
        })
    );
    h.drain();
    // A cancel frees exactly its bytes: an item of that size fits again, one byte more not.
    h.session.handle_cancel("1").unwrap();
    h.drain();
    assert_eq!(
        h.session.handle_enqueue(
            t,
            "over".into(),
            Lane::FollowUp,
            "a".into(),
            "y".repeat(quarter + 1)
        ),
        Err(EnqueueError::QueueBytes {
            queued: MAX_QUEUE_BYTES - quarter,
            item: quarter + 1
        })
    );
    h.session
        .handle_enqueue(
            t,
            "fits".into(),
            Lane::FollowUp,
            "a".into(),
            "y".repeat(quarter),
        )
        .unwrap();
    h.drain();
    assert_eq!(h.session.queue_bytes(), MAX_QUEUE_BYTES);
    // Delivery frees the bytes of every delivered item.
    h.run("reply 1 ok");
    assert_eq!(h.session.queue_bytes(), 0);
    assert!(h.rows.is_empty());
}

#[test]
fn delivery_deletes_the_row_in_the_same_drain_as_the_entry() {
    check(
        "follow one
         follow two
         steer three
         cancel two
         reply 1 a
         reply 2 b",
        expect![[r#"
            > follow one
            queue+ q-one
            queue- q-one
            #2 user(Some(FollowUp)) one
            status running
            infer 1
            > follow two
            queue+ q-two
            > steer three
            queue+ q-three
            > cancel two
            cancel -> Ok(())
            queue- q-two cancelled
            > reply 1 a
            #3 assistant a
            queue- q-three
            #4 user(Some(Steer)) three
            infer 2
            > reply 2 b
            #5 assistant b
            status idle
            idle"#]],
    );
}

#[test]
fn a_failed_enqueue_write_leaves_no_item() {
    check(
        "follow one
         failwrite
         follow two
         reply 1 a",
        expect![[r#"
            > follow one
            queue+ q-one
            queue- q-one
            #2 user(Some(FollowUp)) one
            status running
            infer 1
            > failwrite
            > follow two
            queue+ q-two
            ! write failed: reload
            #3 custom wuhu_storage_error_v1
            infer 1
            > reply 1 a
            #4 assistant a
            status idle
            idle"#]],
    );
}

#[test]
fn a_failed_write_reloads_from_storage_with_a_notice_and_redoes_the_lost_work() {
    check(
        "follow one
         follow two
         failwrite
         reply 1 a
         reply 1 b
         reply 2 c",
        expect![[r#"
            > follow one
            queue+ q-one
            queue- q-one
            #2 user(Some(FollowUp)) one
            status running
            infer 1
            > follow two
            queue+ q-two
            > failwrite
            > reply 1 a
            #3 assistant a
            queue- q-two
            #4 user(Some(FollowUp)) two
            infer 2
            ! write failed: reload
            #3 custom wuhu_storage_error_v1
            infer 1
            > reply 1 b
            #4 assistant b
            queue- q-two
            #5 user(Some(FollowUp)) two
            infer 2
            > reply 2 c
            #6 assistant c
            status idle
            idle"#]],
    );
}

#[test]
fn a_checkpoint_behind_the_transcript_is_repaired_visibly_on_load() {
    check(
        "follow one
         follow two
         losecheckpoint
         reply 1 a
         resume
         reply 1 b",
        expect![[r#"
            > follow one
            queue+ q-one
            queue- q-one
            #2 user(Some(FollowUp)) one
            status running
            infer 1
            > follow two
            queue+ q-two
            > losecheckpoint
            > reply 1 a
            #3 assistant a
            queue- q-two
            #4 user(Some(FollowUp)) two
            infer 2
            ! checkpoint lost
            > resume
            ! cursor repaired
            #5 custom wuhu_storage_repaired_v1
            infer 1
            > reply 1 b
            #6 assistant b
            status idle
            idle"#]],
    );
}

#[test]
fn items_of_an_old_checkpoint_move_into_rows() {
    let old = serde_json::json!({
        "status": "idle",
        "phase": {"phase": "idle"},
        "queue": [{"id": "q1", "lane": "followUp", "author": "ana", "content": "left over", "enqueuedAt": 1}],
        "nextCursor": 5,
        "step": 2,
        "delivered": [],
    });
    let checkpoint: Checkpoint = serde_json::from_value(old).unwrap();
    let mut session = Session::restore(checkpoint, vec![], 1);
    assert_eq!(session.queue().len(), 1);
    assert_eq!(session.queue_bytes(), "left over".len());
    assert!(matches!(session.poll_effect(), Some(Effect::QueueInsert(item)) if item.id == "q1"));
    let saved = serde_json::to_string(session.checkpoint()).unwrap();
    assert!(!saved.contains("left over"), "{saved}");
    session.handle_resume(Millis(10_000));
    assert!(
        matches!(session.poll_effect(), Some(Effect::QueueDelete { id, reason: crate::wire::QueueRemoval::Delivered }) if id == "q1")
    );
}

#[test]
fn a_server_message_wakes_an_idle_session_once() {
    check(
        "notify c1 child-done
         notify c1 child-done
         reply 1 noted
         notify c1 child-done
         notify c2 other",
        expect![[r#"
            > notify c1 child-done
            notify -> Ok(true)
            queue+ n-c1
            queue- n-c1
            #2 system[wuhu_child_status_v1] child-done
            status running
            infer 1
            > notify c1 child-done
            notify -> Ok(false)
            > reply 1 noted
            #3 assistant noted
            status idle
            idle
            > notify c1 child-done
            notify -> Ok(false)
            > notify c2 other
            notify -> Ok(true)
            queue+ n-c2
            queue- n-c2
            #4 system[wuhu_child_status_v1] other
            status running
            infer 2"#]],
    );
}

#[test]
fn a_server_message_reaches_a_running_session_at_the_next_step_boundary() {
    check(
        "follow go
         calls 1 bash:a list_sessions:b
         notify c1 child-done
         done 1 a
         reply 2 ok",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > calls 1 bash:a list_sessions:b
            #3 assistant calls a,b
            run 1 a
            > notify c1 child-done
            notify -> Ok(true)
            queue+ n-c1
            > done 1 a
            #4 result a err=false out-a
            #5 result b err=true Tool call skipped: a new message arrived before it ran.
            queue- n-c1
            #6 system[wuhu_child_status_v1] child-done
            infer 2
            > reply 2 ok
            #7 assistant ok
            status idle
            idle"#]],
    );
}

#[test]
fn a_server_message_never_resumes_a_stopped_session() {
    check(
        "follow go
         stop
         notify c1 child-stopped
         follow again
         reply 2 ok",
        expect![[r#"
            > follow go
            queue+ q-go
            queue- q-go
            #2 user(Some(FollowUp)) go
            status running
            infer 1
            > stop
            stopped 0
            cancel-infer 1
            #3 custom wuhu_execution_stopped_v1
            status stopped
            > notify c1 child-stopped
            notify -> Ok(true)
            queue+ n-c1
            > follow again
            queue+ q-again
            status idle
            queue- n-c1
            #4 system[wuhu_child_status_v1] child-stopped
            status running
            infer 2
            > reply 2 ok
            #5 assistant ok
            queue- q-again
            #6 user(Some(FollowUp)) again
            infer 3"#]],
    );
}

#[test]
fn a_keyed_message_is_queued_once_while_queued_and_after_delivery() {
    let mut h = Harness::new();
    let once = |h: &mut Harness, author: &str, key: &str, text: &str| {
        let r = h.session.handle_enqueue_once(
            Millis(2_000),
            keyed_item_id(author, key),
            Lane::FollowUp,
            author.into(),
            text.into(),
        );
        h.drain();
        r
    };
    // Delivered at once (the session was idle), then sent again: not queued again.
    assert_eq!(once(&mut h, "slack:U1", "ev1", "hello"), Ok(true));
    assert_eq!(once(&mut h, "slack:U1", "ev1", "hello"), Ok(false));
    // While a turn runs it waits in the queue; sent again it is not queued twice.
    assert_eq!(once(&mut h, "slack:U1", "ev2", "later"), Ok(true));
    assert_eq!(once(&mut h, "slack:U1", "ev2", "later"), Ok(false));
    assert_eq!(h.session.queue().len(), 1);
    // Another author's key of the same text is another message.
    assert_eq!(once(&mut h, "slack:U2", "ev2", "later"), Ok(true));
    assert_eq!(h.session.queue().len(), 2);
    // Ids are scoped by author and do not run two fields together.
    assert_ne!(keyed_item_id("a", "bc"), keyed_item_id("ab", "c"));
    assert_eq!(keyed_item_id("a", "b"), keyed_item_id("a", "b"));
    assert!(keyed_item_id("a", "b").starts_with("k-"));
    assert_eq!(keyed_item_id("a", "b").len(), 34);
}

#[test]
fn client_item_keys_are_short_printable_ascii() {
    let long = "k".repeat(MAX_ITEM_KEY_CHARS);
    let too_long = "k".repeat(MAX_ITEM_KEY_CHARS + 1);
    let cases: [(&str, bool); 8] = [
        ("0b7c1e4e-3a7f-4f5e-9d0c-8f1e2d3c4b5a", true),
        ("msg-1", true),
        (&long, true),
        ("", false),
        (&too_long, false),
        ("two words", false),
        ("tab\there", false),
        ("caf\u{e9}", false),
    ];
    for (key, ok) in cases {
        assert_eq!(check_item_key(key).is_ok(), ok, "{key:?}");
    }
}
