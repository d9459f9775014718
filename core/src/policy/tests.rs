use super::*;

/// What the engine reads of command lines: each simple command, and whether any part is opaque.
#[test]
fn command_lines_split_into_their_simple_commands() {
    let cases: &[(&str, &[&str], bool)] = &[
        ("ls -la", &["ls -la"], false),
        ("ls && rm -rf /", &["ls", "rm -rf /"], false),
        ("ls; rm -rf /", &["ls", "rm -rf /"], false),
        ("ls || rm -rf / &", &["ls", "rm -rf /"], false),
        (
            "cat a | grep b | rm -rf /",
            &["cat a", "grep b", "rm -rf /"],
            false,
        ),
        ("(cd x && make) | tee y", &["cd x", "make", "tee y"], false),
        ("{ ls; rm -rf /; }", &["ls", "rm -rf /"], false),
        // Quoting: words are unquoted, and an operator inside quotes is text.
        ("echo 'a && rm -rf /'", &["echo a && rm -rf /"], false),
        (
            "git push \"origin\" 'ma'in",
            &["git push origin main"],
            false,
        ),
        ("printf a\\ b", &["printf a b"], false),
        // Substitutions run commands too.
        ("echo $(rm -rf /)", &["rm -rf /", "echo $(rm -rf /)"], false),
        ("echo `id`", &["id", "echo `id`"], false),
        (
            "diff <(ls a) <(ls b)",
            &["ls a", "ls b", "diff <(ls a) <(ls b)"],
            false,
        ),
        ("x=$(whoami)", &["whoami"], false),
        // Compound commands.
        ("if true; then rm -rf /; fi", &["true", "rm -rf /"], false),
        ("for f in *; do rm \"$f\"; done", &["rm \"$f\""], false),
        (
            "while read l; do echo $l; done < f",
            &["read l", "echo $l"],
            false,
        ),
        ("case $x in a) rm -rf /;; esac", &["rm -rf /"], false),
        ("f() { rm -rf /; }; f", &["rm -rf /", "f"], false),
        ("! rm -rf /", &["rm -rf /"], false),
        ("time rm -rf /", &["rm -rf /"], false),
        // Scripts given to a shell are read as well.
        (
            "bash -c 'ls && rm -rf /'",
            &["ls", "rm -rf /", "bash -c ls && rm -rf /"],
            false,
        ),
        (
            "sh -lc \"git push\"",
            &["git push", "sh -lc git push"],
            false,
        ),
        ("eval 'rm -rf /'", &["rm -rf /", "eval rm -rf /"], false),
        // What cannot be read statically is opaque.
        ("$CMD -rf /", &["$CMD -rf /"], true),
        (
            "$(which rm) -rf /",
            &["which rm", "$(which rm) -rf /"],
            true,
        ),
        ("bash -c \"$SCRIPT\"", &["bash -c \"$SCRIPT\""], true),
        ("eval \"$X\"", &["eval \"$X\""], true),
        ("cat <<EOF\n$(rm -rf /)\nEOF\n", &["cat"], true),
        (
            "echo $(( $(rm -rf /) + 1 ))",
            &["echo $(( $(rm -rf /) + 1 ))"],
            true,
        ),
        ("if [[ $(rm -rf /) ]]; then :; fi", &[":"], true),
        ("ls (", &[], true),
    ];
    for (line, commands, opaque) in cases {
        let parsed = shell::parse(line);
        let texts: Vec<&str> = parsed.commands.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(&texts, commands, "simple commands of {line:?}");
        assert_eq!(parsed.opaque, *opaque, "opaque of {line:?}");
    }
}

#[test]
fn bounds_make_a_line_opaque_without_parsing_it() {
    let deep = format!("{}ls{}", "( ".repeat(200), " )".repeat(200));
    assert!(shell::parse(&deep).opaque, "more than MAX_OPENERS brackets");
    let within = format!("{}ls{}", "( ".repeat(20), " )".repeat(20));
    let parsed = shell::parse(&within);
    assert!(!parsed.opaque);
    assert_eq!(parsed.commands.len(), 1);
    let long = format!("echo {}", "a".repeat(shell::MAX_PARSED_BYTES));
    assert!(shell::parse(&long).opaque, "longer than MAX_PARSED_BYTES");
    let many = "true;".repeat(shell::MAX_SIMPLE_COMMANDS + 5);
    assert!(shell::parse(&many).opaque, "more than MAX_SIMPLE_COMMANDS");
    let fine = "true;".repeat(shell::MAX_SIMPLE_COMMANDS - 5);
    assert!(!shell::parse(&fine).opaque);
    let nested = "bash -c \"bash -c 'bash -c \\\"bash -c ls\\\"'\"";
    assert!(shell::parse(nested).opaque, "beyond MAX_NESTED_SHELLS");
}

#[test]
fn output_redirections_are_written_paths() {
    let parsed = shell::parse("echo hi > infra/a.tf 2>&1; cat x >> ./log/b; ls < in");
    assert_eq!(parsed.written_paths, vec!["infra/a.tf", "./log/b"]);
}

fn policy(path: &str, rules: serde_json::Value) -> Policy {
    Policy::parse(
        path,
        Some(&serde_json::json!({ "rules": rules }).to_string()),
    )
    .unwrap()
}

fn bash(command: &str) -> Call<'_> {
    Call {
        tool: "bash",
        environment: Some("dev"),
        runner: Some("mac"),
        runner_owner: Some("alice"),
        command: Some(command),
        ..Call::default()
    }
}

fn decide(tenant: &Policy, user: Option<(&str, &Policy)>, call: &Call<'_>) -> String {
    match evaluate(tenant, user, call) {
        None => "none".into(),
        Some(v) => format!("{} {}", v.decision.as_str(), v.rule.describe()),
    }
}

/// A table of commands × rules: compound commands, quoting, subshells and wrappers cannot
/// carry a refused command past a rule, and an allow rule covers only lines made of it alone.
#[test]
fn commands_against_rules() {
    let tenant = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([
            {"id": "status", "match": {"command": "git status*"}, "decision": "allow"},
            {"id": "push", "match": {"command": "git push*"}, "decision": "ask", "reason": "pushes are reviewed"},
            {"id": "rm-root", "match": {"command": "rm -rf /*"}, "decision": "deny"},
            {"id": "ls", "match": {"tool": "bash", "command": "ls*"}, "decision": "allow"},
        ]),
    );
    let cases: &[(&str, &str)] = &[
        ("ls", "allow tenant rule \"ls\""),
        ("ls -la src", "allow tenant rule \"ls\""),
        ("ls && rm -rf /", "deny tenant rule \"rm-root\""),
        ("ls; rm -rf /tmp", "deny tenant rule \"rm-root\""),
        ("ls | (rm -rf /)", "deny tenant rule \"rm-root\""),
        ("echo $(rm -rf /)", "deny tenant rule \"rm-root\""),
        ("sudo rm -rf /", "deny tenant rule \"rm-root\""),
        (
            "env A=1 nohup /bin/rm -rf /",
            "deny tenant rule \"rm-root\"",
        ),
        ("timeout 5 rm -rf /", "deny tenant rule \"rm-root\""),
        ("bash -c 'ls && rm -rf /'", "deny tenant rule \"rm-root\""),
        ("'rm' -rf /", "deny tenant rule \"rm-root\""),
        (
            "git status && git push origin main",
            "ask tenant rule \"push\"",
        ),
        ("git status", "allow tenant rule \"status\""),
        (
            "/usr/bin/git status --short",
            "allow tenant rule \"status\"",
        ),
        ("git status && make", "none"),
        ("ls && make", "none"),
        ("$X", "none"),
        // An opaque line is never allowed by a rule: `ls $(…)` hides what runs.
        ("ls $(cat list)", "none"),
        ("echo 'rm -rf /'", "none"),
        ("echo hi", "none"),
    ];
    for (command, expected) in cases {
        assert_eq!(
            decide(&tenant, None, &bash(command)),
            *expected,
            "{command:?}"
        );
    }
}

/// Which policy decides: the tenant's deny always; else the runner owner's first match; else
/// the tenant's; a user's rules only on that user's own runners.
#[test]
fn tenant_deny_beats_user_allow_and_user_rules_cover_their_own_runners() {
    let tenant = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([
            {"match": {"command": "curl *"}, "decision": "deny", "reason": "use the registry mirror"},
            {"match": {"command": "git push*"}, "decision": "ask"},
        ]),
    );
    let alice = policy(
        &user_policy_path("alice"),
        serde_json::json!([
            {"match": {"command": "curl *"}, "decision": "allow"},
            {"match": {"command": "git push*"}, "decision": "allow"},
            {"match": {"path": "infra/*"}, "decision": "ask"},
        ]),
    );
    let user = Some(("alice", &alice));
    assert_eq!(
        decide(&tenant, user, &bash("curl https://x")),
        "deny tenant rule 1"
    );
    assert_eq!(
        decide(&tenant, user, &bash("git push")),
        "allow alice's rule 2"
    );
    // bob's runner: alice's rules do not apply.
    let on_bobs = Call {
        runner_owner: Some("bob"),
        ..bash("git push")
    };
    assert_eq!(
        decide(&tenant, user, &on_bobs),
        "ask tenant rule 1".replace('1', "2")
    );
    // No runner (a fetch, a child session): only the tenant's.
    let no_runner = Call {
        runner: None,
        runner_owner: None,
        ..bash("git push")
    };
    assert_eq!(decide(&tenant, user, &no_runner), "ask tenant rule 2");
    let write = Call {
        tool: "write",
        command: None,
        paths: vec!["./infra/../infra/main.tf".into()],
        ..bash("")
    };
    assert_eq!(decide(&tenant, user, &write), "ask alice's rule 3");
}

/// A line is decided per simple command: the strictest wins, a command no rule decides leaves
/// the line undecided, and a user's allow of one command covers it inside any line.
#[test]
fn a_line_is_decided_command_by_command() {
    let tenant = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([
            {"id": "push", "match": {"command": "git push*"}, "decision": "ask"},
            {"id": "ls", "match": {"command": "ls*"}, "decision": "allow"},
            {"id": "make", "match": {"command": "make*"}, "decision": "allow"},
        ]),
    );
    let alice = policy(
        &user_policy_path("alice"),
        serde_json::json!([{"match": {"command": "git push origin main"}, "decision": "allow"}]),
    );
    let user = Some(("alice", &alice));
    let cases = [
        ("ls && make", "allow tenant rule \"ls\""),
        ("make && git push origin main", "allow tenant rule \"make\""),
        ("make && git push origin dev", "ask tenant rule \"push\""),
        ("echo x && git push origin main", "none"),
        ("ls && $CMD", "none"),
        ("", "none"),
    ];
    for (line, expected) in cases {
        assert_eq!(decide(&tenant, user, &bash(line)), expected, "{line:?}");
    }
    let all = evaluate(&tenant, None, &bash("ls && make")).unwrap();
    assert_eq!(all.subject, "ls && make");
    let asked = evaluate(&tenant, user, &bash("make && git push origin dev")).unwrap();
    assert_eq!(asked.subject, "git push origin dev");
    // A rule about the call, not its command, names the whole line.
    let whole = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([{"match": {"tool": "bash"}, "decision": "ask"}]),
    );
    assert_eq!(
        evaluate(&whole, None, &bash("a; b")).unwrap().subject,
        "a; b"
    );
}

#[test]
fn every_field_of_a_match_must_hold() {
    let tenant = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([
            {"id": "a", "match": {"tool": "write", "path": "infra/*"}, "decision": "ask"},
            {"id": "b", "match": {"tool": "js_fetch", "host": "*.internal"}, "decision": "deny"},
            {"id": "c", "match": {"tool": "request_environment", "costUsdOver": 1}, "decision": "ask"},
            {"id": "d", "match": {"environment": "prod*", "runner": "ci-*"}, "decision": "deny"},
            {"id": "e", "match": {"path": "*.env"}, "decision": "deny"},
            {"id": "f", "match": {"tool": "mcp_call", "mcp": "github/*_delete"}, "decision": "deny"},
        ]),
    );
    let call = |tool, f: &dyn Fn(&mut Call<'static>)| {
        let mut c = Call {
            tool,
            ..Call::default()
        };
        f(&mut c);
        decide(&tenant, None, &c)
    };
    let cases = [
        (
            call("write", &|c| c.paths = vec!["infra/x.tf".into()]),
            "ask tenant rule \"a\"",
        ),
        (
            call("write", &|c| c.paths = vec!["src/x.rs".into()]),
            "none",
        ),
        (call("write", &|_| {}), "none"),
        (
            call("read", &|c| c.paths = vec!["infra/x.tf".into()]),
            "none",
        ),
        (
            call("js_fetch", &|c| c.host = Some("db.internal")),
            "deny tenant rule \"b\"",
        ),
        (call("js_fetch", &|c| c.host = Some("example.com")), "none"),
        (
            call("mcp_call", &|c| c.mcp = Some("github/repo_delete")),
            "deny tenant rule \"f\"",
        ),
        (
            call("mcp_call", &|c| c.mcp = Some("github/repo_create")),
            "none",
        ),
        (call("mcp_call", &|_| {}), "none"),
        (
            call("request_environment", &|c| c.cost_usd = Some(1.5)),
            "ask tenant rule \"c\"",
        ),
        (
            call("request_environment", &|c| c.cost_usd = Some(1.0)),
            "none",
        ),
        (call("request_environment", &|_| {}), "none"),
        (
            call("bash", &|c| {
                c.environment = Some("prod-db");
                c.runner = Some("ci-1");
            }),
            "deny tenant rule \"d\"",
        ),
        (
            call("bash", &|c| {
                c.environment = Some("prod-db");
                c.runner = Some("mac");
            }),
            "none",
        ),
        (
            call("bash", &|c| c.command = Some("cat a > ./app/.env")),
            "deny tenant rule \"e\"",
        ),
    ];
    for (got, expected) in cases {
        assert_eq!(got, expected);
    }
}

#[test]
fn documents_are_checked_with_errors_that_name_the_rule() {
    let bad = |rules: serde_json::Value| {
        Policy::parse(
            TENANT_POLICY_PATH,
            Some(&serde_json::json!({ "rules": rules }).to_string()),
        )
        .unwrap_err()
        .to_string()
    };
    expect_test::expect![[r#"config/policy.json: rule 2: id "a" is used by an earlier rule"#]]
        .assert_eq(&bad(serde_json::json!([
            {"id": "a", "decision": "allow"}, {"id": "a", "decision": "deny"}
        ])));
    expect_test::expect![[
        r#"config/policy.json: rule 1: id "a b" must be 1 to 64 letters, digits, '-', '_' or '.'"#
    ]]
    .assert_eq(&bad(
        serde_json::json!([{"id": "a b", "decision": "allow"}]),
    ));
    expect_test::expect!["config/policy.json: rule 1: match.command must be 1 to 512 characters"]
        .assert_eq(&bad(serde_json::json!([
            {"match": {"command": ""}, "decision": "deny"}
        ])));
    expect_test::expect![
        "config/policy.json: rule 1: match.costUsdOver must be a number of dollars, 0 or more"
    ]
    .assert_eq(&bad(serde_json::json!([
        {"match": {"costUsdOver": -1}, "decision": "ask"}
    ])));
    let long_pattern = "a".repeat(MAX_PATTERN_CHARS + 1);
    assert!(
        bad(serde_json::json!([{"match": {"path": long_pattern}, "decision": "deny"}]))
            .contains("match.path")
    );
    let at_bound = "a".repeat(MAX_PATTERN_CHARS);
    assert!(
        Policy::parse(
            TENANT_POLICY_PATH,
            Some(
                &serde_json::json!({"rules": [{"match": {"path": at_bound}, "decision": "deny"}]})
                    .to_string()
            )
        )
        .is_ok()
    );
    let too_many: Vec<_> = (0..=MAX_RULES)
        .map(|_| serde_json::json!({"decision": "allow"}))
        .collect();
    assert!(bad(serde_json::json!(too_many)).contains("at most 200"));
    let at_most: Vec<_> = (0..MAX_RULES)
        .map(|_| serde_json::json!({"decision": "allow"}))
        .collect();
    assert!(
        Policy::parse(
            TENANT_POLICY_PATH,
            Some(&serde_json::json!({ "rules": at_most }).to_string())
        )
        .is_ok()
    );
    let unknown = Policy::parse(
        TENANT_POLICY_PATH,
        Some(r#"{"rules":[{"match":{"cmd":"x"},"decision":"deny"}]}"#),
    )
    .unwrap_err()
    .to_string();
    assert!(unknown.contains("unknown field `cmd`"), "{unknown}");
    assert!(
        Policy::parse(
            TENANT_POLICY_PATH,
            Some(r#"{"rules":[{"decision":"maybe"}]}"#)
        )
        .is_err()
    );
    assert!(Policy::parse(TENANT_POLICY_PATH, None).unwrap().is_empty());
}

#[test]
fn policy_documents_are_the_tenants_and_each_users() {
    assert!(is_policy_document("config/policy.json"));
    assert!(is_policy_document("users/alice/policy.json"));
    assert_eq!(policy_user("users/alice/policy.json"), Some("alice"));
    assert!(!is_policy_document("users/alice/notes/policy.json"));
    assert!(!is_policy_document("users//policy.json"));
    assert!(!is_policy_document("policy.json"));
}

#[test]
fn paths_are_normalised_before_matching() {
    let cases = [
        ("./infra/x", "infra/x"),
        ("infra//x/", "infra/x"),
        ("src/../infra/x", "infra/x"),
        ("../x", "../x"),
        ("/repo/./a/../b", "/repo/b"),
        ("/../etc", "/etc"),
        ("", ""),
    ];
    for (path, expected) in cases {
        assert_eq!(normalize_path(path), expected, "{path:?}");
    }
}

#[test]
fn texts_name_the_rule_the_reason_and_what_matched() {
    let tenant = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([{"id": "no-rm", "match": {"command": "rm *"}, "decision": "deny", "reason": "nothing is deleted outside the workspace"}]),
    );
    let v = evaluate(&tenant, None, &bash("ls && rm -rf /")).unwrap();
    expect_test::expect![[
        r#"Refused by policy (tenant rule "no-rm": nothing is deleted outside the workspace). It matched "rm -rf /"; the call did not run. Do something else, or ask a person to change the policy."#
    ]]
    .assert_eq(&v.deny_text());
    expect_test::expect![[r#"{"decision":"deny","reason":"nothing is deleted outside the workspace","rule":{"id":"no-rm","index":1,"source":"tenant"},"subject":"rm -rf /","text":"Policy refused bash: \"rm -rf /\" (tenant rule \"no-rm\").","tool":"bash","toolCallId":"c1"}"#]]
    .assert_eq(&decision_entry(&v, "bash", "c1").to_string());
    assert_eq!(
        crate::approvals::policy_approver(&v.rule, "owner"),
        crate::authority::Approver::SessionOwner("owner".into())
    );
}

#[test]
fn a_dry_run_reads_its_query_and_answers_like_a_call() {
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    let tenant = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([{"id": "push", "match": {"command": "git push*"}, "decision": "ask"}]),
    );
    let q =
        CheckQuery::parse(&pairs(&[("tool", "bash"), ("command", "make && git push")])).unwrap();
    let answer = check(&tenant, None, &q);
    assert_eq!(answer.decision, Decision::Ask);
    assert_eq!(answer.commands, vec!["make", "git push"]);
    assert!(!answer.opaque);
    let q = CheckQuery::parse(&pairs(&[("tool", "bash"), ("command", "make")])).unwrap();
    let answer = check(&tenant, None, &q);
    assert_eq!((answer.decision, answer.verdict), (Decision::Allow, None));
    let errors = [
        (pairs(&[]), "tool is required"),
        (
            pairs(&[("tool", "bash"), ("cmd", "x")]),
            "unknown parameter \"cmd\"",
        ),
        (
            pairs(&[("tool", "bash"), ("costUsd", "-1")]),
            "costUsd must be",
        ),
        (
            pairs(&[("tool", "bash"), ("costUsd", "NaN")]),
            "costUsd must be",
        ),
    ];
    for (query, expected) in errors {
        let e = CheckQuery::parse(&query).unwrap_err();
        assert!(e.contains(expected), "{e}");
    }
    let long = "a".repeat(MAX_CHECK_PARAM_BYTES + 1);
    assert!(CheckQuery::parse(&pairs(&[("tool", "bash"), ("command", &long)])).is_err());
    let at_bound = "a".repeat(MAX_CHECK_PARAM_BYTES);
    assert!(CheckQuery::parse(&pairs(&[("tool", "bash"), ("command", &at_bound)])).is_ok());
}

#[test]
fn cost_estimates_scale_an_hourly_price_by_the_time_asked() {
    let per_hour = serde_json::Number::from_f64(0.5).unwrap();
    assert_eq!(cost_estimate(Some(&per_hour), 10_800.0), Some(1.5));
    assert_eq!(
        cost_estimate(Some(&per_hour), DEFAULT_COST_SECONDS),
        Some(0.5)
    );
    assert_eq!(cost_estimate(Some(&per_hour), -5.0), Some(0.0));
    assert_eq!(cost_estimate(None, 10_800.0), None);
}

#[test]
fn always_allows_exactly_what_was_asked_on_the_approvers_own_machine() {
    let tenant = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([
            {"id": "push", "match": {"command": "git push*"}, "decision": "ask"},
            {"id": "infra", "match": {"path": "infra/*"}, "decision": "ask"},
        ]),
    );
    let asked = |call: &Call<'_>| evaluate(&tenant, None, call).unwrap();
    let line = bash("make && sudo git push origin main");
    let rule = always_rule(&asked(&line), &line, "alice").unwrap();
    assert_eq!(
        serde_json::to_value(&rule).unwrap(),
        serde_json::json!({"match": {"tool": "bash", "command": "git push origin main"}, "decision": "allow", "reason": "alice answered \"always\""})
    );
    // Written first into alice's policy, it allows that command inside any line on her runner,
    // and nothing else.
    let text = add_rule_first(&user_policy_path("alice"), None, rule.clone()).unwrap();
    let again = add_rule_first(&user_policy_path("alice"), Some(&text), rule).unwrap();
    assert_eq!(text, again, "the same rule is not added twice");
    let alice = Policy::parse(&user_policy_path("alice"), Some(&text)).unwrap();
    let user = Some(("alice", &alice));
    assert_eq!(
        decide(&tenant, user, &bash("git push origin main")),
        "allow alice's rule 1"
    );
    assert_eq!(
        decide(&tenant, user, &bash("git push origin dev")),
        "ask tenant rule \"push\""
    );
    let on_bobs = Call {
        runner_owner: Some("bob"),
        ..bash("git push origin main")
    };
    assert_eq!(decide(&tenant, user, &on_bobs), "ask tenant rule \"push\"");
    // Not offered: another person's machine, a pattern, nothing exact to name.
    assert!(always_rule(&asked(&line), &line, "bob").is_none());
    let glob = bash("git push origin 'feat*'");
    assert!(always_rule(&asked(&glob), &glob, "alice").is_none());
    let write = Call {
        tool: "write",
        command: None,
        paths: vec!["./infra/a.tf".into()],
        ..bash("")
    };
    let rule = always_rule(&asked(&write), &write, "alice").unwrap();
    assert_eq!(rule.matches.path.as_deref(), Some("infra/a.tf"));
    // A full document refuses one more rule.
    let full: Vec<_> = (0..MAX_RULES)
        .map(|i| serde_json::json!({"match": {"host": format!("h{i}")}, "decision": "allow"}))
        .collect();
    let full = serde_json::json!({ "rules": full }).to_string();
    let refused = add_rule_first(
        "users/alice/policy.json",
        Some(&full),
        always_rule(&asked(&write), &write, "alice").unwrap(),
    );
    assert!(refused.unwrap_err().to_string().contains("at most 200"));
}

#[test]
fn a_pattern_between_slashes_is_a_regular_expression() {
    let tenant = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([
            {"id": "vcs", "match": {"command": "/^git (push|commit)( |$)/"}, "decision": "ask"},
            {"id": "hosts", "match": {"tool": "js_fetch", "host": "/^(10|192\\.168)\\./"}, "decision": "deny"},
        ]),
    );
    let cases = [
        ("git push origin main", "ask tenant rule \"vcs\""),
        ("make && git commit -m x", "ask tenant rule \"vcs\""),
        ("git pushx", "none"),
        ("git status", "none"),
    ];
    for (line, expected) in cases {
        assert_eq!(decide(&tenant, None, &bash(line)), expected, "{line:?}");
    }
    let fetch = |host: &'static str| Call {
        tool: JS_FETCH,
        host: Some(host),
        ..Call::default()
    };
    assert_eq!(
        decide(&tenant, None, &fetch("192.168.1.4")),
        "deny tenant rule \"hosts\""
    );
    assert_eq!(decide(&tenant, None, &fetch("192x168.1.4")), "none");
    // A wrong expression is refused with its rule; `/` alone is a glob.
    let bad = Policy::parse(
        TENANT_POLICY_PATH,
        Some(r#"{"rules":[{"decision":"allow"},{"match":{"command":"/(/"},"decision":"deny"}]}"#),
    )
    .unwrap_err()
    .to_string();
    assert!(
        bad.starts_with("config/policy.json: rule 2: match.command: not a regular expression"),
        "{bad}"
    );
    assert!(
        Policy::parse(
            TENANT_POLICY_PATH,
            Some(r#"{"rules":[{"match":{"path":"/"},"decision":"deny"}]}"#)
        )
        .is_ok()
    );
    // "always" never writes a command that would read as an expression.
    let asked = policy(
        TENANT_POLICY_PATH,
        serde_json::json!([{"match": {"command": "*"}, "decision": "ask"}]),
    );
    let line = bash("/bin/ls /");
    let verdict = evaluate(&asked, None, &line).unwrap();
    let rule = always_rule(&verdict, &line, "alice").unwrap();
    assert_eq!(rule.matches.command.as_deref(), Some("ls /"));
}
