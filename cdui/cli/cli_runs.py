"""``cdui runs``: find, read and act on runs after submitting them.

Every subcommand is a thin client of the HTTP API (docs/api.md): ``list``
(``GET /api/runs`` with its filters and pages), ``show``, ``logs`` (the events,
``--follow`` until the run ends), ``stop`` and ``delete`` (they say what
happens to the run first and ask; off a terminal they need ``--yes``),
``download`` (an artifact, its sha256 checked against the run's record before
the file takes its name), ``clone`` (the run's stored graph with changed
params, queued again), ``outputs`` (recorded node outputs) and ``tag``/``note``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from cdui.cli import cli_devices, cli_workers
from cdui.cli.cli_util import CONTROL_HELP, _die
from cdui.core.errors import CduiError
from cdui.graph.params import ParamError, set_param, split_key, text_value
from cdui.plane.store import TERMINAL
from cdui.wire.target import parse_target, target_json

POLL_S = 0.3  # how often a follower asks for new events


def _client(args: argparse.Namespace) -> Any:
    return cli_workers._client(args)  # the one client factory (--control, --ca-fingerprint)


# -- text of runs and events ----------------------------------------------------------
def _when(iso_text: str | None) -> str:
    """``2026-12-02T13:04:05.123Z`` as ``2026-12-02 13:04:05`` (UTC), or ``-``."""
    if not iso_text:
        return "-"
    return iso_text.replace("T", " ")[:19]


def _seconds(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    try:
        return (datetime.fromisoformat(b.replace("Z", "+00:00"))
                - datetime.fromisoformat(a.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return None


def duration(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def target_text(run: dict[str, Any]) -> str:
    t = run.get("target")
    if isinstance(t, dict):
        return t.get("worker") or t.get("pool") or json.dumps(t)
    return str(t)


def size_text(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def clip(text: str, width: int) -> str:
    """``text`` on one line in at most ``width`` characters, cut at a word where one is near."""
    text = " ".join(str(text).split())
    if len(text) <= width:
        return text
    cut = text[:width - 1]
    space = cut.rfind(" ")
    if space >= width // 2:
        cut = cut[:space]
    return cut + "…"


def progress_line(ev: dict[str, Any]) -> str | None:
    """One event as ``cdui run --wait`` prints it (None for events it leaves out)."""
    k, d = ev["kind"], ev["data"]
    node = d.get("node_id")
    if k == "status":
        s = d.get("status")
        return f"status: {s}" + (f" ({d['error']})" if d.get("error") else "")
    if k == "node_status":
        if d.get("status") in ("running", "failed", "stopped"):
            return f"node {node} ({d.get('type')}): {d.get('status')}" + (f": {d['error']}" if d.get("error") else "")
        return None
    if k == "progress":
        parts = [f"{key} {val:.4g}" if isinstance(val, float) else f"{key} {val}"
                 for key, val in d.items() if key != "node_id"]
        return f"node {node}: " + ", ".join(parts)
    if k == "log":
        if d.get("stream") == "stderr" and d.get("level") != "error":
            return f"  {d.get('message')}"
        return f"[{d.get('level', 'info')}] {d.get('message')}"
    if k == "run_warning":
        return f"warning ({d.get('kind')}): {d.get('message')}"
    if k == "artifact":
        return f"artifact {d.get('kind')}: {d.get('name')}"
    return None


def log_line(ev: dict[str, Any]) -> str | None:
    """One event as ``cdui runs logs`` prints it: every log line, statuses, metrics and warnings."""
    k, d = ev["kind"], ev["data"]
    at = str(ev.get("at") or "")[11:19]
    if k == "node_status":
        s = d.get("status")
        secs = f" ({d['seconds']:.2f} s)" if isinstance(d.get("seconds"), (int, float)) else ""
        text = f"node {d.get('node_id')} ({d.get('type')}): {s}{secs}" + (f": {d['error']}" if d.get("error") else "")
    elif k == "metric":
        vals = ", ".join(f"{key} {val:.5g}" if isinstance(val, float) else f"{key} {val}"
                         for key, val in d.items() if key != "node_id")
        text = f"metric {d.get('node_id')}: {vals}"
    else:
        text = progress_line(ev) or ""
        if not text:
            return None
    return f"{at} {text}" if at else text


def follow(client: Any, run_id: str, quiet: bool = False, line: Any = progress_line,
           say_queue: bool = True) -> dict[str, Any]:
    """Print a run's events as they come (and, while it waits in the queue, why, each time the reason
    changes); return the final run object. Ctrl-C asks (on a terminal) whether to stop the run, else
    says that it keeps going and how to stop it."""
    try:
        return _follow(client, run_id, quiet, line, say_queue)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        stop = False
        if sys.stdin.isatty():
            try:
                stop = input(f"Stop run {run_id} too? [y/N] ").strip().lower() in ("y", "yes")
            except (EOFError, KeyboardInterrupt):
                stop = False
        if stop:
            out = client.call("POST", f"/api/runs/{run_id}/stop")
            print(f"run {run_id}: {out['status']}" + (" (stop requested)" if out["status"] not in TERMINAL else ""),
                  file=sys.stderr)
        else:
            print(f"run {run_id} keeps going; follow it with `cdui runs logs {run_id} --follow`, stop it with "
                  f"`cdui runs stop {run_id}`", file=sys.stderr)
        raise SystemExit(130) from None


def _follow(client: Any, run_id: str, quiet: bool, line: Any, say_queue: bool) -> dict[str, Any]:
    after = 0
    reason = None
    while True:
        while True:  # every page there is now (a page holds at most 10,000 events)
            events = client.call("GET", f"/api/runs/{run_id}/events?after={after}")
            for ev in events:
                after = ev["seq"]
                text = None if quiet else line(ev)
                if text:
                    print(text, flush=True)
            if len(events) < 10000:
                break
        run = client.call("GET", f"/api/runs/{run_id}")
        if run["status"] in TERMINAL and run.get("last_seq", 0) <= after:
            return run
        if say_queue and not quiet and run["status"] == "queued" and run.get("queue_reason") != reason:
            reason = run.get("queue_reason")
            if reason:
                print(f"queued: {reason}", flush=True)
        time.sleep(POLL_S)


# -- confirmation ---------------------------------------------------------------------
def confirm(args: argparse.Namespace, what: str) -> int | None:
    """Print what will happen; None to go ahead (``--yes``, or the person at the terminal said yes), else
    the exit code: 2 off a terminal without ``--yes`` (a script must say it means it), 1 when declined."""
    print(what, file=sys.stderr)
    if args.yes:
        return None
    if not sys.stdin.isatty():
        return _die("not on a terminal, so nothing was done: add --yes to go ahead", 2)
    try:
        answer = input("Go ahead? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        print("nothing done", file=sys.stderr)
        return 1
    return None


# -- list / show ------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    query: dict[str, Any] = {"limit": args.limit}
    for key in ("status", "target", "worker", "tag", "search", "after"):
        value = getattr(args, key)
        if value is not None:
            query[key] = value
    runs = _client(args).call("GET", "/api/runs?" + urlencode(query))
    if args.json:
        print(json.dumps(runs, indent=2))
        return 0
    if not runs:
        print("no runs" + (" match" if len(query) > 1 else ""))
        return 0
    rows = [("ID", "STATUS", "TARGET", "DEVICE", "CREATED (UTC)", "TOOK", "NAME", "TAGS", "ERROR OR WAIT")]
    for r in runs:
        took = _seconds(r.get("started_at"), r.get("finished_at"))
        why = r.get("error") or (r.get("queue_reason") if r["status"] == "queued" else "") or ""
        worker = r.get("worker_id")
        where = target_text(r) + (f" ({worker})" if worker and worker not in ("local", target_text(r)) else "")
        rows.append((r["id"], r["status"], where, r.get("device") or "-", _when(r.get("created_at")),
                     duration(took), clip(r.get("name") or "-", 30), clip(" ".join(r.get("tags") or []) or "-", 30),
                     clip(why, 60)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1])
    if len(runs) == args.limit:
        print(f"(the newest {args.limit} shown; the next page: add --after {runs[-1]['id']})")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    client = _client(args)
    run = client.call("GET", f"/api/runs/{args.run_id}")
    arts = client.call("GET", f"/api/runs/{args.run_id}/artifacts")
    if args.json:
        print(json.dumps({**run, "artifacts": arts}, indent=2))
        return 0
    facts = run.get("execution_facts") or {}
    lines = [
        ("run", run["id"] + (f" ({run['name']})" if run.get("name") else "")),
        ("status", run["status"] + (" (stop requested)" if run.get("stop_requested") and run["status"] not in TERMINAL
                                    else "")),
        ("target", target_text(run)),
        ("worker", "this server" if run.get("worker_id") == "local" else run.get("worker_id") or "-"),
        ("device", run.get("device") or "-"),
    ]
    if run["status"] == "queued":
        lines.append(("waiting", run.get("queue_reason") or "-"))
    if run.get("worker_status"):
        lines.append(("worker state", run["worker_status"].get("text", "")))
    lines += [
        ("created", _when(run.get("created_at"))),
        ("started", _when(run.get("started_at"))),
        ("finished", _when(run.get("finished_at"))),
        ("took", duration(_seconds(run.get("started_at"), run.get("finished_at")))),
        ("events", str(run.get("last_seq", 0))),
    ]
    if run.get("tags"):
        lines.append(("tags", " ".join(run["tags"])))
    if run.get("note"):
        lines.append(("note", run["note"]))
    if facts.get("files"):
        lines.append(("files", str(facts["files"])))
    if run.get("error"):
        lines.append(("error", run["error"]))
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k.ljust(width)}  {v}")
    if arts:
        print("artifacts:")
        for a in arts:
            sha = (a.get("sha256") or "")[:12]
            print(f"  {a['id']:>4}  {a.get('kind', '')}  {a.get('name') or a.get('path')}  {size_text(a.get('size'))}"
                  + (f"  sha256 {sha}…" if sha else "") + (f"  ({a['backend']})" if a.get("backend") else ""))
        print(f"download one: cdui runs download {run['id']} ARTIFACT_ID")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.follow:
        run = follow(client, args.run_id, line=log_line)
        return 0 if run["status"] == "succeeded" else 1
    after = 0
    while True:
        events = client.call("GET", f"/api/runs/{args.run_id}/events?after={after}")
        for ev in events:
            after = ev["seq"]
            text = log_line(ev)
            if text:
                print(text)
        if len(events) < 10000:
            return 0


# -- stop / delete -------------------------------------------------------------------------
def cmd_stop(args: argparse.Namespace) -> int:
    client = _client(args)
    run = client.call("GET", f"/api/runs/{args.run_id}")
    if run["status"] in TERMINAL:
        print(f"run {run['id']} has already ended ({run['status']}): nothing to stop")
        return 0
    if run["status"] == "queued":
        what = f"run {run['id']} is queued: it is cancelled at once and never starts."
    else:
        where = f"worker {run['worker_id']}" if run.get("worker_id") not in (None, "local") else "this server"
        what = (f"run {run['id']} is {run['status']} on {where}: it is asked to stop and gets 10 s to finish "
                f"(it ends cancelled), then it is killed (it ends interrupted). Its events and artifacts so far "
                f"are kept.")
        if run["status"] == "disconnected":
            what += " Its worker is away: the stop reaches it when it reconnects."
    refused = confirm(args, what)
    if refused is not None:
        return refused
    out = client.call("POST", f"/api/runs/{run['id']}/stop")
    print(f"run {out['id']}: {out['status']}" + (" (stop requested)" if out["status"] not in TERMINAL else ""))
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    client = _client(args)
    run = client.call("GET", f"/api/runs/{args.run_id}")
    if run["status"] not in TERMINAL:
        return _die(f"run {run['id']} is {run['status']}: only an ended run can be deleted "
                    f"(stop it first: cdui runs stop {run['id']})")
    what = (f"run {run['id']} ({run['status']}) is deleted: its events, its artifact records and its run folder "
            f"go{' (its checkpoints/ stay)' if run['status'] == 'interrupted' else ''}; files it wrote into the "
            f"data folders stay. This cannot be undone.")
    refused = confirm(args, what)
    if refused is not None:
        return refused
    out = client.call("DELETE", f"/api/runs/{run['id']}")
    print(f"deleted run {out['deleted']}" + (f" ({out['warning']})" if out.get("warning") else ""))
    return 0


# -- download ------------------------------------------------------------------------------
class Progress:
    """A one-line progress bar on a terminal's stderr (nothing off a terminal)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.on = sys.stderr.isatty()
        self.last = 0.0
        self.start = time.monotonic()

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if not self.on or (now - self.last < 0.1 and done != total):
            return
        self.last = now
        rate = done / max(now - self.start, 1e-6)
        if total:
            filled = int(30 * done / total)
            bar = "#" * filled + "." * (30 - filled)
            text = f"\r{self.name} [{bar}] {size_text(done)} / {size_text(total)}, {size_text(int(rate))}/s"
        else:
            text = f"\r{self.name} {size_text(done)}, {size_text(int(rate))}/s"
        sys.stderr.write(text)
        sys.stderr.flush()

    def end(self) -> None:
        if self.on:
            sys.stderr.write("\n")


def _pick_artifact(arts: list[dict[str, Any]], which: str | None, run_id: str) -> dict[str, Any]:
    listing = "; ".join(f"{a['id']}: {a.get('name') or a.get('path')}" for a in arts[:20])
    if not arts:
        raise CduiError("no_artifacts", f"run {run_id} has no artifacts")
    if which is None:
        if len(arts) == 1:
            return arts[0]
        raise CduiError("which_artifact", f"run {run_id} has {len(arts)} artifacts: {listing}",
                        hint=f"name one: cdui runs download {run_id} ID_OR_NAME")
    for a in arts:
        if str(a["id"]) == which:
            return a
    named = [a for a in arts if which in (a.get("name"), a.get("path"), Path(str(a.get("path") or "")).name)]
    if len(named) == 1:
        return named[0]
    if len(named) > 1:
        raise CduiError("which_artifact", f"{len(named)} artifacts of run {run_id} are named {which!r}: "
                                          + "; ".join(str(a["id"]) for a in named), hint="name one by its id")
    raise CduiError("not_found", f"run {run_id} has no artifact {which!r}; it has: {listing}")


def cmd_download(args: argparse.Namespace) -> int:
    client = _client(args)
    arts = client.call("GET", f"/api/runs/{args.run_id}/artifacts")
    art = _pick_artifact(arts, args.artifact, args.run_id)
    folder = art.get("kind") == "tensorboard" or not art.get("sha256")
    base = Path(str(art.get("name") or art.get("path") or f"artifact-{art['id']}")).name or f"artifact-{art['id']}"
    dest = Path(args.output) if args.output else Path(base + (".zip" if folder and not base.endswith(".zip") else ""))
    if dest.is_dir() or (args.output or "").endswith(("/", os.sep)):
        dest = dest / (base + (".zip" if folder and not base.endswith(".zip") else ""))
    if dest.exists() and not args.force:
        return _die(f"{dest} exists: nothing was downloaded (give another -o PATH, or --force to replace it)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    bar = Progress(dest.name)
    h = hashlib.sha256()

    class Hashing:
        def __init__(self, f: Any) -> None:
            self.f = f

        def write(self, piece: bytes) -> None:
            h.update(piece)
            self.f.write(piece)
    try:
        with os.fdopen(fd, "wb") as f:
            done, _ = client.download(f"/api/runs/{args.run_id}/artifacts/{art['id']}/download", Hashing(f), bar)
        bar.end()
        want = art.get("sha256")
        if want and not folder and h.hexdigest() != want:
            return _die(f"the download of artifact {art['id']} has sha256 {h.hexdigest()}, not the {want} the run "
                        f"recorded: it was not kept (try again; if it repeats, the stored file changed)")
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # as any file the user makes (mkstemp made it 0600)
        os.replace(tmp, dest)
        tmp = ""
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
    check = "sha256 checked" if art.get("sha256") and not folder else "a folder, zipped: no single sha256 to check"
    print(f"{dest} ({size_text(done)}, {check})")
    return 0


# -- clone ---------------------------------------------------------------------------------
def apply_params(graph: dict[str, Any], changes: list[str], declared: dict[str, list[str]]) -> list[str]:
    """Set each ``NODE.PARAM=VALUE`` in ``graph`` (in place); the lines saying what changed. Refuses an
    unknown node or a param the node's type does not declare, naming what there is."""
    said = []
    for change in changes:
        key, eq, raw = change.partition("=")
        if not eq:
            raise CduiError("bad_param", f"--param {change!r} is not NODE.PARAM=VALUE",
                            hint="e.g. --param train.lr=0.01 (the node's id, a dot, the param's name)")
        value = text_value(raw)
        try:
            old = set_param(graph, key, value, declared)
        except ParamError as exc:
            if "is not NODE.PARAM" in exc.message:
                raise CduiError("bad_param", f"--param {change!r} is not NODE.PARAM=VALUE",
                                hint="e.g. --param train.lr=0.01 (the node's id, a dot, the param's name)") from None
            raise CduiError("bad_param", f"--param {change!r}: {exc.message}", hint=exc.hint) from None
        node_id, param = split_key(key)
        said.append(f"{node_id}.{param}: {json.dumps(old) if old != '(default)' else old} -> {json.dumps(value)}")
    return said


def cmd_clone(args: argparse.Namespace) -> int:
    client = _client(args)
    run = client.call("GET", f"/api/runs/{args.run_id}")
    graph = client.call("GET", f"/api/runs/{args.run_id}/graph")["graph"]
    declared: dict[str, list[str]] = {}
    if args.param:
        catalog = client.call("GET", "/api/nodes")
        for n in catalog.get("nodes") or []:
            if isinstance(n, dict) and "type" in n:
                declared[n["type"]] = [p["name"] for p in n.get("params") or [] if isinstance(p, dict) and "name" in p]
    said = apply_params(graph, args.param or [], declared)
    opts = run.get("options") or {}
    options: dict[str, Any] = {k: opts[k] for k in ("device", "devices", "memory_mb", "record_outputs") if k in opts}
    if args.record_outputs:
        options["record_outputs"] = True
    options["target"] = target_json(parse_target(args.target)) if args.target is not None else run.get("target")
    if args.device is not None:
        options["device"] = args.device
    if not args.queue_anyway:
        cli_devices.check_device_offered(client, options.get("target"), options.get("device"),
                                         options.get("devices"))
    new = client.call("POST", "/api/runs", {"graph": graph, "options": options})
    print(new["id"] if not args.json else json.dumps(new, indent=2))
    if not args.json:
        print(f"cloned from run {run['id']} onto {target_text(new)}" + (": " + "; ".join(said) if said else
                                                                        " with its params unchanged"),
              file=sys.stderr)
    if args.wait:
        final = follow(client, new["id"], quiet=args.json)
        return 0 if final["status"] == "succeeded" else 1
    return 0


# -- outputs ---------------------------------------------------------------------------------
def _stat(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else "-" if v is None else str(v)


def cmd_outputs(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.node is None:
        out = client.call("GET", f"/api/runs/{args.run_id}/outputs")
        if args.json:
            print(json.dumps(out, indent=2))
            return 0
        if not out.get("record_outputs"):
            print(f"run {args.run_id} was submitted without record_outputs: no node outputs were kept "
                  f"(clone it with them kept: cdui runs clone {args.run_id} --record-outputs)")
            return 0
        where = f"worker {out['worker']}" if out.get("worker") else "this server"
        print(f"recorded outputs of run {args.run_id} (kept on {where}):")
        for n in out.get("nodes") or []:
            print(f"  {n['node_id']}  {n.get('type', '')}")
        if out.get("nodes"):
            print(f"one node's: cdui runs outputs {args.run_id} NODE_ID")
        return 0
    out = client.call("GET", f"/api/runs/{args.run_id}/outputs/{args.node}")
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"node {out['node_id']} ({out.get('type', '')}) of run {out['run_id']}:")
    for o in out.get("outputs") or []:
        head = f"  {o.get('port')}: {o.get('kind')}"
        if o.get("shape") is not None:
            head += f" {o.get('dtype', '')} shape {list(o['shape'])}"
        if o.get("kind") == "tensor":
            head += f"  min {_stat(o.get('min'))}  max {_stat(o.get('max'))}  mean {_stat(o.get('mean'))}"
            if o.get("nonfinite"):
                head += f"  non-finite {o['nonfinite']}"
        if o.get("note"):
            head += f"  ({o['note']})"
        print(head)
        for row in (o.get("preview") or [])[:8]:
            if isinstance(row, list):
                print("    " + " ".join(_stat(v).rjust(9) for v in row[:10]) + (" …" if len(row) > 10 else ""))
    return 0


# -- tags and notes ---------------------------------------------------------------------------
def cmd_tag(args: argparse.Namespace) -> int:
    client = _client(args)
    run = client.call("GET", f"/api/runs/{args.run_id}")
    tags = list(run.get("tags") or [])
    tags = [t for t in tags if t not in (args.remove or [])] + [t for t in args.tags if t not in tags]
    out = client.call("PATCH", f"/api/runs/{run['id']}", {"tags": tags})
    print(f"run {out['id']}: tags " + (" ".join(out["tags"]) or "(none)"))
    return 0


def cmd_note(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    out = _client(args).call("PATCH", f"/api/runs/{args.run_id}", {"note": text})
    print(f"run {out['id']}: " + ("note set" if out.get("note") else "note removed"))
    return 0


# -- parser ----------------------------------------------------------------------------------
RUN_ID_HELP = "the run's id (`cdui runs list` shows them)"


def _common(s: argparse.ArgumentParser) -> None:
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.add_argument("--ca-fingerprint", default=None, metavar="sha256:HEX",
                   help="through a TLS proxy with a self-signed certificate: its key's fingerprint (pinned)")


def add_commands(sub: Any) -> None:
    r = sub.add_parser("runs", help="list, read, stop, delete, download, clone and tag runs")
    rsub = r.add_subparsers(dest="runs_command", metavar="SUBCOMMAND", parser_class=type(r))
    r.set_defaults(func=lambda a: (r.print_help(), 2)[1])

    s = rsub.add_parser("list", help="list runs, newest first (filters combine)")
    s.add_argument("--status", default=None, help="queued, running, disconnected, succeeded, failed, cancelled or "
                                                  "interrupted")
    s.add_argument("--target", default=None, help="the target the run was queued for: local, any, one-shot or a "
                                                  "worker's name")
    s.add_argument("--worker", default=None, metavar="NAME", help="runs that ran (or run) on this worker")
    s.add_argument("--tag", default=None, help="runs carrying this tag")
    s.add_argument("--search", default=None, metavar="TEXT", help="text in the run's id, name, error, note or tags")
    s.add_argument("--limit", type=int, default=50, metavar="N", help="at most N runs (default 50)")
    s.add_argument("--after", default=None, metavar="RUN_ID", help="the next page: the runs listed after this one")
    s.add_argument("--json", action="store_true", help="print the run objects as JSON")
    _common(s)
    s.set_defaults(func=cmd_list)

    s = rsub.add_parser("show", help="a run's status, target, worker, device, wait reason, timings, error and "
                                     "artifacts")
    s.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    s.add_argument("--json", action="store_true", help="print the run object and its artifacts as JSON")
    _common(s)
    s.set_defaults(func=cmd_show)

    s = rsub.add_parser("logs", help="a run's log lines, statuses and metrics")
    s.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    s.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends (exit 0 only if "
                                                               "it succeeded)")
    _common(s)
    s.set_defaults(func=cmd_logs)

    for name, func, what in (("stop", cmd_stop, "stop a run (a queued one is cancelled; a running one gets 10 s)"),
                             ("delete", cmd_delete, "delete an ended run, its events and artifact records")):
        s = rsub.add_parser(name, help=what)
        s.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
        s.add_argument("--yes", "-y", action="store_true", help="do not ask (needed when not on a terminal)")
        _common(s)
        s.set_defaults(func=func)

    s = rsub.add_parser("download", help="download an artifact of a run, its sha256 checked")
    s.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    s.add_argument("artifact", metavar="ARTIFACT", nargs="?", default=None,
                   help="the artifact's id or name (`cdui runs show RUN_ID` lists them); optional when there is one")
    s.add_argument("-o", "--output", default=None, metavar="PATH", help="where to write it (a file or a folder; "
                                                                        "default: its name, here)")
    s.add_argument("--force", action="store_true", help="replace PATH if it exists")
    _common(s)
    s.set_defaults(func=cmd_download)

    s = rsub.add_parser("clone", help="queue a run's graph again, with changed params and another target")
    s.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    s.add_argument("--param", action="append", default=None, metavar="NODE.PARAM=VALUE",
                   help="set a param (VALUE is JSON where it parses, else text); repeat for more")
    s.add_argument("--target", default=None, help="local, any, one-shot or a worker's name (default: the run's own)")
    s.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: the run's own)")
    s.add_argument("--record-outputs", action="store_true", help="keep each node's outputs for `cdui runs outputs`")
    s.add_argument(cli_devices.QUEUE_ANYWAY, action="store_true",
                   help="queue it even when no machine the target may use offers --device (it waits for one)")
    s.add_argument("--wait", action="store_true", help="follow the new run; exit 0 only if it succeeded")
    s.add_argument("--json", action="store_true", help="print the new run object as JSON")
    _common(s)
    s.set_defaults(func=cmd_clone)

    s = rsub.add_parser("outputs", help="a run's recorded node outputs (shapes, statistics, values)")
    s.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    s.add_argument("node", metavar="NODE", nargs="?", default=None, help="one node's outputs (default: list the "
                                                                        "nodes)")
    s.add_argument("--json", action="store_true", help="print the answer as JSON")
    _common(s)
    s.set_defaults(func=cmd_outputs)

    s = rsub.add_parser("tag", help="add (or --remove) tags on a run")
    s.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    s.add_argument("tags", metavar="TAG", nargs="*", help="tags to add: letters, digits and _ . : + / -")
    s.add_argument("--remove", action="append", default=None, metavar="TAG", help="a tag to take off; repeat for "
                                                                                 "more")
    _common(s)
    s.set_defaults(func=cmd_tag)

    s = rsub.add_parser("note", help="set a run's note (\"\" removes it)")
    s.add_argument("run_id", metavar="RUN_ID", help=RUN_ID_HELP)
    s.add_argument("text", metavar="TEXT", help="the note; - reads it from standard input")
    _common(s)
    s.set_defaults(func=cmd_note)
