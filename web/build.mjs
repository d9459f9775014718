// Builds the web app into web/dist (served by the Worker as static assets, see wrangler.toml):
// the files of web/public as they are, docs/openapi.json as v1/openapi.json, and web/src/main.tsx
// bundled with its CSS by esbuild.
// Usage: node web/build.mjs [--dev]  (--dev: no minification).
import { build } from "esbuild";
import { cpSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, "dist");
const dev = process.argv.includes("--dev");

rmSync(dist, { recursive: true, force: true });
mkdirSync(dist, { recursive: true });
cpSync(join(here, "public"), dist, { recursive: true });
// The API description, served by the Worker at /v1/openapi.json through its ASSETS binding
// (worker/src/lib.rs: kept out of the wasm, whose size is budgeted).
mkdirSync(join(dist, "v1"), { recursive: true });
cpSync(join(here, "../docs/openapi.json"), join(dist, "v1/openapi.json"));
await build({
  entryPoints: { app: join(here, "src/main.tsx") },
  outdir: dist,
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: !dev,
  sourcemap: "linked",
  legalComments: "linked",
  define: { "process.env.NODE_ENV": dev ? '"development"' : '"production"' },
  logLevel: "warning",
});
