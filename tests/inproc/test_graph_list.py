"""Listing saved graphs never holds the event loop (cdui.plane.graph_index).

A real control plane in this process; the graphs are real files, the index
helper a real process. In this tier the test's client and the server share one
event loop, so a handler that parsed graphs on the loop would keep the test
itself from even sending the health request until the listing was done.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from cdui.plane.appkeys import GRAPH_INDEX
from tests.inproc.harness import Plane, eventually
from tests.inproc.test_inproc_graph_api import n, triple


def large_graph(mb: float) -> bytes:
    """A callable graph (triple()'s contract) padded with Print nodes to about ``mb`` megabytes."""
    g = triple()
    pad = int(mb * 1e6 / 290)
    g["nodes"] += [n(f"pad{i}", "Print", label="x" * 200) for i in range(pad)]
    return json.dumps(g).encode()


async def _wait_for(check: Any, what: str, timeout: float = 120.0) -> None:
    await eventually(lambda: asyncio.to_thread(check), what, timeout)


async def test_health_answers_while_twenty_large_saved_graphs_are_listed(dirs: dict[str, Path]) -> None:
    """20 graphs of 1 MB saved before the index existed (no entries): the first listing has to read every
    one, and /api/health answers while it has not finished; then every graph is listed with its contract."""
    folder = dirs["data_dir"] / "graphs"
    folder.mkdir(parents=True)
    raw = large_graph(1)
    for i in range(20):
        (folder / f"big{i:02}.json").write_bytes(raw)
    async with Plane(**dirs) as cp:
        listing = asyncio.create_task(cp.api("GET", "/api/graphs"))
        index = folder / ".index"
        # The listing has begun reading graphs once the first one's index entry exists: 19 are still to read.
        await _wait_for(lambda: listing.done() or index.is_dir() and any(index.glob("*.json")),
                        "the first graph indexed")
        status, health = await cp.api("GET", "/api/health")
        assert status == 200 and health["status"] == "ok"
        assert not listing.done(), "the listing ended before /api/health answered"
        status, body = await listing
        assert status == 200 and [g["name"] for g in body["graphs"]] == [f"big{i:02}" for i in range(20)]

        async def listed() -> list[dict[str, Any]]:
            while True:  # graphs not indexed within a listing's budget are indexed by the next ones
                graphs: list[dict[str, Any]] = (await cp.call("GET", "/api/graphs"))["graphs"]
                if not any(g.get("indexing") for g in graphs):
                    return graphs
                await asyncio.sleep(0.05)
        graphs = await asyncio.wait_for(listed(), 120)
        assert [(g["name"], g["callable"], g["nodes"]) for g in graphs] == \
            [(f"big{i:02}", True, len(json.loads(raw)["nodes"])) for i in range(20)]
        assert [i["name"] for i in graphs[0]["contract"]["inputs"]] == ["values", "label"]


async def test_a_listing_reads_the_index_not_the_graphs(dirs: dict[str, Path]) -> None:
    """A graph saved by PUT is listed from its index entry: its bytes replaced in place by garbage of the same
    length and time (the same file, as the entry records it) still list as saved, so nothing parsed them."""
    async with Plane(**dirs) as cp:
        saved = await cp.call("PUT", "/api/graphs/triple", triple(), expect=201)
        assert (saved["callable"], saved["nodes"]) == (True, 6)
        path = dirs["data_dir"] / "graphs" / "triple.json"
        st = path.stat()
        with open(path, "r+b") as fh:
            fh.write(b"!" * st.st_size)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        listed = (await cp.call("GET", "/api/graphs"))["graphs"]
        assert [(g["name"], g["callable"], g["contract"]) for g in listed] == \
            [("triple", True, saved["contract"])]
        # Written again (a new file: new inode and time), it is read again and found broken.
        path.write_text("{not json")
        listed = (await cp.call("GET", "/api/graphs"))["graphs"]
        assert [(g["name"], g["callable"]) for g in listed] == [("triple", False)]
        assert listed[0]["not_callable_because"].startswith("saved graph 'triple' is not valid JSON")
        status, body = await cp.api("GET", "/api/graphs/triple")
        assert (status, body["error"]["code"]) == (500, "bad_graph")


async def test_a_listing_waits_for_the_index_at_most_its_budget(dirs: dict[str, Path]) -> None:
    """With no time to wait, unindexed graphs are listed as such (size and time, no contract) at once; the
    helper goes on, and a later listing has them. GET of one unindexed graph indexes it and answers it whole."""
    folder = dirs["data_dir"] / "graphs"
    folder.mkdir(parents=True)
    graph = json.dumps(triple())
    (folder / "old.json").write_text(graph)
    async with Plane(**dirs) as cp:
        cp.app[GRAPH_INDEX].budget_s = 0
        listed = (await cp.call("GET", "/api/graphs"))["graphs"]
        assert [(g["name"], g["indexing"], g["callable"], g["size"]) for g in listed] == \
            [("old", True, None, len(graph))]
        await _wait_for(lambda: (folder / ".index" / "old.json").exists(), "the helper indexing old.json")
        listed = (await cp.call("GET", "/api/graphs"))["graphs"]
        assert [(g["name"], g["callable"], "indexing" in g) for g in listed] == [("old", True, False)]
        (folder / "older.json").write_text(graph)
        assert await cp.call("GET", "/api/graphs/older") == triple()
        await cp.call("DELETE", "/api/graphs/older")
        assert not (folder / ".index" / "older.json").exists()


def _helpers_of(folder: Path) -> list[int]:
    """Index helper processes working on ``folder``'s graphs."""
    from procs import cmdlines
    return [pid for pid, cmd in cmdlines() if b"cdui.plane.graph_index" in cmd and str(folder).encode() in cmd]


async def test_a_stopping_server_stops_its_index_helper(dirs: dict[str, Path]) -> None:
    """The helper still indexing when the server stops is stopped with it: no process is left behind."""
    folder = dirs["data_dir"] / "graphs"
    folder.mkdir(parents=True)
    raw = large_graph(1)
    for i in range(20):
        (folder / f"big{i:02}.json").write_bytes(raw)
    async with Plane(**dirs) as cp:
        cp.app[GRAPH_INDEX].budget_s = 0
        listed = (await cp.call("GET", "/api/graphs"))["graphs"]
        assert len(listed) == 20
        await _wait_for(lambda: _helpers_of(folder), "the helper started")
    assert _helpers_of(folder) == []
