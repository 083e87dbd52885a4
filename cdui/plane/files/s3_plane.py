"""The S3 backend on the control plane (docs/s3.md).

:func:`setup` wires it into the app when ``CODEFYUI_S3_ENABLED=1`` (and logs
``S3 artifact backend on: ...`` or why it is off, in every case). The
:class:`S3Backend` then:

- **chooses the backend** of a run placed on an unmounted worker
  (:meth:`S3Backend.prepare`, called by the run service just before the run
  is sent): S3 when the worker offers it, else the transfer backend with a
  ``storage_fallback`` warning. Mounted workers were preferred already by
  placement;
- **puts each input once**, at ``inputs/<sha256>``, after checking the bucket
  (an input removed by a lifecycle rule is put again);
- **issues the run's credentials** (:class:`CredentialBroker`) and renews
  temporary ones before they expire while the run lives; a worker that
  reconnects gets fresh ones at once (its old ones may come from a previous
  control-plane process);
- turns a worker's ``artifact`` event with ``backend: "s3"`` into a row,
  only for a key under that run's own ``runs/<run id>/``;
- serves downloads (proxied, or a redirect to a presigned URL) and removes a
  run's objects at retention and delete.

Every bucket call is blocking boto3, run in a thread. The control plane's
own key is read from the environment once and never stored or logged.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import tempfile
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from cdui.core.clock import Clock
from cdui.core.errors import CduiError
from cdui.plane.appkeys import CLOCK, CONFIG
from cdui.plane.runs import RUNS
from cdui.plane.store import ACTIVE, Run
from cdui.plane.workers import WORKERS
from cdui.wire import protocol, s3
from cdui.wire.job import Job

log = logging.getLogger("cdui.wire.s3")
RENEW_TICK_S = 30.0  # how often the renewal loop looks at live runs' credentials
# Placeholder role for endpoints that ignore RoleArn (MinIO); AWS needs CODEFYUI_S3_STS_ROLE_ARN.
PLACEHOLDER_ROLE = "arn:aws:iam::000000000000:role/codefyui"
STORAGE_FACT = "storage"  # execution_facts key: {"backend": "s3", "bucket", "prefix"} of an s3 run
DELETE_BATCH = 1000  # S3's limit on keys per DeleteObjects call


class CredentialError(RuntimeError):
    """No credentials could be had for a run (it fails before it is sent)."""


class CredentialBroker:
    """What a worker gets for one run: ``sts``, ``static`` or ``auto`` (STS, else the static key and
    no STS attempt for :data:`cdui.wire.s3.STS_BACKOFF_S`, or until the S3 settings change)."""

    def __init__(self, settings: s3.S3Settings, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self._sts_off_until: float | None = None
        self._sts_off_for: str | None = None  # the settings' fingerprint when STS refused

    def sts_backed_off(self) -> bool:
        return (self._sts_off_until is not None and self._sts_off_for == self.settings.fingerprint()
                and self.clock.monotonic() < self._sts_off_until)

    def issue(self, run_id: str, input_shas: list[str]) -> s3.S3Credentials:
        """Blocking (STS is an HTTP call): run it in a thread."""
        mode = self.settings.credentials
        if mode == "static" or (mode == "auto" and self.sts_backed_off()):
            return self._static()
        try:
            return self._sts(run_id, input_shas)
        except Exception as exc:  # botocore's errors, or our own policy limit: STS did not give credentials
            why = f"{type(exc).__name__}: {exc}"
            if mode == "sts":
                raise CredentialError(f"STS gave no temporary credentials for run {run_id}: {why} "
                                      f"(CODEFYUI_S3_CREDENTIALS=sts)") from None
            self._sts_off_until = self.clock.monotonic() + s3.STS_BACKOFF_S
            self._sts_off_for = self.settings.fingerprint()
            log.warning("STS gave no temporary credentials (%s); workers get the control plane's own key "
                        "instead (CODEFYUI_S3_CREDENTIALS=auto), and STS is not asked again for %d minutes",
                        why, int(s3.STS_BACKOFF_S // 60))
            return self._static()

    def _static(self) -> s3.S3Credentials:
        s = self.settings
        if not s.access_key_id or not s.secret_access_key:
            raise CredentialError("no key to give the worker: set CODEFYUI_S3_ACCESS_KEY_ID and "
                                  "CODEFYUI_S3_SECRET_ACCESS_KEY on the control plane")
        return s3.S3Credentials("static", s.access_key_id, s.secret_access_key)

    def _sts(self, run_id: str, input_shas: list[str]) -> s3.S3Credentials:
        s = self.settings
        assert s.bucket is not None
        packed = s3.packed_policy(s3.session_policy(s.bucket, s.prefix, run_id, input_shas))
        if len(packed) > s3.MAX_POLICY_BYTES:
            raise ValueError(f"the run's session policy is {len(packed)} bytes, over STS's limit of "
                             f"{s3.MAX_POLICY_BYTES} (too many inputs)")
        sts = s3.client(s.target(), s.access_key_id, s.secret_access_key, service="sts")
        resp = sts.assume_role(RoleArn=s.role_arn or PLACEHOLDER_ROLE, RoleSessionName=f"cdui-run-{run_id}"[:64],
                               Policy=packed, DurationSeconds=s.duration_s)
        c = resp["Credentials"]
        exp = c.get("Expiration")
        return s3.S3Credentials("sts", c["AccessKeyId"], c["SecretAccessKey"], c.get("SessionToken"),
                                exp.timestamp() if exp is not None else None)


def _inputs_shas(run: Run) -> list[str]:
    files = (run.options or {}).get("files") or {}
    return [str(i["sha256"]) for i in files.get("inputs") or [] if isinstance(i, dict) and i.get("sha256")]


class S3Backend:
    """The bucket as the file store of runs on unmounted workers (one per app, when enabled)."""

    def __init__(self, app: web.Application, settings: s3.S3Settings) -> None:
        self.app = app
        self.settings = settings
        self.clock: Clock = app[CLOCK]
        self.broker = CredentialBroker(settings, self.clock)
        self.issued: dict[str, float] = {}  # s3 run id -> clock time its temporary credentials were issued
        self._own: Any = None

    # -- the control plane's own client (its key, memory only) -------------------------------
    def own(self) -> Any:
        if self._own is None:
            s = self.settings
            self._own = s3.client(s.target(), s.access_key_id, s.secret_access_key)
        return self._own

    def renew_after(self) -> float:
        d = float(self.settings.duration_s)
        return d - min(300.0, d / 3)

    # -- choosing the backend and sending the run ----------------------------------------------
    async def prepare(self, run: Run, job: Job, executor: Any) -> Job:
        """The job as it goes to ``executor``: an unmounted worker's transfer run becomes an s3 run when the
        worker offers S3. Raises (the run then fails before it is sent) when the bucket or the credentials
        cannot be had."""
        if job.files.backend != "transfer":
            return job
        caps = executor.capabilities() if hasattr(executor, "capabilities") else []
        if s3.CAPABILITY not in caps:
            if not self.app[CONFIG]["CODEFYUI_TRANSFER_ENABLED"]:
                # The fallback would be the transfer backend, which the operator turned off.
                raise CduiError("s3_not_offered", (
                    f"worker {executor.name} does not offer S3 (boto3 is not installed there) and the transfer "
                    f"backend is off (CODEFYUI_TRANSFER_ENABLED=0), so this run's files have no way to it; "
                    f"install boto3 with `pip install boto3` in the worker's cdui environment"))
            await self.app[RUNS].record_cp(run.id, "run_warning", {
                "kind": "storage_fallback",
                "message": f"worker {executor.name} does not offer S3 (boto3 is not installed there), so this "
                           f"run's files go through the control plane (transfer backend); install it with "
                           f"`pip install boto3` in the worker's cdui environment"})
            return job
        await asyncio.to_thread(self._put_inputs, run.id, list(job.files.inputs))
        creds = await self._issue(run)
        s = self.settings
        facts = dict(run.execution_facts or {})
        facts[STORAGE_FACT] = {"backend": "s3", "bucket": s.bucket, "prefix": s.prefix}
        await self.app[RUNS].store.set_execution_facts(run.id, facts)
        return replace(job, files=replace(job.files, backend="s3", s3=s.target()), s3_credentials=creds.to_dict())

    async def _issue(self, run: Run) -> s3.S3Credentials:
        creds = await asyncio.to_thread(self.broker.issue, run.id, _inputs_shas(run))
        if creds.kind == "sts":
            self.issued[run.id] = self.clock.monotonic()
        else:
            self.issued.pop(run.id, None)  # the static key does not expire
        return creds

    def _put_inputs(self, run_id: str, inputs: list[dict[str, Any]]) -> None:
        """Each input once at ``inputs/<sha256>``: the bucket is asked, not our memory (a lifecycle
        rule may have expired it). What is put is hashed first, so a changed file is never put under
        the old content's name."""
        from botocore.exceptions import ClientError
        s = self.settings
        layout = self.app[CONFIG].layout
        for inp in inputs:
            sha, folder, name = str(inp["sha256"]), str(inp["folder"]), str(inp["name"])
            key = s3.input_key(s.prefix, sha)
            try:
                self.own().head_object(Bucket=s.bucket, Key=key)
                continue
            except ClientError as exc:
                if s3.error_code(exc) not in ("404", "NoSuchKey", "NotFound"):
                    raise RuntimeError(f"could not check s3://{s.bucket}/{key}: {exc}") from None
            path = layout.resolve_upload(folder, name)
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
            if h.hexdigest() != sha:
                raise RuntimeError(f"{folder}/{name} changed on this server since the run was queued "
                                   f"(sha256 {h.hexdigest()}, expected {sha}); submit the run again")
            self._upload(path, key)
            log.info("run %s: put input %s/%s into s3://%s/%s", run_id, folder, name, s.bucket, key)

    def _upload(self, path: Path, key: str) -> None:
        from boto3.s3.transfer import TransferConfig
        self.own().upload_file(str(path), self.settings.bucket, key,
                               Config=TransferConfig(multipart_threshold=s3.MULTIPART_THRESHOLD))

    # -- renewal, and fresh credentials for a worker that reconnects -------------------------------
    async def renew_loop(self) -> None:
        while True:
            await self.clock.sleep(RENEW_TICK_S)
            now = self.clock.monotonic()
            for run_id, at in list(self.issued.items()):
                if now - at >= self.renew_after():
                    try:
                        await self.send_fresh(run_id)
                    except Exception as exc:  # one run's renewal must not stop the others'; it is retried next tick
                        log.warning("run %s: renewing its S3 credentials failed: %s; retrying in %.0f s",
                                    run_id, exc, RENEW_TICK_S)

    async def send_fresh(self, run_id: str) -> bool:
        """New credentials for a live s3 run, sent to its worker if connected (else at its reconnect)."""
        run = await self.app[RUNS].store.get_run(run_id)
        if run is None or run.status not in ACTIVE or STORAGE_FACT not in (run.execution_facts or {}):
            self.issued.pop(run_id, None)
            return False
        conn = self.app[WORKERS].conns.get(run.worker_id or "")
        if conn is None or conn.ws.closed:
            return False
        creds = await self._issue(run)
        sent = await conn.send(protocol.S3CredentialsMessage(run_id, creds.to_dict()))
        if sent:
            log.info("run %s: sent fresh S3 credentials (%s) to worker %s", run_id, creds.kind, run.worker_id)
        return sent

    async def on_worker_resumed(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            try:
                await self.send_fresh(run_id)
            except Exception as exc:  # the renewal loop tries again; the worker keeps what it has meanwhile
                log.warning("run %s: fresh S3 credentials for the reconnected worker failed: %s", run_id, exc)

    # -- rows, downloads, cleanup ---------------------------------------------------------------
    async def artifact_row(self, run_id: str, kind: str, data: dict[str, Any]) -> dict[str, Any] | str | None:
        """The row for a worker's s3 artifact event, or why it is refused: only a key under the run's own
        ``runs/<run id>/`` in the run's own bucket (a worker may be hostile; the row is served later).
        None: the event only says the file is queued for upload (its row comes with the upload)."""
        if data.get("upload") == "queued" and "key" not in data:
            return None
        run = await self.app[RUNS].store.get_run(run_id)
        where = (run.execution_facts or {}).get(STORAGE_FACT) if run is not None else None
        if not isinstance(where, dict):
            return "the run is not an s3 run"
        bucket, prefix, key = where.get("bucket"), str(where.get("prefix") or ""), data.get("key")
        if data.get("bucket") != bucket:
            return f"bucket {str(data.get('bucket'))[:80]!r} is not the run's bucket {bucket!r}"
        if not isinstance(key, str) or not s3.key_in_run(key, prefix, run_id):
            return f"key {str(key)[:200]!r} is not under the run's {s3.run_prefix(prefix, run_id)}"
        size, sha = data.get("size"), data.get("sha256")
        if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
            self.app[RUNS].counts.s3_bytes.inc(size)
        return {"run_id": run_id, "kind": kind, "name": key.rsplit("/", 1)[-1], "backend": "s3",
                "path": s3.s3_url(str(bucket), key), "relative_path": key, "label": bucket,
                "size": size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None,
                "sha256": sha if isinstance(sha, str) and len(sha) == 64 else None}

    async def download(self, request: web.Request, row: dict[str, Any]) -> web.StreamResponse:
        """The object's bytes, only when they are the row's: the agent puts each object with its sha256
        in the object's metadata, which is compared first (a later upload to the same key, or any other
        writer, changes it). An object without that metadata is hashed here before a byte is sent."""
        bucket, key = str(row["label"] or ""), str(row["relative_path"] or "")
        if not bucket or row["path"] != s3.s3_url(bucket, key):
            raise CduiError("not_here", f"artifact {row['id']} has no bucket address", status=404)
        if self.settings.download == "presign":
            head = await self._object_call(bucket, key, lambda c: c.head_object(Bucket=bucket, Key=key))
            verdict = _same_bytes(row, head)
            if verdict == "other":
                raise _replaced_object(row, bucket, key)
            if verdict == "same":
                url = await asyncio.to_thread(self.own().generate_presigned_url, "get_object",
                                              Params={"Bucket": bucket, "Key": key},
                                              ExpiresIn=self.settings.presign_ttl_s)
                return web.Response(status=302, headers={"Location": url})
            # "unknown": checked by reading it here, below, as a proxied download is
        obj = await self._object_call(bucket, key, lambda c: c.get_object(Bucket=bucket, Key=key))
        body = obj["Body"]
        verdict = _same_bytes(row, obj)
        if verdict == "other":
            body.close()
            raise _replaced_object(row, bucket, key)
        headers = {"Content-Disposition": f'attachment; filename="{Path(key).name}"',
                   "Content-Type": "application/octet-stream"}
        if verdict == "unknown":
            spooled = await asyncio.to_thread(_spool_checked, body, str(row["sha256"]),
                                              self.app[CONFIG].user_data)
            if spooled is None:
                raise _replaced_object(row, bucket, key)
            body = spooled
        resp = web.StreamResponse(headers=headers)
        if verdict == "same" and isinstance(obj.get("ContentLength"), int):
            resp.content_length = obj["ContentLength"]
        await resp.prepare(request)
        try:
            while chunk := await asyncio.to_thread(body.read, 1 << 20):
                await resp.write(chunk)
        finally:
            body.close()
        await resp.write_eof()
        return resp

    async def _object_call(self, bucket: str, key: str, fn: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, self.own())
        except Exception as exc:
            if s3.error_code(exc) in ("NoSuchKey", "404"):
                raise CduiError("gone", f"s3://{bucket}/{key} no longer exists in the bucket", status=410) from None
            raise CduiError("bucket_unreachable", f"could not read s3://{bucket}/{key}: {exc}",
                            hint="check that this server reaches the bucket with its key", status=502) from None

    async def cleanup(self, run: Run, by_retention: bool) -> str | None:
        """Remove the run's objects (keeping ``output/``, and ``checkpoint/`` of an interrupted run removed
        by retention) and abort its unfinished uploads. Returns a warning when the bucket could not be
        reached: the objects are then left where they are."""
        where = (run.execution_facts or {}).get(STORAGE_FACT)
        if not isinstance(where, dict):
            return None
        bucket, prefix = str(where.get("bucket")), str(where.get("prefix") or "")
        keep_checkpoint = by_retention and run.status == "interrupted"
        try:
            removed, aborted = await asyncio.to_thread(self._cleanup, bucket, prefix, run.id, keep_checkpoint)
        except Exception as exc:
            msg = (f"the bucket could not be reached to remove run {run.id}'s objects ({exc}); they are left "
                   f"under s3://{bucket}/{s3.run_prefix(prefix, run.id)}")
            log.warning("%s", msg)
            return msg
        log.info("run %s: removed %d object(s) and aborted %d unfinished upload(s) in s3://%s/%s", run.id,
                 removed, aborted, bucket, s3.run_prefix(prefix, run.id))
        return None

    def _cleanup(self, bucket: str, prefix: str, run_id: str, keep_checkpoint: bool) -> tuple[int, int]:
        c = self.own()
        base = s3.run_prefix(prefix, run_id)
        keys: list[str] = []
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=base):
            keys += [o["Key"] for o in page.get("Contents") or []]
        doomed = s3.keys_to_remove(keys, prefix, run_id, keep_checkpoint)
        for i in range(0, len(doomed), DELETE_BATCH):
            c.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in doomed[i:i + DELETE_BATCH]],
                                                    "Quiet": True})
        aborted = 0
        for page in c.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=base):
            for u in page.get("Uploads") or []:
                c.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
                aborted += 1
        return len(doomed), aborted

    # -- the run service's listener: forget ended runs ---------------------------------------------
    async def on_terminal(self, run_id: str, status: str) -> None:
        self.issued.pop(run_id, None)

    async def before_dispatch(self) -> None:
        pass

    async def on_shutdown(self) -> None:
        pass

    async def check_target(self, target: Any, graph: Any, files: Any) -> None:
        pass

    async def on_disk_recovered(self) -> None:
        pass


# The S3 bucket backend; present only when it is on (CODEFYUI_S3_ENABLED=1, a bucket, boto3).
S3_BACKEND: web.AppKey[S3Backend] = web.AppKey("s3_backend")


def _same_bytes(row: dict[str, Any], obj: dict[str, Any]) -> str:
    """Whether an object (a head or get answer) holds the row's bytes: ``same``, ``other``, or
    ``unknown`` (no sha256 in its metadata: only hashing it can tell)."""
    size = row.get("size")
    if isinstance(size, int) and isinstance(obj.get("ContentLength"), int) and obj["ContentLength"] != size:
        return "other"
    want = row.get("sha256")
    if not isinstance(want, str):
        return "same"  # the row names no bytes to check against
    got = (obj.get("Metadata") or {}).get("sha256")
    if got is None:
        return "unknown"
    return "same" if got == want else "other"


def _replaced_object(row: dict[str, Any], bucket: str, key: str) -> CduiError:
    return CduiError("replaced", f"artifact {row['id']} ({row['name']}) of run {row['run_id']} cannot be served: "
                                 f"s3://{bucket}/{key} now holds other bytes than the recorded sha256 "
                                 f"{row['sha256']}", hint="the object was written again after the run recorded it",
                     status=410)


def _spool_checked(body: Any, sha: str, folder: Path) -> Any:
    """The object's bytes in a temporary file (at offset 0) if they hash to ``sha``, else None."""
    tmp = tempfile.TemporaryFile(dir=folder)
    h = hashlib.sha256()
    try:
        while chunk := body.read(1 << 20):
            h.update(chunk)
            tmp.write(chunk)
    except BaseException:
        tmp.close()
        raise
    finally:
        body.close()
    if h.hexdigest() != sha:
        tmp.close()
        return None
    tmp.seek(0)
    return tmp


def setup(app: web.Application) -> None:
    """Log whether the backend is on; when it is, attach it to the run service and start its renewal."""
    settings = s3.S3Settings.from_config(app[CONFIG])
    present = s3.have_boto3() if settings.enabled else False
    line = settings.status_line(present)
    if settings.off_reason(present) is None:
        backend = S3Backend(app, settings)
        app[S3_BACKEND] = backend
        runs = app[RUNS]
        runs.storage = backend
        runs.add_listener(backend)

        async def ctx(app: web.Application) -> AsyncIterator[None]:
            log.info("%s", line)
            task = runs.spawn(backend.renew_loop())
            yield
            task.cancel()
        app.cleanup_ctx.append(ctx)
    elif settings.enabled:
        async def warn(app: web.Application) -> None:
            log.warning("%s", line)
        app.on_startup.append(warn)


def backend_of(app: web.Application) -> S3Backend | None:
    return app.get(S3_BACKEND)
