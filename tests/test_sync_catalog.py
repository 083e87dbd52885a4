"""The pure parts of keeping workers in sync: catalog comparison, the types a graph
uses, what `any` skips, the hello's bounds and the facts a run reports."""
from __future__ import annotations

import json
from typing import Any

import pytest

from cdui.nodes.registry import build_registry, hidden_types
from cdui.plane.sched import catalog_check as check
from cdui.plane.sched.catalog_check import CatalogState
from cdui.run import catalog
from cdui.wire import protocol

# The built-in registry says which params run a preset (Map's subgraph; not Conv2dKernel's preset).
PRESET_PARAMS = build_registry().preset_params
OWN = {"types": ["A", "B", "Map"], "hash": "sha256:own"}


def n(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
    return {"id": nid, "type": ntype, "data": {"params": params}}


@pytest.mark.parametrize("worker, expected", [
    (OWN, CatalogState(True, False, (), (), frozenset(OWN["types"]))),
    ({"types": ["A", "Map"], "hash": "sha256:x"},
     CatalogState(True, True, ("B",), (), frozenset({"A", "Map"}), differs=True)),
    ({"types": ["A", "B", "Map", "p:X"], "hash": "sha256:y"},
     CatalogState(True, True, (), ("p:X",), frozenset({"A", "B", "Map", "p:X"}), differs=True)),
    # Same types, other definitions (a changed param): not degraded, since it could not say why; a warning.
    ({"types": ["A", "B", "Map"], "hash": "sha256:z"},
     CatalogState(True, False, (), (), frozenset(OWN["types"]), differs=True)),
    (None, CatalogState(False, error="boom")),
])
def test_compare(worker: Any, expected: CatalogState) -> None:
    assert check.compare(OWN, worker, "boom" if worker is None else None) == expected


def test_a_degraded_worker_always_says_why() -> None:
    """Degraded comes with the types lacking or extra, in the API and in `cdui workers list`; the same types
    defined otherwise is a warning only."""
    from cdui.cli.cli_workers import catalog_lines
    for worker in ({"types": ["A"], "hash": "h"}, {"types": ["A", "B", "Map", "p:X"], "hash": "h"},
                   {"types": ["A", "B", "Map"], "hash": "h"}, OWN):
        api = check.compare(OWN, worker).to_api()
        assert api["degraded"] == bool(api["lacking"] or api["extra"]), api
    api = check.compare(OWN, {"types": ["A"], "hash": "h"}).to_api()
    assert catalog_lines({"degraded": True, "catalog": api}) == [
        "  degraded: node catalog differs: lacks B, Map (`any` skips it; runs using those types are refused)"]
    api = check.compare(OWN, {"types": ["A", "B", "Map", "p:X"], "hash": "h"}).to_api()
    assert catalog_lines({"degraded": True, "catalog": api}) == ["  degraded: node catalog differs: has extra p:X"]
    api = check.compare(OWN, {"types": ["A", "B", "Map"], "hash": "h"}).to_api()
    assert (api["state"], api["degraded"]) == ("ok", False)
    assert catalog_lines({"degraded": False, "catalog": api}) == [
        "  catalog: the worker has the same node types, but some are defined otherwise (its node catalog's hash "
        "differs): a plugin or custom node of another version?"]
    assert catalog_lines({"degraded": False, "catalog": check.compare(OWN, OWN).to_api()}) == []


class _Described:
    """A loaded registry as node_catalog reads it: only its descriptions."""

    def __init__(self, described: list[dict[str, Any]]) -> None:
        self.described = described

    def catalog(self) -> list[dict[str, Any]]:
        return self.described


def test_the_catalog_hash_ignores_which_extras_this_machine_has() -> None:
    """The case seen: `bin/cdui test` installed every extra into the control plane's environment, so its nodes
    that need one said "available": true where the worker's said false with an install hint; the hash, and so
    the worker's state, must not change with that, only with the nodes' definitions."""
    base = {"type": "Img", "params": [{"name": "size", "type": "int", "default": 8}], "extra": "vision",
            "needs": ["PIL"]}
    here = catalog.node_catalog(_Described([{**base, "available": True}]))
    there = catalog.node_catalog(_Described([{**base, "available": False, "install": "pip install cdui[vision]"}]))
    assert here == there
    changed = {**base, "params": [{"name": "size", "type": "int", "default": 9}], "available": True}
    assert catalog.node_catalog(_Described([changed]))["hash"] != here["hash"]


@pytest.mark.parametrize("state, expected", [
    (None, None),  # the control plane itself
    (check.compare(OWN, OWN), None),
    (check.compare(OWN, {"types": ["A", "B", "Map", "p:X"], "hash": "h"}), None),  # extra only: still `any`
    (check.compare(OWN, {"types": ["A"], "hash": "h"}), "worker w1 is degraded: it lacks B, Map"),
    (check.compare(OWN, None), "worker w1 reported no node catalog (`any` skips it)"),
])
def test_any_refusal(state: CatalogState | None, expected: str | None) -> None:
    assert check.any_refusal("w1", state) == expected


def test_graph_types_expand_presets_subgraphs_and_the_presets_map_runs() -> None:
    library = {"lib1": {"nodes": [n("x", "FromLib"), n("y", "preset:lib2")]},
               "lib2": {"nodes": [n("z", "Deep")]},
               "mapped": {"nodes": [n("m", "MappedOnly")]},
               "unused": {"nodes": [n("u", "NeverUsed")]}}
    g = {"nodes": [n("s", "Start"), n("p", "preset:lib1"), n("own", "preset:embedded"),
                   n("map", "Map", subgraph="mapped"), n("k", "Conv2dKernel", preset="unused")],
         "presets": [{"preset_name": "embedded", "nodes": [n("e", "Embedded")]}]}
    assert check.graph_types(g, library, PRESET_PARAMS) == {"Start", "Map", "FromLib", "Deep", "MappedOnly",
                                                              "Embedded", "Conv2dKernel"}


def test_missing_types_only_for_a_degraded_worker_with_a_catalog() -> None:
    g = {"nodes": [n("a", "A"), n("b", "B")]}
    assert check.missing_types(check.compare(OWN, {"types": ["A"], "hash": "h"}), g, {}, PRESET_PARAMS) == ["B"]
    assert check.missing_types(check.compare(OWN, OWN), g, {}, PRESET_PARAMS) == []
    assert check.missing_types(check.compare(OWN, None), g, {}, PRESET_PARAMS) == []  # no catalog: unchecked


def test_summary_is_equal_for_equal_fingerprints_and_says_not_reported() -> None:
    fp = {"cdui": "0.1.0", "commit": "abc", "python": "3.11.7", "torch": "2.13.0+cpu", "accelerator": "cpu (x86_64)",
          "plugins": {"pk": "1.0 (code 1234)"}, "custom_nodes": {"t.py": "ffff"}, "env": {"OMP_NUM_THREADS": "2"}}
    assert catalog.summary(fp) == catalog.summary(json.loads(json.dumps(fp)))
    assert catalog.summary(fp) == ("cdui 0.1.0 (abc); Python 3.11.7; torch 2.13.0+cpu; cpu (x86_64); "
                                   "plugins: pk 1.0 (code 1234); custom nodes: t.py ffff; env: OMP_NUM_THREADS=2")
    assert catalog.summary(None) == "not reported"


def test_hidden_types_setting() -> None:
    assert hidden_types({"CODEFYUI_NODES_HIDE": " Flatten, Linear ,,"}) == {"Flatten", "Linear"}
    assert hidden_types({}) == set()


def test_run_report_is_bounded_and_marks_the_source() -> None:
    facts = catalog.with_run_report({"fingerprint": "agent", "late": 1}, {
        "fingerprint": "x" * 10000, "resolved": {"numerics": {f"k{i}": {"nested": i} for i in range(100)}}},
        "worker:w1")
    assert facts["fingerprint_source"] == "worker-run" and len(facts["fingerprint"]) == catalog.MAX_FACT_TEXT
    assert len(facts["resolved"]["numerics"]) == catalog.MAX_NUMERICS
    assert facts["resolved"]["numerics"]["k0"] == "{'nested': 0}" and facts["late"] == 1


def _hello(**extra: Any) -> str:
    d = protocol.hello("1.0", "w1", ["cpu"], {}, "m", [])
    d.update(extra)
    return json.dumps(d)


def test_hello_carries_catalog_and_fingerprint() -> None:
    fp = {"cdui": "1.0", "plugins": {"p": "1"}, "env": {}}
    h = protocol.parse_agent_message(_hello(catalog={"types": ["A"], "hash": "sha256:h"}, fingerprint=fp))
    assert isinstance(h, protocol.Hello)
    assert (h.catalog, h.fingerprint, h.catalog_error) == ({"types": ["A"], "hash": "sha256:h"}, fp, None)
    old = protocol.parse_agent_message(_hello())  # an agent that reports neither
    assert isinstance(old, protocol.Hello) and old.catalog is None and old.fingerprint is None


@pytest.mark.parametrize("extra, message", [
    ({"catalog": {"types": ["t"] * (protocol.MAX_TYPES + 1), "hash": "h"}}, "over the limit of 4096"),
    ({"catalog": {"types": ["x" * 200], "hash": "h"}}, "over the limit of 128"),
    ({"catalog": {"types": []}}, "missing field 'hash'"),
    ({"catalog": ["A"]}, "hello.catalog must be an object"),
    ({"fingerprint": {"a": {"b": {"c": {"d": {}}}}}}, "nests deeper than 4"),
    ({"fingerprint": {"a": ["list"]}}, "field 'a' has type list"),
    ({"fingerprint": {"a": "x" * (protocol.MAX_FINGERPRINT + 1)}}, "over the limit of 32768"),
    ({"catalog_error": 5}, "field 'catalog_error' has type int"),
])
def test_hello_bounds(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=message.replace("(", r"\(")):
        protocol.parse_agent_message(_hello(**extra))
