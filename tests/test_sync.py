"""Workers in sync, end to end: real control plane, real agents with their real
catalog helper, real run subprocesses.

A worker lacks a type through ``CODEFYUI_NODES_HIDE`` (the documented way to
try a degraded worker), has an extra one through a plugin pack in its own
installation root (on "another machine", so its runs use that installation
too), and has a failing helper through a plugin that exits when
the catalog helper loads it (runs load it fine).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from procs import edge, graph, load_example, node, trig, wait_for, wait_run
from test_workers import Agent, make_server, token, wait_online, worker

pytestmark = pytest.mark.e2e

EXTRA_PLUGIN = '''
from cdui.nodes.base import Node, Port


class Extra(Node):
    NODE_NAME = "Extra"
    CATEGORY = "test"

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        return {"value": 1.0}
'''

# Exits only in the catalog helper (python -m cdui.run.catalog), so runs still load it.
BREAKS_HELPER = '''
import os
import sys

if sys.argv and sys.argv[0].endswith("catalog.py"):
    sys.stderr.write("this plugin refuses to be catalogued\\n")
    os._exit(3)
'''


def flatten_graph() -> dict[str, Any]:
    return graph([node("start", "Start"), node("tc", "TensorCreate", shape="2,3,4"), node("flat", "Flatten"),
                  node("print", "Print", label="flat")],
                 [trig("start", "tc"), edge("tc", "tensor", "flat", "tensor"),
                  edge("flat", "tensor", "print", "value")],
                 name="uses Flatten")


def ticker_graph(ticks: int = 2) -> dict[str, Any]:
    return graph([node("start", "Start"), node("tick", "Ticker", ticks=ticks, interval=0.01)],
                 [trig("start", "tick")], name="ticker")


def plugin_root(tmp: Path, name: str, pid: str, code: str, version: str = "1.0") -> Path:
    """An installation root for an agent whose plugins/ holds one pack."""
    root = tmp / f"{name}-root"
    (root / "plugins" / pid).mkdir(parents=True)
    (root / "plugins" / pid / "cdui.plugin.toml").write_text(
        f'[plugin]\nid = "{pid}"\nname = "{pid}"\nversion = "{version}"\nmodules = ["nodes.py"]\n')
    (root / "plugins" / pid / "nodes.py").write_text(code)
    return root


@pytest.fixture
def cp(tmp_path):
    s = make_server(tmp_path)
    yield s
    s.stop()


def test_worker_lacking_a_builtin_type(cp, tmp_path):
    """Acceptance: degraded listing the type; a graph using it, targeted at the worker, is
    refused naming it; with `any` it runs elsewhere; a queued one is checked again."""
    hide = {"CODEFYUI_NODES_HIDE": "Flatten"}
    a = Agent(tmp_path, cp.url, token=token(cp), env_extra=hide)
    a.spawn()
    try:
        card = wait_online(cp, agent=a)
        assert card["degraded"] is True
        assert card["catalog"] == {"state": "degraded", "degraded": True, "lacking": ["Flatten"], "extra": [],
                                   "warning": None}
        status, body = cp.api("POST", "/api/runs", {"graph": flatten_graph(), "options": {"target": {"worker": "w1"}}})
        assert status == 400, body
        err = body["error"]
        assert err["code"] == "missing_node_types" and err["details"] == {"missing": ["Flatten"]}
        assert "worker w1 lacks node type(s) the graph uses: Flatten" in err["message"]
        elsewhere = wait_run(cp, cp.submit(flatten_graph(), {"target": "any"})["id"])
        assert (elsewhere["status"], elsewhere["worker_id"]) == ("succeeded", "local"), elsewhere

        # A graph it can run goes to it, and records the fingerprint of what ran.
        mine = wait_run(cp, cp.submit(ticker_graph(), {"target": {"worker": "w1"}})["id"])
        assert (mine["status"], mine["worker_id"]) == ("succeeded", "w1"), mine
        facts = mine["execution_facts"]
        assert facts["fingerprint_source"] == "worker-run"
        assert facts["fingerprint"] == card["fingerprint"], "nothing changed: the run's summary is the agent's"
        assert facts["resolved"]["numerics"]["deterministic_algorithms"] is False

        # Queued while it is offline (nothing to check then), checked when it is sent.
        a.stop()
        wait_for(lambda: not (worker(cp, "w1") or {}).get("online"), 60, 0.2, "w1 offline")
        queued = cp.submit(flatten_graph(), {"target": {"worker": "w1"}})
        a2 = Agent(tmp_path, cp.url, user_data=a.user_data, env_extra=hide)
        a2.spawn()
        try:
            done = wait_run(cp, queued["id"])
            assert done["status"] == "failed", done
            assert "worker w1 lacks node type(s) the graph uses: Flatten" in done["error"]
        finally:
            a2.stop()
    finally:
        a.stop()


def test_extra_plugin_and_failed_helper(cp, tmp_path):
    """An extra plugin node: degraded, still gets `any`, and a run records the plugin it really
    loaded. A failed helper: no catalog, a warning, `any` skips it, named runs go unchecked."""
    extra_root = plugin_root(tmp_path, "x1", "extra", EXTRA_PLUGIN)
    x1 = Agent(tmp_path, cp.url, "x1", token=token(cp),
               env_extra={"CODEFYUI_INSTALL_ROOT": str(extra_root), "CODEFYUI_MACHINE_ID": "x1-box"})
    b1 = Agent(tmp_path, cp.url, "b1", token=token(cp),
               env_extra={"CODEFYUI_INSTALL_ROOT": str(plugin_root(tmp_path, "b1", "breaker", BREAKS_HELPER)),
                          "CODEFYUI_MACHINE_ID": "b1-box"})
    x1.spawn()
    b1.spawn()
    try:
        xc = wait_online(cp, "x1", x1)
        bc = wait_online(cp, "b1", b1)
        assert xc["degraded"] is True
        assert (xc["catalog"]["lacking"], xc["catalog"]["extra"]) == ([], ["extra:Extra"])
        assert "extra 1.0" in xc["fingerprint"]
        assert bc["catalog"]["state"] == "not_reported" and bc["degraded"] is False
        assert "node catalog helper exited with code 3" in bc["catalog"]["warning"]
        assert bc["fingerprint"] == "not reported"
        log = b1.log_text()
        assert "no node catalog is reported to the control plane: the node catalog helper exited with code 3" in log
        assert "this plugin refuses to be catalogued" in log

        # The plugin is updated after the agent started: the run records what it loaded.
        manifest = extra_root / "plugins" / "extra" / "cdui.plugin.toml"
        manifest.write_text(manifest.read_text().replace('version = "1.0"', 'version = "2.0"'))
        anyrun = wait_run(cp, cp.submit(ticker_graph(), {"target": "any"})["id"])
        assert (anyrun["status"], anyrun["worker_id"]) == ("succeeded", "x1"), anyrun  # b1 sorts first: skipped
        facts = anyrun["execution_facts"]
        assert facts["fingerprint_source"] == "worker-run"
        assert "extra 2.0" in facts["fingerprint"] and "extra 1.0" in xc["fingerprint"]
        assert facts["fingerprint"] == xc["fingerprint"].replace("extra 1.0", "extra 2.0")

        named = wait_run(cp, cp.submit(flatten_graph(), {"target": {"worker": "b1"}})["id"])
        assert (named["status"], named["worker_id"]) == ("succeeded", "b1"), named
    finally:
        x1.stop()
        b1.stop()


SEED_NODE = '''
import torch
from cdui.nodes.base import Node


class Seed(Node):
    NODE_NAME = "Seed"
    CATEGORY = "test"

    def execute(self, inputs, params, ctx):
        torch.manual_seed(0)
        return {}
'''


def seeded_iris(**loop: Any) -> dict[str, Any]:
    """The iris example with the model's weights seeded, unshuffled batches and no saved file."""
    g = load_example()
    g["nodes"] = [n for n in g["nodes"] if n["id"] != "save"] + [node("seed", "Seed")]
    g["edges"] = [e for e in g["edges"] if "save" not in (e["source"], e["target"])]
    g["edges"] += [trig("start", "seed"), trig("seed", "model")]  # seeded before the model is built
    for n in g["nodes"]:
        if n["id"] == "train-loader":
            n["data"]["params"]["shuffle"] = False
        if n["id"] == "train":
            n["data"]["params"].update({"epochs": 2, **loop})
    return g


def first_epoch_loss(cp, run_id: str) -> float:
    return next(e["data"]["value"] for e in cp.events(run_id)
                if e["kind"] == "metric" and e["data"]["name"] == "train_loss" and e["data"]["step"] == 1)


def test_ddp_on_a_two_slot_cpu_set_matches_one_process(tmp_path):
    """strategy ddp on worker w1, given a set of its two CPU slots, trains with two gloo
    processes (the set's size: ddp_processes is left unset) and matches the first epoch's
    loss of the same training in one process; the set is recorded and released.

    The agent also names three CUDA cards under an inherited CUDA_VISIBLE_DEVICES=4,6,7
    (this machine has none): a ticker run given a set of two of them, which never touches
    a card, shows that its subprocess saw exactly the set's two entries."""
    cp = make_server(tmp_path, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="w1/cpu=2")
    (cp.data_dir / "custom_nodes" / "seed.py").write_text(SEED_NODE)
    a = Agent(tmp_path, cp.url, token=token(cp), extra=["--devices", "cuda:0,cuda:1,cuda:2,cpu"],
              env_extra={"CUDA_VISIBLE_DEVICES": "4,6,7"})
    (a.data_dir / "custom_nodes" / "seed.py").write_text(SEED_NODE)
    cp.restart()  # the control plane loads custom nodes at start
    a.spawn()
    try:
        wait_online(cp, agent=a)
        cpu_set = {"target": {"worker": "w1"}, "device": "cpu", "devices": 2}
        ddp = wait_run(cp, cp.submit(seeded_iris(strategy="ddp"), cpu_set)["id"])
        assert (ddp["status"], ddp["worker_id"], ddp["device"]) == ("succeeded", "w1", "cpu,cpu"), ddp
        assert ddp["execution_facts"]["devices"] == {"set": ["cpu", "cpu"], "process": ["cpu", "cpu"],
                                                     "cuda_visible_devices": "4,6,7"}
        one = wait_run(cp, cp.submit(seeded_iris(), {"target": "local"})["id"])
        assert one["status"] == "succeeded", one
        assert first_epoch_loss(cp, ddp["id"]) == pytest.approx(first_epoch_loss(cp, one["id"]), rel=1e-3)
        logs = [e["data"]["message"] for e in cp.events(ddp["id"]) if e["kind"] == "log"]
        assert "strategy ddp: 2 process(es) on cpu, cpu" in logs

        cards = wait_run(cp, cp.submit(ticker_graph(), {"target": {"worker": "w1"}, "device": "cuda",
                                                        "devices": 2})["id"])
        assert (cards["status"], cards["device"]) == ("succeeded", "cuda:0,cuda:1"), cards
        assert cards["execution_facts"]["devices"] == {"set": ["cuda:0", "cuda:1"], "process": ["cuda:0", "cuda:1"],
                                                       "cuda_visible_devices": "4,6"}
        # Released at the end: every slot of both sets is free again.
        wait_for(lambda: [d["in_use"] for d in (worker(cp, "w1") or {}).get("devices", [])] == [0, 0, 0, 0],
                 60, 0.2, "w1's slots released")
    finally:
        a.stop()
        cp.stop()
