"""``cdui workers add-ssh|disable|enable|retry``: SSH workers from the command line.

Each is one call of the HTTP API (``POST /api/workers/ssh`` and
``POST /api/workers/{name}/disable|enable|retry``); ``cdui workers remove NAME``
removes an SSH worker like any other (it also ends ssh and cleans the host).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from cdui.cli.cli_util import CONTROL_HELP
from cdui.cli.client import Client
from cdui.core import config


def _client(args: argparse.Namespace) -> Any:
    return Client.for_user_data(config.load().user_data, getattr(args, "control", None))


def cmd_add_ssh(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"target": args.target, "port": args.port}
    for key in ("name", "identity", "remote_cdui"):
        if getattr(args, key):
            body[key] = getattr(args, key)
    res = _client(args).call("POST", "/api/workers/ssh", body)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"SSH worker {res['name']} added: {res['target']} (slot {res['slot']}, remote state {res['remote_dir']}); "
          f"connecting. `cdui workers list` shows its tunnel line")
    return 0


def tunnel_line(s: dict[str, Any]) -> str:
    """The SSH tunnel line under a worker in `cdui workers list`."""
    t = s["tunnel"]
    line = f"  ssh: {s['target']} slot {s['slot']}: {t['state']}"
    if t.get("remote_pid"):
        line += f" (remote agent pid {t['remote_pid']})"
    if t["state"] == "failed":
        line += f": {t['reason']}; " + (f"retrying in {t['next_attempt_s']:.0f} s" if t.get("retrying")
                                       else f"not retrying; `cdui workers retry {s['name']}` tries again")
    return line


def cmd_ssh_action(args: argparse.Namespace) -> int:
    res = _client(args).call("POST", f"/api/workers/{args.name}/{args.action}")
    if args.action == "retry":
        print(f"worker {args.name}: retrying the SSH connection now")
    else:
        print(f"worker {args.name}: {'disabled' if res['disabled'] else 'enabled'}")
    return 0


def add_ssh_commands(wsub: Any) -> None:
    s = wsub.add_parser("add-ssh", help="add a worker the control plane starts over ssh")
    s.add_argument("target", metavar="TARGET", help="user@host, or a Host alias from ~/.ssh/config")
    s.add_argument("--port", type=int, default=22, help="ssh port (22, the default, is not passed to ssh)")
    s.add_argument("--name", default=None, help="worker name (default: the target's host name)")
    s.add_argument("--identity", default=None, metavar="FILE", help="private key (ssh -i); default: ssh config/agent")
    s.add_argument("--remote-cdui", dest="remote_cdui", default=None, metavar="PATH",
                   help="the launcher on the remote host (default ~/CodefyUI/bin/cdui)")
    s.add_argument("--json", action="store_true", help="print the new SSH worker as JSON")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.set_defaults(func=cmd_add_ssh)
    for action, what in (("disable", "stop a worker taking runs (an SSH worker's agent is stopped)"),
                         ("enable", "let a disabled worker take runs again (reconnects an SSH worker)"),
                         ("retry", "retry a failed SSH tunnel now")):
        s = wsub.add_parser(action, help=what)
        s.add_argument("name", metavar="NAME", help="the worker's name (`cdui workers list` shows them)")
        s.add_argument("--control", default=None, help=CONTROL_HELP)
        s.set_defaults(func=cmd_ssh_action, action=action)
