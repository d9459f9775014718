//! Human output: transcript entries and follow events as terminal text, with colour only when
//! stdout is a terminal and `NO_COLOR` is unset.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use serde_json::{Value, json};
use wuhu_client::FollowEvent;
use wuhu_core::wire::{ContentBlock, Entry, EntryPayload, Message, StreamEvent, custom_types};

/// Colours on or off.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    color: bool,
}

impl Style {
    /// Colour when stdout is a terminal, `NO_COLOR` is unset (or empty) and output is not JSON.
    pub fn detect(json: bool) -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            color: !json && !no_color && std::io::stdout().is_terminal(),
        }
    }

    /// Whether the output may move (a spinner): the same terminal without `NO_COLOR`.
    pub fn animated(&self) -> bool {
        self.color
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    /// Dim text.
    pub fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }
    /// Bold text.
    pub fn bold(&self, text: &str) -> String {
        self.paint("1", text)
    }
    /// Red text (errors).
    pub fn red(&self, text: &str) -> String {
        self.paint("31", text)
    }
    /// Green text (success).
    pub fn green(&self, text: &str) -> String {
        self.paint("32", text)
    }
    /// Yellow text (waiting, warnings).
    pub fn yellow(&self, text: &str) -> String {
        self.paint("33", text)
    }
    /// Cyan text (people).
    pub fn cyan(&self, text: &str) -> String {
        self.paint("36", text)
    }
}

/// A follow event as `--json` prints it: the stream event of `docs/api.md`, or the client's own
/// `{"type":"disconnected","reason"}` / `{"type":"resumed","cursor"}`.
pub fn event_json(event: &FollowEvent) -> Value {
    match event {
        FollowEvent::Event(event) => serde_json::to_value(event).unwrap_or(Value::Null),
        FollowEvent::Disconnected { reason } => json!({"type": "disconnected", "reason": reason}),
        FollowEvent::Resumed { cursor } => json!({"type": "resumed", "cursor": cursor}),
    }
}

/// Renders a follow stream as text: assistant deltas as they come, then each entry once. It
/// remembers the streamed text so the finished assistant entry only adds what the deltas did
/// not show (all of it when deltas were lost to a reconnect).
#[derive(Debug)]
pub struct Renderer {
    /// Colours.
    pub style: Style,
    /// Streamed assistant text not yet confirmed by an entry.
    streamed: String,
    /// After a dropped connection, the text of the reply it interrupted as far as it was shown
    /// (empty: none was): until the next entry arrives, deltas are held back (those sent during
    /// the outage are lost, so the ones after it would not follow on), and an assistant entry
    /// then shows only what comes after it.
    broken: Option<String>,
    /// Whether the cursor is at the start of a line.
    at_line_start: bool,
    /// The last thing shown was a running command's output.
    in_tool_output: bool,
    /// The last thing shown was the model's thinking.
    in_thinking: bool,
    /// Queue items this process sent (their user entries are already on screen).
    pub own_items: Vec<String>,
}

impl Renderer {
    /// A renderer writing with `style`.
    pub fn new(style: Style) -> Renderer {
        Renderer {
            style,
            streamed: String::new(),
            broken: None,
            at_line_start: true,
            in_tool_output: false,
            in_thinking: false,
            own_items: Vec::new(),
        }
    }

    /// Renders one follow event to `out`.
    pub fn event(&mut self, out: &mut impl Write, event: &FollowEvent) -> std::io::Result<()> {
        let shows_text = matches!(
            event,
            FollowEvent::Event(
                StreamEvent::AssistantTextDelta { .. } | StreamEvent::EntryAppended { .. }
            ) | FollowEvent::Disconnected { .. }
                | FollowEvent::Resumed { .. }
        );
        let thinks = matches!(event, FollowEvent::Event(StreamEvent::ThinkingDelta { .. }));
        if (shows_text && (self.in_tool_output || self.in_thinking))
            || (thinks && self.in_tool_output)
        {
            // Whatever comes after a command's output or the model's thinking starts on a line
            // of its own.
            self.in_tool_output = false;
            self.in_thinking = false;
            self.line_break(out)?;
        }
        match event {
            FollowEvent::Event(StreamEvent::AssistantTextDelta { .. }) if self.broken.is_some() => {
            }
            FollowEvent::Event(StreamEvent::AssistantTextDelta { delta }) => {
                self.streamed.push_str(delta);
                write!(out, "{delta}")?;
                self.at_line_start = delta.ends_with('\n');
            }
            FollowEvent::Event(StreamEvent::EntryAppended { entry }) => {
                let broken = self.broken.take();
                match (&entry.payload, broken) {
                    (
                        EntryPayload::Message {
                            message: Message::Assistant(assistant),
                        },
                        Some(shown),
                    ) => self.rest_of_broken(out, assistant, &shown)?,
                    _ => self.entry(out, entry)?,
                }
            }
            FollowEvent::Event(StreamEvent::ToolOutputDelta { text, .. }) => {
                self.in_thinking = false;
                self.tool_output(out, text)?;
            }
            // Thinking is shown dimmed as it streams (not after a drop: the entry follows).
            FollowEvent::Event(StreamEvent::ThinkingDelta { .. }) if self.broken.is_some() => {}
            FollowEvent::Event(StreamEvent::ThinkingDelta { delta }) => {
                if !self.in_thinking {
                    self.line_break(out)?;
                    self.in_thinking = true;
                    // Thinking cut the streamed text: its entry is shown whole, on its own line.
                    self.streamed.clear();
                }
                write!(out, "{}", self.style.dim(delta))?;
                self.at_line_start = delta.ends_with('\n');
            }
            // The call is printed with its entry; its arguments as they stream are for clients
            // that draw them (the web app).
            FollowEvent::Event(StreamEvent::ToolCallDelta { .. }) => {}
            FollowEvent::Event(StreamEvent::Lagged { .. } | StreamEvent::Error { .. }) => {}
            // Someone else's message waits in the queue: shown dimmed until its entry comes
            // (this process's own are on screen already).
            FollowEvent::Event(StreamEvent::QueueItemAdded {
                id,
                lane,
                author,
                preview,
            }) => {
                if !self.own_items.contains(id) {
                    self.line_break(out)?;
                    let lane = match lane {
                        wuhu_core::wire::Lane::Steer => " (steer)",
                        _ => "",
                    };
                    let text = format!("⋯ {author}{lane} queued: {preview}");
                    writeln!(out, "{}", self.style.dim(&text))?;
                }
            }
            FollowEvent::Event(StreamEvent::QueueItemRemoved { id, reason }) => {
                if *reason == wuhu_core::wire::QueueRemoval::Cancelled {
                    self.line_break(out)?;
                    let text = format!("✗ queued message {id} was cancelled");
                    writeln!(out, "{}", self.style.dim(&text))?;
                }
            }
            // A child's idle, failure or stop also arrives as a `wuhu_child_status_v1` entry.
            FollowEvent::Event(
                StreamEvent::Status { .. }
                | StreamEvent::Idle
                | StreamEvent::Done
                | StreamEvent::ChildStatus { .. },
            ) => {}
            FollowEvent::Disconnected { reason } => {
                // The notice breaks the streamed line: the entry shows what comes after. Deltas
                // wait for the next entry: those sent during the outage are lost, so the ones
                // after it may not follow on from what is on screen.
                if self.broken.is_none() {
                    self.broken = Some(std::mem::take(&mut self.streamed));
                }
                self.line_break(out)?;
                let text = format!("⚠ connection lost ({reason}); reconnecting…");
                writeln!(out, "{}", self.style.yellow(&text))?;
            }
            FollowEvent::Resumed { cursor } => {
                self.line_break(out)?;
                let text = format!("✓ reconnected; resuming after entry {cursor}, nothing lost");
                writeln!(out, "{}", self.style.green(&text))?;
            }
        }
        out.flush()
    }

    /// A running command's output (not stored: its result entry follows): each line dimmed
    /// after `│ `, so it reads apart from the replies.
    fn tool_output(&mut self, out: &mut impl Write, text: &str) -> std::io::Result<()> {
        if !self.in_tool_output {
            self.line_break(out)?;
            self.in_tool_output = true;
        }
        for line in text.split_inclusive('\n') {
            if self.at_line_start {
                write!(out, "{}", self.style.dim("│ "))?;
            }
            let (body, newline) = match line.strip_suffix('\n') {
                Some(body) => (body, true),
                None => (line, false),
            };
            write!(out, "{}", self.style.dim(body))?;
            if newline {
                writeln!(out)?;
            }
            self.at_line_start = newline;
        }
        Ok(())
    }

    /// The entry of a reply a drop interrupted: what was not shown yet, after `…` (or the whole
    /// text, when it is not the reply that was shown: the turn was tried again), and its calls.
    fn rest_of_broken(
        &mut self,
        out: &mut impl Write,
        assistant: &wuhu_core::wire::AssistantMessage,
        shown: &str,
    ) -> std::io::Result<()> {
        let text = assistant.text();
        self.line_break(out)?;
        match text.strip_prefix(shown) {
            Some(rest) => {
                if !rest.is_empty() {
                    if !shown.is_empty() {
                        write!(out, "{}", self.style.dim("…"))?;
                    }
                    write!(out, "{rest}")?;
                    self.at_line_start = rest.ends_with('\n');
                }
            }
            None => {
                write!(out, "{text}")?;
                self.at_line_start = text.is_empty() || text.ends_with('\n');
            }
        }
        // The text is on screen: the rest of the entry (its tool calls) as usual.
        self.streamed = text;
        let entry = Entry {
            cursor: 0,
            id: String::new(),
            created_at: 0,
            payload: EntryPayload::Message {
                message: Message::Assistant(assistant.clone()),
            },
        };
        self.entry(out, &entry)
    }

    /// Something else was printed (or typed and echoed) in the middle of streamed text: the
    /// finished entry is shown whole on its own lines instead of completing the broken line.
    pub fn interrupt(&mut self, echoed_newline: bool) {
        self.streamed.clear();
        if echoed_newline {
            self.at_line_start = true;
        }
    }

    /// Whether the cursor is at the start of a line (nothing streamed is waiting for its end).
    pub fn at_line_start(&self) -> bool {
        self.at_line_start
    }

    /// Ends a partial line.
    pub fn line_break(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if !self.at_line_start {
            writeln!(out)?;
            self.at_line_start = true;
        }
        Ok(())
    }

    /// Renders one transcript entry.
    pub fn entry(&mut self, out: &mut impl Write, entry: &Entry) -> std::io::Result<()> {
        let style = self.style;
        match &entry.payload {
            EntryPayload::Header(_) => {}
            EntryPayload::Message { message } => match message {
                Message::User {
                    author,
                    content,
                    queue_item_id,
                    lane,
                    acting_for,
                } => {
                    if queue_item_id
                        .as_ref()
                        .is_some_and(|id| self.own_items.contains(id))
                    {
                        return Ok(());
                    }
                    self.line_break(out)?;
                    let lane = match lane {
                        Some(wuhu_core::wire::Lane::Steer) => " (steer)",
                        _ => "",
                    };
                    // A child's task or a parent's message says whom it acts for.
                    let acting = match acting_for {
                        Some(set) if set.is_empty() => " for nobody".to_string(),
                        Some(set) if set != std::slice::from_ref(author) => {
                            format!(" for {}", set.join(", "))
                        }
                        _ => String::new(),
                    };
                    writeln!(
                        out,
                        "{} {content}",
                        style.cyan(&format!("{author}{lane}{acting}:"))
                    )?;
                }
                Message::Assistant(assistant) => {
                    let text = assistant.text();
                    let streamed = std::mem::take(&mut self.streamed);
                    if let Some(rest) = text.strip_prefix(streamed.as_str()) {
                        write!(out, "{rest}")?;
                        if !text.is_empty() {
                            self.at_line_start = text.ends_with('\n');
                        }
                    } else {
                        self.line_break(out)?;
                        write!(out, "{text}")?;
                        self.at_line_start = text.is_empty() || text.ends_with('\n');
                    }
                    self.line_break(out)?;
                    for block in &assistant.content {
                        if let ContentBlock::ToolCall(call) = block {
                            let args = summarize(&call.arguments.to_string(), 80);
                            let line = format!("⋯ {} {args}", call.name);
                            writeln!(out, "{}", style.yellow(&line))?;
                        }
                    }
                }
                Message::ToolResult(result) => {
                    self.line_break(out)?;
                    let n_lines = result.content.lines().count();
                    let first = summarize(result.content.lines().next().unwrap_or(""), 100);
                    let more = if n_lines > 1 {
                        format!(" (+{} lines)", n_lines - 1)
                    } else {
                        String::new()
                    };
                    if result.is_error {
                        let line = format!("✗ {}: {first}{more}", result.tool_name);
                        writeln!(out, "{}", style.red(&line))?;
                    } else {
                        let line = format!("✓ {}: {first}{more}", result.tool_name);
                        writeln!(out, "{}", style.green(&line))?;
                    }
                }
                Message::CustomMessage { custom_type, .. } => {
                    self.line_break(out)?;
                    writeln!(out, "{}", style.dim(&format!("[{custom_type}]")))?;
                }
            },
            EntryPayload::Compaction(compaction) => {
                self.line_break(out)?;
                let line = format!(
                    "⋯ context compacted ({}): entries before {} summarised",
                    compaction.reason.as_str(),
                    compaction.first_kept_cursor
                );
                writeln!(out, "{}", style.dim(&line))?;
            }
            EntryPayload::Custom { custom_type, data } => {
                self.line_break(out)?;
                let text = data["text"].as_str().map(str::to_string);
                let line = match custom_type.as_str() {
                    custom_types::EXECUTION_STOPPED => style.yellow(&format!(
                        "■ stopped by {}",
                        data["by"].as_str().unwrap_or("?")
                    )),
                    custom_types::LLM_ERROR => style.red(&format!(
                        "✗ model error: {}{}",
                        data["message"].as_str().unwrap_or("?"),
                        if data["willRetry"] == true {
                            " (retrying)"
                        } else {
                            ""
                        }
                    )),
                    // Who asks to do what, where, and exactly what (not the model's API wording).
                    custom_types::APPROVAL_REQUESTED => style.yellow(&format!(
                        "? approval {} needed from {}: {}",
                        data["approvalId"].as_str().unwrap_or("?"),
                        data["approver"]["sub"].as_str().unwrap_or("?"),
                        wuhu_core::approvals::card_text(data)
                    )),
                    custom_types::APPROVAL_DECIDED => style.dim(&format!(
                        "approval {}: {}{}",
                        data["approvalId"].as_str().unwrap_or("?"),
                        data["decision"].as_str().unwrap_or("?"),
                        data["by"]
                            .as_str()
                            .map(|by| format!(" by {by}"))
                            .unwrap_or_default()
                    )),
                    other => style.dim(&text.unwrap_or_else(|| format!("[{other}]"))),
                };
                writeln!(out, "{line}")?;
            }
        }
        Ok(())
    }
}

/// Frames of the spinner drawn while a tool runs, on a terminal.
pub const SPINNER_FRAMES: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
/// The marker instead of frames when output may not move (not a terminal, `NO_COLOR`, `--json`):
/// the tool call's own `⋯ name args` line, nothing redrawn.
pub const STATIC_MARKER: &str = "⋯";
/// How often an animated spinner moves.
pub const SPINNER_TICK: Duration = Duration::from_millis(120);

/// The tool calls running (seen called, no result yet) and the spinner frame for them.
#[derive(Debug)]
pub struct Spinner {
    animated: bool,
    /// Running calls: (id, tool name), in call order. Bounded by the calls of one step.
    running: Vec<(String, String)>,
    tick: usize,
}

impl Spinner {
    /// A spinner; `animated` (see [`Style::animated`]) or a static marker.
    pub fn new(animated: bool) -> Spinner {
        Spinner {
            animated,
            running: Vec::new(),
            tick: 0,
        }
    }

    /// Follows an entry: an assistant message's tool calls start, their results end them.
    pub fn track(&mut self, entry: &Entry) {
        match &entry.payload {
            EntryPayload::Message {
                message: Message::Assistant(assistant),
            } => {
                for block in &assistant.content {
                    if let ContentBlock::ToolCall(call) = block {
                        self.running.push((call.id.clone(), call.name.clone()));
                    }
                }
            }
            EntryPayload::Message {
                message: Message::ToolResult(result),
            } => self.running.retain(|(id, _)| *id != result.tool_call_id),
            _ => {}
        }
    }

    /// The turn ended (idle, stopped, failed): nothing runs any more.
    pub fn clear(&mut self) {
        self.running.clear();
    }

    /// Whether a frame should be drawn now: animated and a tool runs.
    pub fn active(&self) -> bool {
        self.animated && !self.running.is_empty()
    }

    /// The current frame: cycling through [`SPINNER_FRAMES`] when animated, else
    /// [`STATIC_MARKER`].
    pub fn frame(&self) -> &'static str {
        if self.animated {
            SPINNER_FRAMES[self.tick % SPINNER_FRAMES.len()]
        } else {
            STATIC_MARKER
        }
    }

    /// Moves to the next frame.
    pub fn advance(&mut self) {
        self.tick = self.tick.wrapping_add(1);
    }

    /// The status line for the running calls (`⠋ running bash, read`), if any run.
    pub fn line(&self) -> Option<String> {
        if self.running.is_empty() {
            return None;
        }
        let names: Vec<&str> = self.running.iter().map(|(_, n)| n.as_str()).collect();
        Some(format!("{} running {}", self.frame(), names.join(", ")))
    }
}

/// The first `max` characters of one line of `text`, with `…` when cut.
pub fn summarize(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or("");
    if line.chars().count() <= max {
        line.to_string()
    } else {
        let mut cut: String = line.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wuhu_core::wire::{AssistantMessage, StopReason};

    fn assistant(cursor: u64, text: &str) -> FollowEvent {
        FollowEvent::Event(StreamEvent::EntryAppended {
            entry: Entry {
                cursor,
                id: format!("e{cursor}"),
                created_at: 0,
                payload: EntryPayload::Message {
                    message: Message::Assistant(AssistantMessage {
                        content: vec![ContentBlock::Text { text: text.into() }],
                        stop_reason: StopReason::Stop,
                        ..AssistantMessage::default()
                    }),
                },
            },
        })
    }

    fn delta(text: &str) -> FollowEvent {
        FollowEvent::Event(StreamEvent::AssistantTextDelta { delta: text.into() })
    }

    fn render(events: &[FollowEvent]) -> String {
        let mut renderer = Renderer::new(Style { color: false });
        let mut out = Vec::new();
        for event in events {
            renderer.event(&mut out, event).unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn others_queued_messages_are_shown_until_delivered_and_cancels_said() {
        let added = |id: &str, author: &str, lane| {
            FollowEvent::Event(StreamEvent::QueueItemAdded {
                id: id.into(),
                lane,
                author: author.into(),
                preview: format!("from {author}"),
            })
        };
        let removed = |id: &str, reason| {
            FollowEvent::Event(StreamEvent::QueueItemRemoved {
                id: id.into(),
                reason,
            })
        };
        use wuhu_core::wire::{Lane, QueueRemoval};
        let mut renderer = Renderer::new(Style { color: false });
        renderer.own_items.push("mine".into());
        let mut out = Vec::new();
        for event in [
            delta("working"),
            added("q1", "bob", Lane::FollowUp),
            added("mine", "ana", Lane::FollowUp),
            added("q2", "cy", Lane::Steer),
            removed("q1", QueueRemoval::Delivered),
            removed("q2", QueueRemoval::Cancelled),
        ] {
            renderer.event(&mut out, &event).unwrap();
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "working\n⋯ bob queued: from bob\n⋯ cy (steer) queued: from cy\n✗ queued message q2 was cancelled\n"
        );
    }

    #[test]
    fn running_output_is_shown_dimmed_between_entries() {
        let output = |text: &str| {
            FollowEvent::Event(StreamEvent::ToolOutputDelta {
                call_id: "c1".into(),
                stream: wuhu_core::wire::runner::OutputStream::Combined,
                text: text.into(),
            })
        };
        assert_eq!(
            render(&[
                delta("running it"),
                output("Compil"),
                output("ing a\nb"),
                output("\n"),
                output("partial"),
                assistant(3, "done"),
            ]),
            "running it\n│ Compiling a\n│ b\n│ partial\ndone\n"
        );
    }

    #[test]
    fn thinking_is_shown_dimmed_on_lines_of_its_own() {
        let thinking =
            |text: &str| FollowEvent::Event(StreamEvent::ThinkingDelta { delta: text.into() });
        let call = FollowEvent::Event(StreamEvent::ToolCallDelta {
            call_id: "c1".into(),
            name: "write".into(),
            arguments_delta: "{\"path\"".into(),
        });
        assert_eq!(
            render(&[
                thinking("the user"),
                thinking(" wants ls"),
                delta("Listing"),
                call,
                assistant(3, "Listing"),
                delta("again"),
                thinking("hm"),
                assistant(4, "again"),
            ]),
            "the user wants ls\nListing\nagain\nhm\nagain\n"
        );
        let mut renderer = Renderer::new(Style { color: true });
        let mut out = Vec::new();
        renderer.event(&mut out, &thinking("deep")).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "\u{1b}[2mdeep\u{1b}[0m");
    }

    #[test]
    fn streamed_text_is_shown_once_even_when_deltas_were_lost() {
        assert_eq!(
            render(&[delta("echo: "), delta("hi"), assistant(3, "echo: hi")]),
            "echo: hi\n"
        );
        // A reconnect lost the second delta: the entry shows what was not shown, once.
        assert_eq!(
            render(&[
                delta("echo: "),
                FollowEvent::Disconnected { reason: "x".into() },
                FollowEvent::Resumed { cursor: 2 },
                assistant(3, "echo: hi"),
            ]),
            "echo: \n⚠ connection lost (x); reconnecting…\n✓ reconnected; resuming after entry 2, nothing lost\n…hi\n"
        );
        assert_eq!(render(&[assistant(3, "plain")]), "plain\n");
    }

    /// Dropped at every point of a streamed reply (and with the deltas after the drop arriving
    /// or not): every character of the reply is shown exactly once, in order, and the next
    /// reply streams as usual.
    #[test]
    fn a_reply_interrupted_anywhere_is_shown_once() {
        let deltas = ["echo", ": ", "hel", "lo ", "wör", "ld"];
        let full: String = deltas.concat();
        for drop_at in 0..=deltas.len() {
            for resumed_from in drop_at..=deltas.len() {
                let mut events: Vec<FollowEvent> =
                    deltas[..drop_at].iter().map(|d| delta(d)).collect();
                events.push(FollowEvent::Disconnected { reason: "x".into() });
                events.push(FollowEvent::Resumed { cursor: 2 });
                // Deltas sent during the outage are lost; those after it arrive.
                events.extend(deltas[resumed_from..].iter().map(|d| delta(d)));
                events.push(assistant(3, &full));
                events.push(delta("next"));
                events.push(assistant(4, "next"));
                let shown: String = render(&events)
                    .lines()
                    .filter(|l| !l.starts_with('⚠') && !l.starts_with('✓'))
                    .map(|l| l.trim_start_matches('…'))
                    .collect();
                assert_eq!(
                    shown,
                    format!("{full}next"),
                    "drop after {drop_at} deltas, resumed from {resumed_from}"
                );
            }
        }
        // A drop, then a different reply (the turn was tried again): shown whole.
        let out = render(&[
            delta("first try"),
            FollowEvent::Disconnected { reason: "x".into() },
            FollowEvent::Resumed { cursor: 2 },
            assistant(3, "second try"),
        ]);
        assert!(out.ends_with("\nsecond try\n"), "{out}");
    }

    fn entry(payload: EntryPayload) -> Entry {
        Entry {
            cursor: 1,
            id: "e1".into(),
            created_at: 0,
            payload,
        }
    }

    fn calls(ids: &[(&str, &str)]) -> Entry {
        entry(EntryPayload::Message {
            message: Message::Assistant(AssistantMessage {
                content: ids
                    .iter()
                    .map(|(id, name)| {
                        ContentBlock::ToolCall(wuhu_core::wire::ToolCall {
                            id: (*id).into(),
                            name: (*name).into(),
                            arguments: json!({}),
                        })
                    })
                    .collect(),
                stop_reason: StopReason::ToolUse,
                ..AssistantMessage::default()
            }),
        })
    }

    fn result(id: &str) -> Entry {
        entry(EntryPayload::Message {
            message: Message::ToolResult(wuhu_core::wire::ToolResult {
                tool_call_id: id.into(),
                tool_name: "bash".into(),
                content: "ok".into(),
                is_error: false,
                blobs: Vec::new(),
            }),
        })
    }

    #[test]
    fn an_animated_spinner_cycles_every_frame_and_a_static_one_never_moves() {
        let mut spinner = Spinner::new(true);
        let mut seen = Vec::new();
        for _ in 0..SPINNER_FRAMES.len() * 2 {
            seen.push(spinner.frame());
            spinner.advance();
        }
        // Each frame differs from the one before, all frames appear, and they wrap around.
        assert!(seen.windows(2).all(|w| w[0] != w[1]), "{seen:?}");
        assert_eq!(&seen[..SPINNER_FRAMES.len()], &SPINNER_FRAMES[..]);
        assert_eq!(&seen[SPINNER_FRAMES.len()..], &SPINNER_FRAMES[..]);
        let mut still = Spinner::new(false);
        still.track(&calls(&[("c1", "bash")]));
        for _ in 0..3 {
            assert_eq!(still.frame(), STATIC_MARKER);
            still.advance();
        }
        assert!(!still.active(), "a static spinner is never redrawn");
        assert_eq!(still.line().as_deref(), Some("⋯ running bash"));
    }

    #[test]
    fn the_spinner_runs_from_a_tool_call_until_its_result_or_the_turn_end() {
        let mut spinner = Spinner::new(true);
        assert!(!spinner.active());
        assert_eq!(spinner.line(), None);
        spinner.track(&calls(&[("c1", "bash"), ("c2", "read")]));
        assert!(spinner.active());
        assert_eq!(spinner.line().as_deref(), Some("⠋ running bash, read"));
        spinner.track(&result("c1"));
        spinner.advance();
        assert_eq!(spinner.line().as_deref(), Some("⠙ running read"));
        spinner.track(&result("other"));
        assert!(spinner.active());
        spinner.track(&result("c2"));
        assert!(!spinner.active());
        spinner.track(&calls(&[("c3", "bash")]));
        spinner.clear();
        assert!(!spinner.active());
    }

    #[test]
    fn summaries_are_cut_on_characters() {
        assert_eq!(summarize("héllo wörld", 5), "héllo…");
        assert_eq!(summarize("a\nb", 5), "a");
    }
}
