// The Workers panel (cards, actions, rejected connections, issued tokens) and the Add worker dialog.
import { api, ApiError } from "./api.js";
import { $, badge, fill, h, time } from "./dom.js";
import { oneShotBlock } from "./oneshot.js";

let ctx = { act: async (fn) => fn(), select: () => {}, onWorkers: () => {} };
// The action waiting for its second click: { name, action } (kept across refreshes).
let pending = null;
let serverAddresses = null;
let missing = false;

export function init(context) {
  ctx = { ...ctx, ...context };
  $("btn-workers").addEventListener("click", () => togglePanel());
  $("btn-settings-workers").addEventListener("click", () => { $("settings").open = false; togglePanel(true); });
  $("btn-workers-close").addEventListener("click", () => togglePanel(false));
  $("btn-add-worker").addEventListener("click", openDialog);
  $("add-worker-close").addEventListener("click", () => $("add-worker").close());
  $("tab-machine").addEventListener("click", () => showTab("machine"));
  $("tab-ssh").addEventListener("click", () => showTab("ssh"));
  for (const id of ["tab-machine", "tab-ssh"]) {
    $(id).addEventListener("keydown", (e) => {
      if (e.key !== "ArrowRight" && e.key !== "ArrowLeft") return;
      const next = id === "tab-machine" ? "ssh" : "machine";
      showTab(next);
      $(`tab-${next}`).focus();
    });
  }
  $("enroll-address").addEventListener("input", addressChanged);
  $("address-choice").addEventListener("change", () => {
    const v = $("address-choice").value;
    if (v) { $("enroll-address").value = v; addressChanged(); }
  });
  $("token-form-machine").addEventListener("submit", generateToken);
  $("ssh-form").addEventListener("submit", addSsh);
}

export function panelOpen() { return !$("workers").hidden; }

function togglePanel(open) {
  const show = open ?? $("workers").hidden;
  $("workers").hidden = !show;
  $("btn-workers").setAttribute("aria-expanded", String(show));
  if (show) {
    refresh();
    $("workers-title").scrollIntoView({ block: "nearest" });
  }
}

// -- data ---------------------------------------------------------------------------
export async function refresh() {
  let data;
  try {
    data = await api("GET", "/api/workers");
    missing = false;
  } catch (err) {
    // A server without the remote-workers routes: say "no workers" quietly.
    missing = err instanceof ApiError && err.status === 404;
    if (!missing) throw err;
    data = { workers: [], rejected: [] };
  }
  const workers = (data && data.workers) || [];
  const rejected = (data && data.rejected) || [];
  ctx.onWorkers(workers);
  if (!panelOpen()) return;
  renderCards(workers);
  $("rejected").hidden = rejected.length === 0;
  fill($("rejected-list"), rejected.map((r) => h("li", { class: "rejected" },
    h("strong", {}, r.name || "(no name)"), `: ${r.reason || ""}`,
    h("div", { class: "small muted" }, [r.address, time(r.at)].filter(Boolean).join(" · ")))));
  if (!missing && $("add-worker").open) await refreshTokens();
}

export const isMissing = () => missing;

async function refreshTokens() {
  const tokens = await api("GET", "/api/workers/tokens");
  const list = Array.isArray(tokens) ? tokens : [];
  $("tokens").hidden = list.length === 0;
  keyed($("tokens-list"), list, (t) => t.id, (t) => h("li", { class: "token", dataset: { tokenId: t.id } },
    h("code", { class: "mono" }, t.id), " ",
    t.worker ? `for ${t.worker} · ` : "",
    `${t.uses_left ?? "?"}/${t.uses_total ?? "?"} uses left · expires ${time(t.expires_at)}`,
    t.expired ? h("span", { class: "badge mark-warn" }, "expired") : null,
    t.used_up ? h("span", { class: "badge mark-muted" }, "used up") : null, " ",
    h("button", { type: "button", class: "danger small-btn", "aria-label": `Delete token ${t.id}`,
      onclick: () => ctx.act(async () => { await api("DELETE", `/api/workers/tokens/${encodeURIComponent(t.id)}`); await refreshTokens(); }),
    }, "Delete")));
}

/** Update a list in place by key: unchanged items keep their elements (and focus). */
function keyed(parent, items, keyOf, build) {
  const old = new Map([...parent.children].map((el) => [el.dataset.key, el]));
  let prev = null;
  for (const item of items) {
    const key = keyOf(item);
    const sig = JSON.stringify(item);
    let el = old.get(key);
    if (el && el.dataset.sig !== sig) {
      const fresh = build(item);
      swapKeepingFocus(el, fresh);
      el = fresh;
    } else if (!el) el = build(item);
    el.dataset.key = key;
    el.dataset.sig = sig;
    old.delete(key);
    const want = prev ? prev.nextSibling : parent.firstChild;
    if (want !== el) parent.insertBefore(el, want);
    prev = el;
  }
  for (const el of old.values()) el.remove();
}

function swapKeepingFocus(oldEl, fresh) {
  const active = document.activeElement;
  const label = active && oldEl.contains(active) ? active.getAttribute("aria-label") || active.id : null;
  oldEl.replaceWith(fresh);
  if (label) {
    const again = [...fresh.querySelectorAll("button, a, input, select")].find(
      (e) => (e.getAttribute("aria-label") || e.id) === label);
    if (again) again.focus();
  }
}

// -- cards --------------------------------------------------------------------------
function renderCards(workers) {
  $("workers-empty").hidden = workers.length > 0;
  const list = $("workers-list");
  keyed(list, workers.map((w) => ({ ...w, _pending: pending && pending.name === w.name ? pending.action : null })),
    (w) => w.name, workerCard);
}

function fact(label, value, cls) {
  if (value == null || value === "" || (Array.isArray(value) && !value.length)) return [];
  return [h("dt", {}, label), h("dd", { class: cls || "" }, value)];
}

function labelsText(l) {
  if (!l) return "";
  if (Array.isArray(l)) return l.join(", ");
  if (typeof l === "object") return Object.entries(l).map(([k, v]) => (v ? `${k}=${v}` : k)).join(", ");
  return String(l);
}

function short(v) {
  if (v == null) return "";
  if (typeof v === "object") {
    const s = JSON.stringify(v);
    return s.length > 300 ? `${s.slice(0, 300)}…` : s;
  }
  return String(v);
}

// What each action's second click will do, said before it is done.
const CONFIRM = {
  remove: (w) => `Remove ${w.name}: its credential is revoked, the agent is told and exits, its running runs end ` +
    "interrupted and its queued runs fail. Click \"Confirm remove\" to do it.",
  delete: (w) => `Delete ${w.name}: it never connected; its entry and credential are deleted. Click "Confirm delete" to do it.`,
  disable: (w) => `Disable ${w.name}: it takes no new runs and its ${(w.runs || []).length} running run(s) are ` +
    "stopped (SSH workers: the agent is stopped). Click \"Confirm disable\" to do it.",
};

function badges(w) {
  const out = [badge(w.status, "worker")];
  const mark = (text, cls = "mark-warn") => h("span", { class: `badge ${cls}` }, text);
  if (w.degraded) out.push(mark("Degraded"));
  if (w.drained && w.status !== "draining") out.push(mark("draining", "mark-muted"));
  if (w.disabled && w.status !== "disabled") out.push(mark("Disabled", "mark-muted"));
  if (w.unencrypted) out.push(mark("Unencrypted HTTP"));
  if (w.ssh) out.push(mark("SSH", "mark-info"));
  return out;
}

function tunnelRow(ssh, w) {
  const t = ssh.tunnel || {};
  const state = { connecting: "Connecting", connected: "Connected", failed: "Failed", stopped: "Stopped" }[t.state] || t.state || "";
  const retry = t.state === "failed" ? h("button", { type: "button", "aria-label": `Retry worker ${w.name}`,
    onclick: () => ctx.act(() => api("POST", `/api/workers/${encodeURIComponent(w.name)}/retry`).then(refresh)) }, "Retry") : null;
  return h("div", { class: `tunnel tunnel-${String(t.state || "").replace(/[^a-z]/g, "")}` },
    h("strong", {}, "SSH tunnel: "), state,
    t.remote_pid ? ` · remote PID ${t.remote_pid}` : "",
    t.reason ? h("span", { class: "error-text" }, ` · ${t.reason}`) : null,
    t.retrying && t.next_attempt_s != null ? ` · retrying in ${Math.round(t.next_attempt_s)} s` : "",
    " ", retry,
    ssh.target ? h("div", { class: "small muted" }, `${ssh.target}${ssh.port && ssh.port !== 22 ? `:${ssh.port}` : ""}`) : null,
    (t.recent_output || []).length ? h("details", {}, h("summary", {}, "Recent ssh output"),
      h("pre", { class: "mono small" }, t.recent_output.join("\n"))) : null);
}

function catalogFacts(w) {
  const c = w.catalog || w.node_catalog || {};
  const missingTypes = c.lacking || [];
  const extraTypes = c.extra || [];
  return [
    fact("Missing node types", Array.isArray(missingTypes) ? missingTypes.join(", ") : short(missingTypes), "warn-text"),
    fact("Extra node types", Array.isArray(extraTypes) ? extraTypes.join(", ") : short(extraTypes)),
    fact("Catalog", c.warning ? short(c.warning) : "", "warn-text"),
    // Plugin packs (docs/plugins.md): what the agent reported, and the control plane's packs it lacks.
    fact("Plugin packs", Object.entries(w.packs || {}).map(([id, p]) =>
      `${id} ${p.version || "?"} (${String(p.sha256 || "").slice(0, 12)})`).join(", ")),
    fact("Lacks packs", (w.packs_lacking || []).map((p) =>
      `${p.id} ${p.version || ""} (${p.have ? "has another build" : "missing"}: run \`${p.install}\` there)`).join("; "),
    "warn-text"),
  ];
}

function fingerprintText(w) {
  const f = w.fingerprint;
  if (f === undefined) return null;
  if (f === null) return "not reported";
  if (typeof f === "object") {
    if (f.summary) return String(f.summary);
    return Object.entries(f).slice(0, 8).map(([k, v]) => `${k} ${short(v)}`).join(", ");
  }
  return String(f);
}

function button(w, text, action, subject) {
  const target = subject || w.name;
  return h("button", { type: "button", class: ["remove", "delete", "remove-instance"].includes(action) ? "danger" : "",
    "aria-label": `${text} worker ${target}`, onclick: () => ctx.act(() => doAction(w, action, target)) }, text);
}

async function doAction(w, action, subject) {
  const name = encodeURIComponent(subject);
  const needsConfirm = action === "remove" || action === "delete" || (action === "disable" && (w.runs || []).length > 0);
  if (needsConfirm && !(pending && pending.name === w.name && pending.action === action)) {
    pending = { name: w.name, action };
    await refresh();
    const again = document.querySelector(`#workers-list li[data-worker="${CSS.escape(w.name)}"] .confirm button.danger`);
    if (again) again.focus();
    return;
  }
  pending = null;
  try {
    if (action === "drain" || action === "undrain" || action === "disable" || action === "enable") {
      await api("POST", `/api/workers/${name}/${action}`);
    } else if (action === "reissue") {
      const chosen = chosenAddress();
      const t = await api("POST", `/api/workers/${name}/reissue`, { control: asked(chosen) });
      openDialog();
      showToken(forAddress(t, chosen));
    } else if (action === "remove" || action === "delete" || action === "remove-instance") {
      await api("DELETE", `/api/workers/${name}`);
    }
  } finally {
    await refresh();
  }
}

// A device's slots, or under "Share by memory" its memory in use of its total (MiB).
function deviceText(d) {
  if (typeof d === "string") return d;
  const mem = d.memory ? ` ${d.memory.free_mb} of ${d.memory.total_mb} MiB free` : "";
  if (d.shared_by_memory) return `${d.device} (shared by memory: ${d.memory_in_use_mb ?? 0} MiB in use;${mem || " no memory reported"})`;
  return `${d.device} (${d.in_use ?? 0}/${d.slots ?? "?"} in use)`;
}

// Each CUDA card's use as its agent last reported it (w.gpu, at most every 15 s): a utilisation bar and a
// memory bar per card. None at all for a worker without CUDA cards (nothing is drawn, nothing invented).
export function gpuBars(w) {
  const cards = Array.isArray(w && w.gpu) ? w.gpu.filter((c) => c && typeof c.device === "string") : [];
  if (!cards.length) return null;
  const gib = (mb) => (mb / 1024).toFixed(1);
  return h("div", { class: "gpu-bars", "aria-label": `GPU use on worker ${w.name}` },
    cards.map((c) => {
      const util = Number.isInteger(c.util) ? c.util : null;
      const mem = Number.isInteger(c.used_mb) && Number.isInteger(c.total_mb) && c.total_mb > 0;
      return h("div", { class: "gpu-card", dataset: { device: c.device } },
        h("span", { class: "gpu-device mono" }, c.device),
        util == null ? h("span", { class: "gpu-none" }, "utilisation not reported")
          : [h("meter", { class: "gpu-util", min: 0, max: 100, value: util, "aria-label": `${c.device} utilisation` }),
            h("span", { class: "gpu-figure" }, `${util}%`)],
        !mem ? h("span", { class: "gpu-none" }, "memory not reported")
          : [h("meter", { class: "gpu-mem", min: 0, max: c.total_mb, value: c.used_mb, high: 0.9 * c.total_mb,
              "aria-label": `${c.device} memory in use` }),
            h("span", { class: "gpu-figure" }, `${gib(c.used_mb)} of ${gib(c.total_mb)} GiB`)]);
    }));
}

// The worker's "Share by memory" setting, for every device of it at once.
function shareToggle(w, shared) {
  return h("label", { class: "share-by-memory" },
    h("input", { type: "checkbox", checked: shared, "aria-label": `Share by memory on worker ${w.name}`,
      onchange: (e) => ctx.act(async () => {
        try {
          await api("POST", `/api/workers/${encodeURIComponent(w.name)}/share-by-memory`, { enabled: e.target.checked });
        } finally {
          await refresh();
        }
      }) }),
    " Share by memory");
}

// "Follow updates": the owner lets this worker's agent install the control plane's `cdui update` bundle when it
// is refused for its version (an agent set to CODEFYUI_AGENT_AUTO_UPDATE=0 never does; docs/updating.md).
// An SSH worker's agent always follows: the control plane starts it so.
function followToggle(w) {
  return h("label", { class: "follow-updates" },
    h("input", { type: "checkbox", checked: !!w.follow_updates, "aria-label": `Follow updates on worker ${w.name}`,
      onchange: (e) => ctx.act(async () => {
        try {
          await api("POST", `/api/workers/${encodeURIComponent(w.name)}/follow-updates`, { enabled: e.target.checked });
        } finally {
          await refresh();
        }
      }) }),
    " Follow updates");
}

// A worker's update state (docs/updating.md), shown only while it is not on the control plane's version.
export function updateText(u) {
  if (!u || u.state === "current") return "";
  if (u.state === "updating") return `updating to ${u.to} (since ${time(u.since)})`;
  return `behind: the control plane runs ${u.to}; refused until this worker runs it`;
}

function workerCard(w) {
  const runs = w.runs || [];
  const devices = (w.devices || []).map(deviceText).join(", ");
  const shared = (w.share_by_memory || []).length > 0;
  const neverConnected = w.ssh && !w.version && !w.last_seen;
  const removeAction = neverConnected ? ["Delete", "delete"] : ["Remove", "remove"];
  const confirmAction = w._pending;
  const fp = fingerprintText(w);
  return h("li", { class: `worker card-item status-${String(w.status || "").replace(/[^a-z_-]/gi, "")}`, dataset: { worker: w.name } },
    h("div", { class: "worker-head" }, h("strong", { class: "worker-name" }, w.name), badges(w)),
    h("dl", { class: "facts compact" },
      fact("Version", w.version), fact("Update", updateText(w.update)), fact("Devices", devices),
      fact("Address", w.address),
      fact("Mounts", labelsText(w.mounts || w.labels)), fact("Last seen", time(w.last_seen)),
      fact("Environment", fp), catalogFacts(w),
      // Published apps' warm processes here: each holds a slot of its device (counted in Devices' "in use").
      fact("Serving", (w.serving || []).map((p) => `${p.slug} v${p.version} on ${p.device} (${p.state}, pid ${p.pid})`)
        .join(", ")),
      fact("Runs", runs.length ? runs.map((id) => h("button", {
        type: "button", class: "link mono", "aria-label": `Show run ${id}`, onclick: () => ctx.select(id) }, id)) : "")),
    gpuBars(w),
    w.ssh ? tunnelRow(w.ssh, w) : null,
    // The one-shot run and the instances under this credential (oneshot.js, from #13).
    oneShotBlock(w, { openRun: ctx.select, removeInstance: (n) => ctx.act(async () => {
      await api("DELETE", `/api/workers/${encodeURIComponent(n)}`);
      await refresh();
    }) }),
    h("div", { class: "actions" },
      !w.disabled && w.status !== "draining" && !w.drained ? button(w, "Drain", "drain") : null,
      !w.disabled && (w.status === "draining" || w.drained) ? button(w, "Undrain", "undrain") : null,
      w.ssh || w.disabled ? (w.disabled ? button(w, "Enable", "enable") : button(w, "Disable", "disable")) : null,
      !w.ssh ? button(w, "Reissue", "reissue") : null,
      shareToggle(w, shared),
      !w.ssh ? followToggle(w) : null,
      button(w, ...removeAction)),
    confirmAction ? h("div", { class: "confirm", role: "alert" },
      h("p", {}, CONFIRM[confirmAction](w)),
      h("button", { type: "button", class: "danger", "aria-label": `Confirm ${confirmAction} worker ${w.name}`,
        onclick: () => ctx.act(() => doAction(w, confirmAction, w.name)) }, `Confirm ${confirmAction}`), " ",
      h("button", { type: "button", onclick: () => { pending = null; refresh(); } }, "Cancel")) : null);
}

// -- Add worker dialog ------------------------------------------------------------------
function showTab(which) {
  for (const t of ["machine", "ssh"]) {
    const on = t === which;
    $(`tab-${t}`).setAttribute("aria-selected", String(on));
    $(`tab-${t}`).tabIndex = on ? 0 : -1;
    $(`pane-${t}`).hidden = !on;
  }
}

const LOOPBACK = /^(127\.|localhost$|\[::1\]$|::1$)/i;

function isLoopbackUrl(u) {
  try { return LOOPBACK.test(new URL(u).hostname); } catch { return false; }
}

async function openDialog() {
  const d = $("add-worker");
  if (!d.open) d.showModal();
  if (!$("enroll-address").value) $("enroll-address").value = location.origin;
  if (serverAddresses === null) {
    try {
      serverAddresses = await api("GET", "/api/server/addresses");
    } catch {
      serverAddresses = { addresses: [] };
    }
  }
  const port = location.port ? `:${location.port}` : "";
  const options = (serverAddresses.addresses || []).map((a) => `${location.protocol}//${a.includes(":") ? `[${a}]` : a}${port}`);
  fill($("address-choice"), h("option", { value: "" }, options.length ? "Choose an address…" : "(no other address found)"),
    options.map((o) => h("option", { value: o }, o)));
  addressChanged();
  await ctx.act(refreshTokens);
}

/** The origin the dialog's address field names (the page's own when it is empty). */
function chosenAddress() {
  const raw = $("enroll-address").value.trim();
  if (!raw) return location.origin;
  const u = new URL(raw.includes("://") ? raw : `http://${raw}`);
  if (u.protocol !== "http:" && u.protocol !== "https:") throw new Error(`${raw} is not an http:// or https:// address`);
  return u.origin;
}

// The server names in its commands only the host this page reached it by (a check against
// forged origins), with the scheme the page asks for; so the page asks with its own host and the
// chosen scheme (that decides the https fingerprint lines), then puts the chosen address in.
const asked = (chosen) => `${new URL(chosen).protocol}//${location.host}`;

function forAddress(t, chosen) {
  const own = asked(chosen);
  if (chosen === own || !t.command) return t;
  return { ...t, command: t.command.replace(`--control ${own} `, `--control ${chosen} `) };
}

function addressChanged() {
  $("address-warning").hidden = !isLoopbackUrl($("enroll-address").value);
}

async function generateToken(e) {
  e.preventDefault();
  const btn = $("btn-generate");
  btn.disabled = true;
  try {
    const hours = Number($("enroll-ttl").value);
    const chosen = chosenAddress();
    const t = await api("POST", "/api/workers/tokens", {
      ttl_s: Math.round(hours * 3600), uses: Number($("enroll-uses").value), control: asked(chosen),
    });
    showToken(forAddress(t, chosen));
    await refreshTokens();
  } catch (err) {
    fill($("enroll"), h("p", { class: "error-text", role: "alert" }, err.message),
      err.hint ? h("p", { class: "hint" }, err.hint) : null);
    $("enroll").hidden = false;
  } finally {
    btn.disabled = false;
  }
}

function copyButton(text, what) {
  return h("button", { type: "button", "aria-label": `Copy ${what}`,
    onclick: () => navigator.clipboard && navigator.clipboard.writeText(text).catch(() => {}) }, "Copy");
}

function showToken(t) {
  showTab("machine");
  fill($("enroll"),
    h("p", {}, `Enrollment token, shown only this once${t.worker ? ` (enrolls only ${t.worker})` : ""}:`),
    h("div", { class: "copy-row" }, h("code", { class: "mono", id: "enroll-token" }, t.token), copyButton(t.token, "token")),
    t.command ? [h("p", {}, "Run on the worker machine:"),
      h("div", { class: "copy-row" }, h("code", { class: "mono", id: "enroll-command" }, t.command), copyButton(t.command, "command"))] : null,
    t.ca_fingerprint ? h("p", { class: "small" }, "Proxy key fingerprint (pinned by --ca-fingerprint): ",
      h("code", { class: "mono", id: "enroll-fingerprint" }, t.ca_fingerprint)) : null,
    t.fingerprint_command ? [h("p", { class: "small muted" }, "To confirm the fingerprint, run on the proxy host:"),
      h("div", { class: "copy-row" }, h("code", { class: "mono", id: "enroll-fingerprint-command" }, t.fingerprint_command),
        copyButton(t.fingerprint_command, "openssl command"))] : null,
    t.note && isLoopbackUrl($("enroll-address").value) ? h("p", { class: "warn-text small" }, t.note) : null,
    t.expires_at ? h("p", { class: "small muted" }, `Expires ${time(t.expires_at)}; uses ${t.uses ?? ""}`) : null);
  $("enroll").hidden = false;
}

async function addSsh(e) {
  e.preventDefault();
  const btn = $("btn-ssh-add");
  btn.disabled = true;
  const body = { target: $("ssh-target").value.trim(), port: Number($("ssh-port").value || 22) };
  const opt = { name: "ssh-name", identity: "ssh-key", remote_cdui: "ssh-cdui" };
  for (const [k, id] of Object.entries(opt)) if ($(id).value.trim()) body[k] = $(id).value.trim();
  try {
    const w = await api("POST", "/api/workers/ssh", body);
    fill($("ssh-result"), h("p", { class: "ok-text" }, `Added ${w.name || body.target}; connecting…`));
    await refresh();
  } catch (err) {
    fill($("ssh-result"), h("p", { class: "error-text", role: "alert", id: "ssh-error" }, err.message),
      err.hint ? h("p", { class: "hint" }, err.hint) : null);
  } finally {
    btn.disabled = false;
  }
}
