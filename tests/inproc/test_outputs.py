"""Recorded node outputs read over a worker's connection, and the run's drawing.

A real control plane app on a loopback port over a real sqlite file; a fake
agent speaks the real protocol and answers (or does not answer) the
control plane's ``outputs_request`` as each test says; the fetch timeout
runs on the fake clock, so the test steps it instead of waiting 60 s.
"""
from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from harness import FakeAgent, Plane

from cdui.plane.drawing import drawing
from cdui.run import outputs

GRAPH = {"format_version": 1, "name": "two tensors", "edges": [
    {"id": f"t{i}", "source": "start", "sourceHandle": "trigger", "target": t, "targetHandle": None, "type": "trigger"}
    for i, t in enumerate(("img", "seq"))],
    "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "img", "type": "TensorCreate", "position": {"x": 0, "y": 0},
         "data": {"params": {"shape": "1,3,8,8", "fill": "full", "value": 0.5}}},
        {"id": "seq", "type": "TensorCreate", "position": {"x": 0, "y": 0},
         "data": {"params": {"shape": "5", "fill": "arange"}}}]}

THUMB = base64.b64encode(outputs.png(2, 1, 3, bytes([255, 0, 0, 0, 0, 255]))).decode()
SUMMARY = {"node_id": "img", "type": "TensorCreate", "outputs": [
    {"port": "tensor", "kind": "tensor", "shape": [1, 3, 8, 8], "dtype": "float32", "min": 0.5, "max": 0.5,
     "mean": 0.5, "thumbnail": THUMB}]}


class Requests(list):  # type: ignore[type-arg]
    """The fake agent's inbox: the control plane's outputs requests also go to a queue the test awaits."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.errors: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def append(self, d: Any) -> None:
        super().append(d)
        if d.get("type") == "outputs_request":
            self.queue.put_nowait(d)
        elif d.get("type") == "error":
            self.errors.put_nowait(d)


async def _setup(plane: Plane) -> tuple[FakeAgent, Requests, str]:
    agent = await FakeAgent(plane).enroll()
    inbox = Requests()
    agent.inbox = inbox
    await agent.connect()
    status, run = await plane.api("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "w1"}, "record_outputs": True}})
    assert status == 201, run
    assign = await agent.assignment()
    # The control plane never tells a worker where to keep captures: each machine decides its own store.
    assert outputs.OPT_DIR not in assign["job"]["options"] and assign["job"]["options"]["record_outputs"] is True
    await agent.status(run["id"], "running")
    return agent, inbox, run["id"]


async def _answer(agent: FakeAgent, request: dict[str, Any], **fields: Any) -> None:
    assert agent.ws is not None
    await agent.ws.send_str(json.dumps({"type": "outputs_answer", "request_id": request["request_id"],
                                        "run_id": request["run_id"], "node_id": request["node_id"], **fields}))


async def test_a_worker_runs_outputs_are_read_over_its_connection(tmp_path):
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        agent, inbox, rid = await _setup(plane)
        try:
            listing = asyncio.create_task(plane.api("GET", f"/api/runs/{rid}/outputs"))
            req = await asyncio.wait_for(inbox.queue.get(), 30)
            assert (req["run_id"], req["node_id"]) == (rid, None)
            await _answer(agent, req, nodes=[{"node_id": "img", "type": "TensorCreate"}])
            assert await listing == (200, {"run_id": rid, "record_outputs": True, "worker": "w1",
                                           "nodes": [{"node_id": "img", "type": "TensorCreate"}]})

            one = asyncio.create_task(plane.api("GET", f"/api/runs/{rid}/outputs/img"))
            req = await asyncio.wait_for(inbox.queue.get(), 30)
            assert (req["run_id"], req["node_id"]) == (rid, "img")
            # A field the control plane does not know is dropped, not passed on to the browser.
            hostile = json.loads(json.dumps(SUMMARY))
            hostile["outputs"][0]["path"] = "/etc/passwd"
            hostile["extra"] = {"deep": [[[1]]]}
            await _answer(agent, req, summary=hostile)
            assert await one == (200, {"run_id": rid, "worker": "w1", **SUMMARY})
        finally:
            await agent.close()


BAD_SUMMARIES = {
    "a shape of 17 sizes": {"shape": [1] * 17},
    "a thumbnail that is not a PNG": {"thumbnail": base64.b64encode(b"GIF89a....").decode()},
    "a thumbnail over 64 KiB": {"thumbnail": "A" * (64 * 1024 + 4)},
    "a port name of 129 characters": {"port": "p" * 129},
    "a min that is not a number": {"min": "0.5"},
    "an output that is a list": None,
}


async def test_malformed_answers_are_refused_and_their_requests_end_504(tmp_path):
    async with Plane(tmp_path / "ud", tmp_path / "data",
                     CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S="5") as plane:
        agent, inbox, rid = await _setup(plane)
        try:
            for what, change in BAD_SUMMARIES.items():
                one = asyncio.create_task(plane.api("GET", f"/api/runs/{rid}/outputs/img"))
                req = await asyncio.wait_for(inbox.queue.get(), 30)
                bad = json.loads(json.dumps(SUMMARY))
                if change is None:
                    bad["outputs"] = [["not", "an", "object"]]
                else:
                    bad["outputs"][0].update(change)
                await _answer(agent, req, summary=bad)
                err = await asyncio.wait_for(inbox.errors.get(), 30)
                assert err["message"].startswith("malformed message: outputs_answer: "), (what, err)
                # Less than the missed-heartbeat verdict (3 beats of 10 s): the worker stays connected.
                await plane.elapse(5)
                status, body = await one
                assert (status, body["error"]["code"]) == (504, "worker_output_timeout"), (what, body)
                assert body["error"]["message"] == ("worker w1 did not send the recorded outputs within 5 s "
                                                    "(CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S)")
            # The connection and the server keep serving: the next request is answered.
            again = asyncio.create_task(plane.api("GET", f"/api/runs/{rid}/outputs/img"))
            req = await asyncio.wait_for(inbox.queue.get(), 30)
            await _answer(agent, req, summary=SUMMARY)
            assert (await again)[0] == 200
        finally:
            await agent.close()


async def test_an_offline_or_departing_worker_answers_504(tmp_path):
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        agent, inbox, rid = await _setup(plane)
        one = asyncio.create_task(plane.api("GET", f"/api/runs/{rid}/outputs"))
        await asyncio.wait_for(inbox.queue.get(), 30)
        await agent.close()  # gone before it answered
        status, body = await one
        assert (status, body["error"]) == (504, {
            "code": "worker_offline", "message": "worker w1 disconnected before it answered",
            "hint": "retry once it is connected again"}), body
        status, body = await plane.api("GET", f"/api/runs/{rid}/outputs/img")
        assert (status, body["error"]["code"]) == (504, "worker_offline"), body
        assert body["error"]["message"] == ("worker w1 is not connected: a worker run's recorded outputs stay on "
                                            "that worker and can be read only while it is connected")


async def test_a_run_without_record_outputs_has_none(tmp_path):
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        agent = await FakeAgent(plane).enroll()  # enrolled, never connected: the run stays queued
        status, run = await plane.api("POST", "/api/runs", {"graph": GRAPH, "options": {"target": {"worker": "w1"}}})
        assert status == 201, run
        assert await plane.call("GET", f"/api/runs/{run['id']}/outputs") == {
            "run_id": run["id"], "record_outputs": False, "worker": None, "nodes": []}
        status, body = await plane.api("GET", f"/api/runs/{run['id']}/outputs/img")
        assert (status, body["error"]["code"]) == (404, "outputs_not_recorded"), body
        status, body = await plane.api("GET", "/api/runs/nosuchrun/outputs")
        assert status == 404, body
        await agent.close()


def test_the_drawing_keeps_the_graphs_places_or_lays_nodes_out_in_layers():
    assert drawing(GRAPH) == {"placed": "layers", "edges": [{"source": "start", "target": "img"},
                                                            {"source": "start", "target": "seq"}],
                              "nodes": [{"id": "start", "type": "Start", "x": 0.0, "y": 0.0},
                                        {"id": "img", "type": "TensorCreate", "x": 190.0, "y": 0.0},
                                        {"id": "seq", "type": "TensorCreate", "x": 190.0, "y": 70.0}]}
    placed = json.loads(json.dumps(GRAPH))
    for i, n in enumerate(placed["nodes"]):
        n["position"] = {"x": 10 * i, "y": -5 * i}
    assert [(n["x"], n["y"]) for n in drawing(placed)["nodes"]] == [(0, 0), (10, -5), (20, -10)]
    assert drawing(placed)["placed"] == "graph"
    # A chain is laid out by its longest path; edges to unknown nodes and params never come out.
    chain = {"nodes": [{"id": c, "type": "T", "data": {"params": {"secret": "x"}}} for c in "abc"],
             "edges": [{"source": "a", "target": "c"}, {"source": "b", "target": "c"}, {"source": "a", "target": "b"},
                       {"source": "a", "target": "ghost"}]}
    d = drawing(chain)
    assert [(n["id"], n["x"], n["y"]) for n in d["nodes"]] == [("a", 0.0, 0.0), ("b", 190.0, 0.0), ("c", 380.0, 0.0)]
    assert "secret" not in json.dumps(d) and len(d["edges"]) == 3


@pytest.mark.e2e  # a real run subprocess, importing torch
async def test_a_local_run_records_into_the_control_planes_own_store(tmp_path):
    async with Plane(tmp_path / "ud", tmp_path / "data") as plane:
        status, run = await plane.api("POST", "/api/runs", {"graph": GRAPH, "options": {
            "target": "local", "device": "cpu", "record_outputs": True}})
        assert status == 201, run
        rid = run["id"]
        done = await plane.wait_status(rid, "succeeded", "failed", timeout=180)
        assert done["status"] == "succeeded", done
        assert await plane.call("GET", f"/api/runs/{rid}/outputs") == {
            "run_id": rid, "record_outputs": True, "worker": None, "nodes": [
                {"node_id": "start", "type": "Start"}, {"node_id": "img", "type": "TensorCreate"},
                {"node_id": "seq", "type": "TensorCreate"}]}
        img = await plane.call("GET", f"/api/runs/{rid}/outputs/img")
        thumb = img["outputs"][0].pop("thumbnail")
        assert img == {"run_id": rid, "worker": None, "node_id": "img", "type": "TensorCreate", "outputs": [
            {"port": "tensor", "kind": "tensor", "shape": [1, 3, 8, 8], "dtype": "float32",
             "min": 0.5, "max": 0.5, "mean": 0.5, "preview": [[0.5] * 8] * 8}]}
        assert base64.b64decode(thumb)[16:24] == (8).to_bytes(4, "big") * 2  # the PNG's own width and height
        seq = await plane.call("GET", f"/api/runs/{rid}/outputs/seq")
        assert seq["outputs"] == [{"port": "tensor", "kind": "tensor", "shape": [5], "dtype": "float32",
                                   "min": 0.0, "max": 4.0, "mean": 2.0, "preview": [[0.0, 1.0, 2.0, 3.0, 4.0]]}]
        # The capture is in this control plane's user data folder, raw tensors included.
        store = plane.config.user_data / "outputs"
        assert sorted(p.name for p in store.iterdir()) == [rid]
        assert len(list((store / rid).glob("*.pt"))) == 2
        # Deleting the run deletes its capture.
        await plane.call("DELETE", f"/api/runs/{rid}")
        assert list(store.iterdir()) == []
