"""The web page's session cookie and the server's address list, in process.

The cookie replaces the token in WebSocket and download URLs, so it must work
there, and nowhere else: any page the browser shows could make it send the
cookie, so a cookie alone must never reach the rest of the API, nor a download
or the event stream from a page of another origin."""
from __future__ import annotations

from pathlib import Path

import aiohttp
from harness import Plane

from cdui.plane.appkeys import SESSION_TOKEN
from cdui.plane.http import web_session


async def _upload(cp: Plane, name: str, data: bytes) -> None:
    assert cp.session is not None
    form = aiohttp.FormData()
    form.add_field("file", data, filename=name)
    async with cp.session.post(cp.url + "/api/files/upload", data=form) as r:
        assert r.status in (200, 201), await r.text()


async def test_bootstrap_cookie_works_for_downloads_and_event_stream_only(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        await _upload(cp, "hello.csv", b"a,b\n1,2\n")
        run = await cp.submit({"target": "local"})
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            # The owner's page bootstraps over loopback and gets the cookie with the token.
            async with browser.get(cp.url + "/api/auth/bootstrap") as r:
                assert r.status == 200, await r.text()
                set_cookie = r.headers.getall("Set-Cookie")
            port = cp.url.rsplit(":", 1)[1]
            [header] = [c for c in set_cookie if c.startswith(f"{web_session.COOKIE}_{port}=")]
            assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/" in header
            # A download link and the event stream work with the cookie alone.
            async with browser.get(cp.url + "/api/files/download/hello.csv") as r:
                assert r.status == 200 and await r.read() == b"a,b\n1,2\n"
            async with browser.ws_connect(cp.url + f"/ws/runs/{run['id']}?after=0",
                                          headers={"Origin": cp.url}) as ws:
                first = await ws.receive_json(timeout=30)
                assert first["seq"] == 1
            # Everything else still needs the header.
            async with browser.get(cp.url + "/api/runs") as r:
                assert r.status == 401
            async with browser.post(cp.url + "/api/runs", json={"graph": {}}) as r:
                assert r.status == 401
            async with browser.delete(cp.url + f"/api/runs/{run['id']}") as r:
                assert r.status == 401
            # A page of another origin (another port of localhost is the same site) gets nothing.
            async with browser.get(cp.url + "/api/files/download/hello.csv",
                                   headers={"Sec-Fetch-Site": "same-site"}) as r:
                assert r.status == 401
            async with browser.get(cp.url + "/api/files/download/hello.csv",
                                   headers={"Origin": "http://localhost:1"}) as r:
                assert r.status == 401
            try:
                async with browser.ws_connect(cp.url + f"/ws/runs/{run['id']}?after=0",
                                              headers={"Origin": "http://localhost:1"}):
                    raise AssertionError("a cross-origin page opened the event stream with the cookie")
            except aiohttp.WSServerHandshakeError as err:
                assert err.status == 401


async def test_cookie_for_a_pasted_token_and_the_old_ways_still_work(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        await _upload(cp, "x.txt", b"x")
        assert cp.app is not None
        token = cp.app[SESSION_TOKEN]
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            # Without the header the cookie route is refused like any other.
            async with browser.post(cp.url + "/api/auth/cookie") as r:
                assert r.status == 401
            async with browser.get(cp.url + "/api/files/download/x.txt") as r:
                assert r.status == 401
            async with browser.post(cp.url + "/api/auth/cookie", headers={"X-CodefyUI-Token": token}) as r:
                assert r.status == 200
            async with browser.get(cp.url + "/api/files/download/x.txt") as r:
                assert r.status == 200
        async with aiohttp.ClientSession() as plain:
            # The header and ?token= on download links keep working as before.
            async with plain.get(cp.url + "/api/files/download/x.txt", headers={"X-CodefyUI-Token": token}) as r:
                assert r.status == 200
            async with plain.get(cp.url + f"/api/files/download/x.txt?token={token}") as r:
                assert r.status == 200
            # A wrong cookie is no token.
            async with plain.get(cp.url + "/api/files/download/x.txt",
                                 cookies={f"{web_session.COOKIE}_{cp.url.rsplit(':', 1)[1]}": "wrong"}) as r:
                assert r.status == 401


async def test_server_addresses_lists_interfaces_not_loopback(dirs: dict[str, Path]) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        got = await cp.call("GET", "/api/server/addresses")
        assert got["addresses"] == web_session.own_addresses()
        assert not [a for a in got["addresses"] if a.startswith("127.") or a == "::1"]
        assert got["port"] == int(cp.url.rsplit(":", 1)[1]) and got["scheme"] == "http"
        async with aiohttp.ClientSession() as anon:
            async with anon.get(cp.url + "/api/server/addresses") as r:
                assert r.status == 401
