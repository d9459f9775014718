//! Workspace documents (`/v1/workspace/docs`) and the small answers of session commands
//! (approvals, cancel). **API Boundary**.

use serde::{Deserialize, Serialize};

/// A document as listed (`GET /v1/workspace/docs`) and as a write answers it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DocSummary {
    /// Normalised relative path.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Unix seconds of the last write.
    pub updated: i64,
    /// Changes whenever the content does (the object's etag).
    pub version: String,
    /// Parsed YAML frontmatter, when the document has one.
    pub frontmatter: Option<serde_json::Value>,
}

/// A whole document (`GET /v1/workspace/docs/{path}`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Doc {
    /// Path, size, version and frontmatter.
    #[serde(flatten)]
    pub summary: DocSummary,
    /// The whole text, frontmatter included.
    pub content: String,
    /// The text after the frontmatter.
    pub body: String,
}

/// A listing page.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DocList {
    /// Documents of this page, by path.
    pub docs: Vec<DocSummary>,
    /// Pass as `cursor` for the next page; `null` on the last one.
    pub cursor: Option<String>,
}

/// `POST /v1/sessions/:id/approvals/:approvalId`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AnswerApprovalRequest {
    /// The answer.
    pub decision: crate::approvals::Answer,
}

/// Reply to [`AnswerApprovalRequest`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AnswerApprovalResponse {
    /// The approval answered.
    pub approval_id: String,
    /// The decision recorded.
    pub decision: crate::approvals::Answer,
}

/// Reply to `POST /v1/sessions/:id/cancel`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct CancelResponse {
    /// The queue item.
    pub id: String,
    /// Always `true` (failures are errors).
    pub cancelled: bool,
}
