//! One instance of the sandbox guest module (see `sandbox-guest/`): instantiated per `js`
//! call, called through `js_sys`, never reused.
//!
//! Workers cannot compile WebAssembly at run time, so the module comes compiled with the
//! bundle: `worker/entry.mjs` imports `build/sandbox_guest.wasm` (wrangler makes a `.wasm`
//! import a `WebAssembly.Module`) and leaves it on `globalThis` under [`MODULE_GLOBAL`].
//! Instantiating an already compiled module is allowed and cheap.
//!
//! Every call into the instance goes through [`call_guest`], a JavaScript `try`/`catch`, so an
//! exception thrown inside it (a trap, or V8's "Maximum call stack size exceeded" when QuickJS's
//! C code recurses deeper than the host's stack) comes back here as an `Err` and never unwinds
//! through the Worker's own instance. wasm-bindgen's `catch` is not enough: it catches with
//! WebAssembly exception handling, and V8 does not let WebAssembly catch traps or stack
//! overflows (seen in workerd: the error passed the `catch` and the Worker's instance was reset).

use js_sys::{Function, Object, Reflect, Uint8Array, WebAssembly};
use wasm_bindgen::prelude::wasm_bindgen;
use wasm_bindgen::{JsCast, JsValue};

#[wasm_bindgen(inline_js = r#"
export function callGuest(entry, a, b) {
  try {
    return entry(a, b);
  } catch (error) {
    return error instanceof Error ? error : new Error(String(error));
  }
}
"#)]
extern "C" {
    /// `entry(a, b)`; a thrown value is returned (as an `Error`) instead of thrown.
    #[wasm_bindgen(js_name = callGuest)]
    fn call_guest(entry: &Function, a: &JsValue, b: &JsValue) -> JsValue;
}

/// Calls a guest export that returns an `i32`; `Err` with the message of anything thrown.
fn call_export(entry: &Function, a: &JsValue, b: &JsValue) -> Result<u32, String> {
    let value = call_guest(entry, a, b);
    if value.as_f64().is_none() {
        return Err(describe(value));
    }
    as_u32(value)
}

/// Where `worker/entry.mjs` leaves the compiled guest module.
const MODULE_GLOBAL: &str = "__wuhuSandboxGuest";

/// A fresh guest instance and its exports.
pub(super) struct GuestInstance {
    memory: WebAssembly::Memory,
    alloc: Function,
    start: Function,
    resume: Function,
    output: Function,
    /// Set once a call failed: the instance's state is unknown, so it is never called again.
    failed: bool,
}

impl GuestInstance {
    /// Instantiates the guest module. `Err` if the bundle lacks it or it cannot be instantiated.
    pub(super) fn new() -> Result<GuestInstance, String> {
        let global = js_sys::global();
        let module = Reflect::get(&global, &JsValue::from_str(MODULE_GLOBAL))
            .map_err(describe)?
            .dyn_into::<WebAssembly::Module>()
            .map_err(|_| {
                format!(
                    "the Worker bundle has no compiled sandbox module at globalThis.{MODULE_GLOBAL}"
                )
            })?;
        // The guest's one import: the time, for `Date.now()` and its time limit.
        let date = Reflect::get(&global, &JsValue::from_str("Date")).map_err(describe)?;
        let now = Reflect::get(&date, &JsValue::from_str("now")).map_err(describe)?;
        let wuhu = Object::new();
        Reflect::set(&wuhu, &JsValue::from_str("now_ms"), &now).map_err(describe)?;
        let imports = Object::new();
        Reflect::set(&imports, &JsValue::from_str("wuhu"), &wuhu).map_err(describe)?;
        let instance = WebAssembly::Instance::new(&module, &imports).map_err(describe)?;
        let exports = instance.exports();
        let function = |name: &str| -> Result<Function, String> {
            Reflect::get(&exports, &JsValue::from_str(name))
                .map_err(describe)?
                .dyn_into::<Function>()
                .map_err(|_| format!("the sandbox module does not export {name}"))
        };
        Ok(GuestInstance {
            memory: Reflect::get(&exports, &JsValue::from_str("memory"))
                .map_err(describe)?
                .dyn_into::<WebAssembly::Memory>()
                .map_err(|_| "the sandbox module does not export its memory".to_string())?,
            alloc: function("wuhu_alloc")?,
            start: function("wuhu_start")?,
            resume: function("wuhu_resume")?,
            output: function("wuhu_output")?,
            failed: false,
        })
    }

    /// Writes `message` into the instance, calls `entry` on it and reads the answer.
    fn exchange(&mut self, entry: &Function, message: &[u8]) -> Result<Vec<u8>, String> {
        if self.failed {
            return Err("the sandbox instance already failed".into());
        }
        let result = self.exchange_once(entry, message);
        if result.is_err() {
            self.failed = true;
        }
        result
    }

    fn exchange_once(&self, entry: &Function, message: &[u8]) -> Result<Vec<u8>, String> {
        let len = u32::try_from(message.len()).map_err(|_| "the message is too large")?;
        let ptr = call_export(&self.alloc, &JsValue::from(len), &JsValue::UNDEFINED)?;
        // The buffer is re-read after every call: growing the memory replaces it.
        let end = ptr
            .checked_add(len)
            .ok_or("the sandbox allocated out of bounds")?;
        self.bytes()?.subarray(ptr, end).copy_from(message);
        let answer_len = call_export(entry, &JsValue::from(ptr), &JsValue::from(len))?;
        let answer_ptr = call_export(&self.output, &JsValue::UNDEFINED, &JsValue::UNDEFINED)?;
        let end = answer_ptr
            .checked_add(answer_len)
            .ok_or("the sandbox answered out of bounds")?;
        let bytes = self.bytes()?;
        if end > bytes.length() {
            return Err("the sandbox answered out of bounds".into());
        }
        Ok(bytes.subarray(answer_ptr, end).to_vec())
    }

    fn bytes(&self) -> Result<Uint8Array, String> {
        Ok(Uint8Array::new(&self.memory.buffer()))
    }
}

impl wuhu_sandbox::Guest for GuestInstance {
    fn start(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        let entry = self.start.clone();
        self.exchange(&entry, input)
    }

    fn resume(&mut self, input: &[u8]) -> Result<Vec<u8>, String> {
        let entry = self.resume.clone();
        self.exchange(&entry, input)
    }
}

fn as_u32(value: JsValue) -> Result<u32, String> {
    value
        .as_f64()
        .filter(|n| n.fract() == 0.0 && *n >= 0.0 && *n <= f64::from(u32::MAX))
        .map(|n| n as u32)
        .ok_or_else(|| "the sandbox returned a non-integer".to_string())
}

/// `Name: message` of a thrown value.
fn describe(error: JsValue) -> String {
    if let Some(error) = error.dyn_ref::<js_sys::Error>() {
        return format!(
            "{}: {}",
            String::from(error.name()),
            String::from(error.message())
        );
    }
    error.as_string().unwrap_or_else(|| format!("{error:?}"))
}
