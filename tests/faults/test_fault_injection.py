"""The fault-injection suite: a real control plane, a real agent between them a
loopback proxy the test controls, and 50 seeded iterations of a run that emits
numbered events and writes files, each hit by one fault at a seeded random point.

Faults: the network cut (connections dropped, new ones refused), reset (RST),
stalled (nothing delivered), slow, or answered 503 by a "reverse proxy"; the
agent killed with SIGKILL or stopped with SIGTERM; the control plane killed
with SIGKILL or stopped with SIGTERM. The point is the tick the run has
reached in the agent's spool when the fault strikes.

Every iteration checks its run against what docs/remote-workers.md and
docs/architecture.md promise:

- the run ends in the documented state: ``succeeded`` after a network fault
  or a control-plane kill (the run is adopted and resumes), ``interrupted``
  after the agent was killed (it comes back without the run), ``cancelled``
  after SIGTERM to either side (the run is stopped in time);
- its event log is gapless (``seq`` 1..n) and holds every tick once, in
  order: nothing the agent had spooled is lost, nothing is repeated;
- every artifact the control plane lists is there with the sha256 the run
  wrote, and every file whose artifact event is in the log of a run that its
  worker ended is listed.

The seed is printed; ``CDUI_FAULT_SEED`` changes it, ``CDUI_FAULT_ONLY=7``
replays iteration 7 alone, ``CDUI_FAULT_ITERATIONS`` changes the count.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from probe import content_sha, expected_files, install, probe_graph

from cdui.core.paths import sha256_file
from procs import TERMINAL, Proc, ServerProc, env_for, spool_dir, wait_for, wait_run
from tcpproxy import TcpProxy

pytestmark = pytest.mark.e2e

BASE_SEED = int(os.environ.get("CDUI_FAULT_SEED", "9009"))
ITERATIONS = int(os.environ.get("CDUI_FAULT_ITERATIONS", "50"))
ONLY = os.environ.get("CDUI_FAULT_ONLY")
NETWORK = ("cut", "reset", "stall", "slow", "proxy_503")
# How often each fault appears in 50 iterations; restarts of the control plane cost
# seconds each (it probes its devices), network faults far less.
WEIGHTS = {"cut": 7, "reset": 6, "stall": 6, "slow": 5, "proxy_503": 6, "agent_kill9": 6, "agent_term": 5,
           "cp_kill9": 5, "cp_term": 4}
# Runs that a fault must catch in the middle (the stop and kill of the agent, the stop
# of the control plane) tick practically for ever: the documented ending is then the
# only one possible, whatever the machine's speed.
ENDLESS = 10 ** 6
EVENTS, INTERVAL, FILES, SIZE = 60, 0.015, 3, 24 * 1024


@dataclass
class Plan:
    index: int
    seed: int
    kind: str
    events: int
    tick: int           # the fault strikes once the agent has spooled this tick
    hold: float = 0.0   # how long a cut, stall or 503 lasts (s)
    rate: float = 0.0   # bytes/s of a slow link

    def describe(self) -> str:
        extra = f" hold={self.hold:.2f}s" if self.hold else ""
        extra += f" rate={self.rate:.0f}B/s" if self.rate else ""
        return f"iteration {self.index} seed={self.seed} fault={self.kind} at tick {self.tick}{extra}"


def schedule(base_seed: int, n: int) -> list[Plan]:
    rng = random.Random(base_seed)
    kinds = [k for k, w in WEIGHTS.items() for _ in range(w)]
    while len(kinds) < n:
        kinds += kinds
    rng.shuffle(kinds)
    plans = []
    for i in range(n):
        seed = base_seed * 1000 + i
        r = random.Random(seed)
        kind = kinds[i]
        endless = kind in ("agent_kill9", "agent_term", "cp_term")
        events = ENDLESS if endless else EVENTS
        tick = r.randint(2, 40) if endless else r.randint(2, EVENTS)
        hold = 0.0
        if kind == "stall":  # past 3 s the control plane's heartbeat watchdog drops the connection too
            hold = round(r.uniform(0.5, 4.0), 2)
        elif kind in ("cut", "proxy_503"):
            hold = round(r.uniform(0.2, 2.0), 2)
        rate = float(r.randint(20_000, 200_000)) if kind == "slow" else 0.0
        plans.append(Plan(i, seed, kind, events, tick, hold, rate))
    return plans


@dataclass
class Tally:
    iterations: int = 0
    events_checked: int = 0
    lost: int = 0
    duplicated: int = 0
    files_checked: int = 0
    missing: int = 0
    endings: Counter[str] = field(default_factory=Counter)

    def line(self) -> str:
        return (f"iterations={self.iterations} events_checked={self.events_checked} lost={self.lost} "
                f"duplicated={self.duplicated} files_checked={self.files_checked} missing={self.missing}")


class Rig:
    """The control plane, the proxy the agent reaches it through, and the agent."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cp = ServerProc(tmp, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1",
                                             "CODEFYUI_WORKER_RESUME_GRACE_S": "60"})
        install(self.cp.data_dir)
        self.cp.start()
        # While the control plane restarts, the proxy holds new connections (socket activation).
        self.proxy = TcpProxy(self.cp.port, upstream_wait=120)
        self.agent_ud = tmp / "agent-ud"
        agent_data = tmp / "agent-data"
        install(agent_data)
        tok = self.cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
        # Another machine id: the agent has no `data` mount, so the files travel by the transfer backend.
        env = env_for(self.agent_ud, agent_data, {"CODEFYUI_MACHINE_ID": "fault-suite-worker"})
        self.agent = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", self.proxy.url,
                           "--name", "w1", "--devices", "cpu", "--foreground", "--token", tok],
                          env, tmp / "agent.log", name="agent")
        self._log_mark = 0
        self.start_agent()

    def start_agent(self) -> None:
        self._log_mark = len(self.agent.log_text())
        self.agent.spawn()

    def reconnects(self) -> int:
        """How often the running agent has waited to reconnect since it started."""
        return self.agent.log_text()[self._log_mark:].count("reconnecting in")

    def wait_online(self) -> None:
        def online() -> bool:
            if not self.agent.alive:
                raise AssertionError(f"the agent exited with {self.agent.returncode}")
            w = [w for w in self.cp.call("GET", "/api/workers", expect=200)["workers"] if w["name"] == "w1"]
            return bool(w and w[0]["online"] and not w[0]["runs"])
        wait_for(online, 120, 0.05, "worker w1 online and idle")

    def fresh_backoff(self) -> None:
        """The agent's reconnect delay doubles with every reconnect (1, 2, 4, 8 s ...) and starts
        again only after a connection that stayed up a minute; the iterations here come faster
        than that. An idle agent whose next delay would reach 16 s is restarted, so each
        iteration waits at most about 8 s for its reconnect (cdui/core/backoff.py). Waiting is
        cheaper than a restart, which costs an interpreter importing torch for the node catalog,
        and the agent's zygote with it (the next run waits for a new zygote to import torch):
        about 8 s of CPU, on a machine whose CPUs the other tests share."""
        if self.reconnects() > 3:
            assert self.agent.stop() == 0, self.agent.log_tail()
            self.start_agent()

    def spool_events(self, run_id: str) -> list[dict[str, Any]] | None:
        """The events the agent has spooled for the run (None once the folder is gone): its events and the
        run's lines it passed through as written (the header line of such a block is not an event)."""
        try:
            text = (spool_dir(self.agent_ud, run_id) / "events.jsonl").read_text(encoding="utf-8")
        except OSError:
            return None
        out = []
        for line in text.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # the line being appended right now
            if "kind" in ev:
                out.append(ev)
        return out

    def spooled_ticks(self, run_id: str) -> list[int]:
        return [e["data"]["tick"] for e in self.spool_events(run_id) or [] if e["kind"] == "progress"]

    def wait_tick(self, run_id: str, tick: int) -> None:
        """Until the agent has spooled ``tick`` of the run, or the run has ended on the control plane."""
        def reached() -> bool:
            ticks = self.spooled_ticks(run_id)
            if ticks and ticks[-1] >= tick:
                return True
            return not ticks and self.cp.run(run_id)["status"] in TERMINAL
        wait_for(reached, 120, 0.005, f"run {run_id} to reach tick {tick}")

    def close(self) -> None:
        self.agent.stop()
        self.proxy.close()
        self.cp.stop()


def inject(rig: Rig, plan: Plan, run_id: str) -> dict[str, Any]:
    """Strike with the planned fault once the run reaches its tick; bring the system back.
    Returns what the checks need to know of the moment (e.g. what the agent had spooled)."""
    seen: dict[str, Any] = {}
    if plan.kind == "slow":  # the whole run over a slow link
        rig.proxy.rate = plan.rate
    rig.wait_tick(run_id, plan.tick)
    seen["spooled_at_fault"] = len(rig.spooled_ticks(run_id))
    if plan.kind == "cut":
        rig.proxy.cut()
        wait_hold(plan.hold)
        rig.proxy.restore()
    elif plan.kind == "reset":
        rig.proxy.reset()
    elif plan.kind == "stall":
        rig.proxy.freeze()
        wait_hold(plan.hold)
        rig.proxy.restore()
    elif plan.kind == "proxy_503":
        rig.proxy.answer_503()
        wait_hold(plan.hold)
        rig.proxy.restore()
    elif plan.kind == "slow":
        wait_run(rig.cp, run_id, timeout=180)
        rig.proxy.restore()
    elif plan.kind == "agent_kill9":
        rig.agent.kill9()
        # What the agent made durable before it died: all of it must reach the log.
        seen["spooled_at_fault"] = len(rig.spooled_ticks(run_id))
        rig.start_agent()
    elif plan.kind == "agent_term":
        assert rig.agent.proc is not None
        rig.agent.proc.send_signal(signal.SIGTERM)
        rc = rig.agent.proc.wait(120)
        assert rc == 0, f"the agent exited {rc} after SIGTERM:\n{rig.agent.log_tail(30)}"
        rig.start_agent()
    elif plan.kind == "cp_kill9":
        rig.cp.kill9()
        rig.cp.start()
    elif plan.kind == "cp_term":
        assert rig.cp.proc is not None
        rig.cp.proc.send_signal(signal.SIGTERM)
        rc = rig.cp.proc.wait(120)
        assert rc == 0, f"the control plane exited {rc} after SIGTERM:\n{rig.cp.log_tail(30)}"
        rig.cp.start()
    else:  # pragma: no cover - the schedule names only the kinds above
        raise AssertionError(f"unknown fault {plan.kind}")
    return seen


def wait_hold(seconds: float) -> None:
    """The fault itself lasts this long: the outage is the test's input, not a synchronisation."""
    time.sleep(seconds)


def expected_ending(plan: Plan) -> str:
    return {"agent_kill9": "interrupted", "agent_term": "cancelled", "cp_term": "cancelled"}.get(plan.kind,
                                                                                                 "succeeded")


def file_sha(plan: Plan, name: str) -> str | None:
    """The sha256 the probe gave the file it named ``name`` (None: not a file it writes)."""
    if name == "checkpoint.bin":
        return content_sha(plan.seed, 0, SIZE)
    if name.startswith("f") and name.endswith(".bin") and name[1:-4].isdigit():
        return content_sha(plan.seed, int(name[1:-4]), SIZE)
    return None


def check(rig: Rig, plan: Plan, run_id: str, seen: dict[str, Any], tally: Tally) -> list[str]:
    """Every promise for one run; returns the broken ones (and counts into ``tally``)."""
    cp = rig.cp
    problems: list[str] = []
    run = wait_run(cp, run_id, timeout=180)
    tally.endings[run["status"]] += 1
    want = expected_ending(plan)
    if run["status"] != want:
        problems.append(f"ended {run['status']!r} ({run.get('error')}), documented: {want!r}")
    if run.get("late_result") is not None:  # every ending here is the worker's own, stored once
        problems.append(f"late_result {run['late_result']} on a run its worker ended itself")
    if plan.kind == "agent_kill9" and "reconnected without the run" not in (run.get("error") or ""):
        problems.append(f"interrupted with {run.get('error')!r}, not 'reconnected without the run'")

    evs = cp.events(run_id)
    if [e["seq"] for e in evs] != list(range(1, len(evs) + 1)):
        problems.append(f"seq is not gapless from 1: {[e['seq'] for e in evs][:20]}...")
    ticks = [e["data"]["tick"] for e in evs if e["kind"] == "progress"]
    counts = Counter(ticks)
    dups = sum(c - 1 for c in counts.values() if c > 1)
    top = max(ticks, default=0)
    if run["status"] == "succeeded":
        top = plan.events
    elif plan.kind in ("agent_kill9", "agent_term", "cp_term"):
        top = max(top, seen.get("spooled_at_fault", 0))
    gaps = [t for t in range(1, top + 1) if t not in counts]
    lost = len(gaps)
    if lost:
        problems.append(f"{lost} tick(s) lost of 1..{top}: first {gaps[:5]}")
    if dups:
        problems.append(f"{dups} duplicated tick(s): {[t for t, c in counts.items() if c > 1][:5]}")
    if ticks != sorted(ticks):
        problems.append("ticks are out of order")
    tally.events_checked += len(ticks)
    tally.lost += lost
    tally.duplicated += dups

    rows = cp.call("GET", f"/api/runs/{run_id}/artifacts", expect=200)
    missing = 0
    for row in rows:
        tally.files_checked += 1
        path = Path(row["path"])
        want_sha = file_sha(plan, row["name"])
        if row["backend"] != "transfer" or not path.is_relative_to(cp.data_dir):
            problems.append(f"artifact row {row} is not a transfer file in the data folder")
            missing += 1
        elif not path.is_file():
            problems.append(f"artifact {row['name']} is listed at {path}, which does not exist")
            missing += 1
        elif not (sha256_file(path)[1] == row["sha256"] == want_sha):
            problems.append(f"artifact {row['name']}: file sha256 {sha256_file(path)[1]}, row {row['sha256']}, "
                            f"written {want_sha}")
            missing += 1
    names = Counter(r["name"] for r in rows)
    if any(c > 1 for c in names.values()):
        problems.append(f"a file is listed twice: {names}")
    # The files the control plane must have: all of them after a success; after a stop, every
    # one whose artifact event is in the log (its worker uploaded them before reporting the end).
    if run["status"] == "succeeded":
        required = [f"f{t:05d}.bin" for t in expected_files(plan.events, FILES)] + ["checkpoint.bin"]
    elif run["status"] == "cancelled":
        required = [e["data"]["name"] for e in evs if e["kind"] == "artifact"]
    else:  # killed with its agent: what it wrote stays in the worker's run folder (see docs/fault-injection.md)
        required = []
    for name in required:
        tally.files_checked += 1
        if name not in names:
            problems.append(f"{name} was reported by the run but is not among its artifacts")
            missing += 1
    tally.missing += missing
    return problems


# About 5 minutes on 2 cores; the per-test limit of pyproject.toml (300 s) is for single tests, and
# .ci/run runs this beside other tests (pytest-xdist), on CPUs other jobs may share.
@pytest.mark.long
@pytest.mark.timeout(1800)
def test_fifty_seeded_faults_lose_no_event_and_no_file(tmp_path, capsys):
    plans = schedule(BASE_SEED, ITERATIONS)
    if ONLY is not None:
        plans = [plans[int(ONLY)]]
    with capsys.disabled():
        print(f"\nfault suite: seed {BASE_SEED}, {len(plans)} iteration(s) "
              f"(reproduce one: CDUI_FAULT_SEED={BASE_SEED} CDUI_FAULT_ONLY=N)")
    rig = Rig(tmp_path)
    tally = Tally()
    started = time.monotonic()
    try:
        for plan in plans:
            t_it = time.monotonic()
            rig.fresh_backoff()
            rig.wait_online()
            graph = probe_graph(plan.events, INTERVAL, FILES, SIZE, plan.seed, f"fault/{plan.seed}")
            run = rig.cp.submit(graph, {"target": {"worker": "w1"}})
            try:
                seen = inject(rig, plan, run["id"])
                problems = check(rig, plan, run["id"], seen, tally)
            except AssertionError as exc:
                problems = [f"{type(exc).__name__}: {exc}"]
            tally.iterations += 1
            status = rig.cp.run(run["id"])["status"] if rig.cp.alive else "?"
            print(f"{plan.describe()}: run {run['id']} {status} after {time.monotonic() - t_it:.1f} s")
            assert not problems, (f"{plan.describe()} (run {run['id']}; reproduce with CDUI_FAULT_SEED={BASE_SEED} "
                                  f"CDUI_FAULT_ONLY={plan.index}):\n  " + "\n  ".join(problems)
                                  + f"\n{tally.line()}")
    finally:
        with capsys.disabled():
            print(f"fault suite: {tally.line()} endings={dict(tally.endings)} "
                  f"in {time.monotonic() - started:.0f} s")
        rig.close()
    assert tally.iterations == len(plans)
    assert tally.lost == 0 and tally.missing == 0 and tally.duplicated == 0, tally.line()
