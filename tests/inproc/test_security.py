"""Security properties of the control plane: the session token, the Host
allowlist, paths from outside (node params, upload names, download names),
the upload size limit, and SECRET params that must never be stored. The
control plane runs in this process; the e2e tests, which run graphs, use a
real server process."""
from __future__ import annotations

import hashlib
import http.server
import json
import os
import stat
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from threaded import InProcServer

from cdui.graph.secrets import MIN_SECRET_LEN, fill_secrets, redact_text, redact_value, short_secrets, split_secrets
from cdui.nodes.registry import build_registry
from procs import ServerProc, csv_print_graph, edge, graph, load_example, node, start_then, trig, wait_run

EXTRA_HOST = "gpu-gw.lan:8000"
LIMIT = 1000


# The webhook receivers here are on loopback, which a graph's Webhook may call only where allowed.
SETTINGS = {"CODEFYUI_EXTRA_ALLOWED_HOSTS": EXTRA_HOST, "CODEFYUI_MAX_UPLOAD_SIZE": str(LIMIT),
            "CODEFYUI_NODE_NET_ALLOW_LOCAL": "*"}


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """The control plane in this process; with ``IN_A_PROCESS`` a real server process, since a
    secret must be absent from everything that process wrote, its log (stderr) included."""
    tmp = tmp_path_factory.mktemp("sec")
    if getattr(request, "param", None) == "process":
        s: ServerProc = ServerProc(tmp, name="security-server-proc", extra_env=SETTINGS)
    else:
        s = InProcServer(tmp, name="security-server", extra_env=SETTINGS)
    try:
        s.start()
        yield s
    finally:
        s.stop()


# For the e2e tests: `server` is a real server process (set up with the module, before the
# per-test sweep of leftover processes looks, so the sweep leaves it alone).
IN_A_PROCESS = pytest.mark.parametrize("server", ["process"], indirect=True)


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
    """API routes answer 401 without the session token and
    with a wrong one, in the error shape; nothing is created."""
    before = len(server.call("GET", "/api/runs"))
    body = b"{}" if method in ("POST", "PUT") else None
    for token in (False, "wrong-" + uuid.uuid4().hex, ""):
        r = server.raw(method, path, body, token=token, headers={"Content-Type": "application/json"})
        assert r.status == 401, (token, r.status, r.body[:200])
        assert error_of(r.json())["code"] == "unauthorized"
    assert len(server.call("GET", "/api/runs")) == before


def test_token_and_open_routes(server: ServerProc) -> None:
    """/api/health is open; /api/auth/bootstrap gives the session token
    to loopback clients of the server's own OS user; the token works as header
    (?token= is tested in test_owner.py); the token file is private (0600)."""
    st, health = server.api("GET", "/api/health", token=False)
    assert st == 200 and health["status"] == "ok" and health["version"]
    st, boot = server.api("GET", "/api/auth/bootstrap", token=False)
    assert st == 200 and boot["token"] == server.token
    r = server.raw("GET", "/api/runs", token=boot["token"])
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
    """DNS rebinding: a Host outside the allowlist is answered
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
@pytest.mark.parametrize("path", ["../../etc/passwd", "data/files/../../../etc/passwd", "data/../../etc/passwd"])
@pytest.mark.e2e  # a real run subprocess on a real server
@IN_A_PROCESS
def test_node_path_traversal_refused(server: ServerProc, path: str) -> None:
    """One safe-join for every outside path: a CSVReader reading outside
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


@IN_A_PROCESS
def test_an_absolute_node_path_outside_the_read_roots_is_refused_at_submit(server: ServerProc) -> None:
    """An absolute path is read only under CODEFYUI_READ_ROOTS (none by default), and a local run's
    machine is known at submit, so the refusal comes before anything is stored or run."""
    before = server.api("GET", "/api/runs")[1]
    st, body = server.api("POST", "/api/runs", {"graph": csv_print_graph("/etc/passwd")})
    assert st == 400, body
    assert error_of(body)["code"] == "path_not_readable"
    assert "'/etc/passwd'" in error_of(body)["message"] and "CODEFYUI_READ_ROOTS" in error_of(body)["hint"]
    assert server.api("GET", "/api/runs")[1] == before


@pytest.mark.e2e  # a real run subprocess on a real server
@IN_A_PROCESS
def test_writer_path_traversal_refused(server: ServerProc) -> None:
    """ModelSaver writing outside its models folder fails with
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
    """An upload whose name is not one plain file name is a 400, and
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
    """Download names that leave their folder (encoded '..', absolute,
    symlinks planted inside the folder) answer 400 path_refused, never the file."""
    files = server.data_dir / "files"
    for link, target in (("link-to-passwd", "/etc/passwd"), ("link-to-root", "/")):
        if not (files / link).is_symlink():
            os.symlink(target, files / link)
    r = server.raw("GET", f"/api/{kind}/download/{name}")
    assert r.status == 400 and error_of(r.json())["code"] == "path_refused", (r.status, r.body[:200])
    assert b"root:" not in r.body


def test_oversize_upload_refused_and_old_file_kept(server: ServerProc) -> None:
    """An upload over CODEFYUI_MAX_UPLOAD_SIZE is a 413 in the
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


@pytest.mark.e2e  # a real run subprocess on a real server
@IN_A_PROCESS
def test_secret_param_used_but_never_stored(server: ServerProc, webhook_receiver) -> None:
    """Secrets: the webhook node's secret reaches the
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


@pytest.mark.e2e  # a real run subprocess on a real server
@IN_A_PROCESS
def test_secret_not_leaked_by_a_failing_run(server: ServerProc, webhook_receiver) -> None:
    """Secrets: when the webhook answers 500 the run fails
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


# -- secrets inside presets, at every depth ----------------------------------------------------
def secret_forms(secret: str) -> list[bytes]:
    """Every way a secret could sit in a file: raw UTF-8, JSON-escaped (ASCII and not), repr."""
    forms = {secret.encode(), json.dumps(secret)[1:-1].encode(), json.dumps(secret, ensure_ascii=False)[1:-1].encode(),
             repr(secret)[1:-1].encode(), secret.encode("unicode_escape")}
    return sorted(forms)


def assert_secret_nowhere_in_any_form(server: ServerProc, run_id: str, secret: str) -> None:
    db = server.db_path
    files = [Path(str(db) + s) for s in ("", "-wal", "-shm")]
    files += [server.log_path, *server.user_data.rglob("*"), *server.data_dir.rglob("*")]
    for needle in secret_forms(secret):
        for p in files:
            if p.is_file() and not p.is_symlink():
                assert needle not in p.read_bytes(), f"the secret is in {p} (as {needle!r})"
        for path in (f"/api/runs/{run_id}/events", f"/api/runs/{run_id}", "/api/runs"):
            assert needle not in server.raw("GET", path).body, f"the secret is in GET {path} (as {needle!r})"


def nested_preset_graph(ntype: str, pname: str, url: str, used: str, default: str) -> dict[str, Any]:
    """Start -> preset "outer" -> preset "inner" -> the webhook node. The inner preset's own
    params carry ``default``; the outer preset overrides it with ``used`` through its inner
    preset node's ``internalParams`` (two levels of nesting, all embedded in the graph)."""
    inner = {"preset_name": "hook-inner", "nodes": [
        {"id": "hook", "type": ntype, "data": {"params": {"url": url, "message": "nested", pname: default}}}],
        "edges": []}
    outer = {"preset_name": "hook-outer", "nodes": [
        {"id": "mid", "type": "preset:hook-inner", "data": {"params": {}, "internalParams": {"hook": {pname: used}}}}],
        "edges": []}
    g = graph([node("start", "Start"),
               {"id": "p", "type": "preset:hook-outer", "data": {"params": {}, "internalParams": {}}}],
              [trig("start", "p")], name="nested secret")
    g["presets"] = [inner, outer]
    return g


@pytest.mark.e2e  # a real run subprocess on a real server
@IN_A_PROCESS
def test_secret_inside_nested_presets_used_but_never_stored(server: ServerProc, webhook_receiver) -> None:
    """A secret two presets deep reaches the webhook, and neither it nor the preset's own
    (overridden) default is in the database, WAL, logs, files or events, in any encoding."""
    url, rec = webhook_receiver
    ntype, pname = secret_node_type(server)
    used, default = "sk-nest-" + uuid.uuid4().hex, "sk-default-" + uuid.uuid4().hex
    run = wait_run(server, server.submit(nested_preset_graph(ntype, pname, url + "/nested", used, default))["id"])
    assert run["status"] == "succeeded", run["error"]
    assert [r["headers"].get("Authorization") for r in rec.requests] == [f"Bearer {used}"]
    for secret in (used, default):
        assert_secret_nowhere_in_any_form(server, run["id"], secret)


@pytest.mark.e2e  # a real run subprocess on a real server
@IN_A_PROCESS
def test_secret_with_escaped_characters_is_masked(server: ServerProc, webhook_receiver) -> None:
    """Accents, quotes, a backslash, a tab and a newline change a secret's JSON form; it is
    masked anyway. A newline cannot go into an HTTP header, so the run fails with an error
    that would quote the key; the key is masked there too."""
    url, rec = webhook_receiver
    ntype, pname = secret_node_type(server)
    secret = 'sk-é"q\\b\tü\nz-' + uuid.uuid4().hex
    run = wait_run(server, server.submit(nested_preset_graph(ntype, pname, url + "/x", secret, "sk-d-xyz1"))["id"])
    assert run["status"] == "failed", run
    assert "Webhook" in run["error"], run["error"]
    assert rec.requests == []
    assert_secret_nowhere_in_any_form(server, run["id"], secret)


def test_secret_too_short_to_mask_is_refused_at_submit(server: ServerProc, webhook_receiver) -> None:
    url, _ = webhook_receiver
    ntype, pname = secret_node_type(server)
    before = len(server.call("GET", "/api/runs"))
    st, body = server.api("POST", "/api/runs", {"graph": nested_preset_graph(ntype, pname, url, "Q7z", "sk-d-xyz1")})
    assert st == 400, body
    err = error_of(body)
    assert err["code"] == "secret_too_short"
    assert "shorter than 4 characters" in err["message"]
    assert f"internalParams.hook.{pname}" in err["message"], err["message"]
    assert "Q7z" not in json.dumps(body)
    assert len(server.call("GET", "/api/runs")) == before


# -- split and mask, as pure functions --------------------------------------------------------------
def hook(nid: str, key: str, **params: Any) -> dict[str, Any]:
    return {"id": nid, "type": "Webhook", "data": {"params": {"url": "http://127.0.0.1:9/x", "api_key": key, **params}}}


def preset_def(name: str, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"preset_name": name, "nodes": nodes, "edges": []}


def test_split_secrets_at_every_depth() -> None:
    """Every place a secret-typed param can get its value from is blanked in the stored
    copy, and fill_secrets puts each back at the same place."""
    reg = build_registry()
    g = graph([node("start", "Start"),
               {"id": "top", "type": "preset:L1",
                "data": {"params": {}, "internalParams": {"mid": {"api_key": "sk-top-override-on-a-preset"}}}},
               {"id": "lib", "type": "preset:Installed", "data": {"params": {}}}],
              [trig("start", "top"), trig("start", "lib")])
    g["presets"] = [
        preset_def("L3", [hook("h3", "sk-depth-three", message="sk-depth-three")]),  # also in a plain param
        preset_def("L2", [{"id": "deep", "type": "preset:L3",
                           "data": {"internalParams": {"h3": {"api_key": "sk-l2-overrides-l3"}}}},
                          {"id": "h2", "type": "Webhook", "params": {"url": "http://x", "api_key": "sk-bare-params"}}]),
        preset_def("L1", [{"id": "mid", "type": "preset:L2", "data": {"params": {}, "internalParams": {}}}]),
    ]
    library = {"Installed": preset_def("Installed", [hook("hi", "sk-from-an-installed-file")])}
    stored, found = split_secrets(g, reg, library)
    text = json.dumps(stored)
    for secret in ("sk-depth-three", "sk-l2-overrides-l3", "sk-bare-params", "sk-top-override-on-a-preset"):
        assert secret not in text, secret
        assert secret in json.dumps(g), "split_secrets changed the caller's graph"
    assert fill_secrets(stored, found) == g
    # The installed preset is not part of this copy: its key is masked, never put anywhere.
    assert ([], "sk-from-an-installed-file") in found
    assert short_secrets(found) == []


@pytest.mark.parametrize("secret", ['sk-é"q\\b\tü\nz-1234', "naïve-ключ-🔑", "it's \"quoted\"", "abcd",
                                    "line-one-long\nline-two-long"])
def test_masking_works_on_values_in_every_encoding(secret: str) -> None:
    secrets = [(["x"], secret)]
    data = {"message": f"key={secret};", secret: "as a key", "list": [secret, {"deep": secret}]}
    masked = redact_value(data, secrets)
    encoded = json.dumps(masked) + json.dumps(masked, ensure_ascii=False)
    for form in (secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1], repr(secret)[1:-1]):
        assert form not in encoded
    assert masked["message"] == "key=***;" and masked["***"] == "as a key"
    # Text that already holds an escaped copy (a traceback, an encoded line) is masked too.
    for text in (json.dumps(data), json.dumps(data, ensure_ascii=False), repr(data), repr(secret.encode())):
        out = redact_text(text, secrets)
        assert secret not in out and json.dumps(secret)[1:-1] not in out and repr(secret)[1:-1] not in out, out
    # A run's stderr is read line by line: each long enough line of a multi-line secret is masked.
    for line in secret.splitlines():
        if len(line) >= MIN_SECRET_LEN:
            assert redact_text(f"printed {line}!", secrets) == "printed ***!"


def test_secrets_shorter_than_the_minimum_are_listed_for_refusal() -> None:
    found = [(["a"], "abc"), (["b"], "abcd"), (["c"], 12)]
    assert short_secrets(found) == [["a"], ["c"]]
    # Unmasked below the minimum: masking "abc" would blank it inside every ordinary word.
    assert redact_text("abc abcd", found) == "abc ***"
