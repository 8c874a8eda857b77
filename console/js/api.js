// The /v1 API client. Every call carries the key as `Authorization: Bearer`; WebSockets, which
// cannot set headers, carry it in their subprotocol list. The key lives in sessionStorage only.

import { h } from './dom.js';

const KEY = 'space.key';

/** Who the key is: filled in by main.js after login. */
export const session = { admin: false, keyId: '', tenant: '' };

export const getKey = () => sessionStorage.getItem(KEY) || '';
export const setKey = (key) => sessionStorage.setItem(KEY, key);
export function clearKey() {
  sessionStorage.removeItem(KEY);
  Object.assign(session, { admin: false, keyId: '', tenant: '' });
}

/** A key as `space_<key id>_<secret>`; anything else still gets a try, printable ASCII only. */
export const plausibleKey = (key) => /^[\x21-\x7e]{1,512}$/.test(key);
export const keyIdOf = (key) => (/^space_(k[a-z0-9]{15})_/.exec(key) || [])[1] || '';

export class ApiError extends Error {
  constructor(message, status, code) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

let unauthorized = () => {};
/** main.js sends the user to the login view on any 401. */
export function onUnauthorized(fn) { unauthorized = fn; }

/** `/v1/sandboxes/<id><rest>` with the id encoded. */
export const sbx = (id, rest = '') => `/v1/sandboxes/${encodeURIComponent(id)}${rest}`;

function url(path, query) {
  const u = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== '') u.searchParams.set(k, String(v));
  }
  return u.href;
}

async function errorOf(res) {
  let code = `http_${res.status}`;
  let message = `${res.status} ${res.statusText || 'error'}`;
  try {
    const body = await res.json();
    if (body && body.error) {
      code = String(body.error.code ?? code);
      message = String(body.error.message ?? message);
    }
  } catch { /* not JSON: keep the status line */ }
  return new ApiError(message, res.status, code);
}

function fail(err, checkAuth) {
  if (err.status === 401 && checkAuth) unauthorized(err);
  throw err;
}

/**
 * api('GET', '/v1/sandboxes', {query, json, body, headers, raw, signal, key, checkAuth})
 * → parsed JSON (text for text/plain, null for 204, the Response itself with raw: true).
 */
export async function api(method, path, opts = {}) {
  const { query, json, body, headers = {}, raw = false, signal, key = getKey(),
    checkAuth = true } = opts;
  const hdrs = { Authorization: `Bearer ${key}`, ...headers };
  let payload = body;
  if (json !== undefined) {
    hdrs['Content-Type'] = 'application/json';
    payload = JSON.stringify(json);
  }
  let res;
  try {
    res = await fetch(url(path, query), { method, headers: hdrs, body: payload, signal,
      cache: 'no-store', credentials: 'omit' });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(`cannot reach the server (${e.message})`, 0, 'network');
  }
  if (!res.ok) fail(await errorOf(res), checkAuth);
  if (raw) return res;
  if (res.status === 204) return null;
  const type = res.headers.get('content-type') || '';
  return type.includes('json') ? res.json() : res.text();
}

/**
 * PUT a browser File into a sandbox with XMLHttpRequest (fetch has no upload progress).
 * onProgress(fraction) is called as bytes go out. Resolves with the FileStat.
 */
export function upload(id, path, file, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('PUT', url(sbx(id, '/files'), { path, parents: 'true' }));
    xhr.setRequestHeader('Authorization', `Bearer ${getKey()}`);
    xhr.setRequestHeader('Content-Type', 'application/octet-stream');
    xhr.upload.addEventListener('progress', (e) => {
      if (e.lengthComputable && onProgress) onProgress(e.loaded / e.total);
    });
    xhr.addEventListener('load', () => {
      let body = null;
      try { body = JSON.parse(xhr.responseText); } catch { /* empty or not JSON */ }
      if (xhr.status >= 200 && xhr.status < 300) { resolve(body); return; }
      const e = body && body.error;
      const err = new ApiError(e ? String(e.message) : `upload failed (${xhr.status})`,
        xhr.status, e ? String(e.code) : `http_${xhr.status}`);
      if (xhr.status === 401) unauthorized(err);
      reject(err);
    });
    xhr.addEventListener('error', () => reject(new ApiError('upload failed: network error', 0, 'network')));
    xhr.addEventListener('abort', () => reject(new ApiError('upload cancelled', 0, 'aborted')));
    xhr.send(file);
  });
}

/** Fetches a path with the key and saves it as a file named `name` (never navigates). */
export async function download(path, query, name) {
  const res = await api('GET', path, { query, raw: true });
  const blob = await res.blob();
  const href = URL.createObjectURL(blob);
  const a = h('a', { href, download: name || 'download', hidden: true });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(href), 10000);
}

/** ws:// or wss:// on this origin, for a path we built. */
export function wsUrl(path) {
  return `${location.protocol === 'https:' ? 'wss:' : 'ws:'}//${location.host}${path}`;
}

/**
 * A WebSocket to an API route. The key rides in the subprotocol list (`space.key.<key>`),
 * the server answers with the `space` protocol. Frames arrive as ArrayBuffers.
 */
export function openSocket(path) {
  const ws = new WebSocket(wsUrl(path), ['space', `space.key.${getKey()}`]);
  ws.binaryType = 'arraybuffer';
  return ws;
}
