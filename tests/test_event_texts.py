"""An agent spools and sends the events of a run's own lines as the run wrote them, with the event's
number put in front, instead of decoding and encoding each again. The text must say exactly what the
event recorded says, and be what a receiver accepts: strict JSON of an object with the event's four
keys. Any line where that is not sure (a secret in it, NaN or an overflowing number, a key of its own,
data that is not flat, text other than ASCII) is encoded anew from the masked, decoded event.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from cdui.agent.spool import RunSpool
from cdui.core.layout import Layout
from cdui.run import runner
from cdui.run.runproc import _encode_event
from cdui.wire import protocol
from cdui.wire.event import event_json
from cdui.wire.job import Job

SECRET = "hunter2-very-secret"


def handle_with_texts(secrets: list[Any] | None = None) -> tuple[runner.RunHandle, list[tuple[dict, str | None]]]:
    got: list[tuple[dict[str, Any], str | None]] = []

    async def sink(events: list[dict[str, Any]], texts: list[str | None] | None = None) -> None:
        assert texts is not None
        got.extend(zip(events, texts, strict=True))
    return runner.RunHandle("r1", sink, None, secrets or [], on_texts=sink), got


def read(h: runner.RunHandle, lines: list[bytes], got: list[Any]) -> list[tuple[dict, str | None]]:
    async def go() -> None:
        h.open()
        h._event_lines(lines)
        await h._close({"status": "succeeded", "error": None})
    asyncio.run(go())
    return got[:-1]  # the last is the final status the launcher itself recorded


def test_the_run_s_own_lines_travel_as_written_with_their_number_in_front() -> None:
    h, got = handle_with_texts()
    lines = [_encode_event("log", {"node": "f", "message": f"event {i}", "level": "info"}).encode().rstrip(b"\n")
             for i in range(50)]
    lines.append(_encode_event("metric", {"name": "loss", "value": 0.25, "step": 3, "ok": True,
                                          "note": None}).encode().rstrip(b"\n"))
    events = read(h, lines, got)
    assert len(events) == 51
    for i, (ev, text) in enumerate(events, start=1):
        assert ev["src_seq"] == i
        # What the event would have been encoded to, byte for byte, and what the control plane accepts.
        assert text == protocol.event_text(ev)
        assert json.loads(text) == ev
    m = protocol.parse_agent_message(protocol.encode_events("r1", [e for e, _ in events],
                                                            encoded=[t for _, t in events if t])[0])
    assert isinstance(m, protocol.Events) and m.events == [e for e, _ in events]


def test_lines_a_receiver_would_refuse_or_read_otherwise_are_encoded_anew() -> None:
    h, got = handle_with_texts()
    good = b'{"kind": "log", "data": {"message": "ok"}, "at": 1764694000.5}'
    odd = [
        b'{"kind": "log", "data": {"loss": NaN}, "at": 1764694000.5}',  # NaN: not strict JSON
        b'{"kind": "log", "data": {"loss": 1e999}, "at": 1764694000.5}',  # overflows to infinity
        b'{"kind": "log", "data": {"message": "m"}, "at": 1764694000.5, "src_seq": 7}',  # a number of its own
        b'{"kind": "log", "data": {"nested": {"a": 1}}, "at": 1764694000.5}',  # not flat
        b'{"kind": "log", "data": null, "at": 1764694000.5}',  # not an object
        b'{"kind": 5, "data": {}, "at": 1764694000.5}',  # a kind that is not text
        b'{"kind": "log", "data": {"message": "m"}, "at": "yesterday"}',  # a time that is not a number
        b'{"kind": "log", "data": {"message": "m"}}',  # no time
        b'{"kind": "log", "data": {"message": "m"}, "at": 1764694000.5} ',  # space after it
    ]
    events = read(h, [good, *odd], got)
    assert events[0][1] == protocol.event_text(events[0][0])
    assert [t for _, t in events[1:]] == [None] * (len(events) - 1)
    # Encoded anew, as before: NaN and infinity as strings, the recorder's own number, nothing lost.
    texts = [protocol.event_text(e) for e, _ in events]
    assert json.loads(texts[1])["data"] == {"loss": "nan"} and json.loads(texts[2])["data"] == {"loss": "inf"}
    assert [json.loads(t)["src_seq"] for t in texts] == list(range(1, len(events) + 1))


class Counting(runner.RunHandle):
    """A launcher that counts the chunks it takes line by line (the rest it took a pass at a time)."""
    line_by_line = 0

    def _plain_lines(self, *args: Any) -> None:
        self.line_by_line += 1
        super()._plain_lines(*args)


def test_a_chunk_of_usual_lines_is_taken_in_passes_and_any_other_line_sends_it_line_by_line() -> None:
    got: list[tuple[dict[str, Any], str | None]] = []

    async def sink(events: list[dict[str, Any]], texts: list[str | None] | None = None) -> None:
        assert texts is not None
        got.extend(zip(events, texts, strict=True))

    def chunk(*lines: bytes) -> tuple[Counting, list[tuple[dict, str | None]]]:
        got.clear()
        h = Counting("r1", sink, None, [], on_texts=sink)
        return h, read(h, list(lines), got)

    usual = [_encode_event("log", {"message": f"m{i}", "ok": True, "none": None, "big": 2 ** 70}).encode().rstrip(b"\n")
             for i in range(20)]
    usual.append(_encode_event("k" * protocol.MAX_NAME, {}).encode().rstrip(b"\n"))
    h, events = chunk(*usual)
    assert h.line_by_line == 0
    assert [e["src_seq"] for e, _ in events] == list(range(1, 22))
    assert [t for _, t in events] == [protocol.event_text(e) for e, _ in events]
    assert [list(e) for e, _ in events] == [["src_seq", "kind", "data", "at"]] * 21
    # Lines the protocol would not take in passes, or that the launcher acts on: the chunk goes line by line,
    # each line as before (a text wherever the line can be one).
    for what, line, texted in [
            ("a time out of 2000-2100", b'{"kind": "log", "data": {}, "at": 5.0}', False),  # read now instead
            ("a time as an int", b'{"kind": "log", "data": {}, "at": 1764694000}', False),
            ("a kind too long", b'{"kind": "' + b"k" * 129 + b'", "data": {}, "at": 1764694000.5}', False),  # a warning
            ("a blank before the object", b' {"kind": "log", "data": {}, "at": 1764694000.5}', False),
            ("floats adding up past the largest", b'{"kind": "log", "data": {"a": 1e308, "b": 1e308}, '
                                                  b'"at": 1764694000.5}', True)]:
        h, events = chunk(usual[0], line, usual[1])
        assert h.line_by_line == 1, what
        assert [e["src_seq"] for e, _ in events] == [1, 2, 3], what
        assert events[0][1] == protocol.event_text(events[0][0]) and events[2][1] == protocol.event_text(events[2][0])
        text = events[1][1]
        assert (text is not None and json.loads(text) == events[1][0]) if texted else text is None, what
    h, events = chunk(usual[0], b'{"kind": "result", "data": {"status": "ok"}, "at": 1764694000.5}', usual[1])
    assert h.line_by_line == 1 and h.result == {"status": "ok"}
    assert [e["src_seq"] for e, _ in events] == [1, 2]  # the result is acted on, not recorded


def test_lines_a_control_plane_would_refuse_as_events_never_hold_back_a_worker_run_s_events() -> None:
    """A node that writes fd 1 itself may write a line the control plane refuses as an event (a kind too long,
    data that is not an object or nests too deep, a time that is not 2000-2100). Sent as such it would have
    its whole message refused, and every later message after that gap: the run's log, and its ending, never
    stored. The agent's launcher records such a line as a warning holding it (a bad time: the time it read
    the line), and what it sends is always taken."""
    deep: dict[str, Any] = {}
    for _ in range(protocol.MAX_DEPTH + 1):
        deep = {"x": deep}
    good = b'{"kind": "log", "data": {"message": "ok"}, "at": 1764694000.5}'
    odd = {
        "data a list": b'{"kind": "log", "data": [1, 2], "at": 1764694000.5}',
        "data a string": b'{"kind": "log", "data": "text", "at": 1764694000.5}',
        "a kind too long": b'{"kind": "' + b"k" * (protocol.MAX_NAME + 1) + b'", "data": {}, "at": 1764694000.5}',
        "data too deep": json.dumps({"kind": "log", "data": deep, "at": 1764694000.5}).encode(),
        "a time in 1970": b'{"kind": "log", "data": {"m": 1}, "at": 5}',
        "a time as text": b'{"kind": "log", "data": {"m": 1}, "at": "yesterday"}',
        "a time true": b'{"kind": "log", "data": {"m": 1}, "at": true}',
        "a time past 2100": b'{"kind": "log", "data": {"m": 1}, "at": 1e12}',
    }
    warned = {"data a list", "data a string", "a kind too long", "data too deep"}
    for what, line in odd.items():
        for lines in ([good, line, good], [line]):  # in a chunk with others, and alone
            h, got = handle_with_texts()
            events = read(h, lines, got)
            assert [e["src_seq"] for e, _ in events] == list(range(1, len(lines) + 1)), what
            mine = events[lines.index(line)][0]
            if what in warned:
                assert (mine["kind"], mine["data"]["level"]) == ("log", "warning"), what
                assert "not an event a control plane takes" in mine["data"]["message"], what
            else:
                assert mine["data"] == {"m": 1} and protocol.usable_at(mine["at"]), what
            for e, _ in events:
                assert protocol.event_refusal(e) is None, what
            texts = [t if t is not None else protocol.event_text(e) for e, t in events]
            m = protocol.parse_agent_message(protocol.encode_events("r1", [e for e, _ in events], encoded=texts)[0])
            assert isinstance(m, protocol.Events) and [e["src_seq"] for e in m.events] == \
                [e["src_seq"] for e, _ in events], what


def test_text_other_than_ascii_is_encoded_anew() -> None:
    h, got = handle_with_texts()
    events = read(h, ['{"kind": "log", "data": {"message": "é"}, "at": 1764694000.5}'.encode(),
                      b'{"kind": "log", "data": {"message": "plain"}, "at": 1764694000.5}'], got)
    # One chunk: a line that is not ASCII makes its neighbours encoded anew too.
    assert [t for _, t in events] == [None, None]
    assert events[0][0]["data"] == {"message": "é"}


def test_a_secret_in_a_chunk_is_masked_and_never_sent_as_written() -> None:
    h, got = handle_with_texts([(("nodes", 0, "data", "params", "token"), SECRET)])
    clean = b'{"kind": "log", "data": {"message": "nothing to hide"}, "at": 1764694000.5}'
    leaky = json.dumps({"kind": "log", "data": {"message": f"token={SECRET}"}, "at": 1764694000.5}).encode()
    events = read(h, [clean, clean], got)
    assert [t for _, t in events] == [protocol.event_text(e) for e, _ in events]  # no secret in it: as written
    h, got = handle_with_texts([(("nodes", 0, "data", "params", "token"), SECRET)])
    events = read(h, [clean, leaky], got)
    assert [t for _, t in events] == [None, None]
    assert events[1][0]["data"]["message"] == "token=***"
    # A secret known and an escape in the chunk: a value's text need not show the secret as it is.
    h, got = handle_with_texts([(("nodes", 0, "data", "params", "token"), SECRET)])
    escaped = b'{"kind": "log", "data": {"message": "a \\"quote\\""}, "at": 1764694000.5}'
    events = read(h, [clean, escaped], got)
    assert [t for _, t in events] == [None, None] and events[1][0]["data"]["message"] == 'a "quote"'


def test_the_spool_writes_the_texts_given_and_encodes_the_rest(tmp_path: Path) -> None:
    spool = RunSpool(tmp_path, "r1")
    events = [{"src_seq": 1, "kind": "log", "data": {"message": "a"}, "at": 1764694000.5},
              {"src_seq": 2, "kind": "log", "data": {"message": "b"}, "at": 1764694000.5}]
    given = '{"src_seq": 1, "kind": "log", "data": {"message": "a"}, "at": 1764694000.5}'
    lines = spool.append(events, [given, None])
    assert lines == [given, protocol.event_text(events[1])]
    assert spool.events_path.read_text().splitlines() == lines
    again = RunSpool(tmp_path, "r1")  # read back after a restart: the same events, unacknowledged
    assert again.last_seq == 2 and again.unacked() == events


PLAIN_FLOOD = '''
from cdui.nodes.base import Node, Param, Port


class PlainFlood(Node):
    """Logs ``count`` events flat out, then a metric, and returns."""
    NODE_NAME = "PlainFlood"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("count", "int", 10)]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        for i in range(int(params["count"])):
            ctx.log(f"event {i}")
        ctx.emit("metric", {"name": "loss", "value": 0.5, "step": 1})
        return {"value": 1.0}
'''


@pytest.mark.e2e
def test_a_real_run_s_flood_comes_with_its_texts_as_an_agent_sends_them(tmp_path: Path) -> None:
    """The run process's own lines, written in batches through its pipe, are an event's text as
    they arrive: every flood event has one, equal to what encoding it gives; what the launcher
    itself records (the run's start and end) has none and is encoded by the agent."""
    nodes = tmp_path / "custom_nodes"
    nodes.mkdir()
    (nodes / "plain_flood.py").write_text(PLAIN_FLOOD)
    n = 5000
    g = {"format_version": 1, "name": "flood", "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "f", "type": "PlainFlood", "position": {"x": 0, "y": 0}, "data": {"params": {"count": n}}}],
        "edges": [{"id": "t", "source": "start", "sourceHandle": "trigger", "target": "f", "targetHandle": None,
                   "type": "trigger"}]}
    job = Job(run_id="r4", graph=g, slot_device="cpu", options={}, custom_nodes_dir=str(nodes),
              layout=Layout.for_data_dir(tmp_path / "data").to_json())
    got: list[tuple[dict[str, Any], str | None]] = []

    async def main() -> dict[str, Any]:
        async def sink(events: list[dict[str, Any]], texts: list[str | None] | None = None) -> None:
            assert texts is not None
            got.extend(zip(events, texts, strict=True))
        handle = runner.RunHandle(job.run_id, sink, tmp_path / "run.log", [], on_texts=sink)
        await handle.start(job)
        return await asyncio.wait_for(handle.wait(), 300)
    final = asyncio.run(main())
    assert final == {"status": "succeeded", "error": None}, final
    assert [e["src_seq"] for e, _ in got] == list(range(1, len(got) + 1))
    flood = [(e, t) for e, t in got if e["kind"] == "log" and str(e["data"].get("message", "")).startswith("event ")]
    assert [e["data"]["message"] for e, _ in flood] == [f"event {i}" for i in range(n)]
    assert all(t == protocol.event_text(e) for e, t in flood)
    metric = [(e, t) for e, t in got if e["kind"] == "metric"]
    assert len(metric) == 1 and metric[0][1] == protocol.event_text(metric[0][0])
    assert metric[0][0]["data"] == {"name": "loss", "value": 0.5, "step": 1, "node_id": "f"}
    statuses = [t for e, t in got if e["kind"] == "status"]
    assert statuses == [None, None]  # running and succeeded: the launcher's own


def test_the_control_plane_s_own_runs_keep_each_line_as_its_text() -> None:
    """For a store that keeps texts as they are (a run of the control plane's own), an event's text is
    the run's line itself: it decodes to the event's kind, data and time (NaN and overflowing numbers
    read back as they were, a key of the line's own is not read). A line without an object of data or a
    time in seconds, and any chunk with a secret in it, give no text."""
    got: list[tuple[dict[str, Any], str | None]] = []

    async def sink(events: list[dict[str, Any]], texts: list[str | None] | None = None) -> None:
        assert texts is not None
        got.extend(zip(events, texts, strict=True))

    def handle(secrets: list[Any] | None = None) -> runner.RunHandle:
        got.clear()
        return runner.RunHandle("r1", sink, None, secrets or [], on_texts=sink, line_texts=True)

    kept = [b'{"kind": "log", "data": {"message": "ok"}, "at": 1764694000.5}',
            b'{"kind": "log", "data": {"loss": NaN, "big": 1e999}, "at": 1764694000.5}',
            b'{"kind": "log", "data": {"message": "m"}, "at": 1764694000.5, "src_seq": 7}',
            b'{"kind": "metric", "data": {"nested": {"a": [1, 2]}}, "at": 1764694000.5} ']
    odd = [b'{"kind": "log", "data": null, "at": 1764694000.5}',
           b'{"kind": "log", "data": {"message": "m"}}',
           b'{"kind": "log", "data": {"message": "m"}, "at": 1764694000}']
    events = read(handle(), [*kept, *odd], got)
    assert [t for _, t in events] == [line.decode() for line in kept] + [None] * len(odd)
    assert [e["src_seq"] for e, _ in events] == list(range(1, len(kept) + len(odd) + 1))
    assert events[-1][0]["at"] == 1764694000 and events[-3][0]["data"] == {}  # recorded as ever
    for ev, text in events[:len(kept)]:
        assert text is not None
        back = json.loads(text)
        assert (back["kind"], event_json(back["data"]), back["at"]) == (ev["kind"], event_json(ev["data"]), ev["at"])
    # A secret of the run in the chunk: masked, and no line kept.
    secret = [(("nodes", 0, "data", "params", "token"), SECRET)]
    leaky = json.dumps({"kind": "log", "data": {"message": f"token={SECRET}"}, "at": 1764694000.5}).encode()
    events = read(handle(secret), [kept[0], leaky], got)
    assert [t for _, t in events] == [None, None] and events[1][0]["data"]["message"] == "token=***"
