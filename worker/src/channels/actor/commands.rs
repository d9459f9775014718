//! What a delivered message becomes: a prompt enqueued in the thread's session (created on
//! first use), a command (`/new`, `/stop`, …), or a button clicked on an approval card.

use super::*;

impl Actor {
    pub(super) async fn enqueue(
        &self,
        binding: &ChannelBinding,
        session: &str,
        author: &str,
        lane: &str,
        content: &str,
        message_key: Option<&str>,
    ) -> ApiResult<EnqueueResponse> {
        let lane = Lane::parse_public(lane)
            .ok_or_else(|| ApiError::internal(format!("a channel enqueues on lane {lane:?}")))?;
        let call = session_calls::Enqueue {
            lane,
            request: EnqueueRequest {
                content: content.to_string(),
                key: None,
                reasoning: None,
            },
            item_key: message_key.map(str::to_string),
        };
        let stub = crate::session_client::stub(&self.env, &binding.tenant, session)?;
        internal::call(&stub, &person(&binding.tenant, author), &call).await
    }

    /// A native command: stop, new, status, steer. A stranger's is refused; a guest's steer
    /// counts against its quota like a message.
    pub(super) async fn command(
        &self,
        binding: &ChannelBinding,
        command: Command,
        origin: &Origin,
    ) -> ApiResult<HookOutcome> {
        if !self.first_delivery(&command.dedupe_keys)? {
            return Ok(HookOutcome::Duplicate);
        }
        let standing = self.standing(binding, &command.user, origin)?;
        if standing == Standing::Stranger {
            let to = admission::Refusal {
                kind: admission::REFUSED,
                user: &command.user,
                delivery: command.dedupe_keys.first().map_or("", String::as_str),
                target: &command.reply_to,
                response_url: command.response_url.as_deref(),
            };
            let refused = self.refuse(binding, &to, &binding.refusal)?;
            self.arm_by(now_ms() + 50).await;
            return Ok(refused);
        }
        if let (CommandKind::Steer(_), Standing::Guest) = (&command.kind, standing)
            && let Err(over) = self.spend_guest_quota(binding, &command.user, false)?
        {
            return self
                .command_note(binding, &command, false, over.text())
                .await;
        }
        let who = self.who(binding, &command.user)?;
        let Some((thread_key, thread)) = self.command_thread(&command)? else {
            let line = match command.kind {
                CommandKind::New => "The next message starts a new session.",
                _ => "No session in this thread yet: mention me to start one.",
            };
            return self
                .command_note(binding, &command, true, line.into())
                .await;
        };
        let stub = crate::session_client::stub(&self.env, &binding.tenant, &thread.session)?;
        let (ok, line) = match &command.kind {
            CommandKind::Stop => {
                match internal::call(&stub, &person(&binding.tenant, &who), &session_calls::Stop)
                    .await
                {
                    Ok(_) => (true, format!("{who} stopped the turn.")),
                    Err(e) => (false, format!("{who} could not stop: {}", e.message)),
                }
            }
            CommandKind::New => {
                // The session stays (readable in Wuhu); the thread forgets it.
                for sql in [
                    "DELETE FROM threads WHERE key = ?",
                    "DELETE FROM watches WHERE thread = ?",
                ] {
                    self.sql
                        .exec(sql, vec![thread_key.clone().into()])
                        .map_err(sql_err)?;
                }
                (true, "The next message starts a new session.".to_string())
            }
            CommandKind::Status => {
                let viewer = Identity {
                    sub: who.clone(),
                    tenant: binding.tenant.clone(),
                    role: Role::Member,
                    runner_kind: None,
                };
                match crate::session_client::transcript(
                    &self.env,
                    &viewer,
                    &thread.session,
                    thread.replied as u64,
                    1,
                )
                .await
                {
                    Ok(page) => (
                        true,
                        turn::status_line(&thread.session, page.session.status, page.queue.len()),
                    ),
                    Err(e) => (
                        false,
                        format!("{who} cannot see the session: {}", e.message),
                    ),
                }
            }
            CommandKind::Steer(content) => {
                // Watched like a message (an idle session starts a turn on it); the answer goes
                // to the thread, not to this command's own response.
                let inbound = Inbound {
                    dedupe_keys: command.dedupe_keys.clone(),
                    thread_key: thread_key.clone(),
                    reply_to: from_json::<ReplyTarget>(&thread.target)?.thread_only(),
                    user: command.user.clone(),
                    text: content.clone(),
                    may_start: false,
                };
                match self.deliver(binding, &inbound, Some("steer")).await {
                    Ok(_) => (true, format!("{who} steered the turn.")),
                    Err(e) => (false, format!("{who} could not steer: {}", e.message)),
                }
            }
        };
        self.command_note(binding, &command, ok, line).await
    }

    /// The thread a command is about and its row: the one it names, else (a Slack slash
    /// command in a channel) the most recently active thread under its prefix.
    pub(super) fn command_thread(
        &self,
        command: &Command,
    ) -> ApiResult<Option<(String, ThreadRow)>> {
        if let Some(row) = self.thread(&command.thread_key)? {
            return Ok(Some((command.thread_key.clone(), row)));
        }
        let Some(prefix) = &command.latest_thread_under else {
            return Ok(None);
        };
        // `LIKE` would read `_` and `%` in the prefix as patterns: compare the start instead.
        let rows: Vec<BodyRow> = self
            .sql
            .exec(
                "SELECT key AS body FROM threads WHERE substr(key, 1, ?) = ? ORDER BY used_at DESC LIMIT 1",
                vec![(prefix.len() as i64).into(), prefix.clone().into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let Some(key) = rows.into_iter().next().map(|row| row.body) else {
            return Ok(None);
        };
        Ok(self.thread(&key)?.map(|row| (key, row)))
    }

    /// Tells the person how a command went: through a Slack slash command's `response_url`
    /// (to the channel when it changed the shared session), else as [`Self::note`] does.
    pub(super) async fn command_note(
        &self,
        binding: &ChannelBinding,
        command: &Command,
        ok: bool,
        line: String,
    ) -> ApiResult<HookOutcome> {
        let key = command.dedupe_keys.join(" ");
        let Some(response_url) = &command.response_url else {
            return self
                .note(
                    binding,
                    &key,
                    Some(command.reply_to.clone()),
                    None,
                    ok,
                    line,
                )
                .await;
        };
        self.queue(
            None,
            &format!("note:{key}"),
            &Outbound::CommandResponse {
                target: command.reply_to.clone(),
                response_url: response_url.clone(),
                text: text::render_one(binding.platform, &line),
                in_channel: slack::slash_note_in_channel(&command.kind, ok),
            },
        )?;
        self.arm_by(now_ms() + 50).await;
        Ok(HookOutcome::Note { ok, text: line })
    }

    /// A session for a new thread: the binding's defaults, created by the first author, open to
    /// the whole tenant (a group chat).
    /// `id` is [`channels::session_id_for`] the message: a session an earlier try of it made
    /// (`/init` answers 409) is taken as it is.
    pub(super) async fn create_session(
        &self,
        binding: &ChannelBinding,
        id: &str,
        author: &str,
        first_text: &str,
    ) -> ApiResult<SessionInfo> {
        let system_prompt = match (
            &binding.defaults.system_prompt,
            &binding.defaults.environment,
        ) {
            (prompt, Some(environment)) => Some(format!(
                "{}\n\nWhen you need an environment, request `{environment}`.",
                prompt.as_deref().unwrap_or(channels::DEFAULT_SYSTEM_PROMPT)
            )),
            (prompt, None) => Some(
                prompt
                    .clone()
                    .unwrap_or_else(|| channels::DEFAULT_SYSTEM_PROMPT.to_string()),
            ),
        };
        // Whoever starts the thread writes the title other people see in their lists: cleaned
        // of invisible characters and cut like any title (`wuhu_core::text`).
        let title = wuhu_core::text::bounded_title(
            &format!("{}: {first_text}", binding.name),
            channels::THREAD_TITLE_CHARS,
        );
        // The thread's first author's global context: a member's own, a guest's the binding's
        // `channels/<id>/context.md`.
        let global_context = crate::workspace_io::global_context_for(
            &self.env,
            &binding.tenant,
            author,
            Some(&binding.id),
        )
        .await
        .unwrap_or_else(|e| {
            worker::console_error!("reading the thread's global context failed: {}", e.message);
            None
        });
        let init = session_calls::SessionInit {
            id: id.to_string(),
            tenant: binding.tenant.clone(),
            created_by: author.to_string(),
            provider: binding.defaults.provider.clone(),
            model: binding.defaults.model.clone(),
            system_prompt,
            title,
            global_context,
            budget: None,
            reasoning: None,
            // Its guests' workspace folder is `channels/<binding id>/` (decision 0035).
            channel: Some(binding.id.clone()),
        };
        let stub = crate::session_client::stub(&self.env, &binding.tenant, id)?;
        let who = person(&binding.tenant, author);
        match internal::call(&stub, &who, &session_calls::Create(init)).await {
            Ok(_) => {}
            Err(e) if e.status == 409 => {}
            Err(e) => return Err(e),
        }
        let open = PatchSessionRequest {
            access: Some(Access::Tenant),
            ..PatchSessionRequest::default()
        };
        internal::call(&stub, &who, &session_calls::Patch(open)).await
    }

    pub(super) async fn click(
        &self,
        binding: &ChannelBinding,
        click: ApprovalClick,
        origin: &Origin,
    ) -> ApiResult<HookOutcome> {
        if !self.first_delivery(std::slice::from_ref(&click.dedupe_key))? {
            return Ok(HookOutcome::Duplicate);
        }
        // A stranger's click answers nothing (the session would refuse it too).
        if self.standing(binding, &click.user, origin)? == Standing::Stranger {
            return Ok(HookOutcome::Ignored(admission::NOT_ADMITTED.into()));
        }
        // Only approvals this binding posted (or, for Slack buttons posted before the binding
        // kept a list, sessions of its threads) take clicks through it.
        let posted: Vec<ApprovalRow> = self
            .sql
            .exec(
                "SELECT session, target FROM approvals WHERE approval_id = ?",
                vec![click.approval_id.clone().into()],
            )
            .map_err(sql_err)?
            .to_array()
            .map_err(sql_err)?;
        let found = match posted.into_iter().next() {
            Some(row) => Some((row.session, row.target)),
            None => match &click.session {
                Some(session) => self
                    .sql
                    .exec(
                        "SELECT target AS body FROM threads WHERE session = ? LIMIT 1",
                        vec![session.clone().into()],
                    )
                    .map_err(sql_err)?
                    .to_array::<BodyRow>()
                    .map_err(sql_err)?
                    .into_iter()
                    .next()
                    .map(|row| (session.clone(), row.body)),
                None => None,
            },
        };
        let Some((session, target)) = found else {
            return Ok(HookOutcome::Ignored(
                "not an approval of this channel".into(),
            ));
        };
        let Some(decision) = wuhu_core::approvals::Answer::parse(&click.decision) else {
            return Ok(HookOutcome::Ignored(format!(
                "a button with no known decision ({:?})",
                click.decision
            )));
        };
        let target: ReplyTarget = from_json(&target)?;
        let who = self.who(binding, &click.user)?;
        let call = session_calls::AnswerApproval {
            approval_id: click.approval_id.clone(),
            answer: AnswerApprovalRequest { decision },
        };
        let stub = crate::session_client::stub(&self.env, &binding.tenant, &session)?;
        let result = internal::call(&stub, &person(&binding.tenant, &who), &call).await;
        let (ok, line) = match &result {
            Ok(_) => (true, format!("{who} answered: {}", click.decision)),
            Err(e) => (false, format!("{who} could not answer: {}", e.message)),
        };
        self.note(
            binding,
            &format!("click:{}", click.dedupe_key),
            Some(target),
            click.callback.as_deref(),
            ok,
            line,
        )
        .await
    }
}
