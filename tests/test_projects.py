"""Project folders (CodefyUI's layout of a lab's graph repository): `cdui project init` and `validate`
through the launcher, and a real control plane and a real agent each opened on a project with
`--project`, running a graph of its `graphs/` that reads an asset of its `assets/data/` and a secret of
its `.env`; the secret reaches the run and no stored file; a save that only moves nodes changes only the
layout file.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from canvas_page import CanvasPage, chromium
from procs import REPO_ROOT, Proc, ServerProc, env_for, wait_for, wait_run

pytestmark = pytest.mark.e2e

CDUI = str(REPO_ROOT / "bin" / "cdui")
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not installed (apt-get install git)")

# A custom node of the project: reads a file by the path a graph gives (an asset), and an environment
# variable by name, and logs the file's text and the variable's sha256 (the value itself would be masked).
PROBE = '''
import hashlib
import os
from cdui.nodes.base import Node, Param, Port


class LabProbe(Node):
    NODE_NAME = "LabProbe"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("path", "string", ""), Param("key", "string", "")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "STRING")]

    def execute(self, inputs, params, ctx):
        text = ctx.resolve(params["path"]).read_text().strip()
        secret = os.environ.get(params["key"], "")
        ctx.log("asset says " + text)
        ctx.log("secret sha256 " + hashlib.sha256(secret.encode()).hexdigest())
        ctx.log("secret itself " + secret)
        return {"value": text}
'''

SECRET_HERE = "plane-secret-5d1c9e0b7a"
SECRET_THERE = "worker-secret-83f2aa61c4"


def cdui(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CDUI, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=env or env_for(cwd / "cli-ud"))


def probe_graph() -> tuple[dict[str, Any], dict[str, Any]]:
    """(logic, layout) of graphs/probe: Start -> LabProbe -> Print."""
    logic = {"format_version": 1, "name": "probe", "nodes": [
        {"id": "start", "type": "Start", "data": {"params": {}}},
        {"id": "probe", "type": "LabProbe", "data": {"params": {"path": "assets/data/greeting.txt",
                                                                "key": "LAB_API_KEY"}}},
        {"id": "print", "type": "Print", "data": {"params": {"label": "greeting"}}}],
        "edges": [{"id": "t1", "source": "start", "target": "probe", "sourceHandle": "trigger",
                   "targetHandle": "", "type": "trigger"},
                  {"id": "d1", "source": "probe", "target": "print", "sourceHandle": "value",
                   "targetHandle": "value", "type": "data"}]}
    layout = {"format_version": 1, "positions": {"start": {"x": 0, "y": 0}, "probe": {"x": 200, "y": 0},
                                                  "print": {"x": 400, "y": 0}}, "notes": {}, "segmentGroups": []}
    return logic, layout


def git(project: Path, *args: str) -> str:
    assert GIT is not None
    r = subprocess.run([GIT, "-C", str(project), "-c", "user.name=lab", "-c", "user.email=lab@example.com", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


# -- init and validate through the launcher -------------------------------------------------------------
def test_init_then_validate_passes_and_a_broken_graph_fails_naming_the_node(tmp_path: Path) -> None:
    r = cdui("project", "init", "lab", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lab = tmp_path / "lab"
    for rel in ("codefyui.project.toml", "graphs", "layout", "assets/images", "assets/models", "assets/data",
                ".env.example", ".gitignore"):
        assert (lab / rel).exists(), rel
    assert ".env" in (lab / ".gitignore").read_text().splitlines()
    if GIT is not None:
        assert (lab / ".git").is_dir()

    r = cdui("project", "validate", "lab", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Validation passed (0 graphs checked)" in r.stdout

    logic, layout = probe_graph()
    (lab / "custom_nodes" / "probe.py").write_text(PROBE)
    (lab / "graphs" / "probe.graph.json").write_text(json.dumps(logic))
    (lab / "layout" / "probe.layout.json").write_text(json.dumps(layout))
    broken = json.loads(json.dumps(logic))
    broken["nodes"][1]["type"] = "LabProbeTypo"
    (lab / "graphs" / "broken.graph.json").write_text(json.dumps(broken))
    keyed = json.loads(json.dumps(logic))  # a key typed into a secret param would be committed
    keyed["nodes"].append({"id": "hook", "type": "Webhook", "data": {"params": {"url": "https://example.com/h",
                                                                               "api_key": "sk-typed-in-1234"}}})
    keyed["edges"].append({"id": "t2", "source": "start", "target": "hook", "sourceHandle": "trigger",
                           "targetHandle": "", "type": "trigger"})
    (lab / "graphs" / "keyed.graph.json").write_text(json.dumps(keyed))

    r = cdui("project", "validate", "lab", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "graph broken: node probe (LabProbeTypo)" in r.stderr, r.stderr
    assert "graph keyed: a secret value is written in the graph at nodes[3] (id 'hook').data.params.api_key" \
        in r.stderr, r.stderr
    assert "sk-typed-in-1234" not in r.stdout + r.stderr
    assert "graph probe" not in r.stderr  # the custom node of the project is known
    assert "2 of 3 graphs checked" in r.stderr

    r = cdui("project", "validate", "lab", "--graph", "probe", cwd=tmp_path)
    assert r.returncode == 0 and "Validation passed (1 graph checked)" in r.stdout, r.stdout + r.stderr
    r = cdui("project", "validate", "lab", "--graph", "prbe", cwd=tmp_path)
    assert r.returncode == 1 and "'prbe'" in r.stderr and "probe" in r.stderr

    # init refuses a folder holding something else, and names what is there
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    r = cdui("project", "init", "other", cwd=tmp_path)
    assert r.returncode == 2 and "notes.txt" in r.stderr and "is not a project" in r.stderr


@needs_git
def test_a_tracked_env_fails_validate(tmp_path: Path) -> None:
    assert cdui("project", "init", "lab", cwd=tmp_path).returncode == 0
    lab = tmp_path / "lab"
    (lab / ".env").write_text("LAB_API_KEY=abcdefgh\n")
    assert cdui("project", "validate", "lab", cwd=tmp_path).returncode == 0  # ignored by git: fine
    git(lab, "add", "-f", ".env")
    r = cdui("project", "validate", "lab", cwd=tmp_path)
    assert r.returncode == 1 and ".env is tracked by git" in r.stderr, r.stderr


# -- a control plane and an agent opened on a project ------------------------------------------------------
def make_project(folder: Path, secret: str, greeting: str) -> Path:
    folder.parent.mkdir(parents=True, exist_ok=True)
    r = cdui("project", "init", str(folder), cwd=folder.parent)
    assert r.returncode == 0, r.stderr
    logic, layout = probe_graph()
    (folder / "custom_nodes" / "probe.py").write_text(PROBE)
    (folder / "graphs" / "probe.graph.json").write_text(json.dumps(logic, indent=2) + "\n")
    (folder / "layout" / "probe.layout.json").write_text(json.dumps(layout, indent=2) + "\n")
    (folder / "assets" / "data" / "greeting.txt").write_text(greeting + "\n")
    (folder / ".env").write_text(f"# the lab's key\nexport LAB_API_KEY=\"{secret}\"\n")
    return folder


@pytest.fixture(scope="module")
def lab(tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("projects")
    here = make_project(tmp / "lab", SECRET_HERE, "hello from the plane's assets")
    if GIT is not None:
        git(here, "add", "-A")
        git(here, "commit", "-q", "-m", "probe")
    there = make_project(tmp / "worker" / "lab", SECRET_THERE, "hello from the worker's assets")
    server = ServerProc(tmp, name="project-server")
    server.cmd += ["--project", str(here)]
    server.start()
    token = server.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    agent = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", server.url, "--token", token,
                  "--name", "w1", "--devices", "cpu", "--foreground", "--project", str(there)],
                 env_for(tmp / "agent-ud", tmp / "agent-data", {"CODEFYUI_MACHINE_ID": "another-machine"}),
                 tmp / "agent.log", name="agent-w1")
    agent.spawn()
    # w2 shares the control plane's project as its `data` mount (a NAS): it treats it as that project.
    token = server.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    mounted = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", server.url, "--token", token,
                    "--name", "w2", "--devices", "cpu", "--foreground", "--mount", f"data={here}"],
                   env_for(tmp / "w2-ud", tmp / "w2-data", {"CODEFYUI_MACHINE_ID": "a-third-machine"}),
                   tmp / "w2.log", name="agent-w2")
    mounted.spawn()
    try:
        wait_for(lambda: {w["name"] for w in server.call("GET", "/api/workers")["workers"] if w["online"]}
                 >= {"w1", "w2"}, 180, 0.2, "workers w1 and w2 online",
                 detail=lambda: agent.log_tail(10) + "\n" + mounted.log_tail(10))
        yield {"tmp": tmp, "here": here, "there": there, "server": server, "agent": agent, "mounted": mounted}
    finally:
        mounted.stop()
        agent.stop()
        server.stop()


def logs_of(server: ServerProc, run_id: str) -> list[str]:
    return [str(e["data"].get("message")) for e in server.events(run_id) if e["kind"] == "log"]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_health_and_log_say_which_project_is_open(lab: dict[str, Any]) -> None:
    server = lab["server"]
    health = server.call("GET", "/api/health")
    assert health["project"]["name"] == "lab"
    if GIT is not None:
        commit = git(lab["here"], "rev-parse", "HEAD").strip()
        assert health["project"]["git_commit"] == commit and health["project"]["git_dirty"] is False
    status = subprocess.run([sys.executable, "-m", "cdui", "status", "--once"], capture_output=True, text=True,
                            timeout=60, env=env_for(server.user_data))
    assert "; project lab (" in status.stdout, status.stdout + status.stderr
    # a start naming another project while this one is open is refused, saying which is open
    other = lab["tmp"] / "other"
    assert cdui("project", "init", str(other), cwd=lab["tmp"]).returncode == 0
    again = subprocess.run([sys.executable, "-m", "cdui", "start", "--project", str(other)], capture_output=True,
                           text=True, timeout=60, env=env_for(server.user_data))
    assert again.returncode == 1 and "with project 'lab', not 'other'" in again.stderr, again.stderr
    log = server.log_text()
    assert f"project: {lab['here']}" in log and "1 secret(s) from .env (LAB_API_KEY)" in log
    assert f"project: {lab['there']}" in lab["agent"].log_text()
    assert f"project: {lab['here']}" in lab["mounted"].log_text()  # its data mount is a project


def run_everywhere(lab: dict[str, Any]) -> list[str]:
    """The project's graph run here, on its worker opened on another checkout, and on one with its data mount:
    once per module (the next test reads what those runs stored, whichever of the two a worker runs first)."""
    if "runs" in lab:
        return list(lab["runs"])
    server = lab["server"]
    assert "probe" in [g["name"] for g in server.call("GET", "/api/graphs")["graphs"]]
    graph = server.call("GET", "/api/graphs/probe")
    assert graph["nodes"][1]["position"] == {"x": 200, "y": 0}  # merged from layout/
    runs = []
    for target, greeting, secret in (("local", "hello from the plane's assets", SECRET_HERE),
                                     ("w1", "hello from the worker's assets", SECRET_THERE),
                                     ("w2", "hello from the plane's assets", SECRET_HERE)):
        run = server.submit(graph, {"target": target})
        final = wait_run(server, run["id"])
        logs = logs_of(server, run["id"])
        assert final["status"] == "succeeded", (target, final, logs)
        assert f"asset says {greeting}" in logs, (target, logs)
        assert f"secret sha256 {sha(secret)}" in logs, (target, logs)  # the machine's own .env value
        assert "secret itself ***" in logs, (target, logs)  # and masked where the run wrote it
        runs.append(run["id"])
    lab["runs"] = runs
    return runs


def test_a_graph_of_the_project_runs_here_and_on_the_worker_with_its_assets_and_env(lab: dict[str, Any]) -> None:
    assert len(run_everywhere(lab)) == 3


def test_env_values_are_in_no_stored_file(lab: dict[str, Any]) -> None:
    assert len(run_everywhere(lab)) == 3  # the runs whose stored files are searched below
    server = lab["server"]
    # Pasted into a param: the saved graph and the stored run do not keep it, the run still gets it.
    leaky, _layout = probe_graph()
    leaky["nodes"][2]["data"]["params"]["label"] = SECRET_HERE
    server.call("PUT", "/api/graphs/leaky", leaky)
    run = server.submit(leaky, {"target": "local"})
    assert wait_run(server, run["id"])["status"] == "succeeded", logs_of(server, run["id"])
    assert "[***] hello from the plane's assets" in logs_of(server, run["id"])
    leaks = []
    for root in (lab["tmp"],):
        for path in root.rglob("*"):
            if not path.is_file() or path.name == ".env" or ".git" in path.parts:
                continue
            data = path.read_bytes()
            for secret in (SECRET_HERE, SECRET_THERE):
                if secret.encode() in data:
                    leaks.append(f"{path}: {secret}")
    assert leaks == []


def test_a_save_that_only_moves_nodes_changes_only_the_layout_file(lab: dict[str, Any]) -> None:
    server, here = lab["server"], lab["here"]
    logic_file, layout_file = here / "graphs" / "probe.graph.json", here / "layout" / "probe.layout.json"
    graph = server.call("GET", "/api/graphs/probe")
    server.call("PUT", "/api/graphs/probe", graph)  # the first save writes the files in the project's format
    logic_before, layout_before = logic_file.read_bytes(), layout_file.read_bytes()
    for n in graph["nodes"]:
        n["position"] = {"x": n["position"]["x"] + 37, "y": n["position"]["y"] + 11}
    server.call("PUT", "/api/graphs/probe", graph)
    assert logic_file.read_bytes() == logic_before
    assert layout_file.read_bytes() != layout_before
    assert json.loads(layout_file.read_text())["positions"]["probe"] == {"x": 237, "y": 11}
    assert "position" not in logic_file.read_text()
    if GIT is not None:
        changed = [line[3:] for line in git(here, "status", "--porcelain").split("\n") if "probe" in line]
        assert changed == ["layout/probe.layout.json"], changed
    # a param edit changes the logic file
    graph["nodes"][2]["data"]["params"]["label"] = "greeting!"
    server.call("PUT", "/api/graphs/probe", graph)
    assert logic_file.read_bytes() != logic_before
    assert server.call("GET", "/api/graphs/probe")["nodes"][1]["position"] == {"x": 237, "y": 11}


def test_a_drag_on_the_canvas_then_save_changes_only_the_layout_file(lab: dict[str, Any]) -> None:
    server, here = lab["server"], lab["here"]
    logic_file, layout_file = here / "graphs" / "probe.graph.json", here / "layout" / "probe.layout.json"
    server.call("PUT", "/api/graphs/probe", server.call("GET", "/api/graphs/probe"))  # the project's own format
    logic_before, layout_before = logic_file.read_bytes(), layout_file.read_bytes()
    browser_gen = chromium()
    browser = next(browser_gen)
    try:
        cp = CanvasPage(browser, server)
        cp.page.click("#cv-open")
        cp.page.click("#cv-open-list button[aria-label='Open graph probe']")
        cp.page.wait_for_function("() => window.cduiCanvas.editor().toJSON().nodes.length === 3")
        at: dict[str, float] = cp.js("""id => { const e = window.cduiCanvas.editor();
            const n = e.graph._nodes.find((x) => String(x.cd.id) === id);
            return e.graphToClient(n.pos[0] + n.size[0] / 2, n.pos[1] - 10); }""", "print")  # its title bar
        cp.page.mouse.move(at["x"], at["y"])
        cp.page.mouse.down()
        cp.page.mouse.move(at["x"] + 40, at["y"] + 60, steps=5)
        cp.page.mouse.up()
        cp.page.wait_for_selector(".cv-tab.active .cv-tab-dirty")
        cp.js("() => window.dispatchEvent(new Event('canvas-save'))")
        cp.page.wait_for_selector(".cv-file-status:has-text('Saved to graphs/probe.graph.json and "
                                  "layout/probe.layout.json')")
        cp.close()
    finally:
        browser_gen.close()
    assert layout_file.read_bytes() != layout_before
    assert logic_file.read_bytes() == logic_before, (logic_before.decode(), logic_file.read_text())
