//! AWS Signature Version 4 presigned URLs (query-string authentication), sans-IO: the caller
//! passes the time and the credentials and gets a URL. Used for blob uploads straight to R2's
//! S3 API when its credentials are configured (decision 0015); R2 takes region `auto`.
//!
//! Verified against the presigned `GET` example of AWS's S3 documentation
//! ("Authenticating Requests: Using Query Parameters"), rusty-s3's presigned `PUT` example, and
//! byte for byte against rusty-s3's presigned `PUT`s for random inputs (moto cannot check a
//! presigned request's signature; decision 0015).

use crate::civil_time::CivilTime;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// Credentials and scope of a signer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key (never logged).
    pub secret_access_key: String,
    /// Region (`auto` for R2).
    pub region: String,
}

/// One request to presign.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Presign<'a> {
    /// `GET`, `PUT`, ...
    pub method: &'a str,
    /// Scheme and authority, without a trailing slash: `https://examplebucket.s3.amazonaws.com`.
    pub origin: &'a str,
    /// The path, unencoded (`/bucket/key` for path-style addressing); each segment is
    /// URI-encoded as SigV4 requires.
    pub path: &'a str,
    /// Headers the uploader must send as they are here (besides `host`), e.g. `content-type`.
    pub signed_headers: &'a [(&'a str, &'a str)],
    /// Unix seconds of signing.
    pub now_unix: u64,
    /// Validity in seconds (1 to 604800).
    pub expires_seconds: u64,
}

/// The presigned URL of `request`.
pub fn presign_url(credentials: &Credentials, request: &Presign<'_>) -> String {
    let amz_date = amz_date(request.now_unix);
    let date = &amz_date[..8];
    let scope = format!("{date}/{}/s3/aws4_request", credentials.region);
    let host = request
        .origin
        .split_once("://")
        .map_or(request.origin, |(_, rest)| rest);
    let mut headers: Vec<(String, String)> = vec![("host".into(), host.to_string())];
    for (name, value) in request.signed_headers {
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    headers.sort();
    let signed_headers = headers
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let mut query = [
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256".to_string()),
        (
            "X-Amz-Credential",
            format!("{}/{scope}", credentials.access_key_id),
        ),
        ("X-Amz-Date", amz_date.clone()),
        ("X-Amz-Expires", request.expires_seconds.to_string()),
        ("X-Amz-SignedHeaders", signed_headers.clone()),
    ]
    .iter()
    .map(|(k, v)| (encode(k, true), encode(v, true)))
    .collect::<Vec<_>>();
    query.sort();
    let canonical_query = query
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&");
    let canonical_path = encode(request.path, false);
    let canonical_headers: String = headers.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let canonical_request = format!(
        "{}\n{canonical_path}\n{canonical_query}\n{canonical_headers}\n{signed_headers}\nUNSIGNED-PAYLOAD",
        request.method
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex::encode(Sha256::digest(canonical_request.as_bytes()))
    );
    let mut key = hmac(
        format!("AWS4{}", credentials.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    for part in [credentials.region.as_str(), "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&key, string_to_sign.as_bytes()));
    format!(
        "{}{canonical_path}?{canonical_query}&X-Amz-Signature={signature}",
        request.origin
    )
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// SigV4 URI encoding: everything but unreserved characters, and `/` too unless it is a path.
fn encode(text: &str, encode_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            b'/' if !encode_slash => out.push('/'),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` of unix seconds (UTC).
pub fn amz_date(unix: u64) -> String {
    let t = CivilTime::from_unix(i64::try_from(unix).unwrap_or(i64::MAX));
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aws_example_credentials() -> Credentials {
        Credentials {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            region: "us-east-1".into(),
        }
    }

    /// AWS S3 documentation, "Authenticating Requests: Using Query Parameters": the presigned
    /// GET of `examplebucket/test.txt` on 2013-05-24, valid 86400 s.
    /// AWS's documented presigned `GET`, and rusty-s3's own test of a presigned `PUT`
    /// (`actions/put_object.rs`, `aws_example`) with the same inputs.
    #[test]
    fn the_documented_presigned_examples() {
        for (method, signature) in [
            (
                "GET",
                "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404",
            ),
            (
                "PUT",
                "f4db56459304dafaa603a99a23c6bea8821890259a65c18ff503a4a72a80efd9",
            ),
        ] {
            let url = presign_url(
                &aws_example_credentials(),
                &Presign {
                    method,
                    origin: "https://examplebucket.s3.amazonaws.com",
                    path: "/test.txt",
                    signed_headers: &[],
                    now_unix: 1_369_353_600,
                    expires_seconds: 86_400,
                },
            );
            assert_eq!(
                url,
                format!(
                    "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature={signature}"
                ),
                "{method}"
            );
        }
    }

    #[test]
    fn a_put_signs_its_headers_and_encodes_the_key() {
        let url = presign_url(
            &Credentials {
                region: "auto".into(),
                ..aws_example_credentials()
            },
            &Presign {
                method: "PUT",
                origin: "https://acct.r2.cloudflarestorage.com",
                path: "/bucket/acme/blobs/s 1/x+y",
                signed_headers: &[("Content-Type", "text/plain")],
                now_unix: 1_369_353_600,
                expires_seconds: 900,
            },
        );
        assert!(
            url.starts_with("https://acct.r2.cloudflarestorage.com/bucket/acme/blobs/s%201/x%2By?"),
            "{url}"
        );
        assert!(
            url.contains("X-Amz-SignedHeaders=content-type%3Bhost"),
            "{url}"
        );
        assert!(url.contains("%2Fauto%2Fs3%2Faws4_request"), "{url}");
        // Another header value is another signature.
        let other = presign_url(
            &Credentials {
                region: "auto".into(),
                ..aws_example_credentials()
            },
            &Presign {
                method: "PUT",
                origin: "https://acct.r2.cloudflarestorage.com",
                path: "/bucket/acme/blobs/s 1/x+y",
                signed_headers: &[("Content-Type", "image/png")],
                now_unix: 1_369_353_600,
                expires_seconds: 900,
            },
        );
        assert_ne!(url, other);
    }

    /// moto cannot check a presigned request's signature (decision 0015), so the presigned PUTs
    /// the Worker issues (path-style, no signed headers but `host`) are checked byte for byte
    /// against rusty-s3's, the signer the runner uses against real S3 servers, over random keys
    /// (every printable ASCII character, spaces, non-ASCII), times, expiries, regions, endpoints
    /// with and without a port and random credentials.
    #[test]
    fn presigned_puts_are_rusty_s3_s_byte_for_byte() {
        use crate::rng::SplitMix64;
        const ENDPOINTS: [&str; 4] = [
            "https://acct.r2.cloudflarestorage.com",
            "http://127.0.0.1:9000",
            "https://s3.eu-west-1.amazonaws.com",
            "http://localhost:4566",
        ];
        const REGIONS: [&str; 3] = ["auto", "us-east-1", "eu-west-1"];
        let alphabet: Vec<char> = (0x20u8..0x7f)
            .map(char::from)
            .chain(['é', 'ü', '中', '😀'])
            .collect();
        let mut rng = SplitMix64::new(13);
        let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
        for case in 0..500 {
            let endpoint = ENDPOINTS[pick(ENDPOINTS.len())];
            let region = REGIONS[pick(REGIONS.len())];
            let bucket = ["wuhu", "blobs-1", "a.b.c"][pick(3)];
            let mut key: String = (0..1 + pick(40))
                .map(|_| alphabet[pick(alphabet.len())])
                .collect();
            if key.starts_with('/') {
                key.insert(0, 'k');
            }
            let access_key_id: String =
                (0..20).map(|_| char::from(b'A' + pick(26) as u8)).collect();
            let secret: String = (0..40).map(|_| alphabet[pick(95)]).collect();
            let now_unix = 1_000_000_000 + (pick(1_000_000_000) as u64);
            let expires_seconds = 1 + pick(604_800) as u64;
            let ours = presign_url(
                &Credentials {
                    access_key_id: access_key_id.clone(),
                    secret_access_key: secret.clone(),
                    region: region.into(),
                },
                &Presign {
                    method: "PUT",
                    origin: endpoint,
                    path: &format!("/{bucket}/{key}"),
                    signed_headers: &[],
                    now_unix,
                    expires_seconds,
                },
            );
            let theirs = {
                use rusty_s3::S3Action as _;
                let bucket = rusty_s3::Bucket::new(
                    endpoint.parse().unwrap(),
                    rusty_s3::UrlStyle::Path,
                    bucket,
                    region,
                )
                .unwrap();
                let credentials = rusty_s3::Credentials::new(access_key_id, secret);
                rusty_s3::actions::PutObject::new(&bucket, Some(&credentials), &key).sign_with_time(
                    std::time::Duration::from_secs(expires_seconds),
                    &jiff::Timestamp::from_second(now_unix as i64).unwrap(),
                )
            };
            assert_eq!(ours, theirs.as_str(), "case {case}: key {key:?}");
        }
    }

    #[test]
    fn dates() {
        for (unix, expected) in [
            (0, "19700101T000000Z"),
            (1_369_353_600, "20130524T000000Z"),
            (951_782_400, "20000229T000000Z"),
            (1_798_761_599, "20261231T235959Z"),
        ] {
            assert_eq!(amz_date(unix), expected, "{unix}");
        }
    }
}
