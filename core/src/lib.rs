//! # wuhu-core
//!
//! Wire contracts and the sans-IO session logic of Wuhu. Nothing here performs I/O, reads a
//! clock or spawns a task: hosts (the Cloudflare Worker, tests) feed inputs in and perform the
//! effects that come out.
//!
//! * [`wire`]: every type that crosses a boundary: API bodies, transcript entries, SSE events.
//! * [`calls`]: the typed calls between Durable Objects, and the public routes that become them.
//! * [`session`]: the per-session state machine (lanes, agent loop, stop, retry, checkpoints).
//! * [`context`]: which transcript entries the LLM sees.
//! * [`llm`]: provider request building and stream decoding (`fake`, `openai-compatible`).
//! * [`tools`]: the tool catalogue and output truncation.
//! * [`archive`]: transcript segments in object storage and stitched reads.
//! * [`follow`]: the follow stream (backfill and live merge, bounds, idle points).
//! * [`sse`]: the one Server-Sent Events decoder (providers, clients).
//! * [`authority`]: who may do what inside a tenant.
//! * [`deletion`]: deleting a session: the forks rule, the order of the steps.
//! * [`channels`]: chat channels (Slack, …): bindings, hook signatures, threads, replies.
//! * [`approvals`]: when a tool call waits for a person, who may answer, and expiry.
//! * [`hub`]: the runner hub's connection rules (hello, name ownership, liveness).
//! * [`cell`]: what a session's commands and file tools may reach on a runner (paths, network,
//!   resource limits), and the macOS Seatbelt profile of it.
//! * [`resolve`]: which runner a definition may name; resolving `request_environment`.
//! * [`masking`]: secrets masked in any text: known values and their encodings, and a detector.
//! * [`snapshot_vars`]: which environment variables a snapshot may capture.
//! * [`tokens`]: tokens for programs, cookie sessions, revocation.
//! * [`access`]: Cloudflare Access identities and the team's key set.
//! * [`jwt`]: compact JWTs: HS256 signing and checks, RS256 parsing (the host verifies).
//! * [`browser`]: cross-site checks for cookie credentials, CORS.
//! * [`orchestration`]: child sessions: lineage, recursion guard, lifecycle, concurrency gate.
//! * [`lifecycle`]: a child's lifecycle outbox: durable, ordered, acknowledged delivery to its parent.
//! * [`jobs`]: background jobs: how a session concludes a job ended (or failed when its runner went away).
//! * [`images`]: image blobs: media type by magic bytes, pixel size, bounds.
//! * [`out_of_line`]: entries too large for a row, stored as objects behind a placeholder.
//! * [`rate_limits`]: which rate limits an action passes, under which keys.
//! * [`tenant_usage`]: usage of a whole tenant: session reports, hourly rows, grouped queries.
//! * [`text`]: titles and paths other people read: invisible characters cleaned or refused.
#![warn(missing_docs, unreachable_pub)]

pub mod access;
pub mod anchors;
pub mod approvals;
pub mod archive;
pub mod authority;
pub mod blobs;
pub mod bookkeeping;
pub mod browser;
pub mod calls;
pub mod cell;
pub mod channels;
pub mod civil_time;
pub mod compaction;
pub mod context;
pub mod deletion;
pub mod egress;
pub mod environments;
pub mod follow;
pub mod hub;
pub mod images;
pub mod jobs;
pub mod jwt;
pub mod lifecycle;
pub mod llm;
pub mod masking;
pub mod mcp;
pub mod mcp_client;
#[cfg(test)]
mod openapi;
pub mod orchestration;
pub mod out_of_line;
pub mod policy;
pub mod rate_limits;
pub mod resolve;
mod rng;
pub mod secrets;
pub mod session;
pub mod sigv4;
pub mod snapshot_vars;
pub mod socket;
pub mod sse;
pub mod tenant_config;
pub mod tenant_usage;
pub mod text;
pub mod tokens;
pub mod tool_output;
pub mod tools;
pub mod wire;
pub mod workspace;

pub use rng::SplitMix64;
