"""Bounds on what one run may put on the control plane: one event's size
(``CODEFYUI_RUN_EVENT_MAX_BYTES``) and all of a run's uploads (``CODEFYUI_RUN_UPLOAD_QUOTA``).

A real control plane in this process; the worker is the fake agent speaking the real protocol
and uploading over real HTTP with its worker credential."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cdui.core.event_size import bound_event, encoded_size
from tests.inproc.harness import FakeAgent, Plane

MiB = 1024 * 1024


@pytest.mark.parametrize("kind, data, limit, expect", [
    ("log", {"message": "short", "level": "info"}, 100, {"message": "short", "level": "info"}),
    ("log", {"message": "x" * 50}, 0, {"message": "x" * 50}),  # 0: no bound
    ("progress", {"node_id": "n", "values": list(range(2000)), "note": "ok"}, 2048, "cut"),
    ("log", {"message": "é" * 5000, "level": "info"}, 4096, "cut"),
    ("graph_output", {"name": "big", "node_id": "out", "value": "v" * 5000}, 1024, "error"),
    ("metric", {f"k{i}": i for i in range(2000)}, 1024, "replaced"),
])
def test_bound_event(kind: str, data: dict[str, Any], limit: int, expect: Any) -> None:
    out = bound_event(kind, data, limit)
    if isinstance(expect, dict):
        assert out is data or out == expect
        return
    size = encoded_size(data)
    assert encoded_size(out) <= limit
    if expect == "error":
        assert out["name"] == "big" and out["node_id"] == "out" and out["error"]["code"] == "output_too_large"
        assert f"{size:,} bytes as JSON, more than CODEFYUI_RUN_EVENT_MAX_BYTES={limit:,}" in out["error"]["message"]
        return
    assert out["truncated"] == {"original_bytes": size, "limit": limit}
    marker = f"…[cut by cdui: this event was {size:,} bytes, more than CODEFYUI_RUN_EVENT_MAX_BYTES={limit:,}"
    if expect == "replaced":
        assert out["message"].startswith(marker)
    else:
        assert marker in json.dumps(out, ensure_ascii=False)
        assert set(data) <= set(out)  # every key kept: level, node_id, note
        assert all(out[k] == v for k, v in data.items() if encoded_size(v) < 100)


def _db_bytes(user_data: Path) -> int:
    return sum(p.stat().st_size for p in user_data.glob("cdui.sqlite3*"))


async def test_a_7_mib_log_event_is_cut_with_a_marker_not_stored_whole(tmp_path: Path) -> None:
    async with Plane(tmp_path / "ud", tmp_path / "data") as cp:  # the default bound, 4 MiB
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run = await cp.submit({"target": {"worker": "w1"}})
            await agent.assignment()
            await agent.status(run["id"], "running", pid=1)
            await agent.log(run["id"], "L" * (7 * MiB))
            await agent.send(run["id"], "graph_output", name="image", node_id="out", value="B" * (5 * MiB))
            await agent.log(run["id"], "after")
            events = await cp.events(run["id"])
            logs = [e["data"] for e in events if e["kind"] == "log"]
            assert [len(d["message"]) < 4 * MiB for d in logs] == [True, True]
            big = logs[0]
            size = big["truncated"]["original_bytes"]
            assert 7 * MiB < size < 7 * MiB + 100 and big["truncated"]["limit"] == 4 * MiB
            assert big["message"].startswith("LLLL") and big["message"].endswith(
                f"…[cut by cdui: this event was {size:,} bytes, more than "
                f"CODEFYUI_RUN_EVENT_MAX_BYTES={4 * MiB:,}; write large data to a file instead]")
            assert logs[1]["message"] == "after"
            [out] = [e["data"] for e in events if e["kind"] == "graph_output"]
            assert (out["name"], out["error"]["code"]) == ("image", "output_too_large")
            assert _db_bytes(tmp_path / "ud") < 6 * MiB  # neither the 7 MiB log nor the 5 MiB output is stored
        finally:
            await agent.close()


async def _upload(cp: Plane, credential: str, run_id: str, name: str, body: bytes,
                  announce: bool = True) -> tuple[int, Any]:
    meta: dict[str, Any] = {"group": "artifact", "kind": "checkpoint", "name": name}
    if announce:
        meta["size"] = len(body)
    form = aiohttp.FormData()
    form.add_field("meta", json.dumps(meta), content_type="application/json")
    form.add_field("file", body, filename=name, content_type="application/octet-stream")
    async with aiohttp.ClientSession() as s:  # the worker's credential only, no session token
        async with s.post(f"{cp.url}/api/runs/{run_id}/artifacts/upload", data=form,
                          headers={"Authorization": f"Bearer {credential}"}) as r:
            return r.status, await r.json()


async def test_uploads_past_the_runs_quota_are_refused_clearly(tmp_path: Path) -> None:
    async with Plane(tmp_path / "ud", tmp_path / "data", CODEFYUI_RUN_UPLOAD_QUOTA="1000") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            run = await cp.submit({"target": {"worker": "w1"}})
            await agent.assignment()
            await agent.status(run["id"], "running", pid=1)
            rid = run["id"]
            assert (await _upload(cp, agent.credential, rid, "a.pt", b"a" * 600))[0] == 201
            for name, announce in (("b.pt", True), ("c.pt", False)):  # refused from its meta, or while streaming
                status, body = await _upload(cp, agent.credential, rid, name, b"b" * 600, announce)
                assert (status, body["error"]["code"]) == (413, "upload_quota"), body
                assert "over its quota of 1000 bytes (CODEFYUI_RUN_UPLOAD_QUOTA); 600 bytes are stored already" \
                       in body["error"]["message"] and "stays on the worker" in body["error"]["hint"], body
            assert (await _upload(cp, agent.credential, rid, "d.pt", b"d" * 400))[0] == 201  # exactly the quota
            status, body = await _upload(cp, agent.credential, rid, "e.pt", b"e", announce=False)
            assert (status, body["error"]["code"]) == (413, "upload_quota"), body
            stored = sorted(p.name for p in (tmp_path / "data" / "runs" / rid / "checkpoint").iterdir())
            assert stored == ["a.pt", "d.pt"]
            assert sorted(a["name"] for a in await cp.call("GET", f"/api/runs/{rid}/artifacts")) == ["a.pt", "d.pt"]
        finally:
            await agent.close()
