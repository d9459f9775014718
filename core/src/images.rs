//! Images a tool produced: which bytes are an image (by magic bytes, never by name), their
//! pixel size read from the header by hand (no image decoding crate: the Worker stays small),
//! and the bounds on images shown to a model.
//!
//! A `read` of an image file on a runner does not return text: the runner uploads the file as
//! a blob ([`crate::blobs`]) and the tool result refers to it ([`crate::wire::BlobRef`] with
//! `width`/`height`). The Worker checks the stored bytes again ([`crate::blobs::accept_image`])
//! and, when it builds an LLM request, inlines the image in the provider's dialect
//! (`crate::llm`).

pub mod cache;

/// Largest image a `read` turns into an image blob, in bytes: the common provider limit
/// (Anthropic refuses larger images; OpenAI's limit is higher). Larger images are refused with a
/// tool error.
pub const MAX_IMAGE_BYTES: u64 = 5 * 1024 * 1024;

/// Bytes of a file's head that [`inspect`] needs: the magic bytes and, for a JPEG, the
/// segments before its frame header (EXIF thumbnails can be long). An image whose size is not in
/// its first `HEADER_BYTES` is still an image, without a width and height.
pub const HEADER_BYTES: usize = 64 * 1024;

/// Media types of the images this module recognises (all accepted by Anthropic and OpenAI).
pub const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// What the head of a file says about it as an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    /// One of [`IMAGE_MEDIA_TYPES`].
    pub media_type: &'static str,
    /// Pixel width, if the header says it within the bytes given.
    pub width: Option<u32>,
    /// Pixel height, likewise.
    pub height: Option<u32>,
}

/// The image media type of `bytes` (a file's head) by its magic bytes: PNG, JPEG, GIF or WebP;
/// `None` for anything else.
pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The image `bytes` (a file's head, ideally [`HEADER_BYTES`] of it) start, with its pixel size
/// when the header holds it; `None` when they are not an image.
pub fn inspect(bytes: &[u8]) -> Option<ImageInfo> {
    let media_type = sniff(bytes)?;
    let size = match media_type {
        "image/png" => png_size(bytes),
        "image/jpeg" => jpeg_size(bytes),
        "image/gif" => gif_size(bytes),
        _ => webp_size(bytes),
    };
    Some(ImageInfo {
        media_type,
        width: size.map(|(w, _)| w),
        height: size.map(|(_, h)| h),
    })
}

/// Why an image file cannot be shown to a model, if it cannot: over [`MAX_IMAGE_BYTES`].
pub fn refusal(shown_path: &str, info: &ImageInfo, size: u64) -> Option<String> {
    (size > MAX_IMAGE_BYTES).then(|| {
        format!(
            "{shown_path} is a {} image of {size} bytes, over the {MAX_IMAGE_BYTES} byte ({} MiB) limit for images; make it smaller (e.g. scale it down or convert it to JPEG) and read that",
            info.media_type,
            MAX_IMAGE_BYTES / (1024 * 1024)
        )
    })
}

/// The tool result text for an image a `read` attached: what the model reads next to the image
/// itself (and all it gets from a provider that accepts no images).
pub fn describe(
    shown_path: &str,
    uri: &str,
    media_type: &str,
    size: u64,
    width: Option<u32>,
    height: Option<u32>,
) -> String {
    let pixels = match (width, height) {
        (Some(w), Some(h)) => format!(", {w}x{h} pixels"),
        _ => String::new(),
    };
    format!(
        "{shown_path}: {media_type} image{pixels}, {size} bytes, stored as {uri} (the image is attached to this result)."
    )
}

/// Most tokens one image is counted as: Anthropic scales an image down to about 1.15
/// megapixels (about 1 600 tokens); OpenAI's largest high-detail image (8 tiles) is 1 445.
pub const MAX_IMAGE_TOKENS: u64 = 1_600;

/// Estimated input tokens of one image shown to `provider`'s models, from the pixel size its
/// stored header gave ([`MAX_IMAGE_TOKENS`] when it is unknown):
/// - Anthropic: `width × height / 750`, at most [`MAX_IMAGE_TOKENS`] (larger images are scaled
///   down to that);
/// - the OpenAI dialects: 85 + 170 per 512-pixel tile, after scaling to fit 2048 × 2048 and then
///   the short side to at most 768.
pub fn estimate_tokens(provider: &str, width: Option<u32>, height: Option<u32>) -> u64 {
    let (Some(w), Some(h)) = (width, height) else {
        return MAX_IMAGE_TOKENS;
    };
    let (w, h) = (f64::from(w.max(1)), f64::from(h.max(1)));
    let tokens = if provider == "anthropic" {
        (w * h / 750.0).ceil()
    } else {
        let fit = (2048.0 / w.max(h)).min(1.0);
        let (w, h) = (w * fit, h * fit);
        let short = (768.0 / w.min(h)).min(1.0);
        let (w, h) = (w * short, h * short);
        85.0 + 170.0 * (w / 512.0).ceil() * (h / 512.0).ceil()
    };
    (tokens as u64).clamp(1, MAX_IMAGE_TOKENS)
}

fn be16(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 2)?;
    Some(u32::from(u16::from_be_bytes([b[0], b[1]])))
}

fn le16(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 2)?;
    Some(u32::from(u16::from_le_bytes([b[0], b[1]])))
}

fn le24(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 3)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], 0]))
}

/// PNG: the IHDR chunk comes first; width and height are big-endian at 16 and 20.
fn png_size(bytes: &[u8]) -> Option<(u32, u32)> {
    if bytes.get(12..16)? != b"IHDR" {
        return None;
    }
    let w = u32::from_be_bytes(bytes.get(16..20)?.try_into().ok()?);
    let h = u32::from_be_bytes(bytes.get(20..24)?.try_into().ok()?);
    (w > 0 && h > 0).then_some((w, h))
}

/// GIF: the logical screen's width and height, little-endian at 6 and 8.
fn gif_size(bytes: &[u8]) -> Option<(u32, u32)> {
    Some((le16(bytes, 6)?, le16(bytes, 8)?))
}

/// JPEG: walks the segments after SOI to the first start-of-frame (SOF0..SOF15 but DHT, JPG and
/// DAC), whose height and width are big-endian at 3 and 5 of its payload.
fn jpeg_size(bytes: &[u8]) -> Option<(u32, u32)> {
    let mut at = 2;
    loop {
        if *bytes.get(at)? != 0xff {
            return None;
        }
        // Fill bytes: any number of 0xff before the marker.
        while *bytes.get(at + 1)? == 0xff {
            at += 1;
        }
        let marker = *bytes.get(at + 1)?;
        at += 2;
        match marker {
            // Markers without a length: TEM, RSTn.
            0x01 | 0xd0..=0xd7 => continue,
            // Start of scan or end of image before any frame header.
            0xda | 0xd9 => return None,
            _ => {}
        }
        let length = be16(bytes, at)? as usize;
        if length < 2 {
            return None;
        }
        if matches!(marker, 0xc0..=0xcf) && !matches!(marker, 0xc4 | 0xc8 | 0xcc) {
            let h = be16(bytes, at + 3)?;
            let w = be16(bytes, at + 5)?;
            return (w > 0 && h > 0).then_some((w, h));
        }
        at += length;
    }
}

/// WebP: the first chunk after `RIFF....WEBP` is `VP8 ` (lossy: 14-bit sizes after the start
/// code), `VP8L` (lossless: 14-bit sizes minus one after the signature byte) or `VP8X`
/// (extended: 24-bit canvas sizes minus one).
fn webp_size(bytes: &[u8]) -> Option<(u32, u32)> {
    match bytes.get(12..16)? {
        b"VP8 " => {
            if bytes.get(23..26)? != [0x9d, 0x01, 0x2a] {
                return None;
            }
            Some((le16(bytes, 26)? & 0x3fff, le16(bytes, 28)? & 0x3fff))
        }
        b"VP8L" => {
            if *bytes.get(20)? != 0x2f {
                return None;
            }
            let bits = u32::from_le_bytes(bytes.get(21..25)?.try_into().ok()?);
            Some(((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1))
        }
        b"VP8X" => Some((le24(bytes, 24)? + 1, le24(bytes, 27)? + 1)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
