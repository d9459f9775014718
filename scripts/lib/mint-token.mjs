// Mints an HS256 bearer token for the local stack.
// Usage: node scripts/lib/mint-token.mjs --secret S --sub NAME --tenant T [--days N]
//   (or the secret in WUHU_JWT_SECRET, which keeps it out of `ps`, or --dev-vars FILE: the
//   WUHU_JWT_SECRET of a .dev.vars file, read as `wrangler dev` reads it, see dev-vars.mjs)
//          [--role admin|member] [--runner [--runner-kind local|cloud]]
// A runner token with --runner-kind cloud may serve every member of the tenant: mint it only for
// a machine the tenant's operators run (docs/security.md).
import { createHmac } from "node:crypto";
import { readFileSync } from "node:fs";

const args = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
};
const devVars = opt("dev-vars");
const secret = devVars !== undefined
  ? (await import("dotenv")).default.parse(readFileSync(devVars)).WUHU_JWT_SECRET
  : opt("secret") ?? process.env.WUHU_JWT_SECRET;
if (!secret) {
  console.error(devVars !== undefined
    ? `mint-token: ${devVars} has no WUHU_JWT_SECRET`
    : "mint-token: --secret (or WUHU_JWT_SECRET, or --dev-vars FILE) is required");
  process.exit(2);
}
const days = Number(opt("days", "30"));
const claims = {
  sub: opt("sub", "dev"),
  tenant: opt("tenant", "dev"),
  exp: Math.floor(Date.now() / 1000) + Math.round(days * 86400),
};
const role = opt("role");
if (role !== undefined) {
  if (role !== "admin" && role !== "member") {
    console.error("mint-token: --role must be admin or member");
    process.exit(2);
  }
  claims.role = role;
}
const runnerKind = opt("runner-kind");
if (args.includes("--runner") || runnerKind !== undefined) claims.typ = "runner";
if (runnerKind !== undefined) {
  if (runnerKind !== "local" && runnerKind !== "cloud") {
    console.error("mint-token: --runner-kind must be local or cloud");
    process.exit(2);
  }
  claims.runnerKind = runnerKind;
}
if (Buffer.byteLength(secret) < 32) {
  console.error("mint-token: warning: the server refuses secrets shorter than 32 bytes");
}
const b64 = (v) => Buffer.from(JSON.stringify(v)).toString("base64url");
const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64(claims)}`;
const sig = createHmac("sha256", secret).update(body).digest("base64url");
console.log(`${body}.${sig}`);
