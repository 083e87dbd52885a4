"""A saved graph called as an API function (``POST /api/graph/run/{name}``):
a real control plane in this process, its local runs in real run
subprocesses; the call routed to a worker uses the fake agent."""
from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest

from cdui.nodes.builtin._imagecodec import encode_png
from tests.inproc.harness import FakeAgent, Plane, e, n, t


def triple() -> dict[str, Any]:
    """values (json) * 3 -> tripled; label (string, optional) passed through."""
    return {"nodes": [n("start", "Start"), n("in", "GraphInput", name="values", type="json"),
                      n("lab", "GraphInput", name="label", type="string", required=False, default="hi"),
                      n("mul", "ScalarMultiply", scalar=3.0),
                      n("out", "GraphOutput", name="tripled"), n("out2", "GraphOutput", name="label")],
            "edges": [t("in"), t("lab"), e("in", "value", "mul", "tensor"), e("mul", "tensor", "out", "value"),
                      e("lab", "value", "out2", "value")]}


@pytest.mark.e2e  # runs real run subprocesses
async def test_save_list_and_call_a_graph(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs) as cp:
        saved = await cp.call("PUT", "/api/graphs/triple", triple(), expect=201)
        assert saved["callable"] is True
        assert [i["name"] for i in saved["contract"]["inputs"]] == ["values", "label"]
        listed = (await cp.call("GET", "/api/graphs"))["graphs"]
        assert [(g["name"], g["callable"]) for g in listed] == [("triple", True)]
        assert (await cp.call("GET", "/api/graphs/triple"))["nodes"][1]["type"] == "GraphInput"

        answer = await cp.call("POST", "/api/graph/run/triple", {"inputs": {"values": [1, 2]}, "device": "cpu"})
        assert answer["status"] == "succeeded" and answer["error"] is None
        assert answer["outputs"] == {"tripled": {"__type__": "tensor", "shape": [2], "dtype": "float32",
                                                 "values": [3.0, 6.0]},
                                     "label": "hi"}
        assert (answer["graph"], answer["app"], answer["device"]) == ("triple", "cdui", "cpu")
        assert answer["timing"]["total_s"] > 0
        run = await cp.run(answer["run_id"])
        assert run["status"] == "succeeded"  # an ordinary run, kept and listed like any

        answer = await cp.call("POST", "/api/graph/run/triple", {"inputs": {"values": [[1]], "label": "yo"}})
        assert answer["outputs"]["label"] == "yo" and answer["outputs"]["tripled"]["values"] == [[3.0]]
        await cp.call("DELETE", "/api/graphs/triple")
        assert (await cp.call("GET", "/api/graphs"))["graphs"] == []


async def test_contract_problems_are_409_and_bad_inputs_400(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs) as cp:
        untriggered = triple()
        untriggered["edges"].remove(t("lab"))
        duplicate = triple()
        duplicate["nodes"][2]["data"]["params"]["name"] = "values"
        no_outputs = {"nodes": [n("start", "Start"), n("in", "GraphInput", name="x")], "edges": [t("in")]}
        optional_image = {"nodes": [n("start", "Start"), n("in", "GraphInput", name="x", type="image", required=False),
                                    n("o", "GraphOutput")], "edges": [t("in"), e("in", "value", "o", "value")]}
        for name, graph, code in (("a", untriggered, "untriggered_input"), ("b", duplicate, "bad_contract"),
                                  ("c", no_outputs, "no_outputs"), ("d", optional_image, "bad_contract")):
            saved = await cp.call("PUT", f"/api/graphs/{name}", graph, expect=201)
            assert saved["callable"] is False
            status, body = await cp.api("POST", f"/api/graph/run/{name}", {"inputs": {"values": [1]}})
            assert (status, body["error"]["code"]) == (409, code), body
        await cp.call("PUT", "/api/graphs/ok", triple(), expect=201)
        status, body = await cp.api("POST", "/api/graph/run/ok", {"inputs": {"values": [1], "nope": 1}})
        assert (status, body["error"]["code"]) == (400, "bad_inputs") and "'nope'" in body["error"]["message"]
        status, body = await cp.api("POST", "/api/graph/run/ok", {"inputs": {}})
        assert (status, body["error"]["code"]) == (400, "missing_inputs") and "'values'" in body["error"]["message"]
        status, body = await cp.api("POST", "/api/graph/run/missing", {})
        assert status == 404
        status, body = await cp.api("PUT", "/api/graphs/..%2Fescape", triple())
        assert status in (400, 404) and not (dirs["data_dir"].parent / "escape.json").exists()
        assert (await cp.api("GET", "/api/health"))[0] == 200


@pytest.mark.e2e  # runs real run subprocesses
async def test_wrong_values_and_oversized_outputs_fail_with_the_reason(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs) as cp:
        number = {"nodes": [n("start", "Start"), n("in", "GraphInput", name="x", type="number"),
                            n("o", "GraphOutput", name="y")], "edges": [t("in"), e("in", "value", "o", "value")]}
        await cp.call("PUT", "/api/graphs/number", number, expect=201)
        answer = await cp.call("POST", "/api/graph/run/number", {"inputs": {"x": True}})
        assert answer["status"] == "failed" and answer["error"]["code"] == "run_failed"
        assert "input 'x' must be a finite number, got True" in answer["error"]["message"]
        assert (await cp.call("POST", "/api/graph/run/number", {"inputs": {"x": 2}}))["outputs"] == {"y": 2.0}

        big = {"nodes": [n("start", "Start"), n("big", "TensorCreate", shape="300,300"), n("o", "GraphOutput")],
               "edges": [t("big"), e("big", "tensor", "o", "value")]}
        await cp.call("PUT", "/api/graphs/big", big, expect=201)
        answer = await cp.call("POST", "/api/graph/run/big", {})
        assert (answer["status"], answer["error"]["code"], answer["error"]["node_id"]) == \
            ("failed", "output_too_large", "o")


@pytest.mark.e2e  # runs real run subprocesses
async def test_an_image_input_arrives_as_an_rgb_tensor(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs) as cp:
        g = {"nodes": [n("start", "Start"), n("in", "GraphInput", name="img", type="image"), n("o", "GraphOutput")],
             "edges": [t("in"), e("in", "value", "o", "value")]}
        await cp.call("PUT", "/api/graphs/img", g, expect=201)
        png = encode_png(2, 1, "RGB", bytes([255, 0, 0, 0, 0, 255]))
        data = "data:image/png;base64," + base64.b64encode(png).decode()
        out = (await cp.call("POST", "/api/graph/run/img", {"inputs": {"img": data}}))["outputs"]["output"]
        assert out["shape"] == [3, 1, 2]
        assert out["values"] == [[[1.0, 0.0]], [[0.0, 0.0]], [[0.0, 1.0]]]


@pytest.mark.e2e  # runs real run subprocesses
async def test_a_call_past_its_timeout_stops_the_run_and_answers_504(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs) as cp:
        await cp.call("PUT", "/api/graphs/triple", triple(), expect=201)
        # No run subprocess (a fresh Python importing torch) ends within a millisecond.
        status, body = await cp.api("POST", "/api/graph/run/triple", {"inputs": {"values": [1]}, "timeout_s": 0.001})
        assert (status, body["status"], body["error"]["code"]) == (504, "timeout", "timeout")
        run = await cp.wait_status(body["run_id"], "cancelled")
        assert run["status"] == "cancelled"


async def test_a_call_targeted_at_a_worker_runs_there(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs) as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            await cp.call("PUT", "/api/graphs/triple", triple(), expect=201)
            call = asyncio.create_task(cp.call("POST", "/api/graph/run/triple",
                                               {"inputs": {"values": [5]}, "target": "w1"}))
            assign = await agent.assignment()
            values = [gi for gi in assign["job"]["graph"]["nodes"] if gi["type"] == "GraphInput"]
            assert values[0]["data"]["params"]["value"] == [5]  # the caller's value travels with the job
            await agent.status(assign["run_id"], "running", pid=1)
            await agent.send(assign["run_id"], "graph_output", name="tripled", node_id="out", value=15)
            await agent.send(assign["run_id"], "graph_output", name="label", node_id="out2", value="hi")
            await agent.status(assign["run_id"], "succeeded")
            answer = await call
            assert (answer["status"], answer["outputs"]) == ("succeeded", {"tripled": 15, "label": "hi"})
            assert (await cp.run(answer["run_id"]))["worker_id"] == "w1"
        finally:
            await agent.drop()
