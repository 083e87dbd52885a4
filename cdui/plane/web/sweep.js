// The sweeps page, /web/sweep.html: without ?id= the list of sweeps (GET /api/sweeps); with ?id=ID one
// sweep (GET /api/sweeps/{id}): its variants in a table sortable by any column with the best
// highlighted, stop and retry, the objective against each param (a scatter per param) and a
// parallel-coordinates view, drawn as SVG in the page; a study (kind "study", GET /api/studies/{id}) also
// its optimisation history and its params' importance, its pruned trials marked. While the sweep runs and the page is visible
// it is read again every few seconds; a hidden page reads nothing.
import { api, ApiError, bootstrap, bootstrapRefusal, getToken } from "./api.js";
import { $, badge, fill, h, num, target, time } from "./dom.js";

const POLL_MS = 3000;
// A sweep may have 10,000 variants: the table shows this many rows (in the order chosen) and the plots
// this many variants (the best always among them), so a redraw every few seconds stays cheap.
const MAX_ROWS = 1000, MAX_PLOTTED = 2000;
const SWEEP_ID = /^[A-Za-z0-9_-]{1,64}$/;
const LIVE = new Set(["running", "stopping"]);
const SVG = "http://www.w3.org/2000/svg";

class PageError extends Error {
  constructor(message, hint = "") { super(message); this.hint = hint; }
}

const state = { id: null, kind: null, sweep: null, sort: { col: "index", dir: 1 }, timer: null, busy: false };

function showError(message, hint) {
  $("sweep-error-message").textContent = message;
  $("sweep-error-hint").textContent = hint || "";
  $("sweep-error").hidden = false;
}

/** An SVG element: s("circle", {cx, cy, r}, ...children). */
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v != null) el.setAttribute(k, String(v));
  for (const c of children.flat(Infinity)) if (c != null) el.append(c instanceof Node ? c : String(c));
  return el;
}

const shown = (v) => (v === undefined || v === null ? "" : typeof v === "string" ? v : typeof v === "number" ? num(v) : JSON.stringify(v));

function duration(sec) {
  if (sec == null || !isFinite(sec)) return "";
  if (sec < 60) return `${sec.toFixed(1)} s`;
  const m = Math.floor(sec / 60);
  return m < 60 ? `${m} min ${Math.round(sec % 60)} s` : `${Math.floor(m / 60)} h ${m % 60} min`;
}

/** The param keys of a sweep's variants, in the order its axes give them. */
export function paramKeys(sweep) {
  const keys = Object.keys(sweep.axes || {});
  for (const v of sweep.variants || []) for (const k of Object.keys(v.params || {})) if (!keys.includes(k)) keys.push(k);
  return keys;
}

// -- the table -----------------------------------------------------------------------------------
function columns(sweep) {
  const goal = sweep.objective ? ` (${sweep.objective.metric}, ${sweep.objective.goal})` : "";
  return [
    { id: "index", label: "#", get: (v) => v.index },
    ...paramKeys(sweep).map((k) => ({ id: `p:${k}`, label: k, mono: true, get: (v) => (v.params || {})[k] })),
    { id: "status", label: "Status", get: (v) => (v.pruned ? "pruned" : v.status),
      cell: (v) => (v.pruned ? [badge(v.status), h("span", { class: "pruned-mark", title: "The study's pruner stopped this trial" }, "pruned")] : badge(v.status)) },
    { id: "worker", label: "Worker", get: (v) => v.worker_id || null },
    { id: "duration", label: "Duration", get: (v) => v.duration_s, cell: (v) => duration(v.duration_s) },
    { id: "objective", label: `Objective${goal}`, get: (v) => v.objective },
    { id: "run", label: "Run", get: (v) => v.run_id || null,
      cell: (v) => (v.run_id ? h("a", { class: "mono", href: `/#run=${encodeURIComponent(v.run_id)}` }, v.run_id) : v.error ? h("span", { class: "error-text small" }, v.error) : "") },
  ];
}

/** Sort order: numbers by value, text by text; a missing value last whichever way. */
export function compare(a, b) {
  const na = a === undefined || a === null || a === "", nb = b === undefined || b === null || b === "";
  if (na || nb) return na && nb ? 0 : na ? 1 : -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(shown(a)).localeCompare(String(shown(b)), undefined, { numeric: true });
}

function renderTable(sweep) {
  const cols = columns(sweep);
  const col = cols.find((c) => c.id === state.sort.col) || cols[0];
  const rows = [...(sweep.variants || [])].sort((x, y) => {
    const a = col.get(x), b = col.get(y);
    const missing = (a === undefined || a === null || a === "") !== (b === undefined || b === null || b === "");
    const c = missing ? compare(a, b) : state.sort.dir * compare(a, b);
    return c || x.index - y.index;
  });
  const more = rows.length - MAX_ROWS;
  if (more > 0) rows.length = MAX_ROWS;
  $("variants-more").hidden = more <= 0;
  $("variants-more").textContent = more > 0 ? `The first ${MAX_ROWS} of ${sweep.variants.length} variants in this order; sort by another column to see others, or \`cdui sweep show ${sweep.id}\` for all.` : "";
  fill($("variants"),
    h("thead", {}, h("tr", {}, cols.map((c) => h("th", { scope: "col", dataset: { col: c.id },
      "aria-sort": c.id === col.id ? (state.sort.dir > 0 ? "ascending" : "descending") : "none" },
      h("button", { type: "button", class: "link sort", onclick: () => sortBy(c.id) },
        c.label, c.id === col.id ? (state.sort.dir > 0 ? " ▲" : " ▼") : ""))))),
    h("tbody", {}, rows.map((v) => h("tr", { class: v.best ? "best" : v.pruned ? "pruned" : "",
      dataset: { variant: v.index, status: v.status, pruned: v.pruned ? "1" : null },
      title: v.best ? "The best variant" : v.pruned ? "Pruned: stopped early by the study's pruner" : null },
      cols.map((c) => h("td", { class: c.mono ? "mono" : "", dataset: { col: c.id } }, c.cell ? c.cell(v) : shown(c.get(v))))))));
}

function sortBy(colId) {
  state.sort = state.sort.col === colId ? { col: colId, dir: -state.sort.dir } : { col: colId, dir: 1 };
  if (state.sweep) renderTable(state.sweep);
}

function fact(label, value) {
  return value == null || value === "" ? [] : [h("dt", {}, label), h("dd", {}, value)];
}

function renderFacts(sweep) {
  const study = sweep.kind === "study";
  $("sweep-title").textContent = `${study ? "Study" : "Sweep"} ${sweep.id}${sweep.name ? ` — ${sweep.name}` : ""}`;
  document.title = `${study ? "Study" : "Sweep"} ${sweep.id} · cdui`;
  const counts = Object.entries(sweep.counts || {}).map(([k, n]) => `${n} ${k}`).join(", ");
  const best = sweep.best;
  fill($("sweep-facts"),
    fact("Status", badge(sweep.status)), fact("Mode", sweep.mode),
    study ? fact("Trials", `${sweep.total} of ${sweep.n_trials}${counts ? ` (${counts})` : ""}`)
      : fact("Variants", `${sweep.total}${counts ? ` (${counts})` : ""}`),
    study ? [fact("Sampler", sweep.sampler && sweep.sampler.name), fact("Pruner", sweep.pruner && sweep.pruner.name),
      fact("Seed", sweep.seed)] : [],
    fact(study ? "Parallelism" : "Max running", sweep.max_running),
    fact("Target", target((sweep.options || {}).target)),
    fact("Objective", sweep.objective ? `${sweep.objective.metric} (${sweep.objective.goal})` : "none"),
    fact("Best", best ? h("span", { id: "sweep-best" }, `#${best.index}: ${num(best.objective)} with ${Object.entries(best.params || {}).map(([k, v]) => `${k}=${shown(v)}`).join(", ")}`) : ""),
    fact("Created", time(sweep.created_at)), fact("Stopped", time(sweep.stopped_at)));
  $("btn-sweep-stop").disabled = !LIVE.has(sweep.status) || sweep.status === "stopping";
  const retryable = (sweep.variants || []).some((v) => ["failed", "interrupted", "cancelled"].includes(v.status));
  $("btn-sweep-retry").disabled = !retryable || study;
  $("btn-sweep-retry").hidden = study;
}

// -- the plots -----------------------------------------------------------------------------------
const W = 320, H = 220, PAD = { l: 56, r: 12, t: 12, b: 40 };

/** A scale for a param's values: numbers on a line (a log line when they are positive and span 100×
 *  or more), anything else spread as categories. Answers {pos(v) in 0..1, ticks: [[v, label]]}. */
export function scaleOf(values) {
  const nums = values.filter((v) => typeof v === "number" && isFinite(v));
  if (values.length && nums.length === values.length) {
    let lo = Math.min(...nums), hi = Math.max(...nums);
    const log = lo > 0 && hi / lo >= 100;
    const f = log ? Math.log10 : (x) => x;
    let a = f(lo), b = f(hi);
    if (a === b) { a -= 1; b += 1; lo = log ? 10 ** a : a; hi = log ? 10 ** b : b; }
    const pos = (v) => (f(v) - a) / (b - a);
    const ticks = [...new Set(nums)].sort((x, y) => x - y);
    const shownTicks = ticks.length <= 6 ? ticks : [ticks[0], ticks[Math.floor(ticks.length / 2)], ticks[ticks.length - 1]];
    return { pos, ticks: shownTicks.map((t) => [t, num(t)]), log };
  }
  const cats = [...new Set(values.map((v) => shown(v)))];
  return { pos: (v) => (cats.length === 1 ? 0.5 : cats.indexOf(shown(v)) / (cats.length - 1)), ticks: cats.map((c) => [c, c]), log: false };
}

function scatter(key, points, yScale, best) {
  const xs = scaleOf(points.map((p) => p.x));
  const iw = W - PAD.l - PAD.r, ih = H - PAD.t - PAD.b;
  const X = (v) => PAD.l + 8 + xs.pos(v) * (iw - 16), Y = (v) => PAD.t + ih - 6 - yScale.pos(v) * (ih - 12);
  return h("figure", { class: "scatter", dataset: { param: key } },
    s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": `objective against ${key}` },
      s("rect", { x: PAD.l, y: PAD.t, width: iw, height: ih, class: "plot-area" }),
      xs.ticks.map(([v, label]) => s("text", { x: X(v), y: H - PAD.b + 16, class: "tick", "text-anchor": "middle" }, label.slice(0, 12))),
      yScale.ticks.map(([v, label]) => s("text", { x: PAD.l - 4, y: Y(v) + 4, class: "tick", "text-anchor": "end" }, label.slice(0, 9))),
      s("text", { x: PAD.l + iw / 2, y: H - 4, class: "axis-label", "text-anchor": "middle" }, `${key}${xs.log ? " (log)" : ""}`),
      points.map((p) => s("circle", { cx: X(p.x), cy: Y(p.y), r: p.index === best ? 6 : 4,
        class: `pt${p.index === best ? " best" : ""}`, "data-variant": p.index },
      s("title", {}, `#${p.index}: ${key}=${shown(p.x)}, objective ${num(p.y)}`)))));
}

function parallel(keys, done, metric, best) {
  const axes = [...keys.map((k) => ({ label: k, scale: scaleOf(done.map((v) => v.params[k])), get: (v) => v.params[k] })),
    { label: metric, scale: scaleOf(done.map((v) => v.objective)), get: (v) => v.objective }];
  const width = Math.max(460, 170 * axes.length), height = 260, top = 20, bottom = 36, side = 100; // room for a label
  const X = (i) => side + i * ((width - 2 * side) / Math.max(1, axes.length - 1));
  const Y = (a, v) => top + (1 - a.scale.pos(v)) * (height - top - bottom);
  const order = [...done].sort((a, b) => (a.index === best) - (b.index === best)); // the best drawn last, on top
  return s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", class: "parallel",
    "aria-label": `parallel coordinates of ${keys.join(", ")} and ${metric}` },
  axes.map((a, i) => s("g", { class: "pc-axis" },
    s("line", { x1: X(i), x2: X(i), y1: top, y2: height - bottom }),
    a.scale.ticks.map(([v, label]) => s("text", { x: X(i) + 4, y: Y(a, v) + 4, class: "tick" }, label.slice(0, 10))),
    s("text", { x: X(i), y: height - 12, class: "axis-label", "text-anchor": "middle" }, a.label))),
  order.map((v) => s("polyline", { class: `pc-line${v.index === best ? " best" : ""}`, "data-variant": v.index,
    points: axes.map((a, i) => `${X(i).toFixed(1)},${Y(a, a.get(v)).toFixed(1)}`).join(" ") },
  s("title", {}, `#${v.index}: ${keys.map((k) => `${k}=${shown(v.params[k])}`).join(", ")} → ${num(v.objective)}`))));
}

function renderPlots(sweep) {
  $("sweep-plots").hidden = false;
  const none = $("sweep-plots-none");
  const keys = paramKeys(sweep);
  const all = (sweep.variants || []).filter((v) => typeof v.objective === "number" && isFinite(v.objective));
  const done = all.length > MAX_PLOTTED ? all.filter((v, i) => i < MAX_PLOTTED - 1 || v.best) : all;
  $("sweep-plots-more").hidden = all.length === done.length;
  $("sweep-plots-more").textContent = `${done.length} of the ${all.length} variants with an objective are drawn (the best among them).`;
  const why = !sweep.objective ? "This sweep has no objective: give one (a metric its graph emits) to plot the variants."
    : !done.length ? `No variant has reported ${sweep.objective.metric} yet.` : "";
  none.hidden = !why;
  none.textContent = why;
  if (why) { fill($("scatters")); fill($("parallel")); return; }
  const best = sweep.best ? sweep.best.index : null;
  const yScale = scaleOf(done.map((v) => v.objective));
  fill($("scatters"), keys.map((k) => scatter(k, done.map((v) => ({ index: v.index, x: v.params[k], y: v.objective })), yScale, best)));
  fill($("parallel"), parallel(keys, done, sweep.objective.metric, best));
}

// -- a study's own plots -------------------------------------------------------------------------
/** The optimisation history: each complete trial's objective in trial order, and the best so far as a step line. */
export function historyPlot(history, metric, best) {
  const width = 480, height = 240, pad = { l: 56, r: 12, t: 12, b: 40 };
  const iw = width - pad.l - pad.r, ih = height - pad.t - pad.b;
  const ys = scaleOf(history.flatMap((p) => [p.objective, p.best_so_far]));
  // Trial numbers on a linear axis, whatever their span (scaleOf would make 1..150 a log axis).
  const first = history[0].index, last = history[history.length - 1].index;
  const xs = { pos: (v) => (last === first ? 0.5 : (v - first) / (last - first)),
    ticks: [...new Set([first, Math.round((first + last) / 2), last])].map((v) => [v, String(v)]) };
  const X = (v) => pad.l + 8 + xs.pos(v) * (iw - 16), Y = (v) => pad.t + ih - 6 - ys.pos(v) * (ih - 12);
  const line = [];
  history.forEach((p, i) => {
    if (i) line.push(`${X(p.index).toFixed(1)},${Y(history[i - 1].best_so_far).toFixed(1)}`);
    line.push(`${X(p.index).toFixed(1)},${Y(p.best_so_far).toFixed(1)}`);
  });
  return s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", class: "history scatter",
    "aria-label": `optimisation history of ${metric}` },
  s("rect", { x: pad.l, y: pad.t, width: iw, height: ih, class: "plot-area" }),
  ys.ticks.map(([v, label]) => s("text", { x: pad.l - 4, y: Y(v) + 4, class: "tick", "text-anchor": "end" }, label.slice(0, 9))),
  xs.ticks.map(([v, label]) => s("text", { x: X(v), y: height - pad.b + 16, class: "tick", "text-anchor": "middle" }, label)),
  s("text", { x: pad.l + iw / 2, y: height - 4, class: "axis-label", "text-anchor": "middle" }, `trial (${metric}; the line: best so far)`),
  s("polyline", { class: "best-line", points: line.join(" ") }),
  history.map((p) => s("circle", { cx: X(p.index), cy: Y(p.objective), r: p.index === best ? 6 : 4,
    class: `hist-pt${p.index === best ? " best" : ""}`, "data-trial": p.index },
  s("title", {}, `trial ${p.index}: ${num(p.objective)} (best so far ${num(p.best_so_far)})`))));
}

/** The params' importance (Optuna's fANOVA, computed by the server) as horizontal bars, largest first. */
export function importanceBars(importances) {
  const items = Object.entries(importances).sort((a, b) => b[1] - a[1]);
  const width = 420, row = 26, left = 160, height = 16 + row * items.length;
  return s("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", class: "importance",
    "aria-label": "param importance" },
  items.map(([k, v], i) => s("g", { "data-param": k },
    s("text", { x: left - 6, y: 12 + i * row + 12, class: "axis-label", "text-anchor": "end" }, k.slice(0, 22)),
    s("rect", { x: left, y: 8 + i * row, height: row - 8, width: Math.max(1, v * (width - left - 50)), class: "imp-bar" }),
    s("text", { x: left + Math.max(1, v * (width - left - 50)) + 4, y: 12 + i * row + 12, class: "tick" }, `${(v * 100).toFixed(0)} %`),
    s("title", {}, `${k}: ${num(v)}`))));
}

function renderStudy(study) {
  $("study-plots").hidden = false;
  const history = study.history || [];
  const why = history.length ? "" : `No trial has completed with ${study.objective.metric} yet.`;
  $("study-plots-none").hidden = !why;
  $("study-plots-none").textContent = why;
  fill($("history"), history.length ? historyPlot(history, study.objective.metric, study.best ? study.best.index : null) : []);
  fill($("importance"), study.importances ? [h("figcaption", { class: "small muted" }, "Param importance"), importanceBars(study.importances)]
    : h("figcaption", { class: "small muted" }, "Param importance shows once 4 trials have completed."));
}

// -- loading ---------------------------------------------------------------------------------------
function render(sweep) {
  state.sweep = sweep;
  $("sweep").hidden = false;
  renderFacts(sweep);
  renderTable(sweep);
  renderPlots(sweep);
  if (sweep.kind === "study") renderStudy(sweep);
  document.body.dataset.sweepStatus = sweep.status;
}

async function load() {
  clearTimeout(state.timer);
  state.timer = null;
  try {
    // A study is read where its trials, history and importances are (its trials are a sweep's variants).
    let sweep = state.kind === "study" ? null : await api("GET", `/api/sweeps/${encodeURIComponent(state.id)}`);
    if (!sweep || sweep.kind === "study") {
      state.kind = "study";
      sweep = await api("GET", `/api/studies/${encodeURIComponent(state.id)}`);
      sweep.variants = sweep.trials;
    }
    render(sweep);
    $("server-status").textContent = "connected";
    $("server-status").className = "server-status ok";
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      showError(`Sweep ${state.id} does not exist on this server.`, "See the list of sweeps (the Sweeps link above) or `cdui sweep list`.");
      return;
    }
    showError(err.message, err.hint);
  }
  document.body.dataset.ready = "1";
  schedule();
}

/** Read the sweep again in a few seconds while it runs and the page is visible. */
function schedule() {
  clearTimeout(state.timer);
  state.timer = null;
  if (!document.hidden && state.sweep && LIVE.has(state.sweep.status)) state.timer = setTimeout(load, POLL_MS);
  document.body.dataset.polling = state.timer ? "1" : "0"; // what the page does now, for a reader or a test
}

async function act(what) {
  if (state.busy) return;
  state.busy = true;
  const out = $("sweep-action");
  try {
    const sweep = await api("POST", `/api/sweeps/${encodeURIComponent(state.id)}/${what}`);
    render(sweep);
    out.textContent = what === "stop" ? "Stopped: no more variants are released." : `Retrying ${sweep.retried ?? 0} variant(s).`;
    out.className = "small ok-text";
    schedule();
  } catch (err) {
    out.textContent = `${err.message}${err.hint ? ` (${err.hint})` : ""}`;
    out.className = "small error-text";
  } finally {
    state.busy = false;
  }
}

async function listSweeps() {
  const body = await api("GET", "/api/sweeps");
  const list = body.sweeps || [];
  $("sweeps").hidden = false;
  $("sweeps-none").hidden = list.length > 0;
  $("sweeps-table").hidden = !list.length;
  fill($("sweeps-body"), list.map((sw) => h("tr", { dataset: { sweep: sw.id } },
    h("td", { class: "mono" }, h("a", { href: `/web/sweep.html?id=${encodeURIComponent(sw.id)}` }, sw.id)),
    h("td", {}, sw.name || ""), h("td", {}, badge(sw.status)), h("td", {}, sw.mode),
    h("td", {}, `${sw.total}${sw.counts ? ` (${Object.entries(sw.counts).map(([k, n]) => `${n} ${k}`).join(", ")})` : ""}`),
    h("td", {}, sw.objective ? `${sw.objective.metric} (${sw.objective.goal})` : ""),
    h("td", { class: "nowrap" }, time(sw.created_at)))));
  document.body.dataset.ready = "1";
}

async function main() {
  try {
    if (!getToken() && !(await bootstrap())) {
      throw new PageError(bootstrapRefusal || "This page needs the session token, and could not fetch it by itself.",
        "Open the runs page (/) in this tab and give the token there, then come back to this address.");
    }
    api("GET", "/api/health/live").then((hv) => { $("version").textContent = `v${hv.version}`; }).catch(() => {});
    const raw = new URLSearchParams(location.search).get("id") ?? new URLSearchParams(location.hash.slice(1)).get("sweep");
    if (raw == null || raw === "") {
      await listSweeps();
      $("server-status").textContent = "connected";
      $("server-status").className = "server-status ok";
      return;
    }
    if (!SWEEP_ID.test(raw)) {
      throw new PageError(`Not a sweep id: ${JSON.stringify(raw.slice(0, 80))}.`,
        "A sweep id is 1 to 64 letters, digits, _ or - (as `cdui sweep list` shows them).");
    }
    state.id = raw;
    $("btn-sweep-stop").addEventListener("click", () => act("stop"));
    $("btn-sweep-retry").addEventListener("click", () => act("retry"));
    document.addEventListener("visibilitychange", () => {
      if (document.hidden) schedule(); else if (!state.timer) load();
    });
    await load();
  } catch (err) {
    showError(String((err && err.message) || err), err && err.hint);
    document.body.dataset.ready = "1";
  }
}

main();
