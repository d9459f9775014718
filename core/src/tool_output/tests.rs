use super::*;

fn masker() -> Masker {
    Masker::new([("TOKEN", "s3cr3t-value-42")])
}

/// Frames sent when `pushes` (time, bytes) arrive and the host polls at every push and at
/// each due time until `end`.
fn run(progress: &mut Progress, pushes: &[(u64, &[u8])], end: u64) -> Vec<(u64, String)> {
    let mut frames = Vec::new();
    let mut pushes = pushes.iter().peekable();
    let mut now = 0;
    while now <= end {
        while let Some((_, bytes)) = pushes.next_if(|(t, _)| *t <= now) {
            progress.push(bytes);
        }
        if let Some(text) = progress.poll(now) {
            frames.push((now, text));
        }
        now += 1;
    }
    frames
}

#[test]
fn frames_are_coalesced_to_one_per_interval() {
    struct Case {
        pushes: &'static [(u64, &'static [u8])],
        frames: &'static [(u64, &'static str)],
    }
    let cases = [
        // The first output goes at once; what follows within the interval waits for it.
        Case {
            pushes: &[(0, b"a\n"), (10, b"b\n"), (99, b"c\n")],
            frames: &[(0, "a\n"), (100, "b\nc\n")],
        },
        // A quiet command sends nothing; output after a pause goes at once.
        Case {
            pushes: &[(5, b"a"), (500, b"b")],
            frames: &[(5, "a"), (500, "b")],
        },
        // Exactly one interval after a frame, the next may go.
        Case {
            pushes: &[(0, b"a"), (100, b"b"), (150, b"c"), (199, b"d")],
            frames: &[(0, "a"), (100, "b"), (200, "cd")],
        },
        Case {
            pushes: &[],
            frames: &[],
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        let mut progress = Progress::new(None);
        let frames = run(&mut progress, case.pushes, 1000);
        let want: Vec<(u64, String)> = case
            .frames
            .iter()
            .map(|(t, s)| (*t, s.to_string()))
            .collect();
        assert_eq!(frames, want, "case {i}");
    }
}

#[test]
fn the_buffer_keeps_the_newest_text_at_every_bound() {
    for extra in [
        0usize,
        1,
        2,
        100,
        MAX_PROGRESS_TEXT_BYTES,
        5 * MAX_PROGRESS_TEXT_BYTES,
    ] {
        let mut progress = Progress::new(None);
        assert_eq!(progress.poll(0).as_deref(), None);
        progress.push(b"first");
        assert_eq!(progress.poll(0).as_deref(), Some("first"));
        let total = MAX_PROGRESS_TEXT_BYTES + extra;
        let body: Vec<u8> = (0..total).map(|i| b'a' + (i % 26) as u8).collect();
        for chunk in body.chunks(7000) {
            progress.push(chunk);
        }
        assert_eq!(progress.poll(99), None, "extra {extra}");
        let frame = progress.poll(100).unwrap();
        assert!(
            frame.len() <= MAX_PROGRESS_FRAME_TEXT_BYTES,
            "extra {extra}"
        );
        let kept = &body[extra..];
        if extra == 0 {
            assert_eq!(frame.as_bytes(), kept);
        } else {
            let marker = skipped_marker(extra as u64);
            assert!(frame.starts_with(&marker), "extra {extra}");
            assert_eq!(&frame.as_bytes()[marker.len()..], kept, "extra {extra}");
        }
    }
}

#[test]
fn a_call_stops_after_its_budget_and_then_holds_nothing() {
    // Just under, at, and over the budget: the frame that passes it is cut and marked.
    for over in [-1i64, 0, 1] {
        let mut progress = Progress::new(None);
        let mut now = 0;
        let target = (MAX_PROGRESS_BYTES_PER_CALL as i64 + over) as usize;
        let mut pushed = 0;
        let mut frames = Vec::new();
        while pushed < target {
            let n = (target - pushed).min(MAX_PROGRESS_TEXT_BYTES);
            progress.push(&vec![b'x'; n]);
            pushed += n;
            frames.extend(progress.poll(now));
            now += PROGRESS_INTERVAL_MS;
        }
        frames.extend(progress.poll(now));
        let sent: usize = frames.iter().map(String::len).sum();
        let stopped = frames.last().unwrap().ends_with(STOPPED_MARKER);
        assert_eq!(stopped, over > 0, "over {over}");
        if over > 0 {
            assert_eq!(sent, MAX_PROGRESS_BYTES_PER_CALL + STOPPED_MARKER.len());
        } else {
            assert_eq!(sent, target);
        }
        // Nothing more once stopped.
        progress.push(b"more");
        if stopped {
            assert_eq!(progress.due_at(), None);
            assert_eq!(progress.poll(now + 10_000), None);
        }
    }
}

#[test]
fn fifty_megabytes_keep_memory_and_frames_bounded() {
    let mut progress = Progress::new(Some(masker()));
    let chunk = vec![b'y'; 64 * 1024];
    let mut frames = 0;
    let mut sent = 0;
    // 800 reads of 64 KiB, a read every 5 ms (a fast command).
    for i in 0..800u64 {
        progress.push(&chunk);
        assert!(progress.pending.len() <= MAX_PROGRESS_TEXT_BYTES);
        if let Some(text) = progress.poll(i * 5) {
            assert!(text.len() <= MAX_PROGRESS_FRAME_TEXT_BYTES);
            frames += 1;
            sent += text.len();
        }
    }
    // One frame per 100 ms over 4 s.
    assert_eq!(frames, 40);
    assert!(sent <= 40 * MAX_PROGRESS_FRAME_TEXT_BYTES);
}

#[test]
fn characters_and_secrets_split_between_reads_survive() {
    let text = "é and s3cr3t-value-42 and 日本\n".as_bytes();
    // Every split point of the text across two reads.
    for at in 0..=text.len() {
        let mut shown = String::new();
        let mut progress = Progress::new(Some(masker()));
        progress.push(&text[..at]);
        shown.extend(progress.poll(0));
        progress.push(&text[at..]);
        shown.extend(progress.poll(100));
        progress
            .push(b"\n-- end of the command's output, long enough to let the held text out --\n");
        shown.extend(progress.poll(200));
        assert!(!shown.contains("s3cr3t"), "split at {at}: {shown}");
        assert!(!shown.contains('\u{FFFD}'), "split at {at}: {shown}");
        assert!(
            shown.starts_with("é and [secret:TOKEN] and 日本\n"),
            "split at {at}: {shown}"
        );
    }
    // Invalid bytes become U+FFFD, once each.
    let mut progress = Progress::new(None);
    progress.push(b"a\xffb");
    assert_eq!(progress.poll(0).as_deref(), Some("a\u{FFFD}b"));
}

#[test]
fn a_cut_never_leaves_part_of_a_secret() {
    // The secret sits where the buffer's front is dropped, at every offset.
    for offset in 0..20 {
        let mut progress = Progress::new(Some(masker()));
        let mut text = "z".repeat(offset);
        text.push_str("s3cr3t-value-42");
        text.push_str(&"w".repeat(MAX_PROGRESS_TEXT_BYTES));
        progress.push(text.as_bytes());
        progress.push(&[b'\n'; 64]);
        let frame = progress.poll(0).unwrap();
        for piece in ["s3cr3t-value-42", "value-42", "e-42"] {
            assert!(!frame.contains(piece), "offset {offset}");
        }
    }
}

#[test]
fn a_session_relays_only_running_calls() {
    let mut live = LiveOutput::default();
    assert_eq!(live.push("c1", OutputStream::Combined, "x"), None);
    live.start("c1", Masker::default());
    assert!(live.is_running("c1"));
    assert_eq!(
        live.push("c1", OutputStream::Combined, "hello\n"),
        Some(StreamEvent::ToolOutputDelta {
            call_id: "c1".into(),
            stream: OutputStream::Combined,
            text: "hello\n".into()
        })
    );
    assert_eq!(live.push("c2", OutputStream::Combined, "other"), None);
    live.end("c1");
    assert_eq!(live.push("c1", OutputStream::Combined, "late"), None);
    assert!(live.tails().is_empty());
    assert_eq!(live.tail_bytes(), 0);
}

#[test]
fn a_session_masks_secrets_split_between_frames() {
    let secret = "s3cr3t-value-42";
    for at in 0..=secret.len() {
        let mut live = LiveOutput::default();
        live.start("c1", masker());
        let mut shown = String::new();
        for text in [
            &format!("key {}", &secret[..at]),
            &format!("{} ok", &secret[at..]),
            " and a long enough end to let it all out\n",
        ] {
            if let Some(StreamEvent::ToolOutputDelta { text, .. }) =
                live.push("c1", OutputStream::Combined, text)
            {
                shown.push_str(&text);
            }
        }
        assert!(
            shown.starts_with("key [secret:TOKEN] ok"),
            "at {at}: {shown}"
        );
        // The tail a late joiner gets is masked too.
        let tails = live.tails();
        assert!(
            matches!(&tails[..], [StreamEvent::ToolOutputDelta { text, .. }] if *text == shown)
        );
    }
}

fn tail_len(live: &LiveOutput, call: &str) -> usize {
    live.tails()
        .iter()
        .map(|e| match e {
            StreamEvent::ToolOutputDelta { call_id, text, .. } if call_id == call => text.len(),
            _ => 0,
        })
        .sum()
}

#[test]
fn tails_are_bounded_per_call_and_per_session() {
    let mut live = LiveOutput::default();
    live.start("c1", Masker::default());
    // At, under and over the per-call bound.
    for (push, want) in [
        (LIVE_TAIL_BYTES - 1, LIVE_TAIL_BYTES - 1),
        (1, LIVE_TAIL_BYTES),
        (1, LIVE_TAIL_BYTES),
        (LIVE_TAIL_BYTES * 3, LIVE_TAIL_BYTES),
    ] {
        let mut left = push;
        while left > 0 {
            let n = left.min(MAX_RELAYED_TEXT_BYTES);
            live.push("c1", OutputStream::Combined, &"a".repeat(n));
            left -= n;
        }
        assert_eq!(tail_len(&live, "c1"), want);
    }
    // The newest text is what is kept.
    live.push("c1", OutputStream::Combined, "END");
    assert!(
        matches!(&live.tails()[0], StreamEvent::ToolOutputDelta { text, .. } if text.ends_with("aEND"))
    );
    // Three calls: the session keeps two calls' worth, the oldest call's tail shrinks first.
    live.start("c2", Masker::default());
    live.start("c3", Masker::default());
    for call in ["c2", "c3"] {
        for _ in 0..4 {
            live.push(
                call,
                OutputStream::Combined,
                &"b".repeat(LIVE_TAIL_BYTES / 4),
            );
        }
    }
    assert_eq!(live.tail_bytes(), MAX_LIVE_TAIL_BYTES_PER_SESSION);
    assert_eq!(tail_len(&live, "c1"), 0);
    assert_eq!(tail_len(&live, "c2"), LIVE_TAIL_BYTES);
    assert_eq!(tail_len(&live, "c3"), LIVE_TAIL_BYTES);
    let order: Vec<String> = live
        .tails()
        .into_iter()
        .map(|e| match e {
            StreamEvent::ToolOutputDelta { call_id, .. } => call_id,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(order, ["c2", "c3"]);
    live.end("c2");
    assert_eq!(live.tail_bytes(), LIVE_TAIL_BYTES);
    // A frame larger than any runner sends keeps its end.
    let big = format!("{}TAIL", "q".repeat(MAX_RELAYED_TEXT_BYTES));
    let Some(StreamEvent::ToolOutputDelta { text, .. }) =
        live.push("c3", OutputStream::Combined, &big)
    else {
        panic!("relayed");
    };
    assert!(text.starts_with(&skipped_marker(4)) && text.ends_with("qTAIL"));
}

#[test]
fn a_session_follows_at_most_its_bound_of_calls() {
    let mut live = LiveOutput::default();
    for i in 0..=MAX_LIVE_CALLS {
        live.start(&format!("c{i}"), Masker::default());
        live.push(&format!("c{i}"), OutputStream::Combined, "x");
    }
    assert!(!live.is_running("c0"));
    assert!(live.is_running("c1"));
    assert!(live.is_running(&format!("c{MAX_LIVE_CALLS}")));
    assert_eq!(live.tail_bytes(), MAX_LIVE_CALLS);
}

#[test]
fn the_hub_relays_a_calls_frames_in_order_through_one_forwarder() {
    let mut queue = RelayQueue::default();
    let c = OutputStream::Combined;
    // The first frame's handler forwards; later ones only queue while it does.
    assert!(queue.push(c, "1".into()));
    assert!(!queue.push(c, "2".into()));
    assert_eq!(queue.pop(), Some((c, "1".into())));
    assert!(!queue.push(c, "3".into()));
    assert_eq!(queue.pop(), Some((c, "2".into())));
    assert_eq!(queue.pop(), Some((c, "3".into())));
    assert_eq!(queue.pop(), None);
    // Idle again: the next frame's handler forwards.
    assert!(queue.push(c, "4".into()));
    assert_eq!(queue.pop(), Some((c, "4".into())));
    assert_eq!(queue.pop(), None);
    // At the bound, and one past it: the oldest is dropped and counted.
    for extra in [0usize, 1, 3] {
        let mut queue = RelayQueue::default();
        for i in 0..MAX_RELAY_QUEUED_FRAMES + extra {
            queue.push(c, format!("f{i:02}"));
        }
        let mut got = Vec::new();
        while let Some((_, text)) = queue.pop() {
            got.push(text);
        }
        assert_eq!(got.len(), MAX_RELAY_QUEUED_FRAMES, "extra {extra}");
        if extra > 0 {
            assert_eq!(
                got[0],
                format!("{}f{extra:02}", skipped_marker(3 * extra as u64))
            );
        } else {
            assert_eq!(got[0], "f00");
        }
        assert_eq!(
            got.last().unwrap(),
            &format!("f{:02}", MAX_RELAY_QUEUED_FRAMES + extra - 1)
        );
    }
}
