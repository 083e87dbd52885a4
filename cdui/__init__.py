"""cdui: a lightweight control plane and worker agent for CodefyUI node graphs."""
from __future__ import annotations

__version__ = "0.1.0"
