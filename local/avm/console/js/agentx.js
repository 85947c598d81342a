// The AgentX WebSocket protocol (docs/protocol.md): requests matched to responses by requestId,
// session events in seq order, reconnect with `afterSeq` so that nothing is missed or shown twice.

import { wsUrl } from "./api.js";

const BACKOFF_MS = [250, 500, 1000, 2000, 4000, 8000];

let counter = 0;
const requestId = () => `req_console_${Date.now().toString(36)}_${++counter}`;

export function sessionOf(event) {
  return (event.context && event.context.sessionId) || (event.data && event.data.sessionId) || null;
}

export class AgentX {
  constructor({ onEvent, onState, onRefused }) {
    this.onEvent = onEvent;
    this.onState = onState || (() => {});
    this.onRefused = onRefused || (() => {});
    this.ws = null;
    this.pending = new Map(); // requestId → {resolve, reject, timer}
    this.followed = new Map(); // sessionId → afterSeq to ask for on the next (re)subscribe
    this.lastSeq = new Map(); // sessionId → last seq handled
    this.attempt = 0;
    this.closed = false;
    this.openWaiters = [];
  }

  connect() {
    this.closed = false;
    const ws = new WebSocket(wsUrl());
    this.ws = ws;
    this.onState("connecting");
    ws.onopen = () => {
      this.attempt = 0;
      this.onState("connected");
      for (const [sessionId, afterSeq] of this.followed) this._subscribe(sessionId, afterSeq);
      for (const resolve of this.openWaiters.splice(0)) resolve();
    };
    ws.onmessage = (message) => this._frame(message.data);
    ws.onclose = (close) => {
      if (this.ws !== ws) return;
      this.ws = null;
      for (const [id, p] of this.pending) {
        clearTimeout(p.timer);
        p.reject(new Error("connection lost before the answer"));
        this.pending.delete(id);
      }
      if (this.closed) return;
      if (close.code === 1008) {
        this.closed = true;
        this.onState("refused");
        this.onRefused(close.reason || "the server refused the connection");
        return;
      }
      const delay = BACKOFF_MS[Math.min(this.attempt++, BACKOFF_MS.length - 1)];
      this.onState(`reconnecting in ${(delay / 1000).toFixed(1)} s`);
      setTimeout(() => { if (!this.closed) this.connect(); }, delay);
    };
  }

  close() {
    this.closed = true;
    if (this.ws) this.ws.close(1000, "console closed");
    this.ws = null;
  }

  _open() {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) return Promise.resolve();
    return new Promise((resolve) => this.openWaiters.push(resolve));
  }

  async request(type, data = {}, timeoutMs = 30000) {
    let waited;
    const notOpen = new Promise((_, reject) => {
      waited = setTimeout(() => reject(new Error(`not connected to the WebSocket after ${timeoutMs / 1000} s`)), timeoutMs);
    });
    try {
      await Promise.race([this._open(), notOpen]);
    } finally {
      clearTimeout(waited);
    }
    const id = requestId();
    const frame = { type: `${type}_request`, timestamp: Date.now(), data: { ...data, requestId: id },
                    source: "command", category: "request", intent: "request" };
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`no answer to ${type} within ${timeoutMs / 1000} s`));
      }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.ws.send(JSON.stringify(frame));
    });
  }

  // Follow a session's events; with `afterSeq`, the stored ones after it are replayed first.
  follow(sessionId, afterSeq) {
    const known = this.lastSeq.get(sessionId);
    const from = known !== undefined ? known : afterSeq;
    this.followed.set(sessionId, from);
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this._subscribe(sessionId, from);
  }

  unfollow(sessionId) {
    this.followed.delete(sessionId);
  }

  _subscribe(sessionId, afterSeq) {
    const frame = { type: "subscribe", sessionId };
    const last = this.lastSeq.get(sessionId);
    const from = last !== undefined ? last : afterSeq;
    if (from !== undefined && from !== null) frame.afterSeq = from;
    this.ws.send(JSON.stringify(frame));
  }

  _frame(raw) {
    let message;
    try {
      message = JSON.parse(raw);
    } catch {
      return;
    }
    for (const item of Array.isArray(message) ? message : [message]) {
      let event = item;
      if (item && typeof item.__payload === "string") {
        try {
          event = JSON.parse(item.__payload);
        } catch {
          continue;
        }
      }
      if (event && typeof event.type === "string") this._event(event);
    }
  }

  _event(event) {
    const data = event.data || {};
    const waiting = data.requestId && this.pending.get(data.requestId);
    if (waiting && (event.type.endsWith("_response") || event.type === "system_error")) {
      clearTimeout(waiting.timer);
      this.pending.delete(data.requestId);
      const error = data.error || (event.type === "system_error" ? data.message : null);
      if (error) waiting.reject(new Error(typeof error === "string" ? error : JSON.stringify(error)));
      else waiting.resolve(event);
      return;
    }
    const sessionId = sessionOf(event);
    if (sessionId && Number.isInteger(event.seq)) {
      const last = this.lastSeq.get(sessionId);
      if (last !== undefined && event.seq <= last) return; // already handled (a replay's overlap)
      this.lastSeq.set(sessionId, event.seq);
      if (this.followed.has(sessionId)) this.followed.set(sessionId, event.seq);
    }
    this.onEvent(event);
  }
}
