// New sweep from a run (its stored graph, GET /api/runs/{id}/graph) or from a canvas tab (the tab's
// graph, canvas/run.js): the params its nodes declare (GET /api/nodes: type, bounds, options), one axis
// per param ticked (a comma list of values, a range START:STOP:STEP with the stop included, or in random
// mode a distribution), a mode, max running, an objective and a target as Queue on… takes it; in list
// mode the variants themselves may be written out and edited (a JSON list of {node.param: value}
// objects, sent as `variants`); POST /api/sweeps, then the sweep's page. What `cdui sweep GRAPH
// --param ...` does.
import { api, ApiError } from "./api.js";
import { $, fill, h } from "./dom.js";
import { declarations, nodeParams } from "./params.js";

const MAX_VARIANTS = 10000; // the server's bound on a sweep's variants (docs/sweeps.md)
const RANGE = /^\s*([-+]?[\d.eE+-]+)\s*:\s*([-+]?[\d.eE+-]+)\s*:\s*([-+]?[\d.eE+-]+)\s*$/;
const DIST = /^\s*(uniform|loguniform|randint)\s*\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)\s*$/;
const METRICS = ["val_loss", "val_accuracy", "train_loss", "train_accuracy"];

let current = null;
let shown = null; // {box, button} of the open form: the runs page's, or the one a caller (the canvas) gave



/** One value as the command line reads it: JSON where it parses, else text. */
function oneValue(text) {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** An axis typed as text: {axis, count} or {error}. A range's values are counted here and made by the
 *  server (the same rounding as `cdui sweep`); a list's values are sent as typed. */
export function parseAxis(key, text) {
  const t = String(text || "").trim();
  if (!t) return { error: `${key}: no values; give a comma list (0.1,0.01) or a range START:STOP:STEP (32:128:32)` };
  const d = DIST.exec(t);
  if (d) {
    const [lo, hi] = [Number(d[2]), Number(d[3])];
    if (!isFinite(lo) || !isFinite(hi)) return { error: `${key}: "${t}" needs two numbers, e.g. ${d[1]}(0.0001,0.1)` };
    if (hi < lo) return { error: `${key}: "${t}" has its high end below its low one` };
    return { axis: { [d[1]]: [lo, hi] }, count: null }; // a distribution: drawn from in random mode only
  }
  const m = RANGE.exec(t);
  if (m) {
    const [start, stop, step] = [Number(m[1]), Number(m[2]), Number(m[3])];
    if (![start, stop, step].every(isFinite)) return { error: `${key}: "${t}" is not a range of numbers START:STOP:STEP` };
    if (step <= 0) return { error: `${key}: the step of "${t}" is ${step}; give a step above 0` };
    if (stop < start) return { error: `${key}: "${t}" stops (${stop}) before it starts (${start}); give START ≤ STOP` };
    const count = Math.floor((stop - start) / step + 1e-9) + 1;
    return { axis: { range: [start, stop, step] }, count };
  }
  const parts = t.split(",").map((s) => s.trim());
  if (parts.some((s) => !s)) return { error: `${key}: "${t}" has an empty value between commas` };
  return { axis: parts.map(oneValue), count: parts.length };
}

/** The variants a set of axis counts gives in a mode: {count} or {error}. */
export function variantCount(mode, counts, draws) {
  if (!counts.length) return { error: "Tick at least one param to sweep." };
  if (mode === "random") {
    if (!Number.isInteger(draws) || draws < 1 || draws > MAX_VARIANTS) return { error: `Random mode draws a count of variants: give a whole number from 1 to ${MAX_VARIANTS}.` };
    return { count: draws };
  }
  if (counts.includes(null)) return { error: "A distribution (uniform, loguniform, randint) is for random mode; give values or a range, or choose random." };
  if (mode === "list") {
    if (new Set(counts).size > 1) return { error: `In list mode every axis has as many values; these have ${counts.join(", ")}.` };
    return { count: counts[0] };
  }
  const n = counts.reduce((a, b) => a * b, 1);
  return n > MAX_VARIANTS ? { error: `${n} variants: a sweep has at most ${MAX_VARIANTS}; take fewer values.`, count: n } : { count: n };
}

export function close() {
  current = null;
  const { box, button } = shown || { box: $("newsweep"), button: $("btn-sweep") };
  shown = null;
  if (box) { box.hidden = true; fill(box); }
  if (button) button.setAttribute("aria-expanded", "false");
}

/** The list mode's variants in zip order from the axes' values (a range's counted out as the server
 *  does: floats rounded to 12 decimals); null where an axis is a distribution. */
export function zipVariants(axes) {
  const lists = {};
  for (const [key, axis] of Object.entries(axes)) {
    if (Array.isArray(axis)) { lists[key] = axis; continue; }
    if (!axis || !Array.isArray(axis.range)) return null;
    const [start, stop, step] = axis.range;
    const n = Math.floor((stop - start) / step + 1e-9) + 1;
    const ints = [start, stop, step].every(Number.isInteger);
    lists[key] = Array.from({ length: n }, (_, i) => ints ? start + i * step : Number((start + i * step).toFixed(12)));
  }
  const n = Math.min(...Object.values(lists).map((l) => l.length));
  return Array.from({ length: Number.isFinite(n) ? n : 0 }, (_, i) =>
    Object.fromEntries(Object.entries(lists).map(([k, l]) => [k, l[i]])));
}

/** The variants written in the form: {variants} or {error}; {variants: null} when left empty. */
export function parseVariants(text) {
  const t = String(text || "").trim();
  if (!t) return { variants: null };
  let v;
  try {
    v = JSON.parse(t);
  } catch (err) {
    return { error: `The variants are not JSON (${err.message}); write a list such as [{"train.epochs": 10}, {"train.epochs": 20}]` };
  }
  if (!Array.isArray(v) || !v.length) return { error: "The variants must be a list of at least one {\"node.param\": value} object." };
  if (v.length > MAX_VARIANTS) return { error: `${v.length} variants: a sweep has at most ${MAX_VARIANTS}.` };
  const bad = v.findIndex((x) => !x || typeof x !== "object" || Array.isArray(x) || !Object.keys(x).length);
  if (bad >= 0) return { error: `Variant ${bad} is not an object of {"node.param": value}; each variant sets at least one param.` };
  return { variants: v };
}

function bounds(decl) {
  const parts = [decl.type || "string"];
  if (decl.min != null || decl.max != null) parts.push(`${decl.min ?? "…"} to ${decl.max ?? "…"}`);
  if (Array.isArray(decl.options) && decl.options.length) parts.push(decl.options.slice(0, 8).join(" | "));
  return parts.join(", ");
}

function row(nodeId, decl, params, n) {
  const key = `${nodeId}.${decl.name}`;
  const now = Object.prototype.hasOwnProperty.call(params, decl.name) ? params[decl.name] : decl.default;
  const id = `sweep-p${n}`;
  const pick = h("input", { type: "checkbox", id: `${id}-on`, dataset: { param: key }, "aria-label": `Sweep ${key}` });
  const values = h("input", { id, type: "text", class: "mono", autocomplete: "off", spellcheck: "false", disabled: true,
    dataset: { param: key }, placeholder: decl.type === "int" || decl.type === "float" ? "0.1,0.01 or 32:128:32" : "a,b,c",
    "aria-label": `Values of ${key}` });
  const err = h("div", { class: "error-text small", hidden: true });
  pick.addEventListener("change", () => {
    values.disabled = !pick.checked;
    if (pick.checked && !values.value && now != null) values.value = typeof now === "string" ? now : JSON.stringify(now);
    if (pick.checked) values.focus();
  });
  const tr = h("tr", { dataset: { param: key } },
    h("td", {}, pick),
    h("td", {}, h("label", { for: `${id}-on`, class: "mono", title: decl.description || "" }, key)),
    h("td", { class: "small muted" }, bounds(decl)),
    h("td", { class: "small mono" }, now == null ? "" : typeof now === "string" ? now.slice(0, 40) : JSON.stringify(now).slice(0, 40)),
    h("td", {}, values, err));
  return { key, pick, values, err, tr };
}

/** Open the form for ``run``. ``ctx.targets``: a Queue on… select (its choices are copied, its choice
 *  kept). From elsewhere than the runs page (the canvas): ``ctx.graph`` (the graph itself; ``run`` then
 *  only names it), ``ctx.box`` and ``ctx.button`` (where the form shows, and the button that opens it),
 *  ``ctx.title``, ``ctx.device`` and ``ctx.recordOutputs`` (the options already chosen there) and
 *  ``ctx.onStarted(sweep)``. */
export async function open(run, ctx) {
  const box = ctx.box || $("newsweep");
  const button = ctx.button || $("btn-sweep");
  shown = { box, button };
  button.setAttribute("aria-expanded", "true");
  box.hidden = false;
  const what = ctx.graph ? "the graph" : `run ${run.id}'s graph`;
  fill(box, h("p", { class: "muted" }, `Reading ${what}…`));
  let graph, decls;
  try {
    graph = ctx.graph || (await api("GET", `/api/runs/${encodeURIComponent(run.id)}/graph`)).graph;
    decls = await declarations([...new Set((graph.nodes || []).map((n) => String(n.type)))]);
  } catch (err) {
    fill(box, h("p", { class: "error-text" }, `Cannot sweep ${what}: ${err.message}${err.hint ? ` (${err.hint})` : ""}`));
    return;
  }
  if (box.hidden) return; // closed meanwhile
  const rows = [];
  let n = 0;
  for (const node of graph.nodes || []) {
    if (!node || typeof node !== "object") continue;
    for (const decl of decls[String(node.type)] || []) {
      if (decl.type === "secret") continue;
      rows.push(row(String(node.id), decl, nodeParams(node), n++));
    }
  }
  const mode = h("select", { id: "sweep-mode" }, h("option", { value: "grid" }, "grid (every combination)"),
    h("option", { value: "list" }, "list (the i-th values together)"),
    h("option", { value: "random" }, "random (draws, with a seed)"));
  const draws = h("input", { id: "sweep-draws", type: "number", min: 1, max: MAX_VARIANTS, value: 8, class: "num" });
  const seed = h("input", { id: "sweep-seed", type: "number", min: 0, value: 0, class: "num" });
  const randomOnly = h("div", { class: "row", hidden: true },
    h("div", {}, h("label", { for: "sweep-draws" }, "Variants to draw"), draws),
    h("div", {}, h("label", { for: "sweep-seed" }, "Seed"), seed),
    h("p", { class: "small muted" }, "Each ticked param is drawn from its values, its range or a distribution: uniform(lo,hi), loguniform(lo,hi), randint(lo,hi)."));
  const maxRunning = h("input", { id: "sweep-max-running", type: "number", min: 1, max: 1000, value: 4, class: "num" });
  const metric = h("input", { id: "sweep-objective", list: "sweep-metrics", placeholder: "none (e.g. val_loss)", autocomplete: "off" });
  const goal = h("select", { id: "sweep-goal" }, h("option", { value: "min" }, "min"), h("option", { value: "max" }, "max"));
  const targetSel = h("select", { id: "sweep-target" }, [...ctx.targets.options].map((o) => h("option", { value: o.value }, o.textContent)));
  targetSel.value = ctx.targets.value;
  const device = h("input", { id: "sweep-device", list: "device-options", placeholder: "auto", autocomplete: "off",
    value: ctx.device || "" });
  const variants = h("textarea", { id: "sweep-variants", class: "mono", rows: 5, spellcheck: "false",
    placeholder: '[{"train.epochs": 10, "optimizer.lr": 0.1}, {"train.epochs": 20}]', "aria-label": "Variants (JSON)" });
  const fromAxes = h("button", { type: "button", id: "btn-sweep-variants-fill" }, "Write out the ticked params' variants");
  const listOnly = h("div", { class: "sweep-variants", hidden: true },
    h("label", { for: "sweep-variants" }, "Variants (list mode, optional): each a {node.param: value} object, edited freely; when given, they are the sweep's variants and the ticked params are not used"),
    variants, h("div", { class: "actions" }, fromAxes));
  const name = h("input", { id: "sweep-name", autocomplete: "off", maxlength: 200,
    value: run && run.name ? `${run.name} sweep` : "" , placeholder: "optional" });
  const count = h("p", { id: "sweep-count", class: "sweep-count", "aria-live": "polite" });
  const result = h("div", { id: "sweep-result", "aria-live": "polite" });
  const submit = h("button", { type: "submit", id: "btn-sweep-submit" }, "Start the sweep");
  const form = h("form", { id: "sweep-form", novalidate: true },
    h("h3", {}, ctx.title || `New sweep of run ${run.id}'s graph`),
    h("p", { class: "small muted" }, "Tick the params to vary; give each a comma list of values or a range START:STOP:STEP (the stop included). Each variant runs as an ordinary run."),
    h("div", { class: "table-wrap sweep-params" }, h("table", { class: "compare-table" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, ""), h("th", { scope: "col" }, "node.param"),
        h("th", { scope: "col" }, "type"), h("th", { scope: "col" }, "now"), h("th", { scope: "col" }, "values"))),
      h("tbody", {}, rows.map((r) => r.tr)))),
    h("datalist", { id: "sweep-metrics" }, METRICS.map((m) => h("option", { value: m }))),
    h("div", { class: "row" },
      h("div", {}, h("label", { for: "sweep-mode" }, "Mode"), mode),
      h("div", {}, h("label", { for: "sweep-max-running" }, "Max running"), maxRunning),
      h("div", {}, h("label", { for: "sweep-objective" }, "Objective metric"), metric),
      h("div", {}, h("label", { for: "sweep-goal" }, "Goal"), goal)),
    h("div", { class: "row" },
      h("div", {}, h("label", { for: "sweep-target" }, "Queue on…"), targetSel),
      h("div", {}, h("label", { for: "sweep-device" }, "Device"), device),
      h("div", {}, h("label", { for: "sweep-name" }, "Name"), name)),
    randomOnly,
    listOnly,
    count,
    h("div", { class: "actions" }, submit, h("button", { type: "button", id: "btn-sweep-cancel", onclick: close }, "Cancel")),
    result);
  current = { run, graph, rows, recordOutputs: !!ctx.recordOutputs,
    ui: { mode, draws, seed, randomOnly, listOnly, variants, maxRunning, metric, goal, targetSel, device, name, count, result, submit } };
  const recount = () => { if (current) read(current, false); };
  fromAxes.addEventListener("click", () => {
    const cur = current;
    if (!cur) return;
    const axes = {};
    for (const r of cur.rows) {
      if (!r.pick.checked) continue;
      const got = parseAxis(r.key, r.values.value);
      if (got.axis) axes[r.key] = got.axis;
    }
    const zipped = zipVariants(axes);
    variants.value = zipped && zipped.length ? `[\n${zipped.map((v) => "  " + JSON.stringify(v)).join(",\n")}\n]` : "";
    recount();
  });
  form.addEventListener("input", recount);
  form.addEventListener("change", recount);
  form.addEventListener("submit", (e) => { e.preventDefault(); start(current, ctx); });
  fill(box, form);
  recount();
}

/** The form's axes and the variant count (shown live); with ``mark``, each bad axis says why. */
function read(cur, mark) {
  const axes = {}, counts = [], errors = [];
  const ui = cur.ui;
  ui.listOnly.hidden = ui.mode.value !== "list";
  const written = ui.mode.value === "list" ? parseVariants(ui.variants.value) : { variants: null };
  if (written.error || written.variants) {
    for (const r of cur.rows) r.err.hidden = true;
    ui.randomOnly.hidden = true;
    ui.count.dataset.count = written.error ? "" : String(written.variants.length);
    ui.count.className = `sweep-count${written.error ? " warn-text" : ""}`;
    ui.count.textContent = written.error || `${written.variants.length} variant${written.variants.length === 1 ? "" : "s"} (as written)`;
    return { axes: {}, variants: written.variants, errors: written.error ? [written.error] : [] };
  }
  for (const r of cur.rows) {
    if (!r.pick.checked) { r.err.hidden = true; continue; }
    const got = parseAxis(r.key, r.values.value);
    r.err.hidden = !(got.error && mark);
    r.err.textContent = got.error || "";
    if (got.error) { errors.push(got.error); continue; }
    axes[r.key] = got.axis;
    counts.push(got.count);
  }
  ui.randomOnly.hidden = ui.mode.value !== "random";
  const total = errors.length ? { error: errors[0] } : variantCount(ui.mode.value, counts, Number(ui.draws.value));
  ui.count.dataset.count = total.error ? "" : String(total.count);
  ui.count.className = `sweep-count${total.error ? " warn-text" : ""}`;
  ui.count.textContent = total.error ? total.error : `${total.count} variant${total.count === 1 ? "" : "s"}`;
  return { axes, errors: errors.length ? errors : total.error ? [total.error] : [] };
}

async function start(cur, ctx) {
  if (!cur || cur.ui.submit.disabled) return;
  const ui = cur.ui;
  const { axes, variants, errors } = read(cur, true);
  const maxRunning = Number(ui.maxRunning.value);
  if (!Number.isInteger(maxRunning) || maxRunning < 1) errors.push(`Max running "${ui.maxRunning.value}" is not a whole number of at least 1`);
  if (errors.length) {
    fill(ui.result, h("div", { class: "submit-errors" },
      h("p", { class: "error-text" }, h("strong", {}, "Nothing was started:")),
      h("ul", { class: "error-list", id: "sweep-errors" }, errors.map((e) => h("li", {}, e)))));
    return;
  }
  const options = { target: ui.targetSel.value === "one-shot" ? { pool: "one-shot" } :
    ui.targetSel.value.startsWith("worker:") ? { worker: ui.targetSel.value.slice(7) } : ui.targetSel.value };
  const device = ui.device.value.trim();
  if (device && device !== "auto") options.device = device;
  if (cur.recordOutputs) options.record_outputs = true;
  const body = variants ? { graph: cur.graph, variants, mode: "list", options, max_running: maxRunning } :
    { graph: cur.graph, axes, mode: ui.mode.value, options, max_running: maxRunning };
  if (ui.mode.value === "random") { body.count = Number(ui.draws.value); body.seed = Number(ui.seed.value) || 0; }
  const metric = ui.metric.value.trim();
  if (metric) body.objective = { metric, goal: ui.goal.value };
  if (ui.name.value.trim()) body.name = ui.name.value.trim();
  ui.submit.disabled = true;
  try {
    const sweep = await api("POST", "/api/sweeps", body);
    fill(ui.result, h("p", { class: "ok-text" }, `Started sweep ${sweep.id}: ${sweep.total} variants.`));
    (ctx.onStarted || ((s) => location.assign(`/web/sweep.html?id=${encodeURIComponent(s.id)}`)))(sweep);
  } catch (err) {
    if (!(err instanceof ApiError)) { fill(ui.result, h("p", { class: "error-text" }, String(err))); return; }
    fill(ui.result, h("div", { class: "submit-errors" },
      h("p", { class: "error-text" }, h("strong", {}, err.message)),
      err.hint ? h("p", { class: "hint" }, err.hint) : null,
      err.details ? h("ul", { class: "error-list", id: "sweep-errors" }, err.details.map((d) => h("li", {},
        h("span", { class: "code" }, d.code || "error"),
        d.node_id ? h("span", { class: "node" }, `node ${d.node_id}`) : null,
        h("span", {}, d.message || ""),
        Array.isArray(d.variants) ? h("span", { class: "muted small" }, ` [variants ${d.variants.slice(0, 20).join(", ")}${d.variants.length > 20 ? ", …" : ""}]`) : null,
        d.hint ? h("div", { class: "hint" }, d.hint) : null))) : null));
  } finally {
    ui.submit.disabled = false;
  }
}
