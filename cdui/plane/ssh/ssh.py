"""SSH workers, the pure part: the ssh command lines, the remote scripts, and
what an ended ssh means.

Everything here is a function of its arguments (no I/O except
:func:`instance_id`), so the exact argv the control plane runs is tested as a
table. The loop that runs these commands is :mod:`cdui.plane.ssh.ssh_supervisor`.

The shape of the long-lived ssh (one per enabled SSH worker)::

    ssh -T -o BatchMode=yes -o ExitOnForwardFailure=yes -o ServerAliveInterval=15 \\
        -o StrictHostKeyChecking=accept-new [-p PORT] [-i KEY] \\
        -R <remote dir>/sock:<local private socket> -- TARGET "sh -c '...'"

Nothing secret is ever part of an argv: the one-time enrollment token is the
first line of ssh's stdin, which the remote script reads. Later lines of stdin
are commands to the remote script (``stop``: SIGTERM to the agent); the end of
stdin means the control plane let go of the connection, and the remote script
then exits while the agent keeps running (it reattaches on the next start).
"""
from __future__ import annotations

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


def _remote(script: str) -> str:
    """One argument that any login shell (sh, bash, zsh, fish, csh) hands to sh unchanged."""
    return "sh -c " + shlex.quote(script)


def _launcher(path: str) -> str:
    """The remote cdui as shell text: a leading ``~/`` means the remote home."""
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


_PRELUDE = 'PATH="$HOME/.local/bin:$PATH"; export PATH; umask 077; '


def prepare_script(iid: str, slot: int, remote_cdui: str, forget: bool) -> str:
    """The short preparatory ssh: the state folder (0700, its parent too), no stale socket,
    the full path reported; the slot's old credential forgotten on its first use; an agent of
    the legacy layout (``~/.codefyui-ssh/<slot>/``, TCP) stopped when nothing is connected."""
    rel = remote_dir_rel(iid, slot)
    url = control_url(iid, slot)
    s = (_PRELUDE
         + f'r="$HOME/{STATE_ROOT}"; d="$HOME/{rel}"; '
         + 'mkdir -p "$r" && chmod 700 "$r" && mkdir -p "$d" && chmod 700 "$d" || exit 1; '
         + 'rm -f "$d/sock"; ')
    if forget:
        s += f"{_launcher(remote_cdui)} agent forget {url} >/dev/null 2>&1; echo '{MARK} forgot {url}'; "
    s += _legacy_script(slot)
    s += f'cd "$d" && echo "{MARK} dir=$(pwd -P)"'
    return s


def _legacy_script(slot: int) -> str:
    """An older version's agent: its PID in ``~/.codefyui-ssh/<slot>/``, connected over the remote
    loopback's TCP port ``<slot>``. It is stopped only once no connection on that port is confirmed
    (``ss``, else ``/proc/net/tcp``); with one, or with no way to tell, it is only reported. The PID
    must still be an ``agent start``: a reused PID is some other process of the user's."""
    hexport = f"{slot:04X}"
    # Established (state 01) with the port as either end; fields 2 and 3 are local and remote address.
    awk = f"$4 == \"01\" && ($2 ~ /:{hexport}$/ || $3 ~ /:{hexport}$/) {{ f = 1 }} END {{ exit !f }}"
    return (f'l="$r/{slot}"; if [ -s "$l/agent.pid" ]; then p=$(cat "$l/agent.pid"); '
            'if kill -0 "$p" 2>/dev/null && { [ ! -r "/proc/$p/cmdline" ] || '
            'tr "\\000" " " <"/proc/$p/cmdline" | grep -q "agent start"; }; then '
            'if command -v ss >/dev/null 2>&1; then '
            f'if ss -Htn state established "( sport = :{slot} or dport = :{slot} )" | grep -q .; then c=1; '
            'else c=0; fi; '
            'elif [ -r /proc/net/tcp ]; then '
            f"if cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk {shlex.quote(awk)}; then c=1; else c=0; fi; "
            'else c=2; fi; '
            f"if [ $c = 0 ]; then kill -TERM \"$p\" && echo \"{MARK} legacy agent $p in $l stopped\"; "
            f"elif [ $c = 1 ]; then echo \"{MARK} legacy agent $p in $l has a connection; left running\"; "
            f"else echo \"{MARK} legacy agent $p in $l left running: cannot tell whether a connection is "
            f"attached (neither ss nor /proc/net/tcp)\"; fi; fi; fi; ")


# agent.starting names a live process starting an agent (a reused PID is some other command line).
_STARTING = ('w=$(cat "$d/agent.starting" 2>/dev/null) && [ -n "$w" ] && kill -0 "$w" 2>/dev/null && '
             '{ [ ! -r "/proc/$w/cmdline" ] || tr "\\000" " " <"/proc/$w/cmdline" | grep -q "agent start"; }')
# While such a start has written neither agent.pid nor agent.exit, wait for it: 30 s at most.
_WAIT_STARTING = ('i=0; while [ ! -s "$d/agent.pid" ] && [ ! -s "$d/agent.exit" ] && [ $i -lt 300 ] && '
                  f'{_STARTING}; do sleep 0.1; i=$((i+1)); done; ')


def tunnel_script(iid: str, slot: int, remote_cdui: str, name: str) -> str:
    """The long-lived ssh's remote side: reattach to a running agent, or start one detached
    (its own session, output to agent.log, exit code to agent.exit), then follow its log
    until the agent exits or stdin ends.

    Between the start and the agent writing agent.pid (its imports, maybe its enrollment) the
    starting wrapper's PID is in agent.starting, so that a stop arriving meanwhile over a short ssh
    waits for the agent instead of finding none (see :func:`_stop_body`), and so does the next
    attempt's script when this ssh dropped in that window: it attaches to that agent."""
    rel = remote_dir_rel(iid, slot)
    url = control_url(iid, slot)
    launcher = _launcher(remote_cdui)
    return (
        _PRELUDE
        + f'd="$HOME/{rel}"; '
        + "exec 3<&0; IFS= read -r t <&3 || t=; "
        # An agent an earlier attempt launched just before its ssh dropped may not have written
        # agent.pid yet: wait for it and attach, rather than start a second agent on the slot.
        + _WAIT_STARTING
        + 'p=$(cat "$d/agent.pid" 2>/dev/null); '
        + 'if [ -n "$p" ] && kill -0 "$p" 2>/dev/null && '
          '{ [ ! -r "/proc/$p/cmdline" ] || tr "\\000" " " <"/proc/$p/cmdline" | grep -q "agent start"; }; then '
        + f"echo \"{MARK} attached pid=$p\"; a=1; "
        + "else a=; "
        # The path as the user typed it is data, never shell text: quoted whole, so that `$(...)`,
        # backticks or quotes in it are printed, not run on the host.
        + f"if ! command -v {launcher} >/dev/null 2>&1; then echo {shlex.quote(f'{MARK} {remote_cdui}: not found')}; "
          "exit 127; fi; "
        + f"if [ -f {launcher} ] && [ ! -x {launcher} ]; then "
          f"echo {shlex.quote(f'{MARK} {remote_cdui}: not executable')}; exit 126; fi; "
        + 'rm -f "$d/agent.pid" "$d/agent.exit" "$d/agent.starting"; touch "$d/agent.log"; '
          'off=$(wc -c <"$d/agent.log"); '
        + "CODEFYUI_AGENT_TOKEN=$t; export CODEFYUI_AGENT_TOKEN; "
        + "if command -v setsid >/dev/null 2>&1; then s=setsid; else s=; fi; "
        + f'$s sh -c \'"$@" </dev/null >>"$0/agent.log" 2>&1; echo $? >"$0/agent.exit"\' "$d" {launcher} '
          f'agent start --uds "$d/sock" --foreground --control {url} --name {shlex.quote(name)} & '
        + 'echo $! >"$d/agent.starting"; '
        + "unset CODEFYUI_AGENT_TOKEN t; i=0; "
        + 'while [ ! -s "$d/agent.pid" ] && [ ! -s "$d/agent.exit" ] && [ $i -lt 600 ]; do '
          "sleep 0.1; i=$((i+1)); done; "
        + 'rm -f "$d/agent.starting"; '
        + 'p=$(cat "$d/agent.pid" 2>/dev/null); '
        + 'if [ -z "$p" ]; then tail -c +$((off+1)) "$d/agent.log"; '
          'e=$(cat "$d/agent.exit" 2>/dev/null); echo "' + MARK + ' agent exited code=${e:-?}"; exit "${e:-1}"; fi; '
        + f'echo "{MARK} started pid=$p"; '
        + "fi; "
        + 'if [ -n "$a" ]; then tail -n 0 -f --pid="$p" "$d/agent.log" & else '
          'tail -c +$((off+1)) -f --pid="$p" "$d/agent.log" & fi; f=$!; '
        # stdin: "stop" asks the agent to stop; its end (ssh gone) ends the follower, not the agent.
        # (fd 3: a background list's stdin would otherwise be /dev/null.)
        + '( while IFS= read -r c; do [ "$c" = stop ] && kill -TERM "$p" 2>/dev/null; done; '
          'kill "$f" 2>/dev/null ) <&3 >/dev/null 2>&1 & '
        + 'wait "$f"; if kill -0 "$p" 2>/dev/null; then exit 0; fi; i=0; '
        + 'while [ ! -s "$d/agent.exit" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; '
        + 'e=$(cat "$d/agent.exit" 2>/dev/null); echo "' + MARK + ' agent exited code=${e:-?}"; exit "${e:-1}"'
    )


def _stop_body(rel: str) -> str:
    """SIGTERM to the slot's agent and wait (60 s at most) for it to exit; sets r=0 when none is left.

    An agent the tunnel script has launched but that has not written agent.pid yet would be missed
    and start afterwards with nobody stopping it: while agent.starting names a live starting wrapper
    (an ``agent start`` command line; a reused PID is not one) and neither agent.pid nor agent.exit
    is there, it waits for one of them, 30 s at most, and reports an agent still starting after that."""
    return (f'd="$HOME/{rel}"; r=0; ' + _WAIT_STARTING
            + 'p=$(cat "$d/agent.pid" 2>/dev/null); '
            'if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then kill -TERM "$p"; i=0; '
            'while kill -0 "$p" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; '
            f'if kill -0 "$p" 2>/dev/null; then echo "{MARK} agent $p still running"; r=3; '
            f'else echo "{MARK} agent $p stopped"; fi; '
            f'elif [ ! -s "$d/agent.exit" ] && {_STARTING}; then '
            f'echo "{MARK} agent starting (pid $w) did not report its PID within 30 s; left running"; r=3; '
            f'else echo "{MARK} no agent running"; fi; ')


def stop_script(iid: str, slot: int) -> str:
    """A short ssh when no connection is there: stop the agent (its runs get their grace)."""
    return _PRELUDE + _stop_body(remote_dir_rel(iid, slot)) + 'exit "$r"'


def cleanup_script(iid: str, slot: int, remote_cdui: str) -> str:
    """Delete and remove: stop the agent, forget the slot's credential, delete the slot's folder.
    Only this control plane's own ``<id>-<slot>`` folder; both kept if the agent cannot be stopped
    or a connection is still attached (its socket is still served)."""
    rel = remote_dir_rel(iid, slot)
    url = control_url(iid, slot)
    return (_PRELUDE + _stop_body(rel)
            + f'if [ "$r" -ne 0 ]; then echo "{MARK} kept $d and the credential for {url}"; exit 3; fi; '
            + 'if [ -S "$d/sock" ] && { if command -v ss >/dev/null 2>&1; then ss -Hxl; '
              'else cat /proc/net/unix 2>/dev/null; fi; } | grep -qF "$d/sock"; then '
              f'echo "{MARK} a connection is still attached to $d/sock; kept $d and the credential for {url}"; '
              "exit 3; fi; "
            + f"{_launcher(remote_cdui)} agent forget {url} >/dev/null 2>&1; "
            + f'rm -rf "$d" && echo "{MARK} cleaned $d and the credential for {url}"')


def tunnel_command(t: Target, iid: str, slot: int, remote_abs_dir: str, local_socket: str, remote_cdui: str,
                   name: str, ssh: str = "ssh") -> list[str]:
    return (base_args(t, ssh) + ["-R", f"{remote_abs_dir}/sock:{local_socket}", "--", t.target,
                                 _remote(tunnel_script(iid, slot, remote_cdui, name))])


def short_command(t: Target, script: str, ssh: str = "ssh") -> list[str]:
    """A short-lived ssh (preparation, stop, cleanup): no forwarding at all."""
    return base_args(t, ssh) + ["-o", "ClearAllForwardings=yes", "--", t.target, _remote(script)]


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
