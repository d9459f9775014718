//! The console buffer: lines with a total size cap.

use std::fmt;

/// The level of a console line: which `console` method wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsoleLevel {
    /// `console.log`.
    Log,
    /// `console.info`.
    Info,
    /// `console.warn`.
    Warn,
    /// `console.error`, and errors thrown by `setTimeout` callbacks.
    Error,
    /// `console.debug` and `console.trace`.
    Debug,
}

impl ConsoleLevel {
    /// The method name: `log`, `info`, `warn`, `error` or `debug`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConsoleLevel::Log => "log",
            ConsoleLevel::Info => "info",
            ConsoleLevel::Warn => "warn",
            ConsoleLevel::Error => "error",
            ConsoleLevel::Debug => "debug",
        }
    }

    #[cfg(feature = "engine")]
    fn from_name(name: &str) -> ConsoleLevel {
        match name {
            "info" => ConsoleLevel::Info,
            "warn" => ConsoleLevel::Warn,
            "error" => ConsoleLevel::Error,
            "debug" => ConsoleLevel::Debug,
            _ => ConsoleLevel::Log,
        }
    }
}

impl fmt::Display for ConsoleLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One call of a `console` method.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConsoleLine {
    /// Which method wrote the line.
    pub level: ConsoleLevel,
    /// The formatted arguments, joined with spaces. May contain newlines.
    pub text: String,
}

/// Console lines up to a byte cap; each line costs its text plus one byte.
#[cfg(feature = "engine")]
#[derive(Debug)]
pub(crate) struct ConsoleBuffer {
    lines: Vec<ConsoleLine>,
    cap_bytes: usize,
    used_bytes: usize,
    truncated: bool,
}

#[cfg(feature = "engine")]
impl ConsoleBuffer {
    pub(crate) fn new(cap_bytes: usize) -> Self {
        ConsoleBuffer {
            lines: Vec::new(),
            cap_bytes,
            used_bytes: 0,
            truncated: false,
        }
    }

    /// Appends a line, cutting it (at a character boundary) if it does not fit.
    pub(crate) fn push(&mut self, level: &str, mut text: String) {
        if self.truncated {
            return;
        }
        let room = self.cap_bytes.saturating_sub(self.used_bytes);
        let cost = text.len().saturating_add(1);
        if cost > room {
            self.truncated = true;
            let mut keep = room.saturating_sub(1).min(text.len());
            while !text.is_char_boundary(keep) {
                keep -= 1;
            }
            if keep == 0 {
                return;
            }
            text.truncate(keep);
        }
        self.used_bytes = self.used_bytes.saturating_add(text.len() + 1);
        self.lines.push(ConsoleLine {
            level: ConsoleLevel::from_name(level),
            text,
        });
    }

    pub(crate) fn take(&mut self) -> (Vec<ConsoleLine>, bool) {
        (std::mem::take(&mut self.lines), self.truncated)
    }
}

#[cfg(all(test, feature = "engine"))]
mod tests {
    use super::*;

    #[test]
    fn cuts_at_the_cap_and_at_char_boundaries() {
        let mut buffer = ConsoleBuffer::new(10);
        buffer.push("log", "abc".into()); // 4 bytes
        buffer.push("warn", "ééé".into()); // 7 bytes but 6 left: 5 would split a char, so "éé"
        buffer.push("log", "dropped".into());
        let (lines, truncated) = buffer.take();
        assert!(truncated);
        assert_eq!(
            lines,
            vec![
                ConsoleLine {
                    level: ConsoleLevel::Log,
                    text: "abc".into()
                },
                ConsoleLine {
                    level: ConsoleLevel::Warn,
                    text: "éé".into()
                },
            ]
        );
    }

    #[test]
    fn an_exact_fit_is_not_truncated() {
        let mut buffer = ConsoleBuffer::new(4);
        buffer.push("log", "abc".into());
        let (lines, truncated) = buffer.take();
        assert!(!truncated);
        assert_eq!(lines.len(), 1);
    }
}
