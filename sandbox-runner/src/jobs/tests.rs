use super::*;
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
    let out = jobs.start(&ctx, "s1", "work", args("echo start; sleep 1; echo done"));
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
    let id = job_id(&jobs.start(&ctx, "s1", "work", args("exit 3")));
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
    let id = job_id(&jobs.start(&ctx, "s1", "work", args(&command)));
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
    let id = job_id(&jobs.start(&ctx, "s1", "work", args("seq 1 5000")));
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
        .map(|_| job_id(&jobs.start(&ctx, "s1", "work", args("sleep 30"))))
        .collect();
    let refused = jobs.start(&ctx, "s1", "work", args("true"));
    assert!(
        refused.is_error && refused.content.contains("limit"),
        "{}",
        refused.content
    );
    assert!(!jobs.start(&ctx, "s2", "work", args("true")).is_error);
    for id in ids {
        let _ = jobs.kill("s1", &json!({"id": id})).await;
    }
}
