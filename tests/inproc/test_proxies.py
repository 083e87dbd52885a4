"""Trusted proxies: whose ``X-Forwarded-*`` headers the server believes, and what follows from it.

The pure decision as a table, then a real control plane in process: a worker's
"unencrypted" mark and address, the enrollment limiter's address and the
session-token bootstrap, each with and without the setting. Nobody on the
network may make the server believe a forwarded header it was not told to
believe, and a proxied client never gets the session token."""
from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import aiohttp
import pytest
from harness import FakeAgent, Plane

from cdui.plane.appkeys import SESSION_TOKEN
from cdui.plane.http.proxies import Client, decide

LOCAL = [ipaddress.ip_network("127.0.0.1/32")]
LAN = [ipaddress.ip_network("10.1.0.0/24"), ipaddress.ip_network("::1/128")]


@pytest.mark.parametrize("peer, tls, xff, proto, trusted, expected", [
    # Nothing trusted: headers are whatever a client wrote, ignored (today's same-host behaviour).
    ("127.0.0.1", False, "203.0.113.7", "http", [], Client("127.0.0.1", False, False)),
    ("198.51.100.2", False, "127.0.0.1", "https", [], Client("198.51.100.2", False, False)),
    ("198.51.100.2", True, None, None, [], Client("198.51.100.2", True, False)),
    # A trusted proxy names the client and the scheme it used.
    ("127.0.0.1", False, "203.0.113.7", "https", LOCAL, Client("203.0.113.7", True, True)),
    ("127.0.0.1", False, "203.0.113.7", "http", LOCAL, Client("203.0.113.7", False, True)),
    ("::ffff:127.0.0.1", False, "203.0.113.7", "https", LOCAL, Client("203.0.113.7", True, True)),
    # A peer that is not a listed proxy is the client, whatever it claims.
    ("10.9.0.1", False, "127.0.0.1", "https", LOCAL, Client("10.9.0.1", False, False)),
    # A trusted proxy with no forwarding header: the peer itself, as it connected.
    ("127.0.0.1", False, None, None, LOCAL, Client("127.0.0.1", False, False)),
    # Chains: the rightmost address that is not a trusted proxy; what the client prepended is ignored.
    ("::1", False, "127.0.0.1, 203.0.113.7, 10.1.0.5", "https", LAN, Client("203.0.113.7", True, True)),
    ("10.1.0.4", False, "10.1.0.9, 10.1.0.5", "https", LAN, Client("10.1.0.9", True, True)),
    # Ports and brackets as proxies write them; an IPv4-mapped address is IPv4.
    ("127.0.0.1", False, "[2001:db8::5]:4711", "https", LOCAL, Client("2001:db8::5", True, True)),
    ("127.0.0.1", False, "203.0.113.7:4711", "http", LOCAL, Client("203.0.113.7", False, True)),
    ("127.0.0.1", False, "::ffff:127.0.0.1", "http", LOCAL, Client("127.0.0.1", False, True)),
    # Not an address: shown as written, and never loopback.
    ("127.0.0.1", False, "unknown", "http", LOCAL, Client("unknown", False, True)),
    # The scheme is the nearest proxy's word (the rightmost value).
    ("127.0.0.1", False, "203.0.113.7", "https, http", LOCAL, Client("203.0.113.7", False, True)),
    ("127.0.0.1", True, "203.0.113.7", None, LOCAL, Client("203.0.113.7", True, True)),
    ("127.0.0.1", False, None, "https", LOCAL, Client("127.0.0.1", True, True)),
])
def test_who_the_client_is(peer: str, tls: bool, xff: str | None, proto: str | None,
                           trusted: list[ipaddress.IPv4Network | ipaddress.IPv6Network], expected: Client) -> None:
    assert decide(peer, tls, xff, proto, trusted) == expected


@pytest.mark.parametrize("client, unencrypted", [
    (Client("203.0.113.7", False, True), True),
    (Client("203.0.113.7", True, True), False),
    # A loopback client's socket never crossed the network (an SSH tunnel's local end, nginx here).
    (Client("127.0.0.1", False, False), False),
    (Client("::1", False, False), False),
    (Client("unknown", False, True), True),
])
def test_what_is_marked_unencrypted(client: Client, unencrypted: bool) -> None:
    assert client.unencrypted is unencrypted


async def _worker_seen_through_proxy(dirs: dict[str, Path], proto: str, **settings: str) -> dict:
    async with Plane(dirs["user_data"], dirs["data_dir"], **settings) as cp:
        agent = await FakeAgent(cp).enroll()
        agent.headers = {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": proto}
        try:
            await agent.connect()
            w = await cp.worker("w1")
            assert w is not None
            return w
        finally:
            await agent.close()


async def test_a_trusted_proxy_names_the_worker_and_its_scheme(dirs: dict[str, Path]) -> None:
    """Plain HTTP from another machine through the proxy is marked; HTTPS through it is not."""
    w = await _worker_seen_through_proxy(dirs, "http", CODEFYUI_TRUSTED_PROXIES="127.0.0.1")
    assert (w["address"], w["unencrypted"]) == ("203.0.113.7", True)


async def test_https_through_a_trusted_proxy_is_not_marked(dirs: dict[str, Path]) -> None:
    w = await _worker_seen_through_proxy(dirs, "https", CODEFYUI_TRUSTED_PROXIES="127.0.0.1/8")
    assert (w["address"], w["unencrypted"]) == ("203.0.113.7", False)


async def test_without_the_setting_forwarded_headers_are_ignored(dirs: dict[str, Path]) -> None:
    """Unset: the loopback peer is the client, as before; a forged header changes nothing."""
    w = await _worker_seen_through_proxy(dirs, "http")
    assert (w["address"], w["unencrypted"]) == ("127.0.0.1", False)


async def test_enrollment_limit_counts_the_real_client(dirs: dict[str, Path]) -> None:
    """Behind the proxy every client connects from its address: one client's failures must not lock out
    another's."""
    async with Plane(dirs["user_data"], dirs["data_dir"], CODEFYUI_TRUSTED_PROXIES="127.0.0.1",
                     CODEFYUI_ENROLL_RATE_PER_MIN="2") as cp:
        async with aiohttp.ClientSession() as s:
            async def enroll(client: str) -> int:
                async with s.post(cp.url + "/api/workers/enroll", json={"token": "x.y", "name": "w"},
                                  headers={"X-Forwarded-For": client, "X-Forwarded-Proto": "https"}) as r:
                    return r.status
            assert [await enroll("203.0.113.7") for _ in range(3)][-1] == 429
            assert await enroll("203.0.113.8") != 429


async def _bootstrap(cp: Plane, headers: dict[str, str]) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s, s.get(cp.url + "/api/auth/bootstrap", headers=headers) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("settings, headers", [
    # The shipped nginx site sets these; the proxy may run as the server's own user.
    ({}, {"X-Forwarded-For": "203.0.113.7"}),
    ({}, {"X-Forwarded-Proto": "https"}),
    ({}, {"Forwarded": "for=203.0.113.7"}),
    ({}, {"X-Real-IP": "203.0.113.7"}),
    ({"CODEFYUI_TRUSTED_PROXIES": "127.0.0.1"}, {"X-Forwarded-For": "127.0.0.1"}),
    # A proxy that adds no header at all: the operator turns bootstrap off.
    ({"CODEFYUI_BOOTSTRAP": "0"}, {}),
])
async def test_bootstrap_refuses_proxied_requests(dirs: dict[str, Path], settings: dict[str, str],
                                                  headers: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    """A proxied client gets a short refusal naming nothing of this machine; the owner's log says why."""
    caplog.set_level(logging.WARNING, logger="cdui.plane.server")
    async with Plane(dirs["user_data"], dirs["data_dir"], **settings) as cp:
        status, body = await _bootstrap(cp, headers)
        assert status == 403, body
        assert body["error"]["code"] == "not_owner"
        text = str(body)
        assert cp.app is not None and "token" not in body
        assert cp.app[SESSION_TOKEN] not in text
        for leak in (str(dirs["user_data"]), "session-token", "uid", "root"):
            assert leak not in text, (leak, body)
        assert str(dirs["user_data"] / "session-token") in caplog.text
        if "CODEFYUI_BOOTSTRAP" not in settings:
            # The owner's own page, straight to the server, still gets it.
            assert await _bootstrap(cp, {}) == (200, {"token": cp.app[SESSION_TOKEN]})
