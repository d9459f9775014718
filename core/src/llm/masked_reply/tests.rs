//! A reply's deltas split at every byte of a secret and of each of its encodings; blocks of
//! every kind around them; a reply without secrets shown as it streams.

use serde_json::json;

use super::*;
use crate::llm::AssistantBuilder;
use crate::masking::encodings;
use crate::wire::{StopReason, ToolCall, Usage};

const NAME: &str = "DEPLOY_KEY";
const VALUE: &str = "dk/Live+Key?Odd&Chars=9";
const PLACEHOLDER: &str = "[secret:DEPLOY_KEY]";

/// The assistant text among `events`.
fn text_of(events: Vec<StreamEvent>) -> String {
    events
        .into_iter()
        .filter_map(|e| match e {
            StreamEvent::AssistantTextDelta { delta } => Some(delta),
            _ => None,
        })
        .collect()
}

fn masker() -> Masker {
    Masker::new([(NAME, VALUE), ("UNICODE", "pässwörd-ünïcode-42")])
}

fn boundaries(text: &str) -> Vec<usize> {
    (1..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect()
}

/// Streams `text` cut at `cuts` as text deltas; checks that no shown piece holds `secret`,
/// that what was shown is what is stored, and that both are `mask_known` of the text.
fn stream_text(masker: &Masker, text: &str, cuts: &[usize], secret: &str) -> String {
    let mut reply = MaskedReply::new(masker.clone());
    let mut shown = String::new();
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&text.len())) {
        let piece = text_of(reply.push(LlmEvent::TextDelta(text[at..cut].to_string())));
        assert!(!piece.contains(secret), "{cuts:?}: {piece}");
        shown.push_str(&piece);
        at = cut;
    }
    reply.push(LlmEvent::Finish(StopReason::Stop));
    shown.push_str(&text_of(reply.finish()));
    let stored = reply.build("p", "m");
    let stored_text = match stored.content.as_slice() {
        [ContentBlock::Text { text }] => text.clone(),
        other => panic!("{cuts:?}: {other:?}"),
    };
    assert_eq!(shown, stored_text, "{cuts:?}");
    assert_eq!(shown, masker.mask_known(text), "{cuts:?}");
    assert!(!shown.contains(secret), "{cuts:?}: {shown}");
    shown
}

#[test]
fn a_secret_split_at_every_byte_into_two_and_three_deltas() {
    let masker = masker();
    let text = format!("the key is {VALUE}, keep it");
    let cuts = boundaries(&text);
    for &i in &cuts {
        let shown = stream_text(&masker, &text, &[i], VALUE);
        assert_eq!(shown, format!("the key is {PLACEHOLDER}, keep it"));
        for &j in cuts.iter().filter(|&&j| j > i) {
            stream_text(&masker, &text, &[i, j], VALUE);
        }
    }
    // One byte (character) per delta.
    stream_text(&masker, &text, &cuts, VALUE);
    // A multibyte value, one character per delta, next to other multibyte text.
    let text = "→pässwörd-ünïcode-42← ok";
    let shown = stream_text(&masker, text, &boundaries(text), "pässwörd-ünïcode-42");
    assert_eq!(shown, "→[secret:UNICODE]← ok");
}

#[test]
fn every_encoding_split_at_every_byte() {
    let masker = masker();
    for value in [VALUE, "pässwörd-ünïcode-42"] {
        for encoded in encodings(value) {
            let text = format!("out: {encoded}\nnext");
            let cuts = boundaries(&text);
            for &i in &cuts {
                let shown = stream_text(&masker, &text, &[i], &encoded);
                assert!(shown.contains("[secret:"), "{encoded}: {shown}");
            }
            stream_text(&masker, &text, &cuts, &encoded);
        }
    }
}

#[test]
fn a_reply_without_secrets_is_shown_as_it_streams() {
    // No secrets known: every delta is shown whole, at once.
    let mut reply = MaskedReply::new(Masker::default());
    for delta in [
        "Hel",
        "lo, ",
        "wor",
        "ld ",
        "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
        "é",
        "!",
    ] {
        assert_eq!(
            text_of(reply.push(LlmEvent::TextDelta(delta.into()))),
            delta
        );
    }
    assert_eq!(reply.finish(), vec![]);
    // Secrets known, none in the text: at most the longest pattern less one byte is held.
    let masker = masker();
    let bound = masker.longest() - 1;
    let text =
        "an ordinary answer with nothing to hide, long enough to stream past the bound. ".repeat(4);
    let mut reply = MaskedReply::new(masker.clone());
    let (mut sent, mut shown) = (0, String::new());
    for piece in text.as_bytes().chunks(7) {
        shown.push_str(&text_of(reply.push(LlmEvent::TextDelta(
            String::from_utf8(piece.to_vec()).unwrap(),
        ))));
        sent += piece.len();
        assert!(text[..sent].starts_with(&shown));
        assert!(sent - shown.len() <= bound, "{} held", sent - shown.len());
    }
    shown.push_str(&text_of(reply.finish()));
    assert_eq!(shown, text);
}

/// The message an unmasked builder makes of `events`, masked as a whole afterwards.
fn masked_after(masker: &Masker, events: &[LlmEvent]) -> AssistantMessage {
    let mut builder = AssistantBuilder::default();
    events.iter().cloned().for_each(|e| builder.push(e));
    let mut message = builder.build("p", "m");
    for block in &mut message.content {
        match block {
            ContentBlock::Text { text } | ContentBlock::Thinking { thinking: text, .. } => {
                *text = masker.mask_known(text).into_owned();
            }
            ContentBlock::ToolCall(call) => {
                crate::secrets::mask_known_json(masker, &mut call.arguments)
            }
            ContentBlock::Reasoning { summary, .. } => {
                for part in summary {
                    *part = masker.mask_known(part).into_owned();
                }
            }
            ContentBlock::RedactedThinking { .. } => {}
        }
    }
    message
}

/// `text` as deltas made by `make`, cut at `cut`.
fn split(text: &str, cut: usize, make: fn(String) -> LlmEvent) -> Vec<LlmEvent> {
    let cut = (0..=cut.min(text.len()))
        .rev()
        .find(|&c| text.is_char_boundary(c))
        .unwrap_or(0);
    vec![make(text[..cut].to_string()), make(text[cut..].to_string())]
}

#[test]
fn blocks_of_every_kind_keep_their_order_and_store_what_was_shown() {
    let masker = masker();
    let thinking = format!("the user wants {VALUE} printed");
    let text = format!("Running it with {VALUE}.");
    let args = json!({"command": format!("echo {VALUE}")}).to_string();
    let after = format!("{VALUE} done");
    for cut in 0..text.len().max(thinking.len()).max(args.len()) {
        let mut events = vec![LlmEvent::ThinkingStart];
        events.extend(split(&thinking, cut, LlmEvent::ThinkingDelta));
        events.push(LlmEvent::ThinkingSignature("c2ln".into()));
        events.extend(split(&text, cut, LlmEvent::TextDelta));
        events.push(LlmEvent::ToolCallStart {
            index: 0,
            id: "toolu_1".into(),
            name: "bash".into(),
        });
        for event in split(&args, cut, |delta| LlmEvent::ToolCallArgumentsDelta {
            index: 0,
            delta,
        }) {
            events.push(event);
        }
        events.push(LlmEvent::RedactedThinking("opaque".into()));
        events.extend(split(&after, cut, LlmEvent::TextDelta));
        events.push(LlmEvent::Usage(Usage::default()));
        events.extend(split(" and more", cut, LlmEvent::TextDelta));
        events.push(LlmEvent::Reasoning {
            id: "rs_1".into(),
            summary: vec![format!("about {VALUE}")],
            encrypted_content: None,
        });
        events.push(LlmEvent::Finish(StopReason::ToolUse));

        let mut reply = MaskedReply::new(masker.clone());
        let mut shown = String::new();
        for event in events.iter().cloned() {
            shown.push_str(&text_of(reply.push(event)));
        }
        shown.push_str(&text_of(reply.finish()));
        let stored = reply.build("p", "m");
        assert_eq!(stored, masked_after(&masker, &events), "cut {cut}");
        let stored_text: String = stored
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(shown, stored_text, "cut {cut}");
        assert!(!serde_json::to_string(&stored).unwrap().contains("Live+Key"));
    }
    // The shape, once.
    let mut reply = MaskedReply::new(masker.clone());
    for event in [
        LlmEvent::ThinkingDelta(format!("x {}", &VALUE[..5])),
        LlmEvent::ThinkingDelta(VALUE[5..].to_string()),
        LlmEvent::TextDelta(format!("say {}", &VALUE[..9])),
        LlmEvent::ToolCallStart {
            index: 0,
            id: "t".into(),
            name: "bash".into(),
        },
        LlmEvent::ToolCallArgumentsDelta {
            index: 0,
            delta: format!("{{\"command\":\"echo {VALUE}\"}}"),
        },
    ] {
        reply.push(event);
    }
    let stored = reply.build("p", "m");
    assert_eq!(
        stored.content,
        vec![
            ContentBlock::Thinking {
                thinking: format!("x {PLACEHOLDER}"),
                signature: String::new(),
            },
            // Half a value, cut by the block's end, is not the value.
            ContentBlock::Text {
                text: format!("say {}", &VALUE[..9]),
            },
            ContentBlock::ToolCall(ToolCall {
                id: "t".into(),
                name: "bash".into(),
                arguments: json!({"command": format!("echo {PLACEHOLDER}")}),
            }),
        ]
    );
}

/// The events followers get, as lines: `text …`, `thinking …`, `call ID NAME …`, each kind's
/// consecutive deltas joined.
fn shown_lines(events: &[StreamEvent]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for event in events {
        let (head, text) = match event {
            StreamEvent::AssistantTextDelta { delta } => ("text".to_string(), delta),
            StreamEvent::ThinkingDelta { delta } => ("thinking".to_string(), delta),
            StreamEvent::ToolCallDelta {
                call_id,
                name,
                arguments_delta,
            } => (format!("call {call_id} {name}"), arguments_delta),
            other => panic!("{other:?}"),
        };
        match lines.last_mut() {
            Some(last) if last.starts_with(&format!("{head}: ")) => last.push_str(text),
            _ => lines.push(format!("{head}: {text}")),
        }
    }
    lines
}

/// Thinking, a reasoning summary and tool-call arguments reach followers as they stream,
/// masked at every split, each call apart; the summary is stored once (by its item), not from
/// its deltas.
#[test]
fn thinking_summaries_and_arguments_are_shown_masked_at_every_split() {
    let masker = masker();
    let thinking = format!("think {VALUE} over");
    let summary = format!("**Plan** use {VALUE}");
    let args_a = json!({"path": "src/main.rs", "content": format!("key={VALUE}")}).to_string();
    let args_b = json!({"command": "ls"}).to_string();
    for cut in 0..args_a.len() {
        let mut events = vec![LlmEvent::ThinkingStart];
        events.extend(split(&thinking, cut, LlmEvent::ThinkingDelta));
        events.extend(split(&summary, cut, LlmEvent::ReasoningSummaryDelta));
        events.push(LlmEvent::Reasoning {
            id: "rs_1".into(),
            summary: vec![summary.clone()],
            encrypted_content: Some("enc".into()),
        });
        events.push(LlmEvent::ToolCallStart {
            index: 1,
            id: "call_a".into(),
            name: "write".into(),
        });
        events.push(LlmEvent::ToolCallStart {
            index: 2,
            id: "call_b".into(),
            name: "bash".into(),
        });
        // Chat Completions may interleave the calls' deltas.
        let a = split(&args_a, cut, |delta| LlmEvent::ToolCallArgumentsDelta {
            index: 1,
            delta,
        });
        let b = split(&args_b, cut, |delta| LlmEvent::ToolCallArgumentsDelta {
            index: 2,
            delta,
        });
        events.extend([a[0].clone(), b[0].clone(), a[1].clone(), b[1].clone()]);
        events.push(LlmEvent::Finish(StopReason::ToolUse));

        let mut reply = MaskedReply::new(masker.clone());
        let mut shown = Vec::new();
        for event in events.iter().cloned() {
            shown.extend(reply.push(event));
        }
        shown.extend(reply.finish());
        assert!(
            !serde_json::to_string(&shown).unwrap().contains("Live+Key"),
            "cut {cut}"
        );
        let mut lines = shown_lines(&shown);
        // The calls' deltas may interleave: compare each call's text.
        let calls: Vec<String> = lines.split_off(1);
        assert_eq!(
            lines,
            [format!(
                "thinking: think {PLACEHOLDER} over**Plan** use {PLACEHOLDER}"
            )],
            "cut {cut}"
        );
        let call_text = |id: &str| -> String {
            shown
                .iter()
                .filter_map(|e| match e {
                    StreamEvent::ToolCallDelta {
                        call_id,
                        arguments_delta,
                        ..
                    } if call_id == id => Some(arguments_delta.as_str()),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(call_text("call_a"), masker.mask_known(&args_a), "cut {cut}");
        assert_eq!(call_text("call_b"), args_b, "cut {cut}");
        assert!(calls.iter().all(|l| l.starts_with("call ")), "{calls:?}");
        let stored = reply.build("p", "m");
        assert_eq!(stored, masked_after(&masker, &events), "cut {cut}");
        // The summary is stored once: in its reasoning item.
        let json = serde_json::to_string(&stored).unwrap();
        assert_eq!(json.matches("**Plan**").count(), 1, "{json}");
    }
}

/// A call's arguments stream up to the bound, cut at a character boundary; the stored call
/// has them all.
#[test]
fn argument_deltas_are_bounded_per_call() {
    for masker in [Masker::default(), masker()] {
        let content = "é".repeat(MAX_STREAMED_ARGUMENT_BYTES);
        let args = json!({ "content": content }).to_string();
        let mut reply = MaskedReply::new(masker);
        let mut shown = Vec::new();
        shown.extend(reply.push(LlmEvent::ToolCallStart {
            index: 0,
            id: "c".into(),
            name: "write".into(),
        }));
        let mut at = 0;
        while at < args.len() {
            let mut end = (at + 999).min(args.len());
            while !args.is_char_boundary(end) {
                end += 1;
            }
            shown.extend(reply.push(LlmEvent::ToolCallArgumentsDelta {
                index: 0,
                delta: args[at..end].to_string(),
            }));
            at = end;
        }
        shown.extend(reply.finish());
        let streamed: String = shown
            .iter()
            .map(|e| match e {
                StreamEvent::ToolCallDelta {
                    arguments_delta, ..
                } => arguments_delta.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(streamed.len() <= MAX_STREAMED_ARGUMENT_BYTES);
        assert!(streamed.len() > MAX_STREAMED_ARGUMENT_BYTES - 4);
        assert!(args.starts_with(&streamed));
        let stored = reply.build("p", "m");
        let ContentBlock::ToolCall(call) = &stored.content[0] else {
            panic!("{stored:?}");
        };
        assert_eq!(call.arguments["content"], content);
    }
}
