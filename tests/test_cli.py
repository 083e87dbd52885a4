"""The `cdui` command line as a user runs it (`python -m cdui ...`), with its
own user data dir: version, usage errors, start/stop in the background, run
(with --wait and with every validation error listed), api, status."""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import (
    REPO_ROOT,
    broken_iris,
    csv_print_graph,
    env_for,
    free_port,
    pid_alive,
    track_log,
    untrack_log,
    wait_for,
)

# These tests run the launcher or the CLI as a user does, in real processes: the e2e tier.
pytestmark = pytest.mark.e2e

VERSION_RE = re.compile(r"^cdui \d+\.\d+\.\d+$")


class Cli:
    """Runs `python -m cdui` with this test module's user data and data dirs."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.user_data = tmp / "user_data"
        self.data_dir = tmp / "data"
        self.env = env_for(self.user_data, self.data_dir)
        self.port = free_port()

    def __call__(self, *args: str, timeout: float = 300, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cdui", *args], env=self.env, cwd=str(cwd), text=True,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def server_pid(self) -> int | None:
        try:
            pid = int((self.user_data / "cdui.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(self.url + "/api/health", timeout=2) as r:
                return json.loads(r.read())
        except OSError:
            return None


def explain(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("cdui: error: "), stderr
    return lines[0]


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    c = Cli(tmp_path_factory.mktemp("cli"))
    log = c.user_data / "cdui.log"
    track_log(log, "cdui start (background)")
    try:
        yield c
    finally:
        untrack_log(log)
        pid = c.server_pid()
        if pid:
            try:
                c("stop", timeout=60)
            except subprocess.TimeoutExpired:
                pass
            if pid_alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


# -- without a server ---------------------------------------------------------------------
def test_version(cli: Cli) -> None:
    """`cdui --version` prints `cdui X.Y.Z`, the version /api/health reports."""
    r = cli("--version")
    assert r.returncode == 0, explain(r)
    assert VERSION_RE.match(r.stdout.strip()), r.stdout
    from cdui import __version__
    assert r.stdout.strip() == f"cdui {__version__}"


@pytest.mark.parametrize("args", [["--bogus-flag"], ["start", "--port", "not-a-port"], ["run"],
                                  ["no-such-command"], ["run", "g.json", "--wait=maybe"], ["api", "GET"]])
def test_bad_usage_exits_2(cli: Cli, args: list[str]) -> None:
    """Bad usage exits 2 with one `cdui: error:` line on stderr."""
    r = cli(*args)
    assert r.returncode == 2, explain(r)
    line = one_error_line(r.stderr)
    assert "--help" in line


def test_commands_without_a_server(cli: Cli) -> None:
    """With nothing running, `cdui api` and `cdui run`
    exit 1 with an error saying how to start the server; `cdui status --once`
    exits 1; `cdui stop` says it is not running."""
    graph = cli.tmp / "quick.json"
    graph.write_text(json.dumps(csv_print_graph()))
    for args in (["api", "GET", "/api/runs"], ["run", str(graph)]):
        r = cli(*args)
        assert r.returncode == 1, explain(r)
        assert "cdui start" in one_error_line(r.stderr)
    r = cli("status", "--once")
    assert r.returncode == 1 and "not running" in r.stdout, explain(r)
    r = cli("stop")
    assert r.returncode == 0 and "not running" in r.stdout, explain(r)


# -- with a server started by `cdui start` ------------------------------------------------------
@pytest.fixture(scope="module")
def started(cli: Cli) -> Cli:
    r = cli("start", "--port", str(cli.port), timeout=180)
    assert r.returncode == 0, explain(r)
    assert cli.url in r.stdout, r.stdout
    return cli


def test_start_in_background(started: Cli) -> None:
    """`cdui start --port P` returns once the server answers, printing its
    URL; the server keeps running in the background on 127.0.0.1; a second
    `cdui start` reports the running one."""
    cli = started
    pid = cli.server_pid()
    assert pid, "no live pid in cdui.pid after `cdui start`"
    health = cli.health()
    assert health and health["status"] == "ok", health
    info = json.loads((cli.user_data / "server.json").read_text())
    assert info["url"] == cli.url and info["pid"] == pid
    other = free_port()
    r = cli("start", "--port", str(other))
    assert (r.returncode, r.stdout) == (1, ""), explain(r)
    assert r.stderr == (f"cdui: error: cdui is already running at {cli.url} (pid {pid}), on port {cli.port}, not "
                        f"{other} (from --port): stop it first with `cdui stop`, then `cdui start --port {other}`\n")
    r = cli("start")  # the port `start --port` remembered is the one it runs on
    assert r.returncode == 0, explain(r)
    assert "already running" in r.stdout and cli.url in r.stdout, r.stdout
    assert cli.server_pid() == pid
    r = cli("status", "--once")
    assert r.returncode == 0 and cli.url in r.stdout and "ok" in r.stdout, explain(r)


def test_run_wait_follows_to_success(started: Cli) -> None:
    """`cdui run examples/iris_train.json --wait` prints the
    run id, follows its progress (epoch and loss lines) and exits 0; `cdui api
    GET /api/runs/<id>` prints the run as JSON with `succeeded`."""
    cli = started
    r = cli("run", "examples/iris_train.json", "--wait")
    assert r.returncode == 0, explain(r)
    lines = r.stdout.splitlines()
    run_id = lines[0].strip()
    assert re.fullmatch(r"[0-9a-f]{8,}", run_id), lines[:3]
    epoch_lines = [ln for ln in lines if "epoch" in ln and "loss" in ln]
    assert len(epoch_lines) >= 20, r.stdout[-2000:]
    assert "status: succeeded" in r.stdout
    a = cli("api", "GET", f"/api/runs/{run_id}")
    assert a.returncode == 0, explain(a)
    run = json.loads(a.stdout)
    assert run["id"] == run_id and run["status"] == "succeeded"
    missing = cli("api", "GET", "/api/runs/nope")
    assert missing.returncode == 1, explain(missing)
    assert json.loads(missing.stdout)["error"]["code"] == "not_found"


def test_run_failing_graph_exits_1(started: Cli) -> None:
    """`cdui run --wait` of a run that fails exits 1 and shows the error."""
    cli = started
    g = cli.tmp / "missing-file.json"
    g.write_text(json.dumps(csv_print_graph("data/files/not-uploaded.csv")))
    r = cli("run", str(g), "--wait")
    assert r.returncode == 1, explain(r)
    assert "status: failed" in r.stdout and "not-uploaded.csv" in r.stdout


def test_run_invalid_graph_lists_every_error(started: Cli) -> None:
    """`cdui run bad.json` exits 1 and lists every validation error
    on stderr (the same ones the API reports); nothing is queued."""
    cli = started
    bad = cli.tmp / "bad.json"
    bad.write_text(json.dumps(broken_iris()))
    before = len(json.loads(cli("api", "GET", "/api/runs?limit=10000").stdout))
    r = cli("run", str(bad))
    assert r.returncode == 1, explain(r)
    first = one_error_line(r.stderr)
    m = re.search(r"(\d+) error", first)
    assert m, first
    items = [ln for ln in r.stderr.splitlines() if ln.startswith("  - ")]
    assert len(items) == int(m.group(1)) >= 6, r.stderr
    v = cli("api", "POST", "/api/graphs/validate", json.dumps({"graph": broken_iris()}))
    assert v.returncode == 0, explain(v)
    errors = json.loads(v.stdout)["errors"]
    assert len(errors) == len(items)
    for e in errors:
        assert any(e["message"] in ln for ln in items), e
    for node_id in ("ghost", "train", "norm", "optimizer", "lonely-print"):
        assert any(f"node {node_id}:" in ln for ln in items), node_id
    assert r.stdout == ""
    assert len(json.loads(cli("api", "GET", "/api/runs?limit=10000").stdout)) == before
    r = cli("run", str(cli.tmp / "does-not-exist.json"))
    assert r.returncode == 1 and "cannot read graph file" in one_error_line(r.stderr), explain(r)
    (cli.tmp / "notjson.json").write_text("{nope")
    r = cli("run", str(cli.tmp / "notjson.json"))
    assert r.returncode == 1 and "not valid JSON" in one_error_line(r.stderr), explain(r)


def test_run_refusals_are_one_line(started: Cli) -> None:
    """The launcher a user types (bin/cdui) prints a refusal as the one `cdui: error:` line, never a traceback:
    a device no machine has, and a worker no one enrolled (more shapes: tests/inproc/test_cli_errors.py)."""
    g = started.tmp / "refused.json"
    g.write_text(json.dumps(csv_print_graph()))
    for args, line in (
            (["--device", "cuda:-1"], "cdui: error: device 'cuda:-1' is not valid (use cpu, cuda, cuda:N or auto)"),
            (["--target", "nosuch"], "cdui: error: no worker named 'nosuch' is enrolled (enrolled workers: none; add "
                                     "one with `cdui workers token`)")):
        r = subprocess.run([str(REPO_ROOT / "bin" / "cdui"), "run", str(g), *args], env=started.env,
                           cwd=str(REPO_ROOT), text=True, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
        assert (r.returncode, r.stdout, r.stderr) == (1, "", line + "\n"), explain(r)


def test_run_json_and_api_body(started: Cli) -> None:
    """`cdui run --json` prints the run object; `cdui api METHOD PATH
    BODY` sends the body; a body that is not JSON is bad usage (exit 2)."""
    cli = started
    g = cli.tmp / "quick.json"
    g.write_text(json.dumps(csv_print_graph()))
    r = cli("run", str(g), "--json", "--target", "local", "--device", "cpu")
    assert r.returncode == 0, explain(r)
    run = json.loads(r.stdout)
    # Its status at submit races the scheduler; the final status is asserted below.
    assert run["options"]["device"] == "cpu"

    def finished() -> bool:
        a = cli("api", "GET", f"/api/runs/{run['id']}")
        return json.loads(a.stdout)["status"] in ("succeeded", "failed", "cancelled", "interrupted")
    wait_for(finished, 120, 0.5, "the --json run to finish")
    a = cli("api", "GET", f"/api/runs/{run['id']}")
    assert json.loads(a.stdout)["status"] == "succeeded"
    a = cli("api", "POST", "/api/runs", "{not json")
    assert a.returncode == 2, explain(a)
    assert "JSON" in one_error_line(a.stderr)
    a = cli("api", "POST", "/api/runs", json.dumps({"graph": {"nodes": []}}))
    assert a.returncode == 1, explain(a)
    assert json.loads(a.stdout)["error"]["code"] == "invalid_graph"


def test_stop(started: Cli) -> None:
    """`cdui stop` stops the background server; afterwards nothing answers
    and `cdui status --once` exits 1."""
    cli = started
    pid = cli.server_pid()
    assert pid
    r = cli("stop", timeout=120)
    assert r.returncode == 0, explain(r)
    assert "stopped" in r.stdout
    wait_for(lambda: not pid_alive(pid), 30, 0.1, f"server pid {pid} to exit")
    assert cli.health() is None
    assert not (cli.user_data / "cdui.pid").exists()
    r = cli("status", "--once")
    assert r.returncode == 1, explain(r)


def test_start_listens_on_the_remembered_port_or_codefyui_port(started: Cli) -> None:
    """After `cdui start --port P` (the module's server), a plain `cdui start` listens on P again;
    CODEFYUI_PORT comes before that remembered port; a port that is not one is refused."""
    cli = started
    assert cli("stop", timeout=120).returncode == 0  # test_stop may have stopped it already
    assert (cli.user_data / "port").read_text() == f"{cli.port}\n"
    r = cli("start", timeout=180)
    assert r.returncode == 0 and f"running at {cli.url} " in r.stdout, explain(r)
    assert cli("stop", timeout=120).returncode == 0
    other = free_port()
    cli.env["CODEFYUI_PORT"] = str(other)
    try:
        r = cli("start", timeout=180)
        assert r.returncode == 0 and f"running at http://127.0.0.1:{other} " in r.stdout, explain(r)
        assert cli("stop", timeout=120).returncode == 0
        assert (cli.user_data / "port").read_text() == f"{cli.port}\n"  # only --port is remembered
        cli.env["CODEFYUI_PORT"] = "70000"
        r = cli("start")
        assert r.returncode == 2 and r.stderr.startswith("cdui: error: CODEFYUI_PORT='70000' is not valid: expected "
                                                         "a port number from 1 to 65535"), explain(r)
    finally:
        del cli.env["CODEFYUI_PORT"]
    r = cli("start", "--port", "0")
    assert r.returncode == 2 and "port '0' is not a port number from 1 to 65535" in r.stderr, explain(r)


def test_session_token_file_keeps_the_token_across_restarts(tmp_path: Path) -> None:
    """CODEFYUI_SESSION_TOKEN_FILE: the first start writes a token there (0600), the next start uses it again,
    `cdui token` prints it; a file other users may read stops the start with what to do."""
    cli = Cli(tmp_path)
    token_file = tmp_path / "lab-token"
    cli.env["CODEFYUI_SESSION_TOKEN_FILE"] = str(token_file)
    r = cli("token")
    assert r.returncode == 1 and r.stderr.startswith("cdui: error: cdui is not running for the user data folder "), \
        explain(r)
    try:
        tokens = []
        for _ in range(2):
            r = cli("start", "--port", str(cli.port), timeout=180)
            assert r.returncode == 0, explain(r)
            r = cli("token")
            assert r.returncode == 0, explain(r)
            tokens.append(r.stdout.strip())
            assert (f"fixed by CODEFYUI_SESSION_TOKEN_FILE={token_file}: it outlives restarts, so a bookmark of "
                    f"{cli.url}/?token=TOKEN keeps working") in r.stderr, explain(r)
            assert cli("stop", timeout=120).returncode == 0
        assert tokens[0] == tokens[1] == token_file.read_text().strip()
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        os.chmod(token_file, 0o640)
        r = cli("start", "--port", str(cli.port), timeout=180)
        assert r.returncode == 1, explain(r)
        assert (f"cdui: error: CODEFYUI_SESSION_TOKEN_FILE={token_file} may be read by other users (mode 0640): "
                f"whoever reads the token owns this server (make it the owner's alone with `chmod 600 "
                f"{token_file}` and start again)") in r.stderr, explain(r)
        assert cli.health() is None
    finally:
        pid = cli.server_pid()
        if pid:
            cli("stop", timeout=60)


# -- settings that do nothing are said to do nothing ------------------------------------------
def _sources_reading_settings() -> str:
    """The code that can read a setting: the package (config.py without its table) and the launchers."""
    texts = []
    for p in sorted((REPO_ROOT / "cdui").rglob("*.py")):
        t = p.read_text(encoding="utf-8")
        if p.name == "config.py" and p.parent.name == "cdui":
            start = t.index("SETTINGS: list[Setting] = [")
            t = t[:start] + t[t.index("\n]\n", start):]
        texts.append(t)
    texts += [(REPO_ROOT / f).read_text(encoding="utf-8") for f in ("bin/cdui", "install.sh")]
    return "\n".join(texts)


def test_every_setting_is_read_or_marked_unavailable() -> None:
    """A setting in the table is either read by some code, or marked available=False
    (and then really read by nothing, so the mark goes away when the feature comes)."""
    from cdui.core.config import SETTINGS
    src = _sources_reading_settings()
    unread = [s.name for s in SETTINGS if s.available and s.name not in src]
    assert unread == [], f"settings nothing reads; implement them or mark them available=False: {unread}"
    read_but_marked = [s.name for s in SETTINGS if not s.available and s.name in src]
    assert read_but_marked == [], f"settings marked unavailable that code reads; drop the mark: {read_but_marked}"


def test_unavailable_setting_warns_at_server_start(tmp_path: Path) -> None:
    """Starting the server logs one warning per set setting this version does not implement,
    and none for an implemented one (the recorded-output settings were the last marked ones)."""
    from cdui import __version__
    from cdui.core.config import SETTINGS, warn_unavailable
    from procs import ServerProc
    marked = [s.name for s in SETTINGS if not s.available]
    env = {name: "1" for name in marked} | {"CODEFYUI_RUN_OUTPUT_STORE_MAX_MB": "100",
                                           "CODEFYUI_WORKER_OUTPUT_FETCH_TIMEOUT_S": "30"}
    s = ServerProc(tmp_path, extra_env=env).start()
    try:
        lines = [ln.split(": ", 1)[1] for ln in s.log_text().splitlines() if "WARNING cdui.plane.server:" in ln]
        assert lines == [f"`{name}` is set but not available in this version of cdui ({__version__}); it has no "
                         f"effect (unset it; see docs/configuration.md)" for name in marked], s.log_tail()
        assert warn_unavailable(logging.getLogger("test"), env) == marked
    finally:
        s.stop()


def test_ca_fingerprint_refused_when_malformed_or_on_plain_http(cli: Cli) -> None:
    """A pin that is not sha256:<64 hex>, or one given for an http:// address (where nothing would check it),
    is refused (exit 2) before any enrollment."""
    r = cli("agent", "start", "--control", "https://127.0.0.1:9", "--token", "abcdef.0123456789abcdef",
            "--ca-fingerprint", "sha256:" + "ab" * 31)
    assert r.returncode == 2, explain(r)
    assert r.stderr.startswith(f"cdui: error: --ca-fingerprint 'sha256:{'ab' * 31}' is not a key fingerprint "
                               f"(write it as sha256:<64 hex characters>; "), explain(r)
    r = cli("agent", "start", "--control", "http://127.0.0.1:9", "--token", "abcdef.0123456789abcdef",
            "--ca-fingerprint", "sha256:" + "ab" * 32)
    assert r.returncode == 2, explain(r)
    assert r.stderr == ("cdui: error: --ca-fingerprint pins a TLS certificate, but --control http://127.0.0.1:9 is "
                        "not an https:// address\n"), explain(r)
    assert not (cli.user_data / "agent").exists()
