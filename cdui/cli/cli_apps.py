"""``cdui apps`` and ``cdui keys``: published apps and their API keys (docs/apps.md).

``cdui apps publish NAME|GRAPH.json --slug S [--serve-on W]`` publishes a saved graph (or a graph file) as
the next version of app S and makes it the one served; ``cdui apps list | versions S | activate S N |
unpublish S | delete S | serve-on S W`` read and change apps (``serve-on``: this server ``local``, a worker's
name or ``any``, with ``--device D``). ``cdui keys create NAME | list | revoke ID`` manage
the API keys that invoke them. What cannot be undone (delete, revoke) and what stops an app serving
(unpublish) asks first on a terminal and needs ``--yes`` off one, as ``cdui delete`` does.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cdui.cli import cli_runs, cli_workers
from cdui.cli.cli_util import CONTROL_HELP, _die

APP_COMMANDS = ("publish", "list", "versions", "activate", "unpublish", "delete", "serve-on")
KEY_COMMANDS = ("create", "list", "revoke")


def _when(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _git_commit(args: argparse.Namespace) -> tuple[str | None, bool | None]:
    """--git-commit as given; ``HEAD`` is read from the git repository of the current folder, with whether
    its work tree has changes."""
    if args.git_commit != "HEAD":
        return args.git_commit, (True if args.git_dirty else None)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, check=True,
                               timeout=30).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(_die(f"--git-commit HEAD: could not read this folder's git commit ({exc})", 2)) from None
    return commit, dirty or bool(args.git_dirty)


def cmd_apps(args: argparse.Namespace) -> int:
    what = args.what
    client = cli_workers._client(args)
    if what == "list":
        out = client.call("GET", "/api/apps")
        if args.json:
            print(json.dumps(out, indent=2))
            return 0
        rows = [["slug", "active", "versions", "invokes", "graph", "record io", "served on", "updated"]]
        for a in out["apps"]:
            rows.append([a["slug"], str(a["active_version"] or "unpublished"), str(a["versions_count"]),
                         str(a["invokes_count"]), a["graph_name"], "yes" if a["record_io"] else "no", _serving(a),
                         _when(a["updated_at"])])
        print("\n".join(_table(rows)) if out["apps"] else "no apps (publish one: cdui apps publish GRAPH --slug S)")
        return 0
    if args.slug is None:
        return _die(f"`cdui apps {what}` needs the app's slug (--slug S, or after the command; "
                    "`cdui apps list` shows them)", 2)
    slug = args.slug
    if what == "publish":
        if args.target is None:
            return _die("`cdui apps publish` needs the saved graph's name or a graph file: "
                        "cdui apps publish NAME|GRAPH.json --slug S", 2)
        body: dict[str, Any] = {"create": args.create}
        path = Path(args.target)
        if args.target.endswith(".json") and path.is_file():
            body["graph"] = json.loads(path.read_text(encoding="utf-8"))
            body["graph"].setdefault("name", path.stem)
        else:
            body["graph"] = args.target
        if args.note is not None:
            body["note"] = args.note
        if args.no_record_io:
            body["record_io"] = False
        if args.git_commit is not None:
            body["git_commit"], body["git_dirty"] = _git_commit(args)
        if args.serve_on is not None:
            body["serve_on"], body["serve_device"] = args.serve_on, args.device
        elif args.device is not None:
            return _die("--device names a device of where the app is served: give --serve-on too", 2)
        out = client.call("POST", f"/api/apps/{slug}/publish", body)
        print(json.dumps(out, indent=2) if args.json else
              f"app {out['slug']}: version {out['version']} published and serving"
              f"{' (new app)' if out['created'] else ''}")
        return 0
    if what == "versions":
        out = client.call("GET", f"/api/apps/{slug}/versions")
        if args.json:
            print(json.dumps(out, indent=2))
            return 0
        rows = [["", "version", "published", "graph", "git", "note"]]
        for v in out["versions"]:
            git = (v["git_commit"] or "-")[:12] + ("+dirty" if v["git_dirty"] else "")
            rows.append(["*" if v["active"] else "", str(v["version"]), _when(v["created_at"]), v["source_graph"],
                         git, (v["note"] or "")[:60]])
        print("\n".join(_table(rows)))
        print(f"app {slug}: " + (f"version {out['active_version']} serves (*)" if out["active_version"]
                                 else "unpublished"))
        return 0
    if what == "serve-on":
        if args.target is None:
            return _die("`cdui apps serve-on` needs where: cdui apps serve-on S local|any|WORKER [--device D]", 2)
        out = client.call("PATCH", f"/api/apps/{slug}", {"serve_on": args.target, "serve_device": args.device})
        print(json.dumps(out, indent=2) if args.json else
              f"app {slug}: served on {_serving(out)} from the next invoke on")
        return 0
    if what == "activate":
        if args.target is None or not args.target.isdigit():
            return _die("`cdui apps activate` needs the version number: cdui apps activate S N", 2)
        out = client.call("POST", f"/api/apps/{slug}/activate", {"version": int(args.target)})
        print(f"app {slug}: version {out['active_version']} serves from the next invoke on")
        return 0
    if what == "unpublish":
        refused = cli_runs.confirm(args, f"app {slug} will stop serving: invokes are refused (409) until a "
                                         f"version is activated again; its versions and invoke records are kept")
        if refused is not None:
            return refused
        client.call("POST", f"/api/apps/{slug}/unpublish")
        print(f"app {slug}: unpublished (cdui apps activate {slug} N serves version N again)")
        return 0
    refused = cli_runs.confirm(args, f"app {slug} will be deleted with all its versions and invoke records; "
                                     "this cannot be undone")
    if refused is not None:
        return refused
    client.call("DELETE", f"/api/apps/{slug}")
    print(f"app {slug}: deleted")
    return 0


def _serving(app: dict[str, Any]) -> str:
    """``local`` (this server), ``any`` or the worker's name, with ``/DEVICE`` where one is set: one word."""
    return app["serve_on"] + (f"/{app['serve_device']}" if app.get("serve_device") else "")


def cmd_keys(args: argparse.Namespace) -> int:
    client = cli_workers._client(args)
    if args.what == "create":
        if not args.arg:
            return _die("`cdui keys create` needs a name saying who uses the key: cdui keys create NAME", 2)
        out = client.call("POST", "/api/keys", {"name": args.arg})
        if args.json:
            print(json.dumps(out, indent=2))
            return 0
        print(out["key"])
        print(f"API key {out['id']} ({out['name']}): shown this once; the server keeps only its prefix "
              f"{out['prefix']} and a hash. Send it as Authorization: Bearer KEY", file=sys.stderr)
        return 0
    if args.what == "list":
        keys = client.call("GET", "/api/keys")["keys"]
        if args.json:
            print(json.dumps(keys, indent=2))
            return 0
        rows = [["id", "name", "prefix", "created", "last used", "revoked"]]
        for k in keys:
            rows.append([str(k["id"]), k["name"], k["prefix"] + "...", _when(k["created_at"]),
                         _when(k["last_used_at"]), _when(k["revoked_at"]) if k["revoked_at"] else "-"])
        print("\n".join(_table(rows)) if keys else "no API keys (make one: cdui keys create NAME)")
        return 0
    if not args.arg or not args.arg.isdigit():
        return _die("`cdui keys revoke` needs the key's id (`cdui keys list` shows them)", 2)
    refused = cli_runs.confirm(args, f"API key {args.arg} will be refused from its next request on; "
                                     "this cannot be undone")
    if refused is not None:
        return refused
    out = client.call("POST", f"/api/keys/{args.arg}/revoke")
    print(f"API key {out['id']} ({out['name']}): revoked")
    return 0


def _common(s: Any) -> None:
    s.add_argument("--json", action="store_true", help="print the answer as JSON")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.add_argument("--ca-fingerprint", default=None, metavar="sha256:HEX",
                   help="through a TLS proxy with a self-signed certificate: its key's fingerprint (pinned)")


def add_commands(sub: Any) -> None:
    s = sub.add_parser("apps", help="publish graphs as versioned apps called with API keys; list, show versions, "
                                    "activate, unpublish and delete apps",
                       description="cdui apps publish NAME|GRAPH.json --slug S [--serve-on W] | list | versions S | "
                                   "activate S N | unpublish S | delete S | serve-on S local|any|WORKER [--device D]  "
                                   "(docs/apps.md)")
    s.add_argument("what", choices=APP_COMMANDS, metavar="SUBCOMMAND", help=", ".join(APP_COMMANDS))
    s.add_argument("first", nargs="?", default=None, metavar="NAME|SLUG",
                   help="publish: the saved graph's name or a graph file; otherwise the app's slug")
    s.add_argument("second", nargs="?", default=None, metavar="VERSION|WHERE",
                   help="activate: the version to serve; serve-on: local, any or a worker's name")
    s.add_argument("--serve-on", default=None, metavar="WHERE",
                   help="publish: where the app's invokes run: local (this server, the default), any (a connected "
                        "worker) or a worker's name")
    s.add_argument("--device", default=None, metavar="D",
                   help="publish, serve-on: the device there (cpu, cuda, cuda:0; default: a card if it has one)")
    s.add_argument("--slug", default=None, help="publish: the app's slug (^[a-z][a-z0-9-]{0,63}$)")
    s.add_argument("--create", action="store_true", help="publish: create the app if the slug is new")
    s.add_argument("--note", default=None, help="publish: a note kept with the version")
    s.add_argument("--git-commit", default=None, metavar="C",
                   help="publish: the git commit the graph comes from (HEAD: this folder's, with whether it has "
                        "changes)")
    s.add_argument("--git-dirty", action="store_true", help="publish: the work tree had uncommitted changes")
    s.add_argument("--no-record-io", action="store_true",
                   help="publish: do not keep invokes' inputs and outputs in their records")
    s.add_argument("--yes", "-y", action="store_true",
                   help="unpublish, delete: do not ask (needed when not on a terminal)")
    _common(s)
    s.set_defaults(func=_apps)

    k = sub.add_parser("keys", help="create, list and revoke the API keys that invoke apps",
                       description="cdui keys create NAME | list | revoke ID  (docs/apps.md)")
    k.add_argument("what", choices=KEY_COMMANDS, metavar="SUBCOMMAND", help=", ".join(KEY_COMMANDS))
    k.add_argument("arg", nargs="?", default=None, metavar="NAME|ID", help="create: the key's name; revoke: its id")
    k.add_argument("--yes", "-y", action="store_true", help="revoke: do not ask (needed when not on a terminal)")
    _common(k)
    k.set_defaults(func=cmd_keys)


def _apps(args: argparse.Namespace) -> int:
    """Positional words to what each subcommand reads: publish NAME --slug S, the rest SLUG [VERSION]."""
    if args.what == "publish":
        args.target = args.first
        args.slug = args.slug or args.second
    else:
        args.slug = args.slug or args.first
        args.target = args.second
    return cmd_apps(args)
