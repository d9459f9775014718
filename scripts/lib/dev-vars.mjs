// Reads one value from a `.dev.vars` file exactly as `wrangler dev` reads that file: with
// `dotenv.parse` of the dotenv version wrangler bundles (package.json pins the same one; the
// dev_script e2e test checks that they agree). So quotes, `export`, comments, CRLF line ends and
// repeated keys (the last wins) mean to scripts/dev what they mean to the Worker, and the token
// scripts/dev mints from WUHU_JWT_SECRET is signed with the secret the Worker checks.
//
// Usage: node scripts/lib/dev-vars.mjs FILE NAME [--bytes]
// Prints the value (with --bytes: its length in UTF-8 bytes) and exits 0; exits 3 when the file
// or the name is missing (nothing printed). Never prints anything else: the value is a secret.
// scripts/lib/mint-token.mjs --dev-vars FILE reads the secret the same way.
import { readFileSync } from "node:fs";
import dotenv from "dotenv";

const bytes = process.argv.includes("--bytes");
const [file, name] = process.argv.slice(2).filter((a) => a !== "--bytes");
if (!file || !name) {
  console.error("usage: node scripts/lib/dev-vars.mjs FILE NAME");
  process.exit(2);
}
let text;
try {
  text = readFileSync(file);
} catch (e) {
  if (e.code === "ENOENT") process.exit(3);
  throw e;
}
const parsed = dotenv.parse(text);
if (!Object.hasOwn(parsed, name)) process.exit(3);
process.stdout.write(bytes ? `${Buffer.byteLength(parsed[name])}\n` : parsed[name]);
