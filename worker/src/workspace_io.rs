//! The workspace knowledge base in R2: `{tenant}/workspace/{path}`.
//! Rules (paths, sizes, frontmatter) live in `wuhu_core::workspace`.
//!
//! A document's parsed frontmatter is kept in the object's custom metadata (when small enough),
//! so a listing does not read every document.

use std::collections::HashMap;

use worker::{Bucket, Env, Include};
use wuhu_core::authority::{WorkspaceWriter, is_tenant_config};
use wuhu_core::llm::models::{ModelTable, ModelTableError, TENANT_TABLE_PATH};
use wuhu_core::llm::{self, anthropic, fake, openai};
use wuhu_core::policy::{Policy, is_policy_document};
use wuhu_core::tenant_config::{
    TENANT_CONFIG_PATH, TenantConfig, TenantConfigError, check_document,
};
use wuhu_core::workspace::{
    MAX_DOC_BYTES, normalize_doc_path, normalize_prefix, split_frontmatter,
};

use crate::http::{ApiError, ApiResult};

const BUCKET: &str = "ARCHIVE";
/// R2 custom metadata is limited to 2 KiB in all; frontmatter above this is read from the body.
const MAX_METADATA_FRONTMATTER: usize = 1500;

pub(crate) use wuhu_core::wire::{Doc, DocList, DocSummary};

fn root(tenant: &str) -> String {
    format!("{tenant}/workspace/")
}

fn bad_path(e: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("invalid workspace path: {e}"))
}

fn bucket(env: &Env) -> ApiResult<Bucket> {
    Ok(env.bucket(BUCKET)?)
}

/// Reads a document; `Ok(None)` when absent.
pub(crate) async fn read(env: &Env, tenant: &str, path: &str) -> ApiResult<Option<Doc>> {
    let path = normalize_doc_path(path).map_err(bad_path)?;
    let Some(object) = bucket(env)?
        .get(format!("{}{path}", root(tenant)))
        .execute()
        .await?
    else {
        return Ok(None);
    };
    let summary_base = (
        object.size(),
        object.uploaded().as_millis() / 1000,
        object.etag(),
    );
    let body = object
        .body()
        .ok_or_else(|| ApiError::internal("workspace object has no body"))?;
    let content = body.text().await?;
    let (frontmatter, body) = split_frontmatter(&content);
    let body = body.to_string();
    Ok(Some(Doc {
        summary: DocSummary {
            path,
            size: summary_base.0,
            updated: summary_base.1 as i64,
            version: summary_base.2,
            frontmatter: frontmatter.ok().flatten(),
        },
        content,
        body,
    }))
}

/// The normalised `path`, if `who` may change it (`users/<sub>/…` belongs to `<sub>` and
/// admins, `config/…` to admins); 403 otherwise. Every write and delete (API, tools, js) goes
/// through here.
fn writable_path(who: &WorkspaceWriter<'_>, path: &str) -> ApiResult<String> {
    let path = normalize_doc_path(path).map_err(bad_path)?;
    if !who.may_write(&path) {
        return Err(ApiError::new(403, "forbidden", who.refusal(&path)));
    }
    Ok(path)
}

/// The tenant's model table: the built-in one with `config/models.json` over it. The inner
/// error is an invalid document (shown, never replaced by the built-in table).
pub(crate) async fn model_table(
    env: &Env,
    tenant: &str,
) -> ApiResult<Result<ModelTable, ModelTableError>> {
    let doc = read(env, tenant, TENANT_TABLE_PATH).await?;
    Ok(ModelTable::with_tenant(
        doc.as_ref().map(|d| d.content.as_str()),
    ))
}

/// The tenant's settings (`config/tenant.json`); the inner error is an invalid document.
pub(crate) async fn tenant_config(
    env: &Env,
    tenant: &str,
) -> ApiResult<Result<TenantConfig, TenantConfigError>> {
    let doc = read(env, tenant, TENANT_CONFIG_PATH).await?;
    Ok(TenantConfig::parse(
        doc.as_ref().map(|d| d.content.as_str()),
    ))
}

/// Writes a document as `who`. Refuses more than 1 MiB (413), invalid frontmatter (400) and
/// another user's `users/<sub>/` (403).
pub(crate) async fn write(
    env: &Env,
    tenant: &str,
    who: &WorkspaceWriter<'_>,
    path: &str,
    content: &str,
) -> ApiResult<DocSummary> {
    let path = writable_path(who, path)?;
    if content.len() > MAX_DOC_BYTES {
        return Err(ApiError::new(
            413,
            "payload_too_large",
            format!("document exceeds {MAX_DOC_BYTES} bytes"),
        ));
    }
    if is_tenant_config(&path) {
        check_document(&path, content).map_err(ApiError::bad_request)?;
    } else if is_policy_document(&path) {
        // A user's policy is checked like the tenant's (`config/policy.json` above).
        Policy::parse(&path, Some(content)).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    let (frontmatter, _) = split_frontmatter(content);
    let frontmatter = frontmatter.map_err(ApiError::bad_request)?;
    let mut metadata = HashMap::new();
    if let Some(fm) = &frontmatter {
        let json = fm.to_string();
        if json.len() <= MAX_METADATA_FRONTMATTER {
            metadata.insert("frontmatter".to_string(), json);
        } else {
            metadata.insert("frontmatter-in-body".to_string(), "1".to_string());
        }
    }
    let object = bucket(env)?
        .put(
            format!("{}{path}", root(tenant)),
            content.as_bytes().to_vec(),
        )
        .custom_metadata(metadata)
        .execute()
        .await?
        .ok_or_else(|| ApiError::internal("workspace write was not stored"))?;
    settings_stored(env, tenant, &path).await?;
    Ok(DocSummary {
        path,
        size: object.size(),
        updated: (object.uploaded().as_millis() / 1000) as i64,
        version: object.etag(),
        frontmatter,
    })
}

/// Deletes a document as `who`; returns whether it existed.
pub(crate) async fn remove(
    env: &Env,
    tenant: &str,
    who: &WorkspaceWriter<'_>,
    path: &str,
) -> ApiResult<bool> {
    let path = writable_path(who, path)?;
    let key = format!("{}{path}", root(tenant));
    let bucket = bucket(env)?;
    if bucket.head(key.clone()).await?.is_none() {
        return Ok(false);
    }
    bucket.delete(key).await?;
    settings_stored(env, tenant, &path).await?;
    Ok(true)
}

/// After a document at `path` was stored or deleted: one under `config/` is answered only once
/// every session keeping a reading of the settings has forgotten it, so a step that starts
/// after the answer runs with the change (decision 0021). When some could not be told, the
/// writer learns it (503) and writing again tells them.
async fn settings_stored(env: &Env, tenant: &str, path: &str) -> ApiResult<()> {
    // A user's policy is read with the settings too (`crate::policy_book`).
    if !is_tenant_config(path) && !is_policy_document(path) {
        return Ok(());
    }
    // The index's `SettingsChanged` answers once every holder was told (503 when some could
    // not be). Called here, not through `tenant_index`, which reads the settings through this
    // module.
    let who = crate::identity::Identity::system(tenant);
    let call = wuhu_core::calls::index::SettingsChanged;
    crate::internal::call(&crate::internal::tenant_index(env, tenant)?, &who, &call)
        .await
        .map(|_| ())
        .map_err(|e| {
            ApiError::new(
                503,
                crate::internal::UNREACHABLE,
                format!(
                    "{path} was saved, but running sessions may still use the old settings: {}",
                    e.message
                ),
            )
        })
}

/// Lists documents under `prefix` (up to `limit`, from `cursor`).
pub(crate) async fn list(
    env: &Env,
    tenant: &str,
    prefix: &str,
    limit: u32,
    cursor: Option<String>,
) -> ApiResult<DocList> {
    let prefix = normalize_prefix(prefix).map_err(bad_path)?;
    let root = root(tenant);
    let bucket = bucket(env)?;
    let mut request = bucket
        .list()
        .prefix(format!("{root}{prefix}"))
        .limit(limit)
        .include(vec![Include::CustomMetadata]);
    let with_cursor = cursor.is_some();
    if let Some(cursor) = cursor {
        request = request.cursor(cursor);
    }
    let page = match request.execute().await {
        Ok(page) => page,
        // A cursor is opaque and comes from the client: one R2 does not know is bad input.
        Err(_) if with_cursor => {
            return Err(ApiError::bad_request(
                "invalid cursor: pass the cursor of the previous page",
            ));
        }
        Err(error) => return Err(error.into()),
    };
    let mut docs = Vec::new();
    for object in page.objects() {
        let metadata = object.custom_metadata().unwrap_or_default();
        let path = object
            .key()
            .strip_prefix(&root)
            .unwrap_or_default()
            .to_string();
        let mut frontmatter = metadata
            .get("frontmatter")
            .and_then(|j| serde_json::from_str(j).ok());
        if metadata.contains_key("frontmatter-in-body") {
            frontmatter = read(env, tenant, &path)
                .await?
                .and_then(|d| d.summary.frontmatter);
        }
        docs.push(DocSummary {
            path,
            size: object.size(),
            updated: (object.uploaded().as_millis() / 1000) as i64,
            version: object.etag(),
            frontmatter,
        });
    }
    let cursor = if page.truncated() {
        page.cursor()
    } else {
        None
    };
    Ok(DocList { docs, cursor })
}

/// The read-only documents under `wuhu://config/`: server settings without secrets, and the
/// model table in effect (the tenant's `config/models.json` over the built-in rows).
///
/// # Errors
/// The tenant's model table is invalid, or could not be read.
pub(crate) async fn config_doc(
    env: &Env,
    tenant: &str,
    path: &str,
) -> Result<Option<String>, String> {
    if path == "models.json" {
        let table = model_table(env, tenant)
            .await
            .map_err(|e| e.message)?
            .map_err(|e| e.to_string())?;
        return Ok(serde_json::to_string_pretty(&table.to_json()).ok());
    }
    if path != "server.json" {
        return Ok(None);
    }
    let var = |name: &str| env.var(name).ok().map(|v| v.to_string());
    let settings = serde_json::json!({
        "tenant": tenant,
        "providers": llm::PROVIDERS,
        // A session that names no provider: the tenant's default (config/tenant.json), else
        // this (null: such a session is refused).
        "defaultProvider": crate::model_choice::fake_enabled(env).then_some(fake::PROVIDER),
        "fakeProviderEnabled": crate::model_choice::fake_enabled(env),
        "openaiBaseUrl": var("OPENAI_BASE_URL").unwrap_or_else(|| openai::DEFAULT_BASE_URL.to_string()),
        "openaiKeyConfigured": env.secret("OPENAI_API_KEY").is_ok() || env.var("OPENAI_API_KEY").is_ok(),
        "anthropicBaseUrl": var("ANTHROPIC_BASE_URL").unwrap_or_else(|| anthropic::DEFAULT_BASE_URL.to_string()),
        "anthropicKeyConfigured": env.secret("ANTHROPIC_API_KEY").is_ok() || env.var("ANTHROPIC_API_KEY").is_ok(),
        "workspace": "wuhu://workspace/",
        "globalContext": "wuhu://workspace/users/<you>/context.md",
        "tenantSettings": format!("wuhu://workspace/{}", wuhu_core::tenant_config::TENANT_CONFIG_PATH),
    });
    Ok(serde_json::to_string_pretty(&settings).ok())
}

/// The global context a new session of `sub` starts with (seed 000): `users/<sub>/context.md`
/// for a person; for a chat guest (`<platform>:<id>`, decision 0035) the context of the binding
/// whose thread it is, `channels/<binding>/context.md` (`channel`), and none without one.
pub(crate) async fn global_context_for(
    env: &Env,
    tenant: &str,
    sub: &str,
    channel: Option<&str>,
) -> ApiResult<Option<wuhu_core::calls::session::GlobalContext>> {
    let path = if wuhu_core::authority::is_guest(sub) {
        match channel {
            Some(binding) => format!("{}context.md", wuhu_core::authority::guest_folder(binding)),
            None => return Ok(None),
        }
    } else {
        format!("users/{sub}/context.md")
    };
    if wuhu_core::workspace::normalize_doc_path(&path).is_err() {
        return Ok(None); // A name that is not a valid path segment has no context document.
    }
    Ok(read(env, tenant, &path)
        .await?
        .map(|doc| wuhu_core::calls::session::GlobalContext {
            path: doc.summary.path,
            version: doc.summary.version,
            content: doc.content,
        }))
}
