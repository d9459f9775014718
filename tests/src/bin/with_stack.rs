//! `with_stack COMMAND [ARGS...]`
//!
//! Starts the local stack the way the end-to-end tests do (the built Worker under `wrangler
//! dev` on an ephemeral port, a temporary state directory, the `fake` provider without
//! delays), runs `COMMAND` with `WUHU_URL` (`http://127.0.0.1:PORT`) and `WUHU_TOKEN` (an admin
//! token of tenant `fuzz`, valid for an hour) in its environment, stops the stack and exits
//! with the command's status. `scripts/test` runs schemathesis through it.
//! The stack's process group is killed by PID when this process ends, however it ends.

use std::process::{Command, ExitCode};

use wuhu_e2e::{Stack, StackOptions};

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: with_stack COMMAND [ARGS...]");
        return ExitCode::from(2);
    };
    let stack = Stack::start_with(StackOptions {
        fake_delay_ms: Some(0),
        ..StackOptions::default()
    });
    let status = Command::new(&program)
        .args(args)
        .env("WUHU_URL", stack.base_url())
        .env("WUHU_TOKEN", stack.admin_token("fuzzer", "fuzz"))
        .status();
    let code = match status {
        Ok(status) => status.code().unwrap_or(1),
        Err(error) => {
            eprintln!(
                "with_stack: cannot run {}: {error}",
                program.to_string_lossy()
            );
            127
        }
    };
    if code != 0 {
        eprintln!(
            "with_stack: the command failed; the Worker's log (last 40 lines):\n{}",
            stack.log_tail(40)
        );
    }
    drop(stack);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
