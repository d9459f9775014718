//! Checks that keep the docs true to the code: every `wuhu-runner` command line the README and
//! the deployment guide show parses with today's flags and keeps the token off the command line;
//! every relative link in the docs names a file that exists; the README's layout table names
//! every top-level directory. (Here rather than in the e2e crate: these need no stack, and the
//! command lines are parsed by this binary's own `Cli`.)

use std::path::{Path, PathBuf};

use clap::Parser;

use crate::Cli;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sandbox-runner/ has a parent")
        .to_path_buf()
}

/// The Markdown files whose examples and links are checked.
fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.extend(
        std::fs::read_dir(root.join("docs/decisions"))
            .expect("docs/decisions/")
            .flatten()
            .map(|e| e.path()),
    );
    docs.sort();
    files.extend(docs);
    files
}

/// Splits a shell command line into words: '…' and "…" quoting, backslash escapes outside
/// single quotes; `$VAR` stays as written.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The `wuhu-runner …` commands in the shell code blocks (```sh, ```bash, ```shell) of `text`:
/// continuation lines joined, comments and leading `VAR=value` assignments dropped. Each with
/// its line number.
fn runner_commands(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut in_code = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            in_code = !in_code && ["sh", "bash", "shell"].contains(&info.trim());
            continue;
        }
        if !in_code {
            continue;
        }
        let (start, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        let body = match trimmed.find(" #") {
            Some(at) if !trimmed[..at].contains(['"', '\'']) => trimmed[..at].trim_end(),
            _ => trimmed,
        };
        if let Some(head) = body.strip_suffix('\\') {
            joined.push_str(head);
            joined.push(' ');
            pending = Some((start, joined));
            continue;
        }
        joined.push_str(body);
        let words = shell_words(&joined);
        let command: Vec<String> = words
            .into_iter()
            .skip_while(|w| w.contains('=') && !w.starts_with('-'))
            .collect();
        if command.first().is_some_and(|w| w == "wuhu-runner") {
            out.push((start, command));
        }
    }
    out
}

#[test]
fn documented_runner_command_lines_parse_and_keep_the_token_off_them() {
    let mut checked = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).expect("read the doc");
        for (line, argv) in runner_commands(&text) {
            let at = format!("{}:{line}: {}", file.display(), argv.join(" "));
            if let Err(e) = Cli::try_parse_from(&argv) {
                // `--help` and `--version` end the parse with an "error" that is a success.
                if !matches!(
                    e.kind(),
                    clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                ) {
                    panic!("{at}\n{e}");
                }
            }
            assert!(
                !argv
                    .iter()
                    .any(|a| a == "--token" || a.starts_with("--token=")),
                "{at}: the token belongs in WUHU_RUNNER_TOKEN or --token-file, not on the command line (ps shows it)"
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "only {checked} documented command lines found"
    );
    let help = format!(
        "{}\n{}",
        crate::AFTER_HELP,
        crate::service_cmd::INSTALL_HELP
    );
    for (line, argv) in runner_commands(&format!("```sh\n{help}\n```")) {
        Cli::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("--help example {line}: {}\n{e}", argv.join(" ")));
        assert!(!argv.iter().any(|a| a == "--token"), "{argv:?}");
    }
}

#[test]
fn shell_words_follow_the_shells_quoting() {
    assert_eq!(
        shell_words(r#"a 'b c' "d \"e\"" f\ g $H"#),
        ["a", "b c", "d \"e\"", "f g", "$H"]
    );
    let commands = runner_commands(
        "```sh\nWUHU_RUNNER_TOKEN=x wuhu-runner register --server s \\\n    --name n   # comment\nls\n```\n",
    );
    assert_eq!(
        commands,
        [(
            2,
            ["wuhu-runner", "register", "--server", "s", "--name", "n"]
                .map(String::from)
                .to_vec()
        )]
    );
}

#[test]
fn relative_links_in_the_docs_name_files_that_exist() {
    let mut missing = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).expect("read the doc");
        let dir = file.parent().expect("a directory");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            rest = &rest[end..];
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            if !dir.join(path).exists() {
                missing.push(format!("{}: {target}", file.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "links to nothing:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_readme_layout_names_every_top_level_directory() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let output = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&root)
        .output()
        .expect("git ls-files");
    let mut dirs: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .split('\0')
        .filter_map(|p| p.split_once('/').map(|(d, _)| d.to_string()))
        .filter(|d| !d.starts_with('.'))
        .collect();
    dirs.sort();
    dirs.dedup();
    assert!(dirs.contains(&String::from("core")), "{dirs:?}");
    let absent: Vec<&String> = dirs
        .iter()
        .filter(|d| !readme.contains(&format!("| `{d}/")))
        .collect();
    assert!(
        absent.is_empty(),
        "README.md's layout table lacks {absent:?}"
    );
}

#[test]
fn the_readmes_first_screen_has_exactly_the_two_commands() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let first_screen = &readme[..readme.find("\n## ").expect("a section")];
    let mut commands = Vec::new();
    let mut in_code = false;
    for line in first_screen.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if in_code && !line.trim().is_empty() {
            commands.push(line.split('#').next().unwrap_or("").trim().to_string());
        }
    }
    assert_eq!(commands, ["scripts/dev", "scripts/test"], "{first_screen}");
}
