"""One contract for every file backend of a run on a worker (cdui/wire/file_backend.py).

The same assertions run against each kind, each with its real other side:

- ``own``: the agent's own installation (a run that uses no files);
- ``mount``: a folder shared with the control plane (``--mount data=PATH``);
- ``transfer``: a real control plane in this process on a loopback port, with a worker that speaks the
  real protocol (tests/inproc/harness.py); the backend downloads and uploads through its real routes;
- ``s3``: moto's standalone S3 server (tests/s3server.py, a process: the e2e tier).

Each :class:`Far` is a backend's other side: it holds the run's inputs where that kind keeps them, and
says what it holds afterwards (the bytes of an output, and the sha256s it would serve). Where a kind
moves nothing (own, mount), the tests about moving bytes are in ``MovingContract``, which runs
only for the kinds that move bytes.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cdui.agent.run_files import run_files
from cdui.core.atomic import temp_name
from cdui.core.config import Config, load
from cdui.core.errors import PathRefused
from cdui.core.layout import Layout
from cdui.wire import s3
from cdui.wire.file_backend import FileBackend
from cdui.wire.job import Job, JobFiles
from s3server import KEY, SECRET, MotoServer
from s3server import _need_moto as need_moto

sys.path.insert(0, str(Path(__file__).parent / "inproc"))
from harness import FakeAgent, Plane, n, t  # noqa: E402

RUN_GRAPH = {"nodes": [], "edges": []}
# The transfer backend's control plane takes files up to this size (CODEFYUI_MAX_UPLOAD_SIZE).
UPLOAD_LIMIT = 4096


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Handle:
    """What finish() reads of the run: how often Stop was pressed."""

    stop_count = 0


class StopDuringFinish:
    """Stop is pressed once more right after the final uploads begin (finish reads the count first)."""

    def __init__(self) -> None:
        self.reads = 0

    @property
    def stop_count(self) -> int:
        self.reads += 1
        return 0 if self.reads == 1 else 1


class Far:
    """A backend's other side. ``fetches``: inputs move (they are not already there); ``sends``: outputs move."""

    kind: str | None = None
    fetches = False
    sends = False

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cfg: Config = load({"CODEFYUI_USER_DATA_DIR": str(tmp / "agent-ud"),
                                 "CODEFYUI_DATA_DIR": str(tmp / "agent-data")})
        self.recorded: list[tuple[str, dict[str, Any]]] = []  # events the backend records itself
        self.stop_event = asyncio.Event()
        self.run_id = "r-contract"

    def record(self, kind: str, data: dict[str, Any]) -> None:
        self.recorded.append((kind, data))

    def backend(self, files: JobFiles) -> FileBackend:
        return run_files(self.run_id, files, self.cfg.user_data, {}, None, "http://127.0.0.1:9", "", 5.0,
                         self.record, self.stop_event)

    async def prepare(self, inputs: dict[str, bytes]) -> tuple[FileBackend, Job]:
        """Hold ``inputs`` (``folder/name`` -> bytes) as this side does; the run's backend and its job."""
        raise NotImplementedError

    async def holds(self, rel: str, events: list[dict[str, Any]]) -> bytes | None:
        """The bytes this side holds of the output the run wrote at ``rel`` in its data folder, if any."""
        raise NotImplementedError

    async def serves(self, events: list[dict[str, Any]]) -> set[str]:
        """The sha256 of every file of the run this side would serve (``events``: as on_artifact answered)."""
        raise NotImplementedError

    async def refuse(self) -> int:
        """Make this side refuse the next file; the size of a file it refuses."""
        raise NotImplementedError


class OwnFar(Far):
    """The agent's own installation: the run's files are in its data folder already."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.folder = self.cfg.layout.data_dir

    async def prepare(self, inputs: dict[str, bytes]) -> tuple[FileBackend, Job]:
        for rel, body in inputs.items():
            (self.folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.folder / rel).write_bytes(body)
        return self.backend(JobFiles(None)), Job(self.run_id, RUN_GRAPH)

    async def holds(self, rel: str, events: list[dict[str, Any]]) -> bytes | None:
        p = self.folder / rel
        return p.read_bytes() if p.is_file() else None

    async def serves(self, events: list[dict[str, Any]]) -> set[str]:
        return {str(e["sha256"]) for e in events if e.get("sha256")}


class MountFar(OwnFar):
    """A folder the control plane and the worker share: nothing moves, artifacts are named relative to it."""

    kind = "mount"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.folder = tmp / "nas"
        self.folder.mkdir()

    def backend(self, files: JobFiles) -> FileBackend:
        return run_files(self.run_id, files, self.cfg.user_data, {"data": str(self.folder)}, None,
                         "http://127.0.0.1:9", "", 5.0, self.record, self.stop_event)

    async def prepare(self, inputs: dict[str, bytes]) -> tuple[FileBackend, Job]:
        await super().prepare(inputs)
        files = JobFiles("mount", label="data")
        return self.backend(files), Job(self.run_id, RUN_GRAPH, files=files)

    async def holds(self, rel: str, events: list[dict[str, Any]]) -> bytes | None:
        # the control plane reads a mount row's file at its relative path under its own mount
        rows = [e for e in events if e.get("backend") == "mount" and e.get("relative_path") == rel]
        return (self.folder / rel).read_bytes() if rows else None

    async def serves(self, events: list[dict[str, Any]]) -> set[str]:
        return {str(e["sha256"]) for e in events if e.get("backend") == "mount" and e.get("sha256")}


class TransferFar(Far):
    """A real control plane: inputs are its uploads, outputs arrive through its upload route."""

    kind = "transfer"
    fetches = sends = True

    def __init__(self, tmp: Path, plane: Plane, agent: FakeAgent, session: aiohttp.ClientSession) -> None:
        super().__init__(tmp)
        self.plane, self.agent, self.session = plane, agent, session

    def backend(self, files: JobFiles) -> FileBackend:
        return run_files(self.run_id, files, self.cfg.user_data, {}, self.session, self.plane.url,
                         self.agent.credential, 1.0, self.record, self.stop_event)

    async def prepare(self, inputs: dict[str, bytes]) -> tuple[FileBackend, Job]:
        assert self.plane.session is not None
        # a run that reads an upload: what makes the control plane send a worker without the mount a transfer run
        inputs = inputs or {"files/unused.csv": b"a\n1\n"}
        nodes = [n("start", "Start")]
        for i, (rel, body) in enumerate(inputs.items()):
            folder, _, name = rel.partition("/")
            assert folder == "files", "the transfer backend's inputs are uploads"
            if len(body) > UPLOAD_LIMIT:  # larger than an upload may be: copied into the folder, as a user may
                (self.tmp / "cp-data" / "files").mkdir(parents=True, exist_ok=True)
                (self.tmp / "cp-data" / "files" / name).write_bytes(body)
            else:
                form = aiohttp.FormData()
                form.add_field("file", body, filename=name)
                async with self.plane.session.post(self.plane.url + "/api/files/upload", data=form) as r:
                    assert r.status == 201, await r.text()
            nodes.append(n(f"csv{i}", "CSVReader", path=name))
        edges = [t(str(node["id"])) for node in nodes[1:]]
        run = await self.plane.call("POST", "/api/runs", {"graph": {"nodes": nodes, "edges": edges},
                                                          "options": {"target": {"worker": self.agent.name}}},
                                    expect=201)
        assign = await self.agent.assignment()
        self.run_id = str(run["id"])
        assert assign["run_id"] == self.run_id
        await self.agent.status(self.run_id, "running", pid=1)
        job = Job.from_dict(assign["job"])
        assert job.files.backend == "transfer", job.files
        return self.backend(job.files), job

    async def _rows(self) -> list[dict[str, Any]]:
        return list(await self.plane.call("GET", f"/api/runs/{self.run_id}/artifacts"))

    async def holds(self, rel: str, events: list[dict[str, Any]]) -> bytes | None:
        assert self.plane.session is not None
        for row in await self._rows():
            if row.get("backend") == "transfer" and row.get("relative_path") == rel:
                url = f"{self.plane.url}/api/runs/{self.run_id}/artifacts/{row['id']}/download"
                async with self.plane.session.get(url) as r:
                    assert r.status == 200, await r.text()
                    return await r.read()
        return None

    async def serves(self, events: list[dict[str, Any]]) -> set[str]:
        return {str(r["sha256"]) for r in await self._rows() if r.get("sha256")}

    async def refuse(self) -> int:
        return UPLOAD_LIMIT + 1  # over the control plane's CODEFYUI_MAX_UPLOAD_SIZE


class S3Far(Far):
    """moto's S3 server: inputs are ``inputs/<sha256>`` objects, outputs arrive under ``runs/<run id>/``."""

    kind = "s3"
    fetches = sends = True

    def __init__(self, tmp: Path, moto: MotoServer) -> None:
        super().__init__(tmp)
        self.moto = moto
        self.target = {"bucket": "codefyui", "region": "us-east-1", "endpoint_url": moto.url,
                       "addressing_style": "path"}

    def backend(self, files: JobFiles) -> FileBackend:
        return run_files(self.run_id, files, self.cfg.user_data, {}, None, "http://127.0.0.1:9", "", 1.0,
                         self.record, self.stop_event)

    async def prepare(self, inputs: dict[str, bytes]) -> tuple[FileBackend, Job]:
        plan = []
        for rel, body in inputs.items():
            folder, _, name = rel.partition("/")
            await asyncio.to_thread(self.moto.client().put_object, Bucket="codefyui",
                                    Key=s3.input_key("", sha(body)), Body=body)
            plan.append({"folder": folder, "name": name, "sha256": sha(body), "size": len(body)})
        files = JobFiles("s3", tuple(plan), "data", s3.check_target(self.target))
        job = Job(self.run_id, RUN_GRAPH, files=files,
                  s3_credentials=s3.S3Credentials("static", KEY, SECRET).to_dict())
        return self.backend(files), job

    def _objects(self) -> dict[str, str]:
        """Every object of the run in the bucket, with the sha256 it carries."""
        c = self.moto.client()
        if "codefyui" not in {b["Name"] for b in c.list_buckets()["Buckets"]}:
            return {}  # refuse() took the bucket away
        return {k: c.head_object(Bucket="codefyui", Key=k)["Metadata"].get("sha256", "")
                for k in self.moto.keys(prefix=f"runs/{self.run_id}/")}

    async def holds(self, rel: str, events: list[dict[str, Any]]) -> bytes | None:
        key = s3.output_key("", self.run_id, rel)
        if key not in await asyncio.to_thread(self._objects):
            return None
        obj = await asyncio.to_thread(self.moto.client().get_object, Bucket="codefyui", Key=key)
        return bytes(obj["Body"].read())

    async def serves(self, events: list[dict[str, Any]]) -> set[str]:
        # a row is made from the backend's own artifact event, and the object must carry the same sha256
        recorded = {str(d["key"]): str(d["sha256"]) for k, d in self.recorded
                    if k == "artifact" and d.get("backend") == "s3"}
        objects = await asyncio.to_thread(self._objects)
        return {s for k, s in recorded.items() if objects.get(k) == s}

    async def refuse(self) -> int:
        def drop() -> None:  # no bucket: every write is refused (NoSuchBucket)
            c = self.moto.client()
            for k in self.moto.keys():
                c.delete_object(Bucket="codefyui", Key=k)
            c.delete_bucket(Bucket="codefyui")
        await asyncio.to_thread(drop)
        return 10


@asynccontextmanager
async def far_side(kind: str, tmp: Path, moto: MotoServer | None) -> AsyncIterator[Far]:
    if kind == "own":
        yield OwnFar(tmp)
    elif kind == "mount":
        yield MountFar(tmp)
    elif kind == "s3":
        assert moto is not None
        yield S3Far(tmp, moto)
    else:
        async with Plane(tmp / "cp-ud", tmp / "cp-data", CODEFYUI_MAX_UPLOAD_SIZE=str(UPLOAD_LIMIT)) as plane:
            agent = FakeAgent(plane)
            try:
                await agent.enroll()
                await agent.connect()
                async with aiohttp.ClientSession() as session:
                    yield TransferFar(tmp, plane, agent, session)
            finally:
                await agent.close()


Body = Callable[[Far], Awaitable[None]]
Contract = Callable[[Body], None]


def runner(kind: str, tmp: Path, moto: MotoServer | None = None) -> Contract:
    """Runs a test body against one kind's backend and its real other side, in a fresh event loop."""
    def run(body: Body) -> None:
        async def main() -> None:
            async with far_side(kind, tmp, moto) as far:
                await body(far)
        asyncio.run(main())
    return run


def run_folder(job: Job) -> Path:
    """The run's data folder as its process sees it."""
    assert job.layout is not None
    return Layout.from_json(job.layout).data_dir


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


async def artifact(files: FileBackend, path: Path, kind: str = "output") -> dict[str, Any]:
    """The run records ``path`` (ctx.artifact), and the backend rewrites the event."""
    return await files.on_artifact({"kind": kind, "path": str(path), "name": path.name})


class FileBackendContract:
    """The contract; each subclass below runs it against one kind (huey's storage tests are built so)."""

    kind = ""

    @pytest.fixture
    def contract(self, tmp_path: Path) -> Contract:
        return runner(self.kind, tmp_path)

    def test_inputs_reach_the_run_folder_byte_identical(self, contract: Contract) -> None:
        inputs = {"files/train.csv": b"a,b\n1,2\n", "files/other.csv": os.urandom(3000)}

        async def body(far: Far) -> None:
            files, job = await far.prepare(inputs)
            local = files.job_for_this_machine(job, far.cfg)
            assert local.s3_credentials is None, "the run's process never gets bucket credentials"
            assert await files.fetch_inputs() is True
            folder = run_folder(local)
            for rel, data in inputs.items():
                assert (folder / rel).read_bytes() == data, rel
        contract(body)

    def test_an_output_the_run_writes_reaches_the_far_side_with_its_sha256(
            self, contract: Contract) -> None:
        data = os.urandom(2000)

        async def body(far: Far) -> None:
            files, job = await far.prepare({})
            folder = run_folder(files.job_for_this_machine(job, far.cfg))
            assert await files.fetch_inputs() is True
            files.start()
            out = folder / "output" / "result.bin"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
            events = [await artifact(files, out)]
            await files.finish({"status": "succeeded"}, Handle())
            assert await far.holds("output/result.bin", events) == data
            shas = await far.serves(events)
            if far.kind is None:
                assert shas == set(), "the machine's own installation describes nothing: the file is where it is"
            else:
                assert shas == {sha(data)}
            assert not [d for k, d in far.recorded if k == "run_warning" and d.get("kind") == "transfer_failed"]
        contract(body)

    def test_files_outside_the_run_folder_are_never_the_runs(self, contract: Contract) -> None:
        """An artifact at an absolute path elsewhere, through '..', or through a symlink out of the run's
        folder is neither uploaded nor described; a symlink among the outputs is not followed."""
        secret = os.urandom(500)

        async def body(far: Far) -> None:
            outside = far.tmp / "secret.key"
            outside.write_bytes(secret)
            files, job = await far.prepare({})
            folder = run_folder(files.job_for_this_machine(job, far.cfg))
            files.start()
            (folder / "output").mkdir(parents=True, exist_ok=True)
            link = folder / "output" / "link.key"
            link.symlink_to(outside)
            (folder / "models").mkdir(parents=True, exist_ok=True)
            dotdot = folder / "models" / os.path.relpath(outside, folder / "models")
            assert dotdot.resolve() == outside.resolve()
            events = [await artifact(files, outside), await artifact(files, dotdot), await artifact(files, link)]
            for ev in events:
                assert ev.get("relative_path") is None and ev.get("sha256") is None, ev
            await files.finish({"status": "succeeded"}, Handle())
            assert sha(secret) not in await far.serves(events)
        contract(body)

    def test_the_job_for_this_machine_is_this_machines(self, contract: Contract) -> None:
        async def body(far: Far) -> None:
            files, job = await far.prepare({})
            local = files.job_for_this_machine(job, far.cfg)
            assert local.custom_nodes_dir == str(far.cfg.custom_nodes_dir)
            assert local.plugins_dir == str(far.cfg.plugins_dir)
            assert local.s3_credentials is None
            assert local.run_id == job.run_id and local.graph == job.graph and local.files == job.files
            assert files.kind == job.files.backend
            files.new_credentials(s3.S3Credentials("static", KEY, SECRET).to_dict())  # any kind takes them
        contract(body)


class MovingContract(FileBackendContract):
    """The rest of the contract, for the kinds that move bytes (transfer, S3): the own installation
    and the mount fetch nothing and send nothing, so these promises have nothing to check there."""

    def test_an_input_named_out_of_the_run_folder_is_refused(self, contract: Contract) -> None:
        async def body(far: Far) -> None:
            files, job = await far.prepare({"files/train.csv": b"x,y\n"})
            for hostile in ({"folder": "..", "name": "escape.csv"}, {"folder": "files", "name": "../../escape.csv"},
                            {"folder": str(far.tmp), "name": "escape.csv"}):
                bad = job.files.inputs[0] | hostile
                files = far.backend(JobFiles(job.files.backend, (bad,), job.files.label, job.files.s3))
                files.job_for_this_machine(job, far.cfg)
                with pytest.raises(PathRefused):
                    await files.fetch_inputs()
                assert not list(far.tmp.rglob("escape.csv")), hostile
        contract(body)

    def test_an_input_that_does_not_arrive_whole_leaves_nothing(self, contract: Contract) -> None:
        async def body(far: Far) -> None:
            files, job = await far.prepare({"files/train.csv": b"x,y\n1,2\n"})
            wrong = sha(b"other bytes")
            plan = (job.files.inputs[0] | {"sha256": wrong},)
            files = far.backend(JobFiles(job.files.backend, plan, job.files.label, job.files.s3))
            folder = run_folder(files.job_for_this_machine(job, far.cfg))
            if far.kind == "s3":  # the bucket holds other bytes under that name
                await asyncio.to_thread(far.moto.client().put_object,  # type: ignore[attr-defined]
                                        Bucket="codefyui", Key=s3.input_key("", wrong), Body=b"x,y\n1,2\n")
            with pytest.raises(RuntimeError, match="sha256"):
                await files.fetch_inputs()
            assert files_under(far.cfg.user_data / "agent-cache") == set(), "no partial or unchecked cache entry"
            assert files_under(folder / "files") == set()
        contract(body)

    def test_a_file_the_far_side_refuses_stays_on_the_worker_and_says_so(
            self, contract: Contract) -> None:
        async def body(far: Far) -> None:
            files, job = await far.prepare({})
            folder = run_folder(files.job_for_this_machine(job, far.cfg))
            files.start()
            size = await far.refuse()
            out = folder / "output" / "big.bin"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(os.urandom(size))
            events = [await artifact(files, out)]
            await files.finish({"status": "succeeded"}, Handle())
            left = [d for k, d in far.recorded if k == "artifact" and d.get("backend") == "left_on_worker"]
            assert [(d["path"], d["relative_path"], d["size"]) for d in left] == [(str(out), "output/big.bin", size)]
            warned = [d for k, d in far.recorded if k == "run_warning" and d.get("kind") == "transfer_failed"]
            assert [d["file"] for d in warned] == [str(out)]
            assert out.read_bytes() and await far.holds("output/big.bin", events) is None
        contract(body)

    def test_a_stop_during_the_final_uploads_leaves_the_rest_on_the_worker(
            self, contract: Contract) -> None:
        async def body(far: Far) -> None:
            files, job = await far.prepare({})
            folder = run_folder(files.job_for_this_machine(job, far.cfg))
            files.start()
            (folder / "output").mkdir(parents=True, exist_ok=True)
            for name in ("a.txt", "b.txt"):
                (folder / "output" / name).write_bytes(name.encode())
            await files.finish({"status": "succeeded"}, StopDuringFinish())
            left = sorted(d["relative_path"] for k, d in far.recorded
                          if k == "artifact" and d.get("backend") == "left_on_worker")
            assert left == ["output/a.txt", "output/b.txt"]
            assert [d["count"] for k, d in far.recorded if k == "run_warning" and "count" in d] == [2]
            assert await far.holds("output/a.txt", []) is None
        contract(body)


class TestOwnInstall(FileBackendContract):
    kind = "own"


class TestMount(FileBackendContract):
    kind = "mount"


class TestTransfer(MovingContract):
    kind = "transfer"

    # Larger than the download's read buffer and than what the hashing thread may hold: the network is
    # read while earlier pieces are still being hashed and written.
    LARGE = 24 << 20

    def test_a_large_input_arrives_whole_and_checked(self, contract: Contract) -> None:
        data = os.urandom(self.LARGE)

        async def body(far: Far) -> None:
            files, job = await far.prepare({"files/big.bin": data})
            folder = run_folder(files.job_for_this_machine(job, far.cfg))
            assert await files.fetch_inputs() is True
            assert (folder / "files" / "big.bin").read_bytes() == data
            assert files_under(far.cfg.user_data / "agent-cache") == {far.cfg.user_data / "agent-cache" / sha(data)}
        contract(body)

    def test_a_large_input_whose_bytes_do_not_match_its_name_is_refused_and_leaves_nothing(
            self, contract: Contract) -> None:
        async def body(far: Far) -> None:
            files, job = await far.prepare({"files/big.bin": os.urandom(self.LARGE)})
            plan = (job.files.inputs[0] | {"sha256": sha(b"other bytes")},)
            files = far.backend(JobFiles(job.files.backend, plan, job.files.label, job.files.s3))
            folder = run_folder(files.job_for_this_machine(job, far.cfg))
            with pytest.raises(RuntimeError, match="arrived with sha256"):
                await files.fetch_inputs()
            assert files_under(far.cfg.user_data / "agent-cache") == set(), "no partial or unchecked cache entry"
            assert files_under(folder / "files") == set()
        contract(body)

    def test_an_input_larger_than_announced_is_refused_before_it_is_all_written(self, contract: Contract) -> None:
        """The file grew on the control plane since the run was queued: the agent stops reading at the size
        it was given instead of filling its disk, and keeps nothing."""
        data = os.urandom(self.LARGE)

        async def body(far: Far) -> None:
            files, job = await far.prepare({"files/big.bin": data})
            plan = (job.files.inputs[0] | {"size": 1 << 20},)
            files = far.backend(JobFiles(job.files.backend, plan, job.files.label, job.files.s3))
            folder = run_folder(files.job_for_this_machine(job, far.cfg))
            with pytest.raises(RuntimeError, match="larger than the 1 MiB"):
                await files.fetch_inputs()
            assert files_under(far.cfg.user_data / "agent-cache") == set()
            assert files_under(folder / "files") == set()
        contract(body)

    def test_a_disk_error_in_the_writing_thread_fails_that_try_and_the_next_try_brings_the_file(
            self, contract: Contract, caplog: pytest.LogCaptureFixture) -> None:
        """The first try writes into /dev/full (its temporary name is a link there): the thread's ENOSPC
        reaches the download, which removes its temporary file and tries again."""
        data = os.urandom(3 << 20)

        async def body(far: Far) -> None:
            files, job = await far.prepare({"files/big.bin": data})
            folder = run_folder(files.job_for_this_machine(job, far.cfg))
            cache = far.cfg.user_data / "agent-cache"
            cache.mkdir(parents=True, exist_ok=True)
            temp_name(cache / sha(data)).symlink_to("/dev/full")
            with caplog.at_level(logging.WARNING, logger="cdui.agent.agent"):
                assert await files.fetch_inputs() is True
            assert "No space left on device" in caplog.text
            assert (folder / "files" / "big.bin").read_bytes() == data
            assert files_under(cache) == {cache / sha(data)}, "the temporary file of the failed try is gone"
        contract(body)


@pytest.fixture(scope="class")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """The class's own moto server, stopped by the class: the session's would be ended as this module's leftover."""
    need_moto()
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    yield server
    server.stop()


# moto's S3 server is a process: the e2e tier.
@pytest.mark.e2e
class TestS3(MovingContract):
    kind = "s3"

    @pytest.fixture
    def contract(self, tmp_path: Path, server: MotoServer) -> Contract:
        server.reset()
        server.client().create_bucket(Bucket="codefyui")
        return runner(self.kind, tmp_path, server)
