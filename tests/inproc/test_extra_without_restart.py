"""A package installed into a running control plane's environment counts from the next check on: no
restart. A drop-in node needs a package that is not installed; a submit is refused `missing_extra`; the
package is then installed with pip, offline, from a tiny wheel made here, into a folder on this process's
``sys.path``; the same control plane (the same process) then accepts the graph and lists the node as
available."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.inproc.harness import Plane, n, t

PKG = "cdui_tiny_extra_pkg"

NEEDS_TINY = f'''
from cdui.nodes.base import TENSOR, Node, Port


class NeedsTiny(Node):
    NODE_NAME = "NeedsTiny"
    NEEDS = ("{PKG}",)

    @classmethod
    def define_outputs(cls):
        return [Port("tensor", TENSOR)]

    def execute(self, inputs, params, ctx):
        raise AssertionError("never runs here")
'''


def tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel of one empty module, as pip expects it (METADATA, WHEEL, RECORD with hashes)."""
    dist = f"{PKG}-1.0.dist-info"
    files = {f"{PKG}/__init__.py": b"VERSION = '1.0'\n",
             f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: cdui-tiny-extra-pkg\nVersion: 1.0\n",
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: cdui-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for name, body in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(body)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{PKG}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, body in files.items():
            z.writestr(name, body)
    return path


async def test_an_extra_installed_while_the_server_runs_counts_without_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    tiny_wheel(wheels)
    data = tmp_path / "data"
    (data / "custom_nodes").mkdir(parents=True)
    (data / "custom_nodes" / "needs_tiny.py").write_text(NEEDS_TINY, encoding="utf-8")
    graph = {"nodes": [n("start", "Start"), n("x", "NeedsTiny")], "edges": [t("x")]}
    options = {"target": "local", "device": "cpu"}
    async with Plane(tmp_path / "ud", data, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=0") as cp:
        async def node() -> dict[str, object]:
            return next(x for x in (await cp.call("GET", "/api/nodes"))["nodes"] if x["type"] == "NeedsTiny")

        status, body = await cp.api("POST", "/api/runs", {"graph": graph, "options": options})
        assert status == 400 and [d["code"] for d in body["error"]["details"]] == ["missing_extra"], body
        assert (await node())["available"] is False

        r = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
                             "--no-index", "--find-links", str(wheels), "--target", str(site), PKG],
            capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert (site / PKG / "__init__.py").exists()

        assert (await node())["available"] is True
        status, body = await cp.api("POST", "/api/runs", {"graph": graph, "options": options})
        assert status == 201, body
        assert PKG not in sys.modules  # looked up, never imported by the control plane
