//! A runner's `hello`: its key checked against the one its name is bound to, the takeover rule
//! (`wuhu_core::hub`), and the answer (`welcome`, or a refusal that closes the socket).

use super::*;

impl Sockets<'_> {
    /// Refuses `ws`'s hello with `code` and closes it (1008, the reason cut to fit).
    pub(super) fn refuse_hello(
        &self,
        ws: &WebSocket,
        mut info: SocketInfo,
        name: &str,
        code: &str,
        message: String,
    ) {
        worker::console_log!(
            "runner hub: refused runner {name:?} of {}: {code}: {message}",
            info.owner
        );
        send(
            ws,
            &ServerMessage::Refused {
                code: code.to_string(),
                message: message.clone(),
            },
        );
        info.closed = true;
        save_info(ws, &info);
        close(ws, 1008, &close_reason(&format!("{code}: {message}")));
    }

    /// The key check of a `hello` (decision 0024), before anything else is decided: `Ok` with
    /// the key to bind after the welcome (if the name had none), or the refusal.
    pub(super) async fn check_key(
        &self,
        info: &SocketInfo,
        hello: &Hello,
    ) -> Result<Option<String>, (&'static str, String)> {
        let bound = store::runner_key(self.sql, &info.owner, &hello.name).map_err(|e| {
            (
                codes::NAME_IN_USE,
                format!(
                    "the server could not read the runner's key ({}); retrying",
                    e.message
                ),
            )
        })?;
        let (public_key, signature, bind) =
            match hub::key_decision(bound.as_deref(), hello.key.as_ref(), &hello.name) {
                KeyDecision::Unbound => return Ok(None),
                KeyDecision::Refuse { code, message } => return Err((code, message)),
                KeyDecision::Bind {
                    public_key,
                    signature,
                } => (public_key, signature, true),
                KeyDecision::Verify {
                    public_key,
                    signature,
                } => (public_key, signature, false),
            };
        let input = hello_signing_input(&info.nonce, &hello.name);
        match crate::webcrypto::verify_ed25519(&public_key, &signature, input.as_bytes()).await {
            Ok(true) if info.nonce.is_empty() => Err(hub::bad_signature(&hello.name)),
            Ok(true) => Ok(bind
                .then(|| hello.key.as_ref().map(|k| k.public_key.clone()))
                .flatten()),
            Ok(false) => Err(hub::bad_signature(&hello.name)),
            Err(e) => Err((
                codes::NAME_IN_USE,
                format!("the server could not verify the runner's key ({e}); retrying"),
            )),
        }
    }

    pub(super) async fn on_hello(
        &self,
        ws: &WebSocket,
        mut info: SocketInfo,
        message: RunnerMessage,
    ) {
        let Some(hello) = Hello::from_message(message) else {
            return;
        };
        // The key first (its verification awaits WebCrypto): what follows decides and records
        // the welcome without awaiting, so two hellos for one name cannot interleave there.
        let key_to_bind = match self.check_key(&info, &hello).await {
            Ok(key) => key,
            Err((code, message)) => {
                self.refuse_hello(ws, info, &hello.name, code, message);
                return;
            }
        };
        let now = now_ms();
        let open = self.open();
        let connections = connections(&open, |ws, info| self.last_seen_ms(ws, info));
        // Expired reservations go first, so they neither hold a name nor count against a cap.
        let rows = match self.purge_expired(now, &open) {
            Ok(rows) => rows,
            Err(e) => {
                // Without the rows neither names nor caps can be checked: refuse for now.
                worker::console_error!("runner hub: reading runners failed: {}", e.message);
                send(
                    ws,
                    &ServerMessage::Refused {
                        code: codes::NAME_IN_USE.to_string(),
                        message: String::from(
                            "the server could not read its runner list; retrying",
                        ),
                    },
                );
                info.closed = true;
                save_info(ws, &info);
                close(ws, 1011, "runner list unavailable");
                return;
            }
        };
        let known: Vec<KnownRunner<'_>> = rows.iter().map(store::NameRow::known).collect();
        let decision = hub::on_hello(
            &info.owner,
            info.epoch,
            info.token_kind,
            &hello,
            &connections,
            &known,
            now,
        );
        let (kind, notice, replace) = match decision {
            HelloDecision::Refuse { code, message } => {
                self.refuse_hello(ws, info, &hello.name, code, message);
                return;
            }
            HelloDecision::Welcome {
                kind,
                notice,
                replace,
            } => (kind, notice, replace),
        };
        let name = hello.name.clone();
        if let Some(notice) = &notice {
            worker::console_log!("runner hub: runner {name:?} of {}: {notice}", info.owner);
        }
        // A runner that comes back replaces its old connection, which went silent (it may not
        // have noticed that it is dead yet), or which `--replace` takes over: that one is told
        // why, so it stops instead of reconnecting.
        for (old, mut old_info) in open {
            if replace.contains(&old_info.epoch) {
                old_info.closed = true;
                save_info(&old, &old_info);
                if hello.replace {
                    let message = format!(
                        "another wuhu-runner took over runner {name:?} with --replace; this one stops"
                    );
                    send(
                        &old,
                        &ServerMessage::Refused {
                            code: codes::REPLACED.to_string(),
                            message: message.clone(),
                        },
                    );
                    close(
                        &old,
                        1008,
                        &close_reason(&format!("{}: {message}", codes::REPLACED)),
                    );
                } else {
                    close(&old, 1012, "replaced by a new connection");
                }
                self.waiters.fail_epoch(
                    old_info.epoch,
                    format!("runner {name:?} reconnected (a new connection replaced the old one) while the call was running"),
                );
            }
        }
        let row = store::Hello {
            owner: &info.owner,
            name: &name,
            kind,
            os: &hello.os,
            arch: &hello.arch,
            capabilities: &hello.capabilities,
            environments: &hello.environments,
            version: hello.runner_version.as_deref(),
        };
        if let Err(e) = store::upsert_runner(self.sql, &row, info.epoch, now) {
            worker::console_error!("runner hub: recording runner failed: {}", e.message);
        }
        if let Some(key) = &key_to_bind
            && let Err(e) = store::bind_runner_key(self.sql, &info.owner, &name, key, now)
        {
            worker::console_error!("runner hub: binding the runner's key failed: {}", e.message);
        }
        info.runner = Some(SocketRunner {
            name: name.clone(),
            kind,
            os: hello.os,
        });
        info.persisted_ms = now;
        save_info(ws, &info);
        send(
            ws,
            &ServerMessage::Welcome {
                runner_id: format!("{}/{name}", info.owner),
                heartbeat_seconds: DEFAULT_HEARTBEAT_SECONDS,
                kind: Some(kind),
                notice,
                sandbox: capabilities::sandbox(&hello.capabilities),
                tool_progress: true,
            },
        );
        self.arm_alarm(now + SILENCE_LIMIT_MS).await;
        // Discards of deleted sessions that waited for this runner.
        match discards::send_waiting(self.sql, ws, &info) {
            Ok(0) => {}
            Ok(n) => worker::console_log!(
                "runner hub: sent {n} waiting discard(s) to runner {name:?} of {}",
                info.owner
            ),
            Err(e) => worker::console_error!(
                "runner hub: reading the waiting discards failed: {}",
                e.message
            ),
        }
    }
}
