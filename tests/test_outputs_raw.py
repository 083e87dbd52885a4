"""A recorded output's raw tensor, downloaded with ``GET /api/runs/{id}/outputs/{node}/{port}/raw``.

The store is written by the real recorder (:mod:`cdui.run.outputs`) with real tensors; the route
is served by a real control plane app on a loopback port over a real sqlite file. The last test
runs a real local run subprocess (e2e tier).
"""
from __future__ import annotations

import asyncio
import io
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "inproc"))
from harness import FakeAgent, Plane  # noqa: E402

from cdui.run import outputs  # noqa: E402

GRAPH = {"format_version": 1, "name": "two tensors", "edges": [
    {"id": "t0", "source": "start", "sourceHandle": "trigger", "target": "seq", "targetHandle": None,
     "type": "trigger"}],
    "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "seq", "type": "TensorCreate", "position": {"x": 0, "y": 0},
         "data": {"params": {"shape": "5", "fill": "arange"}}}]}


def _record(root: Path, run_id: str, node_id: str, result: dict[str, object], max_bytes: int = 1 << 30) -> None:
    warnings: list[str] = []
    rec = outputs.Recorder(root, run_id, max_bytes, warnings.append)
    rec.node(node_id, "T", result)
    rec.close(60)
    assert warnings == []


def test_find_raw_names_the_kept_file_or_says_why_there_is_none(tmp_path):
    root = tmp_path / "outputs"
    _record(root, "r1", "n", {"a": torch.arange(3.0), "note": "text", "b": torch.ones(2, 2)})
    assert outputs.find_raw(root, "r1", "n", "b") == root / "r1" / f"{outputs.node_file('n')}.2.pt"
    assert torch.equal(torch.load(outputs.find_raw(root, "r1", "n", "a")), torch.arange(3.0))
    cases = [
        (("r1", "n", "nope"), "node 'n' has no output 'nope'; its outputs are a, note, b"),
        (("r1", "n", "note"), "output 'note' of node 'n' has no raw tensor kept: it is not a tensor"),
        (("r1", "other", "a"), "node 'other' of run r1 has no recorded outputs here"),
        (("../r1", "n", "a"), "node 'n' of run ../r1 has no recorded outputs here"),
        (("r2", "n", "a"), "node 'n' of run r2 has no recorded outputs here"),
    ]
    for args, message in cases:
        with pytest.raises(outputs.RawNotKept) as err:
            outputs.find_raw(root, *args)
        assert str(err.value) == message
    # A tensor over the store's bound keeps its summary only.
    _record(root, "r3", "big", {"t": torch.zeros(4096)}, max_bytes=8000)
    with pytest.raises(outputs.RawNotKept, match="has no raw tensor kept: it was over 64 MiB or the store's bound"):
        outputs.find_raw(root, "r3", "big", "t")
    # A file swapped for a link is never followed.
    path = outputs.find_raw(root, "r1", "n", "a")
    path.unlink()
    path.symlink_to("/etc/passwd")
    with pytest.raises(outputs.RawNotKept):
        outputs.find_raw(root, "r1", "n", "a")


def test_a_worker_run_without_recorded_outputs_has_no_raw_tensor(tmp_path):
    asyncio.run(_worker_run(tmp_path))


async def _worker_run(tmp_path: Path) -> None:
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        agent = await FakeAgent(plane).enroll()
        await agent.connect()
        status, run = await plane.api("POST", "/api/runs", {"graph": GRAPH, "options": {
            "target": {"worker": "w1"}, "record_outputs": True}})
        assert status == 201, run
        await agent.assignment()
        await agent.status(run["id"], "running")
        # (A worker run's raw tensors are read from the worker: tests/test_outputs_raw_worker.py.)
        # Without record_outputs there is nothing to download, wherever it ran.
        status, plain = await plane.api("POST", "/api/runs", {"graph": GRAPH, "options": {"target": {"worker": "w1"}}})
        assert status == 201, plain
        status, body = await plane.api("GET", f"/api/runs/{plain['id']}/outputs/seq/tensor/raw")
        assert (status, body["error"]["code"]) == (404, "outputs_not_recorded"), body
        status, body = await plane.api("GET", "/api/runs/nosuchrun/outputs/seq/tensor/raw")
        assert (status, body["error"]["code"]) == (404, "not_found"), body
        await agent.close()


@pytest.mark.e2e  # a real run subprocess, importing torch
def test_a_local_runs_raw_tensor_downloads_bounded(tmp_path):
    asyncio.run(_local_run(tmp_path))


async def _local_run(tmp_path: Path) -> None:
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        status, run = await plane.api("POST", "/api/runs", {"graph": GRAPH, "options": {
            "target": "local", "device": "cpu", "record_outputs": True}})
        assert status == 201, run
        rid = run["id"]
        done = await plane.wait_status(rid, "succeeded", "failed", timeout=180)
        assert done["status"] == "succeeded", done
        assert plane.session is not None
        async with plane.session.get(f"{plane.url}/api/runs/{rid}/outputs/seq/tensor/raw") as r:
            assert r.status == 200, await r.text()
            assert r.headers["Content-Type"] == "application/octet-stream"
            assert r.headers["Content-Disposition"] == f'attachment; filename="{rid}-seq-tensor.pt"'
            data = await r.read()
        assert torch.equal(torch.load(io.BytesIO(data)), torch.arange(5, dtype=torch.float32))
        status, body = await plane.api("GET", f"/api/runs/{rid}/outputs/seq/nope/raw")
        assert (status, body["error"]["code"]) == (404, "raw_not_kept"), body
        assert body["error"]["message"] == "node 'seq' has no output 'nope'; its outputs are tensor"
        # A kept file over the download bound (grown in place, sparse) is refused before a byte is sent.
        path = outputs.find_raw(plane.config.user_data / "outputs", rid, "seq", "tensor")
        os.truncate(path, outputs.RAW_SERVE_MAX_BYTES + 1)
        status, body = await plane.api("GET", f"/api/runs/{rid}/outputs/seq/tensor/raw")
        assert (status, body["error"]["code"]) == (413, "raw_too_large"), body
        assert body["error"]["message"] == (f"the raw tensor of output 'tensor' of node 'seq' is 65.0 MiB "
                                            f"({outputs.RAW_SERVE_MAX_BYTES + 1} bytes), over the download bound of "
                                            f"65 MiB")
