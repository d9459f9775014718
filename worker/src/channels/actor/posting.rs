//! A binding's background work: the watches on the sessions its threads wait for, and the
//! outbox that posts replies with retries (its alarm).

use super::*;

impl Actor {
    /// Queues `message` under an idempotency `key` (a key queued before is ignored: a reply is
    /// never posted twice however often a scan finds it). `session`: the session it is about,
    /// told should the message be given up. A full outbox refuses it (logged): callers that can
    /// wait check [`ChannelActor::room`] first.
    pub(super) fn queue(
        &self,
        session: Option<&str>,
        key: &str,
        message: &Outbound,
    ) -> ApiResult<()> {
        if !self.room(1)? {
            worker::console_error!(
                "channel outbox full ({} waiting); gave up the message {key}",
                outbox::MAX_PENDING
            );
            return Ok(());
        }
        let session: worker::SqlStorageValue = match session {
            Some(s) => s.into(),
            None => worker::SqlStorageValue::Null,
        };
        self.sql
            .exec(
                "INSERT OR IGNORE INTO outbox (key, body, attempts, due, session) VALUES (?, ?, 0, ?, ?)",
                vec![
                    key.into(),
                    to_json(message)?.into(),
                    (now_ms() as i64).into(),
                    session,
                ],
            )
            .map_err(sql_err)?;
        Ok(())
    }

    /// Whether `n` more messages fit in the outbox.
    pub(super) fn room(&self, n: usize) -> ApiResult<bool> {
        let pending: Vec<CountRow> = self
            .sql
            .exec("SELECT COUNT(*) AS n FROM outbox WHERE sent = 0", None)
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        Ok(pending.first().map_or(0, |c| c.n as usize) + n <= outbox::MAX_PENDING)
    }

    pub(super) async fn background(self: &Rc<Self>) -> ApiResult<()> {
        let Some((binding, credentials)) = self.load_binding()? else {
            return Ok(());
        };
        self.gateway_watchdog(&binding);
        if let Err(e) = self.drain_inbox(&binding).await {
            worker::console_error!("channel inbox: {}", e.message);
        }
        let watches: Vec<WatchRow> = self
            .sql
            .exec(
                "SELECT session, thread, target, author, scan, started FROM watches",
                None,
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        for watch in watches {
            if let Err(e) = self.poll(&binding, &watch).await {
                worker::console_error!("polling a channel session failed: {}", e.message);
                if e.status == 404
                    || now_ms().saturating_sub(watch.started as u64) > turn::MAX_WATCH_MS
                {
                    let _ = self.sql.exec(
                        "DELETE FROM watches WHERE session = ?",
                        vec![watch.session.into()],
                    );
                }
            }
        }
        self.flush(&binding, &credentials).await
    }

    /// Reads what the watched session did since the last look; queues approvals, and the reply
    /// once the turn is over.
    pub(super) async fn poll(&self, binding: &ChannelBinding, watch: &WatchRow) -> ApiResult<()> {
        // Back-pressure: with the outbox (nearly) full the session is looked at later, when
        // there is room for what it may have to post (a reply is at most 10 pieces, plus its
        // progress line and approvals).
        if !self.room(32)? {
            worker::console_error!(
                "channel outbox full; session {} waits for room",
                watch.session
            );
            return Ok(());
        }
        let mut scan: Scan = from_json(&watch.scan)?;
        let target: ReplyTarget = from_json(&watch.target)?;
        let viewer = Identity {
            sub: watch.author.clone(),
            tenant: binding.tenant.clone(),
            role: Role::Member,
            runner_kind: None,
        };
        let known: HashSet<String> = scan.approvals.iter().map(|(id, _)| id.clone()).collect();
        let mut page: GetSessionResponse;
        let mut pages = 0;
        loop {
            page = crate::session_client::transcript(
                &self.env,
                &viewer,
                &watch.session,
                scan.through,
                wuhu_core::archive::MAX_PAGE as u64,
            )
            .await?;
            turn::scan(&mut scan, &page.transcript);
            pages += 1;
            if page.next_cursor.is_none() || pages >= 10 {
                break;
            }
        }
        for (id, request) in &scan.approvals {
            if known.contains(id) {
                continue;
            }
            self.sql
                .exec(
                    "INSERT OR IGNORE INTO approvals (approval_id, session, target, at) VALUES (?, ?, ?, ?)",
                    vec![
                        id.clone().into(),
                        watch.session.clone().into(),
                        to_json(&target.thread_only())?.into(),
                        (now_ms() as i64).into(),
                    ],
                )
                .map_err(sql_err)?;
            let _ = self.sql.exec(
                "DELETE FROM approvals WHERE approval_id IN (SELECT approval_id FROM approvals ORDER BY at DESC LIMIT -1 OFFSET ?)",
                vec![(channels::MAX_THREADS as i64).into()],
            );
            self.queue(
                Some(&watch.session),
                &format!("approval:{id}"),
                &Outbound::Approval {
                    target: target.thread_only(),
                    session: watch.session.clone(),
                    approval_id: id.clone(),
                    text: text::render_one(binding.platform, request),
                },
            )?;
        }
        let over =
            page.next_cursor.is_none() && turn::turn_over(page.session.status, page.queue.len());
        // The progress line: posted at the first tool call, edited as more come, closed when
        // the turn is over (on Discord it is the interaction's response, which the reply
        // replaces).
        let progress_key = format!("progress:{}:{}", watch.session, watch.started as u64);
        let progress_edit = |line: String| Outbound::Text {
            target: target.clone(),
            text: text::render_one(binding.platform, &line),
            edit: None,
            edit_of: Some(progress_key.clone()),
        };
        if binding.options.progress && scan.tool_calls.len() > scan.progress_shown {
            let line = turn::progress_text(&scan.tool_calls);
            if scan.progress_shown == 0 {
                self.queue(
                    Some(&watch.session),
                    &progress_key,
                    &Outbound::text(target.clone(), text::render_one(binding.platform, &line)),
                )?;
            } else if !over {
                self.queue(
                    Some(&watch.session),
                    &format!("{progress_key}:{}", scan.tool_calls.len()),
                    &progress_edit(line),
                )?;
            }
            scan.progress_shown = scan.tool_calls.len();
        }
        if over {
            let interaction = target != target.thread_only();
            if scan.progress_shown > 0 && !interaction {
                self.queue(
                    Some(&watch.session),
                    &format!("{progress_key}:done"),
                    &progress_edit(turn::progress_done_text(scan.tool_calls.len())),
                )?;
            }
            // A Discord interaction waits for an answer even when the turn had no text.
            let reply = turn::reply(&scan, page.session.status)
                .or_else(|| interaction.then(|| "Done.".to_string()));
            if let Some(reply) = reply {
                for (i, piece) in text::render(binding.platform, &reply)
                    .into_iter()
                    .enumerate()
                {
                    // The first piece answers the interaction (Discord), the rest are
                    // messages in the thread.
                    let to = if i == 0 {
                        target.clone()
                    } else {
                        target.thread_only()
                    };
                    self.queue(
                        Some(&watch.session),
                        &format!("reply:{}:{}:{i}", watch.session, scan.through),
                        &Outbound::text(to, piece),
                    )?;
                }
            }
            self.sql
                .exec(
                    "UPDATE threads SET replied = ? WHERE key = ?",
                    vec![(scan.through as i64).into(), watch.thread.clone().into()],
                )
                .map_err(sql_err)?;
            self.sql
                .exec(
                    "DELETE FROM watches WHERE session = ?",
                    vec![watch.session.clone().into()],
                )
                .map_err(sql_err)?;
        } else {
            // Approvals already queued are remembered; the reply text is found again later.
            self.sql
                .exec(
                    "UPDATE watches SET scan = ? WHERE session = ?",
                    vec![to_json(&scan)?.into(), watch.session.clone().into()],
                )
                .map_err(sql_err)?;
        }
        Ok(())
    }

    /// Posts due messages in order; stops at the first that must wait (replies keep order).
    ///
    /// Exactly once where the platform allows it: before each try the row is marked
    /// `uncertain` (stored before the request leaves), and only an answer that says for sure
    /// takes the mark off. A row found marked (the Worker died mid-try, the connection dropped
    /// after the platform took the message, a 5xx) is looked up first where the platform can
    /// tell (Slack: the metadata); Discord recognises the repeat by its nonce; Telegram may
    /// show it twice (docs/channels.md, "Delivery").
    pub(super) async fn flush(
        &self,
        binding: &ChannelBinding,
        credentials: &Credentials,
    ) -> ApiResult<()> {
        let rows: Vec<OutboxRow> = self
            .sql
            .exec(
                "SELECT seq, key, body, attempts, due, uncertain, first_try, session FROM outbox WHERE sent = 0 ORDER BY seq LIMIT 20",
                None,
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        for row in rows {
            if row.due as u64 > now_ms() {
                break;
            }
            let mut message: Outbound = from_json(&row.body)?;
            if let Outbound::Text { edit, edit_of, .. } = &mut message
                && let Some(key) = edit_of.take()
            {
                // Messages post in order, so the one to edit went before; without a reference
                // (refused, dropped, or a platform that gave none) there is nothing to edit.
                let posted: Vec<RefRow> = self
                    .sql
                    .exec(
                        "SELECT ref FROM outbox WHERE key = ? AND ref IS NOT NULL",
                        vec![key.into()],
                    )
                    .map_err(sql_err)?
                    .to_array()
                    .map_err(sql_err)?;
                match posted.into_iter().next() {
                    Some(row) => *edit = Some(row.r#ref),
                    None => {
                        self.mark_sent(row.seq, None)?;
                        continue;
                    }
                }
            }
            let first_try = row.first_try.map_or(now_secs(), |t| t as i64);
            if row.uncertain > 0.0
                && let Some(call) =
                    outbox::lookup(&binding.api_base_url, credentials, &message, first_try)
            {
                let (status, body) = match send_call(&call).await {
                    Some((status, _, body)) => (status, body),
                    None => (0, Value::Null),
                };
                match outbox::read_lookup(status, &body, &outbox::nonce(&row.key)) {
                    outbox::Found::Posted(reference) => {
                        worker::console_log!(
                            "channel message {} was posted by an earlier try; not posted again",
                            row.key
                        );
                        self.mark_sent(row.seq, reference)?;
                        continue;
                    }
                    outbox::Found::Absent => {}
                    outbox::Found::Unknown => {
                        if !self.retry_later(binding, &row, None).await? {
                            continue;
                        }
                        break;
                    }
                }
            }
            // The intent, stored before the request leaves: should no answer come back, the
            // next try knows the message may be there.
            self.sql
                .exec(
                    "UPDATE outbox SET uncertain = 1, first_try = ? WHERE seq = ?",
                    vec![first_try.into(), row.seq.into()],
                )
                .map_err(sql_err)?;
            let (mut attempt, mut known) = post(binding, credentials, &message, &row.key).await;
            if let Attempt::Refused(why) = &attempt
                && let Some(instead) = outbox::fallback(&message)
            {
                // A Discord interaction's token refused (expired, unknown): the answer goes
                // to the channel. Stored first, so a retry of it goes there too.
                worker::console_log!(
                    "an interaction answer was refused ({why}); posting it in the channel"
                );
                self.sql
                    .exec(
                        "UPDATE outbox SET body = ? WHERE seq = ?",
                        vec![to_json(&instead)?.into(), row.seq.into()],
                    )
                    .map_err(sql_err)?;
                message = instead;
                (attempt, known) = post(binding, credentials, &message, &row.key).await;
            }
            if known {
                self.sql
                    .exec(
                        "UPDATE outbox SET uncertain = 0 WHERE seq = ?",
                        vec![row.seq.into()],
                    )
                    .map_err(sql_err)?;
            }
            match attempt {
                Attempt::Sent(reference) => self.mark_sent(row.seq, reference)?,
                Attempt::Refused(why) => {
                    self.give_up(binding, &row, &format!("refused: {why}"))
                        .await?;
                }
                Attempt::Retry { retry_after_ms } => {
                    if self.retry_later(binding, &row, retry_after_ms).await? {
                        break;
                    }
                }
            }
        }
        // Sent rows stay a day as idempotency keys, then go.
        let _ = self.sql.exec(
            "DELETE FROM outbox WHERE sent > 0 AND sent < ?",
            vec![((now_ms() as i64) - channels::DEDUPE_TTL_SECS * 1000).into()],
        );
        Ok(())
    }

    /// Schedules the next try of `row` (true), or gives it up after [`outbox::MAX_ATTEMPTS`]
    /// tries (false).
    pub(super) async fn retry_later(
        &self,
        binding: &ChannelBinding,
        row: &OutboxRow,
        retry_after_ms: Option<u64>,
    ) -> ApiResult<bool> {
        let attempts = row.attempts as u32 + 1;
        match outbox::next_try_in_ms(attempts, retry_after_ms, js_sys::Math::random()) {
            Some(wait) => {
                self.sql
                    .exec(
                        "UPDATE outbox SET attempts = ?, due = ? WHERE seq = ?",
                        vec![
                            (attempts as i64).into(),
                            ((now_ms() + wait) as i64).into(),
                            row.seq.into(),
                        ],
                    )
                    .map_err(sql_err)?;
                Ok(true)
            }
            None => {
                self.give_up(binding, row, &format!("failed {attempts} tries"))
                    .await?;
                Ok(false)
            }
        }
    }

    /// Gives a message up: a log line, and a notice in its session's transcript (when it is
    /// about one), so nothing is dropped silently.
    pub(super) async fn give_up(
        &self,
        binding: &ChannelBinding,
        row: &OutboxRow,
        reason: &str,
    ) -> ApiResult<()> {
        worker::console_error!(
            "channel {}: gave up the message {} ({reason})",
            binding.id,
            row.key
        );
        self.mark_sent(row.seq, None)?;
        if let Some(session) = &row.session {
            let call = session_calls::Notice {
                channel: binding.id.clone(),
                key: row.key.clone(),
                reason: reason.to_string(),
            };
            let who = person(&binding.tenant, &format!("channel:{}", binding.id));
            let sent = match crate::session_client::stub(&self.env, &binding.tenant, session) {
                Ok(stub) => internal::call(&stub, &who, &call).await.map(|_| ()),
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                worker::console_error!(
                    "channel {}: telling session {session} failed: {}",
                    binding.id,
                    e.message
                );
            }
        }
        Ok(())
    }

    /// Done with an outbox row: its body (which may hold a Discord interaction token) goes,
    /// its key stays as an idempotency key, with the platform's reference for later edits.
    pub(super) fn mark_sent(&self, seq: f64, reference: Option<String>) -> ApiResult<()> {
        let reference: worker::SqlStorageValue = match reference {
            Some(r) => r.into(),
            None => worker::SqlStorageValue::Null,
        };
        self.sql
            .exec(
                "UPDATE outbox SET sent = ?, body = '', ref = ? WHERE seq = ?",
                vec![(now_ms() as i64).into(), reference, seq.into()],
            )
            .map_err(sql_err)?;
        Ok(())
    }

    /// Arms the alarm for the next background work: a watched session's next look, or the
    /// outbox's next due message.
    pub(super) async fn rearm(&self) {
        let watches: Vec<DueRow> = self
            .sql
            .exec("SELECT MIN(started) AS due FROM watches", None)
            .and_then(|c| c.to_array())
            .unwrap_or_default();
        let outbox: Vec<DueRow> = self
            .sql
            .exec("SELECT MIN(due) AS due FROM outbox WHERE sent = 0", None)
            .and_then(|c| c.to_array())
            .unwrap_or_default();
        let inbox: Vec<DueRow> = self
            .sql
            .exec("SELECT MIN(due) AS due FROM inbox", None)
            .and_then(|c| c.to_array())
            .unwrap_or_default();
        let now = now_ms();
        let mut next: Option<u64> = inbox.first().map(|i| i.due as u64);
        if let Some(started) = watches.first().map(|w| w.due as u64) {
            let at = now + turn::poll_interval_ms(now.saturating_sub(started));
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        if let Some(due) = outbox.first().map(|o| o.due as u64) {
            next = Some(next.map_or(due, |n| n.min(due)));
        }
        if self.gateway_wanted() {
            // The watchdog of the Discord Gateway connection.
            let at = now + channels::gateway::WATCHDOG_MS;
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        if let Some(at) = next {
            self.set_alarm_at(at.max(now + 10)).await;
        }
    }

    pub(super) async fn arm_by(&self, at: u64) {
        let storage = self.state.storage();
        let current = storage.get_alarm().await.ok().flatten();
        if current.is_none_or(|c| c as u64 > at) {
            self.set_alarm_at(at).await;
        }
    }

    pub(super) async fn set_alarm_at(&self, at: u64) {
        let offset = at.saturating_sub(now_ms()).max(1) as i64;
        if let Err(e) = self.state.storage().set_alarm(offset).await {
            worker::console_error!("setting the channel alarm failed: {e}");
        }
    }
}

/// One delivery attempt of `message` (outbox key `key`), and whether its outcome is known
/// ([`outbox::outcome_known`]).
pub(super) async fn post(
    binding: &ChannelBinding,
    credentials: &Credentials,
    message: &Outbound,
    key: &str,
) -> (Attempt, bool) {
    let call: HttpCall =
        outbox::request(&binding.api_base_url, credentials, message, now_secs(), key);
    match send_call(&call).await {
        Some((status, retry_after, body)) => (
            outbox::read_answer(binding.platform, status, retry_after.as_deref(), &body),
            outbox::outcome_known(Some(status)),
        ),
        None => (
            Attempt::Retry {
                retry_after_ms: None,
            },
            false,
        ),
    }
}

/// Sends `call`: its status, `Retry-After` and JSON body (`Null` when not JSON), or `None`
/// when no answer came (never log a call: it may hold a token).
pub(super) async fn send_call(call: &HttpCall) -> Option<(u16, Option<String>, Value)> {
    let headers = Headers::new();
    for (name, value) in &call.headers {
        let _ = headers.set(name, value);
    }
    let method = match call.method.as_str() {
        "PATCH" => Method::Patch,
        "GET" => Method::Get,
        _ => Method::Post,
    };
    let mut init = RequestInit::new();
    init.with_method(method).with_headers(headers);
    if call.method != "GET" {
        init.with_body(Some(wasm_bindgen::JsValue::from_str(&call.body)));
    }
    let request = Request::new_with_init(&call.url, &init).ok()?;
    let mut response = Fetch::Request(request).send().await.ok()?;
    let status = response.status_code();
    let retry_after = response.headers().get("retry-after").ok().flatten();
    // A body cut off mid-way is no answer.
    let text = response.text().await.ok()?;
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    Some((status, retry_after, body))
}
