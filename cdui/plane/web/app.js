// cdui web page: runs, run detail with live events, submit, uploads; the Workers panel is workers.js.
import { api, ApiError, bootstrap, bootstrapRefusal, getToken, onTokenNeeded, setToken, upload } from "./api.js";
import { $, badge, fill, h, num, size, target, time, TERMINAL } from "./dom.js";
import { describe, progressParts } from "./events.js";
import { ChartSet } from "./charts.js";
import * as graphView from "./graphview.js";
import { artifactUrl, imageButton, isImageArtifact } from "./images.js";
import * as workersPanel from "./workers.js";
import * as clone from "./clone.js";
import * as sweepform from "./sweepform.js";
import { compareUrl, fitText, MAX_COMPARE, MIN_COMPARE, parseTags, runsQuery } from "./runlist.js";

const state = {
  runs: [], runsKey: "", selected: null, run: null,
  lastSeq: 0, finalStatus: null, stream: null, streamGen: 0, backoff: 1000, retry: null,
  workersAt: 0, pendingEvents: [], frame: 0, nodes: new Map(),
  // The runs list: the filters, how many runs are shown (a page more per "More runs"), whether older
  // runs follow, the ticked runs for comparison (in the order ticked), and a generation that a change
  // of filter bumps so an answer to the old filter is dropped.
  filters: { search: "", status: "", target: "", worker: "", tag: "" }, shown: 0, more: false,
  listGen: 0, checked: [], tagsFor: null,
  // The log's last row and what it says: a repeat of it only counts up its "× N".
  lastRow: null, lastKey: "", lastCount: 0,
};
const PAGE = 50; // runs per page of the list

// -- errors and token --------------------------------------------------------
function showError(err) {
  if (!(err instanceof ApiError)) err = { message: String(err && err.message || err), hint: "" };
  $("banner-message").textContent = err.message;
  $("banner-hint").textContent = err.hint || "";
  $("banner").hidden = false;
}
$("banner-close").addEventListener("click", () => { $("banner").hidden = true; });

/** Run an action; show an API error in the banner instead of throwing. */
async function act(fn) {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return undefined; // the token form is showing
    showError(err);
  }
}

function askToken(message) {
  // The next poll, sent with no token at all, must not wipe why the pasted token was refused.
  if (!message && !$("token-form").hidden && !$("token-error").hidden) return;
  $("token-form").hidden = false;
  $("token-error").hidden = !message;
  $("token-error").textContent = message || "";
  setStatus("needs the session token", "warn");
}
onTokenNeeded((hadToken) => askToken(hadToken ? "The server did not accept that token: it is from before the server's last "
  + "restart (a new token is drawn at each start) or from another server. Paste the one `cdui token` prints now." : ""));

$("token-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  setToken($("token-input").value);
  $("token-input").value = "";
  $("token-form").hidden = true;
  await sessionCookie();
  tick();
});

/** The HttpOnly cookie that the event WebSocket and download links use instead of a token in the URL. */
async function sessionCookie() {
  if (getToken()) await api("POST", "/api/auth/cookie").catch(() => {});
}

function setStatus(text, cls) {
  const el = $("server-status");
  el.textContent = text;
  el.className = `server-status ${cls || ""}`;
}

// -- runs list -----------------------------------------------------------------
function ago(iso) {
  const t = Date.parse(iso);
  if (isNaN(t)) return "";
  const secs = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (secs < 120) return `${secs} s`;
  if (secs < 7200) return `${Math.round(secs / 60)} min`;
  return `${(secs / 3600).toFixed(1)} h`;
}

function runInfo(r) {
  if (r.status === "queued" && r.queue_reason) return r.queue_reason;
  if (r.status === "disconnected" && r.worker_status) {
    const since = r.worker_status.since ? ` (disconnected for ${ago(r.worker_status.since)})` : "";
    return (r.worker_status.text || "worker disconnected") + since;
  }
  if (r.error) return r.error;
  return "";
}

function runRow(r) {
  const checked = state.checked.includes(r.id);
  return h("tr", { class: r.id === state.selected ? "selected" : "", dataset: { runId: r.id },
    onclick: (e) => {
      if (e.target.closest("input, label, a")) return;
      if (!e.target.closest("button") || e.target.closest("button").dataset.show) select(r.id);
    } },
  h("td", { class: "pick" }, h("input", { type: "checkbox", class: "pick-run", checked, "aria-label": `Select run ${r.id} for comparison`,
    onchange: (e) => toggleChecked(r.id, e.target.checked) })),
  h("td", {}, h("button", { type: "button", class: "link mono", dataset: { show: "1" }, "aria-label": `Show run ${r.id}` }, r.id),
    r.name ? h("div", { class: "small muted" }, r.name) : null,
    r.sweep && r.sweep.id ? h("a", { class: "small sweep-link", href: `/web/sweep.html?id=${encodeURIComponent(r.sweep.id)}`,
      "aria-label": `Open sweep ${r.sweep.id}` }, `sweep ${r.sweep.id} #${r.sweep.variant}`) : null,
    (r.tags || []).length ? h("div", { class: "tags" }, r.tags.map((t) => h("button", { type: "button", class: "tag",
      "aria-label": `Show only runs tagged ${t}`, onclick: () => setFilter("tag", t) }, t))) : null,
    r.note ? h("div", { class: "note small muted", title: r.note }, r.note.length > 80 ? `${r.note.slice(0, 79)}…` : r.note) : null),
  h("td", {}, badge(r.status)),
  h("td", {}, target(r.target)),
  h("td", {}, r.worker_id || ""),
  h("td", { class: "opt" }, r.device || (r.options && r.options.device !== "auto" ? r.options.device : "") || ""),
  h("td", { class: "info" }, h("div", { class: "clamp", title: runInfo(r) }, fitText(runInfo(r), h, copyText))),
  h("td", { class: "nowrap" }, time(r.created_at)),
  h("td", { class: "nowrap opt" }, time(r.finished_at)));
}

/** Rows are updated by run id: an unchanged run keeps its row (and the focus in it). */
function renderRuns() {
  const filtered = Object.values(state.filters).some(Boolean);
  $("runs-empty").hidden = state.runs.length > 0 || filtered;
  $("runs-none").hidden = state.runs.length > 0 || !filtered;
  $("btn-more").hidden = !state.more;
  $("runs-count").textContent = state.runs.length ?
    `${state.runs.length} run${state.runs.length === 1 ? "" : "s"} shown${state.more ? ", older ones follow" : ""}` : "";
  const tags = [...new Set(state.runs.flatMap((r) => r.tags || []))].sort();
  const opts = $("tag-options");
  if (opts.dataset.sig !== tags.join(" ")) {
    opts.dataset.sig = tags.join(" ");
    fill(opts, tags.map((t) => h("option", { value: t })));
  }
  const body = $("runs-body");
  const old = new Map([...body.children].map((el) => [el.dataset.runId, el]));
  let prev = null;
  for (const r of state.runs) {
    const sig = JSON.stringify(r) + (r.id === state.selected) + runInfo(r) + state.checked.includes(r.id);
    let el = old.get(r.id);
    if (el && el.dataset.sig !== sig) {
      const fresh = runRow(r);
      const focused = el.contains(document.activeElement);
      el.replaceWith(fresh);
      if (focused) fresh.querySelector("button.link").focus();
      el = fresh;
    } else if (!el) el = runRow(r);
    el.dataset.sig = sig;
    old.delete(r.id);
    const want = prev ? prev.nextSibling : body.firstChild;
    if (want !== el) body.insertBefore(el, want);
    prev = el;
  }
  for (const el of old.values()) el.remove();
}

function copyText(text) {
  if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
}

function toggleChecked(id, on) {
  state.checked = state.checked.filter((x) => x !== id);
  if (on) state.checked.push(id);
  renderCompare();
  renderRuns();
}

function renderCompare() {
  const n = state.checked.length;
  const btn = $("btn-compare");
  btn.disabled = n < MIN_COMPARE || n > MAX_COMPARE;
  btn.textContent = n ? `Compare (${n})` : "Compare";
  btn.title = n > MAX_COMPARE ? `At most ${MAX_COMPARE} runs compare at once: untick ${n - MAX_COMPARE}` :
    n < MIN_COMPARE ? `Tick ${MIN_COMPARE} to ${MAX_COMPARE} runs to compare them` : `Compare runs ${state.checked.join(", ")}`;
}
$("btn-compare").addEventListener("click", () => {
  if (state.checked.length >= MIN_COMPARE && state.checked.length <= MAX_COMPARE) location.assign(compareUrl(state.checked));
});

/** A changed search or filter lists the newest page of what matches. */
function setFilter(key, value) {
  const ids = { search: "runs-search", status: "filter-status", target: "filter-target", worker: "filter-worker", tag: "filter-tag" };
  if ($(ids[key]).value !== value) $(ids[key]).value = value;
  if (state.filters[key] === value) return;
  state.filters[key] = value;
  state.listGen++;
  state.shown = 0;
  tick(true);
}
let searchTimer = 0;
$("runs-search").addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => setFilter("search", $("runs-search").value.trim()), 250);
});
$("filter-tag").addEventListener("change", () => setFilter("tag", $("filter-tag").value.trim()));
for (const [key, id] of [["status", "filter-status"], ["target", "filter-target"], ["worker", "filter-worker"]]) {
  $(id).addEventListener("change", () => setFilter(key, $(id).value));
}
$("runs-filter").addEventListener("submit", (e) => {
  e.preventDefault();
  clearTimeout(searchTimer);
  setFilter("search", $("runs-search").value.trim());
  setFilter("tag", $("filter-tag").value.trim());
});
function clearFilters() {
  $("runs-filter").reset();
  for (const key of Object.keys(state.filters)) setFilter(key, "");
}
$("runs-filter").addEventListener("reset", (e) => { e.preventDefault(); clearFilters(); });
$("btn-filter-clear2").addEventListener("click", clearFilters);

/** The worker filter's and target filter's choices: the fixed ones, then each worker (the chosen one kept). */
function renderWorkerFilters(workers) {
  const names = workers.map((w) => w.name);
  for (const [id, fixed] of [["filter-worker", [["", "Any worker"], ["local", "local"]]],
    ["filter-target", [["", "Any target"], ["local", "local"], ["any", "any"], ["one-shot", "one-shot"]]]]) {
    const sel = $(id);
    const want = [...fixed, ...names.map((n) => [n, n])];
    if (sel.value && !want.some(([v]) => v === sel.value)) want.push([sel.value, sel.value]);
    if (JSON.stringify([...sel.options].map((o) => o.value)) !== JSON.stringify(want.map(([v]) => v))) {
      const keep = sel.value;
      fill(sel, want.map(([v, label]) => h("option", { value: v }, label)));
      sel.value = keep;
    }
  }
}

/** The next page: the runs after the last one shown (?after=), as the server orders them. */
$("btn-more").addEventListener("click", () => act(async () => {
  if (ticking) await ticking;
  const last = state.runs[state.runs.length - 1];
  if (!last) return;
  const gen = state.listGen;
  const page = await api("GET", `/api/runs?${runsQuery(state.filters, { after: last.id, limit: PAGE + 1 })}`);
  if (gen !== state.listGen) return;
  state.listGen++; // a poll sent before this page came asked for fewer runs: its answer is dropped
  const have = new Set(state.runs.map((r) => r.id));
  state.runs = state.runs.concat(page.slice(0, PAGE).filter((r) => !have.has(r.id)));
  state.more = page.length > PAGE;
  state.shown = state.runs.length;
  renderRuns();
}));

// -- run detail ------------------------------------------------------------------
/** ``push``: a new history entry (a click), so Back returns to the run before; off for Back/Forward themselves. */
function select(id, push = true) {
  if (state.selected === id) { if (id) revealDetail(); return; }
  closeStream();
  Object.assign(state, { selected: id, run: state.runs.find((r) => r.id === id) || null, lastSeq: 0, finalStatus: null });
  const url = id ? `#run=${encodeURIComponent(id)}` : location.pathname + location.search;
  if (push && hashRun() !== id) history.pushState(null, "", url);
  fill($("log"));
  resetLive();
  $("progress").hidden = true;
  $("detail").hidden = !id;
  $("detail-body").hidden = !id;
  $("detail-empty").hidden = !!id;
  state.tagsFor = null;
  clone.close();
  sweepform.close();
  renderRuns();
  if (!id) { graphView.showRun(null); return; }
  revealDetail();
  if (state.run) renderDetail();
  else tick();
  graphView.showRun(id).then(() => graphView.setStatuses(state.nodes)).then(() => {
    if (runFinished()) graphView.loadRecorded(state.run, showError);
  }).catch(showError);
  openStream(id);
  loadArtifacts();
}

/** The run view in sight: the side column scrolled to its top (wide screens), or the page to it (narrow). */
function revealDetail() {
  const side = $("side");
  if (getComputedStyle(side).position === "sticky") side.scrollTop = 0;
  const box = $("detail").getBoundingClientRect();
  if (box.top < 0 || box.top > innerHeight - 80) $("detail").scrollIntoView({ block: "start" });
}

/** The run a ``#run=ID`` address names, or null. */
function hashRun() {
  const m = /^#run=(.+)$/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}
addEventListener("popstate", () => select(hashRun(), false));
addEventListener("hashchange", () => select(hashRun(), false));
$("btn-detail-close").addEventListener("click", () => select(null));
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && state.selected && !document.querySelector("dialog[open]") &&
      !e.target.closest("input, textarea, select")) select(null);
});
$("btn-copy-link").addEventListener("click", () => {
  copyText(`${location.origin}${location.pathname}#run=${encodeURIComponent(state.selected)}`);
  $("tags-result").textContent = "Link copied.";
  $("tags-result").className = "small ok-text";
});

function fact(label, value, cls) {
  if (value == null || value === "") return [];
  return [h("dt", {}, label), h("dd", { class: cls || "" }, value)];
}

function renderDetail() {
  const r = state.run;
  if (!r) return;
  $("detail-title").textContent = `Run ${r.id}${r.name ? ` — ${r.name}` : ""}`;
  const late = r.late_result == null ? "" : typeof r.late_result === "string" ? r.late_result : JSON.stringify(r.late_result);
  fill($("detail-facts"),
    fact("Status", badge(r.status)),
    fact("Target", target(r.target)),
    fact("Worker", r.worker_id), fact("Device", r.device),
    fact("Sweep", r.sweep && r.sweep.id ? h("a", { id: "run-sweep-link", href: `/web/sweep.html?id=${encodeURIComponent(r.sweep.id)}` },
      `${r.sweep.id} #${r.sweep.variant}`) : ""),
    fact("Queue reason", r.status === "queued" ? r.queue_reason : ""),
    fact("Worker status", r.worker_status ? r.worker_status.text : ""),
    fact("Error", r.error, "error-text pre"),
    fact("Late result", late, "warn-text pre"),
    fact("Stop", r.stop_requested && !TERMINAL.has(r.status) ? "requested" : ""),
    fact("Created", time(r.created_at)), fact("Started", time(r.started_at)), fact("Finished", time(r.finished_at)));
  $("btn-stop").disabled = TERMINAL.has(r.status);
  $("btn-delete").disabled = !TERMINAL.has(r.status);
  // The tags and note fields show the stored ones when the run opens; later polls leave what is typed.
  if (state.tagsFor !== r.id) {
    state.tagsFor = r.id;
    $("run-tags").value = (r.tags || []).join(" ");
    $("run-note").value = r.note || "";
    $("tags-result").textContent = "";
  }
}

$("tags-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const id = state.selected;
  const out = $("tags-result");
  const tags = parseTags($("run-tags").value);
  const btn = $("btn-save-tags");
  btn.disabled = true;
  api("PATCH", `/api/runs/${encodeURIComponent(id)}`, { tags, note: $("run-note").value })
    .then((run) => {
      if (id !== state.selected) return;
      state.run = run;
      state.runs = state.runs.map((r) => r.id === run.id ? run : r);
      $("run-tags").value = (run.tags || []).join(" ");
      out.className = "small ok-text";
      out.textContent = run.tags.length ? `Saved: tags ${run.tags.join(", ")}.` : "Saved: no tags.";
      renderRuns();
    })
    .catch((err) => {
      out.className = "small error-text";
      out.textContent = err instanceof ApiError ? `${err.message}${err.hint ? ` (${err.hint})` : ""}` : String(err);
    })
    .finally(() => { btn.disabled = false; });
});

$("btn-sweep").addEventListener("click", () => {
  if (!$("newsweep").hidden) { sweepform.close(); return; }
  sweepform.open(state.run, { targets: $("target") });
});

$("btn-clone").addEventListener("click", () => {
  if (!$("clone").hidden) { clone.close(); return; }
  clone.open(state.run, { targets: $("target"), onQueued: async (run) => { await tick(); select(run.id); } });
});

$("btn-stop").addEventListener("click", () => act(async () => {
  state.run = await api("POST", `/api/runs/${encodeURIComponent(state.selected)}/stop`);
  renderDetail();
}));
// Delete needs a second click; the first says what it will do.
let deleteArmed = null;
$("btn-delete").addEventListener("click", () => act(async () => {
  const id = state.selected;
  if (deleteArmed !== id) {
    deleteArmed = id;
    $("btn-delete").textContent = "Confirm delete";
    $("progress").hidden = false;
    $("progress").textContent = `Click "Confirm delete" to delete run ${id}, its events and its files on this server.`;
    return;
  }
  deleteArmed = null;
  $("btn-delete").textContent = "Delete";
  await api("DELETE", `/api/runs/${encodeURIComponent(id)}`);
  select(null);
  tick();
}));

// -- live events ---------------------------------------------------------------
// The run's metric charts (charts.js), fed by the run's `metric` events as they stream in.
const charts = new ChartSet($("charts"));

function runFinished() {
  const r = state.run;
  return TERMINAL.has(state.finalStatus) || (r && TERMINAL.has(r.status) && (r.last_seq || 0) <= state.lastSeq);
}

function closeStream() {
  state.streamGen++;
  clearTimeout(state.retry);
  state.retry = null;
  if (state.stream) state.stream.close();
  state.stream = null;
  state.backoff = 1000;
}

function openStream(id) {
  const gen = ++state.streamGen;
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  // The session cookie authenticates it: no token in the URL.
  const ws = new WebSocket(`${proto}//${location.host}/ws/runs/${encodeURIComponent(id)}?after=${state.lastSeq}`);
  state.stream = ws;
  ws.onopen = () => { state.backoff = 1000; };
  ws.onmessage = (m) => { if (gen === state.streamGen) addEvent(JSON.parse(m.data)); };
  ws.onclose = () => {
    if (gen !== state.streamGen) return;
    state.stream = null;
    if (runFinished()) return;
    // Reconnect from the last event we have while the run is not finished.
    state.retry = setTimeout(() => {
      state.retry = null;
      if (gen === state.streamGen && state.selected === id) openStream(id);
    }, state.backoff);
    state.backoff = Math.min(state.backoff * 2, 10000);
  };
}

const WARNINGS = new Set(["worker_disconnected", "worker_reconnected", "transfer_progress", "transfer_failed",
  "storage_fallback"]);

function resetLive() {
  state.pendingEvents = [];
  state.lastRow = null;
  state.lastKey = "";
  state.lastCount = 0;
  state.nodes = new Map();
  charts.clear();
  fill($("nodes"));
  fill($("warnings"));
  $("warnings").hidden = true;
  $("nodes-wrap").hidden = true;
  $("chart-wrap").hidden = true;
  deleteArmed = null;
  $("btn-delete").textContent = "Delete";
}

/** Events are queued and drawn once per animation frame: thousands of events cost one layout per frame. */
function addEvent(ev) {
  if (!ev || typeof ev.seq !== "number" || ev.seq <= state.lastSeq) return;
  state.lastSeq = ev.seq;
  state.pendingEvents.push(ev);
  const d = ev.data || {};
  if (ev.kind === "status" && TERMINAL.has(d.status)) state.finalStatus = d.status;
  if (!state.frame) state.frame = requestAnimationFrame(flushEvents);
}

function warningKind(ev) {
  const d = ev.data || {};
  if (ev.kind === "run_warning") return d.kind || "warning";
  return WARNINGS.has(ev.kind) ? ev.kind : null;
}

function flushEvents() {
  state.frame = 0;
  const batch = state.pendingEvents;
  state.pendingEvents = [];
  if (!batch.length) return;
  const log = $("log");
  const stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
  const frag = document.createDocumentFragment();
  const warns = document.createDocumentFragment();
  let progress = null, artifacts = false, finished = false, nodesChanged = false, metrics = false;
  for (const ev of batch) {
    const d = ev.data || {};
    const warn = warningKind(ev);
    const level = ev.kind === "log" ? d.level || "info" : ev.kind === "node_status" ? d.status : "";
    const text = describe(ev);
    const key = `${ev.kind}\u0000${level}\u0000${warn || ""}\u0000${text}`;
    if (key === state.lastKey && state.lastRow && ev.kind !== "status") {
      // The same line again: one row says how many times ("× 37") and when the last one came.
      state.lastCount++;
      const row = state.lastRow;
      row.dataset.lastSeq = ev.seq;
      row.dataset.repeats = state.lastCount;
      row.querySelector(".repeat").textContent = `× ${state.lastCount}`;
      row.querySelector(".repeat").hidden = false;
      const t = row.querySelector("time");
      t.setAttribute("datetime", ev.at || "");
      t.textContent = ev.at ? new Date(ev.at).toLocaleTimeString() : "";
    } else {
      state.lastKey = key;
      state.lastCount = 1;
      state.lastRow = h("li", { class: `ev ev-${ev.kind} ${level ? `lvl-${level}` : ""} ${warn ? `ev-warning warn-${warn}` : ""}`,
        dataset: { seq: ev.seq } },
      h("span", { class: "seq" }, ev.seq),
      h("time", { datetime: ev.at || "" }, ev.at ? new Date(ev.at).toLocaleTimeString() : ""),
      h("span", { class: "kind" }, warn ? `⚠ ${warn}` : ev.kind),
      h("span", { class: "msg" }, text, h("span", { class: "repeat", hidden: true, title: "This line came this many times in a row" })));
      frag.append(state.lastRow);
    }
    if (warn) {
      warns.append(h("li", { class: `warning warn-${warn}`, dataset: { seq: ev.seq } },
        h("strong", {}, `⚠ ${warn}`), " ", d.message || describe(ev)));
    }
    if (ev.kind === "node_status" && d.node_id) {
      state.nodes.set(d.node_id, { status: d.status, type: d.type, seconds: d.seconds, error: d.error });
      nodesChanged = true;
    }
    if (ev.kind === "metric" && typeof d.name === "string") {
      charts.addPoint(d.name, d.node_id, d.step, d.value);
      metrics = true;
    }
    if (ev.kind === "progress") progress = d;
    if (ev.kind === "artifact") artifacts = true;
    if (ev.kind === "status" && TERMINAL.has(d.status)) finished = true;
  }
  log.append(frag);
  let extra = log.childElementCount - 5000;
  while (extra-- > 0) {
    if (log.firstElementChild === state.lastRow) state.lastRow = null;
    log.firstElementChild.remove();
  }
  if (stick) log.scrollTop = log.scrollHeight;
  if (warns.childElementCount) {
    $("warnings").append(warns);
    $("warnings").hidden = false;
  }
  if (nodesChanged) { renderNodes(); graphView.setStatuses(state.nodes); }
  if (metrics) $("chart-wrap").hidden = false;
  if (progress) renderProgress(progress);
  if (artifacts || finished) loadArtifacts();
  if (finished) tick().then(() => graphView.loadRecorded(state.run, showError));
}

function renderNodes() {
  $("nodes-wrap").hidden = state.nodes.size === 0;
  fill($("nodes"), [...state.nodes].map(([id, n]) => h("li", { class: "node-item", dataset: { node: id } },
    h("span", { class: "mono" }, id), n.type ? h("span", { class: "small muted" }, ` ${n.type}`) : null, " ",
    badge(n.status, "node"), n.seconds != null ? h("span", { class: "small muted" }, ` ${num(n.seconds)} s`) : null,
    n.error ? h("div", { class: "error-text small" }, n.error) : null)));
}

function renderProgress(d) {
  const parts = progressParts(d, false);
  if (d.node_id) parts.unshift(`node ${d.node_id}`);
  $("progress").textContent = `Latest progress: ${parts.join(" · ")}`;
  $("progress").hidden = false;
}

async function loadArtifacts() {
  const id = state.selected;
  if (!id) return;
  const list = await act(() => api("GET", `/api/runs/${encodeURIComponent(id)}/artifacts`));
  if (!list || id !== state.selected) return;
  $("artifacts-empty").hidden = list.length > 0;
  // Image files the run produced (plots, ImageWriter) are shown as pictures; a click enlarges one.
  const pictures = list.filter(isImageArtifact);
  $("artifact-images").hidden = pictures.length === 0;
  fill($("artifact-images"), pictures.map((a) => h("figure", { class: "image-item", dataset: { artifact: a.id } },
    imageButton(artifactUrl(id, a), `${a.kind} ${a.name}`),
    h("figcaption", { class: "small muted" }, a.name))));
  fill($("artifacts-body"), list.map((a) => h("tr", {},
    h("td", {}, a.kind), h("td", {}, a.name), h("td", {}, a.backend),
    h("td", { class: "mono path", title: artifactPath(a) || a.relative_path || "" },
      artifactPath(a) || (a.relative_path ? `(not here) ${a.relative_path}` : "")),
    h("td", { class: "nowrap" }, size(a.size)),
    h("td", { class: "mono", title: a.sha256 || "" }, a.sha256 ? a.sha256.slice(0, 12) : ""),
    h("td", { class: "nowrap" }, a.path || a.backend === "s3" ? h("a", {
      // The session cookie authenticates the link: no token in the URL.
      href: `/api/runs/${encodeURIComponent(id)}/artifacts/${encodeURIComponent(a.id)}/download`,
      download: "", "aria-label": `Download ${a.name}`,
    }, "download") : "", " ",
    artifactPath(a) ? h("button", { type: "button", class: "small-btn", "aria-label": `Copy path of ${a.name}`,
      onclick: () => navigator.clipboard && navigator.clipboard.writeText(artifactPath(a)).catch(() => {}) }, "Copy path") : ""))));
}

/** Where the artifact lies: its path here, or its s3:// address for a bucket artifact. */
function artifactPath(a) {
  if (a.uri) return a.uri;
  if (a.backend === "s3" && a.bucket && a.key) return `s3://${a.bucket}/${a.key}`;
  if (a.backend === "s3" && typeof a.url === "string" && a.url.startsWith("s3://")) return a.url;
  return a.path || "";
}

// -- submit ----------------------------------------------------------------------
$("graph-file").addEventListener("change", async (e) => {
  const f = e.target.files[0];
  if (f) $("graph-text").value = await f.text();
});

function targetValue(raw) {
  const t = raw.trim();
  if (!t || t === "local" || t === "any") return t || "local";
  if (t === "one-shot") return { pool: "one-shot" };
  return { worker: t.replace(/^worker:/, "") };
}

$("target").addEventListener("change", () => { $("device-hint").hidden = $("target").value !== "one-shot"; });

/** The Queue on… choices: the fixed ones, then one per worker (the chosen one kept). */
function renderTargets(workers) {
  const sel = $("target");
  const keep = sel.value;
  const fixed = [["local", "This server (local)"], ["any", "Any available"], ["one-shot", "One-shot worker"]];
  const names = workers.map((w) => w.name);
  const want = [...fixed, ...names.map((n) => [`worker:${n}`, `Worker ${n}`])];
  const have = [...sel.options].map((o) => o.value);
  if (JSON.stringify(have) !== JSON.stringify(want.map(([v]) => v))) {
    fill(sel, want.map(([v, label]) => h("option", { value: v }, label)));
    sel.value = want.some(([v]) => v === keep) ? keep : "local";
  }
}

$("submit-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const out = $("submit-result");
  let graph;
  try {
    graph = JSON.parse($("graph-text").value);
  } catch (err) {
    fill(out, h("p", { class: "error-text" }, `The graph is not valid JSON: ${err.message}`));
    return;
  }
  if (graph && graph.graph && !graph.nodes) graph = graph.graph; // a saved request body
  const options = { target: targetValue($("target").value) };
  const device = $("device").value.trim();
  if (device && device !== "auto") options.device = device;
  if ($("record-outputs").checked) options.record_outputs = true;
  const btn = $("btn-submit");
  if (btn.disabled) return;
  btn.disabled = true; // one submission at a time: a double click queues one run
  try {
    const run = await api("POST", "/api/runs", { graph, options });
    fill(out, h("p", { class: "ok-text" }, `Submitted run ${run.id}.`));
    await tick();
    select(run.id);
  } catch (err) {
    if (!(err instanceof ApiError)) { fill(out, h("p", { class: "error-text" }, String(err))); return; }
    fill(out, h("div", { class: "submit-errors" },
      h("p", { class: "error-text" }, h("strong", {}, err.message)),
      err.hint ? h("p", { class: "hint" }, err.hint) : null,
      err.details ? h("ul", { id: "submit-errors", class: "error-list" }, err.details.map((d) => h("li", {},
        h("span", { class: "code" }, d.code || "error"),
        d.node_id ? h("span", { class: "node" }, `node ${d.node_id}`) : null,
        h("span", {}, d.message || ""),
        d.hint ? h("div", { class: "hint" }, d.hint) : null))) : null));
  } finally {
    btn.disabled = false;
  }
});

// -- uploads ---------------------------------------------------------------------
$("upload-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const file = $("upload-file").files[0];
  if (!file) return;
  const kind = $("upload-kind").value;
  const form = new FormData();
  form.append("file", file, file.name);
  const btn = $("btn-upload"), bar = $("upload-progress"), text = $("upload-progress-text");
  btn.disabled = true;
  bar.hidden = false;
  bar.value = 0;
  act(async () => {
    const r = await upload(`/api/${encodeURIComponent(kind)}/upload`, form, (sent, total) => {
      bar.value = total ? (100 * sent) / total : 0;
      text.textContent = `${size(sent)} of ${size(total)}`;
    });
    $("upload-results").prepend(h("li", { class: "upload" },
      h("strong", {}, r.path || `${kind}/${r.name}`), " · ", size(r.size), " · ",
      h("span", { class: "mono", title: r.sha256 }, `sha256 ${r.sha256}`)));
    $("upload-file").value = "";
  }).finally(() => {
    btn.disabled = false;
    bar.hidden = true;
    text.textContent = "";
  });
});

// -- workers ---------------------------------------------------------------------
workersPanel.init({ act, select, onWorkers: (workers) => { renderTargets(workers); renderWorkerFilters(workers); } });
// The Workers panel opens in the side column: bring it into sight when a run view is above it.
$("btn-workers").addEventListener("click", () => {
  if (!$("workers").hidden) requestAnimationFrame(() => $("workers").scrollIntoView({ block: "nearest" }));
});

// -- polling ---------------------------------------------------------------------
let ticking = null;
let tickAgain = false;
/** One poll: the runs shown (the first pages, as many as are shown, under the filters), the open run,
 *  the workers now and then. ``fresh``: a filter changed, so a poll in flight is followed by another. */
async function tick(fresh = false) {
  if (ticking) {
    if (fresh) tickAgain = true;
    return ticking;
  }
  ticking = (async () => {
    try {
      const gen = state.listGen;
      const limit = Math.max(PAGE, state.shown);
      const filterError = $("filter-error");
      let runs;
      try {
        runs = await api("GET", `/api/runs?${runsQuery(state.filters, { limit: limit + 1 })}`);
        filterError.hidden = true;
      } catch (err) {
        // A search or tag the server refuses (a bad tag, too long a search) is said by the filters.
        if (!(err instanceof ApiError) || err.status !== 400) throw err;
        filterError.textContent = `${err.message}${err.hint ? ` (${err.hint})` : ""}`;
        filterError.hidden = false;
        runs = [];
      }
      if (gen === state.listGen) {
        state.more = runs.length > limit;
        state.runs = runs.slice(0, limit);
        state.shown = state.runs.length;
      }
      setStatus("connected", "ok");
      if (state.selected) {
        state.run = state.runs.find((r) => r.id === state.selected) ||
          await api("GET", `/api/runs/${encodeURIComponent(state.selected)}`);
        renderDetail();
        if (!state.stream && !runFinished() && !state.retry) openStream(state.selected);
      }
      renderRuns();
      const every = workersPanel.isMissing() ? 30000 : workersPanel.panelOpen() ? 2000 : 5000;
      if (Date.now() - state.workersAt >= every) {
        state.workersAt = Date.now();
        await workersPanel.refresh();
      }
    } catch (err) {
      if (!(err instanceof ApiError)) setStatus("server unreachable", "bad");
      else if (err.status === 404 && state.selected) select(null); // the run was deleted
      else if (err.status !== 401) showError(err);
    } finally {
      ticking = null;
      if (tickAgain) { tickAgain = false; tick(); }
    }
  })();
  return ticking;
}

async function start() {
  const params = new URLSearchParams(location.search);
  if (params.get("token")) {
    setToken(params.get("token"));
    params.delete("token");
    const rest = params.toString();
    history.replaceState(null, "", location.pathname + (rest ? `?${rest}` : "") + location.hash);
  }
  api("GET", "/api/health/live").then((hv) => { $("version").textContent = `v${hv.version}`; }).catch(() => {});
  if (!getToken() && !(await bootstrap())) askToken(bootstrapRefusal);
  else if (getToken()) await sessionCookie();
  renderCompare();
  await tick();
  if (hashRun()) select(hashRun(), false);
  // No polling in a hidden tab; coming back refreshes at once.
  const loop = async () => { if (!document.hidden) await tick(); setTimeout(loop, 2000); };
  setTimeout(loop, 2000);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) { state.workersAt = 0; tick(); } });
}

start();
