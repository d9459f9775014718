//! The S3 calls cloud workspaces make: rusty-s3 signs each request (SigV4, no I/O), reqwest
//! sends it. Every PUT is counted ([`S3::puts`]) for the save report.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use rusty_s3::actions::{
    CompleteMultipartUpload, CreateMultipartUpload, DeleteObjectsResponse, ListObjectsV2,
    ObjectIdentifier, S3Action,
};
use rusty_s3::{Bucket, Credentials, UrlStyle};

use super::rules::{self, AwsCredentials, CredentialSource, StoreLocation};

/// How long a signed URL is valid: requests are sent at once.
const SIGNED_FOR: Duration = Duration::from_secs(300);
/// A whole request's limit.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// A failed S3 call.
#[derive(thiserror::Error, Debug)]
pub enum S3Error {
    /// The request did not complete.
    #[error("{what}: {source}")]
    Transport {
        /// Which call.
        what: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The server answered with an unexpected status.
    #[error("{what}: HTTP {status}: {body}")]
    Status {
        /// Which call.
        what: String,
        /// The status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The answer could not be understood.
    #[error("{0}")]
    Invalid(String),
}

/// A conditional PUT's condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Condition {
    /// Unconditional.
    None,
    /// `If-Match: <etag>`: replace only that version.
    IfMatch(String),
    /// `If-None-Match: *`: create only.
    IfNoneMatch,
}

/// What a conditional PUT did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Put {
    /// Written; the new ETag when the server sent one.
    Done(Option<String>),
    /// The condition failed (HTTP 412, or 409 for a concurrent conditional write).
    PreconditionFailed,
}

/// One bucket.
pub struct S3 {
    bucket: Bucket,
    keys: Keys,
    http: reqwest::Client,
    puts: AtomicU64,
}

/// The signing keys in use, and how to get new ones.
struct Keys {
    current: std::sync::Mutex<Current>,
    /// The `credential_process` command and where it was found; `None` for static keys.
    process: Option<(String, String)>,
    /// One refresh at a time.
    refreshing: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
struct Current {
    credentials: Arc<Credentials>,
    expires_at: Option<i64>,
    fetched_at: i64,
}

fn signing_keys(credentials: &AwsCredentials) -> Credentials {
    match &credentials.session_token {
        Some(token) => Credentials::new_with_token(
            &credentials.access_key_id,
            &credentials.secret_access_key,
            token,
        ),
        None => Credentials::new(&credentials.access_key_id, &credentials.secret_access_key),
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Runs a `credential_process` (`sh -c COMMAND`, its stderr passed through, at most
/// [`rules::CREDENTIAL_PROCESS_TIMEOUT_SECONDS`]) and reads its output
/// ([`rules::parse_process_output`]). Blocking.
///
/// # Errors
///
/// A message (never the output) when it cannot start, times out, fails or prints something
/// unusable.
pub fn run_credential_process(
    command: &str,
    source: &str,
) -> Result<rules::ProcessCredentials, String> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new("sh")
        .args(["-c", command])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{source}: cannot start it: {e}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    // Read on a thread, so a process that prints more than a pipe holds cannot stall the wait.
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&mut stdout)
            .take(rules::CREDENTIAL_PROCESS_MAX_OUTPUT_BYTES as u64 + 1)
            .read_to_end(&mut out);
        out
    });
    let deadline =
        std::time::Instant::now() + Duration::from_secs(rules::CREDENTIAL_PROCESS_TIMEOUT_SECONDS);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{source}: no answer within {} s",
                    rules::CREDENTIAL_PROCESS_TIMEOUT_SECONDS
                ));
            }
            Err(e) => return Err(format!("{source}: {e}")),
        }
    };
    let out = reader.join().unwrap_or_default();
    // The size first: the reader stops at the limit, so a process still printing past it
    // dies of SIGPIPE, and its exit status would hide why.
    if out.len() > rules::CREDENTIAL_PROCESS_MAX_OUTPUT_BYTES {
        return Err(format!(
            "{source}: the output is over {} bytes",
            rules::CREDENTIAL_PROCESS_MAX_OUTPUT_BYTES
        ));
    }
    if !status.success() {
        return Err(format!("{source}: the command failed ({status})"));
    }
    rules::parse_process_output(&String::from_utf8_lossy(&out), source, unix_now())
}

impl std::fmt::Debug for S3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3")
            .field("bucket", &self.bucket.name())
            .field("base_url", &self.bucket.base_url().as_str())
            .finish_non_exhaustive()
    }
}

impl S3 {
    /// A client for `location`'s bucket: at `endpoint` with path-style addressing when given
    /// (MinIO, R2, local servers), else AWS's regional endpoint, virtual-host style.
    ///
    /// # Errors
    ///
    /// A message for a bad endpoint URL.
    pub fn new(
        location: &StoreLocation,
        endpoint: Option<&str>,
        region: &str,
        credentials: &CredentialSource,
    ) -> Result<S3, String> {
        let (url, style) = match endpoint {
            Some(endpoint) => (endpoint.to_string(), UrlStyle::Path),
            None => (
                format!("https://s3.{region}.amazonaws.com"),
                UrlStyle::VirtualHost,
            ),
        };
        let url: url::Url = url
            .parse()
            .map_err(|e| format!("--store-endpoint {url:?}: {e}"))?;
        let bucket = Bucket::new(url, style, location.bucket.clone(), region.to_string())
            .map_err(|e| format!("--store-endpoint: {e:?}"))?;
        let (current, process) = match credentials {
            CredentialSource::Static(keys) => (
                Current {
                    credentials: Arc::new(signing_keys(keys)),
                    expires_at: None,
                    fetched_at: unix_now(),
                },
                None,
            ),
            CredentialSource::Process { command, source } => {
                let fetched = run_credential_process(command, source)?;
                (
                    Current {
                        credentials: Arc::new(signing_keys(&fetched.credentials)),
                        expires_at: fetched.expires_at,
                        fetched_at: unix_now(),
                    },
                    Some((command.clone(), source.clone())),
                )
            }
        };
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(S3 {
            bucket,
            keys: Keys {
                current: std::sync::Mutex::new(current),
                process,
                refreshing: tokio::sync::Mutex::new(()),
            },
            http,
            puts: AtomicU64::new(0),
        })
    }

    /// The keys to sign with: process credentials are fetched again before they expire
    /// ([`rules::needs_refresh`]); a failed refresh keeps the old keys while they are valid.
    ///
    /// # Errors
    ///
    /// [`S3Error::Invalid`] when they expired and the process failed.
    async fn credentials(&self) -> Result<Arc<Credentials>, S3Error> {
        let current = || {
            self.keys
                .current
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
        };
        let Some((command, source)) = &self.keys.process else {
            return Ok(current().credentials);
        };
        if !rules::needs_refresh(current().expires_at, current().fetched_at, unix_now()) {
            return Ok(current().credentials);
        }
        let _one = self.keys.refreshing.lock().await;
        let now_current = current();
        if !rules::needs_refresh(now_current.expires_at, now_current.fetched_at, unix_now()) {
            return Ok(now_current.credentials);
        }
        let (command, source_) = (command.clone(), source.clone());
        let fetched =
            tokio::task::spawn_blocking(move || run_credential_process(&command, &source_))
                .await
                .map_err(|e| S3Error::Invalid(e.to_string()))
                .and_then(|r| r.map_err(S3Error::Invalid));
        match fetched {
            Ok(fetched) => {
                let next = Current {
                    credentials: Arc::new(signing_keys(&fetched.credentials)),
                    expires_at: fetched.expires_at,
                    fetched_at: unix_now(),
                };
                *self.keys.current.lock().unwrap_or_else(|p| p.into_inner()) = next.clone();
                Ok(next.credentials)
            }
            Err(e) => {
                let still_valid = now_current.expires_at.is_none_or(|at| unix_now() < at);
                let mut kept = now_current.clone();
                kept.fetched_at = unix_now();
                *self.keys.current.lock().unwrap_or_else(|p| p.into_inner()) = kept;
                eprintln!(
                    "wuhu-runner: store: refreshing the credentials from {source} failed{}: {e}",
                    if still_valid {
                        " (the current ones are used until they expire)"
                    } else {
                        ""
                    }
                );
                if still_valid {
                    Ok(now_current.credentials)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// PUT requests sent so far (objects, parts, manifests, leases).
    pub fn puts(&self) -> u64 {
        self.puts.load(Ordering::Relaxed)
    }

    /// GETs an object: `None` when it does not exist, else its body and ETag.
    ///
    /// # Errors
    ///
    /// [`S3Error`] for anything but 200 and 404.
    pub async fn get(&self, key: &str) -> Result<Option<(Vec<u8>, Option<String>)>, S3Error> {
        let what = format!("GET {key}");
        let credentials = self.credentials().await?;
        let url = self
            .bucket
            .get_object(Some(&*credentials), key)
            .sign(SIGNED_FOR);
        let response = self.http.get(url).send_named(&what).await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let response = check(response, &what).await?;
        let etag = etag_of(&response);
        let body = response
            .bytes()
            .await
            .map_err(|source| S3Error::Transport { what, source })?;
        Ok(Some((body.to_vec(), etag)))
    }

    /// PUTs an object under `condition`.
    ///
    /// # Errors
    ///
    /// [`S3Error`] for anything but 2xx and a failed precondition.
    pub async fn put(
        &self,
        key: &str,
        body: Vec<u8>,
        condition: &Condition,
    ) -> Result<Put, S3Error> {
        let what = format!("PUT {key}");
        let credentials = self.credentials().await?;
        let mut action = self.bucket.put_object(Some(&*credentials), key);
        let (name, value) = match condition {
            Condition::None => ("", String::new()),
            Condition::IfMatch(etag) => ("if-match", etag.clone()),
            Condition::IfNoneMatch => ("if-none-match", String::from("*")),
        };
        if !name.is_empty() {
            action.headers_mut().insert(name, value.clone());
        }
        let url = action.sign(SIGNED_FOR);
        let mut request = self.http.put(url).body(body);
        if !name.is_empty() {
            request = request.header(name, value);
        }
        self.puts.fetch_add(1, Ordering::Relaxed);
        let response = request.send_named(&what).await?;
        let status = response.status();
        if *condition != Condition::None
            && (status == StatusCode::PRECONDITION_FAILED || status == StatusCode::CONFLICT)
        {
            return Ok(Put::PreconditionFailed);
        }
        let response = check(response, &what).await?;
        Ok(Put::Done(etag_of(&response)))
    }

    /// DELETEs an object (a missing one is fine).
    ///
    /// # Errors
    ///
    /// [`S3Error`] for anything but 2xx and 404.
    pub async fn delete(&self, key: &str) -> Result<(), S3Error> {
        let what = format!("DELETE {key}");
        let credentials = self.credentials().await?;
        let url = self
            .bucket
            .delete_object(Some(&*credentials), key)
            .sign(SIGNED_FOR);
        let response = self.http.delete(url).send_named(&what).await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(());
        }
        check(response, &what).await.map(|_| ())
    }

    /// One page (at most 1,000) of the keys under `prefix`, and the token of the next page.
    ///
    /// # Errors
    ///
    /// [`S3Error`].
    pub async fn list(
        &self,
        prefix: &str,
        token: Option<&str>,
    ) -> Result<(Vec<String>, Option<String>), S3Error> {
        let what = format!("LIST {prefix}");
        let credentials = self.credentials().await?;
        let mut action = self.bucket.list_objects_v2(Some(&*credentials));
        action.with_prefix(prefix);
        action.with_max_keys(1000);
        if let Some(token) = token {
            action.with_continuation_token(token);
        }
        let url = action.sign(SIGNED_FOR);
        let response = self.http.get(url).send_named(&what).await?;
        let body = text_of(response, &what).await?;
        let page = ListObjectsV2::parse_response(&body)
            .map_err(|e| S3Error::Invalid(format!("{what}: {e}")))?;
        Ok((
            page.contents.into_iter().map(|c| c.key).collect(),
            page.next_continuation_token,
        ))
    }

    /// Deletes up to 1,000 keys in one request (`POST ?delete`, quiet: only failures are
    /// reported; a missing key is no failure).
    ///
    /// # Errors
    ///
    /// [`S3Error`], also when the server reports a key it could not delete.
    pub async fn delete_many(&self, keys: &[String]) -> Result<(), S3Error> {
        if keys.is_empty() {
            return Ok(());
        }
        let what = format!("DELETE {} keys from {}", keys.len(), keys[0]);
        let credentials = self.credentials().await?;
        let objects: Vec<ObjectIdentifier> = keys
            .iter()
            .map(|k| ObjectIdentifier::new(k.clone()))
            .collect();
        let mut action = self
            .bucket
            .delete_objects(Some(&*credentials), objects.iter());
        action.set_quiet(true);
        let url = action.sign(SIGNED_FOR);
        let (body, md5) = action.body_with_md5();
        let response = self
            .http
            .post(url)
            .header("content-md5", md5)
            .body(body)
            .send_named(&what)
            .await?;
        let text = text_of(response, &what).await?;
        // Some servers answer a fully successful quiet delete with an empty body.
        if text.trim().is_empty() {
            return Ok(());
        }
        let answer = DeleteObjectsResponse::parse(&text)
            .map_err(|e| S3Error::Invalid(format!("{what}: {e}")))?;
        match answer.errors.first() {
            None => Ok(()),
            Some(first) => Err(S3Error::Invalid(format!(
                "{what}: {} not deleted, the first {}: {} {}",
                answer.errors.len(),
                first.key,
                first.code,
                first.message
            ))),
        }
    }

    /// Starts a multipart upload; returns its id.
    ///
    /// # Errors
    ///
    /// [`S3Error`].
    pub async fn start_multipart(&self, key: &str) -> Result<String, S3Error> {
        let what = format!("POST {key}?uploads");
        let credentials = self.credentials().await?;
        let url = self
            .bucket
            .create_multipart_upload(Some(&*credentials), key)
            .sign(SIGNED_FOR);
        let response = self.http.post(url).send_named(&what).await?;
        let body = text_of(response, &what).await?;
        let parsed = CreateMultipartUpload::parse_response(&body)
            .map_err(|e| S3Error::Invalid(format!("{what}: {e}")))?;
        Ok(parsed.upload_id().to_string())
    }

    /// Uploads part `number` (from 1); returns its ETag.
    ///
    /// # Errors
    ///
    /// [`S3Error`], also when the answer has no ETag.
    pub async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u16,
        body: Vec<u8>,
    ) -> Result<String, S3Error> {
        let what = format!("PUT {key} part {number}");
        let credentials = self.credentials().await?;
        let url = self
            .bucket
            .upload_part(Some(&*credentials), key, number, upload_id)
            .sign(SIGNED_FOR);
        self.puts.fetch_add(1, Ordering::Relaxed);
        let response = self.http.put(url).body(body).send_named(&what).await?;
        let response = check(response, &what).await?;
        etag_of(&response).ok_or_else(|| S3Error::Invalid(format!("{what}: no ETag")))
    }

    /// Completes a multipart upload from its parts' ETags, in order.
    ///
    /// # Errors
    ///
    /// [`S3Error`].
    pub async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        etags: &[String],
    ) -> Result<(), S3Error> {
        let what = format!("POST {key}?uploadId");
        let credentials = self.credentials().await?;
        let action = self.bucket.complete_multipart_upload(
            Some(&*credentials),
            key,
            upload_id,
            etags.iter().map(String::as_str),
        );
        let url = action.sign(SIGNED_FOR);
        let body = CompleteMultipartUpload::body(action);
        let response = self.http.post(url).body(body).send_named(&what).await?;
        check(response, &what).await.map(|_| ())
    }

    /// Aborts a multipart upload (best effort).
    pub async fn abort_multipart(&self, key: &str, upload_id: &str) {
        let Ok(credentials) = self.credentials().await else {
            return;
        };
        let url = self
            .bucket
            .abort_multipart_upload(Some(&*credentials), key, upload_id)
            .sign(SIGNED_FOR);
        let _ = self.http.delete(url).send().await;
    }
}

/// Sending a signed request: a transport failure names what was asked.
trait SendNamed {
    async fn send_named(self, what: &str) -> Result<reqwest::Response, S3Error>;
}

impl SendNamed for reqwest::RequestBuilder {
    async fn send_named(self, what: &str) -> Result<reqwest::Response, S3Error> {
        self.send().await.map_err(|source| S3Error::Transport {
            what: what.to_string(),
            source,
        })
    }
}

/// The body of a successful answer, as text.
async fn text_of(response: reqwest::Response, what: &str) -> Result<String, S3Error> {
    check(response, what)
        .await?
        .text()
        .await
        .map_err(|source| S3Error::Transport {
            what: what.to_string(),
            source,
        })
}

async fn check(response: reqwest::Response, what: &str) -> Result<reqwest::Response, S3Error> {
    if response.status().is_success() {
        return Ok(response);
    }
    let status = response.status().as_u16();
    let body = response.text().await.unwrap_or_default();
    let body: String = body.chars().take(300).collect();
    Err(S3Error::Status {
        what: what.to_string(),
        status,
        body,
    })
}

fn etag_of(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get(reqwest::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A `credential_process` script: prints keys numbered by how often it ran (counted in a
    /// file next to it), expiring `expires_in` seconds from now when given.
    fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.to_string_lossy().into_owned()
    }

    fn location() -> StoreLocation {
        StoreLocation {
            bucket: String::from("bucket"),
            prefix: String::new(),
        }
    }

    #[tokio::test]
    async fn credential_process_keys_are_fetched_at_start_and_again_before_they_expire() {
        let dir = tempfile::tempdir().unwrap();
        let counter = dir.path().join("runs");
        let expires = jiff::Timestamp::from_second(unix_now() + 3600).unwrap();
        let good = script(
            dir.path(),
            "creds.sh",
            &format!(
                "n=$(( $(cat {c} 2>/dev/null || echo 0) + 1 )); echo $n > {c}; echo 'a message for the log' >&2; \
                 printf '{{\"Version\": 1, \"AccessKeyId\": \"AK%s\", \"SecretAccessKey\": \"SK\", \"SessionToken\": \"T\", \"Expiration\": \"{expires}\"}}' $n",
                c = counter.display()
            ),
        );
        let source = CredentialSource::Process {
            command: good.clone(),
            source: String::from("test process"),
        };
        let s3 = S3::new(
            &location(),
            Some("http://127.0.0.1:9"),
            "us-east-1",
            &source,
        )
        .unwrap();
        assert_eq!(s3.credentials().await.unwrap().key(), "AK1");
        // Valid for an hour: no new run.
        assert_eq!(s3.credentials().await.unwrap().key(), "AK1");
        // Inside the refresh window (and fetched long enough ago): run again.
        {
            let mut current = s3.keys.current.lock().unwrap();
            current.expires_at = Some(unix_now() + 100);
            current.fetched_at = unix_now() - 120;
        }
        assert_eq!(s3.credentials().await.unwrap().key(), "AK2");
        assert_eq!(std::fs::read_to_string(&counter).unwrap().trim(), "2");

        // A refresh that fails keeps valid keys, and fails once they expired.
        let failing = S3 {
            keys: Keys {
                current: std::sync::Mutex::new(Current {
                    credentials: Arc::new(Credentials::new("OLD", "S")),
                    expires_at: Some(unix_now() + 100),
                    fetched_at: unix_now() - 120,
                }),
                process: Some((String::from("exit 3"), String::from("broken"))),
                refreshing: tokio::sync::Mutex::new(()),
            },
            ..s3
        };
        assert_eq!(failing.credentials().await.unwrap().key(), "OLD");
        {
            let mut current = failing.keys.current.lock().unwrap();
            current.expires_at = Some(unix_now() - 1);
        }
        let error = failing.credentials().await.unwrap_err().to_string();
        assert!(error.contains("broken: the command failed"), "{error}");
    }

    #[test]
    fn a_credential_process_that_fails_or_prints_nonsense_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        // (script body, error fragment)
        let cases = [
            ("echo '{\"Version\": 1}'; exit 1", "the command failed"),
            ("echo 'AKIA SECRET'", "the output is not JSON"),
            (
                "echo '{\"Version\": 1, \"AccessKeyId\": \"AK\", \"SecretAccessKey\": \"SECRET\", \"Expiration\": \"2001-01-01T00:00:00Z\"}'",
                "expired",
            ),
            ("head -c 70000 /dev/zero", "over 65536 bytes"),
        ];
        for (i, (body, fragment)) in cases.into_iter().enumerate() {
            let command = script(dir.path(), &format!("c{i}.sh"), body);
            let source = CredentialSource::Process {
                command,
                source: String::from("test process"),
            };
            let error = S3::new(&location(), None, "us-east-1", &source).unwrap_err();
            assert!(error.contains(fragment), "{body}: {error}");
            assert!(!error.contains("SECRET"), "{error}");
        }
        let missing = CredentialSource::Process {
            command: String::from("/nonexistent/creds"),
            source: String::from("test process"),
        };
        assert!(
            S3::new(&location(), None, "us-east-1", &missing)
                .unwrap_err()
                .contains("the command failed")
        );
    }
}
