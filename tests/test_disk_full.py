"""A full disk under the database: the run that cannot store its events ends
``failed`` saying so, health reports it, submits are refused, and everything
resumes without a restart once space is freed.

A real server whose user data folder is a 12 MB tmpfs (mounting needs root, as
here and in CI; the test is skipped with the reason otherwise) and a real run
that logs 200,000 lines, far more than fits.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdui.agent.spool import RunSpool
from cdui.wire.protocol import Lines
from procs import Proc, ServerProc, env_for, wait_for, wait_run
from test_end_states import chatter_graph, chatter_lines, http_pages, install_chatter

# Every test here drives real cdui processes (server, agents, run subprocesses): the e2e tier.
pytestmark = pytest.mark.e2e


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 12 MB tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(folder: Path, leave: int) -> Path:
    """A filler file taking all but ``leave`` bytes of the disk."""
    st = os.statvfs(folder)
    size = st.f_bavail * st.f_frsize - leave
    path = folder / "filler"
    with open(path, "wb") as fh:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            fh.write(chunk[:min(size, len(chunk))])
            size -= len(chunk)
    return path


def health_of(s: ServerProc) -> dict[str, object]:
    """/api/health's body: 200 when ok, 503 (the same body) when degraded."""
    return s.call("GET", "/api/health", expect=(200, 503))  # type: ignore[no-any-return]


def test_full_disk_fails_the_run_reports_it_refuses_submits_and_recovers(small_disk, tmp_path):
    s = ServerProc(tmp_path, user_data=small_disk / "user_data", data_dir=tmp_path / "data")
    install_chatter(s.data_dir)
    s.start()
    try:
        filler = fill(small_disk, leave=3 * 1024 * 1024)
        run = s.submit(chatter_graph(200000))
        done = wait_run(s, run["id"], timeout=300)
        assert done["status"] == "failed", done
        assert f"the disk holding {small_disk / 'user_data'} is full" in done["error"], done
        assert "the run's events could not be stored" in done["error"], done

        # What was stored stays readable and gapless; the last event is the ending.
        evs, _ = http_pages(s, run["id"])
        assert [e["seq"] for e in evs] == list(range(1, done["last_seq"] + 1))
        assert evs[-1]["kind"] == "status" and evs[-1]["data"]["status"] == "failed"
        lines = chatter_lines(evs)
        assert lines == [f"line {i}" for i in range(len(lines))] and len(lines) < 200000

        health = s.call("GET", "/api/health", expect=503)  # the same body, for a readiness probe's status code
        assert health["status"] == "degraded", health
        assert s.call("GET", "/api/health/live", expect=200)["status"] == "live", "liveness holds while degraded"
        assert [p["code"] for p in health["problems"]] == ["disk_full"], health
        assert "free space" in health["problems"][0]["hint"]
        assert "version" in health

        status, body = s.api("POST", "/api/runs", {"graph": chatter_graph(3)})
        assert status == 507, (status, body)
        assert body["error"]["code"] == "disk_full" and "free space" in body["error"]["hint"], body
        assert s.alive

        filler.unlink()
        wait_for(lambda: health_of(s)["status"] == "ok", 120, 0.2,
                 "health to be ok again after space was freed", detail=lambda: health_of(s))
        assert s.call("GET", "/api/health", expect=200) == {"status": "ok", "version": health["version"]}
        again = s.submit(chatter_graph(3))
        assert wait_run(s, again["id"])["status"] == "succeeded"
        assert chatter_lines(s.events(again["id"])) == ["line 0", "line 1", "line 2"]
        assert s.run(run["id"])["status"] == "failed", "the failed run keeps its ending"
    finally:
        s.stop()


def test_full_disk_keeps_a_worker_run_in_its_spool_and_replays_it_once_there_is_room(small_disk, tmp_path):
    """On a worker the run is not lost: the control plane does not acknowledge what it
    cannot store, the agent keeps it in its spool, and once space is freed everything
    arrives, gapless and exactly once, and the run ends as it really did."""
    s = ServerProc(tmp_path, user_data=small_disk / "user_data", data_dir=tmp_path / "data",
                   extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "2"})
    install_chatter(s.data_dir)
    s.start()
    tok = s.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    agent = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", s.url, "--name", "w1",
                  "--devices", "cpu", "--foreground", "--token", tok],
                 env_for(tmp_path / "agent-w1", tmp_path / "agent-w1-data"), tmp_path / "agent-w1.log",
                 name="agent-w1")
    agent.spawn()
    try:
        wait_for(lambda: any(w["online"] for w in s.call("GET", "/api/workers")["workers"]), 120, 0.2,
                 "worker w1 online")
        filler = fill(small_disk, leave=3 * 1024 * 1024)
        # 40,000 lines need about twice the room left (events are stored many to a row, about 68 bytes
        # each, and the WAL holds them again until a checkpoint): the disk fills part way through.
        run = s.submit(chatter_graph(40000), {"target": {"worker": "w1"}})
        wait_for(lambda: health_of(s)["status"] == "degraded", 300, 0.2, "the disk to fill")
        assert s.run(run["id"])["status"] == "running", "a worker run is not ended by the full disk"
        filler.unlink()
        done = wait_run(s, run["id"], timeout=300)
        assert done["status"] == "succeeded", done
        evs, _ = http_pages(s, run["id"])
        assert [e["seq"] for e in evs] == list(range(1, done["last_seq"] + 1))
        assert chatter_lines(evs) == [f"line {i}" for i in range(40000)]
        assert s.call("GET", "/api/health")["status"] == "ok"
    finally:
        agent.stop()
        s.stop()


def test_a_spool_batch_a_full_disk_cut_short_is_not_left_in_the_file(small_disk: Path) -> None:
    """An agent's disk that fills in the middle of a spool write: the part written is cut off again, so the
    batches appended once there is room read back whole after a restart (left in, it was read as the start
    of the cut batch's stated bytes, and every batch after it was lost to the reader)."""
    line = b'{"kind": "log", "data": {"message": "%s"}, "at": 1764694000.5}' % (b"x" * 100)
    first, later = b"\n".join([line] * 10), b"\n".join([line] * 20)
    spool = RunSpool(small_disk / "spool", "r1")
    spool.append_lines(Lines("r1", 1, first, 10))
    filler = fill(small_disk, leave=20_000)
    with pytest.raises(OSError) as exc:
        spool.append_lines(Lines("r1", 11, b"\n".join([line] * 1000), 1000))  # about 160 KB: part of it fits
    assert exc.value.errno == errno.ENOSPC
    assert spool.last_seq == 10 and (small_disk / "spool" / "r1" / "events.jsonl").stat().st_size == len(
        b'{"lines": 1, "n": 10, "bytes": %d}\n' % len(first)) + len(first) + 1
    filler.unlink()
    spool.append_lines(Lines("r1", 11, later, 20))
    again = RunSpool(small_disk / "spool", "r1")  # what the agent reads when it starts again
    assert again.last_seq == 30
    assert [(b.src_seq, b.n, b.data) for b in again.unacked()] == [(1, 10, first), (11, 20, later)]
