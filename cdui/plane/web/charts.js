// Per-metric charts (uPlot, vendored in web/vendor/uplot/) for the run view and the comparison page.
// One chart per family of metrics (loss, per-batch loss, accuracy, learning rate, early stopping,
// then one per other metric name), each with axes, a legend naming every series, TensorBoard-style
// smoothing (a debiased exponential moving average) and a log-scale toggle. The per-batch loss
// chart is off until its box is ticked. Series come from the run's `metric` events: live
// (addPoint) or as GET /api/runs/{id}/metrics answers them (setSeries).
import { h, num } from "./dom.js";

const uPlot = window.uPlot; // web/vendor/uplot/uPlot.iife.min.js, loaded before the modules
const MAX_POINTS = 2000;    // values kept per series in the page (thinned as a series grows)
const COLORS = ["#2f5bd3", "#d9480f", "#2b8a3e", "#ae3ec9", "#c92a2a", "#1098ad", "#e67700", "#5c7cfa",
  "#087f5b", "#862e9c"];

/** Which chart a metric goes on: TrainingLoop steps its per-epoch metrics by epoch, its
 *  `train_loss_batch` by batch. */
export function familyOf(name) {
  if (/_batch$/.test(name)) return { id: "batch", title: "Per-batch loss", y: "loss", x: "batch", order: 5, optional: true };
  if (/^(lr|learning_rate)$/i.test(name)) return { id: "lr", title: "Learning rate", y: "learning rate", x: "epoch", order: 3, exp: true };
  if (/acc/i.test(name)) return { id: "accuracy", title: "Accuracy", y: "accuracy", x: "epoch", order: 2, percent: true };
  if (/loss/i.test(name)) return { id: "loss", title: "Loss", y: "loss", x: "epoch", order: 1 };
  if (/^(patience_counter|best_epoch)$/.test(name)) return { id: "early", title: "Early stopping", y: "epochs", x: "epoch", order: 4 };
  return { id: `metric-${name.replace(/[^A-Za-z0-9_-]/g, "_")}`, title: name, y: name, x: "step", order: 6 };
}

/** TensorBoard's smoothing: an exponential moving average, debiased so the first values are not
 *  pulled towards 0; null (not finite) values stay null and do not move the average. */
export function smooth(values, weight) {
  if (!(weight > 0)) return values.slice();
  let last = 0, n = 0;
  return values.map((v) => {
    if (v == null) return null;
    last = last * weight + (1 - weight) * v;
    n++;
    return last / (1 - weight ** n);
  });
}

/** One series, thinned as it grows: every stride-th value kept; at 2 x MAX_POINTS every other one is
 *  dropped and the stride doubles. The last value is always drawn. */
class Series {
  constructor(key, name, node, run) {
    Object.assign(this, { key, name, node, run, xs: [], ys: [], stride: 1, count: 0, last: null, lo: null, hi: null });
  }

  add(x, y) {
    if (y != null) {
      this.lo = this.lo == null ? y : Math.min(this.lo, y);
      this.hi = this.hi == null ? y : Math.max(this.hi, y);
    }
    if (this.count % this.stride === 0) {
      this.xs.push(x);
      this.ys.push(y);
      if (this.xs.length >= 2 * MAX_POINTS) {
        this.xs = this.xs.filter((_, i) => i % 2 === 0);
        this.ys = this.ys.filter((_, i) => i % 2 === 0);
        this.stride *= 2;
      }
    }
    this.count++;
    this.last = { x, y };
  }

  points() {
    const xs = this.xs.slice(), ys = this.ys.slice();
    if (this.last && xs[xs.length - 1] !== this.last.x) { xs.push(this.last.x); ys.push(this.last.y); }
    return { xs, ys };
  }
}

// Steps are whole numbers (epochs, batches): the x axis ticks only at whole steps.
const STEP_INCRS = [1, 2, 5].flatMap((m) => [1, 10, 100, 1e3, 1e4, 1e5, 1e6, 1e7].map((p) => m * p)).sort((a, b) => a - b);

const finite = (v) => (typeof v === "number" && isFinite(v) ? v : null);

/** The charts of one view. `runLabel(run)` names a run in legends when several runs are drawn (the
 *  comparison page, where `runOrder` lists them in the order legends name them); with one run,
 *  series are named by their metric alone. */
export class ChartSet {
  constructor(root, { runLabel = null, runColor = null, runOrder = [] } = {}) {
    this.root = root;
    this.runOrder = runOrder;
    this.runLabel = runLabel;
    this.runColor = runColor;
    this.series = new Map();
    this.plots = new Map(); // family id -> {fig, plot, sig, log}
    this.logScale = new Set();
    this.weight = 0.6;
    this.showBatch = false;
    this.frame = 0;
    this.build();
  }

  build() {
    const slider = h("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: String(this.weight),
      id: `${this.root.id}-smoothing`, class: "smoothing", "aria-label": "Smoothing" });
    const shown = h("output", { class: "smoothing-value", for: slider.id }, this.weight.toFixed(2));
    slider.addEventListener("input", () => {
      this.weight = Number(slider.value);
      shown.textContent = this.weight.toFixed(2);
      this.render(true);
    });
    const batch = h("input", { type: "checkbox", id: `${this.root.id}-batch`, class: "show-batch" });
    batch.addEventListener("change", () => { this.showBatch = batch.checked; this.render(true); });
    this.batchToggle = h("label", { class: "check inline", hidden: true }, batch, " Show per-batch loss");
    this.grid = h("div", { class: "chart-grid" });
    this.empty = h("p", { class: "muted small chart-empty" }, "No metrics reported yet.");
    this.root.replaceChildren(
      h("div", { class: "chart-tools" },
        h("label", { class: "check inline", for: slider.id }, "Smoothing"), slider, shown, this.batchToggle),
      this.empty, this.grid);
    this.resize = new ResizeObserver(() => {
      for (const p of this.plots.values()) if (p.plot) p.plot.setSize(this.size(p.fig));
    });
    this.resize.observe(this.root);
  }

  clear() {
    this.series.clear();
    for (const p of this.plots.values()) if (p.plot) p.plot.destroy();
    this.plots.clear();
    this.grid.replaceChildren();
    this.render();
  }

  size(fig) {
    return { width: Math.max(240, (fig.clientWidth || this.root.clientWidth || 600) - 2), height: 200 };
  }

  /** One value of a `metric` event (`run` names the run on the comparison page). */
  addPoint(name, node, step, value, run = "") {
    if (typeof name !== "string" || !name) return;
    const key = `${run}\u0000${node || ""}\u0000${name}`;
    let s = this.series.get(key);
    if (!s) this.series.set(key, s = new Series(key, name, node || null, run));
    const x = finite(step);
    s.add(x != null ? x : s.count + 1, finite(value));
    this.render();
  }

  /** The series of a GET /api/runs/{id}/metrics answer, replacing what the run had. */
  setSeries(answer, run = "") {
    for (const [k, s] of this.series) if (s.run === run) this.series.delete(k);
    for (const m of answer.series || []) {
      const key = `${run}\u0000${m.node_id || ""}\u0000${m.name}`;
      const s = new Series(key, m.name, m.node_id || null, run);
      s.xs = m.steps.slice();
      s.ys = m.values.map(finite);
      s.stride = Math.max(1, Math.ceil((m.count || 1) / Math.max(1, m.steps.length)));
      s.count = m.count || m.steps.length;
      s.last = m.last ? { x: m.last.step, y: finite(m.last.value) } : null;
      s.lo = finite(m.min);
      s.hi = finite(m.max);
      this.series.set(key, s);
    }
    this.render();
  }

  /** The last value, minimum and maximum of every series: {run, name, node, last, step, min, max}. */
  finals() {
    return [...this.series.values()].map((s) => ({ run: s.run, name: s.name, node: s.node,
      last: s.last ? s.last.y : null, step: s.last ? s.last.x : null, min: s.lo, max: s.hi, count: s.count }));
  }

  /** Draw at the next animation frame (events arrive in bursts); `now` draws at once. */
  render(now = false) {
    if (now) { cancelAnimationFrame(this.frame); this.frame = 0; this.draw(); return; }
    if (!this.frame) this.frame = requestAnimationFrame(() => { this.frame = 0; this.draw(); });
  }

  label(s, ambiguous) {
    const metric = ambiguous.has(`${s.run}\u0000${s.name}`) && s.node ? `${s.name} (${s.node})` : s.name;
    return this.runLabel ? `${this.runLabel(s.run)} · ${metric}` : metric;
  }

  draw() {
    const byFamily = new Map();
    const nodesOf = new Map();
    for (const s of this.series.values()) {
      const f = familyOf(s.name);
      if (!byFamily.has(f.id)) byFamily.set(f.id, { family: f, list: [] });
      byFamily.get(f.id).list.push(s);
      const k = `${s.run}\u0000${s.name}`;
      nodesOf.set(k, (nodesOf.get(k) || new Set()).add(s.node));
    }
    const ambiguous = new Set([...nodesOf].filter(([, n]) => n.size > 1).map(([k]) => k));
    this.batchToggle.hidden = !byFamily.has("batch");
    this.empty.hidden = byFamily.size > 0;
    const want = [...byFamily.values()].filter((g) => !g.family.optional || this.showBatch)
      .sort((a, b) => a.family.order - b.family.order || a.family.title.localeCompare(b.family.title));
    for (const [id, p] of this.plots) {
      if (!want.some((g) => g.family.id === id)) { if (p.plot) p.plot.destroy(); p.fig.remove(); this.plots.delete(id); }
    }
    let prev = null;
    for (const g of want) {
      const p = this.plotFor(g.family);
      if (prev ? prev.nextSibling !== p.fig : this.grid.firstChild !== p.fig) this.grid.insertBefore(p.fig, prev ? prev.nextSibling : this.grid.firstChild);
      prev = p.fig;
      this.drawFamily(p, g.family, g.list.sort((a, b) => this.runOrder.indexOf(a.run) - this.runOrder.indexOf(b.run) || a.name.localeCompare(b.name)), ambiguous);
    }
  }

  plotFor(f) {
    let p = this.plots.get(f.id);
    if (p) return p;
    const log = h("input", { type: "checkbox", class: "log-scale", "aria-label": `Log scale for ${f.title}` });
    const fig = h("figure", { class: "metric-chart", dataset: { family: f.id } },
      h("figcaption", {}, h("strong", {}, f.title), h("label", { class: "check inline" }, log, " log scale")),
      h("div", { class: "plot" }), h("p", { class: "small muted chart-caption" }));
    p = { fig, plot: null, sig: "", box: fig.querySelector(".plot"), caption: fig.querySelector(".chart-caption") };
    log.checked = this.logScale.has(f.id);
    log.addEventListener("change", () => {
      if (log.checked) this.logScale.add(f.id); else this.logScale.delete(f.id);
      this.render(true);
    });
    this.plots.set(f.id, p);
    return p;
  }

  color(s, i) {
    if (this.runColor) return this.runColor(s.run);
    return COLORS[i % COLORS.length];
  }

  drawFamily(p, f, list, ambiguous) {
    const logY = this.logScale.has(f.id);
    // One x axis for the family: the union of the series' steps.
    const xsAll = [...new Set(list.flatMap((s) => s.points().xs))].sort((a, b) => a - b);
    const at = new Map(xsAll.map((x, i) => [x, i]));
    const data = [xsAll];
    const opts = [{ label: f.x }];
    const rawRows = [];
    const names = new Map();
    list.forEach((s, i) => {
      const { xs, ys } = s.points();
      const keep = (v) => (v == null || (logY && v <= 0) ? null : v);
      const color = this.color(s, i);
      // On the comparison page one colour is one run: its metrics are told apart by the dash.
      const idx = names.has(s.name) ? names.get(s.name) : names.set(s.name, names.size).get(s.name);
      const dash = this.runColor && idx > 0 ? [[6, 4], [2, 3], [10, 3, 2, 3]][(idx - 1) % 3] : undefined;
      const label = this.label(s, ambiguous);
      const line = (vals) => { const col = new Array(xsAll.length).fill(null); xs.forEach((x, k) => { col[at.get(x)] = keep(vals[k]); }); return col; };
      if (this.weight > 0) {
        data.push(line(ys));
        opts.push({ label: `${label} (raw)`, stroke: `${color}40`, width: 1, spanGaps: true, dash, points: { show: false } });
        rawRows.push(opts.length - 1);
      }
      data.push(line(smooth(ys, this.weight)));
      opts.push({ label, stroke: color, width: 1.75, spanGaps: true, dash, points: { show: xs.length < 40 },
        value: (u, v) => (v == null ? "—" : f.percent ? `${(100 * v).toFixed(2)} %` : num(v)) });
    });
    const sig = JSON.stringify([opts.map((o) => o.label + (o.stroke || "")), logY, this.weight > 0]);
    p.caption.textContent = list.map((s) => s.last && s.last.y != null
      ? `${this.label(s, ambiguous)}: last ${fmt(s.last.y, f)} at ${f.x} ${num(s.last.x)}, min ${fmt(s.lo, f)}, max ${fmt(s.hi, f)}`
      : `${this.label(s, ambiguous)}: no finite value`).join(" · ");
    if (p.plot && p.sig === sig) { p.plot.setData(data); return; }
    if (p.plot) p.plot.destroy();
    p.sig = sig;
    p.box.replaceChildren();
    const yFmt = (u, vals) => vals.map((v) => (v == null ? "" : f.percent ? `${+(100 * v).toFixed(1)} %` : tick(v, f)));
    p.plot = new uPlot({
      ...this.size(p.fig),
      scales: { x: { time: false }, y: logY ? { distr: 3 } : {} },
      axes: [{ label: f.x, size: 36, incrs: STEP_INCRS }, { label: logY ? `${f.y} (log)` : f.y, values: yFmt, size: 60 }],
      series: opts,
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      // Hiding a series from its legend entry hides its faint raw line too.
      hooks: { setSeries: [(u, i, o) => {
        if (o && o.show != null && rawRows.includes(i - 1) && u.series[i - 1].show !== o.show) u.setSeries(i - 1, { show: o.show });
      }] },
    }, data, p.box);
    // The axes are drawn on the canvas: their names are also the figure's, for tools and tests.
    p.fig.dataset.xAxis = f.x;
    p.fig.dataset.yAxis = logY ? `${f.y} (log)` : f.y;
    p.fig.setAttribute("aria-label", `${f.title}: ${p.fig.dataset.yAxis} by ${f.x}`);
    const rows = p.plot.root.querySelectorAll(".u-legend .u-series");
    for (const i of rawRows) if (rows[i]) rows[i].hidden = true;
  }
}

function fmt(v, f) {
  if (v == null) return "—";
  return f.percent ? `${(100 * v).toFixed(2)} %` : num(v);
}

function tick(v, f) {
  if (f.exp || (v !== 0 && Math.abs(v) < 1e-3)) return v.toExponential(1);
  return String(+v.toPrecision(4));
}
