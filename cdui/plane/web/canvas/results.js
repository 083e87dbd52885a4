// The canvas's results panel: the run's header (status, link to Runs), messages (validation, refusals),
// the execution log and the live training chart. It draws what run.js keeps per tab (a RunView).
//
// The log is virtual: a run's lines are kept in an array (the last MAX_LINES, with a line saying how
// many earlier ones were dropped) and only the lines in view, plus a margin, are in the page, each one
// row high, in a scroller whose inner height is that of all the lines. Whatever arrived since the last
// frame is drawn at the next animation frame, once (the chart too); nothing is drawn while the page is
// hidden, and it catches up when shown. The log follows its end unless the reader scrolled up; the lines
// in view are ordinary text (select, copy), and nothing here takes the focus.
import { badge, fill, h, num } from "../dom.js";
import { describe } from "../events.js";

const MAX_LINES = 50000;       // log lines kept per run (the API has them all)
export const ROW_PX = 18;      // the height of one log line (run.css: .cr-log li)
const MARGIN = 15;             // lines kept in the page above and below the ones in view (a wheel step or two)
const MAX_POINTS = 2000;       // points drawn per chart line (evenly picked)
const COLORS = ["#2f5bd3", "#c62828", "#1a7f37", "#b25e00", "#6a3fb5", "#00838f"];
const SVG = "http://www.w3.org/2000/svg";

/** A run's log lines: the last ``max`` events pushed, and how many earlier ones were dropped. */
export class Lines {
  constructor(max = MAX_LINES) {
    this.max = max;
    this.buf = [];
    this.head = 0;      // buf[head] is the oldest line kept
    this.dropped = 0;   // lines dropped from the front
  }

  get length() { return this.buf.length - this.head; }

  /** The i-th line kept (0: the oldest). */
  at(i) { return this.buf[this.head + i]; }

  push(ev) {
    this.buf.push(ev);
    if (this.buf.length - this.head > this.max) {
      this.head++;
      this.dropped++;
      // Compacted now and then, so that a push stays cheap however long the run.
      if (this.head >= Math.max(1024, this.max >> 2)) { this.buf = this.buf.slice(this.head); this.head = 0; }
    }
  }
}

/** What one run shows in the panel; run.js keeps one per tab, so switching tabs redraws it. */
export class RunView {
  constructor(run, { maxLines = MAX_LINES } = {}) {
    this.run = run;              // {id, kind: "canvas"|"queued", target?, graph, record_outputs}
    this.status = "submitted";   // the run's status from its events
    this.error = "";
    this.lines = new Lines(maxLines); // events for the log
    this.series = new Map();     // chart line name -> [[x, y]]
    this.metricLoss = false;     // a metric named *loss* was seen: progress' loss is then not charted too
    this.nodes = new Map();      // node id -> {status, type, seconds, error, outputs}
  }

  /** Fold one event in; returns what changed ({nodes, chart, status}). */
  add(ev) {
    const d = ev.data || {};
    const changed = { nodes: false, chart: false, status: false };
    this.lines.push(ev);
    if (ev.kind === "status" && d.status) {
      this.status = d.status;
      this.error = d.error || "";
      changed.status = true;
    } else if (ev.kind === "node_status" && d.node_id) {
      this.nodes.set(d.node_id, { status: d.status, type: d.type, seconds: d.seconds, error: d.error, outputs: d.outputs });
      changed.nodes = true;
    } else if (ev.kind === "metric" && /loss/i.test(d.name || "") && typeof d.value === "number" && isFinite(d.value)) {
      if (!this.metricLoss) { this.metricLoss = true; this.series.delete("loss"); }
      this.point(d.name, d.step, d.value);
      changed.chart = true;
    } else if (ev.kind === "progress" && !this.metricLoss && typeof d.loss === "number" && isFinite(d.loss)) {
      this.point("loss", d.epoch ?? d.step, d.loss);
      changed.chart = true;
    }
    return changed;
  }

  point(name, x, y) {
    if (!this.series.has(name)) this.series.set(name, []);
    const pts = this.series.get(name);
    pts.push([typeof x === "number" ? x : pts.length + 1, y]);
  }
}

function lineRow(ev, n) {
  const d = ev.data || {};
  const level = ev.kind === "log" ? d.level || "info" : ev.kind === "node_status" ? d.status : "";
  const text = describe(ev);
  return h("li", { class: `ev ev-${ev.kind}${level ? ` lvl-${level}` : ""}`, dataset: { line: n, seq: ev.seq } },
    h("span", { class: "seq" }, ev.seq),
    h("span", { class: "kind" }, ev.kind),
    h("span", { class: "msg", title: text.length > 80 || text.includes("\n") ? text : null }, text));
}

const droppedText = (n) => `${n} earlier line${n === 1 ? "" : "s"} dropped (the run's events in Runs have them all)`;

/**
 * The execution log: a fixed-height scroller over a run's Lines, only the lines in view (and MARGIN
 * more each side) in the page. Rows are keyed by their line number in the run (1: its first event;
 * 0: the "earlier lines dropped" line), so a row that stays in the window is never rebuilt and a
 * selection in it survives live updates.
 *
 * ``#canvas-log`` says what it holds in data attributes (count: lines kept, dropped, first-seq,
 * last-seq) and ``logOf(element)`` gives its API (lines(), scrollToLine(n), following()).
 */
class LogView {
  constructor() {
    this.el = h("div", { id: "canvas-log", class: "cr-log", role: "log", tabindex: "0", "aria-label": "Execution log",
      dataset: { count: 0, dropped: 0, firstSeq: "", lastSeq: "" } });
    this.space = h("div", { class: "cr-log-space" });
    this.list = h("ol", { class: "cr-log-rows" });
    this.space.append(this.list);
    this.el.append(this.space);
    this.lines = null;   // the Lines shown (a RunView's), or null
    this.stick = true;   // follow the end; false once the reader scrolled up
    this.base = 0;       // lines.dropped when last drawn
    this.drawn = NaN;    // lines.length + lines.dropped when last drawn (-1: no lines)
    this.onScroll = null;
    this.setTop = -1;    // the scrollTop draw() left (its own scroll is no reader's)
    this.el.addEventListener("scroll", () => {
      if (this.el.scrollTop === this.setTop) return;
      this.setTop = -1;
      this.stick = this.el.scrollTop + this.el.clientHeight >= this.el.scrollHeight - ROW_PX / 2;
      if (this.onScroll) this.onScroll();
    }, { passive: true });
    logs.set(this.el, this);
  }

  /** Shows ``lines`` (or nothing), from its end. */
  show(lines) {
    this.lines = lines;
    this.stick = true;
    this.base = lines ? lines.dropped : 0;
    this.drawn = NaN; // drawn afresh
    this.list.replaceChildren();
    this.draw();
  }

  /** The number of rows: the lines kept, and one more saying how many were dropped. */
  rows() {
    const L = this.lines;
    return L ? L.length + (L.dropped ? 1 : 0) : 0;
  }

  /** Brings the log up to date with its lines and its scroll position (one layout). */
  draw() {
    const L = this.lines, el = this.el;
    const total = this.rows();
    const grown = (L ? L.length + L.dropped : -1) !== this.drawn;
    if (grown) {
      this.space.style.height = `${total * ROW_PX}px`;
      const ds = el.dataset;
      ds.count = L ? L.length : 0;
      ds.dropped = L ? L.dropped : 0;
      ds.firstSeq = L && L.length ? L.at(0).seq : "";
      ds.lastSeq = L && L.length ? L.at(L.length - 1).seq : "";
      if (L && !this.stick && L.dropped !== this.base) {
        // Lines dropped above the view: the reader keeps looking at the same lines.
        const rowsGone = (L.dropped - this.base) - ((L.dropped ? 1 : 0) - (this.base ? 1 : 0));
        el.scrollTop = Math.max(0, el.scrollTop - rowsGone * ROW_PX);
      }
      this.base = L ? L.dropped : 0;
      this.drawn = L ? L.length + L.dropped : -1;
    }
    const height = el.clientHeight || 220;
    if (this.stick && grown) el.scrollTop = el.scrollHeight; // the browser stops it at the end
    const top = el.scrollTop;
    this.setTop = top;
    const from = Math.max(0, Math.floor(top / ROW_PX) - MARGIN);
    const to = Math.min(total, Math.ceil((top + height) / ROW_PX) + MARGIN);
    this.list.style.transform = `translateY(${from * ROW_PX}px)`;
    this.place(from, to);
  }

  /** The rows ``from`` to ``to`` (exclusive) in the page, the rows already there kept. */
  place(from, to) {
    const L = this.lines;
    const off = L && L.dropped ? 1 : 0;
    const key = (r) => (r < off ? 0 : L.dropped + (r - off) + 1);
    const want = new Set();
    for (let r = from; r < to; r++) want.add(key(r));
    let cur = this.list.firstElementChild;
    for (let r = from; r < to; r++) {
      const k = key(r);
      while (cur && !want.has(Number(cur.dataset.line))) {
        const next = cur.nextElementSibling;
        cur.remove();
        cur = next;
      }
      if (cur && Number(cur.dataset.line) === k) {
        if (k === 0 && cur.dataset.dropped !== String(L.dropped)) {
          cur.dataset.dropped = L.dropped;
          cur.textContent = droppedText(L.dropped);
        }
        cur = cur.nextElementSibling;
        continue;
      }
      const row = k === 0
        ? h("li", { class: "cr-log-dropped muted", dataset: { line: 0, dropped: L.dropped } }, droppedText(L.dropped))
        : lineRow(L.at(r - off), k);
      this.list.insertBefore(row, cur);
    }
    while (cur) {
      const next = cur.nextElementSibling;
      cur.remove();
      cur = next;
    }
  }

  // -- its API (tests, and anything that wants what the log holds without reading the page) --
  /** Every line kept: {line, seq, kind, level, text}. */
  linesHeld() {
    const L = this.lines, out = [];
    if (!L) return out;
    for (let i = 0; i < L.length; i++) {
      const ev = L.at(i), d = ev.data || {};
      out.push({ line: L.dropped + i + 1, seq: ev.seq, kind: ev.kind,
        level: ev.kind === "log" ? d.level || "info" : ev.kind === "node_status" ? d.status || "" : "", text: describe(ev) });
    }
    return out;
  }

  /** Scrolls so that line ``n`` of the run (1: its first) is the top one in view. */
  scrollToLine(n) {
    const L = this.lines;
    if (!L) return;
    const off = L.dropped ? 1 : 0;
    this.el.scrollTop = Math.max(0, (n - L.dropped - 1 + off) * ROW_PX);
  }
}

const logs = new WeakMap();

/** Puts ``text`` on the clipboard: the Clipboard API where the page may use it (https, localhost), else
 *  the older copy command over a text area that is not shown. Returns whether it was copied. */
async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch { /* refused: the older way below */ }
  }
  const area = h("textarea", { class: "cr-copy-area", readonly: true, "aria-hidden": "true" });
  area.value = text;
  const focused = document.activeElement;
  document.body.append(area);
  area.select();
  let ok = false;
  try { ok = document.execCommand("copy"); } catch { ok = false; }
  area.remove();
  if (focused && focused.focus) focused.focus({ preventScroll: true });
  return ok;
}

/** The API of a log element (``#canvas-log``): lines(), scrollToLine(n), following(), rendered(). */
export function logOf(el) {
  const v = logs.get(el);
  if (!v) return null;
  return {
    lines: () => v.linesHeld(),
    scrollToLine: (n) => v.scrollToLine(n),
    following: () => v.stick,
    rendered: () => [...v.list.children].map((li) => Number(li.dataset.line)),
  };
}

/** The panel's DOM inside ``root``; returns the functions run.js draws with. */
export function createResults(root) {
  const head = h("div", { class: "cr-head" },
    h("strong", { id: "canvas-run-title" }, "No run yet"), " ",
    h("span", { id: "canvas-run-status", role: "status", "aria-live": "polite" }));
  const messages = h("div", { id: "canvas-messages", class: "cr-messages", hidden: true });
  const log = new LogView();
  // Only the lines in view are in the page, so selecting copies those; this copies every line kept.
  const copied = h("span", { id: "canvas-log-copied", class: "small muted", role: "status", "aria-live": "polite" });
  const copyBtn = h("button", { type: "button", id: "canvas-log-copy", class: "small-btn",
    title: "Copy every line the log holds (seq, kind, text; one a line)" }, "Copy log");
  const logBar = h("div", { class: "cr-logbar" }, copyBtn, " ", copied);
  copyBtn.addEventListener("click", async () => {
    const lines = log.linesHeld();
    const text = lines.map((x) => `${x.seq}\t${x.kind}\t${x.text}`).join("\n") + (lines.length ? "\n" : "");
    const ok = await copyText(text);
    copied.textContent = ok ? `${lines.length} line${lines.length === 1 ? "" : "s"} copied` :
      "The browser refused to copy (select the lines in view instead).";
  });
  const svg = document.createElementNS(SVG, "svg");
  svg.id = "canvas-chart";
  svg.setAttribute("viewBox", "0 0 600 180");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "Training loss");
  const caption = h("p", { id: "canvas-chart-caption", class: "small muted" });
  const legend = h("ul", { id: "canvas-chart-legend", class: "cr-legend" });
  const chartWrap = h("figure", { class: "cr-chart", hidden: true }, svg, legend, caption);
  const inspector = h("section", { id: "canvas-inspector", class: "cr-inspector", hidden: true,
    "aria-label": "Inspector" });
  fill(root, head, messages, h("div", { class: "cr-body" },
    h("section", { class: "cr-logwrap", "aria-label": "Execution log" }, log.el, logBar), chartWrap), inspector);

  // What changed since the last frame: drawn at the next one, or when the page is shown again.
  let view = null, frame = 0, logDirty = false, chartDirty = false;

  let titleKey = null, statusKey = null;
  /** The title and the status, each rebuilt only when it changes (a focused run link keeps the focus). */
  function header() {
    const r = view && view.run;
    const tk = r ? JSON.stringify([r.id, r.kind, r.targetLabel]) : "";
    if (tk !== titleKey) {
      titleKey = tk;
      if (!r) fill(head.firstChild, "No run yet");
      else {
        fill(head.firstChild, "Run ", h("a", { href: `/#run=${encodeURIComponent(r.id)}`, class: "mono",
          title: "Open this run in Runs" }, r.id), r.kind === "queued" ? ` queued on ${r.targetLabel}` : " on this server");
      }
    }
    const sk = r ? JSON.stringify([view.status, view.error]) : "";
    if (sk !== statusKey) {
      statusKey = sk;
      if (!r) fill(head.lastChild);
      else fill(head.lastChild, badge(view.status), view.error ? h("span", { class: "error-text small" }, ` ${view.error}`) : null);
    }
  }

  function flush() {
    frame = 0;
    if (document.hidden) return; // drawn when the page is shown again
    if (logDirty) { logDirty = false; log.draw(); }
    if (chartDirty) { chartDirty = false; if (view) drawChart(); }
    header();
  }

  function schedule() {
    if (!frame && !document.hidden) frame = requestAnimationFrame(flush);
  }
  // The reader scrolled: the lines now in view are put in at the next frame.
  log.onScroll = () => { logDirty = true; schedule(); };
  document.addEventListener("visibilitychange", () => { if (!document.hidden && (logDirty || chartDirty)) schedule(); });

  function drawChart() {
    const lines = [...view.series].filter(([, pts]) => pts.length);
    chartWrap.hidden = lines.length === 0;
    if (!lines.length) { svg.replaceChildren(); return; }
    const W = 600, H = 180, pad = 8;
    const all = lines.flatMap(([, pts]) => pts);
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const [x, y] of all) {
      if (x < x0) x0 = x;
      if (x > x1) x1 = x;
      if (y < y0) y0 = y;
      if (y > y1) y1 = y;
    }
    const sx = (x) => pad + ((x - x0) / (x1 - x0 || 1)) * (W - 2 * pad);
    const sy = (y) => H - pad - ((y - y0) / (y1 - y0 || 1)) * (H - 2 * pad);
    const kids = [];
    lines.forEach(([name, pts], i) => {
      const step = Math.max(1, Math.ceil(pts.length / MAX_POINTS));
      const picked = pts.filter((_, j) => j % step === 0 || j === pts.length - 1);
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("points", picked.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" "));
      line.setAttribute("class", "cr-line");
      line.setAttribute("stroke", COLORS[i % COLORS.length]);
      line.dataset.series = name;
      kids.push(line);
    });
    svg.replaceChildren(...kids);
    fill(legend, lines.map(([name, pts], i) => h("li", { dataset: { series: name } },
      h("span", { class: "cr-swatch", style: `background:${COLORS[i % COLORS.length]}` }),
      `${name}: last ${num(pts[pts.length - 1][1])}`)));
    caption.textContent = `${all.length} values · min ${num(y0)} · max ${num(y1)}`;
  }

  return {
    inspector,
    /** Show ``v`` (a RunView, or null): the log and chart are redrawn from what it holds. */
    show(v) {
      view = v;
      logDirty = false;
      chartDirty = false;
      log.show(v ? v.lines : null);
      if (v) drawChart(); else { chartWrap.hidden = true; svg.replaceChildren(); }
      header();
    },
    /** Events folded into the shown view: drawn at the next frame. */
    added(v, events, chart) {
      if (v !== view) return;
      logDirty = logDirty || events.length > 0;
      chartDirty = chartDirty || chart;
      schedule();
    },
    header,
    /** A message above the log (kind: "error" | "ok" | "info"), with an optional list of details. */
    message(kind, text, hint, details) {
      messages.hidden = false;
      fill(messages, h("p", { class: kind === "error" ? "error-text" : kind === "ok" ? "ok-text" : "muted" }, text),
        hint ? h("p", { class: "hint" }, hint) : null,
        details && details.length ? h("ul", { id: "canvas-errors", class: "error-list" }, details.map((d) => h("li", {},
          h("span", { class: "code" }, d.code || "error"), " ",
          d.node_id ? h("span", { class: "node" }, `node ${d.node_id}: `) : null,
          h("span", {}, d.message || ""),
          d.hint ? h("div", { class: "hint" }, d.hint) : null))) : null);
    },
    clearMessage() { messages.hidden = true; fill(messages); },
  };
}
