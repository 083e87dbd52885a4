"""Warm run processes: a zygote per owner that forks one run process per run.

Starting ``python -m cdui.run.runproc`` costs about a second, nearly all of it
importing torch. A :class:`SparePool` keeps one *zygote*: ``python -m
cdui.run.runproc --zygote`` (:mod:`cdui.run.zygote`), which imports torch and
the built-in node modules once and then forks a child for each run, in a few
milliseconds, however close together the runs come. The owner makes the
run's three pipes, hands their child ends to the zygote over its control
socket, and gets back the child's pid and, later, its exit code.

Invariants:

- A forked child serves one run and is never shared: it is that run's
  process, exactly as a fresh one would be (its own session and process group,
  its pipes, its exit code), so a crash still ends only that run and stop and
  kill (``killpg`` of its pid) work unchanged.
- The job (secrets included) reaches the child the same way as a fresh
  process: on its stdin, from the owner, after the fork. Nothing of a run is
  in the zygote's argv, environment, files or control messages.
- A run is forked only if it would have been started with the same python,
  working folder, umask and environment as the zygote. Anything else retires
  the zygote (it forks nothing more, and exits once its children are gone,
  still reporting their exit codes) and starts one of the run's shape, which
  forks that run. The one exception is :data:`cdui.wire.job.DEFERRED_ENV`
  (``CUDA_VISIBLE_DEVICES``): it narrows a run to its card and differs per
  slot, so the zygote is built with the launcher's own value and the run's
  value travels in the fork request; the child sets it before anything can
  initialise CUDA (the zygote's warm imports do not initialise it).
- Plugin and custom-node folders are loaded after the job arrives, as in a
  fresh process, so a change to them counts from the next run.
- No zygote outlives its owner: :meth:`SparePool.close` kills it, and an
  owner that dies without closing (``kill -9``) closes the control socket, on
  which the zygote forks nothing more and exits once its children are gone
  (they see their stdin end at the same moment and stop).
- A zygote that dies on its own is logged (with what it wrote to stderr) and
  replaced, up to :data:`MAX_IDLE_DEATHS` times in a row; after that the pool
  starts none until a run asks for a process again, so a broken python cannot
  make it spin. A run whose fork fails gets a fresh process. Its children live
  on (they are in sessions of their own); the owner then learns of their end
  through a pidfd, their exit code lost with the zygote.

Which owners keep one: the control plane's local executor and a long-running
agent, from their first run on (an owner that never runs anything spends no
memory on torch; the first run is forked by the zygote started for it). A
one-shot agent keeps none: its one run gets a fresh process.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cdui.wire.job import DEFERRED_ENV

log = logging.getLogger(__name__)

MAX_IDLE_DEATHS = 3
STREAM_LIMIT = 16 * 1024 * 1024  # the longest event line the launcher reads
STDERR_TAIL = 4000  # what a dead zygote's log line quotes of its stderr
# A zygote that has not answered a fork by then is taken as wedged: killed, and the run started fresh.
FORK_REPLY_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Shape:
    """How a run process is started, but for the variables handed over per run."""

    python: str
    cwd: str
    umask: int
    env: tuple[tuple[str, str], ...]


def shape_of(python: str, cwd: str, umask: int, env: Mapping[str, str]) -> Shape:
    return Shape(python, cwd, umask, tuple(sorted((k, v) for k, v in env.items() if k not in DEFERRED_ENV)))


def fork_request(run_env: Mapping[str, str]) -> bytes:
    """What the zygote is told of a run: its own values of the deferred variables, nothing else."""
    return json.dumps({"env": {k: run_env.get(k) for k in DEFERRED_ENV}}).encode()


class RunProcess(Protocol):
    """What the launcher uses of a run process: a fresh ``asyncio.subprocess.Process`` or a forked one."""

    pid: int
    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


def exit_text(proc: RunProcess, rc: int) -> str:
    """How a run process that ended without a result ended, for the run's error."""
    if isinstance(proc, ForkedProcess) and proc.code_lost:
        return "run subprocess exited; its exit code was lost with the zygote that forked it"
    return f"run subprocess exited with code {rc}"


async def start_process(python: str, cwd: str, umask: int, env: Mapping[str, str],
                        stdin: int = asyncio.subprocess.PIPE,
                        zygote: bool = False) -> asyncio.subprocess.Process:
    """The one place a run subprocess is started, fresh or as a zygote (which forks the others)."""
    args = ["-m", "cdui.run.runproc"] + (["--zygote"] if zygote else [])
    return await asyncio.create_subprocess_exec(
        python, *args, stdin=stdin,
        stdout=asyncio.subprocess.DEVNULL if zygote else asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=dict(env), cwd=cwd, start_new_session=True,
        limit=STREAM_LIMIT, umask=umask)


def kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class ForkedProcess:
    """A run process a zygote forked, with the owner's ends of its pipes.

    It is not this process's child: its exit code comes from the zygote's message, or, when the
    zygote died first, its end from a pidfd (the code is then lost: :attr:`code_lost`)."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader,
                 stderr: asyncio.StreamReader) -> None:
        self.pid = pid
        self.stdin: asyncio.StreamWriter | None = stdin
        self.stdout: asyncio.StreamReader | None = stdout
        self.stderr: asyncio.StreamReader | None = stderr
        self._returncode: int | None = None
        self.code_lost = False
        self._exited = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None

    @property
    def returncode(self) -> int | None:
        return self._returncode

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._returncode is not None
        return self._returncode

    def exited(self, rc: int | None) -> None:
        if self._exited.is_set():
            return
        self.code_lost = rc is None
        self._returncode = -1 if rc is None else rc
        self._exited.set()
        if self.stdin is not None:
            self.stdin.close()  # a fresh process's transport closes its stdin at exit too

    def watch_without_zygote(self) -> None:
        """The zygote is gone before this child: learn of the child's end from a pidfd."""
        if self._exited.is_set():
            return
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:
            self.exited(None)
            return
        except OSError:  # a kernel before 5.3 has no pidfd: ask now and then
            self._poller = loop.create_task(self._poll_end())
            return

        def gone() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self.exited(None)
        loop.add_reader(pidfd, gone)

    async def _poll_end(self) -> None:
        while True:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.exited(None)
                return
            except PermissionError:
                pass
            await asyncio.sleep(0.5)


async def _pipe_streams(stdin_w: int, stdout_r: int, stderr_r: int
                        ) -> tuple[asyncio.StreamWriter, asyncio.StreamReader, asyncio.StreamReader]:
    """asyncio streams on the owner's ends of a forked run's pipes, as a subprocess transport makes them."""
    loop = asyncio.get_running_loop()
    readers = []
    for fd in (stdout_r, stderr_r):
        reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
        await loop.connect_read_pipe(lambda r=reader: asyncio.StreamReaderProtocol(r, loop=loop),  # type: ignore[misc]
                                     os.fdopen(fd, "rb", 0))
        readers.append(reader)
    transport, protocol = await loop.connect_write_pipe(lambda: asyncio.streams.FlowControlMixin(loop=loop),
                                                        os.fdopen(stdin_w, "wb", 0))
    return asyncio.StreamWriter(transport, protocol, None, loop), readers[0], readers[1]


class _Zygote:
    """The owner's side of one zygote process: its control socket, its forks, its children's exits."""

    def __init__(self, shape: Shape, env: dict[str, str], proc: asyncio.subprocess.Process,
                 sock: socket.socket) -> None:
        self.shape = shape
        self.env = env
        self.proc = proc
        self.sock = sock
        self.retired = False
        self.children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._reply: asyncio.Future[dict[str, Any] | None] | None = None
        self._lock = asyncio.Lock()
        self.stderr_tail = b""
        self.tasks = [asyncio.ensure_future(self._read()), asyncio.ensure_future(self._drain_stderr())]

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self.retired

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                try:
                    data = await loop.sock_recv(self.sock, 65536)
                except OSError:
                    data = b""
                if not data:
                    return
                try:
                    msg = json.loads(data)
                except ValueError:
                    log.warning("the zygote %d sent %r, not a message; ignored", self.proc.pid, data[:200])
                    continue
                if "exit" in msg:
                    pid, rc = int(msg["exit"]), int(msg["rc"])
                    child = self.children.pop(pid, None)
                    if child is not None:
                        child.exited(rc)
                    else:
                        self._early_exits[pid] = rc  # its fork reply is still on its way to the run
                elif self._reply is not None and not self._reply.done():
                    self._reply.set_result(msg)
        finally:
            # The zygote is gone (or going): no more replies, and its children's ends come from pidfds.
            if self._reply is not None and not self._reply.done():
                self._reply.set_result(None)
            for child in list(self.children.values()):
                child.watch_without_zygote()
            self.children.clear()
            self.sock.close()

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while True:
            chunk = await self.proc.stderr.read(65536)
            if not chunk:
                return
            self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL:]

    async def fork(self, run_env: Mapping[str, str]) -> ForkedProcess | None:
        """A forked run process, or None (the zygote is gone or refused; the caller starts one fresh)."""
        pipes = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr
        child_ends = [pipes[0][0], pipes[1][1], pipes[2][1]]
        own_ends = [pipes[0][1], pipes[1][0], pipes[2][0]]
        msg: dict[str, Any] | None = None
        try:
            async with self._lock:
                if not self.alive:
                    return None
                loop = asyncio.get_running_loop()
                self._reply = loop.create_future()
                await self._send(fork_request(run_env), child_ends)
                for fd in child_ends:
                    os.close(fd)
                child_ends = []
                try:
                    msg = await asyncio.wait_for(self._reply, FORK_REPLY_TIMEOUT_S)
                except TimeoutError:
                    log.warning("the zygote %d did not answer a fork in %.0f s; killed, the run starts fresh",
                                self.proc.pid, FORK_REPLY_TIMEOUT_S)
                    kill_group(self.proc)
                    return None
            if msg is None:
                return None
            if "pid" not in msg:
                log.warning("the zygote %d could not fork a run process: %s; the run starts fresh",
                            self.proc.pid, msg.get("error"))
                return None
            pid = int(msg["pid"])
            proc = ForkedProcess(pid, *await _pipe_streams(*own_ends))
            own_ends = []
            if pid in self._early_exits:
                proc.exited(self._early_exits.pop(pid))
            elif self.sock.fileno() < 0:
                proc.watch_without_zygote()  # the zygote died between its reply and now
            else:
                self.children[pid] = proc
            return proc
        except OSError as exc:
            log.warning("could not hand a run to the zygote %d: %s; the run starts fresh", self.proc.pid, exc)
            return None
        finally:
            for fd in child_ends + own_ends:
                os.close(fd)

    async def _send(self, data: bytes, fds: list[int]) -> None:
        while True:
            try:
                socket.send_fds(self.sock, [data], fds)
                return
            except BlockingIOError:
                await asyncio.sleep(0.005)

    def retire(self) -> None:
        """Fork nothing more; the zygote exits once its children are gone, reporting their exits."""
        self.retired = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)


_POOLS: weakref.WeakSet[SparePool] = weakref.WeakSet()


def live_pools() -> list[SparePool]:
    """Every pool of this process not yet garbage: the test suite's leftover check asks which zygotes
    belong to an owner that outlives one test (a module's in-process server)."""
    return list(_POOLS)


def spare_pids(pools: Iterable[SparePool]) -> set[int]:
    return {pid for pool in pools if (pid := pool.idle_pid) is not None}


class SparePool:
    """At most one zygote, of the shape the last run had. ``enabled=False``: every run starts fresh."""

    def __init__(self, enabled: bool = True) -> None:
        _POOLS.add(self)
        self.enabled = enabled
        self._zygote: _Zygote | None = None
        self._all: weakref.WeakSet[_Zygote] = weakref.WeakSet()  # retired ones too, until they exit
        self._closed = False
        self._deaths = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._starting: asyncio.Task[_Zygote | None] | None = None
        self.taken = 0  # runs forked by a zygote
        self.fresh = 0  # runs that got a fresh process

    @property
    def idle_pid(self) -> int | None:
        """The zygote's pid, None while there is none (or it is still being started)."""
        z = self._zygote
        return z.proc.pid if z is not None and z.alive else None

    def prime(self, python: str, cwd: str, umask: int, spare_env: Mapping[str, str]) -> None:
        """Start the zygote now, if there is none (an owner that wants its first run warm too)."""
        if self.enabled and not self._closed and self._zygote is None and self._starting is None:
            self._start(shape_of(python, cwd, umask, spare_env), dict(spare_env))

    async def process(self, python: str, cwd: str, umask: int, spare_env: Mapping[str, str],
                      run_env: Mapping[str, str]) -> RunProcess:
        """A process for one run: forked by the zygote, or fresh.

        ``run_env`` is the run's environment; ``spare_env`` the same before the per-run variables
        were narrowed, which is what a zygote is built with."""
        if self.enabled and not self._closed:
            shape = shape_of(python, cwd, umask, run_env)
            z = await self._zygote_of(shape, dict(spare_env))
            if z is not None:
                forked = await z.fork(run_env)
                if forked is not None:
                    self.taken += 1
                    self._deaths = 0
                    return forked
        self.fresh += 1
        return await start_process(python, cwd, umask, run_env)

    async def _zygote_of(self, shape: Shape, env: dict[str, str]) -> _Zygote | None:
        """The zygote of this shape: the live one, the one being started, or a new one."""
        if self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        z = self._zygote
        if z is not None and z.alive and z.shape == shape:
            return z
        if z is not None:
            self._zygote = None  # a dead one is logged (and replaced) by its watch; this run starts one now
            if z.shape != shape:
                z.retire()  # built for another environment: the next runs are likelier to look like this one
        if self._closed:
            return None
        self._start(shape, env)
        assert self._starting is not None
        started = await asyncio.gather(self._starting, return_exceptions=True)
        return started[0] if isinstance(started[0], _Zygote) else None

    def _start(self, shape: Shape, env: dict[str, str]) -> None:
        task = asyncio.ensure_future(self._spawn(shape, env))
        self._starting = task

        def done(t: asyncio.Task[_Zygote | None]) -> None:
            if self._starting is t:
                self._starting = None
        task.add_done_callback(done)

    async def _spawn(self, shape: Shape, env: dict[str, str]) -> _Zygote | None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = await start_process(shape.python, shape.cwd, shape.umask, env, stdin=theirs.fileno(),
                                       zygote=True)
        except OSError as exc:  # the runs still start, fresh; say why they are not warm
            mine.close()
            log.warning("could not start a zygote for run processes: %s; runs start cold", exc)
            return None
        finally:
            theirs.close()
        mine.setblocking(False)
        z = _Zygote(shape, env, proc, mine)
        self._all.add(z)
        self._own(self._watch(z))
        if self._closed:
            kill_group(proc)
            return None
        self._zygote = z
        return z

    def _own(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, z: _Zygote) -> None:
        rc = await z.proc.wait()
        await asyncio.gather(*z.tasks, return_exceptions=True)
        if z.retired or self._closed:
            return  # its end was asked for
        if self._zygote is z:
            self._zygote = None
        said = z.stderr_tail.decode(errors="replace").strip()
        self._deaths += 1
        again = self._deaths < MAX_IDLE_DEATHS and not self._closed
        log.warning("the zygote %d for run processes exited with code %s%s; %s", z.proc.pid, rc,
                    f" (stderr: {said[-1000:]})" if said else "",
                    "starting another" if again else
                    f"{self._deaths} did in a row, so none is started until the next run")
        if again and self._zygote is None and self._starting is None:
            self._start(z.shape, z.env)

    async def settled(self) -> int | None:
        """Wait until no zygote is being started; the zygote's pid, if there is one."""
        while self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        return self.idle_pid

    async def close(self) -> None:
        """Kill the zygote and wait for it; start no other. Its running children live on, each the
        run's own to end, and are watched through pidfds."""
        self._closed = True
        while self._starting is not None:
            await asyncio.gather(self._starting, return_exceptions=True)
        self._zygote = None
        for z in list(self._all):
            kill_group(z.proc)
            await z.proc.wait()
            await asyncio.gather(*z.tasks, return_exceptions=True)
