//! The sweep of the tenant's expired request logs (`wuhu_core::llm::request_log::Sweep`), run
//! by the index's alarm once a session wrote request logs.

use wuhu_core::llm::request_log;

use super::TenantIndex;
use crate::http::{ApiError, ApiResult};

impl TenantIndex {
    /// A session wrote request logs: a sweep pass starts within a minute unless one is already
    /// due.
    pub(super) async fn llm_logs_written(&self, tenant: &str) -> ApiResult<()> {
        let mut sweep: request_log::Sweep = self.load_state("llm_log_sweep")?;
        if sweep.tenant != tenant {
            sweep.tenant = tenant.to_string();
            self.save_state("llm_log_sweep", &sweep)?;
        }
        let mut alarms = self.load_alarms()?;
        if alarms.alarms.sweep_at.is_none() {
            if alarms.tenant.is_empty() {
                alarms.tenant = tenant.to_string();
            }
            let now = worker::Date::now().as_millis();
            alarms
                .alarms
                .sweep_by(now + request_log::SWEEP_CONTINUE_MS, true);
            self.save_alarms(&alarms).await?;
        }
        Ok(())
    }

    /// One run of the sweep: at most [`request_log::SWEEP_PAGES_PER_RUN`] listing pages of
    /// `{tenant}/llm-logs/`, their expired records deleted; returns when to run again: for the
    /// rest, or when the next record expires (`wuhu_core::llm::request_log::Sweep`).
    pub(super) async fn sweep_llm_logs(&self) -> ApiResult<Option<u64>> {
        let mut sweep: request_log::Sweep = self.load_state("llm_log_sweep")?;
        if sweep.tenant.is_empty() {
            return Ok(None);
        }
        let config = crate::workspace_io::tenant_config(&self.env, &sweep.tenant)
            .await?
            .map_err(|e| ApiError::new(409, "invalid_tenant_config", e.to_string()))?;
        let bucket = self.env.bucket("ARCHIVE")?;
        for _ in 0..request_log::SWEEP_PAGES_PER_RUN {
            let mut list = bucket
                .list()
                .prefix(request_log::tenant_prefix(&sweep.tenant))
                .limit(1000);
            if let Some(cursor) = sweep.cursor.take() {
                list = list.cursor(cursor);
            }
            let page = list.execute().await?;
            let objects: Vec<(String, u64)> = page
                .objects()
                .iter()
                .map(|o| (o.key(), o.uploaded().as_millis()))
                .collect();
            let cursor = if page.truncated() {
                page.cursor()
            } else {
                None
            };
            let now = worker::Date::now().as_millis();
            let expired = sweep.page(&objects, cursor, now, config.llm_request_log_days);
            if !expired.is_empty() {
                bucket.delete_multiple(expired).await?;
            }
            if sweep.cursor.is_none() {
                break;
            }
        }
        let now = worker::Date::now().as_millis();
        let next = sweep.next_run_ms(now);
        self.save_state("llm_log_sweep", &sweep)?;
        Ok(next)
    }
}
