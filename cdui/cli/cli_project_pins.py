"""``cdui project freeze DIR`` and ``cdui project restore DIR``: a project's plugin pack pins.

``freeze`` writes the installed packs (version and sha256; a linked pack has no fixed content and
is left out) into the ``[plugins]`` table of ``DIR/codefyui.project.toml``; ``restore`` installs
exactly those, found by name in the lab's pack folders (CODEFYUI_PLUGIN_SOURCES) or the
wheelhouse, refusing one whose sha256 differs. The table reads::

    [plugins.foundations]
    version = "0.1.0"
    sha256 = "3f5a..."

(a plain ``foundations = "<sha256>"`` is read too). :func:`read_pins` and :func:`write_pins` are
what other project commands call.
"""
from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from cdui.cli.cli_plugin import log_line, reload_server
from cdui.cli.cli_util import _die
from cdui.core.config import load
from cdui.nodes import packs

PROJECT_MANIFEST = "codefyui.project.toml"


def read_pins(project: Path) -> dict[str, dict[str, str]]:
    """``{id: {"version", "sha256"}}`` from the project's manifest; ValueError names what is wrong."""
    path = project / PROJECT_MANIFEST
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist (is {project} a project? `cdui project init` makes one)") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    table = data.get("plugins", {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [plugins] must be a table of pack ids")
    out: dict[str, dict[str, str]] = {}
    for pid, pin in table.items():
        if isinstance(pin, str):
            pin = {"sha256": pin}
        if not isinstance(pin, dict) or not isinstance(pin.get("sha256"), str) \
                or not re.fullmatch(r"[0-9a-f]{64}", pin["sha256"]):
            raise ValueError(f"{path}: [plugins] {pid!r} needs a sha256 of 64 hex digits (freeze writes it)")
        out[str(pid)] = {"version": str(pin.get("version", "")), "sha256": pin["sha256"]}
    return out


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_pins(project: Path, pins: dict[str, dict[str, str]]) -> Path:
    """Replace the manifest's ``[plugins]`` tables with ``pins``, keeping every other line as it is."""
    path = project / PROJECT_MANIFEST
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        lines = ["[project]", f"name = {_q(project.resolve().name)}"]
    kept: list[str] = []
    skipping = False
    for line in lines:
        header = re.match(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$", line)
        if header:
            name = header.group(1).strip().strip('"')
            skipping = name == "plugins" or name.startswith("plugins.")
        if not skipping:
            kept.append(line)
    while kept and not kept[-1].strip():
        kept.pop()
    block = ["", "# Plugin packs this project needs, pinned by `cdui project freeze`; "
                 "`cdui project restore` installs them."]
    block.append("[plugins]")
    for pid, pin in sorted(pins.items()):
        key = pid if re.fullmatch(r"[A-Za-z0-9_-]+", pid) else _q(pid)
        block += ["", f"[plugins.{key}]", f"version = {_q(pin.get('version', ''))}",
                  f"sha256 = {_q(pin['sha256'])}"]
    path.write_text("\n".join(kept + block) + "\n", encoding="utf-8")
    return path


def frozen_pins(store: Path) -> dict[str, dict[str, str]]:
    """The installed packs a project can pin: all but linked ones (a folder on this machine, no fixed content)."""
    return {pid: {"version": str(e.get("version", "")), "sha256": str(e.get("sha256", ""))}
            for pid, e in packs.read_lock(store).items() if e.get("source_kind") != "local"}


def cmd_freeze(args: argparse.Namespace) -> int:
    project = Path(args.dir)
    if not project.is_dir():
        return _die(f"project folder {project} does not exist", 1)
    store = load().plugin_store
    pins = frozen_pins(store)
    skipped = sorted(set(packs.read_lock(store)) - set(pins))
    path = write_pins(project, pins)
    listed = ", ".join(f"{k} {v['version']}" for k, v in sorted(pins.items())) or "none"
    print(f"froze {len(pins)} pack(s) into {path}: {listed}")
    if skipped:
        print(f"left out linked pack(s): {', '.join(skipped)} (install them to pin them)")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    project = Path(args.dir)
    try:
        pins = read_pins(project)
    except ValueError as exc:
        return _die(str(exc), 1)
    store = load().plugin_store
    have = packs.read_lock(store)
    search = packs.search_folders()
    failed = 0
    changed = False
    for pid, pin in sorted(pins.items()):
        if have.get(pid, {}).get("sha256") == pin["sha256"]:
            print(f"{pid} {pin['version']}: already installed")
            continue
        try:
            done = packs.install(pid, store, search, force=True, expect_sha256=pin["sha256"], trust=args.trust)
        except packs.PackError as exc:
            print(f"cdui: error: {pid}: {exc}", file=sys.stderr)
            failed += 1
            continue
        changed = True
        if done.problems:
            log_line(store, f"restored {pid} with --trust despite: {'; '.join(done.problems)}")
        print(f"{pid} {done.entry['version']}: installed (sha256 {done.entry['sha256'][:12]}) from "
              f"{done.entry['source']}")
    if changed:
        reload_server(quiet=True)
    if failed:
        return _die(f"{failed} of {len(pins)} pinned pack(s) could not be restored (put the pinned versions in a "
                    f"folder of CODEFYUI_PLUGIN_SOURCES or CODEFYUI_WHEELHOUSE)", 1)
    print(f"restored: {len(pins)} pinned pack(s) installed")
    return 0


def add_parsers(subparsers: Any) -> None:
    """Add ``freeze`` and ``restore`` to a ``cdui project`` group's subparsers."""
    s = subparsers.add_parser("freeze", help="pin the installed plugin packs (version, sha256) in the project")
    s.add_argument("dir", metavar="DIR", help="the project folder (holds codefyui.project.toml)")
    s.set_defaults(func=cmd_freeze)
    s = subparsers.add_parser("restore", help="install exactly the project's pinned plugin packs")
    s.add_argument("dir", metavar="DIR", help="the project folder (holds codefyui.project.toml)")
    s.add_argument("--trust", action="store_true", help="install pinned packs the safety check refuses (logged)")
    s.set_defaults(func=cmd_restore)

