// The one-shot part of a worker's card: the run its last one-shot agent took, and the
// instances sharing its credential (one card per live instance, one line per departed one).
import { h, time } from "./dom.js";

export function oneShotBlock(w, { openRun, removeInstance }) {
  const runLink = (id) => h("button", { type: "button", class: "link mono", onclick: () => openRun(id) }, id);
  const out = [];
  if (w.one_shot) {
    out.push(h("p", { class: "small" }, h("span", { class: "badge" }, "One-shot"), " ",
      w.one_shot_run ? ["took run ", runLink(w.one_shot_run)] : "its last agent exited without taking a run"));
  }
  const inst = w.instances;
  if (!inst || (!inst.live.length && !inst.departed.length)) return out;
  out.push(h("div", { class: "instances", role: "group", "aria-label": `Instances of ${w.name}` },
    h("p", { class: "small" }, `Instances: ${inst.connected} connected, ${inst.running} running`),
    h("ul", { class: "instance-cards" }, inst.live.map((c) => h("li", { class: "worker", dataset: { worker: c.name } },
      h("strong", {}, c.name), " ", h("span", { class: "badge" }, "online"), " ",
      (c.runs || []).map(runLink)))),
    h("ul", { class: "departed small muted" }, inst.departed.map((d) => h("li", {},
      `${d.name} left ${time(d.left_at)}: `, d.run ? ["took run ", runLink(d.run)] : d.note, " ",
      h("button", { type: "button", "aria-label": `Remove instance ${d.name}`, onclick: () => removeInstance(d.name) },
        "Remove"))))));
  return out;
}
