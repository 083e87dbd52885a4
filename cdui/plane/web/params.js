// A node's declared params (GET /api/nodes) read the same way wherever a page edits them: the canvas's
// config panel (canvas/panel.js) and the runs page's clone form (clone.js).

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

