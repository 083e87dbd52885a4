"""The loop that keeps one SSH worker's ssh running: prepare, start, watch, restart.

One :class:`Supervisor` per enabled SSH worker. Each attempt is: the short
preparatory ssh (state folder, stale socket, full path), a fresh one-time
enrollment token, the long-lived ssh with the reverse Unix-socket forward, the
token written to its stdin, and its output read line by line until it exits.
What the exit means is :func:`cdui.plane.ssh.ssh.classify`'s decision; this module only
acts on it:

- restart after 2 s, doubling on each consecutive failed attempt up to a
  minute; an attempt whose agent connected starts the series again;
- terminal failures (host key, cdui not runnable, forwarding refused, three
  forwarding failures in a row, the agent refused for its version) stop
  retrying and wait for Retry;
- recoverable ones (login denied, name not resolving) are retried until they
  have lasted 10 minutes without a break;
- a credential the agent reports as refused or another worker's is forgotten on
  the remote host at once (the next preparation runs ``cdui agent forget``);
  a refusal for the agent's version is not about the credential, which is kept.

Every timer sleeps on the injected clock (:mod:`cdui.core.clock`), so the logic is
tested by stepping time. The state shown on the worker card is a
:class:`TunnelState`; ``output`` keeps the last attempt only.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from cdui.core.clock import Clock
from cdui.plane.ssh import ssh

log = logging.getLogger("cdui.plane.ssh.ssh")
OUTPUT_LINES = 200   # recent ssh output kept (last attempt only)
LINE_MAX = 2000      # characters kept of one output line
SHORT_SSH_S = 60.0   # the preparatory and stop ssh get this long before they are killed


@dataclass
class TunnelState:
    state: str = "connecting"  # connecting | connected | failed | stopped
    reason: str | None = None
    remote_pid: int | None = None
    retrying: bool = False     # failed, and an automatic retry is due
    next_attempt_s: float | None = None
    attempts: int = 0
    output: deque[str] = field(default_factory=lambda: deque(maxlen=OUTPUT_LINES))

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "remote_pid": self.remote_pid,
                "retrying": self.retrying, "next_attempt_s": self.next_attempt_s, "attempts": self.attempts,
                "recent_output": list(self.output)}


@dataclass(frozen=True)
class Spec:
    """What one SSH worker is: its saved row, as the supervisor needs it."""
    name: str
    target: ssh.Target
    slot: int
    remote_cdui: str


@dataclass
class Deps:
    clock: Clock
    iid: str
    local_socket: Callable[[], Awaitable[str]]   # opens (or reuses) the worker's listener; its path
    issue_token: Callable[[], Awaitable[str]]     # a one-time enrollment token for this start
    forgot: Callable[[], Awaitable[bool]]         # has this worker forgotten its slot's old credential?
    set_forgot: Callable[[bool], Awaitable[None]]
    changed: Callable[[TunnelState], Awaitable[None]]  # persist / show the state
    ssh_binary: str = "ssh"


async def run_short(cmd: ssh.Command, timeout: float, clock: Clock) -> tuple[int | None, list[str]]:
    """Run a short ssh, its stdin the script and then its end; (exit code or None if killed at
    the timeout, output lines)."""
    proc = await asyncio.create_subprocess_exec(*cmd.argv, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                start_new_session=True)
    lines: list[str] = []

    async def read() -> None:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(cmd.stdin)
            await proc.stdin.drain()
        except (ConnectionError, RuntimeError):  # ssh ended without reading it (login refused...)
            pass
        finally:
            proc.stdin.close()
        async for raw in proc.stdout:
            if len(lines) < OUTPUT_LINES:
                lines.append(raw.decode(errors="replace").rstrip("\n")[:LINE_MAX])
        await proc.wait()
    reader = asyncio.ensure_future(read())
    timer = asyncio.ensure_future(clock.sleep(timeout))
    timed_out = True
    try:
        await asyncio.wait({reader, timer}, return_when=asyncio.FIRST_COMPLETED)
        timed_out = not reader.done()
    finally:
        timer.cancel()
        if not reader.done():  # the timeout, or the caller cancelled (a stop): no ssh outlives its caller
            _kill(proc)
            await asyncio.shield(asyncio.gather(reader, return_exceptions=True))
    return (None if timed_out else proc.returncode), lines


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class Supervisor:
    def __init__(self, spec: Spec, deps: Deps) -> None:
        self.spec = spec
        self.deps = deps
        self.tunnel = TunnelState()
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False
        self._wake = asyncio.Event()
        self._exited = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- control -------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    def retry(self) -> None:
        """Try again now; also after a terminal failure."""
        self._retry_now = True
        self._wake.set()

    async def ask_agent_to_stop(self) -> bool:
        """Tell the remote agent to stop through the live connection; False if there is none.

        Only a connection whose remote script reported the agent's PID reads stdin for commands:
        an ssh still logging in or failing its forward would swallow the stop unseen."""
        proc = self.proc
        if proc is None or proc.returncode is not None or proc.stdin is None or self.tunnel.remote_pid is None:
            return False
        try:
            proc.stdin.write(b"stop\n")
            await proc.stdin.drain()
            return True
        except (ConnectionError, RuntimeError):
            return False

    async def wait_exit(self, seconds: float) -> bool:
        """Wait until the ssh is gone or ``seconds`` pass on the clock; True if it is gone."""
        if self.proc is None or self.proc.returncode is not None:
            return True
        gone = asyncio.ensure_future(self._exited.wait())
        timer = asyncio.ensure_future(self.deps.clock.sleep(seconds))
        try:
            await asyncio.wait({gone, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            gone.cancel()
        return self._exited.is_set()

    async def close(self) -> None:
        """End the loop and the ssh (the remote agent keeps running unless it was told to stop)."""
        self.stopping = True
        self._wake.set()
        if self.proc is not None and self.proc.returncode is None:
            _kill(self.proc)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.tunnel.state, self.tunnel.retrying, self.tunnel.next_attempt_s = "stopped", False, None
        await self._changed()

    # -- the loop --------------------------------------------------------------------------
    async def _loop(self) -> None:
        delay: float | None = None
        forward_failures = 0
        recoverable_since: float | None = None
        credential_retry = False
        self._retry_now = False
        while not self.stopping:
            t = self.tunnel
            t.attempts += 1
            t.output.clear()
            t.state, t.reason, t.retrying, t.next_attempt_s, t.remote_pid = "connecting", None, False, None, None
            await self._changed()
            try:
                rc, connected = await self._attempt()
            except OSError as exc:  # ssh missing from PATH, no room for the socket...
                rc, connected = None, False
                t.output.append(f"{ssh.MARK} could not start ssh: {exc}")
            if self.stopping:
                return
            outcome = ssh.classify(rc, list(t.output), connected)
            now = self.deps.clock.monotonic()
            if connected:
                delay, forward_failures, recoverable_since = None, 0, None
            # A version refusal waits for Retry too: each relaunch would be refused the same way.
            terminal = outcome.kind in ("terminal", "version")
            if outcome.kind == "forward":
                forward_failures += 1
                terminal = forward_failures >= ssh.FORWARD_FAILURES_LIMIT
                if terminal:
                    outcome = ssh.Outcome("terminal", f"{outcome.reason} ({forward_failures} times in a row); "
                                                      f"the remote sshd may not allow forwarding to Unix sockets "
                                                      f"(AllowStreamLocalForwarding); ask its administrator, "
                                                      f"then Retry")
            else:
                forward_failures = 0
            if outcome.kind == "recoverable":
                recoverable_since = now if recoverable_since is None else recoverable_since
                if now - recoverable_since >= ssh.RECOVERABLE_LIMIT_S:
                    terminal = True
                    outcome = ssh.Outcome("terminal", f"{outcome.reason}; gave up after it lasted "
                                                      f"{ssh.RECOVERABLE_LIMIT_S / 60:.0f} minutes without a break")
            elif not connected:
                recoverable_since = None
            t.state, t.reason = "failed", outcome.reason
            log.warning("ssh worker %s: %s", self.spec.name, outcome.reason)
            if outcome.kind == "credential" and not credential_retry:
                # Forget it (the next preparation does) and start again at once, so the agent enrolls.
                credential_retry = True
                await self.deps.set_forgot(False)
                continue
            credential_retry = False
            if terminal:
                t.retrying, t.next_attempt_s = False, None
                await self._changed()
                await self._wait(None)
                delay, forward_failures, recoverable_since = None, 0, None
                continue
            delay = ssh.next_delay(delay)
            t.retrying, t.next_attempt_s = True, delay
            await self._changed()
            if await self._wait(delay):
                delay, forward_failures, recoverable_since = None, 0, None

    async def _wait(self, seconds: float | None) -> bool:
        """Sleep on the clock (forever if None) unless Retry or a stop wakes it; True if Retry did."""
        self._wake.clear()
        woken = asyncio.ensure_future(self._wake.wait())
        waits: set[asyncio.Future[Any]] = {woken}
        timer = None
        if seconds is not None:
            timer = asyncio.ensure_future(self.deps.clock.sleep(seconds))
            waits.add(timer)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            if timer is not None:
                timer.cancel()
        retried, self._retry_now = self._retry_now, False
        return retried

    async def _attempt(self) -> tuple[int | None, bool]:
        """One preparation and one long-lived ssh; (exit code, whether the agent connected)."""
        sp, d, t = self.spec, self.deps, self.tunnel
        forget = not await d.forgot()
        rc, lines = await run_short(ssh.short_command(sp.target, ssh.prepare_script(d.iid, sp.slot, sp.remote_cdui,
                                                                                    forget), d.ssh_binary),
                                    SHORT_SSH_S, d.clock)
        t.output.extend(lines)
        remote_dir = None
        for line in lines:
            m = ssh.parse_mark(line)
            if m and m[0].startswith("dir="):
                remote_dir = m[0][4:] + ((" " + m[1]) if m[1] else "")
            elif m and m[0] == "legacy":
                log.warning("ssh worker %s: %s", sp.name, line)
        if rc != 0 or not remote_dir or not remote_dir.startswith("/"):
            if rc == 0:
                t.output.append(f"{ssh.MARK} the preparation did not report the remote folder")
            return (rc if rc is not None else -1), False
        if forget:
            await d.set_forgot(True)
        local = await d.local_socket()
        token = await d.issue_token()
        cmd = ssh.tunnel_command(sp.target, d.iid, sp.slot, remote_dir, local, sp.remote_cdui, sp.name,
                                 d.ssh_binary)
        self._exited.clear()
        proc = await asyncio.create_subprocess_exec(*cmd.argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        self.proc = proc
        connected = False
        try:
            assert proc.stdin is not None and proc.stdout is not None
            try:
                # The token's only way to the remote host: the line of stdin after the script, never
                # an argument.
                proc.stdin.write(cmd.stdin + token.encode() + b"\n")
                await proc.stdin.drain()
            except (ConnectionError, RuntimeError):
                pass
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")[:LINE_MAX]
                t.output.append(line)
                m = ssh.parse_mark(line)
                if m and m[0] in ("started", "attached") and m[1].startswith("pid="):
                    with contextlib.suppress(ValueError):
                        t.remote_pid = int(m[1][4:])
                    await self._changed()
                elif "connected to " in line and f" as worker {sp.name}" in line and token not in line:
                    connected = True
                    t.state, t.reason, t.retrying, t.next_attempt_s = "connected", None, False, None
                    await self._changed()
            await proc.wait()
        finally:
            if proc.returncode is None:
                _kill(proc)
                await proc.wait()
            self._exited.set()
        return proc.returncode, connected

    async def _changed(self) -> None:
        try:
            await self.deps.changed(self.tunnel)
        except Exception:  # showing the state must not stop the supervision
            log.exception("ssh worker %s: saving the tunnel state failed", self.spec.name)
