"""A preset node's inside as a sub-canvas (web/canvas/presets.js, opened by web/canvas/layers.js):
the preset's nodes and wires drawn read-only, their params editable and written back as the node's
``data.internalParams`` (what CodefyUI's expansion reads, cdui/graph/model.py), nothing written when
nothing changed, a preset inside a preset read-only throughout; and ``GET /api/presets`` giving each
preset's inner graph with secret values blanked."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from canvas_page import CanvasPage, chromium, serve
from cdui.graph.model import parse
from cdui.graph.presets import preset_library

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).resolve().parent / "data" / "codefyui_examples"
SECRET = "sk-preset-secret-value-123"
# CDUI_WRITE_SCREENSHOTS=1 writes the sub-canvas's picture into docs/img/ (docs/web-ui.md shows it).
SHOTS = (Path(__file__).resolve().parent.parent / "docs" / "img" if os.environ.get("CDUI_WRITE_SCREENSHOTS") == "1"
         else Path("/tmp/cdui-canvas-shots"))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from serve(tmp_path_factory)


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


def _node(graph: dict[str, Any], node_id: str) -> dict[str, Any]:
    return next(n for n in graph["nodes"] if n["id"] == node_id)


def _open(cp: CanvasPage, node_id: str) -> None:
    cp.select(node_id)
    cp.page.click("#cv-open-preset")
    cp.page.wait_for_selector("#layers-overlay[data-kind='preset']")


def _back(cp: CanvasPage, button: str = "#layers-back") -> None:
    cp.page.click(button)
    cp.page.wait_for_selector("#layers-overlay", state="detached")


def test_training_pipeline_opens_edits_its_params_and_keeps_its_structure(server, browser):
    graph = json.loads((EXAMPLES / "TrainCNN-MNIST.graph.json").read_text())
    pipe = server.call("GET", "/api/presets", expect=200)["presets"]
    definition = next(p for p in pipe if p["name"] == "Training Pipeline")["definition"]
    cp = CanvasPage(browser, server)
    cp.open(copy.deepcopy(graph), "cnn")
    before = cp.graph()
    _open(cp, "train-pipeline")
    assert cp.page.inner_text(".cv-layers-crumbs") == "cnn › Training Pipeline (train-pipeline)"
    assert "nodes and wires are read-only" in cp.page.inner_text("#layers-note")
    # The inside: the preset's nodes, each with the params it runs with (the example's overrides on
    # top of the preset's own values), and its wires.
    inside = cp.graph()
    assert [n["id"] for n in inside["nodes"]] == [n["id"] for n in definition["nodes"]]
    overrides = _node(graph, "train-pipeline")["data"]["internalParams"]
    for n in definition["nodes"]:
        assert _node(inside, n["id"])["data"]["params"] == {**n["params"], **overrides.get(n["id"], {})}
    assert [(e["source"], e["sourceHandle"], e["target"], e["targetHandle"]) for e in inside["edges"]] == [
        (e["source"], e["sourceHandle"], e["target"], e["targetHandle"]) for e in definition["edges"]]
    assert cp.js("() => Object.keys(window.cduiCanvas.editor().graph.links).length") == len(definition["edges"])
    # Back with no edit writes nothing: the tab's graph is exactly as loaded.
    _back(cp)
    assert cp.graph() == before
    # A structural edit inside is taken back, and the page says why; a param edit is kept.
    _open(cp, "train-pipeline")
    cp.js("() => { const e = window.cduiCanvas.editor(); e.select(['loss']); e.deleteSelection(); }")
    assert [n["id"] for n in cp.graph()["nodes"]] == [n["id"] for n in definition["nodes"]]
    assert "nodes and wires cannot change here" in cp.page.inner_text("#canvas-status")
    cp.select("dataloader")
    cp.field("batch_size").fill("16")
    cp.field("batch_size").press("Enter")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('dataloader').params.batch_size === 16")
    cp.select("optimizer")
    cp.field("weight_decay").fill("0.01")
    cp.field("weight_decay").press("Enter")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('optimizer').params.weight_decay === 0.01")
    SHOTS.mkdir(parents=True, exist_ok=True)
    cp.page.screenshot(path=str(SHOTS / "canvas-preset.png"))
    _back(cp)
    after = cp.graph()
    want = copy.deepcopy(overrides)
    want["dataloader"]["batch_size"] = 16
    want["optimizer"]["weight_decay"] = 0.01
    assert _node(after, "train-pipeline")["data"] == {"params": {}, "internalParams": want}
    # Everything else of the graph is as it was.
    assert [n for n in after["nodes"] if n["id"] != "train-pipeline"] == \
        [n for n in before["nodes"] if n["id"] != "train-pipeline"]
    assert after["edges"] == before["edges"]
    # The run expands the preset with the new values, as CodefyUI would.
    expanded, errors = parse(after, library=preset_library())
    assert errors == []
    assert expanded.nodes["train-pipeline__dataloader"].params["batch_size"] == 16
    assert expanded.nodes["train-pipeline__optimizer"].params["weight_decay"] == 0.01
    # The server's check finds nothing new in the edited graph (this test server has no MNIST files).
    assert server.call("POST", "/api/graphs/validate", after, expect=200)["errors"] == \
        server.call("POST", "/api/graphs/validate", before, expect=200)["errors"]
    # One undo on the tab puts the old overrides back.
    cp.js("() => window.cduiCanvas.editor().undo()")
    assert cp.graph() == before
    cp.close()


def test_a_preset_without_overrides_gets_only_what_changed(server, browser):
    cp = CanvasPage(browser, server)
    cp.open({"nodes": [], "edges": []}, "fresh")
    nid = cp.js("() => window.cduiCanvas.editor().addNode('preset:LSTM Sequence', {x: 40, y: 40})")
    before = cp.graph()
    _open(cp, nid)
    cp.select("act")
    assert cp.field("function").input_value() == "tanh"  # the preset's value, not the class default
    cp.field("function").select_option("relu")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('act').params.function === 'relu'")
    _back(cp)
    node = _node(cp.graph(), nid)
    assert node["data"] == {"params": {}, "internalParams": {"act": {"function": "relu"}}}
    # Discard leaves the node as it was.
    _open(cp, nid)
    cp.select("lstm")
    cp.field("hidden_size").fill("32")
    cp.field("hidden_size").press("Enter")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('lstm').params.hidden_size === 32")
    _back(cp, "#layers-discard")
    assert _node(cp.graph(), nid) == node
    assert before != cp.graph()
    cp.close()


NESTED = {"name": "nest", "nodes": [
    {"id": "outer", "type": "preset:Outer", "position": {"x": 0, "y": 0}, "data": {"params": {}}}], "edges": [],
    "presets": [
        {"name": "Outer", "category": "Test", "nodes": [
            {"id": "inner", "type": "preset:Inner", "data": {"internalParams": {"act": {"function": "relu"}}}},
            {"id": "flat", "type": "Flatten", "params": {"start_dim": 1}}],
         "edges": [{"source": "inner", "sourceHandle": "tensor", "target": "flat", "targetHandle": "tensor"}],
         "exposed_inputs": [{"name": "x", "internal_node": "inner", "internal_port": "x", "data_type": "TENSOR"}],
         "exposed_outputs": [{"name": "y", "internal_node": "flat", "internal_port": "tensor", "data_type": "TENSOR"}]},
        {"name": "Inner", "category": "Test", "nodes": [
            {"id": "act", "type": "Activation", "params": {"function": "tanh"}}], "edges": [],
         "exposed_inputs": [{"name": "x", "internal_node": "act", "internal_port": "tensor", "data_type": "TENSOR"}],
         "exposed_outputs": [{"name": "tensor", "internal_node": "act", "internal_port": "tensor",
                              "data_type": "TENSOR"}]}]}


def test_a_preset_inside_a_preset_is_read_only_and_the_breadcrumb_goes_back(server, browser):
    cp = CanvasPage(browser, server)
    cp.open(copy.deepcopy(NESTED), "nest")
    before = cp.graph()
    _open(cp, "outer")
    assert "(embedded in this graph)" in cp.page.inner_text(".cv-preset-side")
    assert [n["id"] for n in cp.graph()["nodes"]] == ["inner", "flat"]
    # The preset inside opens one level further, read-only, with what the outer preset gives it.
    _open(cp, "inner")
    assert cp.js("() => window.cduiCanvas.layers.depth()") == 2
    assert cp.page.inner_text(".cv-layers-crumbs") == "nest › Outer (outer) › Inner (inner) (read-only)"
    assert cp.page.get_attribute("#layers-note", "data-read-only") == "1"
    cp.select("act")
    assert cp.field("function").input_value() == "relu"
    assert cp.field("function").is_disabled()
    cp.page.wait_for_selector("#cv-panel-read-only")
    # A param set anyway (by the editor's API) is taken back.
    cp.js("() => window.cduiCanvas.editor().setParam('act', 'function', 'gelu')")
    assert cp.js("() => window.cduiCanvas.editor().node('act').params.function") == "relu"
    # The breadcrumb: back to the outer preset, then to the tab; nothing was written.
    cp.page.click(".cv-layers-crumb[data-level='1']")
    cp.page.wait_for_function("() => window.cduiCanvas.layers.depth() === 1")
    assert cp.page.inner_text(".cv-layers-crumbs") == "nest › Outer (outer)"
    cp.page.click("#layers-crumb-tab")
    cp.page.wait_for_selector("#layers-overlay", state="detached")
    assert cp.graph() == before
    cp.close()


def test_an_unknown_preset_says_why_it_cannot_open(server, browser):
    cp = CanvasPage(browser, server)
    odd = {"nodes": [{"id": "p1", "type": "preset:MyBlock", "position": {"x": 0, "y": 0}, "data": {"params": {}}}],
           "edges": []}
    cp.open(copy.deepcopy(odd), "odd")
    cp.select("p1")
    cp.page.click("#cv-open-preset")
    cp.page.wait_for_function("() => document.getElementById('canvas-status').textContent.includes('MyBlock')")
    assert cp.page.inner_text("#canvas-status") == (
        'p1: preset "MyBlock" is not installed on this server and the graph does not embed it, so its inside '
        "cannot be shown: install it in data/presets/ or import a graph that embeds it")
    assert cp.page.locator("#layers-overlay").count() == 0
    assert cp.graph() == odd
    cp.close()


def test_presets_api_gives_the_inner_graph_without_secrets(server):
    folder = server.data_dir / "presets"
    folder.mkdir(parents=True, exist_ok=True)
    hook = {"name": "Hook Block", "category": "Test", "nodes": [
        {"id": "hook", "type": "Webhook", "params": {"url": "http://127.0.0.1:9/x", "api_key": SECRET}}],
        "edges": [], "exposed_inputs": [], "exposed_outputs": []}
    (folder / "hook.json").write_text(json.dumps(hook))
    try:
        got = server.call("GET", "/api/presets", expect=200)
    finally:
        (folder / "hook.json").unlink()
    assert SECRET not in json.dumps(got)
    block = next(p for p in got["presets"] if p["name"] == "Hook Block")
    assert block["definition"]["nodes"] == [
        {"id": "hook", "type": "Webhook", "params": {"url": "http://127.0.0.1:9/x", "api_key": ""}}]
    pipe = next(p for p in got["presets"] if p["name"] == "Training Pipeline")
    assert set(pipe["definition"]) == {"nodes", "edges", "exposed_inputs", "exposed_outputs", "exposed_params"}
    assert [n["id"] for n in pipe["definition"]["nodes"]] == ["dataset", "dataloader", "loss", "optimizer",
                                                              "train_loop"]
