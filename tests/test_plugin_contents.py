"""What a CodefyUI pack's manifest declares besides its nodes (docs/plugins.md, "Python packages, presets, browser
code"):
``[python_deps]`` checked at install (refused naming each missing distribution and the offline command, or
installed from the lab's wheels with ``--install-deps``, pip ``--no-index``) and shown by ``cdui plugin info``;
``presets/*.json`` listed as ``<pack>:<name>`` and run; ``[frontend]`` recorded and listed, not loaded.

``--install-deps`` runs in a throwaway virtual environment that sees cdui's packages through a ``.pth`` file,
so the wheel it installs never lands in the test environment; the wheel is built here, by hand.
"""
from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from cdui.nodes import pack_deps
from procs import REPO_ROOT, env_for, wait_run
from test_plugins import cdui
from test_workers import make_server

MANIFEST = """[plugin]
id = "deppack"
name = "Deps and presets"
version = "0.1.0"
schema_version = 1

[python_deps]
cdui-testdep = ">=1.0"

[frontend]
entry = "frontend/index.js"
"""
NODE = '''from app.core.node_base import BaseNode, DataType, PortDefinition

import cdui_testdep


class PlusDep(BaseNode):
    NODE_NAME = "Plus-Dep"
    CATEGORY = "Test"

    @classmethod
    def define_inputs(cls):
        return [PortDefinition("tensor", DataType.TENSOR)]

    @classmethod
    def define_outputs(cls):
        return [PortDefinition("tensor", DataType.TENSOR)]

    def execute(self, inputs, params, progress_callback=None, *, context=None):
        return {"tensor": inputs["tensor"] + cdui_testdep.VALUE}
'''
PRESET = {"name": "Relu", "category": "Test", "description": "an activation, shipped by a pack",
          "nodes": [{"id": "act", "type": "Activation", "params": {"function": "relu"}}], "edges": [],
          "exposed_inputs": [{"name": "tensor", "internal_node": "act", "internal_port": "tensor"}],
          "exposed_outputs": [{"name": "tensor", "internal_node": "act", "internal_port": "tensor"}]}


def write_pack(root: Path) -> Path:
    files = {"cdui.plugin.toml": MANIFEST, "nodes/plus_dep_node.py": NODE,
             "presets/relu.json": json.dumps(PRESET), "frontend/index.js": "export default {};\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def write_wheel(folder: Path) -> Path:
    """cdui-testdep 1.0, a pure-Python wheel of one module (``cdui_testdep.VALUE = 7``)."""
    folder.mkdir(parents=True, exist_ok=True)
    info = "cdui_testdep-1.0.dist-info"
    files = {"cdui_testdep/__init__.py": b"VALUE = 7\n",
             f"{info}/METADATA": b"Metadata-Version: 2.1\nName: cdui-testdep\nVersion: 1.0\n",
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: cdui-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for name, data in files.items()) + f"{info}/RECORD,,\n"
    out = folder / "cdui_testdep-1.0-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", record)
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment of its own (what pip installs into) that imports cdui and its dependencies from the
    test environment, through a .pth file."""
    v = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True, timeout=120)
    site = Path(subprocess.run([str(v / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    (site / "cdui_tests.pth").write_text(f"{REPO_ROOT}\n{sysconfig.get_paths()['purelib']}\n")
    return v


def in_venv(v: Path, ud: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(v / "bin" / "python"), "-m", "cdui", *args], env=env_for(ud, None, env), text=True,
                          capture_output=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("table, deps, problems", [
    ({"httpx": ">=0.27", "numpy": "1.2.0", "rich": "", "a.b-c_d": ">=1,<2"},
     {"httpx": "httpx>=0.27", "numpy": "numpy==1.2.0", "rich": "rich", "a.b-c_d": "a.b-c_d>=1,<2"}, []),
    ({"httpx[http2]": ">=1"}, {}, ["[python_deps] httpx[http2] = '>=1': not a distribution name (extras like name[x] "
                                   "are refused)"]),
    ({"x": "git+https://example.invalid/x.git"}, {}, [
        "[python_deps] x = 'git+https://example.invalid/x.git': only version constraints are accepted (\">=1.2\", "
        "\"1.2.0\" or \"\"), not URLs, git+ sources or paths"]),
    ({"x": ">=1; os_name == 'nt'"}, {}, [
        "[python_deps] x = \">=1; os_name == 'nt'\": not a version constraint (e.g. \">=1.2,<2\")"]),
    ({"x": 1}, {}, ["[python_deps] x = 1: the constraint must be a string"]),
    (["x"], {}, ["[python_deps] must be a table of name = \"constraint\" pairs"]),
])
def test_python_deps_are_read_as_codefyui_writes_them(table: object, deps: dict[str, str],
                                                       problems: list[str]) -> None:
    assert pack_deps.parse(table) == (deps, problems)


def test_a_pack_needing_a_missing_distribution_is_refused_then_installed_from_the_wheels(
        tmp_path: Path, venv: Path) -> None:
    src = write_pack(tmp_path / "deppack")
    ud = tmp_path / "ud"
    r = in_venv(venv, ud, "plugin", "install", str(src))
    assert r.returncode == 1, r
    assert f"cdui: error: {src}: pack 'deppack' needs Python distributions that cdui's environment lacks\n" \
           "  - cdui-testdep>=1.0: not installed\n" in r.stderr, r.stderr
    assert "-m pip install --no-index --find-links WHEELHOUSE 'cdui-testdep>=1.0'" in r.stderr, r.stderr
    assert not (ud / "plugins" / "installed.json").exists()

    # --install-deps with no folder of wheels: refused, naming the settings.
    r = in_venv(venv, ud, "plugin", "install", "--install-deps", str(src))
    assert r.returncode == 1 and "--install-deps has no folder of wheels to install cdui-testdep>=1.0 from" \
        in r.stderr, r.stderr
    # A wheelhouse without it: pip --no-index finds nothing, and says so.
    empty = tmp_path / "empty-wheels"
    empty.mkdir()
    r = in_venv(venv, ud, "plugin", "install", "--install-deps", str(src), env={"CODEFYUI_WHEELHOUSE": str(empty)})
    assert r.returncode == 1 and "cdui-testdep>=1.0 could not be installed from" in r.stderr, r.stderr

    wheels = tmp_path / "wheels"
    write_wheel(wheels)
    r = in_venv(venv, ud, "plugin", "install", "--install-deps", str(src), env={"CODEFYUI_PLUGIN_SOURCES": str(wheels)})
    assert r.returncode == 0, r
    assert "installed Python distributions for deppack: cdui-testdep>=1.0" in r.stdout, r.stdout
    lock = json.loads((ud / "plugins" / "installed.json").read_text())["plugins"]["deppack"]
    assert lock["python_deps"] == ["cdui-testdep>=1.0"]
    r = in_venv(venv, ud, "plugin", "info", "deppack")
    assert "  python_deps:\n    cdui-testdep>=1.0: 1.0 installed\n" in r.stdout, r.stdout
    assert "  presets: deppack:Relu\n" in r.stdout, r.stdout
    assert "  frontend: frontend/index.js (1 file(s) under frontend/; not loaded: it is CodefyUI's browser code, " \
           "see docs/plugins.md)" in r.stdout, r.stdout
    # The node that imports it loads in that environment.
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "from pathlib import Path; from cdui.nodes.registry import "
                        f"build_registry; r = build_registry(plugin_store=Path({str(ud / 'plugins')!r})); "
                        "print(sorted(n for n in r.nodes if n.startswith('deppack:')), r.load_errors)"],
                       capture_output=True, text=True, timeout=120, env=env_for(ud))
    assert r.stdout.strip() == "['deppack:Plus-Dep'] []", r
    # Never installed into the test environment itself.
    assert pack_deps.check({"cdui-testdep": "cdui-testdep"})[0].installed is None


@pytest.mark.e2e
def test_a_packs_presets_are_listed_under_its_name_and_run(tmp_path: Path) -> None:
    src = write_pack(tmp_path / "deppack")
    (src / "nodes" / "plus_dep_node.py").unlink()  # presets only: no distribution to install here
    (src / "cdui.plugin.toml").write_text(MANIFEST.replace('cdui-testdep = ">=1.0"\n', ""))
    cp = make_server(tmp_path)
    try:
        cdui(cp.user_data, "plugin", "install", str(src), launcher=True)
        listed = {p["name"]: p for p in cp.call("GET", "/api/presets")["presets"]}
        assert listed["deppack:Relu"]["category"] == "Test" and listed["deppack:Relu"]["nodes"] == 1, listed.keys()
        assert "LSTM Sequence" in listed  # the built-in ones are still there
        graph = {"nodes": [
            {"id": "start", "type": "Start", "data": {"params": {}}},
            {"id": "t", "type": "TensorCreate", "data": {"params": {"shape": "2", "fill": "ones"}}},
            {"id": "neg", "type": "preset:deppack:Relu", "data": {"params": {}}},
            {"id": "print", "type": "Print", "data": {"params": {"label": "relu"}}}],
            "edges": [{"id": "a", "source": "start", "target": "t", "sourceHandle": "trigger", "type": "trigger"},
                      {"id": "b", "source": "t", "target": "neg", "sourceHandle": "tensor", "targetHandle": "tensor"},
                      {"id": "c", "source": "neg", "target": "print", "sourceHandle": "tensor",
                       "targetHandle": "value"}]}
        run = wait_run(cp, cp.submit(graph, {"target": "local"})["id"])
        assert run["status"] == "succeeded", run
        logged = [e["data"]["message"] for e in cp.events(run["id"]) if e.get("kind") == "log"
                  and "[relu]" in str(e["data"].get("message"))]
        assert logged and "1., 1." in logged[0], logged

        # A project's graph that uses the pack's preset validates as a server opened on it would run it: the
        # installed packs are part of the registry and preset library `cdui project validate` checks against.
        cdui(cp.user_data, "project", "init", str(tmp_path / "lab"))
        (tmp_path / "lab" / "graphs" / "relu.graph.json").write_text(json.dumps(graph))
        r = cdui(cp.user_data, "project", "validate", str(tmp_path / "lab"), launcher=True, ok=False)
        assert r.returncode == 0 and "Validation passed (1 graph checked)" in r.stdout, r.stdout + r.stderr
        typo = json.loads(json.dumps(graph))
        typo["nodes"][2]["type"] = "preset:deppack:Relux"
        (tmp_path / "lab" / "graphs" / "relu.graph.json").write_text(json.dumps(typo))
        r = cdui(cp.user_data, "project", "validate", str(tmp_path / "lab"), ok=False)
        assert r.returncode == 1 and "graph relu: node neg" in r.stderr, r.stdout + r.stderr

        # Installed from a folder, its lockfile's sha256 is that of its files: a copy changed since is not pushed.
        (cp.user_data / "plugins" / "deppack" / "presets" / "relu.json").write_text(json.dumps({**PRESET, "x": 1}))
        status, body = cp.api("POST", "/api/plugins/deppack/push", {"to": "all"})
        assert (status, body["error"]["code"]) == (409, "pack_changed"), body
        assert "were changed after the install" in body["error"]["message"], body
    finally:
        cp.stop()
