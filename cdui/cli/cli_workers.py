"""``cdui workers ...`` and ``cdui agent ...`` commands.

The agent's exit codes are :mod:`cdui.core.exit_codes`; which enrollment failures
end a start and which are retried is :func:`enroll_failure`.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cdui import __version__
from cdui.agent.instances import lock
from cdui.cli import daemon
from cdui.cli.cli_ssh import add_ssh_commands, tunnel_line
from cdui.cli.cli_util import CONTROL_HELP, _die, _read_pid, hold_spool
from cdui.cli.client import Client
from cdui.cli.oneshot_cli import check_flags, claim_instance, list_lines, run_one_shot
from cdui.core import config, exit_codes, logfile, project, trust
from cdui.core.atomic import write_private
from cdui.core.backoff import backoff_delays
from cdui.core.config import machine_id
from cdui.core.errors import CduiError
from cdui.core.layout import READ_ROOTS_LABEL
from cdui.core.netaddr import is_loopback_host
from cdui.core.private import private_dir, restrict_umask
from cdui.core.trust import Trust
from cdui.core.uds_http import post_json
from cdui.run.devices import detect_devices


def parse_duration(v: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", v or "")
    if not m:
        raise argparse.ArgumentTypeError(f"{v!r} is not a duration (e.g. 3600, 30m, 24h, 7d)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


# -- workers -------------------------------------------------------------------------
def _client(args: argparse.Namespace):
    client = Client.for_user_data(config.load().user_data, getattr(args, "control", None))
    pin = getattr(args, "ca_fingerprint", None)
    if pin is not None:
        # Through the TLS proxy with a self-signed key: pinned, as the agent pins it.
        client.trust = Trust(trust.parse_pin(pin), "--ca-fingerprint")
    return client


def cmd_token(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"ttl_s": args.ttl, "uses": args.uses}
    if args.for_name:
        body["worker"] = args.for_name
    if args.public_url:
        try:
            body["control"] = config.public_url(args.public_url)
        except ValueError:
            return _die(f"--public-url {args.public_url!r} is not an http:// or https:// address; give the "
                        f"address workers use, e.g. --public-url https://codefyui.example.com", 2)
    elif args.control and urlsplit(args.control).scheme == "https":
        # Through a TLS proxy the server sees plain HTTP: say which address and scheme this call used.
        u = urlsplit(args.control)
        body["control"] = f"https://{u.netloc}"
    res = _client(args).call("POST", "/api/workers/tokens", body)
    command = res["command"]
    pin = trust.parse_pin(args.ca_fingerprint) if args.ca_fingerprint else None
    https = command.split(" --control ", 1)[-1].startswith("https://")
    if pin is not None and "ca_fingerprint" not in res and https:
        # The server cannot read the proxy's certificate; the pin given here is the one workers need.
        command += f" --ca-fingerprint {pin}"
    print(res["token"])
    print(f"# valid until {res['expires_at']} for {res['uses']} agent(s); run this on the worker:")
    if res.get("note"):
        print(f"# note: {res['note']}")
    print(command)
    return 0


def update_flag(update: Any) -> str:
    """The list's word on a worker's update state (docs/updating.md): nothing while it is current."""
    if not isinstance(update, dict) or update.get("state") == "current":
        return ""
    if update.get("state") == "updating":
        return f" [updating to {update.get('to')} since {update.get('since')}]"
    return f" [behind: the control plane runs {update.get('to')}]"


def cmd_list(args: argparse.Namespace) -> int:
    res = _client(args).call("GET", "/api/workers")
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    if not res["workers"]:
        print("no workers enrolled; add one with `cdui workers token`")
    for w in res["workers"]:
        devs = ", ".join(f"{d['device']} {d['in_use']}/{d['slots']}" for d in w["devices"]) or "-"
        flags = (" [degraded]" if w.get("degraded") else "") + (" [unencrypted HTTP]" if w.get("unencrypted") else "")
        flags += update_flag(w.get("update"))
        if w.get("tls_pin") or w.get("tls_next_pin"):
            flags += f" [pin {(w.get('tls_pin') or '?')[:19]}…" + (
                f", next {w['tls_next_pin'][:19]}…]" if w.get("tls_next_pin") else "]")
        print(f"{w['name']:<16} {w['status']:<9} v{w['version'] or '?':<8} devices: {devs}; "
              f"runs: {', '.join(w['runs']) or '-'}; last contact {w['last_seen'] or 'never'}; "
              f"from {w['address'] or '-'}; labels: {', '.join(w['labels']) or '-'}{flags}")
        for line in catalog_lines(w):
            print(line)
        for line in list_lines(w):
            print(line)
        if w.get("ssh"):
            print(tunnel_line(w["ssh"]))
    for r in res.get("rejected", []):
        print(f"rejected: {r['name']} from {r['address']} at {r['at']}: {r['reason']}")
    return 0


def catalog_lines(w: dict[str, Any]) -> list[str]:
    """The lines that say a worker is degraded, and why (pure: a worker card of GET /api/workers)."""
    c = w.get("catalog") or {}
    out = []
    if c.get("degraded") or w.get("degraded"):
        why = [f"lacks {', '.join(c['lacking'])}"] if c.get("lacking") else []
        why += [f"has extra {', '.join(c['extra'])}"] if c.get("extra") else []
        out.append(f"  degraded: node catalog differs: {'; '.join(why) or 'no types named'}"
                   + (" (`any` skips it; runs using those types are refused)" if c.get("lacking") else ""))
    if c.get("warning"):
        out.append(f"  catalog: {c['warning']}")
    have = w.get("packs") or {}
    if have or w.get("packs_lacking"):
        out.append("  packs: " + (", ".join(f"{pid} {p.get('version') or '?'} ({str(p.get('sha256', ''))[:12]})"
                                           for pid, p in sorted(have.items())) or "none"))
    for p in w.get("packs_lacking") or []:
        what = "lacks" if p.get("have") is None else f"has another build of ({str(p['have'])[:12]})"
        out.append(f"  {what} pack {p['id']} {p.get('version') or ''} ({str(p.get('sha256', ''))[:12]}) of the "
                   f"control plane: on the worker, `{p['install']}`")
    return out


def cmd_action(args: argparse.Namespace) -> int:
    c = _client(args)
    if args.action == "remove":
        res = c.call("DELETE", f"/api/workers/{args.name}")
        print(f"departed instance {args.name} removed from the list" if res.get("instance") else
              f"worker {args.name} removed; its credential is revoked")
    elif args.action == "reissue":
        res = c.call("POST", f"/api/workers/{args.name}/reissue", {})
        print(res["token"])
        print(f"# on {args.name}, first run `cdui agent forget URL` if its old credential file is still there, then:")
        print(res["command"])
    else:
        res = c.call("POST", f"/api/workers/{args.name}/{args.action}")
        print(f"worker {args.name}: {'draining' if res['drained'] else 'accepting runs'}")
    return 0


def cmd_share_by_memory(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"enabled": args.state == "on"}
    if args.device:
        body["device"] = args.device
    res = _client(args).call("POST", f"/api/workers/{args.name}/share-by-memory", body)
    shared = res["share_by_memory"]
    print(f"worker {args.name}: " + ("admits by slot count" if not shared else
                                     "shares every device by memory" if shared == ["*"] else
                                     f"shares {', '.join(shared)} by memory"))
    return 0


def cmd_follow_updates(args: argparse.Namespace) -> int:
    res = _client(args).call("POST", f"/api/workers/{args.name}/follow-updates", {"enabled": args.state == "on"})
    print(f"worker {args.name}: " + ("its agent follows `cdui update` (unless it has CODEFYUI_AGENT_AUTO_UPDATE=0)"
                                     if res["follow_updates"] else
                                     "its agent follows `cdui update` only with CODEFYUI_AGENT_AUTO_UPDATE=1"))
    return 0


# -- agent -----------------------------------------------------------------------------
def _check_control(url: str) -> str:
    u = urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise CduiError("bad_usage", f"--control {url!r} is not an http:// or https:// URL",
                        hint="e.g. --control http://192.168.1.5:8000")
    return url.rstrip("/")


def _load_credential(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _enroll(control: str, token: str, name: str | None, devices: list[str],
            trust: Trust | None = None, uds: str | None = None) -> dict[str, Any]:
    body = {"token": token, "name": name, "devices": devices, "version": __version__, "machine_id": machine_id()}
    if uds:  # an SSH worker: through the tunnel's socket; --control only names the credential
        return dict(post_json(uds, urlsplit(control).netloc, "/api/workers/enroll", body))
    c = Client(control, timeout=30, trust=trust)
    return c.call("POST", "/api/workers/enroll", body)


# Answers that say "not now" rather than "no": the control plane is down or restarting
# behind a proxy (502/503/504), or enrollment is rate limited for a while (429).
TRANSIENT_ENROLL_STATUSES = frozenset({429, 502, 503, 504})
# Refusals retrying cannot fix that are the control plane's word on this agent (exit 2), not a start
# failure (exit 4): another version, a name enrolled already, not the pinned key.
REFUSED_ENROLL_CODES = frozenset({"version_mismatch", "name_taken", "pin_mismatch"})


def enroll_failure(err: CduiError, uds: str | None = None, one_shot: bool = False) -> int | None:
    """What a failed enrollment calls for: None to retry it, else the agent's exit code.

    Retried besides "not now": answers that may heal without touching the agent, because the
    address may not (yet) lead to the control plane that issued the token: the token is unknown
    there (a name still pointing at another server, or a server started on another database),
    or the answer is not cdui's own (any page without cdui's JSON error body: a proxy's or some
    other web server's error). Through an SSH tunnel neither can happen (the socket leads to the
    control plane that made the one-time token), so there they end the start as before and the
    control plane's own retry brings a new token. A one-shot agent is a batch job holding an
    allocation: it ends with "could not start" (exit 4) on these too, rather than wait on an address
    that may never heal. Every other refusal is final (CONTRACT.md)."""
    if err.code == "unreachable" or err.status in TRANSIENT_ENROLL_STATUSES:
        return None
    if not uds and not one_shot and err.code in ("token_unknown", "http_error"):
        return None
    return exit_codes.REFUSED if err.code in REFUSED_ENROLL_CODES else exit_codes.START


def enroll_advice(err: CduiError, control: str) -> str:
    """What to check while a failed enrollment is retried (printed with each retry)."""
    if err.code == "token_unknown":
        return (f"a token works only at the control plane (and database) that issued it: check that {control} "
                f"reaches that server, or make a token there with `cdui workers token`")
    if err.code == "http_error":
        return (f"the answer is not from cdui (a proxy's or another web server's page): check that {control} is "
                f"cdui's address and that the proxy forwards /api/ to it")
    return "the control plane is not reachable or not ready"


def enroll_with_retries(control: str, token: str, name: str | None, devices: list[str],
                        sleep: Callable[[float], None] = time.sleep, trust: Trust | None = None,
                        uds: str | None = None, one_shot: bool = False) -> dict[str, Any]:
    """Enroll, retrying what may heal with the agent's reconnect backoff; raise the final refusal."""
    delays = backoff_delays()
    while True:
        try:
            return _enroll(control, token, name, devices, trust, uds)
        except CduiError as err:
            if enroll_failure(err, uds, one_shot) is not None:
                raise
            delay = next(delays)
            when = time.strftime("%H:%M:%S", time.localtime(time.time() + delay))
            print(f"cdui: enrollment at {control} failed: {err}; {enroll_advice(err, control)}; "
                  f"retrying in {delay:.1f} s (at {when})", file=sys.stderr, flush=True)
            sleep(delay)


@contextlib.contextmanager
def enroll_lock(cred_path: Path) -> Iterator[None]:
    """Hold an exclusive lock next to the credential file while checking for and writing it."""
    cred_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(str(cred_path.with_name(cred_path.name + ".lock")), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        lock(fd, "enrollment", "another agent in this user data folder is enrolling; waiting for it")
        yield
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def _agent_json(user_data: Path) -> Path:
    return user_data / "agent.json"


def _mounts(user_data: Path) -> dict[str, str]:
    try:
        return dict(json.loads(_agent_json(user_data).read_text()).get("mounts", {}))
    except (OSError, ValueError):
        return {}


def _labels_fn(user_data: Path):
    mounts = _mounts(user_data)

    def labels() -> dict[str, str]:
        # A mount whose folder is missing is not offered until it appears, so no run is placed on an empty folder.
        return {k: v for k, v in mounts.items() if Path(v).is_dir()}
    return labels


def cmd_agent_start(args: argparse.Namespace) -> int:
    from cdui.agent.agent import credential_path
    pin_flag = _pin_flag(args)
    if isinstance(pin_flag, int):
        return pin_flag
    bad = check_flags(args)
    if bad is not None:
        return _die(bad, exit_codes.REFUSED)
    if args.one_shot:
        args.foreground = True  # a one-shot agent always runs in the foreground and writes no pidfile
    if args.project is not None:
        # As for `cdui start --project`: the setting carries it to the background agent and its runs.
        try:
            os.environ[project.PROJECT_SETTING] = str(project.find(args.project))
        except CduiError as err:
            return _die(str(err), exit_codes.START)
    if args.foreground:
        # The agent's credential, spool and logs are this user's alone; the
        # daemonising parent opens its files with explicit modes instead, so the
        # agent still knows the user's own umask for its run subprocesses.
        restrict_umask()
    cfg = config.load()
    ud = private_dir(cfg.user_data)
    if args.one_shot:
        instance = claim_instance(args, ud)
        if isinstance(instance, int):
            return instance
    try:
        control = _check_control(args.control)
    except CduiError as err:
        return _die(str(err), exit_codes.REFUSED)
    if args.uds and not args.foreground:
        return _die("--uds needs --foreground (the control plane that started it over ssh keeps it running)",
                    exit_codes.REFUSED)
    u = urlsplit(control)
    if u.scheme == "http" and not is_loopback_host(u.hostname or "") and not args.uds:
        print(f"cdui: warning: {control} is unencrypted HTTP: the worker token and every run's inputs cross the "
              f"network in plain text; use this only on a trusted LAN or VPN", file=sys.stderr)
    pidfile = ud / "agent.pid"
    if args.mount is not None:
        refused = _save_mount(args, ud, pidfile)
        if refused is not None:
            return refused
    shared = _mounts(ud).get("data")
    if not os.environ.get(project.PROJECT_SETTING) and shared and (Path(shared) / project.MANIFEST).is_file():
        # The shared data folder is a project (its control plane runs with --project on it): this worker
        # treats it as that project, as if started with --project on it.
        os.environ[project.PROJECT_SETTING] = shared
        cfg = config.load()
    cred_path = credential_path(ud, control)
    devices = [d.strip() for d in args.devices.split(",") if d.strip()] if args.devices else None
    cred = _stored_or_enrolled(args, control, cred_path, devices, pin_flag)
    if isinstance(cred, int):
        return cred
    if args.token and not args.foreground_child and args.instance is None:  # an array passes it to every task
        print(f"cdui: note: a credential for {control} is already stored ({cred_path}); --token is not used. "
              f"To enroll again, run `cdui agent forget {control}` first", file=sys.stderr)
    if args.name and args.name != cred["name"] and not args.foreground_child:
        return _die(f"the stored credential is for worker {cred['name']!r}, not {args.name!r}; run "
                    f"`cdui agent forget {control}` to enroll under another name", exit_codes.REFUSED)
    if args.one_shot:
        project.open_at_start(logging.getLogger("cdui.agent.agent"))  # its .env, as a long-running agent reads it
        return run_one_shot(args, cfg, control, cred, devices or None, _labels_fn(ud),
                            _agent_trust(pin_flag, cred, cred_path))
    if args.foreground:
        if args.uds:  # an SSH worker's agent: its PID next to its tunnel socket, where the remote script looks
            pidfile = Path(args.uds).parent / "agent.pid"
        return _run_foreground(cfg, control, cred, devices, pidfile, _agent_trust(pin_flag, cred, cred_path),
                               args.uds, log_file=args.log_file)
    running = _read_pid(pidfile)
    if running:
        print(f"an agent is already running (pid {running}); `cdui agent stop` stops it")
        return 0
    return _spawn_and_wait(args, ud, control, cred)


def _stored_or_enrolled(args: argparse.Namespace, control: str, cred_path: Path,
                        devices: list[str] | None, pin_flag: str | None = None) -> dict[str, Any] | int:
    """The stored credential for ``control``, or a new one from enrolling with the token; an exit code if neither."""
    from cdui.agent.agent import hostname
    # Agents started together from one user data folder enroll one at a time: the first uses
    # the token, the others find its credential once they hold the lock (one token use).
    with enroll_lock(cred_path):
        cred = _load_credential(cred_path)
        if cred is None:
            token = args.token or os.environ.get("CODEFYUI_AGENT_TOKEN")
            if not token:
                return _die(f"no stored credential for {control} and no enrollment token; give --token (make one on "
                            f"the control plane with `cdui workers token`) or set CODEFYUI_AGENT_TOKEN",
                            exit_codes.START)
            try:
                res = enroll_with_retries(control, token, args.name or hostname(), devices or detect_devices(),
                                          trust=Trust(pin_flag), uds=args.uds, one_shot=bool(args.one_shot))
            except CduiError as err:
                return _die(f"enrollment failed: {err}",
                            enroll_failure(err, args.uds, bool(args.one_shot)) or exit_codes.START)
            cred = {"credential": res["credential"], "name": res["worker"], "control": control}
            if pin_flag is not None:  # the enrollment's own connection matched it
                cred[trust.CREDENTIAL_KEY] = pin_flag
            write_private(cred_path, json.dumps(cred))
            print(f"enrolled as worker {res['worker']} at {control}; credential saved in {cred_path}", file=sys.stderr)
            args.token = None  # used now; the note below is for a token given beside a stored credential
    return cred


def _pin_flag(args: argparse.Namespace) -> str | int | None:
    """The parsed ``--ca-fingerprint``, None without one, or the exit code of a refused one."""
    if args.ca_fingerprint is None:
        return None
    try:
        pin = trust.parse_pin(args.ca_fingerprint)
    except CduiError as err:
        return _die(str(err), exit_codes.REFUSED)
    if urlsplit(args.control).scheme != "https":
        # A pin on plain HTTP would promise a check that never happens.
        return _die(f"--ca-fingerprint pins a TLS certificate, but --control {args.control} is not an https:// "
                    f"address", exit_codes.REFUSED)
    return pin


def _agent_trust(pin_flag: str | None, cred: dict[str, Any], cred_path: Path) -> tuple[Trust, Callable[[], None]]:
    """The running agent's certificate check, and what to do once a connection passed it."""
    t = trust.agent_trust(pin_flag, cred, cred_path, lambda msg: print(f"cdui: warning: {msg}", file=sys.stderr))

    def on_connected() -> None:
        # A new --ca-fingerprint replaces the stored pin only once a connection proved it right.
        if pin_flag is not None and trust.record_pin(cred_path, pin_flag):
            print(f"cdui: recorded the pin {pin_flag} in {cred_path}", file=sys.stderr, flush=True)
        elif t.verified is not None and t.verified == t.next_pin and t.verified != t.pin:
            # The proxy switched to the next key: it is the pin now, and the old one is dropped.
            trust.record_pin(cred_path, t.verified)
            t.pin, t.next_pin = t.verified, None
            logging.getLogger("cdui.agent.agent").info("the proxy presents the next pinned key %s: it is the pin now "
                                                 "(recorded in %s)", t.verified, cred_path)
    return t, on_connected


def cmd_agent_pin(args: argparse.Namespace) -> int:
    """``cdui agent pin URL --next PIN``: hold the proxy's next key beside the current pin."""
    from cdui.agent.agent import credential_path
    try:
        control = _check_control(args.url)
        pin = None if args.clear_next else trust.parse_pin(args.next, "--next")
    except CduiError as err:
        return _die(str(err), 2)
    if urlsplit(control).scheme != "https":
        return _die(f"{control} is not an https:// address: there is no certificate to pin", 2)
    path = credential_path(config.load().user_data, control)
    if _load_credential(path) is None:
        return _die(f"no credential is stored for {control} ({path}); enroll first with "
                    f"`cdui agent start --control {control} --token ...`", 2)
    trust.record_next_pin(path, pin)
    if pin is None:
        print(f"dropped the next pin for {control} ({path})")
    else:
        print(f"the next pin for {control} is {pin} ({path}); a running agent takes it at its next heartbeat "
              f"and accepts either key from its next connection on")
    return 0


def _save_mount(args: argparse.Namespace, ud: Path, pidfile: Path) -> int | None:
    """Record ``--mount LABEL=PATH`` in agent.json; an exit code if refused, else None.

    Changing mounts while an agent runs is refused: the running agent would go on using the old ones."""
    label, sep, path = args.mount.partition("=")
    if not sep or not label:
        return _die(f"--mount {args.mount!r} must be LABEL=PATH (e.g. data=/nas/codefyui/data)", exit_codes.START)
    if label == READ_ROOTS_LABEL:
        return _die(f"--mount label {label!r} is the label that reports CODEFYUI_READ_ROOTS; choose another",
                    exit_codes.START)
    running = _read_pid(pidfile)
    if running and not args.foreground_child:
        return _die(f"an agent is running (pid {running}); stop it with `cdui agent stop` before changing --mount",
                    exit_codes.START)
    mounts = _mounts(ud)
    if path:
        mounts[label] = str(Path(path).expanduser().absolute())
    else:
        mounts.pop(label, None)
    write_private(_agent_json(ud), json.dumps({"mounts": mounts}, indent=2))
    return None


def _spawn_and_wait(args: argparse.Namespace, ud: Path, control: str, cred: dict[str, Any]) -> int:
    """Start the agent in the background and wait (60 s at most) until it says it connected or stopped."""
    status_file = ud / "agent-status.json"
    status_file.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "cdui", "agent", "start", "--control", control, "--foreground", "--_child"]
    if args.devices:
        cmd += ["--devices", args.devices]
    if args.ca_fingerprint:  # recorded by the agent only after it connected with it
        cmd += ["--ca-fingerprint", args.ca_fingerprint]
    log_path = ud / "agent.log"
    cmd += ["--log-file", str(log_path)]
    proc = daemon.spawn(cmd, log_path)

    def ready(rc: int | None) -> int | None:
        st = _load_credential(status_file) or {}
        if st.get("pid") not in (None, proc.pid):
            st = {}  # another agent of this user data folder (another control plane's) wrote it
        if st.get("state") == "connected":
            print(f"agent {cred['name']} connected to {control} (pid {proc.pid}, log {log_path})")
            return 0
        if st.get("state") == "refused" or rc is not None:
            proc.wait(timeout=30) if rc is None else None
            return _die(f"the agent stopped: {st.get('message') or 'see ' + str(log_path)}", proc.returncode or 2)
        return None
    answer = daemon.wait_ready(proc, ready, 60)
    if answer is not None:
        return answer
    print(f"agent {cred['name']} started (pid {proc.pid}) but is not connected yet: "
          f"{(_load_credential(status_file) or {}).get('message', '')}; it keeps retrying (log {log_path})")
    return 0


def _run_foreground(cfg: Any, control: str, cred: dict[str, Any], devices: list[str] | None, pidfile: Path,
                    checks: tuple[Trust, Callable[[], None]] | None = None, uds: str | None = None,
                    log_file: str | None = None) -> int:
    from cdui.agent.agent import Agent, serve
    logfile.setup(Path(log_file).absolute() if log_file else None, cfg["CODEFYUI_LOG_MAX_BYTES"],
                  cfg["CODEFYUI_LOG_BACKUP_COUNT"])
    ud = cfg.user_data
    config.warn_unavailable(logging.getLogger("cdui.agent.agent"))
    project.open_at_start(logging.getLogger("cdui.agent.agent"))
    held = hold_spool(ud, control, cred)
    if isinstance(held, int):
        return held
    # Ignored until serve() handles it: an SSH worker's pushed pack sends SIGUSR1 to the PID in the pidfile, which
    # would otherwise end an agent still starting.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    with daemon.PidFile(pidfile).held():
        try:
            agent = Agent(control, cred["credential"], cred["name"], devices or detect_devices(), ud, machine_id(),
                          labels=_labels_fn(ud), status_file=ud / "agent-status.json", config=cfg,
                          trust=checks[0] if checks else None, on_connected=checks[1] if checks else None, uds=uds)
            code = asyncio.run(serve(agent))
        finally:
            # Before the pidfile goes: whoever starts an agent once it is gone finds the spool free.
            held.release()
    if agent.reexec is not None:  # updated itself (CODEFYUI_AGENT_AUTO_UPDATE): the same pid runs the new version
        agent.become_updated()
    return code


def cmd_agent_stop(args: argparse.Namespace) -> int:
    cfg = config.load()
    pid = daemon.PidFile(cfg.user_data / "agent.pid").running()
    if not pid:
        print("no agent is running")
        return 0
    # Runs get 10 s to stop, then their last events and files go out, and runs recording node
    # outputs may take up to the write timeout to finish writing them.
    from cdui.agent.agent import stop_wait_s
    limit = stop_wait_s(float(cfg["CODEFYUI_WORKER_OUTPUTS_WRITE_TIMEOUT_S"]))
    # Not killed at the deadline: it may still be uploading its runs' outputs, which a kill would cut off.
    if daemon.stop(pid, limit, kill=False) == "running":
        return _die(f"the agent (pid {pid}) did not stop within {limit:.0f} s", 1)
    print(f"agent (pid {pid}) stopped")
    return 0


def cmd_agent_forget(args: argparse.Namespace) -> int:
    from cdui.agent.agent import credential_path
    try:
        control = _check_control(args.url)
    except CduiError as err:
        return _die(str(err), 2)
    path = credential_path(config.load().user_data, control)
    if path.exists():
        path.unlink()
        print(f"forgot the credential for {control} ({path}); the next start needs a token")
    else:
        print(f"no credential is stored for {control}")
    return 0


def _pin_arg(s: argparse.ArgumentParser) -> None:
    s.add_argument("--ca-fingerprint", default=None, metavar="sha256:HEX",
                   help="the TLS proxy's key, for an https:// --control whose certificate this machine does not "
                        "trust (as `cdui agent start` takes it); `workers token` also puts it in the command")


def add_commands(sub: Any) -> None:
    w = sub.add_parser("workers", help="manage remote workers")
    wsub = w.add_subparsers(dest="workers_command", metavar="ACTION", required=True, parser_class=type(w))
    s = wsub.add_parser("token", help="make an enrollment token")
    s.add_argument("--ttl", type=parse_duration, default=86400.0, help="validity, e.g. 24h (default), 30m, 3600")
    s.add_argument("--uses", type=int, default=1, help="how many agents may use it (default 1)")
    s.add_argument("--for", dest="for_name", default=None, metavar="NAME", help="a reissue token for worker NAME")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.add_argument("--public-url", default=None, metavar="URL",
                   help="the address workers use, e.g. the TLS proxy's https://codefyui.example.com (default: "
                        "CODEFYUI_PUBLIC_URL, else the address this command reached)")
    _pin_arg(s)
    s.set_defaults(func=cmd_token)
    s = wsub.add_parser("list", help="list workers")
    s.add_argument("--json", action="store_true", help="print the answer of GET /api/workers as JSON")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    _pin_arg(s)
    s.set_defaults(func=cmd_list)
    for action in ("drain", "undrain", "remove", "reissue"):
        s = wsub.add_parser(action, help=f"{action} a worker")
        s.add_argument("name", metavar="NAME", help="the worker's name (`cdui workers list` shows them)")
        s.add_argument("--control", default=None, help=CONTROL_HELP)
        _pin_arg(s)
        s.set_defaults(func=cmd_action, action=action)
    s = wsub.add_parser("share-by-memory", help="admit runs on a worker's devices by memory instead of slot count")
    s.add_argument("name", metavar="NAME", help="the worker's name (`cdui workers list` shows them)")
    s.add_argument("state", choices=("on", "off"), help="on: admit runs by memory; off: by slot count again")
    s.add_argument("--device", default=None, help="only this device, e.g. cuda:0 (default: every device)")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.set_defaults(func=cmd_share_by_memory)
    s = wsub.add_parser("follow-updates", help="let a worker's agent install the control plane's `cdui update` "
                                               "(the Workers panel's \"Follow updates\")")
    s.add_argument("name", metavar="NAME", help="the worker's name (`cdui workers list` shows them)")
    s.add_argument("state", choices=("on", "off"), help="on: its agent updates itself when refused for its version "
                                                         "(unless set to CODEFYUI_AGENT_AUTO_UPDATE=0); off: only "
                                                         "with CODEFYUI_AGENT_AUTO_UPDATE=1")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.set_defaults(func=cmd_follow_updates)

    add_ssh_commands(wsub)

    a = sub.add_parser("agent", help="run this machine as a worker")
    asub = a.add_subparsers(dest="agent_command", metavar="ACTION", required=True, parser_class=type(a))
    s = asub.add_parser("start", help="enroll (first time) and connect to a control plane")
    s.add_argument("--control", required=True, metavar="URL", help="the control plane, e.g. http://192.168.1.5:8000")
    s.add_argument("--token", default=None, help="enrollment token (first start only; or CODEFYUI_AGENT_TOKEN)")
    s.add_argument("--name", default=None, help="worker name (default: this host's name)")
    s.add_argument("--devices", default=None, help="devices to offer, e.g. cpu or cuda:0,cuda:1")
    s.add_argument("--mount", default=None, metavar="LABEL=PATH", help="shared data folder, e.g. data=/nas/data")
    s.add_argument("--project", default=None, metavar="DIR",
                   help="open the project folder DIR (its checkout on this machine): its custom nodes, assets and "
                        ".env secrets are what this worker's runs use (docs/projects.md)")
    s.add_argument("--foreground", action="store_true", help="stay attached (for systemd)")
    s.add_argument("--log-file", default=None, metavar="PATH",
                   help="with --foreground: log to PATH, rotated by size (CODEFYUI_LOG_MAX_BYTES, "
                        "CODEFYUI_LOG_BACKUP_COUNT), reopened on SIGHUP (default: stderr, the journal under systemd)")
    s.add_argument("--ca-fingerprint", default=None, metavar="sha256:HEX",
                   help="pin the TLS proxy's key (SHA-256 of its certificate's SubjectPublicKeyInfo); stored with "
                        "the credential")
    s.add_argument("--one-shot", action="store_true",
                   help="take exactly one run, report it and exit (exit codes 0-4; for batch jobs and ssh)")
    s.add_argument("--instance", nargs="?", const="", default=None, metavar="ID",
                   help="one-shot only: one of many agents sharing this credential, as NAME.ID (default ID from "
                        "SLURM_*; else random)")
    s.add_argument("--run-id", default=None, metavar="ID", help="one-shot only: take exactly this run")
    s.add_argument("--uds", default=None, metavar="PATH",
                   help="connect through this Unix socket (SSH workers; --control still names the credential)")
    s.add_argument("--_child", dest="foreground_child", action="store_true", help=argparse.SUPPRESS)
    s.set_defaults(func=cmd_agent_start)
    s = asub.add_parser("stop", help="stop the background agent")
    s.set_defaults(func=cmd_agent_stop)
    s = asub.add_parser("pin", help="hold the TLS proxy's next key beside the current pin (a key rotation)")
    s.add_argument("url", metavar="URL", help="the control plane the credential is for, as given to --control")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--next", default=None, metavar="sha256:HEX", help="the key the proxy will present next")
    g.add_argument("--clear-next", action="store_true", help="drop the next pin")
    s.set_defaults(func=cmd_agent_pin)
    s = asub.add_parser("forget", help="delete the stored credential for URL")
    s.add_argument("url", metavar="URL", help="the control plane the credential is for, as given to --control")
    s.set_defaults(func=cmd_agent_forget)
