"""What the web page needs from the server beyond the API: the session cookie
and the list of this server's own addresses.

The cookie lets the page open its run-event WebSocket and follow download links
without the session token in the URL (URLs end up in history, proxy logs and
``Referer`` headers). It is HttpOnly (no script reads it), SameSite=Strict, and
the auth middleware accepts it only where a browser cannot send a header (the
event WebSocket and download links, both GET) and only from a page of this same
origin: SameSite counts every port of ``localhost`` as the same site, so another
local web server's page would otherwise get the browser to send it. Every other
route still needs the ``X-CodefyUI-Token`` header, so a cookie alone changes
nothing on the server.
"""
from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

from aiohttp import web

from cdui.plane.appkeys import SESSION_TOKEN

COOKIE = "cdui_session"
# At most this many interface addresses are listed (a host with hundreds of
# virtual interfaces gets a bounded answer).
MAX_ADDRESSES = 64
_SIOCGIFADDR = 0x8915


def cookie_name(request: web.Request) -> str:
    """``cdui_session_PORT``: browsers share cookies across the ports of one host, so two servers on one
    machine would otherwise overwrite each other's cookie. The port is the server socket's, the same for
    setting and reading."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    port = sock[1] if isinstance(sock, tuple) and len(sock) >= 2 else 0
    return f"{COOKIE}_{port}"


def set_cookie(request: web.Request, response: web.StreamResponse) -> None:
    """Give the browser the session cookie (called by bootstrap and ``POST /api/auth/cookie``)."""
    response.set_cookie(cookie_name(request), request.app[SESSION_TOKEN], path="/", httponly=True,
                        samesite="Strict", secure=request.scheme == "https")


def _same_origin(request: web.Request) -> bool:
    """True when the browser says the request comes from a page of this origin (or from no page at all:
    a typed URL or a download link opened by itself)."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    own = {f"http://{request.host}", f"https://{request.host}"}
    return origin.lower() in {o.lower() for o in own}


def cookie_token(request: web.Request) -> str | None:
    """The session cookie's token, for the routes that take it (the caller checked the route)."""
    if request.method not in ("GET", "HEAD"):
        return None
    value = request.cookies.get(cookie_name(request))
    if not value or len(value) > 256 or not _same_origin(request):
        return None
    return value


async def cookie_route(request: web.Request) -> web.Response:
    """``POST /api/auth/cookie``: a page that got the token by other means (pasted) asks for the cookie.
    The auth middleware already checked the header token."""
    response = web.json_response({"cookie": cookie_name(request)})
    set_cookie(request, response)
    return response


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _ipv6_addresses() -> list[str]:
    out = []
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()[:MAX_ADDRESSES]
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if not parts or len(parts[0]) != 32:
            continue
        try:
            ip = ipaddress.IPv6Address(bytes.fromhex(parts[0]))
        except ValueError:
            continue
        if not (ip.is_loopback or ip.is_link_local):
            out.append(str(ip))
    return out


def own_addresses() -> list[str]:
    """This machine's non-loopback interface addresses, IPv4 first."""
    found: list[str] = []
    try:
        names = [n for _, n in socket.if_nameindex()][:MAX_ADDRESSES]
    except OSError:
        names = []
    for name in names:
        a = _ipv4_of(name)
        if a and not a.startswith("127.") and a not in found:
            found.append(a)
    if not found:
        try:
            infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
        except OSError:
            infos = []
        found = sorted({str(i[4][0]) for i in infos if not str(i[4][0]).startswith("127.")})
    found += [a for a in _ipv6_addresses() if a not in found]
    return found[:MAX_ADDRESSES]


async def addresses_route(request: web.Request) -> web.Response:
    """``GET /api/server/addresses``: where else this server may be reachable, for the Add worker dialog."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    port = sock[1] if isinstance(sock, tuple) and len(sock) >= 2 else None
    bound = sock[0] if isinstance(sock, tuple) and sock else None
    return web.json_response({"addresses": own_addresses(), "port": port, "bound": bound,
                              "scheme": request.scheme})


def setup(app: web.Application) -> None:
    app.router.add_post("/api/auth/cookie", cookie_route)
    app.router.add_get("/api/server/addresses", addresses_route)

