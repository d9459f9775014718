//! A uid of its own for each session on a runner started as root with `--isolate-uids
//! FIRST-LAST` (decision 0023, addendum): the session's cells run as that uid (and a group of
//! the same number), and its workspace, home, logs and temp dirs belong to it, so what one
//! session leaves on disk is closed to every other session even where the cells' Landlock
//! rules are not in force (files at rest, a runner started with another policy later).
//!
//! The rules here: which ranges may be used, and which uid a session gets. A uid is given in
//! turn from a cursor that moves on (wrapping at the end of the range), so a released uid is
//! not given again until the rest of the range was; the runner keeps the table in a file of
//! its own and performs the ownership changes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// The lowest uid a range may start at: below it are the system's own accounts.
pub const MIN_ISOLATED_UID: u32 = 1_000;
/// The highest uid a range may end at (2^31 - 2: uids from 2^31 confuse some tools, and
/// `(uid_t) -1` means "unchanged" to the kernel).
pub const MAX_ISOLATED_UID: u32 = 2_147_483_646;
/// The most uids one range holds (and so the most sessions one runner isolates at once).
pub const MAX_RANGE_SIZE: u32 = 1_000_000;
/// `nobody` and the 16-bit `(uid_t) -1`, which no range may contain.
const RESERVED: [u32; 2] = [65_534, 65_535];

/// The uids a runner gives its sessions, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    /// The first uid.
    pub first: u32,
    /// The last uid.
    pub last: u32,
}

impl UidRange {
    /// How many uids the range holds (never none: a range holds its first uid).
    pub fn size(self) -> u32 {
        self.last - self.first + 1
    }

    /// Whether `uid` is in the range.
    pub fn contains(self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }
}

impl fmt::Display for UidRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Parses `FIRST-LAST` (`20000-29999`).
///
/// # Errors
/// A message for the runner's refusal to start: not two numbers, reversed, below
/// [`MIN_ISOLATED_UID`], above [`MAX_ISOLATED_UID`], over [`MAX_RANGE_SIZE`] uids, or holding
/// `nobody` (65534) or 65535.
pub fn parse_uid_range(text: &str) -> Result<UidRange, String> {
    let bad = || format!("{text:?} is not a uid range: write FIRST-LAST, such as 20000-29999");
    let (first, last) = text.trim().split_once('-').ok_or_else(bad)?;
    let number = |s: &str| {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<u32>().map_err(|_| bad())
    };
    let range = UidRange {
        first: number(first)?,
        last: number(last)?,
    };
    if range.first > range.last {
        return Err(format!(
            "uid range {range}: the first uid is above the last"
        ));
    }
    if range.first < MIN_ISOLATED_UID {
        return Err(format!(
            "uid range {range}: starts below {MIN_ISOLATED_UID} (the system's own accounts)"
        ));
    }
    if range.last > MAX_ISOLATED_UID {
        return Err(format!("uid range {range}: ends above {MAX_ISOLATED_UID}"));
    }
    if range.size() > MAX_RANGE_SIZE {
        return Err(format!(
            "uid range {range}: {} uids, more than {MAX_RANGE_SIZE}",
            range.size()
        ));
    }
    if let Some(reserved) = RESERVED.iter().find(|&&u| range.contains(u)) {
        return Err(format!(
            "uid range {range}: holds {reserved} (nobody and (uid_t) -1 are never a session's)"
        ));
    }
    Ok(range)
}

/// Why a session got no uid.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UidError {
    /// Every uid of the range is a live session's.
    #[error(
        "every uid of this runner's range {range} belongs to a session; delete sessions or start the runner with a wider --isolate-uids"
    )]
    Exhausted {
        /// The range.
        range: UidRange,
    },
}

/// Which session has which uid (the runner's `session-uids.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UidTable {
    /// Session id → uid.
    #[serde(default)]
    pub sessions: BTreeMap<String, u32>,
    /// Where the search for the next free uid starts.
    #[serde(default)]
    pub next: u32,
}

/// A session's uid, and whether it was given just now (the runner then saves the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assigned {
    /// The uid (also the gid of the session's group).
    pub uid: u32,
    /// Given by this call.
    pub new: bool,
}

impl UidTable {
    /// Keeps what `range` allows: entries outside it (the runner was started with another
    /// range) and a second session on one uid (a hand-edited file) are dropped, with what was
    /// dropped returned for the runner's log.
    pub fn retain_in(&mut self, range: UidRange) -> Vec<(String, u32)> {
        let mut seen = BTreeSet::new();
        let mut dropped = Vec::new();
        self.sessions.retain(|session, uid| {
            let keep = range.contains(*uid) && seen.insert(*uid);
            if !keep {
                dropped.push((session.clone(), *uid));
            }
            keep
        });
        dropped
    }

    /// The uid of `session`: the one it has, else the first free one from the cursor on
    /// (wrapping), which moves past it.
    ///
    /// # Errors
    /// [`UidError::Exhausted`] when every uid of `range` is taken.
    pub fn assign(&mut self, range: UidRange, session: &str) -> Result<Assigned, UidError> {
        if let Some(&uid) = self.sessions.get(session)
            && range.contains(uid)
        {
            return Ok(Assigned { uid, new: false });
        }
        self.sessions.remove(session);
        let taken: BTreeSet<u32> = self.sessions.values().copied().collect();
        if taken.len() >= range.size() as usize {
            return Err(UidError::Exhausted { range });
        }
        let start = if range.contains(self.next) {
            self.next
        } else {
            range.first
        };
        // The first free uid at or after `start`, else from the range's start.
        let free = |from: u32, to: u32| (from..=to).find(|u| !taken.contains(u));
        let uid = free(start, range.last)
            .or_else(|| free(range.first, start))
            .ok_or(UidError::Exhausted { range })?;
        self.sessions.insert(session.to_string(), uid);
        self.next = if uid == range.last {
            range.first
        } else {
            uid + 1
        };
        Ok(Assigned { uid, new: true })
    }

    /// Gives `session`'s uid back (its files are gone); returns it.
    pub fn release(&mut self, session: &str) -> Option<u32> {
        self.sessions.remove(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let cases = [
            ("20000-29999", Ok((20000, 29999))),
            (" 1000-1000 ", Ok((1000, 1000))),
            ("100000-1099999", Ok((100_000, 1_099_999))),
            ("20000", Err("is not a uid range")),
            ("a-b", Err("is not a uid range")),
            ("-5-10", Err("is not a uid range")),
            ("+2000-3000", Err("is not a uid range")),
            ("2000-99999999999", Err("is not a uid range")),
            ("3000-2000", Err("the first uid is above the last")),
            ("999-2000", Err("starts below 1000")),
            ("2147483000-2147483647", Err("ends above 2147483646")),
            ("100000-1100000", Err("more than 1000000")),
            ("60000-70000", Err("holds 65534")),
            ("65535-70000", Err("holds 65535")),
        ];
        for (text, want) in cases {
            let got = parse_uid_range(text);
            match (want, got) {
                (Ok((first, last)), Ok(r)) => {
                    assert_eq!((r.first, r.last), (first, last), "{text}")
                }
                (Err(part), Err(e)) => assert!(e.contains(part), "{text}: {e}"),
                (want, got) => panic!("{text}: want {want:?}, got {got:?}"),
            }
        }
    }

    fn range(first: u32, last: u32) -> UidRange {
        UidRange { first, last }
    }

    #[test]
    fn a_session_keeps_its_uid_and_a_released_uid_waits_its_turn() {
        let r = range(2000, 2002);
        let mut t = UidTable::default();
        let a = t.assign(r, "a").unwrap();
        assert_eq!(
            a,
            Assigned {
                uid: 2000,
                new: true
            }
        );
        assert_eq!(
            t.assign(r, "a").unwrap(),
            Assigned {
                uid: 2000,
                new: false
            }
        );
        assert_eq!(t.assign(r, "b").unwrap().uid, 2001);
        assert_eq!(t.release("a"), Some(2000));
        assert_eq!(t.release("a"), None);
        // 2000 is free again, but the cursor is past it: 2002 first, then it wraps.
        assert_eq!(t.assign(r, "c").unwrap().uid, 2002);
        assert_eq!(t.assign(r, "d").unwrap().uid, 2000);
        assert_eq!(t.assign(r, "e"), Err(UidError::Exhausted { range: r }));
        // A session that has one still gets it when the range is full.
        assert_eq!(
            t.assign(r, "b").unwrap(),
            Assigned {
                uid: 2001,
                new: false
            }
        );
    }

    #[test]
    fn no_two_sessions_share_a_uid_whatever_the_order() {
        // Many interleavings of assign and release over a small range: never two live
        // sessions on one uid, every uid in the range, and exhaustion only when full.
        let r = range(5000, 5006);
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut t = UidTable::default();
        for step in 0..5000 {
            let session = format!("s{}", next() % 12);
            if next() % 3 == 0 {
                t.release(&session);
            } else {
                match t.assign(r, &session) {
                    Ok(a) => assert!(r.contains(a.uid)),
                    Err(UidError::Exhausted { .. }) => {
                        assert_eq!(t.sessions.len(), r.size() as usize, "step {step}");
                        assert!(!t.sessions.contains_key(&session));
                    }
                }
            }
            let uids: BTreeSet<u32> = t.sessions.values().copied().collect();
            assert_eq!(uids.len(), t.sessions.len(), "step {step}: {t:?}");
        }
    }

    #[test]
    fn a_table_from_another_range_keeps_only_what_fits() {
        let mut t = UidTable {
            sessions: BTreeMap::from([
                ("a".into(), 2000),
                ("b".into(), 9000),
                ("c".into(), 2000),
                ("d".into(), 2001),
            ]),
            next: 9001,
        };
        let dropped = t.retain_in(range(2000, 2005));
        assert_eq!(dropped, vec![("b".into(), 9000), ("c".into(), 2000)]);
        // The cursor outside the range starts over at its first uid.
        assert_eq!(t.assign(range(2000, 2005), "e").unwrap().uid, 2002);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(
            json,
            r#"{"sessions":{"a":2000,"d":2001,"e":2002},"next":2003}"#
        );
        assert_eq!(serde_json::from_str::<UidTable>(&json).unwrap(), t);
        assert_eq!(
            serde_json::from_str::<UidTable>("{}").unwrap(),
            UidTable::default()
        );
    }
}
