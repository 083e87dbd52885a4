"""Is a request's peer on this machine's loopback? (one test for every route that asks)."""
from __future__ import annotations

import ipaddress

from aiohttp import web


def is_loopback(request: web.Request) -> bool:
    try:
        ip = ipaddress.ip_address((request.remote or "").split("%")[0])
    except ValueError:
        return False
    # A dual-stack socket (IPV6_V6ONLY off, as one handed over by a service
    # manager can be) sees an IPv4 client as ::ffff:127.0.0.1, which Python
    # does not call loopback.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback
