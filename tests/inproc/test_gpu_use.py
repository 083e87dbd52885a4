"""GPU use per worker: an agent's heartbeat carries each CUDA card's utilisation and memory at a bounded
rate, the control plane keeps the last reading and lists it with the worker, and an agent without CUDA
cards reports none (no figure is invented)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import FakeAgent, Plane, eventually

from cdui.agent import gpu_usage
from cdui.plane.workers import WORKERS
from cdui.wire import protocol


def test_a_cpu_only_agent_reads_and_reports_no_gpu() -> None:
    assert gpu_usage.read(["cpu"]) is None
    sampler = gpu_usage.Sampler(["cpu"])
    assert not sampler.active and [sampler.due(t) for t in (0.0, 100.0)] == [False, False]
    # Cards offered on a machine whose torch sees no CUDA (this one): still nothing, never a guess.
    assert gpu_usage.read(["cuda:0", "cpu"]) is None


def test_the_reading_is_sent_at_most_once_per_interval() -> None:
    sampler = gpu_usage.Sampler(["cuda:0", "cuda:1"], every_s=15.0)
    assert [sampler.due(t) for t in (100.0, 105.0, 114.9, 115.0, 120.0, 130.0)] == [
        True, False, False, True, False, True]
    assert gpu_usage.GPU_REPORT_S >= 10  # bounded: no faster than the default heartbeat interval


@pytest.mark.parametrize(("gpu", "says"), [
    ([{"device": "cpu", "util": 1}], "heartbeat.gpu[0].device is not a CUDA card (cuda:N): 'cpu'"),
    ([{"device": "cuda:0", "util": 101}], "heartbeat.gpu[0].util is not a whole number from 0 to 100: '101'"),
    ([{"device": "cuda:0", "used_mb": -1}], "heartbeat.gpu[0].used_mb is not a whole number from 0 to 16777216"),
    ([{"device": "cuda:0", "util": True}], "heartbeat.gpu[0].util is not a whole number from 0 to 100: 'True'"),
    (["cuda:0"], "heartbeat.gpu[0] must be an object, got str"),
    ([{"device": f"cuda:{i}"} for i in range(65)], "heartbeat.gpu"),
])
def test_a_bad_reading_is_refused(gpu: object, says: str) -> None:
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.parse_agent_message(json.dumps({"type": "heartbeat", "runs": [], "gpu": gpu}))
    assert says in str(info.value)


async def test_the_control_plane_lists_the_last_reading_with_the_worker(tmp_path: Path) -> None:
    async with Plane(tmp_path / "ud", tmp_path / "data", CODEFYUI_LOCAL_DEVICES="cpu") as cp:
        gpu = await FakeAgent(cp, name="gpu1", devices=("cuda:0", "cuda:1", "cpu")).enroll()
        await gpu.connect()
        plain = await FakeAgent(cp, name="w2", devices=("cpu",)).enroll()
        await plain.connect()

        async def listed() -> dict[str, dict[str, object]]:
            return {w["name"]: w for w in (await cp.call("GET", "/api/workers"))["workers"]}

        assert [(await listed())[n]["gpu"] for n in ("gpu1", "w2")] == [None, None]
        reading = [{"device": "cuda:0", "util": 37, "used_mb": 1200, "total_mb": 81559},
                   {"device": "cuda:1", "util": None, "used_mb": 0, "total_mb": 81559}]
        assert gpu.ws is not None
        await gpu.ws.send_str(protocol.Heartbeat([], None, None, reading).to_json())
        manager = cp.app[WORKERS]
        await eventually(lambda: manager.conns["gpu1"].gpu is not None, "the reading to be read")
        w = (await listed())["gpu1"]
        assert w["gpu"] == reading and isinstance(w["gpu_at"], str), w
        # A heartbeat without a reading (the ones in between) keeps the last one.
        await gpu.heartbeat([])
        assert (await listed())["gpu1"]["gpu"] == reading
        await plain.heartbeat([])
        assert (await listed())["w2"]["gpu"] is None
        await gpu.close()
        await plain.close()
        assert (await listed())["gpu1"]["gpu"] is None  # offline: no live figures
