// Mints an HS256 bearer token for the local stack.
// Usage: node scripts/lib/mint-token.mjs --secret S --sub NAME --tenant T [--days N] [--runner]
import { createHmac } from "node:crypto";

const args = process.argv.slice(2);
const opt = (name, fallback) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
};
const secret = opt("secret");
if (!secret) {
  console.error("mint-token: --secret is required");
  process.exit(2);
}
const days = Number(opt("days", "30"));
const claims = {
  sub: opt("sub", "dev"),
  tenant: opt("tenant", "dev"),
  exp: Math.floor(Date.now() / 1000) + Math.round(days * 86400),
};
if (args.includes("--runner")) claims.typ = "runner";
const b64 = (v) => Buffer.from(JSON.stringify(v)).toString("base64url");
const body = `${b64({ alg: "HS256", typ: "JWT" })}.${b64(claims)}`;
const sig = createHmac("sha256", secret).update(body).digest("base64url");
console.log(`${body}.${sig}`);
