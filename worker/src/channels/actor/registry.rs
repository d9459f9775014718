//! The registry's calls (a tenant's list of bindings) and a binding's own settings, members and
//! sealed credentials.

use super::*;

impl Actor {
    pub(super) fn listed(&self, id: &str) -> ApiResult<Listed> {
        let rows: Vec<RegistryRow> = self
            .sql
            .exec(
                "SELECT body, masked FROM registry WHERE id = ?",
                vec![id.into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let row = rows
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::not_found("no such channel"))?;
        Ok(Listed {
            binding: from_json(&row.body)?,
            masked: from_json(&row.masked)?,
        })
    }

    pub(super) fn registry_list(&self, origin: &str) -> ApiResult<ListChannelsResponse> {
        let rows: Vec<RegistryRow> = self
            .sql
            .exec(
                "SELECT body, masked FROM registry ORDER BY created_at, id",
                None,
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let mut channels = Vec::with_capacity(rows.len());
        for row in rows {
            let listed = Listed {
                binding: from_json(&row.body)?,
                masked: from_json(&row.masked)?,
            };
            channels.push(view(origin, &listed));
        }
        Ok(ListChannelsResponse { channels })
    }

    pub(super) async fn registry_create(
        &self,
        origin: &str,
        identity: &Identity,
        request: CreateChannelRequest,
    ) -> ApiResult<ChannelView> {
        let id = uuid::Uuid::new_v4().to_string();
        let (binding, credentials) = request
            .into_binding(
                id.clone(),
                identity.tenant.clone(),
                identity.sub.clone(),
                now_secs(),
            )
            .map_err(ApiError::bad_request)?;
        binding
            .defaults
            .check_provider_allowed(crate::model_choice::fake_enabled(&self.env))
            .map_err(crate::model_choice::provider_refused)?;
        let count: Vec<CountRow> = self
            .sql
            .exec("SELECT COUNT(*) AS n FROM registry", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        if count.first().map_or(0, |c| c.n as usize) >= MAX_BINDINGS_PER_TENANT {
            return Err(ApiError::new(
                409,
                "too_many_channels",
                format!("a tenant may have at most {MAX_BINDINGS_PER_TENANT} channels"),
            ));
        }
        let listed = Listed {
            masked: credentials.masked(),
            binding: binding.clone(),
        };
        // Reserved before the binding's actor is called, so concurrent creates cannot pass the
        // bound together (handlers interleave at awaits).
        self.sql
            .exec(
                "INSERT INTO registry (id, body, masked, created_at) VALUES (?, ?, ?, ?)",
                vec![
                    id.clone().into(),
                    to_json(&listed.binding)?.into(),
                    to_json(&listed.masked)?.into(),
                    (now_ms() as i64).into(),
                ],
            )
            .map_err(sql_err)?;
        let init = channel_calls::InitBinding {
            binding,
            credentials,
        };
        let result = send_binding(&self.env, &identity.tenant, &id, &init).await;
        if let Err(e) = result {
            let _ = self
                .sql
                .exec("DELETE FROM registry WHERE id = ?", vec![id.into()]);
            return Err(e);
        }
        Ok(view(origin, &listed))
    }

    // -----------------------------------------------------------------------------------------
    // Binding

    pub(super) fn binding_init(&self, init: &channel_calls::InitBinding) -> ApiResult<()> {
        if self.load_binding()?.is_some() {
            return Err(ApiError::new(409, "conflict", "binding exists"));
        }
        let sealed = self.seal(&init.binding.id, &init.credentials)?;
        self.sql
            .exec(
                "INSERT INTO binding (k, body, sealed) VALUES (1, ?, ?)",
                vec![to_json(&init.binding)?.into(), sealed.into()],
            )
            .map_err(sql_err)?;
        Ok(())
    }

    pub(super) fn binding_patch(&self, patch: &PatchChannelRequest) -> ApiResult<Listed> {
        let (binding, credentials) = self
            .load_binding()?
            .ok_or_else(|| ApiError::not_found("no such channel"))?;
        let (next, new_credentials) = patch
            .clone()
            .apply(&binding, now_secs())
            .map_err(ApiError::bad_request)?;
        next.defaults
            .check_provider_allowed(crate::model_choice::fake_enabled(&self.env))
            .map_err(crate::model_choice::provider_refused)?;
        let credentials = new_credentials.unwrap_or(credentials);
        let sealed = self.seal(&next.id, &credentials)?;
        self.sql
            .exec(
                "UPDATE binding SET body = ?, sealed = ? WHERE k = 1",
                vec![to_json(&next)?.into(), sealed.into()],
            )
            .map_err(sql_err)?;
        Ok(Listed {
            binding: next,
            masked: credentials.masked(),
        })
    }

    /// After a create or patch: a Discord binding's Gateway connection starts afresh (the token
    /// may be new), watched by the alarm.
    pub(super) async fn binding_changed(self: &Rc<Self>) -> ApiResult<()> {
        let (binding, _) = self
            .load_binding()?
            .ok_or_else(|| ApiError::not_found("no such channel"))?;
        if binding.platform == Platform::Discord {
            self.gateway_restart(&binding);
            self.arm_by(now_ms() + channels::gateway::WATCHDOG_MS).await;
        }
        Ok(())
    }

    /// Every mapped member, in user order.
    pub(super) fn members(&self) -> ApiResult<Members> {
        let members: Vec<Member> = self
            .sql
            .exec("SELECT user, sub FROM members ORDER BY user", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        Ok(Members { members })
    }

    /// Replaces the member list with a checked one.
    pub(super) fn put_members(&self, next: &Members) -> ApiResult<Members> {
        let (binding, _) = self
            .load_binding()?
            .ok_or_else(|| ApiError::not_found("no such channel"))?;
        members::check(binding.platform, next).map_err(ApiError::bad_request)?;
        // One synchronous block: no await between the delete and the inserts, so no hook sees
        // a half-written list.
        self.sql
            .exec("DELETE FROM members", None)
            .map_err(sql_err)?;
        for member in &next.members {
            self.sql
                .exec(
                    "INSERT INTO members (user, sub) VALUES (?, ?)",
                    vec![member.user.clone().into(), member.sub.clone().into()],
                )
                .map_err(sql_err)?;
        }
        self.members()
    }

    /// Who platform user `user` is in Wuhu: their mapped `sub`, else `<platform>:<id>`.
    pub(super) fn who(&self, binding: &ChannelBinding, user: &str) -> ApiResult<String> {
        Ok(members::identity(
            binding.platform,
            user,
            self.mapped_sub(user)?.as_deref(),
        ))
    }

    /// The `sub` an admin mapped platform user `user` to, if any.
    pub(super) fn mapped_sub(&self, user: &str) -> ApiResult<Option<String>> {
        let mapped: Vec<Member> = self
            .sql
            .exec(
                "SELECT user, sub FROM members WHERE user = ?",
                vec![user.into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        Ok(mapped.into_iter().next().map(|m| m.sub))
    }

    pub(super) fn seal(&self, id: &str, credentials: &Credentials) -> ApiResult<String> {
        let key = crate::channels::channel_key(&self.env)?;
        let mut nonce = [0u8; NONCE_BYTES];
        getrandom::getrandom(&mut nonce)
            .map_err(|_| ApiError::internal("no randomness for a nonce"))?;
        let plain =
            serde_json::to_vec(credentials).map_err(|e| ApiError::internal(e.to_string()))?;
        Ok(key.seal(id, nonce, &plain))
    }

    /// The binding and its opened credentials, if this actor holds one.
    pub(super) fn load_binding(&self) -> ApiResult<Option<(ChannelBinding, Credentials)>> {
        let rows: Vec<BindingRow> = self
            .sql
            .exec("SELECT body, sealed FROM binding WHERE k = 1", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        let binding: ChannelBinding = from_json(&row.body)?;
        let key = crate::channels::channel_key(&self.env)?;
        let plain = key
            .open(&binding.id, &row.sealed)
            .map_err(|e| ApiError::new(500, "server_misconfigured", e.to_string()))?;
        let credentials: Credentials = serde_json::from_slice(&plain)
            .map_err(|_| ApiError::internal("sealed credentials are not credentials"))?;
        Ok(Some((binding, credentials)))
    }
}
