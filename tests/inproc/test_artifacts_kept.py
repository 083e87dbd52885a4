"""A run's history stays true: every recorded artifact downloads with the bytes its own row's sha256
names, whatever later runs, uploads or workers write to the same named path (docs/api.md#artifacts-keep-their-bytes).

A real control plane in this process; worker runs are the fake agent's (its uploads go through the real
upload route, its mount events through the real recording path); local runs are real run subprocesses."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cdui.plane.files.artifact_files import KeptFiles
from tests.inproc.harness import FakeAgent, Plane

# Writes `text` into models/<path> by opening the file in place, as torch.save does.
MODEL_WRITER = '''
from cdui.nodes.base import Node, Param, Port


class ModelWriter(Node):
    NODE_NAME = "ModelWriter"
    CATEGORY = "test"
    WRITES_TO = "models"

    @classmethod
    def define_params(cls):
        return [Param("path", "output_path", "iris/model.pt"), Param("text", "string", "weights")]

    @classmethod
    def define_outputs(cls):
        return [Port("path", "STRING")]

    def execute(self, inputs, params, ctx):
        p = ctx.output_path("models", params["path"])
        with open(p, "wb") as fh:
            fh.write(params["text"].encode())
        ctx.artifact("model", p, params["path"])
        return {"path": str(p)}
'''


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def writer_graph(text: str) -> dict[str, Any]:
    return {"nodes": [{"id": "start", "type": "Start", "data": {"params": {}}},
                      {"id": "w", "type": "ModelWriter", "data": {"params": {"path": "iris/model.pt", "text": text}}}],
            "edges": [{"source": "start", "sourceHandle": "trigger", "target": "w", "type": "trigger"}]}


async def download(cp: Plane, run_id: str, aid: int) -> tuple[int, bytes]:
    assert cp.session is not None
    async with cp.session.get(f"{cp.url}/api/runs/{run_id}/artifacts/{aid}/download") as r:
        return r.status, await r.read()


async def only_artifact(cp: Plane, run_id: str) -> dict[str, Any]:
    arts = await cp.call("GET", f"/api/runs/{run_id}/artifacts")
    assert len(arts) == 1, arts
    return arts[0]


async def worker_run(cp: Plane, agent: FakeAgent) -> str:
    run = await cp.submit({"target": {"worker": agent.name}})
    assign = await agent.assignment()
    assert assign["run_id"] == run["id"]
    await agent.status(run["id"], "running", pid=1)
    return str(run["id"])


async def upload_output(cp: Plane, agent: FakeAgent, run_id: str, rel: str, body: bytes) -> dict[str, Any]:
    """What the real agent does after a transfer run: POST the file with its worker credential."""
    form = aiohttp.FormData()
    form.add_field("meta", json.dumps({"group": "output", "relative_path": rel, "sha256": sha(body),
                                       "size": len(body)}), content_type="application/json")
    form.add_field("file", body, filename=Path(rel).name, content_type="application/octet-stream")
    async with aiohttp.ClientSession() as s, s.post(
            f"{cp.url}/api/runs/{run_id}/artifacts/upload", data=form,
            headers={"Authorization": f"Bearer {agent.credential}"}) as r:
        assert r.status == 201, await r.text()
        return dict(await r.json())


def write_new(path: Path, body: bytes) -> None:
    """What a mounted worker's run does at a named path: the run context unlinks a linked file, the node writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_nlink > 1:
        path.unlink()
    path.write_bytes(body)


async def mount_run(cp: Plane, agent: FakeAgent, file: Path, rel: str, body: bytes, kind: str = "model") -> str:
    """A mount run on the fake agent: it writes ``file`` on the shared folder and reports it relative to the mount."""
    run_id = await worker_run(cp, agent)
    write_new(file, body)
    await agent.artifact(run_id, kind=kind, name=Path(rel).name, path=f"/nas/{rel}", backend="mount",
                         label="data", relative_path=rel, size=len(body), sha256=sha(body))
    await agent.status(run_id, "succeeded")
    await cp.wait_status(run_id, "succeeded")
    return run_id


async def mounted_agent(cp: Plane) -> FakeAgent:
    agent = FakeAgent(cp)
    await agent.enroll()
    await agent.connect()
    return agent


@pytest.mark.e2e  # runs real run subprocesses
async def test_two_local_runs_each_download_their_own_model(dirs: dict[str, Path]) -> None:
    """Acceptance (control plane): two runs of one graph that saves iris/model.pt; the named file is the
    latest, and each run's download has the sha256 its own row lists."""
    (dirs["data_dir"] / "custom_nodes").mkdir(parents=True)
    (dirs["data_dir"] / "custom_nodes" / "model_writer.py").write_text(MODEL_WRITER)
    async with Plane(**dirs) as cp:
        runs = []
        for text in ("first model", "second model"):
            run = await cp.call("POST", "/api/runs", {"graph": writer_graph(text), "options": {"target": "local"}},
                                expect=201)
            done = await cp.wait_status(run["id"], "succeeded", "failed", timeout=120)
            assert done["status"] == "succeeded", done
            runs.append((run["id"], text.encode()))
        assert (dirs["data_dir"] / "models" / "iris" / "model.pt").read_bytes() == b"second model"
        for run_id, body in runs:
            a = await only_artifact(cp, run_id)
            assert (a["relative_path"], a["sha256"]) == ("models/iris/model.pt", sha(body)), a
            status, got = await download(cp, run_id, a["id"])
            assert (status, got) == (200, body)


async def test_a_transfer_runs_output_survives_a_replaced_file(dirs: dict[str, Path]) -> None:
    """A worker run's uploaded model keeps its bytes after an upload replaces the file at its path."""
    async with Plane(**dirs) as cp:
        agent = await mounted_agent(cp)
        try:
            run_id = await worker_run(cp, agent)
            await upload_output(cp, agent, run_id, "models/m.pt", b"worker model")
            await agent.status(run_id, "succeeded")
            await cp.wait_status(run_id, "succeeded")
            assert cp.session is not None
            form = aiohttp.FormData()
            form.add_field("file", b"uploaded by hand", filename="m.pt")
            async with cp.session.post(f"{cp.url}/api/models/upload", data=form) as r:
                assert r.status == 201, await r.text()
            assert (dirs["data_dir"] / "models" / "m.pt").read_bytes() == b"uploaded by hand"
            a = await only_artifact(cp, run_id)
            assert (a["backend"], a["sha256"]) == ("transfer", sha(b"worker model"))
            assert await download(cp, run_id, a["id"]) == (200, b"worker model")
        finally:
            await agent.close()


async def test_two_mount_runs_and_a_copy_changed_in_place(dirs: dict[str, Path]) -> None:
    """Two mount runs write one named path: each downloads its own bytes. A kept copy whose bytes were
    changed in place is never served: the download says which run replaced the named file."""
    async with Plane(**dirs) as cp:
        agent = await mounted_agent(cp)
        named = dirs["data_dir"] / "models" / "iris" / "model.pt"
        try:
            r1 = await mount_run(cp, agent, named, "models/iris/model.pt", b"mount one")
            r2 = await mount_run(cp, agent, named, "models/iris/model.pt", b"mount two")
            for run_id, body in ((r1, b"mount one"), (r2, b"mount two")):
                a = await only_artifact(cp, run_id)
                assert (a["path"], a["sha256"]) == (str(named), sha(body)), a
                assert await download(cp, run_id, a["id"]) == (200, body)
            # Someone rewrites the first run's kept copy in place (same inode, other bytes).
            kept = KeptFiles(dirs["data_dir"] / "artifacts").path_of(sha(b"mount one"))
            with open(kept, "r+b") as fh:
                fh.write(b"MOUNT")
            a1 = await only_artifact(cp, r1)
            assert cp.session is not None
            async with cp.session.get(f"{cp.url}/api/runs/{r1}/artifacts/{a1['id']}/download") as r:
                body = await r.json()
                assert r.status == 410, body
            assert body["error"]["code"] == "replaced"
            assert body["error"]["message"] == (
                f"artifact {a1['id']} (model.pt) of run {r1} cannot be served: the file at {named} now holds other "
                f"bytes (run {r2} wrote its model 'model.pt' there), and the recorded bytes "
                f"(sha256 {sha(b'mount one')}) were not kept")
            assert not kept.exists(), "a kept copy that no longer matches its name is dropped"
            assert await download(cp, r2, (await only_artifact(cp, r2))["id"]) == (200, b"mount two")
        finally:
            await agent.close()


async def test_deleting_a_run_frees_kept_bytes_no_other_run_names(dirs: dict[str, Path]) -> None:
    async with Plane(**dirs) as cp:
        agent = await mounted_agent(cp)
        kept = KeptFiles(dirs["data_dir"] / "artifacts")
        try:
            same = []
            for body in (b"identical", b"identical", b"different"):  # identical bytes are stored once
                run_id = await worker_run(cp, agent)
                await upload_output(cp, agent, run_id, "models/m.pt", body)
                await agent.status(run_id, "succeeded")
                await cp.wait_status(run_id, "succeeded")
                same.append(run_id)
            assert (dirs["data_dir"] / "models" / "m-1.pt").read_bytes() == b"different"
            assert kept.path_of(sha(b"identical")).stat().st_nlink == 2, "a hard link, not a second copy"
            await cp.call("DELETE", f"/api/runs/{same[0]}")
            assert kept.path_of(sha(b"identical")).read_bytes() == b"identical", "still named by the other run"
            (dirs["data_dir"] / "models" / "m.pt").unlink()  # the user removes the named file
            assert await download(cp, same[1], (await only_artifact(cp, same[1]))["id"]) == (200, b"identical")
            await cp.call("DELETE", f"/api/runs/{same[1]}")
            assert not kept.path_of(sha(b"identical")).exists()
            assert kept.path_of(sha(b"different")).read_bytes() == b"different"
            assert (dirs["data_dir"] / "models" / "m-1.pt").read_bytes() == b"different", "the named file stays"
        finally:
            await agent.close()


async def test_nfs_layout_mount_checkpoints_get_their_path(tmp_path: Path) -> None:
    """The NFS example (only the data folders on the share, the data folder itself local): a mount run's
    checkpoint under the share's runs/<run id>/ gets its path here, downloads, and goes with the run."""
    share = tmp_path / "mnt" / "codefyui" / "data"
    folders = {"CODEFYUI_DATA_FILES_DIR": share / "files", "CODEFYUI_IMAGES_DIR": share / "images",
               "CODEFYUI_MODELS_DIR": share / "models", "CODEFYUI_MEDIA_DIR": share / "media"}
    async with Plane(tmp_path / "ud", tmp_path / "data", **{k: str(v) for k, v in folders.items()}) as cp:
        agent = await mounted_agent(cp)
        try:
            run_id = await worker_run(cp, agent)
            ckpt = share / "runs" / run_id / "checkpoints" / "epoch-1.pt"
            model = share / "models" / "iris" / "model.pt"
            for file, rel, kind in ((ckpt, f"runs/{run_id}/checkpoints/epoch-1.pt", "checkpoint"),
                                    (model, "models/iris/model.pt", "model")):
                write_new(file, kind.encode())
                await agent.artifact(run_id, kind=kind, name=file.name, path=f"/nas/{rel}", backend="mount",
                                     label="data", relative_path=rel, size=len(kind), sha256=sha(kind.encode()))
            await agent.status(run_id, "succeeded")
            await cp.wait_status(run_id, "succeeded")
            arts = await cp.call("GET", f"/api/runs/{run_id}/artifacts")
            assert [(a["kind"], a["path"]) for a in arts] == [("checkpoint", str(ckpt)), ("model", str(model))]
            for a in arts:
                assert await download(cp, run_id, a["id"]) == (200, a["kind"].encode())
            await cp.call("DELETE", f"/api/runs/{run_id}")
            assert not (share / "runs" / run_id).exists()
            assert model.read_bytes() == b"model", "the named model stays"
        finally:
            await agent.close()


def test_kept_files_link_dedupe_and_refuse_a_symlink(tmp_path: Path) -> None:
    """The store's own rules, as a table of small cases: a link (not a copy), one file per content,
    an expected sha256 that differs keeps nothing, a symlink is refused, a big file is not hashed."""
    kept = KeptFiles(tmp_path / "data" / "artifacts")
    a, b = tmp_path / "data" / "a.pt", tmp_path / "data" / "b.pt"
    a.parent.mkdir(parents=True)
    a.write_bytes(b"same")
    b.write_bytes(b"same")
    facts = kept.keep(a, 1 << 20)
    assert facts is not None and facts.sha256 == sha(b"same")
    assert os.path.samefile(kept.path_of(sha(b"same")), a)
    kept.keep(b, 1 << 20)
    assert os.path.samefile(kept.path_of(sha(b"same")), b), "the freshest file with those bytes is the kept one"
    assert sorted(p.name for p in (tmp_path / "data" / "artifacts").rglob("*") if p.is_file()) == [sha(b"same")]
    a.write_bytes(b"other")
    facts = kept.keep(a, 1 << 20, expect=sha(b"what the worker said"))
    assert facts is not None and facts.sha256 == sha(b"other") and not kept.path_of(sha(b"other")).exists()
    link = tmp_path / "data" / "link.pt"
    link.symlink_to(a)
    with pytest.raises(ValueError, match="link.pt"):
        kept.keep(link, 1 << 20)
    facts = kept.keep(a, 2)
    assert facts is not None and (facts.size, facts.sha256) == (5, None)
    assert sorted(p.name for p in (tmp_path / "data" / "artifacts").rglob("*") if p.is_file()) == [sha(b"same")]
    fd = kept.open_verified(sha(b"same"))
    assert fd is not None and os.read(fd, 100) == b"same"
    os.close(fd)
    assert kept.open_verified("not-a-sha") is None
    # A store that cannot take the bytes (here a link where its folder should be, as a mounted worker
    # sharing the data folder could put): the file is still recorded, and served from its path if unchanged.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = KeptFiles(tmp_path / "data" / "linked-store")
    linked.root.symlink_to(elsewhere)
    facts = linked.keep(b, 1 << 20)
    assert facts is not None and facts.sha256 == sha(b"same") and list(elsewhere.iterdir()) == []
    fd = linked.open_matching(b, sha(b"same"))
    assert fd is not None and os.read(fd, 100) == b"same"
    os.close(fd)
    assert linked.open_matching(a, sha(b"same")) is None


@pytest.mark.parametrize("env, roots", [
    ({}, ["data"]),
    ({"CODEFYUI_MODELS_DIR": "mnt/d/models", "CODEFYUI_MEDIA_DIR": "mnt/d/media"}, ["data", "mnt/d"]),
    ({"CODEFYUI_MODELS_DIR": "elsewhere/weights"}, ["data"]),  # not under its own name: no share layout
    ({"CODEFYUI_MODELS_DIR": "data/models"}, ["data"]),
])
def test_where_a_mounted_workers_data_folder_may_be_seen(tmp_path: Path, env: dict[str, str],
                                                         roots: list[str]) -> None:
    from cdui.core.layout import Layout
    layout = Layout.from_env({"CODEFYUI_DATA_DIR": str(tmp_path / "data"),
                              **{k: str(tmp_path / v) for k, v in env.items()}}, install_root=tmp_path)
    assert layout.mount_roots() == [tmp_path / r for r in roots]
    assert layout.mount_run_dirs("r1") == [tmp_path / r / "runs" / "r1" for r in roots]
