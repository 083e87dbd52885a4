"""GET /api/runs's body (cdui/plane/runs.py: EncodedRows): each run's encoded form is reused only while
its row, its queue reason and (for a disconnected run) the time leave it the same."""
from __future__ import annotations

import json
from dataclasses import replace

from cdui.plane.runs import EncodedRows, api_form
from cdui.plane.store import Run
from cdui.wire.target import AnyWorker, Worker


def runs() -> list[Run]:
    return [
        Run(id="q1", status="queued", target=AnyWorker(), options={"target": "any", "device": "cpu"},
            created_at=100.0, name="queued run", queue_reason="waiting for the scheduler"),
        Run(id="s1", status="succeeded", target=Worker("w1"), options={"target": "w1", "note": "é"},
            created_at=90.0, worker_id="w1", slot_device="cpu", started_at=91.0, finished_at=92.5, last_seq=4,
            execution_facts={"python": "3.11"}),
        Run(id="d1", status="disconnected", target=Worker("w2"), options={"target": "w2"}, created_at=80.0,
            worker_id="w2", slot_device="cuda:0", started_at=81.0, disconnected_at=85.0, last_seq=2),
    ]


def expected(rs: list[Run], reasons: dict[str, str | None], now: float) -> bytes:
    return json.dumps([api_form(r, reasons.get(r.id), now) for r in rs]).encode()


def test_the_listing_is_byte_for_byte_what_encoding_the_whole_list_gives() -> None:
    rows = EncodedRows()
    reasons = {"q1": "waiting for a free cpu slot: slots in use on 2 (w1, w2)"}
    body = rows.encode(runs(), reasons, 200.0)
    assert body == expected(runs(), reasons, 200.0)
    listed = json.loads(body)
    assert [r["queue_reason"] for r in listed] == [reasons["q1"], None, None]
    assert listed[2]["worker_status"]["disconnected_s"] == 115.0
    # Read again (new, equal rows), later: the disconnected run's time moved on, the rest are reused.
    kept = dict(rows._kept)
    assert rows.encode(runs(), reasons, 230.0) == expected(runs(), reasons, 230.0)
    assert set(kept) == {"q1", "s1"} and all(rows._kept[k][2] is kept[k][2] for k in kept)


def test_a_changed_row_or_reason_is_encoded_again() -> None:
    rows = EncodedRows()
    rs = runs()
    rows.encode(rs, {"q1": "first reason"}, 200.0)
    rs2 = [replace(rs[0], status="running", worker_id="w3", started_at=201.0), replace(rs[1], last_seq=5), rs[2]]
    assert rows.encode(rs2, {}, 202.0) == expected(rs2, {}, 202.0)
    assert rows.encode(rs, {"q1": "second reason"}, 203.0) == expected(rs, {"q1": "second reason"}, 203.0)
    assert json.loads(rows.encode(rs, {}, 203.0))[0]["queue_reason"] == "waiting for the scheduler"


def test_it_keeps_at_most_its_bound_and_lists_nothing_as_an_empty_array() -> None:
    rows = EncodedRows(keep=2)
    many = [replace(runs()[1], id=f"r{i}") for i in range(5)]
    assert rows.encode(many, {}, 1.0) == expected(many, {}, 1.0)
    assert list(rows._kept) == ["r3", "r4"]
    assert rows.encode([], {}, 1.0) == b"[]" == json.dumps([]).encode()
