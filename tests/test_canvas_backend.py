"""The canvas backend (docs/canvas.md): per-tab canvas processes, the execution cache, persistent
weights and the /api/canvas routes, on a real server with real processes; and the cache itself on
real tensors and real node classes."""
from __future__ import annotations

import copy
import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from cdui.core.layout import Layout
from cdui.graph.model import parse
from cdui.graph.validate import build_plan
from cdui.nodes.registry import Registry, build_registry
from cdui.run.canvas_proc import ExecutionCache, KeptWeights, RunCache
from procs import (
    ServerProc,
    edge,
    graph,
    load_example,
    long_training_graph,
    node,
    pid_alive,
    trig,
    wait_event,
    wait_for,
    wait_run,
)

UPSTREAM_OF_TRAINING = {"start", "csv", "norm", "split", "train-set", "val-set", "train-loader", "val-loader", "loss"}
# The model, its optimizer and everything after the training loop: not cacheable, or below one that is not.
ALWAYS_RUN = {"model", "optimizer", "train", "save", "print-metrics"}

CUSTOM_NODES = textwrap.dedent('''
    """Nodes for the canvas backend's tests."""
    import time

    from cdui.nodes.base import Node, Param, Port


    class CanvasEchoNode(Node):
        NODE_NAME = "TestCanvasEcho"

        @classmethod
        def define_outputs(cls):
            return [Port("value", "TENSOR")]

        @classmethod
        def define_params(cls):
            return [Param("value", "float", 1.0)]

        def execute(self, inputs, params, ctx):
            import torch
            return {"value": torch.tensor([float(params["value"]) * VERSION])}


    class CanvasIgnoreStopNode(Node):
        NODE_NAME = "TestCanvasIgnoreStop"

        def execute(self, inputs, params, ctx):
            ctx.log("sleeping, and ignoring stop requests")
            for _ in range(1000):
                time.sleep(0.2)  # never looks at ctx.should_stop()
            return {}


    VERSION = 1
''')
STOP_GRACE_S = 8  # short enough for the test that waits it out, long enough for a loaded machine


# -- on a real server -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    s = ServerProc(tmp_path_factory.mktemp("canvas"), name="canvas-server",
                   extra_env={"CODEFYUI_STOP_GRACE_S": str(STOP_GRACE_S), "CODEFYUI_RUN_QUEUE_MAX_CONCURRENT": "1"})
    (s.data_dir / "custom_nodes").mkdir(parents=True)
    (s.data_dir / "custom_nodes" / "canvas_nodes.py").write_text(CUSTOM_NODES)
    try:
        s.start()
        types = {n["type"] for n in s.call("GET", "/api/nodes")["nodes"]}
        assert {"TestCanvasEcho", "TestCanvasIgnoreStop"} <= types
        yield s
    finally:
        s.stop()


def canvas_run(server: ServerProc, tab: str, g: dict[str, Any], persist: bool = False,
               record: bool = False) -> str:
    out = server.call("POST", "/api/canvas/run", {"tab": tab, "graph": g, "persist_weights": persist,
                                                  "record_outputs": record}, expect=202)
    assert out["tab"] == tab
    return str(out["run_id"])


def run_done(server: ServerProc, tab: str, g: dict[str, Any], persist: bool = False) -> str:
    run_id = canvas_run(server, tab, g, persist)
    run = wait_run(server, run_id)
    assert run["status"] == "succeeded", run
    return run_id


def node_statuses(server: ServerProc, run_id: str) -> dict[str, str]:
    """Each node's last status other than running."""
    out: dict[str, str] = {}
    for e in server.events(run_id):
        if e["kind"] == "node_status" and e["data"]["status"] != "running":
            out[e["data"]["node_id"]] = e["data"]["status"]
    return out


def node_event(server: ServerProc, run_id: str, node_id: str) -> dict[str, Any]:
    evs = [e["data"] for e in server.events(run_id) if e["kind"] == "node_status"
           and e["data"].get("node_id") == node_id and e["data"]["status"] != "running"]
    assert len(evs) == 1, evs
    return evs[0]


def losses(server: ServerProc, run_id: str) -> list[float]:
    """The training loss of each epoch, in order, from the run's metric events."""
    pts = [(e["data"]["step"], e["data"]["value"]) for e in server.events(run_id)
           if e["kind"] == "metric" and e["data"]["name"] == "train_loss"]
    return [v for _, v in sorted(pts)]


def process_pid(server: ServerProc, run_id: str) -> int:
    for e in server.events(run_id):
        if e["kind"] == "status" and e["data"].get("status") == "running":
            return int(e["data"]["pid"])
    raise AssertionError(f"run {run_id} has no running event")


def tabs(server: ServerProc) -> dict[str, dict[str, Any]]:
    return {t["tab"]: t for t in server.call("GET", "/api/canvas")["tabs"]}


def with_param(g: dict[str, Any], node_id: str, **params: Any) -> dict[str, Any]:
    g = copy.deepcopy(g)
    for n in g["nodes"]:
        if n["id"] == node_id:
            n["data"]["params"].update(params)
    return g


def first_epoch(server: ServerProc, run_id: str) -> None:
    wait_event(server, run_id, lambda e: e["kind"] == "metric" and e["data"].get("name") == "train_loss",
               what="a training epoch")


@pytest.mark.e2e
def test_lr_change_reruns_only_the_training(server: ServerProc) -> None:
    """A second Run with only TrainingLoop's lr changed answers every node upstream of it from the cache
    (`cached`, seconds 0, the same output summaries) and runs the training and what follows; both are
    ordinary stored local runs marked with their tab."""
    g = load_example()
    first = run_done(server, "lr", g)
    assert node_statuses(server, first) == {n["id"]: "done" for n in g["nodes"]}
    run = server.run(first)
    assert run["canvas"] == "lr" and run["options"]["canvas"] == "lr" and run["target"] == "local"
    assert run["options"]["persist_weights"] is False
    second = run_done(server, "lr", with_param(g, "train", lr=0.005))
    statuses = node_statuses(server, second)
    assert statuses == {**{n: "cached" for n in UPSTREAM_OF_TRAINING}, **{n: "done" for n in ALWAYS_RUN}}
    for nid in ("csv", "split", "train-loader"):
        cached, done = node_event(server, second, nid), node_event(server, first, nid)
        assert cached["seconds"] == 0 and cached["outputs"] == done["outputs"]
    assert process_pid(server, first) == process_pid(server, second)  # the tab's process, kept
    assert server.run(second)["canvas"] == "lr"
    # The stored runs are listed as any run is.
    listed = {r["id"]: r for r in server.call("GET", "/api/runs")}
    assert listed[first]["status"] == listed[second]["status"] == "succeeded"


@pytest.mark.e2e
def test_normalize_change_reruns_it_and_what_is_downstream(server: ServerProc) -> None:
    g = load_example()
    run_done(server, "norm", g)
    second = run_done(server, "norm", with_param(g, "norm", mode="minmax"))
    statuses = node_statuses(server, second)
    downstream = {"norm", "split", "train-set", "val-set", "train-loader", "val-loader"}
    assert statuses == {"start": "cached", "csv": "cached", "loss": "cached",
                        **{n: "done" for n in downstream | ALWAYS_RUN}}
    # Back to the first value: the first run's entries answer again.
    third = run_done(server, "norm", g)
    assert {n for n, s in node_statuses(server, third).items() if s == "cached"} == UPSTREAM_OF_TRAINING


@pytest.mark.e2e
def test_persist_weights_continue_training_until_reset(server: ServerProc) -> None:
    """Persist on: the next Run's first epoch starts where the last one ended; after reset-weights it
    starts from new weights again."""
    g = load_example()
    first = losses(server, run_done(server, "persist", g, persist=True))
    assert len(first) == 20
    drop = first[0] - first[-1]
    assert drop > 0.3, first  # it learned: the margins below are fractions of what it learned
    assert tabs(server)["persist"]["weights"] == 1
    second = losses(server, run_done(server, "persist", with_param(g, "train", lr=0.005), persist=True))
    assert abs(second[0] - first[-1]) < 0.25 * drop, (first, second)
    assert server.call("POST", "/api/canvas/persist/reset-weights") == {"tab": "persist", "reset": 1}
    assert tabs(server)["persist"]["weights"] == 0
    third = losses(server, run_done(server, "persist", g, persist=True))
    assert abs(third[0] - first[0]) < 0.25 * drop, (first, third)
    # A structural change of the model (its building node's params) means new weights too.
    layers = next(n for n in g["nodes"] if n["id"] == "model")["data"]["params"]["layers"]
    wider = with_param(g, "model", layers=layers.replace('"out_features":16', '"out_features":24')
                       .replace('"in_features":16', '"in_features":24'))
    fourth_id = run_done(server, "persist", wider, persist=True)
    fourth = losses(server, fourth_id)
    assert fourth[0] - fourth[-1] > 0.3 and fourth[0] > first[-1] + 0.5 * drop, (first, fourth)
    assert any("changed since the weights were kept" in e["data"].get("message", "")
               for e in server.events(fourth_id) if e["kind"] == "log")


@pytest.mark.e2e
def test_persist_off_starts_every_run_from_fresh_weights(server: ServerProc) -> None:
    g = load_example()
    first = losses(server, run_done(server, "fresh", g, persist=True))  # trains, and keeps its weights
    drop = first[0] - first[-1]
    second = losses(server, run_done(server, "fresh", g, persist=False))
    assert abs(second[0] - first[0]) < 0.25 * drop, (first, second)
    assert second[0] > first[-1] + 0.5 * drop
    third = losses(server, run_done(server, "fresh", g, persist=False))
    assert abs(third[0] - first[0]) < 0.25 * drop, (first, third)


@pytest.mark.e2e
def test_delete_and_sigkill_lose_only_the_process(server: ServerProc) -> None:
    g = load_example()
    first = run_done(server, "kill", g)
    pid = process_pid(server, first)
    assert tabs(server)["kill"]["pid"] == pid
    assert server.call("DELETE", "/api/canvas/kill") == {"tab": "kill", "ended": pid}
    wait_for(lambda: not pid_alive(pid), 30, what=f"canvas process {pid} to end")
    assert "kill" not in tabs(server)
    assert server.run(first)["status"] == "succeeded" and server.events(first)  # the stored run stays
    second = run_done(server, "kill", g)
    pid2 = process_pid(server, second)
    assert pid2 != pid
    assert set(node_statuses(server, second).values()) == {"done"}  # a new process: an empty cache
    # Killed from outside while idle: the next Run gets a new process.
    os.kill(pid2, signal.SIGKILL)
    wait_for(lambda: "kill" not in tabs(server), 30, what="the killed process to leave the list")
    third = run_done(server, "kill", g)
    assert process_pid(server, third) not in (pid, pid2)
    # Killed from outside during a Run: that run fails saying so, the next one works.
    going = canvas_run(server, "kill", long_training_graph())
    first_epoch(server, going)
    os.kill(process_pid(server, going), signal.SIGKILL)
    run = wait_run(server, going)
    assert run["status"] == "failed" and "canvas" in run["error"] and "cache" in run["error"], run
    assert any(e["kind"] == "run_warning" and e["data"]["kind"] == "canvas_process_lost"
               for e in server.events(going))
    run_done(server, "kill", g)
    assert server.call("GET", f"/api/runs/{first}")["status"] == "succeeded"


@pytest.mark.e2e
def test_stop_mid_training_keeps_the_process(server: ServerProc) -> None:
    g = load_example()
    going = canvas_run(server, "stop", long_training_graph())
    first_epoch(server, going)
    st, busy = server.api("POST", "/api/canvas/run", {"tab": "stop", "graph": g, "persist_weights": False,
                                                      "record_outputs": False})
    assert st == 409 and busy["error"]["code"] == "canvas_busy" and going in busy["error"]["message"]
    assert tabs(server)["stop"]["state"] == "running" and tabs(server)["stop"]["run_id"] == going
    assert server.call("POST", "/api/canvas/stop/stop") == {"run_id": going}
    run = wait_run(server, going)
    assert run["status"] == "cancelled", run
    after = run_done(server, "stop", g)
    assert process_pid(server, after) == process_pid(server, going)  # a stop the graph honours keeps it
    assert node_statuses(server, after)["csv"] == "cached"
    st, none = server.api("POST", "/api/canvas/stop/stop")
    assert st == 404 and none["error"]["code"] == "not_found"


@pytest.mark.e2e
def test_stop_ignored_kills_the_process(server: ServerProc) -> None:
    g = graph([node("start", "Start"), node("stuck", "TestCanvasIgnoreStop")], [trig("start", "stuck")])
    going = canvas_run(server, "stuck", g)
    wait_event(server, going, lambda e: e["kind"] == "log" and "ignoring stop" in e["data"]["message"],
               what="the node to start")
    pid = process_pid(server, going)
    # The run-process Stop route works on a canvas run too.
    server.call("POST", f"/api/runs/{going}/stop")
    run = wait_run(server, going)
    assert run["status"] == "interrupted" and f"did not stop within {STOP_GRACE_S} s" in run["error"], run
    assert "cache" in run["error"]
    assert any(e["kind"] == "run_warning" and e["data"]["kind"] == "canvas_process_lost"
               for e in server.events(going))
    wait_for(lambda: not pid_alive(pid), 30, what="the killed process to be gone")
    echo = graph([node("start", "Start"), node("echo", "TestCanvasEcho", value=2.0)], [trig("start", "echo")])
    assert process_pid(server, run_done(server, "stuck", echo)) != pid


@pytest.mark.e2e
def test_a_changed_file_is_read_again(server: ServerProc) -> None:
    files = server.data_dir / "files"
    files.mkdir(parents=True, exist_ok=True)
    csv = files / "canvas.csv"
    csv.write_text("a,b\n1,2\n3,4\n")
    g = graph([node("start", "Start"), node("csv", "CSVReader", path="canvas.csv", target_column="", skip_header=True),
               node("mean", "Mean", dim="0")],
              [trig("start", "csv"), edge("csv", "tensor", "mean", "tensor")])
    run_done(server, "file", g)
    same = run_done(server, "file", g)
    assert node_statuses(server, same) == {"start": "cached", "csv": "cached", "mean": "cached"}
    stat = csv.stat()
    csv.write_text("a,b\n5,6\n7,8\n")  # the same size, and the same mtime: only the content tells
    os.utime(csv, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    changed = run_done(server, "file", g)
    assert node_statuses(server, changed) == {"start": "cached", "csv": "done", "mean": "done"}
    assert node_event(server, changed, "mean")["outputs"]["tensor"]["value"] == [6.0, 7.0]
    csv.write_text("a,b\n5,6\n7,8\n9,10\n")
    grown = run_done(server, "file", g)
    assert node_event(server, grown, "csv")["outputs"]["tensor"]["shape"] == [3, 2]


@pytest.mark.e2e
def test_a_changed_node_file_runs_the_node_again(server: ServerProc) -> None:
    g = graph([node("start", "Start"), node("echo", "TestCanvasEcho", value=2.0)], [trig("start", "echo")])
    first = run_done(server, "code", g)
    assert node_event(server, first, "echo")["outputs"]["value"]["value"] == [2.0]
    assert node_statuses(server, run_done(server, "code", g))["echo"] == "cached"
    path = server.data_dir / "custom_nodes" / "canvas_nodes.py"
    path.write_text(CUSTOM_NODES.replace("VERSION = 1", "VERSION = 3"))
    try:
        changed = run_done(server, "code", g)
        assert node_event(server, changed, "echo") | {"seconds": 0} == {
            "node_id": "echo", "status": "done", "type": "TestCanvasEcho", "seconds": 0,
            "outputs": {"value": {"type": "tensor", "shape": [1], "dtype": "torch.float32", "value": [6.0]}}}
    finally:
        path.write_text(CUSTOM_NODES)


@pytest.mark.e2e
def test_a_canvas_run_never_waits_behind_the_queue(server: ServerProc) -> None:
    """With one local slot taken and a run queued behind it, a canvas Run starts at once."""
    busy = server.submit(long_training_graph())
    first_epoch(server, busy["id"])
    queued = server.submit(long_training_graph())
    try:
        echo = graph([node("start", "Start"), node("echo", "TestCanvasEcho", value=5.0)], [trig("start", "echo")])
        run_done(server, "queue", echo)
        assert server.run(queued["id"])["status"] == "queued"
    finally:
        for r in (queued, busy):
            server.call("POST", f"/api/runs/{r['id']}/stop")
        for r in (queued, busy):
            wait_run(server, r["id"])


@pytest.mark.e2e
def test_a_canvas_run_holds_its_local_slot(server: ServerProc) -> None:
    """While a canvas Run runs, a local run queued for the same (only) slot waits for it, as for any local run."""
    going = canvas_run(server, "slot", long_training_graph())
    first_epoch(server, going)
    local = server.submit(graph([node("start", "Start"), node("echo", "TestCanvasEcho")], [trig("start", "echo")]))
    try:
        busy = "waiting: 1 runs are running, the limit is 1 (CODEFYUI_RUN_QUEUE_MAX_CONCURRENT)"
        waiting = wait_for(lambda: (lambda r: r if r["queue_reason"] == busy else None)(server.run(local["id"])),
                           60, what="the local run to wait for the slot",
                           detail=lambda: server.run(local["id"]))
        assert waiting["status"] == "queued"
    finally:
        server.call("POST", "/api/canvas/slot/stop")
    assert wait_run(server, going)["status"] == "cancelled"
    assert wait_run(server, local["id"])["status"] == "succeeded"


@pytest.mark.e2e
def test_clear_errors(server: ServerProc) -> None:
    g = load_example()
    for bad in ("", "a b", "x" * 65, "../etc", 5):
        st, body = server.api("POST", "/api/canvas/run", {"tab": bad, "graph": g, "persist_weights": False,
                                                          "record_outputs": False})
        assert st == 400 and body["error"]["code"] == "bad_tab", (bad, body)
        assert repr(bad) in body["error"]["message"]
    broken = with_param(g, "train", epochs=0)
    st, canvas = server.api("POST", "/api/canvas/run", {"tab": "err", "graph": broken, "persist_weights": False,
                                                        "record_outputs": False})
    st2, runs = server.api("POST", "/api/runs", {"graph": broken, "options": {"target": "local"}})
    assert st == st2 == 400 and canvas == runs and canvas["error"]["code"] == "invalid_graph"
    st, body = server.api("POST", "/api/canvas/run", {"tab": "err", "graph": g, "persist_weights": "yes",
                                                      "record_outputs": False})
    assert st == 400 and "persist_weights='yes'" in body["error"]["message"]
    st, body = server.api("POST", "/api/canvas/run", {"tab": "err", "graph": g, "persist": True})
    assert st == 400 and "persist" in body["error"]["message"]
    st, body = server.api("DELETE", "/api/canvas/nosuchtab")
    assert st == 404 and "nosuchtab" in body["error"]["message"]
    assert server.call("POST", "/api/canvas/nosuchtab/reset-weights") == {"tab": "nosuchtab", "reset": 0}
    st, body = server.api("POST", "/api/canvas/bad%20tab/stop")
    assert st == 400 and body["error"]["code"] == "bad_tab"
    st, _ = server.api("GET", "/api/canvas", token=False)
    assert st == 401


@pytest.mark.e2e
def test_recorded_outputs_of_cached_nodes_are_served(server: ServerProc) -> None:
    """record_outputs stores a canvas Run's outputs where a local run's go, the cached nodes' included."""
    g = graph([node("start", "Start"), node("echo", "TestCanvasEcho", value=4.0),
               node("mean", "Mean", dim="0")],
              [trig("start", "echo"), edge("echo", "value", "mean", "tensor")])
    run_id = canvas_run(server, "rec", g, record=True)
    assert wait_run(server, run_id)["status"] == "succeeded"
    again = canvas_run(server, "rec", g, record=True)
    assert wait_run(server, again)["status"] == "succeeded"
    assert node_statuses(server, again) == {"start": "cached", "echo": "cached", "mean": "cached"}
    listed = server.call("GET", f"/api/runs/{again}/outputs")
    assert listed["record_outputs"] is True and {n["node_id"] for n in listed["nodes"]} >= {"echo", "mean"}
    mean = server.call("GET", f"/api/runs/{again}/outputs/mean")
    assert mean["outputs"][0]["port"] == "tensor" and mean["outputs"][0]["mean"] == 4.0


ECHO = graph([node("start", "Start"), node("echo", "TestCanvasEcho", value=1.0)], [trig("start", "echo")])


def limited_server(tmp: Path, name: str, env: dict[str, str]) -> ServerProc:
    s = ServerProc(tmp, name=name, extra_env=env)
    (s.data_dir / "custom_nodes").mkdir(parents=True)
    (s.data_dir / "custom_nodes" / "canvas_nodes.py").write_text(CUSTOM_NODES)
    return s.start()


@pytest.mark.e2e
def test_the_least_recently_used_process_ends_first(tmp_path: Path) -> None:
    s = limited_server(tmp_path, "canvas-lru", {"CODEFYUI_CANVAS_MAX_PROCESSES": "2"})
    try:
        pids = {tab: process_pid(s, run_done(s, tab, ECHO)) for tab in ("a", "b")}
        run_done(s, "a", ECHO)  # a is now the most recently used
        pids["c"] = process_pid(s, run_done(s, "c", ECHO))
        assert set(tabs(s)) == {"a", "c"}
        wait_for(lambda: not pid_alive(pids["b"]), 30, what="b's process to end")
        assert tabs(s)["a"]["pid"] == pids["a"] and pid_alive(pids["a"])
        again = run_done(s, "b", ECHO)  # b gets a new process, and a (least recently used now) ends
        assert process_pid(s, again) != pids["b"] and set(tabs(s)) == {"b", "c"}
    finally:
        s.stop()


@pytest.mark.e2e
def test_an_idle_process_ends_and_one_over_its_memory_bound_too(tmp_path: Path) -> None:
    idle = limited_server(tmp_path / "idle", "canvas-idle", {"CODEFYUI_CANVAS_IDLE_TIMEOUT_S": "2"})
    try:
        first = run_done(idle, "t", ECHO)
        wait_for(lambda: "t" not in tabs(idle), 60, what="the idle process to leave the list")
        wait_for(lambda: not pid_alive(process_pid(idle, first)), 30, what="the idle process to end")
        assert process_pid(idle, run_done(idle, "t", ECHO)) != process_pid(idle, first)
    finally:
        idle.stop()
    big = limited_server(tmp_path / "rss", "canvas-rss", {"CODEFYUI_CANVAS_MAX_RSS_MB": "1"})
    try:
        first = run_done(big, "t", ECHO)
        wait_for(lambda: "t" not in tabs(big), 60, what="the process over its memory bound to end")
        second = run_done(big, "t", ECHO)
        assert process_pid(big, second) != process_pid(big, first)
        assert big.run(first)["status"] == "succeeded"
    finally:
        big.stop()


# -- the cache itself, on real tensors and real node classes ---------------------------------------------
def _plan(g: dict[str, Any], registry: Registry) -> Any:
    parsed, errors = parse(g, {})
    plan = build_plan(parsed, registry, None, errors)
    assert not errors, errors
    return plan


def _keys(rc: RunCache, plan: Any) -> dict[str, tuple[str, bool]]:
    keys: dict[str, tuple[str, bool]] = {}
    for pn in plan.order:
        keys[pn.id] = rc.key(pn, {port: (*keys[src], sp) for port, (src, sp) in pn.inputs.items()})
    return keys


def test_keys_follow_params_inputs_files_and_cacheability(tmp_path: Path) -> None:
    registry = build_registry()
    layout = Layout.for_data_dir(tmp_path / "data", user_data=tmp_path / "user")
    (tmp_path / "data" / "files").mkdir(parents=True)
    (tmp_path / "data" / "files" / "t.csv").write_text("a,b\n1,2\n")
    g = load_example()
    rc = RunCache(ExecutionCache(1 << 20), KeptWeights(), False, layout, "cpu", lambda k, d: None)
    base = _keys(rc, _plan(g, registry))
    assert {n for n, (_k, c) in base.items() if c} == UPSTREAM_OF_TRAINING
    again = _keys(rc, _plan(copy.deepcopy(g), registry))
    assert again == base
    lr = _keys(rc, _plan(with_param(g, "train", lr=0.5), registry))
    assert {n for n in base if lr[n] != base[n]} == {"train", "save", "print-metrics"}
    norm = _keys(rc, _plan(with_param(g, "norm", mode="minmax"), registry))
    assert {n for n in base if norm[n] != base[n]} == {
        "norm", "split", "train-set", "val-set", "train-loader", "val-loader", "train", "save", "print-metrics"}
    other_device = RunCache(ExecutionCache(1 << 20), KeptWeights(), False, layout, "cuda:0", lambda k, d: None)
    assert _keys(other_device, _plan(g, registry))["csv"] != base["csv"]
    # An uploaded file's content is in the key.
    csvg = graph([node("start", "Start"), node("csv", "CSVReader", path="t.csv", target_column="")],
                 [trig("start", "csv")])
    k1 = _keys(rc, _plan(csvg, registry))["csv"]
    (tmp_path / "data" / "files" / "t.csv").write_text("a,b\n1,3\n")
    k2 = _keys(rc, _plan(csvg, registry))["csv"]
    assert k1 != k2 and k1[1] and k2[1]


def test_cache_bounds_tensor_bytes_and_never_hands_out_a_changed_tensor() -> None:
    cache = ExecutionCache(max_bytes=3 * 400)
    for i in range(4):
        cache.put(f"k{i}", {"t": torch.zeros(100)})  # 400 bytes each
    assert list(cache.entries) == ["k1", "k2", "k3"] and cache.nbytes == 1200
    assert cache.get("k0") is None
    assert cache.get("k1") is not None  # now the most recently used
    cache.put("k4", {"t": torch.zeros(100)})
    assert list(cache.entries) == ["k3", "k1", "k4"]
    cache.put("big", {"t": torch.zeros(1000)})  # larger than the bound: not kept, nothing dropped for it
    assert "big" not in cache.entries and len(cache.entries) == 3
    hit = cache.get("k4")
    assert hit is not None
    hit["t"].add_(1)  # a later node changed it in place
    assert cache.get("k4") is None and "k4" not in cache.entries
    cache.put("model", {"m": torch.nn.Linear(2, 2)})  # a module with weights is a live object: never cached
    assert "model" not in cache.entries
    assert ExecutionCache(0).entries == {} and (ExecutionCache(0).put("a", {"t": torch.zeros(1)}) is None)


def test_kept_weights_load_only_with_persist_on_and_the_same_key(tmp_path: Path) -> None:
    registry = build_registry()
    layout = Layout.for_data_dir(tmp_path / "data", user_data=tmp_path / "user")
    pn = next(p for p in _plan(load_example(), registry).order if p.id == "model")
    weights, cache = KeptWeights(), ExecutionCache(1 << 20)
    logs: list[str] = []

    def run(persist: bool, key: str) -> torch.nn.Linear:
        rc = RunCache(cache, weights, persist, layout, "cpu", lambda k, d: logs.append(d["message"]))
        model = torch.nn.Linear(3, 2)  # what the building node makes on each run: new weights
        rc.ran(pn, key, False, {"model": model})
        with torch.no_grad():
            model.weight.fill_(7.0)  # "training"
        rc.keep_weights()
        return model

    run(True, "k1")
    assert len(weights.kept) == 1
    fresh = torch.nn.Linear(3, 2).weight.detach().clone()
    off = RunCache(cache, weights, False, layout, "cpu", lambda k, d: None)
    model = torch.nn.Linear(3, 2)
    model.weight.data.copy_(fresh)
    off.ran(pn, "k1", False, {"model": model})
    assert torch.equal(model.weight, fresh)  # persist off: nothing loaded
    on = RunCache(cache, weights, True, layout, "cpu", lambda k, d: logs.append(d["message"]))
    model = torch.nn.Linear(3, 2)
    on.ran(pn, "k1", False, {"model": model})
    assert torch.equal(model.weight, torch.full((2, 3), 7.0))  # persist on, same key: continues
    assert any("continuing from the weights" in m for m in logs)
    changed = RunCache(cache, weights, True, layout, "cpu", lambda k, d: logs.append(d["message"]))
    model = torch.nn.Linear(3, 2)
    model.weight.data.copy_(fresh)
    changed.ran(pn, "k2", False, {"model": model})
    assert torch.equal(model.weight, fresh) and weights.kept == {}  # its key changed: new weights, kept dropped
    run(True, "k1")
    assert weights.clear() == 1 and weights.kept == {}
