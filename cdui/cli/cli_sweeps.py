"""``cdui sweep``: one graph, many variants, each an ordinary run (docs/sweeps.md).

``cdui sweep GRAPH.json --param NODE.PARAM=VALUES ...`` creates a sweep (``POST /api/sweeps``);
``cdui sweep list|show|stop|retry|delete`` read and change sweeps. ``--wait`` follows one to its end
with a table of its variants, redrawn in place on a terminal and as one line per change otherwise.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdui.cli import cli_devices, cli_runs, cli_workers
from cdui.cli.cli_util import CONTROL_HELP, _die
from cdui.core.errors import CduiError
from cdui.wire.sweepspec import MODES, axis_from_text
from cdui.wire.target import parse_target, target_json

SUBCOMMANDS = ("list", "show", "stop", "retry", "delete")
NEEDS_ID = ("show", "stop", "retry", "delete")
LIVE = ("queued", "running", "disconnected")
SBATCH = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "codefyui.sbatch"
POLL_S = 1.0


def _client(args: argparse.Namespace) -> Any:
    return cli_workers._client(args)


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.5g}"
    return json.dumps(v) if not isinstance(v, str) else v


def table(sweep: dict[str, Any]) -> list[str]:
    """The variants as text rows: index, status, worker, objective, params, run id; the best marked ``*``."""
    obj = sweep.get("objective")
    keys = list(sweep.get("axes") or {}) or sorted({k for v in sweep["variants"] for k in v["params"]})
    head = ["", "#", "status", "worker", (f"{obj['metric']} ({obj['goal']})" if obj else "objective"), *keys, "run"]
    rows = [head]
    for v in sweep["variants"]:
        rows.append(["*" if v.get("best") else "", str(v["index"]), v["status"], v.get("worker_id") or "-",
                     _short(v["objective"]) if v.get("objective") is not None else "-",
                     *(_short(v["params"].get(k, "-")) for k in keys), v.get("run_id") or "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    counts = ", ".join(f"{n} {s}" for s, n in sorted(sweep["counts"].items()))
    lines.append(f"sweep {sweep['id']}: {sweep['status']}, {sweep['total']} variants ({counts}), "
                 f"at most {sweep['max_running']} at once")
    best = sweep.get("best")
    if best:
        lines.append(f"best: variant {best['index']} (run {best['run_id']}), {obj['metric'] if obj else ''} "
                     f"{_short(best['objective'])}, {params_text(best['params'])}")
    for v in sweep["variants"]:
        if v.get("error") and v["status"] not in ("succeeded",) + LIVE:
            lines.append(f"variant {v['index']}: {v['error']}")
    return lines


def _done(sweep: dict[str, Any]) -> bool:
    return sweep["status"] in ("finished", "stopped")


def follow_table(client: Any, path: str, table_of: Callable[[dict[str, Any]], list[str]],
                 changes: Callable[[dict[str, Any]], list[str]], quiet: bool = False) -> dict[str, Any]:
    """Poll ``path`` (a sweep or a study) until it has finished or stopped: a live table on a terminal,
    redrawn in place; otherwise each line ``changes`` gives as it changes, then the table once at the end.
    ``quiet``: nothing printed (``--json``)."""
    tty = sys.stdout.isatty() and not quiet
    drawn = 0
    while True:
        item = client.call("GET", path)
        if tty:
            lines = table_of(item)
            if drawn:
                sys.stdout.write(f"\x1b[{drawn}F\x1b[J")  # back to the table's first line, and clear below
            sys.stdout.write("\n".join(lines) + "\n")
            sys.stdout.flush()
            drawn = len(lines)
        elif not quiet:
            for line in changes(item):
                print(line, flush=True)
        if _done(item):
            if not tty and not quiet:
                print("\n".join(table_of(item)), flush=True)
            return item
        time.sleep(POLL_S)


def changed(seen: dict[int, Any]) -> Callable[[list[dict[str, Any]], Callable[[dict[str, Any]], Any],
                                                  Callable[[dict[str, Any]], str]], list[str]]:
    """The lines of the rows (variants, trials) whose ``state_of`` changed since the last call."""
    def lines(rows: list[dict[str, Any]], state_of: Callable[[dict[str, Any]], Any],
              line_of: Callable[[dict[str, Any]], str]) -> list[str]:
        out = []
        for row in rows:
            now = state_of(row)
            if seen.get(row["index"]) != now:
                seen[row["index"]] = now
                out.append(line_of(row))
        return out
    return lines


def params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_short(x)}" for k, x in params.items())


def follow(client: Any, sweep_id: str, quiet: bool = False) -> dict[str, Any]:
    """Poll the sweep until it has finished or stopped; a live table on a terminal, else one line per change."""
    lines = changed({})

    def line(v: dict[str, Any]) -> str:
        where = f" on {v['worker_id']}" if v.get("worker_id") else ""
        return (f"variant {v['index']} ({params_text(v['params'])}): {v['status']}{where}"
                + (f" (run {v['run_id']})" if v.get("run_id") else ""))
    return follow_table(client, f"/api/sweeps/{sweep_id}", table,
                        lambda sweep: lines(sweep["variants"], lambda v: (v["status"], v.get("worker_id")), line),
                        quiet)


def emit_sbatch(sweep: dict[str, Any]) -> str:
    """``deploy/slurm/codefyui.sbatch`` with its array sized to the sweep: one task per variant, at most
    max_running at once (``%N``), so each one-shot task takes one variant."""
    try:
        text = SBATCH.read_text(encoding="utf-8")
    except OSError as exc:
        raise CduiError("no_sbatch", f"cannot read {SBATCH}: {exc.strerror or exc}",
                        hint="--emit-sbatch needs cdui's deploy/slurm folder (an installation from the repository)") \
            from None
    n, at_once = sweep["total"], min(sweep["max_running"], sweep["total"])
    text = re.sub(r"^#SBATCH --array=.*$", f"#SBATCH --array=0-{n - 1}%{at_once}", text, count=1, flags=re.M)
    text = re.sub(r"^#SBATCH --job-name=.*$", f"#SBATCH --job-name=codefyui-sweep-{sweep['id']}", text, count=1,
                  flags=re.M)
    note = (f"#\n# Sweep {sweep['id']}: {n} variants queued for the one-shot pool, at most {at_once} at once; "
            f"this array has one task per variant\n# (each one-shot agent takes one run and exits). Written by "
            f"`cdui sweep --emit-sbatch`.\n")
    return text.replace("#\n", note, 1)


def _errors(err: CduiError) -> int | None:
    items = err.details if isinstance(err.details, list) else []
    if err.code not in ("invalid_sweep", "invalid_graph") or not items:
        return None
    print(f"cdui: error: {err.message}", file=sys.stderr)
    for e in items:
        if not isinstance(e, dict):
            continue
        where = f"node {e['node_id']}: " if e.get("node_id") else ""
        which = e.get("variants")
        variants = f" [variant{'s' if len(which) > 1 else ''} {', '.join(map(str, which[:10]))}" \
                   f"{', ...' if len(which) > 10 else ''}]" if isinstance(which, list) and which else ""
        print(f"  - {where}{e.get('message')}{variants}" + (f" ({e['hint']})" if e.get("hint") else ""),
              file=sys.stderr)
    return 1


def read_graph_arg(what: str, command: str, subcommands: tuple[str, ...]) -> dict[str, Any] | int:
    """The graph file named where a subcommand could also stand, or the exit code of a clear error."""
    path = Path(what)
    if not path.exists() and what not in subcommands:
        close = difflib.get_close_matches(what, subcommands, 1, 0.6)
        if close and not what.endswith(".json"):
            return _die(f"no graph file {what!r} and no subcommand {what!r}; did you mean {close[0]}? "
                        f"(see `cdui {command} --help`)", 2)
    try:
        graph = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return _die(f"cannot read graph file {what}: {exc.strerror} (give a CodefyUI graph file, or one of "
                    f"{', '.join(subcommands)})", 2)
    except ValueError as exc:
        return _die(f"graph file {what} is not valid JSON: {exc}")
    if not isinstance(graph, dict):
        return _die(f"graph file {what} holds {type(graph).__name__}, not a graph (a JSON object with nodes and edges)")
    return graph


def cmd_create(args: argparse.Namespace) -> int:
    graph = read_graph_arg(args.what, "sweep", SUBCOMMANDS)
    if isinstance(graph, int):
        return graph
    if not args.param:
        return _die("a sweep needs at least one --param NODE.PARAM=VALUES (e.g. --param train.lr=0.1,0.01)", 2)
    axes: dict[str, Any] = {}
    for text in args.param:
        key, axis = axis_from_text(text)
        if key in axes:
            return _die(f"--param {key} is given twice (give all its values in one --param, comma-separated)", 2)
        axes[key] = axis
    options: dict[str, Any] = {"target": target_json(parse_target(args.target)) if args.target else "any"}
    if args.device:
        options["device"] = args.device
    if args.devices is not None:
        options["devices"] = args.devices
    if args.record_outputs:
        options["record_outputs"] = True
    if args.emit_sbatch and options["target"] != {"pool": "one-shot"}:
        return _die("--emit-sbatch writes a SLURM array of one-shot agents: give --target one-shot", 2)
    body: dict[str, Any] = {"graph": graph, "axes": axes, "mode": args.mode, "options": options,
                            "max_running": args.max_running}
    if args.mode == "random":
        body["count"] = args.count
        body["seed"] = args.seed
    elif args.count is not None:
        return _die("--count is for --mode random", 2)
    if args.objective:
        body["objective"] = {"metric": args.objective, "goal": "max" if args.max else "min"}
    elif args.max or args.min:
        return _die("--min/--max say which way --objective METRIC is better: give --objective too", 2)
    if args.name:
        body["name"] = args.name
    client = _client(args)
    if not args.queue_anyway:
        cli_devices.check_device_offered(client, options["target"], args.device, args.devices)
    try:
        sweep = client.call("POST", "/api/sweeps", body)
    except CduiError as err:
        shown = _errors(err)
        if shown is not None:
            return shown
        raise
    if args.emit_sbatch:
        print(f"sweep {sweep['id']}: {sweep['total']} variants queued for the one-shot pool; submit the array "
              f"below with sbatch (see its comments for CONTROL and the enrollment token)", file=sys.stderr)
        print(emit_sbatch(sweep), end="")
        return 0
    if not args.wait:
        print(json.dumps(sweep, indent=2) if args.json else sweep["id"])
        return 0
    if not args.json:
        print(f"sweep {sweep['id']}: {sweep['total']} variants", flush=True)
    final = follow(client, sweep["id"], quiet=args.json)
    if args.json:
        print(json.dumps(final, indent=2))
    return 0 if final["counts"].get("succeeded", 0) == final["total"] else 1


def subcommand_problem(args: argparse.Namespace, command: str, item_id: str | None, subcommands: tuple[str, ...],
                       needs_id: tuple[str, ...]) -> int | None:
    """The exit code of a misused subcommand (an id after a graph file, a subcommand without its id), else None."""
    if args.what not in subcommands:
        if item_id is not None:
            return _die(f"unexpected {item_id!r} after the graph file (give params with --param)", 2)
        return None
    if args.what in needs_id and not item_id:
        return _die(f"`cdui {command} {args.what}` needs the {command}'s id (`cdui {command} list` shows them)", 2)
    return None


def print_listing(items: list[dict[str, Any]], command: str, of_what: Callable[[dict[str, Any]], str],
                  as_json: bool) -> int:
    """``cdui sweep list`` / ``cdui study list``: one line each (id, status, created, counts, name)."""
    if as_json:
        print(json.dumps(items, indent=2))
        return 0
    if not items:
        print(f"no {command}s" if command != "study" else "no studies")
    for s in items:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(s["counts"].items()))
        print(f"{s['id']}  {s['status']:<9} {s['created_at'][:19].replace('T', ' ')}  {of_what(s)} "
              f"({counts})  {s.get('name') or ''}".rstrip())
    return 0


def add_common_options(s: Any, noun: str) -> None:
    """The options ``cdui sweep`` and ``cdui study`` share: where each run goes, how to follow, how to reach."""
    s.add_argument("--target", default=None,
                   help=f"where each {noun} runs, as for `cdui run`: any (default), local, a worker NAME, or one-shot")
    s.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: any free device)")
    s.add_argument(cli_devices.QUEUE_ANYWAY, action="store_true",
                   help="queue it even when no machine the target may use offers --device (it waits for one)")
    s.add_argument("--json", action="store_true", help=f"print the {'study' if noun == 'trial' else 'sweep'} "
                                                       "(or the list) as JSON")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.add_argument("--ca-fingerprint", default=None, metavar="sha256:HEX",
                   help="through a TLS proxy with a self-signed certificate: its key's fingerprint (pinned)")


def add_objective_options(s: Any, what: str) -> None:
    s.add_argument("--objective", default=None, metavar="METRIC", help=what)
    goal = s.add_mutually_exclusive_group()
    goal.add_argument("--min", action="store_true", help="lower --objective is better (the default)")
    goal.add_argument("--max", action="store_true", help="higher --objective is better")


def cmd_sweep(args: argparse.Namespace) -> int:
    problem = subcommand_problem(args, "sweep", args.sweep_id, SUBCOMMANDS, NEEDS_ID)
    if problem is not None:
        return problem
    if args.what not in SUBCOMMANDS:
        return cmd_create(args)
    client = _client(args)
    if args.what == "list":
        return print_listing(client.call("GET", "/api/sweeps")["sweeps"], "sweep",
                             lambda s: f"{s['total']} variants", args.json)
    sweep = client.call("GET", f"/api/sweeps/{args.sweep_id}")
    if args.what == "show":
        print(json.dumps(sweep, indent=2) if args.json else "\n".join(table(sweep)))
        return 0
    if args.what == "retry":
        out = client.call("POST", f"/api/sweeps/{sweep['id']}/retry")
        print(f"sweep {out['id']}: {out['retried']} variant(s) queued again as new runs; {out['status']}")
        return 0
    if args.what == "stop":
        live = [v for v in sweep["variants"] if v["status"] in LIVE]
        waiting = sweep["counts"].get("waiting", 0)
        if sweep["status"] in ("finished", "stopped"):
            print(f"sweep {sweep['id']} has already {sweep['status']}: nothing to stop")
            return 0
        refused = cli_runs.confirm(args, f"sweep {sweep['id']}: {waiting} waiting variant(s) are cancelled, "
                                         f"{len(live)} queued or running run(s) are stopped (as `cdui runs stop` "
                                         f"does); `cdui sweep retry {sweep['id']}` queues them again")
        if refused is not None:
            return refused
        out = client.call("POST", f"/api/sweeps/{sweep['id']}/stop")
        print(f"sweep {out['id']}: {out['status']}")
        return 0
    runs = {v["run_id"] for v in sweep["variants"] if v.get("run_id")} | \
        {r for v in sweep["variants"] for r in v.get("previous_runs") or []}
    what = (f"sweep {sweep['id']} is deleted" + (f", with its {len(runs)} run(s), their events and artifacts"
                                                 if not args.keep_runs else f"; its {len(runs)} run(s) are kept"))
    refused = cli_runs.confirm(args, what)
    if refused is not None:
        return refused
    out = client.call("DELETE", f"/api/sweeps/{sweep['id']}" + ("?keep_runs=1" if args.keep_runs else ""))
    print(f"sweep {out['id']} deleted" + (f", {len(out['runs_deleted'])} run(s) deleted" if not args.keep_runs
                                          else ""))
    for w in out.get("warnings") or []:
        print(f"warning: {w}", file=sys.stderr)
    return 0


def add_commands(sub: Any) -> None:
    s = sub.add_parser("sweep", help="run a graph once per variant of its params (a sweep); list, show, stop, "
                                     "retry and delete sweeps",
                       description="cdui sweep GRAPH.json --param NODE.PARAM=VALUES ... creates a sweep; "
                                   "cdui sweep list | show ID | stop ID | retry ID | delete ID")
    s.add_argument("what", metavar="GRAPH.json|SUBCOMMAND",
                   help="the graph to sweep (a CodefyUI graph file), or list, show, stop, retry or delete")
    s.add_argument("sweep_id", metavar="SWEEP_ID", nargs="?", default=None,
                   help="the sweep's id, for show, stop, retry and delete (`cdui sweep list` shows them)")
    s.add_argument("--param", action="append", default=None, metavar="NODE.PARAM=VALUES",
                   help="an axis: a,b,c (values, each JSON where it parses), start:stop:step (a range, stop "
                        "included), or uniform(lo,hi), loguniform(lo,hi), randint(lo,hi) for --mode random; repeat "
                        "for more")
    s.add_argument("--mode", choices=MODES, default="grid",
                   help="grid: every combination (default); list: the i-th value of every --param together; "
                        "random: --count variants drawn with --seed")
    s.add_argument("--count", type=int, default=None, metavar="N", help="how many variants --mode random draws")
    s.add_argument("--seed", type=int, default=0, metavar="S", help="--mode random's seed (default 0)")
    add_objective_options(s, "the metric that ranks the variants (its last value in each run), e.g. val_loss")
    add_common_options(s, "variant")
    s.add_argument("--devices", type=int, default=None, metavar="N",
                   help="a device set per variant: N devices of --device's kind on one worker")
    s.add_argument("--record-outputs", action="store_true", help="keep each node's outputs of every variant")
    s.add_argument("--max-running", type=int, default=4, metavar="N",
                   help="at most N of the sweep's runs queued or running at once; the rest wait in the sweep "
                        "(default 4)")
    s.add_argument("--name", default=None, help="the sweep's name (default: the graph's)")
    s.add_argument("--wait", action="store_true",
                   help="follow the sweep to its end with a table of its variants; exit 0 only if every one succeeded")
    s.add_argument("--emit-sbatch", action="store_true",
                   help="with --target one-shot: print deploy/slurm/codefyui.sbatch with its array sized to the "
                        "sweep's variants (pipe it to sbatch)")
    s.add_argument("--keep-runs", action="store_true", help="delete: keep the sweep's runs (default: deleted too)")
    s.add_argument("--yes", "-y", action="store_true", help="stop, delete: do not ask (needed when not on a terminal)")
    s.set_defaults(func=cmd_sweep)
