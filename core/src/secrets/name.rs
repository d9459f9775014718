//! What may name a secret: a leaf, so the documents that name secrets (an MCP server's bearer
//! credential, `crate::mcp_client::config`) check names without the rest of the vault.

/// Longest name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Whether `name` can name a secret: an environment variable name of 1 to 64 characters
/// (`[A-Z_][A-Z0-9_]*`), not starting `WUHU_` (the runner's own variables).
///
/// # Errors
/// What is wrong, for a 400.
pub fn check_name(name: &str) -> Result<(), String> {
    let shape = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    if !shape {
        return Err(format!(
            "a secret's name is an environment variable name: 1 to {MAX_NAME_BYTES} of A-Z, 0-9 and _, not starting with a digit (got {name:?})"
        ));
    }
    if name.starts_with("WUHU_") {
        return Err(format!(
            "{name:?}: names starting WUHU_ are the runner's own"
        ));
    }
    Ok(())
}
