use super::*;

/// A PNG head: signature, IHDR length and type, width, height, depth and the rest.
fn png(w: u32, h: u32) -> Vec<u8> {
    let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    b.extend_from_slice(&w.to_be_bytes());
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&[8, 6, 0, 0, 0]);
    b
}

fn gif(w: u16, h: u16) -> Vec<u8> {
    let mut b = b"GIF89a".to_vec();
    b.extend_from_slice(&w.to_le_bytes());
    b.extend_from_slice(&h.to_le_bytes());
    b.extend_from_slice(&[0xf7, 0, 0]);
    b
}

/// SOI, an APP0 (JFIF) segment, a DQT segment, fill bytes, then a frame header `sof`.
fn jpeg(sof: u8, w: u16, h: u16) -> Vec<u8> {
    let mut b = vec![0xff, 0xd8];
    b.extend_from_slice(&[0xff, 0xe0, 0x00, 0x10]);
    b.extend_from_slice(b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0");
    b.extend_from_slice(&[0xff, 0xdb, 0x00, 0x04, 0x00, 0x01]);
    b.extend_from_slice(&[0xff, 0xff, sof, 0x00, 0x0b, 0x08]);
    b.extend_from_slice(&h.to_be_bytes());
    b.extend_from_slice(&w.to_be_bytes());
    b.extend_from_slice(&[0x03, 0x01, 0x22, 0x00]);
    b
}

fn webp(chunk: &[u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut b = b"RIFF\0\0\0\0WEBP".to_vec();
    b.extend_from_slice(chunk);
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(payload);
    b
}

#[test]
fn images_are_known_by_magic_bytes_and_sized_from_their_headers() {
    // VP8: frame tag (3 bytes), start code, 14-bit width and height (2 scale bits above).
    let vp8 = webp(
        b"VP8 ",
        &[0x30, 0x01, 0x00, 0x9d, 0x01, 0x2a, 0x40, 0x41, 0xf0, 0xc0],
    );
    // VP8L: signature 0x2f, then (w-1) in 14 bits and (h-1) in the next 14 bits.
    let bits: u32 = (640 - 1) | ((480 - 1) << 14);
    let mut vp8l_payload = vec![0x2f];
    vp8l_payload.extend_from_slice(&bits.to_le_bytes());
    let vp8l = webp(b"VP8L", &vp8l_payload);
    // VP8X: flags (4 bytes), canvas width-1 and height-1 in 24 bits each.
    let vp8x = webp(
        b"VP8X",
        &[0x10, 0, 0, 0, 0x0f, 0x27, 0x00, 0x01, 0x00, 0x00],
    );
    let mut no_frame = jpeg(0xc4, 1, 1); // DHT is not a frame header…
    no_frame.extend_from_slice(&[0xff, 0xda, 0x00, 0x02]); // …and the scan starts.
    type Expected = Option<(&'static str, Option<u32>, Option<u32>)>;
    let cases: Vec<(&str, Vec<u8>, Expected)> = vec![
        ("png", png(2, 3), Some(("image/png", Some(2), Some(3)))),
        (
            "png, 4000 wide",
            png(4000, 1),
            Some(("image/png", Some(4000), Some(1))),
        ),
        (
            "png signature only",
            png(2, 3)[..8].to_vec(),
            Some(("image/png", None, None)),
        ),
        (
            "png, zero width",
            png(0, 3),
            Some(("image/png", None, None)),
        ),
        (
            "gif",
            gif(300, 200),
            Some(("image/gif", Some(300), Some(200))),
        ),
        (
            "gif87a",
            [b"GIF87a".as_slice(), &[1, 0, 1, 0]].concat(),
            Some(("image/gif", Some(1), Some(1))),
        ),
        (
            "jpeg baseline",
            jpeg(0xc0, 1920, 1080),
            Some(("image/jpeg", Some(1920), Some(1080))),
        ),
        (
            "jpeg progressive",
            jpeg(0xc2, 7, 9),
            Some(("image/jpeg", Some(7), Some(9))),
        ),
        (
            "jpeg, no frame before the scan",
            no_frame,
            Some(("image/jpeg", None, None)),
        ),
        (
            "jpeg cut short",
            jpeg(0xc0, 5, 5)[..30].to_vec(),
            Some(("image/jpeg", None, None)),
        ),
        (
            "webp lossy",
            vp8,
            Some(("image/webp", Some(0x140), Some(0xf0))),
        ),
        (
            "webp lossless",
            vp8l,
            Some(("image/webp", Some(640), Some(480))),
        ),
        (
            "webp extended",
            vp8x,
            Some(("image/webp", Some(10000), Some(2))),
        ),
        ("riff but not webp", b"RIFF\0\0\0\0WAVEfmt ".to_vec(), None),
        ("text", b"hello\n".to_vec(), None),
        ("empty", Vec::new(), None),
        (
            "png named wrongly is still png",
            png(1, 1),
            Some(("image/png", Some(1), Some(1))),
        ),
        ("almost png", b"\x89PNG\r\n\x1a".to_vec(), None),
        ("gif without version", b"GIF8".to_vec(), None),
        ("jpeg needs three magic bytes", vec![0xff, 0xd8], None),
        (
            "svg is text, not an image blob",
            b"<svg xmlns='http://www.w3.org/2000/svg'/>".to_vec(),
            None,
        ),
    ];
    for (name, bytes, expected) in cases {
        let got = inspect(&bytes).map(|i| (i.media_type, i.width, i.height));
        assert_eq!(got, expected, "{name}");
        assert_eq!(sniff(&bytes), expected.map(|e| e.0), "{name}");
        if let Some((media_type, ..)) = expected {
            assert!(IMAGE_MEDIA_TYPES.contains(&media_type), "{name}");
            assert!(crate::blobs::MEDIA_TYPES.contains(&media_type), "{name}");
        }
    }
}

#[test]
fn a_jpeg_walk_never_panics_on_garbage() {
    // Every prefix of a valid head, and every corruption of one byte, is answered without a
    // panic (the Worker runs this on bytes a runner uploaded).
    let good = jpeg(0xc0, 300, 200);
    for end in 0..good.len() {
        let _ = inspect(&good[..end]);
    }
    for at in 2..good.len() {
        for value in [0x00, 0x01, 0xff, 0xd9, 0xda, 0xc0] {
            let mut bad = good.clone();
            bad[at] = value;
            let _ = inspect(&bad);
        }
    }
    // Zero-length segments do not loop forever.
    assert_eq!(
        inspect(&[0xff, 0xd8, 0xff, 0xe0, 0x00, 0x00, 0xff, 0xc0])
            .unwrap()
            .width,
        None
    );
}

#[test]
fn images_over_the_limit_are_refused_with_a_reason() {
    let info = inspect(&png(2, 2)).unwrap();
    for (size, refused) in [
        (0, false),
        (70, false),
        (MAX_IMAGE_BYTES, false),
        (MAX_IMAGE_BYTES + 1, true),
        (u64::MAX, true),
    ] {
        let refusal = refusal("shot.png", &info, size);
        assert_eq!(refusal.is_some(), refused, "{size}");
        if let Some(reason) = refusal {
            assert!(reason.contains("shot.png"), "{reason}");
            assert!(reason.contains("5 MiB"), "{reason}");
        }
    }
}

#[test]
fn the_description_names_the_blob_and_the_pixels() {
    assert_eq!(
        describe(
            "out/shot.png",
            "wuhu://blob/x",
            "image/png",
            70,
            Some(2),
            Some(2)
        ),
        "out/shot.png: image/png image, 2x2 pixels, 70 bytes, stored as wuhu://blob/x (the image is attached to this result)."
    );
    assert!(!describe("a.jpg", "u", "image/jpeg", 1, None, None).contains("pixels"));
}

#[test]
fn image_tokens_follow_each_providers_rule_and_are_capped() {
    let cases: [(&str, Option<u32>, Option<u32>, u64); 16] = [
        // Anthropic: width × height / 750, rounded up, at most MAX_IMAGE_TOKENS.
        ("anthropic", Some(100), Some(100), 14),
        ("anthropic", Some(750), Some(1), 1),
        ("anthropic", Some(1000), Some(1000), 1334),
        ("anthropic", Some(1092), Some(1092), 1590),
        ("anthropic", Some(2000), Some(2000), MAX_IMAGE_TOKENS),
        ("anthropic", Some(0), Some(0), 1),
        ("anthropic", None, Some(10), MAX_IMAGE_TOKENS),
        ("anthropic", None, None, MAX_IMAGE_TOKENS),
        // OpenAI dialects: 85 + 170 per 512-pixel tile after fitting 2048 and a 768 short side.
        ("openai", Some(100), Some(100), 255),
        ("openai", Some(512), Some(512), 255),
        ("openai", Some(513), Some(512), 425),
        ("openai", Some(1024), Some(1024), 765),
        ("openai", Some(2048), Some(4096), 1105),
        ("openai-compatible", Some(4096), Some(8192), 1105),
        ("openai-compatible", Some(20_000), Some(10), 765),
        ("openai", None, None, MAX_IMAGE_TOKENS),
    ];
    for (provider, w, h, expected) in cases {
        assert_eq!(
            estimate_tokens(provider, w, h),
            expected,
            "{provider} {w:?}x{h:?}"
        );
    }
}
