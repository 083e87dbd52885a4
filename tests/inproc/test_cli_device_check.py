"""`cdui run --device D` and `cdui runs clone --device D` refuse, before anything is queued, a device no
machine the target may use offers, listing what exists; `--queue-anyway` queues it all the same (the API
never refuses it: a run may wait for a machine about to connect).

The real CLI (in a thread) against a real control plane in this process; the workers are fake agents
speaking the real protocol."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from harness import FakeAgent, Plane, graph

from cdui.cli import cli


async def cdui(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = await asyncio.to_thread(cli.main, list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


async def test_a_device_no_machine_offers_is_refused_with_what_exists(
        dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODEFYUI_USER_DATA_DIR", str(dirs["user_data"]))
    monkeypatch.setenv("CODEFYUI_DATA_DIR", str(dirs["data_dir"]))
    g = tmp_path / "g.json"
    g.write_text(json.dumps(graph()))
    async with Plane(**dirs, CODEFYUI_LOCAL_DEVICES="cpu", CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=0") as cp:
        c = ["--control", cp.url]

        async def queued() -> int:
            return len((await cp.api("GET", "/api/runs"))[1])

        rc, out, err = await cdui(capsys, "run", str(g), "--device", "cuda", *c)
        assert (rc, out) == (1, "")
        assert err == (
            "cdui: error: no machine the target local (this server) may use offers a cuda device, so the run "
            "would wait for ever; nothing was queued\n"
            "what exists:\n"
            "  this server (local): cpu\n"
            "  no workers are enrolled\n"
            "what to do: enroll a machine that has it (`cdui workers token` prints the agent command); choose a "
            "device that exists (--device cpu, or leave --device out for any free device); or queue it anyway, "
            "to wait until such a machine connects (--queue-anyway)\n")
        assert await queued() == 0

        gpu = await FakeAgent(cp, name="gpu1", devices=("cuda:0", "cuda:1", "cpu")).enroll()
        await gpu.connect()
        small = await FakeAgent(cp, name="w2", devices=("cpu",)).enroll()
        await small.connect()
        await small.close()  # offline: still listed, with the devices it last offered

        # Target local: gpu1 has it, so the answer points there.
        rc, out, err = await cdui(capsys, "run", str(g), "--device", "cuda:1", *c)
        assert rc == 1, err
        assert "  this server (local): cpu\n  worker gpu1 (online): cuda:0, cuda:1, cpu\n" in err
        assert "  worker w2 (offline): cpu\n" in err
        assert "what to do: target one that has it (--target gpu1 or --target any); " in err
        # Target w2, which has only a cpu.
        rc, out, err = await cdui(capsys, "run", str(g), "--device", "cuda", "--target", "w2", *c)
        assert rc == 1 and err.startswith("cdui: error: no machine the target worker w2 may use offers a cuda "
                                          "device"), err
        # Where some machine the target may use offers it, the run is queued.
        for argv in (["--device", "cuda:1", "--target", "gpu1"], ["--device", "cuda", "--target", "any"],
                     ["--device", "cpu"], ["--device", "auto"], ["--device", "cuda", "--target", "one-shot"]):
            rc, out, err = await cdui(capsys, "run", str(g), *argv, *c)
            assert rc == 0 and err == "", (argv, err)
        assert await queued() == 5
        rc, out, err = await cdui(capsys, "run", str(g), "--device", "cuda:7", "--target", "any", *c)
        assert rc == 1 and "offers a cuda:7 device" in err and "--target gpu1" not in err, err
        # --queue-anyway queues it; the control plane says why it waits.
        rc, out, err = await cdui(capsys, "run", str(g), "--device", "cuda", "--queue-anyway", *c)
        assert rc == 0 and err == "", err
        run_id = out.strip()
        assert (await cp.api("GET", f"/api/runs/{run_id}"))[1]["status"] == "queued"
        # A name the control plane refuses keeps the control plane's own words.
        rc, out, err = await cdui(capsys, "run", str(g), "--device", "tpu", *c)
        assert err == "cdui: error: device 'tpu' is not valid (use cpu, cuda, cuda:N or auto)\n"

        # The clone of that run onto this server asks for cuda again: refused the same way.
        before = await queued()
        rc, out, err = await cdui(capsys, "runs", "clone", run_id, *c)
        assert rc == 1 and err.startswith("cdui: error: no machine the target local (this server) may use offers "
                                          "a cuda device"), err
        rc, out, err = await cdui(capsys, "runs", "clone", run_id, "--target", "gpu1", *c)
        assert rc == 0, err
        rc, out, err = await cdui(capsys, "runs", "clone", run_id, "--queue-anyway", *c)
        assert rc == 0, err
        assert await queued() == before + 2
        await gpu.close()
