// A preset node's inside, for the sub-canvas (layers.js opens it as it opens a SequentialModel's
// layers). A node of type "preset:NAME" runs the preset's own nodes (cdui/graph/model.py expands
// it, as CodefyUI does): their params are the preset's, then the node's
// data.internalParams[<inner id>] (any param), and its own data.params are not used. The preset's
// nodes and wires are not the graph's to change: they come from the installed preset (or, for a
// name the server lacks, the graph's embedded `presets` list). So on the sub-canvas the structure
// is read-only and the params are editable, written back as the node's internalParams; a preset
// inside a preset is read-only throughout (the outer graph's internalParams reach only the params of
// the first level's nodes).
const clone = (v) => (v === undefined ? undefined : JSON.parse(JSON.stringify(v)));
const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
export const PRESET_PREFIX = "preset:";

/** A value with object keys sorted (so two param sets compare whatever order their keys are in). */
function canonical(v) {
  if (Array.isArray(v)) return v.map(canonical);
  if (!isObj(v)) return v;
  return Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical(v[k])]));
}
export const same = (a, b) => JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));

/** The definition of preset `name`: {def, from: "installed"|"graph"} or {problem}. The installed
 *  presets (GET /api/presets with their `definition`) first, then the tab graph's own `presets`. */
export function findPreset(name, installed, graphPresets) {
  const lib = (installed || []).find((p) => p && p.name === name);
  if (lib && isObj(lib.definition)) return { def: lib.definition, from: "installed" };
  const own = (Array.isArray(graphPresets) ? graphPresets : [])
    .find((p) => isObj(p) && (p.preset_name || p.name) === name && Array.isArray(p.nodes));
  if (own) return { def: own, from: "graph" };
  return { problem: `preset ${JSON.stringify(name)} is not installed on this server and the graph does not `
    + "embed it, so its inside cannot be shown: install it in data/presets/ or import a graph that embeds it" };
}

const innerNodes = (def) => (Array.isArray(def.nodes) ? def.nodes : [])
  .filter((n) => isObj(n) && (typeof n.id === "string" || typeof n.id === "number") && typeof n.type === "string");

/** An inner node's params as the preset file gives them. */
function baseParams(n) {
  if (isObj(n.params)) return n.params;
  return isObj(n.data) && isObj(n.data.params) ? n.data.params : {};
}

/** The params an inner node runs with: the preset's, then the node's override. */
export function effectiveParams(n, internal) {
  const over = isObj(internal) && isObj(internal[String(n.id)]) ? internal[String(n.id)] : {};
  return { ...clone(baseParams(n)), ...clone(over) };
}

/** The preset's inside as the editor's graph JSON: each inner node with the params it runs with
 *  (an inner preset keeps its own internalParams, for opening it in turn). */
export function presetGraph(def, internal) {
  const nodes = innerNodes(def).map((n) => {
    const out = { id: String(n.id), type: n.type };
    const p = isObj(n.position) ? n.position : isObj(n.data) && isObj(n.data.position) ? n.data.position : null;
    if (p && Number.isFinite(p.x) && Number.isFinite(p.y)) out.position = { x: p.x, y: p.y };
    out.data = { params: effectiveParams(n, internal) };
    if (n.type.startsWith(PRESET_PREFIX) && isObj(n.data) && isObj(n.data.internalParams)) {
      out.data.internalParams = clone(n.data.internalParams);
    }
    return out;
  });
  const edges = (Array.isArray(def.edges) ? def.edges : []).filter((e) => isObj(e)).map((e, i) => {
    const trigger = e.type === "trigger" || (e.sourceHandle === "trigger" && e.type !== "data");
    return { id: e.id == null ? `__edge${i}` : String(e.id), source: String(e.source), target: String(e.target),
      sourceHandle: trigger ? "trigger" : e.sourceHandle ?? null, targetHandle: trigger ? null : e.targetHandle ?? null,
      type: trigger ? "trigger" : "data" };
  });
  return { nodes, edges };
}

/** What of the sub-canvas's graph may not change: the nodes (ids, types, an inner preset's
 *  internalParams) and the wires; with `params`, every param too (a read-only level). */
export function structureKey(graph, params) {
  return JSON.stringify(canonical({
    nodes: (graph.nodes || []).map((n) => [String(n.id), n.type, n.data?.internalParams ?? null,
      params ? n.data?.params ?? null : null]),
    edges: (graph.edges || []).map((e) => [String(e.source), e.sourceHandle ?? null, String(e.target),
      e.targetHandle ?? null, e.type ?? null]),
  }));
}

/** The node's internalParams once the sub-canvas's params are written back: the old overrides,
 *  plus every param whose value now differs from what the node ran with. null when nothing changed
 *  (nothing is written then, so a graph opened and closed stays exactly as it was). */
export function internalParamsAfter(def, internal, graph) {
  const old = isObj(internal) ? internal : {};
  const now = new Map((graph.nodes || []).map((n) => [String(n.id), isObj(n.data?.params) ? n.data.params : {}]));
  const next = clone(old);
  let changed = false;
  for (const n of innerNodes(def)) {
    const id = String(n.id);
    if (!now.has(id)) continue;
    const had = effectiveParams(n, old);
    const got = now.get(id);
    if (same(had, got)) continue;
    const base = baseParams(n);
    const over = isObj(old[id]) ? clone(old[id]) : {};
    for (const [k, v] of Object.entries(got)) if (!same(had[k], v)) over[k] = clone(v);
    // A param taken away: only an override can go (the preset's own value stays).
    for (const k of Object.keys(over)) if (!(k in got) && !(k in base)) delete over[k];
    next[id] = over;
    changed = true;
  }
  return changed ? next : null;
}

/** The preset's exposed ports, for the sub-canvas's bar: "name → inner.port" / "inner.port → name". */
export function exposedPorts(def) {
  const one = (p, dir) => (isObj(p) ? (dir === "in" ? `${p.name} → ${p.internal_node}.${p.internal_port}`
    : `${p.internal_node}.${p.internal_port} → ${p.name}`) : "");
  return {
    inputs: (Array.isArray(def.exposed_inputs) ? def.exposed_inputs : []).map((p) => one(p, "in")).filter(Boolean),
    outputs: (Array.isArray(def.exposed_outputs) ? def.exposed_outputs : []).map((p) => one(p, "out")).filter(Boolean),
  };
}
