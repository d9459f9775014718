//! A binding's hooks: a platform's message verified, admitted, deduplicated, kept in the inbox
//! and delivered to its thread's session.

use super::*;

impl Actor {
    pub(super) async fn hook(self: &Rc<Self>, hook: &channel_calls::Hook) -> ApiResult<Response> {
        let platform = Some(hook.platform);
        let body = hook.body.as_bytes();
        let refused = || ApiError::unauthorized("unknown binding or bad signature");
        let Some((mut binding, credentials)) = self.load_binding()? else {
            return Err(refused());
        };
        if platform != Some(binding.platform) {
            return Err(refused());
        }
        let mut origin = Origin::default();
        let header = |name: &str| hook.header(name).map(str::to_string);
        let unauthorized = |e: VerifyError| ApiError::unauthorized(e.to_string());
        let delivery = match &credentials {
            Credentials::Slack { signing_secret, .. } => {
                verify::slack(
                    signing_secret,
                    header("x-slack-request-timestamp").as_deref(),
                    header("x-slack-signature").as_deref(),
                    body,
                    now_secs(),
                )
                .map_err(unauthorized)?;
                let content_type = header("content-type").unwrap_or_default();
                origin = slack::origin(&content_type, body);
                slack::parse(&content_type, body)
            }
            Credentials::Telegram { secret_token, .. } => {
                verify::telegram(
                    secret_token,
                    header("x-telegram-bot-api-secret-token").as_deref(),
                )
                .map_err(unauthorized)?;
                origin = telegram::origin(body);
                telegram::parse(body)
            }
            Credentials::Discord { public_key, .. } => {
                let check = verify::discord(
                    public_key,
                    header("x-signature-timestamp").as_deref(),
                    header("x-signature-ed25519").as_deref(),
                    body,
                    now_secs(),
                )
                .map_err(unauthorized)?;
                let valid = crate::webcrypto::verify_ed25519(
                    &check.public_key,
                    &check.signature,
                    &check.message,
                )
                .await
                .unwrap_or(false);
                check.verdict(valid).map_err(unauthorized)?;
                origin = discord::origin(body);
                discord::parse(body, now_secs())
            }
            Credentials::Generic { secret, .. } => {
                let signature = header("x-wuhu-signature");
                verify::generic(
                    secret,
                    header("x-wuhu-timestamp").as_deref(),
                    signature.as_deref(),
                    body,
                    now_secs(),
                )
                .map_err(unauthorized)?;
                generic::parse(body, signature.as_deref().unwrap_or_default())
            }
        }
        .map_err(ApiError::bad_request)?;
        // A Slack binding serves its own workspace and app only (decision 0035).
        let acts = !matches!(delivery, Delivery::Answer(_) | Delivery::Ignored(_));
        if let Err(why) = self.check_pin(&mut binding, &origin, acts).await {
            worker::console_log!("channel {}: refused {why}", binding.id);
            return Ok(match delivery {
                // Slack shows a slash command's body to the person: nothing, then.
                Delivery::Command(_) => Response::empty()?.with_status(200),
                _ => json_response(
                    200,
                    &channels::hook_answer(binding.platform, &HookOutcome::Ignored(why)),
                ),
            });
        }
        // A Discord binding made before the Gateway was held (no watchdog alarm yet) starts it
        // at its first verified interaction.
        if self.gateway_watchdog(&binding) {
            self.arm_by(now_ms() + channels::gateway::WATCHDOG_MS).await;
        }
        let outcome = match delivery {
            Delivery::Answer(answer) => return Ok(json_response(200, &answer)),
            Delivery::Ignored(why) => HookOutcome::Ignored(why.to_string()),
            Delivery::Message(inbound) => self.message(&binding, inbound, &origin).await?,
            // A slash command is acknowledged with an empty 200 (Slack shows a body as a
            // message); its note follows through the `response_url`.
            Delivery::Command(command) if command.response_url.is_some() => {
                self.command(&binding, command, &origin).await?;
                return Ok(Response::empty()?.with_status(200));
            }
            Delivery::Command(command) => self.command(&binding, command, &origin).await?,
            Delivery::Approval(click) => self.click(&binding, click, &origin).await?,
        };
        Ok(json_response(
            200,
            &channels::hook_answer(binding.platform, &outcome),
        ))
    }

    /// Tells the person how a command or click went: as the hook's answer on platforms that
    /// answer inline (the returned outcome), else posted to `target` (and, for a Telegram
    /// click, as the clicker's notice).
    pub(super) async fn note(
        &self,
        binding: &ChannelBinding,
        key: &str,
        target: Option<ReplyTarget>,
        callback: Option<&str>,
        ok: bool,
        line: String,
    ) -> ApiResult<HookOutcome> {
        if !channels::answers_inline(binding.platform) {
            if let (Some(callback), Some(target)) = (callback, &target) {
                self.queue(
                    None,
                    &format!("ack:{key}"),
                    &Outbound::CallbackAnswer {
                        target: target.clone(),
                        callback_id: callback.to_string(),
                        text: line.chars().take(200).collect(),
                    },
                )?;
            }
            if let Some(target) = target {
                self.queue(
                    None,
                    &format!("note:{key}"),
                    &Outbound::text(
                        target.thread_only(),
                        text::render_one(binding.platform, &line),
                    ),
                )?;
            }
            self.arm_by(now_ms() + 50).await;
        }
        Ok(HookOutcome::Note { ok, text: line })
    }

    /// Records the delivery's keys; false when any was seen before (a retry or a replay).
    pub(super) fn first_delivery(&self, keys: &[String]) -> ApiResult<bool> {
        for key in keys {
            let rows: Vec<CountRow> = self
                .sql
                .exec(
                    "SELECT COUNT(*) AS n FROM seen WHERE key = ?",
                    vec![key.clone().into()],
                )
                .map_err(sql_err)?
                .to_array()
                .map_err(sql_err)?;
            if rows.first().is_some_and(|r| r.n > 0.0) {
                return Ok(false);
            }
        }
        let t = now_secs();
        for key in keys {
            self.sql
                .exec(
                    "INSERT OR IGNORE INTO seen (key, at) VALUES (?, ?)",
                    vec![key.clone().into(), t.into()],
                )
                .map_err(sql_err)?;
        }
        // Bounded: keys past their time, then the oldest past the count.
        let _ = self.sql.exec(
            "DELETE FROM seen WHERE at < ?",
            vec![(t - channels::DEDUPE_TTL_SECS).into()],
        );
        let _ = self.sql.exec(
            "DELETE FROM seen WHERE key IN (SELECT key FROM seen ORDER BY at DESC LIMIT -1 OFFSET ?)",
            vec![(channels::MAX_DEDUPE_KEYS as i64).into()],
        );
        Ok(true)
    }

    pub(super) fn forget_delivery(&self, keys: &[String]) {
        for key in keys {
            let _ = self
                .sql
                .exec("DELETE FROM seen WHERE key = ?", vec![key.clone().into()]);
        }
    }

    pub(super) fn thread(&self, key: &str) -> ApiResult<Option<ThreadRow>> {
        let rows: Vec<ThreadRow> = self
            .sql
            .exec(
                "SELECT session, replied, target FROM threads WHERE key = ?",
                vec![key.into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        Ok(rows.into_iter().next())
    }

    /// A person's message: stored in the inbox with its dedupe keys (one synchronous section,
    /// so one transaction, durable before the answer leaves), then delivered to its session by
    /// a task the hook waits for at most `channels::HOOK_WAIT_MS`: a slow delivery (a session
    /// being created) is answered "accepted" in time and finishes after the answer; should the
    /// instance die first, the alarm delivers the row after `channels::INBOX_LEASE_MS`.
    pub(super) async fn message(
        self: &Rc<Self>,
        binding: &ChannelBinding,
        inbound: Inbound,
        origin: &Origin,
    ) -> ApiResult<HookOutcome> {
        let due = now_ms() + channels::INBOX_LEASE_MS;
        let seq = match self.store_inbound(binding, &inbound, origin, due)? {
            Stored::Inbox(seq) => seq,
            Stored::Duplicate => return Ok(HookOutcome::Duplicate),
            Stored::Refused(outcome) => {
                // A refusal may have been queued.
                self.arm_by(now_ms() + 50).await;
                return Ok(outcome);
            }
        };
        self.arm_by(due).await;
        self.delivering.borrow_mut().insert(seq);
        let (tx, rx) = oneshot::channel();
        let actor = self.clone();
        let for_task = binding.clone();
        self.state.wait_until(async move {
            let outcome = actor.deliver_inbox(seq, &for_task, &inbound).await;
            let _ = tx.send(outcome);
        });
        // `WUHU_CHANNEL_HOOK_WAIT_MS` (0 to the default) lets tests answer before delivery.
        let wait_ms = self
            .env
            .var("WUHU_CHANNEL_HOOK_WAIT_MS")
            .ok()
            .and_then(|v| v.to_string().parse::<u64>().ok())
            .map_or(channels::HOOK_WAIT_MS, |ms| ms.min(channels::HOOK_WAIT_MS));
        if wait_ms == 0 {
            return Ok(HookOutcome::Accepted);
        }
        let wait = worker::Delay::from(std::time::Duration::from_millis(wait_ms));
        match futures::future::select(rx, wait).await {
            futures::future::Either::Left((Ok(outcome), _)) => outcome,
            // Not delivered yet: accepted (stored); the task or the alarm finishes it.
            _ => Ok(HookOutcome::Accepted),
        }
    }

    /// Stores a person's message in the inbox with its dedupe keys (synchronous: one
    /// transaction), due for the alarm at `due`, once it is admitted (`Actor::admit_message`:
    /// a stranger's or an over-quota guest's message is refused, never stored). Past
    /// `channels::MAX_INBOX` waiting messages: 503.
    pub(super) fn store_inbound(
        &self,
        binding: &ChannelBinding,
        inbound: &Inbound,
        origin: &Origin,
        due: u64,
    ) -> ApiResult<Stored> {
        if !self.first_delivery(&inbound.dedupe_keys)? {
            return Ok(Stored::Duplicate);
        }
        if self.inbox_len() >= channels::MAX_INBOX {
            // Back-pressure: the platform retries later (its retry is not a duplicate).
            self.forget_delivery(&inbound.dedupe_keys);
            return Err(ApiError::new(
                503,
                "busy",
                format!(
                    "{} messages wait for their sessions; try again later",
                    channels::MAX_INBOX
                ),
            ));
        }
        if let Some(refused) = self.admit_message(binding, inbound, origin)? {
            return Ok(Stored::Refused(refused));
        }
        let seq = self
            .sql
            .exec(
                "INSERT INTO inbox (body, due) VALUES (?, ?) RETURNING seq",
                vec![to_json(inbound)?.into(), (due as i64).into()],
            )
            .map_err(sql_err)?
            .to_array::<SeqRow>()
            .map_err(sql_err)?
            .first()
            .map(|r| r.seq as i64)
            .ok_or_else(|| ApiError::internal("inbox insert returned no row"))?;
        Ok(Stored::Inbox(seq))
    }

    /// Messages waiting in the inbox.
    pub(super) fn inbox_len(&self) -> usize {
        self.sql
            .exec("SELECT COUNT(*) AS n FROM inbox", None)
            .and_then(|c| c.to_array::<CountRow>())
            .ok()
            .and_then(|rows| rows.first().map(|c| c.n as usize))
            .unwrap_or(0)
    }

    /// Whether an inbox row is due now that no task of this instance delivers.
    pub(super) fn inbox_due_now(&self) -> bool {
        let rows: Vec<SeqRow> = self
            .sql
            .exec(
                "SELECT seq FROM inbox WHERE due <= ? ORDER BY seq LIMIT 100",
                vec![(now_ms() as i64).into()],
            )
            .and_then(|c| c.to_array())
            .unwrap_or_default();
        let delivering = self.delivering.borrow();
        rows.iter().any(|r| !delivering.contains(&(r.seq as i64)))
    }

    /// Delivers inbox row `seq`: removed once its message is in the session's queue (or
    /// refused for good: a 4xx, then the platform's retry may try again); kept for the alarm
    /// after a failure that may pass (then the hook answers "accepted").
    pub(super) async fn deliver_inbox(
        &self,
        seq: i64,
        binding: &ChannelBinding,
        inbound: &Inbound,
    ) -> ApiResult<HookOutcome> {
        let result = self.deliver(binding, inbound, None).await;
        self.delivering.borrow_mut().remove(&seq);
        let done = || {
            self.sql
                .exec("DELETE FROM inbox WHERE seq = ?", vec![seq.into()])
                .map_err(sql_err)
        };
        match result {
            Ok(outcome) => {
                done()?;
                Ok(outcome)
            }
            Err(e) if e.status < 500 => {
                done()?;
                self.forget_delivery(&inbound.dedupe_keys);
                Err(e)
            }
            Err(e) => {
                let attempts: Vec<CountRow> = self
                    .sql
                    .exec(
                        "UPDATE inbox SET attempts = attempts + 1 WHERE seq = ? RETURNING attempts AS n",
                        vec![seq.into()],
                    )
                    .map_err(sql_err)?
                    .to_array()
                    .map_err(sql_err)?;
                let attempts = attempts.first().map_or(1, |c| c.n as u32);
                match outbox::next_try_in_ms(attempts, None, js_sys::Math::random()) {
                    Some(wait) => {
                        worker::console_error!(
                            "channel {}: delivering a message failed ({}); again in {wait} ms",
                            binding.id,
                            e.message
                        );
                        self.sql
                            .exec(
                                "UPDATE inbox SET due = ? WHERE seq = ?",
                                vec![((now_ms() + wait) as i64).into(), seq.into()],
                            )
                            .map_err(sql_err)?;
                        self.arm_by(now_ms() + wait).await;
                    }
                    None => {
                        worker::console_error!(
                            "channel {}: gave up delivering a message after {attempts} tries ({})",
                            binding.id,
                            e.message
                        );
                        done()?;
                    }
                }
                Ok(HookOutcome::Accepted)
            }
        }
    }

    /// The alarm's part of the inbox: rows due (their hook's delivery did not finish, or a
    /// retry), oldest first, one at a time.
    pub(super) async fn drain_inbox(&self, binding: &ChannelBinding) -> ApiResult<()> {
        let rows: Vec<InboxRow> = self
            .sql
            .exec(
                "SELECT seq, body FROM inbox WHERE due <= ? ORDER BY seq LIMIT 50",
                vec![(now_ms() as i64).into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        for row in rows {
            let seq = row.seq as i64;
            if !self.delivering.borrow_mut().insert(seq) {
                continue;
            }
            let inbound: Inbound = match from_json(&row.body) {
                Ok(inbound) => inbound,
                Err(e) => {
                    self.delivering.borrow_mut().remove(&seq);
                    worker::console_error!("dropping a corrupt inbox row: {}", e.message);
                    let _ = self
                        .sql
                        .exec("DELETE FROM inbox WHERE seq = ?", vec![seq.into()]);
                    continue;
                }
            };
            if let Err(e) = self.deliver_inbox(seq, binding, &inbound).await {
                worker::console_error!(
                    "channel {}: a stored message was refused: {}",
                    binding.id,
                    e.message
                );
            }
        }
        Ok(())
    }

    /// Enqueues a message in its thread's session (created on a first message that may start
    /// one) on `lane`, or the binding's lane, and watches the session for the answer.
    pub(super) async fn deliver(
        &self,
        binding: &ChannelBinding,
        inbound: &Inbound,
        lane: Option<&str>,
    ) -> ApiResult<HookOutcome> {
        let author = self.who(binding, &inbound.user)?;
        let (session, replied) = loop {
            if let Some(row) = self.thread(&inbound.thread_key)? {
                break (row.session, row.replied as u64);
            }
            // One creation per thread at a time: a delivery that finds one under way waits for
            // it and looks again (then the thread has its session; had the creation failed,
            // this delivery creates). A message that may not start one waits too: it continues
            // the session being made.
            let waiting = {
                let mut creating = self.creating.borrow_mut();
                match creating.get_mut(&inbound.thread_key) {
                    Some(waiters) => {
                        let (tx, rx) = oneshot::channel();
                        waiters.push(tx);
                        Some(rx)
                    }
                    None if !inbound.may_start => {
                        return Ok(HookOutcome::Ignored(
                            "not a mention in an unbound thread".into(),
                        ));
                    }
                    None => {
                        creating.insert(inbound.thread_key.clone(), Vec::new());
                        None
                    }
                }
            };
            if let Some(rx) = waiting {
                let _ = rx.await;
                continue;
            }
            let _creating = Creating {
                creating: &self.creating,
                thread_key: inbound.thread_key.clone(),
            };
            // Sessions a channel starts are rate-limited per binding and per tenant: a thread
            // over the limit gets a short note and starts nothing.
            if let Err(limited) = crate::rate_limit::check(
                &self.env,
                wuhu_core::rate_limits::RateAction::ChannelSession,
                &binding.tenant,
                &binding.id,
            )
            .await
            {
                if limited.status != 429 {
                    return Err(limited);
                }
                let key = inbound.dedupe_keys.first().map_or("", String::as_str);
                return self
                    .note(
                        binding,
                        &format!("limited:{key}"),
                        Some(inbound.reply_to.clone()),
                        None,
                        false,
                        limited.message,
                    )
                    .await;
            }
            let id = channels::session_id_for(
                &binding.id,
                &inbound.thread_key,
                inbound.dedupe_keys.first().map_or("", String::as_str),
            );
            let info = self
                .create_session(binding, &id, &author, &inbound.text)
                .await?;
            self.sql
                .exec(
                    "INSERT OR REPLACE INTO threads (key, session, target, replied, used_at) VALUES (?, ?, ?, ?, ?)",
                    vec![
                        inbound.thread_key.clone().into(),
                        info.id.clone().into(),
                        to_json(&inbound.reply_to.thread_only())?.into(),
                        (info.last_cursor as i64).into(),
                        (now_ms() as i64).into(),
                    ],
                )
                .map_err(sql_err)?;
            let _ = self.sql.exec(
                "DELETE FROM threads WHERE key IN (SELECT key FROM threads ORDER BY used_at DESC LIMIT -1 OFFSET ?)",
                vec![(channels::MAX_THREADS as i64).into()],
            );
            break (info.id, info.last_cursor);
        };
        let lane = lane.unwrap_or(match channels::lane_for(&binding.options) {
            wuhu_core::wire::Lane::Steer => "steer",
            _ => "followUp",
        });
        let queued = self
            .enqueue(
                binding,
                &session,
                &author,
                lane,
                &inbound.text,
                inbound.dedupe_keys.first().map(String::as_str),
            )
            .await?;
        self.sql
            .exec(
                "UPDATE threads SET used_at = ? WHERE key = ?",
                vec![(now_ms() as i64).into(), inbound.thread_key.clone().into()],
            )
            .map_err(sql_err)?;
        let scan = Scan {
            through: replied,
            ..Scan::default()
        };
        let watched = self
            .sql
            .exec(
                "INSERT OR IGNORE INTO watches (session, thread, target, author, scan, started) VALUES (?, ?, ?, ?, ?, ?)",
                vec![
                    session.clone().into(),
                    inbound.thread_key.clone().into(),
                    to_json(&inbound.reply_to)?.into(),
                    author.into(),
                    to_json(&scan)?.into(),
                    (now_ms() as i64).into(),
                ],
            )
            .map_err(sql_err)?
            .rows_written();
        if watched == 0 && inbound.reply_to != inbound.reply_to.thread_only() {
            // A turn is already watched and answers through an earlier interaction: this one's
            // deferred response is resolved now (Discord shows an error if it never is).
            self.queue(
                Some(&session),
                &format!("joined:{}", inbound.dedupe_keys.join(" ")),
                &Outbound::text(
                    inbound.reply_to.clone(),
                    text::render_one(
                        binding.platform,
                        "Added to the conversation; the answer follows in this channel.",
                    ),
                ),
            )?;
        }
        self.arm_by(now_ms() + 200).await;
        Ok(HookOutcome::Queued {
            session,
            queued: queued.id,
        })
    }
}
