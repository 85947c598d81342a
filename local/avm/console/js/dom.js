// Small DOM helpers: elements are built with text nodes, never from HTML strings (only the Markdown
// renderer produces HTML, and it is sanitised there).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else if (name === "testid") el.dataset.testid = value;
    else if (name === "text") el.textContent = value;
    else if (value === true) el.setAttribute(name, "");
    else el.setAttribute(name, String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

let toastTimer = null;

export function toast(message) {
  const el = document.getElementById("toast");
  el.textContent = message;
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { el.hidden = true; }, 6000);
}

// A labelled form field: <label for=id>text</label><input id=id …>
let fieldCount = 0;
export function field(labelText, control) {
  const id = control.id || `f${++fieldCount}`;
  control.id = id;
  return [h("label", { for: id, text: labelText }), control];
}

export function fmtTime(ms) {
  return ms ? new Date(ms).toLocaleString() : "";
}

// "0.00511875" → "$0.005119" (money stays a decimal string from the server; shown rounded)
export function usd(value) {
  if (value === null || value === undefined) return "";
  const n = Number(value);
  if (!Number.isFinite(n)) return String(value);
  return `$${n >= 1 ? n.toFixed(2) : n.toFixed(6)}`;
}

const ENTITIES = { "&lt;": "<", "&gt;": ">", "&quot;": '"', "&#x27;": "'", "&#39;": "'", "&amp;": "&" };
const unescape = (text) => text.replace(/&(lt|gt|quot|#x27|#39|amp);/g, (e) => ENTITIES[e]);

// The search API's snippets: HTML-escaped text with <mark>…</mark> around the matches. Only the marks
// become elements; the rest is unescaped into text nodes (so "<b>" typed by a user shows as "<b>").
export function highlighted(snippet) {
  const out = [];
  const parts = String(snippet).split(/(<mark>|<\/mark>)/);
  let marked = false;
  for (const part of parts) {
    if (part === "<mark>") marked = true;
    else if (part === "</mark>") marked = false;
    else if (part) out.push(marked ? h("mark", { text: unescape(part) }) : document.createTextNode(unescape(part)));
  }
  return out;
}

export function download(name, blob) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
