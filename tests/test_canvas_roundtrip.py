"""All 29 vendored CodefyUI examples (tests/data/codefyui_examples/) go through the canvas in a real
Chromium with no edit — opened in a tab, saved to data/graphs/ through the Save as of
web/canvas/files.js, autosaved and restored after a reload — and come back exactly: nodes, edges,
params, positions and every field the editor does not know, key for key."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from canvas_page import CanvasPage, module_fixtures

pytestmark = pytest.mark.e2e

EXAMPLES = sorted((Path(__file__).resolve().parent / "data" / "codefyui_examples").glob("*.graph.json"))


server, browser = module_fixtures("canvas-roundtrip")


def saved_name(path: Path) -> str:
    return path.name.removesuffix(".graph.json")


def differences(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Where two graphs differ, by node and edge id, for a readable failure."""
    out = [f"top-level {k}" for k in sorted(set(want) | set(got)) if k not in ("nodes", "edges")
           and want.get(k) != got.get(k)]
    for kind in ("nodes", "edges"):
        w = {x.get("id"): x for x in want.get(kind) or []}
        g = {x.get("id"): x for x in got.get(kind) or []}
        out += [f"{kind} {i}: {json.dumps(w.get(i))[:300]} != {json.dumps(g.get(i))[:300]}"
                for i in sorted(set(w) | set(g), key=str) if w.get(i) != g.get(i)]
        if [x.get("id") for x in want.get(kind) or []] != [x.get("id") for x in got.get(kind) or []]:
            out.append(f"{kind} order")
    return out


def test_the_29_examples_round_trip(server, browser):
    assert len(EXAMPLES) == 29, EXAMPLES
    cp = CanvasPage(browser, server)
    graphs = {p: json.loads(p.read_text()) for p in EXAMPLES}
    tab_of: dict[Path, str] = {}
    for path, graph in graphs.items():
        tab_of[path] = cp.open(graph, saved_name(path))
        got = cp.graph()
        assert got == graph, (path.name, differences(graph, got))
        cp.js("(name) => window.cduiCanvas.tabs.files.saveAs(undefined, name)", saved_name(path))
        cp.page.wait_for_function("(n) => window.cduiCanvas.tabs.active().savedAs === n", arg=saved_name(path))
    # What the server keeps is the graph as it came in.
    for path, graph in graphs.items():
        stored = server.call("GET", f"/api/graphs/{saved_name(path)}", expect=200)
        assert stored == graph, (path.name, differences(graph, stored))
    # Autosaved and restored: every tab after a reload is its example again.
    cp.reload()
    for path, graph in graphs.items():
        cp.js("(id) => window.cduiCanvas.tabs.select(id)", tab_of[path])
        got = cp.graph()
        assert got == graph, (path.name, differences(graph, got))
    # Opened from the server into a fresh tab: the same again.
    for path, graph in list(graphs.items())[:5]:
        cp.js("(name) => window.cduiCanvas.tabs.files.openNamed(name)", saved_name(path))
        got = cp.graph()
        assert got == graph, (path.name, differences(graph, got))
    cp.close()
