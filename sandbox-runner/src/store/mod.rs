//! Cloud workspaces on S3-compatible storage (`--store s3://BUCKET/PREFIX`).
//!
//! A runner with a store hydrates each `folder-template` environment from the session's stored
//! workspace (else copies the template), saves it back incrementally on detach, every
//! `--store-save-interval` seconds and before it exits, and deletes its local copy after a
//! detach. Layout, lease and skip rules: `docs/decisions/0014-cloud-workspaces-on-object-storage.md`.
//!
//! * [`rules`]: the decisions, without I/O (keys, skip rules, manifest diff, lease, when to
//!   refresh credentials).
//! * [`credentials`]: the AWS credentials chain (`aws-config`), cached and refreshed.
//! * [`s3`]: signed S3 requests (rusty-s3 signs, reqwest sends).
//! * [`sync`]: the effects (scan, upload, download, sidecar files, log lines).

pub mod credentials;
pub mod rules;
pub mod s3;
pub mod sync;

pub use sync::{SaveReport, Store, StoreConfig, spawn_interval_saves};
