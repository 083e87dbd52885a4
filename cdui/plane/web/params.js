// A node's declared params (GET /api/nodes) read the same way wherever a page edits them: the canvas's
// config panel (canvas/panel.js), the runs page's clone form (clone.js) and its New sweep form (sweepform.js).
import { api } from "./api.js";

const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);

/** The value a node runs with for one declared param: its own, or the declaration's default. */
export function valueOf(decl, params) {
  return params && Object.prototype.hasOwnProperty.call(params, decl.name) ? params[decl.name] : decl.default;
}

/** Whether a declaration's visible_when ({param: value or [values]}) holds for these params. */
export function isVisible(decl, params, decls) {
  const cond = decl.visible_when;
  if (!isObj(cond)) return true;
  for (const [name, want] of Object.entries(cond)) {
    const other = decls.find((d) => d.name === name);
    const have = other ? valueOf(other, params) : params?.[name];
    const wanted = Array.isArray(want) ? want : [want];
    if (!wanted.some((w) => w === have || String(w) === String(have))) return false;
  }
  return true;
}


let catalog = null; // {type: [param declarations]}, fetched once a page (again when a type is new to it)

/** Every node type's param declarations, {type: [declaration]}; fetched again when ``types`` names one it lacks. */
export async function declarations(types = []) {
  if (!catalog || types.some((t) => !(t in catalog))) {
    const body = await api("GET", "/api/nodes");
    catalog = {};
    for (const n of body.nodes || []) if (n && n.type) catalog[n.type] = n.params || [];
  }
  return catalog;
}

/** A graph node's params as CodefyUI keeps them (under data.params; a bare params object is read too). */
export function nodeParams(node) {
  const data = node.data && typeof node.data === "object" ? node.data : null;
  if (data && data.params && typeof data.params === "object") return data.params;
  return node.params && typeof node.params === "object" ? node.params : {};
}
