"""GET /api/runs/{id}/metrics: a run's metric events as series, read from the stored events and
thinned to ?points=, against a real control plane fed by a scripted agent."""
from __future__ import annotations

from pathlib import Path

from harness import FakeAgent, Plane

from cdui.plane.http.api_runs import MAX_METRIC_SERIES

BATCHES = 12000  # more than one page of stored events (10,000)


async def test_series_are_thinned_evenly_with_first_last_count_min_max_of_every_value(tmp_path: Path) -> None:
    async with Plane(tmp_path / "ud", tmp_path / "data") as cp:
        agent = FakeAgent(cp)
        try:
            await agent.enroll()
            await agent.connect()
            rid = (await cp.submit({"target": {"worker": agent.name}}))["id"]
            await agent.assignment()
            await agent.status(rid, "running", pid=4242)
            batch = [1.0 / (i + 1) + (0.5 if i == 7777 else 0.0) for i in range(BATCHES)]
            for i, v in enumerate(batch):
                agent.spool_event(rid, "metric", node_id="train", name="train_loss_batch", value=v, step=i + 1)
                if i % 1000 == 999:
                    agent.spool_event(rid, "metric", node_id="train", name="train_loss", value=v, step=i // 1000 + 1)
                    agent.spool_event(rid, "log", message=f"epoch {i // 1000 + 1}")
            # No step: numbered 1, 2, ... in its series. The same name from another node: its own series.
            for v in (3, 2.5, None):
                agent.spool_event(rid, "metric", node_id="eval", name="score", value=v)
            agent.spool_event(rid, "metric", node_id="eval", name="train_loss", value=9.0, step=1)
            # More series than the bound: the rest are counted, not sent.
            for k in range(MAX_METRIC_SERIES):
                agent.spool_event(rid, "metric", node_id="many", name=f"m{k}", value=float(k), step=1)
            await agent.flush(rid)
            await agent.status(rid, "succeeded")
            await cp.wait_status(rid, "succeeded")
            stored = await cp.events(rid)

            m = await cp.call("GET", f"/api/runs/{rid}/metrics?points=100")
            assert (m["run_id"], m["status"], m["points"]) == (rid, "succeeded", 100)
            assert m["last_seq"] == stored[-1]["seq"]
            by = {(s["node_id"], s["name"]): s for s in m["series"]}
            assert len(m["series"]) == MAX_METRIC_SERIES and m["series_left_out"] == 4
            assert list(by)[:4] == [("train", "train_loss_batch"), ("train", "train_loss"), ("eval", "score"),
                                    ("eval", "train_loss")]
            b = by[("train", "train_loss_batch")]
            assert b["count"] == BATCHES and len(b["steps"]) == len(b["values"]) == 100
            assert b["steps"][0] == 1 and b["steps"][-1] == BATCHES
            assert b["last"] == {"step": BATCHES, "value": batch[-1]}
            assert b["min"] == min(batch) and b["max"] == max(batch) == 1.0
            # Every value sent is the one stored at its step, the steps rising and spread over the run.
            assert all(v == batch[int(x) - 1] for x, v in zip(b["steps"], b["values"], strict=True))
            gaps = [y - x for x, y in zip(b["steps"], b["steps"][1:], strict=False)]
            assert min(gaps) > 0 and max(gaps) <= 2 * BATCHES / 99
            e = by[("train", "train_loss")]
            assert e["steps"] == list(range(1, 13)) and e["values"] == [batch[i * 1000 + 999] for i in range(12)]
            s = by[("eval", "score")]
            assert s["steps"] == [1, 2, 3] and s["values"] == [3, 2.5, None] and (s["min"], s["max"]) == (2.5, 3)
            assert by[("eval", "train_loss")]["values"] == [9.0]
            # Default: 1000 per series; every value of a short series.
            full = await cp.call("GET", f"/api/runs/{rid}/metrics")
            assert len(full["series"][0]["steps"]) == 1000 and full["series"][1]["count"] == 12
            for bad in ("1", "10001", "x"):
                status, body = await cp.api("GET", f"/api/runs/{rid}/metrics?points={bad}")
                assert status == 400 and body["error"]["code"] == "bad_query", body
                assert f"points={bad!r}" in body["error"]["message"]
            status, body = await cp.api("GET", "/api/runs/nosuch/metrics")
            assert status == 404 and "nosuch" in body["error"]["message"]
        finally:
            await agent.close()
