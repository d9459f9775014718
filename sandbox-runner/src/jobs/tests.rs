use super::*;

fn no_cell(_: &Path) -> Result<Option<Arc<CallCell>>, String> {
    Ok(None)
}
use crate::tools::tests::context;
use wuhu_core::wire::runner::EnvironmentKind;
use wuhu_core::wire::runner::jobs::MAX_RUNNING_PER_SESSION;

fn args(command: &str) -> BashArgs {
    serde_json::from_value(json!({"command": command})).unwrap()
}

fn job_id(output: &ToolOutput) -> String {
    assert!(!output.is_error, "{}", output.content);
    output.details.as_ref().unwrap()["jobId"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn next_event(rx: &mut mpsc::UnboundedReceiver<RunnerMessage>) -> (String, JobReport) {
    let message = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("an event in time")
        .expect("the channel is open");
    match message {
        RunnerMessage::Event {
            name,
            session_id,
            data,
            ..
        } => {
            assert_eq!(name, FINISHED_EVENT);
            (session_id.unwrap(), serde_json::from_value(data).unwrap())
        }
        other => panic!("not an event: {other:?}"),
    }
}

#[tokio::test]
async fn a_job_answers_at_once_runs_on_and_reports_its_end_on_the_connection() {
    let (dir, ctx) = context(EnvironmentKind::FolderTemplate);
    let jobs = Arc::new(Jobs::new(dir.path().join("logs"), dir.path().join("tmp")));
    let (tx, mut rx) = mpsc::unbounded_channel();
    jobs.connected(tx);
    let started = std::time::Instant::now();
    let out = jobs.start(
        &ctx,
        "s1",
        "work",
        args("echo start; sleep 1; echo done"),
        no_cell,
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "answers at once"
    );
    let id = job_id(&out);
    assert!(id.starts_with("job-") && id.len() == 20, "{id}");
    let status = jobs.status("s1", &json!({"id": id}));
    assert_eq!(status.details.as_ref().unwrap()["job"]["state"], "running");
    // Another session does not see it.
    let other = jobs.status("s2", &json!({"id": id}));
    assert!(other.is_error);
    assert_eq!(other.details.unwrap()[UNKNOWN_JOB], true);
    let (session, report) = next_event(&mut rx).await;
    assert_eq!(session, "s1");
    assert_eq!(report.state, JobState::Succeeded);
    assert_eq!(report.exit_code, Some(0));
    assert_eq!(report.output_tail, "start\ndone\n");
    assert!(report.duration_ms >= 1000, "{}", report.duration_ms);
    assert!(!report.truncated && report.full_output_path.is_none());
    assert_eq!(jobs.running("s1"), (0, 0));
    let status = jobs.status("s1", &json!({"id": id}));
    assert_eq!(status.details.unwrap()["job"]["state"], "succeeded");
}

#[tokio::test]
async fn an_end_while_disconnected_is_reported_after_the_next_welcome() {
    let (dir, ctx) = context(EnvironmentKind::Local);
    let jobs = Arc::new(Jobs::new(dir.path().join("logs"), dir.path().join("tmp")));
    let (tx, mut rx) = mpsc::unbounded_channel();
    jobs.connected(tx);
    jobs.disconnected();
    drop(rx);
    let id = job_id(&jobs.start(&ctx, "s1", "work", args("exit 3"), no_cell));
    // Wait for the end without a connection.
    let mut done = jobs.lock().jobs[&id].done.clone();
    done.wait_for(|d| *d).await.unwrap();
    let (tx, new_rx) = mpsc::unbounded_channel();
    rx = new_rx;
    jobs.connected(tx);
    let (_, report) = next_event(&mut rx).await;
    assert_eq!(
        (report.state, report.exit_code),
        (JobState::Failed, Some(3))
    );
    // Delivered once: a further connection does not repeat it.
    let (tx, mut again) = mpsc::unbounded_channel();
    jobs.connected(tx);
    assert!(again.try_recv().is_err());
}

#[tokio::test]
async fn job_kill_kills_the_process_group_and_the_end_says_killed() {
    let (dir, ctx) = context(EnvironmentKind::Local);
    let jobs = Arc::new(Jobs::new(dir.path().join("logs"), dir.path().join("tmp")));
    let (tx, mut rx) = mpsc::unbounded_channel();
    jobs.connected(tx);
    let marker = dir.path().join("child-alive");
    let command = format!(
        "(sleep 30; touch {}) & echo started; sleep 30",
        marker.display()
    );
    let id = job_id(&jobs.start(&ctx, "s1", "work", args(&command), no_cell));
    assert!(
        jobs.kill("s2", &json!({"id": id})).await.is_error,
        "not another session's"
    );
    let killed = jobs.kill("s1", &json!({"id": id})).await;
    assert_eq!(killed.details.unwrap()["job"]["state"], "killed");
    let (_, report) = next_event(&mut rx).await;
    assert_eq!(report.state, JobState::Killed);
    assert!(!marker.exists());
    // Killing again is harmless.
    assert!(!jobs.kill("s1", &json!({"id": id})).await.is_error);
}

#[tokio::test]
async fn long_output_is_kept_in_a_file_the_session_can_read_and_bounds_hold() {
    let (dir, mut ctx) = context(EnvironmentKind::FolderTemplate);
    let logs = dir.path().canonicalize().unwrap().join("logs");
    let jobs = Arc::new(Jobs::new(logs.clone(), dir.path().join("tmp")));
    let (tx, mut rx) = mpsc::unbounded_channel();
    jobs.connected(tx);
    let id = job_id(&jobs.start(&ctx, "s1", "work", args("seq 1 5000"), no_cell));
    let (_, report) = next_event(&mut rx).await;
    assert!(report.truncated);
    assert_eq!(report.total_lines, 5000);
    assert!(report.output_tail.ends_with("4999\n5000\n"));
    assert!(report.output_tail.lines().count() <= TAIL_LINES);
    let path = report.full_output_path.unwrap();
    assert!(path.contains(&id));
    // The session's own job logs are readable; another session's are not.
    ctx.job_logs = Some(session_log_dir(&logs, "s1"));
    let read = crate::tools::files::read(
        &ctx,
        serde_json::from_value(json!({"path": path, "offset": 4999})).unwrap(),
    );
    assert!(read.content.starts_with("4999\n5000"), "{}", read.content);
    ctx.job_logs = Some(session_log_dir(&logs, "s2"));
    let read =
        crate::tools::files::read(&ctx, serde_json::from_value(json!({"path": path})).unwrap());
    assert!(read.is_error, "{}", read.content);
    // At most MAX_RUNNING_PER_SESSION jobs run for a session.
    let ids: Vec<String> = (0..MAX_RUNNING_PER_SESSION)
        .map(|_| job_id(&jobs.start(&ctx, "s1", "work", args("sleep 30"), no_cell)))
        .collect();
    let refused = jobs.start(&ctx, "s1", "work", args("true"), no_cell);
    assert!(
        refused.is_error && refused.content.contains("limit"),
        "{}",
        refused.content
    );
    assert!(
        !jobs
            .start(&ctx, "s2", "work", args("true"), no_cell)
            .is_error
    );
    for id in ids {
        let _ = jobs.kill("s1", &json!({"id": id})).await;
    }
}

/// Whether `pid` runs (a zombie does not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Reads a pid a job wrote to `path`, waiting for it to appear.
async fn pid_in(path: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < deadline, "no pid in {}", path.display());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_output_file_keeps_its_tail_within_its_bound() {
    let (dir, ctx) = context(EnvironmentKind::Local);
    let jobs = Arc::new(
        Jobs::new(dir.path().join("logs"), dir.path().join("tmp")).with_log_cap(4000, 2000),
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    jobs.connected(tx);
    job_id(&jobs.start(
        &ctx,
        "s1",
        "work",
        args("seq 1 20000; printf last"),
        no_cell,
    ));
    let (_, report) = next_event(&mut rx).await;
    assert_eq!(report.state, JobState::Succeeded);
    assert_eq!(report.total_lines, 20001);
    assert!(report.truncated);
    assert!(
        report.output_tail.ends_with("19999\n20000\nlast"),
        "{}",
        report.output_tail
    );
    let path = report.full_output_path.unwrap();
    let file = std::fs::read_to_string(&path).unwrap();
    assert!(file.len() <= 4000, "{} bytes", file.len());
    assert!(file.starts_with("[wuhu: the first "), "{file}");
    assert!(file.ends_with("20000\nlast"), "{file}");
    // After the header, whole lines: the first kept one is a number of its own.
    let first = file.lines().nth(1).unwrap();
    let n: u32 = first.parse().unwrap_or_else(|_| panic!("{first:?}"));
    assert!(n > 19000, "{n}");
}

#[test]
fn a_runner_shutting_down_kills_its_jobs_process_groups() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runner_stops_while_a_job_sleeps(runtime, |pid_file| {
        Box::pin(async move { pid_in(&pid_file).await })
    });
}

/// The same when the runtime stops before the job's task ever ran (a runner shutting down just
/// after it started a job): the dropped task still kills the whole process group, not only the
/// shell. The job is started on a one-thread runtime that is never given back control until it
/// shuts down, so its task is never polled.
#[test]
fn a_runner_shutting_down_before_a_jobs_task_ran_kills_its_process_group() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runner_stops_while_a_job_sleeps(runtime, |pid_file| {
        Box::pin(async move {
            // Waits without yielding: the job's task stays unpolled.
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let text = std::fs::read_to_string(&pid_file).unwrap_or_default();
                if let Ok(pid) = text.trim().parse::<i32>() {
                    break pid;
                }
                assert!(std::time::Instant::now() < deadline, "no pid written");
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    });
}

/// Starts a job that leaves a `sleep 60` in its process group, learns the sleep's pid with
/// `pid_of` (given the file the job writes it to), shuts `runtime` down, and expects the sleep
/// to die with it.
fn runner_stops_while_a_job_sleeps(
    runtime: tokio::runtime::Runtime,
    pid_of: impl FnOnce(PathBuf) -> std::pin::Pin<Box<dyn std::future::Future<Output = i32>>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let pid = runtime.block_on(async {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let jobs = Arc::new(Jobs::new(dir.path().join("logs"), dir.path().join("tmp")));
        let command = format!("sleep 60 & echo $! > {}; wait", pid_file.display());
        job_id(&jobs.start(&ctx, "s1", "work", args(&command), no_cell));
        pid_of(pid_file.clone()).await
    });
    assert!(alive(pid));
    runtime.shutdown_timeout(Duration::from_secs(2));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the job's process {pid} outlived the runner"
        );
        std::thread::yield_now();
    }
}

#[tokio::test]
async fn a_starting_runner_kills_the_jobs_a_dead_runner_left_and_no_other_process() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("logs").join(RECORDS_DIR);
    std::fs::create_dir_all(&records).unwrap();
    // A runner process that has ended.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let start = |job: &str| {
        std::process::Command::new("sleep")
            .arg("60")
            .env("WUHU_JOB_ID", job)
            .process_group(0)
            .spawn()
            .unwrap()
    };
    use std::os::unix::process::CommandExt;
    let mut orphan = start("job-orphan");
    let mut other_runners = start("job-other");
    let mut not_a_job = start("job-else");
    let record = |job: &str, runner: u32, child: &std::process::Child| {
        std::fs::write(records.join(job), format!("{runner} {}\n", child.id())).unwrap();
    };
    record("job-orphan", gone_pid, &orphan);
    // A runner that still runs (the test's parent process stands in for it).
    record(
        "job-other",
        std::os::unix::process::parent_id(),
        &other_runners,
    );
    // The record names a job whose id the process does not carry (a reused pid).
    record("job-mismatch", gone_pid, &not_a_job);

    let _jobs = Jobs::new(dir.path().join("logs"), dir.path().join("tmp"));
    let status = orphan.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(other_runners.try_wait().unwrap().is_none());
    assert!(not_a_job.try_wait().unwrap().is_none());
    assert!(!records.join("job-orphan").exists());
    assert!(!records.join("job-mismatch").exists());
    assert!(records.join("job-other").exists());
    for mut child in [other_runners, not_a_job] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
