"""The S3 / MinIO bucket backend's shared part: settings, keys, session policy, credentials, the client.

With ``CODEFYUI_S3_ENABLED=1`` a bucket replaces the control plane as the
file store of runs on workers without the ``data`` mount
(docs/s3.md). This module holds what both sides need and can be tested as
tables: the settings checked once at start, the object keys, the session
policy of a run's temporary credentials, which objects a cleanup removes,
and the one function that builds a boto3 client. The control plane's side
is :mod:`cdui.plane.files.s3_plane`, the agent's :mod:`cdui.agent.s3_agent`.

boto3 is optional (the ``s3`` extra): nothing here imports it at module
level, and :func:`have_boto3` says whether this machine can use a bucket.

Keys, all under ``CODEFYUI_S3_PREFIX``:

- ``inputs/<sha256>``: an upload a run reads, put once by the control plane;
- ``runs/<run id>/<kind>/<name>``: a file the run recorded as an artifact;
- ``runs/<run id>/output/<models|media|output>/<path>``: a file it wrote.

Credentials (the control plane's own key, or temporary ones) are secrets:
their secret parts are left out of ``repr``, they are never logged or
written to a file, and the agent keeps them from the run subprocess.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cdui.core.errors import CduiError

CAPABILITY = "s3"  # what an agent with boto3 declares in its hello
CREDENTIAL_MODES = ("sts", "static", "auto")
DOWNLOAD_MODES = ("proxy", "presign")
ADDRESSING_STYLES = ("auto", "path", "virtual")
MIN_DURATION_S, MAX_DURATION_S = 900, 43200  # what STS accepts for AssumeRole
STS_BACKOFF_S = 600.0  # after STS refused, `auto` uses the static key without asking STS again for this long
# AWS refuses a packed session policy over 2048 bytes; a run with so many inputs gets no STS credentials.
MAX_POLICY_BYTES = 2048
MULTIPART_THRESHOLD = 8 * 1024 * 1024  # files from this size up are uploaded in parts
MAX_KEY = 1024  # S3's own limit on a key's length, in bytes


def have_boto3() -> bool:
    """Whether boto3 can be imported here (an import, not a lookup: a broken install counts as missing)."""
    try:
        import boto3  # noqa: F401
    except ImportError:
        return False
    return True


def agent_capabilities() -> list[str]:
    """What an agent offers on connecting: ``s3`` only where boto3 is installed."""
    return [CAPABILITY] if have_boto3() else []


# -- settings -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class S3Settings:
    enabled: bool
    endpoint_url: str | None
    region: str
    bucket: str | None
    prefix: str
    addressing_style: str
    access_key_id: str | None
    secret_access_key: str | None = field(repr=False)
    credentials: str
    role_arn: str | None
    duration_s: int
    download: str
    presign_ttl_s: int

    @classmethod
    def from_config(cls, cfg: Any) -> S3Settings:
        """The ``CODEFYUI_S3_*`` settings, each checked once (a bad value stops the start with its name)."""
        def choice(name: str, allowed: tuple[str, ...]) -> str:
            v = str(cfg[name]).strip().lower()
            if v not in allowed:
                raise CduiError("bad_setting", f"{name}={cfg[name]!r} is not valid: expected {'|'.join(allowed)}",
                                hint=f"set {name} to one of {', '.join(allowed)}, or unset it")
            return v
        duration = int(cfg["CODEFYUI_S3_STS_DURATION_S"])
        if not MIN_DURATION_S <= duration <= MAX_DURATION_S:
            raise CduiError("bad_setting", f"CODEFYUI_S3_STS_DURATION_S={duration} is not valid: expected "
                                           f"{MIN_DURATION_S} to {MAX_DURATION_S} seconds",
                            hint="STS issues temporary credentials for 15 minutes to 12 hours")
        ttl = int(cfg["CODEFYUI_S3_PRESIGN_TTL_S"])
        if not 1 <= ttl <= 7 * 86400:
            raise CduiError("bad_setting", f"CODEFYUI_S3_PRESIGN_TTL_S={ttl} is not valid: expected 1 to 604800",
                            hint="presigned URLs are valid for at most 7 days")
        prefix = str(cfg["CODEFYUI_S3_PREFIX"] or "").lstrip("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return cls(enabled=bool(cfg["CODEFYUI_S3_ENABLED"]),
                   endpoint_url=(cfg["CODEFYUI_S3_ENDPOINT_URL"] or None),
                   region=str(cfg["CODEFYUI_S3_REGION"] or "us-east-1"),
                   bucket=(cfg["CODEFYUI_S3_BUCKET"] or None), prefix=prefix,
                   addressing_style=choice("CODEFYUI_S3_ADDRESSING_STYLE", ADDRESSING_STYLES),
                   access_key_id=(cfg["CODEFYUI_S3_ACCESS_KEY_ID"] or None),
                   secret_access_key=(cfg["CODEFYUI_S3_SECRET_ACCESS_KEY"] or None),
                   credentials=choice("CODEFYUI_S3_CREDENTIALS", CREDENTIAL_MODES),
                   role_arn=(cfg["CODEFYUI_S3_STS_ROLE_ARN"] or None), duration_s=duration,
                   download=choice("CODEFYUI_S3_DOWNLOAD", DOWNLOAD_MODES), presign_ttl_s=ttl)

    def off_reason(self, boto3_present: bool) -> str | None:
        """Why the backend is off, or None when it is on."""
        if not self.enabled:
            return "CODEFYUI_S3_ENABLED is not set"
        if not self.bucket:
            return "CODEFYUI_S3_ENABLED=1 but CODEFYUI_S3_BUCKET is empty"
        if not boto3_present:
            return ("CODEFYUI_S3_ENABLED=1 but boto3 is not installed here "
                    "(pip install -e '.[s3]', or `cdui install --s3`)")
        return None

    def status_line(self, boto3_present: bool) -> str:
        why = self.off_reason(boto3_present)
        if why is not None:
            return f"S3 artifact backend off: {why}"
        return (f"S3 artifact backend on: bucket {self.bucket} at {self.endpoint_url or 'AWS S3'} "
                f"(credentials: {self.credentials})")

    def fingerprint(self) -> str:
        """Changes whenever a setting that decides STS's answer changes (the key's secret as a hash only)."""
        secret = hashlib.sha256((self.secret_access_key or "").encode()).hexdigest()
        return "|".join(str(x) for x in (self.endpoint_url, self.region, self.bucket, self.prefix,
                                         self.access_key_id, secret, self.credentials, self.role_arn,
                                         self.duration_s))

    def target(self) -> dict[str, Any]:
        """Where a worker finds the bucket: everything but the credentials (workers need no S3 settings)."""
        return {"endpoint_url": self.endpoint_url, "region": self.region, "bucket": self.bucket,
                "prefix": self.prefix, "addressing_style": self.addressing_style}


# -- keys ---------------------------------------------------------------------------------------
def input_key(prefix: str, sha256: str) -> str:
    return f"{prefix}inputs/{sha256}"


def run_prefix(prefix: str, run_id: str) -> str:
    return f"{prefix}runs/{run_id}/"


def artifact_key(prefix: str, run_id: str, kind: str, name: str) -> str:
    return f"{run_prefix(prefix, run_id)}{kind}/{name}"


def output_key(prefix: str, run_id: str, relative_path: str) -> str:
    return f"{run_prefix(prefix, run_id)}output/{relative_path}"


def s3_url(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key}"


def key_in_run(key: str, prefix: str, run_id: str) -> bool:
    """Whether ``key`` is one of run ``run_id``'s own objects (a worker names keys: it may lie)."""
    if not isinstance(key, str) or not key.startswith(run_prefix(prefix, run_id)):
        return False
    rest = key[len(run_prefix(prefix, run_id)):]
    parts = rest.split("/")
    return (len(key.encode()) <= MAX_KEY and len(parts) >= 2 and all(parts)
            and not any(p in (".", "..") for p in parts) and not any(ord(ch) < 32 for ch in key))


def keys_to_remove(keys: Iterable[str], prefix: str, run_id: str, keep_checkpoint: bool) -> list[str]:
    """Which of a run's objects a cleanup removes: all but ``output/`` (files the run wrote belong to
    the user) and, when ``keep_checkpoint``, ``checkpoint/`` (an interrupted run's resume point)."""
    base = run_prefix(prefix, run_id)
    keep = [base + "output/"] + ([base + "checkpoint/"] if keep_checkpoint else [])
    return [k for k in keys if k.startswith(base) and not any(k.startswith(p) for p in keep)]


# -- the session policy of a run's temporary credentials -------------------------------------------
def session_policy(bucket: str, prefix: str, run_id: str, input_shas: Iterable[str]) -> dict[str, Any]:
    """Writes only under ``runs/<run id>/`` (multipart uploads included: their parts are PutObject
    calls); reads of that run's inputs only. A session policy can only narrow what the key may do."""
    arn = f"arn:aws:s3:::{bucket}"
    statements: list[dict[str, Any]] = [
        {"Sid": "RunWrites", "Effect": "Allow",
         "Action": ["s3:PutObject", "s3:AbortMultipartUpload"],
         "Resource": [f"{arn}/{run_prefix(prefix, run_id)}*"]}]
    shas = sorted(set(input_shas))
    if shas:
        statements.append({"Sid": "RunInputs", "Effect": "Allow", "Action": ["s3:GetObject"],
                           "Resource": [f"{arn}/{input_key(prefix, s)}" for s in shas]})
    return {"Version": "2012-10-17", "Statement": statements}


def packed_policy(policy: dict[str, Any]) -> str:
    return json.dumps(policy, separators=(",", ":"))


# -- credentials ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class S3Credentials:
    """What a worker uses for one run's bucket access. ``kind``: ``sts`` (temporary, expiring at
    ``expires_at``, wall time) or ``static`` (the control plane's key)."""

    kind: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    expires_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "access_key_id": self.access_key_id,
                "secret_access_key": self.secret_access_key, "session_token": self.session_token,
                "expires_at": self.expires_at}

    @classmethod
    def from_dict(cls, d: Any) -> S3Credentials:
        if not isinstance(d, dict):
            raise ValueError(f"s3 credentials must be an object, got {type(d).__name__}")
        kind, key, secret = d.get("kind"), d.get("access_key_id"), d.get("secret_access_key")
        token, expires = d.get("session_token"), d.get("expires_at")
        if kind not in ("sts", "static"):
            raise ValueError(f"s3 credentials: kind {str(kind)[:20]!r} is not sts or static")
        for name, v, limit in (("access_key_id", key, 256), ("secret_access_key", secret, 1024)):
            if not isinstance(v, str) or not v or len(v) > limit:
                raise ValueError(f"s3 credentials: {name} must be a non-empty string of at most {limit} characters")
        if token is not None and (not isinstance(token, str) or len(token) > 8192):
            raise ValueError("s3 credentials: session_token must be a string of at most 8192 characters")
        if expires is not None and (isinstance(expires, bool) or not isinstance(expires, (int, float))):
            raise ValueError("s3 credentials: expires_at must be a number")
        return cls(str(kind), str(key), str(secret), token, float(expires) if expires is not None else None)

    def expired(self, now: float) -> bool:
        """Temporary credentials at or past their expiry (the only ones worth waiting for new ones)."""
        return self.kind == "sts" and self.expires_at is not None and now >= self.expires_at


def check_target(d: Any) -> dict[str, Any]:
    """A job's ``files.s3`` (where the bucket is), checked at the agent's edge."""
    if not isinstance(d, dict):
        raise ValueError(f"files.s3 must be an object, got {type(d).__name__}")
    out: dict[str, Any] = {}
    for key, required in (("endpoint_url", False), ("region", True), ("bucket", True), ("prefix", False),
                          ("addressing_style", False)):
        v = d.get(key)
        if v is None and not required:
            out[key] = "" if key == "prefix" else ("auto" if key == "addressing_style" else None)
            continue
        if not isinstance(v, str) or len(v) > 1024 or (required and not v):
            raise ValueError(f"files.s3.{key} must be a string of at most 1024 characters")
        out[key] = v
    if out["addressing_style"] not in ADDRESSING_STYLES:
        raise ValueError(f"files.s3.addressing_style {out['addressing_style'][:20]!r} is not auto, path or virtual")
    return out


# -- the one client builder --------------------------------------------------------------------------
def client(target: dict[str, Any], access_key_id: str | None, secret_access_key: str | None,
           session_token: str | None = None, service: str = "s3") -> Any:
    """A boto3 client for ``target`` with exactly these credentials (never the environment's chain:
    a worker must use what its run was given, and nothing else)."""
    quiet_sdk_logs()
    import boto3
    from botocore.config import Config
    cfg = Config(signature_version="s3v4" if service == "s3" else None,
                 s3={"addressing_style": target.get("addressing_style") or "auto"},
                 retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=10, read_timeout=60)
    return boto3.session.Session().client(service, endpoint_url=target.get("endpoint_url") or None,
                                          region_name=target.get("region") or "us-east-1",
                                          aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
                                          aws_session_token=session_token, config=cfg)


def quiet_sdk_logs() -> None:
    """botocore logs whole responses at DEBUG, STS's temporary secret included: its loggers stop at
    INFO whatever the root logger's level, so credentials never reach a log."""
    for name in ("botocore", "boto3", "s3transfer", "urllib3"):
        lg = logging.getLogger(name)
        if lg.level < logging.INFO:
            lg.setLevel(logging.INFO)


# Errors, as S3 and MinIO name them.
EXPIRED_CODES = {"InvalidAccessKeyId", "ExpiredToken", "TokenRefreshRequired"}
REFUSED_CODES = {"AccessDenied", "NoSuchBucket", "AllAccessDisabled", "InvalidBucketName"}


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it was raised from (boto3's upload_file wraps the ClientError it got)."""
    out: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and len(out) < 8:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


# botocore's message for an answer, which boto3's S3UploadFailedError copies into its own text
_ANSWER = re.compile(r"An error occurred \(([A-Za-z0-9.]{1,64})\) when calling the ")


def error_code(exc: BaseException) -> str | None:
    """The S3 error code of a botocore ``ClientError`` (or one it wraps), else None.

    boto3's ``upload_file`` raises ``S3UploadFailedError`` from inside its ``except ClientError``,
    so the answer is usually its ``__context__``; but that link is not reliable (an exception
    re-raised while another is being handled gets that one as its context instead), so the
    code is also read from the wrapper's text, which quotes botocore's message."""
    chain = _chain(exc)
    for e in chain:
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            code = (resp.get("Error") or {}).get("Code")
            if code is not None:
                return str(code)
    for e in chain:
        m = _ANSWER.search(str(e))
        if m:
            return m.group(1)
    return None


def is_connection_error(exc: BaseException) -> bool:
    """The bucket could not be reached (worth retrying), as opposed to an answer."""
    from botocore.exceptions import (
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )
    kinds = (EndpointConnectionError, ConnectionClosedError, ConnectTimeoutError, ReadTimeoutError,
             ConnectionError, TimeoutError)
    return any(isinstance(e, kinds) for e in _chain(exc))
