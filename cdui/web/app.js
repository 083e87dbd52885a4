// cdui web page: runs, run detail with live events, submit, uploads, workers.
import { api, ApiError, bootstrap, bootstrapRefusal, getToken, onTokenNeeded, setToken } from "./api.js";
import { $, badge, fill, h, num, size, target, time, TERMINAL } from "./dom.js";
import { oneShotBlock } from "./oneshot.js";

const state = {
  runs: [], runsKey: "", selected: null, run: null,
  lastSeq: 0, finalStatus: null, stream: null, streamGen: 0, backoff: 1000, retry: null,
  workersAt: 0, workersMissing: false,
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
  $("token-form").hidden = false;
  $("token-error").hidden = !message;
  $("token-error").textContent = message || "";
  setStatus("needs the session token", "warn");
}
onTokenNeeded((hadToken) => askToken(hadToken ? "The server did not accept that token." : ""));

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  setToken($("token-input").value);
  $("token-input").value = "";
  $("token-form").hidden = true;
  tick();
});

function setStatus(text, cls) {
  const el = $("server-status");
  el.textContent = text;
  el.className = `server-status ${cls || ""}`;
}

// -- runs list -----------------------------------------------------------------
function runInfo(r) {
  if (r.status === "queued" && r.queue_reason) return r.queue_reason;
  if (r.status === "disconnected" && r.worker_status) return r.worker_status.text || "worker disconnected";
  if (r.error) return r.error;
  return "";
}

function renderRuns() {
  const key = JSON.stringify(state.runs) + state.selected;
  if (key === state.runsKey) return;
  state.runsKey = key;
  $("runs-empty").hidden = state.runs.length > 0;
  fill($("runs-body"), state.runs.map((r) => h("tr", {
    class: r.id === state.selected ? "selected" : "", dataset: { runId: r.id },
    onclick: () => select(r.id),
  },
  h("td", {}, h("button", { type: "button", class: "link mono", "aria-label": `Show run ${r.id}` }, r.id),
    r.name ? h("div", { class: "small muted" }, r.name) : null),
  h("td", {}, badge(r.status)),
  h("td", {}, target(r.target)),
  h("td", {}, r.worker_id || ""),
  h("td", {}, r.device || (r.options && r.options.device !== "auto" ? r.options.device : "") || ""),
  h("td", { class: "info" }, runInfo(r)),
  h("td", { class: "nowrap" }, time(r.created_at)),
  h("td", { class: "nowrap" }, time(r.finished_at)))));
}

// -- run detail ------------------------------------------------------------------
function select(id) {
  if (state.selected === id) return;
  closeStream();
  Object.assign(state, { selected: id, run: state.runs.find((r) => r.id === id) || null, lastSeq: 0, finalStatus: null });
  history.replaceState(null, "", id ? `#run=${encodeURIComponent(id)}` : location.pathname + location.search);
  fill($("log"));
  $("progress").hidden = true;
  $("detail-body").hidden = !id;
  $("detail-empty").hidden = !!id;
  renderRuns();
  if (!id) return;
  if (state.run) renderDetail();
  else tick();
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
$("btn-delete").addEventListener("click", () => act(async () => {
  const id = state.selected;
  if (!confirm(`Delete run ${id}, its events and its files on this server?`)) return;
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
  const ws = new WebSocket(`${proto}//${location.host}/ws/runs/${encodeURIComponent(id)}` +
    `?after=${state.lastSeq}&token=${encodeURIComponent(getToken())}`);
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

function addEvent(ev) {
  if (!ev || typeof ev.seq !== "number" || ev.seq <= state.lastSeq) return;
  state.lastSeq = ev.seq;
  const d = ev.data || {};
  const level = ev.kind === "log" ? d.level || "info" : ev.kind === "node_status" ? d.status : "";
  const log = $("log");
  const stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
  log.append(h("li", { class: `ev ev-${ev.kind} ${level ? `lvl-${level}` : ""}`, dataset: { seq: ev.seq } },
    h("span", { class: "seq" }, ev.seq),
    h("time", { datetime: ev.at || "" }, ev.at ? new Date(ev.at).toLocaleTimeString() : ""),
    h("span", { class: "kind" }, ev.kind === "run_warning" ? `⚠ ${d.kind || "warning"}` : ev.kind),
    h("span", { class: "msg" }, describe(ev))));
  while (log.childElementCount > 5000) log.firstElementChild.remove();
  if (stick) log.scrollTop = log.scrollHeight;
  if (ev.kind === "progress") renderProgress(d);
  if (ev.kind === "artifact") loadArtifacts();
  if (ev.kind === "status" && TERMINAL.has(d.status)) {
    state.finalStatus = d.status;
    loadArtifacts();
    tick();
  }
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
    h("td", { class: "mono path" }, a.path || (a.relative_path ? `(not here) ${a.relative_path}` : ""),
      // A bucket's object: its s3:// address, for `mc cp` or `aws s3 cp`.
      a.backend === "s3" ? h("button", { type: "button", onclick: () => navigator.clipboard && navigator.clipboard.writeText(a.path) }, "Copy path") : null),
    h("td", { class: "nowrap" }, size(a.size)),
    h("td", { class: "mono", title: a.sha256 || "" }, a.sha256 ? a.sha256.slice(0, 12) : ""),
    h("td", {}, a.path ? h("a", {
      href: `/api/runs/${encodeURIComponent(id)}/artifacts/${encodeURIComponent(a.id)}/download?token=${encodeURIComponent(getToken())}`,
      download: "", "aria-label": `Download ${a.name}`,
    }, "download") : ""))));
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
  return { worker: t };
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
  act(async () => {
    const r = await api("POST", `/api/${encodeURIComponent(kind)}/upload`, form);
    $("upload-results").prepend(h("li", { class: "upload" },
      h("strong", {}, r.path || `${kind}/${r.name}`), " · ", size(r.size), " · ",
      h("span", { class: "mono", title: r.sha256 }, `sha256 ${r.sha256}`)));
    $("upload-file").value = "";
  });
});

// -- workers ---------------------------------------------------------------------
async function loadWorkers() {
  let data;
  try {
    data = await api("GET", "/api/workers");
    state.workersMissing = false;
  } catch (err) {
    // Before the remote-workers feature the route does not exist: say "no workers" quietly.
    state.workersMissing = err instanceof ApiError && err.status === 404;
    data = { workers: [], rejected: [] };
  }
  const workers = (data && data.workers) || [];
  const rejected = (data && data.rejected) || [];
  $("workers-empty").hidden = workers.length > 0;
  fill($("workers-list"), workers.map(workerCard));
  $("rejected").hidden = rejected.length === 0;
  fill($("rejected-list"), rejected.map((r) => h("li", {},
    h("strong", {}, r.name || "(no name)"), `: ${r.reason || ""}`,
    h("div", { class: "small muted" }, [r.address, time(r.at)].filter(Boolean).join(" · ")))));
  fill($("target-options"), ["local", "any", "one-shot", ...workers.map((w) => w.name)].map((v) => h("option", { value: v })));
}

function labels(l) {
  if (!l) return "";
  if (Array.isArray(l)) return l.join(", ");
  if (typeof l === "object") return Object.entries(l).map(([k, v]) => (v ? `${k}=${v}` : k)).join(", ");
  return String(l);
}

function workerCard(w) {
  const name = encodeURIComponent(w.name);
  const button = (text, fn, cls) => h("button", { type: "button", class: cls || "", onclick: () => act(fn),
    "aria-label": `${text} worker ${w.name}` }, text);
  const devices = (w.devices || []).map((d) => `${d.device} (${d.in_use ?? 0}/${d.slots ?? "?"} in use)`).join(", ");
  return h("li", { class: "worker", dataset: { worker: w.name } },
    h("div", { class: "worker-head" }, h("strong", {}, w.name), badge(w.status, "worker"),
      w.unencrypted ? h("span", { class: "badge mark-warn" }, "Unencrypted HTTP") : null),
    h("dl", { class: "facts compact" },
      fact("Version", w.version), fact("Devices", devices), fact("Address", w.address),
      fact("Labels", labels(w.labels)), fact("Last seen", time(w.last_seen)),
      fact("Runs", (w.runs || []).length ? (w.runs || []).map((id) => h("button", {
        type: "button", class: "link mono", onclick: () => select(id) }, id)) : "")),
    oneShotBlock(w, { openRun: select, removeInstance: (n) => act(async () => {
      await api("DELETE", `/api/workers/${encodeURIComponent(n)}`);
      await loadWorkers();
    }) }),
    h("div", { class: "actions" },
      w.status === "online" ? button("Drain", () => api("POST", `/api/workers/${name}/drain`).then(loadWorkers)) : null,
      w.status === "draining" ? button("Undrain", () => api("POST", `/api/workers/${name}/undrain`).then(loadWorkers)) : null,
      button("Remove", async () => {
        if (!confirm(`Remove worker ${w.name}? Its credential is revoked, its running runs end as interrupted and its queued runs fail.`)) return;
        await api("DELETE", `/api/workers/${name}`);
        await loadWorkers();
      }, "danger")));
}

$("btn-add-worker").addEventListener("click", () => act(async () => {
  // The page's own origin: behind a TLS proxy it is https:// although the server itself sees plain HTTP.
  const t = await api("POST", "/api/workers/tokens", { ttl_s: 86400, uses: 1, control: location.origin });
  const copy = (text) => h("button", { type: "button", onclick: () => navigator.clipboard && navigator.clipboard.writeText(text) }, "Copy");
  fill($("enroll"),
    h("p", {}, "Enrollment token, shown only this once (valid 24 h, one agent):"),
    h("div", { class: "copy-row" }, h("code", { class: "mono", id: "enroll-token" }, t.token), copy(t.token)),
    t.command ? [h("p", {}, "Run on the worker machine:"),
      h("div", { class: "copy-row" }, h("code", { class: "mono", id: "enroll-command" }, t.command), copy(t.command))] : null,
    t.ca_fingerprint ? h("p", { class: "small" }, "Proxy key fingerprint (pinned by --ca-fingerprint): ",
      h("code", { class: "mono", id: "enroll-fingerprint" }, t.ca_fingerprint)) : null,
    t.fingerprint_command ? [h("p", { class: "small muted" }, "To confirm the fingerprint, run on the proxy host:"),
      h("div", { class: "copy-row" }, h("code", { class: "mono", id: "enroll-fingerprint-command" }, t.fingerprint_command),
        copy(t.fingerprint_command))] : null,
    t.expires_at ? h("p", { class: "small muted" }, `Expires ${time(t.expires_at)}`) : null,
    h("button", { type: "button", onclick: () => { fill($("enroll")); $("enroll").hidden = true; } }, "Done"));
  $("enroll").hidden = false;
}));

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
      if (Date.now() - state.workersAt > (state.workersMissing ? 30000 : 5000)) {
        state.workersAt = Date.now();
        await loadWorkers();
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
  const m = /^#run=(.+)$/.exec(location.hash);
  await tick();
  if (m) select(decodeURIComponent(m[1]));
  const loop = async () => { await tick(); setTimeout(loop, 2000); };
  setTimeout(loop, 2000);
}

start();
