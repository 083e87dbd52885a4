"""The browser tests' shared pieces: a real server, Chromium driven by Playwright, and the canvas page
(web/canvas.html with its real editor, tabs, panel and Run) in one browser context of its own.

The canvas tests (test_canvas_edit.py, test_canvas_tabs.py, test_canvas_roundtrip.py,
test_canvas_layers.py, test_canvas_run_page.py, test_canvas_acceptance.py) and the runs page's
(test_web.py) take their server, browser and page from here; a test is skipped with the reason when
Chromium or Playwright is missing."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import ServerProc

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LONG = 180_000  # ms: generous waits for selectors, never a timing assertion
PAGE = "/web/canvas.html"


def playwright() -> Any:
    """Playwright's ``sync_playwright``; skips the test with the reason when it or Chromium is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is missing (pip install playwright)")
    return sync_playwright


def server_proc(tmp: Path, name: str, custom_nodes: dict[str, str] | None = None) -> ServerProc:
    """A server (not started) with its state in ``tmp``, skipped first when there is no browser;
    ``custom_nodes``: {file name: Python source} put into its data folder's custom_nodes/ (read at start)."""
    playwright()
    s = ServerProc(tmp, name=name)
    if custom_nodes:
        folder = s.data_dir / "custom_nodes"
        folder.mkdir(parents=True, exist_ok=True)
        for file, source in custom_nodes.items():
            (folder / file).write_text(source)
    return s


def serve(tmp_path_factory: Any, name: str = "canvas-tabs", custom_nodes: dict[str, str] | None = None,
          ) -> Iterator[ServerProc]:
    """A module fixture's body: a real server, stopped at the end."""
    s = server_proc(tmp_path_factory.mktemp(name), f"{name}-server", custom_nodes)
    try:
        yield s.start()
    finally:
        s.stop()


def chromium() -> Iterator[Any]:
    """A module fixture's body: Chromium driven by Playwright."""
    with playwright()() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def module_fixtures(name: str = "canvas-tabs", custom_nodes: dict[str, str] | None = None) -> tuple[Any, Any]:
    """A test module's ``server`` and ``browser`` fixtures (module scope), as
    ``server, browser = module_fixtures("canvas-run")``."""

    @pytest.fixture(scope="module")
    def server(tmp_path_factory: Any) -> Iterator[ServerProc]:
        yield from serve(tmp_path_factory, name, custom_nodes)

    @pytest.fixture(scope="module")
    def browser() -> Iterator[Any]:
        yield from chromium()

    return server, browser


def drag_drop(page: Any, source: Any, target: Any, x: float, y: float) -> None:
    """Drags the element ``source`` (a locator: a palette item) onto ``target`` at (x, y) of its box, as a
    hand does: press on the item, a small move that starts the browser's drag, then moves in steps to the
    drop point and one more on it before the release, so the canvas gets ``dragover`` events (it accepts a
    drop only after one) before the drop. Playwright's ``drag_to`` makes a single move from the press to
    the target: under a load of 7 on two cores, one such drag in five runs of the canvas tests dropped
    nothing (the node never appeared in three minutes)."""
    source.scroll_into_view_if_needed()
    a = source.bounding_box()
    b = target.bounding_box()
    sx, sy = a["x"] + a["width"] / 2, a["y"] + a["height"] / 2
    tx, ty = b["x"] + x, b["y"] + y
    page.mouse.move(sx, sy)
    page.mouse.down()
    page.mouse.move(sx + 8, sy + 4, steps=2)
    page.mouse.move(tx, ty, steps=8)
    page.mouse.move(tx + 1, ty + 1)
    page.mouse.move(tx, ty)
    page.mouse.up()


class CanvasPage:
    """One browser context (its own localStorage) on the canvas page; page errors fail close()."""

    def __init__(self, browser: Any, server: ServerProc, width: int = 1400, height: int = 900) -> None:
        self.server = server
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": width, "height": height}, accept_downloads=True)
        self.page = self.context.new_page()
        self.page.set_default_timeout(LONG)
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.goto()

    def goto(self) -> None:
        self.page.goto(self.server.url + PAGE)
        self.page.wait_for_selector("body[data-ready='1']")

    def reload(self) -> None:
        self.page.evaluate("window.cduiCanvas.tabs.flush()")
        self.page.reload()
        self.page.wait_for_selector("body[data-ready='1']")

    def js(self, expr: str, arg: Any = None) -> Any:
        return self.page.evaluate(expr, arg)

    def open(self, graph: dict[str, Any], name: str) -> str:
        tab_id: str = self.js("([g, n]) => window.cduiCanvas.tabs.open(g, n).tabId", [graph, name])
        return tab_id

    def graph(self) -> dict[str, Any]:
        got: dict[str, Any] = self.js("() => window.cduiCanvas.editor().toJSON()")
        return got

    # -- the config panel and the tabs' storage (panel.js, tabs.js) --
    def select(self, node_id: str) -> None:
        self.js("(id) => window.cduiCanvas.editor().select([id])", node_id)
        self.page.wait_for_selector(f".cv-panel-node[data-node-id='{node_id}']")

    def field(self, name: str) -> Any:
        return self.page.locator(f".cv-param[data-param='{name}'] [data-param-input]")

    def row(self, name: str) -> Any:
        return self.page.locator(f".cv-param[data-param='{name}']")

    def problems(self) -> list[dict[str, Any]]:
        """The panel's check of the active tab's params (what is marked before Run)."""
        c = "window.cduiCanvas"
        got: list[dict[str, Any]] = self.js("async () => (await import('/web/canvas/panel.js'))"
                                            f".graphProblems({c}.editor().toJSON(), {c}.catalog)")
        return got

    def stored(self) -> dict[str, str]:
        got: dict[str, str] = self.js("() => Object.fromEntries(Object.keys(localStorage)"
                                      ".filter((k) => k.startsWith('cdui-canvas:')).map((k) => [k, localStorage[k]]))")
        return got

    # -- running (run.js, results.js): node statuses read back through the editor's marks(node_id) --
    def statuses(self) -> dict[str, Any]:
        got: dict[str, Any] = self.js("""() => { const ed = window.cduiCanvas.editor();
            return Object.fromEntries(ed.toJSON().nodes.map((n) => [n.id, ed.marks(n.id).status])); }""")
        return got

    def wait_status(self, node_id: str, status: str) -> None:
        self.page.wait_for_function("([id, s]) => window.cduiCanvas.editor().marks(id).status === s",
                                    arg=[node_id, status])

    def open_node(self, node_id: str) -> None:
        """As a person does: select the node on the canvas, press Enter."""
        self.js("(id) => { const ed = window.cduiCanvas.editor(); ed.select([id]); ed.focus(); }", node_id)
        self.page.keyboard.press("Enter")

    def run_id(self) -> str:
        self.page.wait_for_selector("#canvas-run-title a")
        href: str = self.page.get_attribute("#canvas-run-title a", "href") or ""
        assert href.startswith("/#run="), href
        return href.removeprefix("/#run=")

    def log(self) -> str:
        """A JS expression for the execution log's own API (results.js's logOf(#canvas-log))."""
        self.js("async () => { window.__cduiLog = (await import('/web/canvas/results.js'))"
                ".logOf(document.getElementById('canvas-log')); }")
        return "window.__cduiLog"

    def log_lines(self) -> list[dict[str, Any]]:
        """Every line the execution log holds (not only those in the page): {line, seq, kind, level, text}."""
        got: list[dict[str, Any]] = self.js(f"() => {self.log()}.lines()")
        return got

    def close(self) -> None:
        self.context.close()
        assert not self.errors, self.errors


def example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ROOT / "examples" / name).read_text())
    return data
