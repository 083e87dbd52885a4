"""The web page, driven in a real Chromium by Playwright against a real server.

Needs the Debian package ``chromium`` (``/usr/bin/chromium``) and the pip
package ``playwright`` (its own browser download is not used). Without either
the test is skipped with the reason; CI installs both.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from canvas_page import LONG, ROOT, module_fixtures
from procs import Proc, ServerProc, csv_print_graph, env_for, graph, load_example, node, trig, wait_for, wait_run

# The web page in a real browser against a real server and agent: the e2e tier.
pytestmark = pytest.mark.e2e

SCREENSHOT = Path("/tmp/cdui-web.png")
# The docs' screenshots: CDUI_WRITE_SCREENSHOTS=1 writes them into docs/img/, otherwise into /tmp.
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "img" if os.environ.get("CDUI_WRITE_SCREENSHOTS") == "1" \
    else Path("/tmp/cdui-web-shots")
SHOTS.mkdir(parents=True, exist_ok=True)

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


server, browser = module_fixtures("web")


def _page(browser, errors: list[str]):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(LONG)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return page


def test_runs_detail_submit_errors_upload(server, browser):
    base = server.url
    rid = server.submit(load_example(), {"target": "local"})["id"]

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
    # Every stored event is shown exactly once (seq gapless, no duplicates after reconnects).
    evs = server.events(rid)
    page.wait_for_selector(f"#log li[data-seq='{evs[-1]['seq']}']")
    shown = page.eval_on_selector_all("#log li", "els => els.map(e => Number(e.dataset.seq))")
    assert shown == [e["seq"] for e in evs]
    assert page.is_disabled("#btn-stop") and page.is_enabled("#btn-delete")
    # The iris example saves its model: at least that artifact, each listed once with a link.
    arts = server.call("GET", f"/api/runs/{rid}/artifacts", expect=200)
    assert [a for a in arts if a["kind"] == "model"], arts
    page.wait_for_selector("#artifacts-body tr a[download]")
    assert page.locator("#artifacts-body tr").count() == len(arts)
    # The download link carries no token: the session cookie from bootstrap authenticates it.
    href = page.get_attribute("#artifacts-body tr a[download]", "href")
    assert href and "token" not in href, href
    assert "token" not in page.evaluate("() => location.href")
    # Training runs draw their loss (one chart per metric family: tests/test_web_charts.py); per-node status is listed.
    page.wait_for_selector("#charts figure[data-family='loss'] canvas")
    page.wait_for_selector("#nodes li[data-node='train'] .badge")

    # An invalid graph submitted through the form: every validation error is listed.
    status, bad = server.api("POST", "/api/runs", {"graph": BAD_GRAPH})
    assert status == 400, bad
    details = bad["error"]["details"]
    page.fill("#graph-text", json.dumps(BAD_GRAPH, indent=1))
    page.select_option("#target", "local")
    page.click("#submit-form button[type=submit]")
    page.wait_for_selector("#submit-errors li")
    items = page.locator("#submit-errors li")
    assert items.count() == len(details)
    text = page.inner_text("#submit-errors")
    for d in details:
        assert d["message"] in text
    assert "ghost1" in text

    # Upload: name, sha256 and size come back.
    up = server.tmp / "hello.csv"
    up.write_text("a,b\n1,2\n")
    page.select_option("#upload-kind", "files")
    page.set_input_files("#upload-file", str(up))
    page.click("#upload-form button[type=submit]")
    page.wait_for_selector("#upload-results li:has-text('hello.csv')")
    assert hashlib.sha256(up.read_bytes()).hexdigest() in page.inner_text("#upload-results")

    # This server has no workers (the workers panel has its own tests with real agents).
    page.get_by_role("button", name="Workers", exact=True).click()
    page.wait_for_selector("#workers-empty:not([hidden])")
    assert page.locator("#workers-list li").count() == 0
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
    rid = server.submit(csv_print_graph(), {"target": "local"})["id"]
    page.goto(server.url + "/")
    page.wait_for_selector("#token-form:not([hidden])")
    form = page.inner_text("#token-form")
    assert "session-token" in form and "cdui token" in form and "CODEFYUI_SESSION_TOKEN_FILE" in form, form
    page.fill("#token-input", "wrong-token")
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#token-error:has-text('did not accept')")
    assert "from before the server's last restart" in page.inner_text("#token-error")
    page.fill("#token-input", server.token)
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#token-form[hidden]", state="attached")
    page.wait_for_selector("#server-status.ok")
    page.wait_for_selector(f"#runs-body tr[data-run-id='{rid}']")
    # The live log needs the session cookie, which the pasted token got through POST /api/auth/cookie.
    page.click(f"#runs-body tr[data-run-id='{rid}'] button")
    page.wait_for_selector("#log li.ev-status:has-text('succeeded')")
    assert [c["name"] for c in context.cookies() if c["httpOnly"]] == [f"cdui_session_{server.port}"]
    assert not errors, errors
    context.close()



SLEEPER = '''
"""A node that runs until it is stopped, for the web page's workers test."""
import time

from cdui.graph.context import RunStopped
from cdui.nodes.base import Node


class WebSleeperNode(Node):
    NODE_NAME = "WebSleeper"

    def execute(self, inputs, params, ctx):
        while not ctx.should_stop():
            time.sleep(0.05)  # the run's work: waiting to be stopped
        raise RunStopped()
'''


def _install_sleeper(data_dir: Path) -> None:
    (data_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (data_dir / "custom_nodes" / "sleeper.py").write_text(SLEEPER)


def _agent(tmp: Path, control: str, user_data: Path, data_dir: Path, name: str, log: str,
           token: str | None = None) -> Proc:
    cmd = [sys.executable, "-m", "cdui", "agent", "start", "--control", control, "--name", name,
           "--devices", "cpu", "--mount", f"data={data_dir}", "--foreground"]
    if token:
        cmd += ["--token", token]
    return Proc(cmd, env_for(user_data, data_dir), tmp / log, name=log.rsplit(".", 1)[0])


@pytest.fixture
def worker_setup(tmp_path) -> Iterator[dict[str, Any]]:
    """A real control plane with worker gpu-box (a real agent) running a run, and a
    second agent with gpu-box's credential, refused because the name is connected."""
    cp = ServerProc(tmp_path, name="web-workers-server", extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"})
    _install_sleeper(cp.data_dir)
    agent_data = tmp_path / "agent-data"
    _install_sleeper(agent_data)
    procs: list[Proc] = [cp]
    try:
        cp.start()
        tok = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
        agent = _agent(tmp_path, cp.url, tmp_path / "agent-ud", agent_data, "gpu-box", "agent-gpu-box.log", tok)
        procs.append(agent)
        agent.spawn()

        def online() -> dict[str, Any] | None:
            assert agent.alive, f"the agent exited with {agent.returncode}:\n{agent.log_tail(30)}"
            ws = [w for w in cp.call("GET", "/api/workers", expect=200)["workers"] if w["name"] == "gpu-box"]
            return ws[0] if ws and ws[0]["online"] else None
        wait_for(online, 120, 0.2, "worker gpu-box online", detail=lambda: agent.log_tail(20))
        run = cp.submit(graph([node("start", "Start"), node("z", "WebSleeper")], [trig("start", "z")]),
                        {"target": {"worker": "gpu-box"}})
        wait_run(cp, run["id"], {"running"}, 120)
        twin_ud = tmp_path / "twin-ud"
        shutil.copytree(tmp_path / "agent-ud", twin_ud, ignore=shutil.ignore_patterns("*.pid", "agent-status.json"))
        twin = _agent(tmp_path, cp.url, twin_ud, agent_data, "gpu-box", "agent-twin.log")
        procs.append(twin)
        twin.spawn()
        wait_for(lambda: [r for r in cp.call("GET", "/api/workers", expect=200)["rejected"]
                          if r["name"] == "gpu-box" and "already connected" in r["reason"]],
                 120, 0.2, "the twin agent to be listed under rejected connections")
        yield {"cp": cp, "agent": agent, "twin": twin, "run": run, "agent_data": agent_data}
    finally:
        for p in reversed(procs):
            p.stop()


def test_workers_section(worker_setup, browser):
    """The workers list, rejected connections and actions, against a real server
    with a real agent: what the page shows is what GET /api/workers says, and its
    buttons change the real worker."""
    cp, agent, run = worker_setup["cp"], worker_setup["agent"], worker_setup["run"]
    api = cp.call("GET", "/api/workers", expect=200)
    w = api["workers"][0]
    assert [x["name"] for x in api["workers"]] == ["gpu-box"] and w["status"] == "online"
    slots = [{k: d[k] for k in ("device", "slots", "in_use", "shared_by_memory")} for d in w["devices"]]
    assert w["runs"] == [run["id"]] and slots == [{"device": "cpu", "slots": 1, "in_use": 1,
                                                   "shared_by_memory": False}], w
    assert w["devices"][0]["memory"]["total_mb"] > 0, w  # the agent's /proc/meminfo
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(cp.url + "/")
    page.wait_for_selector("#server-status.ok")
    assert page.is_hidden("#workers")
    # The Settings menu's Execution → Workers → Manage opens the same panel as the Runs panel's button.
    page.click("#settings summary")
    page.get_by_role("button", name="Manage workers").click()
    card = "#workers-list li[data-worker='gpu-box']"
    page.wait_for_selector(f"{card} .badge.worker-online")
    text = page.inner_text(card)
    labels = ", ".join(f"{k}={v}" if v else k for k, v in w["labels"].items())
    for fact in ("cpu (1/1 in use)", w["address"], w["version"], labels, run["id"]):
        assert fact and fact in text, (fact, text)
    assert list(w["labels"]) == ["data"], w["labels"]  # the --mount label
    # A CPU-only agent reports no GPU use, and its card draws no GPU bars.
    assert w["gpu"] is None and page.locator(f"{card} .gpu-bars").count() == 0
    # The bars, drawn from a worker with two cards (one without NVML's utilisation).
    bars = page.evaluate("""async () => {
      const m = await import("/web/workers.js");
      const el = m.gpuBars({name: "g", gpu: [
        {device: "cuda:0", util: 37, used_mb: 40960, total_mb: 81920},
        {device: "cuda:1", util: null, used_mb: 512, total_mb: 81920}]});
      const none = [m.gpuBars({name: "c", gpu: null}), m.gpuBars({name: "c", gpu: []}), m.gpuBars({name: "c"})];
      return {cards: [...el.querySelectorAll(".gpu-card")].map((c) => ({
                device: c.dataset.device, text: c.textContent,
                meters: [...c.querySelectorAll("meter")].map((x) => [x.className, x.value, x.max,
                                                                    x.getAttribute("aria-label")])})),
              label: el.getAttribute("aria-label"), none: none.map((x) => x === null)};
    }""")
    assert bars == {"label": "GPU use on worker g", "none": [True, True, True], "cards": [
        {"device": "cuda:0", "text": "cuda:037%40.0 of 80.0 GiB",
         "meters": [["gpu-util", 37, 100, "cuda:0 utilisation"], ["gpu-mem", 40960, 81920, "cuda:0 memory in use"]]},
        {"device": "cuda:1", "text": "cuda:1utilisation not reported0.5 of 80.0 GiB",
         "meters": [["gpu-mem", 512, 81920, "cuda:1 memory in use"]]}]}, bars
    # Its update state (docs/updating.md) is shown only while it is not on the control plane's version.
    assert w["update"] == {"state": "current"} and "Update" not in text, text
    shown = page.evaluate("""async () => {
      const m = await import("/web/workers.js");
      return [m.updateText({state: "current"}), m.updateText(undefined),
              m.updateText({state: "updating", to: "9.9.9", since: "2026-12-03T08:00:00.000Z"}),
              m.updateText({state: "behind", to: "9.9.9"})];
    }""")
    assert shown[:2] == ["", ""] and shown[2].startswith("updating to 9.9.9 (since "), shown
    assert shown[3] == "behind: the control plane runs 9.9.9; refused until this worker runs it", shown
    # Loopback HTTP is not flagged as unencrypted (only a LAN link would be).
    assert w["unencrypted"] is False and page.locator(f"{card} .mark-warn").count() == 0
    assert page.is_hidden("#workers-empty")
    page.wait_for_selector("#rejected-list li:has-text('gpu-box')")
    assert "already connected" in page.inner_text("#rejected-list")
    # Queue on…: the three fixed choices and the worker.
    page.wait_for_function("() => document.querySelectorAll('#target option').length === 4")
    assert page.eval_on_selector_all("#target option", "els => els.map(e => e.value)") == [
        "local", "any", "one-shot", "worker:gpu-box"]

    def card_of() -> dict[str, Any]:
        return [x for x in cp.call("GET", "/api/workers", expect=200)["workers"] if x["name"] == "gpu-box"][0]

    def status_of() -> str:
        return str(card_of()["status"])
    page.click("button[aria-label='Drain worker gpu-box']")
    page.wait_for_selector(f"{card} .badge.worker-draining")
    assert status_of() == "draining"
    page.click("button[aria-label='Undrain worker gpu-box']")
    page.wait_for_selector(f"{card} .badge.worker-online")
    assert status_of() == "online"
    # Share by memory: the card's checkbox turns it on for every device, and the card says so.
    page.click("input[aria-label='Share by memory on worker gpu-box']")
    page.wait_for_selector(f"{card} :text('shared by memory')")
    assert card_of()["share_by_memory"] == ["*"]
    page.click("input[aria-label='Share by memory on worker gpu-box']")
    page.wait_for_selector(f"{card} :text('cpu (1/1 in use)')")
    assert card_of()["share_by_memory"] == []
    # Follow updates: the owner lets the worker's agent install `cdui update`'s bundle; on, then off again.
    follow = "input[aria-label='Follow updates on worker gpu-box']"
    assert card_of()["follow_updates"] is False and not page.is_checked(follow)
    page.click(follow)
    wait_for(lambda: card_of()["follow_updates"] is True, 60, what="follow_updates stored")
    page.wait_for_selector(f"{follow}:checked")  # the card drawn again from the stored setting
    page.click(follow)
    wait_for(lambda: card_of()["follow_updates"] is False, 60, what="follow_updates off")
    page.wait_for_selector(f"{follow}:not(:checked)")

    # Remove takes a second click, and the first says what the second will do.
    page.click("button[aria-label='Remove worker gpu-box']")
    page.wait_for_selector(f"{card} .confirm:has-text('credential is revoked')")
    assert "running runs end interrupted" in page.inner_text(f"{card} .confirm")
    assert [x["name"] for x in cp.call("GET", "/api/workers", expect=200)["workers"]] == ["gpu-box"]
    assert agent.alive
    page.click("button[aria-label='Confirm remove worker gpu-box']")
    page.wait_for_selector(card, state="detached")
    page.wait_for_selector("#workers-empty:not([hidden])")
    assert cp.call("GET", "/api/workers", expect=200)["workers"] == []
    # Removing revokes the credential: the agent is told and exits 2; its run ends interrupted.
    wait_for(lambda: not agent.alive, 60, 0.1, "the removed agent to exit")
    assert agent.returncode == 2, agent.log_tail(20)
    assert wait_run(cp, run["id"])["status"] == "interrupted"
    page.screenshot(path="/tmp/cdui-web-workers.png", full_page=True)
    assert not errors, errors
    page.close()


def _iris_on_upload(name: str) -> dict[str, Any]:
    """The iris example reading an uploaded CSV, so a worker without mounts gets it by transfer."""
    g = load_example()
    for n in g["nodes"]:
        if n["type"] == "CSVReader":
            n["data"]["params"]["path"] = name
    return g


def test_add_worker_run_on_it_and_download_the_model(tmp_path, browser):
    """The acceptance, from a fresh start: the Add worker dialog makes the token and the command, the command
    (as shown) starts a real agent whose card comes online, the page uploads the data and queues the iris graph
    on that worker, the live log shows it succeed and the page downloads its model; then drain from the card."""
    cp = ServerProc(tmp_path, name="web-add-server", extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"})
    procs: list[Proc] = [cp]
    errors: list[str] = []
    try:
        cp.start()
        page = _page(browser, errors)
        page.set_viewport_size({"width": 1280, "height": 800})
        page.goto(cp.url + "/")
        page.wait_for_selector("#server-status.ok")
        page.get_by_role("button", name="Workers", exact=True).click()
        page.wait_for_selector("#workers-empty:not([hidden])")
        page.get_by_role("button", name="Add worker").click()
        dialog = page.get_by_role("dialog", name="Add worker")
        dialog.wait_for()
        # The address defaults to the page's own; it is loopback, so the dialog warns and offers the others.
        address = page.get_by_label("Control-plane address the worker connects to")
        assert address.input_value() == cp.url
        page.wait_for_selector("#address-warning:not([hidden])")
        offered = cp.call("GET", "/api/server/addresses", expect=200)["addresses"]
        choices = page.eval_on_selector_all("#address-choice option", "els => els.map(e => e.value).filter(Boolean)")
        assert choices == [f"http://{a if ':' not in a else '[' + a + ']'}:{cp.port}" for a in offered], choices
        assert page.get_by_label("Valid for (TTL, hours)").input_value() == "24"
        assert page.get_by_label("Uses (agents it may enroll)").input_value() == "1"
        if choices:
            # Choosing one of the server's other addresses puts it into the command.
            page.select_option("#address-choice", choices[0])
            assert address.input_value() == choices[0]
            page.wait_for_selector("#address-warning", state="hidden")
            page.get_by_role("button", name="Generate token").click()
            page.wait_for_selector(f"#enroll-command:has-text('--control {choices[0]} ')")
            shown = page.inner_text("#enroll-token").strip()
            # Listed under issued tokens until deleted; this test's agent talks loopback only, so delete it.
            tid = shown.split(".", 1)[0]
            page.wait_for_selector(f"#tokens-list li[data-token-id='{tid}']")
            page.click(f"button[aria-label='Delete token {tid}']")
            page.wait_for_selector(f"#tokens-list li[data-token-id='{tid}']", state="detached")
            assert tid not in [t["id"] for t in cp.call("GET", "/api/workers/tokens", expect=200)]
        address.fill(cp.url)
        page.fill("#enroll-ttl", "2")
        before = page.inner_text("#enroll-token").strip() if choices else ""
        page.get_by_role("button", name="Generate token").click()
        # The dialog still shows the first token until the new answer arrives: wait for the new one, then
        # read the token and the command together (one render writes both).
        page.wait_for_function("old => { const t = document.querySelector('#enroll-token'); return !!t && "
                               "t.innerText.trim() !== old && !!document.querySelector('#enroll-command'); }",
                               arg=before)
        token, command = page.evaluate("() => [document.querySelector('#enroll-token').innerText.trim(), "
                                       "document.querySelector('#enroll-command').innerText.trim()]")
        assert command == f"cdui agent start --control {cp.url} --token {token}", command
        [issued] = cp.call("GET", "/api/workers/tokens", expect=200)
        assert issued["uses_total"] == 1 and token.startswith(issued["id"])
        page.screenshot(path=str(SHOTS / "add-worker-dialog.png"))
        page.click("#add-worker-close")

        # The command as shown, plus this test's own name, device and foreground flags; the agent says it is
        # another machine, so its inputs come by transfer as they would over the network.
        args = command.split()
        assert args[:3] == ["cdui", "agent", "start"]
        agent_data = tmp_path / "agent-data"
        agent_data.mkdir()
        env = env_for(tmp_path / "agent-ud", agent_data, {"CODEFYUI_MACHINE_ID": "another-machine"})
        agent = Proc([sys.executable, "-m", "cdui", *args[1:], "--name", "web-box", "--devices", "cpu",
                      "--foreground"], env, tmp_path / "agent-web-box.log", name="agent-web-box")
        procs.append(agent)
        agent.spawn()
        card = "#workers-list li[data-worker='web-box']"
        page.wait_for_selector(f"{card} .badge.worker-online")
        assert "cpu (0/1 in use)" in page.inner_text(card)
        page.screenshot(path=str(SHOTS / "workers-panel.png"))

        # Upload the training data through the page, then queue the graph on the worker.
        csv = ROOT / "data" / "samples" / "iris.csv"
        page.set_input_files("#upload-file", str(csv))
        page.click("#btn-upload")
        page.wait_for_selector("#upload-results li:has-text('iris.csv')")
        page.select_option("#target", "worker:web-box")
        page.fill("#graph-text", json.dumps(_iris_on_upload("iris.csv")))
        page.click("#btn-submit")
        page.wait_for_selector("#submit-result .ok-text")
        rid = page.inner_text("#submit-result").split()[-1].rstrip(".")
        run = cp.call("GET", f"/api/runs/{rid}", expect=200)
        assert run["target"] == {"worker": "web-box"}, run
        page.wait_for_selector("#detail-facts .badge.status-succeeded")
        assert cp.call("GET", f"/api/runs/{rid}", expect=200)["worker_id"] == "web-box"
        page.wait_for_selector("#log li.ev-status:has-text('succeeded')")
        page.wait_for_selector("#charts figure[data-family='loss'] canvas")
        page.wait_for_selector("#warnings li.warn-transfer_progress")
        # The model downloads through its link (the cookie authenticates it), byte-identical.
        model = [a for a in cp.call("GET", f"/api/runs/{rid}/artifacts", expect=200)
                 if a.get("relative_path") == "models/iris/model.pt"]
        assert len(model) == 1, model
        with page.expect_download() as dl:
            page.click(f"#artifacts-body a[aria-label='Download {model[0]['name']}']")
        got = Path(dl.value.path()).read_bytes()
        assert hashlib.sha256(got).hexdigest() == model[0]["sha256"]
        page.screenshot(path=str(SHOTS / "run-on-worker.png"), full_page=True)

        page.click("button[aria-label='Drain worker web-box']")
        page.wait_for_selector(f"{card} .badge.worker-draining")
        assert [w["status"] for w in cp.call("GET", "/api/workers", expect=200)["workers"]] == ["draining"]
        assert not errors, errors
        page.close()
    finally:
        for p in reversed(procs):
            p.stop()


# -- the graph drawing with recorded outputs, polling in a hidden tab, focus in the runs table, and the
# one-shot pool in Queue on…. Time in the page is Playwright's clock where a test is about polling: the
# page's 2 s refresh runs when the test moves that clock, so "no request while hidden" is checked after
# many refresh periods without waiting for them.

# Start triggers two tensors: an 8x8 RGB image of 0.5 and the sequence 0..4.
OUTPUTS_GRAPH = {"format_version": 1, "name": "two tensors", "edges": [
    {"id": f"t{i}", "source": "start", "sourceHandle": "trigger", "target": t, "targetHandle": None, "type": "trigger"}
    for i, t in enumerate(("img", "seq"))],
    "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "img", "type": "TensorCreate", "position": {"x": 0, "y": 0},
         "data": {"params": {"shape": "1,3,8,8", "fill": "full", "value": 0.5}}},
        {"id": "seq", "type": "TensorCreate", "position": {"x": 0, "y": 0},
         "data": {"params": {"shape": "5", "fill": "arange"}}}]}


@pytest.fixture(scope="module")
def plane(server, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The module's control plane with one more real agent, worker ``box``."""
    tmp = tmp_path_factory.mktemp("web-box")
    cp = server
    procs: list[Proc] = []
    try:
        (tmp / "agent-data").mkdir()
        tok = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
        agent = _agent(tmp, cp.url, tmp / "agent-ud", tmp / "agent-data", "box", "agent-box.log", tok)
        procs.append(agent)
        agent.spawn()

        def online() -> bool:
            assert agent.alive, f"the agent exited with {agent.returncode}:\n{agent.log_tail(30)}"
            return any(w["name"] == "box" and w["online"] for w in cp.call("GET", "/api/workers")["workers"])
        wait_for(online, 120, 0.2, "worker box online", detail=lambda: agent.log_tail(20))
        yield {"cp": cp, "agent": agent, "agent_ud": tmp / "agent-ud"}
    finally:
        for p in reversed(procs):
            p.stop()


def _submit(page: Any, target: str, device: str = "", record: bool = False) -> None:
    page.fill("#graph-text", json.dumps(OUTPUTS_GRAPH))
    page.select_option("#target", target)
    page.fill("#device", device)
    page.set_checked("#record-outputs", record)
    page.click("#btn-submit")


def test_recorded_outputs_of_a_worker_run_in_the_graph_drawing(plane, browser):
    cp = plane["cp"]
    errors: list[str] = []
    page = _page(browser, errors)
    page.goto(cp.url + "/")
    page.wait_for_selector("#server-status.ok")
    page.wait_for_selector("#target option[value='worker:box']", state="attached")
    _submit(page, "worker:box", record=True)
    page.wait_for_selector("#submit-result:has-text('Submitted run')")
    rid = re.search(r"Submitted run (\w+)", page.inner_text("#submit-result")).group(1)
    # The drawing shows every node done, from the live events.
    for nid in ("start", "img", "seq"):
        page.wait_for_selector(f"#graph g.g-node[data-node='{nid}'][data-status='done']")
    page.wait_for_selector("#detail-facts .badge.status-succeeded")
    run = cp.call("GET", f"/api/runs/{rid}")
    assert (run["status"], run["worker_id"]) == ("succeeded", "box"), run
    # The captures are on the worker's machine, in the agent's user data folder, not the control plane's.
    assert (plane["agent_ud"] / "outputs" / rid / "index.json").is_file()
    assert not (cp.user_data / "outputs" / rid).exists()

    # A click on a recorded node fetches its summary over the worker's connection.
    page.click("#graph g.g-node.recorded[data-node='img']")
    row = "#node-output tr[data-port='tensor']"
    page.wait_for_selector("#node-output h4:has-text('Outputs of img')")
    cells = page.eval_on_selector_all(f"{row} td", "els => els.map(e => e.textContent)")
    assert cells[:7] == ["tensor", "tensor", "[1, 3, 8, 8]", "float32", "0.5", "0.5", "0.5"], cells
    page.wait_for_function("() => { const i = document.querySelector('#node-output img.thumb');"
                           " return i && i.complete && i.naturalWidth === 8 && i.naturalHeight === 8; }")
    # The keyboard does the same: focus a node, press Enter.
    page.focus("#graph g.g-node[data-node='seq']")
    page.keyboard.press("Enter")
    page.wait_for_selector("#node-output h4:has-text('Outputs of seq')")
    cells = page.eval_on_selector_all(f"{row} td", "els => els.map(e => e.textContent)")
    assert cells[:7] == ["tensor", "tensor", "[5]", "float32", "0", "4", "2"], cells
    assert page.get_attribute("#graph g.g-node[data-node='seq']", "aria-label") == \
        "Show the recorded outputs of node seq (done)"
    page.screenshot(path="/tmp/cdui-web-shots/graph-outputs.png", full_page=True)
    assert not errors, errors
    page.close()


def _is_poll(request: Any) -> bool:
    return request.method == "GET" and urlsplit(request.url).path == "/api/runs"


def _barrier(page: Any) -> None:
    """Every request the page made before this one has been reported to the test."""
    with page.expect_request(lambda r: urlsplit(r.url).path == "/api/health"):
        page.evaluate("() => { fetch('/api/health'); }")


def _set_hidden(page: Any, hidden: bool) -> None:
    page.evaluate("""(hidden) => {
        Object.defineProperty(document, 'visibilityState',
                              {get: () => hidden ? 'hidden' : 'visible', configurable: true});
        Object.defineProperty(document, 'hidden', {get: () => hidden, configurable: true});
        document.dispatchEvent(new Event('visibilitychange'));
    }""", hidden)


def test_one_shot_pool_hidden_tab_and_focus_in_the_runs_table(plane, browser):
    cp = plane["cp"]
    errors: list[str] = []
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(180_000)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.clock.install()
    page.goto(cp.url + "/")
    page.wait_for_selector("#server-status.ok")

    # Queue on… the one-shot pool: recording outputs is refused with the server's message…
    _submit(page, "one-shot", "cpu", record=True)
    page.wait_for_selector("#submit-result .error-text")
    assert page.inner_text("#submit-result .error-text").startswith("a run with record_outputs on cannot go to")
    # …and without it the run waits, with its queue reason in the table and the detail.
    _submit(page, "one-shot", "cpu")
    page.wait_for_selector("#submit-result:has-text('Submitted run')")
    rid = re.search(r"Submitted run (\w+)", page.inner_text("#submit-result")).group(1)
    run = cp.call("GET", f"/api/runs/{rid}")
    assert (run["status"], run["target"], run["queue_reason"]) == (
        "queued", {"pool": "one-shot"}, "waiting for a one-shot worker that offers cpu"), run
    row = f"#runs-body tr[data-run-id='{rid}']"
    page.wait_for_selector(f"{row} .badge.status-queued")
    if page.inner_text(f"{row} td.info") != run["queue_reason"]:
        # Listed in the moment before the dispatch pass gave the run its lane's reason (the stored
        # "waiting for the scheduler" is true then): the page's next refresh shows it. The page's
        # clock is stopped, so the test moves it on by one refresh period.
        with page.expect_request(_is_poll):
            page.clock.run_for(2100)
        page.wait_for_function("([sel, text]) => document.querySelector(sel)?.innerText === text",
                               arg=[f"{row} td.info", run["queue_reason"]])
    assert page.inner_text(f"{row} td.info") == run["queue_reason"]
    page.wait_for_function("(text) => [...document.querySelectorAll('#detail-facts > *')]"
                           ".some(e => e.textContent === text)", arg=run["queue_reason"])
    facts = page.eval_on_selector_all("#detail-facts > *", "els => els.map(e => e.textContent)")
    assert facts[facts.index("Queue reason") + 1] == run["queue_reason"], facts

    # Visible: the 2 s refresh asks for the runs.
    with page.expect_request(_is_poll):
        page.clock.run_for(2100)
    # Hidden: five refresh periods pass without one request for the runs.
    _set_hidden(page, True)
    _barrier(page)
    seen: list[str] = []
    page.on("request", lambda r: seen.append(r.url) if _is_poll(r) else None)
    page.clock.run_for(10_000)
    _barrier(page)
    assert seen == [], seen
    # Shown again: it refreshes at once, then every 2 s.
    with page.expect_request(_is_poll):
        _set_hidden(page, False)
    with page.expect_request(_is_poll):
        page.clock.run_for(2100)

    # Focus stays on a row's button when a refresh redraws that row (its status changed).
    page.focus(f"{row} button")
    cp.call("POST", f"/api/runs/{rid}/stop")
    assert cp.call("GET", f"/api/runs/{rid}")["status"] == "cancelled"
    with page.expect_request(_is_poll):
        page.clock.run_for(2100)
    page.wait_for_selector(f"{row} .badge.status-cancelled")
    # Where the focus is: the row's run id, or the focused element's tag when it left the table.
    assert page.evaluate("() => { const a = document.activeElement, tr = a.closest('tr');"
                         " return tr ? tr.dataset.runId : a.tagName; }") == rid
    assert page.evaluate("() => document.activeElement.dataset.show") == "1"
    assert not errors, errors
    context.close()
