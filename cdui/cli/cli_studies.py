"""``cdui study``: a sweep whose next variants Optuna chooses (docs/sweeps.md, "Studies").

``cdui study GRAPH.json --param NODE.PARAM=SPEC ... --objective METRIC --n-trials N`` creates a study
(``POST /api/studies``); ``cdui study list|show|stop|best-save`` read and change studies. ``--wait`` follows
one to its end with a table of its trials (pruned ones marked), as ``cdui sweep --wait`` does.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from cdui.cli import cli_devices, cli_runs, cli_workers
from cdui.cli.cli_sweeps import (
    LIVE,
    _done,
    _errors,
    _short,
    add_common_options,
    add_objective_options,
    changed,
    follow_table,
    params_text,
    print_listing,
    read_graph_arg,
    subcommand_problem,
)
from cdui.cli.cli_util import _die
from cdui.core.errors import CduiError
from cdui.wire.studyspec import PRUNERS, SAMPLERS, dim_from_text
from cdui.wire.target import parse_target, target_json

SUBCOMMANDS = ("list", "show", "stop", "best-save")
NEEDS_ID = ("show", "stop", "best-save")
POLL_S = 1.0


def table(study: dict[str, Any]) -> list[str]:
    """The trials as text rows: the best marked ``*``, a pruned trial's status says so."""
    obj = study.get("objective") or {}
    keys = list(study.get("axes") or {})
    head = ["", "#", "state", "status", "worker", f"{obj.get('metric')} ({obj.get('goal')})", *keys, "run"]
    rows = [head]
    for t in study["trials"]:
        rows.append(["*" if t.get("best") else "", str(t["index"]), t["state"], t["status"], t.get("worker_id") or "-",
                     _short(t["objective"]) if t.get("objective") is not None else "-",
                     *(_short(t["params"].get(k, "-")) for k in keys), t.get("run_id") or "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    counts = ", ".join(f"{n} {s}" for s, n in sorted(study["counts"].items()) if n)
    lines.append(f"study {study['id']}: {study['status']}, {study['total']} of {study['n_trials']} trials ({counts}), "
                 f"sampler {study['sampler']['name']}, pruner {study['pruner']['name']}, "
                 f"{study['parallelism']} at once")
    best = study.get("best")
    if best:
        lines.append(f"best: trial {best['index']} (run {best['run_id']}), {obj.get('metric')} "
                     f"{_short(best['objective'])}, {params_text(best['params'])}")
    if study.get("importances"):
        lines.append("importance: " + ", ".join(f"{k} {v:.2f}" for k, v in study["importances"].items()))
    return lines


def follow(client: Any, study_id: str, quiet: bool) -> dict[str, Any]:
    lines = changed({})

    def line(t: dict[str, Any]) -> str:
        value = f" {_short(t['objective'])}" if t.get("objective") is not None else ""
        return f"trial {t['index']} ({params_text(t['params'])}): {t['state']}{value}"
    return follow_table(client, f"/api/studies/{study_id}", table,
                        lambda study: lines(study["trials"], lambda t: t["state"], line), quiet)


def cmd_create(args: argparse.Namespace) -> int:
    graph = read_graph_arg(args.what, "study", SUBCOMMANDS)
    if isinstance(graph, int):
        return graph
    if not args.param:
        return _die("a study needs at least one --param NODE.PARAM=SPEC (e.g. --param optimizer.lr=loguniform:1e-4:"
                    "1e-1)", 2)
    if not args.objective:
        return _die("a study needs --objective METRIC (the metric it optimises, e.g. val_loss) and --min or --max", 2)
    axes: dict[str, Any] = {}
    for text in args.param:
        key, axis = dim_from_text(text)
        if key in axes:
            return _die(f"--param {key} is given twice", 2)
        axes[key] = axis
    options: dict[str, Any] = {"target": target_json(parse_target(args.target)) if args.target else "any"}
    if args.device:
        options["device"] = args.device
    sampler: dict[str, Any] = {"name": args.sampler}
    if args.startup_trials is not None:
        sampler["startup_trials"] = args.startup_trials
    body: dict[str, Any] = {"graph": graph, "axes": axes, "options": options, "n_trials": args.n_trials,
                            "parallelism": args.parallelism, "seed": args.seed, "sampler": sampler,
                            "pruner": args.pruner,
                            "objective": {"metric": args.objective, "goal": "max" if args.max else "min"}}
    if args.name:
        body["name"] = args.name
    client = cli_workers._client(args)
    if not args.queue_anyway:
        cli_devices.check_device_offered(client, options["target"], args.device, None)
    try:
        study = client.call("POST", "/api/studies", body)
    except CduiError as err:
        shown = _errors(CduiError("invalid_sweep", err.message, err.hint, err.status, err.details)
                        if err.code == "invalid_study" else err)
        if shown is not None:
            return shown
        raise
    if not args.wait:
        print(json.dumps(study, indent=2) if args.json else study["id"])
        return 0
    if not args.json:
        print(f"study {study['id']}: {study['n_trials']} trials, {study['parallelism']} at once", flush=True)
    final = follow(client, study["id"], args.json)
    if args.json:
        print(json.dumps(final, indent=2))
    return 0 if final["best"] is not None else 1


def cmd_study(args: argparse.Namespace) -> int:
    problem = subcommand_problem(args, "study", args.study_id, SUBCOMMANDS, NEEDS_ID)
    if problem is not None:
        return problem
    if args.what not in SUBCOMMANDS:
        return cmd_create(args)
    client = cli_workers._client(args)
    if args.what == "list":
        return print_listing(client.call("GET", "/api/studies")["studies"], "study",
                             lambda s: f"{s['total']} of {s['count']} trials", args.json)
    study = client.call("GET", f"/api/studies/{args.study_id}")
    if args.what == "show":
        print(json.dumps(study, indent=2) if args.json else "\n".join(table(study)))
        return 0
    if args.what == "best-save":
        if not args.name:
            return _die("`cdui study best-save ID --name NAME` needs --name: the saved graph's name", 2)
        out = client.call("POST", f"/api/studies/{study['id']}/best/save", {"name": args.name})
        print(json.dumps(out, indent=2) if args.json else
              f"saved graph {out['name']} with trial {out['trial']['index']}'s params "
              f"({params_text(out['trial']['params'])})")
        return 0
    if _done(study):
        print(f"study {study['id']} has already {study['status']}: nothing to stop")
        return 0
    live = [t for t in study["trials"] if t["status"] in LIVE]
    refused = cli_runs.confirm(args, f"study {study['id']}: no more trials are asked, {len(live)} queued or "
                                     f"running trial run(s) are stopped (as `cdui runs stop` does)")
    if refused is not None:
        return refused
    out = client.call("POST", f"/api/studies/{study['id']}/stop")
    print(f"study {out['id']}: {out['status']}")
    return 0


def add_commands(sub: Any) -> None:
    s = sub.add_parser("study", help="search a graph's params with Optuna (a study); list, show, stop studies "
                                     "and save the best trial's graph",
                       description="cdui study GRAPH.json --param NODE.PARAM=SPEC ... --objective METRIC creates a "
                                   "study; cdui study list | show ID | stop ID | best-save ID --name NAME")
    s.add_argument("what", metavar="GRAPH.json|SUBCOMMAND",
                   help="the graph to search (a CodefyUI graph file), or list, show, stop or best-save")
    s.add_argument("study_id", metavar="STUDY_ID", nargs="?", default=None,
                   help="the study's id, for show, stop and best-save (`cdui study list` shows them)")
    s.add_argument("--param", action="append", default=None, metavar="NODE.PARAM=SPEC",
                   help="a search axis: loguniform:LO:HI, uniform:LO:HI, randint:LO:HI, range:LO:HI:STEP, "
                        "or a,b,c (a choice); repeat for more")
    s.add_argument("--n-trials", type=int, default=20, metavar="N", help="how many trials in all (default 20)")
    s.add_argument("--sampler", choices=SAMPLERS, default="tpe",
                   help="how the next trial's params are chosen (default tpe; cmaes needs the cmaes package)")
    s.add_argument("--startup-trials", type=int, default=None, metavar="N",
                   help="tpe/cmaes: random trials before the model takes over (Optuna's default: 10)")
    s.add_argument("--pruner", choices=PRUNERS, default="none",
                   help="stop trials that are doing worse than the others at the same step (default none)")
    s.add_argument("--parallelism", type=int, default=1, metavar="N", help="trials queued or running at once "
                                                                          "(default 1)")
    s.add_argument("--seed", type=int, default=0, metavar="S", help="the sampler's seed (default 0)")
    add_objective_options(s, "the metric the study optimises (its last value in each run; every step's value "
                             "feeds the pruner), e.g. val_loss")
    add_common_options(s, "trial")
    s.add_argument("--name", default=None, help="the study's name (default: the graph's); best-save: the saved "
                                                "graph's name")
    s.add_argument("--wait", action="store_true",
                   help="follow the study to its end with a table of its trials; exit 0 if it found a best trial")
    s.add_argument("--yes", "-y", action="store_true", help="stop: do not ask (needed when not on a terminal)")
    s.set_defaults(func=cmd_study)
