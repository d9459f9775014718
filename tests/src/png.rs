//! PNG files encoded by hand for tests (no image crate): RGBA, one stored (uncompressed)
//! deflate block, CRC-32 and Adler-32 computed here. Browsers and providers decode them.

/// A `width`×`height` PNG whose every pixel is `rgba`.
pub fn solid(width: u32, height: u32, rgba: [u8; 4]) -> Vec<u8> {
    // Each row: filter type 0 (none), then the pixels.
    let mut row = vec![0];
    row.extend(rgba.repeat(width as usize));
    let raw = row.repeat(height as usize);
    assert!(
        raw.len() <= 0xffff,
        "one stored block: keep test images small"
    );
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]); // 8 bits, RGBA, deflate, no filter, no interlace
    chunk(&mut png, b"IHDR", &ihdr);
    // zlib: header, one final stored block (length and its complement), the data, Adler-32.
    let mut zlib = vec![0x78, 0x01, 0x01];
    let len = raw.len() as u16;
    zlib.extend_from_slice(&len.to_le_bytes());
    zlib.extend_from_slice(&(!len).to_le_bytes());
    zlib.extend_from_slice(&raw);
    zlib.extend_from_slice(&adler32(&raw).to_be_bytes());
    chunk(&mut png, b"IDAT", &zlib);
    chunk(&mut png, b"IEND", &[]);
    png
}

fn chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    png.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let start = png.len();
    png.extend_from_slice(kind);
    png.extend_from_slice(data);
    let crc = crc32(&png[start..]);
    png.extend_from_slice(&crc.to_be_bytes());
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn adler32(bytes: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for &byte in bytes {
        a = (a + u32::from(byte)) % 65521;
        b = (b + a) % 65521;
    }
    (b << 16) | a
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_crc_is_the_standard_one() {
        // The CRC-32 of "123456789" (the check value of the standard).
        assert_eq!(super::crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(super::adler32(b"Wikipedia"), 0x11e6_0398);
        let png = super::solid(2, 2, [255, 0, 0, 255]);
        assert_eq!(&png[12..16], b"IHDR");
    }
}
