// Prints the content hash of everything the Worker build (build_worker in scripts/lib/setup.sh)
// reads, so a build whose inputs did not change can be skipped (the hash is kept beside the build
// in worker/build/.inputs-sha256) or restored from the tool cache.
//
// Usage: node scripts/lib/worker-inputs.mjs [--explain] [EXTRA...]
//   EXTRA: further strings that decide the output (tool versions, the toolchain's `rustc -vV`),
//   passed by setup.sh.
//   --explain: also print, on stderr, each input's path and hash (to see why a build ran).
//
// The inputs: every crate the two wasm builds compile from this repository (wuhu-worker and
// wuhu-sandbox-guest with the closure of their path dependencies, read from `cargo metadata`, so
// a new workspace crate the Worker starts to use is covered without editing this file), the web
// app's sources (web/, and docs/openapi.json, which it serves), Cargo.toml, Cargo.lock,
// package-lock.json (wrangler, binaryen, esbuild), .cargo/config.toml, the build recipe (setup.sh
// passes its build functions' text as an extra) and the environment variables that change the
// build. Files are what git sees (tracked
// and untracked, not ignored: build outputs and node_modules are ignored); outside a git
// checkout, a walk that skips the usual output directories.
import { createHash } from "node:crypto";
import { execFileSync } from "node:child_process";
import { readFileSync, readdirSync, statSync, existsSync } from "node:fs";
import { join, relative, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const args = process.argv.slice(2);
const explain = args.includes("--explain");
const extras = args.filter((a) => a !== "--explain");

const metadata = JSON.parse(
  execFileSync("cargo", ["metadata", "--no-deps", "--format-version", "1", "--offline"], {
    cwd: root,
    encoding: "utf8",
    maxBuffer: 64 * 1024 * 1024,
  }),
);
const byName = new Map(metadata.packages.map((p) => [p.name, p]));
const crateDirs = new Set();
const pending = ["wuhu-worker", "wuhu-sandbox-guest"];
while (pending.length > 0) {
  const name = pending.pop();
  const pkg = byName.get(name);
  if (!pkg) throw new Error(`worker-inputs: no workspace package ${name}`);
  const dir = relative(root, dirname(pkg.manifest_path)) || ".";
  if (crateDirs.has(dir)) continue;
  crateDirs.add(dir);
  for (const dep of pkg.dependencies) {
    if (dep.path) pending.push(dep.name);
  }
}

const paths = [...crateDirs, "web", "docs/openapi.json", "Cargo.toml", "Cargo.lock", "package-lock.json",
  ".cargo/config.toml"];

// Output directories that live inside the input directories.
const skipped = new Set(["target", "node_modules", "build", "dist", ".wrangler", ".state"]);
function walk(path, out) {
  const full = join(root, path);
  if (!existsSync(full)) return;
  if (statSync(full).isDirectory()) {
    for (const name of readdirSync(full).sort()) {
      if (!skipped.has(name)) walk(join(path, name), out);
    }
  } else {
    out.push(path);
  }
}

let files;
try {
  const listed = execFileSync(
    "git",
    ["ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ...paths],
    { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"], maxBuffer: 64 * 1024 * 1024 },
  );
  files = [...new Set(listed.split("\0").filter(Boolean))].sort();
} catch {
  files = [];
  for (const path of paths) walk(path, files);
  files.sort();
}

const hash = createHash("sha256");
const feed = (label, value) => {
  hash.update(`${label}\0${value}\0`);
  if (explain) process.stderr.write(`${label} ${value}\n`);
};
for (const file of files) {
  let digest;
  try {
    const st = statSync(join(root, file));
    const content = readFileSync(join(root, file));
    digest = `${st.mode & 0o111 ? "x" : "-"}${createHash("sha256").update(content).digest("hex")}`;
  } catch {
    // Tracked but deleted in the work tree: its absence is an input too.
    digest = "missing";
  }
  feed(file, digest);
}
for (const name of ["WUHU_WASM_NAMES", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS",
  "CARGO_PROFILE_RELEASE_OPT_LEVEL", "CARGO_PROFILE_RELEASE_LTO", "CARGO_PROFILE_RELEASE_DEBUG"]) {
  feed(`env ${name}`, process.env[name] ?? "");
}
extras.forEach((extra, i) => feed(`extra ${i}`, extra));
console.log(hash.digest("hex"));
