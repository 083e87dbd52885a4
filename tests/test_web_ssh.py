"""The Add worker dialog's "Via SSH" form in a real Chromium, against a real
server and the real OpenSSH server of tests/sshd.py.

Needs Debian's ``chromium`` and ``openssh-server`` and the pip package
``playwright``; without them it is skipped with the reason (CI installs all).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import ServerProc, wait_for
from sshd import Sshd
from sshd import running as running_sshd
from syspkgs import requires_command

pytestmark = [pytest.mark.e2e, requires_command("sshd", "openssh-server"), requires_command("ssh", "openssh-client")]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LONG = 180_000  # ms: generous waits for selectors, never a timing assertion


@pytest.fixture
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is missing (pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    with running_sshd(tmp_path / "ssh") as s:
        yield s


@pytest.mark.timeout(600)
def test_add_an_ssh_worker_from_the_dialog(tmp_path: Path, sshd: Sshd, browser: Any) -> None:
    """Target, port, name, key and remote cdui typed into "Via SSH"; "Add and connect"; the card's
    SSH tunnel row says Connected with the remote agent's PID, and the worker comes online."""
    cp = ServerProc(tmp_path, name="web-ssh-server", extra_env=sshd.env()).start()
    errors: list[str] = []
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(LONG)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(cp.url + "/")
        page.wait_for_selector("#server-status.ok")
        page.get_by_role("button", name="Workers", exact=True).click()
        page.get_by_role("button", name="Add worker").click()
        page.get_by_role("dialog", name="Add worker").wait_for()
        page.get_by_role("tab", name="Via SSH").click()
        page.get_by_label("SSH target").fill("root@localhost")
        page.get_by_label("Port").fill(str(sshd.port))
        page.get_by_label("Worker name (optional)").fill("gpu-web")
        page.get_by_label("Key file (optional, on this server)").fill(str(sshd.key))
        launcher = sshd.home / "CodefyUI" / "bin" / "cdui"
        page.get_by_label("cdui on remote host (optional)").fill(str(launcher))
        page.get_by_role("button", name="Add and connect").click()
        page.wait_for_selector("#ssh-result .ok-text:has-text('Added gpu-web; connecting')")

        saved = cp.call("GET", "/api/workers/ssh")["ssh_workers"]
        assert [(w["name"], w["target"], w["port"], w["identity"], w["remote_cdui"]) for w in saved] == [
            ("gpu-web", "root@localhost", sshd.port, str(sshd.key), str(launcher))]
        page.click("#add-worker-close")
        card = "#workers-list li[data-worker='gpu-web']"
        page.wait_for_selector(f"{card} .tunnel-connected:has-text('remote PID')")
        shown = page.inner_text(f"{card} .tunnel-connected")
        pid = int(shown.split("remote PID ", 1)[1].split()[0])
        assert wait_for(lambda: sshd.agent_pids() or None, 60, 0.1, "the remote agent's pidfile") == [pid]
        assert "Connected" in shown and f"root@localhost:{sshd.port}" in shown, shown
        page.wait_for_selector(f"{card} .badge.worker-online")
        assert errors == []
    finally:
        cp.stop()
