// Sessions: every session of the tenant, full-text search with highlights, export and import.

import { call, get, query } from "./api.js";
import { clear, download, field, fmtTime, h, highlighted, toast } from "./dom.js";

async function exportSession(sessionId, ctx) {
  try {
    const response = await call("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/export`, undefined, { raw: true });
    download(`${sessionId}.session.json`, await response.blob());
  } catch (error) { ctx.fail(error); }
}

function sessionRows(items, ctx) {
  return items.map((s) => h("tr", {},
    h("td", {}, h("a", { href: `#/chat/${s.imageId}/${s.sessionId}`, text: s.title || s.sessionId })),
    h("td", { text: s.imageId }), h("td", { text: fmtTime(s.updatedAt || s.createdAt) }),
    h("td", {}, h("button", { type: "button", text: "Export", "aria-label": `Export ${s.sessionId}`,
                               onclick: () => exportSession(s.sessionId, ctx) }))));
}

export async function render(main, params, ctx) {
  const table = h("tbody", {});
  const more = h("button", { type: "button", text: "More", hidden: true });
  let cursor = null;
  const load = async () => {
    const page = await get(`/v1/sessions${query({ limit: 50, cursor })}`);
    table.append(...sessionRows(page.items || [], ctx));
    cursor = page.nextCursor;
    more.hidden = !cursor;
  };
  more.addEventListener("click", () => load().catch((e) => ctx.fail(e)));

  const q = h("input", { type: "search", testid: "search-input", required: true });
  const results = h("ul", { class: "list", testid: "search-results", "aria-label": "Search results" });
  const search = h("form", { class: "row", role: "search" }, h("div", {}, ...field("Search messages", q)),
    h("button", { type: "submit", class: "primary", testid: "search-button", text: "Search" }));
  search.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const found = await get(`/v1/sessions/search${query({ q: q.value.trim(), limit: 50 })}`);
      clear(results);
      if (!(found.items || []).length) results.append(h("li", { class: "muted", text: "Nothing found." }));
      for (const hit of found.items || []) {
        results.append(h("li", { testid: "search-hit" },
          h("a", { href: `#/chat/${hit.imageId}/${hit.sessionId}` },
            h("span", { class: "muted", text: `${hit.role} · ${fmtTime(hit.timestamp)} · ` }), highlighted(hit.snippet))));
      }
    } catch (error) { ctx.fail(error); }
  });

  const file = h("input", { type: "file", accept: ".json,application/json", testid: "import-file", required: true });
  const container = h("input", { value: "console", testid: "import-container", required: true });
  const importForm = h("form", { class: "row" }, h("div", {}, ...field("Session archive", file)),
    h("div", {}, ...field("Into container", container)),
    h("button", { type: "submit", testid: "import-button", text: "Import" }));
  importForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!file.files.length) return;
    try {
      const blob = new Blob([await file.files[0].arrayBuffer()], { type: "application/json" });
      const done = await call("POST", `/v1/sessions/import${query({ containerId: container.value.trim() })}`, blob);
      toast(`Imported as session ${done.sessionId}`);
      ctx.go(`#/chat/${done.imageId}/${done.sessionId}`);
    } catch (error) { ctx.fail(error); }
  });

  clear(main).append(
    h("h1", { text: "Sessions" }),
    h("section", { class: "panel" }, search, results),
    h("section", { class: "panel" },
      h("table", { testid: "session-list" },
        h("thead", {}, h("tr", {}, ["Session", "Image", "Last activity", ""].map((t) => h("th", { text: t })))), table),
      more),
    h("section", { class: "panel" }, h("h2", { text: "Import an archive" }), importForm));
  await load();
}
