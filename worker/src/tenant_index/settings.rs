//! The sessions that keep a reading of the tenant's settings (decision 0021): held, and told
//! to forget it before a change under `config/` (or a first budget, decision 0022) is answered.

use futures::StreamExt;
use serde::Deserialize;
use wuhu_core::tenant_config::{SETTINGS_TELL_CONCURRENCY, max_settings_holders};

use super::TenantIndex;
use crate::http::{ApiError, ApiResult};

#[derive(Deserialize)]
struct HolderRow {
    seq: f64,
    session: String,
}

#[derive(Deserialize)]
struct CountRow {
    n: f64,
    #[serde(default)]
    mine: Option<f64>,
}

impl TenantIndex {
    /// Holds `session` (it keeps a reading of the settings). With `max_settings_holders`
    /// holders already, the one that held longest ago is told to forget its reading and let go
    /// first (it holds again at its next step); `false` when it could not be told (`session`
    /// then reads before each step).
    pub(super) async fn hold_settings(&self, tenant: &str, session: &str) -> ApiResult<bool> {
        if !crate::session_client::valid_session_id(session) {
            return Err(ApiError::bad_request("session must be a session id"));
        }
        let rows: Vec<CountRow> = self
            .sql
            .exec(
                "SELECT COUNT(*) AS n, SUM(session = ?) AS mine FROM settings_holders",
                vec![session.to_string().into()],
            )?
            .to_array()?;
        let row = rows.first();
        let (n, mine) = row.map_or((0.0, 0.0), |r| (r.n, r.mine.unwrap_or(0.0)));
        let bound = max_settings_holders(
            self.env
                .var("WUHU_MAX_SETTINGS_HOLDERS")
                .ok()
                .map(|v| v.to_string())
                .as_deref(),
        );
        if mine == 0.0 && n as usize >= bound {
            let oldest: Vec<HolderRow> = self
                .sql
                .exec(
                    "SELECT seq, session FROM settings_holders ORDER BY seq LIMIT 1",
                    None,
                )?
                .to_array()?;
            if let Some(oldest) = oldest.first() {
                if let Err(e) =
                    crate::session_client::forget_settings(&self.env, tenant, &oldest.session).await
                {
                    worker::console_error!(
                        "letting go of session {} to hold another failed: {}",
                        oldest.session,
                        e.message
                    );
                    return Ok(false);
                }
                self.sql.exec(
                    "DELETE FROM settings_holders WHERE seq = ?",
                    vec![oldest.seq.into()],
                )?;
            }
        }
        // A new `seq` each time: see the table.
        self.sql.exec(
            "INSERT OR REPLACE INTO settings_holders (session) VALUES (?)",
            vec![session.to_string().into()],
        )?;
        Ok(true)
    }

    /// Tells every holder of a settings reading to forget it ([`SETTINGS_TELL_CONCURRENCY`] at
    /// a time) and lets go of those told; a deleted session counts as told. Returns how many
    /// could not be told: they stay holders, so the next change (or the same write again) tells
    /// them.
    pub(super) async fn tell_settings_changed(&self, tenant: &str) -> ApiResult<usize> {
        let holders: Vec<HolderRow> = self
            .sql
            .exec("SELECT seq, session FROM settings_holders", None)?
            .to_array()?;
        let told: Vec<(f64, bool)> = futures::stream::iter(holders)
            .map(|holder| async move {
                let told =
                    crate::session_client::forget_settings(&self.env, tenant, &holder.session)
                        .await
                        .inspect_err(|e| {
                            worker::console_error!(
                                "telling session {} of a settings change failed: {}",
                                holder.session,
                                e.message
                            )
                        })
                        .is_ok();
                (holder.seq, told)
            })
            .buffer_unordered(SETTINGS_TELL_CONCURRENCY)
            .collect()
            .await;
        let mut failed = 0;
        for (seq, told) in told {
            if told {
                self.sql.exec(
                    "DELETE FROM settings_holders WHERE seq = ?",
                    vec![seq.into()],
                )?;
            } else {
                failed += 1;
            }
        }
        Ok(failed)
    }
}
