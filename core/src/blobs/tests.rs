use super::*;

const SESSION: &str = "0b7f5c3e-1d2a-4b6c-8e9f-0123456789ab";
const KEY: &[u8] = b"a key derived from the server secret";

fn id() -> String {
    new_id(SESSION, [0xab; 16])
}

fn pairs(url: &str) -> Vec<(String, String)> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

#[test]
fn ids_name_their_session_and_nothing_else_parses() {
    let id = id();
    assert_eq!(id.len(), 36 + 1 + 32);
    let parsed = parse_id(&id).unwrap();
    assert_eq!(parsed.session_id, SESSION);
    assert_eq!(
        object_key("acme", parsed),
        format!("acme/blobs/{SESSION}/{id}")
    );
    assert!(object_key("acme", parsed).starts_with(&session_prefix("acme", SESSION)));
    assert_eq!(id_from_uri(&uri(&id)), Some(Ok(parsed)));
    assert_eq!(id_from_uri("wuhu://workspace/a.md"), None);
    for bad in [
        "",
        SESSION,
        &format!("{SESSION}."),
        &format!("{SESSION}.{}", "A".repeat(32)),
        &format!("{SESSION}.{}", "a".repeat(31)),
        &format!("{SESSION}.{}/x", "a".repeat(31)),
        &format!("../../x.{}", "a".repeat(32)),
        &format!("{}.{}", "g".repeat(36), "a".repeat(32)),
    ] {
        assert_eq!(parse_id(bad), None, "{bad}");
    }
    assert!(matches!(id_from_uri("wuhu://blob/nope"), Some(Err(_))));
}

#[test]
fn media_types_are_an_allow_list() {
    for (given, stored, served) in [
        ("text/plain", "text/plain", "text/plain; charset=utf-8"),
        (
            "Text/Plain; charset=latin1",
            "text/plain",
            "text/plain; charset=utf-8",
        ),
        ("image/png", "image/png", "image/png"),
        (
            "text/html",
            "application/octet-stream",
            "application/octet-stream",
        ),
        (
            "image/svg+xml",
            "application/octet-stream",
            "application/octet-stream",
        ),
        ("", "application/octet-stream", "application/octet-stream"),
    ] {
        assert_eq!(normalize_media_type(given), stored, "{given}");
        assert_eq!(content_type(given), served, "{given}");
    }
    assert!(is_image("image/png") && is_image("image/webp") && !is_image("image/svg+xml"));
    for (path, media) in [
        ("shot.PNG", "image/png"),
        ("a/b.jpeg", "image/jpeg"),
        ("x.html", "application/octet-stream"),
        ("README", "application/octet-stream"),
        ("out.log", "text/plain"),
    ] {
        assert_eq!(media_type_of_path(path), media, "{path}");
    }
}

#[test]
fn ranges() {
    let size = 100;
    for (header, expected) in [
        (None, Ok(None)),
        (Some("bytes=0-9"), Ok(Some((0, 10)))),
        (Some("bytes=90-"), Ok(Some((90, 10)))),
        (Some("bytes=90-1000"), Ok(Some((90, 10)))),
        (Some("bytes=-10"), Ok(Some((90, 10)))),
        (Some("bytes=-1000"), Ok(Some((0, 100)))),
        (Some("bytes=99-99"), Ok(Some((99, 1)))),
        (Some("bytes=100-"), Err(RangeError::Unsatisfiable { size })),
        (Some("bytes=-0"), Err(RangeError::Unsatisfiable { size })),
        (Some("bytes=5-1"), Ok(None)),
        (Some("bytes=0-1,5-6"), Ok(None)),
        (Some("items=0-1"), Ok(None)),
        (Some("bytes=x-1"), Ok(None)),
        (
            Some("bytes=18446744073709551615-"),
            Err(RangeError::Unsatisfiable { size }),
        ),
    ] {
        assert_eq!(byte_range(header, size), expected, "{header:?}");
    }
    assert_eq!(
        byte_range(Some("bytes=0-"), 0),
        Err(RangeError::Unsatisfiable { size: 0 })
    );
}

#[test]
fn upload_urls_allow_one_blob_until_they_expire() {
    let now = 1_000_000;
    let grant = UploadGrant::issue("acme", &id(), now);
    let url = grant.relative_url(KEY);
    assert!(url.starts_with("/v1/blobs/upload?"), "{url}");
    let good = pairs(&url);
    assert_eq!(
        UploadGrant::verify(&good, KEY, Some(10), now),
        Ok(grant.clone())
    );
    // At the expiry instant it is still valid; one millisecond later it is not.
    assert!(UploadGrant::verify(&good, KEY, Some(10), grant.expires_at_ms).is_ok());
    assert_eq!(
        UploadGrant::verify(&good, KEY, Some(10), grant.expires_at_ms + 1),
        Err(UploadRefusal::Expired)
    );
    // The size cap, and a body of unknown length.
    assert!(UploadGrant::verify(&good, KEY, Some(MAX_BLOB_BYTES), now).is_ok());
    assert!(matches!(
        UploadGrant::verify(&good, KEY, Some(MAX_BLOB_BYTES + 1), now),
        Err(UploadRefusal::TooLarge { .. })
    ));
    assert!(matches!(
        UploadGrant::verify(&good, KEY, None, now),
        Err(UploadRefusal::TooLarge { .. })
    ));
    // Any parameter changed, or another key: the signature no longer matches.
    let other_id = new_id(SESSION, [0xcd; 16]);
    for (name, value) in [
        ("tenant", "evil"),
        ("blob", other_id.as_str()),
        ("max", "999999999999"),
        ("exp", "99999999999999"),
        ("sig", "00"),
        ("sig", "zz"),
    ] {
        let tampered: Vec<(String, String)> = good
            .iter()
            .map(|(k, v)| {
                let v = if k == name {
                    value.to_string()
                } else {
                    v.clone()
                };
                (k.clone(), v)
            })
            .collect();
        assert_eq!(
            UploadGrant::verify(&tampered, KEY, Some(10), now),
            Err(UploadRefusal::BadSignature),
            "{name}"
        );
    }
    assert_eq!(
        UploadGrant::verify(&good, b"another key", Some(10), now),
        Err(UploadRefusal::BadSignature)
    );
    let missing: Vec<(String, String)> = good.iter().filter(|(k, _)| k != "exp").cloned().collect();
    assert!(matches!(
        UploadGrant::verify(&missing, KEY, Some(10), now),
        Err(UploadRefusal::Malformed(_))
    ));
    // The upload key is not the server secret.
    assert_ne!(upload_key(b"secret"), b"secret".to_vec());
    assert_eq!(upload_key(b"secret"), upload_key(b"secret"));
}

#[test]
fn a_runner_names_only_the_granted_blob_as_stored() {
    let granted = id();
    let claimed = BlobRef {
        uri: uri(&granted),
        size: 5,
        media_type: "image/png".into(),
        preview: Some("x".repeat(5000)),
        width: Some(9),
        height: Some(9),
    };
    // What storage says wins over what the runner says.
    let accepted = accept_upload(&claimed, &granted, Some((7, "text/plain"))).unwrap();
    assert_eq!(accepted.size, 7);
    assert_eq!(accepted.media_type, "text/plain");
    assert_eq!(accepted.preview.unwrap().len(), PREVIEW_BYTES);
    assert!(accept_upload(&claimed, &granted, None).is_err());
    assert!(accept_upload(&claimed, &granted, Some((MAX_BLOB_BYTES + 1, "text/plain"))).is_err());
    let other = new_id(SESSION, [1; 16]);
    assert!(accept_upload(&claimed, &other, Some((7, "text/plain"))).is_err());
    // An image keeps no preview and none of the runner's pixel claims.
    let image = accept_upload(&claimed, &granted, Some((7, "image/png"))).unwrap();
    assert_eq!(
        (image.preview, image.width, image.height),
        (None, None, None)
    );
}

#[test]
fn an_image_blob_is_what_its_stored_bytes_say() {
    let png = |w: u32, h: u32| {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend_from_slice(&w.to_be_bytes());
        b.extend_from_slice(&h.to_be_bytes());
        b
    };
    let blob = |media_type: &str, size: u64| BlobRef {
        uri: uri(&id()),
        size,
        media_type: media_type.into(),
        preview: None,
        width: Some(1),
        height: Some(1),
    };
    let max = crate::images::MAX_IMAGE_BYTES;
    for (name, stored, head, expected) in [
        (
            "png",
            blob("image/png", 70),
            png(2, 3),
            Ok((Some(2), Some(3))),
        ),
        (
            "png at the limit",
            blob("image/png", max),
            png(2, 3),
            Ok((Some(2), Some(3))),
        ),
        (
            "over the limit",
            blob("image/png", max + 1),
            png(2, 3),
            Err(()),
        ),
        (
            "jpeg stored as png",
            blob("image/png", 70),
            vec![0xff, 0xd8, 0xff, 0xe0],
            Err(()),
        ),
        (
            "text stored as png",
            blob("image/png", 70),
            b"<html>".to_vec(),
            Err(()),
        ),
        (
            "text is left alone",
            blob("text/plain", 70),
            b"<html>".to_vec(),
            Ok((Some(1), Some(1))),
        ),
        (
            "a big text blob too",
            blob("text/plain", max + 1),
            Vec::new(),
            Ok((Some(1), Some(1))),
        ),
    ] {
        let got = accept_image(stored, &head)
            .map(|b| (b.width, b.height))
            .map_err(|_| ());
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn upload_urls_resolve_against_the_server() {
    for (server, url, expected) in [
        (
            "http://127.0.0.1:8787",
            "/v1/blobs/upload?a=1",
            "http://127.0.0.1:8787/v1/blobs/upload?a=1",
        ),
        (
            "https://wuhu.example.com/",
            "/v1/x",
            "https://wuhu.example.com/v1/x",
        ),
        (
            "wss://wuhu.example.com",
            "/v1/x",
            "https://wuhu.example.com/v1/x",
        ),
        ("ws://127.0.0.1:1", "/v1/x", "http://127.0.0.1:1/v1/x"),
        (
            "http://a",
            "https://acct.r2.cloudflarestorage.com/b/k?X-Amz-Signature=1",
            "https://acct.r2.cloudflarestorage.com/b/k?X-Amz-Signature=1",
        ),
    ] {
        assert_eq!(resolve_upload_url(server, url), expected, "{server} {url}");
    }
}

#[test]
fn the_output_note_names_the_blob_instead_of_the_log() {
    let blob = BlobRef {
        uri: uri(&id()),
        size: 10,
        media_type: "text/plain".into(),
        preview: None,
        width: None,
        height: None,
    };
    let content = "tail\n[Showing the last 2 of 9 lines (2000 lines or 50 KB limit). Full output: /tmp/l.log]";
    let replaced = replace_output_path(content, "/tmp/l.log", &blob);
    assert!(!replaced.contains("/tmp/l.log"), "{replaced}");
    assert!(
        replaced.contains(&format!("Full output: {} (10 bytes)", blob.uri)),
        "{replaced}"
    );
    assert!(replaced.ends_with("\"limit\":2000}]"), "{replaced}");
    assert!(replace_output_path("x", "/p", &blob).contains(&blob.uri));
}

#[test]
fn previews_cut_at_a_char_boundary() {
    assert_eq!(preview("short"), "short");
    let euros = "€".repeat(PREVIEW_BYTES);
    let cut = preview(&euros);
    assert!(cut.len() <= PREVIEW_BYTES && cut.len() > PREVIEW_BYTES - 3);
}

#[test]
fn a_read_of_a_blob_is_an_image_when_its_bytes_are_one() {
    let png = {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
        b.extend_from_slice(&4u32.to_be_bytes());
        b.extend_from_slice(&5u32.to_be_bytes());
        b
    };
    let gif = b"GIF89a\x07\0\x09\0".to_vec();
    let u = uri(&id());
    let image = |media_type: &str, size: u64, w: u32, h: u32| {
        Ok(BlobRead::Image(BlobRef {
            uri: u.clone(),
            size,
            media_type: media_type.into(),
            preview: None,
            width: Some(w),
            height: Some(h),
        }))
    };
    let max_image = crate::images::MAX_IMAGE_BYTES;
    type Case<'a> = (&'a str, &'a str, u64, &'a [u8], Result<BlobRead, String>);
    let cases: Vec<Case<'_>> = vec![
        ("png", "image/png", 900, &png, image("image/png", 900, 4, 5)),
        (
            "png at the limit",
            "image/png",
            max_image,
            &png,
            image("image/png", max_image, 4, 5),
        ),
        // The bytes decide, not the stored type.
        (
            "png stored as text",
            "text/plain",
            900,
            &png,
            image("image/png", 900, 4, 5),
        ),
        (
            "gif stored as bytes",
            "application/octet-stream",
            40,
            &gif,
            image("image/gif", 40, 7, 9),
        ),
        (
            "text",
            "text/plain; charset=utf-8",
            5,
            b"hello",
            Ok(BlobRead::Text),
        ),
        ("empty", "text/plain", 0, b"", Ok(BlobRead::Text)),
        (
            "text at the limit",
            "text/plain",
            MAX_READ_BYTES,
            b"hello",
            Ok(BlobRead::Text),
        ),
    ];
    for (name, stored, size, head, expected) in cases {
        assert_eq!(read_kind(&u, stored, size, head), expected, "{name}");
    }
    let over = read_kind(&u, "image/png", max_image + 1, &png).unwrap_err();
    assert!(
        over.contains("over the 5242880 byte (5 MiB) limit"),
        "{over}"
    );
    assert!(over.starts_with(&u), "{over}");
    let not_png = read_kind(&u, "image/png", 5, b"hello").unwrap_err();
    assert!(not_png.contains("not text to page"), "{not_png}");
    let big_text = read_kind(&u, "text/plain", MAX_READ_BYTES + 1, b"hello").unwrap_err();
    assert!(big_text.contains("not text to page"), "{big_text}");
}
