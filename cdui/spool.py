"""The agent's event spool: durable before sent, dropped only once acknowledged.

One folder per run under ``<user-data>/spool/<run id>/``:

- ``events.jsonl``: every event the run's recorder produced, one JSON object a
  line, appended (and fsync'ed) before the event is sent;
- ``acked``: the highest ``src_seq`` the control plane acknowledged;
- ``state.json``: what the agent knows of the run (no secrets, ever).

After an acknowledgement the acknowledged prefix is no longer needed; the
file is compacted when the run has ended and everything is acknowledged (the
folder is removed), so a long run's spool grows only with what is unacked
while the connection is down... and with what it logged, which is bounded by
the run itself.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from cdui.atomic import atomic_write


class RunSpool:
    def __init__(self, root: Path, run_id: str) -> None:
        self.dir = root / run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.events_path = self.dir / "events.jsonl"
        self.acked = self._read_int(self.dir / "acked")
        self.last_seq = 0
        self.pending: list[dict[str, Any]] = []
        if self.events_path.exists():
            for line in self.events_path.read_text(encoding="utf-8").splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a torn last line after a crash; the recorder will not reuse its seq
                self.last_seq = max(self.last_seq, int(ev["src_seq"]))
                if ev["src_seq"] > self.acked:
                    self.pending.append(ev)

    @staticmethod
    def _read_int(p: Path) -> int:
        try:
            return int(p.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def append(self, events: list[dict[str, Any]]) -> None:
        with open(self.events_path, "a", encoding="utf-8") as fh:
            for ev in events:
                fh.write(json.dumps(ev, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        for ev in events:
            self.last_seq = max(self.last_seq, ev["src_seq"])
        self.pending.extend(events)

    def ack(self, acked: int) -> None:
        if acked <= self.acked:
            return
        self.acked = acked
        atomic_write(self.dir / "acked", str(acked))
        self.pending = [e for e in self.pending if e["src_seq"] > acked]

    def unacked(self) -> list[dict[str, Any]]:
        return list(self.pending)

    def write_state(self, state: dict[str, Any]) -> None:
        atomic_write(self.dir / "state.json", json.dumps(state))

    def read_state(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def spooled_runs(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir())
