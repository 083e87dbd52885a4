"""The files of a project folder (cdui/core/project.py), without processes: a graph's logic and layout
split and merged back, a project's .env read, and where a project's node paths lead."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdui.core import project
from cdui.core.errors import CduiError, PathRefused
from cdui.core.layout import Layout


def graph() -> dict:
    return {"format_version": 1, "name": "g", "segmentGroups": [{"id": "s1"}], "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 10.4, "y": -3.6}, "selected": True,
         "data": {"params": {}}},
        {"id": "p", "type": "preset:Block", "position": {"x": 100, "y": 0}, "data": {"params": {}}},
        {"id": "n1", "type": "note", "position": {"x": 5, "y": 5},
         "data": {"text": "why", "noteWidth": 200, "boundToNodeId": "p"}}],
        "edges": [{"id": "e", "source": "start", "target": "p", "type": "trigger"}],
        "presets": [{"preset_name": "Block", "nodes": [{"id": "in", "type": "Print", "position": {"x": 1, "y": 2},
                                                        "data": {"params": {"label": "x"}}}], "edges": []}]}


def test_split_keeps_behaviour_in_logic_and_places_in_layout_and_merge_gives_it_back() -> None:
    logic, layout = project.split_graph(graph())
    text = json.dumps(logic)
    assert "position" not in text and "noteWidth" not in text and "selected" not in text
    assert "segmentGroups" not in logic and logic["nodes"][2]["data"] == {"text": "why"}
    assert layout["positions"] == {"start": {"x": 10, "y": -4}, "p": {"x": 100, "y": 0}, "n1": {"x": 5, "y": 5},
                                   "preset:Block/in": {"x": 1, "y": 2}}
    assert layout["notes"] == {"n1": {"noteWidth": 200, "boundToNodeId": "p"}}
    merged = project.merge_graph(logic, layout)
    assert merged["nodes"][0]["position"] == {"x": 10, "y": -4}
    assert merged["nodes"][2]["data"] == {"noteWidth": 200, "boundToNodeId": "p", "text": "why"}
    assert merged["presets"][0]["nodes"][0]["position"] == {"x": 1, "y": 2}
    assert merged["segmentGroups"] == [{"id": "s1"}] and "layout_missing" not in merged
    # A second round trip writes the very same files: a save that changed nothing touches nothing.
    assert project.split_graph(merged) == (logic, layout)


def test_a_graph_without_a_layout_loads_unplaced_and_says_so() -> None:
    logic, _ = project.split_graph(graph())
    merged = project.merge_graph(logic, None)
    assert merged["layout_missing"] is True and "position" not in merged["nodes"][0]


def test_write_if_changed_leaves_an_unchanged_file_alone(tmp_path: Path) -> None:
    f = tmp_path / "layout" / "g.layout.json"
    assert project.write_if_changed(f, "a\n") is True
    before = f.stat().st_mtime_ns, f.stat().st_ino
    assert project.write_if_changed(f, "a\n") is False
    assert (f.stat().st_mtime_ns, f.stat().st_ino) == before


def test_env_lines_and_a_bad_line_named_by_number_not_content() -> None:
    got = project.parse_env("# c\n\nexport A_KEY=\"v 1\"\nB='x'\nC=plain=with=eq\n", ".env")
    assert got == {"A_KEY": "v 1", "B": "x", "C": "plain=with=eq"}
    with pytest.raises(CduiError) as info:
        project.parse_env("A=1\nsk-live-verysecret\n", ".env")
    assert "line 2" in info.value.message and "sk-live" not in str(info.value)


def test_project_paths_read_assets_and_never_the_env_file(tmp_path: Path) -> None:
    lab, _ = project.scaffold(tmp_path / "lab")
    (lab / "assets" / "data" / "t.csv").write_text("1\n")
    (lab / ".env").write_text("K=abcdefgh\n")
    layout = Layout.from_env({project.PROJECT_SETTING: str(lab), "CODEFYUI_INSTALL_ROOT": str(tmp_path / "inst"),
                              "CODEFYUI_USER_DATA_DIR": str(tmp_path / "ud")})
    assert layout.resolve("assets/data/t.csv") == lab / "assets" / "data" / "t.csv"
    assert layout.resolve("data/assets/data/t.csv") == lab / "assets" / "data" / "t.csv"
    assert layout.folder("files") == tmp_path / "inst" / "data" / "files"  # uploads stay the installation's
    assert layout.folder("models") == lab / "assets" / "models"
    assert layout.folder("graphs") == lab / "graphs"
    with pytest.raises(PathRefused) as info:
        layout.resolve("data/.env")
    assert "secrets file" in str(info.value.reason)


def test_init_refuses_a_folder_that_holds_something_else(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "thesis.tex").write_text("")
    with pytest.raises(CduiError) as info:
        project.scaffold(tmp_path / "x")
    assert "thesis.tex" in info.value.message
    assert list((tmp_path / "x").iterdir()) == [tmp_path / "x" / "thesis.tex"]
