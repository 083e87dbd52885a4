"""The zygote's protocol (cdui/run/zygote.py) with its owner's side (cdui/run/spare.py), without torch.

The zygote here is the real loop, ``zygote.serve``, with nothing to warm and a tiny run in place of a
run process's main, so forking, the pipes, exit codes and the ends of a zygote are tested in the
default tier. tests/test_spare.py runs the same through real run processes (e2e).
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from cdui.run import spare
from cdui.run.zygote import apply_env
from procs import REPO_ROOT, pid_alive

ZYGOTE = textwrap.dedent('''
    import os
    import sys

    from cdui.run import zygote


    def run():
        """Echo the first stdin line with what this process sees; wait for a second line if told to."""
        line = sys.stdin.readline().strip()
        print(f"{line} visible={os.environ.get('CUDA_VISIBLE_DEVICES')} own_session={os.getsid(0) == os.getpid()}",
              flush=True)
        print("to stderr", file=sys.stderr, flush=True)
        if line.startswith("wait"):
            sys.stdin.readline()
        return int(line.rsplit(" ", 1)[-1])


    zygote.exit_now(zygote.serve(lambda: None, run))
''')


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def with_zygote(body: Callable[[spare._Zygote], Awaitable[Any]]) -> Any:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", ZYGOTE, stdin=theirs.fileno(), stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, cwd=str(REPO_ROOT), start_new_session=True)
    theirs.close()
    mine.setblocking(False)
    z = spare._Zygote(spare.shape_of(sys.executable, str(REPO_ROOT), 0o022, {}), {}, proc, mine)
    try:
        return await body(z)
    finally:
        spare.kill_group(proc)
        await proc.wait()
        await asyncio.gather(*z.tasks, return_exceptions=True)


async def fork(z: spare._Zygote, visible: str | None = None) -> spare.ForkedProcess:
    forked = await z.fork({"CUDA_VISIBLE_DEVICES": visible} if visible is not None else {})
    assert forked is not None
    return forked


async def say(p: spare.ForkedProcess, line: str) -> str:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(line.encode() + b"\n")
    await p.stdin.drain()
    return (await asyncio.wait_for(p.stdout.readline(), 60)).decode().strip()


def test_forked_children_get_their_own_pipes_session_variables_and_exit_codes() -> None:
    async def body(z: spare._Zygote) -> dict[str, Any]:
        a, b = await fork(z, "3"), await fork(z)
        parents = {parent_of(a.pid), parent_of(b.pid)}
        said = [await say(b, "b 0"), await say(a, "a 7")]
        assert a.stderr is not None
        err = (await a.stderr.readline()).decode().strip()
        return {"parents": parents, "zygote": z.proc.pid, "said": said, "err": err,
                "codes": [await a.wait(), await b.wait()], "lost": [a.code_lost, b.code_lost]}

    r = asyncio.run(with_zygote(body))
    assert r["parents"] == {r["zygote"]}
    assert r["said"] == ["b 0 visible=None own_session=True", "a 7 visible=3 own_session=True"]
    assert r["err"] == "to stderr"
    assert r["codes"] == [7, 0] and r["lost"] == [False, False]


def test_a_retired_zygote_forks_nothing_more_and_exits_after_its_children() -> None:
    async def body(z: spare._Zygote) -> dict[str, Any]:
        child = await fork(z)
        first = await say(child, "wait 5")
        z.retire()
        refused = await z.fork({})
        await asyncio.sleep(0.2)
        alive_with_child = z.proc.returncode is None
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        return {"first": first, "refused": refused, "alive_with_child": alive_with_child,
                "code": await child.wait(), "zygote_code": await asyncio.wait_for(z.proc.wait(), 60)}

    r = asyncio.run(with_zygote(body))
    assert r["first"] == "wait 5 visible=None own_session=True"
    assert r["refused"] is None
    assert r["alive_with_child"] is True
    assert (r["code"], r["zygote_code"]) == (5, 0)


def test_the_children_of_a_killed_zygote_run_on_and_their_end_is_still_seen() -> None:
    async def body(z: spare._Zygote) -> dict[str, Any]:
        child = await fork(z)
        await say(child, "wait 4")
        os.kill(z.proc.pid, signal.SIGKILL)
        await z.proc.wait()
        await asyncio.gather(*z.tasks, return_exceptions=True)
        alive = pid_alive(child.pid)
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        code = await asyncio.wait_for(child.wait(), 60)
        return {"alive": alive, "lost": child.code_lost, "said": spare.exit_text(child, code),
                "after": await z.fork({})}

    r = asyncio.run(with_zygote(body))
    assert r["alive"] is True, "a zygote's death ends none of its runs"
    assert r["lost"] is True and r["after"] is None
    assert r["said"] == "run subprocess exited; its exit code was lost with the zygote that forked it"


def test_a_zygote_exits_when_its_owner_is_gone() -> None:
    async def body(z: spare._Zygote) -> int:
        z.sock.close()  # what an owner killed with SIGKILL leaves: the socket's end
        return await asyncio.wait_for(z.proc.wait(), 60)

    assert asyncio.run(with_zygote(body)) == 0


@pytest.mark.parametrize(("env", "problem", "visible"), [
    ({"CUDA_VISIBLE_DEVICES": "2"}, None, "2"),
    ({"CUDA_VISIBLE_DEVICES": None}, None, None),
    ({}, None, None),
    ({"CUDA_VISIBLE_DEVICES": 2}, "CUDA_VISIBLE_DEVICES must be a string or null, got int", "1"),
    ({"PATH": "/x"}, 'expected {"env": {...}} naming only CUDA_VISIBLE_DEVICES', "1"),
    ("CUDA_VISIBLE_DEVICES=2", 'expected {"env": {...}} naming only CUDA_VISIBLE_DEVICES', "1"),
])
def test_a_fork_request_sets_only_the_deferred_variables(monkeypatch: pytest.MonkeyPatch, env: Any,
                                                        problem: str | None, visible: str | None) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert apply_env(env) == problem
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == visible


def test_what_a_zygote_is_told_of_a_run_and_what_decides_its_shape() -> None:
    assert spare.fork_request({"CUDA_VISIBLE_DEVICES": "0", "SECRET_TOKEN": "x"}) == \
        b'{"env": {"CUDA_VISIBLE_DEVICES": "0"}}'
    one = spare.shape_of("py", "/r", 0o022, {"A": "1", "CUDA_VISIBLE_DEVICES": "0"})
    assert one == spare.shape_of("py", "/r", 0o022, {"A": "1", "CUDA_VISIBLE_DEVICES": "1"})
    assert one != spare.shape_of("py", "/r", 0o022, {"A": "2"})
    assert one != spare.shape_of("py", "/r", 0o077, {"A": "1"})
