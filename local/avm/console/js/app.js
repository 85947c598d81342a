// The console's shell: sign-in, navigation (#/page/…), one AgentX connection shared by the pages.

import { ApiError, forgetSettings, get, saveSettings, settings } from "./api.js";
import { AgentX } from "./agentx.js";
import { clear, field, h, toast } from "./dom.js";
import * as chat from "./chat.js";
import * as sessions from "./sessions.js";
import * as resources from "./resources.js";
import * as usage from "./usage.js";
import * as admin from "./admin.js";

const PAGES = { chat, sessions, resources, usage, admin };
const main = document.getElementById("main");
const statusEl = document.getElementById("status");
let current = null;
let agentx = null;

const ctx = {
  get agentx() { return agentx; },
  can(scope) { return (settings().scopes || []).includes(scope); },
  go(hash) { if (location.hash === hash) route(); else location.hash = hash; },
  fail(error) {
    if (error instanceof ApiError && error.status === 401) { signOut(error.message); return; }
    toast(error instanceof Error ? error.message : String(error));
  },
};

function setStatus(text) {
  const s = settings();
  statusEl.textContent = [s.open ? "open server" : s.keyName || "signed in", text].filter(Boolean).join(" · ");
}

function connect() {
  agentx = new AgentX({
    onEvent: (event) => { if (current && current.onEvent) current.onEvent(event); },
    onState: (state) => setStatus(`WebSocket ${state}`),
    onRefused: (reason) => signOut(reason),
  });
  agentx.connect();
}

function signOut(reason) {
  if (agentx) agentx.close();
  agentx = null;
  forgetSettings();
  showSignIn(reason);
}

async function probeOpen() {
  // avm serve marks the console's own files with its auth mode; a static host serving the same files
  // does not (then a key and the deployment's URLs are asked for). No request here can fail.
  const response = await fetch("index.html", { cache: "no-store" });
  return response.headers.get("x-agentvm-auth") === "open";
}

function showSignIn(reason) {
  document.getElementById("nav").hidden = true;
  document.getElementById("sign-out").hidden = true;
  statusEl.textContent = "";
  const key = h("input", { type: "password", autocomplete: "off", testid: "api-key", required: true });
  const apiUrl = h("input", { type: "url", placeholder: location.origin, testid: "api-url" });
  const streamUrl = h("input", { type: "url", placeholder: "the same", testid: "stream-url" });
  const ws = h("input", { type: "url", placeholder: `ws://${location.host}/ws`, testid: "ws-url" });
  const problem = h("p", { class: "error", role: "alert", testid: "sign-in-error", text: reason || "" });
  const form = h("form", { class: "panel", "aria-labelledby": "sign-in-title" },
    h("h1", { id: "sign-in-title", text: "Sign in" }),
    h("p", { class: "muted", text: "Your API key stays in this browser tab (session storage) and is sent only to the server below." }),
    field("API key", key),
    h("details", {}, h("summary", { text: "Server (a cloud deployment: its stack outputs)" }),
      field("Management API URL (HttpApiUrl)", apiUrl), field("Sessions and chat URL (ChatStreamUrl)", streamUrl),
      field("WebSocket URL (WebSocketUrl)", ws)),
    problem,
    h("button", { type: "submit", class: "primary", testid: "sign-in", text: "Sign in" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    saveSettings({ key: key.value.trim(), apiUrl: apiUrl.value.trim(), streamUrl: streamUrl.value.trim(),
                   wsUrl: ws.value.trim() });
    try {
      await get("/v1/images");
    } catch (error) {
      forgetSettings();
      problem.textContent = error.message;
      key.focus();
      return;
    }
    // what this key may do (a token is "<keyId>.<secret>"): the pages offer only that
    const keyId = key.value.trim().split(".")[0];
    const mine = ((await get("/v1/auth/keys").catch(() => ({ items: [] }))).items || []).find((k) => k.keyId === keyId);
    const scopes = mine ? mine.scopes : ["user"];
    saveSettings({ ...settings(), signedIn: true, scopes,
                   keyName: `${mine && mine.name ? mine.name : keyId} (${scopes.join(", ")})` });
    start();
  });
  clear(main).append(form);
  key.focus();
}

function start() {
  document.getElementById("nav").hidden = false;
  const out = document.getElementById("sign-out");
  out.hidden = settings().open;
  out.onclick = () => signOut("");
  connect();
  if (!location.hash || location.hash === "#/") location.hash = "#/chat";
  else route();
}

async function route() {
  if (!settings().signedIn) return;
  const [name, ...params] = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const page = PAGES[name] || chat;
  for (const a of document.querySelectorAll("nav a")) {
    if (a.getAttribute("href") === `#/${name || "chat"}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (current && current.leave) current.leave();
  current = page;
  clear(main);
  try {
    await page.render(main, params, ctx);
  } catch (error) {
    ctx.fail(error);
  }
}

window.addEventListener("hashchange", route);

async function boot() {
  if (settings().signedIn) { start(); return; }
  try {
    if (await probeOpen()) {
      saveSettings({ open: true, signedIn: true, scopes: ["user", "admin", "operator"] });
      start();
      return;
    }
  } catch (error) {
    showSignIn(error.message);
    return;
  }
  showSignIn("");
}

boot();
