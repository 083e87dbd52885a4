// The canvas page: fetches the node catalog, builds the palette and the editors,
// then hands the page to the tabs (tabs.js), the config panel (panel.js) and
// Run (run.js).
import { api, ApiError, bootstrap, bootstrapRefusal, getToken } from "../api.js";
import { $ } from "../dom.js";
import { Editor } from "./editor.js";
import { createPalette, openQuickSearch } from "./palette.js";
import { initLayers } from "./layers.js";
import { initPanel } from "./panel.js";
import { initRun } from "./run.js";
import { initTabs } from "./tabs.js";

function showError(err) {
  const e = err instanceof ApiError ? err : { message: String((err && err.message) || err), hint: "" };
  $("banner-message").textContent = e.message;
  $("banner-hint").textContent = e.hint || "";
  $("banner").hidden = false;
}
$("banner-close").addEventListener("click", () => { $("banner").hidden = true; });

async function start() {
  if (!getToken() && !(await bootstrap())) {
    showError({ message: bootstrapRefusal || "This page could not get the session token by itself.",
      hint: "Open the Runs page (link above), paste the token there, then come back with the Canvas link." });
    $("canvas-status").textContent = "needs the session token";
    return;
  }
  const [nodes, presets] = await Promise.all([api("GET", "/api/nodes"),
    api("GET", "/api/presets").then((r) => r.presets || [], () => [])]);
  // The catalog every part gets: GET /api/nodes's answer, plus the installed presets.
  const catalog = { ...nodes, presets };
  const createEditor = (container) => new Editor(container, catalog);

  const root = $("canvas-main");
  const tabs = initTabs({ root, catalog, createEditor });
  // A SequentialModel's layers open as a sub-canvas over the tab's (layers.js): while one is open,
  // the toolbar, the config panel and window.cduiCanvas.editor() act on its editor.
  const layers = initLayers({ host: root, catalog, tabs,
    onStatus: (text) => { $("canvas-status").textContent = text; } });
  const editor = () => layers.current() || tabs.active().editor;

  createPalette({ root: $("palette"), catalog, presets, onAdd: (type) => {
    tabs.active().editor.addNode(type);
    tabs.active().editor.focus();
  } });
  // A double-click on empty canvas (any tab's editor) opens the quick search there.
  root.addEventListener("cd-quicksearch", (e) => {
    const { editor: ed, clientX, clientY, at } = e.detail;
    openQuickSearch({ catalog, presets, clientX, clientY, onPick: (type) => {
      ed.addNode(type, at);
      ed.focus();
    } });
  });

  $("btn-undo").addEventListener("click", () => editor().undo());
  $("btn-redo").addEventListener("click", () => editor().redo());
  $("btn-delete-sel").addEventListener("click", () => editor().deleteSelection());
  $("btn-fit").addEventListener("click", () => editor().fit());
  $("btn-layout").addEventListener("click", () => editor().layout());
  const snap = $("snap");
  snap.addEventListener("change", () => editor().setSnap(snap.checked));
  const follow = () => editor().setSnap(snap.checked);
  follow();
  tabs.onActiveChange(follow);
  layers.onChange(follow);
  // Ctrl+S anywhere on the page: Save belongs to the files part (files.js listens for it).
  window.addEventListener("keydown", (e) => {
    if ((e.ctrlKey || e.metaKey) && !e.altKey && e.key.toLowerCase() === "s") {
      e.preventDefault();
      window.dispatchEvent(new CustomEvent("canvas-save", { detail: { shift: e.shiftKey } }));
    }
  });

  // The panel shows the selected node of the layer editor while one is open; its "Edit layers"
  // button asks for the sub-canvas with a cv-edit-layers event.
  const panelTabs = { ...tabs, active: () => (layers.current() ? { ...tabs.active(), editor: layers.current() } : tabs.active()),
    onActiveChange: (cb) => { tabs.onActiveChange(cb); layers.onChange(cb); } };
  initPanel({ root: $("panel"), catalog, tabs: panelTabs });
  $("panel").addEventListener("cv-edit-layers", (e) => layers.open(e.detail));
  initRun({ toolbar: $("run-toolbar"), results: $("results"), tabs, catalog });

  window.cduiCanvas = { editor, tabs, catalog, presets, layers };
  $("canvas-status").textContent = `${(catalog.nodes || []).length} node types`;
  document.body.dataset.ready = "1";
}

start().catch((err) => {
  showError(err);
  $("canvas-status").textContent = "failed to start";
});
