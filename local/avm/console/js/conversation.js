// One conversation on screen: the stored history, then the live events of its session. A reply that
// was streaming when the page was reloaded continues: the turn's starting seq is kept in session
// storage and the session is followed from it (`afterSeq`); what the history already shows is skipped.

import { get } from "./api.js";
import { sessionOf } from "./agentx.js";
import { h, usd } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

const TURN_KEY = (sessionId) => `avm.console.turn.${sessionId}`;
const RESULT_CHARS = 2000;

function textOf(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content.filter((p) => p && p.type === "text").map((p) => p.text).join("");
}

function shortJson(value) {
  const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
  return text.length > RESULT_CHARS ? `${text.slice(0, RESULT_CHARS)}… (${text.length} characters)` : text;
}

export class Conversation {
  constructor({ imageId, sessionId, list, onRunning }) {
    this.imageId = imageId;
    this.sessionId = sessionId;
    this.list = list; // the element messages go into
    this.onRunning = onRunning;
    this.seen = new Set(); // message ids on screen
    this.costed = new Set(); // turn ids whose cost is on screen
    this.skipping = null; // a replayed message that the history already shows
    this.bubble = null; // the streaming assistant message
    this.text = "";
    this.tools = new Map(); // tool call id → its <details>
    this.painting = false;
  }

  inFlight() {
    try {
      return JSON.parse(sessionStorage.getItem(TURN_KEY(this.sessionId)));
    } catch {
      return null;
    }
  }

  setInFlight(value) {
    if (value) sessionStorage.setItem(TURN_KEY(this.sessionId), JSON.stringify(value));
    else sessionStorage.removeItem(TURN_KEY(this.sessionId));
  }

  async load(agentx) {
    const [messages, turns] = await Promise.all([
      get(`/v1/sessions/${encodeURIComponent(this.sessionId)}/messages`),
      get(`/v1/sessions/${encodeURIComponent(this.sessionId)}/turns?limit=200`).catch(() => ({ items: [] })),
    ]);
    const byUser = new Map((turns.items || []).map((t) => [t.userMessageId, t]));
    let openTurn = null;
    for (const message of messages.items || []) {
      if (message.role === "user" && openTurn) this.costLine(openTurn);
      if (message.role === "user") openTurn = byUser.get(message.id) || null;
      this.show(message);
    }
    if (openTurn && openTurn.status !== "queued" && openTurn.status !== "running") this.costLine(openTurn);
    const flight = this.inFlight();
    if (flight) this.onRunning(true);
    agentx.follow(this.sessionId, flight ? flight.baseSeq ?? 0 : undefined);
    this.scroll();
  }

  show(message) {
    if (!message || this.seen.has(message.id)) return;
    this.seen.add(message.id);
    const subtype = message.subtype || message.role;
    if (subtype === "user") {
      this.list.append(h("div", { class: "msg user", testid: "user-message", text: textOf(message.content) }));
    } else if (subtype === "assistant") {
      const body = h("div", { class: "md" });
      body.innerHTML = renderMarkdown(textOf(message.content));
      this.list.append(h("div", { class: "msg assistant", testid: "assistant-message", "data-message-id": message.id }, body));
    } else if (subtype === "tool-call") {
      const call = message.toolCall || {};
      this.toolCall(call.id, call.name, call.input);
    } else if (subtype === "tool-result") {
      const result = message.toolResult || {};
      const output = result.output || {};
      this.toolResult(message.toolCallId, output.value, output.type === "error-text");
    } else if (subtype === "error") {
      this.list.append(h("div", { class: "msg error", testid: "error-message", text: message.content }));
    }
  }

  toolCall(id, name, input) {
    const args = h("pre", { testid: "tool-args", text: shortJson(input ?? {}) });
    const result = h("pre", { testid: "tool-result", class: "muted", text: "running…" });
    const details = h("details", { class: "tool", testid: "tool-call" },
      h("summary", { text: `tool ${name || "?"}` }), h("div", { class: "muted", text: "arguments" }), args,
      h("div", { class: "muted", text: "result" }), result);
    this.tools.set(id, details);
    this.list.append(details);
  }

  toolResult(id, value, isError) {
    const details = this.tools.get(id);
    if (!details) return;
    const result = details.querySelector("[data-testid=tool-result]");
    result.textContent = shortJson(value ?? "");
    result.className = isError ? "error" : "";
    details.querySelector("summary").textContent += isError ? " — failed" : " — done";
  }

  costLine(turn) {
    if (!turn || this.costed.has(turn.turnId)) return;
    this.costed.add(turn.turnId);
    const usage = turn.usage || {};
    const billed = turn.cost ? turn.cost.billed : turn.billedCost;
    const list = turn.cost ? turn.cost.list : turn.listCost;
    const parts = [`Turn cost ${usd(billed)}${list !== undefined ? ` (list ${usd(list)})` : ""}`,
      `${usage.inputTokens ?? 0} in / ${usage.outputTokens ?? 0} out tokens`, turn.model, turn.status];
    this.list.append(h("div", { class: "cost", testid: "turn-cost", "data-billed": billed ?? "",
                                text: parts.filter(Boolean).join(" · ") }));
  }

  sent(text) {
    this.list.append(h("div", { class: "msg user", testid: "user-message", text }));
    this.setInFlight({ baseSeq: null, at: Date.now() });
    this.onRunning(true);
    this.scroll();
  }

  // A session event of this conversation (the connection already dropped duplicates by seq).
  event(event) {
    if (sessionOf(event) !== this.sessionId) return;
    const data = event.data || {};
    const flight = this.inFlight();
    if (flight && flight.baseSeq === null && Number.isInteger(event.seq)) {
      this.setInFlight({ ...flight, baseSeq: event.seq - 1 });
    }
    switch (event.type) {
      case "message_persisted":
        this.seen.add(data.messageId);
        break;
      case "conversation_start":
      case "message_start":
        this.startMessage(data.messageId);
        break;
      case "text_delta":
        if (!this.skipping && this.bubble) this.delta(data.text || "");
        break;
      case "tool_call_message":
        if (!this.seen.has(data.id)) this.show(data);
        break;
      case "tool_result_message":
        if (!this.seen.has(data.id)) this.show(data);
        break;
      case "assistant_message":
        this.finishMessage(data);
        break;
      case "error_message":
        if (!this.seen.has(data.id)) this.show({ ...data, subtype: "error" });
        break;
      case "interrupted":
        this.list.append(h("div", { class: "muted", testid: "interrupted", text: "interrupted" }));
        break;
      case "turn_response":
        this.endTurn(data);
        break;
      default:
        return;
    }
    this.scroll();
  }

  startMessage(messageId) {
    if (this.bubble && this.bubble.dataset.messageId === messageId) return;
    if (this.seen.has(messageId)) {
      this.skipping = messageId;
      return;
    }
    this.skipping = null;
    this.onRunning(true);
    this.text = "";
    this.body = h("div", { class: "md streaming" });
    this.bubble = h("div", { class: "msg assistant", testid: "assistant-message", "data-message-id": messageId,
                             "aria-busy": "true" }, this.body);
    this.list.append(this.bubble);
  }

  delta(text) {
    this.text += text;
    if (this.painting) return;
    this.painting = true;
    requestAnimationFrame(() => {
      this.painting = false;
      if (this.body) this.body.innerHTML = renderMarkdown(this.text);
    });
  }

  finishMessage(message) {
    if (this.seen.has(message.id)) return;
    this.seen.add(message.id);
    if (this.bubble && this.bubble.dataset.messageId === message.id) {
      this.body.classList.remove("streaming");
      this.body.innerHTML = renderMarkdown(textOf(message.content));
      this.bubble.removeAttribute("aria-busy");
      this.bubble = null;
      this.body = null;
    } else {
      this.show(message);
    }
    this.skipping = null;
  }

  endTurn(data) {
    if (this.bubble) { // a message that ended without text (a tool call, an interrupt)
      this.body.classList.remove("streaming");
      this.bubble.removeAttribute("aria-busy");
      if (!this.text) this.bubble.remove();
      this.bubble = null;
    }
    this.skipping = null;
    this.costLine(data);
    this.setInFlight(null);
    this.onRunning(false);
  }

  scroll() {
    this.list.scrollTop = this.list.scrollHeight;
  }
}
