"""Plugin packs end to end (docs/plugins.md): a pack in CodefyUI's format, written here
(tests/codefyui_pack.py), installed with ``bin/cdui plugin install``, run unchanged on the control
plane and on a real agent of "another machine"; refused where it is not installed, with the
install command; the lockfile survives a restart; unsafe and hostile packs are refused; a project
freezes its pins and restores them into a fresh user data folder.

One control plane and one agent for the module (the e2e tier); the CLI-only checks start no server.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import codefyui_pack
from procs import REPO_ROOT, env_for, wait_for, wait_run
from test_workers import Agent, make_server, token, wait_online, worker

pytestmark = pytest.mark.e2e


def cdui(user_data: Path, *args: str, launcher: bool = False, env: dict[str, str] | None = None,
         ok: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [str(REPO_ROOT / "bin" / "cdui")] if launcher else [sys.executable, "-m", "cdui"]
    r = subprocess.run([*cmd, *args], env=env_for(user_data, None, env), cwd=str(REPO_ROOT), text=True,
                       capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    if ok:
        assert r.returncode == 0, f"cdui {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A control plane (pack installed by the test), an agent on another machine, and the pack archive."""
    tmp = tmp_path_factory.mktemp("plugins")
    src = codefyui_pack.write_pack(tmp / "src")
    archive = codefyui_pack.tar_of(src, tmp / "labpack-0.2.0.tar.gz")
    cp = make_server(tmp)
    agent = Agent(tmp, cp.url, "w1", token=token(cp), env_extra={"CODEFYUI_MACHINE_ID": "plugins-w1-box",
                                                                   "CODEFYUI_AGENT_ACCEPT_PLUGINS": "1"})
    agent.spawn()
    try:
        yield {"tmp": tmp, "cp": cp, "agent": agent, "archive": archive, "src": src}
    finally:
        agent.stop()
        cp.stop()


def means_logged(cp: Any, run_id: str) -> list[str]:
    return [e["data"]["message"] for e in cp.events(run_id)
            if e.get("kind") == "log" and "[means]" in str(e.get("data", {}).get("message"))]


def test_pack_runs_locally_and_on_a_worker_and_is_refused_where_missing(lab):
    cp, agent = lab["cp"], lab["agent"]
    graph = codefyui_pack.example_graph(scale=3.0)
    # Not installed: refused at submit, with the command that installs it.
    status, body = cp.api("POST", "/api/runs", {"graph": graph, "options": {"target": "local"}})
    assert status == 400, body
    err = [e for e in body["error"]["details"] if e["code"] == "unknown_type"]
    assert "cdui plugin install labpack" in err[0]["hint"], err

    # Installed with the launcher a user types; the running control plane reloads it.
    r = cdui(cp.user_data, "plugin", "install", str(lab["archive"]), launcher=True)
    assert "installed labpack 0.2.0 (2 node types" in r.stdout, r.stdout
    lock = json.loads((cp.user_data / "plugins" / "installed.json").read_text())["plugins"]["labpack"]
    assert lock["version"] == "0.2.0" and lock["source_kind"] == "archive" and len(lock["sha256"]) == 64
    listed = cp.call("GET", "/api/plugins")["plugins"]
    assert [(p["id"], p["loaded"], p["examples"]) for p in listed] == [
        ("labpack", True, ["examples/C1-1/Column-Mean-101/graph.json"])]
    assert listed[0]["nodes"] == ["labpack:Edu-ColumnMean", "labpack:Edu-TinyLinear"]

    # Runs here, unchanged; recorded outputs carry the node's steps.
    run = wait_run(cp, cp.submit(graph, {"target": "local", "record_outputs": True})["id"])
    assert run["status"] == "succeeded", run
    assert any("3., 3." in m for m in means_logged(cp, run["id"])), means_logged(cp, run["id"])
    rec = cp.call("GET", f"/api/runs/{run['id']}/outputs/mean")
    ports = {o["port"]: o for o in rec["outputs"]}
    assert ports["__step__0__meta"]["note"] == "col_sum: Sum along rows."
    assert ports["__step__1__meta"]["note"] == "divide: Divide by the row count, then scale. (rows=3)"
    assert ports["__step__1__means"]["kind"] == "tensor" and ports["__step__1__means"]["mean"] == 3.0
    steps = [e for e in cp.events(run["id"]) if e.get("kind") == "node_steps"]
    assert [s["name"] for s in steps[0]["data"]["steps"]] == ["col_sum", "divide"], steps

    # The worker lacks the pack: its card says so, and a run sent to it is refused with the command.
    card = wait_online(cp, "w1", agent)
    assert card["packs"] == {} and [p["id"] for p in card["packs_lacking"]] == ["labpack"], card
    status, body = cp.api("POST", "/api/runs", {"graph": graph, "options": {"target": {"worker": "w1"}}})
    assert status == 400 and body["error"]["code"] == "missing_node_types", body
    assert "cdui plugin install labpack" in body["error"]["hint"], body
    r = cdui(cp.user_data, "workers", "list", ok=True)
    assert "lacks pack labpack 0.2.0" in r.stdout and "`cdui plugin install labpack`" in r.stdout, r.stdout

    # Pushed to the worker over its connection (it accepts packs): it installs it, reconnects with its new
    # catalog, and the run goes there.
    r = cdui(cp.user_data, "plugin", "push", "labpack", "--to", "w1")
    assert "w1: installed labpack 0.2.0; reconnecting with its new catalog" in r.stdout, r.stdout
    wait_for(lambda: (worker(cp, "w1") or {}).get("packs", {}).get("labpack"), 120, 0.2, "w1 reports labpack")
    assert json.loads((agent.user_data / "plugins" / "installed.json").read_text())["plugins"]["labpack"][
        "source_kind"] == "pushed"
    card = worker(cp, "w1")
    assert card["packs"]["labpack"]["sha256"] == lock["sha256"] and card["packs_lacking"] == [], card
    there = wait_run(cp, cp.submit(graph, {"target": {"worker": "w1"}})["id"])
    assert (there["status"], there["worker_id"]) == ("succeeded", "w1"), there
    assert any("3., 3." in m for m in means_logged(cp, there["id"]))

    # The lockfile survives a restart.
    cp.restart()
    assert [p["id"] for p in cp.call("GET", "/api/plugins")["plugins"]] == ["labpack"]
    again = wait_run(cp, cp.submit(graph, {"target": "local"})["id"])
    assert again["status"] == "succeeded", again

    # Uninstalled: the run is refused again, with the install command.
    r = cdui(cp.user_data, "plugin", "uninstall", "labpack")
    assert "uninstalled labpack" in r.stdout
    assert not (cp.user_data / "plugins" / "labpack").exists()
    status, body = cp.api("POST", "/api/runs", {"graph": graph, "options": {"target": "local"}})
    assert status == 400, body
    assert any("cdui plugin install labpack" in e.get("hint", "") for e in body["error"]["details"]), body


def test_unsafe_pack_refused_then_trusted(tmp_path):
    """The safety check lists every problem; --trust installs anyway and logs it."""
    bad = '''import subprocess
import os
from os.path import join


def f(x):
    eval("1")
    return x.__class__.__subclasses__()
'''
    src = codefyui_pack.write_pack(tmp_path / "src", {"nodes/evil_node.py": bad,
                                                      "examples/helper.py": "import socket\n"})
    ud = tmp_path / "ud"
    r = cdui(ud, "plugin", "install", str(src), ok=False)
    assert r.returncode == 1 and "refused, the safety check found 6 problem(s)" in r.stderr, r.stderr
    for line in ("nodes/evil_node.py:1: imports 'subprocess', which can run code or reach the interpreter",
                 "nodes/evil_node.py:2: imports 'os', which needs the 'process-env' capability",
                 "nodes/evil_node.py:7: calls eval()",
                 "nodes/evil_node.py:8: attribute '__class__'", "nodes/evil_node.py:8: attribute '__subclasses__'",
                 "examples/helper.py:1: imports 'socket', which needs the 'network' capability"):
        assert line in r.stderr, (line, r.stderr)
    assert "join" not in r.stderr  # os.path's pure helpers are fine
    assert not (ud / "plugins" / "installed.json").exists()
    r = cdui(ud, "plugin", "install", "--trust", str(src))
    assert "installed with --trust despite 6 problem(s)" in r.stderr
    log = (ud / "plugins" / "plugins.log").read_text()
    assert "installed labpack 0.2.0" in log and "with --trust despite" in log and "subprocess" in log


def test_hostile_archives_refused(tmp_path):
    ud = tmp_path / "ud"
    for kind, why in (("dotdot", "climbs out of the archive with '..'"), ("absolute", "has an absolute path"),
                      ("symlink", "is a link"), ("device", "is a special file")):
        arc = codefyui_pack.hostile_tar(tmp_path / f"{kind}.tar.gz", kind)
        r = cdui(ud, "plugin", "install", str(arc), ok=False)
        assert r.returncode == 1 and "not a safe pack archive" in r.stderr and why in r.stderr, (kind, r.stderr)
    r = cdui(ud, "plugin", "install", str(codefyui_pack.hostile_zip(tmp_path / "up.zip")), ok=False)
    assert r.returncode == 1 and "member '../zip-escaped.py' climbs out of the archive" in r.stderr, r.stderr
    assert not (ud / "plugins" / "installed.json").exists()
    assert [p.name for p in (ud / "plugins").iterdir()] == [], "nothing unpacked is left behind"
    assert not Path("/tmp/cdui-absolute-escape.py").exists() and not (tmp_path / "escaped.py").exists()
    assert not (tmp_path / "zip-escaped.py").exists() and not (ud / "zip-escaped.py").exists()


def test_link_info_freeze_and_restore(tmp_path):
    """info lists the nodes and examples; a linked pack is not frozen; restore installs exactly the pins
    into a fresh user data folder, by name from the lab's pack folder, and refuses another build."""
    src = codefyui_pack.write_pack(tmp_path / "src")
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    codefyui_pack.tar_of(src, shelf / "labpack-0.2.0.tar.gz")
    other = codefyui_pack.write_pack(tmp_path / "other", {"cdui.plugin.toml": codefyui_pack.MANIFEST.replace(
        '"labpack"', '"devpack"')})
    ud, fresh, project = tmp_path / "ud", tmp_path / "fresh", tmp_path / "proj"
    project.mkdir()
    (project / "codefyui.project.toml").write_text('[project]\nname = "lab"  # kept\n\n[publish]\ngraph = "g"\n')
    env = {"CODEFYUI_PLUGIN_SOURCES": str(shelf)}
    (ud / "agent").mkdir(parents=True)  # a worker's user data folder: installing there says to restart its agent
    r = cdui(ud, "plugin", "install", "labpack", env=env)
    assert "restart its agent" in r.stdout, r.stdout
    r = cdui(ud, "plugin", "link", str(other))
    assert "linked devpack" in r.stdout and "no safety check" in r.stdout
    info = cdui(ud, "plugin", "info", "labpack").stdout
    assert "nodes: labpack:Edu-ColumnMean, labpack:Edu-TinyLinear" in info
    assert "examples/C1-1/Column-Mean-101/graph.json" in info
    assert "devpack" in cdui(ud, "plugin", "list").stdout

    r = cdui(ud, "project", "freeze", str(project))
    assert "froze 1 pack(s)" in r.stdout and "left out linked pack(s): devpack" in r.stdout
    text = (project / "codefyui.project.toml").read_text()
    sha = json.loads((ud / "plugins" / "installed.json").read_text())["plugins"]["labpack"]["sha256"]
    assert 'name = "lab"  # kept' in text and '[publish]\ngraph = "g"' in text
    assert f'[plugins.labpack]\nversion = "0.2.0"\nsha256 = "{sha}"' in text

    r = cdui(fresh, "project", "restore", str(project), env=env)
    assert "labpack 0.2.0: installed" in r.stdout, r.stdout
    assert json.loads((fresh / "plugins" / "installed.json").read_text())["plugins"]["labpack"]["sha256"] == sha
    r = cdui(fresh, "project", "restore", str(project), env=env)
    assert "labpack 0.2.0: already installed" in r.stdout

    # Another build of the pack on the shelf than the one pinned: refused, nothing replaced.
    codefyui_pack.tar_of(codefyui_pack.write_pack(tmp_path / "v2", {"nodes/extra.py": "X = 1\n"}),
                         shelf / "labpack-0.2.0.tar.gz")
    cdui(fresh, "plugin", "uninstall", "labpack")
    r = cdui(fresh, "project", "restore", str(project), env=env, ok=False)
    assert r.returncode == 1 and f"is not the pinned {sha}" in r.stderr, r.stderr
    r = cdui(ud, "plugin", "unlink", "devpack")
    assert "unlinked devpack (its folder is left as it is)" in r.stdout and (other / "cdui.plugin.toml").exists()
