"""moto's standalone S3/STS server on a loopback port, for the S3 backend's tests.

A real HTTP server in its own process (``python -m moto.server``): boto3 on
the control plane and on the agent talk to it exactly as to MinIO. The
fixtures skip when moto is not installed (the ``test`` extra has it; with
``CDUI_TEST_REQUIRE_ALL=1`` the skip is a failure).

What moto enforces, checked by tests/test_s3.py: without
``INITIAL_NO_AUTH_ACTION_COUNT`` it accepts any credentials. With it (the
``enforcing`` server), requests are checked against IAM users' policies, so
a key without ``sts:AssumeRole`` is refused by STS.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import procs
from procs import free_port

KEY, SECRET = "cdui-test-key", "cdui-test-secret"


class MotoServer:
    def __init__(self, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, attempt: int = 0) -> MotoServer:
        env = {**os.environ, **self.env, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                          "-p", str(self.port)], stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                log = self.log_path.read_text()[-2000:]
                if "already in use" in log and attempt < 4:
                    # free_port's port was free when picked, but another test's process (another xdist
                    # worker) bound it first: pick another.
                    self.port = free_port()
                    self.url = f"http://127.0.0.1:{self.port}"
                    return self.start(attempt + 1)
                raise RuntimeError(f"moto_server exited {self.proc.returncode}: {log}")
            if self._answers():
                return self
            if time.monotonic() > deadline:
                raise RuntimeError("moto_server did not answer within 60 s") from None
            time.sleep(0.1)

    def _answers(self) -> bool:
        """moto itself answers on the port: its own API's answer, which no other process that might
        hold the same port (a cdui server of another test) gives."""
        try:
            with urllib.request.urlopen(self.url + "/moto-api/data.json", timeout=2) as resp:
                return resp.status == 200 and isinstance(json.loads(resp.read()), dict)
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def reset(self) -> None:
        """Forget every bucket, object and user (moto's own API), so tests do not see each other's."""
        req = urllib.request.Request(self.url + "/moto-api/reset", method="POST", data=b"")
        urllib.request.urlopen(req, timeout=30).read()

    def client(self, service: str = "s3", key: str = KEY, secret: str = SECRET, token: str | None = None) -> Any:
        from cdui.wire import s3
        return s3.client({"endpoint_url": self.url, "region": "us-east-1", "addressing_style": "path"},
                         key, secret, token, service=service)

    def settings(self, bucket: str = "codefyui", **more: str) -> dict[str, str]:
        """The control plane's environment for this server."""
        return {"CODEFYUI_S3_ENABLED": "1", "CODEFYUI_S3_ENDPOINT_URL": self.url, "CODEFYUI_S3_BUCKET": bucket,
                "CODEFYUI_S3_ADDRESSING_STYLE": "path", "CODEFYUI_S3_ACCESS_KEY_ID": KEY,
                "CODEFYUI_S3_SECRET_ACCESS_KEY": SECRET, **more}

    def keys(self, bucket: str = "codefyui", prefix: str = "") -> list[str]:
        out: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents") or []]
        return sorted(out)


def _need_moto() -> None:
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"moto's server and boto3 are needed (the test extra: pip install -e '.[test]'): {exc}")


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    _need_moto()
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log").start()
    assert server.proc is not None
    procs.KEEP.add(server.proc.pid)  # the session's: never a test's or module's leftover
    yield server
    procs.KEEP.discard(server.proc.pid)
    server.stop()


@pytest.fixture
def moto(moto_server: MotoServer) -> MotoServer:
    """The shared server, emptied, with the bucket ``codefyui``."""
    assert moto_server.proc is not None and moto_server.proc.poll() is None, (
        f"the session's moto server has exited ({moto_server.proc and moto_server.proc.returncode}); "
        f"its log: {moto_server.log_path.read_text()[-2000:]}")
    moto_server.reset()
    moto_server.client().create_bucket(Bucket="codefyui")
    return moto_server


# Actions the enforcing server lets through without checks: the set-up below, then none.
SETUP_ACTIONS = 4
S3_ONLY = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}


def start_enforcing(tmp_path: Path, policy: dict[str, Any] = S3_ONLY) -> tuple[MotoServer, str, str]:
    """A moto server that checks IAM policies, with the bucket ``codefyui`` and a user whose only
    policy is ``policy``. Returns (server, the user's key id, its secret); the caller stops it."""
    _need_moto()
    server = MotoServer(tmp_path / "moto-enforcing.log",
                        {"INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_ACTIONS)}).start()
    try:
        server.client().create_bucket(Bucket="codefyui")
        iam = server.client("iam")
        iam.create_user(UserName="cdui")
        iam.put_user_policy(UserName="cdui", PolicyName="cdui", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="cdui")["AccessKey"]
    except BaseException:
        server.stop()
        raise
    return server, key["AccessKeyId"], key["SecretAccessKey"]


@pytest.fixture
def enforcing(tmp_path: Path) -> Iterator[tuple[MotoServer, str, str]]:
    """A moto server that checks IAM policies, with a bucket and a user allowed ``s3:*`` only
    (no ``sts:AssumeRole``). Yields (server, the user's key id, its secret)."""
    server, key, secret = start_enforcing(tmp_path)
    try:
        yield server, key, secret
    finally:
        server.stop()
