"""``cdui plugin``: install, list, inspect, remove, link and reload plugin packs (docs/plugins.md).

Packs go into ``<user data>/plugins/<id>/`` with the lockfile ``installed.json`` beside them
(cdui/nodes/packs.py); nothing is downloaded: a pack is a folder, an archive, or a name looked up
in the folders of CODEFYUI_PLUGIN_SOURCES and CODEFYUI_WHEELHOUSE. After a change the running
control plane (if any) is asked to reload its node registry.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from cdui.cli.cli_util import _die
from cdui.cli.client import Client
from cdui.core.config import load
from cdui.core.errors import CduiError
from cdui.nodes import pack_deps, packs


def _store() -> Path:
    return load().plugin_store


def log_line(store: Path, text: str) -> None:
    """One line in ``<store>/plugins.log``: what was installed with --trust, linked or removed, and when."""
    store.mkdir(parents=True, exist_ok=True)
    with open(store / "plugins.log", "a", encoding="utf-8") as fh:
        fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {text}\n")


def reload_server(quiet: bool = False) -> int:
    """Ask the running control plane to read its packs again; 0 also when none runs (nothing to reload)."""
    cfg = load()
    try:
        client = Client.for_user_data(cfg.user_data)
        status, res = client.request("POST", "/api/plugins/reload", {}, timeout=120)
    except (CduiError, OSError) as exc:
        if not quiet:
            print(f"no running control plane to reload ({exc}); it reads the packs when it starts")
        return 0
    if status >= 300:
        return _die(f"the control plane did not reload its packs: {res}", 1)
    if isinstance(res, dict):
        if res.get("added"):
            print(f"control plane: now has {', '.join(res['added'])}")
        if res.get("removed"):
            print(f"control plane: no longer has {', '.join(res['removed'])}")
        for e in res.get("load_errors") or []:
            print(f"control plane: load error: {e}", file=sys.stderr)
        if not quiet:
            print(f"agents: {res.get('workers')}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    store = _store()
    search = packs.search_folders()
    failed = 0
    for source in args.sources:
        try:
            done = packs.install(source, store, search, trust=args.trust, force=args.force,
                                 install_deps=args.install_deps)
        except packs.PackError as exc:
            print(f"cdui: error: {exc}", file=sys.stderr)
            failed += 1
            continue
        e = done.entry
        if done.problems:
            log_line(store, f"installed {e['id']} {e['version']} sha256 {e['sha256']} from {e['source']} with "
                            f"--trust despite: {'; '.join(done.problems)}")
            print(f"warning: {e['id']} installed with --trust despite {len(done.problems)} problem(s) "
                  f"(logged in {store / 'plugins.log'})", file=sys.stderr)
        if done.deps_installed:
            log_line(store, f"installed Python distributions for {e['id']} (pip --no-index): "
                            f"{' '.join(done.deps_installed)}")
            print(f"installed Python distributions for {e['id']}: {', '.join(done.deps_installed)}")
        print(f"installed {e['id']} {e['version']} ({len(packs.node_names(done.manifest))} node types, "
              f"sha256 {e['sha256'][:12]}) from {e['source']}")
    if failed < len(args.sources):
        reload_server(quiet=True)
        agent_hint()
    return 1 if failed else 0


def agent_hint() -> None:
    """On a worker: its agent reads the node catalog at start, so it must restart to offer the change."""
    if (load().user_data / "agent").is_dir():
        print("this user data folder is a worker's: restart its agent (`cdui agent stop`, then `cdui agent start`) "
              "so that it reports the change and takes runs that need it")


def cmd_uninstall(args: argparse.Namespace, linked: bool = False) -> int:
    store = _store()
    try:
        e = packs.uninstall(args.id, store, linked=linked)
    except packs.PackError as exc:
        return _die(str(exc), 1)
    log_line(store, f"{'unlinked' if linked else 'uninstalled'} {e.get('id')} {e.get('version')}")
    print(f"{'unlinked' if linked else 'uninstalled'} {args.id}"
          + (" (its folder is left as it is)" if e.get("source_kind") == "local" else ""))
    reload_server(quiet=True)
    agent_hint()
    return 0


def cmd_link(args: argparse.Namespace) -> int:
    store = _store()
    try:
        done = packs.link(Path(args.dir), store)
    except packs.PackError as exc:
        return _die(str(exc), 1)
    log_line(store, f"linked {done.entry['id']} from {done.entry['path']} (no safety check)")
    print(f"linked {done.entry['id']} from {done.entry['path']}: loaded in place, with no safety check (it is "
          f"your own code); `cdui plugin reload` after an edit")
    missing = [d for d in pack_deps.check(done.manifest.python_deps) if not d.satisfied]
    if missing:  # your own pack: a warning, not a refusal
        lacking = "; ".join(d.describe() for d in missing)
        print(f"warning: its [python_deps] are not all in cdui's environment ({lacking}): "
              f"{pack_deps.offline_hint([d.requirement for d in missing])}", file=sys.stderr)
    reload_server(quiet=True)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    store = _store()
    items = [packs.describe(e, f) for e, f in packs.installed(store)]
    if args.json:
        print(json.dumps(items, indent=2))
        return 0
    if not items:
        print(f"no plugin packs installed (in {store}); install one with `cdui plugin install SOURCE`")
    for d in items:
        state = "" if d["present"] else " [files missing: install it again]"
        kind = "linked" if d.get("source_kind") == "local" else "installed"
        print(f"{d['id']:<16} {d.get('version') or '-':<10} {kind:<9} sha256 {str(d.get('sha256'))[:12]}  "
              f"{len(d['nodes'])} node types, {len(d['examples'])} examples{state}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    store = _store()
    for e, folder in packs.installed(store):
        if e.get("id") != args.id:
            continue
        d = packs.describe(e, folder)
        if args.json:
            print(json.dumps(d, indent=2))
            return 0
        print(f"{d['id']}: {d.get('name')} {d.get('version')}")
        if d.get("description"):
            print(f"  {d['description']}")
        print(f"  format: {d.get('format')}; source: {d.get('source')} ({d.get('source_kind')}); "
              f"sha256: {d.get('sha256')}; folder: {d['folder']}")
        print(f"  nodes: {', '.join(d['nodes']) or 'none'}")
        print("  examples:" + ("".join(f"\n    {x}" for x in d["examples"]) or " none"))
        deps = d["python_deps"]
        print("  python_deps:" + ("".join(
            f"\n    {x['requirement']}: " + (f"{x['installed']} installed" if x["installed"] else "not installed")
            + ("" if x["satisfied"] or not x["installed"] else ", which does not satisfy it") for x in deps)
            or " none"))
        if any(not x["satisfied"] for x in deps):
            print(f"  (the pack's nodes fail to load without them: "
                  f"{pack_deps.offline_hint([x['requirement'] for x in deps if not x['satisfied']])})")
        print(f"  presets: {', '.join(d['presets']) or 'none'}")
        if d.get("frontend") or d.get("frontend_files"):
            print(f"  frontend: {d.get('frontend') or 'no [frontend] entry'} ({len(d['frontend_files'])} file(s) "
                  "under frontend/; not loaded: it is CodefyUI's browser code, see docs/plugins.md)")
        for p in d.get("problems") or []:
            print(f"  problem: {p}")
        return 0
    return _die(f"no pack {args.id!r} is installed (see `cdui plugin list`)", 1)


def cmd_reload(args: argparse.Namespace) -> int:
    return reload_server()


def cmd_push(args: argparse.Namespace) -> int:
    cfg = load()
    try:
        client = Client.for_user_data(cfg.user_data, args.control)
        status, res = client.request("POST", f"/api/plugins/{args.id}/push", {"to": args.to}, timeout=300)
    except (CduiError, OSError) as exc:
        return _die(f"could not reach the control plane: {exc}", 1)
    if status >= 300:
        err = res.get("error", {}) if isinstance(res, dict) else {}
        return _die(f"{err.get('message', res)}" + (f" ({err['hint']})" if err.get("hint") else ""), 1)
    if not res["results"]:
        print("no worker is connected: nothing was pushed")
    failed = 0
    for r in res["results"]:
        failed += not r["ok"]
        print(f"{r['worker']}: {r['message']}")
    return 1 if failed else 0


def cmd_receive(args: argparse.Namespace) -> int:
    """The SSH worker's side of ``cdui plugin push``: the archive is on stdin. Refused unless this machine accepts
    pushed packs, the same setting as for a push over the agent's connection (it installs new code here)."""
    cfg = load()
    if not cfg["CODEFYUI_AGENT_ACCEPT_PLUGINS"]:
        return _die(f"not installed: this machine does not accept pushed plugin packs (set "
                    f"CODEFYUI_AGENT_ACCEPT_PLUGINS=1 in its environment or settings file, or install the pack here "
                    f"with `cdui plugin install {args.id}`)", 1)
    try:
        done = packs.receive_pushed(sys.stdin.buffer, args.bytes, args.id, args.version, args.pin, args.tree,
                                    cfg.plugin_store)
    except packs.PackError as exc:
        return _die(f"not installed: {exc}", 1)
    log_line(cfg.plugin_store, f"pushed over ssh: {args.id} {done.entry['version']} sha256 {args.pin}")
    print(f"installed {args.id} {done.entry['version']}")
    return 0


def add_commands(sub: Any) -> None:
    d = sub.add_parser("plugin", help="install and manage plugin packs (CodefyUI's and cdui's formats)")
    dsub = d.add_subparsers(dest="plugin_command", metavar="COMMAND", parser_class=type(d))
    s = dsub.add_parser("install", help="install packs from folders, archives (.tar.gz, .zip) or by name")
    s.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="a pack folder, a pack archive, or a pack name found in CODEFYUI_PLUGIN_SOURCES or "
                        "CODEFYUI_WHEELHOUSE")
    s.add_argument("--trust", action="store_true",
                   help="install even when the safety check finds unsafe constructs (logged)")
    s.add_argument("--force", action="store_true", help="replace an installed pack of the same id")
    s.add_argument("--install-deps", action="store_true",
                   help="install the pack's [python_deps] that cdui's environment lacks from the wheels in "
                        "CODEFYUI_PLUGIN_SOURCES / CODEFYUI_WHEELHOUSE (pip --no-index: never the network)")
    s.set_defaults(func=cmd_install)
    s = dsub.add_parser("list", help="the installed packs")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=cmd_list)
    s = dsub.add_parser("info", help="one pack: manifest, node types, example graphs")
    s.add_argument("id", metavar="ID", help="the pack's id (cdui plugin list)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.set_defaults(func=cmd_info)
    s = dsub.add_parser("uninstall", help="remove an installed pack")
    s.add_argument("id", metavar="ID", help="the installed pack's id")
    s.set_defaults(func=cmd_uninstall)
    s = dsub.add_parser("link", help="load a pack folder in place (while writing it)")
    s.add_argument("dir", metavar="DIR", help="the pack folder (its manifest at the top)")
    s.set_defaults(func=cmd_link)
    s = dsub.add_parser("unlink", help="forget a linked pack (its folder stays)")
    s.add_argument("id", metavar="ID", help="the linked pack's id")
    s.set_defaults(func=lambda a: cmd_uninstall(a, linked=True))
    s = dsub.add_parser("reload", help="make the running control plane read the packs again")
    s.set_defaults(func=cmd_reload)
    s = dsub.add_parser("push", help="send an installed pack to workers over their connection")
    s.add_argument("id", metavar="ID", help="the installed pack's id")
    s.add_argument("--to", required=True, metavar="WORKER", help="a worker's name, or all (every connected one)")
    s.add_argument("--control", default=None, metavar="URL", help="the control plane's URL (default: the recorded one)")
    s.set_defaults(func=cmd_push)
    s = dsub.add_parser("receive", help="install a pack pushed over ssh, its archive on stdin (what `cdui plugin "
                                        "push` runs on an SSH worker; needs CODEFYUI_AGENT_ACCEPT_PLUGINS=1 there)")
    s.add_argument("id", metavar="ID", help="the pack's id")
    s.add_argument("--version", required=True, help="the version the control plane recorded")
    s.add_argument("--pin", required=True, metavar="SHA256", help="the control plane's lockfile sha256, recorded here")
    s.add_argument("--tree", required=True, metavar="SHA256", help="the sha256 of the pack's files, checked here")
    s.add_argument("--bytes", required=True, type=int, metavar="N", help="the archive's size on stdin")
    s.set_defaults(func=cmd_receive)
    d.set_defaults(func=lambda _args: d.print_help() or 2)
