use crate::calls::Call;
use expect_test::{Expect, expect};

use super::*;
use crate::calls::Method::{Delete as DELETE, Get as GET, Patch as PATCH, Post as POST};

fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One public request, decoded, as text: the call's name and JSON, or the error's status.
fn decode(method: Method, path: &str, query: &[(&str, &str)], body: &str) -> String {
    let rest: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match decode_public(
        method,
        &rest,
        &q(query),
        body.as_bytes(),
        None,
        Some("jti-1"),
    ) {
        Ok(call) => format!("{} {}", call.name(), encode(&call)),
        Err(e) => {
            let (status, code) = e.status_and_code();
            format!("{status} {code}: {e}")
        }
    }
}

fn encode(call: &SessionCall) -> String {
    match call {
        SessionCall::Transcript(c) => serde_json::to_string(c),
        SessionCall::Enqueue(c) => serde_json::to_string(c),
        SessionCall::Cancel(c) => serde_json::to_string(c),
        SessionCall::Stop(c) => serde_json::to_string(c),
        SessionCall::Patch(c) => serde_json::to_string(c),
        SessionCall::Compact(c) => serde_json::to_string(c),
        SessionCall::Follow(c) => serde_json::to_string(c),
        SessionCall::Socket(c) => serde_json::to_string(c),
        SessionCall::Usage(c) => serde_json::to_string(c),
        SessionCall::Stats(c) => serde_json::to_string(c),
        SessionCall::Delete(c) => serde_json::to_string(c),
        SessionCall::AnswerApproval(c) => serde_json::to_string(c),
        other => Ok(format!("(internal {})", other.name())),
    }
    .unwrap()
}

/// A public request: method, path under the session, query, body.
type Case<'a> = (Method, &'a str, &'a [(&'a str, &'a str)], &'a str);

fn check(cases: &[Case<'_>], expect: Expect) {
    let out: Vec<String> = cases
        .iter()
        .map(|(m, path, query, body)| {
            format!("{m:?} {path:?} -> {}", decode(*m, path, query, body))
        })
        .collect();
    expect.assert_eq(&(out.join("\n") + "\n"));
}

#[test]
fn public_routes_decode_into_their_calls() {
    check(
        &[
            (GET, "", &[], ""),
            (
                GET,
                "",
                &[("sinceCursor", "4"), ("limit", "10"), ("sinceTime", "9")],
                "",
            ),
            (GET, "", &[("limit", "0")], ""),
            (GET, "", &[("limit", "1001")], ""),
            (GET, "", &[("sinceCursor", "x")], ""),
            (POST, "enqueue", &[], r#"{"content":"hi"}"#),
            (
                POST,
                "enqueue",
                &[("lane", "steer")],
                r#"{"content":"hi","key":"k1"}"#,
            ),
            (
                POST,
                "enqueue",
                &[("lane", "system")],
                r#"{"content":"hi"}"#,
            ),
            (
                POST,
                "enqueue",
                &[],
                r#"{"content":"hi","itemKey":"forged"}"#,
            ),
            (POST, "enqueue", &[], "not json"),
            (POST, "cancel", &[], r#"{"id":"q1"}"#),
            (POST, "stop", &[], ""),
            (POST, "stop", &[], "{}"),
            (POST, "stop", &[], "{"),
            (PATCH, "", &[], r#"{"title":" New "}"#),
            (PATCH, "", &[], "{}"),
            (PATCH, "", &[], r#"{"provider":"nope"}"#),
            (POST, "compact", &[], ""),
            (POST, "compact", &[], r#"{"instructions":"keep the plan"}"#),
            (
                GET,
                "follow",
                &[("sinceCursor", "3"), ("stopAfterIdle", "1")],
                "",
            ),
            (GET, "follow", &[("timeoutSeconds", "0")], ""),
            (GET, "socket", &[("after", "12")], ""),
            (GET, "usage", &[], ""),
            (GET, "stats", &[], ""),
            (DELETE, "", &[], ""),
            (POST, "approvals/a1", &[], r#"{"decision":"approve"}"#),
            (GET, "enqueue", &[], ""),
            (POST, "", &[], ""),
            (GET, "approvals/a1", &[], ""),
            (POST, "init", &[], "{}"),
            (POST, "child_input", &[], "{}"),
            (GET, "nope/deeper", &[], ""),
        ],
        expect![[r#"
            Get "" -> transcript {"sinceCursor":0,"sinceTime":null,"limit":1000}
            Get "" -> transcript {"sinceCursor":4,"sinceTime":9,"limit":10}
            Get "" -> 400 bad_request: limit must be between 1 and 1000
            Get "" -> 400 bad_request: limit must be between 1 and 1000
            Get "" -> 400 bad_request: query parameter sinceCursor must be a non-negative integer
            Post "enqueue" -> enqueue {"lane":"followUp","request":{"content":"hi"}}
            Post "enqueue" -> enqueue {"lane":"steer","request":{"content":"hi","key":"k1"}}
            Post "enqueue" -> 400 bad_request: unknown lane "system": use steer or followUp
            Post "enqueue" -> 400 bad_request: invalid json body: unknown field `itemKey`, expected one of `content`, `key`, `reasoning` at line 1 column 25
            Post "enqueue" -> 400 bad_request: invalid json body: expected ident at line 1 column 2
            Post "cancel" -> cancel {"id":"q1"}
            Post "stop" -> stop null
            Post "stop" -> stop null
            Post "stop" -> 400 bad_request: invalid json body: EOF while parsing an object at line 1 column 1
            Patch "" -> patch {"title":" New "}
            Patch "" -> 400 bad_request: patch needs title, access, provider, model, budget or reasoning
            Patch "" -> 400 bad_request: unknown provider "nope": use one of "fake", "openai-compatible", "openai", "anthropic"
            Post "compact" -> compact {}
            Post "compact" -> compact {"instructions":"keep the plan"}
            Get "follow" -> follow {"request":{"sinceCursor":3,"sinceTime":null,"stopAfterIdle":true,"timeoutSeconds":null},"jti":"jti-1"}
            Get "follow" -> 400 bad_request: timeoutSeconds must be between 1 and 86400
            Get "socket" -> socket {"after":12,"jti":"jti-1"}
            Get "usage" -> usage null
            Get "stats" -> stats null
            Delete "" -> delete null
            Post "approvals/a1" -> answer_approval {"approvalId":"a1","answer":{"decision":"approve"}}
            Get "enqueue" -> 405 method_not_allowed: method not allowed on this route
            Post "" -> 405 method_not_allowed: method not allowed on this route
            Get "approvals/a1" -> 405 method_not_allowed: method not allowed on this route
            Post "init" -> 404 not_found: no such route
            Post "child_input" -> 404 not_found: no such route
            Get "nope/deeper" -> 404 not_found: no such route
        "#]],
    );
}

/// What each call needs: reading first; the rest per call (a PATCH per field). Internal calls
/// are never decoded from a client's request (see the table above: `init`, `child_input` are
/// 404 there).
#[test]
fn what_each_call_needs() {
    let patch = |json: &str| {
        SessionCall::Patch(Patch(
            serde_json::from_str::<PatchSessionRequest>(json).unwrap(),
        ))
    };
    let cases: Vec<(SessionCall, &str)> = vec![
        (
            Transcript {
                since_cursor: 0,
                since_time: None,
                limit: 1,
            }
            .into(),
            "Read",
        ),
        (Info.into(), "Read"),
        (Usage.into(), "Read"),
        (Stats.into(), "Read"),
        (Cancel(CancelRequest { id: "q".into() }).into(), "Read"),
        (
            Enqueue {
                lane: Lane::Steer,
                request: EnqueueRequest {
                    content: "x".into(),
                    key: None,
                    reasoning: None,
                },
                item_key: None,
            }
            .into(),
            "Read Prompt",
        ),
        (Compact(CompactRequest::default()).into(), "Read Prompt"),
        (
            Notice {
                channel: "c".into(),
                key: "k".into(),
                reason: "r".into(),
            }
            .into(),
            "Read Prompt",
        ),
        (Stop.into(), "Read Stop"),
        (Delete.into(), "Read Delete"),
        (patch(r#"{"title":"t"}"#), "Read Rename"),
        (patch(r#"{"access":"tenant"}"#), "Read ChangeAccess"),
        (patch(r#"{"budget":{}}"#), "Read Rename"),
        (patch(r#"{"reasoning":{"effort":"low"}}"#), "Read Prompt"),
        (patch(r#"{"reasoning":null}"#), "Read Prompt"),
        (patch(r#"{"model":"m"}"#), "Read Prompt"),
        (patch(r#"{"provider":"fake"}"#), "Read Prompt"),
        (
            patch(r#"{"title":"t","access":"private","model":"m"}"#),
            "Read Rename ChangeAccess Prompt",
        ),
        (Start.into(), "internal"),
        (SlotHeld.into(), "internal"),
        (ForgetSettings.into(), "internal"),
        (Dispose.into(), "internal"),
        (
            Prefix(PrefixRequest {
                since_cursor: 0,
                limit: 1,
                through: 1,
            })
            .into(),
            "internal",
        ),
    ];
    for (call, want) in cases {
        let got = match call.needs() {
            Needs::Internal => "internal".to_string(),
            Needs::Person(actions) => actions
                .iter()
                .map(|a| format!("{a:?}"))
                .collect::<Vec<_>>()
                .join(" "),
        };
        assert_eq!(got, want, "{}", call.name());
    }
}

/// A call survives its trip: what the caller encodes is what the callee decodes.
#[test]
fn calls_round_trip_through_decode() {
    let calls: Vec<(String, Vec<u8>)> = vec![
        (
            Enqueue::NAME.into(),
            serde_json::to_vec(&Enqueue {
                lane: Lane::FollowUp,
                request: EnqueueRequest {
                    content: "hello".into(),
                    key: Some("k".into()),
                    reasoning: None,
                },
                item_key: Some("slack:1".into()),
            })
            .unwrap(),
        ),
        (Start::NAME.into(), serde_json::to_vec(&Start).unwrap()),
        (
            GiveChildInput::NAME.into(),
            serde_json::to_vec(&GiveChildInput(ChildInput {
                content: "more".into(),
                lane: Lane::Steer,
                author: "alice".into(),
                acting_for: vec!["alice".into(), "bob".into()],
            }))
            .unwrap(),
        ),
    ];
    for (name, body) in calls {
        let call = SessionCall::decode(&format!("/{name}"), &body).unwrap();
        assert_eq!(call.name(), name);
    }
    assert_eq!(
        SessionCall::decode("/enqueue", b"{}")
            .unwrap_err()
            .status_and_code(),
        (400, "bad_request")
    );
    assert_eq!(
        SessionCall::decode("/nothing", b"{}").unwrap_err(),
        CallError::UnknownRoute
    );
}

#[test]
fn creation_is_validated_once() {
    let check = |json: &str| -> String {
        let request: CreateSessionRequest = serde_json::from_str(json).unwrap();
        match request.validate() {
            Ok(valid) => format!("{valid:?}"),
            Err(e) => format!("400: {e}"),
        }
    };
    let long = "x".repeat(201);
    let cases = [
        ("{}".to_string(), r#"ValidCreate { provider: None, model: None, title: None }"#.to_string()),
        (
            r#"{"provider":"openai","model":" gpt-4o ","title":"  Plan  "}"#.into(),
            r#"ValidCreate { provider: Some("openai"), model: Some("gpt-4o"), title: Some("Plan") }"#.into(),
        ),
        (r#"{"title":"   "}"#.into(), r#"ValidCreate { provider: None, model: None, title: None }"#.into()),
        (r#"{"provider":"nope"}"#.into(), "400: unknown provider \"nope\": use one of \"fake\", \"openai-compatible\", \"openai\", \"anthropic\"".into()),
        (r#"{"model":""}"#.into(), "400: model must be 1 to 200 characters".into()),
        (format!(r#"{{"title":"{long}"}}"#), "400: title must be 1 to 200 characters once control and format characters are removed".into()),
        (r#"{"title":"evil\u202etxt.exe"}"#.into(), r#"ValidCreate { provider: None, model: None, title: Some("eviltxt.exe") }"#.into()),
        (r#"{"title":"\u200b\u2067\ufeff"}"#.into(), r#"ValidCreate { provider: None, model: None, title: None }"#.into()),
        (r#"{"title":"two\nlines\tand\u0000nul"}"#.into(), r#"ValidCreate { provider: None, model: None, title: Some("two lines and nul") }"#.into()),
        (format!(r#"{{"model":"{long}"}}"#), "400: model must be 1 to 200 characters".into()),
        (r#"{"budget":{"maxUsd":-1}}"#.into(), "400: budget.maxUsd must be a number of dollars, 0 or more".into()),
    ];
    for (json, want) in cases {
        assert_eq!(check(&json), want, "{json}");
    }
    // The bound counts what is visible, at every size around it and in every width of
    // character; invisible characters neither count nor stay.
    for unit in ["x", "é", "中", "🙂"] {
        for visible in [1usize, 2, 199, 200, 201, 400] {
            for hidden in [0usize, 1, 300] {
                let title = format!("{}{}", "\u{200B}".repeat(hidden), unit.repeat(visible));
                let json = serde_json::json!({ "title": title }).to_string();
                let got = check(&json);
                if visible <= 200 {
                    let want = format!("{:?}", Some(unit.repeat(visible)));
                    assert!(
                        got.contains(&format!("title: {want}")),
                        "{unit} x {visible} + {hidden}: {got}"
                    );
                } else {
                    assert!(
                        got.starts_with("400: title must be 1 to 200"),
                        "{unit} x {visible}: {got}"
                    );
                }
                // A patch follows the same rule.
                let patch = PatchSessionRequest {
                    title: Some(title.clone()),
                    ..Default::default()
                };
                assert_eq!(
                    patch.validate().is_ok(),
                    visible <= 200,
                    "{unit} x {visible} + {hidden}"
                );
            }
        }
    }
}
