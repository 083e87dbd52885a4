// cdui web page: runs, run detail with live events, submit, uploads; the Workers panel is workers.js.
import { api, ApiError, bootstrap, bootstrapRefusal, getToken, onTokenNeeded, setToken, upload } from "./api.js";
import { $, badge, fill, h, num, size, target, time, TERMINAL } from "./dom.js";
import * as graphView from "./graphview.js";
import * as workersPanel from "./workers.js";

const state = {
  runs: [], runsKey: "", selected: null, run: null,
  lastSeq: 0, finalStatus: null, stream: null, streamGen: 0, backoff: 1000, retry: null,
  workersAt: 0, pendingEvents: [], frame: 0, nodes: new Map(), losses: [], chartFrame: 0,
};

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
onTokenNeeded((hadToken) => askToken(hadToken ? "The server did not accept that token." : ""));

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
  return h("tr", { class: r.id === state.selected ? "selected" : "", dataset: { runId: r.id },
    onclick: (e) => { if (!e.target.closest("button") || e.target.closest("button").dataset.show) select(r.id); } },
  h("td", {}, h("button", { type: "button", class: "link mono", dataset: { show: "1" }, "aria-label": `Show run ${r.id}` }, r.id),
    r.name ? h("div", { class: "small muted" }, r.name) : null),
  h("td", {}, badge(r.status)),
  h("td", {}, target(r.target)),
  h("td", {}, r.worker_id || ""),
  h("td", {}, r.device || (r.options && r.options.device !== "auto" ? r.options.device : "") || ""),
  h("td", { class: "info" }, runInfo(r)),
  h("td", { class: "nowrap" }, time(r.created_at)),
  h("td", { class: "nowrap" }, time(r.finished_at)));
}

/** Rows are updated by run id: an unchanged run keeps its row (and the focus in it). */
function renderRuns() {
  $("runs-empty").hidden = state.runs.length > 0;
  const body = $("runs-body");
  const old = new Map([...body.children].map((el) => [el.dataset.runId, el]));
  let prev = null;
  for (const r of state.runs) {
    const sig = JSON.stringify(r) + (r.id === state.selected) + runInfo(r);
    let el = old.get(r.id);
    if (el && el.dataset.sig !== sig) {
      const fresh = runRow(r);
      const focused = el.contains(document.activeElement);
      el.replaceWith(fresh);
      if (focused) fresh.querySelector("button").focus();
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

// -- run detail ------------------------------------------------------------------
function select(id) {
  if (state.selected === id) return;
  closeStream();
  Object.assign(state, { selected: id, run: state.runs.find((r) => r.id === id) || null, lastSeq: 0, finalStatus: null });
  history.replaceState(null, "", id ? `#run=${encodeURIComponent(id)}` : location.pathname + location.search);
  fill($("log"));
  resetLive();
  $("progress").hidden = true;
  $("detail-body").hidden = !id;
  $("detail-empty").hidden = !!id;
  renderRuns();
  if (!id) { graphView.showRun(null); return; }
  if (state.run) renderDetail();
  else tick();
  graphView.showRun(id).then(() => graphView.setStatuses(state.nodes)).then(() => {
    if (runFinished()) graphView.loadRecorded(state.run, showError);
  }).catch(showError);
  openStream(id);
  loadArtifacts();
}

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
    fact("Queue reason", r.status === "queued" ? r.queue_reason : ""),
    fact("Worker status", r.worker_status ? r.worker_status.text : ""),
    fact("Error", r.error, "error-text pre"),
    fact("Late result", late, "warn-text pre"),
    fact("Stop", r.stop_requested && !TERMINAL.has(r.status) ? "requested" : ""),
    fact("Created", time(r.created_at)), fact("Started", time(r.started_at)), fact("Finished", time(r.finished_at)));
  $("btn-stop").disabled = TERMINAL.has(r.status);
  $("btn-delete").disabled = !TERMINAL.has(r.status);
}

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

function describe(ev) {
  const d = ev.data || {};
  const node = d.node_id ? `${d.node_id}${d.type ? ` (${d.type})` : ""}` : "";
  switch (ev.kind) {
    case "status":
      return `status → ${d.status}${d.device ? ` on ${d.device}` : ""}${d.error ? `: ${d.error}` : ""}`;
    case "node_status":
      return `node ${node} ${d.status}` + (d.seconds != null ? ` in ${d.seconds} s` : "") + (d.error ? `: ${d.error}` : "");
    case "progress":
      return `progress${d.node_id ? ` ${d.node_id}` : ""}${d.event ? ` [${d.event}]` : ""}: ${progressParts(d, true).join(", ")}`;
    case "log":
      return (d.node_id ? `[${d.node_id}] ` : "") + (d.message ?? "");
    case "metric":
      return `metric ${d.name} = ${num(d.value)}${d.step != null ? ` (step ${d.step})` : ""}`;
    case "run_warning":
      return `warning [${d.kind || "warning"}]: ${d.message ?? ""}`;
    case "artifact":
      return `artifact ${d.kind || ""}: ${d.name || ""}${d.path ? ` (${d.path})` : ""}`;
    default:
      return `${ev.kind}: ${JSON.stringify(d)}`;
  }
}

const WARNINGS = new Set(["worker_disconnected", "worker_reconnected", "transfer_progress", "transfer_failed",
  "storage_fallback"]);

function resetLive() {
  state.pendingEvents = [];
  state.nodes = new Map();
  state.losses = [];
  fill($("nodes"));
  fill($("warnings"));
  fill($("loss-chart"));
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
  let progress = null, artifacts = false, finished = false, nodesChanged = false, lossChanged = false;
  for (const ev of batch) {
    const d = ev.data || {};
    const warn = warningKind(ev);
    const level = ev.kind === "log" ? d.level || "info" : ev.kind === "node_status" ? d.status : "";
    frag.append(h("li", { class: `ev ev-${ev.kind} ${level ? `lvl-${level}` : ""} ${warn ? `ev-warning warn-${warn}` : ""}`,
      dataset: { seq: ev.seq } },
    h("span", { class: "seq" }, ev.seq),
    h("time", { datetime: ev.at || "" }, ev.at ? new Date(ev.at).toLocaleTimeString() : ""),
    h("span", { class: "kind" }, warn ? `⚠ ${warn}` : ev.kind),
    h("span", { class: "msg" }, describe(ev))));
    if (warn) {
      warns.append(h("li", { class: `warning warn-${warn}`, dataset: { seq: ev.seq } },
        h("strong", {}, `⚠ ${warn}`), " ", d.message || describe(ev)));
    }
    if (ev.kind === "node_status" && d.node_id) {
      state.nodes.set(d.node_id, { status: d.status, type: d.type, seconds: d.seconds, error: d.error });
      nodesChanged = true;
    }
    const loss = ev.kind === "progress" ? d.loss : ev.kind === "metric" && /loss/i.test(d.name || "") ? d.value : null;
    if (typeof loss === "number" && isFinite(loss)) {
      state.losses.push(loss);
      lossChanged = true;
    }
    if (ev.kind === "progress") progress = d;
    if (ev.kind === "artifact") artifacts = true;
    if (ev.kind === "status" && TERMINAL.has(d.status)) finished = true;
  }
  log.append(frag);
  let extra = log.childElementCount - 5000;
  while (extra-- > 0) log.firstElementChild.remove();
  if (stick) log.scrollTop = log.scrollHeight;
  if (warns.childElementCount) {
    $("warnings").append(warns);
    $("warnings").hidden = false;
  }
  if (nodesChanged) { renderNodes(); graphView.setStatuses(state.nodes); }
  if (lossChanged) renderChart();
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

/** A plain SVG line of the loss values; at most 2000 points are drawn (evenly picked). */
function renderChart() {
  const all = state.losses;
  $("chart-wrap").hidden = all.length === 0;
  const step = Math.max(1, Math.ceil(all.length / 2000));
  const pts = all.filter((_, i) => i % step === 0 || i === all.length - 1);
  const lo = Math.min(...pts), hi = Math.max(...pts);
  const span = hi - lo || 1;
  const W = 600, H = 160, pad = 6;
  const xy = pts.map((v, i) => `${(pad + (i / Math.max(1, pts.length - 1)) * (W - 2 * pad)).toFixed(1)},` +
    `${(H - pad - ((v - lo) / span) * (H - 2 * pad)).toFixed(1)}`);
  const svg = $("loss-chart");
  const ns = "http://www.w3.org/2000/svg";
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("points", xy.join(" "));
  line.setAttribute("class", "loss-line");
  svg.replaceChildren(line);
  $("chart-caption").textContent = `${all.length} values · last ${num(all[all.length - 1])} · min ${num(lo)} · max ${num(hi)}`;
}

/** "epoch 3/10", "loss 0.41", then the other values of a progress event. */
function progressParts(d, all) {
  const parts = [];
  if (d.epoch != null) parts.push(`epoch ${d.epoch}${d.epochs != null ? `/${d.epochs}` : ""}`);
  if (d.step != null) parts.push(`step ${d.step}${d.steps != null ? `/${d.steps}` : ""}`);
  if (d.loss != null) parts.push(`loss ${num(d.loss)}`);
  for (const [k, v] of Object.entries(d)) {
    if (["node_id", "event", "epoch", "epochs", "step", "steps", "loss"].includes(k)) continue;
    if (typeof v !== "object" || v === null) parts.push(`${k} ${num(v)}`);
    else if (all) parts.push(`${k} ${JSON.stringify(v)}`);
  }
  return parts;
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
  fill($("artifacts-body"), list.map((a) => h("tr", {},
    h("td", {}, a.kind), h("td", {}, a.name), h("td", {}, a.backend),
    h("td", { class: "mono path" }, artifactPath(a) || (a.relative_path ? `(not here) ${a.relative_path}` : "")),
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
workersPanel.init({ act, select, onWorkers: renderTargets });

// -- polling ---------------------------------------------------------------------
let ticking = null;
async function tick() {
  if (ticking) return ticking;
  ticking = (async () => {
    try {
      state.runs = await api("GET", "/api/runs");
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
  api("GET", "/api/health").then((hv) => { $("version").textContent = `v${hv.version}`; }).catch(() => {});
  if (!getToken() && !(await bootstrap())) askToken(bootstrapRefusal);
  else if (getToken()) await sessionCookie();
  const m = /^#run=(.+)$/.exec(location.hash);
  await tick();
  if (m) select(decodeURIComponent(m[1]));
  // No polling in a hidden tab; coming back refreshes at once.
  const loop = async () => { if (!document.hidden) await tick(); setTimeout(loop, 2000); };
  setTimeout(loop, 2000);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) { state.workersAt = 0; tick(); } });
}

start();
