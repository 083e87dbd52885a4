"""SSH workers, the pure part: the exact ssh argv and stdin, the remote scripts as sent,
the names, the slots and what an ended ssh means, as tables (cdui/plane/ssh/ssh.py)."""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdui.core.errors import CduiError
from cdui.plane.ssh import ssh

IID, SLOT = "3f9a12c4", 18000
DIR = "/home/alice/.codefyui-ssh/3f9a12c4-18000"
COMMON = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=15"]


@pytest.mark.parametrize("target, extra", [
    (ssh.Target("alice@gpu-box"), ["-o", "StrictHostKeyChecking=accept-new"]),
    (ssh.Target("alice@gpu-box", port=22), ["-o", "StrictHostKeyChecking=accept-new"]),
    (ssh.Target("alice@gpu-box", port=2222), ["-o", "StrictHostKeyChecking=accept-new", "-p", "2222"]),
    (ssh.Target("alice@gpu-box", identity="/k/id"), ["-o", "StrictHostKeyChecking=accept-new", "-i", "/k/id"]),
    (ssh.Target("alice@gpu-box", port=2200, identity="/k/id", strict="yes"),
     ["-o", "StrictHostKeyChecking=yes", "-p", "2200", "-i", "/k/id"]),
])
def test_tunnel_command_shape(target: ssh.Target, extra: list[str]) -> None:
    cmd = ssh.tunnel_command(target, IID, SLOT, DIR, "/tmp/cdui-ssh-k2j4/s", "~/CodefyUI/bin/cdui", "gpu-box")
    assert cmd.argv[:len(COMMON) + len(extra)] == COMMON + extra
    rest = cmd.argv[len(COMMON) + len(extra):]
    # The remote login shell gets one constant line; the script, with its values, comes on stdin.
    assert rest == ["-R", f"{DIR}/sock:/tmp/cdui-ssh-k2j4/s", "--", "alice@gpu-box", ssh.REMOTE_COMMAND]
    script = ssh.tunnel_script(IID, SLOT, "~/CodefyUI/bin/cdui", "gpu-box")
    assert cmd.stdin == f"{len(script.encode())}\n".encode() + script.encode()
    assert ("    SLOT_DIR='.codefyui-ssh/3f9a12c4-18000'\n    URL='http://cp-3f9a12c4.invalid:18000'\n"
            "    CDUI='~/CodefyUI/bin/cdui'\n    NAME='gpu-box'\n}\n") in script
    assert ('"$cdui" \\\n        agent start --uds "$d/sock" --foreground --control "$URL" --name "$NAME" &'
            in script)
    assert script.index('PATH="$HOME/.local/bin:$PATH"') < script.index("agent start")


def test_short_command_has_no_forward() -> None:
    cmd = ssh.short_command(ssh.Target("gpu-box", port=2222), "echo hi")
    assert cmd.argv == COMMON + ["-o", "StrictHostKeyChecking=accept-new", "-p", "2222",
                                 "-o", "ClearAllForwardings=yes", "--", "gpu-box", ssh.REMOTE_COMMAND]
    assert cmd.stdin == b"7\necho hi"


def test_the_remote_command_is_one_constant_line() -> None:
    """What the remote login shell parses (sh, bash, zsh, fish, csh alike): one line, no value in
    it, nothing those shells read inside single quotes (csh: no newline, fish: no backslash)."""
    assert shlex.split(ssh.REMOTE_COMMAND) == ["sh", "-c", ssh.BOOTSTRAP]
    assert not re.search(r"[\n\\!]", ssh.BOOTSTRAP) and "'" not in ssh.BOOTSTRAP
    # docs/ssh-workers.md shows it as a shell word of the ssh command.
    doc = (Path(__file__).parent.parent / "docs" / "ssh-workers.md").read_text()
    assert [ssh.REMOTE_COMMAND] in [shlex.split(line) for line in doc.splitlines() if line.startswith("    'sh -c ")]


def remote(script: str, env: dict[str, str], stdin: bytes = b"", sh: str = "sh",
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``script`` as ssh has the remote host run it: the login shell given REMOTE_COMMAND,
    stdin the script as sent and then ``stdin``."""
    r = subprocess.run([sh, "-c", ssh.REMOTE_COMMAND], input=ssh.sent(script) + stdin, capture_output=True, env=env,
                       timeout=timeout)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())


def remote_popen(script: str, env: dict[str, str], stderr: int = subprocess.STDOUT) -> subprocess.Popen[bytes]:
    """The same, left running, its stdin open after the script and its output on a pipe; in a
    process group of its own, which :func:`_end` kills as a dropped ssh would end the remote shell."""
    p = subprocess.Popen(["sh", "-c", ssh.REMOTE_COMMAND], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=stderr, start_new_session=True)
    assert p.stdin is not None
    p.stdin.write(ssh.sent(script))
    p.stdin.flush()
    return p


# Values a user may type (remote_cdui is any path without NUL, CR or LF, of at most 1024 characters;
# the worker name is checked far narrower), and ones no input allows, for the quoting alone.
HOSTILE_PATHS = ["~/CodefyUI/bin/cdui", "/opt/x y/cdui", "/opt/$(touch /tmp/ran)/cdui", "/opt/`touch /tmp/ran`/cdui",
                 '/opt/x"; touch /tmp/ran; echo "/cdui', "/opt/x'; touch /tmp/ran; echo '/cdui",
                 "~/$(id)/c\\d\\nui", "/opt/${IFS}$(touch${IFS}/tmp/ran)", "-x", "", "/opt/new\nline/cdui"]
HOSTILE_NAMES = ["gpu-box", "gpu 1", "a'b", "$(touch /tmp/ran)", "new\nline"]
# All of it in one value, for shellcheck (which takes a while per file).
WORST = "~/ 'a' \"b\" $(touch /tmp/ran) `id` ${IFS} \\ \\' %s\nline"


def every_script(path: str, name: str) -> list[tuple[str, str, dict[str, str]]]:
    """Every remote script the control plane sends, rendered: (script, text, some of its parameters)."""
    return [
        ("prepare", ssh.prepare_script(IID, SLOT, path, True), {"CDUI": path, "FORGET": "1", "SLOT": str(SLOT)}),
        ("prepare", ssh.prepare_script(IID, SLOT, path, False), {"CDUI": path, "FORGET": "", "SLOT_HEX": "4650"}),
        ("tunnel", ssh.tunnel_script(IID, SLOT, path, name), {"CDUI": path, "NAME": name}),
        ("stop", ssh.stop_script(IID, SLOT), {"SLOT_DIR": ".codefyui-ssh/3f9a12c4-18000"}),
        ("cleanup", ssh.cleanup_script(IID, SLOT, path), {"CDUI": path, "URL": "http://cp-3f9a12c4.invalid:18000"}),
        ("plugin", ssh.plugin_script(IID, SLOT, path, "labpack", name, "a" * 64, "b" * 64, 4096),
         {"CDUI": path, "VERSION": name, "ID": "labpack", "SIZE": "4096"}),
    ]


def test_every_remote_script_as_sent_passes_shellcheck(tmp_path: Path) -> None:
    """Each script exactly as it goes down ssh's stdin (header, parts, end) passes shellcheck at
    every severity, with the worst values (the rest of the text is the same for any values); so
    does the remote command."""
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is missing (apt-get install shellcheck)")
    files = [tmp_path / "remote_command.sh"]
    files[0].write_text(shlex.split(ssh.REMOTE_COMMAND)[2] + "\n")
    for i, (what, text, _) in enumerate(every_script(WORST, WORST)):
        length, _, body = ssh.sent(text).partition(b"\n")
        assert int(length) == len(body) and body.decode() == text and text.endswith(ssh.END + "\n")
        files.append(tmp_path / f"{what}-{i}.sh")
        files[-1].write_text(text)
    r = subprocess.run(["shellcheck", "--shell=sh", "--severity=style", *map(str, files)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("path, name", [(path, HOSTILE_NAMES[i % len(HOSTILE_NAMES)])
                                        for i, path in enumerate(HOSTILE_PATHS)] + [(WORST, WORST)])
def test_the_parameters_reach_the_script_as_they_are(path: str, name: str) -> None:
    """The header of each script as sent is valid sh on its own and sets each parameter to the very
    value given: quoted once, in one place, never pasted into the script's text."""
    for what, text, values in every_script(path, name):
        header = text[:text.index("\n}\n") + 3]
        assert subprocess.run(["sh", "-n"], input=header, capture_output=True, text=True).returncode == 0, header
        names = list(values)
        shown = subprocess.run(["sh", "-c", header + 'printf "%s\\0" ' + " ".join(f'"${n}"' for n in names)],
                               capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
        assert shown.stdout.split("\0")[:-1] == [values[n] for n in names], (what, header)
        assert all(v not in text[len(header):] for v in values.values() if len(v) > 4), what


def test_every_script_file_is_sent() -> None:
    """No shell file in scripts/ is left out of every script (and none is named that is not there)."""
    files = {p.stem for p in ssh.SCRIPTS.glob("*.sh")}
    assert files == {part for parts in ssh.PARTS.values() for part in parts}


def test_a_script_cut_short_is_not_run(tmp_path: Path) -> None:
    """The control plane gone while writing the script: the remote shell runs none of it."""
    home = tmp_path / "home"
    home.mkdir()
    script = ssh.prepare_script(IID, SLOT, "/nonexistent/cdui", False)
    sent = ssh.sent(script)
    r = subprocess.run(["sh", "-c", ssh.REMOTE_COMMAND], input=sent[:len(sent) // 2], capture_output=True,
                       env={"HOME": str(home), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (1, b"", b"cdui-ssh: the script arrived incomplete\n")
    assert not (home / ".codefyui-ssh").exists()


def test_prepare_makes_private_folders_and_reports_the_path(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    stale = home / ".codefyui-ssh" / f"{IID}-{SLOT}" / "sock"
    stale.parent.mkdir(parents=True)
    stale.write_text("left by a broken connection")
    r = remote(ssh.prepare_script(IID, SLOT, "/nonexistent/cdui", False), {"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == f"cdui-ssh: dir={stale.parent.resolve()}"
    assert not stale.exists()
    for d in (home / ".codefyui-ssh", stale.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


@pytest.mark.parametrize("sh", ["dash", "bash"])
def test_the_tunnel_hands_the_agent_its_token_and_arguments(tmp_path: Path, sh: str) -> None:
    """The remote ``sh`` (dash, or bash where sh is bash) reads the script and not one byte more:
    the token line that follows reaches the agent, in its environment; its arguments are the values
    as given, spaces and quotes in them included."""
    if shutil.which(sh) is None:
        pytest.skip(f"{sh} is missing")
    home = tmp_path / "home"
    (home / ".codefyui-ssh" / f"{IID}-{SLOT}").mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sh").symlink_to(shutil.which(sh) or sh)
    fake = tmp_path / "my cdui's" / "cdui"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$CODEFYUI_AGENT_TOKEN" "$@" >"$HOME/seen"\n')
    fake.chmod(0o755)
    name = "gpu 'one' $(id)"
    r = remote(ssh.tunnel_script(IID, SLOT, str(fake), name), {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"},
               b"abcdef.0123456789abcdef\nstop\n", sh=sh)
    assert (r.returncode, r.stdout.splitlines()[-1]) == (0, "cdui-ssh: agent exited code=0"), (r.stdout, r.stderr)
    assert (home / "seen").read_text().splitlines() == [
        "abcdef.0123456789abcdef", "agent", "start", "--uds", f"{home}/.codefyui-ssh/{IID}-{SLOT}/sock", "--foreground",
        "--control", "http://cp-3f9a12c4.invalid:18000", "--name", name]


HOSTILE = ["/opt/$(touch {m})/cdui", "/opt/`touch {m}`/cdui", '/opt/x"; touch {m}; echo "/cdui',
           "/opt/x'; touch {m}; echo '/cdui", "~/$(touch {m})/cdui", "/opt/${{IFS}}$(touch${{IFS}}{m})"]


@pytest.mark.parametrize("template", HOSTILE)
@pytest.mark.parametrize("executable", [False, True])
def test_a_hostile_remote_cdui_is_printed_not_run(tmp_path: Path, template: str, executable: bool) -> None:
    """``remote_cdui`` is typed by a user of the control plane and runs in the remote host's shell:
    `$(...)`, backticks and quotes in it stay part of the path. Missing, then present but not
    executable (a file at that very path), it is reported with its exact value, and nothing ran."""
    marker = tmp_path / "ran"
    value = template.format(m=marker)
    home = tmp_path / "home"
    home.mkdir()
    if executable:  # the same literal path exists, without the execute bit: the 126 branch
        literal = Path(value.replace("~/", f"{home}/", 1)) if value.startswith("~/") else Path(value)
        literal = tmp_path / "fs" / literal.relative_to("/")
        literal.parent.mkdir(parents=True)
        literal.write_text("#!/bin/sh\n")
        value = str(literal)
        assert "$(" in value or "`" in value or '"' in value or "'" in value
    script = ssh.tunnel_script(IID, SLOT, value, "gpu-box")
    r = remote(script, {"HOME": str(home), "PATH": "/usr/bin:/bin"}, b"abcdef.0123456789abcdef\n")
    what = "not executable" if executable else "not found"
    assert (r.returncode, r.stdout) == (126 if executable else 127, f"cdui-ssh: {value}: {what}\n"), r.stderr
    assert not marker.exists()
    # The preparation and the cleanup name it too, as the launcher to run: quoted the same way.
    for other in (ssh.prepare_script(IID, SLOT, value, True), ssh.cleanup_script(IID, SLOT, value)):
        remote(other, {"HOME": str(home), "PATH": "/usr/bin:/bin"})
        assert not marker.exists()


@pytest.mark.parametrize("target, name", [
    ("alice@gpu1.lab", "gpu1"), ("gpu-box", "gpu-box"), ("bob@10.0.3.17", "10.0.3.17"), ("root@localhost", "localhost"),
    ("carol@node7.cluster.example.org", "node7")])
def test_default_name(target: str, name: str) -> None:
    assert ssh.default_name(target) == name


@pytest.mark.parametrize("bad", ["-oProxyCommand=x", "a b", "", "alice@", "x;rm", None, 7])
def test_bad_targets_are_refused(bad: object) -> None:
    with pytest.raises(CduiError):
        ssh.check_target(bad)


def test_slots_and_instance_id(tmp_path: Path) -> None:
    assert ssh.parse_slot_range("18000-18100") == range(18000, 18101)
    assert ssh.pick_slot(range(18000, 18003), {18000, 18002}) == 18001
    with pytest.raises(CduiError, match="every SSH slot"):
        ssh.pick_slot(range(18000, 18001), {18000})
    for bad in ("18100-18000", "x", "0-5", "1-70000"):
        with pytest.raises(CduiError):
            ssh.parse_slot_range(bad)
    iid = ssh.instance_id(tmp_path)
    assert len(iid) == 8 and int(iid, 16) >= 0
    assert ssh.instance_id(tmp_path) == iid == (tmp_path / "ssh-instance-id").read_text().strip()
    assert stat.S_IMODE((tmp_path / "ssh-instance-id").stat().st_mode) == 0o600
    assert ssh.control_url(iid, 18000) == f"http://cp-{iid}.invalid:18000"


@pytest.mark.parametrize("rc, lines, connected, kind, starts", [
    (255, ["Host key verification failed."], False, "terminal", "host key verification failed"),
    (255, ["@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @"], False, "terminal", "host key"),
    (127, ["cdui-ssh: ~/CodefyUI/bin/cdui: not found"], False, "terminal",
     "the remote shell cannot run cdui (not found"),
    (126, ["cdui-ssh: x: not executable"], False, "terminal", "the remote shell cannot run cdui (not executable"),
    (255, ["Error: remote port forwarding failed for listen path /h/.codefyui-ssh/x/sock"], False, "forward",
     "remote forwarding"),
    (255, ["channel 0: open failed: administratively prohibited: open failed"], False, "terminal",
     "the remote sshd refuses forwarding"),
    (255, ["alice@gpu: Permission denied (publickey)."], False, "recoverable", "ssh login denied"),
    (255, ["ssh: Could not resolve hostname gpu-box: Name or service not known"], False, "recoverable",
     "the host name does not resolve"),
    (2, ["cdui: error: refused by the control plane: unknown credential"], True, "credential", "the agent's stored"),
    # A version refusal is not the credential's fault: at connection (stored credential) or at enrollment.
    (2, ["cdui: error: refused by the control plane: version mismatch: worker 0.0.9, control plane 0.1.0",
         "cdui-ssh: agent exited code=2"], False, "version", "version mismatch (worker 0.0.9, server 0.1.0): "),
    (2, ["cdui: error: enrollment failed: version mismatch: worker 0.2.0, control plane 0.1.0 (install cdui 0.1.0 "
         "on the worker)"], False, "version", "version mismatch (worker 0.2.0, server 0.1.0): "),
    (2, ["cdui: error: refused by the control plane: version mismatch: worker unknown, control plane 0.1.0"], True,
     "version", "version mismatch (worker unknown, server 0.1.0)"),
    (2, ["cdui: error: the stored credential is for worker 'a', not 'b'"], False, "credential", "the agent's stored"),
    (255, ["Connection to gpu closed by remote host."], True, "dropped", "the connection ended (ssh exit 255)"),
    (1, [], False, "dropped", "ssh exited with code 1 before the agent connected"),
])
def test_classify(rc: int, lines: list[str], connected: bool, kind: str, starts: str) -> None:
    out = ssh.classify(rc, lines, connected)
    assert out.kind == kind
    assert out.reason.startswith(starts), out.reason


def test_backoff_doubles_to_a_minute() -> None:
    delays, d = [], None
    for _ in range(8):
        d = ssh.next_delay(d)
        delays.append(d)
    assert delays == [2, 4, 8, 16, 32, 60, 60, 60]


LEGACY_AGENT = """
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[-1])))
while s.recv(1):
    pass
while True:
    time.sleep(3600)
"""


def _prepare_in(home: Path, slot: int, path: str) -> list[str]:
    r = remote(ssh.prepare_script(IID, slot, "/nonexistent/cdui", False), {"HOME": str(home), "PATH": path})
    assert r.returncode == 0, r.stderr
    return [line for line in r.stdout.splitlines() if "legacy agent" in line]


@pytest.mark.e2e
def test_legacy_agent_without_ss_is_judged_by_proc_net_tcp(tmp_path: Path) -> None:
    """A remote host without ``ss``: the connection is read from /proc/net/tcp; with it the legacy
    agent is only reported, without it stopped."""
    import socket
    import sys
    bin_dir = tmp_path / "bin"  # the tools the script uses, and no ss
    bin_dir.mkdir()
    for tool in ("sh", "dd", "mkdir", "chmod", "rm", "cat", "tr", "grep", "awk"):
        (bin_dir / tool).symlink_to(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True,
                                                   text=True, check=True).stdout.strip())
    home = tmp_path / "home"
    forward = socket.create_server(("127.0.0.1", 0))
    slot = forward.getsockname()[1]
    (home / ".codefyui-ssh" / str(slot)).mkdir(parents=True)
    agent = subprocess.Popen([sys.executable, "-c", LEGACY_AGENT, "agent", "start", str(slot)])
    try:
        (home / ".codefyui-ssh" / str(slot) / "agent.pid").write_text(f"{agent.pid}\n")
        forward.settimeout(60)
        conn, _ = forward.accept()
        legacy = f"cdui-ssh: legacy agent {agent.pid} in {home}/.codefyui-ssh/{slot}"
        assert _prepare_in(home, slot, str(bin_dir)) == [f"{legacy} has a connection; left running"]
        assert agent.poll() is None
        conn.close()
        forward.close()
        assert _prepare_in(home, slot, str(bin_dir)) == [f"{legacy} stopped"]
        assert agent.wait(60) == -15
    finally:
        agent.kill()
        agent.wait(30)


@pytest.mark.e2e
def test_a_reused_legacy_pid_is_left_alone(tmp_path: Path) -> None:
    """The PID in a legacy folder now belongs to another process of the user's: not stopped."""
    with _bystander() as other:
        home = tmp_path / "home"
        (home / ".codefyui-ssh" / str(SLOT)).mkdir(parents=True)
        (home / ".codefyui-ssh" / str(SLOT) / "agent.pid").write_text(f"{other.pid}\n")
        assert _prepare_in(home, SLOT, "/usr/bin:/bin") == []
        assert other.poll() is None


@contextlib.contextmanager
def _bystander() -> Iterator[subprocess.Popen[bytes]]:
    """Some other process of the user's (a PID a stale file may name), ended afterwards."""
    other = subprocess.Popen(["sleep", "300"])
    try:
        yield other
    finally:
        other.kill()
        other.wait(30)


@pytest.mark.e2e
def test_cleanup_without_ss_keeps_a_slot_whose_socket_is_served(tmp_path: Path) -> None:
    """A remote host without ``ss``: /proc/net/unix tells that the slot's socket is still served
    (a connection is attached), so the folder is kept; once it is not, the slot is cleaned."""
    import socket
    import tempfile
    bin_dir = tmp_path / "bin"  # the tools the script uses, and no ss
    bin_dir.mkdir()
    for tool in ("sh", "dd", "cat", "grep", "rm", "sleep", "tr"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or tool)
    home = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))  # short: a socket path has at most 108 bytes
    try:
        d = home / ".codefyui-ssh" / f"{IID}-{SLOT}"
        d.mkdir(parents=True)
        served = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        served.bind(str(d / "sock"))
        served.listen()

        def cleanup() -> subprocess.CompletedProcess[str]:
            return remote(ssh.cleanup_script(IID, SLOT, "/nonexistent/cdui"),
                          {"HOME": str(home), "PATH": str(bin_dir)})
        r = cleanup()
        assert r.returncode == 3 and "a connection is still attached" in r.stdout, (r.stdout, r.stderr)
        assert d.is_dir()
        served.close()
        r = cleanup()
        assert r.returncode == 0 and f"cdui-ssh: cleaned {d}" in r.stdout, (r.stdout, r.stderr)
        assert not d.exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)


# The remote cdui as far as the scripts can see it: an `agent start` that writes its PID next to the
# socket only once the test opens the gate (its imports, its enrollment), then runs until SIGTERM.
FAKE_AGENT = """#!{python}
import os, signal, sys, time
d = os.path.dirname(sys.argv[sys.argv.index("--uds") + 1])
def stop(*_):
    open(os.path.join(d, "fake.term"), "w").write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(d, "fake.ready"), "w").write(str(os.getpid()))
while not os.path.exists(os.path.join(d, "fake.gate")):
    time.sleep(0.02)
with open(os.path.join(d, "agent.pid.tmp"), "w") as f:
    f.write(f"{{os.getpid()}}\\n")
os.replace(os.path.join(d, "agent.pid.tmp"), os.path.join(d, "agent.pid"))
while True:
    time.sleep(3600)
"""


def _descendants(pid: int) -> list[str]:
    """The command names of ``pid``'s children, their children and so on."""
    procs: dict[int, tuple[str, int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat_line = (entry / "stat").read_text()
            except OSError:
                continue
            name, _, rest = stat_line.partition("(")[2].rpartition(")")
            procs[int(entry.name)] = name, int(rest.split()[1])
    out, parents = [], {pid}
    while parents:
        children = {p for p, (_, ppid) in procs.items() if ppid in parents}
        out += [procs[p][0] for p in children]
        parents = children
    return out


def _end(p: subprocess.Popen[bytes]) -> None:
    """Kill what :func:`remote_popen` started, its whole process group (an agent started in a
    session of its own is left to the test)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)


def _wait(what: str, pred: Callable[[], bool], timeout: float = 60.0) -> None:
    """Poll a condition on real processes; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.e2e
def test_a_stop_that_lands_before_the_agent_reported_its_pid_waits_for_it(tmp_path: Path) -> None:
    """The tunnel script has launched the agent, which has not written agent.pid yet, when a stop
    arrives over a short ssh: the stop waits for the starting agent and stops it, instead of
    reporting no agent and leaving one to start with nobody stopping it."""
    import sys
    home = tmp_path / "home"
    d = home / ".codefyui-ssh" / f"{IID}-{SLOT}"
    d.mkdir(parents=True)
    fake = tmp_path / "cdui"
    fake.write_text(FAKE_AGENT.format(python=sys.executable))
    fake.chmod(0o755)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    tunnel = remote_popen(ssh.tunnel_script(IID, SLOT, str(fake), "gpu1"), env)
    stop = None
    try:
        assert tunnel.stdin is not None and tunnel.stdout is not None
        tunnel.stdin.write(b"token\n")
        tunnel.stdin.flush()
        # The fake agent writes its PID into fake.ready: wait for the number, not the file (a read between
        # its creation and the write found it empty, once in eight runs under load).
        _wait("the agent to be launched",
              lambda: _pid_in(d / "fake.ready") is not None and (d / "agent.starting").exists())
        agent = _pid_in(d / "fake.ready")
        assert agent is not None
        assert not (d / "agent.pid").exists()
        stop = remote_popen(ssh.stop_script(IID, SLOT), env, stderr=subprocess.PIPE)
        # The stop has looked (and found no agent.pid) once it sleeps in its wait, or it has ended.
        _wait("the stop to wait or end", lambda: stop.poll() is not None or "sleep" in _descendants(stop.pid))
        (d / "fake.gate").touch()  # the agent reports its PID now
        out, err = stop.communicate(timeout=120)
        assert (stop.returncode, out, err) == (0, f"cdui-ssh: agent {agent} stopped\n".encode(), b"")
        assert (d / "fake.term").read_text() == "SIGTERM"
        rest = tunnel.communicate(timeout=60)[0].decode()
        assert f"cdui-ssh: started pid={agent}" in rest and rest.endswith("cdui-ssh: agent exited code=0\n"), rest
        assert not (d / "agent.starting").exists()
    finally:
        for p in (tunnel, stop):
            if p is not None:
                _end(p)
        if (d / "fake.ready").exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int((d / "fake.ready").read_text()), signal.SIGKILL)


@pytest.mark.e2e
def test_a_stale_starting_record_does_not_hold_the_stop(tmp_path: Path) -> None:
    """agent.starting left by a tunnel script that died, naming an ended process or one that is not
    a starting agent (a reused PID): the stop does not wait for it."""
    ended = subprocess.Popen(["true"])
    ended.wait(30)
    with _bystander() as other:
        home = tmp_path / "home"
        d = home / ".codefyui-ssh" / f"{IID}-{SLOT}"
        d.mkdir(parents=True)
        for pid in (ended.pid, other.pid):
            (d / "agent.starting").write_text(f"{pid}\n")
            r = remote(ssh.stop_script(IID, SLOT), {"HOME": str(home), "PATH": "/usr/bin:/bin"}, timeout=120)
            assert (r.returncode, r.stdout) == (0, "cdui-ssh: no agent running\n"), (pid, r.stdout, r.stderr)
        assert other.poll() is None


@pytest.mark.e2e
def test_a_reconnect_while_the_agent_is_starting_attaches_to_it(tmp_path: Path) -> None:
    """The ssh dropped after its tunnel script launched the agent but before the agent wrote
    agent.pid: the next attempt's script waits for that agent and attaches to it, instead of
    starting a second agent on the slot."""
    import sys
    home = tmp_path / "home"
    d = home / ".codefyui-ssh" / f"{IID}-{SLOT}"
    d.mkdir(parents=True)
    fake = tmp_path / "cdui"
    fake.write_text(FAKE_AGENT.format(python=sys.executable))
    fake.chmod(0o755)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    script = ssh.tunnel_script(IID, SLOT, str(fake), "gpu1")
    procs: list[subprocess.Popen[bytes]] = []
    agent = None
    try:
        first = remote_popen(script, env)
        procs.append(first)
        assert first.stdin is not None
        first.stdin.write(b"token\n")
        first.stdin.flush()
        # The fake agent writes its PID into fake.ready: wait for the number, not the file (a read between
        # its creation and the write found it empty, once in eight runs under load).
        _wait("the agent to be launched",
              lambda: _pid_in(d / "fake.ready") is not None and (d / "agent.starting").exists())
        agent = _pid_in(d / "fake.ready")
        assert agent is not None
        _end(first)  # the ssh dropped: its remote shell is gone, the agent (its own session) goes on
        (d / "fake.ready").unlink()  # a second agent started on the slot would write it again
        second = remote_popen(script, env)
        procs.append(second)
        assert second.stdin is not None and second.stdout is not None
        second.stdin.write(b"token\n")
        second.stdin.flush()
        _wait("the next attempt to wait for the starting agent", lambda: "sleep" in _descendants(second.pid))
        (d / "fake.gate").touch()  # the agent reports its PID now
        assert second.stdout.readline().decode() == f"cdui-ssh: attached pid={agent}\n"
        assert not (d / "fake.ready").exists(), "a second agent was started on the slot"
    finally:
        for p in procs:
            _end(p)
        for pid in (agent, _pid_in(d / "fake.ready")):  # the agent, and a second one if one was started
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _pid_in(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


@pytest.mark.e2e
def test_a_reconnection_logged_before_the_follower_starts_is_reported(tmp_path: Path) -> None:
    """The ssh dropped while the agent ran; the next ssh's forward is up before its tunnel script
    runs, so the agent can reconnect (and log it) before the script attaches and starts following
    the log. That line still reaches the control plane (it is how the tunnel is seen connected);
    what the agent logged before the preparation (the old connection) does not."""
    import sys
    home = tmp_path / "home"
    d = home / ".codefyui-ssh" / f"{IID}-{SLOT}"
    d.mkdir(parents=True)
    fake = tmp_path / "cdui"
    fake.write_text(FAKE_AGENT.format(python=sys.executable))
    fake.chmod(0o755)
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    script = ssh.tunnel_script(IID, SLOT, str(fake), "gpu1")
    procs: list[subprocess.Popen[bytes]] = []
    agent = None
    try:
        first = remote_popen(script, env)
        procs.append(first)
        assert first.stdin is not None and first.stdout is not None
        first.stdin.write(b"token\n")
        first.stdin.flush()
        (d / "fake.gate").touch()
        assert first.stdout.readline().decode().startswith("cdui-ssh: started pid=")
        agent = int((d / "agent.pid").read_text())
        with open(d / "agent.log", "a") as log:
            log.write("INFO connected to http://cp.invalid:18000 as worker gpu1 (the old ssh)\n")
        _end(first)  # the ssh dropped; the agent goes on
        r = remote(ssh.prepare_script(IID, SLOT, str(fake), False), env)
        assert r.returncode == 0, r.stderr
        with open(d / "agent.log", "a") as log:
            log.write("WARNING connection to http://cp.invalid:18000 closed\n"
                      "INFO connected to http://cp.invalid:18000 as worker gpu1 (the new ssh)\n")
        second = remote_popen(script, env)
        procs.append(second)
        assert second.stdin is not None and second.stdout is not None
        second.stdin.write(b"token\n")
        second.stdin.flush()
        lines = [second.stdout.readline().decode() for _ in range(3)]
        assert lines == [f"cdui-ssh: attached pid={agent}\n",
                         "WARNING connection to http://cp.invalid:18000 closed\n",
                         "INFO connected to http://cp.invalid:18000 as worker gpu1 (the new ssh)\n"], lines
    finally:
        for p in procs:
            _end(p)
        if agent is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent, signal.SIGKILL)
