//! Background jobs end to end (issue 12, `docs/orchestration.md`): `bash {background: true}`
//! answers at once; the job's end arrives on the session's `system` lane as a
//! `wuhu_job_finished_v1` message that wakes the idle session; `job_status` and `job_kill`;
//! a runner killed during a job ends it as `failed`, visibly, saying its runner went away (after
//! the grace when it stays away, at the next poll when it comes back as a new process).
//!
//! A job survives a reconnect of its runner, and an end that happens while the runner is
//! disconnected is delivered after it is back.
//!
//! One `wrangler dev` for the file, with `WUHU_JOB_RUNNER_GRACE_SECONDS=10` (polls every 3.3
//! s); every test has its own tenant and runner.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wuhu_core::wire::{Entry, EntryPayload, Message, custom_types};
use wuhu_e2e::cli::Relay;
use wuhu_e2e::entries::{assistant, describe, fake_directive, tool_result};
use wuhu_e2e::runner::{Runner, RunnerConfig, TempDir};
use wuhu_e2e::util::unique_name;
use wuhu_e2e::{Api, Stack, StackOptions, wait_for};

const TURN: Duration = Duration::from_secs(90);

fn stack() -> &'static Stack {
    wuhu_e2e::shared_stack(|| StackOptions {
        fake_delay_ms: Some(0),
        vars: vec![("WUHU_JOB_RUNNER_GRACE_SECONDS".into(), "10".into())],
        ..StackOptions::default()
    })
}

/// A session of a fresh tenant with environment `work` attached on a fresh runner.
fn session_with_runner(prefix: &str) -> (Api, String, Runner, TempDir) {
    session_with_runner_via(prefix, None)
}

/// The same, the runner reaching the server at `server` (a relay) when given.
fn session_with_runner_via(prefix: &str, server: Option<String>) -> (Api, String, Runner, TempDir) {
    let tenant = unique_name(prefix);
    let api = stack().client("ana", &tenant);
    let dir = TempDir::new(&format!("wuhu-e2e-{prefix}"));
    let work = dir.mkdir("work");
    // The runner's own path rule applies (no --allow-any-path): job tools must pass it too.
    let mut config = RunnerConfig::new(stack(), "ana", &tenant, "mac")
        .env("work", &work)
        .allow_any_path(false);
    if let Some(server) = server {
        config.server = server;
    }
    let runner = Runner::start(config);
    let id = api.create_fake_session().id;
    let attach = api.run_tool(&id, "request_environment", json!({"spec": "work"}), TURN);
    assert!(!attach.is_error, "{}", attach.content);
    (api, id, runner, dir)
}

/// Starts `command` as a background job; returns its id.
#[track_caller]
fn start_job(api: &Api, id: &str, command: &str) -> String {
    let started = api.run_tool(
        id,
        "bash",
        json!({"command": command, "background": true}),
        TURN,
    );
    assert!(!started.is_error, "{}", started.content);
    let job = started
        .content
        .split_whitespace()
        .find(|w| w.starts_with("job-"))
        .unwrap_or_else(|| panic!("no job id in {:?}", started.content))
        .trim_end_matches(':')
        .to_string();
    assert_eq!(job.len(), 20, "{job}");
    job
}

/// The `wuhu_job_finished_v1` messages: (cursor, content, details).
fn job_messages(entries: &[Entry]) -> Vec<(u64, String, Value)> {
    entries
        .iter()
        .filter_map(|e| match &e.payload {
            EntryPayload::Message {
                message:
                    Message::CustomMessage {
                        custom_type,
                        content,
                        details: Some(details),
                    },
            } if custom_type == custom_types::JOB_FINISHED => {
                Some((e.cursor, content.clone(), details.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Waits for the end of `job`; returns the transcript and that message.
#[track_caller]
fn wait_job_end(
    api: &Api,
    id: &str,
    job: &str,
    timeout: Duration,
) -> (Vec<Entry>, (u64, String, Value)) {
    let entries = api.wait_transcript(id, &format!("the end of {job}"), timeout, |entries| {
        job_messages(entries)
            .iter()
            .any(|(_, _, d)| d["jobId"] == job)
    });
    let message = job_messages(&entries)
        .into_iter()
        .find(|(_, _, d)| d["jobId"] == job)
        .unwrap();
    (entries, message)
}

/// The assistant reply the fake gives to the job message (`echo: <content>`) comes after it:
/// the message started a turn.
#[track_caller]
fn assert_woke(api: &Api, id: &str, cursor: u64) {
    let entries = api.wait_transcript(id, "the reply to the job message", TURN, |entries| {
        entries.iter().any(|e| {
            e.cursor > cursor
                && assistant(e).is_some_and(|m| m.text().starts_with("echo: Background job"))
        })
    });
    let page = api.wait_idle(id, TURN);
    assert!(page.session.last_cursor > cursor, "{}", describe(&entries));
}

#[test]
fn a_background_job_answers_at_once_and_its_end_wakes_the_idle_session() {
    let (api, id, _runner, dir) = session_with_runner("jobs-wake");
    let started = Instant::now();
    let job = start_job(&api, &id, "sleep 2; echo done > finished.txt; echo done");
    // The turn that started it is over before the job is: the session is idle and waits.
    let page = api.session(&id);
    let turn_end = page.session.last_cursor;
    assert!(
        !dir.path().join("work/finished.txt").exists(),
        "the call answered before the job ended ({:?})",
        started.elapsed()
    );
    let (entries, (cursor, content, details)) = wait_job_end(&api, &id, &job, TURN);
    assert!(cursor > turn_end, "{}", describe(&entries));
    assert_eq!(details["state"], "succeeded");
    assert_eq!(details["exitCode"], 0);
    assert_eq!(details["environment"], "work");
    assert_eq!(details["runner"], "mac");
    assert!(details["durationMs"].as_u64().unwrap() >= 2000, "{details}");
    assert_eq!(details["outputTail"], "done\n");
    assert!(
        content.contains("succeeded (exit code 0)") && content.ends_with("done\n"),
        "{content}"
    );
    assert!(dir.path().join("work/finished.txt").exists());
    assert_woke(&api, &id, cursor);
    // Exactly one message per job, even though the poll also sees it finished.
    let entries = api.transcript(&id);
    assert_eq!(job_messages(&entries).len(), 1, "{}", describe(&entries));
    // A finished job's status comes from the session's record.
    let status = api.run_tool(&id, "job_status", json!({"id": job}), TURN);
    assert!(status.content.contains("succeeded"), "{}", status.content);

    // The session's jobs through the API and `wuhu jobs`: the same record, output and all.
    let listed = api.get(&format!("/v1/sessions/{id}/jobs")).json();
    let jobs = listed["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "{listed}");
    assert_eq!(jobs[0]["jobId"], job.as_str(), "{listed}");
    assert_eq!(jobs[0]["state"], "succeeded", "{listed}");
    assert_eq!(jobs[0]["report"]["exitCode"], 0, "{listed}");
    assert_eq!(jobs[0]["report"]["outputTail"], "done\n", "{listed}");
    let wuhu = wuhu_e2e::cli::Wuhu::new()
        .env("WUHU_SERVER", &stack().base_url())
        .env("WUHU_TOKEN", api.token().expect("a token"));
    let ran = wuhu.run(&["--json", "jobs", &id]);
    assert_eq!(ran.json()["jobs"][0]["jobId"], job.as_str(), "{ran:?}");
    let ran = wuhu.run(&["jobs", &id, "--output"]);
    let text = ran.stdout.clone();
    assert!(
        text.contains(&job)
            && text.contains("succeeded")
            && text.contains("work")
            && text.contains("done"),
        "{text}"
    );
    // The session is ana's own: another member of the tenant finds no such session.
    let claims = api
        .token()
        .and_then(|t| t.split('.').nth(1))
        .expect("a JWT");
    let claims: Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, claims)
            .expect("base64"),
    )
    .expect("claims");
    let tenant = claims["tenant"].as_str().expect("tenant");
    let bob = stack().client("bob", tenant);
    assert_eq!(bob.get(&format!("/v1/sessions/{id}/jobs")).status, 404);
}

#[test]
fn job_kill_kills_the_job_and_its_end_says_killed() {
    let (api, id, _runner, dir) = session_with_runner("jobs-kill");
    let marker = dir.path().join("work/never.txt");
    let job = start_job(
        &api,
        &id,
        &format!("echo started; sleep 60; touch {}", marker.display()),
    );
    // job_status sees it running, with its output so far.
    let status = wait_for("the job's first output", TURN, || {
        let status = api.run_tool(&id, "job_status", json!({"id": job}), TURN);
        status.content.contains("started").then_some(status)
    });
    assert!(!status.is_error, "{}", status.content);
    assert!(status.content.contains("is running"), "{}", status.content);
    // The kill's own turn may be overtaken by the job's end (delivered at its step boundary),
    // so it is not awaited like run_tool does.
    api.enqueue(
        &id,
        "followUp",
        &fake_directive(&json!({
            "toolCalls": [{"name": "job_kill", "arguments": {"id": job}}],
            "afterTools": "kill sent"
        })),
    );
    let (entries, (cursor, content, details)) = wait_job_end(&api, &id, &job, TURN);
    let killed = entries
        .iter()
        .filter_map(tool_result)
        .find(|r| r.tool_name == "job_kill")
        .unwrap_or_else(|| panic!("no job_kill result:\n{}", describe(&entries)));
    assert!(
        !killed.is_error && killed.content.contains("killed"),
        "{}",
        killed.content
    );
    assert_eq!(details["state"], "killed");
    assert!(content.contains("was killed (job_kill)"), "{content}");
    assert!(content.contains("started"), "{content}");
    // The end came during the kill's own turn: delivered at its step boundary, the LLM's next
    // step sees it (an assistant message follows it).
    api.wait_transcript(&id, "a step after the job message", TURN, |entries| {
        entries
            .iter()
            .any(|e| e.cursor > cursor && assistant(e).is_some())
    });
    assert!(!marker.exists());
    // A job id this session never started is refused, not forwarded.
    let other = api.run_tool(&id, "job_kill", json!({"id": "job-0000000000000000"}), TURN);
    assert!(
        other.is_error && other.content.contains("No background job"),
        "{}",
        other.content
    );
}

#[test]
fn a_job_survives_a_runner_reconnect_and_an_end_while_disconnected_arrives_after_it() {
    let relay = Relay::start(stack_port());
    let (api, id, mut runner, dir) = session_with_runner_via("jobs-reconnect", Some(relay.url()));
    let work = dir.path().join("work");
    // The job runs until told to go on, then ends at once.
    let job = start_job(
        &api,
        &id,
        "echo waiting; while [ ! -f go ]; do sleep 0.05; done; echo went; touch finished",
    );
    // 1. The connection drops and comes back: the job still runs.
    let connections = runner_connections(&runner);
    assert!(relay.cut() > 0);
    wait_for("the runner to reconnect", TURN, || {
        (runner_connections(&runner) > connections).then_some(())
    });
    runner.wait_connected(TURN);
    let status = api.run_tool(&id, "job_status", json!({"id": job}), TURN);
    assert!(status.content.contains("is running"), "{}", status.content);
    // 2. The job ends while the runner cannot reach the server (new connections go to a port
    // nobody listens on); its end arrives once the runner is back.
    relay.retarget(dead_port());
    let connections = runner_connections(&runner);
    assert!(relay.cut() > 0);
    std::fs::write(work.join("go"), "").unwrap();
    wait_for("the job to end", TURN, || {
        work.join("finished").exists().then_some(())
    });
    let before = api.transcript(&id);
    assert!(
        job_messages(&before).is_empty(),
        "no end heard while disconnected:\n{}",
        describe(&before)
    );
    relay.retarget(stack_port());
    wait_for("the runner to reconnect", TURN, || {
        (runner_connections(&runner) > connections).then_some(())
    });
    let (_, (cursor, content, details)) = wait_job_end(&api, &id, &job, TURN);
    assert_eq!(details["state"], "succeeded", "{content}");
    assert_eq!(details["outputTail"], "waiting\nwent\n");
    assert_woke(&api, &id, cursor);
}

fn stack_port() -> u16 {
    stack()
        .base_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("the stack's port")
}

/// A loopback port nobody listens on.
fn dead_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// How many times the runner process said it connected.
fn runner_connections(runner: &Runner) -> usize {
    runner
        .current_log()
        .lines()
        .filter(|l| l.contains("connected to "))
        .count()
}

/// Whether process `pid` runs (a zombie does not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Starts a job whose process (a `sleep` in the job's process group) writes its pid to a file
/// in `dir`; returns the job id and the pid once it is written.
#[track_caller]
fn start_sleeper(api: &Api, id: &str, dir: &TempDir, name: &str) -> (String, i32) {
    // In the environment's root: the job's cell may write nowhere else.
    let path = dir.path().join("work").join(format!("{name}.pid"));
    let job = start_job(
        api,
        id,
        &format!("sleep 120 & echo $! > {}; wait", path.display()),
    );
    // The job runs in a cell: `$!` is its PID there; the test needs this machine's.
    let pid = wait_for("the job's pid", TURN, || {
        std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .and_then(|p| wuhu_e2e::util::host_pid(p, dir.path()))
    });
    assert!(alive(pid));
    (job, pid)
}

#[track_caller]
fn wait_dead(pid: i32, what: &str) {
    wait_for(what, TURN, || (!alive(pid)).then_some(()));
}

#[test]
fn stopping_a_session_kills_its_jobs_visibly() {
    let (api, id, _runner, dir) = session_with_runner("jobs-stop");
    let (job, pid) = start_sleeper(&api, &id, &dir, "stop");
    api.stop(&id);
    wait_dead(pid, "the job's process killed by the stop");
    // Its end waits on the `system` lane of the stopped session, saying `killed` ...
    let page = api.session(&id);
    assert_eq!(page.session.status, wuhu_core::wire::Status::Stopped);
    let queued = page
        .queue
        .iter()
        .find(|q| q.content.contains(&job))
        .unwrap_or_else(|| panic!("no queued end of {job}: {:?}", page.queue));
    assert!(queued.content.contains("was killed"), "{}", queued.content);
    // ... and reaches the transcript when someone resumes the session.
    api.enqueue(&id, "followUp", "go on");
    let (_, (_, content, details)) = wait_job_end(&api, &id, &job, TURN);
    assert_eq!(details["state"], "killed", "{content}");
}

#[test]
fn a_runner_that_exits_kills_its_jobs_and_one_that_starts_kills_those_a_dead_one_left() {
    let (api, id, mut runner, dir) = session_with_runner("jobs-exit");
    // SIGTERM: the runner kills its jobs' process groups as it exits.
    let (_, pid) = start_sleeper(&api, &id, &dir, "term");
    runner.stop(Duration::from_secs(20));
    wait_dead(pid, "the job's process killed by the exiting runner");
    // SIGKILL leaves the job running; the next runner process kills it as it starts.
    runner.restart();
    let (_, pid) = start_sleeper(&api, &id, &dir, "kill");
    runner.kill_hard();
    assert!(alive(pid));
    runner.restart();
    wait_dead(pid, "the orphaned job's process killed by the next runner");
}

#[test]
fn a_runner_killed_during_a_job_ends_it_as_failed_visibly() {
    // The runner process is killed (SIGKILL, by its PID) and stays away: the job fails after
    // the grace (10 s here), and the message wakes the idle session.
    let (api, id, mut runner, _dir) = session_with_runner("jobs-dead");
    let job = start_job(&api, &id, "sleep 30");
    let idle = api.wait_idle(&id, TURN).session.last_cursor;
    runner.kill_hard();
    let (entries, (cursor, content, details)) = wait_job_end(&api, &id, &job, TURN);
    assert!(cursor > idle, "{}", describe(&entries));
    assert_eq!(details["state"], "failed", "{content}");
    let reason = details["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("runner \"mac\" went away") && reason.contains("disconnected for"),
        "{details}"
    );
    assert!(
        content.contains("failed: its runner \"mac\" went away")
            && content.contains("Whether the command finished is unknown"),
        "{content}"
    );
    assert_woke(&api, &id, cursor);
    // job_status says the same, from the session's record.
    let status = api.run_tool(&id, "job_status", json!({"id": job}), TURN);
    assert!(
        !status.is_error
            && status
                .content
                .contains("failed: its runner \"mac\" went away"),
        "{}",
        status.content
    );
    let entries = api.transcript(&id);
    assert_eq!(job_messages(&entries).len(), 1, "{}", describe(&entries));

    // The runner comes back as a new process: it does not know the job, which fails at the
    // next poll (or after the grace, should the poll find the runner away).
    runner.restart();
    let job = start_job(&api, &id, "sleep 30");
    runner.kill_hard();
    runner.restart();
    let (_, (_, content, details)) = wait_job_end(&api, &id, &job, TURN);
    assert_eq!(details["state"], "failed", "{content}");
    assert!(
        content.contains("no longer knows the job") || content.contains("disconnected for"),
        "{content}"
    );
}
