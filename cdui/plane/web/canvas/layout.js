// A small layered layout, left to right: each node goes one layer right of the
// furthest node that feeds it (longest path), nodes in a layer are ordered by
// the mean row of what feeds them (a few barycentre sweeps), then stacked.
// Small enough to read; dagre/elkjs would add 500 kB for the same picture here.

const GAP_X = 80;
const GAP_Y = 40;

/**
 * @param {{id: string, w: number, h: number}[]} nodes
 * @param {{source: string, target: string}[]} edges
 * @returns {Map<string, {x: number, y: number}>} top-left corner of each node
 */
export function layeredLayout(nodes, edges) {
  const ids = new Set(nodes.map((n) => n.id));
  const preds = new Map(nodes.map((n) => [n.id, []]));
  const succs = new Map(nodes.map((n) => [n.id, []]));
  for (const e of edges) {
    if (!ids.has(e.source) || !ids.has(e.target) || e.source === e.target) continue;
    succs.get(e.source).push(e.target);
    preds.get(e.target).push(e.source);
  }
  // Break cycles: a depth-first walk drops the edges that go back to a node on the stack.
  const state = new Map();
  const back = new Set();
  const visit = (start) => {
    const stack = [[start, 0]];
    state.set(start, 1);
    while (stack.length) {
      const top = stack[stack.length - 1];
      const [id, i] = top;
      const next = succs.get(id)[i];
      if (next === undefined) {
        state.set(id, 2);
        stack.pop();
        continue;
      }
      top[1] = i + 1;
      const s = state.get(next);
      if (s === 1) back.add(id + "\u0000" + next);
      else if (!s) {
        state.set(next, 1);
        stack.push([next, 0]);
      }
    }
  };
  for (const n of nodes) if (!state.get(n.id)) visit(n.id);
  const isBack = (a, b) => back.has(a + "\u0000" + b);

  // Longest-path layers in topological order (Kahn over the acyclic edges).
  const indeg = new Map(nodes.map((n) => [n.id, 0]));
  for (const [t, ps] of preds) for (const p of ps) if (!isBack(p, t)) indeg.set(t, indeg.get(t) + 1);
  const queue = nodes.filter((n) => indeg.get(n.id) === 0).map((n) => n.id);
  const layer = new Map(queue.map((id) => [id, 0]));
  for (let qi = 0; qi < queue.length; qi++) {
    const id = queue[qi];
    for (const t of succs.get(id)) {
      if (isBack(id, t)) continue;
      layer.set(t, Math.max(layer.get(t) || 0, layer.get(id) + 1));
      indeg.set(t, indeg.get(t) - 1);
      if (indeg.get(t) === 0) queue.push(t);
    }
  }
  const layers = [];
  for (const n of nodes) {
    const l = layer.get(n.id) || 0;
    (layers[l] = layers[l] || []).push(n.id);
  }
  // Barycentre sweeps: order each layer by the mean index of its neighbours in the previous one.
  const index = new Map();
  const reindex = (l) => layers[l].forEach((id, i) => index.set(id, i));
  layers.forEach((_, l) => reindex(l));
  const sweep = (l, neighbours) => {
    const key = new Map(layers[l].map((id, i) => {
      const ns = neighbours.get(id).filter((o) => layer.get(o) !== l && index.has(o));
      return [id, ns.length ? ns.reduce((s, o) => s + index.get(o), 0) / ns.length : i];
    }));
    layers[l].sort((a, b) => key.get(a) - key.get(b));
    reindex(l);
  };
  for (let round = 0; round < 4; round++) {
    for (let l = 1; l < layers.length; l++) sweep(l, preds);
    for (let l = layers.length - 2; l >= 0; l--) sweep(l, succs);
  }
  const size = new Map(nodes.map((n) => [n.id, n]));
  const out = new Map();
  let x = 0;
  const heights = layers.map((ids) => ids.reduce((s, id) => s + size.get(id).h, 0) + GAP_Y * (ids.length - 1));
  const tallest = Math.max(0, ...heights);
  layers.forEach((ids, l) => {
    let y = (tallest - heights[l]) / 2;
    let width = 0;
    for (const id of ids) {
      out.set(id, { x: Math.round(x), y: Math.round(y) });
      y += size.get(id).h + GAP_Y;
      width = Math.max(width, size.get(id).w);
    }
    x += width + GAP_X;
  });
  return out;
}
