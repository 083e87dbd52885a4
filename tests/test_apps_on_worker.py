"""Published apps served on a worker (docs/apps.md, "Served by a worker"): a real control plane and a real
agent process that counts as another machine (CODEFYUI_MACHINE_ID), driven through ``bin/cdui`` and HTTP.

The iris MLP is trained once for the module (one epoch: the outputs are compared, not judged), published,
and invoked with an API key on the control plane and on the worker: the worker fetches the version's
weights by sha256 over the transfer route and answers the same outputs. Its serving process killed
mid-invoke fails that invoke alone (503); an offline worker is named in the 503; a key opens neither an
owner route nor ``/ws/worker``.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import (
    REPO_ROOT,
    AgentProc,
    ServerProc,
    edge,
    graph,
    load_example,
    node,
    start_then,
    trig,
    wait_for,
    wait_run,
)

pytestmark = pytest.mark.e2e  # real server, agent and serving processes (torch imported)

BIN = str(REPO_ROOT / "bin" / "cdui")
FEATURES = [5.1, 3.5, 1.4, 0.2]
PID_NODES = textwrap.dedent('''
    """A node that writes its process's id to a file, then sleeps (until a file exists, with "until"): the test
    kills the process meanwhile, or holds it busy as long as it needs."""
    import os
    import time
    from pathlib import Path

    from cdui.nodes.base import Node, Port


    class PidThenSleep(Node):
        NODE_NAME = "TestPidThenSleep"

        @classmethod
        def define_inputs(cls):
            return [Port("value", "ANY", "{pidfile, seconds}")]

        @classmethod
        def define_outputs(cls):
            return [Port("value", "ANY", "the seconds slept")]

        def execute(self, inputs, params, ctx):
            spec = inputs["value"]
            if spec.get("pidfile"):
                Path(spec["pidfile"]).write_text(str(os.getpid()))
            end = time.time() + float(spec.get("seconds", 0))
            while time.time() < end and not (spec.get("until") and Path(spec["until"]).exists()):
                time.sleep(0.05)
            return {"value": float(spec.get("seconds", 0))}


    class Noop(Node):
        """An ordinary run's whole work."""
        NODE_NAME = "TestNoop"

        def execute(self, inputs, params, ctx):
            return {}
''')


def _bench_apps() -> Any:
    """bench/apps.py, for its iris inference graph (the one the benchmark measures)."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_apps", REPO_ROOT / "bench" / "apps.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(REPO_ROOT / "bench"))


def pid_graph() -> dict[str, Any]:
    return graph([node("start", "Start"), node("in", "GraphInput", name="spec", type="json"),
                  node("s", "TestPidThenSleep"), node("out", "GraphOutput", name="slept")],
                 [trig("start", "in"), edge("in", "value", "s", "value"), edge("s", "value", "out", "value")],
                 name="pid")


def cdui(srv: ServerProc, *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([BIN, *args], env=srv.env, cwd=str(REPO_ROOT), text=True, capture_output=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"cdui {' '.join(args)}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return r


class Setup:
    def __init__(self, cp: ServerProc, agent: AgentProc, key: str, key_id: int) -> None:
        self.cp, self.agent, self.key, self.key_id = cp, agent, key, key_id

    def invoke(self, slug: str, inputs: dict[str, Any]) -> tuple[int, Any]:
        """As ``curl -H "Authorization: Bearer KEY" -d '{"inputs": ...}' URL`` calls it."""
        r = self.cp.raw("POST", f"/api/apps/{slug}/invoke", json.dumps({"inputs": inputs}).encode(), token=False,
                        headers={"Authorization": f"Bearer {self.key}"}, timeout=300)
        return r.status, r.json()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("apps-on-worker")
    cp = ServerProc(tmp, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1"})
    for data in (cp.data_dir, tmp / "agent-w2-data"):
        (data / "custom_nodes").mkdir(parents=True, exist_ok=True)
        (data / "custom_nodes" / "pid_nodes.py").write_text(PID_NODES)
    cp.start()
    agent = AgentProc(tmp, cp.url, cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1})["token"])
    try:
        agent.spawn()
        train = load_example()
        for n in train["nodes"]:
            if n["id"] == "train":
                n["data"]["params"]["epochs"] = 1
        run = cp.call("POST", "/api/runs", {"graph": train, "options": {"target": "local", "device": "cpu"}})
        assert wait_run(cp, run["id"])["status"] == "succeeded", cp.events(run["id"])[-5:]
        cp.call("PUT", "/api/graphs/iris", _bench_apps().inference_graph(train))
        cp.call("PUT", "/api/graphs/pid", pid_graph())

        def online() -> bool:
            assert agent.alive, agent.log_tail(30)
            return any(w["name"] == "w2" and w["online"] for w in cp.call("GET", "/api/workers")["workers"])
        wait_for(online, 120, 0.2, "worker w2 online")
        out = cdui(cp, "keys", "create", "lab client")
        key = out.stdout.strip()
        key_id = next(k["id"] for k in cp.call("GET", "/api/keys")["keys"] if k["name"] == "lab client")
        yield Setup(cp, agent, key, key_id)
    finally:
        agent.stop()
        cp.stop()


def test_iris_published_on_a_worker_answers_as_on_the_control_plane(setup: Setup) -> None:
    cp = setup.cp
    out = cdui(cp, "apps", "publish", "iris", "--slug", "iris", "--create", "--serve-on", "w2")
    assert out.stdout.strip() == "app iris: version 1 published and serving (new app)"
    listed = cdui(cp, "apps", "list").stdout.splitlines()
    assert listed[0].split()[-3:] == ["served", "on", "updated"] and listed[1].split()[-3] == "w2", listed

    kept = next(iter((cp.data_dir / "models" / "app-weights").iterdir())).name
    weights_path = f"/api/models/download/app-weights/{kept}/model.pt"

    def worker_download(path: str) -> int:
        return cp.raw("GET", path, token=False, headers={"Authorization": f"Bearer {setup.agent.credential}"}).status
    # A worker downloads a version's weights only once it was sent an invoke of that version; never other files.
    assert worker_download(weights_path) == 403

    status, on_worker = setup.invoke("iris", {"features": FEATURES})
    assert (status, on_worker["status"], on_worker["worker"]) == (200, "succeeded", "w2"), on_worker
    assert (worker_download(weights_path), worker_download("/api/models/download/iris/model.pt")) == (200, 403)
    # The version's weights came to the worker by their sha256, into its own folder.
    weights = cp.call("GET", "/api/apps/iris/versions")["versions"][0]
    cached = setup.agent.user_data / "agent-apps" / "agent-cache" / kept
    assert cached.is_file(), (weights, sorted(p.name for p in (setup.agent.user_data / "agent-apps").rglob("*")))
    status, again = setup.invoke("iris", {"features": FEATURES})  # warm: the same process answers
    assert (status, again["outputs"]) == (200, on_worker["outputs"])

    cdui(cp, "apps", "serve-on", "iris", "local")
    status, here = setup.invoke("iris", {"features": FEATURES})
    assert (status, here["worker"]) == (200, None), here
    assert here["outputs"] == on_worker["outputs"]
    assert here["outputs"]["class"]["dtype"] == "int64" and here["outputs"]["class"]["values"] in (0, 1, 2)

    # "any": a connected worker (w2 is the only one), warm already.
    cdui(cp, "apps", "serve-on", "iris", "any", "--device", "cpu")
    status, anywhere = setup.invoke("iris", {"features": FEATURES})
    assert (status, anywhere["worker"], anywhere["device"]) == (200, "w2", "cpu"), anywhere
    assert anywhere["outputs"] == on_worker["outputs"]

    # A worker that is not connected is named in a clear 503; the invoke is recorded.
    cdui(cp, "apps", "serve-on", "iris", "w9")
    status, out9 = setup.invoke("iris", {"features": FEATURES})
    assert (status, out9["error"]["code"], out9["error"]["details"]) == (503, "app_worker_offline", {"worker": "w9"})
    assert "'w9'" in out9["error"]["message"]
    cdui(cp, "apps", "serve-on", "iris", "w2")

    # Revoking the key refuses its next call.
    cdui(cp, "keys", "revoke", str(setup.key_id), "--yes")
    status, refused = setup.invoke("iris", {"features": FEATURES})
    assert (status, refused["error"]["code"]) == (401, "unauthorized")
    setup.key = cdui(cp, "keys", "create", "lab client 2").stdout.strip()


def test_the_worker_serving_process_killed_mid_invoke_fails_that_invoke_only(setup: Setup, tmp_path: Path) -> None:
    cp = setup.cp
    cp.call("POST", "/api/apps/pid/publish", {"graph": "pid", "create": True, "serve_on": "w2"}, expect=201)
    pidfile = tmp_path / "pid"
    got: list[tuple[int, Any]] = []
    t = threading.Thread(target=lambda: got.append(setup.invoke("pid", {"spec": {"pidfile": str(pidfile),
                                                                                  "seconds": 120}})))
    t.start()
    try:
        wait_for(lambda: pidfile.is_file() and pidfile.read_text(), 120, 0.1, "the invoke to start on the worker")
        pid = int(pidfile.read_text())
        serving = [w for w in cp.call("GET", "/api/workers")["workers"] if w["name"] == "w2"][0]["serving"]
        assert [(p["slug"], p["pid"]) for p in serving] == [("pid", pid)], serving
        os.kill(pid, signal.SIGKILL)
    finally:
        t.join(180)
    status, out = got[0]
    assert (status, out["error"]["code"], out["worker"]) == (503, "app_process_lost", "w2"), out
    status, out = setup.invoke("pid", {"spec": {"seconds": 0}})
    assert (status, out["outputs"]) == (200, {"slept": 0.0}), out


def w2(cp: ServerProc) -> dict[str, Any]:
    return next(w for w in cp.call("GET", "/api/workers")["workers"] if w["name"] == "w2")


def test_a_warm_process_holds_its_slot_and_a_run_waits_for_it(setup: Setup, tmp_path: Path) -> None:
    """The worker's one cpu slot is held by the app's serving process while it serves (shown in /api/workers); a
    run for that worker waits for it, and gets it once the process has been idle a moment."""
    cp = setup.cp
    # Only this test's process on w2: the others' end (moving an app ends its processes where it was served).
    for app in cp.call("GET", "/api/apps")["apps"]:
        cp.call("PATCH", f"/api/apps/{app['slug']}", {"serve_on": "local"})
    wait_for(lambda: w2(cp)["serving"] == [], 60, 0.1, "the other apps' processes on w2 to end")
    cp.call("POST", "/api/apps/pid/publish", {"graph": "pid", "create": True, "serve_on": "w2"}, expect=(201,))
    pidfile = tmp_path / "pid"
    release = tmp_path / "release"
    got: list[tuple[int, Any]] = []
    t = threading.Thread(target=lambda: got.append(setup.invoke("pid", {"spec": {
        "pidfile": str(pidfile), "seconds": 120, "until": str(release)}})))
    t.start()
    try:
        wait_for(lambda: pidfile.is_file() and pidfile.read_text(), 120, 0.1, "the invoke to start on the worker")
        wait_for(lambda: [p["state"] for p in w2(cp)["serving"]] == ["busy"] and
                 [(d["device"], d["slots"], d["in_use"]) for d in w2(cp)["devices"]] == [("cpu", 1, 1)], 60, 0.1,
                 "the busy serving process to hold w2's cpu slot", lambda: w2(cp))
        run = cp.submit(start_then("TestNoop"), {"target": {"worker": "w2"}})

        def reason() -> str | None:
            r = cp.run(run["id"])
            return r["queue_reason"] if r["queue_reason"] != "waiting for the scheduler" else None
        why = wait_for(reason, 60, 0.1, "the run's reason to wait")
        assert cp.run(run["id"])["status"] == "queued", why
    finally:
        release.write_text("go")
        t.join(180)
    assert (got[0][0], got[0][1]["outputs"]) == (200, {"slept": 120.0}), got
    assert wait_run(cp, run["id"])["status"] == "succeeded"
    wait_for(lambda: w2(cp)["serving"] == [], 60, 0.1, "the idle serving process to have given its slot back")


def test_a_key_never_opens_an_owner_route_or_the_worker_socket(setup: Setup) -> None:
    cp = setup.cp
    for method, path in (("GET", "/api/workers"), ("GET", "/api/apps"), ("PATCH", "/api/apps/iris"),
                         ("GET", "/ws/worker"), ("POST", "/api/workers/enroll")):
        r = cp.raw(method, path, b"{}", token=False, headers={"Authorization": f"Bearer {setup.key}"})
        assert (r.status, r.json()["error"]["code"]) == (403, "forbidden"), (method, path, r.body[:200])
