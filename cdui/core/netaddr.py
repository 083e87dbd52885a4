"""The one loopback test, for a peer's address (server) and for a URL's host (CLI)."""
from __future__ import annotations

import ipaddress

from aiohttp import web


def is_loopback_host(host: str) -> bool:
    """Is ``host`` (an IP address, possibly with a ``%zone``, or ``localhost``) this machine's loopback?"""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    # A dual-stack socket (IPV6_V6ONLY off, as one handed over by a service
    # manager can be) sees an IPv4 client as ::ffff:127.0.0.1, which Python
    # does not call loopback.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def is_loopback(request: web.Request) -> bool:
    """Is the request's peer this machine's loopback?"""
    return is_loopback_host(request.remote or "") and request.remote != "localhost"
