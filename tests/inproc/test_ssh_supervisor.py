"""The SSH supervisor's retry rules, stepped on the fake clock.

The "ssh" it runs is a small real script that answers as OpenSSH does in each
failure (its output and exit code), so the supervisor's own subprocess
handling is what runs; only time is stepped."""
from __future__ import annotations

from pathlib import Path

import pytest
from harness import eventually

from cdui.core.clock import FakeClock
from cdui.plane.ssh import ssh
from cdui.plane.ssh.ssh_supervisor import Deps, Spec, Supervisor, TunnelState


def fake_ssh(tmp: Path, prepare: str, tunnel: str) -> str:
    """An ssh that prints ``prepare`` (a short ssh) or ``tunnel`` (one with -R) as 'MESSAGE|CODE'."""
    path = tmp / "ssh"
    msg_p, code_p = prepare.split("|")
    msg_t, code_t = tunnel.split("|")
    path.write_text("#!/bin/sh\n"
                    f"for a in \"$@\"; do [ \"$a\" = -R ] && {{ echo '{msg_t}'; exit {code_t}; }}; done\n"
                    f"echo '{msg_p}'; exit {code_p}\n")
    path.chmod(0o755)
    (tmp / "count").write_text("")
    return str(path)


def supervisor(tmp: Path, clock: FakeClock, binary: str,
               forgot: dict[str, bool] | None = None) -> tuple[Supervisor, list[TunnelState]]:
    """``forgot["v"]``: whether the slot's old credential was forgotten (False: the next preparation forgets it)."""
    seen: list[TunnelState] = []
    forgot = forgot if forgot is not None else {"v": False}

    async def local() -> str:
        return str(tmp / "s")

    async def token() -> str:
        return "abcdef.0123456789abcdef"

    async def get_forgot() -> bool:
        return forgot["v"]

    async def set_forgot(v: bool) -> None:
        forgot["v"] = v

    async def changed(t: TunnelState) -> None:
        seen.append(t)
    spec = Spec("gpu1", ssh.Target("gpu-box"), 18000, "~/CodefyUI/bin/cdui")
    return Supervisor(spec, Deps(clock, "3f9a12c4", local, token, get_forgot, set_forgot, changed, binary)), seen


async def until(pred, what: str, timeout: float = 30.0) -> None:
    """Wait for the supervisor's reaction to its subprocess (real I/O), never for clock time."""
    await eventually(pred, what, timeout)


async def failed_waiting(sup: Supervisor, clock: FakeClock, attempt: int) -> None:
    await until(lambda: sup.tunnel.attempts == attempt and sup.tunnel.state == "failed", f"attempt {attempt} to fail")


async def test_recoverable_failures_back_off_and_give_up_after_ten_minutes(tmp_path: Path) -> None:
    clock = FakeClock()
    binary = fake_ssh(tmp_path, "alice@gpu-box: Permission denied (publickey).|255", "unused|0")
    sup, _ = supervisor(tmp_path, clock, binary)
    sup.start()
    delays: list[float] = []
    try:
        while True:
            await failed_waiting(sup, clock, len(delays) + 1)
            t = sup.tunnel
            assert t.reason is not None and t.reason.startswith("ssh login denied (Permission denied)")
            if not t.retrying:
                break
            assert t.next_attempt_s is not None
            delays.append(t.next_attempt_s)
            await clock.wait_for_sleepers(1)
            await clock.advance(t.next_attempt_s)
        assert delays[:7] == [2, 4, 8, 16, 32, 60, 60]
        assert sum(delays) >= ssh.RECOVERABLE_LIMIT_S and sum(delays[:-1]) < ssh.RECOVERABLE_LIMIT_S
        assert "gave up after it lasted 10 minutes" in (sup.tunnel.reason or "")
        assert sup.tunnel.next_attempt_s is None
        # Retry starts again at once, with the series reset.
        n = sup.tunnel.attempts
        sup.retry()
        await failed_waiting(sup, clock, n + 1)
        assert sup.tunnel.retrying and sup.tunnel.next_attempt_s == 2
    finally:
        await sup.close()
    assert sup.tunnel.state == "stopped"


async def test_host_key_failure_is_terminal_at_once(tmp_path: Path) -> None:
    clock = FakeClock()
    binary = fake_ssh(tmp_path, "Host key verification failed.|255", "unused|0")
    sup, _ = supervisor(tmp_path, clock, binary)
    sup.start()
    try:
        await failed_waiting(sup, clock, 1)
        assert not sup.tunnel.retrying and sup.tunnel.reason == "host key verification failed: " \
                                                                 "Host key verification failed."
        assert clock.sleepers == 0  # nothing scheduled: it waits for Retry
        assert list(sup.tunnel.output) == ["Host key verification failed."]
    finally:
        await sup.close()


async def test_three_forwarding_failures_in_a_row_are_terminal(tmp_path: Path) -> None:
    clock = FakeClock()
    binary = fake_ssh(tmp_path, "cdui-ssh: dir=/home/alice/.codefyui-ssh/3f9a12c4-18000|0",
                      "Error: remote port forwarding failed for listen path /home/alice/x/sock|255")
    sup, _ = supervisor(tmp_path, clock, binary)
    sup.start()
    try:
        for attempt, delay in ((1, 2.0), (2, 4.0)):
            await failed_waiting(sup, clock, attempt)
            assert sup.tunnel.retrying and sup.tunnel.next_attempt_s == delay
            await clock.wait_for_sleepers(1)
            await clock.advance(delay)
        await failed_waiting(sup, clock, 3)
        assert not sup.tunnel.retrying
        assert "3 times in a row" in (sup.tunnel.reason or "") and "AllowStreamLocalForwarding" in sup.tunnel.reason
        # Only the last attempt's output is kept.
        assert sum("cdui-ssh: dir=" in line for line in sup.tunnel.output) == 1
    finally:
        await sup.close()


async def test_remote_cdui_missing_is_terminal(tmp_path: Path) -> None:
    clock = FakeClock()
    binary = fake_ssh(tmp_path, "cdui-ssh: dir=/home/alice/.codefyui-ssh/3f9a12c4-18000|0",
                      "cdui-ssh: ~/CodefyUI/bin/cdui: not found|127")
    sup, _ = supervisor(tmp_path, clock, binary)
    sup.start()
    try:
        await failed_waiting(sup, clock, 1)
        assert not sup.tunnel.retrying
        assert (sup.tunnel.reason or "").startswith("the remote shell cannot run cdui (not found, exit 127)")
    finally:
        await sup.close()


def version_refused_ssh(tmp: Path) -> str:
    """An ssh whose preparation works and whose agent, with its stored credential, is refused for its
    version (exit 2, as the remote script passes the agent's code on); every invocation is logged,
    a short one with the script it got on stdin."""
    path = tmp / "ssh"
    line = "refused by the control plane: version mismatch: worker 0.0.9, control plane 0.1.0"
    path.write_text("#!/bin/sh\n"
                    'for a in "$@"; do [ "$a" = -R ] && tunnel=1; done\n'
                    f"if [ -n \"$tunnel\" ]; then echo \"$*\"; else echo \"$* $(tr '\\n' ' ')\"; fi "
                    f">>'{tmp / 'calls'}'\n"
                    'for a in "$@"; do [ "$a" = -R ] && { echo "cdui-ssh: started pid=4242"; '
                    f"echo '2030-01-01 00:00:00,000 ERROR cdui.agent.agent: {line}'; echo 'cdui: error: {line}'; "
                    "echo 'cdui-ssh: agent exited code=2'; exit 2; }; done\n"
                    'echo "cdui-ssh: dir=/home/alice/.codefyui-ssh/3f9a12c4-18000"; exit 0\n')
    path.chmod(0o755)
    return str(path)


async def test_a_version_refusal_fails_once_keeps_the_credential_and_waits_for_retry(tmp_path: Path) -> None:
    """The control plane was updated first: the agent's stored credential is fine, its version is not.
    Forgetting the credential and relaunching (with a new token) cannot help, so the tunnel fails once
    with both versions named, schedules nothing, and keeps the credential; Retry tries again."""
    clock = FakeClock()
    forgot = {"v": True}  # the slot's first use is behind it: the credential the agent holds is this worker's
    sup, _ = supervisor(tmp_path, clock, version_refused_ssh(tmp_path), forgot)
    sup.start()
    try:
        await failed_waiting(sup, clock, 1)
        t = sup.tunnel
        assert t.reason == ("version mismatch (worker 0.0.9, server 0.1.0): install the same cdui version on both "
                            "(`cdui update` on the older one), then Retry")
        assert not t.retrying and t.next_attempt_s is None
        assert clock.sleepers == 0  # nothing scheduled: no further ssh until Retry
        assert forgot["v"] is True  # the next preparation does not run `cdui agent forget`
        calls = (tmp_path / "calls").read_text().splitlines()
        assert len(calls) == 2 and "-R" in calls[1] and "    FORGET='' " in calls[0]
        sup.retry()
        await failed_waiting(sup, clock, 2)
        assert (sup.tunnel.reason or "").startswith("version mismatch (worker 0.0.9, server 0.1.0)")
        assert len((tmp_path / "calls").read_text().splitlines()) == 4 and forgot["v"] is True
    finally:
        await sup.close()


def switchable_ssh(tmp: Path) -> str:
    """An ssh whose answer the test switches with ``tmp/mode``: ``denied`` (login refused at the
    preparation) or ``up`` (the preparation works and the agent connects, then the link drops)."""
    path = tmp / "ssh"
    path.write_text("#!/bin/sh\n"
                    f"mode=$(cat '{tmp / 'mode'}')\n"
                    'for a in "$@"; do [ "$a" = -R ] && { echo "cdui-ssh: started pid=4242"; '
                    "echo 'agent: connected to http://cp-3f9a12c4.invalid:18000 as worker gpu1'; exit 255; }; done\n"
                    'if [ "$mode" = up ]; then echo "cdui-ssh: dir=/home/alice/.codefyui-ssh/3f9a12c4-18000"; '
                    "exit 0; fi\n"
                    "echo 'alice@gpu-box: Permission denied (publickey).'; exit 255\n")
    path.chmod(0o755)
    return str(path)


async def next_failure(sup: Supervisor, clock: FakeClock) -> None:
    """Step the clock through the delay the last failure set, then wait until the next attempt failed."""
    n = sup.tunnel.attempts
    await clock.wait_for_sleepers(1)
    await clock.advance(sup.tunnel.next_attempt_s or 0)
    await failed_waiting(sup, clock, n + 1)


# It runs real subprocesses (an ssh per attempt): the e2e tier, so the default tier stays fast.
@pytest.mark.e2e
async def test_a_connection_between_recoverable_failures_restarts_the_ten_minutes(tmp_path: Path) -> None:
    """Only ten minutes of failure without a break stop the retries: a connection in between
    starts the count again, so more than ten minutes of failures in all still retry."""
    clock = FakeClock()
    mode = tmp_path / "mode"
    mode.write_text("denied")
    sup, _ = supervisor(tmp_path, clock, switchable_ssh(tmp_path))
    sup.start()
    try:
        await failed_waiting(sup, clock, 1)
        first = clock.monotonic()
        while clock.monotonic() - first < 480:  # eight minutes of login failures, still retried
            assert sup.tunnel.retrying and "Permission denied" in (sup.tunnel.reason or ""), sup.tunnel
            await next_failure(sup, clock)
        assert sup.tunnel.retrying
        mode.write_text("up")  # one attempt whose agent connects, then its link drops
        await next_failure(sup, clock)
        assert sup.tunnel.remote_pid == 4242 and (sup.tunnel.reason or "").startswith("the connection ended")
        assert sup.tunnel.retrying and sup.tunnel.next_attempt_s == 2  # the backoff starts again too
        mode.write_text("denied")
        await next_failure(sup, clock)
        second = clock.monotonic()
        while sup.tunnel.retrying:  # the failures after the connection get ten minutes of their own
            assert clock.monotonic() - second < ssh.RECOVERABLE_LIMIT_S
            await next_failure(sup, clock)
        assert clock.monotonic() - second >= ssh.RECOVERABLE_LIMIT_S
        assert "gave up after it lasted 10 minutes" in (sup.tunnel.reason or "")
    finally:
        await sup.close()
