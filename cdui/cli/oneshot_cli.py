"""``cdui agent start --one-shot [--instance [ID]] [--run-id ID]``: the command line's part.

The flags are checked before anything is touched (bad flags exit 2); an
instance claims its ID in the user data folder before enrollment (an ID
already running there exits 2 without touching its folder) and gives it back
at exit; the agent itself runs in the foreground with no pidfile, so it never
conflicts with a background agent on the same machine. The exit code is the
agent's (:mod:`cdui.agent.oneshot_agent`).
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdui.agent import instances
from cdui.agent.oneshot_agent import OneShot
from cdui.cli.cli_util import _die, hold_spool
from cdui.core import config, exit_codes, logfile
from cdui.core.config import machine_id
from cdui.core.errors import CduiError
from cdui.run.devices import detect_devices

RUN_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def check_flags(args: argparse.Namespace) -> str | None:
    """Why these flags cannot be run, or None."""
    if args.instance is not None and not args.one_shot:
        return "--instance is only for one-shot agents; add --one-shot"
    if args.run_id is not None and not args.one_shot:
        return "--run-id is only for one-shot agents; add --one-shot"
    if args.run_id is not None and not RUN_ID_RE.match(args.run_id):
        return f"--run-id {args.run_id[:80]!r} is not a run id (the id `cdui run` printed)"
    if args.instance:
        try:
            instances.check_id(args.instance)
        except CduiError as err:
            return f"{err.message} ({err.hint})"
    return None


def claim_instance(args: argparse.Namespace, user_data: Path) -> instances.Instance | int | None:
    """Hold this instance's ID (exit code 2 if another agent holds it), and sweep stale folders."""
    if args.instance is None:
        return None
    try:
        inst = instances.Instance(user_data, args.instance or instances.default_id(os.environ))
        inst.claim()
    except CduiError as err:
        return _die(f"{err.message}; {err.hint}" if err.hint else err.message, exit_codes.REFUSED)
    atexit.register(inst.release)
    for gone in inst.sweep_stale():
        print(f"cdui: removed the folder of instance {gone}: no agent held it and nothing in it changed for 24 h",
              flush=True)
    args.instance_claim = inst
    return inst


def run_one_shot(args: argparse.Namespace, cfg: Any, control: str, cred: dict[str, Any], devices: list[str] | None,
                 labels: Callable[[], dict[str, str]], checks: tuple[Any, Callable[[], None]] | None = None) -> int:
    from cdui.agent.agent import Agent, serve
    # stderr, as ever (a batch job's output file), and the newest lines for `cdui logs --worker`; SIGHUP keeps
    # its default, which ends a one-shot agent whose ssh session or job step hung up.
    logfile.setup(None, 0, 1, hup=False)
    config.warn_unavailable(logging.getLogger("cdui.agent.agent"))
    inst: instances.Instance | None = getattr(args, "instance_claim", None)
    one = OneShot(instance=inst.id if inst is not None else None, run_id=args.run_id)
    # An instance keeps its spool, run folders and cache in its own folder; the credential is shared.
    user_data = inst.folder if inst is not None else cfg.user_data
    # Two jobs with one credential in one folder: the second is refused here (exit 2), before it
    # reads the first one's spool, as the control plane would refuse its name.
    held = hold_spool(user_data, control, cred)
    if isinstance(held, int):
        return held
    try:
        agent = Agent(control, cred["credential"], cred["name"], devices or detect_devices(), user_data,
                      machine_id(), labels=labels, status_file=None, config=cfg, one_shot=one,
                      trust=checks[0] if checks else None, on_connected=checks[1] if checks else None)
        what = f"instance {cred['name']}.{inst.id}" if inst is not None else f"worker {cred['name']}"
        logging.getLogger("cdui.agent.agent").info("one-shot agent %s: waiting for one run", what)
        return asyncio.run(serve(agent))
    finally:
        held.release()


def list_lines(w: dict[str, Any]) -> list[str]:
    """``cdui workers list``: a one-shot worker's run, then its credential's instances."""
    out = []
    if w.get("one_shot"):
        out.append(f"  one-shot, {w.get('one_shot_note') or ''}")
    inst = w.get("instances") or {}
    if inst.get("live") or inst.get("departed"):
        out.append(f"  instances: {inst['connected']} connected, {inst['running']} running")
        for c in inst.get("live", []):
            out.append(f"    {c['name']:<24} online    runs: {', '.join(c['runs']) or '-'}; from {c['address']}")
        for d in inst.get("departed", []):
            took = f"took run {d['run']}" if d["run"] else d["note"]
            out.append(f"    {d['name']:<24} left {d['left_at']}; {took}")
    return out
