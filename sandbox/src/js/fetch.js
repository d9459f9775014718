// The optional `fetch` prelude of wuhu-sandbox (`wuhu_sandbox::FETCH_PRELUDE`).
// It defines `fetch`, `Headers` and `Response` on top of one host function named "fetch".
// Host contract:
//   request  {url: string, method: string, headers: {[name]: string}, body: string | null}
//   response {status: number, statusText?: string, headers?: {[name]: string} | [name, value][], body?: string, url?: string}
(function () {
  'use strict';

  const call = __host.call;

  function headerName(name) {
    return String(name).toLowerCase();
  }

  class Headers {
    constructor(init) {
      this._map = new Map();
      if (init === undefined || init === null) return;
      let entries;
      if (init instanceof Headers) entries = Array.from(init.entries());
      else if (Array.isArray(init)) entries = init;
      else entries = Object.entries(init);
      for (const entry of entries) {
        if (!Array.isArray(entry) || entry.length !== 2) {
          throw new TypeError('Headers: each header must be a [name, value] pair');
        }
        this.append(entry[0], entry[1]);
      }
    }
    append(name, value) {
      const key = headerName(name);
      const previous = this._map.get(key);
      this._map.set(key, previous === undefined ? String(value) : previous + ', ' + String(value));
    }
    set(name, value) {
      this._map.set(headerName(name), String(value));
    }
    get(name) {
      const value = this._map.get(headerName(name));
      return value === undefined ? null : value;
    }
    has(name) {
      return this._map.has(headerName(name));
    }
    delete(name) {
      this._map.delete(headerName(name));
    }
    forEach(callback, thisArg) {
      for (const [name, value] of this._map) callback.call(thisArg, value, name, this);
    }
    entries() {
      return this._map.entries();
    }
    keys() {
      return this._map.keys();
    }
    values() {
      return this._map.values();
    }
    [Symbol.iterator]() {
      return this._map.entries();
    }
    toJSON() {
      return Object.fromEntries(this._map);
    }
  }

  class Response {
    constructor(body, init) {
      init = init || {};
      this._body = body === undefined || body === null ? '' : String(body);
      this.status = init.status === undefined ? 200 : Number(init.status);
      this.statusText = init.statusText === undefined ? '' : String(init.statusText);
      this.headers = new Headers(init.headers);
      this.url = init.url === undefined ? '' : String(init.url);
      this.bodyUsed = false;
    }
    get ok() {
      return this.status >= 200 && this.status < 300;
    }
    async text() {
      if (this.bodyUsed) throw new TypeError('Response body has already been read');
      this.bodyUsed = true;
      return this._body;
    }
    async json() {
      return JSON.parse(await this.text());
    }
    clone() {
      if (this.bodyUsed) throw new TypeError('Response body has already been read');
      return new Response(this._body, this);
    }
    toJSON() {
      return { url: this.url, status: this.status, statusText: this.statusText, headers: this.headers };
    }
  }

  async function fetch(input, init) {
    init = init || {};
    const url = typeof input === 'string' ? input : input && input.url ? String(input.url) : String(input);
    const method = String(init.method || 'GET').toUpperCase();
    const headers = new Headers(init.headers);
    let body = init.body === undefined || init.body === null ? null : init.body;
    if (body !== null && typeof body !== 'string') {
      // Lenient: plain values are sent as JSON.
      body = JSON.stringify(body);
      if (!headers.has('content-type')) headers.set('content-type', 'application/json');
    }
    const reply = await call('fetch', { url, method, headers: headers.toJSON(), body });
    if (reply === null || typeof reply !== 'object') {
      throw new TypeError('fetch: the host returned no response');
    }
    return new Response(reply.body, {
      status: reply.status,
      statusText: reply.statusText,
      headers: reply.headers,
      url: reply.url === undefined ? url : reply.url,
    });
  }

  globalThis.Headers = Headers;
  globalThis.Response = Response;
  globalThis.fetch = fetch;
})();
