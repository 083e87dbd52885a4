// The apps page, /web/apps.html: the published apps (GET /api/apps); a chosen app's one-line curl example,
// its versions with Activate and Unpublish, and its last invokes with their duration and status; the API
// keys, with Create (the key is shown once) and Revoke. What the server refuses is shown beside the button.
import { api, bootstrap, bootstrapRefusal, getToken } from "./api.js";
import { $, badge, fill, h } from "./dom.js";

const SLUG = /^[a-z][a-z0-9-]{0,63}$/;
const state = { slug: null };

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
    h("td", {}, a.record_io ? "yes" : "no"), h("td", { class: "nowrap" }, when(a.updated_at)))));
  return apps;
}

function curl(slug) {
  const body = JSON.stringify({ inputs: {} });
  return `curl -H "Authorization: Bearer $CDUI_KEY" -d '${body}' ${location.origin}/api/apps/${slug}/invoke`;
}

async function showApp(slug) {
  state.slug = slug;
  const [versions, invokes] = await Promise.all([
    api("GET", `/api/apps/${slug}/versions`), api("GET", `/api/apps/${slug}/invokes?limit=20`)]);
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
  $("invokes-none").hidden = invokes.invokes.length > 0;
  table($("invokes"), ["When", "Version", "Key", "Status", "Duration", "Error"], invokes.invokes.map((i) => row([
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
