"""The ``cdui`` command line (argparse).

Errors are printed as one line ``cdui: error: <what happened> (<what to do>)``
on stderr. Exit codes: 0 success; 1 failure (a run that did not succeed, a
non-2xx answer); 2 bad usage. The agent has its own table (docs).
"""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from cdui import __version__
from cdui.cli import (
    cli_apps,
    cli_datasets,
    cli_devices,
    cli_ops,
    cli_plugin,
    cli_project,
    cli_project_pins,
    cli_runs,
    cli_studies,
    cli_sweeps,
    cli_update,
    cli_workers,
    daemon,
)
from cdui.cli.cli_util import CONTROL_HELP, _die, _read_pid
from cdui.cli.client import Client, server_info
from cdui.core import argv_token, config, config_file, logfile, project
from cdui.core.config import absolute_paths, warn_unavailable
from cdui.core.errors import CduiError
from cdui.core.private import private_dir, restrict_umask
from cdui.wire.target import TargetJson, parse_target, target_json

QUICK_STOP_S = 2.0  # `cdui stop` kills the server this long after asking it to stop


class Parser(argparse.ArgumentParser):
    """argparse with one error line (exit 2, the usage hint) and a "did you mean" for a mistyped command,
    choice or flag."""

    # The parsers of the command being parsed, outermost first (argparse hands each subcommand's
    # arguments to its own parser, and the outermost one reports the flags none of them knew).
    seen: list[argparse.ArgumentParser] = []

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # only the outermost parser's
        Parser.seen = []
        return super().parse_args(args, namespace)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        Parser.seen.append(self)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:  # one line, exit 2, with the usage hint
        where = Parser.seen[-1] if Parser.seen else self
        self.exit(2, f"cdui: error: {message}{_did_you_mean(message, where)} (see `{where.prog} --help`)\n")


def _did_you_mean(message: str, parser: argparse.ArgumentParser) -> str:
    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if m:
        choices = re.findall(r"'([^']*)'", m.group(2)) or [c.strip() for c in m.group(2).split(",")]
        close = difflib.get_close_matches(m.group(1), choices, 1, 0.6)
        return f"; did you mean {close[0]}?" if close else ""
    m = re.match(r"unrecognized arguments: (.*)$", message)
    if m:
        flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
        words = [w for w in m.group(1).split() if w.startswith("-")]
        said = []
        for word in words:
            close = difflib.get_close_matches(word.split("=")[0], flags, 1, 0.6)
            if close:
                said.append(f"{word + ': ' if len(words) > 1 else ''}did you mean {close[0]}?")
        return "; " + "; ".join(said) if said else ""
    return ""


def _config():
    return config.load()


# -- server lifecycle -----------------------------------------------------------


def _health(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    try:
        status, body = Client(url, timeout=timeout).request("GET", "/api/health")
    except CduiError:
        return None
    # 503: the server answers but is degraded (a full disk): it is up, and its body says why.
    return body if status in (200, 503) and isinstance(body, dict) else None


DEFAULT_PORT = 8000
PORT_FILE = "port"  # in the user data folder: the port the last `cdui start --port N` started on


def start_port(asked: int | None, cfg: Any) -> tuple[int, str]:
    """The port ``cdui start`` listens on, and where it came from: ``--port``, else ``CODEFYUI_PORT``, else
    the port the last ``cdui start --port N`` remembered in the user data folder, else 8000."""
    if asked is not None:
        return asked, "--port"
    if cfg["CODEFYUI_PORT"] is not None:
        return int(cfg["CODEFYUI_PORT"]), "CODEFYUI_PORT"
    try:
        remembered = int((cfg.user_data / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        remembered = 0
    if 1 <= remembered <= 65535:
        return remembered, f"the port the last `cdui start --port` used ({cfg.user_data / PORT_FILE})"
    return DEFAULT_PORT, "the default"


def _remember_port(user_data: Path, port: int) -> None:
    try:
        (user_data / PORT_FILE).write_text(f"{port}\n")
    except OSError as exc:
        print(f"cdui: warning: could not remember port {port} in {user_data / PORT_FILE}: {exc.strerror or exc}; "
              f"the next `cdui start` uses CODEFYUI_PORT or 8000", file=sys.stderr)


def cmd_start(args: argparse.Namespace) -> int:
    if args.extras:
        # bin/cdui installs the extras and takes the flag away before starting; here
        # (a cdui installed from a wheel) pip is the way.
        return _die(f"--extras is done by the launcher: run `bin/cdui start --extras {args.extras}` from "
                    f"the checkout, or install them with `pip install 'cdui[{args.extras}]'` and start again", 2)
    if args.foreground:
        # The server's database, logs and tokens are this user's alone. Only the
        # server process itself narrows its umask (the daemonising parent opens
        # its files with explicit modes), so it still knows the user's own
        # umask for its run subprocesses.
        restrict_umask()
    if args.project is not None:
        # The setting, not a flag, carries the project on: the background server and every process it
        # starts read their folders from their settings (cdui/core/layout.py).
        try:
            os.environ[project.PROJECT_SETTING] = str(project.find(args.project))
        except CduiError as err:
            return _die(str(err), 2)
    cfg = _config()
    ud = private_dir(cfg.user_data)
    port, source = start_port(args.port, cfg)
    pid = daemon.PidFile(ud / "cdui.pid").running()
    if pid == os.getpid():
        # The file of a server that ran in this container before it restarted on the same volume: that one
        # was pid 1 too (Kubernetes, podman). Counted as running, the new server would exit at once.
        pid = None
    if pid:
        info = server_info(ud) or {}
        running = urlsplit(str(info.get("url", ""))).port
        if source in ("--port", "CODEFYUI_PORT") and running is not None and running != port:
            return _die(f"cdui is already running at {info['url']} (pid {pid}), on port {running}, not {port} "
                        f"(from {source}): stop it first with `cdui stop`, then `cdui start --port {port}`")
        if args.project is not None:
            opened = (_health(str(info.get("url", ""))) or {}).get("project")
            wanted = project.name_of(project.find(args.project))
            if not isinstance(opened, dict) or opened.get("name") != wanted:
                said = f"project {opened.get('name')!r}" if isinstance(opened, dict) else "no project"
                return _die(f"cdui is already running at {info.get('url', '?')} (pid {pid}) with {said}, not "
                            f"{wanted!r}: stop it first with `cdui stop`, then `cdui start --project {args.project}`")
        print(f"cdui is already running at {info.get('url', '?')} (pid {pid}); `cdui stop` stops it")
        return 0
    args.port = port
    if args.foreground:
        return _serve(cfg, args)
    log_path = ud / "cdui.log"
    cmd = [sys.executable, "-m", "cdui", "start", "--foreground", "--host", args.host, "--port", str(port),
           "--log-file", str(log_path)]
    (ud / "server.json").unlink(missing_ok=True)
    proc = daemon.spawn(cmd, log_path)
    url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{port}"

    def ready(rc: int | None) -> int | None:
        if rc is not None:
            tail = _tail(log_path, 5)
            return _die(f"the server exited during start (code {rc}); last log lines:\n{tail}")
        info = server_info(ud)
        if info and info.get("pid") == proc.pid and _health(url):
            if source == "--port":  # the next `cdui start` without --port starts here again
                _remember_port(ud, port)
            print(f"cdui {__version__} running at {url} (pid {proc.pid}, log {log_path})")
            return 0
        return None
    answer = daemon.wait_ready(proc, ready, 120)
    return answer if answer is not None else _die(f"the server did not answer at {url} within 120 s; see {log_path}")


def _tail(path: Path, n: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _serve(cfg: Any, args: argparse.Namespace) -> int:
    from cdui.plane.server import serve
    logfile.setup(Path(args.log_file).absolute() if args.log_file else None, cfg["CODEFYUI_LOG_MAX_BYTES"],
                  cfg["CODEFYUI_LOG_BACKUP_COUNT"])
    warn_unavailable(logging.getLogger("cdui.plane.server"))
    project.open_at_start(logging.getLogger("cdui.plane.server"))
    with daemon.PidFile(cfg.user_data / "cdui.pid").held():
        try:
            serve(cfg, args.host, args.port)
        except OSError as exc:
            return _die(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc} "
                        f"(choose another --port, or stop what uses it)")
        finally:
            (cfg.user_data / "server.json").unlink(missing_ok=True)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    cfg = _config()
    pid = daemon.PidFile(cfg.user_data / "cdui.pid").running()
    if not pid:
        print("cdui is not running")
        return 0
    # The server is asked to stop (SIGTERM: workers and SSH agents get the stop notice, local runs
    # are asked to stop), then killed after about 2 s: a stop that waits for every run is SIGTERM
    # alone (`systemctl stop`, `kill PID`). What had not ended by the kill ends `interrupted` at the
    # next start (cdui/plane/stopping.py).
    if daemon.stop(pid, QUICK_STOP_S, kill=True) == "killed":
        daemon.wait_gone(pid, 10)
        daemon.PidFile(cfg.user_data / "cdui.pid").remove_if(pid)
        if (server_info(cfg.user_data) or {}).get("pid") == pid:
            (cfg.user_data / "server.json").unlink(missing_ok=True)
        print(f"cdui (pid {pid}) stopped: killed {QUICK_STOP_S:g} s after the stop request; runs that had not "
              f"ended by then end interrupted at the next start (to wait for them instead: kill -TERM {pid})")
    else:
        print(f"cdui (pid {pid}) stopped")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    cfg = _config()
    pid = _read_pid(cfg.user_data / "cdui.pid")
    info = server_info(cfg.user_data)
    if not pid or not info:
        print(f"cdui is not running (user data {cfg.user_data})")
        return 1
    while True:
        h = _health(info["url"])
        line = f"cdui {h['version'] if h else '?'} at {info['url']} (pid {pid}): {'ok' if h else 'not answering'}"
        opened = h.get("project") if h else None
        if isinstance(opened, dict):
            git = project.describe_git(opened.get("git_commit"), opened.get("git_dirty"))
            line += f"; project {opened.get('name')} ({git})"
        try:
            # Every run counted by the server, not the newest page of them.
            counts: dict[str, int] = Client.for_user_data(cfg.user_data).call("GET", "/api/runs/counts")["counts"]
            line += "; runs: " + (", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "none")
        except CduiError:
            pass
        print(line, flush=True)
        if args.once or not sys.stdout.isatty():
            return 0 if h else 1
        time.sleep(2)


def cmd_token(args: argparse.Namespace) -> int:
    """The running server's session token on stdout (what the page's token form asks for), and on stderr
    where it came from and whether it outlives a restart."""
    cfg = _config()
    pid = _read_pid(cfg.user_data / "cdui.pid")
    info = server_info(cfg.user_data)
    if not pid or not info:
        return _die(f"cdui is not running for the user data folder {cfg.user_data} (start it with `cdui start`; "
                    "the page then asks for the token it draws)")
    path = cfg.user_data / "session-token"
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        return _die(f"cannot read the session token in {path}: {exc.strerror or exc} (run this as the user that "
                    "started the server)")
    print(token, flush=True)
    fixed = cfg["CODEFYUI_SESSION_TOKEN_FILE"]
    lasting = (f"fixed by CODEFYUI_SESSION_TOKEN_FILE={fixed}: it outlives restarts, so a bookmark of "
               f"{info['url']}/?token=TOKEN keeps working (keep that link private)" if fixed else
               "it changes at every start; CODEFYUI_SESSION_TOKEN_FILE fixes it (docs/configuration.md)")
    print(f"the session token of cdui at {info['url']} (pid {pid}), from {path}; paste it into the page's token "
          f"form; {lasting}", file=sys.stderr)
    return 0


# -- runs -------------------------------------------------------------------------
def _client(args: argparse.Namespace):
    # One client for every command: --control, and through the TLS proxy the --ca-fingerprint pin.
    return cli_workers._client(args)


def _target(raw: str | None) -> TargetJson:
    """``--target`` as the submit sends it: ``local`` (or none), ``any``, ``one-shot``, else a worker's name. An
    empty name is sent as it is, so the control plane refuses it in its own words."""
    return target_json(parse_target(raw)) if raw != "" else {"worker": raw}


def cmd_run(args: argparse.Namespace) -> int:
    path = Path(args.graph)
    try:
        graph = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return _die(f"cannot read graph file {args.graph}: {exc.strerror}")
    except ValueError as exc:
        return _die(f"graph file {args.graph} is not valid JSON: {exc}")
    options: dict[str, Any] = {"target": _target(args.target)}
    if args.device:
        options["device"] = args.device
    if args.devices is not None:
        options["devices"] = args.devices
    if args.memory_mb is not None:
        options["memory_mb"] = args.memory_mb
    client = _client(args)
    if not args.queue_anyway:
        cli_devices.check_device_offered(client, options["target"], args.device, args.devices)
    try:
        run = client.call("POST", "/api/runs", {"graph": graph, "options": options})
    except CduiError as err:
        # A validation refusal lists every error under its line; every other refusal is the one line main() prints.
        items = err.details if isinstance(err.details, list) else []
        if err.code == "invalid_graph" and items and all(isinstance(e, dict) for e in items):
            print(f"cdui: error: {err.message}", file=sys.stderr)
            for e in items:
                where = f"node {e['node_id']}: " if e.get("node_id") else ""
                print(f"  - {where}{e.get('message')}" + (f" ({e['hint']})" if e.get("hint") else ""),
                      file=sys.stderr)
            return 1
        raise
    if not args.wait:
        print(json.dumps(run, indent=2) if args.json else run["id"])
        return 0
    if not args.json:
        print(run["id"])
    final = follow(client, run["id"], quiet=args.json)
    if args.json:
        print(json.dumps(final, indent=2))
    return 0 if final["status"] == "succeeded" else 1


# `cdui run --wait` follows as `cdui runs logs --follow` does (cdui/cli/cli_runs.py).
follow = cli_runs.follow


def cmd_api(args: argparse.Namespace) -> int:
    body = None
    if args.body is not None:
        raw = sys.stdin.read() if args.body == "-" else args.body
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return _die(f"JSON_BODY is not valid JSON: {exc} (quote it, e.g. '{{\"ttl_s\": 3600}}')", 2)
    client = _client(args)
    status, parsed = client.request(args.method, args.path, body)
    print(json.dumps(parsed, indent=2) if not isinstance(parsed, str) else parsed)
    return 0 if status < 300 else 1


# -- parser -------------------------------------------------------------------------
def _port_arg(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"port {text!r} is not a port number from 1 to 65535")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="cdui", description="cdui: run CodefyUI node graphs locally and on remote workers")
    p.add_argument("--version", action="version", version=f"cdui {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    s = sub.add_parser("start", help="start the control plane (background unless --foreground)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--port", type=_port_arg, default=None,
                   help="port; remembered for the next start (default: CODEFYUI_PORT, else the port the last "
                        "`start --port` used, else 8000)")
    s.add_argument("--foreground", action="store_true", help="stay attached (for systemd)")
    s.add_argument("--log-file", default=None, metavar="PATH",
                   help="with --foreground: log to PATH, rotated by size (CODEFYUI_LOG_MAX_BYTES, "
                        "CODEFYUI_LOG_BACKUP_COUNT), reopened on SIGHUP (default: stderr, the journal under systemd)")
    s.add_argument("--project", default=None, metavar="DIR",
                   help="open the project folder DIR (codefyui.project.toml): its graphs, presets, custom nodes, "
                        "assets and .env secrets (docs/projects.md)")
    s.add_argument("--extras", default=None, metavar="LIST",
                   help="first install these node-family extras: all or a comma list (done by bin/cdui)")
    s.set_defaults(func=cmd_start)

    s = sub.add_parser("stop", help="stop the control plane (it is killed after about 2 s)")
    s.set_defaults(func=cmd_stop)

    s = sub.add_parser("status", help="show the control plane's state")
    s.add_argument("--once", action="store_true", help="print once and exit")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("token", help="print the session token the page asks for from another machine")
    s.set_defaults(func=cmd_token)

    s = sub.add_parser("run", help="queue a graph as a run")
    s.add_argument("graph", metavar="GRAPH.json", help="the graph to run (a CodefyUI graph file)")
    s.add_argument("--target", default=None, help="local (default), any, a worker NAME, or one-shot")
    s.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: any free device)")
    s.add_argument("--devices", type=int, default=None, metavar="N",
                   help="a device set: N devices of --device's kind on one worker (default: one)")
    s.add_argument("--memory-mb", type=int, default=None, metavar="MB",
                   help="the MiB the run needs on each device, counted where a device shares by memory")
    s.add_argument(cli_devices.QUEUE_ANYWAY, action="store_true",
                   help="queue it even when no machine the target may use offers --device (it waits for one)")
    s.add_argument("--wait", action="store_true", help="follow the run; exit 0 only if it succeeded")
    s.add_argument("--json", action="store_true", help="print the run object as JSON")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.add_argument("--ca-fingerprint", default=None, metavar="sha256:HEX",
                   help="through a TLS proxy with a self-signed certificate: its key's fingerprint (pinned)")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("api", help="call the local server's HTTP API as its owner")
    s.add_argument("method", metavar="METHOD", help="GET, POST, PUT, PATCH or DELETE")
    s.add_argument("path", metavar="PATH", help="the API path, e.g. /api/runs (docs/api.md)")
    s.add_argument("body", metavar="JSON_BODY", nargs="?", help="the request body as JSON; - reads it from stdin")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.add_argument("--ca-fingerprint", default=None, metavar="sha256:HEX",
                   help="through a TLS proxy with a self-signed certificate: its key's fingerprint (pinned)")
    s.set_defaults(func=cmd_api)

    for name, what in (("install", "(re)install cdui's environment, e.g. --gpu cu128"),
                       ("test", "run the test suite (installs the test extras on first use)"),
                       ("wheelhouse", "fill a folder with wheels for an offline install")):
        s = sub.add_parser(name, help=f"{what} [bin/cdui]", add_help=False)
        s.add_argument("rest", nargs=argparse.REMAINDER, help=f"the options of `bin/cdui {name}` (see its --help)")
        s.set_defaults(func=_launcher_only, launcher_command=name)

    cli_workers.add_commands(sub)
    cli_runs.add_commands(sub)
    cli_sweeps.add_commands(sub)
    cli_studies.add_commands(sub)
    cli_datasets.add_commands(sub)
    cli_ops.add_commands(sub)
    cli_update.add_commands(sub)
    cli_plugin.add_commands(sub)
    cli_project_pins.add_parsers(cli_project.add_parsers(sub))
    cli_apps.add_commands(sub)
    return p


def _launcher_only(args: argparse.Namespace) -> int:
    launcher = Path(__file__).resolve().parents[2] / "bin" / "cdui"
    return _die(f"`{args.launcher_command}` is run by the launcher, not by the Python package: "
                f"use `{launcher} {args.launcher_command}` (or `cdui {args.launcher_command}` when the launcher "
                f"is on your PATH)", 2)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # `agent start --token T`: T leaves the world-readable command line at once
        argv_token.hide_token_from_argv()
    try:
        # The settings file (/etc/cdui/cdui.env or CODEFYUI_CONFIG) fills in what the environment leaves unset,
        # before anything reads a setting; every process this one starts inherits the result.
        config_file.apply()
    except CduiError as err:
        return _die(str(err), 2)
    try:
        # Every process this one starts (daemons, runs) sees the paths the user meant, wherever its cwd is.
        os.environ.update(absolute_paths(os.environ, Path.cwd()))
    except FileNotFoundError:  # the launch folder was deleted: relative settings cannot mean anything anyway
        pass
    parser = build_parser()
    args = parser.parse_args(argv)
    argv_token.restore_token(args)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CduiError as err:
        return _die(str(err), 2 if err.code in ("bad_setting", "bad_usage") else 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `cdui workers token | head -1`: the reader left; that is fine
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
