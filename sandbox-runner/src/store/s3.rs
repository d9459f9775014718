//! The S3 calls cloud workspaces make: rusty-s3 signs each request (SigV4, no I/O) with keys
//! from the credentials chain ([`CredentialCache`]), reqwest sends it. Every PUT is counted
//! ([`S3::puts`]) for the save report.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use rusty_s3::actions::{
    CompleteMultipartUpload, CreateMultipartUpload, DeleteObjectsResponse, ListObjectsV2,
    ObjectIdentifier, S3Action,
};
use rusty_s3::{Bucket, Credentials, UrlStyle};

use super::credentials::CredentialCache;
use super::rules::StoreLocation;

/// How long a signed URL is valid: requests are sent at once.
const SIGNED_FOR: Duration = Duration::from_secs(300);
/// A whole request's limit.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

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
    keys: CredentialCache,
    http: reqwest::Client,
    puts: AtomicU64,
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
    /// (MinIO, R2, local servers), else AWS's regional endpoint, virtual-host style; requests
    /// signed with `keys` and sent by `http`.
    ///
    /// # Errors
    ///
    /// A message for a bad endpoint URL.
    pub fn new(
        location: &StoreLocation,
        endpoint: Option<&str>,
        region: &str,
        keys: CredentialCache,
        http: reqwest::Client,
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
        Ok(S3 {
            bucket,
            keys,
            http,
            puts: AtomicU64::new(0),
        })
    }

    /// Where the signing keys came from (for the start-up line; never a key).
    pub fn credentials_source(&self) -> String {
        self.keys.source()
    }

    /// The keys to sign with, refreshed before they expire ([`CredentialCache::keys`]).
    ///
    /// # Errors
    ///
    /// [`S3Error::Invalid`] when they expired and could not be fetched again.
    async fn credentials(&self) -> Result<Arc<Credentials>, S3Error> {
        self.keys.keys().await.map_err(S3Error::Invalid)
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
