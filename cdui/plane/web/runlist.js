// The runs list's pieces that need no page state: its query, the comparison link, tags typed by a
// person, and text whose long paths are cut short with a copy button.

export const MIN_COMPARE = 2;
export const MAX_COMPARE = 10;

/** GET /api/runs's query: the filters that are set, then ``extra`` ({after, limit}). */
export function runsQuery(filters, extra) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
  for (const [k, v] of Object.entries(extra || {})) if (v != null && v !== "") q.set(k, String(v));
  return q.toString();
}

/** The comparison page for these runs (the page is compare.html; the ``runs`` list is the contract). */
export function compareUrl(ids) {
  return `/web/compare.html?runs=${ids.map(encodeURIComponent).join(",")}`;
}

/** "baseline, lr:0.01  best" -> ["baseline", "lr:0.01", "best"]: split on commas and spaces, repeats once.
 *  The server checks each tag and says which one it refuses. */
export function parseTags(text) {
  return [...new Set(String(text).split(/[\s,]+/).filter(Boolean))];
}

const LONG = 40; // characters: a word longer than this is cut short in the list

/** Text as nodes where each long word (a path, a URL, a hash) is cut to its end ("…/models/iris/model.pt"),
 *  whole in its title, with a button that copies it: the line breaks only between words. */
export function fitText(text, h, copy) {
  const out = [];
  for (const part of String(text || "").split(/(\s+)/)) {
    const m = /^(.*?)([)\]'",.;:]*)$/.exec(part);
    const word = m[1], tail = m[2];
    if (word.length <= LONG) { out.push(part); continue; }
    const cut = word.lastIndexOf("/", word.length - 12);
    const end = cut > 0 && word.length - cut <= LONG ? word.slice(cut) : word.slice(-(LONG - 8));
    out.push(h("span", { class: "cut", title: word }, `…${end}`),
      h("button", { type: "button", class: "copy", title: `Copy ${word}`, "aria-label": `Copy ${word}`,
        onclick: (e) => { e.stopPropagation(); copy(word); } }, "⧉"), tail);
  }
  return out;
}
