"""An agent passes a chunk of its run's lines through as written (a ``lines`` frame) when nothing in it is
for the agent to act on, cut or mask, and the control plane reads those lines by the same rules the agent
would have decoded them by: the events the control plane stores are the same either way. A chunk with a
line the agent acts on (the result, an artifact, a status), a secret, or an escape that could spell such a
kind, is decoded on the agent as before. The spool keeps such a block as written, reads it back after a
restart, and drops it only once all its lines are acknowledged.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cdui.agent.spool import RunSpool
from cdui.run import runner
from cdui.run.runproc import _encode_event
from cdui.wire import protocol

NOW = 1_800_000_000.0
SECRET = "hunter2-very-secret"


def line(kind: str, data: dict[str, Any]) -> bytes:
    return json.dumps({"kind": kind, "data": data, "at": 1764694000.5}).encode()


USUAL = [_encode_event("log", {"node_id": "n1", "message": f"step {i}", "level": "info"}).encode().rstrip(b"\n")
         for i in range(30)]


def record(chunks: list[list[bytes]], secrets: list[Any] | None = None, passing: bool = True
           ) -> tuple[runner.RunHandle, list[dict[str, Any]], list[protocol.Lines]]:
    """Feed ``chunks`` of lines to a recorder as an agent's (passing lines through or not); return it, the
    events as the control plane would take them (in src_seq order), and the blocks passed through."""
    sent: list[dict[str, Any]] = []
    blocks: list[protocol.Lines] = []

    async def sink(events: list[dict[str, Any]], texts: list[str | None] | None = None) -> None:
        assert texts is not None
        encoded = [t if t is not None else protocol.event_text(e) for e, t in zip(events, texts, strict=True)]
        for raw in protocol.encode_events("r1", events, encoded=encoded):
            m = protocol.parse_agent_message(raw)
            assert isinstance(m, protocol.Events)
            sent.extend(m.events)

    async def on_lines(block: protocol.Lines) -> None:
        blocks.append(block)
        m = protocol.parse_lines(block.frame(), NOW)
        assert m.run_id == "r1"
        sent.extend(m.events)

    h = runner.RunHandle("r1", sink, None, secrets or [], on_texts=sink, on_lines=on_lines if passing else None)

    async def go() -> None:
        h.open()
        for chunk in chunks:
            h._event_lines(chunk)
        await h._close({"status": "succeeded", "error": None})
    asyncio.run(go())
    return h, sent[:-1], blocks  # the last is the final status the launcher itself recorded


def same(lines: list[bytes], passed: list[dict[str, Any]], decoded: list[dict[str, Any]],
         now: float | None = NOW) -> None:
    """The events of both ways agree: number, kind, data; and the time wherever the line is an event with a
    time the protocol takes (else each side's own time of reading: ``now`` on the control plane's side, where
    every line was passed through)."""
    assert [(e["src_seq"], e["kind"], e["data"]) for e in passed] == \
        [(e["src_seq"], e["kind"], e["data"]) for e in decoded]
    for raw, p, d in zip(lines, passed, decoded, strict=True):
        try:
            at = json.loads(raw).get("at")
        except (ValueError, AttributeError, RecursionError):
            at = None
        warning = p["kind"] == "log" and p["data"].get("stream") == "stdout"
        if protocol.usable_at(at) and not warning:
            assert p["at"] == d["at"] == at, raw[:80]
        elif now is not None:
            assert p["at"] == now, raw[:80]


def test_a_chunk_of_usual_lines_is_passed_through_and_read_as_it_would_have_been_decoded() -> None:
    h, passed, blocks = record([USUAL[:10], USUAL[10:]])
    assert [(b.src_seq, b.n) for b in blocks] == [(1, 30)]  # the two chunks' blocks, sent as one frame
    assert blocks[0].data == b"\n".join(USUAL)
    _, decoded, none = record([USUAL[:10], USUAL[10:]], passing=False)
    assert none == []
    same(USUAL, passed, decoded)
    # The control plane keeps each line as its event's text, as it keeps a local run's.
    m = protocol.parse_lines(blocks[0].frame(), NOW)
    assert m.texts == [raw.decode() for raw in USUAL]


def test_odd_lines_read_on_the_control_plane_as_the_agent_would_have_read_them() -> None:
    deep: dict[str, Any] = {}
    for _ in range(protocol.MAX_DEPTH + 1):
        deep = {"x": deep}
    odd = [
        b"not JSON at all",
        b"\xff\xfe bytes that are not UTF-8",
        b'{"kind": "' + b"k" * (protocol.MAX_NAME + 1) + b'", "data": {}, "at": 1764694000.5}',
        b'{"kind": "log", "data": [1, 2], "at": 1764694000.5}',
        b'{"kind": "log", "data": "text", "at": 1764694000.5}',
        b'{"kind": "log", "data": null, "at": 1764694000.5}',
        json.dumps({"kind": "log", "data": deep, "at": 1764694000.5}).encode(),
        b'{"kind": "log", "data": {"nested": {"a": [1, {"b": 2}]}}, "at": 1764694000.5}',
        b'{"kind": "log", "data": {"loss": NaN, "big": 1e999}, "at": 1764694000.5}',
        b'{"kind": "log", "data": {"m": 1}, "at": 5}',
        b'{"kind": "log", "data": {"m": 1}, "at": "yesterday"}',
        b'{"kind": "log", "data": {"m": 1}, "at": 1764694000}',
        b'{"kind": "log", "data": {"m": 1}, "at": NaN}',
        b'{"kind": "log", "data": {"m": 1}}',
        b'{"kind": 5, "data": {}, "at": 1764694000.5}',
        b'{"kind": "log", "data": {"m": 1}, "at": 1764694000.5, "src_seq": 99}',
        b' {"kind": "log", "data": {"m": "blank before"}, "at": 1764694000.5}',
        b'{"kind": "log", "data": {"m": "caf\xc3\xa9"}, "at": 1764694000.5}',
        b'{"kind": "log", "data": {"m": "a \\"quoted\\" word, a tab\\t, a path C:\\\\x"}, "at": 1764694000.5}',
        b"[1, 2, 3]",
        b"42",
    ]
    for raw in odd:
        for chunk in ([USUAL[0], raw, USUAL[1]], [raw]):
            _, passed, blocks = record([chunk])
            assert len(blocks) == 1 and blocks[0].n == len(chunk), raw[:60]
            _, decoded, _ = record([chunk], passing=False)
            same(chunk, passed, decoded)


def test_chunks_the_agent_acts_on_or_masks_are_decoded_on_the_agent() -> None:
    acted_on = {
        "the result": line("result", {"status": "succeeded", "error": None}),
        "an artifact": line("artifact", {"name": "model.pt", "path": "model.pt"}),
        "a status": line("status", {"status": "running"}),
        "outputs being written": line(runner.OUTPUTS_WRITING, {}),
        "a kind spelled with an escape": b'{"kind": "r\\u0065sult", "data": {"status": "ok"}, "at": 1764694000.5}',
    }
    for what, raw in acted_on.items():
        h, passed, blocks = record([[USUAL[0], raw, USUAL[1]]])
        assert blocks == [], what
        _, decoded, _ = record([[USUAL[0], raw, USUAL[1]]], passing=False)
        assert passed == decoded, what
    h, passed, _ = record([[USUAL[0], acted_on["the result"]]])
    assert h.result == {"status": "succeeded", "error": None} and [e["src_seq"] for e in passed] == [1]
    # A secret of the run: the chunk is masked on the agent, never sent as written.
    raw = line("log", {"message": f"the key is {SECRET}"})
    h, passed, blocks = record([[USUAL[0], raw]], secrets=[(("nodes", 0, "data", "params", "token"), SECRET)])
    assert blocks == [] and SECRET not in json.dumps(passed) and "***" in passed[1]["data"]["message"]
    # Other chunks of the same run still pass through, numbered on after it.
    h, passed, blocks = record([USUAL[:3], [acted_on["an artifact"]], USUAL[3:6]])
    assert [(b.src_seq, b.n) for b in blocks] == [(1, 3), (5, 3)]
    assert [e["src_seq"] for e in passed] == [1, 2, 3, 4, 5, 6, 7]
    assert passed[3]["kind"] == "artifact"


def test_a_frame_holds_a_batch_of_lines_and_never_more_than_the_protocol_s_bound() -> None:
    many = [line("progress", {"tick": i}) for i in range(protocol.MAX_EVENTS + 500)]
    # One chunk of more lines than a frame may hold (a run's 256 KiB batch of short lines): cut into batches.
    h, passed, blocks = record([many])
    batch = runner.DELIVER_BATCH
    assert batch == 1000 and protocol.MAX_EVENTS == 2000
    assert [(b.src_seq, b.n) for b in blocks] == [(1, batch), (batch + 1, batch), (2 * batch + 1, 500)]
    assert [e["data"]["tick"] for e in passed] == list(range(protocol.MAX_EVENTS + 500))
    # Chunks waiting together go as one frame, up to a batch of events (what the control plane reads in a turn).
    h, passed, blocks = record([many[i:i + 300] for i in range(0, 1500, 300)])
    assert [(b.src_seq, b.n) for b in blocks] == [(1, 900), (901, 600)] and runner.DELIVER_BATCH == 1000
    assert [e["data"]["tick"] for e in passed] == list(range(1500))


def test_the_spool_keeps_blocks_as_written_and_reads_them_back(tmp_path: Path) -> None:
    spool = RunSpool(tmp_path, "r1")
    spool.append([{"src_seq": 1, "kind": "status", "data": {"status": "running"}, "at": 1764694000.5}])
    block = protocol.Lines("r1", 2, b"\n".join(USUAL[:5]), 5)
    spool.append_lines(block)
    spool.append([{"src_seq": 7, "kind": "log", "data": {"message": "after"}, "at": 1764694000.5}])
    spool.append_lines(protocol.Lines("r1", 8, b"\xff odd \r bytes\n" + USUAL[5], 2))
    again = RunSpool(tmp_path, "r1")  # after a restart: the same, in order, unacknowledged
    assert again.last_seq == 9
    assert again.unacked() == spool.unacked()
    assert [type(x).__name__ for x in again.unacked()] == ["dict", "Lines", "dict", "Lines"]
    assert again.unacked()[3].data == b"\xff odd \r bytes\n" + USUAL[5]
    # A block is kept until every one of its lines is acknowledged.
    assert again.unacked_events() == 9
    again.ack(4)
    assert [type(x).__name__ for x in again.unacked()] == ["Lines", "dict", "Lines"]
    assert again.unacked_events() == 5
    again.ack(6)
    assert [type(x).__name__ for x in again.unacked()] == ["dict", "Lines"]
    # A block cut short by a crash (never sent) is not read back.
    with open(spool.events_path, "ab") as fh:
        fh.write(b'{"lines": 10, "n": 2, "bytes": 500}\n' + USUAL[6])
    assert RunSpool(tmp_path, "r1").last_seq == 9


def read_stream(pieces: list[bytes], passing: bool) -> tuple[list[dict[str, Any]], list[protocol.Lines]]:
    """Run a recorder's pipe reader over ``pieces`` written one after another (each read as it comes, so a
    line may be cut between two reads), as an agent's recorder passing lines through or not."""
    sent: list[dict[str, Any]] = []
    blocks: list[protocol.Lines] = []

    async def sink(events: list[dict[str, Any]], texts: list[str | None] | None = None) -> None:
        sent.extend(events)

    async def on_lines(block: protocol.Lines) -> None:
        blocks.append(block)
        sent.extend(protocol.parse_lines(block.frame(), NOW).events)

    h = runner.RunHandle("r1", sink, None, [], on_texts=sink, on_lines=on_lines if passing else None)

    async def go() -> None:
        h.open()
        stdout = asyncio.StreamReader(limit=1 << 20)
        h.proc = SimpleNamespace(stdout=stdout)  # type: ignore[assignment]
        reader = asyncio.create_task(h._read_events())
        for piece in pieces:
            stdout.feed_data(piece)
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        stdout.feed_eof()
        await reader
        await h._close({"status": "succeeded", "error": None})
    asyncio.run(go())
    return sent[:-1], blocks


def test_the_pipe_s_chunks_pass_through_whole_lines_only_and_read_as_they_would_have() -> None:
    flood = b"".join(raw + b"\n" for raw in [*USUAL] * 200)  # about 600 KiB: many reads, lines cut between them
    short = b"".join(b'{"kind": "p", "data": {"i": %d}}\n' % i for i in range(2500))
    odd = (b"not JSON\n\n\n" + line("result", {"status": "succeeded", "error": None}) + b"\n"
           + line("log", {"message": "x" * 70000}) + b"\n" + b"{\"kind\": \"log\", \"data\": {}, \"at\": 1764694000.5}")
    for pieces in ([flood], [flood[i:i + 1000] for i in range(0, len(flood), 1000)],
                   [flood[:5], flood[5:70000], flood[70000:]], [flood, odd], [odd, flood],
                   [USUAL[0] + b"\n\n", USUAL[1] + b"\n", b"\n" + USUAL[2] + b"\n"],  # empty lines, skipped
                   [short]):  # more lines in one read than a frame holds
        passed, blocks = read_stream(pieces, passing=True)
        decoded, none = read_stream(pieces, passing=False)
        assert none == [] and blocks, [len(p) for p in pieces]
        data = b"".join(pieces)
        lines = [raw for raw in data.split(b"\n") if raw and b'"result"' not in raw]
        assert len(passed) == len(decoded) == len(lines)
        same(lines, passed, decoded, now=None)
        # Every block is whole lines of the run, as written, in order; a frame holds at most a batch.
        assert all(b.data.split(b"\n")[0] in lines for b in blocks)
        assert max(b.n for b in blocks) <= runner.DELIVER_BATCH
    # The first read of `short` held more lines than a batch.
    assert runner.READ_CHUNK // 33 > runner.DELIVER_BATCH and max(b.n for b in blocks) == runner.DELIVER_BATCH
    assert sum(b.n for b in blocks) == 2500
