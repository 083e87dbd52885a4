"""The S3 backend on a worker: one run's bucket access (docs/s3.md).

:class:`S3Files` is the file backend of a run whose job says
``files.backend: "s3"``: inputs come from ``inputs/<sha256>`` into the same
``agent-cache`` as the transfer backend's, and uploads go to
``runs/<run id>/...`` (in parts from :data:`cdui.wire.s3.MULTIPART_THRESHOLD`;
boto3 aborts the parts of an upload that fails). The order of the uploads,
the retry budget through outages and what stays on the worker are
:class:`cdui.agent.transfer_agent.TransferFiles`' own: S3Files only moves the
bytes through :class:`S3RunFiles`, the run's bucket access.

Credentials live in this object only (memory): never logged, never written,
and never in the job the run subprocess reads. Errors are told apart:

- the bucket unreachable: :class:`Unreachable` (retried like a control plane outage);
- ``InvalidAccessKeyId``/``ExpiredToken`` with temporary credentials at or past
  their expiry: wait for the renewal the control plane sends, then retry
  (other credentials answering so are wrong, not old: refused);
- anything else the bucket answers (``AccessDenied``, no such bucket): :class:`Refused`,
  the file stays on the worker with ``transfer_failed``.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdui.agent.agent_files import Refused, Unreachable
from cdui.agent.transfer_agent import TransferFiles, retry_delays
from cdui.core.config import Config
from cdui.core.layout import Layout
from cdui.wire import s3
from cdui.wire.job import Job

log = logging.getLogger("cdui.agent.agent")


class S3RunFiles:
    def __init__(self, run_id: str, target: dict[str, Any], credentials: s3.S3Credentials,
                 stop_event: asyncio.Event, wait_s: float,
                 unreachable: type[Exception], refused: type[Exception]) -> None:
        self.run_id = run_id
        self.target = target
        self.bucket = str(target["bucket"])
        self.prefix = str(target.get("prefix") or "")
        self._creds = credentials
        self._client: Any = None
        self._changed = asyncio.Event()
        self._call_waiting = False  # an upload or download waits for renewed credentials (tests look)
        self.stop_event = stop_event
        self.wait_s = wait_s  # how long an upload waits for renewed credentials before the file stays here
        self.Unreachable = unreachable
        self.Refused = refused

    def new_credentials(self, raw: dict[str, Any]) -> None:
        creds = s3.S3Credentials.from_dict(raw)
        self._creds = creds
        self._client = None
        self._changed.set()
        until = time.strftime("%H:%M:%S", time.localtime(creds.expires_at)) if creds.expires_at else "no expiry"
        log.info("run %s: new S3 credentials (%s, until %s)", self.run_id, creds.kind, until)

    def _c(self) -> Any:
        if self._client is None:
            c = self._creds
            self._client = s3.client(self.target, c.access_key_id, c.secret_access_key, c.session_token)
        return self._client

    async def _call(self, what: str, fn: Callable[[Any], Any]) -> Any:
        while True:
            creds = self._creds
            self._changed.clear()
            try:
                return await asyncio.to_thread(fn, self._c())
            except Exception as exc:
                code = s3.error_code(exc)
                if code in s3.EXPIRED_CODES and creds.expired(time.time()):
                    if self._creds is not creds:
                        continue  # new ones arrived while this call was out
                    log.warning("run %s: %s: the S3 credentials expired (%s); waiting for new ones from the "
                                "control plane", self.run_id, what, code)
                    if not await self._wait_for_new():
                        raise self.Refused(f"the S3 credentials expired and no new ones came within "
                                           f"{self.wait_s:.0f} s") from None
                    continue
                if s3.is_connection_error(exc):
                    raise self.Unreachable(f"the bucket is unreachable: {exc}") from None
                raise self.Refused(f"the bucket refused {what}: {code or type(exc).__name__}: {exc}") from None

    async def _wait_for_new(self) -> bool:
        changed = asyncio.ensure_future(self._changed.wait())
        stopped = asyncio.ensure_future(self.stop_event.wait())
        self._call_waiting = True
        try:
            await asyncio.wait({changed, stopped}, timeout=self.wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._call_waiting = False
            changed.cancel()
            stopped.cancel()
        return self._changed.is_set()

    # -- inputs ------------------------------------------------------------------------------
    async def download_input(self, sha: str, dest: Path) -> None:
        """``inputs/<sha>`` into ``dest`` (the agent cache), checked against its name's hash."""
        key = s3.input_key(self.prefix, sha)
        tmp = dest.with_name(dest.name + f".part-{os.getpid()}")

        def fetch(c: Any) -> str:
            h = hashlib.sha256()
            body = c.get_object(Bucket=self.bucket, Key=key)["Body"]
            try:
                with open(tmp, "wb") as fh:
                    while chunk := body.read(1 << 20):
                        h.update(chunk)
                        fh.write(chunk)
            finally:
                body.close()
            return h.hexdigest()
        try:
            got = await self._call(f"reading s3://{self.bucket}/{key}", fetch)
            if got != sha:
                raise RuntimeError(f"s3://{self.bucket}/{key} arrived with sha256 {got}: it is not the input "
                                   f"the run was queued with")
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    # -- uploads -------------------------------------------------------------------------------
    def key_for(self, meta: dict[str, Any]) -> str:
        if meta.get("group") == "output":
            return s3.output_key(self.prefix, self.run_id, str(meta["relative_path"]))
        return s3.artifact_key(self.prefix, self.run_id, str(meta.get("kind") or "output"), str(meta["name"]))

    async def upload(self, path: Path, meta: dict[str, Any], sha: str,
                     record: Callable[[str, dict[str, Any]], None]) -> None:
        from boto3.s3.transfer import TransferConfig
        key = self.key_for(meta)
        size = (await asyncio.to_thread(path.stat)).st_size
        config = TransferConfig(multipart_threshold=s3.MULTIPART_THRESHOLD, multipart_chunksize=s3.MULTIPART_THRESHOLD)
        await self._call(f"writing s3://{self.bucket}/{key}",
                         lambda c: c.upload_file(str(path), self.bucket, key, Config=config,
                                                 ExtraArgs={"Metadata": {"sha256": sha}}))
        record("artifact", {"kind": "output" if meta.get("group") == "output" else meta.get("kind", "output"),
                            "name": path.name, "backend": "s3", "bucket": self.bucket, "key": key,
                            "size": size, "sha256": sha})


class S3Files(TransferFiles):
    """The transfer backend's order, retries and leftovers, with the bytes in a bucket."""

    kind = "s3"
    # the artifact event says the file is queued; the row comes with its own event once the object is in the bucket
    QUEUED = {"upload": "queued"}

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.s3: S3RunFiles | None = None  # the run's bucket access, with its credentials (from the job)

    def _layout(self, job: Job, cfg: Config) -> Layout:
        layout = super()._layout(job, cfg)
        if job.files.s3 is None or job.s3_credentials is None:
            raise RuntimeError("the control plane sent an s3 run without its bucket or credentials")
        self.s3 = S3RunFiles(self.run_id, job.files.s3, s3.S3Credentials.from_dict(job.s3_credentials),
                             self.stop_event, max(self.grace_s, 60.0), Unreachable, Refused)
        return layout

    def new_credentials(self, raw: dict[str, Any]) -> None:
        """Fresh bucket credentials from the control plane (renewal, reconnect)."""
        if self.s3 is not None:
            self.s3.new_credentials(raw)

    async def _fetch(self, folder: str, name: str, sha: str, dest: Path, size: int | None = None,
                     what: str = "") -> bool:
        """From the bucket, with the same retries through outages as the transfer backend's (``size`` is not
        used: the object is named by its sha256 and checked against it; nor is ``what``: boto3's download
        gives no in-flight lines, so a bucket input is said once it is there)."""
        assert self.s3 is not None
        delays = retry_delays()
        deadline = time.monotonic() + self.grace_s
        while True:
            try:
                await self.s3.download_input(sha, dest)
                return True
            except Unreachable as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not download input {sha[:12]} from the bucket: {exc}") from None
                log.warning("run %s: downloading input %s failed (%s); retrying", self.run_id, sha[:12], exc)
                await asyncio.sleep(next(delays))
            except Refused as exc:
                raise RuntimeError(str(exc)) from None

    async def _upload(self, path: Path, meta: dict[str, Any]) -> None:
        assert self.s3 is not None
        await self.s3.upload(path, meta, await self._sha(path), self.record)
