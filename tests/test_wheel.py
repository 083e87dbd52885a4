"""A wheel built from the checkout works outside it (e2e: builds, installs, starts a server).

The wheel is built from a copy of the tracked tree (so the checkout gains no
``build/``) and installed with no network: a fresh venv without pip whose
site-packages has a ``.pth`` line naming this ``.venv``'s site-packages, so
aiohttp and torch come from there while cdui itself comes only from the wheel
(a plain path line in a ``.pth`` file does not run that folder's own ``.pth``
files, so the checkout's editable install stays out of the new venv).
"""
from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from procs import REPO_ROOT, ServerProc, load_example, tracked_copy, wait_run

pytestmark = pytest.mark.e2e


def _venv_with_wheel(tmp: Path) -> Path:
    src = tracked_copy(tmp / "src")
    wheels = tmp / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), str(src)], check=True, cwd=tmp)
    (wheel,) = wheels.glob("cdui-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "cdui-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, cwd=tmp)
    return venv


class WheelServer(ServerProc):
    """The installed ``cdui`` command, started from a folder that is not the checkout."""

    def __init__(self, tmp: Path, venv: Path, cwd: Path, home: Path) -> None:
        super().__init__(tmp, name="wheel-server", extra_env={"HOME": str(home)})
        self.cmd = [str(venv / "bin" / "cdui"), *self.cmd[3:]]
        self.cwd = str(cwd)


def test_wheel_outside_checkout_serves_ui_and_runs_iris(tmp_path: Path) -> None:
    """`pip install cdui-*.whl` into a fresh venv: from a folder outside the checkout,
    `cdui start --foreground` serves the page and its scripts, and the iris example
    (which reads the built-in sample data/samples/iris.csv) succeeds."""
    venv = _venv_with_wheel(tmp_path)
    elsewhere, home = tmp_path / "elsewhere", tmp_path / "home"
    elsewhere.mkdir()
    home.mkdir()
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import json, cdui, cdui.core.layout as l; "
                            "print(json.dumps([cdui.__file__, str(l.INSTALL_ROOT)]))"],
                           cwd=elsewhere, env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
                           check=True, capture_output=True, text=True)
    module, root = json.loads(probe.stdout)
    assert Path(module).is_relative_to(venv), module  # the wheel's copy, not the checkout's
    assert root == str(home / "CodefyUI")  # outside a checkout the default installation root

    server = WheelServer(tmp_path, venv, elsewhere, home).start()
    try:
        page = server.raw("GET", "/", token=False)
        assert page.status == 200 and b"<html" in page.body.lower()
        script = server.raw("GET", "/web/app.js", token=False)
        assert script.status == 200
        assert script.body == (REPO_ROOT / "cdui" / "plane" / "web" / "app.js").read_bytes()
        # The canvas page's modules and its vendored editor library are in the wheel too.
        for name in ("canvas.html", "canvas/editor.js", "vendor/litegraph/litegraph.core.js"):
            got = server.raw("GET", f"/web/{name}", token=False)
            assert got.status == 200 and got.body == (REPO_ROOT / "cdui" / "plane" / "web" / name).read_bytes(), name
        run = server.submit(load_example("iris_train.json"))
        assert wait_run(server, run["id"])["status"] == "succeeded"
    finally:
        server.stop()
