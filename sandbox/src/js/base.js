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

  // Scanning built-ins. QuickJS polls its interrupt handler on backward jumps, calls and in the
  // regex engine, but these built-ins loop over a string or an array without polling and
  // without allocating, so one call is one tick of the step budget however long it runs
  // (a loop of `s.indexOf('b')` over a long string could spend a Durable Object's whole CPU
  // limit inside one step). Each is replaced by a wrapper that first charges the work budget
  // with the elements it may visit (`native.work`, see src/memory.rs), then calls the original
  // with the values already converted, so conversions run once, as the original would.
  // The originals stay in this closure; `Reflect.apply` is captured before user code runs.
  // Everything the wrappers use is captured now: user code may replace `Math.max` later.
  const work = native.work;
  const apply = Reflect.apply;
  const toStr = String;
  const toNumber = Number;
  const toObject = Object;
  const isArray = Array.isArray;
  const { trunc, max, min, ceil, log2 } = Math;
  const symbolMatch = Symbol.match;
  const symbolSplit = Symbol.split;
  const symbolReplace = Symbol.replace;
  function charge(visits) {
    if (!work(visits)) throw new RangeError('script exceeded its execution budget');
  }
  function lengthOf(n) {
    n = trunc(toNumber(n));
    if (!(n > 0)) return 0;
    return n > 9007199254740991 ? 9007199254740991 : n;
  }
  // A relative index as the spec resolves it (negative from the end), clamped to [0, len].
  function relative(index, len, fallback) {
    if (index === undefined) return fallback;
    let n = trunc(toNumber(index));
    if (n !== n) n = 0;
    if (n < 0) return max(len + n, 0);
    return min(n, len);
  }
  function replaceMethod(proto, name, wrapper) {
    const original = proto[name];
    if (typeof original !== 'function') return;
    const named = { [name](...args) { return wrapper(original, this, args); } }[name];
    Object.defineProperty(named, 'length', { value: original.length, configurable: true });
    define(proto, name, named);
  }
  // Objects carrying the symbol (a RegExp) take the regex engine's path, which polls.
  function usesSymbol(value, symbol) {
    return value !== null && (typeof value === 'object' || typeof value === 'function') && value[symbol] != null;
  }

  const StringProto = String.prototype;
  // indexOf, lastIndexOf, includes: QuickJS's search is naive (length × needle length). For
  // short needles that is cheap and charged as such; longer ones go to `native.search`, which
  // is linear and charged length + needle length (it copies the text, so it is the dearer
  // choice for short needles). A string that is not valid UTF-16 falls back to the original,
  // charged at the naive worst case.
  const search = native.search;
  const shortNeedle = 4;
  for (const name of ['indexOf', 'lastIndexOf', 'includes']) {
    const backward = name === 'lastIndexOf';
    replaceMethod(StringProto, name, function (original, self, args) {
      if (self === null || self === undefined) return apply(original, self, args);
      const text = toStr(self);
      const needle = args[0];
      if (name === 'includes' && usesSymbol(needle, symbolMatch)) return apply(original, text, args);
      const sought = toStr(needle);
      // The position converts once, here, as the original would convert it.
      let position = args.length > 1 ? toNumber(args[1]) : (backward ? Infinity : 0);
      if (position !== position) position = backward ? Infinity : 0;
      if (sought.length <= shortNeedle) {
        charge(text.length * max(1, sought.length));
        return apply(original, text, [sought, position]);
      }
      charge(text.length + sought.length);
      const found = search(text, sought, trunc(position), backward);
      if (found !== -2) return name === 'includes' ? found >= 0 : found;
      charge(text.length * max(1, sought.length));
      return apply(original, text, [sought, position]);
    });
  }
  // split, replace, replaceAll with a string pattern: the same search, repeated.
  for (const [name, symbol] of [['split', symbolSplit], ['replace', symbolReplace], ['replaceAll', symbolReplace]]) {
    replaceMethod(StringProto, name, function (original, self, args) {
      if (self === null || self === undefined) return apply(original, self, args);
      const pattern = args[0];
      if (usesSymbol(pattern, symbol)) return apply(original, self, args);
      const text = toStr(self);
      if (pattern !== undefined) {
        const search = toStr(pattern);
        charge(text.length * max(1, search.length));
        args[0] = search;
      } else {
        charge(text.length);
      }
      return apply(original, text, args);
    });
  }
  replaceMethod(StringProto, 'isWellFormed', function (original, self, args) {
    if (self === null || self === undefined) return apply(original, self, args);
    const text = toStr(self);
    charge(text.length);
    return apply(original, text, args);
  });

  // Arrays: the loops that neither poll nor allocate for holes or moved elements.
  // (indexOf, lastIndexOf, includes, every, some, find, reduce poll; sorting and copying
  // allocate.) `length` is read once here and again by the original; a getter that changes
  // it between the two reads only cheats itself of elements, never gains unpaid ones beyond
  // what it allocates.
  const ArrayProto = Array.prototype;
  function arrayLength(self) {
    return self === null || self === undefined ? 0 : lengthOf(toObject(self).length);
  }
  const arrayCosts = {
    fill: (len, args) => relative(args[2], len, len) - relative(args[1], len, 0),
    copyWithin: (len, args) => relative(args[2], len, len) - relative(args[1], len, 0),
    reverse: (len) => len,
    // toString calls join, which is charged.
    join: (len) => len,
    slice: (len, args) => relative(args[1], len, len) - relative(args[0], len, 0),
    splice: (len, args) => len - relative(args[0], len, 0),
    shift: (len) => len,
    unshift: (len, args) => len + args.length,
    concat: (len, args) => {
      let total = len;
      for (const a of args) if (isArray(a)) total += lengthOf(a.length);
      return total;
    },
  };
  for (const name of ['fill', 'copyWithin', 'reverse', 'join', 'slice', 'splice', 'shift', 'unshift', 'concat']) {
    const cost = arrayCosts[name];
    replaceMethod(ArrayProto, name, function (original, self, args) {
      charge(max(0, cost(arrayLength(self), args)));
      return apply(original, self, args);
    });
  }

  // Typed arrays: every scan is a tight loop without polling. `length` comes from the
  // prototype's own getter, so an instance cannot lie about it.
  const TypedArrayProto = Object.getPrototypeOf(Uint8Array.prototype);
  const typedLength = Object.getOwnPropertyDescriptor(TypedArrayProto, 'length').get;
  const typedCosts = {
    indexOf: (len) => len,
    lastIndexOf: (len) => len,
    includes: (len) => len,
    fill: (len, args) => relative(args[2], len, len) - relative(args[1], len, 0),
    copyWithin: (len, args) => relative(args[2], len, len) - relative(args[1], len, 0),
    reverse: (len) => len,
    join: (len) => len,
    // Without a comparator: n log n compares in C; with one, every compare is a polled call.
    sort: (len, args) => (args[0] === undefined ? len * max(1, ceil(log2(len + 1))) : len),
    set: (len, args) => {
      const source = args[0];
      return source !== null && typeof source === 'object' ? lengthOf(source.length) : 1;
    },
  };
  for (const name of ['indexOf', 'lastIndexOf', 'includes', 'fill', 'copyWithin', 'reverse', 'join', 'sort', 'set']) {
    const cost = typedCosts[name];
    replaceMethod(TypedArrayProto, name, function (original, self, args) {
      // Not a typed array: the getter throws the same TypeError the original would.
      const len = apply(typedLength, self, []);
      charge(max(0, cost(len, args)));
      return apply(original, self, args);
    });
  }

  return { stringify };
})
