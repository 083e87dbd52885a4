"""The S3 backend end to end: a real control plane process and a real agent process without a
mount, a real torch run, moto's standalone S3/STS server on loopback (tests/s3server.py)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from procs import ServerProc, wait_for, wait_run
from s3server import MotoServer, start_enforcing
from test_files_on_workers import (
    Agent,
    install_nodes,
    iris_on_upload,
    start_agent,
    upload_train,
    warnings,
    writer_graph,
)

pytestmark = pytest.mark.e2e


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def start_s3_server(tmp: Path, moto: MotoServer, **env: str) -> ServerProc:
    s = ServerProc(tmp, extra_env={"CODEFYUI_WORKER_HEARTBEAT_S": "1", **moto.settings(), **env})
    install_nodes(s.data_dir)
    return s.start()


def test_acceptance_s3_run_reads_uploaded_csv_and_its_model_is_in_the_bucket(tmp_path: Path, moto: MotoServer) -> None:
    """CODEFYUI_S3_ENABLED=1 against a local S3 server: a run on a worker without a mount reads an
    uploaded CSV and saves a model; the model object is at runs/<run id>/output/models/...; the
    control plane's own models folder is untouched; the API download is byte-identical."""
    cp = start_s3_server(tmp_path, moto)
    try:
        assert (f"S3 artifact backend on: bucket codefyui at {moto.url} (credentials: auto)") in cp.log_text()
        csv = upload_train(cp)
        a = start_agent(cp, tmp_path)
        try:
            # The agent logs it once the welcome came, which may be just after the server lists it online.
            wait_for(lambda: "(capabilities: s3)" in a.log_text(), 60, 0.1, "the agent's connected line",
                     detail=a.log_tail)
            run = cp.submit(iris_on_upload(checkpoint_every=5), {"target": {"worker": "w2"}})
            done = wait_run(cp, run["id"])
            assert done["status"] == "succeeded", done
            assert done["execution_facts"]["storage"] == {"backend": "s3", "bucket": "codefyui", "prefix": ""}
            assert warnings(cp, run["id"], "transfer_progress") == [
                "fetching inputs 1/1: train.csv (3.77 KiB, fetched)"]
            assert warnings(cp, run["id"], "storage_fallback") == []
            key = f"runs/{run['id']}/output/models/iris/model.pt"
            assert key in moto.keys(), moto.keys()
            assert moto.keys(prefix="inputs/") == [f"inputs/{sha(csv)}"]
            in_bucket = moto.client().get_object(Bucket="codefyui", Key=key)["Body"].read()
            worker_copy = (a.user_data / "agent-runs" / run["id"] / "data" / "models" / "iris"
                           / "model.pt").read_bytes()
            assert in_bucket == worker_copy
            assert not (cp.data_dir / "models" / "iris").exists(), "the control plane's models folder is untouched"
            arts = cp.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
            model = [x for x in arts if x["relative_path"] == key]
            assert model and model[0]["backend"] == "s3" and model[0]["path"] == f"s3://codefyui/{key}", arts
            assert model[0]["sha256"] == sha(worker_copy)
            body = cp.raw("GET", f"/api/runs/{run['id']}/artifacts/{model[0]['id']}/download").body
            assert body == worker_copy
            ckpts = [x for x in arts if x["kind"] == "checkpoint"]
            assert ckpts and all(x["relative_path"].startswith(f"runs/{run['id']}/checkpoint/") for x in ckpts), arts
            # The credentials stayed in the agent's memory: not in its files, not in its log.
            creds_seen = [line for line in a.log_text().splitlines() if "secret" in line.lower()]
            assert creds_seen == [], creds_seen
        finally:
            a.stop()
    finally:
        cp.stop()


def test_agent_without_boto3_gets_transfer_runs_with_storage_fallback(tmp_path: Path, moto: MotoServer) -> None:
    """boto3 hidden from the agent's interpreter: it offers no S3, says so, and its run goes through transfer."""
    hide = tmp_path / "no-boto3" / "boto3"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('boto3 is hidden from this agent by the test')\n")
    cp = start_s3_server(tmp_path, moto)
    try:
        upload_train(cp)
        tok = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
        a = Agent(tmp_path, cp.url, tok)
        a.env["PYTHONPATH"] = str(hide.parent)
        a.spawn()
        try:
            def online() -> bool:
                assert a.alive, a.log_tail()
                return any(w["name"] == "w2" and w["online"] for w in cp.call("GET", "/api/workers")["workers"])
            wait_for(online, 120, 0.2, "w2 online", detail=a.log_tail)
            wait_for(lambda: "(capabilities: none)" in a.log_text(), 60, 0.1, "the agent's connected line",
                     detail=a.log_tail)
            run = cp.submit(iris_on_upload(), {"target": {"worker": "w2"}})
            done = wait_run(cp, run["id"])
            assert done["status"] == "succeeded", done
            assert len(warnings(cp, run["id"], "storage_fallback")) == 1
            arts = cp.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
            assert {x["backend"] for x in arts} == {"transfer"}, arts
            assert (cp.data_dir / "models" / "iris" / "model.pt").is_file()
            assert moto.keys(prefix="runs/") == []
        finally:
            a.stop()
    finally:
        cp.stop()



# The control plane's key may do anything in the bucket except write the runs' files.
NO_RUN_WRITES = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
    {"Effect": "Deny", "Action": "s3:PutObject", "Resource": "arn:aws:s3:::codefyui/runs/*"}]}


def test_a_file_the_bucket_refuses_stays_on_the_worker_with_transfer_failed(tmp_path: Path) -> None:
    """AccessDenied is no reason to retry: the worker keeps the file, the run says so, and the
    listing shows where the file stayed (the worker's own path, never served here)."""
    moto, key, secret = start_enforcing(tmp_path, NO_RUN_WRITES)
    try:
        cp = start_s3_server(tmp_path, moto, CODEFYUI_S3_CREDENTIALS="static", CODEFYUI_S3_ACCESS_KEY_ID=key,
                             CODEFYUI_S3_SECRET_ACCESS_KEY=secret)
        try:
            a = start_agent(cp, tmp_path)
            try:
                run = cp.submit(writer_graph(text="refused"), {"target": {"worker": "w2"}})
                done = wait_run(cp, run["id"])
                assert done["status"] == "succeeded", done
                assert done["execution_facts"]["storage"]["backend"] == "s3"
                failed = warnings(cp, run["id"], "transfer_failed")
                assert len(failed) == 1 and "AccessDenied" in failed[0] and "stays on the worker" in failed[0], \
                    failed
                arts = cp.call("GET", f"/api/runs/{run['id']}/artifacts", expect=200)
                left = [(x["name"], x["backend"]) for x in arts if x["name"] == "fixed.txt"]
                assert left == [("fixed.txt", "left_on_worker")], arts
                listed = moto.client(key=key, secret=secret).list_objects_v2(Bucket="codefyui", Prefix="runs/")
                assert listed.get("Contents", []) == []
                assert not (cp.data_dir / "output" / "fixed.txt").exists()
            finally:
                a.stop()
        finally:
            cp.stop()
    finally:
        moto.stop()
