"""Charts per metric, the comparison page and pictures, in a real Chromium against a real server
that trains iris twice (two learning rates) with torch.

The run view draws one uPlot chart per family of metrics with a legend naming each series
(train_loss and val_loss apart, per-batch loss off until asked for); /web/compare.html overlays
two runs and lists the params that differ; an image a node produced is shown as a picture.
"""
from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import pytest

from canvas_page import LONG, module_fixtures
from procs import edge, graph, load_example, node, trig, wait_run

pytestmark = pytest.mark.e2e

server, browser = module_fixtures("web-charts")

# The docs' screenshots: CDUI_WRITE_SCREENSHOTS=1 writes them into docs/img/, otherwise into /tmp.
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "img" if os.environ.get("CDUI_WRITE_SCREENSHOTS") == "1" \
    else Path("/tmp/cdui-web-shots")
SHOTS.mkdir(parents=True, exist_ok=True)

EPOCHS = 12
LRS = (0.01, 0.05)


def iris(lr: float) -> dict[str, Any]:
    """The iris example with this learning rate, EPOCHS epochs and the per-batch loss recorded."""
    g = load_example()
    g["name"] = f"iris lr {lr}"
    for n in g["nodes"]:
        if n["id"] == "optimizer":
            n["data"]["params"]["lr"] = lr
        if n["id"] == "train":
            n["data"]["params"].update(epochs=EPOCHS, batch_metrics=True)
    return g


@pytest.fixture(scope="module")
def runs(server) -> list[str]:
    ids = [server.submit(iris(lr), {"target": "local"})["id"] for lr in LRS]
    for rid in ids:
        assert wait_run(server, rid)["status"] == "succeeded", server.events(rid)[-5:]
    return ids


def _page(browser, errors: list[str]):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(LONG)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page


def _legend(page, family: str, root: str = "") -> list[str]:
    """The legend labels of one chart's visible series (the first row is the x value)."""
    return page.eval_on_selector_all(
        f"{root} figure[data-family='{family}'] .u-legend tr.u-series:not(:first-child):not([hidden]) .u-label",
        "els => els.map(e => e.textContent)")


def _cells(page, rows: str) -> list[list[str]]:
    return page.eval_on_selector_all(rows, "rs => rs.map(r => [...r.children].map(c => c.textContent))")


def _loaded(page, img: str) -> None:
    """Wait until the <img> is there and its picture loaded (decoded, with a width)."""
    page.wait_for_function("sel => { const i = document.querySelector(sel); "
                           "return i && i.complete && i.naturalWidth > 0; }", arg=img)


def test_metrics_endpoint_gives_each_series_thinned_and_checked(server, runs):
    rid = runs[0]
    evs = [e for e in server.events(rid) if e["kind"] == "metric"]
    m = server.call("GET", f"/api/runs/{rid}/metrics", expect=200)
    assert m["run_id"] == rid and m["status"] == "succeeded" and m["series_left_out"] == 0
    assert m["last_seq"] == server.events(rid)[-1]["seq"]
    by = {s["name"]: s for s in m["series"]}
    assert set(by) == {"train_loss", "val_loss", "val_accuracy", "lr", "train_loss_batch"}
    for name in ("train_loss", "val_loss", "val_accuracy", "lr"):
        want = [e["data"] for e in evs if e["data"]["name"] == name]
        s = by[name]
        assert s["node_id"] == "train" and s["count"] == EPOCHS == len(want)
        assert s["steps"] == list(range(1, EPOCHS + 1))
        assert s["values"] == [d["value"] for d in want]
        assert s["last"] == {"step": EPOCHS, "value": want[-1]["value"]}
        assert s["min"] == min(d["value"] for d in want) and s["max"] == max(d["value"] for d in want)
    assert by["lr"]["values"] == [LRS[0]] * EPOCHS
    # Per batch: 120 training rows in batches of 16 is 8 batches an epoch.
    batches = [e["data"] for e in evs if e["data"]["name"] == "train_loss_batch"]
    assert by["train_loss_batch"]["count"] == len(batches) == 8 * EPOCHS
    # Thinned to ?points=: at most that many values, the first and the last always among them.
    thin = {s["name"]: s for s in server.call("GET", f"/api/runs/{rid}/metrics?points=10", expect=200)["series"]}
    b = thin["train_loss_batch"]
    assert len(b["steps"]) == len(b["values"]) == 10 and b["count"] == len(batches)
    assert b["steps"][0] == batches[0]["step"] and b["steps"][-1] == batches[-1]["step"]
    assert b["values"][-1] == batches[-1]["value"]
    by_step = {d["step"]: d["value"] for d in batches}
    assert all(by_step[x] == v for x, v in zip(b["steps"], b["values"], strict=True))
    # Bad input: a clear 400 naming the value; an unknown run: 404.
    status, body = server.api("GET", f"/api/runs/{rid}/metrics?points=1")
    assert status == 400 and body["error"]["code"] == "bad_query" and "points='1'" in body["error"]["message"]
    status, body = server.api("GET", "/api/runs/nosuchrun/metrics")
    assert status == 404 and "nosuchrun" in body["error"]["message"]


def test_run_view_draws_a_chart_per_metric_with_a_legend(server, browser, runs):
    rid = runs[0]
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{server.url}/#run={rid}")
    page.wait_for_selector("#chart-wrap:not([hidden]) figure[data-family='loss'] .u-legend")
    # train_loss and val_loss: two series of the loss chart, named in its legend.
    page.wait_for_function("() => document.querySelectorAll(\"figure[data-family='loss'] .u-legend "
                           "tr.u-series:not(:first-child):not([hidden])\").length === 2")
    assert _legend(page, "loss") == ["train_loss", "val_loss"]
    assert _legend(page, "accuracy") == ["val_accuracy"]
    assert _legend(page, "lr") == ["lr"]
    page.locator("#chart-wrap").screenshot(path=str(SHOTS / "run-charts.png"))
    # Axes: epochs along x, the metric up y.
    assert page.get_attribute("figure[data-family='loss']", "data-x-axis") == "epoch"
    assert page.get_attribute("figure[data-family='loss']", "data-y-axis") == "loss"
    # The per-batch loss chart is off by default; its box brings it.
    assert page.locator("figure[data-family='batch']").count() == 0
    page.check("#charts .show-batch")
    page.wait_for_selector("figure[data-family='batch'] .u-legend")
    assert _legend(page, "batch") == ["train_loss_batch"]
    assert page.get_attribute("figure[data-family='batch']", "data-x-axis") == "batch"
    # The caption gives the last value, as stored.
    last = server.call("GET", f"/api/runs/{rid}/metrics", expect=200)
    loss = next(s for s in last["series"] if s["name"] == "train_loss")
    assert f"at epoch {EPOCHS}" in page.inner_text("figure[data-family='loss'] .chart-caption")
    assert loss["last"]["value"] > 0
    # A click on a legend entry hides that series, its faint raw line with it.
    page.click("figure[data-family='loss'] .u-legend tr.u-series:has(.u-label:text-is('train_loss'))")
    page.wait_for_function("() => [...document.querySelectorAll(\"figure[data-family='loss'] .u-legend tr.u-series\")]"
                           ".map(r => r.classList.contains('u-off')).join() === 'false,true,true,false,false'")
    # Log scale: the y axis says so; smoothing 0 hides the faint raw lines' legend rows either way.
    page.check("figure[data-family='loss'] .log-scale")
    page.wait_for_selector("figure[data-family='loss'][data-y-axis='loss (log)']")
    page.fill("#charts-smoothing", "0")
    page.wait_for_function("() => document.querySelectorAll(\"figure[data-family='loss'] tr.u-series\").length === 3")
    assert _legend(page, "loss") == ["train_loss", "val_loss"]
    page.close()
    assert errors == []


def test_compare_overlays_two_runs_and_shows_the_lr_that_differs(server, browser, runs):
    a, b = runs
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{server.url}/web/compare.html?runs={a},{b}")
    page.wait_for_selector("body[data-ready='1']")
    want = [f"{a} iris lr {LRS[0]} · train_loss", f"{a} iris lr {LRS[0]} · val_loss",
            f"{b} iris lr {LRS[1]} · train_loss", f"{b} iris lr {LRS[1]} · val_loss"]
    assert _legend(page, "loss", "#compare-charts") == want
    # The params that differ: the optimizer's lr, one value per run, and nothing else.
    rows = _cells(page, "#compare-params tbody tr")
    assert rows == [["optimizer.lr", str(LRS[0]), str(LRS[1])]], rows
    # Final metrics: each run's last train_loss, as stored.
    finals = {}
    for rid in runs:
        m = server.call("GET", f"/api/runs/{rid}/metrics", expect=200)
        finals[rid] = next(s for s in m["series"] if s["name"] == "train_loss")["last"]["value"]
    row = _cells(page, "#compare-final tbody tr[data-metric='train_loss']")[0][1:]
    shown = [page.evaluate("v => v.toPrecision(5).replace(/\\.?0+$/, '')", finals[rid]) for rid in runs]
    assert len(row) == 2 and all(row[i].startswith(f"{shown[i]} at epoch {EPOCHS}") for i in range(2)), (row, shown)
    page.screenshot(path=str(SHOTS / "compare-runs.png"), full_page=True)
    # Runs are named in the order the address gives them, whatever their ids.
    page.goto(f"{server.url}/web/compare.html?runs={b},{a}")
    page.wait_for_selector("body[data-ready='1']")
    assert _legend(page, "loss", "#compare-charts") == want[2:] + want[:2]
    assert [r[1] for r in _cells(page, "#compare-runs-body tr")] == [b, a]

    # Bad addresses: a clear message each, naming what is wrong.
    for query, words in ((f"?runs={a}", "Only 1 run given"), ("", "No runs to compare"),
                         (f"?runs={a},nosuchrun", "nosuchrun does not exist"),
                         ("?runs=" + ",".join(f"r{i}" for i in range(11)), "11 runs given: at most 10"),
                         (f"?runs={a},bad%20id", 'Not a run id: "bad id"')):
        page.goto(f"{server.url}/web/compare.html{query}")
        page.wait_for_selector("#compare-error:not([hidden])")
        assert words in page.inner_text("#compare-error-message"), query
    page.close()
    assert errors == []


def test_an_image_output_and_artifact_render_as_pictures(server, browser):
    pytest.importorskip("matplotlib")
    g = graph([node("start", "Start"), node("img", "TensorCreate", shape="3,32,32", fill="rand"),
               node("viz", "Visualize", title="noise", plot_type="image")],
              [trig("start", "img"), edge("img", "tensor", "viz", "data")], name="picture")
    rid = server.submit(g, {"target": "local", "record_outputs": True})["id"]
    assert wait_run(server, rid)["status"] == "succeeded", server.events(rid)[-5:]
    arts = server.call("GET", f"/api/runs/{rid}/artifacts", expect=200)
    media = [x for x in arts if x["kind"] == "media"]
    assert [x["name"] for x in media] == ["viz.png"]
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(f"{server.url}/#run={rid}")
    # The plot's PNG among the artifacts: an <img> that loaded (naturalWidth > 0), as the server stored it.
    pic = f"#artifact-images figure[data-artifact='{media[0]['id']}'] img"
    _loaded(page, pic)
    assert page.eval_on_selector(pic, "i => [i.naturalWidth, i.naturalHeight]") == [800, 600]
    # A click enlarges it; Escape closes.
    page.click(f"#artifact-images figure[data-artifact='{media[0]['id']}'] button")
    page.wait_for_selector("#image-dialog[open] #image-dialog-img")
    page.wait_for_function("() => document.querySelector('#image-dialog-img').naturalWidth === 800")
    page.keyboard.press("Escape")
    page.wait_for_selector("#image-dialog:not([open])", state="attached")
    # Recorded outputs: the tensor keeps its summary and thumbnail; the plot's base64 text is a picture.
    page.wait_for_selector("#graph .g-node.recorded[data-node='img']")
    page.click("#graph .g-node[data-node='img']")
    page.wait_for_selector("#node-output tr[data-port='tensor'] img.thumb")
    assert "[3, 32, 32]" in page.inner_text("#node-output tr[data-port='tensor']")
    src = page.get_attribute("#node-output tr[data-port='tensor'] img.thumb", "src") or ""
    assert base64.b64decode(src.removeprefix("data:image/png;base64,"))[:8] == b"\x89PNG\r\n\x1a\n"
    page.click("#graph .g-node[data-node='viz']")
    out = "#node-output tr[data-port='image'] img.output-image"
    _loaded(page, out)
    assert page.eval_on_selector(out, "i => i.naturalWidth") == 800
    assert "iVBOR" not in page.inner_text("#node-output")
    page.close()
    assert errors == []
