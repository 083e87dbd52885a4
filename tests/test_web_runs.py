"""The runs page's runs, driven in a real Chromium against a real server with real runs: the run view
opens in sight (after a click, a ``#run=`` link, Back and Forward), the list searches, filters and pages
with ``after=``, tags and notes set in the page are what `cdui runs list --tag` finds, a clone with edited
params queues the edited graph, repeated log lines collapse, and ticked runs open the comparison page."""
from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from canvas_page import LONG, module_fixtures
from procs import REPO_ROOT, ServerProc, graph, load_example, node, trig, wait_run

pytestmark = pytest.mark.e2e

# A node that logs one line ``count`` times (and fails on request): a run with a repeated log line.
REPEAT = '''
from cdui.nodes.base import Node, Param, Port


class RepeatLog(Node):
    """Logs ``line`` ``count`` times, then fails when ``fail`` is on."""
    NODE_NAME = "RepeatLog"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("count", "int", 3, min_value=1, max_value=1000), Param("line", "string", "same line"),
                Param("fail", "bool", False)]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        for _ in range(int(params["count"])):
            ctx.log(params["line"])
        ctx.log("finished repeating")
        if params["fail"]:
            raise ValueError(params["line"])
        return {"value": 1.0}
'''

server, browser = module_fixtures("web-runs", custom_nodes={"repeat_log.py": REPEAT})
BULK = 55  # more than a page (50) of the list
LONG_PATH = "/srv/lab/experiments/2026-12/iris-long-folder-name/model.pt"


def repeat_graph(name: str, count: int = 3, fail: bool = False, line: str = "same line") -> dict[str, Any]:
    return graph([node("start", "Start"), node("rep", "RepeatLog", count=count, line=line, fail=fail)],
                 [trig("start", "rep")], name=name)


def short_iris(epochs: int = 2) -> dict[str, Any]:
    g = load_example()
    g["name"] = "iris-short"
    for n in g["nodes"]:
        if n["id"] == "train":
            n["data"]["params"]["epochs"] = epochs
    return g


@pytest.fixture(scope="module")
def runs(server: ServerProc) -> dict[str, Any]:
    """The oldest run repeats a line 37 times; then a failed run, BULK queued-then-cancelled runs (every
    other one queued for ``any``), and the newest, a succeeded run."""
    out: dict[str, Any] = {}
    out["alpha"] = server.submit(repeat_graph("repeat-alpha", count=37, line="the same line again"))["id"]
    wait_run(server, out["alpha"], {"succeeded"})
    failing = repeat_graph("repeat-fails", fail=True, line=f"failed on purpose at {LONG_PATH}")
    out["failed"] = server.submit(failing)["id"]
    wait_run(server, out["failed"], {"failed"})
    out["bulk"] = []
    for i in range(BULK):
        # Queued for a device this server lacks: they wait, and stop ends them cancelled at once.
        options = {"device": "cuda", "target": "any" if i % 2 else "local"}
        rid = server.submit(repeat_graph(f"bulk-{i:02d}"), options)["id"]
        server.call("POST", f"/api/runs/{rid}/stop")
        out["bulk"].append(rid)
    out["beta"] = server.submit(repeat_graph("repeat-beta"))["id"]
    wait_run(server, out["beta"], {"succeeded"})
    return out


@pytest.fixture
def page(browser: Any, server: ServerProc) -> Iterator[Any]:
    errors: list[str] = []
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    p = context.new_page()
    p.set_default_timeout(LONG)
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    p.goto(server.url + "/")
    p.wait_for_selector("#server-status.ok")
    yield p
    assert not errors, errors
    context.close()


def shown_ids(page: Any) -> list[str]:
    return page.eval_on_selector_all("#runs-body tr", "els => els.map(e => e.dataset.runId)")


def wait_rows(page: Any, want: list[str]) -> None:
    """Wait until the list shows exactly these runs, in this order."""
    page.wait_for_function("want => JSON.stringify([...document.querySelectorAll('#runs-body tr')]"
                           ".map(e => e.dataset.runId)) === JSON.stringify(want)", arg=want)


def in_view(page: Any, selector: str) -> bool:
    return page.eval_on_selector(selector, "el => { const r = el.getBoundingClientRect();"
                                 " return r.height > 0 && r.top >= 0 && r.bottom <= innerHeight; }")


def newest_first(server: ServerProc, **query: str) -> list[str]:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return [r["id"] for r in server.call("GET", f"/api/runs?limit=1000&{q}", expect=200)]


def test_run_view_opens_in_sight_from_a_click_a_link_and_history(server, runs, page):
    first_page = newest_first(server)[:50]
    wait_rows(page, first_page)
    # The last row of the page, reached by scrolling down the list: the run view opens in sight.
    last = first_page[-1]
    page.eval_on_selector(f"#runs-body tr[data-run-id='{last}']", "el => el.scrollIntoView({block: 'end'})")
    assert page.evaluate("() => scrollY") > 300  # the list is longer than the window
    page.click(f"#runs-body tr[data-run-id='{last}'] button.link")
    page.wait_for_selector(f"#detail-title:has-text('Run {last}')")
    assert in_view(page, "#detail-title") and in_view(page, "#detail-facts")
    assert page.evaluate("() => location.hash") == f"#run={last}"
    # Another run, then Back and Forward: each opens the run its address names.
    page.click(f"#runs-body tr[data-run-id='{runs['beta']}'] button.link")
    page.wait_for_selector(f"#detail-title:has-text('Run {runs['beta']}')")
    page.go_back()
    page.wait_for_selector(f"#detail-title:has-text('Run {last}')")
    assert page.evaluate("() => location.hash") == f"#run={last}"
    page.go_forward()
    page.wait_for_selector(f"#detail-title:has-text('Run {runs['beta']}')")
    # Close: the view goes and the address names no run.
    page.click("#btn-detail-close")
    page.wait_for_selector("#detail", state="hidden")
    assert page.evaluate("() => location.hash") == ""
    # A link to a run that is not on the first page opens it directly, in sight.
    assert runs["alpha"] not in first_page
    page.goto(f"{server.url}/#run={runs['alpha']}")
    page.wait_for_selector(f"#detail-title:has-text('Run {runs['alpha']} — repeat-alpha')")
    page.wait_for_selector("#detail-facts .badge.status-succeeded")
    assert in_view(page, "#detail-title")


def test_run_view_in_sight_on_a_narrow_window(server, runs, browser):
    """Below 1000 px the columns stack: the page scrolls to the run view."""
    context = browser.new_context(viewport={"width": 900, "height": 800})
    try:
        page = context.new_page()
        page.set_default_timeout(LONG)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        last = newest_first(server)[49]
        page.wait_for_selector(f"#runs-body tr[data-run-id='{last}']")
        page.click(f"#runs-body tr[data-run-id='{last}'] button.link")
        page.wait_for_selector(f"#detail-title:has-text('Run {last}')")
        page.wait_for_function("() => { const r = document.getElementById('detail-title').getBoundingClientRect();"
                               " return r.top >= 0 && r.bottom <= innerHeight; }")
        assert not errors, errors
    finally:
        context.close()


def test_search_filters_and_paging(server, runs, page):
    every = newest_first(server)
    assert len(every) == BULK + 3
    wait_rows(page, every[:50])
    assert page.is_visible("#btn-more")
    # More runs: the next page (?after= the last shown) reaches the oldest run.
    with page.expect_request(lambda r: "/api/runs?" in r.url and f"after={every[49]}" in r.url):
        page.click("#btn-more")
    wait_rows(page, every)
    assert page.is_hidden("#btn-more")
    assert f"{len(every)} runs shown" in page.inner_text("#runs-count")

    # Search by name, by id, by error text.
    page.fill("#runs-search", "bulk-07")
    wait_rows(page, [runs["bulk"][7]])
    page.fill("#runs-search", runs["alpha"])
    wait_rows(page, [runs["alpha"]])
    page.fill("#runs-search", "failed on purpose")
    wait_rows(page, [runs["failed"]])
    # A row's error breaks only between words; its long path is cut to its end, whole in its tooltip and
    # in what the copy button copies (which does not open the run).
    info = f"#runs-body tr[data-run-id='{runs['failed']}'] td.info"
    assert page.eval_on_selector(info, "el => [getComputedStyle(el).overflowWrap, getComputedStyle(el).wordBreak]"
                                 ) == ["normal", "normal"]
    assert page.inner_text(f"{info} .cut") == "…/iris-long-folder-name/model.pt"
    assert page.get_attribute(f"{info} .cut", "title") == LONG_PATH
    assert server.call("GET", f"/api/runs/{runs['failed']}")["error"].endswith(f"failed on purpose at {LONG_PATH}")
    page.click(f"{info} button.copy")
    assert page.evaluate("() => navigator.clipboard.readText()") == LONG_PATH
    assert page.is_hidden("#detail")
    page.fill("#runs-search", "no run is called this")
    page.wait_for_selector("#runs-none:not([hidden])")
    page.click("#btn-filter-clear2")
    wait_rows(page, every[:50])

    # Filters: status, worker (where it ran), target (where it was queued), and a search with one.
    page.select_option("#filter-status", "failed")
    wait_rows(page, [runs["failed"]])
    page.select_option("#filter-status", "succeeded")
    wait_rows(page, [runs["beta"], runs["alpha"]])
    page.select_option("#filter-status", "")
    page.select_option("#filter-worker", "local")
    wait_rows(page, [runs["beta"], runs["failed"], runs["alpha"]])
    page.select_option("#filter-worker", "")
    page.select_option("#filter-target", "any")
    wanted_any = [rid for i, rid in reversed(list(enumerate(runs["bulk"]))) if i % 2]
    assert wanted_any == newest_first(server, target="any")
    wait_rows(page, wanted_any)
    page.fill("#runs-search", "bulk-1")  # bulk-10 .. bulk-19, of which the odd ones went to any
    wait_rows(page, [runs["bulk"][i] for i in (19, 17, 15, 13, 11)])
    page.click("#btn-filter-clear")
    wait_rows(page, every[:50])
    assert page.input_value("#runs-search") == "" and page.input_value("#filter-target") == ""


def test_tags_and_note_from_the_page_are_found_by_the_cli(server, runs, page):
    beta = runs["beta"]
    page.click(f"#runs-body tr[data-run-id='{beta}'] button.link")
    page.wait_for_selector(f"#detail-title:has-text('Run {beta}')")
    # A tag the server refuses: its message, nothing changed.
    page.fill("#run-tags", "keep bad!tag")
    page.click("#btn-save-tags")
    page.wait_for_selector("#tags-result.error-text")
    assert "bad!tag" in page.inner_text("#tags-result")
    assert server.call("GET", f"/api/runs/{beta}")["tags"] == []
    page.fill("#run-tags", "keep, lr:0.05 keep")
    page.fill("#run-note", "best so far")
    page.click("#btn-save-tags")
    page.wait_for_selector("#tags-result:has-text('Saved: tags keep, lr:0.05.')")
    run = server.call("GET", f"/api/runs/{beta}")
    assert (run["tags"], run["note"]) == (["keep", "lr:0.05"], "best so far")
    row = f"#runs-body tr[data-run-id='{beta}']"
    page.wait_for_selector(f"{row} button.tag:has-text('lr:0.05')")
    assert page.inner_text(f"{row} .note") == "best so far"

    # bin/cdui, with the server's own user data, finds it by the tag.
    r = subprocess.run([str(REPO_ROOT / "bin" / "cdui"), "runs", "list", "--tag", "keep", "--json"], env=server.env,
                       cwd=str(REPO_ROOT), text=True, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [x["id"] for x in json.loads(r.stdout)] == [beta]

    # The page filters by it (a click on the tag) and finds the note by search.
    page.click(f"{row} button.tag:has-text('keep')")
    wait_rows(page, [beta])
    assert page.input_value("#filter-tag") == "keep"
    page.fill("#filter-tag", "")
    page.dispatch_event("#filter-tag", "change")
    page.fill("#runs-search", "best so far")
    wait_rows(page, [beta])


def test_clone_with_edited_params_queues_the_edited_graph(server, runs, page):
    orig = server.submit(short_iris(), {"target": "local", "device": "cpu"})["id"]
    page.goto(f"{server.url}/#run={orig}")
    page.wait_for_selector(f"#detail-title:has-text('Run {orig}')")
    page.click("#btn-clone")
    page.wait_for_selector("#clone-form [data-param='train.epochs']")
    assert page.input_value("#clone-form [data-param='train.epochs']") == "2"
    assert page.input_value("#clone-form [data-param='optimizer.lr']") == "0.01"
    # The select of a declared choice offers its options.
    assert "SGD" in page.eval_on_selector_all("#clone-form [data-param='optimizer.type'] option",
                                              "els => els.map(e => e.value)")
    # Bad values: nothing is queued, each says what is wrong.
    before = len(newest_first(server))
    page.fill("#clone-form [data-param='train.epochs']", "0")
    page.fill("#clone-form [data-param='optimizer.lr']", "fast")
    page.click("#btn-clone-submit")
    page.wait_for_selector("#clone-errors li")
    errors = page.eval_on_selector_all("#clone-errors li", "els => els.map(e => e.textContent)")
    assert errors == ['optimizer.lr: "fast" is not a number; give a number (at least 0), e.g. 0.001',
                      "train.epochs: 0 is below its minimum 1; give a whole number (at least 1)"], errors
    assert page.get_attribute("#clone-form [data-param='train.epochs']", "aria-invalid") == "true"
    assert len(newest_first(server)) == before
    # Good values: the clone is queued with them and opens.
    page.fill("#clone-form [data-param='train.epochs']", "3")
    page.fill("#clone-form [data-param='optimizer.lr']", "0.05")
    page.select_option("#clone-target", "local")
    page.click("#btn-clone-submit")
    page.wait_for_function("orig => /^#run=/.test(location.hash) && location.hash !== '#run=' + orig", arg=orig)
    new = page.evaluate("() => decodeURIComponent(location.hash.slice(5))")
    page.wait_for_selector(f"#detail-title:has-text('Run {new}')")
    assert in_view(page, "#detail-title")
    stored = server.call("GET", f"/api/runs/{new}/graph")["graph"]
    want = copy.deepcopy(server.call("GET", f"/api/runs/{orig}/graph")["graph"])
    for n in want["nodes"]:
        if n["id"] == "train":
            n["data"]["params"]["epochs"] = 3
        if n["id"] == "optimizer":
            n["data"]["params"]["lr"] = 0.05
    assert stored == want  # the two edits, and nothing else changed
    assert server.call("GET", f"/api/runs/{new}")["target"] == "local"
    for rid in (orig, new):
        server.call("POST", f"/api/runs/{rid}/stop")


def test_the_clone_form_shows_a_param_only_when_its_visible_when_holds(server, runs, page):
    """Conv2dKernel's kernel_size and weights apply to its Custom preset only: the form hides them for a
    preset filter, shows them once Custom is picked, and a clone with Custom queues the edited values."""
    g = graph([node("start", "Start"), node("k", "Conv2dKernel", preset="Sharpen3x3")], [trig("start", "k")],
              name="kernel")
    orig = server.submit(g, {"target": "local", "device": "cpu"})["id"]
    wait_run(server, orig, {"succeeded"})
    page.goto(f"{server.url}/#run={orig}")
    page.wait_for_selector(f"#detail-title:has-text('Run {orig}')")
    page.click("#btn-clone")
    page.wait_for_selector("#clone-form [data-param='k.preset']")
    shown = "sel => !document.querySelector(sel).closest('.clone-field').hidden"
    assert page.evaluate(shown, "#clone-form [data-param='k.preset']") is True
    for name in ("kernel_size", "weights"):
        assert page.evaluate(shown, f"#clone-form [data-param='k.{name}']") is False, name
    page.select_option("#clone-form [data-param='k.preset']", "Custom")
    for name in ("kernel_size", "weights"):
        assert page.evaluate(shown, f"#clone-form [data-param='k.{name}']") is True, name
    page.fill("#clone-form [data-param='k.kernel_size']", "2")
    page.fill("#clone-form [data-param='k.weights']", "[[1, 0], [0, 1]]")
    page.select_option("#clone-target", "local")
    page.click("#btn-clone-submit")
    page.wait_for_function("orig => /^#run=/.test(location.hash) && location.hash !== '#run=' + orig", arg=orig)
    new = page.evaluate("() => decodeURIComponent(location.hash.slice(5))")
    stored = {n["id"]: n for n in server.call("GET", f"/api/runs/{new}/graph")["graph"]["nodes"]}
    assert stored["k"]["data"]["params"] == {"preset": "Custom", "kernel_size": 2, "weights": [[1, 0], [0, 1]]}
    assert wait_run(server, new, {"succeeded", "failed"})["status"] == "succeeded"


def test_repeated_log_lines_collapse(server, runs, page):
    alpha = runs["alpha"]
    page.goto(f"{server.url}/#run={alpha}")
    page.wait_for_selector("#log li.ev-status:has-text('succeeded')")
    events = server.events(alpha)
    same = [e for e in events if e["kind"] == "log" and e["data"].get("message") == "the same line again"]
    assert len(same) == 37
    rows = page.locator("#log li:has-text('the same line again')")
    assert rows.count() == 1
    assert rows.locator(".repeat").inner_text() == "× 37"
    assert (rows.get_attribute("data-seq"), rows.get_attribute("data-last-seq")) == (
        str(same[0]["seq"]), str(same[-1]["seq"]))
    # Every other event keeps its own row: the rows are the events, the 36 repeats folded in.
    seqs = page.eval_on_selector_all("#log li", "els => els.map(e => Number(e.dataset.seq))")
    assert seqs == [e["seq"] for e in events if e not in same[1:]]


def test_ticked_runs_open_the_comparison_page(server, runs, page):
    a, b = runs["beta"], runs["alpha"]
    wait_rows(page, newest_first(server)[:50])
    assert page.is_disabled("#btn-compare")
    page.check(f"#runs-body tr[data-run-id='{a}'] input.pick-run")
    assert page.is_disabled("#btn-compare")
    assert page.is_hidden("#detail")  # ticking a row does not open it
    page.fill("#runs-search", "repeat-alpha")
    wait_rows(page, [b])
    page.check(f"#runs-body tr[data-run-id='{b}'] input.pick-run")
    assert page.inner_text("#btn-compare") == "Compare (2)" and page.is_enabled("#btn-compare")
    # The comparison page is its own (compare.html); here only the address it is opened with matters.
    page.route("**/web/compare.html*", lambda route: route.fulfill(
        status=200, content_type="text/html", body="<!doctype html><title>compare</title>"))
    page.click("#btn-compare")
    page.wait_for_url(f"**/web/compare.html?runs={a},{b}")
    assert page.evaluate("() => location.pathname + location.search") == f"/web/compare.html?runs={a},{b}"
