"""Absolute dataset paths in process: a run reading /x/... goes only to a worker whose agent
reported /x among its read roots (CODEFYUI_READ_ROOTS, its `read-roots` label); a named
worker or this server that does not allow it is refused at submit, naming the path and the
setting."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from harness import FakeAgent, Plane


def reading(path: str) -> dict[str, Any]:
    return {"format_version": 1, "name": "reads", "edges": [
        {"id": "t", "source": "start", "sourceHandle": "trigger", "target": "r", "targetHandle": None,
         "type": "trigger"}], "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "r", "type": "FileReader", "position": {"x": 0, "y": 0}, "data": {"params": {"path": path}}}]}


async def test_a_run_reading_an_absolute_path_goes_to_the_worker_that_allows_it(tmp_path: Path) -> None:
    async with Plane(tmp_path / "ud", tmp_path / "data") as cp:
        plain, lab = FakeAgent(cp, "a-plain"), FakeAgent(cp, "b-lab")
        lab.labels = {"read-roots": "/scratch,/datasets"}
        try:
            for agent in (plain, lab):
                await agent.enroll()
                await agent.connect()
            graph = reading("/datasets/iris/train.csv")
            run = await cp.call("POST", "/api/runs", {"graph": graph, "options": {"target": "any"}}, expect=201)
            assert (await lab.assignment())["run_id"] == run["id"]
            assert plain.assigned.empty()
            # Named: the worker that does not allow it, and this server, refuse at submit.
            for target, where in (({"worker": "a-plain"}, "worker a-plain"), ("local", "this server")):
                status, body = await cp.api("POST", "/api/runs", {"graph": graph, "options": {"target": target}})
                assert status == 400, body
                err = body["error"]
                assert err["code"] == "path_not_readable"
                assert err["message"] == (f"{where} does not allow reading '/datasets/iris/train.csv': absolute "
                                          "paths are read only under the folders its CODEFYUI_READ_ROOTS lists (none)")
                assert "CODEFYUI_READ_ROOTS" in err["hint"]
        finally:
            await plain.close()
            await lab.close()
