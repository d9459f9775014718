//! An incremental Server-Sent Events decoder (the line and field layer of the WHATWG
//! `text/event-stream` format), push-based and sans-IO: feed bytes in pieces of any size, get
//! frames and comments out. Used by the OpenAI-compatible provider and by Rust clients of the
//! follow stream (the e2e harness).
//!
//! * Lines end at LF, CRLF or a lone CR (a CR at the end of a piece waits for the next piece).
//! * A byte order mark at the start of the stream is dropped.
//! * `data` lines are joined with `\n`; a blank line dispatches the frame if it had `data`.
//! * `event` and `id` belong to the frame they appear in (the caller tracks the last id).
//! * `retry` and unknown fields are ignored; `:` lines are comments.
//! * **Bound**: a line, and the joined data of one frame, are at most `max_bytes` each; more is
//!   [`SseError::TooLarge`] and the decoder stays failed.

/// One dispatched frame.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseFrame {
    /// The `id` field of this frame, if it had one.
    pub id: Option<String>,
    /// The `event` field, if it had one (`message` by default, per the standard).
    pub event: Option<String>,
    /// The `data` lines joined with `\n`.
    pub data: String,
}

/// What the decoder yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SseItem {
    /// A frame.
    Frame(SseFrame),
    /// A comment line, without the colon and one optional space after it.
    Comment(String),
}

/// Why decoding stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line or a frame's data is longer than the decoder's bound.
    #[error("an event-stream line or frame is larger than {0} bytes")]
    TooLarge(usize),
}

/// The decoder's state between pieces.
#[derive(Debug)]
pub struct SseDecoder {
    max_bytes: usize,
    /// Bytes of the current, unterminated line.
    line: Vec<u8>,
    /// The previous piece ended with `\r`: a leading `\n` belongs to that line end.
    after_cr: bool,
    /// Whether a line was seen yet (a leading byte order mark is dropped).
    seen_line: bool,
    frame: SseFrame,
    has_data: bool,
    failed: Option<SseError>,
}

impl SseDecoder {
    /// A decoder at the start of a stream, bounding lines and frame data to `max_bytes`.
    pub fn new(max_bytes: usize) -> SseDecoder {
        SseDecoder {
            max_bytes,
            line: Vec::new(),
            after_cr: false,
            seen_line: false,
            frame: SseFrame::default(),
            has_data: false,
            failed: None,
        }
    }

    /// Decodes the next piece; complete items are appended to `out` in order.
    ///
    /// # Errors
    /// [`SseError::TooLarge`], then again on every later call.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<SseItem>) -> Result<(), SseError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if let Some(rest) = bytes.strip_prefix(b"\n") {
                    bytes = rest;
                    continue;
                }
            }
            let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') else {
                self.extend_line(bytes)?;
                break;
            };
            let (head, tail) = bytes.split_at(end);
            self.extend_line(head)?;
            self.after_cr = tail.first() == Some(&b'\r');
            bytes = tail.get(1..).unwrap_or_default();
            let line = std::mem::take(&mut self.line);
            let outcome = self.process_line(&line, out);
            self.line = line;
            self.line.clear();
            outcome?;
        }
        Ok(())
    }

    /// Ends the stream: a last line without its terminator, and a last frame without its
    /// blank line, are dispatched.
    ///
    /// # Errors
    /// As [`SseDecoder::push`].
    pub fn finish(&mut self, out: &mut Vec<SseItem>) -> Result<(), SseError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, out)?;
        }
        self.dispatch(out);
        Ok(())
    }

    fn fail(&mut self) -> SseError {
        let error = SseError::TooLarge(self.max_bytes);
        self.failed = Some(error);
        error
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len().saturating_add(bytes.len()) > self.max_bytes {
            return Err(self.fail());
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// One complete line, without its terminator.
    fn process_line(&mut self, line: &[u8], out: &mut Vec<SseItem>) -> Result<(), SseError> {
        let mut line = line;
        if !self.seen_line {
            self.seen_line = true;
            line = line.strip_prefix("\u{feff}".as_bytes()).unwrap_or(line);
        }
        if line.is_empty() {
            self.dispatch(out);
            return Ok(());
        }
        let text = String::from_utf8_lossy(line);
        if let Some(comment) = text.strip_prefix(':') {
            let comment = comment.strip_prefix(' ').unwrap_or(comment);
            out.push(SseItem::Comment(comment.to_string()));
            return Ok(());
        }
        let (field, value) = match text.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (&*text, ""),
        };
        match field {
            "data" => {
                let joined = self
                    .frame
                    .data
                    .len()
                    .saturating_add(value.len())
                    .saturating_add(1);
                if joined > self.max_bytes {
                    return Err(self.fail());
                }
                if self.has_data {
                    self.frame.data.push('\n');
                }
                self.frame.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.frame.event = Some(value.to_string()),
            // An id with NUL is ignored, as the standard says.
            "id" if !value.contains('\0') => self.frame.id = Some(value.to_string()),
            _ => {}
        }
        Ok(())
    }

    /// Ends the current frame: dispatched when it had `data`, dropped otherwise.
    fn dispatch(&mut self, out: &mut Vec<SseItem>) {
        let frame = std::mem::take(&mut self.frame);
        if std::mem::take(&mut self.has_data) {
            out.push(SseItem::Frame(frame));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(pieces: &[&[u8]], max: usize) -> Result<Vec<SseItem>, SseError> {
        let mut decoder = SseDecoder::new(max);
        let mut out = Vec::new();
        for piece in pieces {
            decoder.push(piece, &mut out)?;
        }
        decoder.finish(&mut out)?;
        Ok(out)
    }

    fn frame(id: Option<&str>, event: Option<&str>, data: &str) -> SseItem {
        SseItem::Frame(SseFrame {
            id: id.map(str::to_string),
            event: event.map(str::to_string),
            data: data.to_string(),
        })
    }

    const WIRE: &[u8] =
        b"\xef\xbb\xbfid: 7\nevent: entry_appended\ndata: {\"a\":1}\n\n: heartbeat\n\n\
event: idle\r\ndata: {}\r\n\r\nevent: x\rdata: a\rdata:b\r\rdata\n\nid: 9\nevent: no data\n\n\
retry: 5\nunknown: y\ndata:  two spaces\n\ndata: last without blank line";

    fn expected() -> Vec<SseItem> {
        vec![
            frame(Some("7"), Some("entry_appended"), "{\"a\":1}"),
            SseItem::Comment("heartbeat".into()),
            frame(None, Some("idle"), "{}"),
            frame(None, Some("x"), "a\nb"),
            frame(None, None, ""),
            frame(None, None, " two spaces"),
            frame(None, None, "last without blank line"),
        ]
    }

    #[test]
    fn decodes_the_standard_line_and_field_rules() {
        assert_eq!(decode(&[WIRE], 1024), Ok(expected()));
    }

    #[test]
    fn every_split_and_byte_by_byte_decode_the_same() {
        for split in 0..=WIRE.len() {
            assert_eq!(
                decode(&[&WIRE[..split], &WIRE[split..]], 1024),
                Ok(expected()),
                "split at {split}"
            );
        }
        let bytes: Vec<&[u8]> = WIRE.chunks(1).collect();
        assert_eq!(decode(&bytes, 1024), Ok(expected()));
    }

    #[test]
    fn a_crlf_split_across_pieces_is_one_line_end() {
        assert_eq!(
            decode(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"], 64),
            Ok(vec![frame(None, None, "a\nb")])
        );
    }

    #[test]
    fn lines_and_data_are_bounded() {
        assert_eq!(
            decode(&[b"data: 0123456789"], 8),
            Err(SseError::TooLarge(8))
        );
        // Each line fits, the joined data does not.
        assert_eq!(
            decode(&[b"data:abcd\ndata:efgh\n\n"], 8),
            Err(SseError::TooLarge(8))
        );
        // At the bound exactly: fine.
        assert_eq!(
            decode(&[b"data:abc\n\n"], 8),
            Ok(vec![frame(None, None, "abc")])
        );
        // Failed stays failed.
        let mut decoder = SseDecoder::new(4);
        let mut out = Vec::new();
        assert!(decoder.push(b"data: long", &mut out).is_err());
        assert_eq!(decoder.push(b"\n\n", &mut out), Err(SseError::TooLarge(4)));
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        assert_eq!(
            decode(&[b"data: \xff\n\n"], 64),
            Ok(vec![frame(None, None, "\u{fffd}")])
        );
    }
}
