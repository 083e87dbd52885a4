"""Published apps (docs/apps.md): publish, versions, API keys, invokes on the warm serving process,
its crash, and what a key may open; a real control plane in this process, its serving processes
real canvas processes (torch imported, the graph run by the real executor)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.inproc.harness import Plane, e, eventually, n, t

SLOW_NODES = textwrap.dedent('''
    """A node that takes its input's number of seconds, for the serving-process crash test."""
    import time

    from cdui.nodes.base import Node, Port


    class AppSleepNode(Node):
        NODE_NAME = "TestAppSleep"
        @classmethod
        def define_inputs(cls):
            return [Port("value", "ANY", "seconds to sleep")]

        @classmethod
        def define_outputs(cls):
            return [Port("value", "ANY", "the same number")]

        def execute(self, inputs, params, ctx):
            time.sleep(float(inputs["value"]))
            return {"value": inputs["value"]}


    class WaitFileNode(Node):
        """Waits until the file its input names exists (a run that holds its slot until the test lets it go)."""
        NODE_NAME = "TestWaitFile"
        @classmethod
        def define_inputs(cls):
            return [Port("value", "ANY", "a file's path")]

        @classmethod
        def define_outputs(cls):
            return [Port("value", "ANY", "the same path")]

        def execute(self, inputs, params, ctx):
            import os
            while not os.path.exists(inputs["value"]):
                time.sleep(0.05)
            return {"value": inputs["value"]}
''')


def waits_for(path: Path) -> dict[str, Any]:
    """A run that ends once ``path`` exists."""
    return {"nodes": [n("start", "Start"), n("in", "GraphInput", name="path", type="string", default=str(path)),
                      n("wait", "TestWaitFile")],
            "edges": [t("in"), e("in", "value", "wait", "value")]}


def scaled(factor: float) -> dict[str, Any]:
    """values (json) * factor -> scaled; seconds (number, optional) slept, then answered as slept."""
    return {"nodes": [n("start", "Start"), n("in", "GraphInput", name="values", type="json",
                                             description="numbers to scale"),
                      n("sec", "GraphInput", name="seconds", type="number", required=False, default="0"),
                      n("mul", "ScalarMultiply", scalar=factor), n("sleep", "TestAppSleep"),
                      n("out", "GraphOutput", name="scaled"), n("out2", "GraphOutput", name="slept")],
            "edges": [t("in"), t("sec"), e("in", "value", "mul", "tensor"), e("mul", "tensor", "out", "value"),
                      e("sec", "value", "sleep", "value"), e("sleep", "value", "out2", "value")]}


class Client:
    """An API client holding only an API key (no session token)."""

    def __init__(self, plane: Plane, key: str | None) -> None:
        self.plane = plane
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    async def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as s, \
                s.request(method, self.plane.url + path, json=body, headers=self.headers) as r:
            return r.status, await r.json(content_type=None)


@pytest.fixture
def plane_dirs(dirs: dict[str, Path]) -> dict[str, Path]:
    nodes = dirs["data_dir"] / "custom_nodes"
    nodes.mkdir(parents=True)
    (nodes / "app_nodes.py").write_text(SLOW_NODES)
    return dirs


@pytest.mark.e2e  # serving processes are real processes with torch imported
async def test_publish_invoke_versions_keys_and_a_crash_mid_invoke(plane_dirs: dict[str, Path]) -> None:
    async with Plane(**plane_dirs, CODEFYUI_APP_MAX_WAITING="1") as cp:
        await cp.call("PUT", "/api/graphs/scale", scaled(3.0), expect=201)
        # Publishing to an unknown slug needs "create"; slugs follow CodefyUI's rule.
        status, body = await cp.api("POST", "/api/apps/scaler/publish", {"graph": "scale"})
        assert (status, body["error"]["code"]) == (404, "app_not_found"), body
        status, body = await cp.api("POST", "/api/apps/Bad_Slug/publish", {"graph": "scale", "create": True})
        assert (status, body["error"]["code"]) == (422, "invalid_slug")
        status, body = await cp.api("POST", "/api/apps/scaler/publish", {"graph": "nope", "create": True})
        assert (status, body["error"]["code"]) == (404, "graph_not_found")
        v1 = await cp.call("POST", "/api/apps/scaler/publish",
                           {"graph": "scale", "create": True, "note": "first", "git_commit": "abc1234",
                            "git_dirty": False}, expect=201)
        assert (v1["version"], v1["active"], v1["created"]) == (1, True, True)

        key = await cp.call("POST", "/api/keys", {"name": "lab client"}, expect=201)
        assert key["key"].startswith("cdui_") and key["prefix"] == key["key"][:12]
        listed = (await cp.call("GET", "/api/keys"))["keys"]
        assert [k["prefix"] for k in listed] == [key["prefix"]] and "key" not in listed[0]
        client = Client(cp, key["key"])

        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1, 2]}})
        assert status == 200 and out["status"] == "succeeded", out["error"]
        assert out["outputs"]["scaled"]["values"] == [3.0, 6.0] and (out["app"], out["version"]) == ("scaler", 1)
        status, doc = await client.api("GET", "/api/apps/scaler/openapi.json")
        assert status == 200 and doc["info"]["version"] == "1" and doc["info"]["x-cdui-git-commit"] == "abc1234"
        schema = doc["paths"]["/api/apps/scaler/invoke"]["post"]["requestBody"]["content"]["application/json"]
        assert schema["schema"]["properties"]["inputs"]["required"] == ["values"]
        # A bad input is the caller's mistake, answered as such and recorded.
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"nope": 1}})
        assert (status, out["error"]["code"]) == (400, "bad_inputs")

        # A second version serves at once; activating the first serves its outputs again.
        await cp.call("PUT", "/api/graphs/scale", scaled(5.0))
        v2 = await cp.call("POST", "/api/apps/scaler/publish", {"graph": "scale"}, expect=201)
        assert (v2["version"], v2["created"]) == (2, False)
        out = (await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}}))[1]
        assert (out["version"], out["outputs"]["scaled"]["values"]) == (2, [5.0])
        await cp.call("POST", "/api/apps/scaler/activate", {"version": 1})
        out = (await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}}))[1]
        assert (out["version"], out["outputs"]["scaled"]["values"]) == (1, [3.0])
        status, body = await cp.api("POST", "/api/apps/scaler/activate", {"version": 9})
        assert (status, body["error"]["code"]) == (404, "version_not_found")

        async def busy() -> int | None:
            serving = (await cp.call("GET", "/api/apps"))["serving"]
            return next((p["pid"] for p in serving if p["state"] == "busy"), None)

        # Activating another version while an invoke runs: that invoke ends on its version, the next is v2's.
        pending = asyncio.ensure_future(client.api("POST", "/api/apps/scaler/invoke",
                                                   {"inputs": {"values": [1], "seconds": 2}}))
        v1_pid = await eventually(busy, "the serving process to run the slow invoke", 60)
        await cp.call("POST", "/api/apps/scaler/activate", {"version": 2})
        status, out = await asyncio.wait_for(pending, 60)
        assert (status, out["status"], out["version"]) == (200, "succeeded", 1), out["error"]
        assert out["outputs"]["slept"] == 2.0
        out = (await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}}))[1]
        assert (out["version"], out["outputs"]["scaled"]["values"]) == (2, [5.0])
        assert v1_pid not in [p["pid"] for p in (await cp.call("GET", "/api/apps"))["serving"]]

        # The serving process killed mid-invoke: that invoke alone fails (503), the next is served.
        pending = asyncio.ensure_future(client.api("POST", "/api/apps/scaler/invoke",
                                                   {"inputs": {"values": [1], "seconds": 60}}))
        pid = await eventually(busy, "the serving process to run the slow invoke", 60)
        # CODEFYUI_APP_MAX_WAITING=1: one invoke in flight, the next is refused rather than queued.
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
        assert (status, out["error"]["code"]) == (429, "app_busy")
        os.killpg(pid, signal.SIGKILL)
        status, out = await asyncio.wait_for(pending, 60)
        assert (status, out["error"]["code"]) == (503, "app_process_lost"), out
        # Its slot was given back as it ended, before its invoke was answered (not at the pool's next sweep).
        assert cp.runs.app_slots == {}
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [2]}})
        assert (status, out["outputs"]["scaled"]["values"]) == (200, [10.0])

        # Past its timeout an invoke is stopped (this node ignores the stop: its process is killed) and answered
        # 504; the next invoke is served.
        status, out = await client.api("POST", "/api/apps/scaler/invoke",
                                       {"inputs": {"values": [1], "seconds": 60}, "timeout_s": 1})
        assert (status, out["status"], out["error"]["code"]) == (504, "timeout", "timeout"), out
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [2]}})
        assert (status, out["outputs"]["scaled"]["values"]) == (200, [10.0])

        # Unpublished: refused, nothing lost; activating a version serves again.
        await cp.call("POST", "/api/apps/scaler/unpublish")
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
        assert (status, out["error"]["code"]) == (409, "app_unpublished")
        versions = (await cp.call("GET", "/api/apps/scaler/versions"))["versions"]
        assert [(v["version"], v["active"], v["note"]) for v in versions] == [(2, False, None), (1, False, "first")]
        assert (await cp.call("GET", "/api/apps"))["apps"][0]["active_version"] is None

        # Every invoke is recorded, with its key, inputs and outputs (record_io is on by default).
        invokes = (await cp.call("GET", "/api/apps/scaler/invokes"))["invokes"]
        assert [i["status"] for i in invokes][:5] == ["succeeded", "timeout", "succeeded", "failed", "failed"]
        assert all(i["key_id"] == key["id"] for i in invokes) and invokes[0]["inputs"] == {"values": [2]}
        assert invokes[0]["outputs"]["scaled"]["values"] == [10.0]
        await cp.call("PATCH", "/api/apps/scaler", {"record_io": False})
        await cp.call("POST", "/api/apps/scaler/activate", {"version": 2})
        await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
        last = (await cp.call("GET", "/api/apps/scaler/invokes?limit=1"))["invokes"][0]
        assert (last["version"], last["status"], last["inputs"], last["outputs"]) == (2, "succeeded", None, None)

        # A revoked key is refused at once; its row stays.
        await cp.call("POST", f"/api/keys/{key['id']}/revoke")
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
        assert (status, out["error"]["code"]) == (401, "unauthorized")
        assert (await cp.call("GET", "/api/keys"))["keys"][0]["revoked_at"] is not None

        await cp.call("DELETE", "/api/apps/scaler")
        assert (await cp.call("GET", "/api/apps"))["apps"] == []
        status, out = await cp.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
        assert (status, out["error"]["code"]) == (404, "app_not_found")


@pytest.mark.e2e  # serving processes are real processes with torch imported
async def test_a_version_gets_more_processes_while_every_one_is_busy(plane_dirs: dict[str, Path]) -> None:
    # Each process holds a slot of the device: two slots for two processes.
    async with Plane(**plane_dirs, CODEFYUI_APP_PROCESSES="2", CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="cpu=2") as cp:
        await cp.call("PUT", "/api/graphs/scale", scaled(3.0), expect=201)
        await cp.call("POST", "/api/apps/scaler/publish", {"graph": "scale", "create": True}, expect=201)
        slow = {"inputs": {"values": [1], "seconds": 1.5}}
        answers = await asyncio.gather(*(cp.api("POST", "/api/apps/scaler/invoke", slow) for _ in range(3)))
        assert [(status, out["status"]) for status, out in answers] == [(200, "succeeded")] * 3, answers
        pids = {p["pid"] for p in (await cp.call("GET", "/api/apps"))["serving"]}
        assert len(pids) == 2  # the third invoke waited for one of the two


@pytest.mark.e2e  # serving processes are real processes with torch imported
async def test_a_cold_invoke_waits_for_the_slot_a_run_holds(plane_dirs: dict[str, Path], tmp_path: Path) -> None:
    """One cpu slot (the default), held by a run: the app's first serving process waits for it rather than run
    beside the run, and a further process of a busy version is not started on a slot that is not free."""
    async with Plane(**plane_dirs, CODEFYUI_APP_PROCESSES="2") as cp:
        await cp.call("PUT", "/api/graphs/scale", scaled(3.0), expect=201)
        await cp.call("POST", "/api/apps/scaler/publish", {"graph": "scale", "create": True}, expect=201)
        go = tmp_path / "go"
        run = await cp.call("POST", "/api/runs", {"graph": waits_for(go), "options": {"device": "cpu"}}, expect=201)
        await cp.wait_status(run["id"], "running", timeout=120)
        invoke = asyncio.ensure_future(cp.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}}))
        await eventually(lambda: len(cp.runs.slot_waiters) == 1, "the invoke to wait for the run's slot", 60)
        assert (await cp.call("GET", "/api/apps"))["serving"] == []
        go.write_text("")
        status, out = await asyncio.wait_for(invoke, 120)
        assert (status, out["outputs"]["scaled"]["values"]) == (200, [3.0]), out
        assert (await cp.run(run["id"]))["status"] == "succeeded"
        # Three slow invokes at once: one slot, one process (the others wait for it).
        slow = {"inputs": {"values": [1], "seconds": 1}}
        answers = await asyncio.gather(*(cp.api("POST", "/api/apps/scaler/invoke", slow) for _ in range(3)))
        assert [(status, out["status"]) for status, out in answers] == [(200, "succeeded")] * 3, answers
        assert len({p["pid"] for p in (await cp.call("GET", "/api/apps"))["serving"]}) == 1


MODEL_NODES = textwrap.dedent('''
    """A model built once per serving process unless a node changes it: each build is a line in COUNT."""
    import torch

    from cdui.nodes.base import Node, Port

    COUNT = {count!r}


    class CountedModelNode(Node):
        NODE_NAME = "TestCountedModel"
        @classmethod
        def define_inputs(cls):
            return []

        @classmethod
        def define_outputs(cls):
            return [Port("model", "MODEL", "a one-weight linear model, its weight 1")]

        def execute(self, inputs, params, ctx):
            with open(COUNT, "a") as fh:
                fh.write("built\\n")
            m = torch.nn.Linear(1, 1, bias=False)
            with torch.no_grad():
                m.weight.fill_(1.0)
            return {{"model": m}}


    class BumpNode(Node):
        NODE_NAME = "TestBumpWeights"
        CACHEABLE = False  # runs at every invoke, as a training step does (with its other output, also in an app)
        @classmethod
        def define_inputs(cls):
            return [Port("model", "MODEL", "a model")]

        @classmethod
        def define_outputs(cls):
            return [Port("model", "MODEL", "the same model, each weight one more (changed in place)"),
                    Port("steps", "ANY", "how many weights it changed")]

        def execute(self, inputs, params, ctx):
            with torch.no_grad():
                for p in inputs["model"].parameters():
                    p.add_(1.0)
            return {{"model": inputs["model"], "steps": 1}}


    class ApplyNode(Node):
        NODE_NAME = "TestApplyModel"
        @classmethod
        def define_inputs(cls):
            return [Port("model", "MODEL", "a model"), Port("value", "ANY", "a number")]

        @classmethod
        def define_outputs(cls):
            return [Port("value", "ANY", "the model of the number")]

        def execute(self, inputs, params, ctx):
            with torch.no_grad():
                return {{"value": float(inputs["model"](torch.tensor([[float(inputs["value"])]]))[0, 0])}}
''')


def model_app(bump: bool) -> dict[str, Any]:
    """x -> TestApplyModel(the counted model [, its weights bumped in place]) -> y."""
    nodes = [n("start", "Start"), n("in", "GraphInput", name="x", type="number"), n("model", "TestCountedModel"),
             n("apply", "TestApplyModel"), n("out", "GraphOutput", name="y")]
    edges = [t("in"), t("model"), e("in", "value", "apply", "value"), e("apply", "value", "out", "value")]
    if bump:
        nodes.append(n("bump", "TestBumpWeights"))
        edges += [e("model", "model", "bump", "model"), e("bump", "model", "apply", "model")]
    else:
        edges.append(e("model", "model", "apply", "model"))
    return {"nodes": nodes, "edges": edges}


@pytest.mark.e2e  # serving processes are real processes with torch imported
async def test_a_serving_process_builds_its_model_once_unless_a_node_changes_it(plane_dirs: dict[str, Path],
                                                                                 tmp_path: Path) -> None:
    """The issue's "models loaded once": a node that hands back a model is answered from the serving process's
    cache at the next invoke; one whose model a later node changed in place is run again (never the changed
    model handed out twice)."""
    counts = {name: tmp_path / f"{name}.count" for name in ("kept", "bumped")}
    for name, count in counts.items():
        (plane_dirs["data_dir"] / "custom_nodes" / f"model_nodes_{name}.py").write_text(
            MODEL_NODES.format(count=str(count)).replace("TestCountedModel", f"TestCountedModel_{name}"))
    async with Plane(**plane_dirs) as cp:
        for name, bump in (("kept", False), ("bumped", True)):
            g = json.loads(json.dumps(model_app(bump)).replace("TestCountedModel", f"TestCountedModel_{name}"))
            await cp.call("PUT", f"/api/graphs/{name}", g, expect=201)
            await cp.call("POST", f"/api/apps/{name}/publish", {"graph": name, "create": True}, expect=201)
            answers = [await cp.api("POST", f"/api/apps/{name}/invoke", {"inputs": {"x": x}}) for x in (1, 2, 3)]
            weight = 2.0 if bump else 1.0  # never bumped twice: a fresh model at each invoke
            assert [(status, out["outputs"].get("y")) for status, out in answers] == \
                [(200, weight * x) for x in (1, 2, 3)], answers
            built = counts[name].read_text().count("built")
            assert built == (3 if bump else 1), (name, built)


async def test_a_key_opens_only_invokes_and_everything_survives_a_crash(dirs: dict[str, Path]) -> None:
    """No serving process is started here: every invoke is refused before one would be."""
    async with Plane(**dirs) as cp:
        await cp.call("PUT", "/api/graphs/scale", scaled_plain(), expect=201)
        await cp.call("POST", "/api/apps/scaler/publish", {"graph": "scale", "create": True}, expect=201)
        key = await cp.call("POST", "/api/keys", {"name": "ci"}, expect=201)
        client = Client(cp, key["key"])
        # Owner routes, the app management routes, and worker routes: a key is refused on each.
        for method, path in (("GET", "/api/runs"), ("GET", "/api/apps"), ("POST", "/api/keys"),
                             ("POST", "/api/apps/scaler/unpublish"), ("GET", "/api/apps/scaler/versions"),
                             ("GET", "/api/files/download/x.csv"), ("POST", "/api/runs/r1/artifacts/upload"),
                             ("POST", "/api/workers/enroll")):
            status, body = await client.api(method, path, {})
            assert (status, body["error"]["code"]) == (403, "forbidden"), (method, path, body)
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await s.ws_connect(cp.url.replace("http", "ws", 1) + "/ws/worker", headers=client.headers)
            assert refused.value.status == 403
        # A made-up key and no key at all: 401.
        for who in (Client(cp, "cdui_" + "x" * 43), Client(cp, None)):
            status, _body = await who.api("POST", "/api/apps/scaler/invoke", {"inputs": {"values": [1]}})
            assert status == 401
        # Refused before it runs, and recorded with the key that made it.
        status, out = await client.api("POST", "/api/apps/scaler/invoke", {"inputs": {}})
        assert (status, out["error"]["code"], out["invoke_id"]) == (400, "missing_inputs", 1)

        # The same pre-flight as /api/graph/run, and no saved secret in a version.
        broken = scaled_plain()
        broken["edges"].remove(t("in"))
        status, body = await cp.api("POST", "/api/apps/scaler/publish", {"graph": broken})
        assert (status, body["error"]["code"]) == (409, "untriggered_input")
        secret = scaled_plain()
        secret["nodes"].append(n("hook", "Webhook", url="http://127.0.0.1:9/x", api_key="s3cr3t-value-long-enough"))
        secret["edges"].append(t("hook"))
        status, body = await cp.api("POST", "/api/apps/scaler/publish", {"graph": secret})
        assert (status, body["error"]["code"]) == (409, "secret_in_graph"), body
        assert len((await cp.call("GET", "/api/apps/scaler/versions"))["versions"]) == 1

        # kill -9 of the control plane: apps, versions, keys and invoke records are all in the database.
        cp.crash_copy(dirs["user_data"].parent / "after-crash")
    async with Plane(dirs["user_data"].parent / "after-crash", dirs["data_dir"]) as again:
        apps = (await again.call("GET", "/api/apps"))["apps"]
        assert [(a["slug"], a["active_version"], a["versions_count"]) for a in apps] == [("scaler", 1, 1)]
        assert [k["id"] for k in (await again.call("GET", "/api/keys"))["keys"]] == [key["id"]]
        invokes = (await again.call("GET", "/api/apps/scaler/invokes"))["invokes"]
        assert [(i["status"], i["key_id"]) for i in invokes] == [("failed", key["id"])]
        status, _out = await Client(again, key["key"]).api("GET", "/api/apps/scaler/openapi.json")
        assert status == 200


async def test_a_version_keeps_a_copy_of_its_weights(dirs: dict[str, Path]) -> None:
    """Weights saved again over the file a version loads do not change that version: publish copies them."""
    async with Plane(**dirs) as cp:
        models = Path(cp.runs.layout.folder("models"))
        (models / "iris").mkdir(parents=True)
        (models / "iris" / "w.pt").write_bytes(b"weights one")
        g = scaled_plain()
        g["nodes"].append(n("load", "ModelLoader", path="iris/w.pt", load_mode="full_model"))
        g["edges"].append(t("load"))
        v1 = await cp.call("POST", "/api/apps/loader/publish", {"graph": g, "create": True}, expect=201)
        (models / "iris" / "w.pt").write_bytes(b"weights two")
        v2 = await cp.call("POST", "/api/apps/loader/publish", {"graph": g}, expect=201)
        (w1,), (w2,) = v1["weights"], v2["weights"]
        assert (w1["node_id"], w1["param"], w1["from"], w1["bytes"]) == ("load", "path", "iris/w.pt", 11)
        assert w1["to"].startswith("app-weights/") and w1["to"] != w2["to"]
        assert (models / w1["to"]).read_bytes() == b"weights one" and (models / w2["to"]).read_bytes() == b"weights two"
        kept = await cp.runs.store.apps.version("loader", 1)
        assert next(x for x in kept["graph"]["nodes"] if x["id"] == "load")["data"]["params"]["path"] == w1["to"]


def scaled_plain() -> dict[str, Any]:
    """values (json) * 3 -> scaled, with built-in nodes only."""
    return {"nodes": [n("start", "Start"), n("in", "GraphInput", name="values", type="json"),
                      n("mul", "ScalarMultiply", scalar=3.0), n("out", "GraphOutput", name="scaled")],
            "edges": [t("in"), e("in", "value", "mul", "tensor"), e("mul", "tensor", "out", "value")]}


async def test_the_cli_publishes_lists_and_manages_keys(dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from cdui.cli import cli

    monkeypatch.setenv("CODEFYUI_USER_DATA_DIR", str(dirs["user_data"]))
    monkeypatch.setenv("CODEFYUI_DATA_DIR", str(dirs["data_dir"]))
    async with Plane(**dirs) as cp:
        async def cdui(*argv: str) -> tuple[int, str]:
            capsys.readouterr()
            rc = await asyncio.to_thread(cli.main, [*argv, "--control", cp.url])
            return rc, capsys.readouterr().out

        await cp.call("PUT", "/api/graphs/scale", scaled_plain(), expect=201)
        rc, _out = await cdui("apps", "publish", "scale", "--slug", "scaler")
        assert rc != 0  # a new slug needs --create
        rc, out = await cdui("apps", "publish", "scale", "--slug", "scaler", "--create", "--git-commit", "abc1234",
                             "--note", "first")
        assert (rc, out.strip()) == (0, "app scaler: version 1 published and serving (new app)")
        graph_file = dirs["data_dir"].parent / "scale-file.json"
        graph_file.write_text(json.dumps(scaled_plain()))
        rc, out = await cdui("apps", "publish", str(graph_file), "--slug", "from-file", "--create")
        assert (rc, out.strip()) == (0, "app from-file: version 1 published and serving (new app)")
        rc, out = await cdui("apps", "list")
        assert rc == 0 and [line.split()[:4] for line in out.splitlines()[1:]] == [
            ["from-file", "1", "1", "0"], ["scaler", "1", "1", "0"]]
        assert (await cp.call("GET", "/api/apps/from-file/versions"))["versions"][0]["source_graph"] == "scale-file"
        await cp.call("DELETE", "/api/apps/from-file")
        rc, out = await cdui("apps", "versions", "scaler")
        assert rc == 0 and "abc1234" in out and "first" in out
        rc, out = await cdui("keys", "create", "ci")
        key = out.strip()
        assert rc == 0 and key.startswith("cdui_")
        rc, out = await cdui("keys", "list")
        assert rc == 0 and key[:12] + "..." in out and key not in out
        # Off a terminal, what cannot be undone needs --yes.
        rc, _out = await cdui("keys", "revoke", "1")
        assert rc == 2 and (await cp.call("GET", "/api/keys"))["keys"][0]["revoked_at"] is None
        rc, _out = await cdui("keys", "revoke", "1", "--yes")
        assert rc == 0 and (await cp.call("GET", "/api/keys"))["keys"][0]["revoked_at"] is not None
        rc, _out = await cdui("apps", "unpublish", "scaler", "--yes")
        assert rc == 0 and (await cp.call("GET", "/api/apps"))["apps"][0]["active_version"] is None
        rc, _out = await cdui("apps", "activate", "scaler", "1")
        assert rc == 0 and (await cp.call("GET", "/api/apps"))["apps"][0]["active_version"] == 1
        rc, _out = await cdui("apps", "delete", "scaler", "--yes")
        assert rc == 0 and (await cp.call("GET", "/api/apps"))["apps"] == []
