// Sub-canvases over the tab's canvas, with a breadcrumb back.
// - SequentialModel's layers: the `layers` param (a JSON layer graph, {"version": 2, "nodes": [...],
//   "edges": [...]}, see cdui/nodes/builtin/_torchlib/layer_spec.py) opens in a second Editor, with
//   a palette of the layer types (GET /api/nodes's `layer_types`). Back checks the layer graph and
//   writes it into the param with one editor.setParam (one undo step), keeping every field of the
//   layer graph the editor does not draw.
// - A preset node's inside (presets.js): the preset's nodes and wires, read-only; the params of its
//   nodes editable, written back as the node's data.internalParams with one editor.setNodeData.
// Back with no edit writes nothing. A preset or SequentialModel inside a preset opens one level further.
import { h, fill } from "../dom.js";
import { Editor } from "./editor.js";
import { openQuickSearch } from "./palette.js";
import { paramProblem, valueOf } from "./panel.js";
import { exposedPorts, findPreset, internalParamsAfter, presetGraph, PRESET_PREFIX, structureKey } from "./presets.js";

const DRAG_TYPE = "application/x-cdui-node";
const MERGES = new Set(["Add", "Concat", "Multiply"]);
const clone = (v) => (v === undefined ? undefined : JSON.parse(JSON.stringify(v)));
const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

/** What an empty SequentialModel starts with: Input wired to Output. */
export function emptyLayers() {
  return { version: 2,
    nodes: [{ id: "in", type: "Input", ports: [{ id: "p_x", name: "x" }] },
      { id: "out", type: "Output", ports: [{ id: "p_y", name: "y" }] }],
    edges: [{ id: "e1", source: "in", sourceHandle: "p_x", target: "out", targetHandle: "p_y" }] };
}

/** The layer graph a `layers` value holds: {spec} (v2; a legacy list of layers becomes a chain),
 *  or {problem} when it cannot be drawn. */
export function parseLayers(value) {
  let v = value;
  if (v == null || (typeof v === "string" && !v.trim())) return { spec: emptyLayers() };
  if (typeof v === "string") {
    try { v = JSON.parse(v); } catch (e) { return { problem: `the layers are not valid JSON (${e.message}): fix the text in the panel first` }; }
  }
  const list = Array.isArray(v) ? v : isObj(v) && v.version !== 2 && Array.isArray(v.layers) ? v.layers : null;
  if (list) {
    const spec = emptyLayers();
    spec.edges = [];
    const mids = list.map((cfg, i) => {
      const rest = isObj(cfg) ? cfg : {};
      const params = isObj(rest.params) ? clone(rest.params)
        : Object.fromEntries(Object.entries(rest).filter(([k]) => k !== "type"));
      return { id: `l${i + 1}`, type: String(rest.type ?? "?"), params };
    });
    spec.nodes.splice(1, 0, ...mids);
    const chain = spec.nodes.map((n) => n.id);
    for (let i = 1; i < chain.length; i++) {
      const e = { id: `e${i}`, source: chain[i - 1], target: chain[i] };
      if (i === 1) e.sourceHandle = "p_x";
      if (i === chain.length - 1) e.targetHandle = "p_y";
      spec.edges.push(e);
    }
    return { spec, legacy: true };
  }
  if (!isObj(v) || !Array.isArray(v.nodes)) {
    return { problem: 'the layers are not a layer graph ({"version": 2, "nodes": [...], "edges": [...]}): fix the text in the panel first' };
  }
  return { spec: clone(v) };
}

const outSlot = (type) => (type === "Input" ? "x" : "y");
function inSlot(type, k) {
  if (MERGES.has(type)) return ["a", "b", "c", "d"][k] || `in${k}`;
  return type === "Output" ? "y" : "x";
}

/** The layer graph as the editor's graph JSON (CodefyUI's node/edge shape). */
export function toEditorGraph(spec) {
  const typeOf = new Map((spec.nodes || []).map((n) => [String(n?.id), n?.type]));
  const nodes = (spec.nodes || []).map((n) => {
    const out = { id: n.id, type: n.type };
    if (isObj(n.position)) out.position = clone(n.position);
    out.data = isObj(n.params) ? { params: clone(n.params) } : {};
    return out;
  });
  const seen = new Map();
  const edges = (spec.edges || []).map((e, i) => {
    const target = String(e?.target);
    const k = seen.get(target) || 0;
    seen.set(target, k + 1);
    return { id: e?.id == null ? `__edge${i}` : String(e.id), source: String(e?.source), target, type: "data",
      sourceHandle: outSlot(typeOf.get(String(e?.source))), targetHandle: inSlot(typeOf.get(target), k) };
  });
  return { nodes, edges };
}

/** The editor's graph back as a layer graph: `spec` (the one opened) gives every field the
 *  editor does not draw; new nodes and edges get CodefyUI's shape. */
export function fromEditorGraph(graph, spec) {
  const oldNodes = new Map((spec.nodes || []).map((n) => [String(n?.id), n]));
  const oldEdges = new Map((spec.edges || []).map((e, i) => [e?.id == null ? `__edge${i}` : String(e.id), e]));
  const nodes = graph.nodes.map((n) => {
    const old = oldNodes.get(String(n.id));
    const out = old ? clone(old) : { id: n.id, type: n.type };
    if (!old && n.type === "Input") out.ports = [{ id: "p_x", name: "x" }];
    if (!old && n.type === "Output") out.ports = [{ id: "p_y", name: "y" }];
    const params = n.data && isObj(n.data.params) ? n.data.params : null;
    if (params && (Object.keys(params).length || (old && "params" in old))) out.params = clone(params);
    else delete out.params;
    if (n.position) out.position = { x: n.position.x, y: n.position.y };
    return out;
  });
  const byId = new Map(nodes.map((n) => [String(n.id), n]));
  const slotOf = new Map();
  const edges = graph.edges.map((e) => {
    const old = oldEdges.get(String(e.id));
    let out;
    if (old) out = clone(old);
    else {
      out = { id: e.id, source: e.source };
      const src = byId.get(String(e.source));
      if (src && src.type === "Input") out.sourceHandle = (Array.isArray(src.ports) && src.ports[0]?.id) || "p_x";
      out.target = e.target;
      const dst = byId.get(String(e.target));
      if (dst && dst.type === "Output") out.targetHandle = (Array.isArray(dst.ports) && dst.ports[0]?.id) || "p_y";
    }
    slotOf.set(out, String(e.targetHandle ?? ""));
    return out;
  });
  // A merge layer takes its inputs in edge order: keep that order the order of its ports (a, b, ...).
  const mergeIds = new Set(nodes.filter((n) => MERGES.has(n.type)).map((n) => String(n.id)));
  for (const id of mergeIds) {
    const at = edges.map((e, i) => (String(e.target) === id ? i : -1)).filter((i) => i >= 0);
    const sorted = at.map((i) => edges[i]).sort((a, b) => slotOf.get(a).localeCompare(slotOf.get(b)));
    at.forEach((i, k) => { edges[i] = sorted[k]; });
  }
  const out = {};
  for (const [k, v] of Object.entries(spec)) out[k] = k === "nodes" ? nodes : k === "edges" ? edges : clone(v);
  if (!("version" in out)) out.version = 2;
  out.nodes = nodes;
  out.edges = edges;
  return out;
}

/** What keeps the layer graph from building, as layer_spec.py would refuse it, plus what the
 *  editor can tell before a run: [{node_id?, edge_id?, message}] ([] when it builds). */
export function layerProblems(spec, types) {
  const found = [];
  const nodes = spec.nodes || [];
  const ids = nodes.map((n) => String(n?.id));
  const typeOf = new Map(nodes.map((n) => [String(n?.id), n?.type]));
  if (new Set(ids).size !== ids.length) found.push({ message: "two layers have the same id: each layer needs its own" });
  const ins = nodes.filter((n) => n?.type === "Input");
  const outs = nodes.filter((n) => n?.type === "Output");
  if (ins.length !== 1 || outs.length !== 1) {
    found.push({ message: `the layer graph needs exactly 1 Input and 1 Output, it has ${ins.length} and ${outs.length}: `
      + "add the missing one from the palette or delete the extra one" });
  }
  const preds = new Map(ids.map((id) => [id, []]));
  for (const e of spec.edges || []) {
    const s = String(e?.source);
    const t = String(e?.target);
    if (!preds.has(s) || !preds.has(t)) {
      found.push({ message: `edge ${JSON.stringify(e?.id)} joins a layer that is not there (${s} → ${t})` });
      continue;
    }
    preds.get(t).push(s);
  }
  for (const n of nodes) {
    const id = String(n?.id);
    const decl = types.get(n?.type);
    if (!decl) {
      found.push({ node_id: id, message: `${id}: unknown layer type ${JSON.stringify(n?.type)}; pick one of the palette's` });
      continue;
    }
    const k = preds.get(id)?.length || 0;
    if (n.type !== "Input" && k === 0) found.push({ node_id: id, message: `${id} (${n.type}) has no input: wire something into it` });
    if (n.type !== "Output" && n.type !== "Input" && !MERGES.has(n.type) && k > 1) {
      found.push({ node_id: id, message: `${id} (${n.type}) takes one input, ${k} are wired into it: use Add or Concat to merge them` });
    }
    for (const d of decl.params || []) {
      const p = paramProblem(d, valueOf(d, n.params || {}), n.type);
      if (p) found.push({ node_id: id, message: `${id} (${n.type}): ${d.name}: ${p}` });
    }
  }
  // A cycle, and whether Output is reached from Input.
  const indeg = new Map(ids.map((id) => [id, preds.get(id).length]));
  const succ = new Map(ids.map((id) => [id, []]));
  for (const [t, ps] of preds) for (const s of ps) succ.get(s).push(t);
  const queue = ids.filter((id) => indeg.get(id) === 0);
  let done = 0;
  while (queue.length) {
    const id = queue.shift();
    done++;
    for (const t of succ.get(id)) {
      indeg.set(t, indeg.get(t) - 1);
      if (indeg.get(t) === 0) queue.push(t);
    }
  }
  if (done < ids.length && new Set(ids).size === ids.length) found.push({ message: "the layer graph has a cycle: a layer feeds itself through others" });
  if (ins.length === 1 && outs.length === 1) {
    const reach = new Set([String(ins[0].id)]);
    const stack = [String(ins[0].id)];
    while (stack.length) for (const t of succ.get(stack.pop()) || []) if (!reach.has(t)) { reach.add(t); stack.push(t); }
    const outId = String(outs[0].id);
    if (!reach.has(outId)) found.push({ node_id: outId, message: "Output is not connected to Input: wire a path of layers from Input to Output" });
    for (const id of ids) {
      if (!reach.has(id) && typeOf.get(id) !== "Input" && (preds.get(id)?.length || 0) > 0) {
        found.push({ node_id: id, message: `${id} (${typeOf.get(id)}) does not get Input's tensor: wire it into the path from Input` });
      }
    }
  }
  return found;
}

// The layer editor draws no trigger ports: layers only pass tensors.
class LayerEditor extends Editor {
  constructor(container, catalog) {
    super(container, catalog);
    this.canvas.onShowNodePanel = () => {}; // no litegraph panel on double-click: its edits bypass the graph JSON
  }

  _addLNode(raw, pos) {
    const n = super._addLNode(raw, pos);
    const i = n.findInputSlot("__trigger");
    if (i >= 0) {
      n.removeInput(i);
      n.size = n.computeSize();
    }
    return n;
  }
}

// A preset's inside: the page's node types, drawn as the tab draws them.
class PresetEditor extends Editor {
  constructor(container, catalog) {
    super(container, catalog);
    this.canvas.onShowNodePanel = () => {};
  }
}

/**
 * Keeps what `keyOf(graph)` covers from changing on a sub-canvas: an edit that changes it (a node
 * added, deleted or pasted, a wire drawn or removed; with a read-only level, a param) is taken back
 * at once and `refuse()` says why. Moving nodes stays possible (to look), and is never written.
 */
function guard(ed, keyOf, refuse) {
  const key = keyOf(ed.toJSON());
  const commit = ed._commit.bind(ed);
  ed._commit = () => {
    if (keyOf(ed.toJSON()) === key) return commit();
    ed._restore(ed._last);
    refuse();
    return false;
  };
}

const READ_ONLY_PRESET = "read-only: a preset inside a preset runs as its own preset says (the graph keeps "
  + "overrides only for the first level's nodes)";
const PRESET_NOTE = "the preset's nodes and wires are read-only; params you change are kept in this node's internalParams";

/**
 * The sub-canvases of the page. `host` is the element they cover (the tabs' canvas), `tabs` the tabs
 * part; open({editor, nodeId}) shows a SequentialModel's layers or a preset node's inside. From a
 * preset's inside, a preset or SequentialModel in it opens one level further; the breadcrumb goes
 * back level by level. current() is the top level's Editor while one is open (the page's toolbar,
 * the config panel and window.cduiCanvas.editor() act on it), onChange(cb) fires when a level opens
 * or closes.
 */
export function initLayers({ host, catalog, tabs, onStatus }) {
  const list = Array.isArray(catalog.layer_types) ? catalog.layer_types : [];
  const types = new Map(list.map((d) => [d.type, d]));
  const layerCatalog = { nodes: list };
  const listeners = [];
  // One level per open sub-canvas, the top last: {kind: "layers"|"preset", editor (the one the node
  // is in), nodeId, sub, box, side, label, readOnly, initial, tabId, ...}.
  const stack = [];
  let el = null; // the overlay, while a level is open

  const emit = () => listeners.forEach((cb) => cb());
  const say = (text) => { if (onStatus) onStatus(text); };
  const top = () => stack[stack.length - 1] || null;

  function palette(onAdd) {
    const search = h("input", { type: "search", id: "layers-search", placeholder: "Search layers…",
      "aria-label": "Search layer types", autocomplete: "off" });
    const box = h("div", { class: "palette-list" });
    const cats = new Map();
    for (const d of list) {
      if (!cats.has(d.category)) cats.set(d.category, []);
      cats.get(d.category).push(d);
    }
    const render = () => {
      const words = search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
      const groups = [];
      for (const [cat, ds] of cats) {
        const hits = ds.filter((d) => words.every((w) => `${d.type} ${cat} ${d.description}`.toLowerCase().includes(w)));
        if (!hits.length) continue;
        const det = h("details", { class: "palette-cat", "data-category": cat },
          h("summary", {}, `${cat} `, h("span", { class: "muted small" }, String(hits.length))),
          hits.map((d) => {
            const b = h("button", { type: "button", class: "palette-item", draggable: "true", "data-type": d.type,
              title: layerTitle(d), onclick: () => onAdd(d.type) }, d.type);
            b.addEventListener("dragstart", (ev) => {
              ev.dataTransfer.setData(DRAG_TYPE, d.type);
              ev.dataTransfer.setData("text/plain", d.type);
              ev.dataTransfer.effectAllowed = "copy";
            });
            return b;
          }));
        det.open = words.length > 0 || ["Graph", "Dense", "Activation"].includes(cat);
        groups.push(det);
      }
      fill(box, groups.length ? groups : h("p", { class: "muted small" }, `No layer type matches "${search.value}".`));
    };
    search.addEventListener("input", render);
    render();
    return h("div", { class: "palette cv-layers-palette", "aria-label": "Layer types" }, search, box);
  }

  function showProblems(problems) {
    const box = el.querySelector(".cv-layers-problems");
    if (!problems.length) {
      fill(box);
      return;
    }
    fill(box, h("p", { class: "cv-param-error" }, `These layers do not build yet (${problems.length}):`),
      h("ul", { class: "cv-problem-list" }, problems.slice(0, 12).map((p) => h("li", { class: "small", dataset: { node: p.node_id || "" } }, p.message))));
  }

  function current() { return top() ? top().sub : null; }

  /** The bar of the overlay for the levels open now: the breadcrumb (each earlier level a button
   *  back to it), what the top level is, and its buttons. */
  function renderBar() {
    const o = top();
    const tab = tabs.active();
    const crumbs = [h("button", { type: "button", class: "plain cv-layers-tab", id: "layers-crumb-tab",
      title: "Back to the tab (writes what changed)", onclick: () => backTo(0) }, tab?.name || "Tab")];
    stack.forEach((lv, i) => {
      crumbs.push(h("span", { class: "muted" }, " › "));
      crumbs.push(i === stack.length - 1
        ? h("span", { "aria-current": "page", id: "layers-crumb-node" }, lv.label, lv.readOnly ? " (read-only)" : "")
        : h("button", { type: "button", class: "plain cv-layers-crumb", dataset: { level: String(i + 1) },
          title: "Back to this level (writes what changed)", onclick: () => backTo(i + 1) }, lv.label));
    });
    const note = o.kind === "layers"
      ? (o.readOnly ? "read-only: the preset around these layers is read-only here"
        : o.legacy ? "a list of layers, drawn as a graph (written back as a graph)" : "")
      : o.readOnly ? READ_ONLY_PRESET : PRESET_NOTE;
    fill(el.querySelector(".cv-layers-bar"),
      h("nav", { class: "cv-layers-crumbs", "aria-label": "Breadcrumb" }, crumbs),
      h("span", { class: "muted small", id: "layers-note", dataset: { readOnly: o.readOnly ? "1" : "" } }, note),
      h("span", { class: "cv-layers-actions" },
        h("button", { type: "button", id: "layers-back", class: "primary",
          title: o.kind === "layers" ? "Check the layers and write them into the param"
            : "Write the changed params into the preset node", onclick: () => back() }, "Back"),
        h("button", { type: "button", id: "layers-discard", title: "Back without writing anything",
          onclick: () => back({ discard: true }) }, "Discard changes")));
    el.setAttribute("aria-label", `${o.kind === "layers" ? "Layers" : "Inside"} of ${o.nodeId}`);
    el.dataset.kind = o.kind;
  }

  /** Back one level: writes what changed when it may (layers that build; a preset's changed params);
   *  false (problems shown) when the layers do not build. */
  function back({ discard = false } = {}) {
    const o = top();
    if (!o) return true;
    const now = o.sub.toJSON();
    if (!discard && !o.readOnly && JSON.stringify(now) !== o.initial) {
      if (o.kind === "layers") {
        const spec = fromEditorGraph(now, o.spec);
        const problems = layerProblems(spec, types);
        if (problems.length) {
          showProblems(problems);
          o.sub.setBadges(problems.filter((p) => p.node_id).map((p) => ({ node_id: p.node_id, message: p.message })));
          return false;
        }
        if (!o.editor.node(o.nodeId)) say(`${o.nodeId} was deleted: its layers were not written`);
        else o.editor.setParam(o.nodeId, "layers", o.asText ? JSON.stringify(spec) : spec);
      } else {
        const next = internalParamsAfter(o.def, o.internal, now);
        if (next && !o.editor.node(o.nodeId)) say(`${o.nodeId} was deleted: the params changed inside it were not written`);
        else if (next) o.editor.setNodeData(o.nodeId, "internalParams", next);
      }
    }
    pop();
    return true;
  }

  /** Back until `depth` levels are open (0: the tab); false when a level refuses. */
  function backTo(depth) {
    while (stack.length > depth) if (!back()) return false;
    return true;
  }

  function pop() {
    const o = stack.pop();
    if (!o) return;
    o.sub.destroy();
    o.box.remove();
    o.side.remove();
    const up = top();
    if (up) {
      up.box.hidden = false;
      up.side.hidden = false;
      up.sub.setDrawing(true);
      fill(el.querySelector(".cv-layers-problems"));
      renderBar();
    } else {
      el.remove();
      el = null;
      host.closest(".canvas-layout")?.classList.remove("cv-layers-open");
    }
    emit();
    (up ? up.sub : o.editor).focus();
  }

  /** Every level closed without writing (another tab was chosen and a level refused to go back). */
  function closeAll() {
    while (stack.length) pop();
  }

  /** A new level over the ones open: its side panel and its canvas, shown on top. */
  function push(level, side, SubEditor, subCatalog) {
    if (!el) {
      el = h("div", { class: "cv-layers", id: "layers-overlay", role: "region" },
        h("div", { class: "cv-layers-bar" }),
        h("div", { class: "cv-layers-problems", role: "status", "aria-live": "polite" }),
        h("div", { class: "cv-layers-area" }));
      host.append(el);
      host.closest(".canvas-layout")?.classList.add("cv-layers-open");
      // Double-click on empty space: the quick search, of layer types (on a layers level).
      el.addEventListener("cd-quicksearch", (e) => {
        e.stopPropagation();
        const o = top();
        if (!o || o.kind !== "layers" || o.readOnly) return;
        const { clientX, clientY, at } = e.detail;
        openQuickSearch({ catalog: layerCatalog, clientX, clientY, onPick: (type) => { o.sub.addNode(type, at); o.sub.focus(); } });
      });
    }
    const below = top();
    if (below) {
      below.box.hidden = true;
      below.side.hidden = true;
      below.sub.setDrawing(false);
    }
    fill(el.querySelector(".cv-layers-problems"));
    const box = h("div", { class: "cv-layers-canvas", dataset: { level: String(stack.length + 1) } });
    el.querySelector(".cv-layers-area").append(side, box);
    const sub = new SubEditor(box, subCatalog);
    Object.assign(level, { sub, box, side, tabId: tabs.active()?.tabId });
    stack.push(level);
    return sub;
  }

  function openLayers(editor, node, nodeId, readOnly) {
    const decl = (catalog.nodes || []).find((d) => d.type === node.type)?.params?.find((p) => p.name === "layers");
    const value = decl ? valueOf(decl, node.params) : node.params.layers;
    const got = parseLayers(value);
    if (got.problem) {
      say(`${nodeId}: ${got.problem}`);
      return null;
    }
    const level = { kind: "layers", editor, nodeId, label: `${node.type} (${nodeId})`, readOnly, spec: got.spec,
      legacy: !!got.legacy, asText: typeof value !== "object" || value === null };
    let sub = null;
    const side = palette((type) => { if (!level.readOnly) { sub.addNode(type); sub.focus(); } });
    sub = push(level, side, LayerEditor, layerCatalog);
    sub.layerCatalog = types; // the config panel shows a layer's params from these
    sub.readOnly = readOnly;
    sub.load(toEditorGraph(got.spec));
    if (readOnly) guard(sub, (g) => JSON.stringify(g.nodes.map((n) => [n.id, n.type, n.data?.params ?? null]).concat(g.edges.map((e) => [e.source, e.target]))),
      () => say("these layers are read-only here: the preset around them is read-only"));
    sub.on("change", () => {
      if (top() !== level) return;
      const problems = layerProblems(fromEditorGraph(sub.toJSON(), got.spec), types);
      sub.setBadges(problems.filter((p) => p.node_id).map((p) => ({ node_id: p.node_id, message: p.message })));
      if (el.querySelector(".cv-layers-problems").childElementCount) showProblems(problems);
    });
    level.initial = JSON.stringify(sub.toJSON());
    return sub;
  }

  function openPreset(editor, node, nodeId, readOnly) {
    const name = node.type.slice(PRESET_PREFIX.length);
    const graphPresets = stack.length ? stack[0].graphPresets : tabs.active()?.editor?.toJSON().presets;
    const found = findPreset(name, catalog.presets, graphPresets);
    if (found.problem) {
      say(`${nodeId}: ${found.problem}`);
      return null;
    }
    const internal = editor.nodeData(nodeId, "internalParams");
    const ports = exposedPorts(found.def);
    const info = (catalog.presets || []).find((p) => p.name === name);
    const side = h("div", { class: "cv-preset-side small", "aria-label": `Preset ${name}` },
      h("p", {}, h("strong", {}, name), " ", h("span", { class: "muted" },
        found.from === "installed" ? "(installed on this server)" : "(embedded in this graph)")),
      info?.description ? h("p", { class: "muted" }, info.description) : null,
      h("p", { class: "cv-preset-ports" }, h("strong", {}, "In: "), ports.inputs.join(", ") || "none"),
      h("p", { class: "cv-preset-ports" }, h("strong", {}, "Out: "), ports.outputs.join(", ") || "none"),
      h("p", { class: "muted" }, readOnly ? "Nothing here can change: "
        + "the graph can override the params of a preset's own nodes only, not those of a preset inside it."
        : "Select a node to change its params (the panel). Its nodes and wires come from the preset and "
          + "cannot change here; Back writes the params you changed into this node's internalParams."));
    const level = { kind: "preset", editor, nodeId, label: `${name} (${nodeId})`, readOnly, def: found.def,
      internal, graphPresets };
    const sub = push(level, side, PresetEditor, catalog);
    sub.readOnly = readOnly;
    sub.load(presetGraph(found.def, internal));
    guard(sub, (g) => structureKey(g, readOnly), () => say(readOnly ? READ_ONLY_PRESET
      : "the preset's nodes and wires cannot change here (they come from the preset); only params can"));
    // Enter or a double-click on a preset or SequentialModel inside opens it one level further.
    sub.on("open", (id) => { if (top() === level) openLevel({ editor: sub, nodeId: id }); });
    level.initial = JSON.stringify(sub.toJSON());
    return sub;
  }

  function openLevel({ editor, nodeId }) {
    // From the tab or from a level below the top: the open levels go back first.
    const at = editor === (top()?.sub ?? null) ? stack.length : stack.findIndex((lv) => lv.sub === editor) + 1;
    if (!backTo(at)) return null;
    const node = editor.node(nodeId);
    if (!node) throw new Error(`no node ${JSON.stringify(nodeId)} in this graph`);
    let sub;
    if (String(node.type).startsWith(PRESET_PREFIX)) {
      // Inside a preset, a preset is read-only (the graph's overrides reach only the first level).
      sub = openPreset(editor, node, nodeId, stack.some((lv) => lv.kind === "preset"));
    } else if ((catalog.nodes || []).find((d) => d.type === node.type)?.params?.some((p) => p.name === "layers")) {
      sub = openLayers(editor, node, nodeId, !!editor.readOnly);
    } else {
      return null;
    }
    if (!sub) return null;
    renderBar();
    emit();
    sub.focus();
    return sub;
  }

  // Another tab: the levels go back first (written when they may, else left as they were).
  tabs.onActiveChange(() => {
    if (!stack.length || tabs.active()?.tabId === stack[0].tabId) return;
    const id = stack[0].nodeId;
    if (!backTo(0)) {
      closeAll();
      say(`the layers inside ${id} did not build, so they were not written`);
    }
  });

  return { open: openLevel, back, current, depth: () => stack.length, onChange: (cb) => listeners.push(cb),
    problems: (spec) => layerProblems(spec, types) };
}

/** A layer type's tooltip in the palette: what it does, then each param with its description. */
function layerTitle(d) {
  const params = (d.params || []).map((p) => `${p.name}${p.required ? " (required)" : ""}: ${p.description || p.type}`);
  return [d.description || d.type, ...params].join("\n");
}
