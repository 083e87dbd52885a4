"""Sizes in messages read as MiB and GiB, and a size just over a limit never reads as the limit."""
from __future__ import annotations

import pytest

from cdui.core.units import size_text


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 bytes"), (1000, "1000 bytes"), (1024, "1 KiB"), (1536, "1.5 KiB (1536 bytes)"),
    (64 << 20, "64 MiB"), ((64 << 20) + 1, "64.0 MiB (67108865 bytes)"), (500_000_000, "476.8 MiB (500000000 bytes)"),
    (20 << 30, "20 GiB"), (3 << 40, "3 TiB"),
])
def test_size_text(n: int, text: str) -> None:
    assert size_text(n) == text
