"""The public and the file routes fuzzed with hypothesis, against one control
plane served from a thread (real sockets, a real sqlite file).

Examples are bounded and derandomized (the same ones on every run, so a
failure reproduces and CI stays quick); ``deadline=None`` because the machine
may be busy. For every example: the answer is 201 with the route's body, or a
4xx with the one JSON error shape (never a 500, never a dropped connection);
the server still answers afterwards; and no file appears or changes outside
the folders the route writes into.
"""
from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.multipart import content_disposition_filename, parse_content_disposition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdui import __version__
from cdui.plane.appkeys import SESSION_TOKEN
from inproc.harness import FakeAgent

FUZZ = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# -- helpers -----------------------------------------------------------------------------
def request(tp: Any, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
            session: bool = True) -> tuple[int, Any]:
    hdrs = dict(headers or {})
    if session:
        hdrs.setdefault("X-CodefyUI-Token", tp.plane.app[SESSION_TOKEN])
    req = urllib.request.Request(f"http://127.0.0.1:{tp.port}{path}", data=body, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return status, json.loads(raw) if raw else None


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_error_shape(status: int, body: Any, allowed: set[int]) -> None:
    assert status in allowed, (status, body)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert isinstance(body["error"]["code"], str) and body["error"]["message"], body


def tree(root: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, name)
            st_ = os.lstat(p)
            out[os.path.relpath(p, root)] = (st_.st_size, st_.st_mtime_ns)
    return out


def outside(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
            allowed: tuple[str, ...]) -> list[str]:
    """Paths added, removed or changed that are neither the database's nor under ``allowed``."""
    return [p for p in sorted(set(before) | set(after)) if before.get(p) != after.get(p)
            and not p.startswith(("ud/cdui.sqlite3", *allowed))]


def multipart(parts: list[tuple[str, str | None, bytes, str | None]], boundary: str) -> bytes:
    """(field name, file name or None, content, content type or None) parts, written as given."""
    out = b""
    for name, filename, content, ctype in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
        out += f"--{boundary}\r\nContent-Disposition: {disp}\r\n".encode("utf-8", "surrogateescape")
        if ctype:
            out += f"Content-Type: {ctype}\r\n".encode()
        out += b"\r\n" + content + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
json_values = st.recursive(scalars,
                           lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                           max_leaves=12)
# Names built from the pieces that break naive path handling.
segments = st.sampled_from(["..", ".", "", "x", "a b", "out", "output", "models", "media", "files", "runs", "link",
                            "ü", "\x00", "\x1f", "\\", "C:", "~", "%2e%2e", "x" * 300, ".upload-1", "/"])
# Any text, but no quote or line break: those would end the multipart header this test writes, not test the server.
name_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='"\r\n'), max_size=60)
path_names = st.lists(segments, min_size=0, max_size=5).map("/".join) | name_text


# -- enrollment ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def enroll_token(threaded_plane: Any) -> str:
    status, body = request(threaded_plane, "POST", "/api/workers/tokens", json.dumps({"ttl_s": 3600, "uses": 10000})
                           .encode(), {"Content-Type": "application/json"})
    assert status == 201, body
    return str(body["token"])


@FUZZ
@given(token=st.one_of(st.just("VALID"), json_values),
       name=json_values | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,70}", fullmatch=True),
       devices=json_values | st.lists(st.text(max_size=200), max_size=70), version=st.just(__version__) | json_values,
       machine_id=json_values | st.text(max_size=200),
       extra=st.dictionaries(st.text(max_size=8), json_values, max_size=3),
       drop=st.sets(st.sampled_from(["token", "name", "devices", "version", "machine_id"])))
def test_enrollment_fuzzed_bodies(threaded_plane, enroll_token, token, name, devices, version, machine_id, extra, drop):
    body: dict[str, Any] = {**extra, "token": enroll_token if token == "VALID" else token, "name": name,
                            "devices": devices, "version": version, "machine_id": machine_id}
    for k in drop:
        body.pop(k, None)
    before = tree(threaded_plane.root)
    status, answer = request(threaded_plane, "POST", "/api/workers/enroll", json.dumps(body).encode(),
                             {"Content-Type": "application/json"}, session=False)
    if status == 201:
        assert set(answer) == {"worker", "credential", "version"} and answer["credential"].startswith("cdw_"), answer
        assert answer["worker"] == name and body["token"] == enroll_token, (body, answer)
    else:
        assert_error_shape(status, answer, {400, 401, 403, 409, 413})
    assert outside(before, tree(threaded_plane.root), ()) == []
    assert request(threaded_plane, "GET", "/api/health")[0] == 200


@FUZZ
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
       ctype=st.sampled_from(["application/json", "text/plain", "multipart/form-data; boundary=x", ""]))
def test_enrollment_fuzzed_raw_bodies(threaded_plane, raw, ctype):
    status, answer = request(threaded_plane, "POST", "/api/workers/enroll", raw,
                             {"Content-Type": ctype} if ctype else {}, session=False)
    assert_error_shape(status, answer, {400, 401, 413})


# -- user uploads -----------------------------------------------------------------------------
@FUZZ
@given(filename=path_names, content=st.binary(max_size=6000), field=st.sampled_from(["file", "File", "other", ""]),
       kind=st.sampled_from(["files", "images", "models", "runs", "..", "files/../..", "%2e%2e"]),
       extra_first=st.booleans())
def test_user_uploads_fuzzed(threaded_plane, filename, content, field, kind, extra_first):
    boundary = "b" + uuid.uuid4().hex
    parts = [(field, filename, content, "application/octet-stream")]
    if extra_first:
        parts.insert(0, ("note", None, b"hello", None))
    before = tree(threaded_plane.root)
    status, answer = request(threaded_plane, "POST", f"/api/{kind}/upload", multipart(parts, boundary),
                             {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    after = tree(threaded_plane.root)
    if status == 201:
        assert kind in ("files", "images", "models") and field == "file", (kind, field, answer)
        target = threaded_plane.root / "data" / kind / answer["name"]
        # The name as the header says it (aiohttp's parser drops a leading '/' and reads '\\x' as x).
        _, params = parse_content_disposition(f'form-data; name="file"; filename="{filename}"')
        sent = content_disposition_filename(params, "filename")
        assert answer["name"] == sent and "/" not in sent and target.parent == threaded_plane.root / "data" / kind, (
            filename, answer)
        assert sha256_of(target) == answer["sha256"] == hashlib.sha256(content).hexdigest()
        assert outside(before, after, (f"data/{kind}/{sent}",)) == []
    else:
        assert_error_shape(status, answer, {400, 404, 405, 413})
        assert outside(before, after, ()) == [], "a refused upload leaves nothing behind"
    assert not [p for p in after if ".upload-" in p], "no temporary upload file stays"


@FUZZ
@given(raw=st.binary(max_size=400), boundary=st.sampled_from(["x", "b" * 80, "", "a;b"]))
def test_user_upload_garbage_multipart(threaded_plane, raw, boundary):
    before = tree(threaded_plane.root)
    status, answer = request(threaded_plane, "POST", "/api/files/upload", raw,
                             {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    if status == 201:  # the garbage happened to be a valid upload of a plain name
        assert "/" not in answer["name"], answer
        return
    assert_error_shape(status, answer, {400, 413})
    assert outside(before, tree(threaded_plane.root), ()) == []


@FUZZ
@given(name=path_names)
def test_download_names_fuzzed(threaded_plane, name):
    """Whatever the name, a download serves only a regular file inside its folder."""
    secret = threaded_plane.root / "outside.txt"
    path = "/api/files/download/" + urllib.request.quote(name, safe="/")
    status, raw = _raw_get(threaded_plane, path)
    if status == 200:
        assert raw != secret.read_bytes(), name
        target = (threaded_plane.root / "data" / "files" / name).resolve()
        assert target.is_relative_to((threaded_plane.root / "data" / "files").resolve()) and target.is_file(), name
    else:
        assert status in (400, 404), (name, status, raw[:200])
        assert set(json.loads(raw)) == {"error"}


def _raw_get(tp: Any, path: str) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{tp.port}{path}",
                                 headers={"X-CodefyUI-Token": tp.plane.app[SESSION_TOKEN]})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module", autouse=True)
def planted(threaded_plane: Any) -> None:
    """A secret next to the data folder, and links inside it that lead to it."""
    root = threaded_plane.root
    (root / "outside.txt").write_text("the secret outside every data folder")
    for folder in ("files", "output", "models"):
        (root / "data" / folder).mkdir(parents=True, exist_ok=True)
        (root / "data" / folder / "link").symlink_to(root)
        (root / "data" / folder / "secret.txt").symlink_to(root / "outside.txt")


# -- a worker's artifact uploads --------------------------------------------------------------
@pytest.fixture(scope="module")
def worker_run(threaded_plane: Any) -> Iterator[tuple[str, str]]:
    """An enrolled, connected worker holding one running run: (credential, run id). The fake
    agent lives on the plane's loop until the module's plane closes."""
    agents: list[FakeAgent] = []

    async def connect() -> tuple[str, str]:
        agent = FakeAgent(threaded_plane.plane, "fuzz")  # its HTTP session belongs to the plane's loop
        agents.append(agent)
        await agent.enroll()
        await agent.connect()
        run = await threaded_plane.plane.submit({"target": {"worker": "fuzz"}})
        assert (await agent.assignment())["run_id"] == run["id"]
        await agent.status(run["id"], "running")
        return agent.credential, str(run["id"])
    try:
        yield threaded_plane.call(connect())
    finally:
        for agent in agents:
            threaded_plane.call(agent.close())  # the plane's shutdown waits for open worker sockets


@FUZZ
@given(group=st.sampled_from(["artifact", "output", "input", ""]) | st.text(max_size=8),
       kind=st.sampled_from(["checkpoint", "tensorboard", "model", "output", "log", "metrics", "../x", ""]),
       name=path_names, relative_path=path_names, content=st.binary(max_size=6000),
       sha=st.sampled_from(["right", "wrong", "absent"]), meta_raw=st.none() | st.binary(max_size=60))
def test_worker_artifact_uploads_fuzzed(threaded_plane, worker_run, group, kind, name, relative_path, content, sha,
                                        meta_raw):
    credential, run_id = worker_run
    meta: dict[str, Any] = {"group": group, "kind": kind, "name": name, "relative_path": relative_path,
                            "size": len(content)}
    if sha != "absent":
        meta["sha256"] = hashlib.sha256(content).hexdigest() if sha == "right" else "0" * 64
    boundary = "b" + uuid.uuid4().hex
    body = multipart([("meta", None, meta_raw if meta_raw is not None else json.dumps(meta).encode(),
                       "application/json"), ("file", "f.bin", content, "application/octet-stream")], boundary)
    before = tree(threaded_plane.root)
    status, answer = request(threaded_plane, "POST", f"/api/runs/{run_id}/artifacts/upload", body,
                             {"Content-Type": f"multipart/form-data; boundary={boundary}",
                              "Authorization": f"Bearer {credential}"}, session=False)
    after = tree(threaded_plane.root)
    data = (threaded_plane.root / "data").resolve()
    if status == 201:
        stored = Path(answer["path"]).resolve()
        ok_roots = [data / "runs" / run_id, data / "output", data / "models", data / "media"]
        assert any(stored.is_relative_to(r) for r in ok_roots), answer
        assert stored.is_file() and not Path(answer["path"]).is_symlink(), answer
        assert sha256_of(stored) == answer["sha256"] == hashlib.sha256(content).hexdigest()
        assert sha != "wrong" and len(content) <= 4096, (meta, answer)
        rel = str(stored.relative_to(threaded_plane.root.resolve()))
        digest = answer["sha256"]
        kept = f"data/artifacts/{digest[:2]}/{digest}"  # its bytes kept under their sha256 (a hard link)
        assert os.path.samefile(threaded_plane.root / kept, stored), answer
        assert outside(before, after, (rel, kept)) == [], answer
    else:
        assert_error_shape(status, answer, {400, 413})
        assert outside(before, after, ()) == [], (meta, answer)
    assert not [p for p in after if ".upload-" in p], "no temporary upload file stays"
    assert (threaded_plane.root / "outside.txt").read_text() == "the secret outside every data folder"


def test_a_part_s_content_length_is_held_to_the_body(threaded_plane, worker_run):
    """The agent uploads as multipart/mixed, each part with its Content-Length, which the receiver then
    reads by (no search for the boundary). A worker may lie about it: a length past the body's end,
    short of the part's end, or not a number gets a clear 400, stores nothing and leaves no temporary
    file; the truthful length stores the file; the control plane keeps serving."""
    credential, run_id = worker_run
    content = os.urandom(3000)  # under the plane's upload limit (4 KiB), with the rest of the body too
    meta = json.dumps({"group": "artifact", "kind": "output", "name": "mixed.bin",
                       "sha256": hashlib.sha256(content).hexdigest(), "size": len(content)}).encode()

    def body(length: str, boundary: str) -> bytes:
        return (f"--{boundary}\r\nContent-Type: application/json\r\nContent-Length: {len(meta)}\r\n"
                f'Content-Disposition: form-data; name="meta"\r\n\r\n').encode() + meta + (
            f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\n"
            f'Content-Disposition: form-data; name="file"; filename="mixed.bin"\r\n\r\n').encode() + content + (
            f"\r\n--{boundary}--\r\n").encode()

    for length, says in ((str(len(content) + 10_000), "malformed"), (str(len(content) - 1), "malformed"),
                         (str(10 ** 15), "malformed"), ("-1", "malformed"), ("12abc", "malformed")):
        boundary = "b" + uuid.uuid4().hex
        before = tree(threaded_plane.root)
        status, answer = request(threaded_plane, "POST", f"/api/runs/{run_id}/artifacts/upload", body(length, boundary),
                                 {"Content-Type": f"multipart/mixed; boundary={boundary}",
                                  "Authorization": f"Bearer {credential}"}, session=False)
        assert (status, answer["error"]["code"]) == (400, "bad_upload"), (length, status, answer)
        assert says in answer["error"]["message"], answer
        after = tree(threaded_plane.root)
        assert outside(before, after, ()) == [], (length, answer)
        assert not [p for p in after if ".upload-" in p], "no temporary upload file stays"
    boundary = "b" + uuid.uuid4().hex
    status, answer = request(threaded_plane, "POST", f"/api/runs/{run_id}/artifacts/upload",
                             body(str(len(content)), boundary),
                             {"Content-Type": f"multipart/mixed; boundary={boundary}",
                              "Authorization": f"Bearer {credential}"}, session=False)
    assert status == 201, answer
    assert Path(answer["path"]).read_bytes() == content and answer["sha256"] == hashlib.sha256(content).hexdigest()
    # A user's upload goes through the same receiver.
    boundary = "b" + uuid.uuid4().hex
    before = tree(threaded_plane.root)
    status, answer = request(threaded_plane, "POST", "/api/files/upload", (
        f"--{boundary}\r\nContent-Length: {len(content) + 5}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="lying.bin"\r\n\r\n').encode() + content + (
        f"\r\n--{boundary}--\r\n").encode(), {"Content-Type": f"multipart/mixed; boundary={boundary}"})
    assert (status, answer["error"]["code"]) == (400, "bad_upload") and "malformed" in answer["error"]["message"]
    assert outside(before, tree(threaded_plane.root), ()) == [], answer


def test_names_of_uploads_in_progress_are_refused(threaded_plane, worker_run):
    """A file named like the receiver's temporary files would be hidden from the listing and
    deleted by the next start's sweep, leaving its row pointing at nothing: refused up front."""
    credential, run_id = worker_run
    boundary = "b" + uuid.uuid4().hex
    status, answer = request(threaded_plane, "POST", "/api/files/upload",
                             multipart([("file", ".upload-abc", b"data", None)], boundary),
                             {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert (status, answer["error"]["code"]) == (400, "path_refused") and ".upload-" in answer["error"]["message"]
    for meta in ({"group": "artifact", "kind": "checkpoint", "name": ".upload-1"},
                 {"group": "output", "relative_path": "output/.upload-x/f.bin"}):
        body = multipart([("meta", None, json.dumps(meta).encode(), "application/json"),
                          ("file", "f.bin", b"data", None)], boundary)
        status, answer = request(threaded_plane, "POST", f"/api/runs/{run_id}/artifacts/upload", body,
                                 {"Content-Type": f"multipart/form-data; boundary={boundary}",
                                  "Authorization": f"Bearer {credential}"}, session=False)
        assert (status, answer["error"]["code"]) == (400, "path_refused"), (meta, answer)
