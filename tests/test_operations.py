"""Running an install over time (docs/operations.md): the settings file and `cdui config`, the log file's
rotation and SIGHUP reopen, and `cdui backup` / `cdui restore` on a server that writes a burst of events.

Everything goes through the launcher a user types (bin/cdui), against one real background server
(`bin/cdui start`, which logs to <user data>/cdui.log through the rotating handler) shared by the module.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdui.core import logfile
from cdui.plane.store import backup as db_backup
from cdui.wire import protocol
from procs import REPO_ROOT, Proc, ServerProc, env_for, free_port, track_log, wait_for

BIN = str(REPO_ROOT / "bin" / "cdui")
LOG_MAX = 4000
LOG_COUNT = 2
BURST = 10_000

# Logs at least BURST events, then goes on logging until the test creates the file RELEASE (after its
# backup ended), so the server is writing events for the whole time the backup runs.
BURST_NODE = '''
import os, time
from cdui.nodes.base import Node, Param, Port


class Burst(Node):
    NODE_NAME = "Burst"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("count", "int", 1000)]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        i = 0
        while i < int(params["count"]) or not os.path.exists(RELEASE):
            ctx.log(f"event {i}")
            i += 1
            if i % 100 == 0:
                time.sleep(0.002)  # a steady stream rather than one batch: the backup runs inside it
        return {"value": float(i)}
'''


def cdui(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([BIN, *args], env=env, cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"cdui {' '.join(args)} exited {r.returncode}: {r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def bg(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A background server (`bin/cdui start`), its environment and a handle to call its API."""
    tmp = tmp_path_factory.mktemp("ops")
    release = tmp / "release"
    data = tmp / "data"
    (data / "custom_nodes").mkdir(parents=True)
    (data / "custom_nodes" / "burst.py").write_text(BURST_NODE.replace("RELEASE", repr(str(release))))
    (data / "graphs").mkdir()
    (data / "graphs" / "mine.json").write_text('{"nodes": []}\n')
    port = free_port()
    env = env_for(tmp / "ud", data, {"CODEFYUI_LOG_MAX_BYTES": str(LOG_MAX),
                                     "CODEFYUI_LOG_BACKUP_COUNT": str(LOG_COUNT)})
    track_log(tmp / "ud" / "cdui.log", "background server")
    cdui(env, "start", "--port", str(port))
    srv = ServerProc(tmp, port=port, user_data=tmp / "ud", data_dir=data)  # its HTTP helpers; started above
    try:
        yield {"env": env, "srv": srv, "tmp": tmp, "release": release}
    finally:
        cdui(env, "stop", check=False)


def _pid(ud: Path) -> int:
    return int((ud / "cdui.pid").read_text())


@pytest.mark.e2e  # a real background server
def test_log_rotates_keeping_the_configured_count_and_reopens_on_sighup(bg: Any) -> None:
    ud = bg["srv"].user_data
    log = ud / "cdui.log"
    pid = _pid(ud)
    # Each SIGHUP logs a line, which is how this test makes the log grow until it rotated more times than
    # it keeps files.
    def rotated_past_count() -> bool:
        os.kill(pid, signal.SIGHUP)
        return (ud / f"cdui.log.{LOG_COUNT}").exists() and log.stat().st_size < LOG_MAX / 2
    wait_for(rotated_past_count, 120, 0.02, "the log to rotate twice")
    for _ in range(60):  # well past LOG_COUNT more rotations' worth of lines
        os.kill(pid, signal.SIGHUP)
    wait_for(lambda: log.read_text().count("SIGHUP") >= 1, 60, 0.1, "a SIGHUP line in the log")
    names = sorted(p.name for p in ud.iterdir() if p.name.startswith("cdui.log"))
    assert names == ["cdui.log"] + [f"cdui.log.{i}" for i in range(1, LOG_COUNT + 1)], names
    for p in ud.glob("cdui.log*"):
        assert p.stat().st_size <= LOG_MAX + 200, p
        assert p.stat().st_mode & 0o777 == 0o600, p
    # What logrotate does without copytruncate: rename the file, then SIGHUP the process.
    moved = ud / "cdui.log.logrotate"
    os.rename(log, moved)
    os.kill(pid, signal.SIGHUP)
    wait_for(lambda: log.exists() and "SIGHUP: reopened" in log.read_text(), 60, 0.1,
             "the server to log into a new cdui.log after the rename and SIGHUP")
    assert log.stat().st_mode & 0o777 == 0o600
    moved.unlink()
    # `cdui logs -n 1` prints the last line of that log.
    out = cdui(bg["env"], "logs", "--lines", "1").stdout
    assert out.count("\n") == 1 and out.strip() == log.read_text().splitlines()[-1]


@pytest.mark.e2e  # a real agent connected to the background server
def test_a_workers_log_is_read_over_its_connection(bg: Any) -> None:
    srv, env, tmp = bg["srv"], bg["env"], bg["tmp"]
    token = srv.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)["token"]
    agent = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", srv.url, "--token", token,
                  "--name", "w1", "--devices", "cpu", "--foreground"],
                 env_for(tmp / "agent-ud", tmp / "agent-data"), tmp / "agent.log", name="agent-w1")
    agent.spawn()
    try:
        def online() -> bool:
            assert agent.alive, agent.log_tail(20)
            return any(w["name"] == "w1" and w["online"] for w in srv.call("GET", "/api/workers")["workers"])
        wait_for(online, 120, 0.2, "worker w1 online")
        # The agent logs to stderr here (no --log-file, as under systemd); its lines still come back.
        out = cdui(env, "logs", "--worker", "w1", "--lines", "3").stdout.splitlines()
        assert 1 <= len(out) <= 3
        written = agent.log_text().splitlines()
        assert all(line in written for line in out), (out, written[-10:])
        r = cdui(env, "logs", "--worker", "nobody", check=False)
        assert r.returncode == 1 and "nobody" in r.stderr
    finally:
        agent.stop()


def test_logs_follow_reads_every_line_across_rotations(tmp_path: Path) -> None:
    """`cdui logs --follow` (a real process) on a log that the real handler rotates three times while it
    reads: every line comes once, in order, the tails of the rotated files included."""
    ud = tmp_path / "ud"
    ud.mkdir()
    handler = logfile.LogFile(ud / "cdui.log", 600, 2, take_std=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    lg = logging.getLogger("test.follow")
    lg.propagate = False
    lg.addHandler(handler)
    lg.setLevel(logging.INFO)
    lg.info("before")
    follower = Proc([BIN, "logs", "--follow", "--lines", "1"], env_for(ud), tmp_path / "follow.out", name="follow")
    follower.spawn()
    try:
        def printed() -> list[str]:
            return [ln for ln in follower.log_text().splitlines() if ln.startswith(("before", "line "))]
        wait_for(lambda: printed() == ["before"], 60, 0.1, "the follower to print the last line")
        rolls: list[int] = []
        rollover = handler.doRollover
        handler.doRollover = lambda: (rolls.append(1), rollover())[1]  # type: ignore[method-assign]
        for step in range(8):  # each batch ends in a file the follower reads before the next is written
            for i in range(step * 10, step * 10 + 10):
                lg.info("line %03d %s", i, "x" * 20)
            wait_for(lambda n=step * 10 + 10: len(printed()) == n + 1, 60, 0.05, f"line {step * 10 + 9}")
        assert printed() == ["before"] + [f"line {i:03d} {'x' * 20}" for i in range(80)]
        assert len(rolls) >= 3, "the log should have been rotated at least three times"
    finally:
        follower.stop()
        lg.removeHandler(handler)
        handler.close()


def test_a_log_answer_over_its_bounds_is_refused() -> None:
    ok = {"type": "log_answer", "request_id": "r", "lines": ["x" * 100] * 10, "first": 1, "last": 10}
    assert isinstance(protocol.parse_agent_message(json.dumps(ok)), protocol.LogAnswer)
    for bad in ({"lines": ["x"] * (protocol.LOG_MAX_LINES + 1)},
                {"lines": ["x" * (protocol.LOG_LINE_CHARS + 1)]},
                {"lines": ["x" * protocol.LOG_LINE_CHARS] * (protocol.LOG_ANSWER_CHARS // protocol.LOG_LINE_CHARS
                                                             + 1)}):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_agent_message(json.dumps({**ok, **bad}))


def _events_seen(srv: ServerProc, run_id: str, after: int) -> int:
    """The highest seq the server answers for ``run_id`` (committed events), paging on from ``after``."""
    while True:
        r = srv.raw("GET", f"/api/runs/{run_id}/events?after={after}&limit=10000")
        assert r.status == 200, r.body[:200]
        events = r.json()
        if events:
            after = events[-1]["seq"]
        if "X-CodefyUI-Next-After" not in r.headers:
            return after


@pytest.mark.e2e  # a real background server and a run
def test_backup_during_a_burst_restores_every_acknowledged_event(bg: Any) -> None:
    srv, env, tmp = bg["srv"], bg["env"], bg["tmp"]
    graph = {"format_version": 1, "name": "burst", "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "b", "type": "Burst", "position": {"x": 0, "y": 0}, "data": {"params": {"count": BURST}}}],
        "edges": [{"id": "t", "source": "start", "sourceHandle": "trigger", "target": "b", "targetHandle": None,
                   "type": "trigger"}]}
    run_id = srv.call("POST", "/api/runs", {"graph": graph, "options": {}})["id"]
    seen = wait_for(lambda: (n := _events_seen(srv, run_id, 0)) >= 2000 and n, 120, 0.1,
                    "the burst to be under way")
    acked = _events_seen(srv, run_id, seen)  # every event the server answers is committed
    # A published app version's kept weights (cdui/plane/apps.py) and the plugin packs' lockfile are in a
    # backup (the database names the first, graphs need the packs); other models are not.
    kept = srv.data_dir / "models" / "app-weights" / ("ab" * 32) / "w.pt"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"weights of a published version")
    (srv.data_dir / "models" / "trained.pt").write_bytes(b"a model users copy with their file backup")
    lock = srv.user_data / "plugins" / "installed.json"
    lock.parent.mkdir()
    lock.write_text('{"version": 1, "plugins": {}}\n')
    dest = tmp / "backup1"
    cdui(env, "backup", str(dest))
    copy = dest / "user-data" / "cdui.sqlite3"
    in_copy = db_backup.count_events(copy, run_id)
    assert in_copy >= acked, "an event acknowledged before the backup began is missing from it"
    # The burst went on past the snapshot: the copy was taken while the server wrote.
    wait_for(lambda: _events_seen(srv, run_id, in_copy) > in_copy, 120, 0.1, "events after the snapshot")
    bg["release"].write_text("")
    wait_for(lambda: srv.call("GET", f"/api/runs/{run_id}")["status"] == "succeeded", 120, 0.2, "the run to end")
    total = _events_seen(srv, run_id, 0)
    assert total > in_copy >= BURST // 5
    assert db_backup.check_database(copy) == ("ok", db_backup.schema_version_known())
    manifest = json.loads((dest / "manifest.json").read_text())
    paths = {f["path"] for f in manifest["files"]}
    assert {"user-data/cdui.sqlite3", "data/graphs/mine.json", "user-data/port", "user-data/plugins/installed.json",
            f"data/models/app-weights/{'ab' * 32}/w.pt"} <= paths, paths
    assert "data/models/trained.pt" not in paths
    assert not any("session-token" in p for p in paths), "the session token must never be in a backup"

    # While the server is up, restore refuses and names its pid.
    r = cdui(env, "restore", str(dest), check=False)
    assert r.returncode == 1 and f"pid {_pid(srv.user_data)}" in r.stderr and "nothing was restored" in r.stderr
    cdui(env, "stop")

    # A tampered backup is refused before anything is replaced.
    tampered = tmp / "tampered"
    shutil.copytree(dest, tampered)
    (tampered / "data" / "graphs" / "mine.json").write_text('{"nodes": ["changed"]}\n')
    before = {p: p.read_bytes() for p in srv.user_data.iterdir() if p.is_file()}
    r = cdui(env, "restore", str(tampered), check=False)
    assert r.returncode == 1 and "does not match the sha256" in r.stderr and "nothing was replaced" in r.stderr
    assert {p: p.read_bytes() for p in srv.user_data.iterdir() if p.is_file()} == before
    assert not list(srv.user_data.glob("replaced-*"))
    # A database in the backup whose manifest hashes agree but whose pages are damaged is refused too.
    broken = tmp / "broken"
    shutil.copytree(dest, broken)
    db = broken / "user-data" / "cdui.sqlite3"
    raw = bytearray(db.read_bytes())
    raw[len(raw) // 2: len(raw) // 2 + 4096] = b"\x55" * 4096
    db.write_bytes(bytes(raw))
    mf = json.loads((broken / "manifest.json").read_text())
    for f in mf["files"]:
        if f["path"] == "user-data/cdui.sqlite3":
            f["sha256"] = hashlib.sha256(db.read_bytes()).hexdigest()
    (broken / "manifest.json").write_text(json.dumps(mf))
    r = cdui(env, "restore", str(broken), check=False)
    assert r.returncode == 1 and "integrity check" in r.stderr, r.stderr

    # Stopped, the backup restores; what it replaced is kept aside.
    (srv.data_dir / "graphs" / "mine.json").write_text('{"nodes": ["edited after the backup"]}\n')
    shutil.rmtree(srv.data_dir / "models" / "app-weights")
    lock.unlink()
    cdui(env, "restore", str(dest))
    assert kept.read_bytes() == b"weights of a published version"
    assert lock.read_text() == '{"version": 1, "plugins": {}}\n'
    assert db_backup.check_database(srv.db_path) == ("ok", db_backup.schema_version_known())
    assert db_backup.count_events(srv.db_path, run_id) == in_copy
    assert not (srv.user_data / "cdui.sqlite3-wal").exists()
    assert (srv.data_dir / "graphs" / "mine.json").read_text() == '{"nodes": []}\n'
    aside = next(srv.user_data.glob("replaced-*"))
    assert "edited after the backup" in (aside / "data" / "graphs" / "mine.json").read_text()
    con = sqlite3.connect(aside / "user-data" / "cdui.sqlite3")
    try:  # the replaced database is whole (its WAL was moved beside it)
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] >= 1
    finally:
        con.close()
    # The restored server starts and serves the run as the backup saw it, ended now (its process is gone).
    cdui(env, "start", "--port", str(srv.port))
    try:
        run = srv.call("GET", f"/api/runs/{run_id}")
        assert run["status"] == "interrupted", run
        events = srv.call("GET", f"/api/runs/{run_id}/events?after={in_copy - 1}")
        assert [e["seq"] for e in events][:1] == [in_copy]
    finally:
        cdui(env, "stop")


@pytest.mark.e2e  # the background server (restarted by the test above)
def test_backup_into_a_folder_keeps_the_newest(bg: Any) -> None:
    env, tmp = bg["env"], bg["tmp"]
    into = tmp / "nightly"
    into.mkdir()
    (into / "cdui-notes").mkdir()  # not a backup: never removed
    for _ in range(3):
        cdui(env, "backup", "--into", str(into), "--keep", "2")
    made = sorted(p.name for p in into.iterdir())
    assert len(made) == 3 and made[-1] == "cdui-notes", made
    for name in made[:2]:
        assert name.startswith("cdui-20") and (into / name / "manifest.json").is_file()
    r = cdui(env, "backup", check=False)
    assert r.returncode == 2 and "--into" in r.stderr


def test_the_backup_timer_runs_a_command_cdui_accepts() -> None:
    import configparser

    from cdui.cli.cli import build_parser
    units = {}
    for name in ("codefyui-backup.service", "codefyui-backup.timer"):
        unit = configparser.ConfigParser(interpolation=None, strict=False)
        unit.optionxform = str  # type: ignore[assignment,method-assign]
        unit.read_string((REPO_ROOT / "deploy" / name).read_text())
        units[name] = unit
    svc = units["codefyui-backup.service"]["Service"]
    argv = svc["ExecStart"].split()
    assert argv[0] == "/opt/codefyui/bin/cdui" and svc["Type"] == "oneshot" and svc["User"] == "codefyui"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "backup" and args.into and args.keep >= 1
    assert units["codefyui-backup.timer"]["Timer"]["OnCalendar"]


def test_config_shows_sources_and_masks_secrets(tmp_path: Path) -> None:
    secret = tmp_path / "s3-secret"
    secret.write_text("very-secret-value\n")
    secret.chmod(0o600)
    conf = tmp_path / "cdui.env"
    conf.write_text("# lab settings\nCODEFYUI_STOP_GRACE_S=7\nCODEFYUI_CANVAS_MAX_PROCESSES='3'\n"
                    f"CODEFYUI_S3_SECRET_ACCESS_KEY_FILE={secret}\nCDUI_NO_INSTALL=1\n")
    env = env_for(tmp_path / "ud", extra={"CODEFYUI_CONFIG": str(conf), "CODEFYUI_CANVAS_MAX_PROCESSES": "2"})
    out = cdui(env, "config").stdout
    lines = {ln.split(" = ")[0].strip(): ln for ln in out.splitlines() if " = " in ln}
    assert f"# settings file: {conf}" in out
    assert lines["CODEFYUI_STOP_GRACE_S"].endswith(f"= 7  [file {conf}]")
    assert lines["CODEFYUI_CANVAS_MAX_PROCESSES"].endswith("= 2  [env]"), "the environment overrides the file"
    assert lines["CODEFYUI_SHUTDOWN_GRACE_S"].endswith("= 10.0  [default]")
    assert "= ****  [file" in lines["CODEFYUI_S3_SECRET_ACCESS_KEY"]
    assert "very-secret-value" not in out
    as_json = json.loads(cdui(env, "config", "--json").stdout)
    assert {r["name"]: r["source"] for r in as_json["settings"]}["CODEFYUI_CONFIG"] == "env"

    # A secret file other users may read is refused, naming the file, its mode and the fix.
    secret.chmod(0o644)
    r = cdui(env, "config", check=False)
    assert r.returncode == 2 and f"chmod 600 {secret}" in r.stderr and "0644" in r.stderr, r.stderr
    secret.chmod(0o600)
    # A line that is not a setting is refused with its number; a misspelt name is warned about.
    conf.write_text("CODEFYUI_STOP_GRACE_S=7\nstop grace seven\nCODEFYUI_STOP_GRACE=1\n")
    r = cdui(env, "config", check=False)
    assert r.returncode == 2 and f"{conf} line 2 is not a setting" in r.stderr, r.stderr
    conf.write_text("CODEFYUI_STOP_GRACE=1\n")
    r = cdui(env, "config", "--changed")
    assert "did you mean CODEFYUI_STOP_GRACE_S?" in r.stderr
    assert "CODEFYUI_SHUTDOWN_GRACE_S" not in r.stdout
