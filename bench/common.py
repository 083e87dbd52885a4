"""Shared helpers of the benchmarks: a real control plane process, figures, reports.

Every benchmark starts its own control plane (``python -m cdui start
--foreground``) on a free loopback port with its state in a temporary folder,
measures, prints its figures as a table, and, when ``--json PATH`` is given,
writes them there for ``bench/run_all``. A benchmark always exits 0: a goal
that is missed is a figure to report, not a failure.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# The checkout whose control plane and agent run (default: this one); point it at an
# exported older commit to measure "before" with the same benchmark.
CDUI_ROOT = Path(os.environ.get("CDUI_BENCH_ROOT") or REPO)
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


@dataclass
class Figure:
    """One measured figure against its goal. ``better``: "lower" or "higher"."""

    bench: str
    name: str
    measured: float | None
    unit: str
    goal: float | None = None
    better: str = "lower"
    note: str = ""
    # The machine's load while it was measured (filled in by ``report`` when the benchmark leaves them
    # unset): the 1-minute load average at the end, and the share of all cores that other processes used.
    load1: float | None = None
    others_cpu_pct: float | None = None

    @property
    def ratio(self) -> float | None:
        """measured / goal (for "higher" goals, ≥ 1 meets it; for "lower", ≤ 1 does)."""
        if self.goal in (None, 0) or self.measured is None:
            return None
        return self.measured / self.goal

    @property
    def met(self) -> bool | None:
        if self.goal is None or self.measured is None:
            return None
        return self.measured <= self.goal if self.better == "lower" else self.measured >= self.goal

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "met": self.met}


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


def goal_text(f: Figure) -> str:
    if f.goal is None:
        return "-"
    return ("≤ " if f.better == "lower" else "≥ ") + fmt(f.goal)


def met_text(f: Figure) -> str:
    return {None: "-", True: "yes", False: "**no**"}[f.met]


def load_text(f: Figure) -> str:
    """The machine's load beside a figure: "1-minute load average / other processes' share of all cores"."""
    if f.load1 is None and f.others_cpu_pct is None:
        return "-"
    load = "?" if f.load1 is None else f"{f.load1:.1f}"
    others = "?" if f.others_cpu_pct is None else f"{f.others_cpu_pct:.0f} %"
    return f"{load} / {others}"


class LoadMeter:
    """The machine's load while a benchmark (or one phase of it) ran.

    Two numbers: the 1-minute load average when it ends (it counts this benchmark's own processes too),
    and the share of all cores that *other* processes used meanwhile: the machine's busy CPU time
    (/proc/stat, steal included) less what this process and every process it started used (its live
    descendants read from /proc, the ones it already waited for from its own children's times). Linux
    only; elsewhere both are None."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0 = _machine_busy_s()
        self.own0 = _tree_cpu_s(os.getpid())

    def stop(self) -> tuple[float | None, float | None]:
        """(1-minute load average, other processes' CPU share in percent of all cores) since the start."""
        busy, own = _machine_busy_s(), _tree_cpu_s(os.getpid())
        took = time.monotonic() - self.t0
        others = None
        if busy is not None and own is not None and self.busy0 is not None and self.own0 is not None and took > 0:
            others = max(0.0, (busy - self.busy0) - (own - self.own0)) / (took * (os.cpu_count() or 1)) * 100
        try:
            load1: float | None = os.getloadavg()[0]
        except OSError:
            load1 = None
        return load1, others

    def apply(self, figures: list[Figure]) -> list[Figure]:
        """Set the load on every figure that has none yet."""
        load1, others = self.stop()
        for f in figures:
            if f.load1 is None and f.others_cpu_pct is None:
                f.load1, f.others_cpu_pct = load1, others
        return figures


def _machine_busy_s() -> float | None:
    """CPU seconds every core of the machine spent not idle since boot."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal (guest time is already inside user)
    v = [int(x) for x in first[1:9]]
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int) -> float | None:
    """CPU seconds used by ``root`` and all its descendants, live or already waited for."""
    parent: dict[int, int] = {}
    used: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # utime stime cutime cstime: its own and its waited-for children's
        parent[int(name)] = int(fields[1])
        used[int(name)] = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0)
        todo += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


# Started when the benchmark parses its arguments (or, failing that, when it imports this module).
_METER = LoadMeter()


def report(figures: list[Figure], json_path: str | None) -> None:
    _METER.apply(figures)
    print(f"{'figure':58} {'measured':>12} {'unit':10} {'goal':>10} {'ratio':>7}  met  load")
    for f in figures:
        print(f"{f.name[:58]:58} {fmt(f.measured):>12} {f.unit[:10]:10} {goal_text(f):>10} "
              f"{fmt(f.ratio):>7}  {met_text(f):4} {load_text(f)}" + (f"   ({f.note})" if f.note else ""))
    if json_path:
        Path(json_path).write_text(json.dumps([f.row() for f in figures], indent=1))


# Set by --smoke. Smoke sizes measure nothing; there the control plane is told its devices (cpu) instead of
# probing them at each start in a helper process that imports torch: a second or more of CPU per start, and
# run_all --smoke starts a dozen control planes at once on a machine of two cores.
SMOKE = False


class _Smoke(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        global SMOKE
        SMOKE = True
        setattr(namespace, self.dest, True)


def parser(doc: str | None) -> argparse.ArgumentParser:
    # A benchmark stopped by SIGTERM (run_all's timeout, a user) still stops the processes it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    global _METER
    _METER = LoadMeter()
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--smoke", action=_Smoke, nargs=0, default=False,
                   help="tiny sizes: checks that the benchmark runs, measures nothing")
    p.add_argument("--json", help="also write the figures to this file (bench/run_all uses it)")
    return p


def say(what: str) -> None:
    """Progress on stderr, so a slow phase shows where it is."""
    print(f"[{time.strftime('%H:%M:%S')}] {what}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    i = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[i]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    """Resident set size of one process, in MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    return 0.0


def rss_kib(pid: int) -> float:
    """Resident set size of one process, in KiB."""
    return rss_mb(pid) * 1e6 / 1024


def raise_nofile() -> None:
    """The soft limit on open files up to the hard one: a benchmark with thousands of sockets needs
    as many descriptors (the control plane it starts inherits the limit, and raises its own too)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def cpu_s(pid: int) -> float:
    """User + system CPU seconds used by one process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def imports_torch(pid: int) -> bool:
    """Whether torch's shared library is mapped into the process."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def python() -> str:
    return sys.executable


def base_env(user_data: Path, data_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEFYUI_")}
    env.update({"CODEFYUI_USER_DATA_DIR": str(user_data), "CODEFYUI_DATA_DIR": str(data_dir),
                "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


class Server:
    """A control plane process of its own, on a free loopback port."""

    def __init__(self, root: Path, extra_env: dict[str, str] | None = None) -> None:
        self.root = root
        self.user_data = root / "user_data"
        self.data_dir = root / "data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.extra_env = extra_env or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "server.log"

    def start(self) -> Server:
        self.user_data.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            # CDUI_BENCH_PROFILE=DIR: the control plane runs under cProfile, its profile written to DIR on stop.
            prof = os.environ.get("CDUI_BENCH_PROFILE")
            wrap = ["-m", "cProfile", "-o", str(Path(prof) / f"server-{self.port}.prof")] if prof else []
            self.proc = subprocess.Popen([python(), *wrap, "-m", "cdui", "start", "--foreground", "--host",
                                          "127.0.0.1", "--port", str(self.port)], cwd=CDUI_ROOT,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True,
                                         env=base_env(self.user_data, self.data_dir,
                                                      {**({"CODEFYUI_LOCAL_DEVICES": "cpu"} if SMOKE else {}),
                                                       **self.extra_env}))
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the control plane exited with {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/api/health", timeout=2) as r:
                    if r.status == 200 and (self.user_data / "session-token").exists():
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the control plane did not answer /api/health within 120 s")
            time.sleep(0.05)
        self.token = (self.user_data / "session-token").read_text().strip()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def call(self, method: str, path: str, body: Any = None, timeout: float = 120) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"X-CodefyUI-Token": self.token, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{method} {path} answered {exc.code}: {exc.read()[:500]!r}") from None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


@contextlib.contextmanager
def server(extra_env: dict[str, str] | None = None, keep: bool = False,
           prepare: Callable[[Server], None] | None = None) -> Iterator[Server]:
    """A started control plane in a temporary folder; ``prepare(server)`` runs before it starts (custom nodes
    are read at start: installing them first spares a restart)."""
    with tempfile.TemporaryDirectory(prefix="cdui-bench-", dir=os.environ.get("CDUI_BENCH_TMP")) as tmp:
        s = Server(Path(tmp), extra_env)
        if prepare is not None:
            prepare(s)
        try:
            yield s.start()
        finally:
            s.stop()


def trivial_graph(name: str = "trivial") -> dict[str, Any]:
    """CSVReader -> Print on the bundled iris sample: the trivial graph of the issue."""
    def node(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
        return {"id": nid, "type": ntype, "position": {"x": 0, "y": 0}, "data": {"params": params}}
    return {"format_version": 1, "name": name, "nodes": [
        node("start", "Start"), node("csv", "CSVReader", path="data/samples/iris.csv", target_column="",
                                     skip_header=True), node("print", "Print", label="rows")],
        "edges": [{"id": "t", "source": "start", "sourceHandle": "trigger", "target": "csv", "targetHandle": None,
                   "type": "trigger"},
                  {"id": "d", "source": "csv", "sourceHandle": "tensor", "target": "print", "targetHandle": "value",
                   "type": "data"}]}


def tiny_graph(name: str = "tiny") -> dict[str, Any]:
    """The smallest graph the control plane accepts (fake agents never run it)."""
    return {"format_version": 1, "name": name, "edges": [
        {"id": "t", "source": "start", "sourceHandle": "trigger", "target": "n", "targetHandle": None,
         "type": "trigger"}], "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "n", "type": "TensorCreate", "position": {"x": 0, "y": 0}, "data": {"params": {}}}]}


FLOOD_NODE = '''
import time

from cdui.nodes.base import Node, Param, Port


class Flood(Node):
    """Logs ``count`` events as fast as it can (benchmark only)."""
    NODE_NAME = "Flood"
    CATEGORY = "bench"

    @classmethod
    def define_params(cls):
        return [Param("count", "int", 1000), Param("report_cpu", "bool", False)]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        cpu = time.process_time()
        for i in range(int(params["count"])):
            if i % 1000 == 0 and ctx.should_stop():
                break
            ctx.log(f"event {i}")
        if params.get("report_cpu"):
            # The run process's own CPU for the flood (its flusher thread's included), for the bench to read.
            ctx.log(f"flood cpu {time.process_time() - cpu:.6f}")
        return {"value": float(params["count"])}
'''


def install_flood(data_dir: Path) -> None:
    (data_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (data_dir / "custom_nodes" / "flood.py").write_text(FLOOD_NODE)


def flood_graph(count: int, report_cpu: bool = False) -> dict[str, Any]:
    """``report_cpu``: the node logs one more line, ``flood cpu <seconds>``, its process's CPU for the flood."""
    params: dict[str, Any] = {"count": count, "report_cpu": True} if report_cpu else {"count": count}
    return {"format_version": 1, "name": f"flood {count}", "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "f", "type": "Flood", "position": {"x": 0, "y": 0}, "data": {"params": params}}],
        "edges": [{"id": "t", "source": "start", "sourceHandle": "trigger", "target": "f", "targetHandle": None,
                   "type": "trigger"}]}


class AgentProc:
    """``cdui agent start --foreground`` with its own user data, enrolled on ``srv`` as ``name``."""

    def __init__(self, srv: Server, name: str = "w1", extra_env: dict[str, str] | None = None) -> None:
        self.srv = srv
        self.name = name
        self.extra_env = extra_env or {}
        self.user_data = srv.root / f"agent-{name}"
        self.data_dir = srv.root / f"agent-{name}-data"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProc:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        install_flood(self.data_dir)
        tok = self.srv.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1})["token"]
        # CDUI_BENCH_PROFILE=DIR: the agent too runs under cProfile, its profile written to DIR on stop.
        prof = os.environ.get("CDUI_BENCH_PROFILE")
        wrap = ["-m", "cProfile", "-o", str(Path(prof) / f"agent-{self.name}-{os.getpid()}.prof")] if prof else []
        with open(self.srv.root / f"agent-{self.name}.log", "ab") as log:
            self.proc = subprocess.Popen([python(), *wrap, "-m", "cdui", "agent", "start", "--control", self.srv.url,
                                          "--name", self.name, "--devices", "cpu", "--token", tok, "--foreground"],
                                         cwd=CDUI_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True,
                                         env=base_env(self.user_data, self.data_dir, self.extra_env))
        deadline = time.monotonic() + 120
        while not any(w["name"] == self.name and w["status"] == "online"
                      for w in self.srv.call("GET", "/api/workers")["workers"]):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"agent {self.name} did not come online")
            time.sleep(0.1)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def credential(self) -> str:
        """The worker credential the agent enrolled with (what it sends as its Bearer token)."""
        files = sorted((self.user_data / "agent").glob("*.token"))
        return str(json.loads(files[0].read_text())["credential"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


def wait_run(srv: Server, run_id: str, timeout: float = 600, interval: float = 0.005) -> dict[str, Any]:
    """Poll until the run ended; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        r = srv.call("GET", f"/api/runs/{run_id}")
        if r["status"] in ("succeeded", "failed", "cancelled", "interrupted"):
            return dict(r)
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} is still {r['status']} after {timeout} s")
        time.sleep(interval)


def started_at(srv: Server, run_id: str) -> float | None:
    """When the run subprocess was started: the ``running`` status event's time."""
    for ev in srv.call("GET", f"/api/runs/{run_id}/events?after=0"):
        if ev["kind"] == "status" and ev["data"].get("status") == "running":
            return at_s(ev["at"])
    return None


def at_s(iso: str) -> float:
    """Epoch seconds of an event's ISO 8601 ``at``."""
    from datetime import datetime
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
