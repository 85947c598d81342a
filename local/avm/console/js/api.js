// The HTTP management API, with the key kept in this browser tab's session storage only.

const STORE = "avm.console.settings";

export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

export function settings() {
  try {
    return JSON.parse(sessionStorage.getItem(STORE)) || {};
  } catch {
    return {};
  }
}

export function saveSettings(value) {
  sessionStorage.setItem(STORE, JSON.stringify(value));
}

export function forgetSettings() {
  sessionStorage.removeItem(STORE);
}

// Where a path is served: avm serve serves everything on this page's origin; a cloud deployment serves
// images, sessions and the chat API on its stream URL (ChatStreamUrl) and the rest on its management
// API (HttpApiUrl), both typed in at sign-in.
const STREAM_PATHS = /^\/(v1\/(images|sessions|definitions|turns)\b|api\/)/;

export function apiBase(path = "") {
  const s = settings();
  const chosen = STREAM_PATHS.test(path) ? s.streamUrl || s.apiUrl : s.apiUrl;
  return (chosen || location.origin).replace(/\/+$/, "");
}

export function wsUrl() {
  const s = settings();
  let url = s.wsUrl || `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/ws`;
  if (s.key) url += `${url.includes("?") ? "&" : "?"}token=${encodeURIComponent(s.key)}`;
  return url;
}

async function errorOf(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: a proxy's page, say
  }
  const e = body && body.error;
  if (e && typeof e.message === "string") return new ApiError(response.status, e.code, e.message, e.field);
  return new ApiError(response.status, "http_error", `${response.status} ${response.statusText || "error"}`);
}

export async function call(method, path, body, { raw = false, headers = {} } = {}) {
  const s = settings();
  const init = { method, headers: { ...headers } };
  if (s.key) init.headers.Authorization = `Bearer ${s.key}`;
  if (body !== undefined && !(body instanceof Blob)) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  } else if (body instanceof Blob) {
    init.headers["Content-Type"] = body.type || "application/octet-stream";
    init.body = body;
  }
  let response;
  try {
    response = await fetch(apiBase(path) + path, init);
  } catch (exc) {
    throw new ApiError(0, "unreachable", `cannot reach ${apiBase(path)}: ${exc.message}`);
  }
  if (!response.ok) throw await errorOf(response);
  if (raw) return response;
  if (response.status === 204) return null;
  return response.json();
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body);
export const put = (path, body) => call("PUT", path, body);
export const del = (path) => call("DELETE", path);

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const text = q.toString();
  return text ? `?${text}` : "";
}
