"""Files on workers: the `data` mount and the transfer backend (STO, XFER).

Real control plane and agent processes with separate data folders; the agent
counts as another machine (CODEFYUI_MACHINE_ID), so nothing is shared unless
a test mounts it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from procs import (
    REPO_ROOT,
    AgentProc,
    ServerProc,
    edge,
    graph,
    load_example,
    node,
    spool_dir,
    trig,
    wait_for,
    wait_run,
)
from tcpproxy import TcpProxy

# Every test here drives real cdui processes (server, agents, run subprocesses): the e2e tier.
pytestmark = pytest.mark.e2e

WRITER = '''
import time
from cdui.nodes.base import Node, Param, Port


class Writer(Node):
    """Writes `text` (repeated `repeat` times) to output/<path> after `delay` s."""
    NODE_NAME = "Writer"
    CATEGORY = "test"
    WRITES_TO = "output"

    @classmethod
    def define_params(cls):
        return [Param("path", "output_path", "fixed.txt"), Param("text", "string", "hello"),
                Param("repeat", "int", 1), Param("delay", "float", 0.0)]

    @classmethod
    def define_outputs(cls):
        return [Port("path", "STRING")]

    def execute(self, inputs, params, ctx):
        end = time.time() + float(params["delay"])
        while time.time() < end:
            if ctx.should_stop():
                break
            time.sleep(0.05)
        p = ctx.output_path("output", params["path"])
        p.write_text(params["text"] * int(params["repeat"]))
        ctx.artifact("output", p)
        return {"path": str(p)}


class SizeOf(Node):
    """The size of an upload chosen in a file field (a run with one input and nothing else to do)."""
    NODE_NAME = "SizeOf"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("input", "data_file", "")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        return {"value": float(ctx.resolve_upload("files", params["input"]).stat().st_size)}
'''


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def install_nodes(data_dir: Path) -> None:
    (data_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (data_dir / "custom_nodes" / "writer.py").write_text(WRITER)


def writer_graph(**params: Any) -> dict[str, Any]:
    return graph([node("start", "Start"), node("w", "Writer", **params)], [trig("start", "w")], name="writer")


def iris_on_upload(name: str = "train.csv", checkpoint_every: int = 0) -> dict[str, Any]:
    g = load_example()
    for n in g["nodes"]:
        if n["type"] == "CSVReader":
            n["data"]["params"]["path"] = name
        if n["type"] == "TrainingLoop" and checkpoint_every:
            n["data"]["params"]["checkpoint_every"] = checkpoint_every
    return g


class Agent(AgentProc):
    """An agent with this file's test nodes installed in its data folder."""

    def __init__(self, tmp: Path, control: str, token: str, name: str = "w2", mount: str | None = None,
                 machine: str = "another-machine") -> None:
        super().__init__(tmp, control, token, name, mount, machine, prepare=install_nodes)


def start_server(tmp: Path, **env: str) -> ServerProc:
    s = ServerProc(tmp, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1", **env})
    install_nodes(s.data_dir)
    return s.start()


def start_agent(cp: ServerProc, tmp: Path, control: str | None = None, **kw: Any) -> Agent:
    tok = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    a = Agent(tmp, control or cp.url, tok, **kw)
    a.spawn()
    name = kw.get("name", "w2")

    def online():
        if not a.alive:
            raise AssertionError(f"agent exited {a.returncode}:\n{a.log_tail(30)}")
        for w in cp.call("GET", "/api/workers", expect=200)["workers"]:
            if w["name"] == name and w["online"]:
                return w
        return None
    wait_for(online, 120, 0.2, f"worker {name} online")
    return a


def upload_train(cp: ServerProc) -> bytes:
    data = (REPO_ROOT / "data" / "samples" / "iris.csv").read_bytes()
    status, body = cp.upload("files", "train.csv", data)
    assert status == 201, body
    return data


def warnings(cp: ServerProc, run_id: str, kind: str) -> list[str]:
    return [e["data"]["message"] for e in cp.events(run_id)
            if e["kind"] == "run_warning" and e["data"].get("kind") == kind]


@pytest.fixture
def cp(tmp_path):
    s = start_server(tmp_path)
    yield s
    s.stop()


def test_a_large_input_reports_its_fetch_while_it_runs(cp, tmp_path):
    """An input of 64 MiB or more says how far its fetch has got at each quarter, not only once it is there."""
    status, body = cp.upload("files", "big.bin", os.urandom(1 << 20) * 80)
    assert status == 201, body
    a = start_agent(cp, tmp_path)
    try:
        g = graph([node("start", "Start"), node("s", "SizeOf", input="big.bin")], [trig("start", "s")], name="big")
        run = cp.submit(g, {"target": {"worker": "w2"}})
        assert wait_run(cp, run["id"])["status"] == "succeeded", cp.events(run["id"])[-5:]
        lines = warnings(cp, run["id"], "transfer_progress")
        assert lines[-1] == "fetching inputs 1/1: big.bin (80.00 MiB, fetched)", lines
        quarters = [m for m in (re.fullmatch(r"fetching inputs 1/1: big\.bin [\d.]+ MiB of 80\.00 MiB \((\d+) %\)", x)
                                for x in lines[:-1])]
        assert all(quarters), lines  # every line before the last is an in-flight one
        percents = [int(m.group(1)) for m in quarters if m]
        assert percents == sorted(percents) and all(0 <= p < 100 for p in percents), lines
        # Each quarter is said once it has passed (a line every 10 s may come between them on a slow link).
        for q in (25, 50, 75):
            assert any(q <= p < q + 25 for p in percents), (q, lines)
    finally:
        a.stop()


def test_transfer_run_trains_on_upload_and_outputs_land_here(cp, tmp_path):
    """Acceptance of the transfer backend: a run on an unmounted worker reads an uploaded CSV, writes a model and
    checkpoints; the model is downloadable here, byte-identical; a second run fetches nothing."""
    upload_train(cp)
    a = start_agent(cp, tmp_path)
    try:
        run = cp.submit(iris_on_upload(checkpoint_every=5), {"target": {"worker": "w2"}})
        done = wait_run(cp, run["id"])
        assert done["status"] == "succeeded", done
        assert warnings(cp, run["id"], "transfer_progress") == ["fetching inputs 1/1: train.csv (3.77 KiB, fetched)"]
        arts = cp.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
        model = [x for x in arts if x["relative_path"] == "models/iris/model.pt"]
        assert model and model[0]["backend"] == "transfer" and model[0]["kind"] == "output", arts
        worker_copy = a.user_data / "agent-runs" / run["id"] / "data" / "models" / "iris" / "model.pt"
        body = cp.raw("GET", f"/api/runs/{run['id']}/artifacts/{model[0]['id']}/download").body
        assert body == worker_copy.read_bytes() and sha(body) == model[0]["sha256"]
        assert (cp.data_dir / "models" / "iris" / "model.pt").read_bytes() == body
        ckpts = [x for x in arts if x["kind"] == "checkpoint"]
        assert ckpts and all(x["relative_path"].startswith(f"runs/{run['id']}/checkpoint/") for x in ckpts), arts
        for c in ckpts:
            assert sha(Path(c["path"]).read_bytes()) == c["sha256"]
        first_model = body
        # Second run: the input comes from the agent's cache.
        cache = a.user_data / "agent-cache"
        before = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
        run2 = cp.submit(iris_on_upload(), {"target": {"worker": "w2"}})
        assert wait_run(cp, run2["id"])["status"] == "succeeded"
        assert warnings(cp, run2["id"], "transfer_progress") == ["fetching inputs 1/1: train.csv (3.77 KiB, cached)"]
        assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == before, "nothing was fetched again"
        # The first model is kept; the second is stored once if identical, else under a suffix:
        # which of the two is decided by the bytes the worker produced.
        assert (cp.data_dir / "models" / "iris" / "model.pt").read_bytes() == first_model
        second = (a.user_data / "agent-runs" / run2["id"] / "data" / "models" / "iris" / "model.pt").read_bytes()
        expected = "models/iris/model.pt" if second == first_model else "models/iris/model-1.pt"
        m2 = [x for x in cp.call("GET", f"/api/runs/{run2['id']}/artifacts", expect=200) if x["kind"] == "output"]
        assert m2[0]["relative_path"] == expected, (m2, second == first_model)
    finally:
        a.stop()


def test_identical_output_stored_once_different_gets_suffix(cp, tmp_path):
    """A different file at the target is kept and the new one suffixed; identical content once."""
    a = start_agent(cp, tmp_path)
    try:
        (cp.data_dir / "output").mkdir(exist_ok=True)
        (cp.data_dir / "output" / "fixed.txt").write_text("the user's own file")
        r1 = cp.submit(writer_graph(text="from the worker"), {"target": {"worker": "w2"}})
        assert wait_run(cp, r1["id"])["status"] == "succeeded"
        assert (cp.data_dir / "output" / "fixed.txt").read_text() == "the user's own file"
        assert (cp.data_dir / "output" / "fixed-1.txt").read_text() == "from the worker"
        r2 = cp.submit(writer_graph(text="from the worker"), {"target": {"worker": "w2"}})
        assert wait_run(cp, r2["id"])["status"] == "succeeded"
        assert not (cp.data_dir / "output" / "fixed-2.txt").exists(), "identical content is stored once"
        a2 = cp.call("GET", f"/api/runs/{r2['id']}/artifacts", expect=200)
        assert [x["relative_path"] for x in a2 if x["kind"] == "output"] == ["output/fixed-1.txt"]
    finally:
        a.stop()


def test_placement_refusals_for_unmounted_worker(tmp_path):
    """Every refusal of the placement table, with the exact message."""
    cp = start_server(tmp_path, CODEFYUI_TRANSFER_MAX_INPUT_BYTES="1000")
    a = start_agent(cp, tmp_path)
    try:
        upload_train(cp)
        prefix = "worker w2 has no `data` mount; add `--mount data=...` to its agent, or make the run fit the " \
                 "transfer backend: "

        def refused(g: dict[str, Any]) -> str:
            status, body = cp.api("POST", "/api/runs", {"graph": g, "options": {"target": {"worker": "w2"}}})
            assert status == 400, body
            assert body["error"]["message"].startswith(prefix), body
            return body["error"]["message"][len(prefix):]

        n_runs = len(cp.call("GET", "/api/runs", expect=200))
        plain = graph([node("start", "Start"), node("fr", "FileReader", path="examples/iris_train.json"),
                       node("p", "Print")], [trig("start", "fr"), edge("fr", "text", "p", "value")])
        assert "plain path 'examples/iris_train.json'" in refused(plain)
        assert "upload files/missing.csv does not exist on this server" in refused(iris_on_upload("missing.csv"))
        assert refused(iris_on_upload()) == ("its inputs add up to 0.00 GiB, over the transfer limit of 0.00 GiB "
                                             "(CODEFYUI_TRANSFER_MAX_INPUT_BYTES)")
        assert len(cp.call("GET", "/api/runs", expect=200)) == n_runs, "nothing stored for refused runs"
        # `any` skips the unmounted worker for such a run: it runs on this server (which has `data`).
        r = cp.submit(iris_on_upload(), {"target": "any"})
        assert wait_run(cp, r["id"])["worker_id"] == "local"
        # A run without files goes to the unmounted worker.
        ok = cp.submit(graph([node("start", "Start"), node("t", "TensorCreate"), node("p", "Print")],
                             [trig("start", "t"), edge("t", "tensor", "p", "value")]), {"target": {"worker": "w2"}})
        assert wait_run(cp, ok["id"])["status"] == "succeeded"
    finally:
        a.stop()
        cp.stop()
    cp2 = start_server(tmp_path / "off", CODEFYUI_TRANSFER_ENABLED="0")
    a2 = start_agent(cp2, tmp_path / "off")
    try:
        status, body = cp2.api("POST", "/api/runs", {"graph": writer_graph(), "options": {"target": {"worker": "w2"}}})
        assert status == 400 and body["error"]["message"].endswith(
            "the transfer backend is off (CODEFYUI_TRANSFER_ENABLED=0)"), body
    finally:
        a2.stop()
        cp2.stop()


def test_uploads_survive_503_then_recover(cp, tmp_path):
    """A proxy answering 503 while the run ends; the files arrive once it recovers."""
    proxy = TcpProxy(cp.port)
    a = start_agent(cp, tmp_path, control=proxy.url)
    try:
        run = cp.submit(writer_graph(text="late file", delay=4), {"target": {"worker": "w2"}})
        # Wait until the worker really runs it (its own events arrived), not only until it was dispatched.
        wait_for(lambda: any(e["kind"] == "node_status" and e["data"].get("node_id") == "w"
                             for e in cp.events(run["id"])), 60, 0.1, "the Writer node to start on the worker")
        proxy.answer_503()
        wait_for(lambda: "uploading fixed.txt failed" in a.log_text(), 60, 0.2, "the agent to retry an upload")
        proxy.restore()
        done = wait_run(cp, run["id"])
        assert done["status"] == "succeeded", done
        assert (cp.data_dir / "output" / "fixed.txt").read_text() == "late file"
        assert not warnings(cp, run["id"], "transfer_failed")
    finally:
        a.stop()
        proxy.close()


def test_oversize_output_stays_on_worker(tmp_path):
    """A file over CODEFYUI_MAX_UPLOAD_SIZE stays on the worker, listed with its worker path."""
    cp = start_server(tmp_path, CODEFYUI_MAX_UPLOAD_SIZE="1000")
    a = start_agent(cp, tmp_path)
    try:
        run = cp.submit(writer_graph(text="x", repeat=5000), {"target": {"worker": "w2"}})
        assert wait_run(cp, run["id"])["status"] == "succeeded"
        failed = warnings(cp, run["id"], "transfer_failed")
        assert failed and "stays on the worker" in failed[0], failed
        arts = cp.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
        left = [x for x in arts if x["name"] == "fixed.txt"]
        assert left and left[0]["path"].startswith(str(a.user_data)), arts
        assert Path(left[0]["path"]).stat().st_size == 5000
        assert not (cp.data_dir / "output" / "fixed.txt").exists()
    finally:
        a.stop()
        cp.stop()


def test_worker_credential_is_confined(cp, tmp_path):
    """XFER security: uploads only for its own runs, only into models/ media/ output/ and the run folder;
    downloads only of its runs' inputs; no other route."""
    upload_train(cp)
    a = start_agent(cp, tmp_path)
    try:
        run = cp.submit(writer_graph(delay=600), {"target": {"worker": "w2"}})
        wait_run(cp, run["id"], {"running"}, 60)
        auth = {"Authorization": f"Bearer {a.credential}"}

        def upload(meta: dict[str, Any], run_id: str = run["id"]) -> tuple[int, Any]:
            boundary = "cduiboundary"
            body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"meta\"\r\n"
                    f"Content-Type: application/json\r\n\r\n{json.dumps(meta)}\r\n"
                    f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x\"\r\n"
                    f"Content-Type: application/octet-stream\r\n\r\nEVIL\r\n--{boundary}--\r\n").encode()
            r = cp.raw("POST", f"/api/runs/{run_id}/artifacts/upload", body, token=False,
                       headers={**auth, "Content-Type": f"multipart/form-data; boundary={boundary}"})
            return r.status, r.json() if r.body else None

        for meta, code in (({"group": "output", "relative_path": "../../evil.txt"}, "path_refused"),
                           ({"group": "output", "relative_path": "files/evil.txt"}, "path_refused"),
                           ({"group": "output", "relative_path": "/tmp/evil.txt"}, "path_refused"),
                           ({"group": "output", "relative_path": "custom_nodes/evil.py"}, "path_refused"),
                           ({"group": "artifact", "kind": "checkpoint", "name": "../../../evil.txt"}, "path_refused"),
                           ({"group": "artifact", "kind": "../x", "name": "evil.txt"}, "bad_upload"),
                           ({"group": "artifact", "kind": "checkpoint", "name": "a\x00b"}, "path_refused")):
            status, body = upload(meta)
            assert (status, body["error"]["code"]) == (400, code), (meta, status, body)
        assert not list(tmp_path.rglob("evil*")), "nothing was written for a refused upload"
        status, body = upload({"group": "output", "relative_path": "output/ok.txt"})
        assert status == 201, body
        other = cp.submit(writer_graph(), {"target": "local"})
        status, _ = upload({"group": "output", "relative_path": "output/x.txt"}, run_id=other["id"])
        assert status == 403, "not its run"
        # Downloads: only inputs of its own runs.
        r = cp.raw("GET", "/api/files/download/train.csv", token=False, headers=auth)
        assert r.status == 403
        r = cp.raw("GET", "/api/runs", token=False, headers=auth)
        assert r.status == 403 and r.json()["error"]["code"] == "forbidden", (r.status, r.body[:300])
        cp.call("POST", f"/api/runs/{run['id']}/stop", expect=200)
        wait_run(cp, run["id"])
    finally:
        a.stop()


def test_mount_run_artifacts_relative_to_mount(cp, tmp_path):
    """A mounted worker reads and writes the shared folder; artifacts are
    `backend: mount`, relative to the mount, with this server's path (or null where it lacks the file)."""
    upload_train(cp)
    shared = cp.data_dir  # the share, seen by the worker at a path of its own
    link = tmp_path / "nas-view"
    link.symlink_to(shared)
    a = start_agent(cp, tmp_path, mount=str(link), name="m1")
    b = None
    try:
        w = [x for x in cp.call("GET", "/api/workers", expect=200)["workers"] if x["name"] == "m1"][0]
        assert "data" in w["labels"]
        run = cp.submit(iris_on_upload(), {"target": {"worker": "m1"}})
        assert wait_run(cp, run["id"])["status"] == "succeeded"
        assert not warnings(cp, run["id"], "transfer_progress"), "a mount run fetches nothing"
        arts = cp.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
        m = [x for x in arts if x["relative_path"] == "models/iris/model.pt"]
        assert m and m[0]["backend"] == "mount" and m[0]["label"] == "data", arts
        assert m[0]["path"] == str(cp.data_dir / "models" / "iris" / "model.pt")
        saved = json.loads((a.user_data / "agent.json").read_text())
        assert saved["mounts"]["data"] == str(link)
        # A worker whose `data` is a folder this server does not see: path null, label + relative path.
        private = tmp_path / "private-share"
        (private / "files").mkdir(parents=True)
        (private / "files" / "train.csv").write_bytes((cp.data_dir / "files" / "train.csv").read_bytes())
        b = start_agent(cp, tmp_path, mount=str(private), name="m2")
        (cp.data_dir / "models" / "iris" / "model.pt").unlink()
        run2 = cp.submit(iris_on_upload(), {"target": {"worker": "m2"}})
        assert wait_run(cp, run2["id"])["status"] == "succeeded"
        m2 = [x for x in cp.call("GET", f"/api/runs/{run2['id']}/artifacts", expect=200)
              if x["relative_path"] == "models/iris/model.pt"]
        assert m2 and m2[0]["path"] is None and m2[0]["label"] == "data", m2
        assert (private / "models" / "iris" / "model.pt").exists()
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_two_mount_runs_each_download_their_own_file(cp, tmp_path):
    """Acceptance (worker): two runs of one graph on a mounted worker write the same named file on the
    share; the file is the latest, and each run's download has the sha256 its own row lists."""
    link = tmp_path / "nas-view"
    link.symlink_to(cp.data_dir)
    a = start_agent(cp, tmp_path, mount=str(link), name="m1")
    try:
        runs = []
        for text in ("first run", "second run"):
            run = cp.submit(writer_graph(text=text), {"target": {"worker": "m1"}})
            assert wait_run(cp, run["id"])["status"] == "succeeded"
            runs.append((run["id"], text.encode()))
        assert (cp.data_dir / "output" / "fixed.txt").read_bytes() == b"second run"
        for run_id, body in runs:
            arts = cp.call("GET", f"/api/runs/{run_id}/artifacts", expect=200)
            assert [(x["backend"], x["relative_path"], x["sha256"]) for x in arts] == [
                ("mount", "output/fixed.txt", sha(body))], arts
            got = cp.raw("GET", f"/api/runs/{run_id}/artifacts/{arts[0]['id']}/download")
            assert (got.status, got.body) == (200, body)
    finally:
        a.stop()


def test_stop_while_inputs_download_is_cancelled(cp, tmp_path):
    """Stop pressed while the inputs download ends the run `cancelled`."""
    big = b"a,b,species\n" + b"1.0,2.0,x\n" * 300_000  # ~3 MB: long over a slow link
    assert cp.upload("files", "big.csv", big)[0] == 201
    proxy = TcpProxy(cp.port)
    a = start_agent(cp, tmp_path, control=proxy.url)
    try:
        proxy.rate = 100_000
        g = graph([node("start", "Start"), node("csv", "CSVReader", path="big.csv", target_column="species"),
                   node("p", "Print")], [trig("start", "csv"), edge("csv", "tensor", "p", "value")])
        run = cp.submit(g, {"target": {"worker": "w2"}})
        wait_for(lambda: "fetching 1 input(s)" in a.log_text(), 60, 0.1, "the download to start")
        cp.call("POST", f"/api/runs/{run['id']}/stop", expect=200)
        done = wait_run(cp, run["id"])
        assert done["status"] == "cancelled", done
        assert done["error"] == "stopped while its inputs were downloading", done
        assert not list((a.user_data / "agent-cache").glob("*.part-*")), "no partial file is left in the cache"
    finally:
        proxy.rate = 0
        a.stop()
        proxy.close()


def test_stop_during_final_uploads_leaves_rest_on_worker(cp, tmp_path):
    """Stop during the final uploads: the rest stay on the worker, one transfer_failed counts them."""
    proxy = TcpProxy(cp.port)
    a = start_agent(cp, tmp_path, control=proxy.url)
    try:
        nodes = [node("start", "Start")] + [node(f"w{i}", "Writer", path=f"big{i}.bin", text="z", repeat=400_000)
                                           for i in range(3)]
        g = graph(nodes, [trig("start", f"w{i}") for i in range(3)], name="three files")
        proxy.rate = 200_000
        run = cp.submit(g, {"target": {"worker": "w2"}})
        # Every Writer finished (the worker spooled their `done`), so the run's own work
        # succeeded before Stop; Stop then only cuts the final uploads short.
        def writers_done() -> set[str]:
            spool = spool_dir(a.user_data, run["id"]) / "events.jsonl"  # there once the run was assigned
            done_ids = set()
            for line in (spool.read_text().splitlines() if spool.is_file() else []):
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # the line being appended right now
                if ev.get("kind") == "node_status" and ev["data"].get("status") == "done":  # (not a header)
                    done_ids.add(ev["data"]["node_id"])
            return done_ids
        wait_for(lambda: {"w0", "w1", "w2"} <= writers_done(), 120, 0.1, "the three writers to finish on the worker")
        wait_for(lambda: (cp.data_dir / "output").is_dir() and any(
            p.name.startswith("big") for p in (cp.data_dir / "output").iterdir()), 120, 0.1, "the first file")
        cp.call("POST", f"/api/runs/{run['id']}/stop", expect=200)
        done = wait_run(cp, run["id"], timeout=300)
        failed = warnings(cp, run["id"], "transfer_failed")
        assert len(failed) == 1 and "not uploaded because the run was stopped" in failed[0], failed
        left = [x for x in cp.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
                if x["path"] and x["path"].startswith(str(a.user_data))]
        assert left, "the files not sent are listed with their worker path"
        assert done["status"] == "succeeded", done
    finally:
        proxy.rate = 0
        a.stop()
        proxy.close()


def test_stopped_transfer_training_keeps_its_interrupt_checkpoint_here(cp, tmp_path):
    """The checkpoint of a stopped training loop is uploaded (last) into the run's folder here."""
    upload_train(cp)
    a = start_agent(cp, tmp_path)
    try:
        g = iris_on_upload()
        for n in g["nodes"]:
            if n["type"] == "TrainingLoop":
                n["data"]["params"]["epochs"] = 100000
        run = cp.submit(g, {"target": {"worker": "w2"}})
        wait_for(lambda: any(e["kind"] == "progress" for e in cp.events(run["id"])), 120, 0.2, "training progress")
        cp.call("POST", f"/api/runs/{run['id']}/stop", expect=200)
        done = wait_run(cp, run["id"])
        assert done["status"] == "cancelled", done
        arts = cp.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
        ck = [x for x in arts if x["name"] == "interrupt.pt"]
        assert ck and ck[0]["backend"] == "transfer", arts
        assert ck[0]["relative_path"] == f"runs/{run['id']}/checkpoint/interrupt.pt"
        assert sha(Path(ck[0]["path"]).read_bytes()) == ck[0]["sha256"]
        assert not warnings(cp, run["id"], "transfer_failed")
    finally:
        a.stop()


def test_mount_offered_only_while_its_folder_exists_and_fixed_while_running(cp, tmp_path):
    """A missing mount folder is not offered until it appears (rechecked every heartbeat);
    --mount cannot change while the agent runs (exit 4)."""
    later = tmp_path / "appears-later"
    a = start_agent(cp, tmp_path, mount=str(later), name="m3")
    try:
        labels = lambda: [w for w in cp.call("GET", "/api/workers", expect=200)["workers"]  # noqa: E731
                          if w["name"] == "m3"][0]["labels"]
        assert "data" not in labels()
        later.mkdir()
        wait_for(lambda: "data" in labels(), 60, 0.2, "the mount to be offered once its folder exists")
        import subprocess
        r = subprocess.run([sys.executable, "-m", "cdui", "agent", "start", "--control", cp.url,
                            "--mount", f"data={tmp_path}"], env=a.env, cwd=REPO_ROOT, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 4 and "stop it with `cdui agent stop`" in r.stderr, r.stderr
        assert json.loads((a.user_data / "agent.json").read_text())["mounts"]["data"] == str(later)
    finally:
        a.stop()
