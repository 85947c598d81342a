// Admin: API keys (the secret shown once), the config center, metrics and recent logs.

import { del, get, post, put, query } from "./api.js";
import { clear, field, fmtTime, h, toast } from "./dom.js";

async function keysPanel(ctx, reload) {
  const keys = (await get("/v1/auth/keys")).items || [];
  const name = h("input", { testid: "key-name", maxlength: 100 });
  const admin = h("input", { type: "checkbox", testid: "key-admin" });
  const shown = h("div", { "aria-live": "polite" });
  const form = h("form", { class: "row" }, h("div", {}, ...field("Name", name)),
    h("div", {}, h("label", {}, admin, " admin scope")),
    h("button", { type: "submit", class: "primary", testid: "create-key", text: "Create key" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = { scopes: admin.checked ? ["user", "admin"] : ["user"] };
    if (name.value.trim()) body.name = name.value.trim();
    try {
      const key = await post("/v1/auth/keys", body);
      await reload();
      // after the reload, which rebuilt this panel: the token goes in the new one
      const target = document.querySelector("[data-testid=new-key-slot]");
      clear(target).append(h("p", { text: "Copy this key now: it is not shown again." }),
        h("div", { class: "secret", testid: "new-key-token", text: key.token }));
    } catch (error) { ctx.fail(error); }
  });
  const rows = keys.map((k) => h("tr", { testid: "key-row", "data-key-id": k.keyId || k.id },
    h("td", { text: k.name || "" }), h("td", { text: k.keyId || k.id }), h("td", { text: (k.scopes || []).join(", ") }),
    h("td", { text: k.status || (k.revoked ? "revoked" : "active"), testid: "key-status" }), h("td", { text: fmtTime(k.createdAt) }),
    h("td", {}, !ctx.can("admin") || k.revoked || k.status === "revoked" ? "" : h("button", { type: "button", class: "danger", testid: "revoke-key",
      text: "Revoke", "aria-label": `Revoke key ${k.name || k.keyId || k.id}`,
      onclick: async () => {
        if (!confirm(`Revoke key ${k.name || k.keyId || k.id}? Clients using it stop working.`)) return;
        try {
          await del(`/v1/auth/keys/${encodeURIComponent(k.keyId || k.id)}`);
          toast("Key revoked");
          await reload();
        } catch (error) { ctx.fail(error); }
      } }))));
  return h("section", { class: "panel" }, h("h2", { text: "API keys" }),
    ctx.can("admin") ? form : h("p", { class: "muted", text: "Creating and revoking keys needs a key with the admin scope." }), h("div", { testid: "new-key-slot" }, shown),
    h("table", { testid: "key-list" }, h("thead", {}, h("tr", {},
      ["Name", "Id", "Scopes", "Status", "Created", ""].map((t) => h("th", { text: t })))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 6, class: "muted", text: "No key: the server runs open." })))));
}

function configPanel(config, ctx, reload) {
  const rows = Object.entries(config.values || {}).map(([key, v]) => {
    const input = h("input", { value: v.secret ? "" : JSON.stringify(v.value), "aria-label": `Value of ${key}`,
                               placeholder: v.secret ? "secret: type a new value" : "" });
    const save = h("button", { type: "button", text: "Save", "aria-label": `Save ${key}`, onclick: async () => {
      let value;
      try {
        value = v.secret ? input.value : JSON.parse(input.value);
      } catch {
        value = input.value; // a bare string
      }
      try {
        await put(`/v1/config/${encodeURIComponent(key)}`, { value });
        toast(`${key} saved (applies at: ${v.appliesAt})`);
        reload();
      } catch (error) { ctx.fail(error); }
    } });
    return h("tr", {}, h("td", {}, h("code", { text: key }), h("div", { class: "muted", text: v.description || "" })),
      h("td", {}, input), h("td", { class: "muted", text: `${v.source || "unset"} · ${v.appliesAt}` }), h("td", {}, save));
  });
  return h("section", { class: "panel" }, h("h2", { text: "Config center" }),
    h("table", { testid: "config-list" }, h("thead", {}, h("tr", {}, ["Key", "Value (JSON)", "Source", ""].map((t) => h("th", { text: t })))),
      h("tbody", {}, rows)));
}

function metricsPanel(m) {
  const card = (label, value) => h("div", { class: "card" }, h("div", { class: "muted", text: label }), h("div", { class: "v", text: value }));
  const turns = m.turns || {};
  const latency = m.latencyMs || {};
  return h("section", { class: "panel", testid: "metrics" }, h("h2", { text: "Metrics" }),
    h("div", { class: "cards" }, card("turns", turns.total ?? 0), card("completed", turns.completed ?? 0),
      card("failed", turns.failed ?? 0), card("success rate", m.successRate === undefined ? "—" : `${Math.round(m.successRate * 100)} %`),
      card("first token p50", latency.firstToken ? `${latency.firstToken.p50} ms` : "—"),
      card("turn p95", latency.turn ? `${latency.turn.p95} ms` : "—"),
      card("connections", (m.active || {}).connections ?? 0)));
}

function logsPanel(logs) {
  return h("section", { class: "panel" }, h("h2", { text: "Recent turns (log)" }),
    h("table", { testid: "log-list" }, h("thead", {}, h("tr", {}, ["Time", "Level", "Message", "Model", "Duration", "Error"].map((t) => h("th", { text: t })))),
      h("tbody", {}, (logs.items || []).map((l) => h("tr", {}, h("td", { text: fmtTime(l.time) }), h("td", { text: l.level }),
        h("td", { text: l.message }), h("td", { text: l.model || "" }), h("td", { class: "num", text: l.durationMs ?? "" }),
        h("td", { text: l.errorCode || "" }))))));
}

export async function render(main, params, ctx) {
  const reload = async () => {
    const parts = await Promise.all([
      keysPanel(ctx, reload).catch((e) => h("section", { class: "panel" }, h("h2", { text: "API keys" }), h("p", { class: "error", text: e.message }))),
      ctx.can("operator")
        ? get("/v1/config").then((c) => configPanel(c, ctx, reload)).catch((e) => h("section", { class: "panel" }, h("h2", { text: "Config center" }), h("p", { class: "error", text: e.message })))
        : h("section", { class: "panel" }, h("h2", { text: "Config center" }),
            h("p", { class: "muted", text: "The deployment's configuration needs a key with the operator scope." })),
      get("/v1/metrics").then(metricsPanel).catch((e) => h("p", { class: "error", text: e.message })),
      get(`/v1/logs${query({ limit: 50 })}`).then(logsPanel).catch((e) => h("p", { class: "error", text: e.message })),
    ]);
    clear(main).append(h("h1", { text: "Admin" }), ...parts);
  };
  await reload();
}
