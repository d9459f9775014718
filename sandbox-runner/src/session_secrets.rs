//! The secrets each session's calls were given, in this process's memory only (never on disk,
//! gone with the process): every later answer of that session is masked with them before it
//! leaves the runner, including output the runner uploads to storage itself (a long `read` of
//! a log a command wrote a secret into), which the server never sees to mask.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use wuhu_core::masking::Masker;
use wuhu_core::wire::runner::SecretEnv;

/// Most secrets remembered per session; a session given more keeps the latest ones' names
/// first come (the server masks all of them in what reaches it anyway).
pub const MAX_SECRETS_PER_SESSION: usize = wuhu_core::secrets::MAX_SECRETS_PER_TENANT;

#[derive(Default)]
struct Known {
    values: BTreeMap<String, String>,
    masker: Masker,
}

/// Per session: the secret values its calls got, and their masker.
#[derive(Default)]
pub struct SessionSecrets {
    sessions: Mutex<HashMap<String, Known>>,
}

impl std::fmt::Debug for SessionSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sessions = self.sessions.lock().map_or(0, |s| s.len());
        f.debug_struct("SessionSecrets")
            .field("sessions", &sessions)
            .finish_non_exhaustive()
    }
}

impl SessionSecrets {
    /// Remembers what a call of `session` is given; returns the session's masker (`None` when
    /// it was never given a secret).
    pub fn learn(&self, session: &str, given: &SecretEnv) -> Option<Masker> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if given.is_empty() {
            return sessions.get(session).map(|k| k.masker.clone());
        }
        let known = sessions.entry(session.to_string()).or_default();
        let mut changed = false;
        for (name, value) in &given.0 {
            // A replaced value is masked too: the old one may still sit in files.
            let key = if known.values.get(name).is_some_and(|v| v != value) {
                format!("{name}\u{0}{}", known.values.len())
            } else {
                name.clone()
            };
            if known.values.len() >= MAX_SECRETS_PER_SESSION && !known.values.contains_key(&key) {
                continue;
            }
            if known.values.get(&key) != Some(value) {
                known.values.insert(key, value.clone());
                changed = true;
            }
        }
        if changed {
            known.masker = Masker::new(known.values.iter().map(|(key, value)| {
                let name = key.split('\u{0}').next().unwrap_or(key).to_string();
                (name, value.as_str())
            }));
        }
        Some(known.masker.clone())
    }

    /// Forgets a deleted session's secrets.
    pub fn forget(&self, session: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> SecretEnv {
        SecretEnv(
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn a_session_masks_what_it_was_ever_given_and_only_that() {
        let secrets = SessionSecrets::default();
        assert!(secrets.learn("s1", &SecretEnv::default()).is_none());
        let masker = secrets
            .learn("s1", &env(&[("TOKEN", "first-value-1")]))
            .unwrap();
        assert_eq!(masker.mask_known("x first-value-1 y"), "x [secret:TOKEN] y");
        // A later call without secrets still masks them; a replaced value masks both.
        let masker = secrets
            .learn("s1", &env(&[("TOKEN", "second-value-2")]))
            .unwrap();
        assert_eq!(
            masker.mask_known("first-value-1 second-value-2"),
            "[secret:TOKEN] [secret:TOKEN]"
        );
        let masker = secrets.learn("s1", &SecretEnv::default()).unwrap();
        assert_eq!(masker.mask_known("first-value-1"), "[secret:TOKEN]");
        // Another session knows nothing of them.
        assert!(secrets.learn("s2", &SecretEnv::default()).is_none());
        secrets.forget("s1");
        assert!(secrets.learn("s1", &SecretEnv::default()).is_none());
    }
}
