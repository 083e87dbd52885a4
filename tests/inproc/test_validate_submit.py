"""``POST /api/graphs/validate`` and ``POST /api/runs`` give one answer for one graph and target.

Both routes go through the run service's one check (``RunService.admit``), so
a graph validate calls valid is one submit accepts, and a refusal names the
same codes on both. The table sends each graph and its options to both routes
of a real control plane in this process. Local runs get no slot here
(``local/cpu=0``), so an accepted submit stays queued and no process starts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.inproc.harness import Plane, e, n, t

# A drop-in custom node whose package is not installed: on this machine the graph
# can never run (a missing extra, refused for a local target).
NEEDS_MISSING = '''
from cdui.nodes.base import TENSOR, Node, Port


class NeedsMissing(Node):
    NODE_NAME = "NeedsMissing"
    NEEDS = ("cdui_test_package_that_is_not_installed",)

    @classmethod
    def define_outputs(cls):
        return [Port("tensor", TENSOR)]

    def execute(self, inputs, params, ctx):
        raise AssertionError("never runs")
'''


def one(ntype: str, **params: Any) -> dict[str, Any]:
    """Start triggering one node of ``ntype``."""
    return {"nodes": [n("start", "Start"), n("x", ntype, **params)], "edges": [t("x")]}


def kernel_graph() -> dict[str, Any]:
    return {"nodes": [n("start", "Start"), n("k", "Conv2dKernel"), n("p", "Print")],
            "edges": [t("k"), e("k", "tensor", "p", "value")]}


def map_graph(preset: str) -> dict[str, Any]:
    return {"nodes": [n("start", "Start"), n("v", "GraphInput", name="items", type="json"),
                      n("m", "Map", subgraph=preset)],
            "edges": [t("v"), e("v", "value", "m", "items")]}


LOCAL = {"target": "local", "device": "cpu"}
# (name, graph, options, the codes both routes give: [] is accepted)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    ("a plain graph", one("TensorCreate"), LOCAL, []),
    ("Conv2dKernel with its default preset", kernel_graph(), LOCAL, []),
    # submit refused it; validate, which looked at no machine, said valid
    ("a node whose extra is missing here", one("NeedsMissing"), LOCAL, ["missing_extra"]),
    ("an unknown node type", one("NoSuchType"), LOCAL, ["unknown_type"]),
    ("Map running a preset that is not installed", map_graph("No Such Preset"), LOCAL, ["unknown_preset"]),
    ("Map running an installed preset", map_graph("LSTM Sequence"), LOCAL, []),
    ("a worker that is not enrolled", one("TensorCreate"), {"target": {"worker": "nobody"}}, ["unknown_worker"]),
    ("a device that does not exist", one("TensorCreate"), {"target": "local", "device": "tpu"}, ["bad_device"]),
    ("a key too short to mask", one("Webhook", url="https://example.com/hook", api_key="abc"), LOCAL,
     ["secret_too_short"]),
]


def _codes(status: int, body: Any) -> list[str]:
    if status == 201:
        return []
    error = body["error"]
    return sorted({d["code"] for d in error["details"]}) if error["code"] == "invalid_graph" else [error["code"]]


def _plane(tmp_path: Path) -> Plane:
    data = tmp_path / "data"
    (data / "custom_nodes").mkdir(parents=True)
    (data / "custom_nodes" / "needs_missing.py").write_text(NEEDS_MISSING, encoding="utf-8")
    return Plane(tmp_path / "ud", data, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=0")


@pytest.mark.parametrize("graph, options, codes", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_validate_and_submit_give_the_same_answer(tmp_path: Path, graph: dict[str, Any],
                                                        options: dict[str, Any], codes: list[str]) -> None:
    async with _plane(tmp_path) as cp:
        checked = await cp.call("POST", "/api/graphs/validate", {"graph": graph, "options": options})
        status, submitted = await cp.api("POST", "/api/runs", {"graph": graph, "options": options})
        assert (checked["valid"], sorted({x["code"] for x in checked["errors"]})) == (codes == [], codes), checked
        assert (status, _codes(status, submitted)) == ((201, []) if not codes else (400, codes)), submitted
        for error in checked["errors"]:
            assert error["message"]  # what happened, in words, on both routes


async def test_a_bare_graph_is_validated_for_submits_default_target(tmp_path: Path) -> None:
    """A body that is the graph itself has no options: it is checked as submit checks a run without
    options (``local``), so a missing extra on this machine is reported, with what to install."""
    async with _plane(tmp_path) as cp:
        checked = await cp.call("POST", "/api/graphs/validate", one("NeedsMissing"))
        assert [(x["node_id"], x["code"]) for x in checked["errors"]] == [("x", "missing_extra")]
        assert checked["valid"] is False and checked["nodes"] == []
        assert "cdui_test_package_that_is_not_installed" in checked["errors"][0]["message"]
        assert (await cp.call("POST", "/api/graphs/validate", one("TensorCreate")))["nodes"] == ["start", "x"]
