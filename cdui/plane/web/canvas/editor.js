// The graph editor of the canvas page: CodefyUI graph JSON in and out, drawn and
// edited with litegraph.js (web/vendor/litegraph, loaded by canvas.html as a
// classic script that sets window.LiteGraph).
//
// The graph JSON is the truth: every node and edge keeps the object it was loaded
// from, and toJSON() writes it back with only what the user changed (position,
// params, new or removed nodes and edges), so a load with no edit gives the same
// JSON key for key. Litegraph holds the drawing; each node carries its graph id
// (`cd.id`), each link its edge record.
import { layeredLayout } from "./layout.js";

const LG = window.LiteGraph;
if (!LG) throw new Error("litegraph.js is not loaded: canvas.html must load /web/vendor/litegraph/litegraph.core.js before the canvas modules");
const { LGraph, LGraphCanvas, LGraphNode } = LG;

export const TRIGGER = "TRIGGER";
const ANY = "ANY";
const TRIGGER_IN = "__trigger"; // the name of every node's trigger input slot (shown as "trigger")
const UNDO_DEPTH = 100;
const STATUS_COLORS = { running: "#e0a800", done: "#2e9d4f", cached: "#3a7bd5", failed: "#d64545", stopped: "#888" };

/** The port rule of cdui/graph/validate.py is_compatible: equal types, anything into ANY,
 *  ANY into anything, IMAGE into TENSOR; TRIGGER only with TRIGGER. */
export function isCompatible(source, target) {
  const s = source || ANY;
  const t = target || ANY;
  if (s === TRIGGER || t === TRIGGER) return s === t;
  if (s === t || s === ANY || t === ANY) return true;
  return s === "IMAGE" && t === "TENSOR";
}

// Litegraph asks this whenever it highlights or makes a connection: the same rule everywhere.
LG.isValidConnection = (a, b) => isCompatible(a === "*" || a === "" || a === 0 ? ANY : a,
  b === "*" || b === "" || b === 0 ? ANY : b);
LG.release_link_on_empty_shows_menu = false;
LG.middle_click_slot_add_default_node = false;
LGraphCanvas.link_type_colors[TRIGGER] = "#f0a030";

// A refused connection is reported to the editor that owns the graph (for the tooltip).
const baseConnect = LGraphNode.prototype.connect;
LGraphNode.prototype.connect = function connect(slot, target, targetSlot) {
  const ed = this.graph && this.graph.cdEditor;
  if (ed && target && typeof target === "object") {
    const si = typeof slot === "string" ? this.findOutputSlot(slot) : slot;
    const ti = typeof targetSlot === "string" ? target.findInputSlot(targetSlot) : (targetSlot || 0);
    const out = this.outputs && this.outputs[si];
    const inp = target.inputs && target.inputs[ti];
    if (out && inp && !isCompatible(out.type, inp.type)) {
      ed._refused(this, out, target, inp);
      return null;
    }
  }
  return baseConnect.call(this, slot, target, targetSlot);
};

// Trigger edges are dashed, data edges solid.
const baseRenderLink = LGraphCanvas.prototype.renderLink;
LGraphCanvas.prototype.renderLink = function renderLink(ctx, a, b, link, ...rest) {
  const dashed = link && link.type === TRIGGER;
  if (dashed) ctx.setLineDash([7, 5]);
  try {
    return baseRenderLink.call(this, ctx, a, b, link, ...rest);
  } finally {
    if (dashed) ctx.setLineDash([]);
  }
};

// Copy/paste between every editor of the page (one per tab).
let clipboard = null;

const clone = (v) => (v === undefined ? undefined : JSON.parse(JSON.stringify(v)));
const isEditable = (el) => !!el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
const finite = (v) => typeof v === "number" && Number.isFinite(v);

/** Node type -> declaration: the catalog's nodes, and its presets (GET /api/presets, when the
 *  caller put them in as `catalog.presets`) as types "preset:NAME" with their exposed ports. */
function catalogMap(catalog) {
  const list = Array.isArray(catalog) ? catalog : (catalog && catalog.nodes) || [];
  const map = new Map(list.map((d) => [d.type, d]));
  for (const p of (catalog && !Array.isArray(catalog) && catalog.presets) || []) {
    map.set(`preset:${p.name}`, { type: `preset:${p.name}`, category: "Presets", description: p.description || "",
      inputs: (p.inputs || []).map((i) => ({ ...i, optional: false })), outputs: p.outputs || [], params: [], preset: true });
  }
  return map;
}

export class Editor {
  constructor(container, catalog) {
    if (!(container instanceof HTMLElement)) throw new Error("Editor needs an HTMLElement to draw in");
    this.container = container;
    this.catalog = catalogMap(catalog);
    this._listeners = { change: [], select: [], open: [] };
    this._undo = [];
    this._redo = [];
    this._status = new Map();
    this._badges = [];
    this._edges = [];
    this._top = {};
    this._loadedIds = new Set();
    this._lastSel = "";
    this._seq = 0;
    this._pointer = null;

    const wrap = document.createElement("div");
    wrap.className = "cd-editor";
    const canvasEl = document.createElement("canvas");
    canvasEl.className = "cd-canvas";
    canvasEl.setAttribute("aria-label", "graph canvas");
    const tip = document.createElement("div");
    tip.className = "cd-tip";
    tip.hidden = true;
    tip.setAttribute("role", "tooltip");
    wrap.append(canvasEl, tip);
    container.append(wrap);
    this.wrap = wrap;
    this.el = canvasEl;
    this.tip = tip;

    this.graph = new LGraph();
    this.graph.cdEditor = this;
    // The editor runs its own drawing loop (below) instead of litegraph's, so that it can be stopped
    // for a tab that is not shown and while the page is hidden, and started again without doubling.
    this.canvas = new LGraphCanvas(canvasEl, this.graph, { skip_render: true });
    this._raf = 0;
    this._drawing = false;
    this._frame = () => {
      this._raf = 0;
      if (!this._drawing) return;
      this.canvas.draw();
      this._raf = requestAnimationFrame(this._frame);
    };
    const c = this.canvas;
    c.allow_searchbox = false; // the page's own quick search opens on double-click instead
    c.render_canvas_border = false;
    c.render_shadows = false; // shadows cost a third of a redraw in software rendering
    c.render_connections_arrows = true;
    c.show_info = false;
    c.align_to_grid = true;
    c.processContextMenu = () => {}; // no litegraph menus: their actions bypass the graph JSON
    c.showLinkMenu = () => false;
    // A double-click on a node opens the page's own panels (the config panel follows the selection,
    // "open" the Inspector): litegraph's Properties dialog would edit the node behind the graph JSON.
    c.onShowNodePanel = () => {};
    c.onSelectionChange = () => this._selectionChanged();
    c.onNodeSelected = () => this._selectionChanged();
    c.onNodeDeselected = () => this._selectionChanged();

    this._resize = new ResizeObserver(() => this._fitCanvas());
    this._resize.observe(wrap);
    this._fitCanvas();
    this.setDrawing(true);

    // An edit by mouse ends with a pointerup (litegraph's own handler runs first; then the
    // graph JSON is compared with the last one). Only gestures that began on this editor count.
    this._onPointerUp = () => {
      if (!this._armed) return;
      this._armed = false;
      setTimeout(() => this._commit(), 0);
    };
    this._onPointerMove = (e) => {
      this._pointer = [e.clientX, e.clientY]; // where Ctrl+V pastes
      this._hover(e);
    };
    this._onPointerDown = (e) => {
      this._pointer = [e.clientX, e.clientY];
      this._armed = true;
      this._hideTip();
      if (document.activeElement !== canvasEl) canvasEl.focus({ preventScroll: true });
    };
    document.addEventListener("pointerup", this._onPointerUp, true);
    wrap.addEventListener("pointerdown", this._onPointerDown, true);
    wrap.addEventListener("pointermove", this._onPointerMove);
    wrap.addEventListener("pointerleave", () => { if (!this._tipSticky) this._hideTip(); });
    wrap.addEventListener("keydown", (e) => this._key(e), true);
    wrap.addEventListener("dblclick", (e) => this._dblclick(e));
    wrap.addEventListener("dragover", (e) => {
      if ([...e.dataTransfer.types].includes("application/x-cdui-node")) e.preventDefault();
    }, true);
    wrap.addEventListener("drop", (e) => {
      const type = e.dataTransfer.getData("application/x-cdui-node");
      if (!type) return;
      e.preventDefault();
      e.stopPropagation();
      this.addNode(type, this.clientToGraph(e.clientX, e.clientY));
    }, true);
    this._last = JSON.stringify(this.toJSON());
  }

  // ---- events ---------------------------------------------------------
  on(event, cb) {
    if (!this._listeners[event]) throw new Error(`Editor.on: unknown event ${JSON.stringify(event)}; use "change", "select" or "open"`);
    this._listeners[event].push(cb);
    return () => { this._listeners[event] = this._listeners[event].filter((f) => f !== cb); };
  }

  _emit(event, arg) {
    for (const cb of this._listeners[event]) {
      try {
        cb(arg);
      } catch (err) {
        setTimeout(() => { throw err; });
      }
    }
  }

  // ---- graph in and out --------------------------------------------------
  load(graph) {
    this._build(graph, true);
    this._undo = [];
    this._redo = [];
    this._last = JSON.stringify(this.toJSON());
    this._selectionChanged();
  }

  _build(graph, fitAfter) {
    if (!graph || typeof graph !== "object" || Array.isArray(graph)) {
      throw new Error(`a graph must be a JSON object with "nodes" and "edges", got ${Array.isArray(graph) ? "a list" : JSON.stringify(graph)}`);
    }
    if (graph.nodes !== undefined && !Array.isArray(graph.nodes)) throw new Error(`the graph's "nodes" must be a list, got ${JSON.stringify(graph.nodes).slice(0, 80)}`);
    if (graph.edges !== undefined && !Array.isArray(graph.edges)) throw new Error(`the graph's "edges" must be a list, got ${JSON.stringify(graph.edges).slice(0, 80)}`);
    const g = clone(graph);
    this._loading = true;
    try {
      this.graph.clear();
      this.canvas.deselectAllNodes();
      this._top = g;
      this._edges = [];
      this._loadedIds = new Set();
      const nodes = g.nodes || [];
      let positioned = 0;
      for (const raw of nodes) {
        if (!raw || typeof raw !== "object" || typeof raw.id !== "string" && typeof raw.id !== "number") {
          throw new Error(`every node needs an "id": got ${JSON.stringify(raw).slice(0, 120)}`);
        }
        const p = raw.position;
        const has = p && finite(p.x) && finite(p.y);
        if (has) positioned++;
        this._addLNode(raw, has ? [p.x, p.y] : [0, 0]);
        this._loadedIds.add(String(raw.id));
      }
      for (const raw of g.edges || []) this._edges.push(this._linkEdge(raw));
      if (nodes.length && !positioned) this._applyLayout();
    } finally {
      this._loading = false;
    }
    this.graph.setDirtyCanvas(true, true);
    if (fitAfter) requestAnimationFrame(() => this.fit());
  }

  _byId(id) {
    return this.graph._nodes.find((n) => n.cd.id === String(id)) || null;
  }

  _addLNode(raw, pos) {
    const def = this.catalog.get(raw.type);
    const n = new LGraphNode(String(raw.type ?? "?"));
    n.type = raw.type;
    // seq: the node's place in the graph JSON. Litegraph reorders its own list to draw a clicked
    // node on top, which must not reorder the JSON (nor count as an edit).
    n.cd = { id: String(raw.id), raw, pos: raw.position ? [raw.position.x, raw.position.y] : null, seq: ++this._seq };
    const data = raw.data && typeof raw.data === "object" ? raw.data : {};
    n.cd.params = data.params && typeof data.params === "object" ? data.params : undefined;
    if (raw.type === "note") {
      n.title = "note";
      n.color = "#6b5d1f";
      n.bgcolor = "#4a4225";
      n.cd.note = String(data.noteContent || "");
    } else if (def) {
      if (raw.type !== "Start") n.addInput(TRIGGER_IN, TRIGGER, { label: "trigger", cdTrigger: true });
      for (const p of def.inputs) n.addInput(p.name, p.type, { label: p.name + (p.optional ? "?" : "") });
      for (const p of def.outputs) n.addOutput(p.name, p.type);
      if (def.available === false) n.color = "#6a3b3b";
    } else {
      n.cd.unknown = true;
      n.color = "#5a2a2a";
      n.bgcolor = "#3b2626";
      n.addInput(TRIGGER_IN, TRIGGER, { label: "trigger", cdTrigger: true });
    }
    n.size = n.computeSize();
    if (n.cd.note !== undefined) n.size = [220, 60];
    n.pos = pos;
    n.onDrawForeground = (ctx) => this._drawNode(n, ctx);
    this.graph.add(n, true);
    return n;
  }

  _linkEdge(raw) {
    const rec = { raw, link: null };
    if (!raw || typeof raw !== "object") return rec;
    const src = this._byId(raw.source);
    const dst = this._byId(raw.target);
    if (!src || !dst) return rec;
    const trigger = raw.type === "trigger" || (raw.sourceHandle === "trigger" && raw.type !== "data");
    let si;
    let ti;
    if (trigger) {
      si = src.findOutputSlot("trigger");
      if (si === -1 && src.cd.unknown) si = src.addOutput("trigger", TRIGGER) && src.outputs.length - 1;
      ti = dst.findInputSlot(TRIGGER_IN);
    } else {
      const sh = raw.sourceHandle == null ? "" : String(raw.sourceHandle);
      const th = raw.targetHandle == null ? "" : String(raw.targetHandle);
      si = src.findOutputSlot(sh);
      if (si === -1 && src.cd.unknown && sh) {
        src.addOutput(sh, ANY);
        si = src.outputs.length - 1;
      }
      ti = dst.findInputSlot(th);
      if (ti === -1 && dst.cd.unknown && th) {
        dst.addInput(th, ANY);
        ti = dst.inputs.length - 1;
      }
    }
    if (si == null || si < 0 || ti < 0 || dst.inputs[ti].link != null) return rec; // kept as written, not drawn
    src.size = src.computeSize();
    dst.size = dst.computeSize();
    const link = src.connect(si, dst, ti);
    if (link) {
      rec.link = link.id;
      link.cdEdge = rec;
    }
    return rec;
  }

  /** The edge records, in order, made to match the drawn links (new links become new edges). */
  _syncEdges() {
    const links = this.graph.links || {};
    const present = new Set(this.graph._nodes.map((n) => n.cd.id));
    const kept = this._edges.filter((r) => {
      if (r.link != null) return !!links[r.link] && links[r.link].cdEdge === r;
      const raw = r.raw || {};
      const gone = (id) => this._loadedIds.has(String(id)) && !present.has(String(id));
      return !gone(raw.source) && !gone(raw.target);
    });
    const claimed = new Set(kept.filter((r) => r.link != null).map((r) => r.link));
    const used = new Set(kept.map((r) => r.raw && r.raw.id));
    for (const key of Object.keys(links)) {
      const l = links[key];
      if (!l || claimed.has(l.id)) continue;
      const src = this.graph.getNodeById(l.origin_id);
      const dst = this.graph.getNodeById(l.target_id);
      if (!src || !dst) continue;
      const trigger = l.type === TRIGGER;
      const sh = trigger ? "trigger" : src.outputs[l.origin_slot].name;
      const th = trigger ? null : dst.inputs[l.target_slot].name;
      let id = `${src.cd.id}-${sh}-${dst.cd.id}-${th ?? "trigger"}`;
      for (let k = 2; used.has(id); k++) id = `${src.cd.id}-${sh}-${dst.cd.id}-${th ?? "trigger"}-${k}`;
      used.add(id);
      const rec = { raw: { id, source: src.cd.id, target: dst.cd.id, sourceHandle: sh, targetHandle: th, type: trigger ? "trigger" : "data" }, link: l.id };
      l.cdEdge = rec;
      kept.push(rec);
    }
    this._edges = kept;
    return kept;
  }

  toJSON() {
    const nodes = this._nodesInOrder().map((n) => this._nodeJSON(n));
    const edges = this._syncEdges().map((r) => clone(r.raw));
    const out = {};
    for (const [k, v] of Object.entries(this._top)) {
      if (k === "nodes") out.nodes = nodes;
      else if (k === "edges") out.edges = edges;
      else out[k] = clone(v);
    }
    if (!("nodes" in out)) out.nodes = nodes;
    if (!("edges" in out)) out.edges = edges;
    return out;
  }

  _nodesInOrder() {
    return this.graph._nodes.slice().sort((a, b) => a.cd.seq - b.cd.seq);
  }

  _nodeJSON(n) {
    const raw = clone(n.cd.raw);
    const orig = n.cd.pos;
    // Litegraph keeps positions as 32-bit floats: an unmoved node writes back its own numbers.
    const moved = !orig || Math.fround(orig[0]) !== n.pos[0] || Math.fround(orig[1]) !== n.pos[1];
    const position = moved ? { x: Math.round(n.pos[0]), y: Math.round(n.pos[1]) } : { x: orig[0], y: orig[1] };
    if (raw.position && typeof raw.position === "object") Object.assign(raw.position, position);
    else raw.position = position;
    if (n.cd.params !== undefined) {
      if (!raw.data || typeof raw.data !== "object") raw.data = {};
      raw.data.params = clone(n.cd.params);
    }
    return raw;
  }

  // ---- reading and editing ---------------------------------------------
  selection() {
    return Object.values(this.canvas.selected_nodes || {}).map((n) => n.cd.id);
  }

  node(id) {
    const n = this._byId(id);
    if (!n) return null;
    return { id: n.cd.id, type: n.cd.raw.type, params: clone(n.cd.params || {}),
      position: { x: n.pos[0], y: n.pos[1] } };
  }

  setParam(nodeId, name, value) {
    const n = this._byId(nodeId);
    if (!n) throw new Error(`setParam: no node ${JSON.stringify(nodeId)} in this graph`);
    this._commit(); // a mouse edit not yet recorded is its own step, before this one
    if (n.cd.params === undefined) n.cd.params = {};
    if (value === undefined) delete n.cd.params[name];
    else n.cd.params[name] = clone(value);
    this._commit();
  }

  /** A field of a node's `data` besides its params (a preset node's internalParams), as the graph
   *  holds it; undefined when it has none. */
  nodeData(nodeId, name) {
    const n = this._byId(nodeId);
    const data = n && n.cd.raw.data;
    return data && typeof data === "object" ? clone(data[name]) : undefined;
  }

  /** Sets one field of a node's `data` besides params (undefined removes it): an edit, undoable. */
  setNodeData(nodeId, name, value) {
    const n = this._byId(nodeId);
    if (!n) throw new Error(`setNodeData: no node ${JSON.stringify(nodeId)} in this graph`);
    if (name === "params") throw new Error("setNodeData: a node's params change with setParam");
    this._commit();
    if (!n.cd.raw.data || typeof n.cd.raw.data !== "object") n.cd.raw.data = {};
    if (value === undefined) delete n.cd.raw.data[name];
    else n.cd.raw.data[name] = clone(value);
    this._commit();
  }

  /** Adds a node of a catalog type (or "preset:NAME") at graph coordinates; returns its id. */
  addNode(type, pos) {
    this._commit();
    const def = this.catalog.get(type);
    const params = {};
    if (def) for (const p of def.params || []) if (p.default !== undefined && p.default !== null) params[p.name] = clone(p.default);
    const base = String(type).replace(/^preset:/, "").replace(/[^A-Za-z0-9]+/g, "-").toLowerCase() || "node";
    const taken = new Set(this.graph._nodes.map((n) => n.cd.id));
    let id = base;
    for (let k = 2; taken.has(id); k++) id = `${base}-${k}`;
    const at = pos || this._viewCenter();
    const snap = (v) => Math.round(v / LG.CANVAS_GRID_SIZE) * LG.CANVAS_GRID_SIZE;
    const raw = { id, type, position: { x: snap(at.x), y: snap(at.y) }, data: { params } };
    const n = this._addLNode(raw, [raw.position.x, raw.position.y]);
    n.cd.pos = null;
    this.canvas.selectNodes([n]);
    this._commit();
    return id;
  }

  deleteSelection() {
    const sel = Object.values(this.canvas.selected_nodes || {});
    if (!sel.length) return;
    this._commit();
    for (const n of sel) this.graph.remove(n);
    this.canvas.deselectAllNodes();
    this._commit();
  }

  selectAll() {
    this.canvas.selectNodes(this.graph._nodes.slice());
  }

  select(ids) {
    const ns = ids.map((id) => this._byId(id)).filter(Boolean);
    this.canvas.deselectAllNodes();
    if (ns.length) this.canvas.selectNodes(ns);
  }

  copy() {
    const sel = new Set(this.selection());
    if (!sel.size) return 0;
    const g = this.toJSON();
    clipboard = {
      nodes: g.nodes.filter((n) => sel.has(String(n.id))),
      edges: g.edges.filter((e) => sel.has(String(e.source)) && sel.has(String(e.target))),
    };
    return sel.size;
  }

  paste() {
    if (!clipboard || !clipboard.nodes.length) return [];
    this._commit();
    const taken = new Set(this.graph._nodes.map((n) => n.cd.id));
    const rename = new Map();
    for (const n of clipboard.nodes) {
      const base = String(n.id).replace(/-copy(-\d+)?$/, "");
      let id = `${base}-copy`;
      for (let k = 2; taken.has(id); k++) id = `${base}-copy-${k}`;
      taken.add(id);
      rename.set(String(n.id), id);
    }
    const xs = clipboard.nodes.map((n) => (n.position && finite(n.position.x) ? n.position.x : 0));
    const ys = clipboard.nodes.map((n) => (n.position && finite(n.position.y) ? n.position.y : 0));
    const target = this._pointer ? this.clientToGraph(this._pointer[0], this._pointer[1]) : null;
    const dx = target ? target.x - Math.min(...xs) : 40;
    const dy = target ? target.y - Math.min(...ys) : 40;
    const added = [];
    for (const n of clipboard.nodes) {
      const raw = clone(n);
      raw.id = rename.get(String(n.id));
      raw.position = { x: Math.round(((n.position && n.position.x) || 0) + dx), y: Math.round(((n.position && n.position.y) || 0) + dy) };
      const ln = this._addLNode(raw, [raw.position.x, raw.position.y]);
      ln.cd.pos = null;
      added.push(ln);
    }
    const used = new Set(this._syncEdges().map((r) => r.raw && r.raw.id));
    for (const e of clipboard.edges) {
      const raw = clone(e);
      raw.source = rename.get(String(e.source));
      raw.target = rename.get(String(e.target));
      let id = `${e.id}-copy`;
      for (let k = 2; used.has(id); k++) id = `${e.id}-copy-${k}`;
      used.add(id);
      raw.id = id;
      this._edges.push(this._linkEdge(raw));
    }
    this.canvas.deselectAllNodes();
    this.canvas.selectNodes(added);
    this._commit();
    return added.map((n) => n.cd.id);
  }

  // ---- undo ------------------------------------------------------------
  // A mouse gesture is recorded a task after its pointerup (litegraph finishes it first), and a busy
  // browser runs input before timers: a key pressed meanwhile (Delete, Ctrl+Z) would otherwise record
  // its edit on top of the state before the gesture, and undo would lose the gesture. So every edit
  // first records whatever changed since the last one, as its own step.
  /** Records an edit when the graph JSON changed since the last one; fires "change". */
  _commit() {
    const now = JSON.stringify(this.toJSON());
    if (now === this._last) return false;
    this._undo.push(this._last);
    if (this._undo.length > UNDO_DEPTH) this._undo.shift();
    this._redo = [];
    this._last = now;
    this._emit("change");
    return true;
  }

  _restore(json) {
    const keep = { scale: this.canvas.ds.scale, offset: [...this.canvas.ds.offset] };
    const sel = this.selection();
    this._build(JSON.parse(json), false);
    this.canvas.ds.scale = keep.scale;
    this.canvas.ds.offset = keep.offset;
    this.select(sel.filter((id) => this._byId(id)));
    this._last = json;
    this.graph.setDirtyCanvas(true, true);
    this._emit("change");
  }

  undo() {
    this._commit();
    if (!this._undo.length) return false;
    this._redo.push(this._last);
    this._restore(this._undo.pop());
    return true;
  }

  redo() {
    this._commit(); // an edit not yet recorded ends what there was to redo
    if (!this._redo.length) return false;
    this._undo.push(this._last);
    this._restore(this._redo.pop());
    return true;
  }

  canUndo() { return this._undo.length > 0; }
  canRedo() { return this._redo.length > 0; }

  // ---- view ------------------------------------------------------------
  _fitCanvas() {
    const r = this.wrap.getBoundingClientRect();
    const w = Math.max(1, Math.floor(r.width));
    const h = Math.max(1, Math.floor(r.height));
    if (this.el.width !== w || this.el.height !== h) this.canvas.resize(w, h);
  }

  fit() {
    this._fitCanvas();
    const ns = this.graph._nodes;
    const ds = this.canvas.ds;
    if (!ns.length) {
      ds.scale = 1;
      ds.offset = [0, 0];
      this.graph.setDirtyCanvas(true, true);
      return;
    }
    const T = LG.NODE_TITLE_HEIGHT;
    let x0 = Infinity; let y0 = Infinity; let x1 = -Infinity; let y1 = -Infinity;
    for (const n of ns) {
      x0 = Math.min(x0, n.pos[0]);
      y0 = Math.min(y0, n.pos[1] - T);
      x1 = Math.max(x1, n.pos[0] + n.size[0]);
      y1 = Math.max(y1, n.pos[1] + n.size[1]);
    }
    const W = this.el.width;
    const H = this.el.height;
    const m = 40;
    const scale = Math.max(0.1, Math.min(1.5, Math.min((W - 2 * m) / Math.max(1, x1 - x0), (H - 2 * m) / Math.max(1, y1 - y0))));
    ds.scale = scale;
    ds.offset = [W / 2 / scale - (x0 + x1) / 2, H / 2 / scale - (y0 + y1) / 2];
    this.graph.setDirtyCanvas(true, true);
  }

  _applyLayout() {
    const T = LG.NODE_TITLE_HEIGHT;
    const nodes = this._nodesInOrder().map((n) => ({ id: n.cd.id, w: n.size[0], h: n.size[1] + T }));
    const edges = this._syncEdges().map((r) => r.raw || {}).filter((e) => e.source != null && e.target != null)
      .map((e) => ({ source: String(e.source), target: String(e.target) }));
    const pos = layeredLayout(nodes, edges);
    for (const n of this.graph._nodes) {
      const p = pos.get(n.cd.id);
      if (p) n.pos = [p.x, p.y + T];
    }
  }

  /** Auto layout (layered, left to right) of the whole graph: an edit, undoable. */
  layout() {
    this._commit();
    this._applyLayout();
    this._commit();
    this.fit();
  }

  _viewCenter() {
    const ds = this.canvas.ds;
    return { x: this.el.width / 2 / ds.scale - ds.offset[0] - 80, y: this.el.height / 2 / ds.scale - ds.offset[1] - 30 };
  }

  /** Page (client) coordinates to graph coordinates. */
  clientToGraph(clientX, clientY) {
    const r = this.el.getBoundingClientRect();
    const p = this.canvas.ds.convertCanvasToOffset([clientX - r.left, clientY - r.top]);
    return { x: p[0], y: p[1] };
  }

  /** Graph coordinates to page (client) coordinates. */
  graphToClient(x, y) {
    const r = this.el.getBoundingClientRect();
    const p = this.canvas.ds.convertOffsetToCanvas([x, y]);
    return { x: r.left + p[0], y: r.top + p[1] };
  }

  /** Where on the page a node's port is: side "input"|"output", name as in the catalog
   *  ("trigger" is the trigger port on either side). For tests and tools. */
  portClientPos(nodeId, side, name) {
    const n = this._byId(nodeId);
    if (!n) return null;
    const input = side === "input";
    const slot = input ? n.findInputSlot(name === "trigger" ? TRIGGER_IN : name) : n.findOutputSlot(name);
    if (slot < 0) return null;
    const p = n.getConnectionPos(input, slot);
    return this.graphToClient(p[0], p[1]);
  }

  /** Where on the page a node's title bar is (to click or drag it). */
  nodeClientPos(nodeId) {
    const n = this._byId(nodeId);
    if (!n) return null;
    return this.graphToClient(n.pos[0] + Math.min(60, n.size[0] / 2), n.pos[1] - LG.NODE_TITLE_HEIGHT / 2);
  }

  setSnap(on) { this.canvas.align_to_grid = !!on; }
  snap() { return !!this.canvas.align_to_grid; }

  // ---- statuses and badges (not edits) ------------------------------------
  setNodeStatus(nodeId, status, info) {
    if (status == null) this._status.delete(String(nodeId));
    else this._status.set(String(nodeId), { status, info: info || {} });
    this.graph.setDirtyCanvas(true, false);
  }

  clearStatuses() {
    this._status.clear();
    this.graph.setDirtyCanvas(true, false);
  }

  setBadges(list) {
    this._badges = Array.isArray(list) ? list.map((b) => ({ node_id: b.node_id == null ? null : String(b.node_id),
      edge_id: b.edge_id == null ? null : String(b.edge_id), message: String(b.message || "") })) : [];
    this.graph.setDirtyCanvas(true, false);
  }

  /** Badges on a node, and node statuses, for tests: what is drawn. */
  marks(nodeId) {
    const id = String(nodeId);
    return { status: (this._status.get(id) || {}).status || null,
      badges: this._badges.filter((b) => b.node_id === id).map((b) => b.message) };
  }

  _drawNode(n, ctx) {
    const T = LG.NODE_TITLE_HEIGHT;
    if (n.cd.note !== undefined) {
      ctx.fillStyle = "#e8dca0";
      ctx.font = "12px sans-serif";
      const words = n.cd.note.split(/\s+/);
      let line = "";
      let y = 16;
      for (const w of words) {
        if (ctx.measureText(line + w).width > n.size[0] - 12 && line) {
          ctx.fillText(line, 6, y);
          line = "";
          y += 14;
          if (y > n.size[1] - 4) break;
        }
        line += w + " ";
      }
      if (y <= n.size[1] - 4) ctx.fillText(line, 6, y);
    }
    if (n.cd.unknown) {
      ctx.fillStyle = "#ff9a9a";
      ctx.font = "11px sans-serif";
      ctx.fillText("unknown type", 6, n.size[1] - 6);
    }
    const st = this._status.get(n.cd.id);
    if (st) {
      const color = STATUS_COLORS[st.status] || "#888";
      ctx.fillStyle = color;
      ctx.fillRect(0, -T, n.size[0], 3);
      const secs = st.info && finite(st.info.seconds) ? ` ${st.info.seconds.toFixed(st.info.seconds < 10 ? 2 : 1)}s` : "";
      ctx.font = "11px sans-serif";
      const text = st.status + secs;
      ctx.textAlign = "right";
      ctx.fillText(text, n.size[0] - 6, -T + 14 + (n.size[0] > 140 ? 0 : T));
      ctx.textAlign = "left";
      n.boxcolor = color;
    } else {
      n.boxcolor = null;
    }
    if (this._badges.some((b) => b.node_id === n.cd.id)) {
      ctx.fillStyle = "#d64545";
      ctx.beginPath();
      ctx.arc(n.size[0] - 2, -T - 2, 8, 0, Math.PI * 2);
      ctx.fill();
      ctx.fillStyle = "#fff";
      ctx.font = "bold 12px sans-serif";
      ctx.textAlign = "center";
      ctx.fillText("!", n.size[0] - 2, -T + 2);
      ctx.textAlign = "left";
    }
  }

  _edgeBadgePos(b) {
    const rec = this._edges.find((r) => r.raw && String(r.raw.id) === b.edge_id);
    const l = rec && rec.link != null && this.graph.links[rec.link];
    return l && l._pos ? [l._pos[0], l._pos[1]] : null;
  }

  _hover(e) {
    if (this._tipSticky) return;
    if (!this._badges.length) return;
    const p = this.clientToGraph(e.clientX, e.clientY);
    const n = this.graph.getNodeOnPos(p.x, p.y, this.graph._nodes, 4);
    let msgs = n ? this._badges.filter((b) => b.node_id === n.cd.id).map((b) => b.message) : [];
    if (!msgs.length) {
      const near = 10 / this.canvas.ds.scale;
      msgs = this._badges.filter((b) => b.edge_id).filter((b) => {
        const c = this._edgeBadgePos(b);
        return c && Math.abs(c[0] - p.x) < near && Math.abs(c[1] - p.y) < near;
      }).map((b) => b.message);
    }
    if (msgs.length) this._showTip(msgs.join("\n"), e.clientX, e.clientY, "badge");
    else this._hideTip();
  }

  _showTip(text, clientX, clientY, kind) {
    const r = this.wrap.getBoundingClientRect();
    this.tip.textContent = text;
    this.tip.dataset.kind = kind;
    this.tip.style.left = `${Math.max(0, clientX - r.left + 12)}px`;
    this.tip.style.top = `${Math.max(0, clientY - r.top + 12)}px`;
    this.tip.hidden = false;
  }

  _hideTip() {
    this._tipSticky = false;
    clearTimeout(this._tipTimer);
    this.tip.hidden = true;
  }

  _refused(src, out, dst, inp) {
    if (this._loading) return;
    const name = (s) => (s.cdTrigger ? "trigger" : s.name);
    const text = `Cannot connect ${src.cd.id}.${name(out)} (${out.type}) to ${dst.cd.id}.${name(inp)} (${inp.type}): ` +
      `${out.type} does not fit ${inp.type}`;
    const at = this._pointer || [0, 0];
    const p = this.canvas.last_mouse ? this.canvas.last_mouse : null;
    const r = this.el.getBoundingClientRect();
    this._showTip(text, p ? r.left + p[0] : at[0], p ? r.top + p[1] : at[1], "refused");
    this._tipSticky = true;
    clearTimeout(this._tipTimer);
    this._tipTimer = setTimeout(() => this._hideTip(), 8000);
  }

  // ---- input -----------------------------------------------------------
  _selectionChanged() {
    const ids = this.selection();
    const key = ids.join("\u0000");
    if (key === this._lastSel) return;
    this._lastSel = key;
    this._emit("select", ids);
  }

  _dblclick(e) {
    const p = this.clientToGraph(e.clientX, e.clientY);
    const n = this.graph.getNodeOnPos(p.x, p.y, this.graph._nodes, 4);
    if (n) {
      this._emit("open", n.cd.id);
      return;
    }
    this.wrap.dispatchEvent(new CustomEvent("cd-quicksearch", { bubbles: true,
      detail: { editor: this, clientX: e.clientX, clientY: e.clientY, at: p } }));
  }

  _key(e) {
    if (isEditable(e.target)) return;
    const ctrl = e.ctrlKey || e.metaKey;
    const k = e.key.length === 1 ? e.key.toLowerCase() : e.key;
    let done = true;
    if ((k === "Delete" || k === "Backspace") && !ctrl) this.deleteSelection();
    else if (ctrl && !e.shiftKey && k === "z") this.undo();
    else if (ctrl && (k === "y" || (e.shiftKey && k === "z"))) this.redo();
    else if (ctrl && k === "c") this.copy();
    else if (ctrl && k === "v") this.paste();
    else if (ctrl && k === "a") this.selectAll();
    else if (!ctrl && !e.altKey && e.shiftKey && k === "l") this.layout();
    else if (!ctrl && !e.altKey && !e.shiftKey && k === "f") this.fit();
    else if (!ctrl && k === "Enter" && this.selection().length === 1) this._emit("open", this.selection()[0]);
    else done = false;
    if (done) {
      e.preventDefault();
      e.stopPropagation();
    }
  }

  focus() { this.el.focus({ preventScroll: true }); }

  /**
   * Draws on every animation frame (on) or not at all (off): the tabs turn it off for a tab that is
   * not shown and while the page is hidden. Turning it on redraws everything at the next frame, so
   * statuses set meanwhile appear.
   */
  setDrawing(on) {
    on = !!on;
    if (on === this._drawing) return;
    this._drawing = on;
    if (on) {
      this._fitCanvas();
      this.graph.setDirtyCanvas(true, true);
      if (!this._raf) this._raf = requestAnimationFrame(this._frame);
    } else if (this._raf) {
      cancelAnimationFrame(this._raf);
      this._raf = 0;
    }
  }

  /** Whether the editor is drawing, and how many times it has drawn (for tests: counts, not timings). */
  drawing() { return { on: this._drawing, frames: this.canvas.frame }; }

  destroy() {
    document.removeEventListener("pointerup", this._onPointerUp, true);
    this._resize.disconnect();
    this.setDrawing(false);
    this.canvas.unbindEvents();
    this.canvas.graph = null;
    this.graph.cdEditor = null;
    clearTimeout(this._tipTimer);
    this.wrap.remove();
    this._listeners = { change: [], select: [], open: [] };
  }
}
