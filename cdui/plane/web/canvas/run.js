// Running from the canvas: Run and Stop (a canvas run on this server, POST /api/canvas/run), Queue on…
// (an ordinary queued run, POST /api/runs), New sweep… (the runs page's sweep form, sweepform.js, on the
// tab's graph with the target chosen in Queue on…), the per-tab toggles (Persist weights, Record outputs) and
// Reset weights, validation badges on the nodes and edges, node statuses from the run's event stream
// onto the tab's editor, the results panel (results.js) and the Inspector (inspector.js).
//
// Each tab has its own last run: its events stream on /ws/runs/{id} (pushed, never polled) while the
// page is open, and its id is kept in the browser so a reload shows it again. Nothing here polls: the
// worker list for Queue on… is read when the picker is opened, validation runs on an edit (debounced).
import { api, ApiError } from "../api.js";
import { fill, h, TERMINAL } from "../dom.js";
import * as sweepform from "../sweepform.js";
import { inspect } from "./inspector.js";
import { createResults, RunView } from "./results.js";

const VALIDATE_DELAY_MS = 400;
const KEEP = "cdui-canvas-run:";      // localStorage: a tab's last run ({id, kind, ...}), by tab id
const enc = encodeURIComponent;
const FIXED_TARGETS = [["local", "This server (local)"], ["any", "Any available"], ["one-shot", "One-shot worker"]];

/** The run API's target for a picker value ("local", "any", "one-shot", "worker:NAME"). */
export function targetValue(v) {
  if (v === "local" || v === "any") return v;
  if (v === "one-shot") return { pool: "one-shot" };
  return { worker: String(v).replace(/^worker:/, "") };
}

function targetLabel(v) {
  const fixed = FIXED_TARGETS.find(([k]) => k === v);
  return fixed ? fixed[1] : `worker ${String(v).replace(/^worker:/, "")}`;
}

/**
 * Validation errors as editor badges: on the node they name, and on the edge when the error is about
 * one (a port that does not exist, types that do not connect).
 */
export function badgesFor(errors, graph) {
  const nodes = new Set((graph.nodes || []).map((n) => n.id));
  const edges = graph.edges || [];
  const out = [];
  for (const e of errors || []) {
    const message = e.hint ? `${e.message} (${e.hint})` : e.message;
    let edge = null;
    if (e.code === "bad_port" && e.node_id) {
      edge = edges.find((x) => (x.target === e.node_id && x.targetHandle === e.value) ||
        (x.source === e.node_id && x.sourceHandle === e.value));
    } else if (e.code === "type_mismatch" && e.node_id) {
      edge = edges.find((x) => x.target === e.node_id && String(e.message).startsWith(`${x.source}.${x.sourceHandle} (`) &&
        String(e.message).includes(` ${e.node_id}.${x.targetHandle} (`));
    }
    if (edge) out.push({ edge_id: edge.id, message });
    if (e.node_id && nodes.has(e.node_id)) out.push({ node_id: e.node_id, message });
  }
  return out;
}

function injectStyle() {
  if (document.querySelector("link[data-canvas-run]")) return;
  document.head.append(h("link", { rel: "stylesheet", href: new URL("./run.css", import.meta.url).href,
    dataset: { canvasRun: "1" } }));
}

export function initRun({ toolbar, results, tabs }) {
  injectStyle();
  const panel = createResults(results);
  const perTab = new Map();           // tab id -> {view, editor, gen, ws, retry, backoff, lastSeq, misses}
  const watched = new WeakSet();      // editors whose events we listen to
  let validateTimer = 0, validateGen = 0, inspected = null;

  // -- the toolbar ------------------------------------------------------------------------------
  const runBtn = h("button", { type: "button", id: "canvas-run", class: "primary", title: "Run the tab's graph on this server" }, "Run");
  const stopBtn = h("button", { type: "button", id: "canvas-stop", "aria-disabled": "true", title: "Stop the tab's run" }, "Stop");
  const persist = h("input", { type: "checkbox", id: "canvas-persist" });
  const reset = h("button", { type: "button", id: "canvas-reset-weights", title: "Drop the weights this tab kept" }, "Reset weights");
  const record = h("input", { type: "checkbox", id: "canvas-record" });
  const device = h("input", { id: "canvas-device", list: "canvas-device-options", placeholder: "auto", size: "6",
    autocomplete: "off", spellcheck: "false" });
  const picker = h("select", { id: "canvas-queue-target", "aria-label": "Queue on" },
    FIXED_TARGETS.map(([v, label]) => h("option", { value: v }, label)));
  const queueBtn = h("button", { type: "button", id: "canvas-queue", title: "Queue the tab's graph as a run on the chosen target" }, "Queue on…");
  const sweepBtn = h("button", { type: "button", id: "canvas-sweep", "aria-controls": "canvas-newsweep", "aria-expanded": "false",
    title: "Run the tab's graph many times with different param values (a sweep), on the target chosen in Queue on…" }, "New sweep…");
  const sweepBox = h("div", { id: "canvas-newsweep", class: "clone cr-sweep", role: "dialog", "aria-label": "New sweep", hidden: true });
  sweepBox.addEventListener("keydown", (e) => { if (e.key === "Escape") { sweepform.close(); sweepBtn.focus(); } });
  document.body.append(sweepBox);
  const validity = h("span", { id: "canvas-validity", class: "small muted", role: "status", "aria-live": "polite" });
  toolbar.append(h("div", { class: "cr-toolbar", role: "group", "aria-label": "Run" },
    runBtn, stopBtn,
    h("label", { class: "cr-check" }, persist, " Persist weights"), reset,
    h("label", { class: "cr-check" }, record, " Record outputs"),
    h("label", { class: "cr-field" }, "Device ", device),
    h("datalist", { id: "canvas-device-options" }, ["auto", "cpu", "cuda", "cuda:0", "mps"].map((v) => h("option", { value: v }))),
    h("span", { class: "cr-queue" }, queueBtn, picker, sweepBtn), validity));

  const active = () => tabs.active();
  const optionsOf = (tab) => {
    if (!tab.options) tab.options = {};
    return tab.options;
  };
  const deviceValue = () => {
    const d = device.value.trim();
    return d && d !== "auto" ? d : null;
  };

  function showToggles() {
    const tab = active();
    const o = tab ? optionsOf(tab) : {};
    persist.checked = !!o.persist_weights;
    record.checked = !!o.record_outputs;
  }
  persist.addEventListener("change", () => { optionsOf(active()).persist_weights = persist.checked; });
  record.addEventListener("change", () => { optionsOf(active()).record_outputs = record.checked; });

  /** The Queue on… choices: the fixed ones, then one per worker (the chosen one kept). */
  async function refreshTargets() {
    let workers = [];
    try {
      workers = ((await api("GET", "/api/workers")) || {}).workers || [];
    } catch (err) {
      if (!(err instanceof ApiError) || err.status !== 404) return;
    }
    const want = [...FIXED_TARGETS, ...workers.map((w) => [`worker:${w.name}`, `Worker ${w.name}${w.state && w.state !== "online" ? ` (${w.state})` : ""}`])];
    const have = [...picker.options].map((o) => `${o.value}|${o.textContent}`);
    if (JSON.stringify(have) === JSON.stringify(want.map(([v, l]) => `${v}|${l}`))) return;
    const keep = picker.value;
    fill(picker, want.map(([v, label]) => h("option", { value: v }, label)));
    picker.value = want.some(([v]) => v === keep) ? keep : "local";
  }
  picker.addEventListener("focus", refreshTargets);
  picker.addEventListener("pointerdown", refreshTargets);

  // -- per-tab runs and their event streams -------------------------------------------------------
  function running(st) {
    return !!st && !TERMINAL.has(st.view.status);
  }

  function showControls() {
    const st = perTab.get(active() && active().tabId);
    stopBtn.setAttribute("aria-disabled", running(st) ? "false" : "true");
  }

  function applyStatuses(st) {
    const ed = st.editor;
    if (!ed) return;
    for (const [id, n] of st.view.nodes) {
      if (ed.node(id)) ed.setNodeStatus(id, n.status, { seconds: n.seconds, error: n.error });
    }
  }

  function closeStream(st) {
    st.gen++;
    st.inbox.length = 0;
    st.parsed = [];
    st.parsedAt = 0;
    if (st.pumping) cancelAnimationFrame(st.pumping);
    st.pumping = 0;
    clearTimeout(st.retry);
    st.retry = 0;
    if (st.ws) st.ws.close();
    st.ws = null;
  }

  function forget(tabId) {
    const st = perTab.get(tabId);
    if (st) closeStream(st);
    perTab.delete(tabId);
    localStorage.removeItem(KEEP + tabId);
  }

  /** Follow ``run`` ({id, kind, ...}) as the tab's run: its events from ``after`` (0: all of them). */
  function attach(tabId, editor, run) {
    const old = perTab.get(tabId);
    if (old) closeStream(old);
    const st = { view: new RunView(run), editor, gen: 0, ws: null, retry: 0, backoff: 1000, lastSeq: 0, misses: 0,
      inbox: [], parsed: [], parsedAt: 0, pumping: 0 };
    perTab.set(tabId, st);
    try {
      localStorage.setItem(KEEP + tabId, JSON.stringify(run));
    } catch {
      localStorage.setItem(KEEP + tabId, JSON.stringify({ ...run, graph: null })); // over the quota: no Inspector inputs
    }
    if (active() && active().tabId === tabId) panel.show(st.view);
    openStream(tabId, st);
    showControls();
    return st;
  }

  function openStream(tabId, st) {
    const gen = ++st.gen;
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    // The session cookie authenticates it: no token in the URL.
    // batch=1: the server sends the events that are ready as one array per message (tens of messages a
    // second, not thousands, during a flood).
    const ws = new WebSocket(`${proto}//${location.host}/ws/runs/${enc(st.view.run.id)}?after=${st.lastSeq}&batch=1`);
    st.ws = ws;
    let got = false;
    ws.onopen = () => { st.backoff = 1000; };
    ws.onmessage = (m) => {
      if (gen !== st.gen) return;
      got = true;
      st.misses = 0;
      // Only kept here: the events are read and drawn a frame's budget at a time (pump), so a run
      // that logs thousands of lines a second never holds the page between two frames.
      st.inbox.push(m.data);
      pump(tabId, st);
    };
    ws.onclose = () => {
      if (gen !== st.gen) return;
      drain(tabId, st, Infinity); // what arrived before the close, the final status among it
      st.ws = null;
      if (TERMINAL.has(st.view.status)) return;
      if (!got && ++st.misses >= 2) { checkGone(tabId, st); return; }
      // Reconnect from the last event we have; a hidden page waits until it is shown again.
      const again = () => {
        st.retry = 0;
        if (gen !== st.gen) return;
        if (document.hidden) { document.addEventListener("visibilitychange", again, { once: true }); return; }
        openStream(tabId, st);
      };
      st.retry = setTimeout(again, st.backoff);
      st.backoff = Math.min(st.backoff * 2, 10000);
    };
  }

  /** A stream that closes without a word twice: the run may have been deleted. */
  async function checkGone(tabId, st) {
    try {
      await api("GET", `/api/runs/${enc(st.view.run.id)}`);
      st.misses = 0;
      st.retry = setTimeout(() => openStream(tabId, st), st.backoff);
    } catch (err) {
      if (err instanceof ApiError && err.status === 404 && perTab.get(tabId) === st) {
        forget(tabId);
        if (active() && active().tabId === tabId) panel.show(null);
        showControls();
      }
    }
  }

  // -- the events' inbox ---------------------------------------------------------------------------
  // Milliseconds of each animation frame given to reading events: the rest is the page's own (the log,
  // the editor, the browser's paint), so the canvas keeps its frame rate while a run floods it.
  const FRAME_BUDGET_MS = 6;

  /** Read the tab's waiting events at the next frame (at once on a hidden page, which draws no frames). */
  function pump(tabId, st) {
    if (document.hidden) { drain(tabId, st, Infinity); return; }
    if (st.pumping) return;
    st.pumping = requestAnimationFrame(() => {
      st.pumping = 0;
      if (perTab.get(tabId) !== st) { st.inbox.length = 0; st.parsed = []; st.parsedAt = 0; return; }
      drain(tabId, st, FRAME_BUDGET_MS);
      if (st.inbox.length || st.parsedAt < st.parsed.length) pump(tabId, st);
    });
  }

  /** Read waiting events for at most ``budgetMs`` (at least one batch), oldest first. A message is an
   * array of events (batch=1) or one event; a message's events not read yet wait in ``st.parsed``. */
  function drain(tabId, st, budgetMs) {
    if (!st.inbox.length && st.parsedAt >= st.parsed.length) return;
    const t0 = performance.now();
    let i = 0;
    do {
      if (st.parsedAt >= st.parsed.length) {
        const m = JSON.parse(st.inbox[i++]);
        st.parsed = Array.isArray(m) ? m : [m];
        st.parsedAt = 0;
      }
      const batch = st.parsed.slice(st.parsedAt, st.parsedAt + 32);
      st.parsedAt += batch.length;
      onEvents(tabId, st, batch);
    } while ((i < st.inbox.length || st.parsedAt < st.parsed.length) && performance.now() - t0 < budgetMs);
    st.inbox.splice(0, i);
  }

  function onEvents(tabId, st, events) {
    const fresh = [];
    let chart = false, ended = false;
    for (const ev of events) {
      if (!ev || typeof ev.seq !== "number" || ev.seq <= st.lastSeq) continue;
      st.lastSeq = ev.seq;
      fresh.push(ev);
      const changed = st.view.add(ev);
      chart = chart || changed.chart;
      const d = ev.data || {};
      if (ev.kind === "node_status" && d.node_id && st.editor && st.editor.node(d.node_id)) {
        st.editor.setNodeStatus(d.node_id, d.status, { seconds: d.seconds, error: d.error });
      }
      if (ev.kind === "status" && TERMINAL.has(d.status)) ended = true;
    }
    if (!fresh.length) return;
    if (ended) {
      // A node still running when the run ended did not finish.
      for (const [id, n] of st.view.nodes) {
        if (n.status === "running") {
          n.status = "stopped";
          if (st.editor && st.editor.node(id)) st.editor.setNodeStatus(id, "stopped", {});
        }
      }
    }
    panel.added(st.view, fresh, chart);
    if (ended) {
      showControls();
      if (inspected && inspected.tabId === tabId) openInspector(inspected.nodeId);
    } else if (fresh.some((ev) => ev.kind === "status")) showControls();
  }

  // -- validation ----------------------------------------------------------------------------------
  /** Validate the active tab's graph; its errors become badges. Returns the answer (or null). */
  async function validate(options) {
    const tab = active();
    if (!tab || !tab.editor) return null;
    const gen = ++validateGen;
    const graph = tab.editor.toJSON();
    let answer;
    try {
      answer = await api("POST", "/api/graphs/validate", { graph, options: options || { target: "local" } });
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      answer = { valid: false, errors: [{ node_id: null, code: err.code, message: err.message, hint: err.hint }] };
    }
    if (gen !== validateGen || !active() || active().tabId !== tab.tabId) return answer;
    tab.editor.setBadges(badgesFor(answer.errors, graph));
    const n = answer.errors.length;
    validity.textContent = answer.valid ? "✓ valid" : `${n} problem${n === 1 ? "" : "s"}`;
    validity.className = `small ${answer.valid ? "ok-text" : "error-text"}`;
    validity.title = answer.errors.map((e) => `${e.node_id ? `${e.node_id}: ` : ""}${e.message}`).join("\n");
    return answer;
  }

  function scheduleValidate() {
    clearTimeout(validateTimer);
    validateTimer = setTimeout(() => { validateTimer = 0; validate().catch(() => {}); }, VALIDATE_DELAY_MS);
  }

  // -- Run, Stop, Reset weights, Queue on… ---------------------------------------------------------------
  async function busy(button, fn) {
    if (button.disabled) return;
    button.disabled = true; // one request at a time: a double click sends one
    try {
      await fn();
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      panel.message("error", err.message, err.hint, err.details);
      const tab = active();
      if (err.details && tab && tab.editor) tab.editor.setBadges(badgesFor(err.details, tab.editor.toJSON()));
    } finally {
      button.disabled = false;
    }
  }

  runBtn.addEventListener("click", () => busy(runBtn, async () => {
    const tab = active();
    if (!tab || !tab.editor) return;
    clearTimeout(validateTimer);
    const dev = deviceValue();
    const checked = await validate({ target: "local", ...(dev ? { device: dev } : {}) });
    if (checked && !checked.valid) {
      panel.message("error", `The graph has ${checked.errors.length} problem${checked.errors.length === 1 ? "" : "s"}: fix them to run it.`,
        "Each is marked on its node; hover the mark to read it.", checked.errors);
      return;
    }
    const o = optionsOf(tab);
    const graph = tab.editor.toJSON();
    const body = { tab: tab.tabId, graph, persist_weights: !!o.persist_weights, record_outputs: !!o.record_outputs };
    if (dev) body.device = dev;
    const answer = await api("POST", "/api/canvas/run", body);
    panel.clearMessage();
    tab.editor.clearStatuses();
    attach(tab.tabId, tab.editor, { id: answer.run_id, kind: "canvas", targetLabel: "this server", local: true,
      record_outputs: body.record_outputs, graph });
  }));

  stopBtn.addEventListener("click", () => busy(stopBtn, async () => {
    const tab = active();
    const st = tab && perTab.get(tab.tabId);
    if (!running(st)) return;
    if (st.view.run.kind === "canvas") await api("POST", `/api/canvas/${enc(tab.tabId)}/stop`);
    else await api("POST", `/api/runs/${enc(st.view.run.id)}/stop`);
    panel.message("info", `Stop requested for run ${st.view.run.id}.`);
  }));

  reset.addEventListener("click", () => busy(reset, async () => {
    const tab = active();
    if (!tab) return;
    const r = await api("POST", `/api/canvas/${enc(tab.tabId)}/reset-weights`);
    panel.message("ok", `Weights reset: ${r.reset} kept module${r.reset === 1 ? "" : "s"} dropped; the next Run starts fresh.`);
  }));

  queueBtn.addEventListener("click", () => busy(queueBtn, async () => {
    const tab = active();
    if (!tab || !tab.editor) return;
    clearTimeout(validateTimer);
    const graph = tab.editor.toJSON();
    const choice = picker.value;
    const options = { target: targetValue(choice) };
    const dev = deviceValue();
    if (dev) options.device = dev;
    const rec = !!optionsOf(tab).record_outputs;
    if (rec) options.record_outputs = true;
    const run = await api("POST", "/api/runs", { graph, options });
    panel.message("ok", `Queued run ${run.id} on ${targetLabel(choice)}: it is listed in Runs; its status shows here while this page is open.`);
    tab.editor.clearStatuses();
    tab.editor.setBadges([]);
    attach(tab.tabId, tab.editor, { id: run.id, kind: "queued", targetLabel: targetLabel(choice), local: choice === "local",
      record_outputs: rec, graph });
  }));

  sweepBtn.addEventListener("click", async () => {
    if (!sweepBox.hidden) { sweepform.close(); return; }
    const tab = active();
    if (!tab || !tab.editor) return;
    await refreshTargets();
    const dev = deviceValue();
    await sweepform.open({ id: null, name: tab.name }, {
      graph: tab.editor.toJSON(), targets: picker, box: sweepBox, button: sweepBtn,
      title: `New sweep of tab ${tab.name}'s graph`, device: dev || "", recordOutputs: !!optionsOf(tab).record_outputs,
      onStarted: (sweep) => {
        sweepform.close();
        panel.message("ok", h("span", {}, `Started sweep ${sweep.id} (${sweep.total} variants) on ${targetLabel(picker.value)}: `,
          h("a", { href: `/web/sweep.html?id=${enc(sweep.id)}`, id: "canvas-sweep-link" }, "its page"), "; each variant is a run listed in Runs."));
      } });
  });

  // -- the Inspector --------------------------------------------------------------------------------
  function openInspector(nodeId) {
    const tab = active();
    if (!tab) return;
    const st = perTab.get(tab.tabId);
    inspected = { tabId: tab.tabId, nodeId };
    inspect(panel.inspector, st ? st.view.run : null, nodeId, st ? st.view.nodes.get(nodeId) : undefined)
      .catch((err) => panel.message("error", err.message || String(err)));
  }

  // -- tabs ----------------------------------------------------------------------------------------
  function watch(editor) {
    if (!editor || watched.has(editor)) return;
    watched.add(editor);
    editor.on("change", () => { if (active() && active().editor === editor) scheduleValidate(); });
    editor.on("open", (nodeId) => { if (active() && active().editor === editor) openInspector(nodeId); });
  }

  function onTab() {
    const tab = active();
    showToggles();
    panel.clearMessage();
    if (inspected && (!tab || inspected.tabId !== tab.tabId)) {
      inspected = null;
      panel.inspector.hidden = true;
      fill(panel.inspector);
    }
    if (!tab) { panel.show(null); showControls(); return; }
    watch(tab.editor);
    let st = perTab.get(tab.tabId);
    if (!st) {
      let kept = null;
      try { kept = JSON.parse(localStorage.getItem(KEEP + tab.tabId) || "null"); } catch { kept = null; }
      if (kept && kept.id) st = attach(tab.tabId, tab.editor, kept); // its events replay: statuses come back
    } else if (st.editor !== tab.editor) {
      st.editor = tab.editor;
      applyStatuses(st);
    }
    panel.show(st ? st.view : null);
    showControls();
    scheduleValidate();
  }

  tabs.onActiveChange(onTab);
  onTab();
  refreshTargets();
  return { validate, openInspector, refreshTargets };
}
