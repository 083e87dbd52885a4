"""The canvas's config panel, tabs and file buttons (web/canvas/panel.js, tabs.js, files.js), in a
real Chromium against a real server (the page is tests/canvas_page.py's)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from canvas_page import CanvasPage, example, module_fixtures

pytestmark = pytest.mark.e2e


server, browser = module_fixtures("canvas-tabs")

EXAMPLES = Path(__file__).resolve().parent / "data" / "codefyui_examples"
SECRET = "sk-test-DO-NOT-SHOW-4242"


def webhook_graph() -> dict:
    return {"name": "hook", "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "hook", "type": "Webhook", "position": {"x": 200, "y": 0},
         "data": {"params": {"url": "http://127.0.0.1:9/x", "api_key": ""}}},
        {"id": "kernel", "type": "Conv2dKernel", "position": {"x": 0, "y": 200},
         "data": {"params": {"preset": "Sharpen3x3"}}},
    ], "edges": [{"id": "e1", "source": "start", "target": "hook", "sourceHandle": "trigger", "targetHandle": "",
                  "type": "trigger"}]}


def params_of(graph: dict, node_id: str) -> dict:
    return next(n for n in graph["nodes"] if n["id"] == node_id)["data"]["params"]


def test_panel_float_invalid_undo_visibility(server, browser):
    cp = CanvasPage(browser, server)
    iris = example("iris_train.json")
    cp.open(iris, "iris")
    cp.select("optimizer")
    lr = cp.field("lr")
    assert lr.input_value() == "0.01"
    assert "Learning rate" in cp.row("lr").inner_text()
    # A float typed into the panel reaches toJSON() as a number.
    lr.fill("0.05")
    lr.press("Enter")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('optimizer').params.lr === 0.05")
    assert params_of(cp.graph(), "optimizer")["lr"] == 0.05
    # Bad values are marked on the field and never written.
    for bad, why in (("-1", "below the minimum 0"), ("fast", "is not a number"), ("", "a number is needed")):
        lr.fill(bad)
        lr.press("Enter")
        cp.page.wait_for_selector(".cv-param[data-param='lr'].invalid")
        assert lr.get_attribute("aria-invalid") == "true"
        assert why in cp.row("lr").locator(".cv-param-error").inner_text()
        assert params_of(cp.graph(), "optimizer")["lr"] == 0.05
    lr.fill("0.2")
    lr.press("Enter")
    cp.page.wait_for_selector(".cv-param[data-param='lr']:not(.invalid)")
    assert params_of(cp.graph(), "optimizer")["lr"] == 0.2
    # Each change is one edit of the editor's undo history; the panel follows an undo.
    cp.js("() => window.cduiCanvas.editor().undo()")
    cp.page.wait_for_function("() => document.querySelector(\".cv-param[data-param='lr'] input\").value === '0.05'")
    assert params_of(cp.graph(), "optimizer")["lr"] == 0.05
    # An int with a minimum, a select and a bool.
    cp.select("train")
    cp.field("epochs").fill("0")
    cp.field("epochs").press("Enter")
    cp.page.wait_for_selector(".cv-param[data-param='epochs'].invalid")
    cp.field("epochs").fill("2.5")
    cp.field("epochs").press("Enter")
    assert "is not a whole number" in cp.row("epochs").inner_text()
    cp.field("epochs").fill("3")
    cp.field("epochs").press("Enter")
    cp.page.wait_for_selector(".cv-param[data-param='epochs']:not(.invalid)")
    cp.field("device").select_option("auto")
    cp.select("csv")
    cp.field("skip_header").uncheck()
    g = cp.graph()
    assert params_of(g, "train")["epochs"] == 3 and params_of(g, "train")["device"] == "auto"
    assert params_of(g, "csv")["skip_header"] is False
    # A value already in the graph that does not fit is marked as soon as the node is shown.
    broken = copy.deepcopy(iris)
    params_of(broken, "optimizer")["lr"] = -0.5
    params_of(broken, "optimizer")["type"] = "NoSuchOptimizer"
    cp.open(broken, "broken")
    cp.select("optimizer")
    cp.page.wait_for_selector(".cv-param[data-param='lr'].invalid")
    cp.page.wait_for_selector(".cv-param[data-param='type'].invalid")
    problems = cp.problems()
    assert sorted(p["param"] for p in problems) == ["lr", "type"], problems
    # ...and listed above the form for the whole tab, each a way to its node.
    cp.page.wait_for_selector(".cv-panel-problems :text('2 params in this graph do not fit')")
    cp.select("train")
    cp.page.click(".cv-panel-problems button[data-param='lr']")
    cp.page.wait_for_selector(".cv-panel-node[data-node-id='optimizer']")
    cp.field("lr").fill("0.1")
    cp.field("lr").press("Enter")
    cp.page.wait_for_selector(".cv-panel-problems :text('1 param in this graph does not fit')")
    # SequentialModel's layer graph: JSON text, validated.
    cp.select("model")
    layers = cp.field("layers")
    layers.fill('{"version": 2, "nodes": [')
    layers.press("Tab")
    cp.page.wait_for_selector(".cv-param[data-param='layers'].invalid")
    assert "not valid JSON" in cp.row("layers").inner_text()
    assert params_of(cp.graph(), "model")["layers"] == params_of(iris, "model")["layers"]
    # visible_when: the kernel's size and grid only for the Custom preset; a ragged grid is marked.
    cp.open(webhook_graph(), "hook")
    cp.select("kernel")
    assert cp.row("kernel_size").is_hidden() and cp.row("weights").is_hidden()
    cp.field("preset").select_option("Custom")
    cp.page.wait_for_selector(".cv-param[data-param='weights']:not([hidden])")
    assert cp.row("kernel_size").is_visible()
    cp.field("weights").fill("[[1, 2], [3]]")
    cp.field("weights").press("Tab")
    cp.page.wait_for_selector(".cv-param[data-param='weights'].invalid")
    assert "different lengths" in cp.row("weights").inner_text()
    cp.field("weights").fill("[[1, 0], [0, 1]]")
    cp.field("weights").press("Tab")
    cp.page.wait_for_selector(".cv-param[data-param='weights']:not(.invalid)")
    assert params_of(cp.graph(), "kernel") == {"preset": "Custom", "weights": [[1, 0], [0, 1]]}
    cp.field("preset").select_option("Sharpen3x3")
    cp.page.wait_for_selector(".cv-param[data-param='weights'][hidden]", state="attached")
    # A CodefyUI note, a preset and a type this server lacks: said so, their fields kept untouched.
    odd = {"nodes": [
        {"id": "n1", "type": "note", "position": {"x": 0, "y": 0}, "data": {"noteContent": "hello"}},
        {"id": "p1", "type": "preset:MyBlock", "position": {"x": 0, "y": 100}, "data": {"params": {}}},
        {"id": "x1", "type": "NoSuchType", "position": {"x": 0, "y": 200}, "data": {"params": {"k": 1}}}],
        "edges": []}
    cp.open(odd, "odd")
    for node_id, text in (("n1", "A note on the canvas"), ("p1", "Preset MyBlock"),
                          ("x1", 'This server has no node type "NoSuchType"')):
        cp.select(node_id)
        cp.page.wait_for_selector(f"#panel :text('{text}')")
    assert cp.graph() == odd
    cp.close()


def test_secret_masked_and_never_in_page_or_storage(server, browser):
    cp = CanvasPage(browser, server)
    cp.open(webhook_graph(), "hook")
    cp.select("hook")
    key = cp.field("api_key")
    assert key.get_attribute("type") == "password"
    key.fill(SECRET)
    key.press("Enter")
    cp.page.wait_for_selector(".cv-param[data-param='api_key'] [data-secret-state]:has-text('set')")
    # The editor has it for a Run; the field was emptied and shows only that a key is set.
    assert params_of(cp.graph(), "hook")["api_key"] == SECRET
    assert key.input_value() == ""
    cp.js("() => window.cduiCanvas.tabs.flush()")
    assert all(SECRET not in v for v in cp.stored().values())
    cp.js("() => window.cduiCanvas.tabs.files.saveAs(undefined, 'hook-saved')")
    cp.page.wait_for_selector(".cv-file-status:has-text('secrets were not saved')")
    saved = server.call("GET", "/api/graphs/hook-saved", expect=200)
    assert params_of(saved, "hook")["api_key"] == ""
    on_disk = [f for f in server.tmp.rglob("*") if f.is_file() and SECRET.encode() in f.read_bytes()]
    assert on_disk == []
    # Nowhere in the page: not in the DOM, not in any input's value (the panel shown again too).
    cp.select("start")
    cp.select("hook")
    assert SECRET not in cp.page.content()
    values = cp.js("() => [...document.querySelectorAll('input, textarea')].map((e) => e.value).join('\\n')")
    assert SECRET not in values
    # Export leaves it out as well.
    with cp.page.expect_download() as dl:
        cp.page.click("#cv-export")
    exported = json.loads(open(dl.value.path()).read())
    assert params_of(exported, "hook")["api_key"] == ""
    # Clear takes it out of the graph.
    cp.page.click(".cv-param[data-param='api_key'] button:has-text('Clear')")
    assert params_of(cp.graph(), "hook")["api_key"] == ""
    cp.close()


def test_file_field_picker_and_upload(server, browser, tmp_path):
    server.upload("files", "existing.csv", b"a,b\n1,2\n")
    cp = CanvasPage(browser, server)
    cp.open(example("iris_train.json"), "iris")
    cp.select("csv")
    pick = cp.page.locator(".cv-param[data-param='path'] select.cv-file-pick")
    cp.page.wait_for_selector(".cv-param[data-param='path'] select.cv-file-pick option[value='existing.csv']",
                              state="attached")
    pick.select_option("existing.csv")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('csv').params.path === 'existing.csv'")
    assert cp.field("path").input_value() == "existing.csv"
    up = tmp_path / "fresh.csv"
    up.write_text("x,y\n3,4\n")
    cp.page.set_input_files(".cv-param[data-param='path'] input[type=file]", str(up))
    cp.page.wait_for_selector(".cv-upload-note:has-text('uploaded fresh.csv')")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('csv').params.path === 'fresh.csv'")
    names = [f["name"] for f in server.call("GET", "/api/files", expect=200)]
    assert "fresh.csv" in names
    cp.page.wait_for_selector(".cv-param[data-param='path'] option[value='fresh.csv']", state="attached")
    cp.close()


def test_two_tabs_keep_their_graphs_and_survive_reload(server, browser):
    cp = CanvasPage(browser, server)
    first = cp.js("() => window.cduiCanvas.tabs.active().tabId")  # a fresh page has one empty tab
    assert cp.js("() => window.cduiCanvas.editor().toJSON().nodes.length") == 0
    iris = example("iris_train.json")
    hook = webhook_graph()
    a = cp.open(iris, "iris")
    b = cp.open(hook, "hook")
    assert len({first, a, b}) == 3
    assert cp.graph() == hook
    cp.page.click(f".cv-tab[data-tab-id='{a}'] .cv-tab-button")
    cp.page.wait_for_selector(f".cv-tab[data-tab-id='{a}'] [aria-selected='true']")
    assert cp.graph() == iris
    # An edit in one tab stays in that tab, and marks it unsaved.
    cp.select("optimizer")
    cp.field("lr").fill("0.3")
    cp.field("lr").press("Enter")
    cp.page.wait_for_selector(f".cv-tab[data-tab-id='{a}'] .cv-tab-dirty")
    cp.js("(id) => window.cduiCanvas.tabs.get(id).options.persist_weights = true", a)
    # Rename by double-click.
    cp.page.dblclick(f".cv-tab[data-tab-id='{b}'] .cv-tab-button")
    cp.page.fill(".cv-tab-rename", "my hook")
    cp.page.press(".cv-tab-rename", "Enter")
    cp.page.wait_for_selector(f".cv-tab[data-tab-id='{b}'] .cv-tab-name:has-text('my hook')")
    # The autosave reaches storage without any flush (waited for, not timed).
    cp.page.wait_for_function("(id) => (localStorage.getItem('cdui-canvas:tab:' + id) || '').includes('0.3')", arg=a)
    cp.reload()
    tabs = cp.js("() => window.cduiCanvas.tabs.list().map((t) => [t.tabId, t.name, t.options.persist_weights])")
    assert tabs == [[first, "Untitled", False], [a, "iris", True], [b, "my hook", False]]
    # The double-click selected the hook tab: it is still the one shown.
    assert cp.js("() => window.cduiCanvas.tabs.active().tabId") == b
    assert cp.graph() == hook
    cp.js("(id) => window.cduiCanvas.tabs.select(id)", a)
    edited = copy.deepcopy(iris)
    params_of(edited, "optimizer")["lr"] = 0.3
    assert cp.graph() == edited
    assert cp.page.locator(f".cv-tab[data-tab-id='{a}'] .cv-tab-dirty").count() == 1
    # Close a tab: gone after a reload too; closing the last leaves one empty tab.
    cp.page.click(f".cv-tab[data-tab-id='{b}'] .cv-tab-close")
    cp.page.wait_for_selector(f".cv-tab[data-tab-id='{b}']", state="detached")
    cp.reload()
    assert cp.js("() => window.cduiCanvas.tabs.list().map((t) => t.tabId)") == [first, a]
    assert not [k for k in cp.stored() if b in k]
    cp.page.click(f".cv-tab[data-tab-id='{first}'] .cv-tab-close")
    cp.page.click(f".cv-tab[data-tab-id='{a}'] .cv-tab-close")
    cp.page.wait_for_function("() => window.cduiCanvas.tabs.list().length === 1")
    assert cp.js("() => window.cduiCanvas.tabs.active().tabId") not in (first, a)
    # Tab ids are what the canvas backend accepts.
    assert cp.js("() => /^[A-Za-z0-9_-]{1,64}$/.test(window.cduiCanvas.tabs.active().tabId)")
    cp.close()


def test_save_reload_open_import_export(server, browser, tmp_path):
    cp = CanvasPage(browser, server)
    iris = example("iris_train.json")
    cp.open(iris, "iris example")
    # Save as through the dialog: a bad name is refused with the rule, a good one is written.
    cp.page.click("#cv-save-as")
    assert cp.page.input_value("#cv-save-name") == "iris-example"
    cp.page.fill("#cv-save-name", "bad name!")
    cp.page.click("#cv-save-confirm")
    cp.page.wait_for_selector("#cv-save-error:has-text('is not a graph name')")
    cp.page.fill("#cv-save-name", "iris-canvas")
    cp.page.click("#cv-save-confirm")
    cp.page.wait_for_selector(".cv-file-status:has-text('Saved to data/graphs/iris-canvas.json')")
    assert server.call("GET", "/api/graphs/iris-canvas", expect=200) == iris
    # Ctrl+S (the editor's keyboard code sends canvas-save) saves an edit under the same name.
    cp.select("train")
    cp.field("epochs").fill("7")
    cp.field("epochs").press("Enter")
    cp.page.wait_for_selector(".cv-tab.active .cv-tab-dirty")
    cp.js("() => window.dispatchEvent(new Event('canvas-save'))")
    cp.page.wait_for_selector(".cv-tab.active:not(:has(.cv-tab-dirty))")
    saved = server.call("GET", "/api/graphs/iris-canvas", expect=200)
    assert params_of(saved, "train")["epochs"] == 7
    # Ctrl+S pressed in a field whose new value is not committed yet saves that value.
    cp.field("epochs").fill("8")
    cp.field("epochs").press("Control+s")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('train').params.epochs === 8")
    cp.page.wait_for_selector(".cv-tab.active:not(:has(.cv-tab-dirty))")
    saved = server.call("GET", "/api/graphs/iris-canvas", expect=200)
    assert params_of(saved, "train")["epochs"] == 8
    # Reload, then Open: the same graph in a new tab.
    cp.reload()
    cp.page.click("#cv-open")
    cp.page.click("#cv-open-list button[aria-label='Open graph iris-canvas']")
    cp.page.wait_for_selector(".cv-file-status:has-text('Opened data/graphs/iris-canvas.json')")
    assert cp.graph() == saved
    assert cp.js("() => window.cduiCanvas.tabs.active().savedAs") == "iris-canvas"
    # Import a CodefyUI export: from a file, and pasted; a file that is not a graph is refused.
    src = sorted(EXAMPLES.glob("*.graph.json"))
    assert len(src) == 29, EXAMPLES
    gfile = src[0]
    before = cp.js("() => window.cduiCanvas.tabs.list().length")
    cp.page.click("#cv-import")
    cp.page.set_input_files("#cv-import-file", str(gfile))
    cp.page.click("#cv-import-confirm")
    cp.page.wait_for_function("(n) => window.cduiCanvas.tabs.list().length === n + 1", arg=before)
    assert cp.graph() == json.loads(gfile.read_text())
    pasted = json.loads(src[1].read_text())
    cp.page.click("#cv-import")
    cp.page.fill("#cv-import-text", json.dumps(pasted))
    cp.page.click("#cv-import-confirm")
    cp.page.wait_for_function("(n) => window.cduiCanvas.tabs.list().length === n + 2", arg=before)
    assert cp.graph() == pasted
    assert cp.js("() => window.cduiCanvas.tabs.active().name") == pasted["name"]
    junk = tmp_path / "notes.json"
    junk.write_text('{"hello": 1}')
    cp.page.click("#cv-import")
    cp.page.set_input_files("#cv-import-file", str(junk))
    cp.page.click("#cv-import-confirm")
    cp.page.wait_for_selector("#cv-import-error:has-text('notes.json is not a graph: it has no \"nodes\" list')")
    cp.page.fill("#cv-import-text", "{not json")
    cp.page.set_input_files("#cv-import-file", [])
    cp.page.click("#cv-import-confirm")
    cp.page.wait_for_selector("#cv-import-error:has-text('the pasted text is not JSON')")
    cp.page.keyboard.press("Escape")
    assert cp.js("() => window.cduiCanvas.tabs.list().length") == before + 2
    # Export: the tab's JSON as a download.
    with cp.page.expect_download() as dl:
        cp.page.click("#cv-export")
    assert dl.value.suggested_filename.endswith(".json")
    assert json.loads(open(dl.value.path()).read()) == pasted
    cp.close()


def test_each_tab_has_its_own_undo_and_paste_crosses_tabs(server, browser):
    cp = CanvasPage(browser, server)
    iris = example("iris_train.json")
    a = cp.open(iris, "a")
    cp.select("optimizer")
    cp.field("lr").fill("0.4")
    cp.field("lr").press("Enter")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('optimizer').params.lr === 0.4")
    b = cp.open(iris, "b")
    cp.select("train")
    cp.field("epochs").fill("9")
    cp.field("epochs").press("Enter")
    cp.page.wait_for_function("() => window.cduiCanvas.editor().node('train').params.epochs === 9")
    # Undo in b takes back b's edit only; a keeps its own.
    cp.js("() => window.cduiCanvas.editor().undo()")
    assert params_of(cp.graph(), "train")["epochs"] == params_of(iris, "train")["epochs"]
    assert params_of(cp.graph(), "optimizer")["lr"] == params_of(iris, "optimizer")["lr"]
    cp.js("(id) => window.cduiCanvas.tabs.select(id)", a)
    assert params_of(cp.graph(), "optimizer")["lr"] == 0.4
    # Copy in a, paste in b: the node (with a's value) lands in b, a is unchanged.
    assert cp.js("() => { const e = window.cduiCanvas.editor(); e.select(['optimizer']); return e.copy(); }") == 1
    cp.js("(id) => window.cduiCanvas.tabs.select(id)", b)
    pasted = cp.js("() => window.cduiCanvas.editor().paste()")
    assert pasted == ["optimizer-copy"]
    got = cp.graph()
    assert params_of(got, "optimizer-copy")["lr"] == 0.4
    assert len(got["nodes"]) == len(iris["nodes"]) + 1
    # The panel follows the pasted node (the editor selects it) and b is autosaved with it.
    cp.page.wait_for_selector(".cv-panel-node[data-node-id='optimizer-copy']")
    cp.page.wait_for_function("(id) => (localStorage.getItem('cdui-canvas:tab:' + id) || '')"
                              ".includes('optimizer-copy')", arg=b)
    cp.js("(id) => window.cduiCanvas.tabs.select(id)", a)
    assert len(cp.graph()["nodes"]) == len(iris["nodes"])
    cp.close()
