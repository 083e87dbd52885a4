// The comparison page, /web/compare.html?runs=ID1,ID2,... (2 to 10 runs): their metric charts
// overlaid (one colour per run), the params that differ between their graphs and their final
// metrics. Everything comes from GET /api/runs/{id}, /api/runs/{id}/metrics and /api/runs/{id}/graph.
import { api, ApiError, bootstrap, bootstrapRefusal, getToken } from "./api.js";
import { ChartSet, familyOf } from "./charts.js";
import { $, badge, fill, h, num, target, time, TERMINAL } from "./dom.js";

const MIN_RUNS = 2, MAX_RUNS = 10;
const RUN_ID = /^[A-Za-z0-9_-]{1,64}$/;
const COLORS = ["#2f5bd3", "#d9480f", "#2b8a3e", "#ae3ec9", "#c92a2a", "#1098ad", "#e67700", "#5c7cfa",
  "#087f5b", "#862e9c"];
const URL_FORM = "/web/compare.html?runs=ID1,ID2";

class PageError extends Error {
  constructor(message, hint = "") { super(message); this.hint = hint; }
}

function showError(message, hint) {
  $("compare-error-message").textContent = message;
  $("compare-error-hint").textContent = hint || "";
  $("compare-error").hidden = false;
  $("compare-loading").hidden = true;
}

/** The run ids of ?runs=, checked: 2 to 10 distinct ids of run-id characters. */
export function parseIds(search) {
  const raw = new URLSearchParams(search).get("runs");
  if (raw == null || !raw.trim()) {
    throw new PageError("No runs to compare: the address names none.",
      `Open ${URL_FORM} with 2 to 10 run ids separated by commas (select runs on the runs page).`);
  }
  const ids = [...new Set(raw.split(",").map((s) => s.trim()).filter(Boolean))];
  const bad = ids.filter((id) => !RUN_ID.test(id));
  if (bad.length) {
    throw new PageError(`Not a run id: ${bad.map((b) => JSON.stringify(b.slice(0, 80))).join(", ")}.`,
      "A run id is 1 to 64 letters, digits, _ or - (as `cdui runs list` shows them).");
  }
  if (ids.length < MIN_RUNS) {
    throw new PageError(`Only ${ids.length} run given (${ids[0]}): comparing needs ${MIN_RUNS} to ${MAX_RUNS} runs.`,
      `Add another run id: ${URL_FORM}.`);
  }
  if (ids.length > MAX_RUNS) {
    throw new PageError(`${ids.length} runs given: at most ${MAX_RUNS} can be compared at once.`,
      `Drop ${ids.length - MAX_RUNS} of the ids from ?runs=.`);
  }
  return ids;
}

const color = (ids) => (run) => COLORS[ids.indexOf(run) % COLORS.length];

function shortName(r) {
  const name = r.name ? ` ${r.name.length > 24 ? `${r.name.slice(0, 23)}…` : r.name}` : "";
  return `${r.id}${name}`;
}

/** Every run, or one error naming every id the server does not know. */
async function loadRuns(ids) {
  const answers = await Promise.all(ids.map((id) => api("GET", `/api/runs/${encodeURIComponent(id)}`)
    .then((r) => ({ id, r }), (err) => ({ id, err }))));
  const missing = answers.filter((a) => a.err instanceof ApiError && a.err.status === 404).map((a) => a.id);
  if (missing.length) {
    throw new PageError(`${missing.length === 1 ? "Run" : "Runs"} ${missing.join(", ")} ${missing.length === 1 ? "does" : "do"} not exist on this server.`,
      "Check the ids with `cdui runs list` or on the runs page; a deleted run cannot be compared.");
  }
  const failed = answers.find((a) => a.err);
  if (failed) throw failed.err;
  return answers.map((a) => a.r);
}

// -- params that differ --------------------------------------------------------------------------
function defaultsOf(catalog) {
  const out = new Map();
  for (const n of (catalog && catalog.nodes) || []) {
    out.set(n.type, new Map((n.params || []).map((p) => [p.name, p.default])));
  }
  return out;
}

const shown = (v) => (v === undefined ? "—" : typeof v === "string" ? v : JSON.stringify(v));

/** Rows of [label, values per run] for every node param whose value is not the same in every graph
 *  (a param a graph leaves out counts as its declared default), plus nodes of another type or absent. */
export function paramDiff(graphs, defaults) {
  const order = [];
  const byRun = graphs.map((g) => {
    const m = new Map();
    for (const n of (g && g.nodes) || []) {
      if (!order.includes(n.id)) order.push(n.id);
      m.set(n.id, n);
    }
    return m;
  });
  const rows = [];
  for (const id of order) {
    const nodes = byRun.map((m) => m.get(id));
    const types = nodes.map((n) => (n ? n.type : undefined));
    if (new Set(types).size > 1) rows.push([`${id} (node type)`, types.map((t) => (t === undefined ? "(no such node)" : t))]);
    const keys = [];
    for (const n of nodes) for (const k of Object.keys((n && n.data && n.data.params) || {})) if (!keys.includes(k)) keys.push(k);
    for (const k of keys) {
      const vals = nodes.map((n) => {
        if (!n) return undefined;
        const p = (n.data && n.data.params) || {};
        if (k in p) return p[k];
        const d = defaults.get(n.type);
        return d && d.has(k) ? d.get(k) : undefined;
      });
      if (new Set(vals.map((v) => JSON.stringify(v))).size > 1) rows.push([`${id}.${k}`, vals.map(shown)]);
    }
  }
  return rows;
}

function renderParams(runs, graphs, defaults) {
  const rows = paramDiff(graphs, defaults);
  $("compare-params-same").hidden = rows.length > 0;
  $("compare-params").hidden = rows.length === 0;
  fill($("compare-params"),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "node.param"), runs.map((r, i) =>
      h("th", { scope: "col", class: "mono", style: `border-bottom: 3px solid ${COLORS[i % COLORS.length]}` }, r.id)))),
    h("tbody", {}, rows.map(([label, vals]) => h("tr", { dataset: { param: label } },
      h("th", { scope: "row", class: "mono" }, label),
      vals.map((v) => h("td", { class: "mono differs", title: v }, v.length > 80 ? `${v.slice(0, 79)}…` : v))))));
}

// -- final metrics -------------------------------------------------------------------------------
function renderFinals(runs, finals) {
  const names = [];
  for (const f of finals) {
    const label = f.node && finals.some((g) => g.name === f.name && g.node !== f.node) ? `${f.name} (${f.node})` : f.name;
    if (!names.some((n) => n.label === label)) names.push({ label, name: f.name, node: f.node });
  }
  names.sort((a, b) => familyOf(a.name).order - familyOf(b.name).order || a.label.localeCompare(b.label));
  $("compare-final-none").hidden = names.length > 0;
  $("compare-final").hidden = names.length === 0;
  fill($("compare-final"),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "metric"), runs.map((r, i) =>
      h("th", { scope: "col", class: "mono", style: `border-bottom: 3px solid ${COLORS[i % COLORS.length]}` }, r.id)))),
    h("tbody", {}, names.map((n) => {
      const fam = familyOf(n.name);
      const cells = runs.map((r) => finals.find((f) => f.run === r.id && f.name === n.name && f.node === n.node));
      const lasts = cells.map((c) => (c && c.last != null ? c.last : null)).filter((v) => v != null);
      // The best last value: lowest for a loss, highest for accuracy (other metrics have no best).
      const best = fam.id === "loss" || fam.id === "batch" ? Math.min(...lasts) : fam.id === "accuracy" ? Math.max(...lasts) : null;
      return h("tr", { dataset: { metric: n.label } }, h("th", { scope: "row", class: "mono" }, n.label),
        cells.map((c) => h("td", { class: c && best != null && c.last === best && lasts.length > 1 ? "best" : "" },
          c && c.last != null ? fmt(c.last, fam) : "—",
          c && c.step != null ? h("span", { class: "small muted" }, ` at ${fam.x} ${num(c.step)}`) : null,
          c && c.min != null && fam.id === "loss" ? h("div", { class: "small muted" }, `min ${fmt(c.min, fam)}`) : null)));
    })));
}

function fmt(v, fam) {
  return fam.percent ? `${(100 * v).toFixed(2)} %` : num(v);
}

// -- the page ------------------------------------------------------------------------------------
async function signIn() {
  if (getToken()) return;
  if (!(await bootstrap())) {
    throw new PageError(bootstrapRefusal || "This page needs the session token, and could not fetch it by itself.",
      "Open the runs page (/) in this tab and give the token there, then come back to this address.");
  }
}

async function main() {
  let ids;
  try {
    ids = parseIds(location.search);
  } catch (err) {
    showError(err.message, err.hint);
    return;
  }
  document.title = `Compare ${ids.join(", ")} · cdui`;
  try {
    await signIn();
    api("GET", "/api/health/live").then((hv) => { $("version").textContent = `v${hv.version}`; }).catch(() => {});
    const runs = await loadRuns(ids);
    $("server-status").textContent = "connected";
    $("server-status").className = "server-status ok";
    const byId = new Map(runs.map((r) => [r.id, r]));
    const charts = new ChartSet($("compare-charts"), { runLabel: (id) => shortName(byId.get(id)), runColor: color(ids), runOrder: ids });
    fill($("compare-runs-body"), runs.map((r, i) => h("tr", { dataset: { runId: r.id } },
      h("td", {}, h("span", { class: "swatch", style: `background: ${COLORS[i % COLORS.length]}`, "aria-hidden": "true" })),
      h("td", { class: "mono" }, h("a", { href: `/#run=${encodeURIComponent(r.id)}` }, r.id)),
      h("td", {}, r.name || ""), h("td", {}, badge(r.status)), h("td", {}, target(r.target)),
      h("td", {}, r.worker_id || ""), h("td", { class: "nowrap" }, time(r.finished_at)))));
    $("compare-runs").hidden = false;
    $("compare-loading").hidden = true;
    const [graphs, catalog] = await Promise.all([
      Promise.all(ids.map((id) => api("GET", `/api/runs/${encodeURIComponent(id)}/graph`).then((g) => g.graph))),
      api("GET", "/api/nodes").catch(() => null),
    ]);
    renderParams(runs, graphs, defaultsOf(catalog));
    // Metrics: once for ended runs, every 5 s while one of them is still going.
    const pending = new Set(ids);
    for (;;) {
      const answers = await Promise.all([...pending].map((id) =>
        api("GET", `/api/runs/${encodeURIComponent(id)}/metrics`).then((m) => [id, m])));
      for (const [id, m] of answers) {
        charts.setSeries(m, id);
        if (TERMINAL.has(m.status)) pending.delete(id);
      }
      charts.render(true);
      renderFinals(runs, charts.finals());
      document.body.dataset.ready = "1";
      if (!pending.size) break;
      await new Promise((resolve) => setTimeout(resolve, 5000));
    }
  } catch (err) {
    if (err instanceof PageError || err instanceof ApiError) showError(err.message, err.hint);
    else showError(String(err && err.message || err), "");
    $("server-status").textContent = err instanceof ApiError || err instanceof PageError ? "connected" : "server unreachable";
  }
}

main();
