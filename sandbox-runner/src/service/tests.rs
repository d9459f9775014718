use std::path::{Path, PathBuf};

use super::*;

fn spec(args: &[&str]) -> ServiceSpec {
    ServiceSpec {
        binary: PathBuf::from("/Users/ana/.cargo/bin/wuhu-runner"),
        register_args: args.iter().map(|a| a.to_string()).collect(),
        path: String::from("/Users/ana/.cargo/bin:/opt/homebrew/bin:/usr/bin:/bin"),
        home: PathBuf::from("/Users/ana"),
    }
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

#[test]
fn layouts_put_the_token_beside_the_settings_and_the_service_where_its_manager_looks() {
    let home = Path::new("/home/ana");
    let agent = Layout::new(&Target::LaunchdAgent, Path::new("/Users/ana"));
    assert_eq!(
        agent.service_file,
        Path::new("/Users/ana/Library/LaunchAgents/dev.wuhu.runner.plist")
    );
    assert_eq!(agent.token_file, Path::new("/Users/ana/.wuhu/runner.token"));
    assert_eq!(
        agent.log_file.as_deref(),
        Some(Path::new("/Users/ana/Library/Logs/wuhu-runner.log"))
    );
    let user = Layout::new(&Target::SystemdUser, home);
    assert_eq!(
        user.service_file,
        Path::new("/home/ana/.config/systemd/user/wuhu-runner.service")
    );
    assert_eq!(user.token_file, Path::new("/home/ana/.wuhu/runner.token"));
    assert_eq!(user.log_file, None);
    let system = Layout::new(
        &Target::SystemdSystem {
            run_as: String::from("wuhu"),
        },
        Path::new("/home/wuhu"),
    );
    assert_eq!(
        system.service_file,
        Path::new("/etc/systemd/system/wuhu-runner.service")
    );
    assert_eq!(system.token_file, Path::new("/etc/wuhu/runner.token"));
}

#[test]
fn the_launchd_agent_runs_the_binary_with_its_flags_and_a_token_file_never_the_token() {
    let layout = Layout::new(&Target::LaunchdAgent, Path::new("/Users/ana"));
    let plist = launchd_plist(
        &spec(&[
            "--server",
            "https://wuhu.example.com",
            "--name",
            "ana-mac",
            "--env",
            "a&b=~/src/<x>",
        ]),
        &layout,
    )
    .unwrap();
    let expected = r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- Written by `wuhu-runner service install`; removed by `wuhu-runner service uninstall`.
     The token is in the file after token-file (mode 0600), never here. -->
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>dev.wuhu.runner</string>
  <key>ProgramArguments</key>
  <array>
    <string>/Users/ana/.cargo/bin/wuhu-runner</string>
    <string>register</string>
    <string>--server</string>
    <string>https://wuhu.example.com</string>
    <string>--name</string>
    <string>ana-mac</string>
    <string>--env</string>
    <string>a&amp;b=~/src/&lt;x&gt;</string>
    <string>--token-file</string>
    <string>/Users/ana/.wuhu/runner.token</string>
  </array>
  <key>EnvironmentVariables</key>
  <dict>
    <key>PATH</key>
    <string>/Users/ana/.cargo/bin:/opt/homebrew/bin:/usr/bin:/bin</string>
  </dict>
  <key>WorkingDirectory</key>
  <string>/Users/ana</string>
  <key>RunAtLoad</key>
  <true/>
  <key>KeepAlive</key>
  <dict>
    <key>SuccessfulExit</key>
    <false/>
  </dict>
  <key>ThrottleInterval</key>
  <integer>10</integer>
  <key>ExitTimeOut</key>
  <integer>150</integer>
  <key>StandardOutPath</key>
  <string>/Users/ana/Library/Logs/wuhu-runner.log</string>
  <key>StandardErrorPath</key>
  <string>/Users/ana/Library/Logs/wuhu-runner.log</string>
</dict>
</plist>
"#;
    assert_eq!(plist, expected);
}

#[test]
fn systemd_units_for_a_user_and_for_the_system() {
    let home = Path::new("/home/ana");
    let mut linux = spec(&[
        "--server",
        "https://w.example",
        "--name",
        "vm 1",
        "--kind",
        "cloud",
    ]);
    linux.binary = PathBuf::from("/usr/local/bin/wuhu-runner");
    linux.path = String::from("/usr/local/bin:/usr/bin:/bin:/odd%dir");
    linux.home = home.to_path_buf();
    let user = systemd_unit(
        &linux,
        &Layout::new(&Target::SystemdUser, home),
        &Target::SystemdUser,
    )
    .unwrap();
    let expected_user = r#"# Written by `wuhu-runner service install`; removed by `wuhu-runner service uninstall`.
# The token is in the file after --token-file (mode 0600), never here.
[Unit]
Description=Wuhu runner (lends environments to Wuhu sessions)

[Service]
Type=exec
WorkingDirectory=~
Environment="PATH=/usr/local/bin:/usr/bin:/bin:/odd%%dir"
ExecStart=/usr/local/bin/wuhu-runner register --server https://w.example --name "vm 1" --kind cloud --token-file /home/ana/.wuhu/runner.token
# Exit code 2: the server refused the token; restarting would not help.
RestartPreventExitStatus=2
Restart=on-failure
RestartSec=10
# SIGTERM to the runner first (it stops its tools and saves held workspaces), then the rest.
KillMode=mixed
TimeoutStopSec=150

[Install]
WantedBy=default.target
"#;
    assert_eq!(user, expected_user);

    let target = Target::SystemdSystem {
        run_as: String::from("wuhu"),
    };
    let system = systemd_unit(
        &linux,
        &Layout::new(&target, Path::new("/home/wuhu")),
        &target,
    )
    .unwrap();
    assert!(system.contains("\nAfter=network-online.target\nWants=network-online.target\n"));
    assert!(system.contains("\nUser=wuhu\nWorkingDirectory=~\n"));
    assert!(system.contains("--token-file /etc/wuhu/runner.token\n"));
    assert!(system.ends_with("[Install]\nWantedBy=multi-user.target\n"));
}

#[test]
fn words_reach_the_process_as_written() {
    // (word, how ExecStart carries it)
    let cases = [
        ("plain-word_1.2:3=x,y@z+", "plain-word_1.2:3=x,y@z+"),
        ("with space", "\"with space\""),
        ("50%", "50%%"),
        ("$HOME", "$$HOME"),
        ("say \"hi\"", "\"say \\\"hi\\\"\""),
        ("back\\slash", "\"back\\\\slash\""),
        (";", "\";\""),
        ("", "\"\""),
        ("~/src", "\"~/src\""),
    ];
    for (word, quoted) in cases {
        assert_eq!(systemd_word(word), quoted, "{word:?}");
    }
    assert_eq!(
        systemd_assignment("PATH", "/a b:/c%\"d\\"),
        "\"PATH=/a b:/c%%\\\"d\\\\\""
    );
}

#[test]
fn values_a_service_file_cannot_carry_are_refused() {
    let layout = Layout::new(&Target::SystemdUser, Path::new("/home/ana"));
    let bad = spec(&["--name", "two\nlines"]);
    let error = systemd_unit(&bad, &layout, &Target::SystemdUser).unwrap_err();
    assert!(error.to_string().contains("control character"), "{error}");
    assert!(launchd_plist(&bad, &layout).is_err());
}

#[test]
fn the_default_path_has_the_binarys_directory_homebrew_and_the_system() {
    let mac = default_path(
        &Target::LaunchdAgent,
        Path::new("/Users/ana"),
        Path::new("/opt/homebrew/bin/wuhu-runner"),
    );
    assert_eq!(
        mac,
        "/opt/homebrew/bin:/Users/ana/.cargo/bin:/Users/ana/.local/bin:/opt/homebrew/sbin:/usr/local/bin:/usr/local/sbin:/usr/bin:/bin:/usr/sbin:/sbin"
    );
    let linux = default_path(
        &Target::SystemdUser,
        Path::new("/home/ana"),
        Path::new("/home/ana/.cargo/bin/wuhu-runner"),
    );
    assert_eq!(
        linux,
        "/home/ana/.cargo/bin:/home/ana/.local/bin:/home/linuxbrew/.linuxbrew/bin:/home/linuxbrew/.linuxbrew/sbin:/usr/local/bin:/usr/local/sbin:/usr/bin:/bin:/usr/sbin:/sbin"
    );
}

#[test]
fn install_and_uninstall_plans() {
    let home = Path::new("/Users/ana");
    let layout = Layout::new(&Target::LaunchdAgent, home);
    let plan = install_plan(
        &Target::LaunchdAgent,
        &layout,
        &spec(&[]),
        " SECRET-TOKEN\n",
        501,
        true,
    )
    .unwrap();
    assert_eq!(plan.write[0].path, layout.token_file);
    assert_eq!((plan.write[0].mode, plan.write[0].secret), (0o600, true));
    assert_eq!(plan.write[0].contents, "SECRET-TOKEN\n");
    assert_eq!((plan.write[1].mode, plan.write[1].secret), (0o644, false));
    assert!(!plan.write[1].contents.contains("SECRET-TOKEN"));
    assert_eq!(
        plan.best_effort,
        vec![strings(&[
            "launchctl",
            "bootout",
            "gui/501/dev.wuhu.runner"
        ])]
    );
    assert_eq!(
        plan.commands,
        vec![
            strings(&[
                "launchctl",
                "bootstrap",
                "gui/501",
                "/Users/ana/Library/LaunchAgents/dev.wuhu.runner.plist"
            ]),
            strings(&["launchctl", "enable", "gui/501/dev.wuhu.runner"]),
        ]
    );
    let quiet = install_plan(
        &Target::LaunchdAgent,
        &layout,
        &spec(&[]),
        "tok",
        501,
        false,
    )
    .unwrap();
    assert!(quiet.commands.is_empty() && quiet.best_effort.is_empty());
    let user_layout = Layout::new(&Target::SystemdUser, Path::new("/home/ana"));
    let quiet = install_plan(
        &Target::SystemdUser,
        &user_layout,
        &spec(&[]),
        "tok",
        1,
        false,
    )
    .unwrap();
    assert!(quiet.commands.is_empty() && quiet.best_effort.is_empty());

    let user_layout = Layout::new(&Target::SystemdUser, Path::new("/home/ana"));
    let user = install_plan(
        &Target::SystemdUser,
        &user_layout,
        &spec(&[]),
        "tok",
        1000,
        true,
    )
    .unwrap();
    assert_eq!(
        user.commands,
        vec![
            strings(&["systemctl", "--user", "daemon-reload"]),
            strings(&["systemctl", "--user", "enable", "wuhu-runner.service"]),
            strings(&["systemctl", "--user", "restart", "wuhu-runner.service"]),
        ]
    );
    let removal = uninstall_plan(&Target::SystemdUser, &user_layout, 1000);
    assert_eq!(
        removal.remove,
        vec![
            PathBuf::from("/home/ana/.config/systemd/user/wuhu-runner.service"),
            PathBuf::from("/home/ana/.wuhu/runner.token"),
            PathBuf::from("/home/ana/.wuhu"),
            PathBuf::from("/home/ana/.config/systemd/user"),
            PathBuf::from("/home/ana/.config/systemd"),
        ]
    );
    assert_eq!(
        removal.best_effort,
        vec![strings(&[
            "systemctl",
            "--user",
            "disable",
            "--now",
            "wuhu-runner.service"
        ])]
    );
    let mac_removal = uninstall_plan(&Target::LaunchdAgent, &layout, 501);
    assert!(
        mac_removal
            .remove
            .contains(&PathBuf::from("/Users/ana/Library/Logs/wuhu-runner.log"))
    );
}

#[test]
fn only_registers_flags_reach_the_service() {
    let flags = [
        ("--system", false),
        ("--run-as", true),
        ("--token", true),
        ("--token-file", true),
    ];
    // (given, kept)
    let cases: [(&[&str], &[&str]); 5] = [
        (
            &["--server", "https://x", "--token", "SECRET"],
            &["--server", "https://x"],
        ),
        (&["--token=SECRET", "--name", "a"], &["--name", "a"]),
        (
            &["--system", "--run-as", "wuhu", "--kind", "cloud"],
            &["--kind", "cloud"],
        ),
        (&["--run-as=wuhu", "--token-file", "/t", "-v"], &["-v"]),
        // A value that looks like a flag is a value.
        (&["--name", "--system"], &["--name", "--system"]),
    ];
    for (given, kept) in cases {
        let got = without_flags(&strings(given), &flags);
        if given == ["--name", "--system"] {
            // Without a parser the value is taken for the flag; clap refuses such a name first
            // (names are letters, digits, '-', '_', '.'), so this never reaches the service.
            assert_eq!(got, strings(&["--name"]));
            continue;
        }
        assert_eq!(got, strings(kept), "{given:?}");
    }
}

#[test]
fn targets_follow_the_platform_and_who_installs() {
    use super::system::select_target;
    assert_eq!(
        select_target(true, false, None, 501),
        Ok(Target::LaunchdAgent)
    );
    assert!(
        select_target(true, true, None, 0)
            .unwrap_err()
            .contains("Linux")
    );
    assert_eq!(
        select_target(false, false, None, 1000),
        Ok(Target::SystemdUser)
    );
    assert!(
        select_target(false, false, Some("wuhu"), 0)
            .unwrap_err()
            .contains("--system")
    );
    assert!(
        select_target(false, true, Some("wuhu"), 1000)
            .unwrap_err()
            .contains("root")
    );
    assert!(
        select_target(false, true, None, 0)
            .unwrap_err()
            .contains("--run-as")
    );
    assert_eq!(
        select_target(false, true, Some("wuhu"), 0),
        Ok(Target::SystemdSystem {
            run_as: String::from("wuhu")
        })
    );
}
