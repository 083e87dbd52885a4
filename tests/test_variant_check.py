"""A sweep checks its variants through the node checks of the params they change (cdui/graph/variants.py), and
that must find exactly what checking each variant's whole graph finds (cdui/graph/validate.py): the real
registry, the iris example, good and bad values of several params (types, bounds, options), a node that does
not run, and the params that must leave the shortcut (a file path, a node without a data object)."""
from __future__ import annotations

import copy
import itertools
import json
from typing import Any

from cdui.core.layout import INSTALL_ROOT
from cdui.graph.params import declared_of, set_param
from cdui.graph.validate import validate_graph
from cdui.graph.variants import VariantChecker
from cdui.nodes.registry import build_registry
from procs import load_example

REGISTRY = build_registry(None, INSTALL_ROOT / "plugins")


def graph_with_a_draft() -> dict[str, Any]:
    g = load_example()
    draft = copy.deepcopy(next(n for n in g["nodes"] if n["id"] == "optimizer"))
    draft["id"] = "draft-opt"  # connected to nothing: it does not run, and nothing checks its params
    g["nodes"].append(draft)
    return g


def full(graph: dict[str, Any], params: dict[str, Any]) -> list[str]:
    g = copy.deepcopy(graph)
    for k, v in params.items():
        set_param(g, k, v, declared_of(REGISTRY, graph))
    return sorted(json.dumps(e, sort_keys=True) for e in validate_graph(g, REGISTRY, {})[1])


def test_the_node_checks_of_a_variant_find_what_its_whole_graph_check_finds() -> None:
    graph = graph_with_a_draft()
    axes = {"optimizer.lr": [0.01, -1, "fast"], "train.epochs": [1, 0], "split.test_size": [0.2, 1.5],
            "optimizer.type": ["Adam", "Nope"], "draft-opt.lr": [-5]}
    variants = [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]
    variants.append({"train.epochs": 3})  # an explicit variant may set fewer params than the others
    checker = VariantChecker(graph, axes, REGISTRY, {}, 20000, None)
    assert checker.fast
    first = variants[0]
    first_errors = [json.loads(e) for e in full(graph, first)]
    common = list(first_errors)
    for e in checker.node_errors(first):
        common.remove(e)  # each of the first variant's node errors is one its whole check found
    bad = 0
    for params in variants:
        got = sorted(json.dumps(e, sort_keys=True) for e in common + checker.node_errors(params))
        want = full(graph, params)
        assert got == want, params
        bad += bool(want)
    assert 0 < bad < len(variants)  # both kinds were compared


def test_params_the_node_checks_do_not_cover_leave_the_shortcut() -> None:
    graph = load_example()
    assert not VariantChecker(graph, ["csv.path"], REGISTRY, {}, 20000, None).fast  # a file: the file plan reads it
    assert not VariantChecker(graph, ["save.path"], REGISTRY, {}, 20000, None).fast  # a file it writes
    bare = copy.deepcopy(graph)
    opt = next(n for n in bare["nodes"] if n["id"] == "optimizer")
    opt["params"] = opt.pop("data")["params"]  # set_param writes a bare params object, which the graph's parse skips
    assert not VariantChecker(bare, ["optimizer.lr"], REGISTRY, {}, 20000, None).fast
    assert VariantChecker(graph, ["optimizer.lr", "train.epochs"], REGISTRY, {}, 20000, None).fast
