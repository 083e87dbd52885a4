"""The canvas's acceptance (#25), as one person would do it in Chromium against a real server and agent.

A person who has never seen cdui's graph JSON builds the iris MLP on an empty canvas by dragging
nodes from the palette and wiring their ports, sets its params in the config panel, runs it on the
control plane, changes the learning rate and runs it again (only training and what follows execute
again: the nodes above answer from the cache), inspects the normalised tensor, and queues the same
tab on a worker where it succeeds. The model's layers are built by mouse too, in the
SequentialModel's layer sub-canvas: no JSON is typed anywhere. Each step is photographed:
``CDUI_WRITE_SCREENSHOTS=1`` writes them into ``docs/img/canvas-*.png`` (docs/web-ui.md shows
them), otherwise into /tmp.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from canvas_page import ROOT, CanvasPage, chromium, drag_drop, server_proc
from procs import Proc, ServerProc, spawn_agent, wait_for, wait_run

pytestmark = pytest.mark.e2e

SHOTS = ROOT / "docs" / "img" if os.environ.get("CDUI_WRITE_SCREENSHOTS") == "1" else Path("/tmp/cdui-canvas-shots")
# The MLP's layers, built in the SequentialModel's layer sub-canvas: 4 features in, 3 species out.
LAYERS = ["Input", "Linear", "ReLU", "Linear", "Output"]
LAYER_WIRES = [("input", "x", "linear", "x"), ("linear", "y", "relu", "x"), ("relu", "y", "linear-2", "x"),
               ("linear-2", "y", "output", "y")]
LAYER_PARAMS = [("linear", "in_features", "4"), ("linear", "out_features", "16"),
                ("linear-2", "in_features", "16"), ("linear-2", "out_features", "3")]

# (name, node type, column, row) of the grid the nodes are dropped on.
NODES = [("start", "Start", 0, 0), ("csv", "CSVReader", 1, 0), ("norm", "Normalize", 2, 0),
         ("split", "TrainTestSplit", 3, 0),
         ("train-set", "TensorDataset", 0, 1), ("val-set", "TensorDataset", 1, 1),
         ("train-loader", "DataLoader", 2, 1), ("val-loader", "DataLoader", 3, 1),
         ("model", "SequentialModel", 0, 2), ("loss", "Loss", 1, 2), ("optimizer", "Optimizer", 2, 2),
         ("train", "TrainingLoop", 3, 2)]
WIRES = [("start", "trigger", "csv", "trigger"),
         ("csv", "tensor", "norm", "tensor"), ("norm", "tensor", "split", "features"),
         ("csv", "labels", "split", "labels"),
         ("split", "x_train", "train-set", "features"), ("split", "y_train", "train-set", "labels"),
         ("split", "x_test", "val-set", "features"), ("split", "y_test", "val-set", "labels"),
         ("train-set", "classes", "val-set", "classes"),
         ("train-set", "dataset", "train-loader", "dataset"), ("val-set", "dataset", "val-loader", "dataset"),
         ("model", "model", "optimizer", "model"), ("model", "model", "train", "model"),
         ("train-loader", "dataloader", "train", "dataloader"), ("val-loader", "dataloader", "train", "val_dataloader"),
         ("optimizer", "optimizer", "train", "optimizer"), ("loss", "loss_fn", "train", "loss_fn")]
ABOVE_TRAINING = ["csv", "norm", "split", "train-set", "val-set"]


@pytest.fixture
def server(tmp_path) -> Iterator[ServerProc]:
    s = server_proc(tmp_path / "cp", "canvas-acceptance-server")
    try:
        yield s.start()
    finally:
        s.stop()


@pytest.fixture
def agent(server, tmp_path) -> Iterator[Proc]:
    a = spawn_agent(server, tmp_path, "lab-gpu")
    try:
        yield a
    finally:
        a.stop()


class Person:
    """The mouse and keyboard of someone using the canvas page."""

    def __init__(self, page: Any) -> None:
        self.page = page

    def js(self, expr: str, arg: Any = None) -> Any:
        return self.page.evaluate(expr, arg)

    def graph(self) -> dict[str, Any]:
        got: dict[str, Any] = self.js("() => window.cduiCanvas.editor().toJSON()")
        return got

    def drag(self, node_type: str, x: float, y: float) -> str:
        before = {n["id"] for n in self.graph()["nodes"]}
        self.page.fill("#palette-search", node_type)
        box = self.page.locator(".cd-canvas").bounding_box()
        drag_drop(self.page, self.page.locator(f".palette-item[data-type='{node_type}']"),
                  self.page.locator(".cd-canvas"), x - box["x"], y - box["y"])
        self.page.wait_for_function("n => window.cduiCanvas.editor().toJSON().nodes.length === n", arg=len(before) + 1)
        (new,) = {n["id"] for n in self.graph()["nodes"]} - before
        return new

    def port(self, node_id: str, side: str, name: str) -> tuple[float, float]:
        p = self.js("([n, s, p]) => window.cduiCanvas.editor().portClientPos(n, s, p)", [node_id, side, name])
        assert p is not None, f"{node_id} has no {side} port {name!r}"
        return p["x"], p["y"]

    def wire(self, src: str, out: str, dst: str, inp: str) -> None:
        x0, y0 = self.port(src, "output", out)
        x1, y1 = self.port(dst, "input", inp)
        self.page.mouse.move(x0, y0)
        self.page.mouse.down()
        self.page.mouse.move((x0 + x1) / 2, (y0 + y1) / 2, steps=4)
        self.page.mouse.move(x1, y1, steps=4)
        self.page.mouse.up()

    def click_node(self, node_id: str) -> None:
        p = self.js("(id) => window.cduiCanvas.editor().nodeClientPos(id)", node_id)
        self.page.mouse.click(p["x"], p["y"])
        self.page.wait_for_selector(f".cv-panel-node[data-node-id='{node_id}']")

    def set_param(self, node_id: str, name: str, value: str) -> None:
        self.click_node(node_id)
        field = self.page.locator(f".cv-param[data-param='{name}'] [data-param-input]")
        field.fill(value)
        if self.js("(el) => el.tagName", field.element_handle()) == "TEXTAREA":
            field.evaluate("(el) => el.blur()")
        else:
            field.press("Enter")

    def build_layers(self, model_id: str) -> None:
        """Opens the model's layers (Edit layers in the panel), replaces the default CNN with the MLP
        by mouse (layer palette, ports, panel), and goes back to the tab through the breadcrumb."""
        self.click_node(model_id)
        self.page.click("#cv-edit-layers")
        self.page.wait_for_selector("#layers-overlay")
        self.js("() => window.cduiCanvas.editor().focus()")
        self.page.keyboard.press("Control+a")
        self.page.keyboard.press("Delete")
        self.page.wait_for_function("() => window.cduiCanvas.editor().toJSON().nodes.length === 0")
        self.page.keyboard.press("f")  # an empty view at scale 1 (the CNN was fitted zoomed out)
        canvas = self.page.locator(".cv-layers .cd-canvas")
        for i, layer in enumerate(LAYERS):
            self.page.fill("#layers-search", layer)
            drag_drop(self.page, self.page.locator(f".cv-layers-palette .palette-item[data-type='{layer}']"),
                      canvas, 40 + 190 * i, 120 + 90 * (i % 2))
            self.page.wait_for_function("n => window.cduiCanvas.editor().toJSON().nodes.length === n", arg=i + 1)
        assert [n["id"] for n in self.graph()["nodes"]] == ["input", "linear", "relu", "linear-2", "output"]
        for src, out, dst, inp in LAYER_WIRES:
            self.wire(src, out, dst, inp)
        self.page.wait_for_function("n => window.cduiCanvas.editor().toJSON().edges.length === n", arg=len(LAYER_WIRES))
        for layer, name, value in LAYER_PARAMS:
            if self.js("() => window.cduiCanvas.editor().selection().join()") != layer:
                self.click_node(layer)
            field = self.page.locator(f".cv-param[data-param='{name}'] [data-param-input]")
            field.fill(value)
            field.press("Enter")
            self.page.wait_for_function("([id, k, v]) => String(window.cduiCanvas.editor().node(id).params[k]) === v",
                                        arg=[layer, name, value])
        self.shot("1-layers")
        self.page.click("#layers-crumb-tab")
        self.page.wait_for_selector("#layers-overlay", state="detached")

    def status(self, node_id: str) -> str | None:
        got: str | None = self.js("(id) => window.cduiCanvas.editor().marks(id).status", node_id)
        return got

    def wait_status(self, node_id: str, status: str) -> None:
        self.page.wait_for_function("([id, s]) => window.cduiCanvas.editor().marks(id).status === s",
                                    arg=[node_id, status])

    def run_id(self, not_this: str | None = None) -> str:
        self.page.wait_for_function(
            "(old) => { const a = document.querySelector('#canvas-run-title a');"
            " return a && !a.href.endsWith('=' + old); }",
            arg=not_this or "")
        href: str = self.page.get_attribute("#canvas-run-title a", "href") or ""
        return href.removeprefix("/#run=")

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"canvas-{name}.png"))


def _statuses(server: ServerProc, run_id: str) -> dict[str, str]:
    return {e["data"]["node_id"]: e["data"]["status"] for e in server.events(run_id)
            if e["kind"] == "node_status" and e["data"]["status"] in ("done", "cached", "failed")}


@pytest.fixture
def browser() -> Iterator[Any]:
    yield from chromium()


def test_build_run_change_rerun_inspect_and_queue_on_a_worker(server, agent, browser, tmp_path):
    cp = CanvasPage(browser, server, width=1700, height=1150)
    page = cp.page
    me = Person(page)
    assert me.graph()["nodes"] == []

    # 1. Build the iris MLP: nodes dragged from the palette, ports wired with the mouse.
    box = page.locator(".cd-canvas").bounding_box()
    ids = {name: me.drag(node_type, box["x"] + 70 + 240 * col, box["y"] + 70 + 220 * row)
           for name, node_type, col, row in NODES}
    for src, out, dst, inp in WIRES:
        me.wire(ids[src], out, ids[dst], inp)
    page.wait_for_function("n => window.cduiCanvas.editor().toJSON().edges.length === n", arg=len(WIRES))
    got = {(e["source"], e["sourceHandle"], e["target"], e["targetHandle"]) for e in me.graph()["edges"]}
    assert got == {(ids[s], o, ids[d], None if o == "trigger" else i) for s, o, d, i in WIRES}
    # Its params in the config panel: the CSV's label column; the MLP's layers in their sub-canvas.
    me.set_param(ids["csv"], "target_column", "species")
    me.build_layers(ids["model"])
    page.wait_for_function("(id) => window.cduiCanvas.editor().node(id).params.layers.includes('Linear')",
                           arg=ids["model"])
    # Tidy it: Shift+L lays it out left to right, F fits it in view.
    me.js("() => window.cduiCanvas.editor().focus()")
    page.keyboard.press("Shift+L")
    page.keyboard.press("f")
    page.wait_for_selector("#canvas-validity.ok-text")
    me.shot("1-built")

    # 2. Run it on the control plane, outputs recorded: every node done, the loss chart drawn.
    page.check("#canvas-record")
    page.fill("#canvas-device", "cpu")
    page.click("#canvas-run")
    first = me.run_id()
    page.wait_for_selector("#canvas-run-status .badge.status-succeeded")
    run = server.call("GET", f"/api/runs/{first}", expect=200)
    assert run["canvas"] and run["status"] == "succeeded", run
    me.wait_status(ids["train"], "done")
    assert set(_statuses(server, first).values()) == {"done"}
    page.wait_for_selector("#canvas-chart polyline[data-series='train_loss']")
    me.shot("2-run")

    # 3. A new learning rate, run again: training and what follows execute, the nodes above are cached.
    me.set_param(ids["optimizer"], "lr", "0.02")
    page.wait_for_function("(id) => window.cduiCanvas.editor().node(id).params.lr === 0.02", arg=ids["optimizer"])
    page.click("#canvas-run")
    second = me.run_id(first)
    page.wait_for_selector("#canvas-run-status .badge.status-succeeded")
    me.wait_status(ids["train"], "done")
    after = _statuses(server, second)
    assert {after[ids[n]] for n in ABOVE_TRAINING} == {"cached"}, after
    assert after[ids["optimizer"]] == after[ids["train"]] == "done", after
    for n in ABOVE_TRAINING:
        assert me.status(ids[n]) == "cached"
    me.shot("3-rerun-cached")

    # 4. Inspect the normalised tensor: z-scored, so its mean is 0.
    me.click_node(ids["norm"])
    page.keyboard.press("Enter")
    out = "#canvas-inspector .ins-outputs .ins-port[data-port='tensor']"
    page.wait_for_selector(f"{out} dd[data-stat='mean']")
    assert page.inner_text(f"{out} dd[data-stat='shape']") == "[150, 4]"
    want = server.call("GET", f"/api/runs/{second}/outputs/{ids['norm']}", expect=200)["outputs"][0]
    assert abs(want["mean"]) < 1e-5
    assert float(page.inner_text(f"{out} dd[data-stat='mean']")) == pytest.approx(want["mean"], abs=1e-6)
    page.locator("#canvas-inspector").scroll_into_view_if_needed()
    me.shot("4-inspector")

    # 5. Queue the same tab on the worker: it succeeds there, and its status comes back onto the tab.
    wait_for(lambda: any(w["name"] == "lab-gpu" and w["online"]
                         for w in server.call("GET", "/api/workers", expect=200)["workers"]),
             120, 0.2, "worker lab-gpu online")
    page.focus("#canvas-queue-target")
    page.wait_for_selector("#canvas-queue-target option[value='worker:lab-gpu']", state="attached")
    page.select_option("#canvas-queue-target", "worker:lab-gpu")
    page.click("#canvas-queue")
    queued = me.run_id(second)
    page.wait_for_selector("#canvas-run-status .badge.status-succeeded")
    done = wait_run(server, queued)
    assert (done["status"], done["worker_id"], done["target"]) == ("succeeded", "lab-gpu", {"worker": "lab-gpu"})
    me.wait_status(ids["train"], "done")
    assert set(_statuses(server, queued).values()) == {"done"}
    me.shot("5-queued-on-worker")
    cp.close()  # no page error
