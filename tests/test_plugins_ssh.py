"""``cdui plugin push`` to an SSH worker goes over that worker's own ssh (docs/plugins.md#packs-on-workers):
the archive follows the remote script on ssh's stdin, the remote ``cdui plugin receive`` installs it only
where CODEFYUI_AGENT_ACCEPT_PLUGINS=1, with its files checked against the control plane's copy and the
lockfile's sha256 recorded, and the slot's agent reads its catalog again (SIGUSR1) and reports the pack.

A real control plane, the system sshd on loopback (tests/sshd.py), a real remote agent and a real run; the
script's own refusals are checked by running it as ssh's remote side does, with the real ``bin/cdui``.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

import codefyui_pack
from cdui.nodes import packs
from cdui.plane.ssh import ssh
from procs import REPO_ROOT, ServerProc, env_for, wait_for, wait_run
from sshd import Sshd
from sshd import running as running_sshd
from syspkgs import requires_command
from test_plugins import cdui
from test_workers import worker

IID, SLOT = "3f9a12c4", 18000


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The test pack's folder and archive; the archive's files' sha256 and a pin as a control plane sends them."""
    tmp = tmp_path_factory.mktemp("sshpack")
    src = codefyui_pack.write_pack(tmp / "src")
    archive = codefyui_pack.tar_of(src, tmp / "labpack-0.2.0.tar.gz")
    return {"src": src, "archive": archive, "data": archive.read_bytes(), "tree": packs.tree_sha256(src),
            "pin": hashlib.sha256(archive.read_bytes()).hexdigest()}


def remote_side(home: Path, script: str, data: bytes, accept: bool) -> subprocess.CompletedProcess[str]:
    """``script`` run as ssh's remote side runs it (the login shell given REMOTE_COMMAND, stdin the script as
    sent, then ``data``), with a remote ``~/CodefyUI/bin/cdui`` that is this checkout's, its user data in ``home``."""
    launcher = home / "CodefyUI" / "bin" / "cdui"
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(f"#!/bin/sh\nexec {REPO_ROOT / 'bin' / 'cdui'} \"$@\"\n")
    launcher.chmod(0o755)
    env = env_for(home / "ud", None, {"HOME": str(home), "CODEFYUI_AGENT_ACCEPT_PLUGINS": "1" if accept else "0"})
    r = subprocess.run(["sh", "-c", ssh.REMOTE_COMMAND], input=ssh.sent(script) + data, capture_output=True, env=env,
                       timeout=120)
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode())


def script_for(p: dict[str, object], pin: str | None = None, tree: str | None = None, size: int | None = None) -> str:
    data: bytes = p["data"]  # type: ignore[assignment]
    return ssh.plugin_script(IID, SLOT, "~/CodefyUI/bin/cdui", "labpack", "0.2.0", pin or str(p["pin"]),
                             tree or str(p["tree"]), len(data) if size is None else size)


def test_the_remote_side_refuses_without_the_opt_in_and_a_pack_that_is_not_the_control_planes(
        tmp_path: Path, pack: dict[str, object]) -> None:
    home = tmp_path / "home"
    lock = home / "ud" / "plugins" / "installed.json"
    data: bytes = pack["data"]  # type: ignore[assignment]

    r = remote_side(home, script_for(pack), data, accept=False)
    assert r.returncode == 1, r
    assert ssh.plugin_outcome(r.returncode, r.stdout.splitlines(), "labpack", 300) == (False, (
        "not installed: this machine does not accept pushed plugin packs (set CODEFYUI_AGENT_ACCEPT_PLUGINS=1 in its "
        "environment or settings file, or install the pack here with `cdui plugin install labpack`)")), r.stdout
    assert not lock.exists()

    # Files that are not the control plane's copy: refused, nothing kept.
    r = remote_side(home, script_for(pack, tree="0" * 64), data, accept=True)
    assert r.returncode == 1 and "not installed: the pushed pack is not 'labpack' with files of sha256 000000000000" \
        in r.stdout, r
    assert packs.read_lock(home / "ud" / "plugins") == {}
    # A stream shorter than announced (ssh cut): refused before anything is unpacked.
    r = remote_side(home, script_for(pack, size=len(data) + 10), data, accept=True)
    assert r.returncode == 1 and f"the pushed archive ended after {len(data)} of {len(data) + 10} bytes" in r.stdout, r
    # A malformed checksum never reaches the install.
    r = remote_side(home, script_for(pack, pin="x; touch /tmp/ran"), data, accept=True)
    assert r.returncode == 1 and "--pin 'x; touch /tmp/ran' is not a sha256 (64 hex digits)" in r.stdout, r

    # Accepted: installed with the control plane's pin; no agent runs in the slot, which the outcome says.
    r = remote_side(home, script_for(pack), data, accept=True)
    assert r.returncode == 0, r
    assert ssh.plugin_outcome(0, r.stdout.splitlines(), "labpack", 300) == (
        True, "installed labpack 0.2.0 over ssh; no agent runs there now: it reports the pack when it starts")
    entry = packs.read_lock(home / "ud" / "plugins")["labpack"]
    assert (entry["sha256"], entry["source_kind"], entry["version"]) == (pack["pin"], "pushed", "0.2.0")
    assert packs.tree_sha256(home / "ud" / "plugins" / "labpack") == pack["tree"]


@pytest.mark.parametrize("rc, lines, want", [
    (None, [], (False, "not installed: no answer over ssh within 300 s")),
    (0, ["installed labpack 0.2.0", "cdui-ssh: catalog reload pid=42"],
     (True, "installed labpack 0.2.0 over ssh; its agent reads its catalog again and reconnects")),
    (127, ["cdui-ssh: ~/x/cdui: not found"],
     (False, "not installed: ~/x/cdui: not found (the SSH worker's remote cdui)")),
    (1, ["cdui: error: not installed: boom"], (False, "not installed: boom")),
    (255, ["ssh: connect to host h port 22: Connection refused"],
     (False, "not installed: ssh ended with code 255: ssh: connect to host h port 22: Connection refused")),
])
def test_what_a_pushed_packs_ssh_came_to(rc: int | None, lines: list[str], want: tuple[bool, str]) -> None:
    assert ssh.plugin_outcome(rc, lines, "labpack", 300) == want


@pytest.mark.e2e
@requires_command("sshd", "openssh-server")
@requires_command("ssh", "openssh-client")
@pytest.mark.timeout(600)
def test_push_to_an_ssh_worker_over_its_ssh(tmp_path: Path, pack: dict[str, object]) -> None:
    with running_sshd(tmp_path / "ssh") as sshd:
        push_over_ssh(tmp_path, sshd, pack)


def push_over_ssh(tmp_path: Path, sshd: Sshd, pack: dict[str, object]) -> None:
    server = ServerProc(tmp_path, extra_env={**sshd.env(), "CODEFYUI_WORKER_HEARTBEAT_S": "2"}).start()
    try:
        server.call("POST", "/api/workers/ssh", {"target": "root@localhost", "port": sshd.port}, expect=201)
        wait_for(lambda: (worker(server, "localhost") or {}).get("online"), 120, 0.2, "the SSH worker online")
        pid = worker(server, "localhost")["ssh"]["tunnel"]["remote_pid"]  # type: ignore[index]
        cdui(server.user_data, "plugin", "install", str(pack["archive"]), env=sshd.env())
        lock = packs.read_lock(server.user_data / "plugins")["labpack"]
        remote_lock = sshd.home / "ud" / "plugins" / "installed.json"

        # The remote side has not opted in: refused there, the setting named; nothing installed.
        r = cdui(server.user_data, "plugin", "push", "labpack", "--to", "localhost", launcher=True, env=sshd.env(),
                 ok=False)
        assert r.returncode == 1, r
        assert "localhost: not installed: this machine does not accept pushed plugin packs (set " \
               "CODEFYUI_AGENT_ACCEPT_PLUGINS=1" in r.stdout, r.stdout
        assert not remote_lock.exists()

        # Opted in (the remote cdui's environment): installed over ssh, with the control plane's sha256; the
        # same agent reads its catalog again, reports the pack, and runs the pack's graph.
        launcher = sshd.install_launcher()
        launcher.write_text(launcher.read_text().replace(
            "export CODEFYUI_USER_DATA_DIR\n", "export CODEFYUI_USER_DATA_DIR\nCODEFYUI_AGENT_ACCEPT_PLUGINS=1; "
            "export CODEFYUI_AGENT_ACCEPT_PLUGINS\n"))
        r = cdui(server.user_data, "plugin", "push", "labpack", "--to", "all", launcher=True, env=sshd.env())
        assert r.stdout.strip() == ("localhost: installed labpack 0.2.0 over ssh; its agent reads its catalog "
                                    "again and reconnects"), r.stdout
        entry = json.loads(remote_lock.read_text())["plugins"]["labpack"]
        assert (entry["sha256"], entry["source_kind"]) == (lock["sha256"], "pushed")
        card = wait_for(lambda: (w := worker(server, "localhost")) and w["online"] and w["packs"].get("labpack")
                        and w, 120, 0.2, "the SSH worker to report labpack")
        assert card["packs"]["labpack"]["sha256"] == lock["sha256"] and card["packs_lacking"] == [], card
        assert sshd.agent_pids() == [pid], "the agent was restarted, not asked to read its catalog"
        done = wait_run(server, server.submit(codefyui_pack.example_graph(scale=3.0),
                                              {"target": {"worker": "localhost"}})["id"], timeout=300)
        assert (done["status"], done["worker_id"]) == ("succeeded", "localhost"), done
        assert os.path.getsize(sshd.home / "ud" / "plugins" / "plugins.log") > 0
    finally:
        server.stop()
