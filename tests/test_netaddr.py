"""The one loopback test, as a table."""
from __future__ import annotations

import pytest

from cdui.core.netaddr import is_loopback_host

CASES = [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("localhost", True),
    ("::ffff:127.0.0.1", True),  # an IPv4 client seen on a dual-stack socket
    ("fe80::1%eth0", False), ("::1%lo", True),
    ("192.168.1.5", False), ("::ffff:10.0.0.1", False), ("0.0.0.0", False),
    ("example.org", False), ("", False),
]


@pytest.mark.parametrize("host,expected", CASES)
def test_is_loopback_host(host: str, expected: bool) -> None:
    assert is_loopback_host(host) is expected
