//! `cell_spawn`: what a cell adds to a `bash` call (issue 30, decision 0023), measured where it
//! happens: the runner's process spawn. Alternating, `bash -c true` spawned and waited for as
//! the runner does without cells, and the same through `wuhu-runner cell-exec` (the runner's
//! release binary, as every call in a cell) with an `open` network, with `none` (a network
//! namespace), and with an `allow` list (a namespace and the relay to a proxy socket).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::json;
use wuhu_e2e::runner::{TempDir, runner_bin};

use crate::{Config, Measured, Series, Stats, ms};

pub fn cell_spawn(config: &Config) -> Measured {
    let dir = TempDir::new("wuhu-bench-cell");
    let root = dir.mkdir("root");
    let temp = dir.mkdir("tmp");
    let socket = dir.path().join("proxy.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("proxy socket");
    let policy = |network: serde_json::Value| {
        json!({
            "policy": {
                "readWrite": [root, temp],
                "readOnly": ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"],
                "devices": ["/dev/null", "/dev/zero", "/dev/urandom"],
                "tempDir": temp,
                "network": network,
                "limits": {"processes": 1024, "openFiles": 4096, "fileSizeBytes": 17179869184u64, "cpuSeconds": 3600},
                "refused": []
            },
            "proxySocket": socket,
        })
        .to_string()
    };
    let specs = [
        ("open", policy(json!("open"))),
        ("none", policy(json!("none"))),
        ("allow", policy(json!({"allow": ["github.com"]}))),
    ];
    let bash = wuhu_e2e::runner::RUNNER_PATH
        .split(':')
        .map(|d| std::path::Path::new(d).join("bash"))
        .find(|p| p.exists())
        .expect("bash");
    let run = |cell: Option<&str>| {
        let mut command = match cell {
            None => Command::new(&bash),
            Some(spec) => {
                let mut c = Command::new(runner_bin());
                c.arg("cell-exec").arg(spec).arg("--").arg(&bash);
                c
            }
        };
        command
            .args(["-c", "true"])
            .current_dir(&root)
            .env_clear()
            .env("PATH", wuhu_e2e::runner::RUNNER_PATH)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let started = Instant::now();
        let status = command.status().expect("spawn");
        let elapsed = started.elapsed();
        assert!(status.success(), "{cell:?}: {status}");
        ms(elapsed)
    };
    let calls = config.warmup + config.turns;
    let mut bare = Vec::new();
    let mut cells: Vec<Vec<f64>> = vec![Vec::new(); specs.len()];
    for i in 0..calls {
        let b = run(None);
        let c: Vec<f64> = specs.iter().map(|(_, spec)| run(Some(spec))).collect();
        if i >= config.warmup {
            bare.push(b);
            for (series, sample) in cells.iter_mut().zip(c) {
                series.push(sample);
            }
        }
    }
    let added =
        |series: &[f64]| -> Vec<f64> { series.iter().zip(&bare).map(|(c, b)| c - b).collect() };
    let p50 = |s: &[f64]| Stats::of(s).p50;
    eprintln!(
        "bench: cell_spawn bare bash p50 {:.2} ms; in a cell p50 {:.2} (open) {:.2} (none) {:.2} (allow) ms; added p50 {:.2} / {:.2} / {:.2} ms (target ≤ 5 ms: {})",
        p50(&bare),
        p50(&cells[0]),
        p50(&cells[1]),
        p50(&cells[2]),
        p50(&added(&cells[0])),
        p50(&added(&cells[1])),
        p50(&added(&cells[2])),
        if cells.iter().all(|c| p50(&added(c)) <= 5.0) {
            "met"
        } else {
            "missed"
        },
    );
    vec![
        Series {
            name: "added_open",
            samples_ms: added(&cells[0]),
        },
        Series {
            name: "added_none",
            samples_ms: added(&cells[1]),
        },
        Series {
            name: "added_allow",
            samples_ms: added(&cells[2]),
        },
        Series {
            name: "bare_bash_spawn",
            samples_ms: bare.clone(),
        },
        Series {
            name: "cell_open",
            samples_ms: cells[0].clone(),
        },
        Series {
            name: "cell_none",
            samples_ms: cells[1].clone(),
        },
        Series {
            name: "cell_allow",
            samples_ms: cells[2].clone(),
        },
    ]
    .into()
}
