"""Sizes as people read them in messages: ``64 MiB``, ``20 GiB``, ``476.8 MiB (500000000 bytes)``."""
from __future__ import annotations


def size_text(n: int) -> str:
    """``n`` bytes in the largest binary unit it reaches: whole (``64 MiB``), or to one decimal with the exact
    count beside it (``476.8 MiB (500000000 bytes)``: a size just over a limit never reads as the limit)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n // scale} {unit}" if n % scale == 0 else f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"
