//! `masking`: what masking secrets costs per KiB of output (issue 32), in process, native
//! release code (the Worker runs the same code as wasm, slower by a small factor).
//!
//! Three realistic outputs of about 64 KiB each (a compiler's output, an `env` dump, a wrapped
//! base64 blob), each with a few known secrets in it (raw and base64), masked by a masker of 0,
//! 10 and 100 secrets of 40 characters (~1,000+ patterns at 100): `Masker::mask` over the whole
//! text, and `StreamMasker` fed the same text in 64-byte deltas. Samples are microseconds per
//! KiB of output, not milliseconds. Target: ≤ 50 µs per KiB with 100 secrets.

use std::time::Instant;

use serde_json::json;
use wuhu_core::masking::{Masker, StreamMasker};

use crate::{Config, Measured, Series};

/// The target of issue 32, µs per KiB with 100 secrets of 40 characters.
const TARGET_US_PER_KIB: f64 = 50.0;
/// Bytes of each output.
const OUTPUT_BYTES: usize = 64 * 1024;
/// Bytes per delta in the stream series.
const DELTA_BYTES: usize = 64;

/// A deterministic generator of secret-looking text.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn word(&mut self, len: usize, alphabet: &[u8]) -> String {
        (0..len)
            .map(|_| char::from(alphabet[self.next() as usize % alphabet.len()]))
            .collect()
    }
}

const BASE62: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
const BASE64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn secrets(n: usize) -> Vec<(String, String)> {
    let mut rng = Lcg(42);
    (0..n)
        .map(|i| (format!("SECRET_{i:03}"), rng.word(40, BASE62)))
        .collect()
}

/// `cargo build` output: compile lines, warnings with source snippets, paths with hashes.
fn compiler_output(secret: &str) -> String {
    let mut rng = Lcg(7);
    let mut out = String::new();
    let mut i = 0;
    while out.len() < OUTPUT_BYTES {
        let hash = rng.word(16, b"0123456789abcdef");
        out.push_str(&format!(
            "   Compiling crate-{i} v0.{i}.3 (/work/src/crate-{i})\n\
             warning: unused variable: `response_{i}`\n  \
             --> src/handlers/session_{i}.rs:{}:{}\n   |\n\
             {} |     let response_{i} = client.get(&url).header(\"x-request-id\", id).send()?;\n   \
             |         ^^^^^^^^^^ help: if this is intentional, prefix it with an underscore\n   |\n   \
             = note: `#[warn(unused_variables)]` on by default\n\
             /work/target/debug/deps/libcrate_{i}-{hash}.rlib\n",
            10 + i % 90,
            9 + i % 7,
            10 + i % 90,
        ));
        if i % 50 == 7 {
            out.push_str(&format!("error: request failed: token {secret} rejected\n"));
        }
        i += 1;
    }
    out
}

/// `env` output: paths, locales, ids, hashes, and a few credentials.
fn env_dump(secret: &str) -> String {
    let mut rng = Lcg(9);
    let mut out = String::new();
    let mut i = 0;
    while out.len() < OUTPUT_BYTES {
        let line = match i % 8 {
            0 => format!("PATH_{i}=/usr/local/bin:/usr/bin:/bin:/home/ana/.cargo/bin\n"),
            1 => format!("LANG_{i}=en_US.UTF-8\n"),
            2 => format!("GIT_COMMIT_{i}={}\n", rng.word(40, b"0123456789abcdef")),
            3 => format!(
                "RUN_ID_{i}={}-{}-4{}-8{}-{}\n",
                rng.word(8, b"0123456789abcdef"),
                rng.word(4, b"0123456789abcdef"),
                rng.word(3, b"0123456789abcdef"),
                rng.word(3, b"0123456789abcdef"),
                rng.word(12, b"0123456789abcdef")
            ),
            4 => format!("HOME_{i}=/home/ana\n"),
            5 => format!("NODE_OPTIONS_{i}=--max-old-space-size=4096\n"),
            6 if i % 40 == 6 => format!("API_TOKEN_{i}={secret}\n"),
            6 => format!("TERM_{i}=xterm-256color\n"),
            _ => format!("SERVICE_URL_{i}=https://api-{i}.internal.example.com:8443/v1\n"),
        };
        out.push_str(&line);
        i += 1;
    }
    out
}

/// `base64 file` output: 76-character lines, the secret's base64 inside.
fn base64_blob(secret_b64: &str) -> String {
    let mut rng = Lcg(11);
    let mut body = String::new();
    while body.len() < OUTPUT_BYTES {
        body.push_str(&rng.word(3000, BASE64));
        body.push_str(secret_b64);
    }
    let mut out = String::with_capacity(body.len() + body.len() / 76 + 1);
    for line in body.as_bytes().chunks(76) {
        out.push_str(std::str::from_utf8(line).expect("ASCII"));
        out.push('\n');
    }
    out
}

fn base64_of(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn us_per_kib(elapsed: std::time::Duration, bytes: usize) -> f64 {
    elapsed.as_secs_f64() * 1e6 / (bytes as f64 / 1024.0)
}

fn samples(config: &Config, bytes: usize, mut run: impl FnMut()) -> Vec<f64> {
    let mut out = Vec::with_capacity(config.turns);
    for i in 0..config.warmup + config.turns {
        let started = Instant::now();
        run();
        if i >= config.warmup {
            out.push(us_per_kib(started.elapsed(), bytes));
        }
    }
    out
}

pub(super) fn masking(config: &Config) -> Measured {
    let all = secrets(100);
    // The outputs carry secret 0 (known to every masker but the empty one).
    let secret = all[0].1.clone();
    let outputs = [
        ("compiler", compiler_output(&secret)),
        ("env", env_dump(&secret)),
        ("base64", base64_blob(&base64_of(&format!("{secret}\n")))),
    ];
    let mut series = Vec::new();
    let mut facts = Vec::new();
    const NAMES: [[&str; 4]; 3] = [
        ["all_0", "compiler_0", "env_0", "base64_0"],
        ["all_10", "compiler_10", "env_10", "base64_10"],
        ["all_100", "compiler_100", "env_100", "base64_100"],
    ];
    const STREAM: [&str; 3] = ["stream_0", "stream_10", "stream_100"];
    let whole: String = outputs.iter().map(|(_, text)| text.as_str()).collect();
    for (k, n) in [0, 10, 100].into_iter().enumerate() {
        let started = Instant::now();
        let masker = Masker::new(all[..n].iter().map(|(a, b)| (a.as_str(), b.as_str())));
        let built = started.elapsed();
        if n == 100 {
            facts.push((
                "build_100_secrets_ms",
                json!((built.as_secs_f64() * 1e6).round() / 1e3),
            ));
            facts.push(("longest_pattern_100", json!(masker.longest())));
            facts.push(("patterns_100", json!(masker.patterns())));
        }
        let masked = masker.mask(&whole);
        if n == 0 {
            // The detector alone: what it masks is the secret (a random word), nothing else.
            facts.push((
                "raw_secret_occurrences",
                json!(whole.matches(&secret).count()),
            ));
            facts.push(("detector_hits_0", json!(masked.matches("[secret]").count())));
        }
        if n > 0 {
            assert!(!masked.contains(&secret), "the secret is masked");
        }
        facts.push((
            ["masked_bytes_0", "masked_bytes_10", "masked_bytes_100"][k],
            json!(masked.len()),
        ));
        series.push(Series::new(
            NAMES[k][0],
            samples(config, whole.len(), || {
                std::hint::black_box(masker.mask(&whole));
            }),
        ));
        for (j, (_, text)) in outputs.iter().enumerate() {
            series.push(Series::new(
                NAMES[k][j + 1],
                samples(config, text.len(), || {
                    std::hint::black_box(masker.mask(text));
                }),
            ));
        }
        let streamed = samples(config, whole.len(), || {
            let mut stream = StreamMasker::new(masker.clone());
            let mut out = 0;
            let mut at = 0;
            while at < whole.len() {
                let end = (at + DELTA_BYTES).min(whole.len());
                out += stream.push(&whole[at..end]).len();
                at = end;
            }
            out += stream.finish().len();
            std::hint::black_box(out);
        });
        series.push(Series::new(STREAM[k], streamed));
    }
    // Headline first: all outputs, 100 secrets.
    series.rotate_left(10);
    let median = |s: &Series| {
        let mut v = s.samples_ms.clone();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let worst = series
        .iter()
        .filter(|s| s.name.ends_with("_100"))
        .map(median)
        .fold(0.0f64, f64::max);
    facts.push(("unit", json!("µs per KiB")));
    facts.push((
        "output_bytes",
        json!(outputs.iter().map(|(_, t)| t.len()).sum::<usize>()),
    ));
    facts.push(("target_us_per_kib", json!(TARGET_US_PER_KIB)));
    facts.push(("worst_median_100", json!((worst * 1000.0).round() / 1000.0)));
    facts.push(("under_target", json!(worst <= TARGET_US_PER_KIB)));
    Measured { series, facts }
}
