//! Who a binding lets in (decision 0035), performed: the rules are
//! `wuhu_core::channels::admit`; this keeps the facts they need (the member list, what guests
//! did in the last hour, whom the binding told) and queues what they say to post.

use wuhu_core::calls::channels::SlackPinned;
use wuhu_core::channels::admit::{
    self, GuestUsage, NOTICE_INTERVAL_SECS, Origin, OverQuota, Pin, QUOTA_WINDOW_SECS, Standing,
};
use wuhu_core::channels::outbound::Outbound;
use wuhu_core::channels::{ChannelBinding, HookOutcome, Inbound, ReplyTarget, text};

use super::{Actor, BodyRow, CountRow, from_json, now_secs, sql_err, to_json};
use crate::auth::Identity;
use crate::http::ApiResult;
use crate::internal;

/// What a stranger's refusal is remembered as (`told` rows, outbox keys).
pub(super) const REFUSED: &str = "refused";
/// What an over-quota guest's notice is remembered as.
const QUOTA: &str = "quota";
/// Why a stranger's click or plain message does nothing.
pub(super) const NOT_ADMITTED: &str = "not a member of this channel";

/// Who is refused, for which delivery, and where they are told.
pub(super) struct Refusal<'a> {
    /// [`REFUSED`] or the quota's: what is remembered of having told them.
    pub(super) kind: &'a str,
    /// The platform user.
    pub(super) user: &'a str,
    /// The delivery refused (its first dedupe key): the note's outbox key, so a note is never
    /// queued twice for one delivery, and two deliveries are two notes unless the hour says no.
    pub(super) delivery: &'a str,
    /// Where the note goes.
    pub(super) target: &'a ReplyTarget,
    /// A Slack slash command's `response_url`: the note goes there, to the person only.
    pub(super) response_url: Option<&'a str>,
}

#[derive(serde::Deserialize)]
struct UsageRow {
    n: f64,
    sessions: f64,
}

impl Actor {
    /// Checks a delivery's Slack workspace and app against `binding`'s pin
    /// (`admit::check_pin`; `acts`: whether the delivery would do anything). A binding stored
    /// before pins existed pins this delivery's, in its own row (synchronously) and then in its
    /// registry's copy. `Err`: refused, and why.
    pub(super) async fn check_pin(
        &self,
        binding: &mut ChannelBinding,
        origin: &Origin,
        acts: bool,
    ) -> Result<(), String> {
        let pin = (
            binding.team_id.as_deref(),
            binding.api_app_id.as_deref(),
            binding.enterprise_id.as_deref(),
        );
        let (team, app, enterprise) = match admit::check_pin(binding.platform, pin, origin, acts) {
            Pin::Pass => return Ok(()),
            Pin::Refuse(why) => return Err(why),
            Pin::PinFirst {
                team,
                app,
                enterprise,
            } => (team, app, enterprise),
        };
        if let Err(e) = self.store_pin(binding, &team, &app, enterprise.as_deref()) {
            return Err(format!("the pin could not be stored: {}", e.message));
        }
        worker::console_log!(
            "channel {}: pinned to Slack workspace {team} and app {app} at its first delivery",
            binding.id
        );
        let call = SlackPinned {
            id: binding.id.clone(),
            team_id: team,
            api_app_id: app,
            enterprise_id: enterprise,
        };
        let told = match super::super::stub(&self.env, &format!("registry:{}", binding.tenant)) {
            Ok(stub) => internal::call(&stub, &Identity::system(&binding.tenant), &call)
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = told {
            // The binding's own row holds the pin; only the list shows it late.
            worker::console_error!(
                "channel {}: the registry did not take the pin: {}",
                binding.id,
                e.message
            );
        }
        Ok(())
    }

    /// Pins `binding` (and its stored row, read again so nothing else in it is undone).
    fn store_pin(
        &self,
        binding: &mut ChannelBinding,
        team: &str,
        app: &str,
        enterprise: Option<&str>,
    ) -> ApiResult<()> {
        let rows: Vec<BodyRow> = self
            .sql
            .exec("SELECT body FROM binding WHERE k = 1", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(());
        };
        let mut stored: ChannelBinding = from_json(&row.body)?;
        for target in [&mut stored, binding] {
            if target.team_id.is_none() {
                target.team_id = Some(team.to_string());
                target.api_app_id = Some(app.to_string());
                target.enterprise_id = enterprise.map(str::to_string);
            }
        }
        self.sql
            .exec(
                "UPDATE binding SET body = ? WHERE k = 1",
                vec![to_json(&stored)?.into()],
            )
            .map_err(sql_err)?;
        Ok(())
    }

    /// The standing of platform user `user` on `binding` for a delivery from `origin`.
    pub(super) fn standing(
        &self,
        binding: &ChannelBinding,
        user: &str,
        origin: &Origin,
    ) -> ApiResult<Standing> {
        let mapped = self.mapped_sub(user)?.is_some();
        Ok(admit::admit(
            mapped,
            binding.admit,
            &binding.allowlist,
            origin,
        ))
    }

    /// Whether a person's message may go on to its session (`None`), or what the hook answers
    /// instead: a stranger's message that addresses the bot is refused (told once an hour),
    /// any other of theirs ignored; a guest's counts against its quota, and past it the guest
    /// is told so (once an hour) and nothing is stored. Synchronous: part of the hook's one
    /// transaction.
    pub(super) fn admit_message(
        &self,
        binding: &ChannelBinding,
        inbound: &Inbound,
        origin: &Origin,
    ) -> ApiResult<Option<HookOutcome>> {
        match self.standing(binding, &inbound.user, origin)? {
            Standing::Member => Ok(None),
            Standing::Stranger if !inbound.may_start => {
                Ok(Some(HookOutcome::Ignored(NOT_ADMITTED.into())))
            }
            Standing::Stranger => self
                .refuse(binding, &refusal(REFUSED, inbound), &binding.refusal)
                .map(Some),
            Standing::Guest => {
                let bound = self.creating.borrow().contains_key(&inbound.thread_key)
                    || self.thread(&inbound.thread_key)?.is_some();
                if !bound && !inbound.may_start {
                    // Delivery ignores it (a plain message in a thread without a session):
                    // nothing to count.
                    return Ok(None);
                }
                match self.spend_guest_quota(binding, &inbound.user, !bound)? {
                    Ok(()) => Ok(None),
                    Err(over) => self
                        .refuse(binding, &refusal(QUOTA, inbound), &over.text())
                        .map(Some),
                }
            }
        }
    }

    /// Counts one message of guest `user` (which starts a session when `starts_session`)
    /// against `binding`'s guest quota, or says which bound it would pass (then nothing is
    /// counted).
    pub(super) fn spend_guest_quota(
        &self,
        binding: &ChannelBinding,
        user: &str,
        starts_session: bool,
    ) -> ApiResult<Result<(), OverQuota>> {
        let now = now_secs();
        self.sql
            .exec(
                "DELETE FROM guest_usage WHERE at <= ?",
                vec![(now - QUOTA_WINDOW_SECS).into()],
            )
            .map_err(sql_err)?;
        let count = |filter: Option<&str>| -> ApiResult<(u32, u32)> {
            let rows: Vec<UsageRow> = match filter {
                Some(user) => self.sql.exec(
                    "SELECT COUNT(*) AS n, COALESCE(SUM(session), 0) AS sessions FROM guest_usage WHERE user = ?",
                    vec![user.into()],
                ),
                None => self.sql.exec(
                    "SELECT COUNT(*) AS n, COALESCE(SUM(session), 0) AS sessions FROM guest_usage",
                    None,
                ),
            }
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
            Ok(rows
                .first()
                .map_or((0, 0), |r| (r.n as u32, r.sessions as u32)))
        };
        let (messages, sessions) = count(Some(user))?;
        let (all_messages, all_sessions) = count(None)?;
        let usage = GuestUsage {
            sessions,
            messages,
            all_sessions,
            all_messages,
        };
        if let Err(over) = admit::within_quota(&binding.guest_quota, usage, starts_session) {
            return Ok(Err(over));
        }
        self.sql
            .exec(
                "INSERT INTO guest_usage (user, session, at) VALUES (?, ?, ?)",
                vec![user.into(), i64::from(starts_session).into(), now.into()],
            )
            .map_err(sql_err)?;
        Ok(Ok(()))
    }

    /// Tells `user` `line` for being refused (`kind`): a Discord interaction waits for an
    /// answer, so it is the answer (seen by the person only); anywhere else it is posted through
    /// the outbox (to a Slack slash command's `response_url` when there is one), at most once
    /// per person and kind per [`NOTICE_INTERVAL_SECS`]. The caller arms the alarm.
    pub(super) fn refuse(
        &self,
        binding: &ChannelBinding,
        to: &Refusal<'_>,
        line: &str,
    ) -> ApiResult<HookOutcome> {
        let inline = matches!(
            to.target,
            ReplyTarget::Discord {
                interaction: Some(_),
                ..
            }
        );
        if !inline && self.tell_once(to.kind, to.user)? {
            let text = text::render_one(binding.platform, line);
            let message = match to.response_url {
                Some(url) => Outbound::CommandResponse {
                    target: to.target.clone(),
                    response_url: url.to_string(),
                    text,
                    in_channel: false,
                },
                None => Outbound::text(to.target.thread_only(), text),
            };
            self.queue(None, &format!("{}:{}", to.kind, to.delivery), &message)?;
        }
        Ok(HookOutcome::Refused(line.to_string()))
    }

    /// Whether `user` may be told `kind` now (`admit::notice_due`); records that they were.
    /// Past `admit::MAX_NOTICED` people told this hour, nobody new is.
    fn tell_once(&self, kind: &str, user: &str) -> ApiResult<bool> {
        let now = now_secs();
        self.sql
            .exec(
                "DELETE FROM told WHERE at <= ?",
                vec![(now - NOTICE_INTERVAL_SECS).into()],
            )
            .map_err(sql_err)?;
        let key = format!("{kind}:{user}");
        let last: Vec<CountRow> = self
            .sql
            .exec(
                "SELECT at AS n FROM told WHERE key = ?",
                vec![key.clone().into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        if !admit::notice_due(last.first().map(|r| r.n as i64), now) {
            return Ok(false);
        }
        let told: Vec<CountRow> = self
            .sql
            .exec("SELECT COUNT(*) AS n FROM told", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        if told.first().map_or(0, |r| r.n as usize) >= admit::MAX_NOTICED {
            return Ok(false);
        }
        self.sql
            .exec(
                "INSERT OR REPLACE INTO told (key, at) VALUES (?, ?)",
                vec![key.into(), now.into()],
            )
            .map_err(sql_err)?;
        Ok(true)
    }
}

/// The refusal of person's message `inbound` as `kind`.
fn refusal<'a>(kind: &'a str, inbound: &'a Inbound) -> Refusal<'a> {
    Refusal {
        kind,
        user: &inbound.user,
        delivery: inbound.dedupe_keys.first().map_or("", String::as_str),
        target: &inbound.reply_to,
        response_url: None,
    }
}
