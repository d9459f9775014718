//! Forks: a new session whose history is the first `N` entries of another one. The new session
//! does not copy them: its host reads cursors `1..=N` from the session it was forked from (which
//! reads its own fork's prefix the same way). This module derives the loop state those entries
//! imply, one page at a time, so a long prefix is never held whole.

use super::{Checkpoint, Millis, Session};
use crate::compaction::Anchors;
use crate::wire::{Entry, ForkedFrom};
use crate::wire::{EntryPayload, Header, Message, custom_types};

/// What a fork's history implies, gathered entry by entry (oldest first, every cursor
/// `1..=N` once).
#[derive(Debug, Default)]
pub struct ForkPrefix {
    anchors: Anchors,
    group_chat_since: Option<u64>,
    header: Option<Header>,
    last_cursor: u64,
}

impl ForkPrefix {
    /// Notes the next entry of the history.
    pub fn observe(&mut self, entry: &Entry) {
        let _ = self.anchors.observe(entry);
        self.last_cursor = entry.cursor;
        match &entry.payload {
            EntryPayload::Header(header) => self.header = Some(header.clone()),
            EntryPayload::Custom { custom_type, data }
                if custom_type == custom_types::MODEL_CHANGED =>
            {
                let to = &data["to"];
                if let (Some(header), Some(provider), Some(model)) = (
                    self.header.as_mut(),
                    to["provider"].as_str(),
                    to["model"].as_str(),
                ) {
                    header.provider = provider.to_string();
                    header.model = model.to_string();
                }
            }
            // The reasoning setting as the history left it (`null`: none).
            EntryPayload::Custom { custom_type, data }
                if custom_type == custom_types::REASONING_CHANGED =>
            {
                if let (Some(header), Ok(to)) = (
                    self.header.as_mut(),
                    serde_json::from_value(data["to"].clone()),
                ) {
                    header.reasoning = to;
                }
            }
            EntryPayload::Message {
                message: Message::CustomMessage { custom_type, .. },
            } if custom_type == custom_types::GROUP_CHAT_REMINDER => {
                self.group_chat_since.get_or_insert(entry.cursor);
            }
            _ => {}
        }
    }

    /// The newest cursor observed.
    pub fn last_cursor(&self) -> u64 {
        self.last_cursor
    }

    /// The system prompt, provider, model and reasoning setting in effect at the end of the
    /// history (its header and the switches after it); `None` when it has no header.
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }
}

impl Session {
    /// A session forked from `from` at `from.cursor` by `by`, whose history is `prefix` (every
    /// entry `1..=from.cursor` observed). It is idle, owned by its creator until someone prompts
    /// it, with no budget and nothing spent. Its context is the history's (pinned global context,
    /// latest compaction), except environments' AGENTS.md: a fork starts with no environment
    /// attached. Appends a `wuhu_forked_v1` notice (the first entry of its own).
    pub fn fork(
        now: Millis,
        seed: u64,
        prefix: ForkPrefix,
        from: &ForkedFrom,
        by: &str,
    ) -> Session {
        let mut anchors = prefix.anchors;
        anchors.pinned.retain(|p| p.environment.is_none());
        let state = Checkpoint {
            next_cursor: from.cursor + 1,
            group_chat_since: prefix.group_chat_since,
            context: anchors,
            ..Checkpoint::default()
        };
        let mut session = Session::restore(state, Vec::new(), seed);
        session.append(
            now,
            EntryPayload::Custom {
                custom_type: custom_types::FORKED.into(),
                data: serde_json::json!({
                    "text": format!("{by} forked this session from {} at cursor {}.", from.session_id, from.cursor),
                    "from": from.session_id,
                    "atCursor": from.cursor,
                    "by": by,
                }),
            },
        );
        session
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::wire::{Compaction, CompactionReason};

    fn header(model: &str) -> Header {
        Header {
            system_prompt: "s".into(),
            provider: "fake".into(),
            model: model.into(),
            reasoning: None,
        }
    }

    fn custom_message(custom_type: &str, details: serde_json::Value) -> EntryPayload {
        EntryPayload::Message {
            message: Message::CustomMessage {
                custom_type: custom_type.into(),
                content: "c".into(),
                details: Some(details),
            },
        }
    }

    fn user(text: &str) -> EntryPayload {
        EntryPayload::Message {
            message: Message::User {
                author: "ana".into(),
                content: text.into(),
                queue_item_id: None,
                lane: None,
                acting_for: None,
            },
        }
    }

    fn history() -> Vec<Entry> {
        let low = serde_json::from_value(json!({"effort": "low"})).unwrap();
        let payloads = vec![
            EntryPayload::Header(Header {
                reasoning: Some(low),
                ..header("m1")
            }), // 1
            custom_message(custom_types::GLOBAL_CONTEXT, json!({})), // 2
            user("a"),                                               // 3
            custom_message(custom_types::AGENTS_MD, json!({"environment": "api"})), // 4
            EntryPayload::Custom {
                custom_type: custom_types::MODEL_CHANGED.into(),
                data: json!({"to": {"provider": "anthropic", "model": "m2"}}),
            }, // 5
            custom_message(custom_types::GROUP_CHAT_REMINDER, json!({})), // 6
            user("b"),                                               // 7
            EntryPayload::Compaction(Compaction {
                summary: "s".into(),
                first_kept_cursor: 7,
                kept_cursors: vec![3],
                tokens_before: 0,
                reason: CompactionReason::Auto,
                instructions: None,
                provider: "fake".into(),
                model: "m".into(),
                usage: None,
            }), // 8
            EntryPayload::Custom {
                custom_type: custom_types::REASONING_CHANGED.into(),
                data: json!({"from": {"effort": "low"}, "to": {"effort": "high"}}),
            }, // 9
            user("c"),                                               // 10
        ];
        payloads
            .into_iter()
            .enumerate()
            .map(|(i, payload)| Entry {
                cursor: i as u64 + 1,
                id: format!("e{}", i + 1),
                created_at: 0,
                payload,
            })
            .collect()
    }

    #[test]
    fn a_fork_continues_from_the_state_its_history_implies() {
        let history = history();
        // (at cursor, model in effect, group chat since, pinned cursors, compaction cursor)
        type Case<'a> = (u64, Option<&'a str>, Option<u64>, Vec<u64>, Option<u64>);
        let cases: Vec<Case> = vec![
            (1, Some("m1"), None, vec![], None),
            (2, Some("m1"), None, vec![2], None),
            // An environment's AGENTS.md is not pinned: a fork has no environment.
            (4, Some("m1"), None, vec![2], None),
            (5, Some("m2"), None, vec![2], None),
            (6, Some("m2"), Some(6), vec![2], None),
            (8, Some("m2"), Some(6), vec![2], Some(8)),
            (10, Some("m2"), Some(6), vec![2], Some(8)),
        ];
        for (at, model, since, pinned, compaction) in cases {
            let mut prefix = ForkPrefix::default();
            for entry in &history[..at as usize] {
                prefix.observe(entry);
            }
            assert_eq!(prefix.last_cursor(), at);
            assert_eq!(prefix.header().map(|h| h.model.as_str()), model, "at {at}");
            let from = ForkedFrom {
                session_id: "parent".into(),
                cursor: at,
            };
            let mut fork = Session::fork(Millis(5), 1, prefix, &from, "bob");
            assert_eq!(fork.last_cursor(), at + 1, "at {at}");
            assert_eq!(fork.status(), crate::wire::Status::Idle);
            assert_eq!((fork.owner(), fork.budget()), (None, None));
            assert!(fork.spent().is_zero());
            assert_eq!(fork.group_chat_since(), since, "at {at}");
            let anchors = fork.context_anchors();
            let got: Vec<u64> = anchors.pinned.iter().map(|p| p.cursor).collect();
            assert_eq!(got, pinned, "at {at}");
            assert_eq!(anchors.compaction.as_ref().map(|c| c.cursor), compaction);
            if compaction.is_some() {
                assert_eq!(anchors.compaction.as_ref().unwrap().kept, [3]);
            }
            let effects: Vec<_> = std::iter::from_fn(|| fork.poll_effect()).collect();
            let notice = effects.iter().find_map(|e| match e {
                super::super::Effect::AppendEntry(entry) => Some(entry),
                _ => None,
            });
            let notice = notice.expect("the fork notice");
            assert_eq!(notice.cursor, at + 1);
            let EntryPayload::Custom { custom_type, data } = &notice.payload else {
                panic!("{notice:?}");
            };
            assert_eq!(custom_type, custom_types::FORKED);
            assert_eq!(data["atCursor"], at);
            assert_eq!(data["from"], "parent");
        }
        // The reasoning setting: the header's until the history changed it.
        let reasoning_at = |at: usize| {
            let mut prefix = ForkPrefix::default();
            history[..at].iter().for_each(|e| prefix.observe(e));
            prefix
                .header()
                .and_then(|h| h.reasoning)
                .map(|r| r.effort.as_str())
        };
        assert_eq!(
            (reasoning_at(8), reasoning_at(10)),
            (Some("low"), Some("high"))
        );
    }
}
