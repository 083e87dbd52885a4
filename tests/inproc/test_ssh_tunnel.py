"""The per-SSH-worker tunnel listener (cdui/plane/ssh/tunnel.py): only an agent's routes,
worker credentials only, enrollment rate limited per SSH worker; and on the
server's own port, no Host makes a request count as tunnelled."""
from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import aiohttp
from harness import FakeAgent, Plane

from cdui import __version__
from cdui.plane.appkeys import SESSION_TOKEN
from cdui.plane.ssh.tunnel import TunnelListener


async def call(sock: str, method: str, path: str, headers: dict[str, str] | None = None,
               body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s:
        async with s.request(method, "http://cp-3f9a12c4.invalid:18000" + path, headers=headers or {},
                             json=body) as r:
            return r.status, await r.json(content_type=None)


async def test_listener_serves_only_agent_routes(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as plane:
        assert plane.app is not None
        w1 = await FakeAgent(plane, "w1").enroll()
        w2 = await FakeAgent(plane, "w2").enroll()
        listener = TunnelListener(plane.app, "w1")
        sock = await listener.start()
        try:
            assert stat.S_IMODE(Path(sock).parent.stat().st_mode) == 0o700
            session = plane.app[SESSION_TOKEN]
            for method, path in (("GET", "/api/auth/bootstrap"), ("GET", "/"), ("GET", "/index.html"),
                                 ("GET", "/api/health"), ("GET", "/api/runs"), ("GET", "/api/workers"),
                                 ("POST", "/api/workers/tokens"), ("GET", "/web/app.js"),
                                 ("GET", "/api/runs/x/artifacts/1/download")):
                for host in ({}, {"Host": "127.0.0.1:8000"}, {"Host": "evil.example"}):
                    status, body = await call(sock, method, path, {**host, "X-CodefyUI-Token": session})
                    assert status == 404, (method, path, host, status, body)
            # The session token is refused where an agent's routes are.
            for headers in ({"X-CodefyUI-Token": session}, {"Authorization": f"Bearer {session}"}):
                status, body = await call(sock, "GET", "/ws/worker", headers)
                assert status == 403 and "session token" in body["error"]["message"]
                status, _ = await call(sock, "GET", "/api/files/download/a.csv", headers)
                assert status == 403
            # Downloads need a worker credential here (on the LAN port they are public to the owner's page).
            status, body = await call(sock, "GET", "/api/files/download/a.csv")
            assert status == 403 and "needs a worker credential" in body["error"]["message"]
            # w1's credential gets through to the route's own check; w2's is not this tunnel's.
            status, body = await call(sock, "GET", "/api/files/download/a.csv",
                                      {"Authorization": f"Bearer {w1.credential}"})
            assert status == 403 and "not an input of one of its runs" in body["error"]["message"]
            status, body = await call(sock, "GET", "/api/files/download/a.csv",
                                      {"Authorization": f"Bearer {w2.credential}"})
            assert status == 403 and body["error"]["code"] == "credential_mismatch"
            # On the server's own port, the tunnel's pseudo-address is just a Host outside the allowlist.
            assert plane.session is not None
            async with plane.session.get(plane.url + "/api/health",
                                         headers={"Host": "cp-3f9a12c4.invalid:18000"}) as r:
                assert r.status == 421
        finally:
            await listener.close()
        assert not Path(sock).parent.exists()


async def test_listener_websocket_admits_its_worker(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as plane:
        assert plane.app is not None
        w1 = await FakeAgent(plane, "w1").enroll()
        listener = TunnelListener(plane.app, "w1")
        sock = await listener.start()
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock)) as s:
                async with s.ws_connect("ws://cp-3f9a12c4.invalid:18000/ws/worker",
                                        headers={"Authorization": f"Bearer {w1.credential}"}) as ws:
                    await ws.send_json({"type": "hello", "version": __version__, "name": "w1", "devices": ["cpu"],
                                        "labels": {}, "machine_id": "another-machine", "runs": []})
                    msg = await ws.receive_json(timeout=30)
                    assert msg["type"] == "welcome"
                    w = await plane.worker("w1")
                    assert w is not None and w["online"] and w["address"] == "127.0.0.1"
                    assert w["unencrypted"] is False and w["same_machine"] is False
        finally:
            await listener.close()


async def test_enrollment_through_a_tunnel_is_limited_per_ssh_worker(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"], CODEFYUI_ENROLL_RATE_PER_MIN="2") as plane:
        assert plane.app is not None
        a, b = TunnelListener(plane.app, "a"), TunnelListener(plane.app, "b")
        sa, sb = await a.start(), await b.start()
        try:
            bad = {"token": "aaaaaa.bbbbbbbbbbbbbbbb", "name": "a", "devices": ["cpu"], "version": __version__}
            assert [(await call(sa, "POST", "/api/workers/enroll", body=bad))[0] for _ in range(3)] == [401, 401, 429]
            # Another SSH worker's tunnel, and agents on the server's own port, are not affected.
            assert (await call(sb, "POST", "/api/workers/enroll", body=bad))[0] == 401
            status, _ = await plane.api("POST", "/api/workers/enroll", bad)
            assert status == 401
            tok = (await plane.call("POST", "/api/workers/tokens", {"ttl_s": 600, "uses": 1}, expect=201))["token"]
            status, body = await call(sb, "POST", "/api/workers/enroll", body={**bad, "token": tok, "name": "b"})
            assert status == 201 and body["worker"] == "b"
        finally:
            await a.close()
            await b.close()
