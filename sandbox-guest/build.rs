//! Link settings of the guest module (wasm32 only).

/// The most linear memory one guest instance may grow to. QuickJS's heap is limited to
/// 32 MiB by default inside it; the rest is the stack, Rust-side copies (console, host-call
/// arguments, the result) and allocator slack. A cap keeps one script from growing the
/// isolate's memory (128 MB for everything in it) without bound: growing past it fails, which
/// ends the script with a tool error.
const MAX_MEMORY_BYTES: u64 = 96 * 1024 * 1024;

/// The guest's shadow stack (wasm32's default is 1 MiB). QuickJS's stack check
/// (`Limits::max_stack_bytes`, 256 KiB by default) must fire well inside it.
const STACK_BYTES: u64 = 1024 * 1024;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg-cdylib=--max-memory={MAX_MEMORY_BYTES}");
        println!("cargo:rustc-link-arg-cdylib=-zstack-size={STACK_BYTES}");
    }
}
