// A run's event as one line of text: the runs page's live log (app.js) and the canvas's execution log
// (canvas/results.js) say the same thing for the same event.
import { num } from "./dom.js";

/** "epoch 3/10", "step 5/50", "loss 0.41", then the other values of a progress event (``all``: objects too). */
export function progressParts(d, all) {
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

/** The text of a log line for one event ({kind, data}). */
export function describe(ev) {
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
