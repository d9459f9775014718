//! The tenant's secrets, sealed (`wuhu_core::secrets`): set, deleted and listed by people,
//! read sealed by sessions. A change is told to every settings holder before it is answered
//! (as a change under `config/` is), so no session keeps using a deleted or replaced value past
//! its current step.

use serde::Deserialize;
use wuhu_core::calls::index::{DeleteSecret, PutSecret};
use wuhu_core::secrets::{self, SealedSecret, SecretInfo, SecretList, SecretScope};

use super::{TenantIndex, every_holder_told};
use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};

#[derive(Deserialize)]
struct Row {
    info: String,
    sealed: String,
}

#[derive(Deserialize)]
struct Count {
    n: f64,
}

impl TenantIndex {
    fn rows(&self) -> ApiResult<Vec<SealedSecret>> {
        let rows: Vec<Row> = self
            .sql
            .exec(
                "SELECT info, sealed FROM secrets ORDER BY scope, owner, name",
                None,
            )?
            .to_array()?;
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                let info: SecretInfo = serde_json::from_str(&row.info).ok()?;
                Some(SealedSecret {
                    info,
                    sealed: row.sealed,
                })
            })
            .collect())
    }

    fn store_secret(&self, secret: &SealedSecret) -> ApiResult<()> {
        let info =
            serde_json::to_string(&secret.info).map_err(|e| ApiError::internal(e.to_string()))?;
        self.sql.exec(
            "INSERT INTO secrets (scope, owner, name, info, sealed) VALUES (?, ?, ?, ?, ?) \
             ON CONFLICT (scope, owner, name) DO UPDATE SET info = excluded.info, sealed = excluded.sealed",
            vec![
                secret.info.scope.as_str().into(),
                secret.info.owner.clone().unwrap_or_default().into(),
                secret.info.name.clone().into(),
                info.into(),
                secret.sealed.clone().into(),
            ],
        )?;
        Ok(())
    }

    /// `PUT /v1/secrets/:name`.
    pub(super) async fn put_secret(
        &self,
        who: &Identity,
        call: &PutSecret,
    ) -> ApiResult<SecretInfo> {
        let principal = who.principal();
        let request = &call.request;
        secrets::may_write(&principal, request.scope)
            .map_err(|m| ApiError::new(403, "forbidden", m))?;
        let owner = (request.scope == SecretScope::User).then(|| who.sub.clone());
        let exists: Vec<Count> = self
            .sql
            .exec(
                "SELECT COUNT(*) AS n FROM secrets WHERE scope = ? AND owner = ? AND name = ?",
                vec![
                    request.scope.as_str().into(),
                    owner.clone().unwrap_or_default().into(),
                    call.name.clone().into(),
                ],
            )?
            .to_array()?;
        if exists.first().is_none_or(|c| c.n == 0.0) {
            let all: Vec<Count> = self
                .sql
                .exec("SELECT COUNT(*) AS n FROM secrets", None)?
                .to_array()?;
            if all
                .first()
                .is_some_and(|c| c.n as usize >= secrets::MAX_SECRETS_PER_TENANT)
            {
                return Err(ApiError::new(
                    409,
                    "too_many_secrets",
                    format!(
                        "the tenant keeps at most {} secrets; delete one first",
                        secrets::MAX_SECRETS_PER_TENANT
                    ),
                ));
            }
        }
        let keys = crate::secrets::keys(&self.env)?;
        let info = SecretInfo {
            name: call.name.clone(),
            scope: request.scope,
            owner: owner.clone(),
            hosts: request.hosts.clone(),
            environments: request.environments.clone(),
            set_by: who.sub.clone(),
            set_at: worker::Date::now().as_millis() as i64 / 1000,
        };
        let aad = secrets::aad(&who.tenant, request.scope, owner.as_deref(), &call.name);
        let sealed = keys.seal(&aad, crate::secrets::nonce()?, &request.value);
        self.store_secret(&SealedSecret {
            info: info.clone(),
            sealed,
        })?;
        let failed = self.tell_settings_changed(&who.tenant).await?;
        every_holder_told(failed, |failed| {
            format!(
                "the secret was stored, but {failed} running session(s) of the tenant could not be told of it; put it again"
            )
        })?;
        Ok(info)
    }

    /// `DELETE /v1/secrets/:name?scope=`.
    pub(super) async fn delete_secret(&self, who: &Identity, call: &DeleteSecret) -> ApiResult<()> {
        secrets::may_write(&who.principal(), call.scope)
            .map_err(|m| ApiError::new(403, "forbidden", m))?;
        let owner = match call.scope {
            SecretScope::User => who.sub.clone(),
            SecretScope::Tenant => String::new(),
        };
        let exists: Vec<Count> = self
            .sql
            .exec(
                "SELECT COUNT(*) AS n FROM secrets WHERE scope = ? AND owner = ? AND name = ?",
                vec![
                    call.scope.as_str().into(),
                    owner.clone().into(),
                    call.name.clone().into(),
                ],
            )?
            .to_array()?;
        if exists.first().is_none_or(|c| c.n == 0.0) {
            return Err(ApiError::new(
                404,
                "not_found",
                format!("no {} secret named {}", call.scope.as_str(), call.name),
            ));
        }
        self.sql.exec(
            "DELETE FROM secrets WHERE scope = ? AND owner = ? AND name = ?",
            vec![
                call.scope.as_str().into(),
                owner.into(),
                call.name.clone().into(),
            ],
        )?;
        let failed = self.tell_settings_changed(&who.tenant).await?;
        every_holder_told(failed, |failed| {
            format!(
                "the secret was deleted, but {failed} running session(s) of the tenant could not be told of it; they stop using it at their next settings reading"
            )
        })
    }

    /// `GET /v1/secrets`. Like a session's reading, it seals again what is still sealed under
    /// the previous key (an admin's way to finish a rotation for the tenant).
    pub(super) fn list_secrets(&self, who: &Identity) -> ApiResult<SecretList> {
        Ok(secrets::listing(
            &self.sealed_secrets(&who.tenant)?,
            &who.principal(),
        ))
    }

    /// Every secret of the tenant, sealed, for a session. A value still sealed under the
    /// previous key (`WUHU_SECRETS_KEY_PREVIOUS`) is sealed again under the current one first,
    /// so after one reading the previous key may go.
    pub(super) fn sealed_secrets(&self, tenant: &str) -> ApiResult<Vec<SealedSecret>> {
        let mut rows = self.rows()?;
        if rows.is_empty() {
            return Ok(rows);
        }
        let Ok(keys) = crate::secrets::keys(&self.env) else {
            // Sessions report the missing key when they need a value.
            return Ok(rows);
        };
        for row in &mut rows {
            let info = &row.info;
            let aad = secrets::aad(tenant, info.scope, info.owner.as_deref(), &info.name);
            if let Ok((value, true)) = keys.open(&aad, &row.sealed) {
                row.sealed = keys.seal(&aad, crate::secrets::nonce()?, &value);
                self.store_secret(row)?;
            }
        }
        Ok(rows)
    }
}
