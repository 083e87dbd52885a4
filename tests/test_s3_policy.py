"""The S3 backend's pure pieces as tables: keys, the session policy (evaluated), what a cleanup
removes, the settings' checks and status line, and where credentials must never show."""
from __future__ import annotations

import fnmatch
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdui.core.config import load
from cdui.core.errors import CduiError
from cdui.wire import s3
from cdui.wire.job import Job, JobFiles

SHA = "a" * 64


def allowed(policy: dict[str, Any], action: str, bucket: str, key: str) -> bool:
    """IAM's rule for an Allow-only policy: a request is allowed when some statement names its action
    and matches its resource (``*`` spans ``/``); everything else is denied."""
    arn = f"arn:aws:s3:::{bucket}/{key}"
    return any(st["Effect"] == "Allow" and action in st["Action"]
               and any(fnmatch.fnmatchcase(arn, r) for r in st["Resource"]) for st in policy["Statement"])


@pytest.mark.parametrize("action,key,expected", [
    ("s3:PutObject", "runs/r1/output/models/iris/model.pt", True),
    ("s3:PutObject", "runs/r1/checkpoint/epoch_5.pt", True),
    ("s3:AbortMultipartUpload", "runs/r1/checkpoint/big.pt", True),
    ("s3:PutObject", "runs/r2/output/x", False),          # another run's folder
    ("s3:PutObject", "runs/r1", False),                   # not under runs/r1/
    ("s3:PutObject", "runs/r10/x", False),                # a run whose id starts the same
    ("s3:PutObject", f"inputs/{SHA}", False),             # inputs are the control plane's to put
    ("s3:PutObject", "elsewhere/x", False),
    ("s3:GetObject", f"inputs/{SHA}", True),              # the run's own input
    ("s3:GetObject", f"inputs/{'b' * 64}", False),        # another upload
    ("s3:GetObject", "runs/r2/output/x", False),
    ("s3:DeleteObject", "runs/r1/output/x", False),
])
def test_session_policy_allows_only_the_runs_writes_and_inputs(action: str, key: str, expected: bool) -> None:
    policy = s3.session_policy("codefyui", "", "r1", [SHA, SHA])
    assert allowed(policy, action, "codefyui", key) is expected
    assert not allowed(policy, action, "other-bucket", key)


def test_session_policy_under_a_prefix() -> None:
    policy = s3.session_policy("b", "lab/", "r1", [SHA])
    assert allowed(policy, "s3:PutObject", "b", "lab/runs/r1/output/x")
    assert not allowed(policy, "s3:PutObject", "b", "runs/r1/output/x")
    assert allowed(policy, "s3:GetObject", "b", f"lab/inputs/{SHA}")


def test_session_policy_fits_stss_limit_for_a_few_inputs() -> None:
    policy = s3.packed_policy(s3.session_policy("codefyui", "codefyui/", "0123456789ab", [c * 64 for c in "abcdef"]))
    assert len(policy) < s3.MAX_POLICY_BYTES


@pytest.mark.parametrize("keep_checkpoint,expected", [
    (False, ["p/runs/r1/checkpoint/a.pt", "p/runs/r1/tensorboard/tb/e"]),
    (True, ["p/runs/r1/tensorboard/tb/e"]),
])
def test_cleanup_keeps_output_and_optionally_checkpoint(keep_checkpoint: bool, expected: list[str]) -> None:
    keys = ["p/runs/r1/checkpoint/a.pt", "p/runs/r1/output/models/m.pt", "p/runs/r1/tensorboard/tb/e",
            "p/runs/r10/checkpoint/x", "p/inputs/" + SHA]
    assert s3.keys_to_remove(keys, "p/", "r1", keep_checkpoint) == expected


@pytest.mark.parametrize("key,ok", [
    ("runs/r1/output/models/m.pt", True),
    ("runs/r1/checkpoint/epoch_1.pt", True),
    ("runs/r1/x", False),                      # no kind folder
    ("runs/r1/output/../../r2/x", False),
    ("runs/r1//x", False),
    ("runs/r2/output/x", False),
    ("inputs/" + SHA, False),
    ("runs/r1/output/a\nb", False),
    ("runs/r1/output/" + "x" * 1100, False),
])
def test_key_in_run(key: str, ok: bool) -> None:
    assert s3.key_in_run(key, "", "r1") is ok


def test_keys() -> None:
    assert s3.input_key("p/", SHA) == f"p/inputs/{SHA}"
    assert s3.artifact_key("", "r1", "checkpoint", "epoch_5.pt") == "runs/r1/checkpoint/epoch_5.pt"
    assert s3.output_key("", "r1", "models/iris/model.pt") == "runs/r1/output/models/iris/model.pt"
    assert s3.s3_url("b", "runs/r1/x") == "s3://b/runs/r1/x"


def _settings(**env: str) -> s3.S3Settings:
    return s3.S3Settings.from_config(load({"CODEFYUI_USER_DATA_DIR": "/tmp/unused", **env}))


def test_status_line_on_and_why_off() -> None:
    on = _settings(CODEFYUI_S3_ENABLED="1", CODEFYUI_S3_BUCKET="codefyui",
                   CODEFYUI_S3_ENDPOINT_URL="http://minio.lab:9000")
    assert on.status_line(True) == ("S3 artifact backend on: bucket codefyui at http://minio.lab:9000 "
                                    "(credentials: auto)")
    assert on.status_line(False) == ("S3 artifact backend off: CODEFYUI_S3_ENABLED=1 but boto3 is not installed here "
                                     "(pip install -e '.[s3]', or `cdui install --s3`)")
    assert _settings(CODEFYUI_S3_ENABLED="1").status_line(True) == (
        "S3 artifact backend off: CODEFYUI_S3_ENABLED=1 but CODEFYUI_S3_BUCKET is empty")
    aws = _settings(CODEFYUI_S3_ENABLED="1", CODEFYUI_S3_BUCKET="b", CODEFYUI_S3_CREDENTIALS="sts")
    assert aws.status_line(True) == "S3 artifact backend on: bucket b at AWS S3 (credentials: sts)"


@pytest.mark.parametrize("env,message", [
    ({"CODEFYUI_S3_STS_DURATION_S": "899"},
     "CODEFYUI_S3_STS_DURATION_S=899 is not valid: expected 900 to 43200 seconds"),
    ({"CODEFYUI_S3_STS_DURATION_S": "43201"},
     "CODEFYUI_S3_STS_DURATION_S=43201 is not valid: expected 900 to 43200 seconds"),
    ({"CODEFYUI_S3_CREDENTIALS": "iam"}, "CODEFYUI_S3_CREDENTIALS='iam' is not valid: expected sts|static|auto"),
    ({"CODEFYUI_S3_DOWNLOAD": "direct"}, "CODEFYUI_S3_DOWNLOAD='direct' is not valid: expected proxy|presign"),
    ({"CODEFYUI_S3_ADDRESSING_STYLE": "dns"},
     "CODEFYUI_S3_ADDRESSING_STYLE='dns' is not valid: expected auto|path|virtual"),
])
def test_bad_settings_are_refused_with_name_and_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(CduiError) as err:
        _settings(**env)
    assert err.value.message == message


def test_defaults_and_prefix_gets_its_slash() -> None:
    s = _settings(CODEFYUI_S3_PREFIX="codefyui")
    assert (s.enabled, s.region, s.credentials, s.duration_s, s.download, s.presign_ttl_s, s.addressing_style) == (
        False, "us-east-1", "auto", 3600, "proxy", 900, "auto")
    assert s.prefix == "codefyui/"


def test_credentials_never_in_a_repr_and_the_run_process_never_gets_them(tmp_path: Path) -> None:
    creds = s3.S3Credentials("sts", "ASIAKEY", "the-secret", "the-token", 1.0)
    settings = _settings(CODEFYUI_S3_SECRET_ACCESS_KEY="cp-secret")
    job = Job("r1", {"nodes": [], "edges": []}, files=JobFiles("s3", (), "data", {"bucket": "b", "region": "r"}),
              s3_credentials=creds.to_dict())
    for text in (repr(creds), repr(job), repr(settings)):
        assert "the-secret" not in text and "the-token" not in text and "cp-secret" not in text
    # The job crosses the wire with them, and the agent's copy for the run process has none.
    back = Job.from_json(job.to_json())
    assert back.s3_credentials == creds.to_dict()
    import asyncio

    from cdui.agent.run_files import run_files
    from cdui.agent.s3_agent import S3Files
    from cdui.core.config import load as load_cfg
    files = run_files("r1", back.files, tmp_path, {}, None, "http://x", "cred", 5.0, lambda k, d: None,
                      asyncio.Event())
    assert isinstance(files, S3Files)
    local = files.job_for_this_machine(back, load_cfg({"CODEFYUI_USER_DATA_DIR": str(tmp_path)}))
    assert local.s3_credentials is None and "the-secret" not in local.to_json()
    assert files.s3 is not None and files.s3.bucket == "b"
    assert replace(local, s3_credentials=None) == local


def test_s3_credentials_checked_at_the_edge() -> None:
    with pytest.raises(ValueError, match="kind 'root' is not sts or static"):
        s3.S3Credentials.from_dict({"kind": "root", "access_key_id": "k", "secret_access_key": "s"})
    with pytest.raises(ValueError, match="secret_access_key must be a non-empty string"):
        s3.S3Credentials.from_dict({"kind": "sts", "access_key_id": "k", "secret_access_key": ""})
    c = s3.S3Credentials.from_dict({"kind": "sts", "access_key_id": "k", "secret_access_key": "s",
                                    "session_token": "t", "expires_at": 100})
    assert c.expired(100.0) and not c.expired(99.9)
    assert not s3.S3Credentials("static", "k", "s").expired(1e12), "the static key never counts as expired"


def test_agent_without_boto3_offers_no_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("boto3", reason="the test extra installs boto3; here it is hidden on purpose")
    assert s3.agent_capabilities() == ["s3"]
    monkeypatch.setitem(sys.modules, "boto3", None)  # what an environment without boto3 gives an import
    assert s3.agent_capabilities() == []
    assert not s3.have_boto3()


def _client_error(code: str) -> Exception:
    from botocore.exceptions import ClientError
    return ClientError({"Error": {"Code": code, "Message": "m"}}, "PutObject")


def test_error_code_reads_the_answer_through_boto3s_upload_wrapper() -> None:
    """boto3's upload_file raises S3UploadFailedError inside its ``except ClientError``. The code
    comes from the ClientError it wraps; and when that link was lost (an exception re-raised while
    another is being handled takes that one as its context), from the text boto3 copied."""
    pytest.importorskip("boto3")
    from boto3.exceptions import S3UploadFailedError
    inner = _client_error("InvalidAccessKeyId")
    try:
        try:
            raise inner
        except Exception as e:
            raise S3UploadFailedError(f"Failed to upload m.pt to codefyui/k: {e}")  # noqa: B904 (boto3's way)
    except S3UploadFailedError as wrapped:
        assert wrapped.__context__ is inner
        assert s3.error_code(wrapped) == "InvalidAccessKeyId"
        wrapped.__context__ = ValueError("something else being handled")
        assert s3.error_code(wrapped) == "InvalidAccessKeyId"
    assert s3.error_code(_client_error("NoSuchBucket")) == "NoSuchBucket"
    assert s3.error_code(S3UploadFailedError("Failed to upload m.pt: disk gone")) is None
    assert s3.error_code(ValueError("An error occurred (Nope) when")) is None
