// Chat: images (create, list, delete), their sessions, and one conversation streamed over AgentX.

import { call, del, get, post } from "./api.js";
import { clear, download, field, h, toast } from "./dom.js";
import { Conversation } from "./conversation.js";

const DEFAULT_CONTAINER = "console";
let conversation = null;

export function leave() {
  conversation = null;
}

export function onEvent(event) {
  if (conversation) conversation.event(event);
}

async function newChat(imageId, ctx) {
  if (imageId) {
    const session = await post(`/v1/images/${encodeURIComponent(imageId)}/sessions`, {});
    ctx.go(`#/chat/${imageId}/${session.sessionId}`);
    return;
  }
  // No image yet: one from the built-in plain chat definition, then its first session.
  let image;
  try {
    image = await post("/v1/images", { containerId: DEFAULT_CONTAINER, agent: "chat_basic" });
  } catch {
    image = await post("/v1/images", { containerId: DEFAULT_CONTAINER, config: { name: "chat" } });
  }
  ctx.go(`#/chat/${image.imageId}/${image.sessionId}`);
}

function imageForm(ctx, definitions) {
  const name = h("input", { testid: "image-name", required: true, maxlength: 100 });
  const prompt = h("textarea", { testid: "image-prompt", rows: 3 });
  const model = h("input", { testid: "image-model", placeholder: "server default" });
  const container = h("input", { testid: "image-container", value: DEFAULT_CONTAINER, required: true });
  const definition = h("select", { testid: "image-definition" }, h("option", { value: "", text: "none: the fields above" }),
    definitions.map((d) => h("option", { value: d.name, text: `${d.name} — ${d.description || d.source}` })));
  const form = h("form", {}, field("Name", name), field("System prompt", prompt), field("Model", model),
    field("Definition", definition), field("Container", container),
    h("button", { type: "submit", class: "primary", testid: "create-image", text: "Create image" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { containerId: container.value.trim() };
    if (definition.value) body.agent = definition.value;
    const config = {};
    if (name.value.trim()) config.name = name.value.trim();
    if (prompt.value.trim()) config.systemPrompt = prompt.value.trim();
    if (model.value.trim()) config.model = model.value.trim();
    if (!definition.value || Object.keys(config).length > 1) body.config = config;
    try {
      const image = await post("/v1/images", body);
      toast(`Image ${image.name || image.imageId} created`);
      ctx.go(`#/chat/${image.imageId}/${image.sessionId}`);
    } catch (error) {
      ctx.fail(error);
    }
  });
  return h("details", { class: "panel" }, h("summary", { testid: "new-image", text: "New image" }), form);
}

function sidebar(ctx, images, sessions, imageId, sessionId, definitions) {
  const containers = [...new Set(images.map((img) => img.containerId))];
  const imageList = h("ul", { class: "list", testid: "image-list", "aria-label": "Images by container" },
    containers.map((container) => [h("li", { class: "muted", testid: "container", text: `container ${container}` }),
    images.filter((img) => img.containerId === container).map((img) => h("li", { class: img.imageId === imageId ? "selected" : "" },
      h("a", { href: `#/chat/${img.imageId}`, text: img.name || img.imageId,
               "aria-current": img.imageId === imageId ? "true" : null }),
      h("button", { type: "button", class: "danger", "aria-label": `Delete image ${img.name || img.imageId}`,
                    testid: "delete-image", text: "×",
                    onclick: async () => {
                      if (!confirm(`Delete image ${img.name || img.imageId} and all its sessions?`)) return;
                      try {
                        await del(`/v1/images/${encodeURIComponent(img.imageId)}`);
                        ctx.go("#/chat");
                      } catch (error) { ctx.fail(error); }
                    } })))]));
  const sessionList = h("ul", { class: "list", testid: "image-sessions", "aria-label": "Sessions of this image" },
    sessions.map((s) => h("li", { class: s.sessionId === sessionId ? "selected" : "" },
      h("a", { href: `#/chat/${imageId}/${s.sessionId}`, text: s.title || `${s.primary ? "primary · " : ""}${s.sessionId}`,
               "aria-current": s.sessionId === sessionId ? "true" : null }))));
  return h("aside", {},
    h("button", { type: "button", class: "primary", testid: "new-chat", text: "New chat",
                  onclick: () => newChat(imageId, ctx).catch((e) => ctx.fail(e)) }),
    h("h2", { text: "Containers and images" }), images.length ? imageList : h("p", { class: "muted", text: "No image yet." }),
    imageForm(ctx, definitions),
    imageId ? [h("h2", { text: "Sessions" }), sessionList] : null);
}

function conversationPanel(ctx, image, sessionId) {
  const list = h("div", { class: "messages", role: "log", "aria-live": "polite", testid: "messages" });
  const input = h("textarea", { testid: "message-input", rows: 2, placeholder: "Message (Enter sends, Shift+Enter: new line)" });
  const send = h("button", { type: "submit", class: "primary", testid: "send-button", text: "Send" });
  const stop = h("button", { type: "button", testid: "interrupt-button", text: "Interrupt", hidden: true });
  const onRunning = (running) => { stop.hidden = !running; };
  conversation = new Conversation({ imageId: image.imageId, sessionId, list, onRunning });
  const form = h("form", { class: "composer" }, ...field("Message", input), send, stop);
  form.querySelector("label").className = "skip";
  const submit = async () => {
    const text = input.value.trim();
    if (!text) return;
    input.value = "";
    const mine = conversation;
    mine.sent(text);
    try {
      await ctx.agentx.request("message_send", { imageId: image.imageId, sessionId, content: text });
    } catch (error) {
      mine.setInFlight(null);
      onRunning(false);
      ctx.fail(error);
    }
  };
  form.addEventListener("submit", (event) => { event.preventDefault(); submit(); });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); submit(); }
  });
  stop.addEventListener("click", async () => {
    try {
      await ctx.agentx.request("agent_interrupt", { imageId: image.imageId, sessionId });
    } catch (error) { ctx.fail(error); }
  });
  const exportButton = h("button", { type: "button", testid: "export-session", text: "Export session",
    onclick: async () => {
      try {
        const response = await call("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/export`, undefined, { raw: true });
        download(`${sessionId}.session.json`, await response.blob());
      } catch (error) { ctx.fail(error); }
    } });
  const panel = h("section", { class: "panel conversation", "aria-label": "Conversation" },
    h("div", { class: "row" }, h("h1", { text: image.name || image.imageId }), exportButton),
    h("p", { class: "muted", text: `${image.model || "default model"} · session ${sessionId}` }),
    list, form);
  return { panel, input };
}

export async function render(main, [imageId, sessionId], ctx) {
  const [images, definitions] = await Promise.all([get("/v1/images"), get("/v1/definitions").catch(() => ({ items: [] }))]);
  const items = images.items || [];
  if (!imageId && items.length) imageId = items[0].imageId;
  const image = items.find((i) => i.imageId === imageId);
  if (imageId && !image) {
    toast(`Image ${imageId} not found`);
    imageId = null;
  }
  const sessions = image ? (await get(`/v1/images/${encodeURIComponent(imageId)}/sessions`)).items || [] : [];
  if (image && !sessionId) sessionId = image.sessionId;
  const layout = h("div", { class: "chat" }, sidebar(ctx, items, sessions, imageId, sessionId, definitions.items || []));
  clear(main).append(layout);
  if (!image) {
    layout.append(h("section", { class: "panel" }, h("h1", { text: "Chat" }),
      h("p", { text: "Start with New chat (a plain chat image), or create an image from a definition." })));
    return;
  }
  const { panel, input } = conversationPanel(ctx, image, sessionId);
  layout.append(panel);
  input.focus();
  await conversation.load(ctx.agentx);
}
