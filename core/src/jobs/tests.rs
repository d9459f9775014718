use super::*;

const T: JobTimings = JobTimings {
    poll_ms: 5_000,
    grace_ms: 30_000,
};

fn record(state: JobState, absent_since_ms: Option<u64>) -> JobRecord {
    JobRecord {
        job_id: "job-1".into(),
        runner: "mac".into(),
        runner_owner: "ana".into(),
        environment: "work".into(),
        command: "sleep 2; echo done".into(),
        started_at_ms: 1_000,
        state,
        absent_since_ms,
        report: None,
        reason: None,
    }
}

fn report(state: JobState, exit_code: Option<i32>) -> JobReport {
    JobReport {
        job_id: "job-1".into(),
        command: "sleep 2; echo done".into(),
        state,
        exit_code,
        signal: None,
        timed_out: false,
        started_at_ms: 1_000,
        duration_ms: 2_000,
        total_lines: 1,
        output_tail: "done\n".into(),
        truncated: false,
        full_output_path: None,
    }
}

/// (case, record, observation, now) → (state after, absent since after, message queued?)
///
/// A runner that goes away (restarted, or away for the grace) fails its running jobs, with a
/// reason naming it; an end its runner reports carries no reason.
#[test]
fn a_job_ends_once_and_only_from_running() {
    use JobState::*;
    use Observation as O;
    let other = JobReport {
        job_id: "job-2".into(),
        ..report(Succeeded, Some(0))
    };
    #[allow(clippy::type_complexity)]
    let cases: Vec<(
        &str,
        JobRecord,
        Observation,
        u64,
        Option<(JobState, Option<u64>, bool)>,
    )> = vec![
        (
            "finished by its runner",
            record(Running, None),
            O::Report(report(Succeeded, Some(0))),
            3_000,
            Some((Succeeded, None, true)),
        ),
        (
            "failed by its runner",
            record(Running, None),
            O::Report(report(Failed, Some(3))),
            3_000,
            Some((Failed, None, true)),
        ),
        (
            "killed",
            record(Running, Some(2_000)),
            O::Report(report(Killed, None)),
            3_000,
            Some((Killed, None, true)),
        ),
        (
            "still running: nothing changes",
            record(Running, None),
            O::Report(report(Running, None)),
            3_000,
            None,
        ),
        (
            "running again after an absence clears it",
            record(Running, Some(2_000)),
            O::Report(report(Running, None)),
            3_000,
            Some((Running, None, false)),
        ),
        (
            "a report about another job is ignored",
            record(Running, None),
            O::Report(other),
            3_000,
            None,
        ),
        (
            "unknown to a connected runner (it restarted): failed at once",
            record(Running, None),
            O::Unknown,
            3_000,
            Some((Failed, None, true)),
        ),
        (
            "runner absent: the absence starts",
            record(Running, None),
            O::RunnerAbsent,
            3_000,
            Some((Running, Some(3_000), false)),
        ),
        (
            "runner still absent within the grace",
            record(Running, Some(3_000)),
            O::RunnerAbsent,
            32_999,
            None,
        ),
        (
            "runner absent for the grace: failed",
            record(Running, Some(3_000)),
            O::RunnerAbsent,
            33_000,
            Some((Failed, None, true)),
        ),
        (
            "a finished job never changes (event after poll)",
            record(Succeeded, None),
            O::Report(report(Failed, Some(1))),
            3_000,
            None,
        ),
        (
            "a job failed for its runner's absence stays failed when the runner reports",
            JobRecord {
                reason: Some("its runner went away".into()),
                ..record(Failed, None)
            },
            O::Report(report(Succeeded, Some(0))),
            3_000,
            None,
        ),
        (
            "a finished job does not fail for its runner's absence",
            record(Failed, None),
            O::RunnerAbsent,
            99_000,
            None,
        ),
        (
            "a finished job does not fail when its runner forgot it",
            record(Killed, None),
            O::Unknown,
            3_000,
            None,
        ),
    ];
    for (case, record, observation, now, want) in cases {
        let runner_gone = matches!(observation, O::Unknown | O::RunnerAbsent);
        let got = observe(&record, observation, Millis(now), T);
        let got_summary = got.as_ref().map(|c| {
            (
                c.record.state,
                c.record.absent_since_ms,
                c.message.is_some(),
            )
        });
        assert_eq!(got_summary, want, "{case}");
        if let Some(change) = got {
            // A finished job carries its report; the message is the job's, once.
            assert_eq!(
                change.record.state.is_finished(),
                change.record.report.is_some(),
                "{case}"
            );
            if let Some(message) = change.message {
                assert_eq!(message.id, "job-job-1-finished", "{case}");
                assert_eq!(message.input.custom_type, custom_types::JOB_FINISHED);
                let details = message.input.details.unwrap();
                assert_eq!(details["state"], change.record.state.as_str(), "{case}");
                assert_eq!(details["environment"], "work");
                // Concluded by the session: failed, the reason naming the runner that went
                // away, in the details, the record and the text; reported: no reason.
                if runner_gone {
                    assert_eq!(change.record.state, Failed, "{case}");
                    let reason = change.record.reason.as_deref().unwrap_or_default();
                    assert!(
                        reason.contains("runner \"mac\" went away"),
                        "{case}: {reason}"
                    );
                    assert_eq!(details["reason"], reason, "{case}");
                    assert!(message.content.contains(reason), "{case}");
                } else {
                    assert_eq!(change.record.reason, None, "{case}");
                    assert!(details.get("reason").is_none(), "{case}");
                }
            }
        }
    }
}

#[test]
fn messages_say_how_the_job_ended_and_where_the_whole_output_is() {
    let running = record(JobState::Running, None);
    let text = |report: JobReport| finished_message(&running, &report).content;
    expect_test::expect![[r#"
        Background job job-1 (`sleep 2; echo done`) in environment "work" succeeded (exit code 0) after 2.0 s. Its output:

        done
    "#]]
    .assert_eq(&text(report(JobState::Succeeded, Some(0))));
    let long = JobReport {
        truncated: true,
        total_lines: 5000,
        output_tail: "line 4999\nline 5000\n".into(),
        full_output_path: Some("/tmp/wuhu-runner-logs/jobs/s/job-1.log".into()),
        exit_code: Some(2),
        ..report(JobState::Failed, Some(2))
    };
    expect_test::expect![[r#"
        Background job job-1 (`sleep 2; echo done`) in environment "work" failed with exit code 2 after 2.0 s. The end of its output:

        line 4999
        line 5000

        [5000 lines in all. The whole output is in /tmp/wuhu-runner-logs/jobs/s/job-1.log: page it with read (offset, limit).]"#]]
    .assert_eq(&text(long));
    let silent = JobReport {
        output_tail: String::new(),
        duration_ms: 200_000,
        ..report(JobState::Killed, None)
    };
    expect_test::expect![[r#"Background job job-1 (`sleep 2; echo done`) in environment "work" was killed (job_kill) after 3 min 20 s. It printed nothing."#]]
    .assert_eq(&text(silent));
    let restarted = observe(&running, Observation::Unknown, Millis(4_000), T).unwrap();
    expect_test::expect![[r#"Background job job-1 (`sleep 2; echo done`) in environment "work" failed: its runner "mac" went away: it is connected again but no longer knows the job (the runner process died or was restarted, which ends its jobs). Whether the command finished is unknown; check the environment before running it again."#]]
    .assert_eq(&restarted.message.as_ref().unwrap().content);
    let details = restarted.message.unwrap().input.details.unwrap();
    assert_eq!(details["durationMs"], 3_000, "failed after 3 s");
    assert_eq!(details["state"], "failed");
    // job_status of the finished job says the same (from the record).
    let record = restarted.record;
    assert_eq!(
        finished_message(&record, record.report.as_ref().unwrap()).content,
        text_of_gone(&record)
    );
    let absent = JobRecord {
        absent_since_ms: Some(1_000),
        ..running.clone()
    };
    let away = observe(&absent, Observation::RunnerAbsent, Millis(31_000), T)
        .unwrap()
        .message
        .unwrap();
    expect_test::expect![[r#"Background job job-1 (`sleep 2; echo done`) in environment "work" failed: its runner "mac" went away: disconnected for 30 s (the runner process died or lost its network). Whether the command finished is unknown; check the environment before running it again."#]]
    .assert_eq(&away.content);
}

#[test]
fn polls_run_while_a_job_runs_and_bounds_hold() {
    let now = Millis(10_000);
    assert_eq!(next_poll(&[], now, T), None);
    assert_eq!(
        next_poll(&[record(JobState::Succeeded, None)], now, T),
        None
    );
    assert_eq!(
        next_poll(
            &[
                record(JobState::Failed, None),
                record(JobState::Running, None)
            ],
            now,
            T
        ),
        Some(Millis(15_000))
    );
    assert!(may_start(MAX_RUNNING_PER_SESSION - 1).is_ok());
    assert!(may_start(MAX_RUNNING_PER_SESSION).is_err());
    let cases = [
        (0, 0, true),
        (
            MAX_RUNNING_PER_RUNNER - 1,
            MAX_RUNNING_PER_SESSION - 1,
            true,
        ),
        (MAX_RUNNING_PER_RUNNER, 0, false),
        (3, MAX_RUNNING_PER_SESSION, false),
    ];
    for (on_runner, for_session, ok) in cases {
        assert_eq!(
            runner_admits(on_runner, for_session).is_ok(),
            ok,
            "{on_runner} {for_session}"
        );
    }
    // Only finished jobs are forgotten, oldest first, down to the bound.
    let mut records: Vec<JobRecord> = (0..MAX_JOBS_KEPT + 3)
        .map(|i| JobRecord {
            job_id: format!("job-{i}"),
            ..record(
                if i == 0 {
                    JobState::Running
                } else {
                    JobState::Succeeded
                },
                None,
            )
        })
        .collect();
    assert_eq!(to_forget(&records), ["job-1", "job-2", "job-3"]);
    records.truncate(MAX_JOBS_KEPT);
    assert!(to_forget(&records).is_empty());
}

#[test]
fn timings_come_from_the_grace_variable() {
    let cases = [
        (None, JobTimings::default()),
        (
            Some("6"),
            JobTimings {
                poll_ms: 2_000,
                grace_ms: 6_000,
            },
        ),
        (
            Some("1"),
            JobTimings {
                poll_ms: 1_000,
                grace_ms: 1_000,
            },
        ),
        (
            Some("600"),
            JobTimings {
                poll_ms: DEFAULT_POLL_MS,
                grace_ms: 600_000,
            },
        ),
        (Some("0"), JobTimings::default()),
        (Some("soon"), JobTimings::default()),
    ];
    for (value, want) in cases {
        let got = JobTimings::from_vars(|name| {
            (name == "WUHU_JOB_RUNNER_GRACE_SECONDS")
                .then(|| value.map(str::to_string))
                .flatten()
        });
        assert_eq!(got, want, "{value:?}");
    }
}

fn text_of_gone(record: &JobRecord) -> String {
    format!(
        "Background job job-1 (`sleep 2; echo done`) in environment \"work\" failed: {}. \
         Whether the command finished is unknown; check the environment before running it \
         again.",
        record.reason.as_deref().unwrap()
    )
}

/// A record kept before a runner's going away was called `failed` reads as failed.
#[test]
fn a_record_saying_lost_reads_as_failed() {
    let mut json = serde_json::to_value(record(JobState::Running, None)).unwrap();
    json["state"] = "lost".into();
    let read: JobRecord = serde_json::from_value(json).unwrap();
    assert_eq!(read.state, JobState::Failed);
    assert_eq!(serde_json::to_value(read.state).unwrap(), "failed");
}
