// The base prelude of wuhu-sandbox.
// It is evaluated as a function expression and called once with the native bindings.
// It installs `console`, `setTimeout`/`clearTimeout`, `queueMicrotask` and `__host`, keeps the
// natives private, disables code generation from strings, and guards the recursive built-ins
// (see src/nesting.rs). It returns the internals the Rust side needs.
(function (native) {
  'use strict';

  const consoleLimit = native.consoleLimit;
  const maxDepth = native.maxJsonDepth;
  const writeConsole = native.console;
  const callHost = native.call;
  const sleep = native.sleep;
  const cancel = native.cancel;
  const jsonDepthOk = native.jsonDepthOk;
  const rawStringify = JSON.stringify;
  const rawParse = JSON.parse;
  const rawFlat = Array.prototype.flat;

  function define(object, name, value) {
    Object.defineProperty(object, name, { value, writable: true, configurable: true, enumerable: false });
  }

  function tooDeep() {
    return new RangeError('JSON nested deeper than ' + maxDepth + ' levels');
  }

  // `JSON.stringify` with a depth guard: QuickJS's own stack check does not fire in wasm.
  function stringify(value, replacer, space) {
    let inner = null;
    if (typeof replacer === 'function') {
      inner = replacer;
    } else if (Array.isArray(replacer)) {
      // An allow-list of keys: applied to objects (not arrays), in list order.
      const keys = [];
      for (const k of replacer) {
        if (typeof k === 'string' || typeof k === 'number' || k instanceof String || k instanceof Number) {
          const key = String(k);
          if (!keys.includes(key)) keys.push(key);
        }
      }
      inner = function (key, v) {
        if (typeof v !== 'object' || v === null || Array.isArray(v)) return v;
        const picked = {};
        for (const k of keys) if (k in v) picked[k] = v[k];
        return picked;
      };
    }
    const path = [];
    return rawStringify(value, function (key, v) {
      if (inner !== null) v = inner.call(this, key, v);
      if (typeof v === 'object' && v !== null) {
        // `this` holds `key`; pop what is no longer on the path from the root.
        while (path.length > 0 && path[path.length - 1] !== this) path.pop();
        if (path.length >= maxDepth) throw tooDeep();
        path.push(v);
      }
      return v;
    }, space);
  }
  define(JSON, 'stringify', stringify);

  define(JSON, 'parse', function parse(text, reviver) {
    text = String(text);
    if (!jsonDepthOk(text)) throw tooDeep();
    return reviver === undefined ? rawParse(text) : rawParse(text, reviver);
  });

  define(Array.prototype, 'flat', function flat(depth) {
    let d = depth === undefined ? 1 : Number(depth);
    if (Number.isNaN(d)) d = 0;
    if (d > maxDepth) d = maxDepth;
    return rawFlat.call(this, d);
  });

  // No code generation from strings, as in Cloudflare Workers: `eval`, `Function` and the
  // async/generator function constructors throw. `instanceof Function` still works.
  function denied(name) {
    const stub = function () {
      throw new EvalError(name + ': code generation from strings is disabled in the sandbox');
    };
    Object.defineProperty(stub, 'name', { value: name });
    return stub;
  }
  define(globalThis, 'eval', denied('eval'));
  for (const sample of [function () {}, async function () {}, function* () {}, async function* () {}]) {
    const prototype = Object.getPrototypeOf(sample);
    const original = prototype.constructor;
    const stub = denied(original.name);
    stub.prototype = prototype;
    define(prototype, 'constructor', stub);
    if (original === globalThis.Function) define(globalThis, 'Function', stub);
  }

  function functionLabel(f) {
    return '[Function: ' + (f.name || '(anonymous)') + ']';
  }

  function errorText(e) {
    let head;
    try {
      head = String(e.name) + ': ' + String(e.message);
    } catch (_) {
      head = 'Error';
    }
    const stack = typeof e.stack === 'string' ? e.stack.replace(/\s+$/, '') : '';
    return stack ? head + '\n' + stack : head;
  }

  function inspect(value) {
    switch (typeof value) {
      case 'string':
        return value;
      case 'undefined':
        return 'undefined';
      case 'function':
        return functionLabel(value);
      case 'symbol':
        return value.toString();
      case 'bigint':
        return String(value) + 'n';
      case 'number':
        return Object.is(value, -0) ? '-0' : String(value);
      case 'boolean':
        return String(value);
    }
    if (value === null) return 'null';
    if (value instanceof Error) return errorText(value);
    try {
      const ancestors = [];
      const json = JSON.stringify(value, function (key, v) {
        if (typeof v === 'bigint') return String(v) + 'n';
        if (typeof v === 'function') return functionLabel(v);
        if (typeof v === 'symbol') return v.toString();
        if (v === undefined) return key === '' ? v : 'undefined';
        if (typeof v === 'object' && v !== null) {
          // `this` is the holder of `key`; drop ancestors that are no longer on the path.
          while (ancestors.length > 0 && ancestors[ancestors.length - 1] !== this) ancestors.pop();
          if (ancestors.includes(v)) return '[Circular]';
          if (ancestors.length >= maxDepth) return '[Deep]';
          if (v instanceof Error) return errorText(v);
          ancestors.push(v);
          let out = v;
          if (v instanceof Map) out = Object.fromEntries(v);
          else if (v instanceof Set) out = Array.from(v);
          if (out !== v) ancestors.push(out);
          return out;
        }
        return v;
      });
      return json === undefined ? String(value) : json;
    } catch (_) {
      try {
        return String(value);
      } catch (_) {
        return '[object]';
      }
    }
  }

  function format(args) {
    let text = '';
    for (let i = 0; i < args.length; i++) {
      if (i > 0) text += ' ';
      text += inspect(args[i]);
      if (text.length > consoleLimit) break;
    }
    return text;
  }

  function writer(level) {
    return function (...args) {
      const text = format(args);
      writeConsole(level, text.length > consoleLimit ? text.slice(0, consoleLimit + 1) : text);
    };
  }

  const console = {
    log: writer('log'),
    info: writer('info'),
    warn: writer('warn'),
    error: writer('error'),
    debug: writer('debug'),
    trace: writer('debug'),
  };
  globalThis.console = console;

  globalThis.__host = Object.freeze({
    call(name, arg) {
      const json = arg === undefined ? 'null' : stringify(arg);
      if (json === undefined) {
        throw new TypeError('host call argument cannot be converted to JSON');
      }
      return callHost(String(name), json);
    },
  });

  globalThis.setTimeout = function setTimeout(callback, delay, ...args) {
    if (typeof callback !== 'function') {
      throw new TypeError('setTimeout: callback must be a function');
    }
    const timer = sleep(Number(delay) || 0);
    timer.promise
      .then(() => callback(...args))
      .catch((e) => console.error('Uncaught (in setTimeout callback)', e));
    return timer.id;
  };

  globalThis.clearTimeout = function clearTimeout(id) {
    if (typeof id === 'number') cancel(id);
  };

  if (typeof globalThis.queueMicrotask !== 'function') {
    globalThis.queueMicrotask = function queueMicrotask(callback) {
      if (typeof callback !== 'function') {
        throw new TypeError('queueMicrotask: callback must be a function');
      }
      Promise.resolve().then(() => callback());
    };
  }

  return { stringify };
})
