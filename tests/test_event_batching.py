"""Events travel in batches: the run process writes its lines in batches while it floods, the
launcher reads them in chunks, the store inserts a batch in a few multi-row statements and the control plane
checks a worker's batch in one pass. Batching changes none of what is stored: every event once,
in order, with its sequence numbers; secrets masked; the result never lost; a batch measured
against the event bound; a worker's malformed batch refused whole.
"""
from __future__ import annotations

import asyncio
import json
import math
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdui.core import event_size
from cdui.core.layout import Layout
from cdui.plane.store import Run, Store
from cdui.plane.store.event_chunks import event_rows
from cdui.run import runner, runproc
from cdui.wire import protocol
from cdui.wire.job import Job
from cdui.wire.target import Local


def new_run(run_id: str) -> Run:
    return replace(Run(id=run_id, name=run_id, status="running", target=Local(), options={"target": "local"},
                       graph={"nodes": []}, created_at=time.time()))


def ev(src_seq: int, kind: str = "log", **data: Any) -> dict[str, Any]:
    return {"src_seq": src_seq, "kind": kind, "data": data or {"message": f"event {src_seq}"}, "at": time.time()}


# -- the store ---------------------------------------------------------------------------------
def test_a_large_batch_is_stored_in_order_with_its_numbers(store: Store) -> None:
    async def go() -> None:
        await store.create_run(new_run("r"))
        n = 5000
        stored, acked = await store.append_events("r", "local", [ev(i) for i in range(1, n + 1)])
        assert acked == n and [e["seq"] for e in stored] == list(range(1, n + 1))
        # A replay overlapping the end, in disorder: only the new ones, in src_seq order.
        stored, acked = await store.append_events("r", "local", [ev(n + 2), ev(n), ev(n + 1), ev(n - 1)])
        assert [e["data"]["message"] for e in stored] == [f"event {n + 1}", f"event {n + 2}"] and acked == n + 2
        evs = await store.events("r", limit=n + 10)
        assert [e["seq"] for e in evs] == list(range(1, n + 3))
        assert [e["data"]["message"] for e in evs] == [f"event {i}" for i in range(1, n + 3)]
        rows = await store.read(lambda c: event_rows(c, "r"))
        assert [(r[2], r[0]) for r in rows] == [(i, i) for i in range(1, n + 3)]
    asyncio.run(go())


def test_every_event_of_a_batch_is_held_to_the_bound(store: Store) -> None:
    """A batch over the bound is measured event by event: the one large event is cut (and stored and
    returned cut), the others are kept whole."""
    limit = 4096

    async def go() -> None:
        await store.create_run(new_run("b"))
        big = {"message": "x" * (limit * 2), "level": "info"}
        batch = [ev(1), {**ev(2), "data": big}, ev(3)]
        stored, acked = await store.append_events("b", "local", batch, max_bytes=limit)
        assert acked == 3
        assert stored[0]["data"] == {"message": "event 1"} and stored[2]["data"] == {"message": "event 3"}
        assert stored[1]["data"] == event_size.bound_event("log", big, limit)
        assert stored[1]["data"]["truncated"]["limit"] == limit
        assert [e["data"] for e in await store.events("b")] == [e["data"] for e in stored]
    asyncio.run(go())


def test_unusual_events_in_a_batch_are_stored_as_they_were(store: Store) -> None:
    """NaN (not JSON), deep nesting, a kind that is not ASCII: stored and read back the same."""
    deep: dict[str, Any] = {}
    for _ in range(1100):
        deep = {"d": deep}

    async def go() -> None:
        await store.create_run(new_run("o"))
        batch = [ev(1, value=math.inf), ev(2, kind="lög"), {**ev(3), "data": deep}, ev(4)]
        stored, acked = await store.append_events("o", "local", batch)
        assert acked == 4 and [e["seq"] for e in stored] == [1, 2, 3, 4]
        evs = await store.events("o")
        assert evs[0]["data"] == {"value": math.inf}
        assert evs[1]["kind"] == "lög"
        assert evs[2]["data"] == deep
        assert evs[3]["data"] == {"message": "event 4"}
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(10000)  # json itself walks the deep one recursively
    try:
        asyncio.run(go())
    finally:
        sys.setrecursionlimit(old)


# -- the launcher's reading ---------------------------------------------------------------------
STAND_IN = textwrap.dedent('''
    import json, os, sys, time
    sys.stdin.readline()  # the job
    out = sys.stdout.buffer
    def line(kind, **data):
        return (json.dumps({"kind": kind, "data": data, "at": time.time()}) + "\\n").encode()
    # Many lines in one write, one line cut across two writes, lines that are not events.
    out.write(b"".join(line("log", message=f"event {i}") for i in range(3000)))
    whole = line("log", message="cut in two")
    out.write(whole[:10]); out.flush(); time.sleep(0.2); out.write(whole[10:])
    out.write(b"not json\\n" + b"\\n" + b'{"kind": "log"}, {"kind": "log"}\\n')
    out.write(line("metric", name="after", value=1.0))
    out.write(line("result", status="succeeded", error=None).rstrip(b"\\n"))  # its last line has no end
    out.flush()
''')


def _python(tmp_path: Path, script: str) -> str:
    """An interpreter path that runs ``script`` whatever arguments the launcher passes."""
    path = tmp_path / "stand_in.py"
    path.write_text(script)
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {path}\n")
    exe.chmod(0o755)
    return str(exe)


def test_the_launcher_reads_lines_however_they_were_written(tmp_path: Path) -> None:
    job = Job(run_id="r1", graph={"nodes": [], "edges": []}, slot_device="cpu", options={},
              layout=Layout.for_data_dir(tmp_path).to_json())

    async def main() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []

        async def sink(batch: list[dict[str, Any]]) -> None:
            events.extend(batch)
        handle = runner.RunHandle(job.run_id, sink, tmp_path / "run.log", [])
        await handle.start(job, python=_python(tmp_path, STAND_IN))
        return await asyncio.wait_for(handle.wait(), 60), events
    final, events = asyncio.run(main())
    assert final == {"status": "succeeded", "error": None}
    assert [e["src_seq"] for e in events] == list(range(1, len(events) + 1))
    logs = [e["data"]["message"] for e in events if e["kind"] == "log"]
    assert logs[:3001] == [*(f"event {i}" for i in range(3000)), "cut in two"]
    # Each line that is not one event becomes one warning with its text; the empty line is nothing.
    assert logs[3001:] == ["not json\n", '{"kind": "log"}, {"kind": "log"}\n']
    assert [e["kind"] for e in events[-2:]] == ["metric", "status"]


# -- a real run process --------------------------------------------------------------------------
FLOOD = '''
from cdui.nodes.base import Node, Param, Port


class SecretFlood(Node):
    """Logs ``count`` events flat out, each with the secret in it, and returns."""
    NODE_NAME = "SecretFlood"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("count", "int", 10), Param("token", "string", "")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        token = params["token"]
        for i in range(int(params["count"])):
            ctx.log(f"event {i} with {token}")
        ctx.emit("metric", {"name": token, "value": 1.0, "step": None})
        return {"value": 1.0}
'''
SECRET = "s3cr3t-batched-value"


@pytest.mark.e2e
def test_a_flood_arrives_whole_in_order_masked_and_ends_with_its_result(tmp_path: Path) -> None:
    """A run that logs thousands of events flat out: every one reaches the launcher once, in order,
    with gapless numbers, the secret masked by the run process itself (the launcher here knows no
    secret), and the run's own result ends it (it was written last, right before the process ended)."""
    nodes = tmp_path / "custom_nodes"
    nodes.mkdir()
    (nodes / "secret_flood.py").write_text(FLOOD)
    n = 20000
    g = {"format_version": 1, "name": "flood", "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "f", "type": "SecretFlood", "position": {"x": 0, "y": 0}, "data": {"params": {"count": n}}}],
        "edges": [{"id": "t", "source": "start", "sourceHandle": "trigger", "target": "f", "targetHandle": None,
                   "type": "trigger"}]}
    job = Job(run_id="r3", graph=g, slot_device="cpu", options={}, custom_nodes_dir=str(nodes),
              secrets=((("nodes", 1, "data", "params", "token"), SECRET),),
              layout=Layout.for_data_dir(tmp_path / "data").to_json())

    async def main() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        events: list[dict[str, Any]] = []

        async def sink(batch: list[dict[str, Any]]) -> None:
            events.extend(batch)
        handle = runner.RunHandle(job.run_id, sink, tmp_path / "run.log", [])  # no secret known here
        await handle.start(job)
        return await asyncio.wait_for(handle.wait(), 300), events
    final, events = asyncio.run(main())
    assert final == {"status": "succeeded", "error": None}, final
    assert [e["src_seq"] for e in events] == list(range(1, len(events) + 1))
    flood = [e["data"]["message"] for e in events if e["kind"] == "log" and
             str(e["data"].get("message", "")).startswith("event ")]
    assert flood == [f"event {i} with ***" for i in range(n)]
    assert SECRET not in json.dumps(events)
    assert any(e["kind"] == "metric" and e["data"]["name"] == "***" for e in events)
    assert events[-1]["kind"] == "status" and events[-1]["data"]["status"] == "succeeded"


# -- a worker's batch ---------------------------------------------------------------------------
def _accepted(event: Any) -> str | None:
    """None if one event is accepted on its own, else why not."""
    try:
        protocol._event(event, "events[0]")
    except protocol.ProtocolError as exc:
        return str(exc)
    return None


EVENTS = [
    {"src_seq": 1, "kind": "log", "data": {"message": "m", "level": "info"}, "at": 1.7e9},
    {"src_seq": 1, "kind": "log", "data": {"message": "m"}},
    {"src_seq": 1, "kind": "log", "data": None, "at": 1.7e9},
    {"src_seq": 1, "kind": "log"},
    {"src_seq": 1, "kind": "log", "data": {"nested": {"a": [1, {"b": 2}]}}, "at": 1700000000},
    {"src_seq": 0, "kind": "log", "data": {}},
    {"src_seq": True, "kind": "log", "data": {}},
    {"src_seq": 1.0, "kind": "log", "data": {}},
    {"src_seq": protocol.MAX_SEQ + 1, "kind": "log", "data": {}},
    {"src_seq": 1, "kind": "k" * (protocol.MAX_NAME + 1), "data": {}},
    {"src_seq": 1, "kind": 3, "data": {}},
    {"kind": "log", "data": {}},
    {"src_seq": 1, "data": {}},
    {"src_seq": 1, "kind": "log", "data": [1]},
    {"src_seq": 1, "kind": "log", "data": {}, "at": 1.0},
    {"src_seq": 1, "kind": "log", "data": {}, "at": True},
    {"src_seq": 1, "kind": "log", "data": {}, "at": "now"},
    {"src_seq": 1, "kind": "log", "data": {"x": json.loads("[" * 20 + "]" * 20)}, "at": 1.7e9},
    "not an object",
    None,
]


@pytest.mark.parametrize("event", EVENTS, ids=range(len(EVENTS)))
def test_a_batch_is_checked_as_each_event_would_be(event: Any) -> None:
    """The one-pass check of a batch accepts exactly what the check of one event does, and refuses
    the whole message with that check's words, naming the event."""
    good = EVENTS[0]
    raw = json.dumps({"type": "events", "run_id": "r1", "events": [good, good, event]})
    why = _accepted(event)
    if why is None:
        assert protocol.parse_agent_message(raw).events[2] == event
    else:
        with pytest.raises(protocol.ProtocolError) as exc:
            protocol.parse_agent_message(raw)
        assert str(exc.value) == why.replace("events[0]", "events[2]")


class _Pipe:
    """A pipe's writing end for the run process's event writer: what reached the pipe, and which of
    its flushes were made by the writing thread itself (a line written at once) rather than by the
    writer's flusher thread."""

    def __init__(self) -> None:
        self.caller = threading.get_ident()
        self.buffer: list[str] = []
        self.at_once = 0

    def write(self, text: str) -> None:
        self.buffer.append(text)

    def flush(self) -> None:
        if threading.get_ident() == self.caller:
            self.at_once += 1


def test_a_flood_s_lines_wait_for_the_batch_and_a_quiet_run_s_go_at_once() -> None:
    """The first BURST lines of a window go to the pipe at once (a run that logs now and then loses
    none of them if it then crashes); in a window that follows a full one at once (a flood) every line
    waits for the batch, so the launcher reads batches, not a line at a time; after a quiet spell a line
    goes at once again. The result line always goes at once."""
    now = [1000.0]
    pipe = _Pipe()
    out = runproc._EventPipe(pipe, clock=lambda: now[0])
    burst, window = runproc.BURST, runproc.FLUSH_EVERY_S
    for i in range(burst + 4):
        out.write(f"line {i}\n")
    assert pipe.at_once == burst
    for step in range(1, 4):  # windows that follow a full one at once: all of a flood's lines wait
        now[0] += window * 1.01
        for i in range(burst * 2):
            out.write(f"flood {step} {i}\n")
    assert pipe.at_once == burst
    out.write("result\n", now=True)
    assert pipe.at_once == burst + 1
    now[0] += window * 3  # quiet for a while: a line goes at once again
    out.write("later\n")
    assert pipe.at_once == burst + 2
    now[0] += window * 1.01  # a window that follows one that was not full: at once too
    out.write("later still\n")
    assert pipe.at_once == burst + 3
    out.flush()
    assert len(pipe.buffer) == burst + 4 + 3 * 2 * burst + 3


class _CountedPipe:
    """A real pipe's writing end, buffered as the run process's is, counting the flushes the writer's flusher
    thread made; a thread drains the reading end as a launcher would."""

    def __init__(self) -> None:
        import os
        r, w = os.pipe()
        self.out = os.fdopen(w, "w", buffering=runproc.EVENTS_BUFFER, encoding="utf-8")
        self.caller = threading.get_ident()
        self.by_flusher = 0
        self.read = 0
        self.drainer = threading.Thread(target=self._drain, args=(r,), daemon=True)
        self.drainer.start()

    def _drain(self, r: int) -> None:
        import os
        while chunk := os.read(r, 1 << 16):
            self.read += len(chunk)
        os.close(r)

    def write(self, text: str) -> None:
        self.out.write(text)

    def flush(self) -> None:
        if threading.get_ident() != self.caller:
            self.by_flusher += 1
        self.out.flush()


def test_a_flood_goes_to_the_pipe_at_most_once_a_window() -> None:
    """In a flood the flusher writes the waiting lines at most once every FLUSH_EVERY_S: flushed whenever it
    got the interpreter, it and the logging thread took turns, and a flood reached the launcher a few dozen
    lines at a time (each a read and a store job, on an agent a spool write and a frame of its own). And
    every line still reaches the pipe once the run goes quiet, without a flush of its own."""
    pipe = _CountedPipe()
    out = runproc._EventPipe(pipe)
    line = '{"kind": "log", "data": {"node_id": "f", "message": "event 1", "level": "info"}, "at": 1.5}\n'
    lines = 0
    start = time.monotonic()
    while time.monotonic() - start < 0.3:
        for _ in range(100):
            out.write(line)
        lines += 100
    took = time.monotonic() - start
    windows = took / runproc.FLUSH_EVERY_S
    assert pipe.by_flusher <= windows + 2, (pipe.by_flusher, windows)
    # Only the flusher writes a flood's last lines (the buffer goes to the pipe by itself only when full).
    deadline = time.monotonic() + 60
    while pipe.read < lines * len(line) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pipe.read == lines * len(line)


# -- a node's log line ----------------------------------------------------------------------------
LOG_TEXTS = ["event 1", "", 'quote " and backslash \\ and /slash', "line\nbreak\ttab\r\x00\x1f\x7f",
             "naïve ☃ 日本語 🎉", "lone \ud800 surrogate", "x" * 5000]


@pytest.mark.parametrize("text", LOG_TEXTS, ids=range(len(LOG_TEXTS)))
@pytest.mark.parametrize("at", [1.7e9, 1764812345.123456, 2000000000.0000002, 0.1, 1e16])
def test_a_log_line_is_byte_for_byte_what_the_encoder_writes(text: str, at: float) -> None:
    """``ctx.log`` in a run process writes its line with one format instead of the JSON encoder; the
    line must be the encoder's own, byte for byte (an agent passes the run's lines on as written)."""
    for node_id, level in ((text or "n", "info"), ("f", text)):
        want = runproc._encode_strict({"kind": "log", "data": {"node_id": node_id, "message": text, "level": level},
                                       "at": at}) + "\n"
        assert runproc._log_line(node_id, text, level, at) == want


def test_ctx_log_in_a_run_process_writes_what_emit_would() -> None:
    """The run process's ``ctx.log`` takes the format only for the usual event; a node without an id, a
    level that is not a string, or a run with secrets goes through ``emit`` (which masks), each line the
    event ``emit("log", ...)`` would have written."""
    from cdui.graph.context import RunContext

    pipe = _Pipe()
    secrets: list[Any] = []
    emit = runproc._Emitter(runproc._EventPipe(pipe), secrets)
    ctx = RunContext("r", Layout.for_data_dir(Path("/nonexistent")), emit)
    assert ctx._log is not None
    ctx.log("before any node")
    ctx.node_id = "f"
    ctx.log("plain")
    ctx.log(42, level="warning")
    ctx.log("odd level", level=3)  # type: ignore[arg-type]
    secrets.append(((), SECRET))
    ctx.log(f"the key is {SECRET}")
    emit.out.flush()
    got = [json.loads(line) for line in "".join(pipe.buffer).splitlines()]
    assert [e["data"] for e in got] == [
        {"message": "before any node", "level": "info"},
        {"node_id": "f", "message": "plain", "level": "info"},
        {"node_id": "f", "message": "42", "level": "warning"},
        {"node_id": "f", "message": "odd level", "level": 3},
        {"node_id": "f", "message": "the key is ***", "level": "info"}]
    assert all(e["kind"] == "log" and isinstance(e["at"], float) and set(e) == {"kind", "data", "at"} for e in got)
    # An emitter without a log writer of its own (a test's list, a serving process's filter): emit itself.
    seen: list[tuple[str, dict[str, Any]]] = []
    plain = RunContext("r", Layout.for_data_dir(Path("/nonexistent")), lambda k, d: seen.append((k, d)))
    plain.node_id = "g"
    plain.log("through emit")
    assert seen == [("log", {"node_id": "g", "message": "through emit", "level": "info"})]
