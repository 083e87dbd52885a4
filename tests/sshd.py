"""A real OpenSSH server on loopback for the SSH worker tests.

:class:`Sshd` starts Debian's ``/usr/sbin/sshd -D`` on a free port with its own
host key, an ``authorized_keys`` holding a generated client key, and
``SetEnv HOME=...``: the "remote" home is a temporary folder of this same
user. The control plane's side gets a ``~/.ssh/config``-style file (Host
``sshtest`` and ``localhost``, the key, a private ``known_hosts``) through a
small ``ssh`` wrapper first on its PATH (``ssh -F <that file> "$@"``): ssh
reads config from the passwd home, not from ``$HOME``, so a wrapper is how a
test gives the control plane its own ssh config without touching the real one.

The remote ``~/CodefyUI/bin/cdui`` execs this checkout's ``bin/cdui`` with the
remote agent's own user data folder in the remote home.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from procs import REPO_ROOT, SESSION_ENV, Proc, cmdlines, free_port, pid_alive, wait_for

SSHD = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/sbin")


class Sshd:
    def __init__(self, tmp: Path, extra_config: str = "") -> None:
        self.tmp = Path(tmp)
        self.port = free_port()
        # Short: the remote socket's whole path must fit a Unix socket address (108 bytes).
        self.home = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))
        self.client_dir = self.tmp / "client"
        self.bin = self.tmp / "cp-bin"
        self.extra_config = extra_config
        self.proc: Proc | None = None

    @property
    def key(self) -> Path:
        return self.client_dir / "id"

    @property
    def config_file(self) -> Path:
        return self.client_dir / "config"

    @property
    def known_hosts(self) -> Path:
        return self.client_dir / "known_hosts"

    def setup(self) -> Sshd:
        for d in (self.home, self.client_dir, self.bin):
            d.mkdir(parents=True, exist_ok=True)
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
        subprocess.run(keygen + ["-f", str(self.tmp / "hostkey")], check=True)
        subprocess.run(keygen + ["-f", str(self.key)], check=True)
        shutil.copy(self.key.with_suffix(".pub"), self.tmp / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
        self.write_sshd_config()
        common = (f"  User {os.environ.get('USER') or 'root'}\n  IdentityFile {self.key}\n  IdentitiesOnly yes\n"
                  f"  UserKnownHostsFile {self.known_hosts}\n")
        self.config_file.write_text(f"Host sshtest\n  HostName 127.0.0.1\n  Port {self.port}\n{common}"
                                    f"Host localhost\n  HostName 127.0.0.1\n{common}")
        wrapper = self.bin / "ssh"
        wrapper.write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F {self.config_file} \"$@\"\n")
        wrapper.chmod(0o755)
        self.install_launcher()
        return self

    def write_sshd_config(self, extra: str | None = None) -> None:
        (self.tmp / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.tmp / 'hostkey'}\n"
            f"AuthorizedKeysFile {self.tmp / 'authorized_keys'}\nStrictModes no\nPidFile {self.tmp / 'sshd.pid'}\n"
            f"UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"PermitRootLogin prohibit-password\n"
            # The remote home is a temporary folder; the session marker lets the leftover sweep find remote agents.
            f"SetEnv HOME={self.home} {SESSION_ENV}={os.environ.get(SESSION_ENV, '')}\n"
            f"{self.extra_config if extra is None else extra}\n")

    def install_launcher(self) -> Path:
        launcher = self.home / "CodefyUI" / "bin" / "cdui"
        launcher.parent.mkdir(parents=True, exist_ok=True)
        launcher.write_text(f"#!/bin/sh\nCODEFYUI_USER_DATA_DIR={self.home / 'ud'}; export CODEFYUI_USER_DATA_DIR\n"
                            f"exec {REPO_ROOT / 'bin' / 'cdui'} \"$@\"\n")
        launcher.chmod(0o755)
        return launcher

    def start(self) -> Sshd:
        assert SSHD is not None
        self.proc = Proc([SSHD, "-D", "-e", "-f", str(self.tmp / "sshd_config")], dict(os.environ),
                         self.tmp / "sshd.log", name="sshd")
        self.proc.spawn()

        def listening() -> bool:
            assert self.proc is not None
            if not self.proc.alive:
                raise AssertionError(f"sshd exited: {self.proc.log_tail(20)}")
            r = subprocess.run(["ss", "-Htln", f"sport = :{self.port}"], capture_output=True, text=True)
            return bool(r.stdout.strip())
        wait_for(listening, 30, 0.05, f"sshd to listen on {self.port}")
        return self

    def restart(self, extra: str) -> None:
        self.stop()
        self.write_sshd_config(extra)
        self.start()

    def env(self) -> dict[str, str]:
        """What the control plane's environment needs: the ssh wrapper first on PATH."""
        return {"PATH": f"{self.bin}:{os.environ.get('PATH', '')}"}

    def agent_pids(self) -> list[int]:
        """Remote agents that are alive, from their pidfiles in the remote state folders."""
        out = []
        for p in (self.home / ".codefyui-ssh").glob("*/agent.pid"):
            try:
                pid = int(p.read_text().strip())
            except (OSError, ValueError):
                continue
            if pid_alive(pid):
                out.append(pid)
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(10)
            self.proc = None

    def remove_home(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)

    def remote_agent_processes(self) -> list[int]:
        """Every live process starting or running an agent on this remote home's slots, found by its
        command line: an agent that is stopping may already have removed its pidfile."""
        needle = f"{self.home}/.codefyui-ssh/".encode()
        return [pid for pid, cmd in cmdlines()
                if needle in cmd and b"agent start" in cmd.replace(b"\0", b" ") and pid_alive(pid)]

    def end_remote_agents(self) -> None:
        """Remote agents are sshd's descendants, not the test's: end them here (SIGTERM stops their runs)."""
        for sig, wait in ((signal.SIGTERM, 60), (signal.SIGKILL, 30)):
            for pid in set(self.agent_pids()) | set(self.remote_agent_processes()):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            try:
                wait_for(lambda: not self.agent_pids() and not self.remote_agent_processes(), wait, 0.05,
                         "remote agents to end")
                return
            except AssertionError:
                continue


@contextlib.contextmanager
def running(tmp: Path) -> Iterator[Sshd]:
    """A started sshd for one test; afterwards its remote agents, the daemon and the remote home are gone."""
    s = Sshd(tmp).setup().start()
    try:
        yield s
    finally:
        s.end_remote_agents()
        s.stop()
        s.remove_home()
