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
            "unknown to a connected runner: lost at once",
            record(Running, None),
            O::Unknown,
            3_000,
            Some((Lost, None, true)),
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
            "runner absent for the grace: lost",
            record(Running, Some(3_000)),
            O::RunnerAbsent,
            33_000,
            Some((Lost, None, true)),
        ),
        (
            "a finished job never changes (event after poll)",
            record(Succeeded, None),
            O::Report(report(Failed, Some(1))),
            3_000,
            None,
        ),
        (
            "a lost job stays lost when its runner reports",
            record(Lost, None),
            O::Report(report(Succeeded, Some(0))),
            3_000,
            None,
        ),
        (
            "a finished job is not lost",
            record(Failed, None),
            O::RunnerAbsent,
            99_000,
            None,
        ),
        (
            "a finished job is not lost to an unknown",
            record(Killed, None),
            O::Unknown,
            3_000,
            None,
        ),
    ];
    for (case, record, observation, now, want) in cases {
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
            }
        }
    }
}

#[test]
fn messages_say_how_the_job_ended_and_where_the_whole_output_is() {
    let running = record(JobState::Running, None);
    let text = |report: JobReport| finished_message(&running, &report, None).content;
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
    let lost = observe(&running, Observation::Unknown, Millis(4_000), T)
        .unwrap()
        .message
        .unwrap();
    expect_test::expect![[r#"Background job job-1 (`sleep 2; echo done`) in environment "work" was lost: runner "mac" is connected but no longer knows the job: the runner process restarted (or died and was started again), which ends its jobs. Whether it finished is unknown; check the environment before running it again."#]]
    .assert_eq(&lost.content);
    assert_eq!(
        lost.input.details.unwrap()["durationMs"],
        3_000,
        "lost after 3 s"
    );
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
                record(JobState::Lost, None),
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
