// Images where people look: a run's image artifacts (PNG, JPEG, GIF, WebP, BMP files: what the
// plot nodes and ImageWriter write) and recorded image outputs, drawn as <img> with a click to
// enlarge. An artifact's picture is fetched only through the artifact download route, which serves
// nothing but files the control plane stored itself (inside its own data folders, bytes checked);
// a path a worker names is never opened, so an artifact left on a worker or in a bucket shows no
// picture here.
import { h } from "./dom.js";

const IMAGE_EXT = /\.(png|jpe?g|gif|webp|bmp)$/i;
export const MAX_IMAGE_BYTES = 32 * 1024 * 1024; // larger pictures keep only their download link

/** Whether the page can show this artifact as a picture. */
export function isImageArtifact(a) {
  return !!a && IMAGE_EXT.test(a.name || a.path || "") && !!a.path && a.backend !== "s3" &&
    a.backend !== "left_on_worker" && !(a.size > MAX_IMAGE_BYTES);
}

export function artifactUrl(runId, a) {
  return `/api/runs/${encodeURIComponent(runId)}/artifacts/${encodeURIComponent(a.id)}/download`;
}

/** A base64 text that holds a PNG or JPEG (the plot nodes' `image` output), by its first bytes. */
export function base64Image(text) {
  if (typeof text !== "string") return null;
  if (text.startsWith("iVBORw0KGgo")) return "PNG";
  if (text.startsWith("/9j/")) return "JPEG";
  return null;
}

let dialog = null;

/** Show a picture large, over the page (Escape, the × or a click outside closes it). */
export function enlarge(src, alt, pixelated = false) {
  if (!dialog) {
    dialog = h("dialog", { id: "image-dialog", class: "image-dialog", "aria-label": "Enlarged image" },
      h("div", { class: "card-head" }, h("h2", { id: "image-dialog-title" }),
        h("button", { type: "button", class: "plain", "aria-label": "Close the image", onclick: () => dialog.close() }, "×")),
      h("img", { id: "image-dialog-img", alt: "" }));
    dialog.addEventListener("click", (e) => { if (e.target === dialog) dialog.close(); });
    document.body.append(dialog);
  }
  dialog.classList.toggle("pixelated", pixelated);
  dialog.querySelector("#image-dialog-title").textContent = alt;
  const img = dialog.querySelector("#image-dialog-img");
  img.src = src;
  img.alt = alt;
  if (!dialog.open) dialog.showModal();
}

/** A picture as a button: click (or Enter) enlarges it. `pixelated` for a tiny thumbnail. */
export function imageButton(src, alt, { cls = "image-thumb", pixelated = false } = {}) {
  return h("button", { type: "button", class: `image-button ${pixelated ? "pixelated" : ""}`, title: `${alt} (click to enlarge)`,
    "aria-label": `Enlarge ${alt}`, onclick: () => enlarge(src, alt, pixelated) },
  h("img", { class: cls, src, alt, loading: "lazy" }));
}
