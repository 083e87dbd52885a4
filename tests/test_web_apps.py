"""The Apps page (/web/apps.html) in a real Chromium against a real server: reachable from the runs
page's header, it lists the published apps and where each is served, shows an app's one-line curl
example, moves it to another machine, its versions (Activate rolls back), a latency chart and its last
invokes with duration and status, and creates (shown once) and revokes API keys. No serving process is
started: the one invoke is refused before it would run."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from canvas_page import LONG, module_fixtures
from procs import ServerProc

pytestmark = pytest.mark.e2e

server, browser = module_fixtures("web-apps")


def scaled(factor: float) -> dict[str, Any]:
    def n(nid: str, ntype: str, **params: Any) -> dict[str, Any]:
        return {"id": nid, "type": ntype, "data": {"params": params}}
    return {"nodes": [n("start", "Start"), n("in", "GraphInput", name="values", type="json"),
                      n("mul", "ScalarMultiply", scalar=factor), n("out", "GraphOutput", name="scaled")],
            "edges": [{"source": "start", "sourceHandle": "trigger", "target": "in", "type": "trigger"},
                      {"source": "in", "sourceHandle": "value", "target": "mul", "targetHandle": "tensor"},
                      {"source": "mul", "sourceHandle": "tensor", "target": "out", "targetHandle": "value"}]}


@pytest.fixture
def page(browser: Any, server: ServerProc) -> Iterator[Any]:
    errors: list[str] = []
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.set_default_timeout(LONG)
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    p.on("dialog", lambda d: d.accept())
    yield p
    assert not errors, errors
    context.close()


def test_the_apps_page_lists_versions_invokes_and_keys(server: ServerProc, page: Any) -> None:
    server.call("PUT", "/api/graphs/scale", scaled(3.0))
    server.call("POST", "/api/apps/scaler/publish", {"graph": "scale", "create": True, "note": "first",
                                                    "git_commit": "abc1234"})
    server.call("PUT", "/api/graphs/scale", scaled(5.0))
    server.call("POST", "/api/apps/scaler/publish", {"graph": "scale"})
    server.call("POST", "/api/apps/scaler/invoke", {"inputs": {}}, expect=400)  # recorded, nothing runs

    page.goto(server.url + "/")
    page.click("#link-apps")
    page.wait_for_selector("body[data-ready='1'][data-app='scaler']")
    assert page.text_content("#apps-body tr[data-slug='scaler'] td:nth-child(2)") == "version 2"
    curl = page.text_content("#app-curl")
    assert curl.startswith('curl -H "Authorization: Bearer $CDUI_KEY"') and curl.endswith("/api/apps/scaler/invoke")
    assert '{"inputs":{"values":"<json>"}}' in curl
    assert "abc1234" in page.text_content("#versions") and "first" in page.text_content("#versions")
    invoke = page.eval_on_selector_all("#invokes tbody tr td", "tds => tds.map(t => t.textContent)")
    assert invoke[1:4] == ["2", "owner", "failed"] and invoke[4].endswith(" ms") and "missing_inputs" in invoke[5]
    # The latency chart draws the one invoke; the app is served here until moved.
    assert page.get_attribute("#latency", "data-points") == "1" and page.query_selector("#latency canvas")
    assert page.text_content("#apps-body tr[data-slug='scaler'] td:nth-child(7)") == "this server"

    # Served on any worker, from the page: stored, and shown in the list.
    page.select_option("#serve-on", "any")
    page.fill("#serve-device", "cpu")
    page.click("#btn-serve-on")
    page.wait_for_selector("#apps-body tr[data-slug='scaler'] td:nth-child(7):text('any worker (cpu)')")
    got = server.call("GET", "/api/apps")["apps"][0]
    assert (got["serve_on"], got["serve_device"]) == ("any", "cpu")

    # Activate version 1 (a rollback), then unpublish.
    page.click("#versions button.btn-activate[data-version='1']")
    page.wait_for_selector("#app-action.ok-text")
    assert server.call("GET", "/api/apps")["apps"][0]["active_version"] == 1
    page.click("#btn-app-unpublish")
    page.wait_for_selector("#apps-body tr[data-slug='scaler'] .badge")
    assert server.call("GET", "/api/apps")["apps"][0]["active_version"] is None

    # A key is shown once, listed by its prefix only, and revoked from the page.
    page.fill("#key-name", "lab client")
    page.click("#btn-key-create")
    page.wait_for_selector("#key-new:not([hidden])")
    key = page.text_content("#key-new-value")
    assert key.startswith("cdui_")
    listed = server.call("GET", "/api/keys")["keys"]
    assert [(k["name"], k["prefix"]) for k in listed] == [("lab client", key[:12])]
    assert key not in page.text_content("#keys-table")
    page.click(f"#keys-table button.btn-revoke[data-key='{listed[0]['id']}']")
    page.wait_for_selector("#keys-table button.btn-revoke", state="detached")
    assert server.call("GET", "/api/keys")["keys"][0]["revoked_at"] is not None
