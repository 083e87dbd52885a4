"""LLMChat: ask a chat model over HTTP and output its answer.

Providers are CodefyUI's: ``ChatGPT API`` and ``Ollama`` speak OpenAI's
``POST {base}/chat/completions``; ``Claude API`` speaks Anthropic's
``POST {base}/v1/messages``. The base URLs are params (``openai_base_url``
and ``anthropic_base_url`` are cdui's, defaulting to the public APIs, so an
OpenAI-compatible server in the lab can be named; ``ollama_base_url`` is
CodefyUI's). ``Codex`` (ChatGPT sign-in) is not supported and says so.

The API key is a ``secret`` param: the run gets it from the run's secrets
(saved graphs, the database and logs never hold it), else from
``CODEFYUI_OPENAI_API_KEY`` / ``OPENAI_API_KEY`` (``..._ANTHROPIC_...`` for
Claude) in the run's environment, as CodefyUI reads them. It is sent only in
the request header, never in an error, a log line or an output, and redirects
are not followed (they would carry the header to another host). A key from the
environment is the machine's, not the graph's: it goes only over https to the
provider's own host, or to a host the operator lists in
``CODEFYUI_LLM_KEY_HOSTS``; and, as every secret, the run masks it in events
and errors. Loopback and link-local targets other than the allowed ports
(``CODEFYUI_NODE_NET_ALLOW_LOCAL``, Ollama's 11434 by default) are refused
(:mod:`._netguard`).

The answer is read whole (``stream: false``); CodefyUI streams it, and the
final text is the same. Standard library only (urllib); an image input is
encoded as PNG by cdui's own codec.
"""
from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from cdui.core.units import size_text
from cdui.graph.secrets import ANTHROPIC_ENV, OPENAI_ENV
from cdui.nodes.base import IMAGE, LIST, STRING, Param, Port
from cdui.nodes.builtin import _netguard
from cdui.nodes.builtin._declared import DeclaredNode, F, I, float_param, int_param
from cdui.nodes.builtin._imagecodec import encode_png
from cdui.nodes.builtin.notify import _redact  # the URL without credentials or query, as the webhook logs it

if TYPE_CHECKING:  # pragma: no cover
    from cdui.graph.context import RunContext

PROVIDERS = ["ChatGPT API", "Codex", "Claude API", "Ollama"]
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
MAX_ARRAY_CHARS = 1_000_000
MAX_IMAGE_PIXELS = 25_000_000
ANTHROPIC_VERSION = "2023-06-01"


def _first(*values: Any) -> str:
    for v in values:
        if v is not None and str(v).strip():
            return str(v).strip()
    return ""


# Where each provider's key comes from: the graph's own secret param, then this machine's environment.
_KEY_SOURCES = {"ChatGPT API": ("openai_api_key", OPENAI_ENV, "api.openai.com"),
                "Claude API": ("anthropic_api_key", ANTHROPIC_ENV, "api.anthropic.com")}


def key_and_source(provider: str, params: dict[str, Any]) -> tuple[str, str | None]:
    """The key, and the environment variable it came from (None: the graph's own param, or no key)."""
    if provider not in _KEY_SOURCES:
        return "", None
    param, env_names, _host = _KEY_SOURCES[provider]
    own = _first(params.get(param))
    if own:
        return own, None
    for name in env_names:
        value = _first(os.environ.get(name))
        if value:
            return value, name
    return "", None


def api_key(provider: str, params: dict[str, Any]) -> str:
    return key_and_source(provider, params)[0]


def _check_env_key(provider: str, url: str, source: str | None) -> None:
    """Refuse to send this machine's environment key anywhere but the provider (or an allowed host)."""
    if source is None:
        return
    host = _KEY_SOURCES[provider][2]
    if not _netguard.env_key_allowed(url, host):
        raise ValueError(f"LLMChat: the graph gives no {_KEY_SOURCES[provider][0]}, and this machine's {source} "
                         f"is sent only to https://{host}, not to {_redact(url)!r}; give the key for that server "
                         f"in the node's {_KEY_SOURCES[provider][0]} (a secret), or have the operator of this "
                         f"machine add its host to {_netguard.KEY_HOSTS}")


def _image_png(value: Any) -> str:
    """An image input as base64 PNG: a tensor (C, H, W) / (N, C, H, W) / (H, W) in [0, 1], or base64 text."""
    import torch


    if isinstance(value, str):
        text = value.strip()
        return text.split(",", 1)[1] if text.startswith("data:") and "," in text else text
    x = torch.as_tensor(value).detach().cpu()
    if x.dim() == 4:
        x = x[0]
    if x.dim() == 2:
        x = x[None]
    if x.dim() != 3 or x.shape[0] not in (1, 3, 4):
        raise ValueError(f"LLMChat: image must be (C, H, W) with 1, 3 or 4 channels, got {tuple(x.shape)}")
    if x.shape[1] * x.shape[2] > MAX_IMAGE_PIXELS:
        raise ValueError(f"LLMChat: image of {x.shape[2]}x{x.shape[1]} is more than {MAX_IMAGE_PIXELS:,} pixels")
    x = x.clamp(0, 1).mul(255).to(torch.uint8) if x.is_floating_point() else x.clamp(0, 255).to(torch.uint8)
    if x.shape[0] == 1:
        x = x.repeat(3, 1, 1)
    x = x[:3]
    png = encode_png(int(x.shape[2]), int(x.shape[1]), "RGB", bytes(x.permute(1, 2, 0).contiguous().flatten().tolist()))
    return base64.b64encode(png).decode("ascii")


def _jsonish(value: Any) -> str:
    def default(v: Any) -> Any:
        shape = getattr(v, "shape", None)
        if shape is not None:
            if hasattr(v, "numel") and v.numel() <= 4096:
                return v.tolist()
            return {"type": type(v).__name__, "shape": [int(s) for s in shape], "dtype": str(getattr(v, "dtype", ""))}
        return repr(v)

    try:
        text = json.dumps(value, ensure_ascii=False, indent=2, default=default)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > MAX_ARRAY_CHARS:
        raise ValueError(f"LLMChat: the array input is {len(text):,} characters as JSON, more than {MAX_ARRAY_CHARS:,}")
    return text


def build_request(provider: str, inputs: dict[str, Any], params: dict[str, Any]) -> tuple[str, dict[str, str],
                                                                                        dict[str, Any]]:
    """(url, headers, body) of the call (pure: checked without a server)."""
    if provider == "Codex":
        raise ValueError("LLMChat: the Codex provider signs in with a ChatGPT account, which cdui does not "
                         "support; use ChatGPT API with an API key, or Ollama")
    if provider not in PROVIDERS:
        raise ValueError(f"LLMChat: unknown provider {provider!r}; use one of {PROVIDERS}")
    model = str(params.get("model") or "").strip()
    if not model:
        raise ValueError("LLMChat requires a model id")
    parts = [str(params.get("prompt") or "").strip()]
    if inputs.get("text") is not None:
        parts.append(str(inputs["text"]))
    if inputs.get("array") is not None:
        parts.append("Array input:\n" + _jsonish(inputs["array"]))
    text = "\n\n".join(p for p in parts if p).strip()
    image = _image_png(inputs["image"]) if inputs.get("image") is not None else None
    if not text and image is None:
        raise ValueError("LLMChat needs a prompt, a text input, an image input or an array input")
    system = str(params.get("system_prompt") or "").strip()
    max_tokens, temperature = int_param(params, "max_tokens", 1024), float_param(params, "temperature", 0.7)
    key, source = key_and_source(provider, params)
    headers = {"Content-Type": "application/json", "User-Agent": "cdui-llmchat"}
    if provider == "Claude API":
        if not key:
            raise ValueError("LLMChat: the Claude API provider needs anthropic_api_key (a secret) or "
                             "ANTHROPIC_API_KEY in the run's environment")
        base = str(params.get("anthropic_base_url") or "https://api.anthropic.com").strip().rstrip("/")
        content: Any = text if image is None else [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}},
            {"type": "text", "text": text or "Describe the image."}]
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature,
                                "messages": [{"role": "user", "content": content}]}
        if system:
            body["system"] = system
        headers.update({"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION})
        url = base + "/v1/messages"
    else:
        if provider == "ChatGPT API":
            if not key:
                raise ValueError("LLMChat: the ChatGPT API provider needs openai_api_key (a secret) or "
                                 "OPENAI_API_KEY in the run's environment")
            base = str(params.get("openai_base_url") or "https://api.openai.com/v1")
            headers["Authorization"] = f"Bearer {key}"
        else:
            base = str(params.get("ollama_base_url") or "http://127.0.0.1:11434/v1")
        content = text if image is None else [
            {"type": "text", "text": text or "Describe the image."},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}}]
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                "stream": False}
        url = base.strip().rstrip("/") + "/chat/completions"
    split = urlsplit(url)
    if split.scheme not in ("http", "https") or not split.netloc:
        raise ValueError(f"LLMChat: the base URL must be an http(s) URL, got {_redact(url)!r}")
    _check_env_key(provider, url, source)
    return url, headers, body


def answer_text(provider: str, reply: Any) -> tuple[str, dict[str, int]]:
    """The answer and the token usage from a provider's JSON reply."""
    try:
        if provider == "Claude API":
            text = "".join(str(b.get("text", "")) for b in reply["content"] if b.get("type") == "text")
            usage = reply.get("usage") or {}
            return text, {"input_tokens": int(usage.get("input_tokens", 0)),
                          "output_tokens": int(usage.get("output_tokens", 0))}
        message = reply["choices"][0]["message"]
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        usage = reply.get("usage") or {}
        return str(content or ""), {"input_tokens": int(usage.get("prompt_tokens", 0)),
                                    "output_tokens": int(usage.get("completion_tokens", 0))}
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        raise ValueError(f"LLMChat: the {provider} reply has no answer where one was expected: "
                         f"{json.dumps(reply)[:300]}") from None


class LLMChatNode(DeclaredNode):
    NODE_NAME, CATEGORY = "LLMChat", "LLM"
    CACHEABLE = False  # reads the network
    DESCRIPTION = "Send a prompt (with text, image or array inputs) to a chat model and output its answer"
    INPUTS = (Port("text", STRING, "Text appended to the prompt", optional=True),
              Port("image", IMAGE, "Image sent with the prompt", optional=True),
              Port("array", LIST, "Data appended to the prompt as JSON", optional=True))
    OUTPUTS = (Port("text", STRING, "The model's answer"),)
    PARAMS = (Param("provider", "select", "ChatGPT API", "Which API to call", options=PROVIDERS),
              Param("model", "string", "gpt-5.2", "Model id (e.g. gpt-5.2, claude-sonnet-4-6, llama3.2)"),
              Param("prompt", "string", "Summarize the provided input.", "User prompt; inputs are appended"),
              Param("system_prompt", "string", "You are a helpful assistant.", "System instruction"),
              Param("openai_api_key", "secret", "", "OpenAI API key (never saved or logged)",
                    visible_when={"provider": "ChatGPT API"}),
              Param("anthropic_api_key", "secret", "", "Anthropic API key (never saved or logged)",
                    visible_when={"provider": "Claude API"}),
              Param("ollama_base_url", "string", "http://127.0.0.1:11434/v1", "Ollama's OpenAI-compatible URL",
                    visible_when={"provider": "Ollama"}),
              I("max_tokens", 1024, "Most tokens in the answer", lo=1, hi=200000),
              F("temperature", 0.7, "Sampling temperature", lo=0.0, hi=2.0),
              Param("openai_base_url", "string", "https://api.openai.com/v1",
                    "Base URL of the OpenAI-compatible API the ChatGPT API provider calls"),
              Param("anthropic_base_url", "string", "https://api.anthropic.com", "Base URL of the Anthropic API"),
              F("timeout", 120.0, "Seconds to wait for the answer", lo=1.0))

    def execute(self, inputs: dict[str, Any], params: dict[str, Any], ctx: RunContext) -> dict[str, Any]:
        provider = str(params.get("provider") or "ChatGPT API")
        url, headers, body = build_request(provider, inputs, params)
        ctx.check_stop()
        _netguard.check_url("LLMChat", url)
        request = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), headers=headers, method="POST")
        where = _redact(url)
        try:
            with _netguard.opener("LLMChat").open(request, timeout=float_param(params, "timeout", 120.0)) as resp:
                raw = resp.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            detail = exc.read(2048).decode("utf-8", "replace") if exc.fp else ""
            key = api_key(provider, params)
            if key:  # a server may echo the key it refused; the message must not carry it
                detail = detail.replace(key, "***")
            raise RuntimeError(f"LLMChat: {where} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RuntimeError(f"LLMChat: could not reach {where}: {type(reason).__name__}: {reason}; check "
                               f"that the server runs and the base URL is right") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise RuntimeError(f"LLMChat: the answer from {where} is larger than {size_text(MAX_RESPONSE_BYTES)}")
        try:
            reply = json.loads(raw)
        except ValueError:
            raise RuntimeError(f"LLMChat: {where} did not answer JSON: {raw[:200]!r}") from None
        text, usage = answer_text(provider, reply)
        ctx.log(f"LLMChat: {provider} {body.get('model')}: {usage['input_tokens']} tokens in, "
                f"{usage['output_tokens']} out")
        return {"text": text}
