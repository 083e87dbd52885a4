"""Where node paths may read: absolute paths under a machine's read roots, and
never a .git, .venv or cdui user data folder (docs/configuration.md,
CODEFYUI_READ_ROOTS). Pure tables over a real folder tree; no processes."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cdui.core.config import load
from cdui.core.errors import CduiError, PathRefused
from cdui.core.layout import Layout, read_roots_in, read_roots_label
from cdui.graph.context import RunContext
from cdui.nodes.builtin import fileio
from cdui.nodes.registry import build_registry
from cdui.plane.sched.placement import analyze, transfer_verdict, unreadable


@pytest.fixture()
def tree(tmp_path: Path) -> dict[str, Path]:
    """An installation with a data folder, a lab's /datasets and /scratch, and secrets around them."""
    install = tmp_path / "install"
    data = install / "data"
    for sub in ("files", "graphs", "samples"):
        (data / sub).mkdir(parents=True)
    (data / "files" / "ok.csv").write_text("a\n1\n")
    (install / "README.txt").write_text("hello")
    (install / ".git").mkdir()
    (install / ".git" / "config").write_text("[remote] url=https://token@host/x")
    (install / ".venv" / "bin").mkdir(parents=True)
    (install / ".venv" / "bin" / "activate").write_text("x")
    # this process's user data folder, and a second agent's under another name
    (install / ".codefyui_dev").mkdir()
    (install / ".codefyui_dev" / "session-token").write_text("tok")
    (install / "ud2" / "agent").mkdir(parents=True)
    (install / "ud2" / "agent" / "cp-8000.token").write_text("cred")
    (install / "ud3").mkdir()
    (install / "ud3" / "cdui.sqlite3").write_text("db")
    datasets = tmp_path / "datasets"
    (datasets / "iris").mkdir(parents=True)
    (datasets / "iris" / "train.csv").write_text("x\n2\n")
    (datasets / "repo" / ".git").mkdir(parents=True)
    (datasets / "repo" / ".git" / "config").write_text("secret")
    (datasets / "alice-ud" / "agent").mkdir(parents=True)
    (datasets / "alice-ud" / "agent.json").write_text("{}")
    (datasets / "alice-ud" / "agent" / "h-1.token").write_text("cred")
    outside = tmp_path / "home"
    outside.mkdir()
    (outside / "id_rsa").write_text("key")
    os.symlink(outside, datasets / "escape")
    os.symlink(install / ".git", data / "files" / "gitlink")
    return {"install": install, "data": data, "datasets": datasets, "scratch": tmp_path / "scratch",
            "outside": outside}


def layout(tree: dict[str, Path], roots: str = "") -> Layout:
    env = {"CODEFYUI_DATA_DIR": str(tree["data"]), "CODEFYUI_USER_DATA_DIR": str(tree["install"] / ".codefyui_dev")}
    if roots:
        env["CODEFYUI_READ_ROOTS"] = roots
    return Layout.from_env(env, tree["install"])


@pytest.mark.parametrize("value, roots, reason", [
    # absolute paths: refused unless a read root covers them, with the path and the setting named
    ("{datasets}/iris/train.csv", "", "CODEFYUI_READ_ROOTS"),
    ("{datasets}/iris/train.csv", "{scratch}", "CODEFYUI_READ_ROOTS"),
    ("{outside}/id_rsa", "{datasets}", "CODEFYUI_READ_ROOTS"),
    ("{datasets}/../home/id_rsa", "{datasets}", "'..'"),
    ("{datasets}/escape/id_rsa", "{datasets}", "symbolic link"),
    # inside an allowed folder, what nodes never read
    ("{datasets}/repo/.git/config", "{datasets}", ".git folder"),
    ("{datasets}/alice-ud/agent/h-1.token", "{datasets}", "user data folder"),
    ("{install}/.git/config", "{install}", ".git folder"),
    # relative paths under the installation root
    (".git/config", "", ".git folder"),
    (".venv/bin/activate", "", ".venv folder"),
    (".codefyui_dev/session-token", "", "user data folder"),
    ("ud2/agent/cp-8000.token", "", "user data folder"),
    ("ud3/cdui.sqlite3", "", "user data folder"),
    ("data/files/gitlink/config", "", ".git folder"),
])
def test_node_paths_refused(tree: dict[str, Path], value: str, roots: str, reason: str) -> None:
    """Absolute paths outside the read roots, and any .git, .venv or user data folder, are refused
    with the offending path in the message."""
    lay = layout(tree, roots.format(**tree))
    v = value.format(**tree)
    with pytest.raises(PathRefused) as ei:
        lay.resolve(v)
    assert reason in ei.value.message and repr(v) in ei.value.message
    assert ei.value.code == "path_refused" and ei.value.status == 400
    if reason == "CODEFYUI_READ_ROOTS":
        assert "CODEFYUI_READ_ROOTS" in (ei.value.hint or "")


@pytest.mark.parametrize("value, roots, expect", [
    ("{datasets}/iris/train.csv", "{datasets}", "{datasets}/iris/train.csv"),
    ("{datasets}/iris", "{scratch},{datasets}", "{datasets}/iris"),
    ("{datasets}", "{datasets}", "{datasets}"),
    ("{datasets}/iris//train.csv", "{datasets}/", "{datasets}/iris/train.csv"),
    ("README.txt", "", "{install}/README.txt"),
    ("data/files/ok.csv", "", "{data}/files/ok.csv"),
    ("{data}/files/ok.csv", "", "{data}/files/ok.csv"),  # a node output names a file of the run's data folder so
])
def test_node_paths_accepted(tree: dict[str, Path], value: str, roots: str, expect: str) -> None:
    lay = layout(tree, roots.format(**tree))
    assert lay.resolve(value.format(**tree)) == Path(expect.format(**tree)).resolve()


def test_file_reader_reads_under_a_read_root_only(tree: dict[str, Path]) -> None:
    """FileReader (and an upload field) read /datasets/... where the machine allows it, and say which
    setting to change where it does not."""
    path = str(tree["datasets"] / "iris" / "train.csv")
    allowed = RunContext("r", layout(tree, str(tree["datasets"])), emit=lambda k, d: None)
    assert fileio.FileReaderNode().execute({}, {"path": path}, allowed)["text"] == "x\n2\n"
    assert allowed.resolve_upload("files", path) == Path(path).resolve()
    refused = RunContext("r", layout(tree), emit=lambda k, d: None)
    with pytest.raises(PathRefused) as ei:
        fileio.FileReaderNode().execute({}, {"path": path}, refused)
    assert path in ei.value.message and "CODEFYUI_READ_ROOTS" in ei.value.message
    with pytest.raises(PathRefused):  # writing stays inside the data folders
        allowed.output_path("output", str(tree["datasets"] / "x.csv"))


def test_read_roots_travel_with_the_layout_and_the_label(tree: dict[str, Path]) -> None:
    """The run subprocess gets the roots in its layout; an agent reports them in its read-roots label."""
    lay = layout(tree, f"{tree['datasets']},{tree['scratch']}")
    assert Layout.from_json(lay.to_json()).read_roots == lay.read_roots
    label = read_roots_label(lay.read_roots)
    assert read_roots_in(label) == [str(tree["datasets"]), str(tree["scratch"])]
    assert read_roots_label(()) == {} and read_roots_in({}) == []


@pytest.mark.parametrize("raw", ["datasets", "/datasets,scratch"])
def test_read_roots_setting_refuses_relative_folders(raw: str) -> None:
    with pytest.raises(CduiError) as ei:
        load({"CODEFYUI_READ_ROOTS": raw})
    assert "CODEFYUI_READ_ROOTS" in ei.value.message and ei.value.code == "bad_setting"


@pytest.mark.parametrize("reads, roots, missing", [
    (["/datasets/a.csv"], [], ["/datasets/a.csv"]),
    (["/datasets/a.csv"], ["/datasets"], []),
    (["/datasets/a.csv"], ["/datasets/"], []),
    (["/datasets"], ["/datasets"], []),
    (["/datasets2/a.csv"], ["/datasets"], ["/datasets2/a.csv"]),
    (["/datasets/../etc/passwd"], ["/datasets"], ["/datasets/../etc/passwd"]),
    (["/datasets/a", "/scratch/b"], ["/scratch", "/datasets"], []),
    (["/datasets/a", "/scratch/b"], ["/datasets"], ["/scratch/b"]),
])
def test_unreadable(reads: list[str], roots: list[str], missing: list[str]) -> None:
    """Which absolute reads a machine's read roots do not cover."""
    assert unreadable(reads, roots) == missing


def graph_reading(path: str) -> dict[str, Any]:
    return {"nodes": [{"id": "r", "type": "FileReader", "data": {"params": {"path": path}}}], "edges": []}


def test_file_plan_lists_absolute_reads_apart_from_plain_paths() -> None:
    """An absolute read does not stop the transfer backend (it is read where the run runs, not moved);
    the plan carries it so placement can pick a machine that allows it."""
    reg = build_registry()
    usage = analyze(graph_reading("/datasets/iris/train.csv"), reg)
    assert usage.absolute_reads == ["/datasets/iris/train.csv"] and usage.plain_paths == []
    plan = transfer_verdict(usage, lambda f, n: None, True, 1 << 30)
    assert plan.reads == ["/datasets/iris/train.csv"] and plan.transfer_ok and not plan.uses_files


def test_an_agent_reports_its_read_roots_beside_its_mounts(tmp_path: Path) -> None:
    """The agent's hello carries its CODEFYUI_READ_ROOTS as the read-roots label, so placement knows them."""
    import json

    from cdui.agent.agent import Agent

    cfg = load({"CODEFYUI_USER_DATA_DIR": str(tmp_path / "ud"), "CODEFYUI_READ_ROOTS": "/datasets,/scratch/"})
    agent = Agent("http://127.0.0.1:9", "cred", "w1", ["cpu"], tmp_path / "ud", "m1",
                  labels=lambda: {"data": "/nas/data"}, config=cfg)
    assert json.loads(agent._hello())["labels"] == {"data": "/nas/data", "read-roots": "/datasets,/scratch"}
    plain = Agent("http://127.0.0.1:9", "cred", "w1", ["cpu"], tmp_path / "ud", "m1",
                  config=load({"CODEFYUI_USER_DATA_DIR": str(tmp_path / "ud")}))
    assert json.loads(plain._hello())["labels"] == {}
