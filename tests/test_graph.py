"""Pure graph functions as tables: validation (every error at once), pruning
of drafts, preset expansion, secrets split/fill/redact, and the one safe-join
function every outside path goes through."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cdui.core.errors import CduiError, PathRefused
from cdui.core.layout import Layout
from cdui.core.paths import check_name, safe_join
from cdui.graph.model import MAX_PRESET_DEPTH, parse
from cdui.graph.secrets import fill_secrets, redact_text, split_secrets
from cdui.graph.validate import is_compatible, validate_graph
from cdui.nodes.base import ANY, IMAGE, MODEL, STRING, TENSOR, TRIGGER, Node, Param, Port
from cdui.nodes.builtin.control import StartNode
from cdui.nodes.registry import Registry


# -- a registry with small nodes whose ports and params the tables rely on ----
class TSource(Node):
    NODE_NAME = "T_Source"

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("tensor", TENSOR), Port("image", IMAGE), Port("model", MODEL), Port("text", STRING)]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("n", "int", 1, min_value=1, max_value=10),
                Param("rate", "float", 0.5, min_value=0.0, max_value=1.0),
                Param("mode", "select", "a", options=["a", "b"]),
                Param("flag", "bool", False),
                Param("name", "string", "")]


class TSink(Node):
    NODE_NAME = "T_Sink"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("x", TENSOR), Port("extra", ANY, optional=True)]

    @classmethod
    def define_outputs(cls) -> list[Port]:
        return [Port("y", TENSOR)]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("scale", "float", 1.0)]


class TRequired(Node):
    NODE_NAME = "T_Required"

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("url", "string", "", required=True)]


class TSecret(Node):
    NODE_NAME = "T_Secret"

    @classmethod
    def define_inputs(cls) -> list[Port]:
        return [Port("value", ANY, optional=True)]

    @classmethod
    def define_params(cls) -> list[Param]:
        return [Param("url", "string", ""), Param("api_key", "secret", ""), Param("token", "secret", "")]


@pytest.fixture(scope="module")
def reg() -> Registry:
    r = Registry()
    for cls in (StartNode, TSource, TSink, TRequired, TSecret):
        r.register(cls)
    return r


def node(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
    return {"id": nid, "type": ntype, "position": {"x": 0, "y": 0}, "data": {"params": params}}


def edge(src: str, sh: str, dst: str, th: str) -> dict[str, Any]:
    return {"id": f"{src}.{sh}-{dst}.{th}", "source": src, "sourceHandle": sh, "target": dst, "targetHandle": th}


def trig(src: str, dst: str) -> dict[str, Any]:
    return {"id": f"t-{src}-{dst}", "source": src, "sourceHandle": "trigger", "target": dst, "type": "trigger"}


def graph(nodes: list[dict[str, Any]], edges: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"format_version": 1, "nodes": nodes, "edges": edges, **extra}


def simple() -> dict[str, Any]:
    return graph([node("start", "Start"), node("src", "T_Source", n=3), node("sink", "T_Sink")],
                 [trig("start", "src"), edge("src", "tensor", "sink", "x")])


def codes(errors: list[dict[str, Any]]) -> list[str]:
    return [e["code"] for e in errors]


# -- validation -----------------------------------------------------------------
def test_valid_graph_plan_order_and_coerced_params(reg: Registry) -> None:
    """A valid graph yields a topologically ordered plan; params are
    coerced to their declared types with defaults filled in."""
    g = simple()
    g["nodes"][1]["data"]["params"] = {"n": "4", "rate": "0.25", "flag": "true"}
    plan, errors = validate_graph(g, reg)
    assert errors == []
    assert plan is not None
    assert [p.id for p in plan.order] == ["start", "src", "sink"]
    src = plan.order[1]
    assert src.params == {"n": 4, "rate": 0.25, "mode": "a", "flag": True, "name": ""}
    assert plan.order[2].inputs == {"x": ("src", "tensor")}


@pytest.mark.parametrize("mutate, code", [
    (lambda g: g["nodes"].append(node("u", "NoSuchNode")) or g["edges"].append(trig("start", "u")), "unknown_type"),
    (lambda g: g["edges"].__setitem__(1, trig("start", "sink")), "missing_input"),
    (lambda g: g["edges"].__setitem__(1, edge("src", "tensor", "sink", "nope")), "bad_port"),
    (lambda g: g["edges"].__setitem__(1, edge("src", "nope", "sink", "x")), "bad_port"),
    (lambda g: g["edges"].__setitem__(1, edge("src", "model", "sink", "x")), "type_mismatch"),
    (lambda g: g["nodes"][1]["data"]["params"].update(n=11), "param_out_of_range"),
    (lambda g: g["nodes"][1]["data"]["params"].update(rate=-0.1), "param_out_of_range"),
    (lambda g: g["nodes"][1]["data"]["params"].update(n="many"), "bad_param"),
    (lambda g: g["nodes"][1]["data"]["params"].update(n=2.5), "bad_param"),
    (lambda g: g["nodes"][1]["data"]["params"].update(mode="c"), "bad_param"),
    (lambda g: g["nodes"][1]["data"]["params"].update(flag="maybe"), "bad_param"),
    (lambda g: g["nodes"].append(node("src", "T_Source")), "duplicate_id"),
    (lambda g: g["nodes"].pop(0), "no_entry_point"),
    (lambda g: g.update(format_version=2), "bad_format_version"),
    (lambda g: g["nodes"].append(node("req", "T_Required")) or g["edges"].append(trig("start", "req")),
     "missing_param"),
    (lambda g: g["nodes"].append(node("p", "preset:Missing")) or g["edges"].append(trig("start", "p")),
     "unknown_preset"),
])
def test_each_error_kind(reg: Registry, mutate: Any, code: str) -> None:
    """Each kind of mistake is reported with its code, and no plan is returned."""
    g = simple()
    mutate(g)
    plan, errors = validate_graph(g, reg)
    assert plan is None
    assert code in codes(errors), errors
    for e in errors:
        assert e["message"] and "node_id" in e


def test_cycle_is_reported(reg: Registry) -> None:
    """A data cycle among live nodes is an error naming its nodes."""
    g = graph([node("start", "Start"), node("src", "T_Source"), node("a", "T_Sink"), node("b", "T_Sink")],
              [trig("start", "src"), edge("src", "tensor", "a", "x"), edge("a", "y", "b", "x"),
               edge("b", "y", "a", "extra")])
    plan, errors = validate_graph(g, reg)
    assert plan is None
    cyc = [e for e in errors if e["code"] == "cycle"]
    assert cyc and set(cyc[0]["value"]) == {"a", "b"}


def test_every_error_at_once(reg: Registry) -> None:
    """Unknown type, missing input, bad port, type mismatch,
    out-of-range param and a cycle in one graph: all are listed in one answer."""
    g = graph([node("start", "Start"), node("src", "T_Source", n=99), node("u", "Bogus"),
               node("s1", "T_Sink"), node("s2", "T_Sink"), node("s3", "T_Sink"),
               node("c1", "T_Sink"), node("c2", "T_Sink")],
              [trig("start", "src"), trig("start", "u"), trig("start", "s1"),
               edge("src", "tensor", "s2", "wrong"),
               edge("src", "model", "s3", "x"),
               edge("src", "tensor", "c1", "x"), edge("c1", "y", "c2", "x"), edge("c2", "y", "c1", "extra")])
    plan, errors = validate_graph(g, reg)
    assert plan is None
    got = set(codes(errors))
    assert {"unknown_type", "missing_input", "bad_port", "type_mismatch", "param_out_of_range", "cycle"} <= got, errors
    by_node = {e["node_id"] for e in errors}
    assert {"src", "u", "s1", "s2", "s3"} <= by_node


def test_a_mistyped_node_type_gets_a_did_you_mean(reg: Registry) -> None:
    """An unknown type spelled nearly like an installed one (case aside) names it; one like none does not."""
    g = graph([node("start", "Start"), node("a", "T_Sorce"), node("b", "t_sink"), node("c", "Frobnicate")],
              [trig("start", "a"), trig("start", "b"), trig("start", "c")])
    errors = validate_graph(g, reg)[1]
    hints = {e["node_id"]: e["hint"] for e in errors if e["code"] == "unknown_type"}
    rest = "put the custom node's .py file in the custom_nodes folder and restart, or remove the node"
    assert hints == {"a": "did you mean 'T_Source'? else " + rest, "b": "did you mean 'T_Sink'? else " + rest,
                     "c": rest}


def test_not_a_graph() -> None:
    """Garbage instead of a graph is an error, not a crash."""
    r = Registry()
    for raw in (None, [], "x", 3, {"nodes": "x"}, {"nodes": [1, {"id": 2}], "edges": [{"source": 1}]}):
        plan, errors = validate_graph(raw, r)
        assert plan is None and errors, raw


@pytest.mark.parametrize("src, dst, ok", [
    (TENSOR, TENSOR, True), (IMAGE, TENSOR, True), (TENSOR, IMAGE, False), (ANY, MODEL, True),
    (MODEL, ANY, True), (MODEL, TENSOR, False), (TRIGGER, TRIGGER, True), (TRIGGER, ANY, False),
    (ANY, TRIGGER, False), (STRING, STRING, True),
])
def test_port_compatibility(src: str, dst: str, ok: bool) -> None:
    """CodefyUI's port type rules."""
    assert is_compatible(src, dst) is ok


# -- pruning ------------------------------------------------------------------------
def test_drafts_are_pruned_without_complaint(reg: Registry) -> None:
    """Nodes no Start reaches (and that feed nothing live) are drafts:
    pruned, even when they are broken; notes are dropped."""
    g = simple()
    g["nodes"] += [node("draft1", "DoesNotExist"), node("draft2", "T_Sink"), node("draft3", "T_Source", n=500),
                   {"id": "note1", "type": "note", "data": {"text": "hello"}}]
    g["edges"] += [edge("draft3", "model", "draft2", "x")]
    plan, errors = validate_graph(g, reg)
    assert errors == []
    assert [p.id for p in plan.order] == ["start", "src", "sink"]
    assert set(plan.pruned) == {"draft1", "draft2", "draft3"}


def test_data_feeders_of_live_nodes_run(reg: Registry) -> None:
    """A node not triggered itself still runs when it feeds a live node."""
    g = graph([node("start", "Start"), node("feeder", "T_Source"), node("sink", "T_Sink")],
              [trig("start", "sink"), edge("feeder", "tensor", "sink", "x")])
    plan, errors = validate_graph(g, reg)
    assert errors == []
    assert [p.id for p in plan.order] == ["start", "feeder", "sink"]


def test_start_alone_is_an_error(reg: Registry) -> None:
    """A Start that reaches nothing means nothing would run."""
    g = graph([node("start", "Start"), node("src", "T_Source")], [])
    plan, errors = validate_graph(g, reg)
    assert plan is None and codes(errors) == ["no_entry_point"]


# -- presets --------------------------------------------------------------------------
def preset(name: str, nodes: list[dict[str, Any]], edges: list[dict[str, Any]],
           ins: list[tuple[str, str, str]] = (), outs: list[tuple[str, str, str]] = ()) -> dict[str, Any]:
    return {"preset_name": name, "nodes": nodes, "edges": edges,
            "exposed_inputs": [{"name": n, "internal_node": i, "internal_port": p} for n, i, p in ins],
            "exposed_outputs": [{"name": n, "internal_node": i, "internal_port": p} for n, i, p in outs]}


def test_preset_expansion_ids_overrides_and_ports(reg: Registry) -> None:
    """Preset inner ids are <presetNodeId>__<innerId>; data.internalParams
    overrides inner params; exposed ports are rewired to the inner nodes."""
    inner = preset("Pair",
                   [{"id": "a", "type": "T_Sink", "params": {"scale": 2.0}},
                    {"id": "b", "type": "T_Sink", "data": {"params": {"scale": 3.0}}}],
                   [edge("a", "y", "b", "x")], ins=[("in", "a", "x")], outs=[("out", "b", "y")])
    g = graph([node("start", "Start"), node("src", "T_Source"),
               {"id": "p1", "type": "preset:Pair", "data": {"params": {}, "internalParams": {"b": {"scale": 7.5}}}},
               node("after", "T_Sink")],
              [trig("start", "src"), edge("src", "tensor", "p1", "in"), edge("p1", "out", "after", "x")],
              presets=[inner])
    plan, errors = validate_graph(g, reg)
    assert errors == []
    ids = [p.id for p in plan.order]
    assert ids == ["start", "src", "p1__a", "p1__b", "after"]
    by_id = {p.id: p for p in plan.order}
    assert by_id["p1__a"].params["scale"] == 2.0
    assert by_id["p1__b"].params["scale"] == 7.5
    assert by_id["p1__a"].inputs == {"x": ("src", "tensor")}
    assert by_id["after"].inputs == {"x": ("p1__b", "y")}
    assert by_id["p1__b"].origin == "p1"
    # The same preset can come from the installed library instead of the graph.
    g2 = dict(g)
    g2.pop("presets")
    plan2, errors2 = validate_graph(g2, reg, {"Pair": inner})
    assert errors2 == [] and [p.id for p in plan2.order] == ids


def test_preset_errors_name_the_preset_node(reg: Registry) -> None:
    """Errors inside a preset point at the node the user placed;
    unknown exposed ports are bad_port."""
    inner = preset("Broken", [{"id": "a", "type": "T_Sink", "params": {}}], [], ins=[("in", "a", "x")])
    g = graph([node("start", "Start"), node("src", "T_Source"),
               {"id": "pp", "type": "preset:Broken", "data": {"internalParams": {"a": {"scale": "big"}}}}],
              [trig("start", "src"), edge("src", "tensor", "pp", "in"), edge("src", "image", "pp", "nosuch")],
              presets=[inner])
    plan, errors = validate_graph(g, reg)
    assert plan is None
    assert "bad_port" in codes(errors) and "bad_param" in codes(errors)
    assert {e["node_id"] for e in errors} == {"pp"}


def test_nested_presets_and_depth_limit(reg: Registry) -> None:
    """Presets nest (ids chain as outer__mid__leaf); a preset that
    contains itself stops at the depth limit with an error."""
    leaf = preset("Leaf", [{"id": "s", "type": "T_Sink", "params": {"scale": 1.5}}], [],
                  ins=[("in", "s", "x")], outs=[("out", "s", "y")])
    mid = preset("Mid", [{"id": "l", "type": "preset:Leaf", "params": {}}], [],
                 ins=[("in", "l", "in")], outs=[("out", "l", "out")])
    g = graph([node("start", "Start"), node("src", "T_Source"), {"id": "o", "type": "preset:Mid", "data": {}}],
              [trig("start", "src"), edge("src", "tensor", "o", "in")], presets=[leaf, mid])
    plan, errors = validate_graph(g, reg)
    assert errors == []
    assert [p.id for p in plan.order] == ["start", "src", "o__l__s"]
    assert plan.order[-1].params["scale"] == 1.5 and plan.order[-1].origin == "o"

    loop = preset("Loop", [{"id": "again", "type": "preset:Loop", "params": {}}], [])
    g2 = graph([node("start", "Start"), {"id": "x", "type": "preset:Loop", "data": {}}], [trig("start", "x")],
               presets=[loop])
    # Refused before anything is expanded: counting the nesting finds the loop.
    with pytest.raises(CduiError) as parsed:
        parse(g2)
    assert parsed.value.code == "graph_too_large" and f"deeper than {MAX_PRESET_DEPTH} levels" in parsed.value.message
    with pytest.raises(CduiError) as validated:
        validate_graph(g2, reg)
    assert validated.value.code == "graph_too_large"


def test_trigger_into_preset_starts_its_entry_nodes(reg: Registry) -> None:
    """A Start trigger wired to a preset node reaches the preset's inner nodes."""
    p = preset("Solo", [{"id": "src", "type": "T_Source", "params": {"n": 2}},
                        {"id": "sink", "type": "T_Sink", "params": {}}],
               [edge("src", "tensor", "sink", "x")], ins=[], outs=[("y", "sink", "y")])
    g = graph([node("start", "Start"), {"id": "s", "type": "preset:Solo", "data": {}}], [trig("start", "s")],
              presets=[p])
    plan, errors = validate_graph(g, reg)
    assert errors == []
    assert [q.id for q in plan.order] == ["start", "s__src", "s__sink"]


# -- secrets --------------------------------------------------------------------------
def test_split_and_fill_secrets(reg: Registry) -> None:
    """Secrets: every secret-typed param is blanked in the stored
    copy (node params, preset internalParams, the graph's own presets), the
    original is untouched, and fill_secrets puts the values back exactly."""
    p = preset("Hook", [{"id": "h", "type": "T_Secret", "params": {"url": "u", "api_key": "inner-preset-key"}}], [])
    g = graph([node("start", "Start"),
               node("w", "T_Secret", url="http://x", api_key="sk-live-AAAA1111", token=""),
               {"id": "ph", "type": "preset:Hook", "data": {"internalParams": {"h": {"token": "tok-in-override"}}}}],
              [trig("start", "w"), trig("start", "ph")], presets=[p])
    stored, found = split_secrets(g, reg)
    text = repr(stored)
    for secret in ("sk-live-AAAA1111", "inner-preset-key", "tok-in-override"):
        assert secret not in text
        assert secret in repr(g), "split_secrets changed the caller's graph"
    assert stored["nodes"][1]["data"]["params"]["url"] == "http://x"
    paths = {tuple(path): value for path, value in found}
    assert paths[("nodes", 1, "data", "params", "api_key")] == "sk-live-AAAA1111"
    assert paths[("nodes", 2, "data", "internalParams", "h", "token")] == "tok-in-override"
    assert paths[("presets", 0, "nodes", 0, "params", "api_key")] == "inner-preset-key"
    assert len(found) == 3, "empty secrets are not secrets"
    assert fill_secrets(stored, found) == g
    # The stored copy still validates (secrets are optional strings).
    assert validate_graph(stored, reg)[1] == []


def test_redact_text() -> None:
    """Secrets: secret values are replaced in any text; very
    short values are left alone (they would blank ordinary words)."""
    secrets = [(["a"], "hunter2-very-secret"), (["b"], "abc"), (["c"], 12345)]
    line = "auth=hunter2-very-secret; again hunter2-very-secret; abc stays"
    assert redact_text(line, secrets) == "auth=***; again ***; abc stays"


# -- safe_join and layout ----------------------------------------------------------------
@pytest.mark.parametrize("rel, reason", [
    ("..", "'..'"),
    ("../x", "'..'"),
    ("a/../../x", "'..'"),
    ("a\\..\\..\\x", "'..'"),
    ("/etc/passwd", "absolute"),
    ("\\\\server\\share", "absolute"),
    ("C:/Windows/x", "absolute"),
    ("a\x00b", "control"),
    ("a\nb", "control"),
    ("x" * 256, "longer"),
    ("a/" * 2100 + "b", "longer"),
    ("", "empty"),
    ("./", "empty"),
    ("escape/passwd", "symbolic link"),
    ("escape", "symbolic link"),
])
def test_safe_join_refuses(tmp_path: Path, rel: str, reason: str) -> None:
    """`..`, absolute paths, control characters, long names,
    empty paths and symlink escapes are refused with a reason."""
    base = tmp_path / "base"
    base.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "passwd").write_text("secret")
    os.symlink(tmp_path / "outside", base / "escape")
    with pytest.raises(PathRefused) as ei:
        safe_join(base, rel)
    assert reason in ei.value.message
    assert ei.value.status == 400 and ei.value.code == "path_refused"


@pytest.mark.parametrize("rel, expect", [
    ("a.csv", "a.csv"),
    ("sub/a.csv", "sub/a.csv"),
    ("./sub//a.csv", "sub/a.csv"),
    ("sub\\a.csv", "sub/a.csv"),
    ("inside-link/f.txt", "inside-link/f.txt"),
    ("..hidden", "..hidden"),
    ("x" * 255, "x" * 255),
])
def test_safe_join_accepts(tmp_path: Path, rel: str, expect: str) -> None:
    """Ordinary relative names (and links that stay inside) are joined."""
    base = tmp_path / "base"
    (base / "sub").mkdir(parents=True)
    os.symlink(base / "sub", base / "inside-link")
    got = safe_join(base, rel)
    assert got == base.resolve() / expect


def test_check_name() -> None:
    """An upload name is one plain file name."""
    assert check_name("train.csv") == "train.csv"
    for bad in ("", ".", "..", "a/b", "a\\b", "x\x01", "y" * 256, None):
        with pytest.raises(PathRefused):
            check_name(bad)  # type: ignore[arg-type]


def test_layout_resolves_inside_data_folders(tmp_path: Path) -> None:
    """Relative node paths resolve against the install root; data/...
    resolves inside the (moved) data folders; built-in samples fall back to the
    install's copy; writers resolve inside their own folder; escapes are refused."""
    install = tmp_path / "install"
    (install / "data" / "samples").mkdir(parents=True)
    (install / "data" / "samples" / "iris.csv").write_text("a,b\n")
    data = tmp_path / "moved-data"
    lay = Layout.from_env({"CODEFYUI_DATA_DIR": str(data), "CODEFYUI_MODELS_DIR": str(tmp_path / "m")}, install)
    assert lay.resolve("data/files/train.csv") == data.resolve() / "files" / "train.csv"
    assert lay.resolve("data/models/x.pt") == (tmp_path / "m").resolve() / "x.pt"
    assert lay.resolve("data/samples/iris.csv") == (install / "data" / "samples" / "iris.csv").resolve()
    assert lay.resolve("examples/g.json") == install.resolve() / "examples" / "g.json"
    assert lay.resolve_output("models", "iris/model.pt") == (tmp_path / "m").resolve() / "iris" / "model.pt"
    assert lay.resolve_output("output", "data/output/o.csv") == data.resolve() / "output" / "o.csv"
    with pytest.raises(PathRefused):  # cdui's own folders are not for nodes to write into
        lay.resolve_output("output", "data/graphs/g.json")
    assert lay.resolve_upload("files", "train.csv") == data.resolve() / "files" / "train.csv"
    for bad in ("../../etc/passwd", "/etc/passwd", "data/files/../../x", "data/../../x", ""):
        with pytest.raises(PathRefused):
            lay.resolve(bad)
    for bad in ("../x.pt", "/tmp/x.pt"):
        with pytest.raises(PathRefused):
            lay.resolve_output("models", bad)
    with pytest.raises(PathRefused):
        lay.run_dir("../other")
