"""SequentialModel's layers as a sub-canvas (web/canvas/layers.js): opened from the config panel,
built by mouse from the layer palette, checked before going back, written into the param as one
undoable edit; and the layer types the page gets (cdui/nodes/layer_types.py) are exactly the ones
cdui/nodes/builtin/_torchlib/layer_spec.py builds."""
from __future__ import annotations

import copy
import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from canvas_page import CanvasPage, drag_drop, example, module_fixtures
from cdui.nodes.layer_types import layer_types

EXAMPLES = Path(__file__).resolve().parent / "data" / "codefyui_examples"


server, browser = module_fixtures("canvas-layers")


# A value for each required param when the test builds every layer type once.
SAMPLE = {"int": 4, "json": 2, "string": "2,2", "float": 0.5, "bool": True}


def test_layer_types_are_the_ones_layer_spec_builds():
    from cdui.nodes.builtin._torchlib import layer_spec

    got = {d["type"]: d for d in layer_types()}
    assert set(got) == {"Input", "Output", *layer_spec.LAYER_TYPES}
    for name, d in got.items():
        if name in ("Input", "Output"):
            continue
        params = {p["name"]: SAMPLE[p["type"]] for p in d["params"] if p.get("required")}
        if name == "GroupNorm":
            params["num_groups"] = 2
        layer_spec.build_layer(name, params, "test")  # the required params are enough
        for p in d["params"]:  # and every declared param is one the layer takes, with its default
            full = dict(params)
            full[p["name"]] = p["default"] if p["default"] is not None or p.get("required") else None
            if p.get("required"):
                continue
            layer_spec.build_layer(name, full, "test")
        cls = layer_spec.STANDARD.get(name)
        if cls is not None:
            sig = inspect.signature(cls.__init__).parameters
            for p in d["params"]:
                assert p["name"] in sig, (name, p["name"])
                if not p.get("required"):
                    assert sig[p["name"]].default == p["default"], (name, p["name"])


def _layers(graph: dict[str, Any], node_id: str) -> Any:
    return next(n for n in graph["nodes"] if n["id"] == node_id)["data"]["params"]["layers"]


class Layers:
    """The mouse on the layer sub-canvas."""

    def __init__(self, cp: CanvasPage) -> None:
        self.cp, self.page = cp, cp.page

    def graph(self) -> dict[str, Any]:
        return self.cp.graph()  # window.cduiCanvas.editor() is the layer editor while it is open

    def drag(self, layer_type: str, x: float, y: float) -> str:
        before = {n["id"] for n in self.graph()["nodes"]}
        self.page.fill("#layers-search", layer_type)
        canvas = self.page.locator(".cv-layers .cd-canvas")
        canvas.wait_for()
        drag_drop(self.page, self.page.locator(f".cv-layers-palette .palette-item[data-type='{layer_type}']"),
                  canvas, x, y)
        self.page.wait_for_function("n => window.cduiCanvas.editor().toJSON().nodes.length === n", arg=len(before) + 1)
        (new,) = {n["id"] for n in self.graph()["nodes"]} - before
        return str(new)

    def wire(self, src: str, dst: str, out: str = "y", inp: str = "x") -> None:
        a = self.cp.js("([n, p]) => window.cduiCanvas.editor().portClientPos(n, 'output', p)", [src, out])
        b = self.cp.js("([n, p]) => window.cduiCanvas.editor().portClientPos(n, 'input', p)", [dst, inp])
        assert a and b, (src, out, dst, inp)
        n = len(self.graph()["edges"])
        self.page.mouse.move(a["x"], a["y"])
        self.page.mouse.down()
        self.page.mouse.move((a["x"] + b["x"]) / 2, (a["y"] + b["y"]) / 2, steps=4)
        self.page.mouse.move(b["x"], b["y"], steps=4)
        self.page.mouse.up()
        self.page.wait_for_function("n => window.cduiCanvas.editor().toJSON().edges.length === n", arg=n + 1)

    def pos(self, node_id: str) -> dict[str, float]:
        """Where a layer's title bar is on the page, once the sub-canvas is still: it fits its view to the
        layers at an animation frame after it opens, and a position read before that (one CI run) put the
        mouse beside the layer, so that a drag panned the view and nothing was edited. The same position
        over three animation frames in a row."""
        got: dict[str, float] = self.page.evaluate("""id => new Promise((done) => {
            let last = null, same = 0;
            const step = () => {
              const q = window.cduiCanvas.editor().nodeClientPos(id);
              same = last && q && q.x === last.x && q.y === last.y ? same + 1 : 0;
              last = q;
              if (same >= 2) done(q); else requestAnimationFrame(step);
            };
            requestAnimationFrame(step); })""", node_id)
        return got

    def click(self, node_id: str) -> None:
        p = self.pos(node_id)
        self.page.mouse.click(p["x"], p["y"])
        self.page.wait_for_selector(f".cv-panel-node[data-node-id='{node_id}']")

    def set(self, node_id: str, name: str, value: str) -> None:
        if self.cp.js("() => window.cduiCanvas.editor().selection().join()") != node_id:
            self.click(node_id)
        f = self.cp.field(name)
        f.fill(value)
        f.press("Enter")
        self.page.wait_for_function("([id, k, v]) => String(window.cduiCanvas.editor().node(id).params[k]) === v",
                                    arg=[node_id, name, value])

    def clear(self) -> None:
        """Select every layer and delete it (the default layers are a CNN)."""
        self.cp.js("() => window.cduiCanvas.editor().focus()")
        self.page.keyboard.press("Control+a")
        self.page.keyboard.press("Delete")
        self.page.wait_for_function("() => window.cduiCanvas.editor().toJSON().nodes.length === 0")
        self.page.keyboard.press("f")  # an empty view at scale 1 (the CNN was fitted zoomed out)

    def build_mlp(self) -> None:
        """Input → Linear(4, 16) → ReLU → Linear(16, 3) → Output, by mouse."""
        self.clear()
        ids = [self.drag(t, 40 + 120 * i, 100 + 90 * (i % 2))
               for i, t in enumerate(["Input", "Linear", "ReLU", "Linear", "Output"])]
        assert ids == ["input", "linear", "relu", "linear-2", "output"]
        self.wire("input", "linear", out="x")
        self.wire("linear", "relu")
        self.wire("relu", "linear-2")
        self.wire("linear-2", "output", inp="y")
        self.set("linear", "in_features", "4")
        self.set("linear", "out_features", "16")
        self.set("linear-2", "in_features", "16")
        self.set("linear-2", "out_features", "3")


def test_build_layers_by_mouse_back_and_undo(server, browser):
    import torch

    from cdui.nodes.builtin._torchlib import layer_spec

    cat = server.call("GET", "/api/nodes", expect=200)
    assert {d["type"] for d in cat["layer_types"]} >= {"Input", "Output", "Linear", "ReLU", "Add"}
    cp = CanvasPage(browser, server)
    cp.open({"nodes": [], "edges": []}, "mlp")
    model = cp.js("() => window.cduiCanvas.editor().addNode('SequentialModel', {x: 40, y: 40})")
    old = _layers(cp.graph(), model)
    cp.select(model)
    cp.page.click("#cv-edit-layers")
    cp.page.wait_for_selector("#layers-overlay")
    assert cp.page.inner_text(".cv-layers-crumbs") == f"mlp › SequentialModel ({model})"
    lay = Layers(cp)
    # Going back with a graph that does not build is refused, with the reason, and nothing is written.
    lay.clear()
    cp.page.click("#layers-back")
    cp.page.wait_for_selector(".cv-layers-problems li")
    assert "exactly 1 Input and 1 Output, it has 0 and 0" in cp.page.inner_text(".cv-layers-problems")
    lay.build_mlp()
    cp.page.click("#layers-back")
    cp.page.wait_for_selector("#layers-overlay", state="detached")
    # Back on the tab: the param holds the new layers, as JSON text, and they build.
    assert cp.js("() => window.cduiCanvas.layers.current() === null")
    text = _layers(cp.graph(), model)
    assert isinstance(text, str)
    spec = json.loads(text)
    assert [(n["id"], n["type"], n.get("params")) for n in spec["nodes"]] == [
        ("input", "Input", None), ("linear", "Linear", {"in_features": 4, "out_features": 16, "bias": True}),
        ("relu", "ReLU", None), ("linear-2", "Linear", {"in_features": 16, "out_features": 3, "bias": True}),
        ("output", "Output", None)]
    assert spec["nodes"][0]["ports"] == [{"id": "p_x", "name": "x"}]
    assert [(e["source"], e.get("sourceHandle"), e["target"], e.get("targetHandle")) for e in spec["edges"]] == [
        ("input", "p_x", "linear", None), ("linear", None, "relu", None), ("relu", None, "linear-2", None),
        ("linear-2", None, "output", "p_y")]
    net = layer_spec.build_model(text)
    assert net(torch.zeros(5, 4)).shape == (5, 3)
    # One undo on the tab puts the old layers back.
    cp.js("() => window.cduiCanvas.editor().undo()")
    assert _layers(cp.graph(), model) == old
    cp.close()


@pytest.mark.parametrize("name", ["TrainResNet-CIFAR10", "DQN-Atari-RL"])
def test_example_layers_round_trip_unchanged(server, browser, name):
    graph = json.loads((EXAMPLES / f"{name}.graph.json").read_text())
    model = next(n["id"] for n in graph["nodes"] if n["type"] == "SequentialModel")
    cp = CanvasPage(browser, server)
    cp.open(copy.deepcopy(graph), name)
    before = cp.graph()
    cp.select(model)
    cp.page.click("#cv-edit-layers")
    cp.page.wait_for_selector("#layers-overlay")
    spec = json.loads(_layers(before, model))
    drawn = cp.graph()
    assert [n["id"] for n in drawn["nodes"]] == [n["id"] for n in spec["nodes"]]
    assert len(drawn["edges"]) == len(spec["edges"])
    # Every edge is drawn (a merge layer's two inputs on its ports a and b).
    assert cp.js("() => window.cduiCanvas.editor().graph.links && "
                 "Object.keys(window.cduiCanvas.editor().graph.links).length") == len(spec["edges"])
    cp.page.click("#layers-back")
    cp.page.wait_for_selector("#layers-overlay", state="detached")
    assert cp.graph() == before
    # Moving a layer is an edit: everything the layer graph had is kept, positions added.
    cp.select(model)
    cp.page.click("#cv-edit-layers")
    cp.page.wait_for_selector("#layers-overlay")
    lay = Layers(cp)
    first = spec["nodes"][1]["id"]
    p = lay.pos(first)
    cp.page.mouse.move(p["x"], p["y"])
    cp.page.mouse.down()
    cp.page.mouse.move(p["x"] + 30, p["y"] + 200, steps=5)
    cp.page.mouse.up()
    cp.page.wait_for_function("() => window.cduiCanvas.editor().canUndo()")
    assert lay.graph()["nodes"]
    cp.page.click("#layers-back")
    cp.page.wait_for_selector("#layers-overlay", state="detached")
    moved = json.loads(_layers(cp.graph(), model))
    strip = [{k: v for k, v in n.items() if k != "position"} for n in moved["nodes"]]
    assert strip == spec["nodes"]
    assert moved["edges"] == spec["edges"]
    assert {k: v for k, v in moved.items() if k not in ("nodes", "edges")} == \
        {k: v for k, v in spec.items() if k not in ("nodes", "edges")}
    assert all(set(n["position"]) == {"x", "y"} for n in moved["nodes"])
    cp.close()


def test_iris_example_layers_open_and_discard(server, browser):
    cp = CanvasPage(browser, server)
    cp.open(example("iris_train.json"), "iris")
    before = cp.graph()
    cp.select("model")
    cp.page.click("#cv-edit-layers")
    cp.page.wait_for_selector("#layers-overlay")
    # Delete a layer, then discard: the param is as it was.
    cp.js("() => { const e = window.cduiCanvas.editor(); e.select(['r1']); e.deleteSelection(); }")
    cp.page.click("#layers-discard")
    cp.page.wait_for_selector("#layers-overlay", state="detached")
    assert cp.graph() == before
    cp.close()


def test_every_layer_param_and_port_has_its_description():
    from cdui.nodes.layer_types import describe

    for d in layer_types():
        for p in d["params"]:
            assert p["description"] == describe(d["type"], p["name"]) != "", (d["type"], p["name"])
        for p in d["inputs"] + d["outputs"]:
            assert p["description"], (d["type"], p["name"])
    # One name, one meaning, except where a layer says otherwise.
    assert describe("Conv2d", "kernel_size") == describe("MaxPool2d", "kernel_size")
    assert describe("Concat", "dim") != describe("SelectIndex", "dim")


def test_layer_params_show_their_descriptions_on_the_sub_canvas(server, browser):
    cp = CanvasPage(browser, server)
    cp.open(example("iris_train.json"), "iris")
    layers = json.loads(_layers(cp.graph(), "model"))
    cp.select("model")
    cp.page.click("#cv-edit-layers")
    cp.page.wait_for_selector("#layers-overlay")
    linear = next(n["id"] for n in layers["nodes"] if n["type"] == "Linear")
    Layers(cp).click(linear)
    linear_decl = next(d for d in layer_types() if d["type"] == "Linear")
    for p in linear_decl["params"]:
        # Under each field, as a node's params show theirs, and tied to the field for screen readers.
        desc = cp.page.locator(f".cv-param[data-param='{p['name']}'] .cv-param-desc")
        assert desc.inner_text() == p["description"]
        assert cp.field(p["name"]).get_attribute("aria-describedby") == desc.get_attribute("id")
    # The layer palette's tooltip names each param with its description.
    title = cp.page.get_attribute(".cv-layers-palette .palette-item[data-type='Linear']", "title")
    assert title == "\n".join([linear_decl["description"]] + [
        f"{p['name']}{' (required)' if p.get('required') else ''}: {p['description']}" for p in linear_decl["params"]])
    cp.page.click("#layers-discard")
    cp.close()
