//! Prints the presigned URL `wuhu_core::sigv4` makes for one request, as the Worker does for a
//! blob upload (decision 0015), so `scripts/check-presign` can try it on an S3 server that checks
//! SigV4.
//!
//! `presign_probe METHOD ORIGIN PATH ACCESS_KEY_ID SECRET REGION NOW_UNIX EXPIRES_SECONDS`

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [method, origin, path, key, secret, region, now, expires] = args.as_slice() else {
        eprintln!(
            "usage: presign_probe METHOD ORIGIN PATH ACCESS_KEY_ID SECRET REGION NOW_UNIX EXPIRES_SECONDS"
        );
        std::process::exit(2);
    };
    let (Ok(now_unix), Ok(expires_seconds)) = (now.parse(), expires.parse()) else {
        eprintln!("NOW_UNIX and EXPIRES_SECONDS are whole numbers");
        std::process::exit(2);
    };
    let url = wuhu_core::sigv4::presign_url(
        &wuhu_core::sigv4::Credentials {
            access_key_id: key.clone(),
            secret_access_key: secret.clone(),
            region: region.clone(),
        },
        &wuhu_core::sigv4::Presign {
            method,
            origin,
            path,
            signed_headers: &[],
            now_unix,
            expires_seconds,
        },
    );
    println!("{url}");
}
