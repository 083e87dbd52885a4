"""Published apps (docs/apps.md): publish, versions, API keys, invokes on the warm serving process,
its crash, and what a key may open; a real control plane in this process, its serving processes
real canvas processes (torch imported, the graph run by the real executor)."""
from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.inproc.harness import Plane, e, eventually, n, t

SLOW_NODES = textwrap.dedent('''
    """A node that takes its input's number of seconds, for the serving-process crash test."""
    import time

    from cdui.nodes.base import Node, Port


    class AppSleepNode(Node):
        NODE_NAME = "TestAppSleep"
        @classmethod
        def define_inputs(cls):
            return [Port("value", "ANY", "seconds to sleep")]

        @classmethod
        def define_outputs(cls):
            return [Port("value", "ANY", "the same number")]

        def execute(self, inputs, params, ctx):
            time.sleep(float(inputs["value"]))
            return {"value": inputs["value"]}
''')


def scaled(factor: float) -> dict[str, Any]:
    """values (json) * factor -> scaled; seconds (number, optional) slept, then answered as slept."""
    return {"nodes": [n("start", "Start"), n("in", "GraphInput", name="values", type="json",
                                             description="numbers to scale"),
                      n("sec", "GraphInput", name="seconds", type="number", required=False, default="0"),
                      n("mul", "ScalarMultiply", scalar=factor), n("sleep", "TestAppSleep"),
                      n("out", "GraphOutput", name="scaled"), n("out2", "GraphOutput", name="slept")],
            "edges": [t("in"), t("sec"), e("in", "value", "mul", "tensor"), e("mul", "tensor", "out", "value"),
                      e("sec", "value", "sleep", "value"), e("sleep", "value", "out2", "value")]}


class Client:
    """An API client holding only an API key (no session token)."""

    def __init__(self, plane: Plane, key: str | None) -> None:
        self.plane = plane
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, \
                s.request(method, self.plane.url + path, json=body, headers=self.headers) as r:
            return r.status, await r.json(content_type=None)


@pytest.fixture
def plane_dirs(dirs: dict[str, Path]) -> dict[str, Path]:
    nodes = dirs["data_dir"] / "custom_nodes"
    nodes.mkdir(parents=True)
    (nodes / "app_nodes.py").write_text(SLOW_NODES)
    return dirs


@pytest.mark.e2e  # serving processes are real processes with torch imported
async def test_publish_invoke_versions_keys_and_a_crash_mid_invoke(plane_dirs: dict[str, Path]) -> None:
    async with Plane(**plane_dirs) as cp:
        await cp.call("PUT", "/api/graphs/scale", scaled(3.0), expect=201)
        # Publishing to an unknown slug needs "create"; slugs follow CodefyUI's rule.
        status, body = await cp.api("POST", "/api/apps/scaler/publish", {"graph": "scale"})
        assert (status, body["error"]["code"]) == (404, "app_not_found"), body
        status, body = await cp.api("POST", "/api/apps/Bad_Slug/publish", {"graph": "scale", "create": True})
        assert (status, body["error"]["code"]) == (422, "invalid_slug")
        status, body = await cp.api("POST", "/api/apps/scaler/publish", {"graph": "nope", "create": True})
        assert (status, body["error"]["code"]) == (404, "graph_not_found")
        v1 = await cp.call("POST", "/api/apps/scaler/publish",
                           {"graph": "scale", "create": True, "note": "first", "git_commit": "abc1234",
                            "git_dirty": False}, expect=201)
        assert (v1["version"], v1["active"], v1["created"]) == (1, True, True)

        key = await cp.call("POST", "/api/keys", {"name": "lab client"}, expect=201)
        assert key["key"].startswith("cdui_") and key["prefix"] == key["key"][:12]
        listed = (await cp.call("GET", "/api/keys"))["keys"]
        assert [k["prefix"] for k in listed] == [key["prefix"]] and "key" not in listed[0]
        client = Client(cp, key["key"])

        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1, 2]}})
        assert status == 200 and out["status"] == "succeeded", out["error"]
        assert out["outputs"]["scaled"]["values"] == [3.0, 6.0] and (out["app"], out["version"]) == ("scaler", 1)
        status, doc = await client.api("GET", "/api/apps/scaler/openapi.json")
        assert status == 200 and doc["info"]["version"] == "1" and doc["info"]["x-cdui-git-commit"] == "abc1234"
        schema = doc["paths"]["/api/apps/scaler/invoke"]["post"]["requestBody"]["content"]["application/json"]
        assert schema["schema"]["properties"]["inputs"]["required"] == ["values"]
        # A bad input is the caller's mistake, answered as such and recorded.
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"nope": 1}})
        assert (status, out["error"]["code"]) == (400, "bad_inputs")

        # A second version serves at once; activating the first serves its outputs again.
        await cp.call("PUT", "/api/graphs/scale", scaled(5.0))
        v2 = await cp.call("POST", "/api/apps/scaler/publish", {"graph": "scale"}, expect=201)
        assert (v2["version"], v2["created"]) == (2, False)
        out = (await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}}))[1]
        assert (out["version"], out["outputs"]["scaled"]["values"]) == (2, [5.0])
        await cp.call("POST", "/api/apps/scaler/activate", {"version": 1})
        out = (await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}}))[1]
        assert (out["version"], out["outputs"]["scaled"]["values"]) == (1, [3.0])
        status, body = await cp.api("POST", "/api/apps/scaler/activate", {"version": 9})
        assert (status, body["error"]["code"]) == (404, "version_not_found")

        # The serving process killed mid-invoke: that invoke alone fails (503), the next is served.
        pending = asyncio.ensure_future(client.api("POST", "/api/apps/scaler/invoke",
                                                   {"inputs": {"values": [1], "seconds": 60}}))

        async def busy() -> int | None:
            serving = (await cp.call("GET", "/api/apps"))["serving"]
            return next((p["pid"] for p in serving if p["state"] == "busy"), None)
        pid = await eventually(busy, "the serving process to run the slow invoke", 60)
        os.killpg(pid, signal.SIGKILL)
        status, out = await asyncio.wait_for(pending, 60)
        assert (status, out["error"]["code"]) == (503, "app_process_lost"), out
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [2]}})
        assert (status, out["outputs"]["scaled"]["values"]) == (200, [6.0])

        # Unpublished: refused, nothing lost; activating a version serves again.
        await cp.call("POST", "/api/apps/scaler/unpublish")
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
        assert (status, out["error"]["code"]) == (409, "app_unpublished")
        versions = (await cp.call("GET", "/api/apps/scaler/versions"))["versions"]
        assert [(v["version"], v["active"], v["note"]) for v in versions] == [(2, False, None), (1, False, "first")]

        # Every invoke is recorded, with its key, inputs and outputs (record_io is on by default).
        invokes = (await cp.call("GET", "/api/apps/scaler/invokes"))["invokes"]
        assert [i["status"] for i in invokes][:3] == ["succeeded", "failed", "succeeded"]
        assert all(i["key_id"] == key["id"] for i in invokes) and invokes[0]["inputs"] == {"values": [2]}
        assert invokes[0]["outputs"]["scaled"]["values"] == [6.0]
        await cp.call("PATCH", "/api/apps/scaler", {"record_io": False})
        await cp.call("POST", "/api/apps/scaler/activate", {"version": 2})
        await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
        last = (await cp.call("GET", "/api/apps/scaler/invokes?limit=1"))["invokes"][0]
        assert (last["version"], last["status"], last["inputs"], last["outputs"]) == (2, "succeeded", None, None)

        # A revoked key is refused at once; its row stays.
        await cp.call("POST", f"/api/keys/{key['id']}/revoke")
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
        assert (status, out["error"]["code"]) == (401, "unauthorized")
        assert (await cp.call("GET", "/api/keys"))["keys"][0]["revoked_at"] is not None

        await cp.call("DELETE", "/api/apps/scaler")
        assert (await cp.call("GET", "/api/apps"))["apps"] == []
        status, out = await cp.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
        assert (status, out["error"]["code"]) == (404, "app_not_found")
