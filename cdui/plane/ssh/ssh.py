"""SSH workers, the pure part: the ssh command lines, the remote scripts, and
what an ended ssh means.

Everything here is a function of its arguments (no I/O except
:func:`instance_id`, and reading the scripts shipped beside it), so the exact
argv and stdin the control plane sends are tested as a table. The loop that runs
these commands is :mod:`cdui.plane.ssh.ssh_supervisor`.

The shape of the long-lived ssh (one per enabled SSH worker)::

    ssh -T -o BatchMode=yes -o ExitOnForwardFailure=yes -o ServerAliveInterval=15 \\
        -o StrictHostKeyChecking=accept-new [-p PORT] [-i KEY] \\
        -R <remote dir>/sock:<local private socket> -- TARGET REMOTE_COMMAND

REMOTE_COMMAND is one constant line that reads the remote script (a file of
``scripts/``, its parameters in a quoted header) from ssh's stdin and runs it.
Nothing secret is ever part of an argv: the one-time enrollment token is the
line of ssh's stdin right after the script, which the script reads. Later lines
of stdin are commands to the remote script (``stop``: SIGTERM to the agent); the
end of stdin means the control plane let go of the connection, and the remote
script then exits while the agent keeps running (it reattaches on the next start).
"""
from __future__ import annotations

import functools
import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path

from cdui.core.atomic import write_private
from cdui.core.errors import CduiError

DEFAULT_REMOTE_CDUI = "~/CodefyUI/bin/cdui"
STATE_ROOT = ".codefyui-ssh"  # under the remote user's home
INSTANCE_FILE = "ssh-instance-id"
# Lines the remote scripts print for the control plane; everything else is ssh's or the agent's output.
MARK = "cdui-ssh:"
FIRST_DELAY_S, MAX_DELAY_S = 2.0, 60.0
RECOVERABLE_LIMIT_S = 600.0  # recoverable failures give up after this long without a success
FORWARD_FAILURES_LIMIT = 3
TARGET_RE = re.compile(r"^(?:[A-Za-z0-9._-]{1,64}@)?[A-Za-z0-9._:\[\]%-]{1,253}$")
# The agent's refusal for its version, as the control plane words it (at enrollment or at connection).
VERSION_MISMATCH_RE = re.compile(r"version mismatch: worker ([^\s,;()]{1,64}), control plane ([^\s,;()]{1,64})")


# -- identity: instance id, slots, names ---------------------------------------------------
def instance_id(user_data: Path) -> str:
    """This control plane's 8-hex instance id, made once and kept in its user data folder."""
    path = user_data / INSTANCE_FILE
    try:
        v = path.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{8}", v):
            return v
    except OSError:
        pass
    v = secrets.token_hex(4)
    write_private(path, v + "\n")
    return v


def parse_slot_range(value: str) -> range:
    m = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", value or "")
    if not m or not (0 < int(m.group(1)) <= int(m.group(2)) <= 65535):
        raise CduiError("bad_setting", f"CODEFYUI_SSH_REMOTE_PORT_RANGE={value!r} is not a range LOW-HIGH",
                        hint="e.g. 18000-18100 (numbers from 1 to 65535, LOW <= HIGH)")
    return range(int(m.group(1)), int(m.group(2)) + 1)


def pick_slot(slots: range, taken: set[int]) -> int:
    for s in slots:
        if s not in taken:
            return s
    raise CduiError("no_slot", f"every SSH slot in {slots.start}-{slots.stop - 1} is in use",
                    hint="remove an SSH worker, or widen CODEFYUI_SSH_REMOTE_PORT_RANGE", status=409)


def check_target(target: object) -> str:
    """``user@host`` or a Host alias; nothing ssh could read as an option."""
    if not isinstance(target, str) or not TARGET_RE.match(target) or target.startswith("-"):
        raise CduiError("bad_request", f"SSH target {str(target)[:80]!r} is not user@host or a Host alias",
                        hint="e.g. alice@gpu1.lab, or a Host from ~/.ssh/config such as gpu-box")
    return target


def default_name(target: str) -> str:
    """``alice@gpu1.lab`` -> ``gpu1``: the user part and the domain stripped."""
    host = target.rsplit("@", 1)[-1].strip("[]")
    first = host.split(".")[0] if not re.fullmatch(r"[\d.]+|[0-9a-fA-F:]+", host) else host
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", first).strip("-.") or "ssh-worker"
    return name[:63]


def control_url(iid: str, slot: int) -> str:
    """The address the remote agent keys its credential by; it never resolves."""
    return f"http://cp-{iid}.invalid:{slot}"


def remote_dir_rel(iid: str, slot: int) -> str:
    return f"{STATE_ROOT}/{iid}-{slot}"


# -- command lines --------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    target: str
    port: int = 22
    identity: str | None = None
    strict: str = "accept-new"  # CODEFYUI_SSH_STRICT_HOST_KEY_CHECKING


def base_args(t: Target, ssh: str = "ssh") -> list[str]:
    # Port 22 is not passed, so a Port line of the user's ssh config for that host applies.
    args = [ssh, "-T", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=15",
            "-o", f"StrictHostKeyChecking={t.strict}"]
    if t.port != 22:
        args += ["-p", str(t.port)]
    if t.identity:
        args += ["-i", t.identity]
    return args


# -- the remote scripts ------------------------------------------------------------------------
# Each remote script is put together from shell files in scripts/ (package data) and sent as: a
# header of `NAME='value'` lines (every value through _quote, here and nowhere else), the parts
# PARTS names, then END. It travels on ssh's stdin after a line with its length in bytes; the
# command ssh hands the remote login shell is always REMOTE_COMMAND, one constant line: nothing a
# user typed ever reaches that shell, whichever it is (sh, bash, zsh, fish, or csh, which cannot
# take a quoted newline), and no limit on the length of an argument applies.
SCRIPTS = Path(__file__).with_name("scripts")
# Shared parts first (prelude.sh: PATH, umask, is_agent), the script's own file last; only the
# functions a script calls are sent, so what is sent is what runs.
PARTS: dict[str, tuple[str, ...]] = {
    "prepare": ("prelude", "launcher", "prepare"),
    "tunnel": ("prelude", "launcher", "starting", "tunnel"),
    "stop": ("prelude", "starting", "stop_agent", "stop"),
    "cleanup": ("prelude", "launcher", "starting", "stop_agent", "cleanup"),
    "plugin": ("prelude", "launcher", "plugin"),
}
END = "# end of the script sent by cdui"
# Reads exactly the script's bytes (dd bs=1: one byte per read, so not one byte of what follows,
# the tunnel's token, is taken) and runs it in this shell, with stdin where the script ends.
# A script cut short (the control plane gone while writing it) lacks END and is not run at all.
BOOTSTRAP = ('IFS= read -r sent_len; sent=$(dd bs=1 count="$sent_len" 2>/dev/null); '
             f'case $sent in *"{END}") eval "$sent" ;; '
             '*) echo "cdui-ssh: the script arrived incomplete" >&2; exit 1 ;; esac')
REMOTE_COMMAND = "sh -c " + shlex.quote(BOOTSTRAP)


def _quote(value: str) -> str:
    """``value`` as one shell word that stands for itself: shlex.quote, always in single quotes
    (shlex leaves a word like ``cdui-ssh:`` bare, which is safe but reads to shellcheck as code)."""
    q = shlex.quote(value)
    return q if q.startswith("'") else f"'{q}'"


@functools.cache
def _part(name: str) -> str:
    return (SCRIPTS / f"{name}.sh").read_text()


def _header(name: str, params: dict[str, str]) -> str:
    """The parameters of remote script ``name`` as shell assignments of quoted literals. A value
    is data: the lints for code (a `$` or `~` that does not expand) are off for it alone."""
    lines = "".join(f"    {k}={_quote(v)}\n" for k, v in params.items())
    return (f"# cdui: the remote script {name}.sh; its parameters, each a quoted literal:\n"
            "# shellcheck disable=SC1003,SC2016,SC2088\n"
            "{\n" + lines + "}\n")


def render(name: str, params: dict[str, str]) -> str:
    """The exact text of remote script ``name`` with its parameters: what ``sh`` runs remotely."""
    return _header(name, params) + "".join("\n" + _part(p) for p in PARTS[name]) + END + "\n"


def sent(script: str) -> bytes:
    """What goes down ssh's stdin ahead of anything else: the script's length line, the script."""
    data = script.encode()
    return f"{len(data)}\n".encode() + data


def prepare_script(iid: str, slot: int, remote_cdui: str, forget: bool) -> str:
    """The short preparatory ssh (scripts/prepare.sh): the state folder, no stale socket, the full
    path reported, the slot's old credential forgotten on its first use, a legacy agent stopped."""
    return render("prepare", {"MARK": MARK, "STATE_ROOT": STATE_ROOT, "SLOT_DIR": remote_dir_rel(iid, slot),
                              "URL": control_url(iid, slot), "CDUI": remote_cdui, "FORGET": "1" if forget else "",
                              "SLOT": str(slot), "SLOT_HEX": f"{slot:04X}"})


def tunnel_script(iid: str, slot: int, remote_cdui: str, name: str) -> str:
    """The long-lived ssh's remote side (scripts/tunnel.sh): reattach to the slot's agent or start
    it, then follow its log; the token is the first line of stdin after the script."""
    return render("tunnel", {"MARK": MARK, "SLOT_DIR": remote_dir_rel(iid, slot), "URL": control_url(iid, slot),
                             "CDUI": remote_cdui, "NAME": name})


def stop_script(iid: str, slot: int) -> str:
    """A short ssh when no connection is there (scripts/stop.sh): stop the agent (its runs get their grace)."""
    return render("stop", {"MARK": MARK, "SLOT_DIR": remote_dir_rel(iid, slot)})


def cleanup_script(iid: str, slot: int, remote_cdui: str) -> str:
    """Delete and remove (scripts/cleanup.sh): stop the agent, forget the slot's credential, delete
    the slot's folder; both kept if the agent cannot be stopped or a connection is still attached."""
    return render("cleanup", {"MARK": MARK, "SLOT_DIR": remote_dir_rel(iid, slot), "URL": control_url(iid, slot),
                              "CDUI": remote_cdui})


def plugin_script(iid: str, slot: int, remote_cdui: str, pack_id: str, version: str, pin: str, tree: str,
                  size: int) -> str:
    """A pushed plugin pack (scripts/plugin.sh): ``size`` bytes of its archive follow the script on stdin; the
    remote cdui installs them (its own opt-in and sha256 checks), then the slot's agent reads its catalog again."""
    return render("plugin", {"MARK": MARK, "SLOT_DIR": remote_dir_rel(iid, slot), "CDUI": remote_cdui,
                             "ID": pack_id, "VERSION": version, "PIN": pin, "TREE": tree, "SIZE": str(size)})


@dataclass(frozen=True)
class Command:
    """One ssh to run: its argv, and the bytes its stdin starts with (the script)."""
    argv: list[str]
    stdin: bytes


def tunnel_command(t: Target, iid: str, slot: int, remote_abs_dir: str, local_socket: str, remote_cdui: str,
                   name: str, ssh: str = "ssh") -> Command:
    """The long-lived ssh; the caller writes the token line after ``stdin``."""
    return Command(base_args(t, ssh) + ["-R", f"{remote_abs_dir}/sock:{local_socket}", "--", t.target,
                                        REMOTE_COMMAND], sent(tunnel_script(iid, slot, remote_cdui, name)))


def short_command(t: Target, script: str, ssh: str = "ssh", data: bytes = b"") -> Command:
    """A short-lived ssh (preparation, stop, cleanup, a pushed pack): no forwarding at all; stdin ends after the
    script and ``data`` (what the script reads from stdin)."""
    return Command(base_args(t, ssh) + ["-o", "ClearAllForwardings=yes", "--", t.target, REMOTE_COMMAND],
                   sent(script) + data)


# -- what an ended ssh means ------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    kind: str  # "forward", "terminal", "recoverable", "credential", "version", "dropped"
    reason: str


def classify(rc: int | None, output: list[str], connected: bool) -> Outcome:
    """Why the ssh (and the remote script in it) ended, and what that calls for.

    - ``terminal``: retrying cannot fix it (host key, cdui not runnable: 127/126,
      forwarding explicitly refused);
    - ``forward``: a forwarding failure, terminal after three in a row;
    - ``recoverable``: may clear on its own (login denied, name not resolving), retried
      with backoff until it has lasted 10 minutes;
    - ``version``: the agent was refused for its version; retrying cannot fix it until one
      side is updated, and its credential is still good, so it is kept and nothing is retried
      until Retry (or the control plane's own restart, after its update);
    - ``credential``: the agent said its stored credential was refused or is another
      worker's; forget it and start again so that it enrolls;
    - ``dropped``: anything else (network outage, sleep, agent ended): retried.
    """
    text = "\n".join(output)
    low = text.lower()
    last = _last_line(output)
    if "host key verification failed" in low or "remote host identification has changed" in low:
        return Outcome("terminal", "host key verification failed" + _detail(last))
    if "administratively prohibited" in low or "forwarding disabled" in low:
        return Outcome("terminal", "the remote sshd refuses forwarding to Unix sockets (AllowStreamLocalForwarding "
                                   "no or DisableForwarding yes); ask its administrator to allow it, then Retry")
    if "bad remote forwarding specification" in low:
        return Outcome("terminal", "ssh refused the forward: the remote folder's socket path is too long for a Unix "
                                   "socket (about 100 characters at most); use a remote account with a shorter home"
                       + _detail(last))
    if "remote port forwarding failed" in low or "forwarding failed for listen path" in low:
        return Outcome("forward", "remote forwarding to the Unix socket failed" + _detail(last))
    if rc in (126, 127):
        what = "not found" if rc == 127 else "not executable"
        return Outcome("terminal", f"the remote shell cannot run cdui ({what}, exit {rc})" + _detail(last))
    version = VERSION_MISMATCH_RE.search(text) if rc == 2 else None
    if version is not None:
        # Before the credential rule: a version refusal also says "refused by the control plane",
        # and forgetting a good credential over it made every update a relaunch loop.
        worker, server = version.groups()
        return Outcome("version", f"version mismatch (worker {worker}, server {server}): install the same cdui "
                                  f"version on both (`cdui update` on the older one), then Retry")
    if rc == 2 and ("refused by the control plane" in low or "stored credential is for worker" in low):
        return Outcome("credential", "the agent's stored credential was refused or belongs to another worker"
                       + _detail(last))
    if "permission denied" in low:
        return Outcome("recoverable", "ssh login denied (Permission denied)" + _detail(last))
    if "could not resolve hostname" in low or "name or service not known" in low:
        return Outcome("recoverable", "the host name does not resolve" + _detail(last))
    if connected:
        return Outcome("dropped", f"the connection ended (ssh exit {rc})" + _detail(last))
    return Outcome("dropped", f"ssh exited with code {rc} before the agent connected" + _detail(last))


def _last_line(output: list[str]) -> str:
    for line in reversed(output):
        s = line.strip()
        if s and not s.startswith(MARK):
            return s
    return ""


def _detail(line: str) -> str:
    return f": {line[:300]}" if line else ""


def next_delay(previous: float | None) -> float:
    """2 s, then doubling on each consecutive attempt, at most a minute."""
    return FIRST_DELAY_S if previous is None else min(MAX_DELAY_S, previous * 2)


def parse_mark(line: str) -> tuple[str, str] | None:
    """A line of the remote scripts: (word, rest), e.g. ("started", "pid=123")."""
    s = line.strip()
    if not s.startswith(MARK):
        return None
    word, _, rest = s[len(MARK):].strip().partition(" ")
    return word, rest


def plugin_outcome(rc: int | None, output: list[str], pack_id: str, timeout_s: float) -> tuple[bool, str]:
    """What a pushed pack's ssh (scripts/plugin.sh) came to: (installed, the line ``cdui plugin push`` prints)."""
    if rc is None:
        return False, f"not installed: no answer over ssh within {timeout_s:g} s"
    marks = [f"{word} {rest}".strip() for word, rest in (m for m in map(parse_mark, output) if m is not None)]
    if rc == 0:
        done = next((line.strip() for line in output if line.startswith("installed ")), f"installed {pack_id}")
        if any(m.startswith("catalog reload") for m in marks):
            return True, f"{done} over ssh; its agent reads its catalog again and reconnects"
        return True, f"{done} over ssh; no agent runs there now: it reports the pack when it starts"
    missing = [m for m in marks if m.endswith(": not found")]
    if rc == 127 and missing:  # the remote cdui's path as the SSH worker records it
        return False, f"not installed: {missing[-1]} (the SSH worker's remote cdui)"
    errors = [line.strip().removeprefix("cdui: error: ") for line in output if line.startswith("cdui: error: ")]
    if errors:
        return False, errors[-1]
    return False, f"not installed: ssh ended with code {rc}{_detail(_last_line(output))}"
