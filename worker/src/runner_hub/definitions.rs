//! The runner listing, environment definitions (create, read, change, delete) and `Resolve`.
//! Who may name which runner and which runner a spec resolves to are `wuhu_core::resolve`'s
//! and `wuhu_core::authority`'s rules.

use worker::SqlStorage;
use wuhu_core::authority::{self, Principal};
use wuhu_core::hub;
use wuhu_core::resolve::{self, ResolveError, RunnerView};
use wuhu_core::wire::{
    CreateEnvironmentRequest, EnvironmentDefinition, ListEnvironmentsResponse, ListRunnersResponse,
    ResolveEnvironmentRequest, ResolveEnvironmentResponse, RunnerEnvironmentInfo, RunnerInfo,
    UpdateEnvironmentRequest,
};

use super::socket_state::now_ms;
use super::sockets::Sockets;
use super::store;
use crate::http::{ApiError, ApiResult};

/// `409` code of a definition past [`hub::MAX_DEFINITIONS_PER_OWNER`] or
/// [`hub::MAX_DEFINITIONS_PER_TENANT`].
const TOO_MANY_ENVIRONMENTS: &str = "too_many_environments";

/// The tenant's runners as resolution sees them (stored rows, with whether each is connected).
fn runner_views(sockets: &Sockets<'_>) -> ApiResult<Vec<RunnerView>> {
    let open = sockets.open();
    Ok(store::runners(sockets.sql)?
        .into_iter()
        .map(|row| {
            let connected = open
                .iter()
                .any(|(_, info)| info.serves(&row.owner, &row.name));
            RunnerView {
                kind: row.kind(),
                environments: row.environments(),
                capabilities: row.capabilities(),
                owner: row.owner,
                name: row.name,
                os: row.os,
                connected,
            }
        })
        .collect())
}

/// `GET /runners`.
pub(super) fn list_runners(sockets: &Sockets<'_>) -> ApiResult<ListRunnersResponse> {
    let open = sockets.open();
    sockets.purge_expired(now_ms(), &open)?;
    let runners = store::runners(sockets.sql)?
        .into_iter()
        .map(|row| {
            let live = open
                .iter()
                .filter(|(_, info)| info.serves(&row.owner, &row.name))
                .max_by_key(|(_, info)| info.epoch);
            let last_seen_ms = live.map_or(row.last_seen_ms, |(ws, info)| {
                sockets.last_seen_ms(ws, info).max(row.last_seen_ms)
            });
            let capabilities = row.capabilities();
            RunnerInfo {
                kind: row.kind(),
                sandbox: wuhu_core::wire::runner::capabilities::sandbox(&capabilities),
                capabilities,
                environments: row
                    .environments()
                    .into_iter()
                    .map(|e| RunnerEnvironmentInfo {
                        name: e.name,
                        path: e.path,
                    })
                    .collect(),
                connected: live.is_some(),
                last_seen: last_seen_ms / 1000,
                connected_at: live.map(|(_, info)| info.connected_at_ms / 1000),
                version: row.version.clone(),
                name: row.name.clone(),
                owner: row.owner.clone(),
                os: row.os.clone(),
                arch: row.arch.clone(),
            }
        })
        .collect();
    Ok(ListRunnersResponse { runners })
}

/// `Resolve`: which environment, on which runner, `sub`'s session gets for a spec.
pub(super) fn resolve(
    sockets: &Sockets<'_>,
    sub: &str,
    request: &ResolveEnvironmentRequest,
) -> ApiResult<ResolveEnvironmentResponse> {
    let definitions = store::definitions(sockets.sql)?;
    let runners = runner_views(sockets)?;
    let resolved = resolve::resolve(sub, request, &definitions, &runners).map_err(resolve_error)?;
    Ok(resolved)
}

/// `GET /environments`.
pub(super) fn list(sql: &SqlStorage) -> ApiResult<ListEnvironmentsResponse> {
    Ok(ListEnvironmentsResponse {
        environments: store::definitions(sql)?,
    })
}

/// The definition with this id or name, or 404.
pub(super) fn find(sql: &SqlStorage, key: &str) -> ApiResult<EnvironmentDefinition> {
    store::definition(sql, key)?
        .ok_or_else(|| ApiError::not_found(format!("no environment {key:?}")))
}

/// `POST /environments`.
pub(super) fn create(
    sockets: &Sockets<'_>,
    who: &Principal,
    request: CreateEnvironmentRequest,
) -> ApiResult<EnvironmentDefinition> {
    let id = uuid::Uuid::new_v4().to_string();
    let mut definition = request
        .into_definition(id, now_ms() / 1000)
        .map_err(ApiError::bad_request)?;
    definition.owner = Some(who.sub.clone());
    resolve::bind_runner(who, &mut definition, &runner_views(sockets)?).map_err(resolve_error)?;
    if store::name_taken(sockets.sql, &definition.name, &definition.id)? {
        return Err(name_conflict(&definition.name));
    }
    let existing = store::definitions(sockets.sql)?;
    hub::admit_definition(&who.sub, existing.iter().map(|d| d.owner.as_deref()))
        .map_err(|message| ApiError::new(409, TOO_MANY_ENVIRONMENTS, message))?;
    store::put_definition(sockets.sql, &definition)?;
    Ok(definition)
}

/// `PATCH /environments/:key`.
pub(super) fn update(
    sockets: &Sockets<'_>,
    who: &Principal,
    key: &str,
    update: UpdateEnvironmentRequest,
) -> ApiResult<EnvironmentDefinition> {
    let current = find(sockets.sql, key)?;
    check_may_edit(who, &current)?;
    let mut next = current
        .apply(update, now_ms() / 1000)
        .map_err(ApiError::bad_request)?;
    resolve::bind_runner(who, &mut next, &runner_views(sockets)?).map_err(resolve_error)?;
    if store::name_taken(sockets.sql, &next.name, &next.id)? {
        return Err(name_conflict(&next.name));
    }
    store::put_definition(sockets.sql, &next)?;
    Ok(next)
}

/// `DELETE /environments/:key`.
pub(super) fn delete(sql: &SqlStorage, who: &Principal, key: &str) -> ApiResult<()> {
    let definition = find(sql, key)?;
    check_may_edit(who, &definition)?;
    store::delete_definition(sql, &definition.id)?;
    Ok(())
}

/// 403 unless `who` owns the definition or is an admin (a definition without an owner, stored
/// before owners existed, is editable only by admins).
fn check_may_edit(who: &Principal, definition: &EnvironmentDefinition) -> ApiResult<()> {
    let owner = definition.owner.as_deref().unwrap_or_default();
    if authority::may_edit_definition(who, owner) {
        return Ok(());
    }
    let whose = match definition.owner.as_deref() {
        Some(owner) => format!("{owner:?}'s"),
        None => String::from("an unowned (legacy)"),
    };
    Err(ApiError::new(
        403,
        "forbidden",
        format!(
            "environment {:?} is {whose} definition; only its owner or an admin may change or delete it",
            definition.name
        ),
    ))
}

fn resolve_error(error: ResolveError) -> ApiError {
    ApiError::new(error.status(), error.code(), error.message)
}

fn name_conflict(name: &str) -> ApiError {
    ApiError::new(
        409,
        "conflict",
        format!("an environment named {name:?} already exists"),
    )
}
