#!/usr/bin/env python3
"""Runs the workspace's test binaries in parallel lanes (scripts/test).

    test-lanes.py BINARIES.json [--lanes N] [--threads T]     (defaults: 2 lanes, 2 threads)

BINARIES.json is the output of `cargo test --no-run --message-format=json`: every test
executable it names runs as cargo would run it (in its package's directory, with
CARGO_MANIFEST_DIR and CARGO_PKG_NAME set, `--test-threads=T`), at most N at once. The
end-to-end binaries spend most of their time waiting on wrangler, runners and timers (the
2-core CI machine is two-thirds idle while one runs), and each starts its own stack on ephemeral
ports with its own state, so two run side by side without meeting.

A binary's output is printed whole when it ends (never interleaved), with its time; at the end,
the times of the slowest and every failure again. Exit status 1 when any binary failed (all of
them run: one failure must not hide the verdict on the others), 2 on bad input.

The slowest binaries start first (longest-first packs the lanes best); their names are kept in
SLOW_FIRST below, from the CI log's times. A binary not listed starts after them, in name order.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

# The slowest binaries of the last full runs, slowest first (seconds on the 2-core machine in
# brackets, 2026-11-29). Only an ordering hint: a missing or renamed one changes nothing else.
SLOW_FIRST = [
    "orchestration_restart",  # 78
    "runner_image",  # 68 with its image build, 8 cached
    "session_deletion",  # 66
    "channels",  # 52
    "follow",  # 50
    "cli",  # 42
    "socket",  # 39
    "restart",  # 39
    "discord_gateway",  # 36
    "web_app",  # 32
    "durability",  # 25
    "cloud_workspaces",  # 25
]


def binaries(path):
    found = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
                continue
            if not msg.get("profile", {}).get("test"):
                continue
            target = msg["target"]
            package_dir = os.path.dirname(msg["manifest_path"])
            package = msg["package_id"]
            # "path+file:///…/tests#wuhu-e2e@0.1.0" or "…#0.1.0" (name = the directory's).
            tail = package.rsplit("#", 1)[-1]
            name = tail.split("@", 1)[0] if "@" in tail else os.path.basename(package_dir)
            found.append(
                {
                    "name": target["name"],
                    "kind": target["kind"][0],
                    "src": os.path.relpath(target["src_path"], os.getcwd()),
                    "exe": msg["executable"],
                    "dir": package_dir,
                    "package": name,
                }
            )
    return found


def order(found):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    return sorted(found, key=lambda b: (rank.get(b["name"], len(rank)), b["package"], b["name"]))


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    path, lanes, threads = args[0], 2, 2
    rest = args[1:]
    while rest:
        flag = rest.pop(0)
        if flag in ("--lanes", "--threads") and rest:
            raw = rest.pop(0)
            value = int(raw) if raw.isdigit() else 0
            if value < 1:
                print(f"{flag} must be a whole number, at least 1 (not {raw!r})", file=sys.stderr)
                return 2
            if flag == "--lanes":
                lanes = value
            else:
                threads = value
        else:
            print(f"unknown argument {flag!r}", file=sys.stderr)
            return 2
    queue = order(binaries(path))
    if not queue:
        print(f"no test executables in {path}", file=sys.stderr)
        return 2
    total = len(queue)
    print(f"[lanes] {total} test binaries, {lanes} at once, --test-threads={threads}", flush=True)
    out_dir = tempfile.mkdtemp(prefix="wuhu-test-lanes-")
    running = {}  # pid -> (binary, Popen, log path, start)
    done = []  # (binary, seconds, code)
    started = time.monotonic()

    def stop_all(*_):
        for _, proc, _, _ in running.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        sys.exit(130)

    signal.signal(signal.SIGINT, stop_all)
    signal.signal(signal.SIGTERM, stop_all)

    def start(binary):
        log_path = os.path.join(out_dir, f"{binary['package']}-{binary['name']}-{len(done) + len(running)}.log")
        env = dict(os.environ)
        env["CARGO_MANIFEST_DIR"] = binary["dir"]
        env["CARGO_PKG_NAME"] = binary["package"]
        log = open(log_path, "wb")
        proc = subprocess.Popen(
            [binary["exe"], f"--test-threads={threads}"],
            cwd=binary["dir"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        running[proc.pid] = (binary, proc, log_path, time.monotonic())

    while queue or running:
        while queue and len(running) < lanes:
            start(queue.pop(0))
        pid, status = os.wait()
        if pid not in running:
            continue
        binary, proc, log_path, began = running.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - began
        code = proc.returncode
        # A test binary's own children (wrangler, runners) are killed by their harness; what
        # is left of its session would outlive it, so it goes too.
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        done.append((binary, seconds, code))
        verdict = "passed" if code == 0 else f"FAILED (exit {code})"
        print(
            f"\n[lanes] ===== {binary['src']} ({binary['package']}): {verdict} in {seconds:.1f} s "
            f"[{len(done)}/{total}, {time.monotonic() - started:.0f} s in] =====",
            flush=True,
        )
        with open(log_path, "rb") as f:
            sys.stdout.buffer.write(f.read())
        sys.stdout.flush()

    failed = [(b, s, c) for b, s, c in done if c != 0]
    print(f"\n[lanes] all {total} binaries ran in {time.monotonic() - started:.0f} s; the slowest:")
    for b, s, _ in sorted(done, key=lambda d: -d[1])[:10]:
        print(f"[lanes]   {s:6.1f} s  {b['src']}")
    if failed:
        print(f"[lanes] {len(failed)} failed:")
        for b, _, c in failed:
            which = {"lib": "--lib", "test": f"--test {b['name']}"}.get(b["kind"], f"--bin {b['name']}")
            print(f"[lanes]   {b['src']} (exit {c}); alone: cargo test -p {b['package']} {which}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
