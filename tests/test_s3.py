"""The S3 backend against moto's standalone S3/STS server (tests/s3server.py), with a real
control plane app on a loopback port and fake agents that speak the real protocol
(tests/inproc/harness.py). The end-to-end acceptance with a real agent process is
tests/test_s3_e2e.py; the pure pieces (keys, policy, settings) are tests/test_s3_policy.py."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cdui.core.clock import FakeClock
from cdui.plane.files.s3_plane import CredentialBroker
from cdui.wire import s3
from procs import REPO_ROOT, load_example
from s3server import MotoServer

sys.path.insert(0, str(Path(__file__).parent / "inproc"))
from harness import FakeAgent, Plane, eventually  # noqa: E402

CSV = (REPO_ROOT / "data" / "samples" / "iris.csv").read_bytes()
CSV_SHA = hashlib.sha256(CSV).hexdigest()
# Every test here talks to moto's S3 server, a separate process started by the fixtures.
pytestmark = pytest.mark.e2e

QUIET = {"CODEFYUI_WORKER_HEARTBEAT_S": "100000"}  # no watchdog verdicts while a test steps the clock


def iris_on_upload() -> dict[str, Any]:
    g = load_example()
    for n in g["nodes"]:
        if n["type"] == "CSVReader":
            n["data"]["params"]["path"] = "train.csv"
    return g


async def upload(plane: Plane, name: str = "train.csv", data: bytes = CSV) -> None:
    assert plane.session is not None
    form = aiohttp.FormData()
    form.add_field("file", data, filename=name)
    async with plane.session.post(plane.url + "/api/files/upload", data=form) as r:
        assert r.status == 201, await r.text()


async def submit(plane: Plane, worker: str = "w1") -> str:
    run = await plane.call("POST", "/api/runs", {"graph": iris_on_upload(), "options": {"target": {"worker": worker}}},
                           expect=201)
    return str(run["id"])


def warnings(events: list[dict[str, Any]], kind: str) -> list[str]:
    return [e["data"]["message"] for e in events if e["kind"] == "run_warning" and e["data"].get("kind") == kind]


async def s3_agent(plane: Plane, name: str = "w1", capabilities: tuple[str, ...] = ("s3",)) -> FakeAgent:
    a = await FakeAgent(plane, name).enroll()
    a.capabilities = list(capabilities)
    await a.connect()
    return a


async def inbox_message(agent: FakeAgent, kind: str, count: int = 1, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Wait until ``count`` messages of type ``kind`` arrived (the server sends them from its own tasks)."""
    def got() -> list[dict[str, Any]]:
        return [m for m in agent.inbox if m.get("type") == kind]
    await eventually(lambda: len(got()) >= count, f"{count} {kind!r} message(s)", timeout, lambda: len(got()))
    return got()


async def send_artifact(agent: FakeAgent, run_id: str, **data: Any) -> None:
    """An artifact event as the agent sends it (``kind`` is the artifact's, not the event's)."""
    await agent.artifact(run_id, **data)


def run(coro: Any) -> None:
    asyncio.run(coro)


# -- backend choice ------------------------------------------------------------------------------
def test_agent_without_boto3_gets_transfer_run_with_storage_fallback(tmp_path: Path, moto: MotoServer) -> None:
    async def main() -> None:
        async with Plane(tmp_path / "ud", tmp_path / "data", **moto.settings()) as plane:
            await upload(plane)
            agent = await s3_agent(plane, capabilities=())
            run_id = await submit(plane)
            job = (await agent.assignment())["job"]
            assert job["files"]["backend"] == "transfer" and "s3" not in job["files"]
            assert job["s3_credentials"] is None
            assert warnings(await plane.events(run_id), "storage_fallback") == [
                "worker w1 does not offer S3 (boto3 is not installed there), so this run's files go through the "
                "control plane (transfer backend); install it with `pip install boto3` in the worker's cdui "
                "environment"]
            assert moto.keys() == [], "nothing was put into the bucket for a transfer run"
            await agent.close()
    run(main())


def test_s3_run_gets_bucket_and_sts_credentials_and_its_input_is_put_once(
        tmp_path: Path, moto: MotoServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cdui.wire.s3")

    async def main() -> None:
        async with Plane(tmp_path / "ud", tmp_path / "data", **moto.settings(CODEFYUI_S3_CREDENTIALS="sts")) as plane:
            await upload(plane)
            agent = await s3_agent(plane)
            ids = []
            for _ in range(2):
                run_id = await submit(plane)
                a = await agent.assignment()
                ids.append(run_id)
                job = a["job"]
                assert job["files"]["backend"] == "s3"
                assert job["files"]["s3"] == {"endpoint_url": moto.url, "region": "us-east-1", "bucket": "codefyui",
                                              "prefix": "", "addressing_style": "path"}
                creds = s3.S3Credentials.from_dict(job["s3_credentials"])
                assert creds.kind == "sts" and creds.session_token and creds.expires_at
                # The worker's credentials read the input from the bucket, byte for byte.
                c = moto.client(key=creds.access_key_id, secret=creds.secret_access_key, token=creds.session_token)
                assert c.get_object(Bucket="codefyui", Key=f"inputs/{CSV_SHA}")["Body"].read() == CSV
                await agent.status(run_id, "succeeded")
            puts = [r.getMessage() for r in caplog.records if "put input" in r.getMessage()]
            assert puts == [f"run {ids[0]}: put input files/train.csv into s3://codefyui/inputs/{CSV_SHA}"]
            assert moto.keys() == [f"inputs/{CSV_SHA}"]
            # An input the bucket lost (a lifecycle rule expired it) is put again by the next run.
            moto.client().delete_object(Bucket="codefyui", Key=f"inputs/{CSV_SHA}")
            third = await submit(plane)
            await agent.assignment()
            assert moto.keys() == [f"inputs/{CSV_SHA}"]
            assert [r.getMessage() for r in caplog.records if "put input" in r.getMessage()][-1].startswith(
                f"run {third}: put input")
            await agent.close()
    run(main())


def test_mounted_worker_comes_first(tmp_path: Path, moto: MotoServer) -> None:
    async def main() -> None:
        async with Plane(tmp_path / "ud", tmp_path / "data", **moto.settings()) as plane:
            await upload(plane)
            unmounted = await s3_agent(plane, "w1")
            mounted = await FakeAgent(plane, "w2").enroll()
            mounted.capabilities = ["s3"]
            await mounted.connect()
            # The control plane's own machine offers its data folder to a worker there: a mounted worker.
            assert plane.app is not None
            from cdui.plane.workers import WORKERS
            conn = plane.app[WORKERS].conns["w2"]
            conn.labels = {"data": str(tmp_path / "data")}
            run_id = (await plane.call("POST", "/api/runs", {"graph": iris_on_upload(), "options": {"target": "any"}},
                                       expect=201))["id"]
            job = (await mounted.assignment())["job"]
            assert job["run_id"] == run_id and job["files"]["backend"] == "mount"
            assert unmounted.assigned.empty()
            await unmounted.close()
            await mounted.close()
    run(main())



@pytest.mark.e2e  # over a second: out of the default tier
def test_s3_replaces_transfer_so_transfer_off_still_sends_runs_to_unmounted_workers(
        tmp_path: Path, moto: MotoServer) -> None:
    """CODEFYUI_TRANSFER_ENABLED=0 turns off the control plane as the file store; the bucket is
    another store, so an unmounted worker offering S3 still gets the run, and one without boto3
    (which could only fall back to the transfer that is off) fails before it is sent."""
    async def main() -> None:
        async with Plane(tmp_path / "ud", tmp_path / "data", CODEFYUI_TRANSFER_ENABLED="0",
                         **moto.settings()) as plane:
            await upload(plane)
            agent = await s3_agent(plane)
            run_id = await submit(plane)
            job = (await agent.assignment())["job"]
            assert (job["run_id"], job["files"]["backend"]) == (run_id, "s3")
            assert moto.keys() == [f"inputs/{CSV_SHA}"]
            await agent.close()

            plain = await s3_agent(plane, "w2", capabilities=())
            other = await submit(plane, "w2")
            r = await plane.wait_status(other, "failed")
            assert (r["status"], r["error"]) == ("failed", (
                "could not start the run on w2: worker w2 does not offer S3 (boto3 is not installed there) and "
                "the transfer backend is off (CODEFYUI_TRANSFER_ENABLED=0), so this run's files have no way to "
                "it; install boto3 with `pip install boto3` in the worker's cdui environment"))
            assert plain.assigned.empty()
            await plain.close()
    run(main())

# -- credentials ----------------------------------------------------------------------------------
def test_sts_credentials_renewed_before_expiry_and_sent_at_once_after_reconnect(
        tmp_path: Path, moto: MotoServer) -> None:
    async def main() -> None:
        clock = FakeClock()
        env = {**moto.settings(CODEFYUI_S3_CREDENTIALS="sts", CODEFYUI_S3_STS_DURATION_S="900"), **QUIET}
        async with Plane(tmp_path / "ud", tmp_path / "data", clock, **env) as plane:
            await upload(plane)
            agent = await s3_agent(plane)
            run_id = await submit(plane)
            first = (await agent.assignment())["job"]["s3_credentials"]
            await agent.status(run_id, "running")
            # 900 s credentials are renewed 300 s before they expire: not yet at 500 s...
            await plane.elapse(500, sleepers=2)
            await plane.elapse(60, sleepers=2)
            assert [m for m in agent.inbox if m.get("type") == "s3_credentials"] == []
            # ...and by 630 s (the renewal loop looks every 30 s).
            await plane.elapse(70, sleepers=2)
            renewed = (await inbox_message(agent, "s3_credentials"))[0]
            assert renewed["run_id"] == run_id
            new = s3.S3Credentials.from_dict(renewed["credentials"])
            assert new.kind == "sts" and new.access_key_id != first["access_key_id"]
            # A reconnecting worker gets fresh credentials at once, without waiting for the renewal.
            await agent.drop()
            await agent.connect(held=[run_id])
            again = await inbox_message(agent, "s3_credentials", count=2)
            assert again[1]["run_id"] == run_id
            assert again[1]["credentials"]["access_key_id"] not in (first["access_key_id"], new.access_key_id)
            await agent.status(run_id, "succeeded")
            await agent.close()
    run(main())


def test_sts_mode_run_without_credentials_fails_before_it_is_sent(
        tmp_path: Path, enforcing: tuple[MotoServer, str, str]) -> None:
    server, key, secret = enforcing

    async def main() -> None:
        env = {**server.settings(CODEFYUI_S3_CREDENTIALS="sts", CODEFYUI_S3_ACCESS_KEY_ID=key,
                                 CODEFYUI_S3_SECRET_ACCESS_KEY=secret)}
        async with Plane(tmp_path / "ud", tmp_path / "data", **env) as plane:
            await upload(plane)
            agent = await s3_agent(plane)
            run_id = await submit(plane)
            done = await plane.wait_status(run_id, "failed")
            assert done["error"].startswith(f"could not start the run on w1: STS gave no temporary credentials for "
                                            f"run {run_id}: ClientError: ")
            assert "(CODEFYUI_S3_CREDENTIALS=sts)" in done["error"]
            assert agent.assigned.empty(), "the run never reached the worker"
            await agent.close()
    run(main())


def test_auto_falls_back_to_static_and_does_not_ask_sts_for_ten_minutes(
        enforcing: tuple[MotoServer, str, str], caplog: pytest.LogCaptureFixture) -> None:
    """A key without sts:AssumeRole (moto enforces IAM policies here): STS refuses, the static
    key is given, and STS is asked again only after 10 minutes or a settings change."""
    server, key, secret = enforcing
    from cdui.core.config import load
    cfg = load(server.settings(CODEFYUI_S3_ACCESS_KEY_ID=key, CODEFYUI_S3_SECRET_ACCESS_KEY=secret))
    settings = s3.S3Settings.from_config(cfg)
    clock = FakeClock()
    broker = CredentialBroker(settings, clock)
    caplog.set_level(logging.WARNING, logger="cdui.wire.s3")

    def refusals() -> int:
        return sum(1 for r in caplog.records if r.getMessage().startswith("STS gave no temporary credentials"))

    first = broker.issue("run1", [CSV_SHA])
    assert (first.kind, first.access_key_id, first.session_token) == ("static", key, None)
    assert refusals() == 1
    msg = [r.getMessage() for r in caplog.records][0]
    assert "AccessDenied" in msg and msg.endswith("workers get the control plane's own key instead "
                                                  "(CODEFYUI_S3_CREDENTIALS=auto), and STS is not asked again for "
                                                  "10 minutes")
    asyncio.run(clock.advance(599))
    assert broker.issue("run2", []).kind == "static"
    assert refusals() == 1, "STS was not asked within the 10 minutes"
    asyncio.run(clock.advance(1))
    assert broker.issue("run3", []).kind == "static"
    assert refusals() == 2, "after 10 minutes STS is asked again"
    # A settings change ends the back-off at once.
    import dataclasses
    broker.settings = dataclasses.replace(settings, duration_s=1800)
    assert broker.issue("run4", []).kind == "static"
    assert refusals() == 3
    # The static key's secret is in no repr.
    assert secret not in repr(first) and secret not in repr(settings)


def test_generated_session_policy_is_what_the_worker_gets(tmp_path: Path, moto: MotoServer) -> None:
    """The policy STS was given for a run allows writes only under runs/<id>/ and reads of its input.

    moto issues credentials for any session policy but does not evaluate session policies when it
    checks requests (its IAM enforcement covers users' and roles' own policies), so the denial is
    checked on the policy document (tests/test_s3_policy.py evaluates it as a table)."""
    broker_settings = s3.S3Settings.from_config(_cfg(tmp_path, moto, CODEFYUI_S3_CREDENTIALS="sts"))
    policy = s3.session_policy("codefyui", broker_settings.prefix, "r1", [CSV_SHA])
    assert policy["Statement"] == [
        {"Sid": "RunWrites", "Effect": "Allow", "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
         "Resource": ["arn:aws:s3:::codefyui/runs/r1/*"]},
        {"Sid": "RunInputs", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": [f"arn:aws:s3:::codefyui/inputs/{CSV_SHA}"]}]
    creds = CredentialBroker(broker_settings, FakeClock()).issue("r1", [CSV_SHA])
    assert creds.kind == "sts"


def _cfg(tmp_path: Path, server: MotoServer, **more: str) -> Any:
    from cdui.core.config import load
    return load({"CODEFYUI_USER_DATA_DIR": str(tmp_path / "ud"), **server.settings(**more)})


# -- rows, downloads, cleanup -------------------------------------------------------------------------
async def _s3_run_with_objects(plane: Plane, agent: FakeAgent, moto: MotoServer,
                               objects: dict[str, bytes]) -> tuple[str, s3.S3Credentials]:
    run_id = await submit(plane)
    job = (await agent.assignment())["job"]
    creds = s3.S3Credentials.from_dict(job["s3_credentials"])
    c = moto.client(key=creds.access_key_id, secret=creds.secret_access_key, token=creds.session_token)
    await agent.status(run_id, "running")
    for rel, body in objects.items():
        key = f"runs/{run_id}/{rel}"
        # with its sha256 in the object's metadata, as the agent puts it (cdui/agent/s3_agent.py)
        c.put_object(Bucket="codefyui", Key=key, Body=body, Metadata={"sha256": hashlib.sha256(body).hexdigest()})
        await send_artifact(agent, run_id, kind=rel.split("/")[0], name=rel.rsplit("/", 1)[-1], backend="s3",
                            bucket="codefyui", key=key, size=len(body), sha256=hashlib.sha256(body).hexdigest())
    return run_id, creds


def test_listing_and_download_proxied_and_presigned(tmp_path: Path, moto: MotoServer) -> None:
    model = b"model bytes \x00\x01" * 1000

    async def main() -> None:
        for mode in ("proxy", "presign"):
            async with Plane(tmp_path / f"ud-{mode}", tmp_path / f"data-{mode}",
                             **moto.settings(CODEFYUI_S3_DOWNLOAD=mode)) as plane:
                await upload(plane)
                agent = await s3_agent(plane)
                run_id, _ = await _s3_run_with_objects(plane, agent, moto, {"output/models/iris/model.pt": model})
                await agent.status(run_id, "succeeded")
                arts = await plane.call("GET", f"/api/runs/{run_id}/artifacts")
                key = f"runs/{run_id}/output/models/iris/model.pt"
                assert [(a["backend"], a["path"], a["relative_path"], a["label"], a["size"]) for a in arts] == [
                    ("s3", f"s3://codefyui/{key}", key, "codefyui", len(model))]
                assert plane.session is not None
                url = f"{plane.url}/api/runs/{run_id}/artifacts/{arts[0]['id']}/download"
                async with plane.session.get(url, allow_redirects=False) as r:
                    if mode == "proxy":
                        assert r.status == 200 and await r.read() == model
                    else:
                        assert r.status == 302
                        location = r.headers["Location"]
                        assert location.startswith(f"{moto.url}/codefyui/{key}?"), location
                        assert "X-Amz-Expires=900" in location, location
                # The presigned URL works without any cdui credential (the browser goes to the bucket).
                if mode == "presign":
                    async with aiohttp.ClientSession() as bare, bare.get(location) as r:
                        assert r.status == 200 and await r.read() == model
                assert not (tmp_path / f"data-{mode}" / "models" / "iris").exists(), "nothing lands in models/"
                await agent.close()
    run(main())


def test_download_serves_only_the_bytes_the_row_names(tmp_path: Path, moto: MotoServer) -> None:
    """An object written again after its run recorded it is never served as the run's: a different
    sha256 in its metadata is refused at once (both modes); an object without that metadata is hashed
    here first and served (proxied, also in presign mode) only when its bytes are the row's."""
    good, other = b"the run's model", b"a later writer!"
    assert len(good) == len(other)  # so only the hash can tell them apart

    async def main() -> None:
        for mode in ("proxy", "presign"):
            async with Plane(tmp_path / f"ud-{mode}", tmp_path / f"data-{mode}",
                             **moto.settings(CODEFYUI_S3_DOWNLOAD=mode)) as plane:
                await upload(plane)
                agent = await s3_agent(plane)
                run_id, _ = await _s3_run_with_objects(plane, agent, moto, {
                    f"output/models/{n}.pt": good for n in ("again", "plain", "changed")})
                await agent.status(run_id, "succeeded")
                c = moto.client()
                base = f"runs/{run_id}/output/models"
                c.put_object(Bucket="codefyui", Key=f"{base}/again.pt", Body=other,
                             Metadata={"sha256": hashlib.sha256(other).hexdigest()})
                c.put_object(Bucket="codefyui", Key=f"{base}/plain.pt", Body=good)
                c.put_object(Bucket="codefyui", Key=f"{base}/changed.pt", Body=other)
                arts = {a["name"]: a for a in await plane.call("GET", f"/api/runs/{run_id}/artifacts")}
                assert plane.session is not None
                for name, status, body in (("again.pt", 410, None), ("plain.pt", 200, good),
                                           ("changed.pt", 410, None)):
                    url = f"{plane.url}/api/runs/{run_id}/artifacts/{arts[name]['id']}/download"
                    async with plane.session.get(url, allow_redirects=False) as r:
                        assert r.status == status, (mode, name, r.status, await r.text())
                        if body is not None:
                            assert await r.read() == body
                        else:
                            err = (await r.json())["error"]
                            assert err["code"] == "replaced" and f"s3://codefyui/{base}/{name}" in err["message"]
                await agent.close()
    run(main())


@pytest.mark.e2e  # over a second: out of the default tier
def test_a_changed_bucket_and_prefix_affect_only_new_runs(tmp_path: Path, moto: MotoServer) -> None:
    """Each row keeps its bucket and its key (with the prefix of its time): after a restart with
    another bucket and prefix, an earlier run's file is still listed, downloaded and removed where it is."""
    model, ckpt = b"old model", b"old checkpoint"
    moto.client().create_bucket(Bucket="newer")

    async def main() -> None:
        async with Plane(tmp_path / "ud", tmp_path / "data", **moto.settings()) as plane:
            await upload(plane)
            agent = await s3_agent(plane)
            old, _ = await _s3_run_with_objects(plane, agent, moto, {"output/models/m.pt": model,
                                                                     "checkpoint/c.pt": ckpt})
            await agent.status(old, "succeeded")
            await agent.close()
        async with Plane(tmp_path / "ud", tmp_path / "data",
                         **moto.settings(bucket="newer", CODEFYUI_S3_PREFIX="cdui/")) as plane:
            arts = await plane.call("GET", f"/api/runs/{old}/artifacts")
            assert sorted((a["path"], a["label"]) for a in arts) == [
                (f"s3://codefyui/runs/{old}/checkpoint/c.pt", "codefyui"),
                (f"s3://codefyui/runs/{old}/output/models/m.pt", "codefyui")]
            m = next(a for a in arts if a["kind"] == "output")
            assert plane.session is not None
            async with plane.session.get(f"{plane.url}/api/runs/{old}/artifacts/{m['id']}/download") as r:
                assert r.status == 200 and await r.read() == model
            agent = await s3_agent(plane, "w2")
            new = await submit(plane, "w2")
            job = (await agent.assignment())["job"]
            assert (job["run_id"], job["files"]["s3"]["bucket"], job["files"]["s3"]["prefix"]) == (
                new, "newer", "cdui/")
            assert moto.keys(bucket="newer") == [f"cdui/inputs/{CSV_SHA}"]
            await agent.status(new, "succeeded")
            assert (await plane.call("DELETE", f"/api/runs/{old}"))["deleted"] == old
            assert moto.keys(prefix=f"runs/{old}/") == [f"runs/{old}/output/models/m.pt"]
            await agent.close()
    run(main())

def test_worker_cannot_name_another_runs_key(tmp_path: Path, moto: MotoServer) -> None:
    async def main() -> None:
        async with Plane(tmp_path / "ud", tmp_path / "data", **moto.settings()) as plane:
            await upload(plane)
            agent = await s3_agent(plane)
            run_id = await submit(plane)
            await agent.assignment()
            await agent.status(run_id, "running")
            for key, bucket in (("runs/other/output/x.pt", "codefyui"), (f"inputs/{CSV_SHA}", "codefyui"),
                                (f"runs/{run_id}/../other/x", "codefyui"), (f"runs/{run_id}/output/x", "elsewhere")):
                await send_artifact(agent, run_id, kind="output", name="x", backend="s3", bucket=bucket, key=key)
            await agent.status(run_id, "succeeded")
            assert await plane.call("GET", f"/api/runs/{run_id}/artifacts") == []
            refused = warnings(await plane.events(run_id), "artifact_refused")
            assert len(refused) == 4, refused
            assert refused[3].endswith("bucket 'elsewhere' is not the run's bucket 'codefyui'")
            await agent.close()
    run(main())


def _uploads(moto: MotoServer, prefix: str) -> list[str]:
    return sorted(u["Key"] for u in moto.client().list_multipart_uploads(Bucket="codefyui", Prefix=prefix)
                  .get("Uploads") or [])


def test_delete_keeps_output_removes_the_rest_and_aborts_unfinished_uploads(tmp_path: Path, moto: MotoServer) -> None:
    async def main() -> None:
        async with Plane(tmp_path / "ud", tmp_path / "data", **moto.settings()) as plane:
            await upload(plane)
            agent = await s3_agent(plane)
            run_id, _ = await _s3_run_with_objects(plane, agent, moto, {
                "checkpoint/epoch_5.pt": b"c", "tensorboard/tb/events.out": b"t", "output/models/iris/model.pt": b"m"})
            moto.client().create_multipart_upload(Bucket="codefyui", Key=f"runs/{run_id}/checkpoint/big.pt")
            await agent.status(run_id, "interrupted")
            answer = await plane.call("DELETE", f"/api/runs/{run_id}")
            assert answer == {"deleted": run_id}
            # A plain delete keeps only output/, even of an interrupted run.
            assert moto.keys(prefix="runs/") == [f"runs/{run_id}/output/models/iris/model.pt"]
            assert _uploads(moto, "runs/") == []
            assert moto.keys(prefix="inputs/") == [f"inputs/{CSV_SHA}"], "inputs are left to the lifecycle rules"
            await agent.close()
    run(main())


def test_retention_keeps_checkpoint_of_an_interrupted_run(tmp_path: Path, moto: MotoServer) -> None:
    async def main() -> None:
        env = {**moto.settings(), "CODEFYUI_RUN_RETENTION_KEEP_LAST": "1"}
        async with Plane(tmp_path / "ud", tmp_path / "data", **env) as plane:
            await upload(plane)
            agent = await s3_agent(plane)
            old, _ = await _s3_run_with_objects(plane, agent, moto, {
                "checkpoint/interrupt.pt": b"c", "tensorboard/events.out": b"t", "output/models/m.pt": b"m"})
            await agent.status(old, "interrupted")
            new = await submit(plane)
            await agent.assignment()
            await agent.status(new, "succeeded")
            async def removed() -> bool:
                return (await plane.api("GET", f"/api/runs/{old}"))[0] == 404
            await eventually(removed, "retention to remove the old run")
            assert moto.keys(prefix=f"runs/{old}/") == [f"runs/{old}/checkpoint/interrupt.pt",
                                                         f"runs/{old}/output/models/m.pt"]
            await agent.close()
    run(main())


def test_unreachable_bucket_at_delete_is_logged_and_objects_stay(tmp_path: Path, moto: MotoServer,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A bucket that cannot be reached at cleanup time: the run row goes, the answer says the objects stay."""
    own = MotoServer(tmp_path / "own-moto.log").start()
    caplog.set_level(logging.WARNING, logger="cdui.wire.s3")

    async def main() -> None:
        try:
            own.client().create_bucket(Bucket="codefyui")
            async with Plane(tmp_path / "ud", tmp_path / "data", **own.settings()) as plane:
                await upload(plane)
                agent = await s3_agent(plane)
                run_id, _ = await _s3_run_with_objects(plane, agent, own, {"checkpoint/a.pt": b"c"})
                await agent.status(run_id, "succeeded")
                own.stop()
                answer = await plane.call("DELETE", f"/api/runs/{run_id}")
                assert answer["deleted"] == run_id
                assert answer["warning"].startswith(f"the bucket could not be reached to remove run {run_id}'s "
                                                    f"objects (")
                assert answer["warning"].endswith(f"they are left under s3://codefyui/runs/{run_id}/")
                assert [r.getMessage() for r in caplog.records if "could not be reached" in r.getMessage()] == [
                    answer["warning"]]
                await agent.close()
        finally:
            own.stop()
    run(main())


def test_credentials_never_in_the_database_or_logs(tmp_path: Path, moto: MotoServer,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)

    async def main() -> None:
        async with Plane(tmp_path / "ud", tmp_path / "data", **moto.settings(CODEFYUI_S3_CREDENTIALS="sts")) as plane:
            await upload(plane)
            agent = await s3_agent(plane)
            run_id = await submit(plane)
            creds = (await agent.assignment())["job"]["s3_credentials"]
            await agent.status(run_id, "succeeded")
            await plane.close()
            secrets = [creds["secret_access_key"], creds["session_token"], "cdui-test-secret"]
            db = b"".join(p.read_bytes() for p in (tmp_path / "ud").glob("cdui.sqlite3*"))
            for secret in secrets:
                assert secret.encode() not in db, secret
                assert [(r.name, r.getMessage()[:200]) for r in caplog.records if secret in r.getMessage()] == []
            await agent.close()
    run(main())


# -- the agent's bucket access ------------------------------------------------------------------------
class _Unreachable(Exception):
    pass


class _Refused(Exception):
    pass


def _agent_files(server: MotoServer, creds: s3.S3Credentials, stop: asyncio.Event, bucket: str = "codefyui",
                 wait_s: float = 30.0) -> Any:
    from cdui.agent.s3_agent import S3RunFiles
    target = {"endpoint_url": server.url, "region": "us-east-1", "bucket": bucket, "prefix": "",
              "addressing_style": "path"}
    return S3RunFiles("r1", target, creds, stop, wait_s, _Unreachable, _Refused)


def test_agent_upload_waits_for_renewed_credentials_only_when_they_expired(
        tmp_path: Path, enforcing: tuple[MotoServer, str, str]) -> None:
    """moto (enforcing IAM here) answers InvalidAccessKeyId to a key it does not know, as MinIO does to
    expired temporary credentials. Expired temporary credentials wait for the renewal; others are refused."""
    server, key, secret = enforcing
    f = tmp_path / "model.pt"
    f.write_bytes(b"weights" * 100)
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    meta = {"group": "output", "relative_path": "models/iris/model.pt"}

    async def main() -> None:
        recorded: list[dict[str, Any]] = []
        expired = s3.S3Credentials("sts", "ASIAEXPIRED", "old", "old-token", expires_at=1.0)
        files = _agent_files(server, expired, asyncio.Event())
        up = asyncio.ensure_future(files.upload(f, meta, sha, lambda k, d: recorded.append(d)))
        # The bucket's answer came and the upload waits.
        await eventually(lambda: files._call_waiting or up.done(), "the upload to wait for new credentials", 60)
        assert not up.done(), f"the upload waits for new credentials: {up}"
        files.new_credentials(s3.S3Credentials("static", key, secret).to_dict())
        await asyncio.wait_for(up, 60)
        assert recorded == [{"kind": "output", "name": "model.pt", "backend": "s3", "bucket": "codefyui",
                             "key": "runs/r1/output/models/iris/model.pt", "size": 700, "sha256": sha}]
        got = server.client(key=key, secret=secret).get_object(Bucket="codefyui", Key=recorded[0]["key"])
        assert got["Body"].read() == f.read_bytes()
        # Temporary credentials that are not yet expired, answered the same way, are wrong: refused at once.
        wrong = _agent_files(server, s3.S3Credentials("sts", "ASIAWRONG", "x", "y", expires_at=4e9), asyncio.Event())
        with pytest.raises(_Refused, match="InvalidAccessKeyId"):
            await wrong.upload(f, meta, sha, lambda k, d: None)
        # A bucket that does not exist: refused (the file stays on the worker with transfer_failed).
        missing = _agent_files(server, s3.S3Credentials("static", key, secret), asyncio.Event(), bucket="nope")
        with pytest.raises(_Refused, match="NoSuchBucket"):
            await missing.upload(f, meta, sha, lambda k, d: None)
    run(main())


def test_agent_download_checks_the_content_hash(tmp_path: Path, moto: MotoServer) -> None:
    async def main() -> None:
        moto.client().put_object(Bucket="codefyui", Key=f"inputs/{CSV_SHA}", Body=CSV)
        moto.client().put_object(Bucket="codefyui", Key=f"inputs/{'0' * 64}", Body=b"not what the name says")
        files = _agent_files(moto, s3.S3Credentials("static", "k", "s"), asyncio.Event())
        await files.download_input(CSV_SHA, tmp_path / CSV_SHA)
        assert (tmp_path / CSV_SHA).read_bytes() == CSV
        with pytest.raises(RuntimeError, match="it is not the input the run was queued with"):
            await files.download_input("0" * 64, tmp_path / ("0" * 64))
        assert sorted(p.name for p in tmp_path.iterdir()) == [CSV_SHA], "nothing half-written is left"
    run(main())


def test_agent_uploads_a_large_file_in_parts(tmp_path: Path, moto: MotoServer) -> None:
    big = tmp_path / "big.pt"
    big.write_bytes(bytes(range(256)) * (s3.MULTIPART_THRESHOLD // 256 + 4096))  # just over 8 MiB: two parts
    sha = hashlib.sha256(big.read_bytes()).hexdigest()

    async def main() -> None:
        files = _agent_files(moto, s3.S3Credentials("static", "k", "s"), asyncio.Event())
        await files.upload(big, {"group": "artifact", "kind": "checkpoint", "name": "big.pt"}, sha, lambda k, d: None)
    run(main())
    head = moto.client().head_object(Bucket="codefyui", Key="runs/r1/checkpoint/big.pt")
    assert head["ContentLength"] == big.stat().st_size
    assert head["ETag"].strip('"').endswith("-2"), head["ETag"]  # S3's mark of an object put in 2 parts
    assert head["Metadata"] == {"sha256": sha}
