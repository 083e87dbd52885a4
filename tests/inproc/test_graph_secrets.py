"""Secrets of saved graphs, and the network nodes' limits, on a real control plane in this process.

- A graph saved with ``PUT /api/graphs/{name}`` holding a Webhook and an LLMChat key: the keys are
  in no file under the user-data and data folders and in no API answer; a call of the saved graph
  gets its key from the call's own ``secrets`` (kept in memory, like a submitted run's).
- A key from this machine's environment (``OPENAI_API_KEY``) that a server echoes back is masked
  in the run's events and error, like a graph's own secret.

The webhook and chat targets are real aiohttp servers on a loopback port, which the network nodes
may call only because the tests allow that port (``CODEFYUI_NODE_NET_ALLOW_LOCAL``)."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.inproc.harness import Plane, e, n, t

HOOK_KEY = "sk-hook-" + "5f1e0c9a7d3b4e21"
CHAT_KEY = "sk-chat-" + "a8c4e02b9f1d7e63"
ENV_KEY = "sk-env-" + "0d9e8c7b6a5f4e3d"


def hook_graph(url: str, key: str = HOOK_KEY, chat_key: str | None = CHAT_KEY) -> dict[str, Any]:
    """msg -> Webhook(url, key) -> status; with an (unconnected) LLMChat holding a key of its own."""
    nodes = [n("start", "Start"), n("in", "GraphInput", name="msg", type="string"),
             n("hook", "Webhook", url=url, api_key=key, message="saved graph called"),
             n("out", "GraphOutput", name="status")]
    if chat_key is not None:
        nodes.append(n("chat", "LLMChat", openai_api_key=chat_key, model="m"))
    return {"nodes": nodes, "edges": [t("in"), e("in", "value", "hook", "value"), e("hook", "status", "out", "value")]}


def files_with(root: Path, needle: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle.encode() in p.read_bytes()]


def assert_nowhere(dirs: dict[str, Path], answers: dict[str, Any], *keys: str) -> None:
    for key in keys:
        for folder in dirs.values():
            assert files_with(folder, key) == [], f"{key} is in a file"
        for what, answer in answers.items():
            assert key not in json.dumps(answer), f"{key} is in the answer of {what}"


@asynccontextmanager
async def receiver(answer: Any = None) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A real HTTP server on a loopback port recording each request's headers; it answers
    ``answer`` (default ``{"ok": true}``), or, for ``"echo"``, the request's Authorization header."""
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        headers = dict(request.headers)
        seen.append({"path": request.path, "headers": headers, "body": await request.text()})
        echo = {"you_sent": headers.get("Authorization")}
        return web.json_response(echo if answer == "echo" else (answer or {"ok": True}))

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_a_saved_graph_keeps_no_secret_in_any_file_or_answer(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs) as cp:
        graph = hook_graph("http://hooks.example.invalid/x")
        answers: dict[str, Any] = {}
        answers["PUT"] = saved = await cp.call("PUT", "/api/graphs/notify", graph, expect=201)
        assert_nowhere(dirs, answers, HOOK_KEY, CHAT_KEY)
        assert saved["secrets_removed"] == ["nodes[2] (id 'hook').data.params.api_key",
                                            "nodes[4] (id 'chat').data.params.openai_api_key"]
        answers["PUT again"] = await cp.call("PUT", "/api/graphs/notify", {"graph": graph})
        answers["GET"] = got = await cp.call("GET", "/api/graphs/notify")
        assert got["nodes"][2]["data"]["params"] == {"url": "http://hooks.example.invalid/x", "api_key": "",
                                                     "message": "saved graph called"}
        answers["list"] = await cp.call("GET", "/api/graphs")
        answers["validate"] = await cp.call("POST", "/api/graphs/validate", {"graph": got})
        assert answers["validate"]["valid"] is True
        # A call's secrets are for the secret params of the graph's own nodes, and nothing else.
        for secrets, said in (({"hook": {"url": "http://elsewhere"}}, "'url', which is not a secret param"),
                              ({"nope": {"api_key": HOOK_KEY}}, "node 'nope', which the saved graph does not"),
                              ({"hook": {"api_key": 5}}, "must be a string"), ([HOOK_KEY], "must be an object")):
            status, body = await cp.api("POST", "/api/graph/run/notify", {"secrets": secrets, "inputs": {"msg": "x"}})
            assert (status, body["error"]["code"]) == (400, "bad_secrets") and said in body["error"]["message"], body
            answers[f"refused {secrets}"] = body
        assert_nowhere(dirs, answers, HOOK_KEY, CHAT_KEY)

        # A file an older version saved with the key in it: GET never shows the key, and the first
        # read writes the file back without it, so the key leaves the disk too.
        old = dirs["data_dir"] / "graphs" / "old.json"
        old.write_text(json.dumps(graph))
        assert HOOK_KEY not in json.dumps(await cp.call("GET", "/api/graphs/old"))
        assert HOOK_KEY not in old.read_text()
        assert HOOK_KEY not in json.dumps(await cp.call("GET", "/api/graphs/old"))
        assert_nowhere(dirs, answers, HOOK_KEY, CHAT_KEY)


@pytest.mark.e2e  # the call runs in a real run subprocess
async def test_a_saved_graph_call_gets_its_key_from_the_call_only(dirs: dict[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    async with receiver() as (url, seen):
        monkeypatch.setenv("CODEFYUI_NODE_NET_ALLOW_LOCAL", url.rsplit(":", 1)[1])
        async with Plane(**dirs) as cp:
            answers: dict[str, Any] = {}
            answers["PUT"] = await cp.call("PUT", "/api/graphs/notify", hook_graph(url + "/hook"), expect=201)
            answers["call"] = call = await cp.call("POST", "/api/graph/run/notify", {
                "inputs": {"msg": "hi"}, "secrets": {"hook": {"api_key": HOOK_KEY}}, "device": "cpu"})
            assert (call["status"], call["outputs"]) == ("succeeded", {"status": 200}), call
            assert seen[-1]["headers"]["Authorization"] == f"Bearer {HOOK_KEY}"
            answers["run"] = await cp.run(call["run_id"])
            answers["events"] = await cp.events(call["run_id"])
            # Without the call's secrets the saved graph sends no key: the file never supplies one.
            answers["call without"] = call = await cp.call("POST", "/api/graph/run/notify",
                                                           {"inputs": {"msg": "hi"}, "device": "cpu"})
            assert call["status"] == "succeeded" and "Authorization" not in seen[-1]["headers"], call
            assert len(seen) == 2
            answers["runs"] = await cp.call("GET", "/api/runs")
            assert_nowhere(dirs, answers, HOOK_KEY, CHAT_KEY)


@pytest.mark.e2e  # a real run subprocess with this machine's OPENAI_API_KEY in its environment
async def test_an_environment_key_echoed_back_is_masked_in_events_and_the_error(
        dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    async with receiver("echo") as (url, seen):
        monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
        monkeypatch.setenv("CODEFYUI_NODE_NET_ALLOW_LOCAL", url.rsplit(":", 1)[1])
        monkeypatch.setenv("CODEFYUI_LLM_KEY_HOSTS", "127.0.0.1")  # the operator allows this host the key
        graph = {"nodes": [n("start", "Start"), n("chat", "LLMChat", openai_base_url=url + "/v1", model="m")],
                 "edges": [t("chat")]}
        async with Plane(**dirs) as cp:
            run = await cp.call("POST", "/api/runs", {"graph": graph, "options": {"device": "cpu"}}, expect=201)
            run = await cp.wait_status(run["id"], "failed", timeout=120)
            assert seen[-1]["headers"]["Authorization"] == f"Bearer {ENV_KEY}"  # sent, and echoed back
            # The reply had no answer: the error quotes it, with the key masked.
            assert "reply has no answer" in run["error"] and "Bearer ***" in run["error"], run["error"]
            events = await cp.events(run["id"])
            assert "Bearer ***" in json.dumps(events)
            assert_nowhere(dirs, {"run": run, "events": events}, ENV_KEY)
