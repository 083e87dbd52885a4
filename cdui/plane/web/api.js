// The session token and JSON calls to the cdui API.
const KEY = "cdui-token";
let token = sessionStorage.getItem(KEY) || "";
let needToken = () => {};

export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || "http_error";
    this.hint = e.hint || "";
    this.details = Array.isArray(e.details) ? e.details : null;
  }
}

export const getToken = () => token;

export function setToken(t) {
  token = (t || "").trim();
  if (token) sessionStorage.setItem(KEY, token);
  else sessionStorage.removeItem(KEY);
}

/** Called when the server refuses the token and bootstrap cannot get one. */
export function onTokenNeeded(fn) { needToken = fn; }

/** Why the last bootstrap was refused, as the server said it ("" when it was not). */
export let bootstrapRefusal = "";

/** Ask the server for its session token (it answers only loopback clients of
 *  the OS user that started it). */
export async function bootstrap() {
  bootstrapRefusal = "";
  try {
    const r = await fetch("/api/auth/bootstrap", { cache: "no-store" });
    if (r.status === 403) {
      // Another OS user of this machine: say so, instead of a bare token form.
      const e = ((await r.json().catch(() => null)) || {}).error || {};
      bootstrapRefusal = [e.message, e.hint].filter(Boolean).join(". ");
    }
    if (!r.ok) return false;
    const body = await r.json();
    if (!body || !body.token) return false;
    setToken(body.token);
    return true;
  } catch {
    return false;
  }
}

export async function api(method, path, body, retry = true) {
  const headers = {};
  if (token) headers["X-CodefyUI-Token"] = token;
  let payload;
  if (body instanceof FormData) payload = body;
  else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const r = await fetch(path, { method, headers, body: payload, cache: "no-store" });
  const text = await r.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { error: { message: `${r.status} ${r.statusText}: ${text.slice(0, 200)}` } };
  }
  if (r.status === 401 && retry) {
    // The server may have restarted with a new token: fetch it again once.
    const hadToken = !!token;
    setToken("");
    if (await bootstrap()) return api(method, path, body, false);
    needToken(hadToken);
  }
  if (!r.ok) throw new ApiError(r.status, data);
  return data;
}

/** POST a FormData with upload progress (fetch reports none): onProgress(sentBytes, totalBytes). */
export function upload(path, form, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", path);
    if (token) xhr.setRequestHeader("X-CodefyUI-Token", token);
    xhr.upload.onprogress = (e) => onProgress(e.loaded, e.lengthComputable ? e.total : 0);
    xhr.onerror = () => reject(new Error(`the upload to ${path} failed: the server could not be reached`));
    xhr.onload = () => {
      let data = null;
      try {
        data = xhr.responseText ? JSON.parse(xhr.responseText) : null;
      } catch {
        data = { error: { message: `${xhr.status}: ${xhr.responseText.slice(0, 200)}` } };
      }
      if (xhr.status >= 200 && xhr.status < 300) resolve(data);
      else reject(new ApiError(xhr.status, data));
    };
    xhr.send(form);
  });
}
