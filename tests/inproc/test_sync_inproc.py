"""Workers in sync, in process: the version gate, degraded workers, catalog checks, fingerprints.

A real control plane app and fake agents speaking the real protocol; each
fake agent's hello carries the catalog and fingerprint the test gives it.
The local executor gets no slot (``local/cpu=0``) so that a run the
workers may not take waits with its reason, instead of running locally."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
from harness import FakeAgent, Plane, eventually, graph

from cdui import __version__
from cdui.run import catalog

NO_LOCAL = {"CODEFYUI_RUN_QUEUE_MAX_CONCURRENT": "local/cpu=0"}


def _plane(tmp_path: Path) -> Plane:
    return Plane(tmp_path / "ud", tmp_path / "data", **NO_LOCAL)


def _without(cp: Plane, *types: str) -> dict[str, Any]:
    own = catalog.node_catalog(cp.runs.registry)
    return {"types": [t for t in own["types"] if t not in types], "hash": "sha256:" + "0" * 64}


async def _queue_reason(cp: Plane, run_id: str, contains: str) -> str:
    """The run's queue_reason once the dispatch loop has given one that says ``contains``."""
    async def said() -> str | None:
        reason = (await cp.run(run_id))["queue_reason"] or ""
        return reason if contains in reason else None
    return str(await eventually(said, f"queue_reason to say {contains!r}", detail=lambda: cp.run(run_id)))


async def test_changed_hello_format_still_gets_the_version_reason_and_connecting_clears_it(tmp_path: Path) -> None:
    async with _plane(tmp_path) as cp:
        agent = await FakeAgent(cp).enroll()
        # A future agent: another version, and fields this control plane cannot parse.
        async with aiohttp.ClientSession() as s, s.ws_connect(
                cp.url.replace("http", "ws", 1) + "/ws/worker",
                headers={"Authorization": f"Bearer {agent.credential}"}) as ws:
            await ws.send_str(json.dumps({"version": "99.0.0", "type": "hello2", "devices": {"gpu": 8},
                                          "runs": "all of them"}))
            refused = json.loads((await ws.receive(timeout=30)).data)
        reason = f"version mismatch: worker 99.0.0, control plane {__version__}"
        assert refused == {"type": "refused", "code": "version_mismatch", "message": reason + (
            "; to follow, copy the control plane's update bundle here and run `cdui update --from BUNDLE`, or let "
            "the agent update itself: CODEFYUI_AGENT_AUTO_UPDATE=1 on this machine, or \"follow updates\" for worker "
            f"{agent.name} in the Workers panel (docs/updating.md)")}
        rejected = (await cp.call("GET", "/api/workers"))["rejected"]
        assert [(r["name"], r["reason"]) for r in rejected] == [("w1", reason)]
        await agent.connect()
        assert (await cp.call("GET", "/api/workers"))["rejected"] == []
        await agent.close()


async def test_worker_lacking_a_type_is_degraded_refused_named_and_skipped_by_any(tmp_path: Path) -> None:
    async with _plane(tmp_path) as cp:
        agent = await FakeAgent(cp, catalog=None).enroll()
        agent.catalog = _without(cp, "TensorCreate")
        await agent.connect()
        card = await cp.worker("w1")
        assert card is not None and card["degraded"] is True
        assert card["catalog"] == {"state": "degraded", "degraded": True, "lacking": ["TensorCreate"], "extra": [],
                                   "warning": None}
        status, body = await cp.api("POST", "/api/runs", {"graph": graph(), "options": {"target": {"worker": "w1"}}})
        assert status == 400, body
        assert body["error"]["code"] == "missing_node_types"
        assert "TensorCreate" in body["error"]["message"] and body["error"]["details"] == {"missing": ["TensorCreate"]}
        run = await cp.submit({"target": "any"})
        reason = await _queue_reason(cp, run["id"], "degraded")
        assert "worker w1 is degraded: it lacks TensorCreate" in reason
        assert agent.assigned.empty()
        await agent.close()


async def test_worker_with_only_extra_types_is_degraded_but_gets_any(tmp_path: Path) -> None:
    async with _plane(tmp_path) as cp:
        agent = await FakeAgent(cp, catalog=None).enroll()
        own = catalog.node_catalog(cp.runs.registry)
        agent.catalog = {"types": own["types"] + ["extra:Thing"], "hash": "sha256:" + "1" * 64}
        await agent.connect()
        card = await cp.worker("w1")
        assert card is not None and card["catalog"]["state"] == "degraded"
        assert (card["catalog"]["lacking"], card["catalog"]["extra"]) == ([], ["extra:Thing"])
        run = await cp.submit({"target": "any"})
        assert (await agent.assignment())["run_id"] == run["id"]
        await agent.close()


async def test_worker_without_catalog_warns_is_skipped_by_any_and_gets_named_runs_unchecked(tmp_path: Path) -> None:
    async with _plane(tmp_path) as cp:
        agent = await FakeAgent(cp, catalog=None).enroll()
        await agent.connect()
        card = await cp.worker("w1")
        assert card is not None and card["catalog"]["state"] == "not_reported" and card["degraded"] is False
        assert "reported no node catalog" in card["catalog"]["warning"]
        anyrun = await cp.submit({"target": "any"})
        assert "worker w1 reported no node catalog" in await _queue_reason(cp, anyrun["id"], "no node catalog")
        named = await cp.submit({"target": {"worker": "w1"}})
        assert (await agent.assignment())["run_id"] == named["id"]
        await agent.close()


async def test_queued_run_is_checked_again_when_the_worker_connects_with_fewer_types(tmp_path: Path) -> None:
    async with _plane(tmp_path) as cp:
        agent = await FakeAgent(cp).enroll()  # enrolled, offline: nothing to check at submit
        run = await cp.submit({"target": {"worker": "w1"}})
        agent.catalog = _without(cp, "TensorCreate")
        await agent.connect()
        done = await cp.wait_status(run["id"], "failed")
        assert "worker w1 lacks node type(s) the graph uses: TensorCreate" in done["error"], done
        assert agent.assigned.empty()
        await agent.close()


async def test_fingerprint_recorded_at_start_replaced_by_the_run_and_not_reused(tmp_path: Path) -> None:
    fp = {"cdui": __version__, "commit": "abc", "python": "3.11.7", "torch": "2.13.0+cpu",
          "accelerator": "cpu (x86_64)", "plugins": {}, "custom_nodes": {}, "env": {"OMP_NUM_THREADS": "4"}}
    async with _plane(tmp_path) as cp:
        agent = await FakeAgent(cp, fingerprint=fp).enroll()
        await agent.connect()
        card = await cp.worker("w1")
        assert card is not None and card["fingerprint"] == catalog.summary(fp)
        run = await cp.submit({"target": {"worker": "w1"}})
        await agent.assignment()
        facts = (await cp.run(run["id"]))["execution_facts"]
        assert facts == {"fingerprint": catalog.summary(fp), "fingerprint_source": "worker"}
        numerics = {"deterministic_algorithms": False, "num_threads": 4}
        await agent.status(run["id"], "running", pid=1)
        await agent.send(run["id"], "execution_facts", fingerprint="what the run loaded",
                         resolved={"numerics": numerics})
        facts = (await cp.run(run["id"]))["execution_facts"]
        assert facts == {"fingerprint": "what the run loaded", "fingerprint_source": "worker-run",
                         "resolved": {"numerics": numerics}}
        await agent.status(run["id"], "succeeded")
        await cp.wait_status(run["id"], "succeeded")
        # Reconnected without a fingerprint: the next run says so, never the old one.
        await agent.close()
        again = FakeAgent(cp, fingerprint=None)
        again.credential = agent.credential
        await again.connect()
        assert (await cp.worker("w1") or {})["fingerprint"] == "not reported"
        second = await cp.submit({"target": {"worker": "w1"}})
        await again.assignment()
        facts = (await cp.run(second["id"]))["execution_facts"]
        assert facts == {"fingerprint": "not reported", "fingerprint_source": "worker"}
        await again.close()


async def test_workers_list_shows_a_degraded_worker_and_why(tmp_path: Path, monkeypatch: Any,
                                                             capsys: Any) -> None:
    """`cdui workers list` (the real CLI against this control plane) marks a worker lacking a type and names
    the type; a worker with the same types whose catalog hash differs is not degraded (the seen case: every
    extra installed on one side only), and says so in a warning."""
    import asyncio

    from cdui.cli import cli
    monkeypatch.setenv("CODEFYUI_USER_DATA_DIR", str(tmp_path / "ud"))
    monkeypatch.setenv("CODEFYUI_DATA_DIR", str(tmp_path / "data"))
    async with _plane(tmp_path) as cp:
        lacking = await FakeAgent(cp, catalog=None).enroll()
        lacking.catalog = _without(cp, "TensorCreate")
        await lacking.connect()
        same = await FakeAgent(cp, name="w2", catalog=None).enroll()
        same.catalog = {"types": catalog.node_catalog(cp.runs.registry)["types"], "hash": "sha256:" + "2" * 64}
        await same.connect()
        card = await cp.worker("w2")
        assert card is not None and (card["degraded"], card["catalog"]["state"]) == (False, "ok")
        capsys.readouterr()
        assert await asyncio.to_thread(cli.main, ["workers", "list", "--control", cp.url]) == 0
        lines = capsys.readouterr().out.splitlines()
        w1 = lines.index(next(ln for ln in lines if ln.startswith("w1 ")))
        assert "[degraded]" in lines[w1]
        assert lines[w1 + 1] == ("  degraded: node catalog differs: lacks TensorCreate (`any` skips it; runs using "
                                 "those types are refused)")
        w2 = lines.index(next(ln for ln in lines if ln.startswith("w2 ")))
        assert "degraded" not in lines[w2] and lines[w2 + 1].startswith("  catalog: the worker has the same node "
                                                                        "types, but some are defined otherwise")
        await lacking.close()
        await same.close()


async def test_agents_reporting_the_same_or_other_catalogs_are_each_judged_on_their_own(tmp_path: Path) -> None:
    """The control plane keeps one copy of a catalog many agents report; each worker is still judged
    on the catalog it reported, however many others reported the same one or another."""
    async with _plane(tmp_path) as cp:
        lacking = _without(cp, "TensorCreate")
        agents = [await FakeAgent(cp, name=f"w{i}", catalog=None).enroll() for i in range(4)]
        for i, a in enumerate(agents):
            a.catalog = dict(lacking, types=list(lacking["types"])) if i % 2 else "same"
            await a.connect()
        try:
            for i in range(4):
                card = await cp.worker(f"w{i}")
                assert card is not None
                assert card["catalog"]["lacking"] == (["TensorCreate"] if i % 2 else []), (i, card["catalog"])
        finally:
            for a in agents:
                await a.close()
