// Usage and cost: per-day chart by model, totals, budgets with their use and holds, rate limits, and
// the FOCUS / JSON-lines export as a download.

import { call, get, put, query } from "./api.js";
import { clear, download, field, h, toast, usd } from "./dom.js";

let chart = null;

export function leave() {
  if (chart) chart.destroy();
  chart = null;
}

function thisMonth() {
  return new Date().toISOString().slice(0, 7);
}

function drawChart(canvas, rows) {
  if (chart) chart.destroy();
  chart = null;
  if (!window.Chart) return;
  const days = [...new Set(rows.map((r) => r.day))].sort();
  const models = [...new Set(rows.map((r) => r.model || "unknown"))].sort();
  const datasets = models.map((model) => ({
    label: model,
    data: days.map((day) => rows.filter((r) => r.day === day && (r.model || "unknown") === model)
      .reduce((sum, r) => sum + Number(r.billedCost || 0), 0)),
  }));
  chart = new window.Chart(canvas, {
    type: "bar",
    data: { labels: days, datasets },
    options: { responsive: true, maintainAspectRatio: false, animation: false,
               scales: { x: { stacked: true }, y: { stacked: true, title: { display: true, text: "billed USD" } } } },
  });
}

function budgetsPanel(budgets, ctx, reload) {
  const rows = (budgets.budgets || []).map((b) => h("tr", {},
    h("td", { text: b.keyId || "tenant" }), h("td", { class: "num", text: b.monthlyBudget ? usd(b.monthlyBudget) : "—" }),
    h("td", { class: "num", text: usd(b.spent ?? "0") }), h("td", { class: "num", text: b.requestsPerMinute ?? "—" })));
  const monthly = h("input", { inputmode: "decimal", testid: "budget-monthly", placeholder: "25.00" });
  const rpm = h("input", { inputmode: "numeric", testid: "budget-rpm", placeholder: "60" });
  const keyId = h("input", { testid: "budget-key", placeholder: "whole tenant" });
  const form = h("form", { class: "row" }, h("div", {}, ...field("Monthly budget (USD)", monthly)),
    h("div", {}, ...field("Turns per minute", rpm)), h("div", {}, ...field("Key id (optional)", keyId)),
    h("button", { type: "submit", testid: "set-budget", text: "Set" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const body = {};
    if (monthly.value.trim()) body.monthlyBudget = monthly.value.trim();
    if (rpm.value.trim()) body.requestsPerMinute = Number(rpm.value.trim());
    if (keyId.value.trim()) body.keyId = keyId.value.trim();
    try {
      await put("/v1/budgets", body);
      toast("Budget saved");
      reload();
    } catch (error) { ctx.fail(error); }
  });
  return h("section", { class: "panel" }, h("h2", { text: `Budgets and rate limits (${budgets.period})` }),
    h("div", { class: "cards" },
      h("div", { class: "card" }, h("div", { class: "muted", text: "spent" }), h("div", { class: "v", testid: "budget-spent", text: usd(budgets.spent) })),
      h("div", { class: "card" }, h("div", { class: "muted", text: "held for running calls" }), h("div", { class: "v", testid: "budget-reserved", text: usd(budgets.reserved) }))),
    h("table", { testid: "budget-list" }, h("thead", {}, h("tr", {},
      ["Applies to", "Monthly budget", "Spent", "Turns / minute"].map((t) => h("th", { text: t })))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 4, class: "muted", text: "No budget set." })))),
    form);
}

export async function render(main, params, ctx) {
  const month = h("input", { type: "month", value: params[0] || thisMonth(), testid: "usage-period" });
  const body = h("div", {});
  const exportButtons = ["focus", "jsonl"].map((format) => h("button", { type: "button", testid: `export-${format}`,
    text: format === "focus" ? "Download FOCUS CSV" : "Download JSON lines",
    onclick: async () => {
      try {
        const response = await call("GET", `/v1/usage/export${query({ period: month.value, format })}`, undefined, { raw: true });
        download(`agentvm-usage-${month.value}.${format === "focus" ? "csv" : "jsonl"}`, await response.blob());
      } catch (error) { ctx.fail(error); }
    } }));
  const load = async () => {
    const [byDay, byTenant, budgets] = await Promise.all([
      get(`/v1/usage${query({ period: month.value, groupBy: "day,model" })}`),
      get(`/v1/usage${query({ period: month.value, groupBy: "tenant,model" })}`),
      get("/v1/budgets"),
    ]);
    const total = byDay.total || {};
    const canvas = h("canvas", { testid: "usage-chart", role: "img", "aria-label": "Billed USD per day by model" });
    clear(body).append(
      h("div", { class: "cards" },
        h("div", { class: "card" }, h("div", { class: "muted", text: "billed" }), h("div", { class: "v", testid: "usage-total", "data-billed": total.billedCost ?? "0", text: usd(total.billedCost ?? "0") })),
        h("div", { class: "card" }, h("div", { class: "muted", text: "list price" }), h("div", { class: "v", text: usd(total.listCost ?? "0") })),
        h("div", { class: "card" }, h("div", { class: "muted", text: "LLM calls" }), h("div", { class: "v", testid: "usage-calls", text: total.calls ?? 0 })),
        h("div", { class: "card" }, h("div", { class: "muted", text: "tokens in / out" }),
          h("div", { class: "v", text: `${(total.usage || {}).inputTokens ?? 0} / ${(total.usage || {}).outputTokens ?? 0}` }))),
      h("section", { class: "panel" }, h("h2", { text: "Billed per day" }), h("div", { class: "chart-box" }, canvas)),
      h("section", { class: "panel" }, h("h2", { text: "By tenant and model" }),
        h("table", { testid: "usage-by-tenant" }, h("thead", {}, h("tr", {},
          ["Tenant", "Model", "Calls", "Input", "Output", "Billed"].map((t) => h("th", { text: t })))),
          h("tbody", {}, (byTenant.rows || []).map((r) => h("tr", {}, h("td", { text: r.tenant }), h("td", { text: r.model }),
            h("td", { class: "num", text: r.calls }), h("td", { class: "num", text: (r.usage || {}).inputTokens ?? 0 }),
            h("td", { class: "num", text: (r.usage || {}).outputTokens ?? 0 }), h("td", { class: "num", text: usd(r.billedCost) })))))),
      budgetsPanel(budgets, ctx, () => load().catch((e) => ctx.fail(e))));
    drawChart(canvas, byDay.rows || []);
  };
  month.addEventListener("change", () => load().catch((e) => ctx.fail(e)));
  clear(main).append(h("h1", { text: "Usage and cost" }),
    h("div", { class: "row panel" }, h("div", {}, ...field("Month", month)), ...exportButtons), body);
  await load();
}
