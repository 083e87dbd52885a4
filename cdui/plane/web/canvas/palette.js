// The node palette (catalog by category, searchable, plus installed presets) and
// the quick search that a double-click on empty canvas opens.
import { h as el } from "../dom.js";

const DRAG_TYPE = "application/x-cdui-node";

function entries(catalog, presets) {
  const list = (Array.isArray(catalog) ? catalog : (catalog && catalog.nodes) || []).map((d) => ({
    type: d.type, title: d.type, category: d.category || "Other", description: d.description || "",
    available: d.available !== false,
  }));
  for (const p of presets || []) {
    list.push({ type: `preset:${p.name}`, title: p.name, category: "Presets", description: p.description || "", available: true });
  }
  return list;
}

function matches(entry, words) {
  const hay = `${entry.type} ${entry.title} ${entry.category} ${entry.description}`.toLowerCase();
  return words.every((w) => hay.includes(w));
}

function rank(entry, q) {
  const t = entry.title.toLowerCase();
  if (t === q) return 0;
  if (t.startsWith(q)) return 1;
  if (t.includes(q)) return 2;
  return 3;
}

/**
 * The palette in `root`. onAdd(type) is called on click or Enter; items are also draggable
 * onto an editor (the editor adds the node where it is dropped).
 */
export function createPalette({ root, catalog, presets = [], onAdd }) {
  const all = entries(catalog, presets);
  const search = el("input", { type: "search", id: "palette-search", placeholder: "Search…",
    "aria-label": "Search nodes", autocomplete: "off" });
  const list = el("div", { class: "palette-list", id: "palette-list" });
  const box = el("div", { class: "palette" }, search, list);
  root.append(box);
  const cats = new Map();
  for (const e of all) {
    if (!cats.has(e.category)) cats.set(e.category, []);
    cats.get(e.category).push(e);
  }
  const order = [...cats.keys()].sort((a, b) => (a === "Presets") - (b === "Presets") || a.localeCompare(b));

  const item = (e) => {
    const b = el("button", { type: "button", class: "palette-item" + (e.available ? "" : " unavailable"),
      draggable: "true", "data-type": e.type, title: e.description || e.type }, e.title);
    b.addEventListener("click", () => onAdd(e.type));
    b.addEventListener("dragstart", (ev) => {
      ev.dataTransfer.setData(DRAG_TYPE, e.type);
      ev.dataTransfer.setData("text/plain", e.type);
      ev.dataTransfer.effectAllowed = "copy";
    });
    return b;
  };

  const render = () => {
    const words = search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    list.replaceChildren();
    let shown = 0;
    for (const c of order) {
      const items = cats.get(c).filter((e) => matches(e, words));
      if (!items.length) continue;
      shown += items.length;
      const det = el("details", { class: "palette-cat", "data-category": c },
        el("summary", {}, `${c} `, el("span", { class: "muted small" }, String(items.length))),
        ...items.map(item));
      det.open = words.length > 0 || c === "Control" || c === "Data";
      list.append(det);
    }
    if (!shown) list.append(el("p", { class: "muted small" }, `No node matches "${search.value}".`));
  };
  search.addEventListener("input", render);
  search.addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    const first = list.querySelector(".palette-item");
    if (first) onAdd(first.dataset.type);
  });
  render();
  return { search, element: box, entries: all };
}

/**
 * The quick search at a point of the page: type, arrows, Enter picks, Escape closes.
 * onPick(type) is called with the chosen entry.
 */
export function openQuickSearch({ catalog, presets = [], clientX, clientY, onPick }) {
  document.querySelectorAll(".quick-search").forEach((q) => q.remove());
  const all = entries(catalog, presets);
  const input = el("input", { type: "search", placeholder: "Add a node…", "aria-label": "Quick search: add a node",
    autocomplete: "off" });
  const ul = el("ul", { class: "quick-list", role: "listbox" });
  const box = el("div", { class: "quick-search", role: "dialog", "aria-label": "Add a node" }, input, ul);
  box.style.left = `${Math.min(clientX, window.innerWidth - 300)}px`;
  box.style.top = `${Math.min(clientY, window.innerHeight - 320)}px`;
  let hits = [];
  let at = 0;
  const close = () => {
    box.remove();
    document.removeEventListener("pointerdown", outside, true);
  };
  const pick = (e) => {
    close();
    if (e) onPick(e.type);
  };
  const render = () => {
    const q = input.value.trim().toLowerCase();
    const words = q.split(/\s+/).filter(Boolean);
    hits = all.filter((e) => matches(e, words)).sort((a, b) => rank(a, q) - rank(b, q) || a.title.localeCompare(b.title)).slice(0, 40);
    at = Math.min(at, Math.max(0, hits.length - 1));
    ul.replaceChildren(...hits.map((e, i) => {
      const li = el("li", { role: "option", "data-type": e.type, "aria-selected": String(i === at), class: i === at ? "active" : "" },
        e.title, el("span", { class: "muted small" }, ` ${e.category}`));
      li.addEventListener("pointerdown", (ev) => {
        ev.preventDefault();
        pick(e);
      });
      return li;
    }));
  };
  const outside = (ev) => { if (!box.contains(ev.target)) close(); };
  input.addEventListener("input", () => { at = 0; render(); });
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") close();
    else if (ev.key === "Enter") pick(hits[at]);
    else if (ev.key === "ArrowDown") at = Math.min(hits.length - 1, at + 1);
    else if (ev.key === "ArrowUp") at = Math.max(0, at - 1);
    else return;
    ev.preventDefault();
    ev.stopPropagation();
    if (box.isConnected) render();
  });
  document.body.append(box);
  document.addEventListener("pointerdown", outside, true);
  render();
  input.focus();
  return { close, element: box };
}
