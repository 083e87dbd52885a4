"""How the real agent notices a dead route to the control plane, in-process against the real control plane.

Over its own TCP connection on Linux the agent leaves it to the kernel: data it sent (its heartbeat,
every interval) that stays unacknowledged for three of the control plane's heartbeat intervals ends
the connection (``TCP_USER_TIMEOUT``), so the control plane has no WebSocket ping to answer per agent
and interval. Elsewhere it pings, as before.
"""
from __future__ import annotations

import socket
from pathlib import Path

import pytest
from harness import Link, eventually
from test_agent import SLOW_S, agent_for, control_plane, enroll, online, running

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="a system without TCP_USER_TIMEOUT "
                                                                                   "(the agent pings there)")


def user_timeout_ms(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)


async def test_over_tcp_the_kernel_ends_a_connection_silent_for_three_of_the_control_planes_intervals(
        tmp_path: Path) -> None:
    # Not the agent's first guess of 10 s: the interval the welcome names.
    async with control_plane(tmp_path, CODEFYUI_WORKER_HEARTBEAT_S="4") as cp:
        agent = agent_for(cp, tmp_path, await enroll(cp, "w1"))
        async with running(agent) as task:
            await online(cp, "w1", task)
            # Online on the control plane once it sent the welcome; the agent's connection once it read it.
            await eventually(lambda: agent.ws is not None, "the agent to read its welcome", SLOW_S)
            assert agent.ws is not None
            sock = agent.ws.get_extra_info("socket")
            assert sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6)
            assert user_timeout_ms(sock) == 12_000


async def test_over_a_connection_it_did_not_open_itself_the_agent_leaves_the_socket_alone(tmp_path: Path) -> None:
    # A connector given to the agent (here the test's cuttable link) may not be a plain TCP socket of its
    # own: the agent keeps its WebSocket pings there and sets nothing on the socket.
    async with control_plane(tmp_path) as cp:
        agent = agent_for(cp, tmp_path, await enroll(cp, "w1"), link=Link())
        async with running(agent) as task:
            await online(cp, "w1", task)
            # Online on the control plane once it sent the welcome; the agent's connection once it read it.
            await eventually(lambda: agent.ws is not None, "the agent to read its welcome", SLOW_S)
            assert agent.ws is not None
            assert user_timeout_ms(agent.ws.get_extra_info("socket")) == 0
