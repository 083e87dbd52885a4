// New sweep from a run: its stored graph (GET /api/runs/{id}/graph), the params its nodes declare
// (GET /api/nodes: type, bounds, options), one axis per param ticked (a comma list of values, a
// range START:STOP:STEP with the stop included, or in random mode a distribution), a mode, max
// running, an objective and a target as the clone form takes it; POST /api/sweeps, then the sweep's
// page. What `cdui sweep GRAPH --param ...` does.
import { api, ApiError } from "./api.js";
import { $, fill, h } from "./dom.js";
import { declarations, nodeParams } from "./params.js";

const MAX_VARIANTS = 10000; // the server's bound on a sweep's variants (docs/sweeps.md)
const RANGE = /^\s*([-+]?[\d.eE+-]+)\s*:\s*([-+]?[\d.eE+-]+)\s*:\s*([-+]?[\d.eE+-]+)\s*$/;
const DIST = /^\s*(uniform|loguniform|randint)\s*\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)\s*$/;
const METRICS = ["val_loss", "val_accuracy", "train_loss", "train_accuracy"];

let current = null;



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
  const box = $("newsweep");
  box.hidden = true;
  fill(box);
  $("btn-sweep").setAttribute("aria-expanded", "false");
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

/** Open the form for ``run``. ``ctx.targets``: the submit form's Queue on… select (its choices are copied). */
export async function open(run, ctx) {
  const box = $("newsweep");
  $("btn-sweep").setAttribute("aria-expanded", "true");
  box.hidden = false;
  fill(box, h("p", { class: "muted" }, `Reading run ${run.id}'s graph…`));
  let graph, decls;
  try {
    graph = (await api("GET", `/api/runs/${encodeURIComponent(run.id)}/graph`)).graph;
    decls = await declarations([...new Set((graph.nodes || []).map((n) => String(n.type)))]);
  } catch (err) {
    fill(box, h("p", { class: "error-text" }, `Cannot sweep run ${run.id}'s graph: ${err.message}${err.hint ? ` (${err.hint})` : ""}`));
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
  const device = h("input", { id: "sweep-device", list: "device-options", placeholder: "auto", autocomplete: "off" });
  const name = h("input", { id: "sweep-name", autocomplete: "off", maxlength: 200,
    value: run.name ? `${run.name} sweep` : "" , placeholder: "optional" });
  const count = h("p", { id: "sweep-count", class: "sweep-count", "aria-live": "polite" });
  const result = h("div", { id: "sweep-result", "aria-live": "polite" });
  const submit = h("button", { type: "submit", id: "btn-sweep-submit" }, "Start the sweep");
  const form = h("form", { id: "sweep-form", novalidate: true },
    h("h3", {}, `New sweep of run ${run.id}'s graph`),
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
    count,
    h("div", { class: "actions" }, submit, h("button", { type: "button", id: "btn-sweep-cancel", onclick: close }, "Cancel")),
    result);
  current = { run, graph, rows, ui: { mode, draws, seed, randomOnly, maxRunning, metric, goal, targetSel, device, name, count, result, submit } };
  const recount = () => { if (current) read(current, false); };
  form.addEventListener("input", recount);
  form.addEventListener("change", recount);
  form.addEventListener("submit", (e) => { e.preventDefault(); start(current, ctx); });
  fill(box, form);
  recount();
}

/** The form's axes and the variant count (shown live); with ``mark``, each bad axis says why. */
function read(cur, mark) {
  const axes = {}, counts = [], errors = [];
  for (const r of cur.rows) {
    if (!r.pick.checked) { r.err.hidden = true; continue; }
    const got = parseAxis(r.key, r.values.value);
    r.err.hidden = !(got.error && mark);
    r.err.textContent = got.error || "";
    if (got.error) { errors.push(got.error); continue; }
    axes[r.key] = got.axis;
    counts.push(got.count);
  }
  const ui = cur.ui;
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
  const { axes, errors } = read(cur, true);
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
  const body = { graph: cur.graph, axes, mode: ui.mode.value, options, max_running: maxRunning };
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
