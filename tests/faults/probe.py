"""The run the fault suite drives: a custom node that emits numbered events and
writes files, and what the test expects of them.

``FaultProbe`` emits ``progress`` events ``tick`` 1..N (``at`` strictly
increasing), writes ``files`` output files under ``output/<folder>/`` spread
over the run, and one checkpoint into the run's own folder half-way, each
reported with ``ctx.artifact``. A file's bytes depend only on the seed and the
tick that wrote it, so the test knows every sha256 without reading the worker.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from procs import graph, node, trig

NODE_SOURCE = '''
import hashlib
import time

from cdui.graph.context import RunStopped
from cdui.nodes.base import Node, Param, Port


def content(seed, tick, size):
    block = hashlib.sha256(f"{seed}:{tick}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]


class FaultProbe(Node):
    NODE_NAME = "FaultProbe"
    CATEGORY = "test"
    WRITES_TO = "output"

    @classmethod
    def define_params(cls):
        return [Param("events", "int", 50), Param("interval", "float", 0.02), Param("files", "int", 3),
                Param("size", "int", 20000), Param("seed", "int", 0),
                Param("folder", "output_path", "fault/x")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        n, files, size, seed = (int(params[k]) for k in ("events", "files", "size", "seed"))
        folder = str(params["folder"])
        every = max(1, n // max(files, 1))
        written = 0
        for i in range(1, n + 1):
            if ctx.should_stop():
                raise RunStopped()
            ctx.progress(tick=i, ticks=n)
            if files and i % every == 0 and written < files:
                p = ctx.output_path("output", f"{folder}/f{i:05d}.bin")
                p.write_bytes(content(seed, i, size))
                ctx.artifact("output", p)
                written += 1
            if i == n // 2:
                d = ctx.run_dir() / "probe"
                d.mkdir(parents=True, exist_ok=True)
                c = d / "checkpoint.bin"
                c.write_bytes(content(seed, 0, size))
                ctx.artifact("checkpoint", c)
            time.sleep(float(params["interval"]))
        return {"value": float(n)}
'''


def content_sha(seed: int, tick: int, size: int) -> str:
    block = hashlib.sha256(f"{seed}:{tick}".encode()).digest()
    return hashlib.sha256((block * (size // len(block) + 1))[:size]).hexdigest()


def install(data_dir: Path) -> None:
    (data_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (data_dir / "custom_nodes" / "fault_probe.py").write_text(NODE_SOURCE)


def probe_graph(events: int, interval: float, files: int, size: int, seed: int, folder: str) -> dict[str, Any]:
    return graph([node("start", "Start"),
                  node("probe", "FaultProbe", events=events, interval=interval, files=files, size=size, seed=seed,
                       folder=f"{folder}/x")],
                 [trig("start", "probe")], name=f"fault probe {seed}")


def expected_files(events: int, files: int) -> list[int]:
    """The ticks at which the probe writes its output files."""
    every = max(1, events // max(files, 1))
    return [i for i in range(1, events + 1) if i % every == 0][:files]
