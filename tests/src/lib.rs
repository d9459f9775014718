//! # wuhu-e2e
//!
//! End-to-end tests of Wuhu on the real stack: the built Worker under `wrangler dev` on an
//! ephemeral port with a temp state dir, real HTTP and SSE, and local fake LLM servers that
//! speak the real wire formats. The tests live in `tests/`; this library is their harness.
//!
//! * [`Stack`]: starts wrangler (own process group, log captured, killed on drop or when the
//!   test process exits), restarts it on the same state after a SIGKILL, mints tokens.
//! * [`Api`]: a JSON client bound to one token; typed helpers for every route.
//! * [`net`]: the `reqwest` client and tokio runtime under [`Request`] and [`SseStream`].
//! * [`SseStream`]: reads a follow stream incrementally with read deadlines.
//! * [`FakeOpenAi`]: a fake LLM server scripted per model, recording requests; it speaks OpenAI
//!   Chat Completions, OpenAI Responses ([`fake_responses`]) and Anthropic Messages
//!   ([`fake_anthropic`]).
//! * [`drop_proxy::DropProxy`]: a TCP proxy that can cut every connection through it (dropped streams).
//! * [`FakeHttp`]: a plain HTTP server with fixed replies per path, recording requests (what
//!   the `js` tool's `fetch` reaches).
//! * [`cli`]: the real `wuhu` binary: one-shot runs in a private `HOME`, background runs, `tmux`
//!   for `wuhu chat`, and a TCP relay whose connections a test can cut.
//! * [`fake_imds::FakeImds`]: a local EC2 instance metadata service (IMDSv2) handing out
//!   temporary credentials, for the runner's credentials chain.
//! * [`moto::Moto`]: a local S3-compatible server (moto, installed by `ensure_moto`) for cloud
//!   workspaces.
//! * [`wait_until`] / [`wait_for`]: polling with deadlines instead of sleeps.
//! * [`access::AccessTeam`]: a Cloudflare Access team (key-set server, signed Access tokens).
//!
//! The harness needs `worker/build` (built by `scripts/test`) and wrangler from
//! `node_modules` (or `$WRANGLER_BIN`). Set `WUHU_E2E_KEEP=1` to keep every temp dir.

pub mod access;
pub mod api;
pub mod cli;
pub mod delay_proxy;
pub mod drop_proxy;
pub mod entries;
pub mod fake_anthropic;
pub mod fake_chat;
pub mod fake_gateway;
pub mod fake_http;
pub mod fake_imds;
pub mod fake_openai;
pub mod fake_responses;
pub mod fake_server;
pub mod http;
pub mod jwt;
pub mod mcp_servers;
pub mod moto;
pub mod net;
pub mod png;
pub mod runner;
pub mod socket;
pub mod sse;
pub mod stack;
pub mod util;

pub use api::Api;
pub use fake_http::{FakeHttp, HttpReply};
pub use fake_openai::{FakeOpenAi, RecordedRequest, Reply};
pub use fake_server::Gate;
pub use http::{Request, Response};
pub use sse::{FollowOpen, SseEvent, SseItem, SseStream};
pub use stack::{Stack, StackOptions, shared_fake_stack, shared_stack};
pub use util::{wait_for, wait_until};
