//! Where a running `bash` call sends its live output (`tool_progress` frames): the rules
//! (decoding, masking, coalescing, bounds) are `wuhu_core::tool_output::Progress`'; this is the
//! way to the connection's writer.
//!
//! Frames wait in the connection's outgoing queue with the calls' results. A call sends a
//! frame only while the progress text queued on its connection is under
//! [`MAX_QUEUED_PROGRESS_BYTES`]: on a slow connection its output keeps waiting in its own
//! bounded buffer (where the oldest is dropped), so the runner's memory stays flat whatever
//! the commands print.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;
use wuhu_core::masking::Masker;
use wuhu_core::tool_output::Progress;
use wuhu_core::wire::runner::{OutputStream, RunnerMessage};

/// Bytes of progress text one connection lets wait to be written, across its calls.
pub const MAX_QUEUED_PROGRESS_BYTES: usize = 256 * 1024;

/// Progress text queued on one connection and not written yet.
#[derive(Clone, Debug, Default)]
pub struct Queued(Arc<AtomicUsize>);

impl Queued {
    /// `message` was written (or dropped): what it queued is no longer waiting.
    pub fn written(&self, message: &RunnerMessage) {
        if let RunnerMessage::ToolProgress { text, .. } = message {
            self.0.fetch_sub(text.len(), Ordering::Relaxed);
        }
    }
}

/// One call's way to its connection.
#[derive(Clone)]
pub struct ProgressSink {
    id: String,
    masker: Option<Masker>,
    out: mpsc::UnboundedSender<RunnerMessage>,
    queued: Queued,
}

/// Never shows the masker's values.
impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressSink")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ProgressSink {
    /// Frames of call `id`, masked with `masker` (the session's known secrets), to `out`.
    pub fn new(
        id: &str,
        masker: Option<Masker>,
        out: mpsc::UnboundedSender<RunnerMessage>,
        queued: Queued,
    ) -> ProgressSink {
        ProgressSink {
            id: id.to_string(),
            masker,
            out,
            queued,
        }
    }

    /// The call's state machine.
    pub fn progress(&self) -> Progress {
        Progress::new(self.masker.clone())
    }

    /// Whether the connection has room for another frame now.
    pub fn has_room(&self) -> bool {
        self.queued.0.load(Ordering::Relaxed) < MAX_QUEUED_PROGRESS_BYTES
    }

    /// Sends one frame.
    pub fn send(&self, text: String) {
        self.queued.0.fetch_add(text.len(), Ordering::Relaxed);
        let message = RunnerMessage::ToolProgress {
            id: self.id.clone(),
            stream: OutputStream::Combined,
            text,
        };
        if let Err(unsent) = self.out.send(message) {
            self.queued.written(&unsent.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::bash::{BashArgs, bash};
    use crate::tools::tests::context;
    use wuhu_core::tool_output::{MAX_PROGRESS_BYTES_PER_CALL, MAX_PROGRESS_FRAME_TEXT_BYTES};
    use wuhu_core::wire::runner::EnvironmentKind;

    fn texts(rx: &mut mpsc::UnboundedReceiver<RunnerMessage>, queued: &Queued) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(message) = rx.try_recv() {
            queued.written(&message);
            match message {
                RunnerMessage::ToolProgress { id, stream, text } => {
                    assert_eq!((id.as_str(), stream), ("call-1", OutputStream::Combined));
                    out.push(text);
                }
                other => panic!("{other:?}"),
            }
        }
        out
    }

    /// A command's first line arrives while it still runs (it waits for a file this test
    /// writes only once the line came), masked; the rest after.
    #[tokio::test(flavor = "current_thread")]
    async fn output_arrives_while_the_command_runs_masked() {
        let (dir, mut ctx) = context(EnvironmentKind::Local);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let queued = Queued::default();
        let masker = Masker::new([("TOKEN", "s3cr3t-value-42")]);
        ctx.progress = Some(ProgressSink::new(
            "call-1",
            Some(masker),
            tx,
            queued.clone(),
        ));
        let go = dir.path().join("go");
        let command = format!(
            "echo first s3cr3t-value-42; while [ ! -e {go} ]; do sleep 0.02; done; echo second",
            go = go.display()
        );
        let run = tokio::spawn(async move {
            bash(
                &ctx,
                BashArgs {
                    command,
                    timeout: Some(30.0),
                },
            )
            .await
        });
        let mut seen = String::new();
        while !seen.contains("first") {
            match rx.recv().await {
                Some(message) => {
                    queued.written(&message);
                    if let RunnerMessage::ToolProgress { text, .. } = message {
                        seen.push_str(&text);
                    }
                }
                None => panic!("the call ended before its first line arrived"),
            }
            assert!(!run.is_finished());
        }
        std::fs::write(&go, "").unwrap();
        let output = run.await.unwrap();
        seen.extend(texts(&mut rx, &queued));
        assert!(output.content.contains("second"), "{}", output.content);
        assert!(seen.starts_with("first [secret:TOKEN]\n"), "{seen:?}");
        assert!(!seen.contains("s3cr3t"), "{seen:?}");
    }

    /// A command printing 50 MB: a few frames, each bounded, all within the call's budget.
    #[tokio::test(flavor = "current_thread")]
    async fn a_flood_is_bounded() {
        let (_dir, mut ctx) = context(EnvironmentKind::Local);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let queued = Queued::default();
        ctx.progress = Some(ProgressSink::new("call-1", None, tx, queued.clone()));
        let command = String::from("head -c 50000000 /dev/zero | tr '\\0' 'x'");
        let output = bash(
            &ctx,
            BashArgs {
                command,
                timeout: Some(60.0),
            },
        )
        .await;
        assert!(!output.is_error, "{}", output.content);
        let frames = texts(&mut rx, &queued);
        let sent: usize = frames.iter().map(String::len).sum();
        assert!(!frames.is_empty());
        assert!(
            frames
                .iter()
                .all(|f| f.len() <= MAX_PROGRESS_FRAME_TEXT_BYTES)
        );
        assert!(sent <= MAX_PROGRESS_BYTES_PER_CALL + 1024, "{sent}");
        assert_eq!(queued.0.load(Ordering::Relaxed), 0);
    }
}
