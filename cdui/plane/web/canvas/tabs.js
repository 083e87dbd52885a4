// Tabs: several graphs open at once, each with its own Editor (and so its own undo history) and
// its own options. Every tab autosaves to localStorage (secrets blanked) and comes back after a
// reload with the same id, which is also the id the canvas backend knows the tab's process by.
import { api } from "../api.js";
import { h, fill } from "../dom.js";
import { blankSecrets, catalogIndex, initFiles, useStyles } from "./files.js";

const INDEX_KEY = "cdui-canvas:tabs";
const TAB_KEY = (id) => `cdui-canvas:tab:${id}`;
// The backend's rule for tab ids (POST /api/canvas/run's "tab").
export const TAB_ID = /^[A-Za-z0-9_-]{1,64}$/;
const SAVE_DELAY_MS = 300; // autosave after this long without a further edit
const EMPTY = () => ({ nodes: [], edges: [] });

function newId() {
  const rnd = crypto.getRandomValues(new Uint8Array(9));
  return `tab-${Array.from(rnd, (b) => b.toString(36).padStart(2, "0")).join("").slice(0, 16)}`;
}

function readJSON(key) {
  try {
    const s = localStorage.getItem(key);
    return s ? JSON.parse(s) : null;
  } catch {
    return null;
  }
}

/**
 * initTabs({root, catalog, createEditor, stage?}): the tab bar and the file buttons go into `root`;
 * each tab's editor gets its own container in `stage` (made at the end of `root` when not given),
 * and `createEditor(container)` must return an Editor for it.
 */
export function initTabs({ root, catalog, createEditor, stage }) {
  useStyles();
  const byType = catalogIndex(catalog);
  const tabs = new Map(); // id -> tab record
  let order = [];
  let activeId = null;
  const listeners = [];
  const problems = [];

  const bar = h("div", { class: "cv-tabbar", role: "tablist", "aria-label": "Open graphs" });
  const addButton = h("button", { type: "button", class: "cv-tab-new", "aria-label": "New tab", title: "New tab",
    onclick: () => api_.newTab() }, "+");
  const toolbar = h("div", { class: "cv-files" });
  const note = h("div", { class: "cv-tabs-note small", role: "status" });
  root.classList.add("cv-tabs");
  fill(root, h("div", { class: "cv-tabs-row" }, bar, addButton, toolbar), note);
  if (!stage) {
    stage = h("div", { class: "cv-stage" });
    root.append(stage);
  }
  stage.classList.add("cv-stage");

  // -- storage -------------------------------------------------------------
  function writeIndex() {
    const index = {
      active: activeId,
      tabs: order.map((id) => {
        const t = tabs.get(id);
        return { id, name: t.name, savedAs: t.savedAs, dirty: t.dirty, options: { ...t.options } };
      }),
    };
    try {
      localStorage.setItem(INDEX_KEY, JSON.stringify(index));
    } catch (e) {
      note.textContent = `The tabs could not be kept in this browser's storage (${e.message}).`;
    }
  }

  function writeGraph(t) {
    clearTimeout(t.timer);
    t.timer = null;
    if (!t.pending) return;
    t.pending = false;
    try {
      localStorage.setItem(TAB_KEY(t.id), JSON.stringify(blankSecrets(t.editor.toJSON(), byType)));
      note.textContent = "";
    } catch (e) {
      note.textContent = `Tab ${t.name} could not be autosaved in this browser's storage (${e.message}); ` +
        "Save it to the server.";
    }
  }

  function schedule(t) {
    t.pending = true;
    clearTimeout(t.timer);
    t.timer = setTimeout(() => writeGraph(t), SAVE_DELAY_MS);
  }

  function flush() {
    for (const t of tabs.values()) writeGraph(t);
    writeIndex();
  }
  window.addEventListener("pagehide", flush);
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) flush();
    drawOnlyShown();
  });

  // -- tabs ----------------------------------------------------------------
  function optionsFor(t, given) {
    const base = { persist_weights: false, record_outputs: false, ...(given || {}) };
    // The run controls set options on the active tab's object: keep each setting with the tab.
    return new Proxy(base, {
      set(target, key, value) {
        target[key] = value;
        if (tabs.has(t.id)) writeIndex();
        return true;
      },
    });
  }

  function info(t) {
    return t ? { tabId: t.id, name: t.name, editor: t.editor, options: t.options, savedAs: t.savedAs, dirty: t.dirty } : null;
  }

  function create({ id, name, graph, savedAs = null, dirty = false, options }) {
    const t = { id, name, savedAs, dirty, timer: null, pending: false };
    t.options = optionsFor(t, options);
    t.container = h("div", { class: "cv-editor", role: "tabpanel", id: `cv-panel-${id}`, dataset: { tabId: id } });
    stage.append(t.container);
    t.editor = createEditor(t.container);
    try {
      t.editor.load(graph || EMPTY());
    } catch (e) {
      problems.push(`Tab ${name} could not be restored (${e.message}); it is empty now.`);
      t.editor.load(EMPTY());
    }
    t.editor.on("change", () => {
      if (!t.dirty) {
        t.dirty = true;
        drawBar();
        writeIndex();
      }
      schedule(t);
    });
    tabs.set(id, t);
    return t;
  }

  function drawBar() {
    fill(bar, order.map((id) => {
      const t = tabs.get(id);
      const selected = id === activeId;
      const label = h("span", { class: "cv-tab-name" }, t.name);
      const tab = h("div", { class: `cv-tab${selected ? " active" : ""}`, dataset: { tabId: id } },
        h("button", { type: "button", role: "tab", class: "cv-tab-button", "aria-selected": selected ? "true" : "false",
          "aria-controls": `cv-panel-${id}`, title: t.savedAs ? `data/graphs/${t.savedAs}.json (double-click to rename)` : "double-click to rename",
          onclick: () => api_.select(id), ondblclick: () => startRename(id),
          onkeydown: (ev) => { if (ev.key === "F2") startRename(id); } },
        label, t.dirty ? h("span", { class: "cv-tab-dirty", "aria-label": "unsaved changes" }, " •") : null),
        h("button", { type: "button", class: "plain cv-tab-close", "aria-label": `Close tab ${t.name}`,
          onclick: () => api_.close(id) }, "×"));
      return tab;
    }));
  }

  function startRename(id) {
    const t = tabs.get(id);
    const el = bar.querySelector(`.cv-tab[data-tab-id="${id}"] .cv-tab-name`);
    if (!t || !el) return;
    const input = h("input", { type: "text", class: "cv-tab-rename", "aria-label": `New name for tab ${t.name}`,
      value: t.name });
    let done = false;
    const finish = (keep) => {
      if (done) return;
      done = true;
      if (keep) api_.rename(id, input.value);
      else drawBar();
    };
    input.addEventListener("keydown", (ev) => {
      if (ev.key === "Enter") finish(true);
      else if (ev.key === "Escape") finish(false);
      ev.stopPropagation();
    });
    input.addEventListener("blur", () => finish(true));
    el.replaceWith(input);
    input.focus();
    input.select();
  }

  // Only the shown tab's editor draws, and none while the page is hidden: an editor draws on every
  // animation frame, which costs CPU for nothing on a canvas nobody sees.
  function drawOnlyShown() {
    for (const t of tabs.values()) t.editor.setDrawing?.(t.id === activeId && !document.hidden);
  }

  function show() {
    for (const t of tabs.values()) {
      const on = t.id === activeId;
      t.container.classList.toggle("active", on);
      t.container.inert = !on;
    }
    drawOnlyShown();
    drawBar();
  }

  function uniqueName(base) {
    const names = new Set([...tabs.values()].map((t) => t.name));
    if (!names.has(base)) return base;
    for (let i = 2; ; i++) if (!names.has(`${base} ${i}`)) return `${base} ${i}`;
  }

  const api_ = {
    /** {tabId, name, editor, options, savedAs, dirty} of the tab shown. */
    active: () => info(tabs.get(activeId)),
    onActiveChange(cb) { listeners.push(cb); },
    list: () => order.map((id) => info(tabs.get(id))),
    get: (id) => info(tabs.get(id)),
    /** Opens a graph in a new tab and shows it. */
    open(graph, name, { savedAs = null } = {}) {
      const t = create({ id: newId(), name: uniqueName(name || graph?.name || "Untitled"), graph, savedAs });
      t.pending = true;
      writeGraph(t);
      order.push(t.id);
      api_.select(t.id);
      return info(t);
    },
    newTab: () => api_.open(EMPTY(), "Untitled"),
    select(id) {
      if (!tabs.has(id)) return;
      const changed = id !== activeId;
      activeId = id;
      show();
      writeIndex();
      if (changed) for (const cb of listeners) cb(api_.active());
    },
    rename(id, name) {
      const t = tabs.get(id);
      const clean = String(name || "").trim().slice(0, 200);
      if (t && clean) t.name = clean;
      drawBar();
      writeIndex();
    },
    close(id) {
      const t = tabs.get(id);
      if (!t) return;
      clearTimeout(t.timer);
      const at = order.indexOf(id);
      order = order.filter((x) => x !== id);
      tabs.delete(id);
      try { t.editor.destroy(); } catch { /* an editor that fails to clean up still leaves the page */ }
      t.container.remove();
      localStorage.removeItem(TAB_KEY(id));
      // The tab's canvas process (cache and kept weights) is not needed any more; none may exist.
      api("DELETE", `/api/canvas/${id}`).catch(() => {});
      if (!order.length) {
        api_.newTab();
        return;
      }
      if (activeId === id) api_.select(order[Math.min(at, order.length - 1)]);
      else {
        drawBar();
        writeIndex();
      }
    },
    /** After a Save: the tab is known under that graph name and has no unsaved changes. */
    markSaved(id, savedAs) {
      const t = tabs.get(id);
      if (!t) return;
      t.savedAs = savedAs;
      t.name = savedAs;
      t.dirty = false;
      drawBar();
      writeIndex();
    },
    /** Writes every pending autosave now. */
    flush,
  };

  // -- restore -------------------------------------------------------------
  const index = readJSON(INDEX_KEY);
  for (const rec of Array.isArray(index?.tabs) ? index.tabs : []) {
    if (!rec || !TAB_ID.test(String(rec.id)) || tabs.has(rec.id)) continue;
    const graph = readJSON(TAB_KEY(rec.id));
    if (!graph) problems.push(`Tab ${rec.name || rec.id} had no stored graph; it is empty now.`);
    create({ id: rec.id, name: String(rec.name || "Untitled"), graph: graph || EMPTY(),
      savedAs: rec.savedAs || null, dirty: !!rec.dirty, options: rec.options });
    order.push(rec.id);
  }
  if (problems.length) note.textContent = problems.join(" ");
  if (!order.length) api_.newTab();
  else api_.select(tabs.has(index?.active) ? index.active : order[0]);

  api_.files = initFiles({ toolbar, tabs: api_, catalog });
  return api_;
}
