"""Where the network nodes (Webhook, LLMChat) may connect, and where an environment key may go.

A graph is data from whoever submitted it; the machine that runs it is the
operator's. So a graph must not turn the machine's own network position or
credentials against it:

- **Local targets.** A loopback, link-local or unspecified address (127/8,
  ``::1``, 169.254/16, ``fe80::/10``, ``0.0.0.0``/``::``, and their IPv4-mapped
  IPv6 forms) reaches this machine's own services (the control plane, an
  agent's ports, a cloud's metadata service at 169.254.169.254), and the nodes
  read up to 64 KiB of the answer back into the run. Such a target is refused
  unless its port is listed in ``CODEFYUI_NODE_NET_ALLOW_LOCAL`` (``*``: every
  port). The default lists Ollama's port (11434), which LLMChat's Ollama
  provider calls on 127.0.0.1.
- **The check is made on the address really connected to**: the host name is
  resolved once, every address is checked, and the connection goes to a
  checked address (a name that resolves to a public address first and to
  127.0.0.1 on the second lookup cannot slip through). Through an HTTP proxy
  the operator set (``http_proxy``/``https_proxy``), the proxy is the peer;
  the URL's own host is still checked before the request.
- **Environment keys.** ``OPENAI_API_KEY``/``ANTHROPIC_API_KEY`` (and their
  ``CODEFYUI_`` forms) are the operator's. LLMChat sends one only over https
  to the provider's own host (``api.openai.com``, ``api.anthropic.com``) or to a
  host listed in ``CODEFYUI_LLM_KEY_HOSTS``. A key the graph gives in its own
  secret param goes wherever the graph says: it is the graph's.

Settings are read from this process's environment: the run subprocess inherits
it from the control plane or agent that started it, so each machine's operator
decides for that machine.
"""
from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from cdui.core.config import SETTINGS_BY_NAME

ALLOW_LOCAL = "CODEFYUI_NODE_NET_ALLOW_LOCAL"
KEY_HOSTS = "CODEFYUI_LLM_KEY_HOSTS"
Resolver = Callable[[str, int], list[str]]


class TargetRefused(ValueError):
    """A node was asked to connect where this machine's settings do not allow."""


def _setting(name: str, env: Mapping[str, str] | None) -> list[str]:
    env = os.environ if env is None else env
    raw = env.get(name)
    s = SETTINGS_BY_NAME[name]
    value = s.default if raw is None else s.parse(raw)
    return [str(v).strip().lower() for v in value]


def is_local(ip: str) -> bool:
    """Loopback, link-local or unspecified (IPv4-mapped IPv6 included)."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback or addr.is_link_local or addr.is_unspecified


def local_port_allowed(port: int, allowed: list[str]) -> bool:
    return "*" in allowed or str(port) in allowed


def resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def check_addresses(what: str, host: str, port: int, addresses: list[str], allowed: list[str]) -> None:
    """Refuse when any address of ``host`` is local and its port is not allowed."""
    local = sorted({a for a in addresses if is_local(a)})
    if local and not local_port_allowed(port, allowed):
        raise TargetRefused(
            f"{what}: {host}:{port} is this machine's own address ({', '.join(local)}); loopback and link-local "
            f"targets are refused so a graph cannot reach the machine's own services. If this service is "
            f"meant to be reached, the operator of this machine adds its port to {ALLOW_LOCAL} "
            f"(now {','.join(allowed) or 'empty'}; '*' allows every port) and restarts cdui")


def url_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def check_url(what: str, url: str, env: Mapping[str, str] | None = None,
              resolver: Resolver = resolve) -> None:
    """Refuse a URL whose host is (or resolves to) a local address whose port is not allowed.

    A host that does not resolve is left to the request, which reports it as unreachable."""
    host, port = url_port(url)
    try:
        addresses = resolver(host, port)
    except OSError:
        return
    check_addresses(what, host, port, addresses, _setting(ALLOW_LOCAL, env))


def env_key_allowed(url: str, provider_host: str, env: Mapping[str, str] | None = None) -> bool:
    """May this machine's environment API key be sent to ``url``?"""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme == "https" and host == provider_host and parts.port in (None, 443):
        return True
    return host in _setting(KEY_HOSTS, env)


def _guarded_connect(what: str, allowed: list[str]) -> Callable[..., socket.socket]:
    """``socket.create_connection`` that connects only to addresses the check allows."""

    def connect(address: tuple[str, int], timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
                source_address: Any = None, **_: Any) -> socket.socket:
        host, port = address
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        check_addresses(what, host, port, [str(i[4][0]) for i in infos], allowed)
        last: OSError | None = None
        for family, stype, proto, _name, sockaddr in infos:
            sock = socket.socket(family, stype, proto)
            try:
                if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                    sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise last or OSError(f"could not connect to {host}:{port}")
    return connect


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Report a redirect as its 3xx status instead of following it: urllib
    would resend the key header to wherever the redirect points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def opener(what: str, env: Mapping[str, str] | None = None) -> urllib.request.OpenerDirector:
    """An urllib opener that follows no redirect and connects only where :func:`check_addresses` allows.

    Through a proxy tunnel (https) the peer is the operator's proxy and is not checked; a plain-http
    request through a proxy connects to the proxy too, which the operator named."""
    allowed = _setting(ALLOW_LOCAL, env)
    connect = _guarded_connect(what, allowed)

    class Conn(http.client.HTTPConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._create_connection = connect

    class TLSConn(http.client.HTTPSConnection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._create_connection = connect

    class Plain(urllib.request.HTTPHandler):
        def http_open(self, req: urllib.request.Request) -> Any:
            if req.has_proxy():
                return super().http_open(req)
            return self.do_open(Conn, req)

    class Secure(urllib.request.HTTPSHandler):
        def https_open(self, req: urllib.request.Request) -> Any:
            if getattr(req, "_tunnel_host", None):
                return super().https_open(req)
            kw: dict[str, Any] = {"context": getattr(self, "_context", None)}
            if hasattr(self, "_check_hostname"):  # Python 3.11 still passes it
                kw["check_hostname"] = self._check_hostname
            return self.do_open(TLSConn, req, **kw)

    return urllib.request.build_opener(_NoRedirect, Plain, Secure)
