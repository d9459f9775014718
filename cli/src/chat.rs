//! `wuhu chat`: an interactive chat with one session in the terminal.
//!
//! Lines typed while the session is at rest start a turn; lines typed while a turn runs steer
//! it (delivered at the next step), or queue a follow-up when they start with `+ `. Streamed
//! text appears as it arrives, tool calls with their status, approvals addressed to you are
//! asked inline (`y`/`n`). `Ctrl-C` once stops the turn; twice within three seconds exits.
//! When stdin ends (a pipe), the chat exits once everything it sent has been answered.
//!
//! The follow stream runs in its own task and resumes by itself after a dropped connection
//! (saying so once); nothing the session records is lost or shown twice.

use std::collections::{HashSet, VecDeque};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;
use wuhu_client::{Client, FollowEvent, FollowOptions, TranscriptQuery};
use wuhu_core::wire::{
    CreateSessionRequest, Entry, EntryPayload, Lane, Message, Status, StreamEvent, custom_types,
};

use crate::exit;
use crate::render::{self, Renderer, SPINNER_TICK, Spinner, Style};

/// A second `Ctrl-C` within this long exits.
const DOUBLE_CTRL_C: Duration = Duration::from_secs(3);

/// Prefix of a line that queues a follow-up instead of steering.
const FOLLOW_UP_PREFIX: &str = "+ ";

/// `wuhu chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    /// The session (default: a new one).
    pub session: Option<String>,
    /// Title of a new session.
    #[arg(long)]
    pub title: Option<String>,
    /// Transcript entries shown before the chat starts.
    #[arg(long, default_value_t = 20)]
    pub history: usize,
}

/// Runs the chat until the user exits (or stdin ends and the session is at rest). With `json`
/// (`--json`) it prints one JSON object per line instead of the terminal view (see [`Screen`]).
///
/// # Errors
/// The session cannot be read or created, or the follow stream gave up.
pub async fn run(client: Client, args: ChatArgs, json: bool) -> Result<u8> {
    let claims = client
        .token()
        .and_then(|t| crate::token::read_claims(t).ok())
        .unwrap_or_default();
    let me = claims["sub"].as_str().unwrap_or_default().to_string();
    let admin = claims["role"] == "admin";

    let session = match &args.session {
        Some(id) => {
            client
                .session(
                    id,
                    TranscriptQuery {
                        limit: Some(1),
                        ..TranscriptQuery::default()
                    },
                )
                .await?
                .session
        }
        None => {
            client
                .create_session(&CreateSessionRequest {
                    title: args.title.clone(),
                    ..CreateSessionRequest::default()
                })
                .await?
        }
    };
    let since = session.last_cursor.saturating_sub(args.history as u64);
    let history = client.transcript(&session.id, since).await?;
    let mut screen = Screen::new(json);
    let style = screen.style();
    screen.note(
        json!({"type": "session", "session": session}),
        &format!(
            "{} {}\n{}",
            style.bold(session.title.as_deref().unwrap_or("wuhu chat")),
            style.dim(&format!("session {}", session.id)),
            style.dim(
                "Type a message. While a turn runs a line steers it (\"+ text\" queues a follow-up). \
Ctrl-C stops the turn, twice exits; /quit exits."
            )
        ),
    )?;
    for entry in &history.transcript {
        screen.entry(entry)?;
    }

    let mut running = history.session.status == Status::Running;
    let mut my_approvals: VecDeque<String> =
        wuhu_core::approvals::pending_requests(&history.transcript)
            .into_iter()
            .filter(|a| admin || a["approver"]["sub"] == me.as_str())
            .filter_map(|a| a["approvalId"].as_str().map(str::to_string))
            .collect();
    for id in &my_approvals {
        screen.ask_approval(id)?;
    }

    let last_cursor = history
        .transcript
        .last()
        .map(|e| e.cursor)
        .unwrap_or(since)
        .max(history.session.last_cursor);
    let (events_tx, mut events) = mpsc::channel::<Result<FollowEvent, wuhu_client::Error>>(256);
    let mut follow = client.follow(&session.id, FollowOptions::live_after(last_cursor));
    tokio::spawn(async move {
        while let Some(event) = follow.next().await {
            if events_tx.send(event).await.is_err() {
                break;
            }
        }
    });

    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut input_open = true;
    let stdin_is_terminal = std::io::stdin().is_terminal();
    // Queue items sent and not yet seen in the transcript.
    let mut outstanding: HashSet<String> = HashSet::new();
    // Something was sent and the turn that takes it has not ended yet: a piped chat waits.
    let mut awaiting_answer = false;
    let mut last_ctrl_c: Option<Instant> = None;
    // One listener for the whole chat: from here on Ctrl-C never kills the process by default.
    let mut interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    // Moves the spinner while a tool runs (only on a terminal: see `Spinner::active`).
    let mut ticker = tokio::time::interval(SPINNER_TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);

    loop {
        if !input_open && !running && outstanding.is_empty() && !awaiting_answer {
            screen.end()?;
            return Ok(exit::OK);
        }
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else {
                    screen.end()?;
                    return Ok(exit::OK);
                };
                let event = event?;
                match &event {
                    FollowEvent::Event(StreamEvent::Status { status }) => {
                        running = *status == Status::Running;
                        // The turn that took everything sent so far has ended.
                        awaiting_answer &= running || !outstanding.is_empty();
                    }
                    FollowEvent::Event(StreamEvent::Idle) => {
                        running = false;
                        awaiting_answer &= !outstanding.is_empty();
                    }
                    FollowEvent::Event(StreamEvent::EntryAppended { entry }) => {
                        match &entry.payload {
                            EntryPayload::Message { message: Message::User { queue_item_id: Some(id), .. } } => {
                                outstanding.remove(id);
                            }
                            EntryPayload::Custom { custom_type, data } => {
                                let id = data["approvalId"].as_str().unwrap_or_default().to_string();
                                if custom_type == custom_types::APPROVAL_REQUESTED
                                    && (admin || data["approver"]["sub"] == me.as_str())
                                {
                                    my_approvals.push_back(id.clone());
                                    screen.event(&event)?;
                                    screen.ask_approval(&id)?;
                                    continue;
                                }
                                if custom_type == custom_types::APPROVAL_DECIDED {
                                    my_approvals.retain(|a| *a != id);
                                }
                            }
                            _ => {}
                        }
                    }
                    _ => {}
                }
                screen.event(&event)?;
            }
            line = lines.next_line(), if input_open => {
                let line = match line {
                    Ok(Some(line)) => line,
                    Ok(None) | Err(_) => {
                        input_open = false;
                        continue;
                    }
                };
                // A terminal echoed the line (and its Enter) into whatever was streaming.
                screen.renderer.interrupt(stdin_is_terminal);
                let text = line.trim();
                if text.is_empty() {
                    continue;
                }
                if let Some(approval) = my_approvals.front().cloned() {
                    let decision = match text.to_lowercase().as_str() {
                        "y" | "yes" => Some(wuhu_core::approvals::Answer::Approve),
                        "n" | "no" => Some(wuhu_core::approvals::Answer::Deny),
                        _ => None,
                    };
                    if let Some(decision) = decision {
                        my_approvals.pop_front();
                        match client.answer_approval(&session.id, &approval, decision).await {
                            Ok(answer) => screen.note(
                                json!({"type": "approval_answered", "approvalId": answer.approval_id, "decision": answer.decision}),
                                &style.dim(&format!("{}: {}", answer.approval_id, answer.decision.as_str())),
                            )?,
                            Err(error) => screen.error(&error)?,
                        }
                        continue;
                    }
                }
                match text {
                    "/quit" | "/exit" => {
                        screen.end()?;
                        return Ok(exit::OK);
                    }
                    "/stop" => {
                        stop(&client, &session.id, &mut screen).await?;
                        continue;
                    }
                    _ => {}
                }
                let (lane, content) = match text.strip_prefix(FOLLOW_UP_PREFIX) {
                    Some(rest) => (Lane::FollowUp, rest),
                    None if running => (Lane::Steer, text),
                    None => (Lane::FollowUp, text),
                };
                match client.enqueue(&session.id, lane, content).await {
                    Ok(item) => {
                        screen.renderer.own_items.push(item.id.clone());
                        outstanding.insert(item.id.clone());
                        awaiting_answer = true;
                        let what = if !running {
                            ""
                        } else if lane == Lane::Steer {
                            "↪ steering"
                        } else {
                            "↪ queued as a follow-up"
                        };
                        screen.note(
                            json!({"type": "sent", "id": item.id, "lane": lane}),
                            &style.dim(what),
                        )?;
                    }
                    Err(error) => {
                        screen.error(&error)?;
                        if error.status() == Some(401) {
                            return Ok(exit::AUTH);
                        }
                    }
                }
            }
            _ = ticker.tick(), if screen.spinner.active() => screen.spin()?,
            _ = interrupts.recv() => {
                if last_ctrl_c.is_some_and(|t| t.elapsed() < DOUBLE_CTRL_C) {
                    screen.end()?;
                    return Ok(exit::OK);
                }
                last_ctrl_c = Some(Instant::now());
                if running {
                    stop(&client, &session.id, &mut screen).await?;
                }
                screen.note(
                    json!({"type": "interrupted", "exitOnSecondWithinMs": DOUBLE_CTRL_C.as_millis() as u64}),
                    &style.dim("(Ctrl-C again to exit)"),
                )?;
            }
        }
    }
}

async fn stop(client: &Client, session_id: &str, screen: &mut Screen) -> Result<()> {
    match client.stop(session_id).await {
        Ok(_) => {
            let text = screen.style().yellow("■ stopping the turn");
            screen.note(json!({"type": "stopping"}), &text)?;
        }
        Err(error) => screen.error(&error)?,
    }
    Ok(())
}

/// Where the chat writes: the terminal view (colours as [`Style::detect`] says), or with
/// `--json` one JSON object per line on stdout: `{"type":"session","session"}` first, the
/// history and the live stream as `sessions follow --json` prints them (history entries as
/// `entry_appended`), and the chat's own records: `approval_asked`, `approval_answered`,
/// `sent` (`id`, `lane`), `stopping`, `interrupted`, `error` (`message`, `code`, `status`).
///
/// On a terminal (colours on) a running tool call has a spinner line under it
/// (`⠋ running bash`), erased before anything else is written.
struct Screen {
    json: bool,
    renderer: Renderer,
    spinner: Spinner,
    /// The spinner line is on screen (the cursor is at its end).
    spinner_shown: bool,
    stdout: std::io::Stdout,
}

impl Screen {
    fn new(json: bool) -> Screen {
        let style = Style::detect(json);
        Screen {
            json,
            renderer: Renderer::new(style),
            spinner: Spinner::new(style.animated()),
            spinner_shown: false,
            stdout: std::io::stdout(),
        }
    }

    /// Erases the spinner line, if drawn.
    fn clear_spinner(&mut self) -> std::io::Result<()> {
        if self.spinner_shown {
            self.spinner_shown = false;
            write!(self.stdout, "\r\x1b[2K")?;
        }
        Ok(())
    }

    /// Draws the next spinner frame (on a line of its own only: never over streamed text).
    fn spin(&mut self) -> std::io::Result<()> {
        if !self.spinner.active() || !self.renderer.at_line_start() {
            return Ok(());
        }
        if let Some(line) = self.spinner.line() {
            write!(self.stdout, "\r\x1b[2K{}", self.style().dim(&line))?;
            self.spinner_shown = true;
        }
        self.spinner.advance();
        self.stdout.flush()
    }

    fn style(&self) -> Style {
        self.renderer.style
    }

    fn line(&mut self, value: &Value) -> std::io::Result<()> {
        writeln!(self.stdout, "{value}")?;
        self.stdout.flush()
    }

    /// A history entry.
    fn entry(&mut self, entry: &Entry) -> std::io::Result<()> {
        self.spinner.track(entry);
        if self.json {
            return self.line(&json!({"type": "entry_appended", "entry": entry}));
        }
        self.clear_spinner()?;
        self.renderer.entry(&mut self.stdout, entry)?;
        self.stdout.flush()
    }

    /// A live event.
    fn event(&mut self, event: &FollowEvent) -> std::io::Result<()> {
        match event {
            FollowEvent::Event(StreamEvent::EntryAppended { entry }) => self.spinner.track(entry),
            FollowEvent::Event(StreamEvent::Status { status }) if *status != Status::Running => {
                self.spinner.clear()
            }
            FollowEvent::Event(StreamEvent::Idle) => self.spinner.clear(),
            _ => {}
        }
        if self.json {
            return self.line(&render::event_json(event));
        }
        self.clear_spinner()?;
        self.renderer.event(&mut self.stdout, event)
    }

    /// One of the chat's own records: `value` under `--json`, else `text` on a line of its own
    /// (nothing when it is empty).
    fn note(&mut self, value: Value, text: &str) -> std::io::Result<()> {
        if self.json {
            return self.line(&value);
        }
        if text.is_empty() {
            return Ok(());
        }
        self.clear_spinner()?;
        self.renderer.line_break(&mut self.stdout)?;
        writeln!(self.stdout, "{text}")?;
        self.stdout.flush()
    }

    fn ask_approval(&mut self, id: &str) -> std::io::Result<()> {
        let text = self.style().yellow(&format!("approve {id}? [y/n]"));
        self.note(json!({"type": "approval_asked", "approvalId": id}), &text)
    }

    fn error(&mut self, error: &wuhu_client::Error) -> std::io::Result<()> {
        let text = self.style().red(&format!("✗ {error}"));
        self.note(
            json!({"type": "error", "message": error.to_string(), "code": error.code(), "status": error.status()}),
            &text,
        )
    }

    /// Ends a partial line before the chat exits.
    fn end(&mut self) -> std::io::Result<()> {
        if self.json {
            return Ok(());
        }
        self.clear_spinner()?;
        self.renderer.line_break(&mut self.stdout)?;
        self.stdout.flush()
    }
}
