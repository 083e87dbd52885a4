// The run view's drawing of the graph: one box per node (placed by GET /api/runs/{id}/drawing),
// its status from the live node_status events, and for a node with recorded outputs a button
// (click or Enter) that shows the summary of each output: shape, dtype, min/max/mean, a thumbnail.
import { api, ApiError } from "./api.js";
import { $, fill, h, num } from "./dom.js";
import { artifactUrl, base64Image, imageButton, isImageArtifact } from "./images.js";

const NS = "http://www.w3.org/2000/svg";
const BOX_W = 150, BOX_H = 40, PAD = 12;
const view = { runId: null, drawing: null, boxes: new Map(), recorded: new Set(), statuses: new Map(), shown: null };

function svg(tag, attrs, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v != null) el.setAttribute(k, String(v));
  for (const c of children) el.append(c);
  return el;
}

/** Forget the last run's drawing and fetch this one's (null: no run selected). */
export async function showRun(runId) {
  Object.assign(view, { runId, drawing: null, boxes: new Map(), recorded: new Set(), statuses: new Map(), shown: null });
  fill($("graph"));
  fill($("node-output"));
  $("node-output").hidden = true;
  $("graph-wrap").hidden = true;
  if (!runId) return;
  let d;
  try {
    d = await api("GET", `/api/runs/${encodeURIComponent(runId)}/drawing`);
  } catch (err) {
    if (err instanceof ApiError) return; // the run went away; the detail pane says so
    throw err;
  }
  if (view.runId !== runId || !d.nodes.length) return;
  view.drawing = d;
  draw();
}

function draw() {
  const d = view.drawing;
  const xs = d.nodes.map((n) => n.x), ys = d.nodes.map((n) => n.y);
  const x0 = Math.min(...xs), y0 = Math.min(...ys);
  const W = Math.max(...xs) - x0 + BOX_W + 2 * PAD, H = Math.max(...ys) - y0 + BOX_H + 2 * PAD;
  const at = new Map(d.nodes.map((n) => [n.id, { x: n.x - x0 + PAD, y: n.y - y0 + PAD }]));
  const root = $("graph");
  root.setAttribute("viewBox", `0 0 ${W} ${H}`);
  root.style.maxHeight = `${Math.min(H, 420)}px`;
  const edges = d.edges.map((e) => {
    const a = at.get(e.source), b = at.get(e.target);
    return svg("line", { class: "g-edge", x1: a.x + BOX_W, y1: a.y + BOX_H / 2, x2: b.x, y2: b.y + BOX_H / 2 });
  });
  const boxes = d.nodes.map((n) => {
    const p = at.get(n.id);
    const label = svg("text", { x: p.x + 8, y: p.y + 16, class: "g-id" });
    label.textContent = n.id.length > 18 ? `${n.id.slice(0, 17)}…` : n.id;
    const type = svg("text", { x: p.x + 8, y: p.y + 32, class: "g-type" });
    type.textContent = n.type.length > 22 ? `${n.type.slice(0, 21)}…` : n.type;
    const title = svg("title");
    const g = svg("g", { class: "g-node status-none", "data-node": n.id },
      title, svg("rect", { x: p.x, y: p.y, width: BOX_W, height: BOX_H, rx: 6 }), label, type);
    g.addEventListener("click", () => { if (view.recorded.has(n.id)) showOutputs(n.id); });
    g.addEventListener("keydown", (e) => {
      if ((e.key === "Enter" || e.key === " ") && view.recorded.has(n.id)) { e.preventDefault(); showOutputs(n.id); }
    });
    view.boxes.set(n.id, { g, title, type: n.type });
    return g;
  });
  root.replaceChildren(...edges, ...boxes);
  $("graph-wrap").hidden = false;
  for (const id of view.boxes.keys()) paint(id);
}

/** A node's status, or for a preset's node the latest status of a node inside it (``<id>__<inner>``). */
function statusOf(id) {
  if (view.statuses.has(id)) return view.statuses.get(id);
  let last = null;
  for (const [k, s] of view.statuses) if (k.startsWith(`${id}__`)) last = s;
  return last;
}

function paint(id) {
  const box = view.boxes.get(id);
  if (!box) return;
  const status = statusOf(id) || "none";
  const recorded = view.recorded.has(id);
  box.g.setAttribute("class", `g-node status-${status.replace(/[^a-z_-]/gi, "")}${recorded ? " recorded" : ""}`);
  box.g.dataset.status = status;
  box.title.textContent = `${id} (${box.type}): ${status === "none" ? "not run yet" : status}` +
    (recorded ? " — press Enter to show its recorded outputs" : "");
  if (recorded) {
    box.g.setAttribute("tabindex", "0");
    box.g.setAttribute("role", "button");
    box.g.setAttribute("aria-label", `Show the recorded outputs of node ${id} (${status})`);
  } else {
    box.g.removeAttribute("tabindex");
    box.g.setAttribute("role", "img");
    box.g.setAttribute("aria-label", `Node ${id} (${box.type}): ${status === "none" ? "not run yet" : status}`);
  }
}

/** The node statuses from the live events (the run view's map of node id -> {status, ...}). */
export function setStatuses(nodes) {
  for (const [id, n] of nodes) view.statuses.set(id, n.status);
  if (!view.drawing) return;
  for (const id of view.boxes.keys()) paint(id);
}

/** Ask which nodes have recorded outputs (when the run ends, or on demand); errors go to ``onError``. */
export async function loadRecorded(run, onError) {
  if (!run || !run.options || !run.options.record_outputs || run.id !== view.runId) return;
  try {
    const list = await api("GET", `/api/runs/${encodeURIComponent(run.id)}/outputs`);
    if (run.id !== view.runId) return;
    view.recorded = new Set(list.nodes.map((n) => n.node_id));
    $("graph-note").textContent = list.nodes.length
      ? `${list.nodes.length} nodes have recorded outputs${list.worker ? ` on worker ${list.worker}` : ""}: click one, or focus it and press Enter.`
      : "No node outputs were recorded.";
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    $("graph-note").textContent = `Recorded outputs: ${err.message}`;
    if (err.status !== 504) onError(err);
  }
  for (const id of view.boxes.keys()) paint(id);
}

async function showOutputs(nodeId) {
  const runId = view.runId;
  const panel = $("node-output");
  panel.hidden = false;
  fill(panel, h("p", { class: "muted" }, `Loading the recorded outputs of ${nodeId}…`));
  let s;
  try {
    s = await api("GET", `/api/runs/${encodeURIComponent(runId)}/outputs/${encodeURIComponent(nodeId)}`);
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
    fill(panel, h("p", { class: "error-text" }, err.message), err.hint ? h("p", { class: "hint" }, err.hint) : null);
    return;
  }
  if (runId !== view.runId) return;
  view.shown = nodeId;
  // A plot node's `image` output is the base64 text of a PNG: its picture is the PNG file the node
  // kept as the run's artifact (named after the node), served by the control plane from its own copy.
  let pictures = [];
  if (s.outputs.some((o) => o.kind === "text" && base64Image(o.note))) {
    const arts = await api("GET", `/api/runs/${encodeURIComponent(runId)}/artifacts`).catch(() => []);
    if (runId !== view.runId) return;
    pictures = arts.filter((a) => isImageArtifact(a) && a.name.replace(/\.[^.]+$/, "") === nodeId);
  }
  fill(panel,
    h("h4", { id: "node-output-title" }, `Outputs of ${s.node_id}`, s.type ? h("span", { class: "small muted" }, ` ${s.type}`) : null),
    h("table", { class: "outputs-table", "aria-labelledby": "node-output-title" },
      h("thead", {}, h("tr", {}, ["Output", "Kind", "Shape", "dtype", "min", "max", "mean", ""].map((t) =>
        h("th", { scope: "col" }, t)))),
      h("tbody", {}, s.outputs.map((o) => h("tr", { dataset: { port: o.port } },
        h("td", { class: "mono" }, o.port), h("td", {}, o.kind),
        h("td", { class: "mono" }, o.shape ? `[${o.shape.join(", ")}]` : ""), h("td", { class: "mono" }, o.dtype || ""),
        h("td", {}, o.min != null ? num(o.min) : ""), h("td", {}, o.max != null ? num(o.max) : ""),
        h("td", {}, o.mean != null ? num(o.mean) : ""),
        h("td", {}, cell(runId, o, pictures)))))));
}

/** The last cell of an output's row: its thumbnail (click to enlarge), its picture for a base64
 *  image, else its note. */
function cell(runId, o, pictures) {
  if (o.thumbnail) {
    return imageButton(`data:image/png;base64,${o.thumbnail}`, `Thumbnail of output ${o.port}`, { cls: "thumb", pixelated: true });
  }
  const kind = o.kind === "text" ? base64Image(o.note) : null;
  if (kind) {
    return pictures.length
      ? pictures.map((a) => imageButton(artifactUrl(runId, a), `Output ${o.port}: ${a.name}`, { cls: "output-image" }))
      : h("span", { class: "muted" }, `a ${kind} image as base64 text (its file is not on this server)`);
  }
  return o.note || (o.nonfinite ? `${o.nonfinite} values not finite` : "");
}
