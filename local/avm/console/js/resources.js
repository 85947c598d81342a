// Resources and definitions: browse kinds, names and versions, view content, register a version,
// build an image from a definition.

import { get, post, put, query } from "./api.js";
import { clear, field, h, toast } from "./dom.js";

const KINDS = ["", "prompt", "tool", "sandbox", "agent", "knowledge"];

function parseJson(text, name) {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new Error(`${name}: not JSON (${error.message})`);
  }
}

function registerForm(ctx, reload) {
  const kind = h("select", { testid: "resource-kind", required: true }, KINDS.slice(1).map((k) => h("option", { value: k, text: k })));
  const name = h("input", { testid: "resource-name", required: true, pattern: "[a-z0-9][a-z0-9._\\-]*" });
  const version = h("input", { testid: "resource-version", required: true, placeholder: "1.0.0" });
  const content = h("textarea", { testid: "resource-content", rows: 6, required: true, placeholder: '{"text": "You are…"}' });
  const form = h("form", {}, h("div", { class: "row" }, h("div", {}, ...field("Kind", kind)), h("div", {}, ...field("Name", name)),
    h("div", {}, ...field("Version", version))), field("Content (JSON)", content),
    h("button", { type: "submit", class: "primary", testid: "register-resource", text: "Register" }));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const body = { kind: kind.value, name: name.value.trim(), version: version.value.trim(),
                     content: parseJson(content.value, "content") };
      const done = await post("/v1/resources", body);
      toast(`Registered ${done.kind || body.kind}/${done.name || body.name} ${done.version || body.version}`);
      reload();
    } catch (error) { ctx.fail(error); }
  });
  return form;
}

async function showResource(id, viewer, ctx, version) {
  try {
    const r = await get(`/v1/resources/${encodeURIComponent(id)}${query({ version })}`);
    const versions = (r.versions || []).map((v) => v.version);
    const pick = h("select", { testid: "resource-version-pick" },
      versions.map((v) => h("option", { value: v, text: v, selected: v === r.version })));
    pick.addEventListener("change", () => showResource(id, viewer, ctx, pick.value));
    const next = h("input", { testid: "new-version", required: true, placeholder: "1.1.0" });
    const content = h("textarea", { testid: "new-version-content", rows: 5, required: true });
    content.value = JSON.stringify(r.content ?? {}, null, 2);
    const form = h("form", {}, h("div", { class: "row" }, h("div", {}, ...field("New version", next))),
      field("Its content (JSON)", content),
      h("button", { type: "submit", class: "primary", testid: "publish-version", text: "Publish version" }));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      try {
        const done = await put(`/v1/resources/${encodeURIComponent(id)}`,
          { version: next.value.trim(), content: parseJson(content.value, "content") });
        toast(`Published ${r.kind}/${r.name} ${done.version}`);
        showResource(id, viewer, ctx, done.version);
      } catch (error) { ctx.fail(error); }
    });
    clear(viewer).append(h("h2", { text: `${r.kind}/${r.name}` }),
      h("p", { class: "muted", text: [r.uri, r.description].filter(Boolean).join(" · ") }),
      h("div", { class: "row" }, h("div", {}, ...field("Version", pick))),
      h("pre", { class: "content", testid: "resource-view", text: JSON.stringify(r.content ?? {}, null, 2) }),
      h("h2", { text: "Publish a new version" }), form);
  } catch (error) { ctx.fail(error); }
}

export async function render(main, params, ctx) {
  const kind = h("select", { testid: "filter-kind" }, KINDS.map((k) => h("option", { value: k, text: k || "every kind" })));
  const rows = h("tbody", {});
  const viewer = h("section", { class: "panel", "aria-live": "polite" }, h("p", { class: "muted", text: "Pick a resource to view it." }));
  const reload = async () => {
    const page = await get(`/v1/resources${query({ kind: kind.value, limit: 200 })}`);
    clear(rows);
    for (const r of page.items || []) {
      rows.append(h("tr", {}, h("td", { text: r.kind }),
        h("td", {}, h("button", { type: "button", class: "pick", text: r.name, onclick: () => showResource(r.resourceId, viewer, ctx) })),
        h("td", { text: r.version || "" }), h("td", { text: r.description || "" })));
    }
    if (!(page.items || []).length) rows.append(h("tr", {}, h("td", { colspan: 4, class: "muted", text: "No resources." })));
  };
  kind.addEventListener("change", () => reload().catch((e) => ctx.fail(e)));

  const definitions = (await get("/v1/definitions")).items || [];
  const container = h("input", { value: "console", testid: "definition-container" });
  const defs = h("table", { testid: "definition-list" },
    h("thead", {}, h("tr", {}, ["Definition", "Source", "Description", ""].map((t) => h("th", { text: t })))),
    h("tbody", {}, definitions.map((d) => h("tr", {}, h("td", { text: d.name }), h("td", { text: d.source }),
      h("td", { text: d.description || "" }),
      h("td", {}, h("button", { type: "button", text: "Build image", "aria-label": `Build an image from ${d.name}`,
        onclick: async () => {
          try {
            const image = await post("/v1/images", { containerId: container.value.trim() || "console", agent: d.name });
            toast(`Image ${image.imageId} built from ${d.name}`);
            ctx.go(`#/chat/${image.imageId}/${image.sessionId}`);
          } catch (error) { ctx.fail(error); }
        } }))))));

  clear(main).append(h("h1", { text: "Resources" }),
    h("section", { class: "panel" }, h("div", { class: "row" }, h("div", {}, ...field("Kind", kind))),
      h("table", { testid: "resource-list" },
        h("thead", {}, h("tr", {}, ["Kind", "Name", "Version", "Description"].map((t) => h("th", { text: t })))), rows)),
    viewer,
    h("section", { class: "panel" }, h("h2", { text: "Register a resource" }), registerForm(ctx, () => reload().catch((e) => ctx.fail(e)))),
    h("section", { class: "panel" }, h("h2", { text: "Definitions" }), field("Build into container", container), defs));
  await reload();
}
