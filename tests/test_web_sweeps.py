"""Sweeps in the page, driven in a real Chromium against a real server that trains iris with torch:
"New sweep" from a run's view counts the variants before it starts (a list axis and a range axis, 2×2
grid), starts the sweep and opens its page, where the variants' table fills while they run, the best
is highlighted, a column's title sorts the table, each param's scatter has a point per variant and the
parallel-coordinates view a line per variant. A bad value shows the server's list of errors in the form
and stores nothing. In list mode the variants are written out and edited as JSON; the canvas's New sweep…
opens the same form on the tab's graph, its target the one chosen in Queue on…."""
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from canvas_page import LONG, CanvasPage, module_fixtures
from procs import ServerProc, load_example, long_training_graph, wait_run

pytestmark = pytest.mark.e2e

server, browser = module_fixtures("web-sweeps")

# The docs' screenshot: CDUI_WRITE_SCREENSHOTS=1 writes it into docs/img/, otherwise into /tmp.
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "img" if os.environ.get("CDUI_WRITE_SCREENSHOTS") == "1" \
    else Path("/tmp/cdui-web-shots")


@pytest.fixture(scope="module")
def seed(server: ServerProc) -> str:
    """A finished run of iris with one epoch: the graph the sweeps start from."""
    g = load_example()
    g["name"] = "iris-seed"
    for n in g["nodes"]:
        if n["id"] == "train":
            n["data"]["params"]["epochs"] = 1
    rid: str = server.submit(g, {"target": "local"})["id"]
    assert wait_run(server, rid)["status"] == "succeeded", server.events(rid)[-5:]
    return rid


@pytest.fixture
def page(browser: Any, server: ServerProc) -> Iterator[Any]:
    errors: list[str] = []
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.set_default_timeout(LONG)
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    yield p
    assert not errors, errors
    context.close()


def open_form(page: Any, server: ServerProc, run_id: str) -> None:
    page.goto(f"{server.url}/#run={run_id}")
    page.wait_for_selector(f"#detail-title:has-text('Run {run_id}')")
    page.click("#btn-sweep")
    page.wait_for_selector("#sweep-form")


def axis(page: Any, key: str, values: str) -> None:
    page.check(f"#sweep-form input[type=checkbox][data-param='{key}']")
    page.fill(f"#sweep-form input[type=text][data-param='{key}']", values)


def test_a_bad_value_shows_the_servers_errors_and_stores_nothing(server, seed, page):
    before = server.call("GET", "/api/sweeps")["sweeps"]
    open_form(page, server, seed)
    axis(page, "optimizer.lr", "0.01,-1")
    axis(page, "train.epochs", "1,0")
    assert page.text_content("#sweep-count") == "4 variants"
    page.select_option("#sweep-target", "local")
    page.click("#btn-sweep-submit")
    page.wait_for_selector("#sweep-errors li")
    errors = page.eval_on_selector_all("#sweep-errors li", "els => els.map(e => e.textContent)")
    assert len(errors) == 2, errors
    assert any("lr" in e and "-1" in e for e in errors), errors
    assert any("epochs" in e for e in errors), errors
    assert "nothing was stored" in page.text_content("#sweep-result")
    assert server.call("GET", "/api/sweeps")["sweeps"] == before
    # A list sweep whose axes differ in length is counted as an error before anything is sent.
    page.select_option("#sweep-mode", "list")
    axis(page, "train.epochs", "1")
    assert "every axis has as many values" in page.text_content("#sweep-count")
    # A distribution is for random mode, which draws as many variants as asked.
    axis(page, "optimizer.lr", "loguniform(0.001,0.1)")
    assert "is for random mode" in page.text_content("#sweep-count")
    page.select_option("#sweep-mode", "random")
    page.fill("#sweep-draws", "5")
    page.fill("#sweep-seed", "7")
    assert page.text_content("#sweep-count") == "5 variants"


def test_a_random_sweep_from_the_form_draws_its_variants(server, seed, page):
    """Aimed at the one-shot pool, which has no agent here: the variants wait, and the sweep is stopped."""
    open_form(page, server, seed)
    axis(page, "optimizer.lr", "loguniform(0.001,0.1)")
    axis(page, "train.epochs", "1,2,3")
    page.select_option("#sweep-mode", "random")
    page.fill("#sweep-draws", "6")
    page.fill("#sweep-seed", "3")
    page.select_option("#sweep-target", "one-shot")
    assert page.text_content("#sweep-count") == "6 variants"
    page.click("#btn-sweep-submit")
    page.wait_for_url("**/web/sweep.html?id=*")
    sweep_id = page.evaluate("() => new URLSearchParams(location.search).get('id')")
    sweep = server.call("POST", f"/api/sweeps/{sweep_id}/stop")
    assert (sweep["mode"], sweep["seed"], sweep["total"]) == ("random", 3, 6), sweep
    for v in sweep["variants"]:
        assert 0.001 <= v["params"]["optimizer.lr"] <= 0.1 and v["params"]["train.epochs"] in (1, 2, 3), v
    page.wait_for_selector("#variants tbody tr")
    assert len(page.query_selector_all("#variants tbody tr")) == 6


def test_new_sweep_opens_its_view_with_table_and_plots(server, seed, page):
    open_form(page, server, seed)
    axis(page, "optimizer.lr", "0.003,0.05")
    axis(page, "train-loader.batch_size", "16:32:16")
    page.select_option("#sweep-mode", "grid")
    page.fill("#sweep-max-running", "2")
    page.fill("#sweep-objective", "val_loss")
    page.select_option("#sweep-goal", "min")
    page.select_option("#sweep-target", "local")
    assert page.text_content("#sweep-count") == "4 variants"
    page.click("#btn-sweep-submit")
    page.wait_for_url("**/web/sweep.html?id=*")
    sweep_id = page.evaluate("() => new URLSearchParams(location.search).get('id')")
    page.wait_for_selector("#variants tbody tr")
    assert len(page.query_selector_all("#variants tbody tr")) == 4
    # The page reads the sweep again while it runs, until every variant ends.
    page.wait_for_selector("body[data-sweep-status='finished']")
    sweep = server.call("GET", f"/api/sweeps/{sweep_id}")
    assert sweep["max_running"] == 2 and sweep["options"]["target"] == "local", sweep
    assert [v["status"] for v in sweep["variants"]] == ["succeeded"] * 4, sweep["variants"]
    assert sorted((v["params"]["optimizer.lr"], v["params"]["train-loader.batch_size"]) for v in sweep["variants"]) == \
        [(0.003, 16), (0.003, 32), (0.05, 16), (0.05, 32)]
    best = sweep["best"]["index"]
    page.wait_for_selector("#variants tbody tr.best")
    assert page.eval_on_selector_all("#variants tbody tr.best", "rs => rs.map(r => r.dataset.variant)") == [str(best)]
    # One scatter per param, a point per variant; a line per variant across the params and the objective.
    for key in ("optimizer.lr", "train-loader.batch_size"):
        assert len(page.query_selector_all(f"#scatters figure[data-param='{key}'] circle.pt")) == 4, key
        assert len(page.query_selector_all(f"#scatters figure[data-param='{key}'] circle.pt.best")) == 1, key
    assert len(page.query_selector_all("#scatters figure")) == 2
    assert len(page.query_selector_all("#parallel polyline.pc-line")) == 4
    assert page.get_attribute("#parallel polyline.pc-line.best", "data-variant") == str(best)
    # Sorting by the objective puts the best first (min), then last when pressed again.
    page.click("#variants th[data-col='objective'] button")
    order = page.eval_on_selector_all("#variants tbody tr", "rs => rs.map(r => r.dataset.variant)")
    by_obj = sorted(sweep["variants"], key=lambda v: v["objective"])
    assert order == [str(v["index"]) for v in by_obj], (order, by_obj)
    page.click("#variants th[data-col='objective'] button")
    assert page.eval_on_selector_all("#variants tbody tr", "rs => rs.map(r => r.dataset.variant)") == order[::-1]
    # A finished sweep: nothing to stop, nothing to retry.
    assert page.is_disabled("#btn-sweep-stop") and page.is_disabled("#btn-sweep-retry")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "sweep.png"), full_page=True)
    # The list of sweeps links to it, and a variant's run links back to its sweep.
    page.goto(f"{server.url}/web/sweep.html")
    page.wait_for_selector(f"#sweeps-body tr[data-sweep='{sweep_id}']")
    run_id = sweep["variants"][0]["run_id"]
    page.goto(f"{server.url}/")
    page.wait_for_selector(f"#runs-body tr[data-run-id='{run_id}'] a.sweep-link[href='/web/sweep.html?id={sweep_id}']")
    page.goto(f"{server.url}/#run={run_id}")
    page.wait_for_selector("#run-sweep-link")
    assert page.get_attribute("#run-sweep-link", "href") == f"/web/sweep.html?id={sweep_id}"
    page.click("#run-sweep-link")
    page.wait_for_selector("body[data-sweep-status='finished']")


def test_the_view_polls_only_while_running_and_visible_and_stops_and_retries(server, page):
    """A sweep of a graph that trains (practically) for ever, one variant at a time: it keeps running."""
    g = long_training_graph()
    sweep = server.call("POST", "/api/sweeps", {"graph": g, "axes": {"optimizer.lr": [0.1, 0.01]},
                                                "options": {"target": "local"}, "max_running": 1}, expect=201)
    assert sweep["status"] == "running", sweep
    page.goto(f"{server.url}/web/sweep.html#sweep={sweep['id']}")
    page.wait_for_selector("body[data-sweep-status='running'][data-polling='1']")
    statuses = page.eval_on_selector_all("#variants tbody tr", "rs => rs.map(r => r.dataset.status)")
    assert sorted(statuses)[1] == "waiting" and sorted(statuses)[0] in ("queued", "running"), statuses
    assert page.is_enabled("#btn-sweep-stop") and page.is_disabled("#btn-sweep-retry")
    # A hidden page reads nothing; shown again, it reads the sweep and goes on.
    page.evaluate("() => { Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});"
                  " document.dispatchEvent(new Event('visibilitychange')); }")
    page.wait_for_selector("body[data-polling='0']")
    page.evaluate("() => { Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});"
                  " document.dispatchEvent(new Event('visibilitychange')); }")
    page.wait_for_selector("body[data-polling='1']")
    # Stop: the waiting variant is cancelled and the run stopped; the page follows the sweep until it
    # has stopped, then reads nothing more.
    page.click("#btn-sweep-stop")
    page.wait_for_selector("body[data-sweep-status='stopped'][data-polling='0']")
    statuses = page.eval_on_selector_all("#variants tbody tr", "rs => rs.map(r => r.dataset.status)")
    assert "cancelled" in statuses and not {"queued", "running", "waiting"} & set(statuses), statuses
    assert server.call("GET", f"/api/sweeps/{sweep['id']}")["status"] == "stopped"
    # Retry: the variants wait again (as new runs), the sweep runs and the page polls it again.
    page.click("#btn-sweep-retry")
    page.wait_for_selector("body[data-sweep-status='running'][data-polling='1']")
    assert "Retrying 2 variant(s)" in page.text_content("#sweep-action")
    server.call("POST", f"/api/sweeps/{sweep['id']}/stop")


def test_a_big_sweep_shows_a_bounded_table(server, page):
    """1,056 variants (32 × 33) waiting for a one-shot agent that never comes: the table shows its first
    1,000 rows and says so."""
    g = load_example()
    g["name"] = "iris-big"
    sweep = server.call("POST", "/api/sweeps", {"graph": g, "axes": {"train.epochs": {"range": [1, 32, 1]},
                                                                     "train-loader.batch_size": {"range": [8, 40, 1]}},
                                                "options": {"target": "one-shot"}, "max_running": 1}, expect=201)
    assert sweep["total"] == 32 * 33, sweep["total"]
    try:
        page.goto(f"{server.url}/web/sweep.html?id={sweep['id']}")
        page.wait_for_selector("#variants-more:not([hidden])")
        assert len(page.query_selector_all("#variants tbody tr")) == 1000
        assert "The first 1000 of 1056 variants" in page.text_content("#variants-more")
    finally:
        server.call("POST", f"/api/sweeps/{sweep['id']}/stop")


def test_list_mode_variants_are_written_out_and_edited(server, seed, page):
    """Aimed at the one-shot pool, which has no agent here: nothing trains; the sweep is stopped."""
    open_form(page, server, seed)
    page.select_option("#sweep-mode", "list")
    axis(page, "optimizer.lr", "0.01,0.02")
    axis(page, "train.epochs", "1:2:1")
    assert page.text_content("#sweep-count") == "2 variants"
    page.click("#btn-sweep-variants-fill")
    written = json.loads(page.input_value("#sweep-variants"))
    assert written == [{"optimizer.lr": 0.01, "train.epochs": 1}, {"optimizer.lr": 0.02, "train.epochs": 2}]
    page.fill("#sweep-variants", "[{")
    assert "not JSON" in page.text_content("#sweep-count")
    edited = [*written, {"train.epochs": 3}]  # a variant may set fewer params than the others
    page.fill("#sweep-variants", json.dumps(edited))
    assert page.text_content("#sweep-count") == "3 variants (as written)"
    page.select_option("#sweep-target", "one-shot")
    page.click("#btn-sweep-submit")
    page.wait_for_url("**/web/sweep.html?id=*")
    sweep_id = page.evaluate("() => new URLSearchParams(location.search).get('id')")
    sweep = server.call("POST", f"/api/sweeps/{sweep_id}/stop")
    assert sweep["mode"] == "list" and [v["params"] for v in sweep["variants"]] == edited, sweep


def test_new_sweep_from_the_canvas_takes_the_tabs_graph_and_its_queue_on_target(server, browser):
    """The tab's graph as edited there (3 epochs, unsaved), aimed at the one-shot pool chosen in Queue on…
    (no agent: nothing trains; the sweep is stopped)."""
    p = CanvasPage(browser, server, height=1000)
    g = load_example()
    next(n for n in g["nodes"] if n["id"] == "train")["data"]["params"]["epochs"] = 3
    p.open(g, "iris tab")
    p.page.select_option("#canvas-queue-target", "one-shot")
    p.page.click("#canvas-sweep")
    p.page.wait_for_selector("#canvas-newsweep #sweep-form")
    assert p.page.get_attribute("#canvas-sweep", "aria-expanded") == "true"
    assert p.page.input_value("#sweep-target") == "one-shot"
    assert "iris tab" in p.page.text_content("#sweep-form h3")
    axis(p.page, "optimizer.lr", "0.1,0.01")
    assert p.page.text_content("#sweep-count") == "2 variants"
    p.page.click("#btn-sweep-submit")
    p.page.wait_for_selector("#canvas-sweep-link")
    assert p.page.is_hidden("#canvas-newsweep")
    sweep_id = (p.page.get_attribute("#canvas-sweep-link", "href") or "").removeprefix("/web/sweep.html?id=")
    sweep = server.call("POST", f"/api/sweeps/{sweep_id}/stop")
    assert sweep["options"]["target"] == {"pool": "one-shot"} and sweep["total"] == 2, sweep
    for v in sweep["variants"]:
        graph = server.call("GET", f"/api/runs/{v['run_id']}/graph")["graph"]
        params = {n["id"]: n["data"]["params"] for n in graph["nodes"]}
        assert params["train"]["epochs"] == 3 and params["optimizer"]["lr"] == v["params"]["optimizer.lr"], params
    p.close()
def test_a_study_view_draws_its_history_and_importance(server, page):
    """A 5-trial study (#27) of iris's learning rate, its `lr` metric as the objective: the view says Study,
    draws the optimisation history with a point per complete trial and the best marked, and (from 4 complete
    trials) the param's importance bar."""
    g = load_example()
    for n in g["nodes"]:
        if n["id"] == "train":
            n["data"]["params"]["epochs"] = 1
    study = server.call("POST", "/api/studies", {
        "graph": g, "axes": {"optimizer.lr": {"loguniform": [0.0001, 0.1]}}, "objective": {"metric": "lr"},
        "n_trials": 5, "parallelism": 2, "seed": 1, "options": {"target": "local"}}, expect=201)
    page.goto(f"{server.url}/web/sweep.html?id={study['id']}")
    page.wait_for_selector("body[data-sweep-status='finished']")
    final = server.call("GET", f"/api/studies/{study['id']}")
    complete = [t["index"] for t in final["trials"] if t["state"] == "complete"]
    assert len(complete) == 5, final["trials"]
    assert page.text_content("#sweep-title").startswith(f"Study {study['id']}")
    page.wait_for_selector("#history circle.hist-pt.best")
    drawn = page.eval_on_selector_all("#history circle.hist-pt", "cs => cs.map(c => Number(c.dataset.trial))")
    assert sorted(drawn) == complete
    assert page.get_attribute("#history circle.hist-pt.best", "data-trial") == str(final["best"]["index"])
    assert page.get_attribute("#importance g", "data-param") == "optimizer.lr"
    assert page.is_hidden("#btn-sweep-retry")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "study.png"), full_page=True)
