// Save / Save as (data/graphs/ through PUT /api/graphs/{name}), Open (GET /api/graphs), Import a
// CodefyUI export (a file or pasted JSON) into a new tab, Export the tab's JSON. Ctrl+S arrives as
// the "canvas-save" event the editor's keyboard code dispatches on window.
import { api } from "../api.js";
import { h, fill, size, time } from "../dom.js";

// The server's rule for graph names (cdui/plane/graph_index.py GRAPH_NAME, api_graphs.py RESERVED).
export const GRAPH_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$/;
const RESERVED = new Set(["validate", "run"]);

/** Why a graph name is refused ("" when the server takes it). */
export function nameProblem(name) {
  if (!GRAPH_NAME.test(name)) {
    return `${JSON.stringify(name)} is not a graph name: use up to 100 letters, digits, '_', '-' and '.', ` +
      "starting with a letter or digit";
  }
  if (name.endsWith(".json")) return `${JSON.stringify(name)} ends in .json: leave the extension out`;
  if (RESERVED.has(name)) return `${JSON.stringify(name)} is a route word of the API: choose another name`;
  return "";
}

/** A graph name made from a tab's name (invalid characters become '-'). */
export function suggestName(name) {
  const s = String(name || "").trim().replace(/\.json$/i, "").replace(/[^A-Za-z0-9_.-]+/g, "-")
    .replace(/^[^A-Za-z0-9]+/, "").slice(0, 100);
  return s && !RESERVED.has(s) ? s : "graph";
}

/** type -> catalog entry, from the GET /api/nodes answer (or its nodes list). */
export function catalogIndex(catalog) {
  const list = Array.isArray(catalog) ? catalog : catalog?.nodes || [];
  return new Map(list.map((n) => [n.type, n]));
}

/** A copy of the graph with every secret-typed param blanked (what leaves memory: browser
 *  storage, exports). The keys stay, so the graph keeps its shape. */
export function blankSecrets(graph, byType) {
  let copy = null;
  (graph?.nodes || []).forEach((n, i) => {
    const params = n?.data?.params;
    const spec = byType.get(n?.type);
    if (!params || !spec) return;
    for (const d of spec.params || []) {
      if (d.type !== "secret" || typeof params[d.name] !== "string" || params[d.name] === "") continue;
      copy = copy || JSON.parse(JSON.stringify(graph));
      copy.nodes[i].data.params[d.name] = "";
    }
  });
  return copy || graph;
}

/** The graph in an imported text: a CodefyUI export (the graph object) or {graph: {...}}.
 *  Throws an Error that says what is wrong and what to do. */
export function parseImport(text, source) {
  let data;
  try {
    data = JSON.parse(text);
  } catch (e) {
    throw new Error(`${source} is not JSON (${e.message}): export the graph from CodefyUI or cdui and import that file`);
  }
  const graph = data && typeof data === "object" && !Array.isArray(data) && data.graph && typeof data.graph === "object"
    && !Array.isArray(data.nodes) ? data.graph : data;
  if (!graph || typeof graph !== "object" || Array.isArray(graph) || !Array.isArray(graph.nodes)) {
    throw new Error(`${source} is not a graph: it has no "nodes" list. Import a graph CodefyUI exported ` +
      '({"nodes": [...], "edges": [...]})');
  }
  const bad = graph.nodes.findIndex((n) => !n || typeof n !== "object" || typeof n.id !== "string" || typeof n.type !== "string");
  if (bad >= 0) throw new Error(`${source}: node #${bad + 1} has no string "id" and "type"; the file is not a graph export`);
  if (graph.edges != null && !Array.isArray(graph.edges)) throw new Error(`${source}: "edges" is not a list`);
  return graph;
}

let styled = false;
/** Keys typed into a field of `el` stay there (Delete, Ctrl+Z edit the text, not the graph);
 *  only Ctrl+S goes on to the page's keyboard handling, after the field's value is committed. */
export function keepKeys(el) {
  el.addEventListener("keydown", (ev) => {
    const field = ev.target instanceof Element && ev.target.matches("input, textarea, select");
    const save = (ev.ctrlKey || ev.metaKey) && ev.key.toLowerCase() === "s";
    if (field && !save) ev.stopPropagation();
    // A value typed but not yet committed is part of what Ctrl+S saves.
    else if (field && save) ev.target.dispatchEvent(new Event("change", { bubbles: true }));
  });
}

/** Adds the panel/tabs/files stylesheet to the page once. */
export function useStyles() {
  if (styled || document.querySelector("link[data-cv-panel-css]")) return;
  styled = true;
  document.head.append(h("link", { rel: "stylesheet", href: "/web/canvas/panel.css", "data-cv-panel-css": true }));
}

/** The file buttons in `toolbar`, acting on tabs (tabs.js's API). Returns {save, saveAs, open, importText, exportTab}. */
export function initFiles({ toolbar, tabs, catalog }) {
  useStyles();
  const byType = catalogIndex(catalog);
  const status = h("span", { class: "cv-file-status small", role: "status", "aria-live": "polite" });
  const say = (text, bad = false) => {
    status.textContent = text;
    status.classList.toggle("bad", bad);
  };
  const errorText = (e) => [e.message, e.hint].filter(Boolean).join(" ");

  // One dialog for Save as / Open / Import.
  const dialog = h("dialog", { class: "cv-dialog", "aria-labelledby": "cv-dialog-title" });
  document.body.append(dialog);
  keepKeys(dialog);
  function showDialog(title, ...content) {
    fill(dialog, h("h2", { id: "cv-dialog-title" }, title), ...content);
    if (!dialog.open) dialog.showModal();
  }
  const closeButton = () => h("button", { type: "button", class: "plain", onclick: () => dialog.close() }, "Cancel");

  async function saveTo(tab, name) {
    const problem = nameProblem(name);
    if (problem) throw new Error(problem);
    const graph = tab.editor.toJSON();
    const got = await api("PUT", `/api/graphs/${encodeURIComponent(name)}`, graph);
    tabs.markSaved(tab.tabId, name);
    const blanked = got?.secrets_removed?.length ? `; secrets were not saved (${got.secrets_removed.join(", ")})` : "";
    say(`Saved to ${got?.saved_as || `data/graphs/${name}.json`}${blanked}`);
    return got;
  }

  async function save(tab = tabs.active()) {
    if (!tab) return null;
    if (!tab.savedAs) return saveAs(tab);
    try {
      return await saveTo(tab, tab.savedAs);
    } catch (e) {
      say(`Save failed: ${errorText(e)}`, true);
      return null;
    }
  }

  /** With a name: save under it. Without: ask for one in the dialog. */
  function saveAs(tab = tabs.active(), name) {
    if (!tab) return null;
    if (name != null) return saveTo(tab, name);
    const input = h("input", { id: "cv-save-name", type: "text", spellcheck: "false", autocomplete: "off" });
    input.value = tab.savedAs || suggestName(tab.name);
    const err = h("p", { class: "cv-param-error", role: "alert", id: "cv-save-error" });
    const form = h("form", { method: "dialog", onsubmit: async (ev) => {
      ev.preventDefault();
      const name = input.value.trim();
      try {
        await saveTo(tab, name);
        dialog.close();
      } catch (e) {
        err.textContent = errorText(e);
      }
    } },
    h("label", { for: "cv-save-name" }, "Name (saved as data/graphs/NAME.json)"), input, err,
    h("div", { class: "cv-dialog-buttons" }, h("button", { type: "submit", id: "cv-save-confirm" }, "Save"), closeButton()));
    showDialog("Save graph as", form);
    input.select();
    return null;
  }

  async function openNamed(name) {
    const graph = await api("GET", `/api/graphs/${encodeURIComponent(name)}`);
    const tab = tabs.open(graph, name, { savedAs: name });
    say(`Opened data/graphs/${name}.json`);
    return tab;
  }

  async function open() {
    const list = h("ul", { class: "cv-graph-list", id: "cv-open-list" }, h("li", { class: "muted" }, "loading…"));
    const err = h("p", { class: "cv-param-error", role: "alert" });
    showDialog("Open a saved graph", list, err, h("div", { class: "cv-dialog-buttons" }, closeButton()));
    try {
      const got = await api("GET", "/api/graphs");
      const graphs = got?.graphs || [];
      fill(list, graphs.length ? graphs.map((g) => h("li", { dataset: { graph: g.name } },
        h("button", { type: "button", "aria-label": `Open graph ${g.name}`, onclick: async () => {
          try {
            await openNamed(g.name);
            dialog.close();
          } catch (e) {
            err.textContent = `Could not open ${g.name}: ${errorText(e)}`;
          }
        } }, g.name),
        h("span", { class: "small muted" }, ` ${g.nodes ?? "?"} nodes · ${size(g.size)} · ${time(g.modified_at ? new Date(g.modified_at * 1000).toISOString() : "")}`)))
        : h("li", { class: "muted" }, "No saved graphs in data/graphs/ yet: Save one first."));
    } catch (e) {
      fill(list);
      err.textContent = `Could not list the saved graphs: ${errorText(e)}`;
    }
  }

  /** Imports a text (a file's or pasted); returns the new tab. Throws with the reason. */
  function importText(text, source = "the pasted text", fallbackName = "Imported") {
    const graph = parseImport(text, source);
    const name = typeof graph.name === "string" && graph.name.trim() ? graph.name.trim() : fallbackName;
    const tab = tabs.open(graph, name);
    say(`Imported ${source} into tab ${name}`);
    return tab;
  }

  function importDialog() {
    const file = h("input", { id: "cv-import-file", type: "file", accept: ".json,application/json" });
    const text = h("textarea", { id: "cv-import-text", rows: 8, spellcheck: "false", class: "mono",
      placeholder: '{"nodes": [...], "edges": [...]}' });
    const err = h("p", { class: "cv-param-error", role: "alert", id: "cv-import-error" });
    const form = h("form", { method: "dialog", onsubmit: async (ev) => {
      ev.preventDefault();
      try {
        const f = file.files?.[0];
        if (f) importText(await f.text(), f.name, f.name.replace(/(\.graph)?\.json$/i, ""));
        else if (text.value.trim()) importText(text.value);
        else throw new Error("Choose a file or paste a graph's JSON first.");
        dialog.close();
      } catch (e) {
        err.textContent = e.message;
      }
    } },
    h("label", { for: "cv-import-file" }, "A CodefyUI export (.json)"), file,
    h("label", { for: "cv-import-text" }, "or paste its JSON"), text, err,
    h("div", { class: "cv-dialog-buttons" }, h("button", { type: "submit", id: "cv-import-confirm" }, "Import"), closeButton()));
    showDialog("Import a graph into a new tab", form);
  }

  function exportTab(tab = tabs.active()) {
    if (!tab) return;
    const graph = blankSecrets(tab.editor.toJSON(), byType);
    const blob = new Blob([JSON.stringify(graph, null, 2)], { type: "application/json" });
    const a = h("a", { href: URL.createObjectURL(blob), download: `${suggestName(tab.savedAs || tab.name)}.json` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
    say(`Exported ${a.download}`);
  }

  fill(toolbar,
    h("button", { type: "button", id: "cv-save", title: "Save (Ctrl+S)", onclick: () => save() }, "Save"),
    h("button", { type: "button", id: "cv-save-as", onclick: () => saveAs() }, "Save as…"),
    h("button", { type: "button", id: "cv-open", onclick: () => open() }, "Open…"),
    h("button", { type: "button", id: "cv-import", onclick: () => importDialog() }, "Import…"),
    h("button", { type: "button", id: "cv-export", onclick: () => exportTab() }, "Export"),
    status);
  toolbar.classList.add("cv-files");
  window.addEventListener("canvas-save", () => save());
  return { save, saveAs, open, openNamed, importText, exportTab, say };
}
