// The config panel: the selected node's params as a form built from the node's declarations in
// GET /api/nodes. Every change goes through editor.setParam (one undoable edit); a value the node
// cannot take is marked on its field and never written into the graph.
import { api, upload } from "../api.js";
import { h, fill } from "../dom.js";
import { catalogIndex, keepKeys, useStyles } from "./files.js";
import { isVisible, valueOf } from "../params.js";

export { isVisible, valueOf };

// File params and the data folder their picker lists (cdui/nodes/base.py UPLOAD_FOLDERS).
export const UPLOAD_FOLDERS = { data_file: "files", image_file: "images", model_file: "models" };

// A string param that holds a layer graph as JSON (SequentialModel's architecture).
const JSON_STRING_PARAMS = { SequentialModel: ["layers"] };

// Canvas-only node types that never run (cdui/graph/model.py ANNOTATION_TYPES).
const ANNOTATIONS = new Set(["note", "group", "comment", "frame"]);

const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

function rangeProblem(decl, n) {
  if (decl.min != null && n < decl.min) return `${n} is below the minimum ${decl.min}`;
  if (decl.max != null && n > decl.max) return `${n} is above the maximum ${decl.max}`;
  return "";
}

function gridProblem(v) {
  if (!Array.isArray(v)) return "a tensor grid is a list of rows, e.g. [[1, 0], [0, 1]]";
  const rows = v.every(Array.isArray);
  const flat = rows ? v.flat() : v;
  if (!flat.every((x) => typeof x === "number" && Number.isFinite(x))) return "every cell must be a number";
  if (rows && v.length && !v.every((r) => r.length === v[0].length)) {
    return `the rows have different lengths (${v.map((r) => r.length).join(", ")}); a grid is rectangular`;
  }
  return "";
}

function layersProblem(v) {
  if (typeof v !== "string") return "the layer graph must be JSON text";
  let g;
  try { g = JSON.parse(v); } catch (e) { return `not valid JSON: ${e.message}`; }
  if (Array.isArray(g) || (isObj(g) && Array.isArray(g.nodes))) return "";
  return 'a layer graph is {"version": 2, "nodes": [...], "edges": [...]} or a list of layers';
}

/** Why a value does not fit its declaration ("" when it does). Values as the graph holds them. */
export function paramProblem(decl, value, nodeType) {
  const t = decl.type;
  if (value == null || value === "") {
    if (decl.required) return "a value is needed";
    if (t === "int" || t === "float") return value == null && decl.default == null ? "" : "a number is needed";
    return "";
  }
  if (t === "int" || t === "float") {
    if (typeof value !== "number" || !Number.isFinite(value)) return `${JSON.stringify(value)} is not a number`;
    if (t === "int" && !Number.isInteger(value)) return `${value} is not a whole number`;
    return rangeProblem(decl, value);
  }
  if (t === "bool") return typeof value === "boolean" ? "" : `${JSON.stringify(value)} is not true or false`;
  if (t === "select") {
    const opts = decl.options || [];
    return !opts.length || opts.includes(value) ? "" : `${JSON.stringify(value)} is not one of ${opts.join(", ")}`;
  }
  if (t === "tensor_grid") return gridProblem(value);
  if (t === "json" && typeof value === "string") {
    try { JSON.parse(value); } catch (e) { return `not valid JSON: ${e.message}`; }
  }
  if ((JSON_STRING_PARAMS[nodeType] || []).includes(decl.name)) return layersProblem(value);
  return "";
}

/** Every param of the graph that does not fit its declaration: [{node_id, param, message}]
 *  (for marking a tab's graph before Run; hidden params are not checked). */
export function graphProblems(graph, catalog) {
  const byType = catalogIndex(catalog);
  const out = [];
  for (const n of graph?.nodes || []) {
    const spec = byType.get(n?.type);
    if (!spec) continue;
    const params = n.data?.params || {};
    for (const d of spec.params || []) {
      if (!isVisible(d, params, spec.params)) continue;
      const message = paramProblem(d, valueOf(d, params), n.type);
      if (message) out.push({ node_id: n.id, param: d.name, message: `${d.name}: ${message}` });
    }
  }
  return out;
}

// Text in a field -> the value to write, or {problem}.
function parseText(decl, text, nodeType) {
  const t = decl.type;
  const s = text.trim();
  if (t === "int" || t === "float") {
    if (s === "") return decl.required || decl.default != null ? { problem: "a number is needed" } : { value: null };
    const n = t === "int" ? (/^[-+]?\d+$/.test(s) ? Number(s) : NaN) : (/^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i.test(s) ? Number(s) : NaN);
    if (!Number.isFinite(n)) return { problem: `${JSON.stringify(text)} is not ${t === "int" ? "a whole number" : "a number"}` };
    const p = rangeProblem(decl, n);
    return p ? { problem: p } : { value: n };
  }
  if (t === "tensor_grid") {
    if (s === "") return { value: null };
    let v;
    try { v = JSON.parse(s); } catch (e) { return { problem: `not valid JSON: ${e.message}` }; }
    const p = gridProblem(v);
    return p ? { problem: p } : { value: v };
  }
  if (t === "json") {
    let v;
    try { v = JSON.parse(s); } catch (e) { return { problem: `not valid JSON: ${e.message}` }; }
    // Keep the shape the declaration uses: JSON text stays text, a structure stays a structure.
    return { value: typeof decl.default === "string" ? text : v };
  }
  const p = paramProblem(decl, text, nodeType);
  return p ? { problem: p } : { value: text };
}

function textOf(decl, value) {
  if (value == null) return "";
  if (decl.type === "tensor_grid" || (decl.type === "json" && typeof value !== "string")) {
    return JSON.stringify(value);
  }
  return String(value);
}

const fieldId = (name) => `cv-param-${name.replace(/[^A-Za-z0-9_-]/g, "_")}`;

export function initPanel({ root, catalog, tabs }) {
  useStyles();
  const byType = catalogIndex(catalog);
  const listings = new Map(); // upload folder -> Promise<[names]>
  const watched = new WeakSet();
  let shown = null; // {editor, nodeId}
  let writing = false;

  const body = h("div", { class: "cv-panel-body" });
  const summary = h("div", { class: "cv-panel-problems", role: "status", "aria-live": "polite" });
  fill(root, h("h2", { class: "cv-panel-title" }, "Params"), summary, body);
  root.classList.add("cv-panel");
  keepKeys(root);

  const editor = () => tabs.active()?.editor || null;
  // A SequentialModel's layer editor (layers.js) carries its own declarations: the layer types.
  const specOf = (ed, type) => (ed && ed.layerCatalog ? ed.layerCatalog : byType).get(type);

  function watch(ed) {
    if (!ed || watched.has(ed)) return;
    watched.add(ed);
    ed.on("select", () => {
      if (ed !== editor()) return;
      listings.clear(); // the data folders are listed again for the next node shown
      render();
    });
    // Any edit fires "change" (a node dragged: many): the form is rebuilt only when the shown
    // node's params changed under it (an undo) or the node went away.
    ed.on("change", () => {
      if (ed !== editor()) return;
      checkSoon();
      if (writing) return;
      const node = shown && shown.editor === ed ? ed.node(shown.nodeId) : null;
      if (shown && node && node.type === shown.type && JSON.stringify(node.params || {}) === shown.snapshot) return;
      render();
    });
  }

  function listing(kind) {
    if (!listings.has(kind)) {
      listings.set(kind, api("GET", `/api/${kind}`).then(
        (rows) => (rows || []).filter((r) => r.type !== "symlink").map((r) => r.name),
        () => []));
    }
    return listings.get(kind);
  }

  function write(ed, nodeId, name, value) {
    writing = true;
    try {
      ed.setParam(nodeId, name, value);
    } finally {
      writing = false;
    }
    if (shown && shown.editor === ed && shown.nodeId === nodeId) {
      shown.snapshot = JSON.stringify(ed.node(nodeId)?.params || {});
    }
  }

  function mark(row, problem) {
    const input = row.querySelector("[data-param-input]");
    const err = row.querySelector(".cv-param-error");
    row.classList.toggle("invalid", !!problem);
    if (input) {
      if (problem) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }
    if (err) err.textContent = problem || "";
  }

  function refreshVisibility() {
    if (!shown) return;
    const node = shown.editor.node(shown.nodeId);
    const spec = node && specOf(shown.editor, node.type);
    if (!spec) return;
    for (const row of body.querySelectorAll(".cv-param[data-param]")) {
      const d = spec.params.find((p) => p.name === row.dataset.param);
      if (d) row.hidden = !isVisible(d, node.params || {}, spec.params);
    }
  }

  function commit(ed, node, decl, row, text) {
    const got = parseText(decl, text, node.type);
    mark(row, got.problem || "");
    if (got.problem) return;
    if (JSON.stringify(got.value) === JSON.stringify(valueOf(decl, ed.node(node.id)?.params))) return;
    write(ed, node.id, decl.name, got.value);
    refreshVisibility();
  }

  function field(ed, node, decl) {
    const params = node.params || {};
    const value = valueOf(decl, params);
    const id = fieldId(decl.name);
    const row = h("div", { class: "cv-param", dataset: { param: decl.name, type: decl.type } });
    const label = h("label", { for: id }, decl.name);
    const err = h("div", { class: "cv-param-error", role: "alert" });
    const desc = decl.description ? h("div", { class: "cv-param-desc", id: `${id}-desc` }, decl.description) : null;
    const common = { id, "data-param-input": true, "aria-describedby": desc ? `${id}-desc` : null };
    let input;
    let extra = null;
    const t = decl.type;
    if (t === "bool") {
      input = h("input", { ...common, type: "checkbox" });
      input.checked = value === true;
      input.addEventListener("change", () => {
        mark(row, "");
        write(ed, node.id, decl.name, input.checked);
        refreshVisibility();
      });
      row.append(h("div", { class: "cv-param-check" }, input, label));
    } else if (t === "select") {
      const opts = [...(decl.options || [])];
      if (value != null && !opts.includes(value)) opts.push(value);
      input = h("select", common, opts.map((o) => h("option", { value: o }, String(o))));
      input.value = value == null ? "" : String(value);
      input.addEventListener("change", () => commit(ed, node, decl, row, input.value));
      row.append(label, input);
    } else if (t === "secret") {
      // Never shown, never put back into the page: the field only takes a new value.
      const set = typeof params[decl.name] === "string" && params[decl.name] !== "";
      input = h("input", { ...common, type: "password", autocomplete: "off",
        placeholder: set ? "set (hidden): type to replace" : "not set" });
      const state = h("span", { class: "cv-secret-state small muted", "data-secret-state": true }, set ? "set" : "not set");
      const clear = h("button", { type: "button", class: "plain small", "aria-label": `Clear ${decl.name}`,
        onclick: () => {
          write(ed, node.id, decl.name, "");
          input.placeholder = "not set";
          state.textContent = "not set";
        } }, "Clear");
      input.addEventListener("change", () => {
        const v = input.value;
        input.value = "";
        if (!v) return;
        write(ed, node.id, decl.name, v);
        input.placeholder = "set (hidden): type to replace";
        state.textContent = "set";
      });
      row.append(label, input, h("div", { class: "cv-param-line" }, state, clear));
    } else if (t === "code" || t === "json" || t === "tensor_grid" ||
               (JSON_STRING_PARAMS[node.type] || []).includes(decl.name)) {
      input = h("textarea", { ...common, rows: t === "tensor_grid" ? 4 : 8, spellcheck: "false", class: "mono" });
      input.value = textOf(decl, value);
      input.addEventListener("change", () => commit(ed, node, decl, row, input.value));
      input.addEventListener("input", () => {
        const got = parseText(decl, input.value, node.type);
        mark(row, got.problem || "");
      });
      row.append(label, input);
      if ((JSON_STRING_PARAMS[node.type] || []).includes(decl.name)) {
        extra = h("div", { class: "cv-param-line" },
          h("button", { type: "button", class: "small", id: "cv-edit-layers",
            onclick: () => root.dispatchEvent(new CustomEvent("cv-edit-layers", { bubbles: true,
              detail: { editor: ed, nodeId: node.id } })) }, "Edit layers"),
          h("span", { class: "small muted" }, "opens them as a graph; the JSON here is the same layers as text"));
      }
    } else {
      const numeric = t === "int" || t === "float";
      input = h("input", { ...common, type: "text", inputmode: numeric ? (t === "int" ? "numeric" : "decimal") : null,
        spellcheck: "false" });
      input.value = textOf(decl, value);
      input.addEventListener("change", () => commit(ed, node, decl, row, input.value));
      if (numeric) {
        input.addEventListener("input", () => mark(row, parseText(decl, input.value, node.type).problem || ""));
      }
      row.append(label, input);
      if (numeric && (decl.min != null || decl.max != null)) {
        extra = h("div", { class: "small muted cv-param-range" },
          decl.min != null && decl.max != null ? `${decl.min} … ${decl.max}`
            : decl.min != null ? `at least ${decl.min}` : `at most ${decl.max}`);
      }
      const kind = UPLOAD_FOLDERS[t];
      if (kind) extra = filePicker(ed, node, decl, row, input, kind);
    }
    if (extra) row.append(extra);
    if (desc) row.append(desc);
    row.append(err);
    mark(row, t === "secret" ? "" : paramProblem(decl, value, node.type));
    row.hidden = !isVisible(decl, params, specOf(ed, node.type)?.params || []);
    return row;
  }

  function filePicker(ed, node, decl, row, input, kind) {
    const pick = h("select", { "aria-label": `Pick ${decl.name} from data/${kind}`, class: "cv-file-pick" },
      h("option", { value: "" }, `data/${kind}/…`));
    const fileInput = h("input", { type: "file", class: "sr-only", tabindex: "-1",
      "aria-label": `Upload a file for ${decl.name}` });
    const note = h("span", { class: "small muted cv-upload-note", role: "status" });
    const fillPick = (names) => {
      fill(pick, h("option", { value: "" }, names.length ? `data/${kind}/…` : `data/${kind} is empty`),
        names.map((n) => h("option", { value: n }, n)));
    };
    listing(kind).then(fillPick);
    pick.addEventListener("change", () => {
      if (!pick.value) return;
      input.value = pick.value;
      commit(ed, node, decl, row, input.value);
    });
    const button = h("button", { type: "button", class: "small", onclick: () => fileInput.click() }, "Upload…");
    fileInput.addEventListener("change", async () => {
      const file = fileInput.files?.[0];
      if (!file) return;
      const form = new FormData();
      form.append("file", file, file.name);
      note.textContent = `uploading ${file.name}…`;
      try {
        const got = await upload(`/api/${kind}/upload`, form, (sent, total) => {
          if (total) note.textContent = `uploading ${file.name}: ${Math.round((100 * sent) / total)}%`;
        });
        note.textContent = `uploaded ${got.name}`;
        listings.delete(kind);
        listing(kind).then(fillPick);
        input.value = got.name;
        commit(ed, node, decl, row, got.name);
      } catch (e) {
        note.textContent = `upload of ${file.name} failed: ${e.message}${e.hint ? ` (${e.hint})` : ""}`;
      } finally {
        fileInput.value = "";
      }
    });
    return h("div", { class: "cv-param-line" }, pick, button, fileInput, note);
  }

  function render() {
    const ed = editor();
    watch(ed);
    const focused = document.activeElement && root.contains(document.activeElement) ? document.activeElement.id : "";
    const ids = ed ? ed.selection() : [];
    shown = null;
    if (!ed || ids.length === 0) {
      fill(body, h("p", { class: "muted small cv-panel-empty" }, "Select a node to edit its params."));
      return;
    }
    if (ids.length > 1) {
      fill(body, h("p", { class: "muted small cv-panel-empty" }, `${ids.length} nodes selected: select one to edit its params.`));
      return;
    }
    const node = ed.node(ids[0]);
    if (!node) {
      fill(body);
      return;
    }
    shown = { editor: ed, nodeId: node.id, type: node.type, snapshot: JSON.stringify(node.params || {}) };
    const spec = specOf(ed, node.type);
    const head = h("div", { class: "cv-panel-node", "data-node-id": node.id },
      h("strong", {}, node.type), " ", h("span", { class: "muted mono small" }, node.id));
    if (!spec) {
      const type = String(node.type);
      const why = type.startsWith("preset:")
        ? [h("p", { class: "small muted" }, `Preset ${type.slice(7)}: it runs the preset's own nodes, with the `
          + "params the preset gives them and this node's overrides (internalParams)."),
        h("div", { class: "cv-param-line" }, h("button", { type: "button", class: "small", id: "cv-open-preset",
          onclick: () => root.dispatchEvent(new CustomEvent("cv-edit-layers", { bubbles: true,
            detail: { editor: ed, nodeId: node.id } })) }, "Open preset"),
        h("span", { class: "small muted" }, "shows its nodes; their params can change there"))]
        : ANNOTATIONS.has(type) ? h("p", { class: "small muted" }, "A note on the canvas: it has nothing to set and never runs.")
          : h("p", { class: "cv-param-error" }, `This server has no node type ${JSON.stringify(type)}: its params are `
            + "kept as they are.");
      const params = node.params || {};
      fill(body, head, why, Object.keys(params).length ? h("pre", { class: "mono small" }, JSON.stringify(params, null, 2)) : null);
      return;
    }
    const decls = spec.params || [];
    // A read-only sub-canvas (a preset inside a preset, layers.js): the params are shown, not editable.
    const locked = ed.readOnly ? h("p", { class: "small muted", id: "cv-panel-read-only" },
      "Read-only here: this node is inside a preset inside a preset.") : null;
    const undeclared = Object.keys(node.params || {}).filter((k) => !decls.some((d) => d.name === k));
    fill(body, head, locked,
      spec.description ? h("p", { class: "small muted" }, spec.description) : null,
      decls.length ? decls.map((d) => field(ed, node, d)) : h("p", { class: "muted small" }, "This node has no params."),
      undeclared.length ? [h("h3", {}, "Other params (kept as they are)"),
        h("pre", { class: "mono small" }, JSON.stringify(Object.fromEntries(undeclared.map((k) => [k, node.params[k]])), null, 2))]
        : null);
    if (locked) for (const x of body.querySelectorAll("[data-param-input], .cv-param button, .cv-param select")) if (x.id !== "cv-edit-layers") x.disabled = true;
    if (focused) document.getElementById(focused)?.focus();
  }

  // The whole tab's params that do not fit (a loaded or imported graph may have them), listed above
  // the form before Run, each a button to its node.
  let checking = 0;
  function checkSoon() {
    if (checking) return;
    checking = requestAnimationFrame(() => {
      checking = 0;
      check();
    });
  }
  function check() {
    const ed = editor();
    const found = ed ? graphProblems(ed.toJSON(), ed.layerCatalog ? [...ed.layerCatalog.values()] : catalog) : [];
    if (!found.length) {
      fill(summary);
      return;
    }
    fill(summary, h("p", { class: "cv-param-error" },
      `${found.length} param${found.length === 1 ? "" : "s"} in this graph ${found.length === 1 ? "does" : "do"} not fit:`),
    h("ul", { class: "cv-problem-list" }, found.slice(0, 20).map((p) => h("li", {},
      h("button", { type: "button", class: "plain small", dataset: { node: p.node_id, param: p.param },
        onclick: () => { if (typeof ed.select === "function") ed.select([p.node_id]); } },
      `${p.node_id} · ${p.message}`))),
    found.length > 20 ? h("li", { class: "small muted" }, `and ${found.length - 20} more`) : null));
  }

  tabs.onActiveChange(() => {
    render();
    check();
  });
  render();
  check();
  return {
    render,
    /** The problems of the active tab's graph ([{node_id, param, message}]). */
    problems: () => (editor() ? graphProblems(editor().toJSON(), editor().layerCatalog ? [...editor().layerCatalog.values()] : catalog) : []),
  };
}
