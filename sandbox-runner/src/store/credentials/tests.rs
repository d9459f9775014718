use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::future;

use super::*;

/// A provider that hands out `AK1`, `AK2`, … expiring at the times it is given, or fails.
#[derive(Debug)]
struct Scripted {
    calls: AtomicUsize,
    /// What the next calls answer: an expiry (unix seconds; `None`: never) or a failure.
    answers: Mutex<Vec<Result<Option<i64>, &'static str>>>,
}

impl Scripted {
    fn provider(answers: Vec<Result<Option<i64>, &'static str>>) -> SharedCredentialsProvider {
        SharedCredentialsProvider::new(Scripted {
            calls: AtomicUsize::new(0),
            answers: Mutex::new(answers),
        })
    }
}

impl ProvideCredentials for Scripted {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let answer = {
            let mut answers = self.answers.lock().unwrap();
            if answers.is_empty() {
                Err("no more answers")
            } else {
                answers.remove(0)
            }
        };
        future::ProvideCredentials::ready(match answer {
            Ok(expiry) => Ok(Credentials::new(
                format!("AK{n}"),
                "SECRET",
                Some(String::from("TOKEN")),
                expiry.map(|at| UNIX_EPOCH + Duration::from_secs(at as u64)),
                "Scripted",
            )),
            Err(why) => Err(CredentialsError::provider_error(why)),
        })
    }
}

#[tokio::test]
async fn expiring_keys_are_fetched_again_before_they_expire_and_kept_while_a_refresh_fails() {
    let start = crate::unix_now();
    let expires = start + 3600;
    let cache = CredentialCache::new(Scripted::provider(vec![
        Ok(Some(expires)),
        Ok(Some(expires + 3600)),
        Err("the metadata service is down"),
        Err("the metadata service is still down"),
    ]))
    .await
    .unwrap();
    assert!(
        cache.source().starts_with("Scripted, expiring in "),
        "{}",
        cache.source()
    );
    assert_eq!(cache.keys_at(start).await.unwrap().key(), "AK1");
    // Valid for an hour: nothing fetched.
    assert_eq!(cache.keys_at(start + 3000).await.unwrap().key(), "AK1");
    // Inside the last five minutes: fetched again.
    assert_eq!(cache.keys_at(expires - 299).await.unwrap().key(), "AK2");
    // The new ones are used until their own window.
    assert_eq!(cache.keys_at(expires + 1).await.unwrap().key(), "AK2");
    // A refresh that fails keeps valid keys ...
    let window = expires + 3600 - 200;
    assert_eq!(cache.keys_at(window).await.unwrap().key(), "AK2");
    // ... asks again at most once a minute ...
    assert_eq!(cache.keys_at(window + 30).await.unwrap().key(), "AK2");
    // ... and fails once they expired, saying why (never a key).
    let error = cache.keys_at(expires + 3600).await.unwrap_err();
    assert!(
        error.contains("expired") && error.contains("still down"),
        "{error}"
    );
    assert!(
        !error.contains("SECRET") && !error.contains("AK2"),
        "{error}"
    );
}

#[tokio::test]
async fn keys_that_never_expire_are_fetched_once() {
    let cache = CredentialCache::new(Scripted::provider(vec![Ok(None)]))
        .await
        .unwrap();
    let far = crate::unix_now() + 10 * 365 * 86400;
    assert_eq!(cache.keys_at(far).await.unwrap().key(), "AK1");
    assert_eq!(cache.source(), "Scripted");
}

#[tokio::test]
async fn no_credentials_at_start_is_an_error_with_the_chains_reason() {
    let error = CredentialCache::new(Scripted::provider(vec![Err("nothing in the chain")]))
        .await
        .unwrap_err();
    assert!(error.contains("nothing in the chain"), "{error}");
}

#[tokio::test]
async fn concurrent_callers_share_one_refresh() {
    let start = crate::unix_now();
    let provider = Arc::new(Scripted {
        calls: AtomicUsize::new(0),
        answers: Mutex::new(vec![Ok(Some(start + 100)), Ok(Some(start + 7200))]),
    });
    let cache = Arc::new(
        CredentialCache::new(SharedCredentialsProvider::new(ScriptedRef(
            provider.clone(),
        )))
        .await
        .unwrap(),
    );
    // Fetched at `start`, expiring 100 s later: inside the window, but a minute must pass.
    let at = start + 61;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.keys_at(at).await.unwrap().key().to_string() })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), "AK2");
    }
    assert_eq!(provider.calls.load(Ordering::SeqCst), 2);
}

#[derive(Debug)]
struct ScriptedRef(Arc<Scripted>);

impl ProvideCredentials for ScriptedRef {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        self.0.provide_credentials()
    }
}

#[test]
fn the_source_is_the_providers_name() {
    let credentials = Credentials::new("AKID", "SECRET", None, None, "IMDSv2");
    assert_eq!(provider_label(&credentials), "IMDSv2");
}
