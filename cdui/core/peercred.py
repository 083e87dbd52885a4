"""Which local OS user owns the other end of a loopback TCP connection (Linux).

TCP has no ``SO_PEERCRED``; the kernel lists every TCP socket of this network
namespace in ``/proc/net/tcp`` and ``/proc/net/tcp6`` with the uid that
created it. The client's socket is the row whose *local* end is the client's
address and port and whose *remote* end is the server's; the server's own
accepted socket is the mirror row (owned by the server), so the direction
matters. A client of an IPv6 listener may appear as ``::ffff:127.0.0.1`` on
one side and as plain ``127.0.0.1`` in ``/proc/net/tcp`` on the other:
addresses are compared after unmapping IPv4-mapped IPv6.

:func:`parse_proc_net` is pure (tested as a table on sample lines);
:func:`peer_uid` is the one function that reads the files. ``None`` means the
owner could not be determined (not Linux, or no such row): callers refuse.
"""
from __future__ import annotations

import ipaddress
import struct
import sys
from collections.abc import Iterable

IpAddr = ipaddress.IPv4Address | ipaddress.IPv6Address
PROC_FILES = ("/proc/net/tcp", "/proc/net/tcp6")
# Bound what one lookup reads: a host with a huge socket table must not make
# one request allocate without limit (about 150 bytes a row, so ~400,000 rows).
MAX_PROC_BYTES = 64 * 1024 * 1024


def _norm(ip: IpAddr) -> IpAddr:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def decode_address(field: str, byteorder: str = sys.byteorder) -> tuple[IpAddr, int]:
    """``0100007F:1F90`` -> (127.0.0.1, 8080). The kernel prints each 32-bit
    word of the address in its own byte order; the port is plain hex."""
    addr_hex, _, port_hex = field.partition(":")
    if len(addr_hex) not in (8, 32) or not port_hex:
        raise ValueError(f"not a /proc/net/tcp address: {field!r}")
    fmt = "<I" if byteorder == "little" else ">I"
    raw = b"".join(struct.pack(fmt, int(addr_hex[i:i + 8], 16)) for i in range(0, len(addr_hex), 8))
    ip: IpAddr = ipaddress.IPv4Address(raw) if len(raw) == 4 else ipaddress.IPv6Address(raw)
    return _norm(ip), int(port_hex, 16)


def parse_proc_net(lines: Iterable[str], client: tuple[str, int], server: tuple[str, int],
                   byteorder: str = sys.byteorder) -> int | None:
    """The uid of the socket whose local end is ``client`` and remote end ``server``."""
    want_local = (_norm(ipaddress.ip_address(client[0].split("%")[0])), int(client[1]))
    want_remote = (_norm(ipaddress.ip_address(server[0].split("%")[0])), int(server[1]))
    for line in lines:
        cols = line.split()
        # sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
        if len(cols) < 10 or not cols[0].endswith(":"):
            continue  # the header line, or a line this parser does not know
        try:
            local = decode_address(cols[1], byteorder)
            remote = decode_address(cols[2], byteorder)
            uid = int(cols[7])
        except ValueError:
            continue
        if local == want_local and remote == want_remote:
            return uid
    return None


def _read_lines(path: str) -> list[str]:
    with open(path, "rb") as fh:
        data = fh.read(MAX_PROC_BYTES)
    return data.decode("ascii", errors="replace").splitlines()


def peer_uid(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client end of a TCP connection of this machine, or None."""
    if not sys.platform.startswith("linux"):
        return None
    for path in PROC_FILES:
        try:
            lines = _read_lines(path)
        except OSError:
            continue
        uid = parse_proc_net(lines, client, server)
        if uid is not None:
            return uid
    return None
