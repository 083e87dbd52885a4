"""Bad input gets a 400 that names the field, never a 500 or a run queued for ever.

A real control plane in this process; each row is one request and the error
it must get. The server keeps serving after every row (the last request of
each test is an ordinary one that succeeds)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from harness import Plane, graph


def with_node(ntype: Any, **params: Any) -> dict[str, Any]:
    """The harness graph with one more node, triggered from Start."""
    g = graph()
    g["nodes"].append({"id": "x", "type": ntype, "data": {"params": params}})
    g["edges"].append({"id": "tx", "source": "start", "sourceHandle": "trigger", "target": "x", "type": "trigger"})
    return g


def with_params(**params: Any) -> dict[str, Any]:
    """The harness graph with its TensorCreate's params set."""
    g = copy.deepcopy(graph())
    g["nodes"][1]["data"]["params"].update(params)
    return g


BIG = 2 ** 64
# (graph, options, status, code, text the message or an error detail must contain)
SUBMITS: list[tuple[dict[str, Any], dict[str, Any], int, str, str]] = [
    (with_node(["Print"]), {}, 400, "invalid_graph", "nodes[2] needs a string 'id' and 'type'"),
    (with_node({"a": 1}), {}, 400, "invalid_graph", "nodes[2] needs a string 'id' and 'type'"),
    (with_node("Print", label=["a", "b"]), {}, 400, "invalid_graph", "label=['a', 'b'] is not a valid string"),
    (with_node("Print", label={"a": 1}), {}, 400, "invalid_graph", "label={'a': 1} is not a valid string"),
    (with_node("KNN", n_neighbors="nan"), {}, 400, "invalid_graph", "n_neighbors='nan' is not a valid int"),
    (with_node("KNN", n_neighbors="1e999"), {}, 400, "invalid_graph", "n_neighbors='1e999' is not a valid int"),
    (with_params(value="nan"), {}, 400, "invalid_graph", "value='nan' is not a valid float"),
    (with_params(value="-inf"), {}, 400, "invalid_graph", "value='-inf' is not a valid float"),
    (with_params(shape="-1,3"), {}, 400, "invalid_graph", "shape='-1,3' has a dim below 1"),
    (with_params(shape="nan"), {}, 400, "invalid_graph", "shape='nan' is not comma-separated integers"),
    (with_params(shape="100000,100000,1000"), {}, 400, "invalid_graph",
     "shape='100000,100000,1000' asks for 10,000,000,000,000 elements, more than 2,147,483,648"),
    (with_node("TensorInput", shape="1,1,1,1,1,1,1,1,1"), {}, 400, "invalid_graph",
     "shape='1,1,1,1,1,1,1,1,1' has 9 dims, more than 8"),
    (graph(), {"device": "cuda:-1"}, 400, "bad_device", "device 'cuda:-1' is not valid"),
    (graph(), {"device": "cpu:x"}, 400, "bad_device", "device 'cpu:x' is not valid"),
    (graph(), {"device": "cuda:01"}, 400, "bad_device", "device 'cuda:01' is not valid"),
    (graph(), {"record_outputs": "no"}, 400, "bad_options", "record_outputs='no' is not true or false"),
    (graph(), {"record_outputs": 1}, 400, "bad_options", "record_outputs=1 is not true or false"),
]

QUERIES: list[tuple[str, str]] = [
    (f"/api/runs?limit={BIG}", f"limit='{BIG}' is not an integer from 0 to {2 ** 63 - 1}"),
    ("/api/runs?limit=-1", f"limit='-1' is not an integer from 0 to {2 ** 63 - 1}"),
    ("/api/runs?limit=x", f"limit='x' is not an integer from 0 to {2 ** 63 - 1}"),
    (f"/api/runs/RUN/events?after={BIG}", f"after='{BIG}' is not an integer from 0 to {2 ** 63 - 1}"),
    ("/api/runs/RUN/events?after=-1", f"after='-1' is not an integer from 0 to {2 ** 63 - 1}"),
    ("/api/sweeps?limit=0", "limit='0' is not an integer from 1 to 500"),
    ("/api/studies?limit=x", "limit='x' is not an integer from 1 to 500"),
]


def _says(body: dict[str, Any], text: str) -> bool:
    err = body["error"]
    return text in err["message"] or any(text in d.get("message", "") for d in err.get("details") or []
                                         if isinstance(d, dict))


async def test_bad_submits_are_400_naming_the_field(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=0") as cp:
        for g, options, status, code, text in SUBMITS:
            got, body = await cp.api("POST", "/api/runs", {"graph": g, "options": options})
            assert (got, body["error"]["code"]) == (status, code), (g["nodes"][-1], options, body)
            assert _says(body, text), (text, body)
        for g, _, _, _, text in SUBMITS[:12]:  # the graph checks answer validate the same
            got, body = await cp.api("POST", "/api/graphs/validate", {"graph": g})
            assert got == 200 and body["valid"] is False and any(text in e["message"] for e in body["errors"]), body
        assert (await cp.call("GET", "/api/runs")) == []  # nothing was stored
        await cp.submit()


async def test_bad_queries_are_400_naming_the_value(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=0") as cp:
        run = await cp.submit()
        for path, text in QUERIES:
            got, body = await cp.api("GET", path.replace("RUN", run["id"]))
            assert (got, body["error"]["code"]) == (400, "bad_query"), (path, body)
            assert text in body["error"]["message"], (text, body)
        assert [r["id"] for r in await cp.call("GET", "/api/runs?limit=0")] == []
        assert [r["id"] for r in await cp.call("GET", f"/api/runs?limit={2 ** 63 - 1}")] == [run["id"]]
