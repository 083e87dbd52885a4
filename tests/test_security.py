"""Security properties of a real server: the session token, the Host
allowlist, paths from outside (node params, upload names, download names),
the upload size limit, and SECRET params that must never be stored."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import stat
import threading
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from procs import (ServerProc, csv_print_graph, edge, graph, load_example, node, start_then, trig,
                   wait_run)

EXTRA_HOST = "gpu-gw.lan:8000"
LIMIT = 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    s = ServerProc(tmp_path_factory.mktemp("sec"), name="security-server",
                   extra_env={"CODEFYUI_EXTRA_ALLOWED_HOSTS": EXTRA_HOST, "CODEFYUI_MAX_UPLOAD_SIZE": str(LIMIT)})
    try:
        s.start()
        yield s
    finally:
        s.stop()


def error_of(body: Any) -> dict[str, Any]:
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    assert body["error"].get("code") and body["error"].get("message"), body
    return body["error"]


def files_containing(root: Path, needle: bytes) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink():
            try:
                if needle in p.read_bytes():
                    hits.append(str(p))
            except OSError:
                pass
    return hits


# -- auth -------------------------------------------------------------------------------------
PROTECTED = [("GET", "/api/runs"), ("POST", "/api/runs"), ("GET", "/api/runs/x"), ("GET", "/api/runs/x/events"),
             ("POST", "/api/runs/x/stop"), ("DELETE", "/api/runs/x"), ("GET", "/api/runs/x/artifacts"),
             ("GET", "/api/nodes"), ("GET", "/api/files"), ("POST", "/api/files/upload"),
             ("POST", "/api/graphs/validate"), ("GET", "/ws/runs/x")]


@pytest.mark.parametrize("method, path", PROTECTED)
def test_routes_need_the_session_token(server: ServerProc, method: str, path: str) -> None:
    """foundation (GEN-08): API routes answer 401 without the session token and
    with a wrong one, in the error shape; nothing is created."""
    before = len(server.call("GET", "/api/runs"))
    body = b"{}" if method in ("POST", "PUT") else None
    for token in (False, "wrong-" + uuid.uuid4().hex, ""):
        r = server.raw(method, path, body, token=token, headers={"Content-Type": "application/json"})
        assert r.status == 401, (token, r.status, r.body[:200])
        assert error_of(r.json())["code"] == "unauthorized"
    assert len(server.call("GET", "/api/runs")) == before


def test_token_and_open_routes(server: ServerProc) -> None:
    """foundation: /api/health is open; /api/auth/bootstrap gives the session token
    to loopback clients; the token works as header and as ?token=; the token file
    is private (0600)."""
    st, health = server.api("GET", "/api/health", token=False)
    assert st == 200 and health["status"] == "ok" and health["version"]
    st, boot = server.api("GET", "/api/auth/bootstrap", token=False)
    assert st == 200 and boot["token"] == server.token
    r = server.raw("GET", f"/api/runs?token={boot['token']}", token=False)
    assert r.status == 200
    mode = stat.S_IMODE((server.user_data / "session-token").stat().st_mode)
    assert mode == 0o600, oct(mode)


@pytest.mark.parametrize("host, ok", [
    ("evil.example:80", False),
    ("evil.example", False),
    ("gpu-gw.lan:9000", False),
    ("gpu-gw.lan", False),
    ("cp-1234abcd.invalid:18000", False),
    (EXTRA_HOST, True),
    ("localhost:{port}", True),
    ("127.0.0.1:{port}", True),
    ("localhost", True),
])
def test_host_allowlist(server: ServerProc, host: str, ok: bool) -> None:
    """CONN-04, CONN-05, CONN-06, API-12: a Host outside the allowlist is answered
    421 (even on open routes); localhost and CODEFYUI_EXTRA_ALLOWED_HOSTS are accepted."""
    h = host.format(port=server.port)
    for path, token in (("/api/health", False), ("/api/runs", True)):
        r = server.raw("GET", path, token=token, headers={"Host": h})
        if ok:
            assert r.status == 200, (h, path, r.status, r.body[:200])
        else:
            assert r.status == 421, (h, path, r.status, r.body[:200])
            err = error_of(r.json())
            assert "CODEFYUI_EXTRA_ALLOWED_HOSTS" in err.get("hint", "") + err["message"]


# -- paths --------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "data/files/../../../etc/passwd",
                                  "data/../../etc/passwd"])
def test_node_path_traversal_refused(server: ServerProc, path: str) -> None:
    """foundation (one safe-join for every outside path): a CSVReader reading outside
    the installation fails with a clear 'refused' error and never reads the file."""
    # File params are resolved where the run executes (a worker resolves them in its
    # own data folder), so the submit is accepted and the run refuses the path.
    st, body = server.api("POST", "/api/runs", {"graph": csv_print_graph(path)})
    assert st == 201, body
    run = wait_run(server, body["id"])
    assert run["status"] == "failed"
    assert "refused" in run["error"], run["error"]
    evs = server.events(run["id"])
    assert not any(e["kind"] == "node_status" and e["data"]["status"] == "done" and e["data"]["node_id"] == "csv"
                   for e in evs)
    assert "root:" not in json.dumps(evs)


def test_writer_path_traversal_refused(server: ServerProc) -> None:
    """foundation: ModelSaver writing outside its models folder fails with
    'refused' and creates no file outside the data folder."""
    layers = next(n for n in load_example()["nodes"] if n["type"] == "SequentialModel")["data"]["params"]["layers"]
    name = f"escape-{uuid.uuid4().hex[:8]}.pt"
    g = graph([node("start", "Start"), node("model", "SequentialModel", layers=layers),
               node("save", "ModelSaver", path=f"../../{name}", save_mode="state_dict", format="pytorch")],
              [trig("start", "model"), edge("model", "model", "save", "model")])
    st, body = server.api("POST", "/api/runs", {"graph": g})
    assert st == 201, body  # refused where the run executes, as for reads
    run = wait_run(server, body["id"])
    assert run["status"] == "failed", run
    assert run["error"] == (f"node 'save' (ModelSaver) failed: PathRefused: path '../../{name}' refused: "
                            "'..' is not allowed (use a relative path inside the folder, without '..')"), run
    assert not list(server.tmp.parent.rglob(name)), "a file was written outside the models folder"


@pytest.mark.parametrize("filename, code", [
    ("../evil-{u}.csv", "path_refused"), ("..\\evil-{u}.csv", "path_refused"), ("/tmp/evil-{u}.csv", "path_refused"),
    ("sub/evil-{u}.csv", "path_refused"), ("..", "path_refused"),
    ("evil-{u}\x01.csv", "bad_upload"),  # a control character is not a path problem: the name is malformed
])
def test_upload_name_traversal_refused(server: ServerProc, filename: str, code: str) -> None:
    """foundation: an upload whose name is not one plain file name is a 400, and
    no file is written anywhere (inside or outside the files folder)."""
    u = uuid.uuid4().hex[:8]
    name = filename.format(u=u)
    st, body = server.upload("files", name, b"a,b\n1,2\n")
    assert st == 400, (name, st, body)
    assert error_of(body)["code"] == code, body
    assert not list(server.tmp.parent.rglob(f"evil-{u}*")), "an upload escaped or was stored"
    assert not Path(f"/tmp/evil-{u}.csv").exists()
    assert not [p for p in (server.data_dir / "files").iterdir() if p.name.startswith(".upload-")]


@pytest.mark.parametrize("kind, name", [
    ("files", "..%2F..%2Fetc%2Fpasswd"),
    ("files", "..%2F..%2F..%2F..%2F..%2F..%2Fetc%2Fpasswd"),
    ("files", "%2Fetc%2Fpasswd"),
    ("files", "sub/..%2F..%2F..%2Fetc%2Fpasswd"),
    ("models", "..%2F..%2F..%2F..%2Fetc%2Fpasswd"),
    ("images", "%2E%2E/%2E%2E/%2E%2E/etc/passwd"),
    ("files", "link-to-passwd"),
    ("files", "link-to-root/etc/passwd"),
])
def test_download_traversal_refused(server: ServerProc, kind: str, name: str) -> None:
    """foundation: download names that leave their folder (encoded '..', absolute,
    symlinks planted inside the folder) answer 400 path_refused, never the file."""
    files = server.data_dir / "files"
    for link, target in (("link-to-passwd", "/etc/passwd"), ("link-to-root", "/")):
        if not (files / link).is_symlink():
            os.symlink(target, files / link)
    r = server.raw("GET", f"/api/{kind}/download/{name}")
    assert r.status == 400 and error_of(r.json())["code"] == "path_refused", (r.status, r.body[:200])
    assert b"root:" not in r.body


def test_oversize_upload_refused_and_old_file_kept(server: ServerProc) -> None:
    """CFG-09, foundation: an upload over CODEFYUI_MAX_UPLOAD_SIZE is a 413 in the
    error shape; the stored file of the same name is untouched and no partial
    file is left."""
    small = b"a,b\n" + b"1,2\n" * 50
    assert len(small) < LIMIT
    st, body = server.upload("files", "keep.csv", small)
    assert st == 201, body
    assert body["sha256"] == hashlib.sha256(small).hexdigest()
    big = b"a,b\n" + b"3,4\n" * 2000
    assert len(big) > LIMIT
    st, body = server.upload("files", "keep.csv", big)
    assert st == 413, (st, body)
    err = error_of(body)
    assert err["code"] == "too_large" and "CODEFYUI_MAX_UPLOAD_SIZE" in err["message"]
    assert (server.data_dir / "files" / "keep.csv").read_bytes() == small
    # Far over the limit: refused from Content-Length alone, same answer.
    st, body = server.upload("files", "keep.csv", b"5,6\n" * 500_000)
    assert st == 413 and error_of(body)["code"] == "too_large", (st, body)
    assert (server.data_dir / "files" / "keep.csv").read_bytes() == small
    assert server.raw("GET", "/api/files/download/keep.csv").body == small
    assert not [p for p in (server.data_dir / "files").iterdir() if p.name.startswith(".upload-")]
    # Exactly at the limit is allowed.
    exact = b"x" * LIMIT
    st, body = server.upload("files", "exact.bin", exact)
    assert st == 201 and body["size"] == LIMIT, body


# -- secrets ------------------------------------------------------------------------------------
class Recorder(http.server.BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []
    answer = 200

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        type(self).requests.append({"path": self.path, "headers": dict(self.headers.items()), "body": body})
        self.send_response(type(self).answer)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"received": true}')

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def webhook_receiver() -> Iterator[tuple[str, type[Recorder]]]:
    handler = type("Rec", (Recorder,), {"requests": [], "answer": 200})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def secret_node_type(server: ServerProc) -> tuple[str, str]:
    for n in server.call("GET", "/api/nodes")["nodes"]:
        for p in n["params"]:
            if p["type"] == "secret" and "url" in {q["name"] for q in n["params"]}:
                return n["type"], p["name"]
    pytest.fail("no node type with a url and a `secret` param in GET /api/nodes (the webhook node)")


def assert_secret_nowhere(server: ServerProc, run_id: str, secret: str) -> None:
    needle = secret.encode()
    db = server.db_path
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(db) + suffix)
        if p.exists():
            assert needle not in p.read_bytes(), f"the secret is in {p.name}"
    assert secret not in server.log_text(), "the secret is in the server log"
    assert files_containing(server.user_data, needle) == [], "the secret is in a file under user data"
    assert files_containing(server.data_dir, needle) == [], "the secret is in a file under the data dir"
    for path in (f"/api/runs/{run_id}/events", f"/api/runs/{run_id}", "/api/runs",
                 f"/api/runs/{run_id}/artifacts"):
        assert secret not in server.raw("GET", path).body.decode(), f"the secret is in GET {path}"


def test_secret_param_used_but_never_stored(server: ServerProc, webhook_receiver) -> None:
    """TRUST-23, foundation (secrets): the webhook node's secret reaches the
    webhook's request header, but appears nowhere in the sqlite files (db, -wal,
    -shm), the server log, run logs, files, or the API."""
    url, rec = webhook_receiver
    ntype, pname = secret_node_type(server)
    secret = "sk-test-" + uuid.uuid4().hex
    g = start_then(ntype, "hook", url=url + "/hook", message="run finished", **{pname: secret})
    run = wait_run(server, server.submit(g)["id"])
    assert run["status"] == "succeeded", run["error"]
    assert len(rec.requests) == 1, rec.requests
    req = rec.requests[0]
    assert req["path"] == "/hook"
    assert secret in " ".join(req["headers"].values()), "the webhook did not receive the secret"
    assert req["headers"].get("Authorization") == f"Bearer {secret}"
    assert secret.encode() not in req["body"], "the secret leaked into the webhook payload"
    assert json.loads(req["body"])["message"] == "run finished"
    assert_secret_nowhere(server, run["id"], secret)


def test_secret_not_leaked_by_a_failing_run(server: ServerProc, webhook_receiver) -> None:
    """TRUST-23, foundation (secrets): when the webhook answers 500 the run fails
    with an error that names the problem, and the secret is still nowhere."""
    url, rec = webhook_receiver
    rec.answer = 500
    ntype, pname = secret_node_type(server)
    secret = "sk-fail-" + uuid.uuid4().hex
    g = start_then(ntype, "hook", url=url + "/fails", **{pname: secret})
    run = wait_run(server, server.submit(g)["id"])
    assert run["status"] == "failed"
    assert "500" in run["error"]
    assert len(rec.requests) == 1 and secret in json.dumps(rec.requests[0]["headers"])
    assert_secret_nowhere(server, run["id"], secret)
