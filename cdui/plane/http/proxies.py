"""Who the real client of a request is, when a reverse proxy stands in front of the server.

Nothing a client writes in a header is believed unless the operator named the
proxy (``CODEFYUI_TRUSTED_PROXIES``): without it the client is the socket's
peer, and the connection counts as encrypted only when it is TLS itself. That
is the same-host deployment of docs/deploy-behind-proxy.md: nginx connects
from 127.0.0.1, a loopback peer, so nothing is marked unencrypted, and nobody
on the network can make the server believe a forged ``X-Forwarded-Proto``.

With the setting, a request whose peer is one of those proxies is taken from
the headers the proxy sets: the client is the rightmost ``X-Forwarded-For``
address that is not itself a trusted proxy (addresses further left were
written by the client and prove nothing), and the scheme is the rightmost
``X-Forwarded-Proto`` value (the one the nearest proxy wrote). A peer outside
the list is the client whatever it sends.

The decision is the pure :func:`decide`, tested as a table; :func:`client_of`
applies it to an aiohttp request once and keeps the answer on the request.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web

from cdui.core.netaddr import is_loopback_host
from cdui.plane.appkeys import CONFIG

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Any of these on a request means some proxy stands between the client and us, trusted or not.
FORWARDING_HEADERS = ("X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "Forwarded", "X-Real-IP")
# A forwarded address longer than this is not an address; it is cut in what is shown and logged.
MAX_ADDRESS = 64
_REQUEST_KEY: web.RequestKey[Client] = web.RequestKey("cdui.cli.client")


@dataclass(frozen=True)
class Client:
    """The real client of one request."""
    address: str     # its IP address (the socket's peer unless a trusted proxy named another)
    encrypted: bool  # the hop from the client to the first proxy (or to us) was TLS
    proxied: bool    # a trusted proxy forwarded it

    @property
    def unencrypted(self) -> bool:
        """Marked "Unencrypted HTTP": plain HTTP from another machine. A loopback client's socket
        never crosses the network (an agent on this host, or the local end of an SSH tunnel)."""
        return not self.encrypted and not (is_loopback_host(self.address) and self.address != "localhost")


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as a proxy writes it: bare, ``[v6]``, ``[v6]:port`` or ``v4:port``; IPv4-mapped IPv6 as IPv4."""
    s = text.strip()
    if s.startswith("[") and "]" in s:
        s = s[1:s.index("]")]
    elif s.count(":") == 1:
        s = s.split(":", 1)[0]
    try:
        ip = ipaddress.ip_address(s.split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _trusted(ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None, trusted: Sequence[Network]) -> bool:
    return ip is not None and any(ip.version == n.version and ip in n for n in trusted)


def decide(peer: str, tls: bool, forwarded_for: str | None, forwarded_proto: str | None,
           trusted: Sequence[Network]) -> Client:
    """The real client, from the socket's peer, whether the socket is TLS, the two headers and the
    trusted proxies. Pure: the table in tests/test_proxies.py is its specification."""
    if not _trusted(_ip(peer), trusted) or (forwarded_for is None and forwarded_proto is None):
        return Client(peer, tls, False)
    address = peer
    if forwarded_for is not None:
        hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
        # Walk from the nearest hop outwards past the trusted proxies; the first other one is the client.
        # An entry that is not an address ends the walk: it is what the client sent, shown as it is.
        for hop in reversed(hops):
            address = hop[:MAX_ADDRESS]
            if not _trusted(_ip(hop), trusted):
                break
        ip = _ip(address)
        if ip is not None:
            address = str(ip)
    encrypted = tls
    if forwarded_proto is not None:
        values = [v.strip().lower() for v in forwarded_proto.split(",") if v.strip()]
        encrypted = bool(values) and values[-1] in ("https", "wss")
    return Client(address, encrypted, True)


def forwarding_headers(headers: Mapping[str, str]) -> list[str]:
    """The forwarding headers a request carries, whoever sent them."""
    return [h for h in FORWARDING_HEADERS if h in headers]


def client_of(request: web.Request) -> Client:
    """The real client of ``request`` under this server's ``CODEFYUI_TRUSTED_PROXIES``."""
    found = request.get(_REQUEST_KEY)
    if found is not None:
        return found
    client = decide(request.remote or "?", request.scheme == "https", request.headers.get("X-Forwarded-For"),
                    request.headers.get("X-Forwarded-Proto"), request.app[CONFIG]["CODEFYUI_TRUSTED_PROXIES"])
    request[_REQUEST_KEY] = client
    return client
