"""Running from the canvas, in a real Chromium against a real server (and a real agent):
web/canvas/run.js, results.js and inspector.js on the canvas page (web/canvas.html) with its real
editor, tabs and panel.

What run.js draws on the editor is read back through the editor's own ``marks(node_id)`` (the
status and badges it draws); a node is opened as a person opens it (select it, Enter).
"""
from __future__ import annotations

from typing import Any

import pytest

from canvas_page import CanvasPage, module_fixtures
from procs import ServerProc, load_example, spawn_agent, wait_for, wait_run

pytestmark = pytest.mark.e2e

IRIS_NODES = ["start", "csv", "norm", "split", "train-set", "val-set", "train-loader", "val-loader", "model", "loss",
              "optimizer", "train", "save", "print-metrics"]

# A node that logs ``count`` lines as fast as it can, then, with ``every_s`` > 0, one more each
# ``every_s`` seconds until the run is stopped: a run that keeps adding lines while the test scrolls.
CHATTER = '''
import time

from cdui.nodes.base import Node, Param, Port


class Chatter(Node):
    """Logs ``count`` lines, then one line each ``every_s`` seconds until stopped (tests only)."""
    NODE_NAME = "Chatter"
    CATEGORY = "tests"

    @classmethod
    def define_params(cls):
        return [Param("count", "int", 100), Param("every_s", "float", 0.0)]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        for i in range(int(params["count"])):
            ctx.log(f"line {i + 1} of {params['count']}")
        j = 0
        while params["every_s"] > 0:
            ctx.check_stop()  # a stopped run ends here, cancelled
            j += 1
            ctx.log(f"tick {j}")
            time.sleep(params["every_s"])
        return {"value": float(params["count"])}
'''


def chatter_graph(count: int, every_s: float = 0.0) -> dict[str, Any]:
    return {"format_version": 1, "name": f"chatter {count}", "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "chat", "type": "Chatter", "position": {"x": 220, "y": 0},
         "data": {"params": {"count": count, "every_s": every_s}}}],
        "edges": [{"id": "t", "source": "start", "sourceHandle": "trigger", "target": "chat", "targetHandle": None,
                   "type": "trigger"}]}


server, browser = module_fixtures("canvas-run", {"chatter.py": CHATTER})


def test_queue_on_this_server_shows_statuses_chart_and_the_inspector(server, browser, tmp_path):
    p = CanvasPage(browser, server, height=1000)
    p.open(load_example(), "iris")
    p.page.check("#canvas-record")
    assert p.js("() => window.cduiCanvas.tabs.active().options.record_outputs") is True
    p.page.select_option("#canvas-queue-target", "local")
    p.page.click("#canvas-queue")
    rid = p.run_id()
    run = server.call("GET", f"/api/runs/{rid}", expect=200)
    assert run["target"] == "local" and run["options"]["record_outputs"] is True, run
    p.page.wait_for_selector("#canvas-run-status .badge.status-succeeded")
    assert wait_run(server, rid)["status"] == "succeeded"
    # Every node's status came from the run's events onto the tab's editor, with its seconds.
    p.wait_status("print-metrics", "done")
    assert p.statuses() == {n: "done" for n in IRIS_NODES}
    # The log holds every stored event once, in order (read through its own API: only the lines in
    # view are in the page); the chart draws the training losses.
    events = server.events(rid)
    p.page.wait_for_selector(f"#canvas-log[data-last-seq='{events[-1]['seq']}']")
    lines = p.log_lines()
    assert [x["seq"] for x in lines] == [e["seq"] for e in events]
    assert len([x for x in lines if x["kind"] == "node_status" and " done in " in x["text"]]) == len(IRIS_NODES)
    # The log follows its end: the last event's line is in the page.
    p.page.wait_for_selector(f"#canvas-log li[data-seq='{events[-1]['seq']}']")
    p.page.wait_for_selector("#canvas-chart polyline[data-series='train_loss']")
    losses = [e["data"]["value"] for e in events if e["kind"] == "metric" and e["data"]["name"] == "train_loss"]
    points = p.page.get_attribute("#canvas-chart polyline[data-series='train_loss']", "points") or ""
    assert len(points.split()) == len(losses) == 20

    # The Inspector on Normalize: its input (the CSV's features) and output, their stats and values.
    p.open_node("norm")
    p.page.wait_for_selector("#canvas-inspector .ins-port[data-port='tensor'] dd[data-stat='mean']")
    want = server.call("GET", f"/api/runs/{rid}/outputs/norm", expect=200)["outputs"][0]
    out = "#canvas-inspector .ins-outputs .ins-port[data-port='tensor']"
    assert p.page.inner_text(f"{out} dd[data-stat='shape']") == "[150, 4]"
    assert p.page.inner_text(f"{out} dd[data-stat='dtype']") == want["dtype"] == "float32"
    for stat in ("min", "max", "mean"):
        assert float(p.page.inner_text(f"{out} dd[data-stat='{stat}']")) == pytest.approx(want[stat], rel=1e-4)
    assert abs(want["mean"]) < 1e-5  # z-scored
    # The input block names its edge, and the difference of two tensors of one shape is drawn.
    assert p.page.inner_text("#canvas-inspector .ins-inputs .ins-port h5").startswith("tensor ← csv.tensor")
    cells = p.page.locator(f"{out} .ins-diff td")
    assert cells.count() == len(want["preview"]) * len(want["preview"][0]) == 16 * 4
    # The raw tensor downloads (header-authenticated) and loads as the same tensor.
    with p.page.expect_download() as dl:
        p.page.click(f"{out} button:has-text('Download .pt')")
    path = tmp_path / "norm.pt"
    dl.value.save_as(path)
    import torch
    t = torch.load(path)
    assert tuple(t.shape) == (150, 4) and float(t.mean()) == pytest.approx(want["mean"], abs=1e-6)
    p.close()


def test_validation_badges_and_run_refused_with_errors(server, browser):
    p = CanvasPage(browser, server, height=1000)
    bad = load_example()
    # An edge into a port that does not exist and a node of a type that does not exist.
    bad["edges"].append({"id": "wrong", "source": "csv", "target": "split", "sourceHandle": "tensor",
                         "targetHandle": "nope", "type": "data"})
    bad["nodes"].append({"id": "ghost", "type": "NoSuchNodeType", "position": {"x": 0, "y": 300},
                         "data": {"params": {}}})
    bad["edges"].append({"id": "to-ghost", "source": "start", "target": "ghost", "sourceHandle": "trigger",
                         "targetHandle": None, "type": "trigger"})
    errors = server.call("POST", "/api/graphs/validate", {"graph": bad}, expect=200)["errors"]
    assert errors, errors
    runs_before = len(server.call("GET", "/api/runs", expect=200))
    p.open(bad, "bad")
    # Validation after the change (debounced) marks the nodes and the edge the errors name.
    p.page.wait_for_function("() => window.cduiCanvas.editor().marks('ghost').badges.length > 0")
    wrong = next(f"{e['message']} ({e['hint']})" for e in errors if e.get("value") == "nope")
    assert wrong in p.js("() => window.cduiCanvas.editor().marks('split').badges")
    # The edge the error names is marked too (the editor keeps edge marks beside node marks).
    assert {"node_id": None, "edge_id": "wrong", "message": wrong} in p.js("() => window.cduiCanvas.editor()._badges")
    p.page.wait_for_selector("#canvas-validity.error-text")
    # Run shows every error and sends nothing.
    p.page.click("#canvas-run")
    p.page.wait_for_selector("#canvas-errors li")
    assert p.page.locator("#canvas-errors li").count() == len(errors)
    text = p.page.inner_text("#canvas-errors")
    for e in errors:
        assert e["message"] in text
    assert len(server.call("GET", "/api/runs", expect=200)) == runs_before
    # Fixing the graph clears the marks.
    p.js("""() => { const ed = window.cduiCanvas.editor();
                     ed.load(Object.assign(ed.toJSON(), {nodes: ed.toJSON().nodes.filter(n => n.id !== 'ghost'),
                       edges: ed.toJSON().edges.filter(e => !['wrong', 'to-ghost'].includes(e.id))}));
                     ed.setParam('train', 'epochs', 3); }""")
    p.page.wait_for_function("() => window.cduiCanvas.editor()._badges.length === 0")
    p.page.wait_for_selector("#canvas-validity.ok-text")
    p.close()


def test_queue_on_a_real_agent_and_its_status_flows_back(server, browser, tmp_path):
    agent = spawn_agent(server, tmp_path, "canvas-box")
    try:
        def online() -> bool:
            if not agent.alive:
                raise AssertionError(f"agent exited {agent.returncode}:\n{agent.log_tail(30)}")
            return any(w["name"] == "canvas-box" and w["online"]
                       for w in server.call("GET", "/api/workers", expect=200)["workers"])
        wait_for(online, 120, 0.2, "worker canvas-box online")
        p = CanvasPage(browser, server, height=1000)
        graph = load_example()
        p.open(graph, "iris on a worker")
        # The picker reads the workers when it is opened (nothing polls).
        p.page.focus("#canvas-queue-target")
        p.page.wait_for_selector("#canvas-queue-target option[value='worker:canvas-box']", state="attached")
        p.page.select_option("#canvas-queue-target", "worker:canvas-box")
        p.page.fill("#canvas-device", "cpu")
        p.page.click("#canvas-queue")
        rid = p.run_id()
        run = server.call("GET", f"/api/runs/{rid}", expect=200)
        assert run["target"] == {"worker": "canvas-box"} and run["options"]["device"] == "cpu", run
        assert "canvas" not in run or not run["canvas"], run
        p.page.wait_for_selector("#canvas-run-status .badge.status-succeeded")
        assert server.call("GET", f"/api/runs/{rid}", expect=200)["worker_id"] == "canvas-box"
        p.wait_status("print-metrics", "done")
        assert p.statuses() == {n: "done" for n in IRIS_NODES}
        assert p.page.inner_text("#canvas-run-title") == f"Run {rid} queued on worker canvas-box"
        p.page.wait_for_selector("#canvas-chart polyline")
        p.close()
    finally:
        agent.stop()


def test_run_cached_upstream_then_stop(server, browser):
    p = CanvasPage(browser, server, height=1000)
    tab = p.open(load_example(), "iris cached")
    p.page.click("#canvas-run")
    first = p.run_id()
    p.page.wait_for_selector("#canvas-run-status .badge.status-succeeded")
    assert server.call("GET", f"/api/runs/{first}", expect=200)["canvas"] == tab
    p.wait_status("train", "done")
    # A downstream change: training and what follows re-run, the nodes above it answer from the cache.
    p.js("() => window.cduiCanvas.editor().setParam('optimizer', 'lr', 0.02)")
    p.page.click("#canvas-run")
    p.page.wait_for_function("(id) => !document.querySelector('#canvas-run-title a')?.href.endsWith(id)", arg=first)
    second = p.run_id()
    p.page.wait_for_selector("#canvas-run-status .badge.status-succeeded")
    p.wait_status("train", "done")
    p.wait_status("print-metrics", "done")
    got = p.statuses()
    from_events = {e["data"]["node_id"]: e["data"]["status"] for e in server.events(second)
                   if e["kind"] == "node_status" and e["data"]["status"] in ("done", "cached")}
    assert got == from_events
    for upstream in ("csv", "norm", "split"):
        assert got[upstream] == "cached", got
    for downstream in ("optimizer", "train", "save"):
        assert got[downstream] == "done", got
    assert any(x["level"] == "cached" for x in p.log_lines())

    # Stop: a long training run, stopped from the toolbar, ends cancelled with its node stopped.
    long = load_example()
    for n in long["nodes"]:
        if n["id"] == "train":
            n["data"]["params"]["epochs"] = 100000
    p.js("(g) => window.cduiCanvas.editor().load(g)", long)
    p.page.click("#canvas-run")
    p.page.wait_for_function("(id) => !document.querySelector('#canvas-run-title a')?.href.endsWith(id)", arg=second)
    third = p.run_id()
    p.wait_status("train", "running")
    # Live updates never move the focus: the run's link keeps it while the epochs stream in.
    p.page.focus("#canvas-run-title a")
    log = p.log()
    progress = f"() => {log}.lines().filter((x) => x.kind === 'progress').length"
    epochs = p.js(progress)
    p.page.wait_for_function(f"n => ({progress})() > n + 2", arg=epochs)
    assert p.js("() => document.activeElement === document.querySelector('#canvas-run-title a')")
    p.page.click("#canvas-stop")
    p.page.wait_for_selector("#canvas-run-status .badge.status-cancelled")
    assert wait_run(server, third)["status"] == "cancelled"
    p.wait_status("train", "stopped")
    assert server.call("GET", f"/api/runs/{third}", expect=200)["canvas"] == tab
    p.close()


def _losses(server: ServerProc, run_id: str) -> list[float]:
    """The training loss of each epoch, in order, from the run's metric events."""
    pts = [(e["data"]["step"], e["data"]["value"]) for e in server.events(run_id)
           if e["kind"] == "metric" and e["data"]["name"] == "train_loss"]
    return [v for _, v in sorted(pts)]


def _run_from_page(p: CanvasPage, before: str | None) -> str:
    """Clicks Run and waits for that run to succeed; returns its id."""
    p.page.click("#canvas-run")
    if before is not None:
        p.page.wait_for_function("(id) => !document.querySelector('#canvas-run-title a')?.href.endsWith(id)",
                                 arg=before)
    rid = p.run_id()
    p.page.wait_for_selector("#canvas-run-status .badge.status-succeeded")
    assert wait_run(p.server, rid)["status"] == "succeeded"
    return rid


def test_persist_weights_then_reset_from_the_page(server, browser):
    p = CanvasPage(browser, server, height=1000)
    tab = p.open(load_example(), "iris persist")
    p.page.check("#canvas-persist")
    assert p.js("() => window.cduiCanvas.tabs.active().options.persist_weights") is True
    first_id = _run_from_page(p, None)
    assert server.call("GET", f"/api/runs/{first_id}", expect=200)["options"]["persist_weights"] is True
    first = _losses(server, first_id)
    assert len(first) == 20
    drop = first[0] - first[-1]
    assert drop > 0.3, first  # it learned: the margins below are fractions of what it learned
    # The second Run (a changed learning rate, so training runs again) starts where the first ended.
    p.js("() => window.cduiCanvas.editor().setParam('train', 'lr', 0.005)")
    second_id = _run_from_page(p, first_id)
    second = _losses(server, second_id)
    assert abs(second[0] - first[-1]) < 0.25 * drop, (first, second)
    assert second[0] < first[0] - 0.5 * drop, (first, second)
    # Reset weights from the toolbar: the page says one model's weights were dropped ...
    p.page.click("#canvas-reset-weights")
    p.page.wait_for_function("() => document.body.innerText.includes('Weights reset: 1 kept module dropped')")
    tabs = {t["tab"]: t for t in server.call("GET", "/api/canvas", expect=200)["tabs"]}
    assert tabs[tab]["weights"] == 0, tabs
    # ... and the next Run, Persist still on, starts from fresh weights again.
    p.js("() => window.cduiCanvas.editor().setParam('train', 'lr', 0.01)")
    third_id = _run_from_page(p, second_id)
    third = _losses(server, third_id)
    assert abs(third[0] - first[0]) < 0.25 * drop, (first, third)
    assert third[0] > first[-1] + 0.5 * drop, (first, third)
    p.close()


def test_canvas_process_killed_then_the_next_run_works(server, browser):
    import os
    import signal

    def tab_procs() -> dict[str, Any]:
        return {t["tab"]: t for t in server.call("GET", "/api/canvas", expect=200)["tabs"]}

    p = CanvasPage(browser, server, height=1000)
    tab = p.open(load_example(), "iris killed")
    first = _run_from_page(p, None)
    pid = tab_procs()[tab]["pid"]
    # Killed from outside (SIGKILL of the pid GET /api/canvas names): the next Run from the page works,
    # on a new process with an empty cache (every node runs again), and the first run is still stored.
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: tab not in tab_procs(), 60, 0.1, "the killed canvas process to leave GET /api/canvas")
    second = _run_from_page(p, first)
    assert tab_procs()[tab]["pid"] != pid
    p.wait_status("print-metrics", "done")
    assert p.statuses() == {n: "done" for n in IRIS_NODES}
    # Ended through the API (what closing a tab does): the same again.
    assert server.call("DELETE", f"/api/canvas/{tab}", expect=200)["tab"] == tab
    assert tab not in tab_procs()
    third = _run_from_page(p, second)
    p.wait_status("print-metrics", "done")
    assert p.statuses() == {n: "done" for n in IRIS_NODES}
    listed = {r["id"]: r for r in server.call("GET", "/api/runs", expect=200)}
    for rid in (first, second, third):
        assert listed[rid]["status"] == "succeeded", listed.get(rid)
        assert server.call("GET", f"/api/runs/{rid}", expect=200)["canvas"] == tab
        assert len(_losses(server, rid)) == 20
    p.close()


def test_only_the_shown_tab_draws_and_nothing_while_the_page_is_hidden(server, browser):
    """An editor draws on every animation frame; a tab not shown, or any tab of a hidden page, must not."""
    p = CanvasPage(browser, server, height=1000)
    a = p.open(load_example(), "drawn a")
    b = p.open(load_example(), "drawn b")
    drawing = "(id) => window.cduiCanvas.tabs.get(id).editor.drawing()"
    # b is shown: it draws, a does not, and a's frame count stays where it was while b draws on.
    assert p.js(drawing, a)["on"] is False and p.js(drawing, b)["on"] is True
    a_frames = p.js(drawing, a)["frames"]
    b_frames = p.js(drawing, b)["frames"]
    p.page.wait_for_function("([id, n]) => window.cduiCanvas.tabs.get(id).editor.drawing().frames > n + 30",
                             arg=[b, b_frames])
    assert p.js(drawing, a)["frames"] == a_frames
    # A status set on the tab that is not shown appears when it is shown (it redraws on show).
    p.js("(id) => window.cduiCanvas.tabs.get(id).editor.setNodeStatus('csv', 'done', {seconds: 1})", a)
    assert p.js(drawing, a)["frames"] == a_frames
    p.page.click(f".cv-tab[data-tab-id='{a}'] .cv-tab-button")
    assert p.js(drawing, a)["on"] is True and p.js(drawing, b)["on"] is False
    p.page.wait_for_function("([id, n]) => window.cduiCanvas.tabs.get(id).editor.drawing().frames > n",
                             arg=[a, a_frames])
    assert p.js("(id) => window.cduiCanvas.tabs.get(id).editor.marks('csv').status", a) == "done"
    # The page hidden: no editor draws, for as many animation frames as the page gets meanwhile.
    p.js("""() => { Object.defineProperty(document, 'visibilityState', {get: () => 'hidden', configurable: true});
                    Object.defineProperty(document, 'hidden', {get: () => true, configurable: true});
                    document.dispatchEvent(new Event('visibilitychange')); }""")
    assert p.js(drawing, a)["on"] is False and p.js(drawing, b)["on"] is False
    frames = [p.js(drawing, a)["frames"], p.js(drawing, b)["frames"]]
    p.page.evaluate("""() => new Promise((done) => { let n = 0;
        const tick = () => (++n >= 30 ? done() : requestAnimationFrame(tick)); requestAnimationFrame(tick); })""")
    assert [p.js(drawing, a)["frames"], p.js(drawing, b)["frames"]] == frames
    # Shown again: the tab shown draws again, the other stays still.
    p.js("""() => { Object.defineProperty(document, 'visibilityState', {get: () => 'visible', configurable: true});
                    Object.defineProperty(document, 'hidden', {get: () => false, configurable: true});
                    document.dispatchEvent(new Event('visibilitychange')); }""")
    p.page.wait_for_function("([id, n]) => window.cduiCanvas.tabs.get(id).editor.drawing().frames > n + 30",
                             arg=[a, frames[0]])
    assert p.js(drawing, b)["frames"] == frames[1]
    p.close()


def _stored_events(server: ServerProc, run_id: str) -> list[dict[str, Any]]:
    """All of a run's stored events, page after page."""
    out: list[dict[str, Any]] = []
    while True:
        got = server.events(run_id, out[-1]["seq"] if out else 0)
        if not got:
            return out
        out += got


def _frames(p: CanvasPage, n: int) -> None:
    """Lets the page draw ``n`` animation frames (what it draws, it draws at one of them)."""
    p.page.evaluate("""(n) => new Promise((done) => { let i = 0;
        const tick = () => (++i >= n ? done() : requestAnimationFrame(tick)); requestAnimationFrame(tick); })""", n)


def _set_hidden(p: CanvasPage, hidden: bool) -> None:
    p.js("""(hidden) => { Object.defineProperty(document, 'visibilityState', {get: () => hidden ? 'hidden' : 'visible',
                            configurable: true});
                          Object.defineProperty(document, 'hidden', {get: () => hidden, configurable: true});
                          document.dispatchEvent(new Event('visibilitychange')); }""", hidden)


LOG_EL = "document.getElementById('canvas-log')"
# The last line in the page is the last line the log holds: the log shows its end.
AT_END = f"() => {{ const el = {LOG_EL}, li = el.querySelector('li:last-child'); " \
    "return !!li && li.dataset.seq === el.dataset.lastSeq; }"
# Where line n's row is drawn, from the top of the log's box (0: the first row in view).
ROW_AT = f"(n) => {{ const el = {LOG_EL}, li = el.querySelector(`li[data-line='${{n}}']`); if (!li) return null; " \
    "const a = el.getBoundingClientRect(), b = li.getBoundingClientRect(); return b.top - a.top - el.clientTop; }"


def test_ten_thousand_lines_stream_into_a_virtual_log(server, browser):
    """A run logs 10,000 lines, then one more every 50 ms until stopped. The log holds them all, in the
    order stored, with only a window of them in the page; it follows the end until the reader scrolls
    up, and then a new line does not move the view; a line in view can be selected and the selection
    survives new lines; a hidden page draws nothing and catches up when shown; Copy log copies them all."""
    p = CanvasPage(browser, server, height=1000)
    p.open(chatter_graph(10000, every_s=0.05), "chatter")
    p.page.click("#canvas-run")
    rid = p.run_id()
    log = p.log()
    # The 10,000 lines and the first ticks after them have arrived (counted by the log itself).
    p.page.wait_for_function(f"() => Number({LOG_EL}.dataset.count) > 10005")
    lines = p.log_lines()
    stored = _stored_events(server, rid)
    n = min(len(lines), len(stored))
    assert n > 10005
    assert [x["seq"] for x in lines[:n]] == [e["seq"] for e in stored[:n]]
    assert [x["line"] for x in lines] == list(range(1, len(lines) + 1))
    said = [x["text"] for x in lines if x["kind"] == "log" and x["text"].startswith("[chat] ")]
    assert said[:10001] == [f"[chat] line {i} of 10000" for i in range(1, 10001)] + ["[chat] tick 1"]
    assert p.page.get_attribute("#canvas-log", "data-dropped") == "0"
    # Only a window of them is in the page, and it is the end: the log follows the run.
    p.page.wait_for_function(AT_END)
    shown = p.js(f"() => {log}.rendered()")
    assert 0 < len(shown) <= 50 and shown == list(range(shown[0], shown[0] + len(shown))), shown
    assert p.js(f"() => {log}.following()") is True

    # The reader scrolls to the top: line 1 is the first row in view.
    p.js(f"() => {{ {LOG_EL}.scrollTop = 0; }}")
    p.page.wait_for_selector("#canvas-log li[data-seq='1']")
    assert p.js(ROW_AT, 1) == 0
    assert p.js(f"() => {log}.following()") is False
    # A line in view selected (three clicks: the whole line) ...
    third = lines[2]["text"]
    p.page.locator("#canvas-log li[data-line='3'] .msg").click(click_count=3)
    assert third in p.js("() => String(window.getSelection())")
    # ... then new lines arrive and are drawn: the view does not move, the selection stays.
    count = int(p.page.get_attribute("#canvas-log", "data-count") or 0)
    p.page.wait_for_function(f"(n) => Number({LOG_EL}.dataset.count) > n + 5", arg=count)
    _frames(p, 3)
    assert p.js(f"() => {LOG_EL}.scrollTop") == 0
    assert p.js(ROW_AT, 1) == 0
    assert p.js(AT_END) is False
    assert third in p.js("() => String(window.getSelection())")

    # Hidden, the page draws nothing (the lines are still kept); shown again, it catches up.
    p.js(f"() => {{ {LOG_EL}.scrollTop = {LOG_EL}.scrollHeight; }}")
    p.page.wait_for_function(AT_END)
    _set_hidden(p, True)
    _frames(p, 2)  # a frame asked for before the page was hidden draws nothing now
    drawn = (p.page.get_attribute("#canvas-log", "data-count"), p.js(f"() => {log}.rendered()"))
    held = p.js(f"() => {log}.lines().length")
    p.page.wait_for_function(f"(n) => {log}.lines().length > n + 5", arg=held)
    _frames(p, 30)
    assert (p.page.get_attribute("#canvas-log", "data-count"), p.js(f"() => {log}.rendered()")) == drawn
    _set_hidden(p, False)
    p.page.wait_for_function(f"(n) => Number({LOG_EL}.dataset.count) > n + 5", arg=int(drawn[0] or 0))
    p.page.wait_for_function(AT_END)
    assert p.js(f"() => {log}.following()") is True

    p.page.click("#canvas-stop")
    p.page.wait_for_selector("#canvas-run-status .badge.status-cancelled")
    assert wait_run(server, rid)["status"] == "cancelled"
    # Every stored event is in the log once, in order.
    stored = _stored_events(server, rid)
    p.page.wait_for_selector(f"#canvas-log[data-last-seq='{stored[-1]['seq']}']")
    lines = p.log_lines()
    assert [x["seq"] for x in lines] == [e["seq"] for e in stored]
    # Copy log copies every line it holds, not only those in the page.
    p.context.grant_permissions(["clipboard-read", "clipboard-write"])
    p.page.click("#canvas-log-copy")
    p.page.wait_for_selector(f"#canvas-log-copied:has-text('{len(lines)} lines copied')")
    assert p.js("() => navigator.clipboard.readText()") == "".join(
        f"{x['seq']}\t{x['kind']}\t{x['text']}\n" for x in lines)
    p.close()


def test_the_log_keeps_its_last_lines_and_says_how_many_it_dropped(server, browser):
    """The results panel of results.js on its own (a RunView keeping 100 lines, fed events as run.js
    feeds them): past its bound the log drops its oldest lines and says how many; a reader looking at a
    line keeps looking at it while lines are dropped above it."""
    p = CanvasPage(browser, server, height=1000)
    p.js("""async () => {
        const { createResults, RunView, logOf } = await import('/web/canvas/results.js');
        const root = document.createElement('section');
        root.className = 'canvas-results';
        document.body.prepend(root);
        const panel = createResults(root);
        const view = new RunView({ id: 'r1', kind: 'canvas', targetLabel: 'this server' }, { maxLines: 100 });
        panel.show(view);
        const el = root.querySelector('.cr-log');
        let seq = 0;
        const add = (n) => { const evs = [];
          for (let i = 0; i < n; i++) { const ev = { seq: ++seq, kind: 'log', data: { message: `m ${seq}` } };
            view.add(ev); evs.push(ev); }
          panel.added(view, evs, false); };
        window.__t = { el, add, panel, log: logOf(el) };
    }""")
    t = "window.__t"
    p.js(f"() => {t}.add(250)")
    p.page.wait_for_function(f"() => {t}.el.dataset.lastSeq === '250'")
    held = p.js(f"() => [{t}.el.dataset.count, {t}.el.dataset.dropped, {t}.el.dataset.firstSeq]")
    assert held == ["100", "150", "151"]
    lines = p.js(f"() => {t}.log.lines()")
    assert [x["line"] for x in lines] == list(range(151, 251))
    assert [x["text"] for x in lines] == [f"m {i}" for i in range(151, 251)]
    # At the top: a line says how many were dropped, then the oldest line kept.
    p.js(f"() => {{ {t}.el.scrollTop = 0; }}")
    p.page.wait_for_selector(".canvas-results li[data-line='151']")
    assert p.js(f"() => [...{t}.el.querySelectorAll('li')].slice(0, 2).map((li) => li.textContent)") == [
        "150 earlier lines dropped (the run's events in Runs have them all)", "151logm 151"]
    # Looking at line 200 (the top row in view), 30 more arrive and 30 more are dropped above it:
    # line 200 is still the top row in view.
    top = f"(n) => {{ const el = {t}.el, li = el.querySelector(`li[data-line='${{n}}']`); return li && " \
        "li.getBoundingClientRect().top - el.getBoundingClientRect().top - el.clientTop; }"
    p.js(f"() => {t}.log.scrollToLine(200)")
    p.page.wait_for_function(f"() => ({top})(200) === 0")
    p.js(f"() => {t}.add(30)")
    p.page.wait_for_function(f"() => {t}.el.dataset.dropped === '180'")
    _frames(p, 2)
    assert p.js(top, 200) == 0
    assert p.js(f"() => {t}.log.following()") is False
    p.js(f"() => {{ {t}.el.scrollTop = 0; }}")
    p.page.wait_for_selector(".canvas-results li[data-line='0'][data-dropped='180']")
    # No run shown (a tab without one): an empty log.
    p.js(f"() => {t}.panel.show(null)")
    assert p.js(f"() => [{t}.el.dataset.count, {t}.el.dataset.lastSeq, {t}.el.querySelectorAll('li').length]") == [
        "0", "", 0]
    assert p.js(f"() => {t}.log.lines()") == []
    p.close()
