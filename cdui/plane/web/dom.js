// Small DOM and formatting helpers. Text always goes in as text nodes, never as HTML.

/** h("tag", {class, onclick, "aria-label", ...}, ...children) */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export const $ = (id) => document.getElementById(id);

export function fill(el, ...children) {
  el.replaceChildren();
  for (const c of children.flat(Infinity)) if (c != null && c !== false) el.append(c instanceof Node ? c : String(c));
}

export const TERMINAL = new Set(["succeeded", "failed", "cancelled", "interrupted"]);

export function badge(status, kind = "status") {
  const s = String(status || "unknown");
  return h("span", { class: `badge ${kind}-${s.replace(/[^a-z_-]/gi, "")}` }, s);
}

/** A local time; the date too unless it is today. */
export function time(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (isNaN(d)) return String(iso);
  const t = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return d.toDateString() === new Date().toDateString() ? t : `${d.toLocaleDateString()} ${t}`;
}

export function size(n) {
  if (n == null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = Number(n), i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return i ? `${v.toFixed(1)} ${units[i]}` : `${v} B`;
}

export function target(t) {
  if (t == null) return "";
  if (typeof t === "string") return t;
  if (t.worker) return t.worker;
  if (t.pool) return `pool: ${t.pool}`;
  return JSON.stringify(t);
}

export function num(v) {
  return typeof v === "number" && !Number.isInteger(v) ? v.toPrecision(5).replace(/\.?0+$/, "") : String(v);
}
