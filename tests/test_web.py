"""The web page, driven in a real Chromium by Playwright against a real server.

Needs the Debian package ``chromium`` (``/usr/bin/chromium``) and the pip
package ``playwright`` (its own browser download is not used). Without either
the test is skipped with the reason; CI installs both.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = Path("/tmp/cdui-web.png")
LONG = 180_000  # ms: generous waits for selectors, never a timing assertion

SMALL_GRAPH = {
    "format_version": 1,
    "nodes": [
        {"id": "s", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "t", "type": "TensorCreate", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "p", "type": "Print", "position": {"x": 0, "y": 0}, "data": {"params": {"label": "hi"}}},
    ],
    "edges": [
        {"id": "e1", "source": "s", "target": "t", "sourceHandle": "trigger", "type": "trigger"},
        {"id": "e2", "source": "t", "target": "p", "sourceHandle": "tensor", "targetHandle": "value", "type": "data"},
    ],
}
# Two nodes of types that do not exist: at least two validation errors.
BAD_GRAPH = {
    "format_version": 1,
    "nodes": [
        {"id": "s", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "ghost1", "type": "NoSuchNodeType", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "ghost2", "type": "AlsoMissingType", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
    ],
    "edges": [
        {"id": "e1", "source": "s", "target": "ghost1", "sourceHandle": "trigger", "type": "trigger"},
        {"id": "e2", "source": "ghost1", "target": "ghost2", "sourceHandle": "trigger", "type": "trigger"},
    ],
}


def _playwright():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is missing (pip install playwright)")
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(base: str, method: str, path: str, token: str | None = None, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if token:
        req.add_header("X-CodefyUI-Token", token)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sync_playwright = _playwright()
    tmp = tmp_path_factory.mktemp("web")
    port = _free_port()
    env = dict(os.environ, CODEFYUI_USER_DATA_DIR=str(tmp / "user"), CODEFYUI_DATA_DIR=str(tmp / "data"))
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "cdui", "start", "--foreground", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}: {(tmp / 'server.log').read_text()[-3000:]}")
            try:
                if _call(base, "GET", "/api/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server did not answer /api/health: {(tmp / 'server.log').read_text()[-3000:]}")
            time.sleep(0.2)
        status, body = _call(base, "GET", "/api/auth/bootstrap")
        assert status == 200, body
        yield {"base": base, "token": body["token"], "tmp": tmp, "sync_playwright": sync_playwright}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def browser(server):
    with server["sync_playwright"]() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _page(browser, errors: list[str]):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(LONG)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page


def test_runs_detail_submit_errors_upload(server, browser):
    base, token = server["base"], server["token"]
    example = ROOT / "examples" / "iris_train.json"
    graph = json.loads(example.read_text()) if example.is_file() else SMALL_GRAPH
    status, run = _call(base, "POST", "/api/runs", token, {"graph": graph, "options": {"target": "local"}})
    assert status == 201, run
    rid = run["id"]

    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(base + "/")
    page.wait_for_selector("#version:has-text('v')")
    # The run appears in the list and reaches succeeded.
    row = f"#runs-body tr[data-run-id='{rid}']"
    page.wait_for_selector(f"{row} .badge.status-succeeded")
    page.wait_for_selector("#server-status.ok")

    # Detail pane: the live log shows status changes, node status and log lines.
    page.click(f"{row} button")
    page.wait_for_selector("#detail-body:not([hidden])")
    page.wait_for_selector("#detail-facts .badge.status-succeeded")
    page.wait_for_selector("#log li.ev-status:has-text('succeeded')")
    page.wait_for_selector("#log li.ev-node_status:has-text('done')")
    page.wait_for_selector("#log li.ev-log")
    if graph is SMALL_GRAPH:
        page.wait_for_selector("#log li.ev-log:has-text('[hi]')")
    # Every stored event is shown exactly once (seq gapless, no duplicates after reconnects).
    _, evs = _call(base, "GET", f"/api/runs/{rid}/events", token)
    page.wait_for_selector(f"#log li[data-seq='{evs[-1]['seq']}']")
    shown = page.eval_on_selector_all("#log li", "els => els.map(e => Number(e.dataset.seq))")
    assert shown == [e["seq"] for e in evs]
    assert page.is_disabled("#btn-stop") and page.is_enabled("#btn-delete")
    _, arts = _call(base, "GET", f"/api/runs/{rid}/artifacts", token)
    if arts:
        page.wait_for_selector("#artifacts-body tr a[download]")
        assert page.locator("#artifacts-body tr").count() == len(arts)
    else:
        page.wait_for_selector("#artifacts-empty:not([hidden])")

    # An invalid graph submitted through the form: every validation error is listed.
    status, bad = _call(base, "POST", "/api/runs", token, {"graph": BAD_GRAPH})
    assert status == 400, bad
    details = bad["error"]["details"]
    page.fill("#graph-text", json.dumps(BAD_GRAPH, indent=1))
    page.fill("#target", "local")
    page.click("#submit-form button[type=submit]")
    page.wait_for_selector("#submit-errors li")
    items = page.locator("#submit-errors li")
    assert items.count() == len(details)
    text = page.inner_text("#submit-errors")
    for d in details:
        assert d["message"] in text
    assert "ghost1" in text

    # Upload: name, sha256 and size come back.
    up = server["tmp"] / "hello.csv"
    up.write_text("a,b\n1,2\n")
    page.select_option("#upload-kind", "files")
    page.set_input_files("#upload-file", str(up))
    page.click("#upload-form button[type=submit]")
    page.wait_for_selector("#upload-results li:has-text('hello.csv')")
    assert hashlib.sha256(up.read_bytes()).hexdigest() in page.inner_text("#upload-results")

    # Workers: a list, or "No workers" when the server has none (or no workers route yet).
    page.wait_for_selector("#workers-empty:not([hidden]), #workers-list li")
    page.wait_for_selector("#btn-add-worker")
    assert page.is_hidden("#banner"), page.inner_text("#banner")
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    assert not errors, errors
    page.close()


def test_token_form_when_bootstrap_is_refused(server, browser):
    """A remote browser cannot bootstrap: the page asks for the token and then works."""
    errors: list[str] = []
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(LONG)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.route("**/api/auth/bootstrap", lambda route: route.fulfill(
        status=404, content_type="application/json",
        body=json.dumps({"error": {"code": "not_found", "message": "no such path"}})))
    page.goto(server["base"] + "/")
    page.wait_for_selector("#token-form:not([hidden])")
    assert "session-token" in page.inner_text("#token-form")
    page.fill("#token-input", "wrong-token")
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#token-error:has-text('did not accept')")
    page.fill("#token-input", server["token"])
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#token-form[hidden]", state="attached")
    page.wait_for_selector("#server-status.ok")
    page.wait_for_selector("#runs-body tr, #runs-empty:not([hidden])")
    assert not errors, errors
    context.close()


WORKERS = {
    "workers": [
        {"name": "gpu-box", "status": "online", "version": "0.1.0",
         "devices": [{"device": "cuda:0", "slots": 2, "in_use": 1}, {"device": "cpu", "slots": 1, "in_use": 0}],
         "runs": ["abc123def456"], "last_seen": "2026-01-02T03:04:05Z", "address": "192.0.2.7:51234",
         "labels": {"data": "/nas/data"}, "unencrypted": True},
        {"name": "old-box", "status": "draining", "version": "0.1.0", "devices": [], "runs": [],
         "last_seen": None, "address": None, "labels": [], "unencrypted": False},
    ],
    "rejected": [{"name": "stale", "reason": "version 0.0.9 does not match 0.1.0", "address": "192.0.2.9",
                  "at": "2026-01-02T03:04:05Z"}],
}


def test_workers_section(server, browser):
    """The workers list, rejected connections and actions, against the documented API shape."""
    errors: list[str] = []
    calls: list[tuple[str, str]] = []
    page = _page(browser, errors)

    def workers_api(route):
        req = route.request
        calls.append((req.method, req.url.split("/api/workers", 1)[1]))
        if req.method == "GET":
            return route.fulfill(status=200, content_type="application/json", body=json.dumps(WORKERS))
        if req.url.endswith("/tokens"):
            assert json.loads(req.post_data) == {"ttl_s": 86400, "uses": 1}
            return route.fulfill(status=201, content_type="application/json", body=json.dumps(
                {"token": "abcdef.0123456789abcdef", "expires_at": "2026-01-03T03:04:05Z",
                 "command": "cdui agent start --control http://192.0.2.1:8000 --token abcdef.0123456789abcdef"}))
        return route.fulfill(status=200, content_type="application/json", body="{}")

    page.route("**/api/workers**", workers_api)
    page.goto(server["base"] + "/")
    page.wait_for_selector("#workers-list li[data-worker='gpu-box'] .badge.worker-online")
    card = page.inner_text("#workers-list li[data-worker='gpu-box']")
    for fact in ("Unencrypted HTTP", "cuda:0 (1/2 in use)", "192.0.2.7:51234", "data=/nas/data", "abc123def456"):
        assert fact in card
    assert page.is_hidden("#workers-empty")
    page.wait_for_selector("#rejected-list li:has-text('version 0.0.9 does not match')")
    page.click("button[aria-label='Drain worker gpu-box']")
    page.click("button[aria-label='Undrain worker old-box']")
    page.once("dialog", lambda d: d.accept())
    page.click("button[aria-label='Remove worker old-box']")
    page.click("#btn-add-worker")
    page.wait_for_selector("#enroll-token:has-text('abcdef.0123456789abcdef')")
    page.wait_for_selector("#enroll-command:has-text('cdui agent start')")
    page.wait_for_function("n => document.querySelectorAll('#target-options option').length >= n", arg=5)
    assert ("POST", "/gpu-box/drain") in calls and ("POST", "/old-box/undrain") in calls
    assert ("DELETE", "/old-box") in calls and ("POST", "/tokens") in calls
    page.screenshot(path="/tmp/cdui-web-workers.png", full_page=True)
    assert not errors, errors
    page.close()
