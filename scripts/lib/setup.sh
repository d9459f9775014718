#!/usr/bin/env bash
# Idempotent set-up shared by scripts/dev, scripts/test and scripts/bench.
# Installs what a brand-new machine lacks; skips what is already present at the
# right version. Slow `cargo install`s are cached outside the clone, keyed by
# version, under $WUHU_TOOL_CACHE (default ~/.cache/wuhu-tools).
set -euo pipefail

WUHU_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WUHU_TOOL_CACHE="${WUHU_TOOL_CACHE:-$HOME/.cache/wuhu-tools}"
WORKER_BUILD_VERSION="0.8.7"
export WUHU_ROOT WUHU_TOOL_CACHE

log() { printf '[setup] %s\n' "$*" >&2; }

# The wasm-bindgen CLI must equal the wasm-bindgen crate in Cargo.lock.
wasm_bindgen_version() {
  awk '/^name = "wasm-bindgen"$/ { getline; gsub(/version = |"/, ""); print; exit }' "$WUHU_ROOT/Cargo.lock" 2>/dev/null || true
}

ensure_wasm_target() {
  if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
    log "adding rust target wasm32-unknown-unknown"
    rustup target add wasm32-unknown-unknown >&2
  fi
}

# cargo_install_cached NAME VERSION BIN [extra cargo install args...]
cargo_install_cached() {
  local name="$1" version="$2" bin="$3"; shift 3
  local root="$WUHU_TOOL_CACHE/$name-$version"
  if [ ! -x "$root/bin/$bin" ]; then
    log "installing $name $version into $root (slow, once per machine)"
    mkdir -p "$WUHU_TOOL_CACHE"
    # Install into a temporary root, then rename, so an interrupted install is never mistaken for a finished one.
    rm -rf "$root.partial"
    cargo install "$name" --version "$version" --root "$root.partial" "$@" >&2
    rm -rf "$root" && mv "$root.partial" "$root"
  fi
  printf '%s\n' "$root/bin/$bin"
}

ensure_worker_tools() {
  ensure_wasm_target
  local wbv; wbv="$(wasm_bindgen_version)"
  if [ -z "$wbv" ]; then log "Cargo.lock has no wasm-bindgen entry"; exit 1; fi
  # wasm-bindgen-cli installs only without --locked (its lock wants a crate the index lacks).
  WASM_BINDGEN_BIN="$(cargo_install_cached wasm-bindgen-cli "$wbv" wasm-bindgen)"
  WORKER_BUILD_BIN="$(cargo_install_cached worker-build "$WORKER_BUILD_VERSION" worker-build --locked)"
  export WASM_BINDGEN_BIN WORKER_BUILD_BIN
}

ensure_npm_packages() {
  local stamp="$WUHU_ROOT/node_modules/.wuhu-lock-hash"
  local want; want="$(sha256sum "$WUHU_ROOT/package-lock.json" | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing npm packages (wrangler, binaryen)"
    (cd "$WUHU_ROOT" && npm ci --no-audit --no-fund --loglevel=error >&2)
    printf '%s\n' "$want" > "$stamp"
  fi
  WASM_OPT_BIN="$WUHU_ROOT/node_modules/binaryen/bin/wasm-opt"
  ESBUILD_BIN="$(ls "$WUHU_ROOT"/node_modules/@esbuild/linux-x64/bin/esbuild 2>/dev/null | head -1)"
  WRANGLER_BIN="$WUHU_ROOT/node_modules/.bin/wrangler"
  export WASM_OPT_BIN ESBUILD_BIN WRANGLER_BIN
}

# clang with the wasm32 target, for rquickjs (C) inside the Worker's wasm.
ensure_clang() {
  if ! command -v clang >/dev/null 2>&1; then
    log "installing clang (apt)"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq clang >&2
  fi
}

# tmux, for the end-to-end test that drives `wuhu chat` in a terminal (tests/tests/cli.rs).
ensure_tmux() {
  if ! command -v tmux >/dev/null 2>&1; then
    log "installing tmux (apt)"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq tmux >&2
  fi
}

# Builds the js sandbox's own wasm module (sandbox-guest/, QuickJS inside) into
# worker/build/sandbox_guest.wasm, which worker/entry.mjs imports. Plain cargo for
# wasm32-unknown-unknown: no wasm-bindgen, no network. Run after worker-build, which replaces
# only the entries it produces in worker/build.
build_sandbox_guest() {
  ensure_clang
  ensure_wasm_target
  log "building the js sandbox module (release)"
  (cd "$WUHU_ROOT" && cargo build --release -p wuhu-sandbox-guest --target wasm32-unknown-unknown >&2)
  local target_dir
  target_dir="$(cd "$WUHU_ROOT" && cargo metadata --format-version 1 --no-deps \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
  local built="$target_dir/wasm32-unknown-unknown/release/wuhu_sandbox_guest.wasm"
  local out="$WUHU_ROOT/worker/build/sandbox_guest.wasm"
  if [ ! -f "$built" ]; then log "missing $built after the build"; exit 1; fi
  mkdir -p "$WUHU_ROOT/worker/build"
  # wasm-opt -Oz (binaryen from package.json, as worker-build uses) takes the module from about
  # 400 KB to 340 KB gzipped; it runs only when cargo produced a new module (a stamp holds the
  # input's hash), and writes through a temporary name so a running `wrangler dev` never sees
  # half a file. Features: rustc's wasm32-unknown-unknown defaults.
  local stamp="$out.input-sha256" want
  want="$(sha256sum "$built" | cut -d' ' -f1)"
  if [ ! -f "$out" ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    ensure_npm_packages
    log "optimising the js sandbox module (wasm-opt -Oz)"
    "$WASM_OPT_BIN" -Oz --enable-bulk-memory --enable-sign-ext --enable-mutable-globals \
      --enable-nontrapping-float-to-int --enable-reference-types --enable-multivalue \
      "$built" -o "$out.partial" >&2
    mv -f "$out.partial" "$out"
    printf '%s\n' "$want" > "$stamp"
  fi
}

# Builds the web app into web/dist (the Worker's static assets; wrangler refuses to start
# without that directory). Quick: one esbuild bundle.
build_web() {
  ensure_npm_packages
  log "building the web app"
  (cd "$WUHU_ROOT" && node web/build.mjs >&2)
}

# Type-checks the web app (esbuild only strips types).
check_web() {
  ensure_npm_packages
  log "type-checking the web app"
  (cd "$WUHU_ROOT" && node_modules/.bin/tsc -p web --noEmit >&2)
}

# Debian's Chromium for the browser tests (tests/tests/web_app.rs); playwright-core comes from
# package.json and drives it. Never a browser download of Playwright's own.
ensure_chromium() {
  if [ ! -x /usr/bin/chromium ]; then
    log "installing chromium (apt)"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq chromium >&2
  fi
  export WUHU_CHROMIUM="${WUHU_CHROMIUM:-/usr/bin/chromium}"
}

# schemathesis (PyPI) in its own virtualenv under $WUHU_TOOL_CACHE, pinned; sets SCHEMATHESIS_BIN.
# It fuzzes the OpenAPI document against a running stack (scripts/test, run_schemathesis).
SCHEMATHESIS_VERSION="4.32.5"
ensure_schemathesis() {
  local root="$WUHU_TOOL_CACHE/schemathesis-$SCHEMATHESIS_VERSION"
  # A virtualenv's scripts name its own path, so it is built where it stays; the stamp, written
  # last, tells a finished install from an interrupted one.
  if [ ! -f "$root/.wuhu-installed" ]; then
    log "installing schemathesis $SCHEMATHESIS_VERSION into $root (once per machine)"
    rm -rf "$root"
    mkdir -p "$WUHU_TOOL_CACHE"
    python3 -m venv "$root" >&2
    "$root/bin/pip" install --quiet --disable-pip-version-check \
      "schemathesis==$SCHEMATHESIS_VERSION" >&2
    touch "$root/.wuhu-installed"
  fi
  SCHEMATHESIS_BIN="$root/bin/schemathesis"
  export SCHEMATHESIS_BIN
}

# moto (PyPI) in its own virtualenv under $WUHU_TOOL_CACHE, pinned; sets MOTO_SERVER_BIN. It is
# the S3-compatible server the cloud-workspace e2e tests (tests/tests/cloud_workspaces.rs) start
# on an ephemeral port: in memory, conditional puts atomic under races, no auth check
# (docs/decisions/0014-cloud-workspaces-on-object-storage.md).
MOTO_VERSION="5.2.5"
ensure_moto() {
  local root="$WUHU_TOOL_CACHE/moto-$MOTO_VERSION"
  if [ ! -f "$root/.wuhu-installed" ]; then
    log "installing moto $MOTO_VERSION into $root (once per machine)"
    rm -rf "$root"
    mkdir -p "$WUHU_TOOL_CACHE"
    python3 -m venv "$root" >&2
    "$root/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$MOTO_VERSION" >&2
    touch "$root/.wuhu-installed"
  fi
  MOTO_SERVER_BIN="$root/bin/moto_server"
  export MOTO_SERVER_BIN
}

# Builds the Worker (release) into worker/build: worker-build's output and the sandbox module;
# and the web app it serves (web/dist). Skipped when the build's inputs did not change: their
# content hash (scripts/lib/worker-inputs.mjs: the crates the two wasm builds compile, Cargo.lock,
# web/, package-lock.json, this recipe, the toolchain and tool versions) is kept beside the build
# in worker/build/.inputs-sha256. A finished build is also kept in the tool cache under that hash
# (the newest WUHU_WORKER_BUILDS_KEPT, default 4), so another checkout of the same sources, such
# as CI's fresh clone of a tree already built here, copies it instead of building. Concurrent
# callers (scripts/dev, scripts/test, the e2e harness) take turns on a lock.
build_worker() {
  mkdir -p "$WUHU_ROOT/target"
  if command -v flock >/dev/null 2>&1; then
    # The lock is released when this subshell's descriptor closes.
    ( flock 9; build_worker_locked ) 9>"$WUHU_ROOT/target/.wuhu-worker-build.lock"
  else
    build_worker_locked
  fi
  # The locked part ran in a subshell: export the tools' paths here (npm is up to date now).
  ensure_npm_packages
}

# The hash of the Worker build's inputs (see build_worker).
worker_inputs_hash() {
  local rustc_version
  rustc_version="$(rustc -vV 2>/dev/null | tr '\n' ' ')"
  node "$WUHU_ROOT/scripts/lib/worker-inputs.mjs" "rustc $rustc_version" \
    "worker-build $WORKER_BUILD_VERSION" "wasm-bindgen $(wasm_bindgen_version)" "$@"
}

build_worker_locked() {
  # npm ci replaces node_modules: inside the lock, so no other caller runs wrangler meanwhile.
  ensure_npm_packages
  local want stamp="$WUHU_ROOT/worker/build/.inputs-sha256"
  want="$(worker_inputs_hash)"
  local outputs=("$WUHU_ROOT/worker/build/index.js" "$WUHU_ROOT/worker/build/index_bg.wasm"
    "$WUHU_ROOT/worker/build/sandbox_guest.wasm" "$WUHU_ROOT/web/dist/index.html")
  local present=1 f
  for f in "${outputs[@]}"; do [ -f "$f" ] || present=0; done
  if [ "$present" = 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    log "the worker is up to date (inputs ${want:0:12}; worker/build/.inputs-sha256)"
    return
  fi
  local cached="$WUHU_TOOL_CACHE/worker-builds/$want"
  if [ -f "$cached/.complete" ]; then
    log "the worker's inputs were built before: copying $cached"
    rm -rf "$WUHU_ROOT/worker/build" "$WUHU_ROOT/web/dist"
    mkdir -p "$WUHU_ROOT/worker" "$WUHU_ROOT/web"
    cp -a "$cached/build" "$WUHU_ROOT/worker/build"
    cp -a "$cached/dist" "$WUHU_ROOT/web/dist"
    touch "$cached"
    printf '%s\n' "$want" > "$stamp"
    return
  fi
  ensure_clang
  ensure_worker_tools
  rm -f "$stamp"
  build_web
  log "building the worker (release, opt-level z)"
  # Size over speed for the Worker's wasm (decision 0030): 12 % smaller gzipped and quicker to
  # start, for about 10 % more CPU on a turn's path. Only this build: the runner, the CLI and
  # the benchmarks keep the workspace's release profile.
  (cd "$WUHU_ROOT/worker" && CARGO_PROFILE_RELEASE_OPT_LEVEL=z "$WORKER_BUILD_BIN" --release >&2)
  strip_worker_names
  build_sandbox_guest
  printf '%s\n' "$want" > "$stamp"
  # Kept for other checkouts of the same sources; written under a temporary name, so an
  # interrupted copy is never taken for a finished one.
  local builds="$WUHU_TOOL_CACHE/worker-builds"
  mkdir -p "$builds"
  rm -rf "$cached.partial"
  mkdir -p "$cached.partial"
  cp -a "$WUHU_ROOT/worker/build" "$cached.partial/build"
  cp -a "$WUHU_ROOT/web/dist" "$cached.partial/dist"
  touch "$cached.partial/.complete"
  rm -rf "$cached" && mv "$cached.partial" "$cached"
  # The newest few stay (about 3 MB each).
  ls -1t "$builds" | grep -v '\.partial$' | tail -n +"$((${WUHU_WORKER_BUILDS_KEPT:-4} + 1))" \
    | while read -r old; do rm -rf "${builds:?}/$old"; done
}

# worker-build keeps the wasm "name" section (wasm-opt --debuginfo), which is 11 % of the
# Worker's compressed size (about 88 KB of 1.1 MB gzip) and only feeds stack traces: a panic's
# message and file:line reach the log without it. Dropped by default to keep the bundle under
# its budget (docs/benchmarks.md); WUHU_WASM_NAMES=1 keeps it for a debugging build.
# The same pass optimises once more at -O3 (worker-build's own pass is -O): a second pass finds
# about 6.6 KB gzip more than one (-O3 alone instead of -O: 1.5 KB), about 20 s of build time.
strip_worker_names() {
  if [ "${WUHU_WASM_NAMES:-0}" = 1 ]; then
    log "keeping the worker's wasm name section (WUHU_WASM_NAMES=1)"
    return
  fi
  local wasm="$WUHU_ROOT/worker/build/index_bg.wasm"
  "$WASM_OPT_BIN" -O3 --strip-debug --strip-producers --enable-mutable-globals --enable-sign-ext \
    --enable-nontrapping-float-to-int --enable-bulk-memory --enable-multivalue \
    --enable-reference-types --enable-exception-handling "$wasm" -o "$wasm.partial" >&2
  mv -f "$wasm.partial" "$wasm"
}

export WRANGLER_SEND_METRICS=false
export CLOUDFLARE_CF_FETCH_ENABLED=false
