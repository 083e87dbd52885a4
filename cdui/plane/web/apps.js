// The apps page, /web/apps.html: the published apps (GET /api/apps); a chosen app's one-line curl example,
// where it is served (this server, a worker or any; its warm processes), its versions with Activate and
// Unpublish, a latency chart and its last invokes with their duration and status; the API keys, with Create
// (the key is shown once) and Revoke. What the server refuses is shown beside the button.
import { api, bootstrap, bootstrapRefusal, getToken } from "./api.js";
import { $, badge, fill, h } from "./dom.js";

const SLUG = /^[a-z][a-z0-9-]{0,63}$/;
const LATENCY_INVOKES = 100;  // the last invokes the latency chart draws
const uPlot = window.uPlot;   // web/vendor/uplot/uPlot.iife.min.js, loaded before the modules
const state = { slug: null, apps: [], serving: [], chart: null };

class PageError extends Error {
  constructor(message, hint = "") { super(message); this.hint = hint; }
}

function showError(message, hint) {
  $("apps-error-message").textContent = message;
  $("apps-error-hint").textContent = hint || "";
  $("apps-error").hidden = false;
}

const when = (ts) => (typeof ts === "number" ? new Date(ts * 1000).toLocaleString() : "");

function say(el, text, ok) {
  el.textContent = text;
  el.className = `small ${ok ? "ok-text" : "error-text"}`;
}

const failed = (err) => `${err.message}${err.hint ? ` (${err.hint})` : ""}`;

function row(cells) {
  return h("tr", {}, cells.map((c) => h("td", {}, c)));
}

function table(el, head, rows) {
  fill(el, h("thead", {}, h("tr", {}, head.map((t) => h("th", { scope: "col" }, t)))), h("tbody", {}, rows));
}

async function listApps() {
  const body = await api("GET", "/api/apps");
  const apps = body.apps || [];
  $("apps-none").hidden = apps.length > 0;
  $("apps-table").hidden = !apps.length;
  fill($("apps-body"), apps.map((a) => h("tr", { dataset: { slug: a.slug } },
    h("td", { class: "mono" }, h("a", { href: `#app=${encodeURIComponent(a.slug)}` }, a.slug)),
    h("td", {}, a.active_version == null ? badge("unpublished") : `version ${a.active_version}`),
    h("td", {}, String(a.versions_count)), h("td", {}, String(a.invokes_count)), h("td", {}, a.graph_name),
    h("td", {}, a.record_io ? "yes" : "no"), h("td", { class: "mono" }, servedOn(a)),
    h("td", { class: "nowrap" }, when(a.updated_at)))));
  state.apps = apps;
  state.serving = body.serving || [];
  return apps;
}

// Where an app is served: "local" (this server), "any" or a worker's name, and the device there if one is set.
function servedOn(a) {
  const where = a.serve_on === "local" ? "this server" : a.serve_on === "any" ? "any worker" : `worker ${a.serve_on}`;
  return a.serve_device ? `${where} (${a.serve_device})` : where;
}

async function showServing(app) {
  const workers = (await api("GET", "/api/workers")).workers || [];
  const names = ["local", "any", ...workers.filter((w) => !w.one_shot).map((w) => w.name)];
  if (!names.includes(app.serve_on)) names.push(app.serve_on);  // a worker that is gone stays choosable
  fill($("serve-on"), names.map((n) => h("option", { value: n, selected: n === app.serve_on },
    n === "local" ? "this server" : n === "any" ? "any worker" : `worker ${n}`)));
  $("serve-device").value = app.serve_device || "";
  const procs = state.serving.filter((p) => p.slug === app.slug);
  $("app-serving").textContent = procs.length
    ? `Warm: ${procs.map((p) => `v${p.version} on ${p.worker ? `worker ${p.worker}` : "this server"} ${p.device} ` +
      `(${p.state}, pid ${p.pid})`).join("; ")}`
    : "No warm process: the next invoke starts one.";
}

async function serveOn(ev) {
  ev.preventDefault();
  const device = $("serve-device").value.trim();
  try {
    await api("PATCH", `/api/apps/${state.slug}`, { serve_on: $("serve-on").value, serve_device: device || null });
    say($("app-action"), `Served on ${$("serve-on").selectedOptions[0].textContent} from the next invoke on.`, true);
    await refresh();
  } catch (err) {
    say($("app-action"), failed(err), false);
  }
}

// The duration of the last invokes, oldest first (uPlot, as the runs page draws metrics).
function latencyChart(invokes) {
  const box = $("latency");
  if (state.chart) { state.chart.destroy(); state.chart = null; }
  box.replaceChildren();
  const rows = invokes.slice(0, LATENCY_INVOKES).reverse();
  box.dataset.points = String(rows.length);
  if (!rows.length || !uPlot) return;
  const data = [rows.map((i) => i.created_at), rows.map((i) => Number(i.duration_ms)),
    rows.map((i) => (i.status === "succeeded" ? null : Number(i.duration_ms)))];
  state.chart = new uPlot({
    width: Math.max(320, Math.min(900, box.clientWidth || 640)), height: 220,
    scales: { x: { time: true } },
    axes: [{}, { label: "ms", size: 60 }],
    series: [{ label: "invoked" }, { label: "duration (ms)", stroke: "#2f5bd3", width: 1.5 },
      { label: "not succeeded", stroke: "#c92a2a", width: 0, points: { show: true, size: 7 } }],
    legend: { live: true },
  }, data, box);
}

function curl(slug) {
  const body = JSON.stringify({ inputs: {} });
  return `curl -H "Authorization: Bearer $CDUI_KEY" -d '${body}' ${location.origin}/api/apps/${slug}/invoke`;
}

async function showApp(slug) {
  state.slug = slug;
  const [versions, invokes] = await Promise.all([
    api("GET", `/api/apps/${slug}/versions`), api("GET", `/api/apps/${slug}/invokes?limit=${LATENCY_INVOKES}`)]);
  $("app").hidden = false;
  $("app-title").textContent = `App ${slug}`;
  const active = versions.versions.find((v) => v.active);
  const inputs = active ? Object.fromEntries(active.contract.inputs.map((i) => [i.name, `<${i.type}>`])) : {};
  $("app-curl").textContent = curl(slug).replace("{\"inputs\":{}}", JSON.stringify({ inputs }));
  $("btn-app-unpublish").disabled = versions.active_version == null;
  table($("versions"), ["Version", "Published", "Graph", "Git", "Note", ""], versions.versions.map((v) => row([
    v.active ? h("strong", {}, `${v.version} (serving)`) : String(v.version), when(v.created_at), v.source_graph,
    v.git_commit ? `${v.git_commit.slice(0, 12)}${v.git_dirty ? "+dirty" : ""}` : "", v.note || "",
    v.active ? "" : h("button", { type: "button", class: "btn-activate", dataset: { version: v.version },
      onclick: () => activate(v.version) }, "Activate")])));
  const app = state.apps.find((a) => a.slug === slug);
  if (app) await showServing(app);
  latencyChart(invokes.invokes);
  $("invokes-none").hidden = invokes.invokes.length > 0;
  table($("invokes"), ["When", "Version", "Key", "Status", "Duration", "Error"], invokes.invokes.slice(0, 20).map((i) => row([
    when(i.created_at), String(i.version ?? ""), i.key_id == null ? "owner" : `#${i.key_id}`, badge(i.status),
    `${Number(i.duration_ms).toFixed(1)} ms`, i.error || ""])));
  document.body.dataset.app = slug;
}

async function activate(version) {
  try {
    await api("POST", `/api/apps/${state.slug}/activate`, { version });
    say($("app-action"), `Version ${version} serves from the next invoke on.`, true);
    await refresh();
  } catch (err) {
    say($("app-action"), failed(err), false);
  }
}

async function unpublish() {
  if (!confirm(`Unpublish ${state.slug}? Invokes are refused until a version is activated again; nothing is lost.`)) return;
  try {
    await api("POST", `/api/apps/${state.slug}/unpublish`);
    say($("app-action"), "Unpublished: invokes are refused (409) until a version is activated.", true);
    await refresh();
  } catch (err) {
    say($("app-action"), failed(err), false);
  }
}

async function listKeys() {
  const keys = (await api("GET", "/api/keys")).keys || [];
  $("keys-none").hidden = keys.length > 0;
  table($("keys-table"), ["Id", "Name", "Prefix", "Created", "Last used", "Revoked", ""], keys.map((k) => row([
    String(k.id), k.name, h("code", {}, `${k.prefix}…`), when(k.created_at), when(k.last_used_at),
    k.revoked_at ? when(k.revoked_at) : "",
    k.revoked_at ? "" : h("button", { type: "button", class: "btn-revoke", dataset: { key: k.id },
      onclick: () => revoke(k) }, "Revoke")])));
}

async function revoke(k) {
  if (!confirm(`Revoke key ${k.id} (${k.name})? It is refused from its next request on.`)) return;
  try {
    await api("POST", `/api/keys/${k.id}/revoke`);
    await listKeys();
  } catch (err) {
    showError(failed(err));
  }
}

async function createKey(ev) {
  ev.preventDefault();
  const name = $("key-name").value.trim();
  if (!name) return;
  try {
    const out = await api("POST", "/api/keys", { name });
    $("key-new-value").textContent = out.key;
    $("key-new").hidden = false;
    $("key-name").value = "";
    await listKeys();
  } catch (err) {
    showError(failed(err));
  }
}

async function refresh() {
  const apps = await listApps();
  const wanted = new URLSearchParams(location.hash.slice(1)).get("app");
  const slug = wanted && SLUG.test(wanted) && apps.some((a) => a.slug === wanted) ? wanted
    : state.slug && apps.some((a) => a.slug === state.slug) ? state.slug : apps.length ? apps[0].slug : null;
  if (slug) await showApp(slug);
  else $("app").hidden = true;
}

async function main() {
  try {
    if (!getToken() && !(await bootstrap())) {
      throw new PageError(bootstrapRefusal || "This page needs the session token, and could not fetch it by itself.",
        "Open the runs page (/) in this tab and give the token there, then come back to this address.");
    }
    api("GET", "/api/health").then((hv) => { $("version").textContent = `v${hv.version}`; }).catch(() => {});
    $("btn-app-unpublish").addEventListener("click", unpublish);
    $("key-form").addEventListener("submit", createKey);
    $("serve-form").addEventListener("submit", serveOn);
    window.addEventListener("hashchange", () => refresh().catch((err) => showError(failed(err))));
    await Promise.all([refresh(), listKeys()]);
    $("server-status").textContent = "connected";
    $("server-status").className = "server-status ok";
  } catch (err) {
    showError(String((err && err.message) || err), err && err.hint);
  }
  document.body.dataset.ready = "1";
}

main();
