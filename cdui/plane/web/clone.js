// Clone with edits: a form built from a run's stored graph (GET /api/runs/{id}/graph) and its node types'
// param declarations (GET /api/nodes: type, default, options, min, max), a target like the submit form's,
// and POST /api/runs with the changed values; what `cdui runs clone ID --param NODE.PARAM=VALUE` does.
import { api, ApiError } from "./api.js";
import { $, fill, h, target as targetText } from "./dom.js";
import { declarations, isVisible, nodeParams } from "./params.js";

let current = null; // {run, graph, fields: [...], options}

const TEXT_LONG = 80; // characters: a longer text param is edited in a text area



/** The params object to write into (CodefyUI keeps them under data.params; a bare params object is read too). */
function writableParams(node) {
  if (node.data && typeof node.data === "object") {
    if (!node.data.params || typeof node.data.params !== "object") {
      if (node.params && typeof node.params === "object") return node.params;
      node.data.params = {};
    }
    return node.data.params;
  }
  if (node.params && typeof node.params === "object") return node.params;
  node.data = { params: {} };
  return node.data.params;
}

export function close() {
  current = null;
  const box = $("clone");
  box.hidden = true;
  fill(box);
  $("btn-clone").setAttribute("aria-expanded", "false");
}

/** One field: its input and a function reading it back as {value} or {error}. */
function field(nodeId, decl, params, n) {
  const key = `${nodeId}.${decl.name}`;
  const present = Object.prototype.hasOwnProperty.call(params, decl.name);
  const initial = present ? params[decl.name] : decl.default;
  const id = `clone-f${n}`;
  const type = decl.type || "string";
  const common = { id, dataset: { param: key }, "aria-describedby": `${id}-err` };
  let input, read;
  if (type === "bool") {
    input = h("input", { ...common, type: "checkbox", checked: !!initial });
    read = () => ({ value: input.checked });
  } else if (type === "select" && Array.isArray(decl.options) && decl.options.length) {
    const opts = decl.options.map(String);
    if (initial != null && !opts.includes(String(initial))) opts.unshift(String(initial));
    input = h("select", common, opts.map((o) => h("option", { value: o, selected: String(initial) === o }, o)));
    read = () => ({ value: input.value });
  } else if (type === "int" || type === "float") {
    const whole = type === "int";
    input = h("input", { ...common, type: "text", inputmode: whole ? "numeric" : "decimal", autocomplete: "off",
      spellcheck: "false", value: initial == null ? "" : String(initial), class: "num" });
    const range = decl.min != null && decl.max != null ? `${decl.min} to ${decl.max}` :
      decl.min != null ? `at least ${decl.min}` : decl.max != null ? `at most ${decl.max}` : "";
    read = () => {
      const text = input.value.trim();
      const kind = whole ? "a whole number" : "a number";
      const example = decl.default != null ? `, e.g. ${decl.default}` : "";
      if (!text) {
        if (!present && !decl.required) return { value: undefined };
        return { error: `${key} is empty: give ${kind}${range ? ` (${range})` : ""}${example}` };
      }
      const v = Number(text);
      if (!isFinite(v) || (whole && !/^[-+]?\d+$/.test(text))) {
        return { error: `${key}: "${text}" is not ${kind}; give ${kind}${range ? ` (${range})` : ""}${example}` };
      }
      if (decl.min != null && v < decl.min) return { error: `${key}: ${text} is below its minimum ${decl.min}; give ${kind} (${range})` };
      if (decl.max != null && v > decl.max) return { error: `${key}: ${text} is above its maximum ${decl.max}; give ${kind} (${range})` };
      return { value: v };
    };
  } else {
    // Text, paths and anything else: a value that is not text (a list, an object) is edited as JSON.
    const json = initial != null && typeof initial !== "string";
    const text = initial == null ? "" : json ? JSON.stringify(initial) : initial;
    const long = text.length > TEXT_LONG || text.includes("\n");
    input = long ? h("textarea", { ...common, rows: 3, spellcheck: "false" }, text)
      : h("input", { ...common, type: "text", spellcheck: "false", autocomplete: "off", value: text });
    if (long) input.value = text;
    read = () => {
      if (!json) return { value: input.value };
      try {
        return { value: JSON.parse(input.value) };
      } catch (err) {
        return { error: `${key} is not valid JSON (${err.message}); it held ${text.slice(0, 60)}` };
      }
    };
  }
  const wrap = h("div", { class: `clone-field${type === "bool" ? " check" : ""}` },
    h("label", { for: id, title: decl.description || "" }, decl.name, h("span", { class: "muted small" }, ` ${type}`)),
    input, h("div", { id: `${id}-err`, class: "error-text small", hidden: true }));
  return { key, nodeId, name: decl.name, input, wrap, read, initial: present ? params[decl.name] : undefined,
    shown: read().value, err: wrap.lastElementChild };
}

function targetChoice(t) {
  if (t == null || t === "local") return "local";
  if (typeof t === "string") return t;
  if (t.worker) return `worker:${t.worker}`;
  if (t.pool) return t.pool;
  return "local";
}

function targetValue(v) {
  if (v === "local" || v === "any") return v;
  if (v === "one-shot") return { pool: "one-shot" };
  return { worker: v.replace(/^worker:/, "") };
}

/** Open the form for ``run``. ``ctx.targets``: the submit form's Queue on… select (its choices are copied);
 *  ``ctx.onQueued(run)``: called with the new run. */
export async function open(run, ctx) {
  const box = $("clone");
  $("btn-clone").setAttribute("aria-expanded", "true");
  box.hidden = false;
  fill(box, h("p", { class: "muted" }, `Reading run ${run.id}'s graph…`));
  let graph, decls;
  try {
    graph = (await api("GET", `/api/runs/${encodeURIComponent(run.id)}/graph`)).graph;
    decls = await declarations([...new Set((graph.nodes || []).map((n) => String(n.type)))]);
  } catch (err) {
    fill(box, h("p", { class: "error-text" }, `Cannot clone run ${run.id}: ${err.message}${err.hint ? ` (${err.hint})` : ""}`));
    return;
  }
  if (!current && $("clone").hidden) return; // closed meanwhile
  const fields = [], unknown = [], secrets = [];
  const groups = [];
  let n = 0;
  for (const node of graph.nodes || []) {
    if (!node || typeof node !== "object") continue;
    const list = decls[String(node.type)];
    if (!list) { unknown.push(`${node.id} (${node.type})`); continue; }
    const params = nodeParams(node);
    const mine = [];
    for (const decl of list) {
      if (decl.type === "secret") { secrets.push(`${node.id}.${decl.name}`); continue; }
      const f = field(String(node.id), decl, params, n++);
      f.decl = decl;
      fields.push(f);
      mine.push(f);
    }
    if (mine.length) {
      // A param shown only for some values of another (visible_when, e.g. momentum for SGD only) is
      // shown as the canvas shows it: with the values the form holds now.
      const relevel = () => {
        const now = { ...params };
        for (const f of mine) {
          const r = f.read();
          if (!r.error && r.value !== undefined) now[f.name] = r.value;
        }
        for (const f of mine) f.wrap.hidden = !isVisible(f.decl, now, list);
      };
      relevel();
      const set = h("fieldset", { class: "clone-node", dataset: { node: node.id } },
        h("legend", {}, h("span", { class: "mono" }, node.id), h("span", { class: "muted small" }, ` ${node.type}`)),
        mine.map((f) => f.wrap));
      set.addEventListener("input", relevel);
      set.addEventListener("change", relevel);
      groups.push(set);
    }
  }
  const opts = run.options || {};
  const targetSel = h("select", { id: "clone-target" }, [...ctx.targets.options].map((o) => h("option", { value: o.value }, o.textContent)));
  const want = targetChoice(run.target);
  if (![...targetSel.options].some((o) => o.value === want)) targetSel.append(h("option", { value: want }, targetText(run.target)));
  targetSel.value = want;
  const device = h("input", { id: "clone-device", list: "device-options", placeholder: "auto", autocomplete: "off",
    value: opts.device && opts.device !== "auto" ? opts.device : "" });
  const record = h("input", { type: "checkbox", id: "clone-record", checked: !!opts.record_outputs });
  const result = h("div", { id: "clone-result", "aria-live": "polite" });
  const submit = h("button", { type: "submit", id: "btn-clone-submit" }, "Queue the clone");
  const form = h("form", { id: "clone-form", novalidate: true },
    h("h3", {}, `Clone run ${run.id} with edits`),
    h("p", { class: "small muted" }, "Change any value; the clone runs the same graph with them, on the target you choose."),
    unknown.length ? h("p", { class: "small warn-text" }, `Not editable here (types this server does not know): ${unknown.join(", ")}.`) : null,
    secrets.length ? h("p", { class: "small muted" }, `Secret params are never stored, so the clone runs without them: ${secrets.join(", ")}.`) : null,
    groups.length ? groups : h("p", { class: "muted" }, "This graph's nodes have no params to edit."),
    h("div", { class: "row" },
      h("div", {}, h("label", { for: "clone-target" }, "Queue on…"), targetSel),
      h("div", {}, h("label", { for: "clone-device" }, "Device"), device)),
    h("label", { class: "check" }, record, " Record node outputs"),
    h("div", { class: "actions" }, submit,
      h("button", { type: "button", id: "btn-clone-cancel", onclick: close }, "Cancel")),
    result);
  current = { run, graph, fields };
  form.addEventListener("submit", (e) => { e.preventDefault(); queue(current, { targetSel, device, record, result, submit }, ctx); });
  fill(box, form);
}

async function queue(cur, ui, ctx) {
  if (!cur || ui.submit.disabled) return;
  const errors = [];
  const changes = [];
  const graph = JSON.parse(JSON.stringify(cur.graph));
  const nodes = new Map((graph.nodes || []).map((nd) => [String(nd.id), nd]));
  for (const f of cur.fields) {
    const got = f.read();
    f.err.hidden = !got.error;
    f.err.textContent = got.error || "";
    f.input.setAttribute("aria-invalid", got.error ? "true" : "false");
    if (got.error) { errors.push(got); continue; }
    if (JSON.stringify(got.value) === JSON.stringify(f.shown)) continue; // unchanged: the graph keeps what it had
    if (got.value === undefined) continue;
    writableParams(nodes.get(f.nodeId))[f.name] = got.value;
    changes.push(`${f.key}: ${f.initial === undefined ? "(default)" : JSON.stringify(f.initial)} → ${JSON.stringify(got.value)}`);
  }
  if (errors.length) {
    fill(ui.result, h("div", { class: "submit-errors" },
      h("p", { class: "error-text" }, h("strong", {}, `Nothing was queued: ${errors.length} value${errors.length > 1 ? "s are" : " is"} not valid.`)),
      h("ul", { class: "error-list", id: "clone-errors" }, errors.map((e) => h("li", {}, e.error)))));
    const bad = cur.fields.find((f) => !f.err.hidden);
    if (bad) bad.input.focus();
    return;
  }
  const old = cur.run.options || {};
  const options = {};
  for (const k of ["devices", "memory_mb"]) if (k in old) options[k] = old[k];
  options.target = targetValue(ui.targetSel.value);
  const device = ui.device.value.trim();
  if (device && device !== "auto") options.device = device;
  if (ui.record.checked) options.record_outputs = true;
  ui.submit.disabled = true;
  try {
    const run = await api("POST", "/api/runs", { graph, options });
    fill(ui.result, h("p", { class: "ok-text" }, `Queued run ${run.id}`,
      changes.length ? `: ${changes.join("; ")}.` : " with the params unchanged."));
    await ctx.onQueued(run);
  } catch (err) {
    if (!(err instanceof ApiError)) { fill(ui.result, h("p", { class: "error-text" }, String(err))); return; }
    fill(ui.result, h("div", { class: "submit-errors" },
      h("p", { class: "error-text" }, h("strong", {}, err.message)),
      err.hint ? h("p", { class: "hint" }, err.hint) : null,
      err.details ? h("ul", { class: "error-list", id: "clone-errors" }, err.details.map((d) => h("li", {},
        h("span", { class: "code" }, d.code || "error"),
        d.node_id ? h("span", { class: "node" }, `node ${d.node_id}`) : null,
        h("span", {}, d.message || ""),
        d.hint ? h("div", { class: "hint" }, d.hint) : null))) : null));
  } finally {
    ui.submit.disabled = false;
  }
}
