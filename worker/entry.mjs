// The Worker's entry module: worker-build's output plus the js sandbox's own wasm module.
//
// wrangler turns a `.wasm` import into a compiled `WebAssembly.Module` (the Workers runtime
// cannot compile wasm at run time). QuickJS runs only in instances of this module, one per `js`
// call (worker/src/js_tool/instance.rs), never in the Worker's own instance. The module is left
// on globalThis because the Rust side reads it at call time, long after these imports ran.
import sandboxGuest from "./build/sandbox_guest.wasm";

globalThis.__wuhuSandboxGuest = sandboxGuest;

export * from "./build/index.js";
export { default } from "./build/index.js";
