"""Process helpers for tests that drive cdui as a user would: real processes,
real ports, real files.

- :func:`free_port`, :func:`env_for`, :func:`wait_for` are plain helpers.
- :class:`Proc` starts one command in its own process group with its output
  in a log file, and always ends it (``stop`` asks with SIGTERM, ``kill9``
  kills the whole group). Agents and other long-running commands reuse it.
- :class:`ServerProc` is a ``python -m cdui start --foreground`` server with
  its own user data and data dirs; ``api`` / ``raw`` / ``upload`` talk to it
  over HTTP with the session token it wrote.

Every process started here is remembered, so a failing test can show the
tail of each log (see :class:`LogSectionsPlugin`, registered by conftest).

Leftover processes (see :class:`ProcessSweep`): every process a test session
starts carries ``CDUI_TEST_SESSION`` in its environment (set by conftest and
inherited by servers, agents and their run subprocesses), so one left behind
is found even after its parent died and it was reparented away from pytest;
a descendant of the pytest process is found by its parent chain. conftest
ends, after each test (and each module), what that test started and left
running; processes that a longer-lived fixture owns survive.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

# The project's own check (a zombie is dead, another user's process alive), re-exported for the tests.
from cdui.core.pids import pid_alive as pid_alive
from cdui.run.spare import live_pools, spare_pids

REPO_ROOT = Path(__file__).resolve().parent.parent
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "interrupted"})
_ALL: list[Proc] = []
# Processes of session-scoped fixtures that are not Procs (the moto server of tests/s3server.py): no test's or
# module's leftover sweep ends them, whichever test first asked for the fixture (a module's sweep begins at
# its first test, so a session server a later test of that module started looked like the module's leftover).
KEEP: set[int] = set()
_LOGS: dict[Path, str] = {}  # log files of processes not started here (e.g. `cdui start` in the background)
SESSION_ENV = "CDUI_TEST_SESSION"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(user_data: Path | str, data_dir: Path | str | None = None,
            extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a cdui process whose state lives in ``user_data``
    (and data folders in ``data_dir``); no CODEFYUI_* setting leaks in from
    the environment the tests were started from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEFYUI_")}
    env["CODEFYUI_USER_DATA_DIR"] = str(user_data)
    if data_dir is not None:
        env["CODEFYUI_DATA_DIR"] = str(data_dir)
    env["PYTHONUNBUFFERED"] = "1"
    # The control plane's own devices, as its probe finds them on a machine without CUDA; the probe
    # (a helper that imports torch, seconds of CPU at every start of a server) has tests of its own
    # (tests/test_device_probe.py). A test may set another value, or "" to probe.
    env["CODEFYUI_LOCAL_DEVICES"] = "cpu"
    env.update(extra or {})
    return env


def spool_dir(user_data: Path | str, run_id: str) -> Path:
    """A run's folder in an agent's spool: ``spool/<host>-<port>/<run id>/``, one spool per
    control plane the folder has a credential for (a path that does not exist if none holds it)."""
    found = sorted(Path(user_data, "spool").glob(f"*/{run_id}"))
    return found[0] if found else Path(user_data, "spool", "-", run_id)


def track_log(path: Path | str, name: str) -> None:
    """Show this log's tail in the report of a failing test (until untracked)."""
    _LOGS[Path(path)] = name


def untrack_log(path: Path | str) -> None:
    _LOGS.pop(Path(path), None)


def wait_for(predicate: Callable[[], Any], timeout: float = 120, interval: float = 0.1,
             what: str = "a condition", detail: Callable[[], Any] | None = None) -> Any:
    """Poll ``predicate`` until it returns something truthy; return that.

    Fails with ``what`` (and ``detail()``, evaluated at the end) when
    ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = ""
            if detail is not None:
                try:
                    extra = f"; last state: {detail()}"
                except Exception as exc:  # the detail is a courtesy; never hide the timeout
                    extra = f"; (detail failed: {exc!r})"
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(interval)


class Proc:
    """One command in its own process group, output in ``log_path``."""

    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path,
                 cwd: Path | str = REPO_ROOT, name: str | None = None) -> None:
        self.cmd = cmd
        self.env = env
        self.log_path = Path(log_path)
        self.cwd = str(cwd)
        self.name = name or Path(cmd[0]).name
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.stopped_at: float | None = None
        _ALL.append(self)

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== {time.strftime('%H:%M:%S')} start: {' '.join(self.cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = time.time()
        self.stopped_at = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM to the process (graceful), wait; SIGKILL the group if it
        does not end in ``timeout`` seconds. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait(30)
        # Whatever it left behind in its group (run subprocesses have their own
        # sessions and are the server's job, checked by the tests themselves).
        self._signal_group(signal.SIGKILL)
        self.stopped_at = time.time()
        return self.proc.returncode

    def kill9(self) -> None:
        """SIGKILL the process group at once (a crash, a power cut)."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        self.stopped_at = time.time()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


# -- leftover processes -------------------------------------------------------------
def mark_session() -> str:
    """Give this pytest process (and so everything it starts) a session marker."""
    value = f"{os.getpid()}-{secrets.token_hex(8)}"
    os.environ[SESSION_ENV] = value
    return value


ProcKey = tuple[int, int]  # (pid, start time in clock ticks): a pid alone can be reused


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, start time, state) of every process visible in /proc."""
    table: dict[int, tuple[int, int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while we looked
        table[int(entry)] = (int(fields[1]), int(fields[19]), fields[0])
    return table


def cmdlines() -> Iterator[tuple[int, bytes]]:
    """(pid, raw command line, NUL-separated) of every process visible in /proc."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    yield int(entry), fh.read()
            except OSError:
                continue  # ended while we looked


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return marker in fh.read().split(b"\0")
    except OSError:
        return False


def session_processes(marker: str | None = None) -> dict[int, tuple[int, int]]:
    """Live processes of this test session: pid -> (parent pid, start time).

    A process belongs to the session if it carries the session marker or its
    parent chain leads to this pytest process. Zombies are left out (dead)."""
    me = os.getpid()
    mark = f"{SESSION_ENV}={marker or os.environ.get(SESSION_ENV, '')}".encode()
    table = _proc_table()
    out: dict[int, tuple[int, int]] = {}
    for pid, (ppid, start, state) in table.items():
        if pid == me or state in ("Z", "X"):
            continue
        chain, p, hops = False, ppid, 0
        while p > 1 and hops < 64:
            if p == me:
                chain = True
                break
            p, hops = table.get(p, (0, 0, ""))[0], hops + 1
        if chain or _has_marker(pid, mark):
            out[pid] = (ppid, start)
    return out


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"pid {pid}: {cmd[:200]}"


class AgentProc(Proc):
    """A real agent (``python -m cdui agent start --foreground``) enrolling with ``token`` at ``control``, its
    user data and data folders under ``tmp`` by its name; ``prepare`` is given its data folder first (to
    install custom nodes there)."""

    def __init__(self, tmp: Path, control: str, token: str, name: str = "w2", mount: str | None = None,
                 machine: str = "another-machine", prepare: Callable[[Path], None] | None = None) -> None:
        self.user_data = tmp / f"agent-{name}"
        self.data_dir = tmp / f"agent-{name}-data"
        if prepare is not None:
            prepare(self.data_dir)
        cmd = [sys.executable, "-m", "cdui", "agent", "start", "--control", control, "--token", token,
               "--name", name, "--devices", "cpu", "--foreground"]
        if mount is not None:
            cmd += ["--mount", f"data={mount}"]
        super().__init__(cmd, env_for(self.user_data, self.data_dir, {"CODEFYUI_MACHINE_ID": machine}),
                         tmp / f"agent-{name}.log", name=f"agent-{name}")

    @property
    def credential(self) -> str:
        files = list((self.user_data / "agent").glob("*.token"))
        return str(json.loads(files[0].read_text())["credential"])


class ProcessSweep:
    """What was running when a scope (a test, a module) began, so that its end
    can find what the scope started and left running.

    Kept alive at the end: processes that were already running at the start,
    the current process of every :class:`Proc` created before the start (a
    module's server that a test restarted), and any descendant of those (a
    module server's run subprocesses are that server's to end)."""

    def __init__(self) -> None:
        self.before: set[ProcKey] = {(pid, st) for pid, (_, st) in session_processes().items()}
        self.procs_before = list(_ALL)
        # An in-process server of a module keeps its warm spare run process across tests; a spare
        # of a pool made during this scope is this scope's to end, as any process it started.
        self.pools_before = live_pools()

    def leftovers(self) -> dict[int, tuple[int, int]]:
        now = session_processes()
        owners = {pid for pid, (_, st) in now.items() if (pid, st) in self.before}
        owners |= {p.pid for p in self.procs_before if p.alive and p.pid is not None}
        owners |= spare_pids(self.pools_before)
        owners |= KEEP

        def owned(pid: int) -> bool:
            hops = 0
            while pid in now and hops < 64:
                if pid in owners:
                    return True
                pid, hops = now[pid][0], hops + 1
            return False
        return {pid: v for pid, v in now.items() if not owned(pid)}

    def end_leftovers(self, timeout: float = 20) -> list[str]:
        """SIGTERM every leftover, SIGKILL what is still alive after ``timeout``
        seconds; return a line per process ended, saying how."""
        left = self.leftovers()
        if not left:
            return []
        names = {pid: _describe(pid) for pid in left}
        for pid in left:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        alive = set(left)
        while alive and time.monotonic() < deadline:
            _reap(alive)
            alive = {pid for pid in alive if _same_process(pid, left[pid][1])}
            if alive:
                time.sleep(0.05)  # polling for their exit, bounded by the deadline above
        for pid in alive:
            _signal(pid, signal.SIGKILL)
        dying, deadline = set(alive), time.monotonic() + 30
        while dying and time.monotonic() < deadline:
            dying = {pid for pid in dying if _same_process(pid, left[pid][1])}
            if dying:
                time.sleep(0.05)  # SIGKILL takes effect asynchronously; poll, bounded
        _reap(set(left))
        return [f"{names[pid]} ({'SIGKILL' if pid in alive else 'SIGTERM'})" for pid in sorted(left)]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _same_process(pid: int, start: int) -> bool:
    """``pid`` is still the process that started at ``start`` and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[19]) == start and fields[0] not in ("Z", "X")


def _reap(pids: set[int]) -> None:
    """Collect the exit status of those that are our own children, so they do
    not stay zombies (Proc objects get theirs through Popen)."""
    by_pid = {p.pid: p for p in _ALL if p.proc is not None}
    for pid in pids:
        if pid in by_pid:
            by_pid[pid].proc.poll()  # type: ignore[union-attr]
            continue
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


class HttpResult:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class _PortTaken(Exception):
    """The server could not bind its port: another process holds it."""


class ServerProc(Proc):
    """``python -m cdui start --foreground`` with state in ``tmp``.

    ``tmp/user_data`` and ``tmp/data`` are the server's dirs unless given;
    the log is ``tmp/<name>.log``."""

    def __init__(self, tmp: Path, name: str = "server", port: int | None = None,
                 user_data: Path | None = None, data_dir: Path | None = None,
                 extra_env: dict[str, str] | None = None, host: str = "127.0.0.1") -> None:
        self.tmp = Path(tmp)
        self.user_data = Path(user_data or self.tmp / "user_data")
        self.data_dir = Path(data_dir or self.tmp / "data")
        self.port = port or free_port()
        self.port_picked = port is None  # picked here, so another may be picked if someone takes it first
        self.host = host
        self.extra_env = dict(extra_env or {})
        cmd = [sys.executable, "-m", "cdui", "start", "--foreground", "--host", host, "--port", str(self.port)]
        super().__init__(cmd, {}, self.tmp / f"{name}.log", name=name)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return (self.user_data / "session-token").read_text().strip()

    @property
    def db_path(self) -> Path:
        return self.user_data / "cdui.sqlite3"

    def start(self, extra_env: dict[str, str] | None = None, timeout: float = 120) -> ServerProc:
        if extra_env:
            self.extra_env.update(extra_env)
        self.user_data.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.env = env_for(self.user_data, self.data_dir, self.extra_env)
        for attempt in range(5):
            self.spawn()
            try:
                wait_for(self._healthy, timeout, 0.1, f"{self.name} to answer /api/health on {self.url}",
                         detail=lambda: self.log_tail(20))
                return self
            except _PortTaken:
                # free_port's port was free when picked; another test's process (in another xdist worker)
                # may bind it before this server does. Only a port picked here is picked again.
                if not self.port_picked or attempt == 4:
                    raise AssertionError(f"{self.name}: port {self.port} is taken; log tail:\n"
                                         f"{self.log_tail(30)}") from None
                self.port = free_port()
                self.cmd[self.cmd.index("--port") + 1] = str(self.port)
        raise AssertionError("unreachable")

    def _healthy(self) -> bool:
        """This server answers /api/health: it wrote server.json (only once its port is bound) with its
        own pid, so an answer from another process that holds the port never counts."""
        if not self.alive:
            if "address already in use" in self.log_tail(5):
                raise _PortTaken()
            raise AssertionError(f"server exited during start with code {self.returncode}; "
                                 f"log tail:\n{self.log_tail(30)}")
        try:
            info = json.loads((self.user_data / "server.json").read_text())
        except (OSError, ValueError):
            return False
        if info.get("pid") != self.pid:
            return False
        try:
            r = self.raw("GET", "/api/health", token=False, timeout=2)
        except OSError:
            return False
        # 503: up but degraded (a test may start a server on a full disk)
        return r.status in (200, 503) and (self.user_data / "session-token").exists()

    def restart(self, extra_env: dict[str, str] | None = None) -> ServerProc:
        self.stop()
        return self.start(extra_env)

    # -- HTTP ---------------------------------------------------------------
    def raw(self, method: str, path: str, data: bytes | None = None, token: bool | str = True,
            headers: dict[str, str] | None = None, timeout: float = 60) -> HttpResult:
        hdrs = dict(headers or {})
        if token is True:
            hdrs["X-CodefyUI-Token"] = self.token
        elif isinstance(token, str):
            hdrs["X-CodefyUI-Token"] = token
        req = urllib.request.Request(self.url + path, data=data, method=method.upper(), headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return HttpResult(resp.status, dict(resp.headers.items()), resp.read())
        except urllib.error.HTTPError as exc:
            return HttpResult(exc.code, dict(exc.headers.items()), exc.read())

    def api(self, method: str, path: str, body: Any = None, token: bool | str = True,
            headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, Any]:
        """Call the JSON API; returns (status, parsed JSON or None)."""
        hdrs = dict(headers or {})
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        r = self.raw(method, path, data, token, hdrs, timeout)
        try:
            return r.status, r.json()
        except ValueError:
            raise AssertionError(f"{method} {path} answered {r.status} with a body that is not JSON: "
                                 f"{r.body[:300]!r}") from None

    def call(self, method: str, path: str, body: Any = None, expect: int | Iterable[int] = (200, 201)) -> Any:
        """``api`` that fails the test unless the status is expected."""
        status, parsed = self.api(method, path, body)
        ok = {expect} if isinstance(expect, int) else set(expect)
        assert status in ok, f"{method} {path} answered {status}, expected {sorted(ok)}: {parsed}"
        return parsed

    def upload(self, kind: str, filename: str, content: bytes, field: str = "file",
               token: bool | str = True) -> tuple[int, Any]:
        """multipart/form-data upload to ``/api/{kind}/upload``."""
        boundary = "----cdui" + uuid.uuid4().hex
        # A quoted-string: backslash and quote are escaped, as browsers and curl do.
        filename = filename.replace("\\", "\\\\").replace('"', '\\"')
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"{filename}\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode()
        body += content + f"\r\n--{boundary}--\r\n".encode()
        r = self.raw("POST", f"/api/{kind}/upload", body, token,
                     {"Content-Type": f"multipart/form-data; boundary={boundary}"})
        try:
            return r.status, r.json()
        except ValueError:
            return r.status, r.body

    # -- runs ---------------------------------------------------------------
    def submit(self, graph: dict[str, Any], options: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.call("POST", "/api/runs", {"graph": graph, "options": options or {}}, expect=201)

    def run(self, run_id: str) -> dict[str, Any]:
        return self.call("GET", f"/api/runs/{run_id}", expect=200)

    def events(self, run_id: str, after: int = 0) -> list[dict[str, Any]]:
        return self.call("GET", f"/api/runs/{run_id}/events?after={after}", expect=200)


def wait_run(server: ServerProc, run_id: str, statuses: Iterable[str] = TERMINAL,
             timeout: float = 180) -> dict[str, Any]:
    """Wait until the run's status is one of ``statuses``; return the run."""
    wanted = set(statuses)
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        status, run = server.api("GET", f"/api/runs/{run_id}")
        assert status == 200, f"GET /api/runs/{run_id} answered {status}: {run}"
        last["run"] = run
        return run if run["status"] in wanted else None

    def detail() -> str:
        evs = server.events(run_id)
        tail = [(e["seq"], e["kind"], e["data"]) for e in evs[-8:]]
        return f"run {last.get('run')}; last events {tail}"
    return wait_for(check, timeout, 0.2, f"run {run_id} to reach {sorted(wanted)}", detail=detail)


def wait_event(server: ServerProc, run_id: str, predicate: Callable[[dict[str, Any]], bool],
               timeout: float = 120, what: str = "an event") -> dict[str, Any]:
    """Wait until the run has an event matching ``predicate``; return it."""
    def check() -> dict[str, Any] | None:
        for ev in server.events(run_id):
            if predicate(ev):
                return ev
        return None
    return wait_for(check, timeout, 0.2, f"{what} in run {run_id}",
                    detail=lambda: [(e["kind"], e["data"]) for e in server.events(run_id)[-8:]])


class LogSectionsPlugin:
    """Adds the log tail of every process a failing test touched to its report."""

    def __init__(self) -> None:
        self.item_start = 0.0

    def pytest_runtest_setup(self, item: Any) -> None:
        self.item_start = time.time()

    def pytest_runtest_logreport(self, report: Any) -> None:
        if not report.failed or report.when not in ("setup", "call"):
            return
        for p in _ALL:
            if p.proc is None:
                continue
            if p.stopped_at is not None and p.stopped_at < self.item_start:
                continue
            report.sections.append((f"log of {p.name} ({p.log_path})", p.log_tail(80)))
        for path, name in list(_LOGS.items()):
            try:
                tail = "\n".join(path.read_text(errors="replace").splitlines()[-80:])
            except OSError:
                continue
            report.sections.append((f"log of {name} ({path})", tail))


# -- graphs ---------------------------------------------------------------------
def load_example(name: str = "iris_train.json") -> dict[str, Any]:
    """A graph from the repository's ``examples/`` folder."""
    return json.loads((REPO_ROOT / "examples" / name).read_text(encoding="utf-8"))


def iris_example(epochs: int = 1) -> dict[str, Any]:
    """The iris example, training for ``epochs`` epochs."""
    g = load_example()
    for n in g["nodes"]:
        if n["id"] == "train":
            n["data"]["params"]["epochs"] = epochs
    return g


def spawn_agent(server: ServerProc, tmp: Path, name: str) -> Proc:
    """A real agent (``cdui agent start --foreground``, cpu) enrolled on ``server`` as ``name``, its state
    and log in ``tmp``; started, not waited for (the caller stops it)."""
    token = server.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    a = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", server.url, "--token", token,
              "--name", name, "--devices", "cpu", "--foreground"],
             env_for(tmp / f"{name}-ud", tmp / f"{name}-data"), tmp / f"{name}.log", name=f"agent-{name}")
    a.spawn()
    return a


@contextlib.contextmanager
def lab_of(tmp: Path, server_name: str, agent_names: tuple[str, ...]) -> Iterator[tuple[ServerProc, list[Proc]]]:
    """A server and real agents named ``agent_names``, all online; stopped at the end."""
    server = ServerProc(tmp, name=server_name).start()
    agents = [spawn_agent(server, tmp, name) for name in agent_names]
    try:
        wait_for(lambda: {w["name"] for w in server.call("GET", "/api/workers")["workers"] if w["online"]}
                 >= set(agent_names), 180, 0.2, f"workers {', '.join(agent_names)} online",
                 detail=lambda: agents[0].log_tail(20))
        yield server, agents
    finally:
        for a in agents:
            a.stop()
        server.stop()


def long_training_graph(epochs: int = 100000) -> dict[str, Any]:
    """The iris example, training for (practically) ever: a run to stop."""
    g = load_example()
    for n in g["nodes"]:
        if n["type"] == "TrainingLoop":
            n["data"]["params"]["epochs"] = epochs
    g["name"] = f"iris for {epochs} epochs"
    return g


def node(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
    return {"id": nid, "type": ntype, "position": {"x": 0, "y": 0}, "data": {"params": params}}


def trig(src: str, dst: str) -> dict[str, Any]:
    return {"id": f"trig-{src}-{dst}", "source": src, "sourceHandle": "trigger", "target": dst,
            "targetHandle": None, "type": "trigger"}


def edge(src: str, sh: str, dst: str, th: str) -> dict[str, Any]:
    return {"id": f"{src}.{sh}-{dst}.{th}", "source": src, "sourceHandle": sh, "target": dst,
            "targetHandle": th, "type": "data"}


def graph(nodes: list[dict[str, Any]], edges: list[dict[str, Any]], name: str = "test graph") -> dict[str, Any]:
    return {"format_version": 1, "name": name, "nodes": nodes, "edges": edges}


def start_then(ntype: str, nid: str = "n", **params: Any) -> dict[str, Any]:
    """Start triggering one node of ``ntype``: the smallest runnable graph."""
    return graph([node("start", "Start"), node(nid, ntype, **params)], [trig("start", nid)], name=ntype)


def csv_print_graph(path: str = "data/samples/iris.csv", label: str = "rows") -> dict[str, Any]:
    """CSVReader -> Print: a quick run that reads one file."""
    return graph([node("start", "Start"), node("csv", "CSVReader", path=path, target_column="", skip_header=True),
                  node("print", "Print", label=label)],
                 [trig("start", "csv"), edge("csv", "tensor", "print", "value")], name="csv-print")


def broken_iris() -> dict[str, Any]:
    """The iris example with one of each mistake."""
    g = load_example()
    for n in g["nodes"]:
        if n["id"] == "train":
            n["data"]["params"]["epochs"] = 0  # below the minimum of 1
    for e in g["edges"]:
        if e["id"] == "csv-norm":
            e["targetHandle"] = "no_such_port"
        if e["id"] == "model-opt":  # LIST into MODEL
            e["source"], e["sourceHandle"] = "csv", "labels"
    g["nodes"] += [node("ghost", "NoSuchNodeType"), node("lonely-print", "Print", label="x"),
                   node("loop-a", "Print"), node("loop-b", "Print")]
    g["edges"] += [trig("start", "ghost"), trig("start", "lonely-print"), trig("start", "loop-a"),
                   edge("loop-a", "value", "loop-b", "value"), edge("loop-b", "value", "loop-a", "value")]
    return g


# A node that ticks N times, reporting progress, honouring stop: a run whose
# every event we can count, long enough to cut its connection mid-way.
TICKER = '''
import time
from cdui.nodes.base import Node, Param, Port
from cdui.graph.context import RunStopped


class Ticker(Node):
    NODE_NAME = "Ticker"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("ticks", "int", 20), Param("interval", "float", 0.1), Param("token", "secret", "")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        for i in range(1, int(params["ticks"]) + 1):
            if ctx.should_stop():
                raise RunStopped()
            ctx.progress(tick=i, ticks=int(params["ticks"]))
            time.sleep(float(params["interval"]))
        return {"value": float(params["ticks"])}
'''


def ticker_graph(ticks: int = 20, interval: float = 0.1, token: str = "") -> dict[str, Any]:
    return graph([node("start", "Start"), node("tick", "Ticker", ticks=ticks, interval=interval, token=token),
                  node("print", "Print", label="ticks")],
                 [trig("start", "tick"), edge("tick", "value", "print", "value")], name=f"ticker {ticks}")


def install_ticker(data_dir: Path) -> None:
    """The Ticker node in ``data_dir``'s custom nodes (a control plane's or an agent's)."""
    (data_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (data_dir / "custom_nodes" / "ticker.py").write_text(TICKER)


def stand_in_python(tmp_path: Path, source: str) -> str:
    """An interpreter path that runs the script ``source`` whatever arguments the launcher passes: a run
    process stand-in that speaks the launcher's stdout protocol (cdui/run/runner.py)."""
    script = tmp_path / "stand_in.py"
    script.write_text(source)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {script}\n")
    exe.chmod(0o755)
    return str(exe)


def tracked_copy(dest: Path, untracked: bool = False) -> Path:
    """A copy of this checkout's files git tracks (``untracked``: and those not yet added that it does not
    ignore: the checkout as it is), links kept as links."""
    args = ["git", "ls-files", "-z", *(["--cached", "--others", "--exclude-standard"] if untracked else [])]
    files = subprocess.run(args, cwd=REPO_ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src, dst = REPO_ROOT / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(src.readlink())
        elif src.is_file():
            shutil.copy2(src, dst)
    return dest
