"""Only the owner is the owner: on a shared machine another local OS user must
not get the session token, read the database or logs, or use a node path to
read the user data folder; the token does not travel in URLs or cookies
where it need not; the page cannot be framed and API answers are not cached.

Real servers on loopback; the other OS user is a real process running as
``nobody`` (the tests run as root, so they can start one)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdui.core.peercred import decode_address, parse_proc_net
from procs import REPO_ROOT, ServerProc, edge, env_for, graph, load_example, node, trig, wait_run

# Every test here starts real cdui processes (servers, agents or run subprocesses) and checks what
# they do on the machine: the e2e tier.
pytestmark = pytest.mark.e2e

NOBODY = 65534

# -- the /proc/net/tcp parser, as a table ---------------------------------------------------------
# Captured on a little-endian Linux: a listener on port 0xB8E3 (47331) of "::", an IPv4 client from
# 127.0.0.1:0xEAAE (60078) and an IPv6 client from [::1]:0x8378 (33656). The client rows are made
# uid 1000 here; the server's own accepted rows stay uid 0, so matching the wrong direction shows.
TCP4 = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   4: 0100007F:EAAE 0100007F:B8E3 01 00000000:00000000 00:00000000 00000000  1000        0 11620 2 0000000037fed9ee 20 0 0 10 -1
""".splitlines()
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:B8E3 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11619 1 000000003f25e7d5 100 0 0 10 0
   1: 0000000000000000FFFF00000100007F:B8E3 0000000000000000FFFF00000100007F:EAAE 01 00000000:00000000 00:00000000 00000000     0        0 11621 1 000000008f794b45 20 0 0 10 -1
   2: 00000000000000000000000001000000:B8E3 00000000000000000000000001000000:8378 01 00000000:00000000 00:00000000 00000000     0        0 11623 1 00000000e60d444c 20 0 0 10 -1
   3: 00000000000000000000000001000000:8378 00000000000000000000000001000000:B8E3 01 00000000:00000000 00:00000000 00000000  1000        0 11622 2 00000000f4cb7205 20 0 0 10 -1
   9: 0000000000000000FFFF00000100007F:9C40 0000000000000000FFFF00000100007F:B8E3 01 00000000:00000000 00:00000000 00000000  2000        0 11630 2 00000000f4cb7206 20 0 0 10 -1
   garbage line that is not a socket
""".splitlines()


@pytest.mark.parametrize("lines, client, server, uid", [
    (TCP4, ("127.0.0.1", 60078), ("127.0.0.1", 47331), 1000),
    # The server listens on "::" and sees the IPv4 client as IPv4-mapped IPv6; its row is in tcp.
    (TCP4, ("::ffff:127.0.0.1", 60078), ("::ffff:127.0.0.1", 47331), 1000),
    # The mirror row (local = server) belongs to the server: asking the other way round finds it.
    (TCP6, ("::ffff:127.0.0.1", 47331), ("127.0.0.1", 60078), 0),
    (TCP6, ("::1", 33656), ("::1", 47331), 1000),
    (TCP6, ("::1%lo", 33656), ("::1", 47331), 1000),
    # An IPv6 socket that connected to an IPv4-mapped address: its row is in tcp6, mapped.
    (TCP6, ("127.0.0.1", 40000), ("127.0.0.1", 47331), 2000),
    (TCP4 + TCP6, ("127.0.0.1", 1), ("127.0.0.1", 47331), None),
    (TCP4, ("127.0.0.1", 60078), ("127.0.0.1", 47332), None),
    ([], ("127.0.0.1", 60078), ("127.0.0.1", 47331), None),
])
def test_proc_net_tcp_parser(lines: list[str], client: tuple[str, int], server: tuple[str, int],
                             uid: int | None) -> None:
    """Bootstrap's owner check: the uid of the client's own socket row, IPv4 and IPv6."""
    assert parse_proc_net(lines, client, server, byteorder="little") == uid


def test_proc_net_address_byte_order() -> None:
    assert decode_address("0100007F:1F90", "little") == (decode_address("7F000001:1F90", "big")[0], 8080)
    assert str(decode_address("0000000000000000FFFF00000100007F:0050", "little")[0]) == "127.0.0.1"
    with pytest.raises(ValueError):
        decode_address("0100007F", "little")


# -- a real server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    s = ServerProc(tmp_path_factory.mktemp("owner"), name="owner-server")
    try:
        s.start()
        yield s
    finally:
        s.stop()


CLIENT = """
import json, sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=60) as r:
        print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
"""


def get_as(uid: int | None, url: str) -> tuple[int, dict]:
    """GET ``url`` from a separate process, as OS user ``uid`` (None: as this user)."""
    cmd = [sys.executable, "-c", CLIENT, url]
    if uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    return res["status"], json.loads(res["body"])


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to act as another OS user")
def test_bootstrap_only_for_the_servers_os_user(server: ServerProc) -> None:
    """Another local user reaches loopback too; the token goes only to the server's own user."""
    url = server.url + "/api/auth/bootstrap"
    status, body = get_as(NOBODY, url)
    assert status == 403, body
    assert body["error"]["code"] == "not_owner"
    # The refusal names no user, uid or path (the asker may be a network client behind a proxy);
    # the owner's log does.
    assert "uid" not in json.dumps(body) and "session-token" not in json.dumps(body), body
    assert "user that started the server" in body["error"]["hint"]
    assert "uid 65534" in server.log_text() and "uid 0" in server.log_text()
    assert server.token not in json.dumps(body)
    status, body = get_as(None, url)
    assert status == 200 and body == {"token": server.token}
    # The server kept serving the refused user's neighbours.
    assert server.api("GET", "/api/health", token=False)[0] == 200


class Ipv6Server(ServerProc):
    @property
    def url(self) -> str:
        return f"http://[::1]:{self.port}"


@pytest.mark.skipif(os.getuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv to act as another OS user")
def test_bootstrap_over_ipv6(tmp_path: Path) -> None:
    """Listening on ::1, the client's socket is found in /proc/net/tcp6."""
    s = Ipv6Server(tmp_path, name="ipv6", host="::1")
    try:
        s.start()
        status, body = get_as(NOBODY, s.url + "/api/auth/bootstrap")
        assert status == 403 and body["error"]["code"] == "not_owner", body
        assert get_as(None, s.url + "/api/auth/bootstrap") == (200, {"token": s.token})
    finally:
        s.stop()


def test_query_token_only_on_websocket_and_download_routes(server: ServerProc) -> None:
    """A URL lands in history and logs: ?token= opens only what a browser cannot call with a header."""
    t = server.token
    r = server.raw("GET", f"/api/runs?token={t}", token=False)
    assert r.status == 401
    err = r.json()["error"]
    assert err["code"] == "unauthorized" and "?token=" in err["message"]
    assert "X-CodefyUI-Token" in err["hint"]
    # Accepted: the routes answer for the thing asked (404: no such run or file), not 401.
    for path in ("/ws/runs/nosuchrun", "/api/files/download/nosuch.csv",
                 "/api/runs/nosuchrun/artifacts/1/download"):
        r = server.raw("GET", f"{path}?token={t}", token=False)
        assert r.status == 404, (path, r.status, r.body[:200])
        assert server.raw("GET", path, token=False).status == 401, path


def test_no_cookie_carries_the_token(server: ServerProc) -> None:
    r = server.raw("GET", "/api/runs", token=False, headers={"Cookie": f"cdui_token={server.token}"})
    assert r.status == 401, r.body[:200]


def test_page_cannot_be_framed_and_api_answers_are_not_cached(server: ServerProc) -> None:
    for path in ("/", "/web/app.js"):
        r = server.raw("GET", path, token=False)
        assert r.status == 200, path
        assert r.headers.get("X-Frame-Options") == "DENY", (path, r.headers)
        assert r.headers.get("Content-Security-Policy") == "frame-ancestors 'none'", (path, r.headers)
        assert r.headers.get("X-Content-Type-Options") == "nosniff", (path, r.headers)
    for path, token in (("/api/auth/bootstrap", False), ("/api/runs", True), ("/api/runs", False),
                        ("/api/health", False)):
        r = server.raw("GET", path, token=token)
        assert r.headers.get("Cache-Control") == "no-store", (path, r.status, r.headers)


# -- file modes ------------------------------------------------------------------------------------
def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def model_saver_graph(path: str) -> dict:
    layers = next(n for n in load_example()["nodes"] if n["type"] == "SequentialModel")["data"]["params"]["layers"]
    return graph([node("start", "Start"), node("model", "SequentialModel", layers=layers),
                  node("save", "ModelSaver", path=path, save_mode="state_dict", format="pytorch")],
                 [trig("start", "model"), edge("model", "model", "save", "model")])


def test_user_data_and_its_files_are_private(tmp_path: Path) -> None:
    """Started by `cdui start` (daemonised) under a permissive umask, after a run:
    the folder is 0700 and the database, WAL, SHM, server log and run log 0600;
    the model the run saved keeps the user's umask."""
    ud = tmp_path / "ud"
    ud.mkdir(mode=0o755)
    os.chmod(ud, 0o755)  # an older folder with wide bits gets tightened
    data = tmp_path / "data"
    s = ServerProc(tmp_path, name="modes", user_data=ud, data_dir=data)
    env = env_for(ud, data)
    old = os.umask(0o022)
    try:
        out = subprocess.run([sys.executable, "-m", "cdui", "start", "--port", str(s.port)], env=env,
                             capture_output=True, text=True, timeout=180, cwd=str(tmp_path))
    finally:
        os.umask(old)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        run = wait_run(s, s.submit(model_saver_graph("modes/model.pt"))["id"])
        assert run["status"] == "succeeded", run["error"]
        # What the run wrote is the user's ordinary file, under the user's own umask.
        assert mode(data / "models" / "modes" / "model.pt") == 0o644
        run_logs = list((ud / "logs" / "runs").glob("*.log"))
        assert run_logs, "the run wrote no log under logs/runs/"
        assert mode(ud) == 0o700
        for p in [ud / "cdui.sqlite3", ud / "cdui.sqlite3-wal", ud / "cdui.sqlite3-shm", ud / "cdui.log",
                  ud / "session-token", *run_logs]:
            assert p.exists(), p
            assert mode(p) == 0o600, (p.name, oct(mode(p)))
    finally:
        subprocess.run([sys.executable, "-m", "cdui", "stop"], env=env, capture_output=True, timeout=120)


def test_agent_user_data_and_log_are_private(server: ServerProc, tmp_path: Path) -> None:
    """A daemonised `cdui agent start` under a permissive umask: its folder is 0700 and its
    log and credential 0600, their folder 0700."""
    ud = tmp_path / "agent-ud"
    ud.mkdir(mode=0o755)
    os.chmod(ud, 0o755)
    env = env_for(ud, tmp_path / "agent-data")
    tok = server.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    old = os.umask(0o022)
    try:
        out = subprocess.run([sys.executable, "-m", "cdui", "agent", "start", "--control", server.url, "--name",
                              "modes", "--token", tok, "--devices", "cpu"], env=env, capture_output=True, text=True,
                             timeout=180, cwd=str(tmp_path))
    finally:
        os.umask(old)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        assert "connected" in out.stdout, out.stdout + out.stderr
        assert mode(ud) == 0o700
        cred = ud / "agent" / f"127.0.0.1-{server.port}.token"
        assert mode(cred.parent) == 0o700
        for p in (ud / "agent.log", cred):
            assert mode(p) == 0o600, (p.name, oct(mode(p)))
    finally:
        subprocess.run([sys.executable, "-m", "cdui", "agent", "stop"], env=env, capture_output=True, timeout=120)


# -- node file params and the user data folder -------------------------------------------------------
@pytest.fixture
def server_in_install(tmp_path: Path) -> Iterator[tuple[ServerProc, str]]:
    """A server whose user data folder sits inside the installation root, as the default
    ``<install>/.codefyui_dev`` does (a unique name, so parallel runs do not share it)."""
    name = f".codefyui_dev-test-{uuid.uuid4().hex[:8]}"
    ud = REPO_ROOT / name
    s = ServerProc(tmp_path, name="install-ud", user_data=ud)
    try:
        s.start()
        yield s, name
    finally:
        s.stop()
        shutil.rmtree(ud, ignore_errors=True)


def reader_graph(path: str) -> dict:
    return graph([node("s", "Start"), node("r", "FileReader", path=path), node("p", "Print", label="got")],
                 [trig("s", "r"), edge("r", "text", "p", "value")])


def test_file_params_cannot_read_the_user_data_folder(server_in_install: tuple[ServerProc, str]) -> None:
    s, name = server_in_install
    token = s.token
    link = s.data_dir / "files" / "tok.txt"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(s.user_data / "session-token")
    inside = "it leads into the user data folder"
    for path, why in ((f"{name}/session-token", inside), (f"{name}/cdui.sqlite3", inside),
                      (f"./{name}//session-token", inside), (name, inside),
                      ("data/files/tok.txt", inside)):
        run = wait_run(s, s.submit(reader_graph(path))["id"])
        assert run["status"] == "failed", (path, run)
        assert f"path {path!r} refused: {why}" in run["error"], run["error"]
        assert token not in json.dumps(s.events(run["id"])), path
    assert token not in s.log_text()
    for p in (s.user_data / "logs" / "runs").glob("*.log"):
        assert token not in p.read_text(errors="replace"), p
    # A file the user put in data/files is still read.
    (s.data_dir / "files" / "fine.txt").write_text("hello")
    run = wait_run(s, s.submit(reader_graph("data/files/fine.txt"))["id"])
    assert run["status"] == "succeeded", run["error"]
