// Builds the web app into web/dist (served by the Worker as static assets, see wrangler.toml):
// the files of web/public as they are, and web/src/main.tsx bundled with its CSS by esbuild.
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
