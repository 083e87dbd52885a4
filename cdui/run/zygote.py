"""The zygote's own side: ``python -m cdui.run.runproc --zygote`` forks one run process per run.

Its owner (:class:`cdui.run.spare.SparePool`, in the control plane or a
long-running agent) starts it with fd 0 one end of a ``SOCK_SEQPACKET`` unix
socket pair, the *control socket*. The zygote imports torch and the built-in
node modules (nothing of it initialises CUDA), then serves, single-threaded:

- owner -> zygote, one message per run: ``{"env": {NAME: value or null}}``
  (the run's values of :data:`cdui.wire.job.DEFERRED_ENV`) carrying, as
  ``SCM_RIGHTS``, the three pipe ends that become the run's fd 0, 1 and 2.
  Nothing of a run is in it: the job and its secrets go down the run's own
  stdin afterwards, from the owner, exactly as to a fresh process.
- zygote -> owner: ``{"pid": N}`` (or ``{"error": "..."}``) in answer, in
  order; ``{"exit": N, "rc": RC}`` when a child it forked has exited (``RC``
  as asyncio reports it: the exit code, or minus the signal). The reply to a
  fork always precedes that child's exit message.
- end of the control socket (the owner closed or lost it, ``kill -9``
  included): the zygote forks nothing more and exits as soon as its children
  are gone (each of them sees its own stdin end then and stops, see
  :mod:`cdui.run.runproc`).

A forked child is a run process like a fresh one: it leaves the zygote's
session (``setsid``: its own session and process group, so stop, kill and
crash isolation work unchanged), drops every descriptor of the zygote's,
takes the three pipe ends as its stdio, sets its deferred variables before
anything can initialise CUDA, and runs the job it then reads from its stdin.
It never returns into the zygote's loop: it ends with :func:`exit_now`.
"""
from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import selectors
import signal
import socket
import sys
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from cdui.wire.job import DEFERRED_ENV

MAX_MESSAGE = 64 * 1024


def exit_now(rc: int) -> None:
    """End this run process at once, once what it wrote is out.

    The run's events and its result are flushed by then. Tearing an interpreter with torch
    loaded down takes a few hundred milliseconds and changes nothing a run reports, so the
    launcher gets its exit (and the run its end) without waiting for it. atexit functions
    still run: a library may flush a file of the run's there."""
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:  # noqa: BLE001 - the process ends either way; say why it might have lost output
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(rc)


def apply_env(env: Any) -> str | None:
    """Set this process's deferred variables from a fork request's ``env``; the problem, if it is not one."""
    if not isinstance(env, dict) or set(env) - set(DEFERRED_ENV):
        return f"expected {{\"env\": {{...}}}} naming only {', '.join(DEFERRED_ENV)}"
    for name in DEFERRED_ENV:
        value = env.get(name)
        if value is None:
            os.environ.pop(name, None)
        elif isinstance(value, str):
            os.environ[name] = value
        else:
            return f"{name} must be a string or null, got {type(value).__name__}"
    return None


def serve(warm: Callable[[], None], run: Callable[[], int]) -> int:
    """The zygote's loop; ``run`` is the run process's own main, called in each forked child."""
    warm()
    # The warm imports' own finalizers (torch registers one per operator library, 134 of them) would
    # otherwise run one by one at every child's exit, about 25 ms of nothing on an idle machine:
    # the process's end frees what they hold. What a run registers itself still runs at its exit.
    for info in weakref.finalize._registry.values():  # type: ignore[attr-defined]
        info.atexit = False
    # Objects the children only read stay shared: a child's collector never walks (and so never writes to,
    # copying the page) what the zygote had made.
    gc.collect()
    gc.freeze()
    ctl = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
    signal.set_wakeup_fd(wake_w)
    # Stopping the zygote means ending it; a SIGTERM meant for a batch job's processes is for the runs.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children: set[int] = set()
    listening = True

    def send(msg: dict[str, Any]) -> None:
        try:
            ctl.send(json.dumps(msg).encode())
        except OSError:
            pass  # the owner is gone: nobody to tell

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                return
            if pid == 0:
                return
            children.discard(pid)
            send({"exit": pid, "rc": os.waitstatus_to_exitcode(status)})

    def become_child(request: bytes, fds: list[int]) -> None:
        """In the forked child: leave everything of the zygote's behind and run. Never returns."""
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            sel.close()
            ctl.close()
            os.close(wake_r)
            os.close(wake_w)
            os.setsid()
            for target, fd in zip((0, 1, 2), fds, strict=True):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            problem = apply_env(json.loads(request).get("env"))
            if problem:
                print(f"cdui: the forked run process could not read its fork request: {problem}",
                      file=sys.stderr, flush=True)
                exit_now(2)
            _reseed()
            exit_now(run())
        except BaseException:  # noqa: BLE001 - a child must never return into the zygote's loop
            traceback.print_exc()
            exit_now(1)

    while listening or children:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                continue
            try:
                request, fds, _flags, _addr = socket.recv_fds(ctl, MAX_MESSAGE, 3)
            except OSError:
                request, fds = b"", []
            if not request:
                listening = False  # the owner is gone or retired this zygote
                sel.unregister(ctl)
                for fd in fds:
                    os.close(fd)
                continue
            if len(fds) != 3:
                for fd in fds:
                    os.close(fd)
                send({"error": f"a fork request carries the run's 3 pipe ends, this one {len(fds)}"})
                continue
            try:
                pid = os.fork()
            except OSError as exc:
                send({"error": f"fork failed: {exc}"})
            else:
                if pid == 0:
                    become_child(request, fds)
                children.add(pid)
                send({"pid": pid})
            finally:
                for fd in fds:
                    os.close(fd)
        reap()
    ctl.close()
    return 0


def _reseed() -> None:
    """Children of one zygote would share its random state; a fresh process's own is seeded from the OS.
    Python's ``random`` reseeds itself at fork; numpy's global generator does not."""
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:  # noqa: BLE001 - a numpy without the legacy generator has no global state to share
            pass
