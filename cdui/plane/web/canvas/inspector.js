// The Inspector: a node's inputs and outputs after a run (shape, dtype, min/max/mean, a values
// preview, an image thumbnail, the raw tensor to download) and, where an input and an output have
// the same shape, their difference heat-coloured. It reads the existing outputs API, so canvas runs
// and recorded worker runs look the same; a node's inputs are its feeders' recorded outputs, found
// through the edges of the graph as it was when the run was sent.
import { api, ApiError, getToken } from "../api.js";
import { badge, fill, h, num } from "../dom.js";

const enc = encodeURIComponent;

/** A cell's colour for a value in [-1, 1]: blue below zero, red above, white at zero. */
export function heat(t) {
  const a = Math.min(1, Math.abs(t));
  const fade = Math.round(255 * (1 - a));
  return t < 0 ? `rgb(${fade},${fade},255)` : `rgb(255,${fade},${fade})`;
}

function sameShape(a, b) {
  return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => x === b[i]);
}

/** The values preview as a small table; ``scale`` colours each cell by value / scale. */
function grid(rows, caption, scale) {
  return h("table", { class: "ins-grid" }, h("caption", { class: "small muted" }, caption),
    h("tbody", {}, rows.map((row) => h("tr", {}, row.map((v) => h("td", {
      class: "mono", style: scale && v != null ? `background:${heat(v / scale)};color:${Math.abs(v / scale) > 0.55 ? "#fff" : "inherit"}` : null,
      title: v == null ? "not finite" : String(v) }, v == null ? "—" : num(v)))))));
}

function diffGrid(input, output, label) {
  const rows = output.preview.map((row, i) => row.map((v, j) => {
    const a = (input.preview[i] || [])[j];
    return v == null || a == null ? null : v - a;
  }));
  const scale = Math.max(0, ...rows.flat().filter((v) => v != null).map(Math.abs)) || 1;
  return h("div", { class: "ins-diff", dataset: { from: label },
    title: `Output minus input ${label}; the largest change is ${num(scale)}` },
  grid(rows, "Change from the input (blue lower, red higher)", scale));
}

async function download(runId, nodeId, port, button) {
  // The token travels in a header (a link would need it in the URL): fetch, then save the blob.
  button.disabled = true;
  try {
    const headers = {};
    const token = getToken();
    if (token) headers["X-CodefyUI-Token"] = token;
    const r = await fetch(`/api/runs/${enc(runId)}/outputs/${enc(nodeId)}/${enc(port)}/raw`, { headers, cache: "no-store" });
    if (!r.ok) {
      const body = await r.json().catch(() => ({}));
      throw new ApiError(r.status, body);
    }
    const url = URL.createObjectURL(await r.blob());
    const a = h("a", { href: url, download: `${runId}-${nodeId}-${port}.pt` });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60000);
  } catch (err) {
    button.replaceWith(h("span", { class: "error-text small" }, err.message || String(err)));
    return;
  }
  button.disabled = false;
}

function portBlock(o, label, runId, nodeId, canDownload) {
  const stats = [["shape", o.shape ? `[${o.shape.join(", ")}]` : null], ["dtype", o.dtype],
    ["min", o.min != null ? num(o.min) : null], ["max", o.max != null ? num(o.max) : null],
    ["mean", o.mean != null ? num(o.mean) : null],
    ["not finite", o.nonfinite ? String(o.nonfinite) : null]].filter(([, v]) => v != null);
  const dl = canDownload && o.kind === "tensor"
    ? h("button", { type: "button", class: "small-btn", "aria-label": `Download the raw tensor of ${label}` }, "Download .pt")
    : null;
  if (dl) dl.addEventListener("click", () => download(runId, nodeId, o.port, dl));
  return h("div", { class: "ins-port", dataset: { port: o.port } },
    h("h5", {}, label, " ", h("span", { class: "small muted" }, o.kind || ""), " ", dl),
    stats.length ? h("dl", { class: "ins-stats" }, stats.map(([k, v]) => [h("dt", {}, k), h("dd", { class: "mono", dataset: { stat: k } }, v)])) : null,
    o.note ? h("p", { class: "small" }, o.note) : null,
    o.thumbnail ? h("img", { class: "thumb", src: `data:image/png;base64,${o.thumbnail}`, alt: `Thumbnail of ${label}` }) : null,
    o.preview ? grid(o.preview, "Values (first rows and columns)") : null);
}

/** What the run's node_status event says of its outputs (when nothing was recorded). */
function fromEvent(outputs) {
  return Object.entries(outputs || {}).map(([port, s]) => {
    if (s && typeof s === "object" && s.type === "tensor") {
      return { port, kind: "tensor", shape: s.shape, dtype: String(s.dtype || "").replace(/^torch\./, ""),
        preview: Array.isArray(s.value) ? (Array.isArray(s.value[0]) ? s.value : [s.value].flat().length ? [[s.value].flat()] : null) : null };
    }
    if (s && typeof s === "object" && s.type === "model") return { port, kind: "model", note: `${s.class}, ${s.parameters} parameters` };
    return { port, kind: "value", note: JSON.stringify(s) };
  });
}

async function summary(runId, nodeId, cache) {
  if (!cache.has(nodeId)) cache.set(nodeId, api("GET", `/api/runs/${enc(runId)}/outputs/${enc(nodeId)}`));
  return cache.get(nodeId);
}

/**
 * Show node ``nodeId`` of ``run`` ({id, graph, record_outputs, local}) in ``el``; ``status`` is what the
 * run's events said of the node ({status, seconds, error, outputs}) or undefined.
 */
export async function inspect(el, run, nodeId, status) {
  el.hidden = false;
  const title = h("h4", { id: "inspector-title" }, `Inspector: ${nodeId}`);
  const close = h("button", { type: "button", class: "small-btn", "aria-label": "Close the Inspector" }, "Close");
  close.addEventListener("click", () => { el.hidden = true; fill(el); });
  const head = h("div", { class: "ins-head" }, title, " ",
    status ? badge(status.status, "node") : h("span", { class: "muted small" }, "not run"),
    status && status.seconds != null ? h("span", { class: "small muted" }, ` ${num(status.seconds)} s`) : null, " ", close);
  if (!run) {
    fill(el, head, h("p", { class: "muted" }, "Run the graph first: the Inspector shows what each node received and produced."));
    return;
  }
  fill(el, head, h("p", { class: "muted", id: "inspector-loading" }, `Loading the outputs of ${nodeId}…`));
  if (status && status.error) el.append(h("p", { class: "error-text" }, status.error));

  const edges = ((run.graph && run.graph.edges) || []).filter((e) => e.target === nodeId && e.type !== "trigger");
  let outs, ins = [], note = null;
  if (run.record_outputs) {
    const cache = new Map();
    try {
      outs = (await summary(run.id, nodeId, cache)).outputs;
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      note = h("p", { class: "error-text" }, err.message, err.hint ? h("span", { class: "hint" }, ` ${err.hint}`) : null);
      outs = fromEvent(status && status.outputs);
    }
    ins = await Promise.all(edges.map(async (e) => {
      try {
        const s = await summary(run.id, e.source, cache);
        const o = s.outputs.find((x) => x.port === e.sourceHandle);
        return o ? { ...o, label: `${e.targetHandle} ← ${e.source}.${e.sourceHandle}`, from: e.source } : null;
      } catch {
        return null;
      }
    }));
    ins = ins.filter(Boolean);
  } else {
    outs = fromEvent(status && status.outputs);
    note = h("p", { class: "hint" }, "Values, statistics and inputs are recorded with Record outputs on: turn it on and Run again.");
  }
  // A worker run's raw tensors are read from that worker over its connection while it is connected.
  const canDownload = !!run.record_outputs;
  const body = [];
  if (note) body.push(note);
  const inputs = h("div", { class: "ins-inputs" }, ins.length ? ins.map((o) => portBlock(o, o.label, run.id, o.from, canDownload))
    : h("p", { class: "muted small" }, edges.length ? "The inputs were not recorded." : "No data inputs."));
  const outputs = h("div", { class: "ins-outputs" }, outs && outs.length ? outs.map((o) => {
    const block = portBlock(o, o.port, run.id, nodeId, canDownload);
    if (o.preview) {
      for (const i of ins) if (i.preview && sameShape(i.shape, o.shape)) block.append(diffGrid(i, o, i.label));
    }
    return block;
  }) : h("p", { class: "muted small" }, "No outputs."));
  body.push(h("div", { class: "ins-io" },
    h("section", { class: "ins-col", "aria-label": "Inputs" }, h("h5", { class: "ins-section" }, "Inputs"), inputs),
    h("section", { class: "ins-col", "aria-label": "Outputs" }, h("h5", { class: "ins-section" }, "Outputs"), outputs)));
  fill(el, head, body);
}
