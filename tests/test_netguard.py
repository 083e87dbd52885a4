"""The network nodes (Webhook, LLMChat) cannot be turned against the machine that runs them.

Targets are a real aiohttp server on a loopback port: reached with the port allowed in
``CODEFYUI_NODE_NET_ALLOW_LOCAL``, refused (nothing arrives) without it. The machine's own
``OPENAI_API_KEY`` goes only to the provider's host over https unless ``CODEFYUI_LLM_KEY_HOSTS``
names another. The address table covers what the setting is about (loopback, link-local,
unspecified, and their IPv4-mapped forms)."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdui.core.layout import Layout
from cdui.graph.context import RunContext
from cdui.graph.secrets import environment_secrets, redact_text
from cdui.nodes.base import Node
from cdui.nodes.builtin import _netguard, llm_chat, notify

ENV_KEY = "sk-env-" + "77aa66bb55cc44dd"


class Target:
    """A real aiohttp server on 127.0.0.1 in a thread, answering an OpenAI-style reply and recording headers."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            self.seen.append(dict(request.headers))
            return web.json_response({"choices": [{"message": {"content": "hi"}}]})

        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_post("/{tail:.*}", handle)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            return runner

        asyncio.set_event_loop(self._loop)
        runner = self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> Target:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


@pytest.fixture
def target() -> Iterator[Target]:
    with Target() as t:
        yield t


@pytest.fixture
def ctx(tmp_path: Path) -> RunContext:
    return RunContext("run-1", Layout.for_data_dir(tmp_path), emit=lambda kind, data: None)


def run(node_cls: type[Node], ctx: RunContext, **params: Any) -> dict[str, Any]:
    merged = {p.name: p.default for p in node_cls.define_params()}
    merged.update(params)
    return node_cls().execute({}, merged, ctx)


def test_webhook_reaches_a_loopback_port_only_when_the_setting_allows_it(
        ctx: RunContext, target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{target.port}/hook"
    for refused in ("", "11434", str(target.port + 1)):
        monkeypatch.setenv("CODEFYUI_NODE_NET_ALLOW_LOCAL", refused)
        for fail_on_error in (True, False):  # a refusal is the machine's rule, never just a warning
            with pytest.raises(ValueError, match=rf"127.0.0.1:{target.port} is this machine's own address "
                                                 r"\(127.0.0.1\).*CODEFYUI_NODE_NET_ALLOW_LOCAL"):
                run(notify.WebhookNode, ctx, url=url, fail_on_error=fail_on_error)
    for host in ("localhost", "[::ffff:127.0.0.1]"):  # a name, and the IPv4-mapped form, resolve to loopback
        with pytest.raises(ValueError, match="this machine's own address"):
            run(notify.WebhookNode, ctx, url=f"http://{host}:{target.port}/hook")
    assert target.seen == []
    for allowed in (str(target.port), f"11434, {target.port}", "*"):
        monkeypatch.setenv("CODEFYUI_NODE_NET_ALLOW_LOCAL", allowed)
        assert run(notify.WebhookNode, ctx, url=url)["status"] == 200
    assert len(target.seen) == 3


def test_the_connection_itself_is_checked_not_only_the_url(target: Target) -> None:
    """What a second DNS answer could do (the name checked first, another address connected to) is
    stopped at connect: the opener checks the address it really connects to."""
    import urllib.request
    request = urllib.request.Request(f"http://127.0.0.1:{target.port}/x", data=b"{}", method="POST")
    with pytest.raises(_netguard.TargetRefused, match="this machine's own address"):
        _netguard.opener("Webhook", env={"CODEFYUI_NODE_NET_ALLOW_LOCAL": ""}).open(request, timeout=10)
    assert target.seen == []
    with _netguard.opener("Webhook", env={"CODEFYUI_NODE_NET_ALLOW_LOCAL": str(target.port)}).open(
            request, timeout=10) as resp:
        assert resp.status == 200


@pytest.mark.parametrize("address, local", [
    ("127.0.0.1", True), ("127.200.3.4", True), ("::1", True), ("169.254.169.254", True), ("fe80::1", True),
    ("fe80::1%eth0", True), ("0.0.0.0", True), ("::", True), ("::ffff:127.0.0.1", True),
    ("::ffff:169.254.1.1", True), ("10.0.0.5", False), ("192.168.1.2", False), ("8.8.8.8", False),
    ("2001:db8::1", False), ("not-an-ip", False)])
def test_which_addresses_are_this_machine(address: str, local: bool) -> None:
    assert _netguard.is_local(address) is local


def test_a_link_local_target_such_as_the_metadata_service_is_refused() -> None:
    def resolver(host: str, port: int) -> list[str]:
        return {"metadata.internal": ["169.254.169.254"], "mixed.example": ["93.184.216.34", "127.0.0.1"]}[host]
    for url in ("http://metadata.internal/latest/meta-data/", "https://mixed.example/hook"):
        with pytest.raises(_netguard.TargetRefused, match="this machine's own address"):
            _netguard.check_url("Webhook", url, env={}, resolver=resolver)
    # The default allows Ollama's port only.
    _netguard.check_url("LLMChat", "http://127.0.0.1:11434/v1", env={}, resolver=lambda h, p: ["127.0.0.1"])


def test_llm_chat_sends_the_machines_key_only_where_the_operator_allows(
        ctx: RunContext, target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    monkeypatch.setenv("CODEFYUI_NODE_NET_ALLOW_LOCAL", str(target.port))
    monkeypatch.delenv("CODEFYUI_LLM_KEY_HOSTS", raising=False)
    base = f"http://127.0.0.1:{target.port}/v1"
    with pytest.raises(ValueError, match=r"this machine's OPENAI_API_KEY is sent only to https://api.openai.com, "
                                         r"not to 'http://127.0.0.1:\d+/v1/chat/completions'.*"
                                         r"CODEFYUI_LLM_KEY_HOSTS") as info:
        run(llm_chat.LLMChatNode, ctx, openai_base_url=base, model="m")
    assert ENV_KEY not in str(info.value) and target.seen == []
    # http to the provider's own host is refused too: the key would cross the network in clear.
    with pytest.raises(ValueError, match="sent only to https://api.openai.com"):
        llm_chat.build_request("ChatGPT API", {}, {"openai_base_url": "http://api.openai.com/v1", "model": "m",
                                                   "prompt": "x"})
    url, headers, _ = llm_chat.build_request("ChatGPT API", {}, {"model": "m", "prompt": "x"})
    assert (url, headers["Authorization"]) == ("https://api.openai.com/v1/chat/completions", f"Bearer {ENV_KEY}")
    # The graph's own key goes where the graph says.
    assert run(llm_chat.LLMChatNode, ctx, openai_base_url=base, model="m", openai_api_key="sk-graph-own-key")
    assert target.seen[-1]["Authorization"] == "Bearer sk-graph-own-key"
    # The operator names the host: the machine's key goes there.
    monkeypatch.setenv("CODEFYUI_LLM_KEY_HOSTS", "127.0.0.1")
    assert run(llm_chat.LLMChatNode, ctx, openai_base_url=base, model="m") == {"text": "hi"}
    assert target.seen[-1]["Authorization"] == f"Bearer {ENV_KEY}"


def test_environment_keys_are_masked_like_secrets() -> None:
    env = {"OPENAI_API_KEY": ENV_KEY, "CODEFYUI_ANTHROPIC_API_KEY": "sk-ant-" + "1234abcd", "ANTHROPIC_API_KEY": "",
           "OTHER": "not-a-key-value"}
    secrets = environment_secrets(env)
    assert sorted(v for _p, v in secrets) == sorted([ENV_KEY, "sk-ant-1234abcd"])
    text = f"echo: Bearer {ENV_KEY} and {{\"k\": \"sk-ant-1234abcd\"}} not-a-key-value"
    assert redact_text(text, secrets) == 'echo: Bearer *** and {"k": "***"} not-a-key-value'
