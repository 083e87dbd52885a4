"""Commands for running an install over time: ``cdui config``, ``cdui backup``, ``cdui restore``, ``cdui logs``.

See docs/operations.md for what each does and why it is shaped so.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cdui import __version__
from cdui.cli import cli_workers, daemon
from cdui.cli.cli_util import CONTROL_HELP, _die
from cdui.core import config, config_file
from cdui.core.layout import Layout
from cdui.core.private import private_dir
from cdui.plane.store import backup as db_backup
from cdui.wire import protocol

MANIFEST = "manifest.json"
FORMAT = "cdui-backup"
FORMAT_VERSION = 1
DB_ENTRY = "user-data/cdui.sqlite3"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_LINES = 100_000
PARTIAL_MARK = ".cdui-backup-partial"
INTO_PREFIX = "cdui-"  # `cdui backup --into DIR` makes DIR/cdui-YYYYMMDD-HHMMSS (UTC)
FOLLOW_WORKER_S = 1.0  # `cdui logs --worker NAME --follow` asks again this often (the server allows 2 a second)
# What a backup holds besides the database, relative to the user data folder: the agent's credentials and
# mounts, the port `cdui start --port` remembered, and the id that names SSH workers' remote folders. Never
# the session token (`session-token`, or the file of CODEFYUI_SESSION_TOKEN_FILE): it grants the owner's
# rights to whoever reads the backup, and a new one is drawn at the next start.
USER_DATA_FILES = ("agent.json", "port", "ssh-instance-id")
# The agent's credentials, and the installed plugin packs with their lockfile (graphs that use a pack's nodes
# run only where it is installed; a pack installed from a lab folder may be gone from there since).
USER_DATA_FOLDERS = ("agent", "plugins")
# Data folders that hold what users made and cannot download again: saved graphs and presets.
DATA_FOLDERS = ("graphs", "presets")
# And of the models folder, only the weights files published app versions keep (cdui/plane/apps.py copies
# each into models/app-weights/<sha256>/ at publish): the database's app versions name them, so a restore
# without them would leave every app that loads weights failing. Other models stay out, as uploads do.
DATA_SUBFOLDERS = (("models", "app-weights"),)


# -- config ------------------------------------------------------------------------------------
def _shown(s: config.Setting, env: dict[str, str]) -> str:
    raw = env.get(s.name)
    if raw is None:
        d = s.default
        if d is None:
            return "(unset)"
        if isinstance(d, bool):
            return "1" if d else "0"
        if isinstance(d, (list, tuple)):
            return ",".join(str(x) for x in d)
        return str(d)
    if s.secret:
        return "****" if raw else "(empty)"
    return raw


def cmd_config(args: argparse.Namespace) -> int:
    config.load()  # a bad value stops here, as it would stop the server, naming the setting
    env = dict(os.environ)
    rows = [{"name": s.name, "value": _shown(s, env), "source": config_file.source_of(s.name),
             **({"secret": True} if s.secret else {})} for s in config.SETTINGS]
    used = config_file.USED_FILE[0] if config_file.USED_FILE else None
    if args.json:
        print(json.dumps({"file": str(used) if used else None, "settings": rows}, indent=2))
        return 0
    print(f"# settings file: {used}" if used else
          f"# settings file: none ({config_file.DEFAULT_PATH} does not exist and CODEFYUI_CONFIG is not set)")
    print("# source: env (the environment), file (the settings file), default; secrets are shown as ****")
    width = max(len(s.name) for s in config.SETTINGS)
    for r in rows:
        if args.changed and r["source"] == "default":
            continue
        print(f"{r['name']:<{width}} = {r['value']}  [{r['source']}]")
    return 0


# -- backup ------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _regular_files(root: Path) -> Iterator[Path]:
    """Regular files under ``root`` (symlinks neither followed nor copied: a backup holds what cdui wrote)."""
    if not root.is_dir() or root.is_symlink():
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not (Path(dirpath) / d).is_symlink())
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                yield p


def _sources(cfg: Any) -> list[tuple[str, Path]]:
    """(path in the backup, file on this machine) of everything a backup holds besides the database."""
    ud: Path = cfg.user_data
    out: list[tuple[str, Path]] = []
    for name in USER_DATA_FILES:
        p = ud / name
        if p.is_file() and not p.is_symlink():
            out.append((f"user-data/{name}", p))
    for folder in USER_DATA_FOLDERS:
        for p in _regular_files(ud / folder):
            if not p.name.endswith(".lock"):
                out.append((f"user-data/{p.relative_to(ud).as_posix()}", p))
    layout: Layout = cfg.layout
    for folder in DATA_FOLDERS:
        root = layout.folder(folder)
        for p in _regular_files(root):
            out.append((f"data/{folder}/{p.relative_to(root).as_posix()}", p))
    for folder, sub in DATA_SUBFOLDERS:
        top = layout.folder(folder)
        if (top / sub).is_symlink():
            continue
        for p in _regular_files(top / sub):
            out.append((f"data/{folder}/{p.relative_to(top).as_posix()}", p))
    if config_file.USED_FILE:  # for reference: restore leaves /etc alone
        out.append(("config/" + config_file.USED_FILE[0].name, config_file.USED_FILE[0]))
    return out


class _Progress:
    """One line rewritten in place on a terminal; nothing in between when stderr is a file or a pipe (a timer)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def __call__(self, what: str, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.tty or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        pct = 100 * done // total if total else 100
        print(f"\r{what}: {pct:3d}% ({done}/{total})", end="", file=sys.stderr, flush=True)

    def end(self) -> None:
        if self.tty:
            print(file=sys.stderr, flush=True)


def _prune(into: Path, keep: int, made: Path) -> list[Path]:
    """Remove all but the newest ``keep`` backups that ``--into`` made in ``into`` (``cdui-<time>`` folders
    holding a cdui backup's manifest; anything else there is left alone). Returns the removed ones."""
    ours = []
    for p in sorted(into.glob(f"{INTO_PREFIX}*")):
        try:
            mf = json.loads((p / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if p.is_dir() and not p.is_symlink() and isinstance(mf, dict) and mf.get("format") == FORMAT:
            ours.append(p)
    gone = [p for p in ours[:-keep] if p != made]
    for p in gone:
        shutil.rmtree(p)
    return gone


def cmd_backup(args: argparse.Namespace) -> int:
    if (args.dest is None) == (args.into is None):
        return _die("name the backup's folder (`cdui backup DEST`) or where to make a dated one "
                    "(`cdui backup --into DIR`), one of the two", 2)
    if args.keep is not None and (args.into is None or args.keep < 1):
        return _die("--keep N (N at least 1) goes with --into DIR: it keeps the newest N backups made there", 2)
    if args.into is not None:
        into = Path(args.into).expanduser().absolute()
        private_dir(into)
        base = into / time.strftime(f"{INTO_PREFIX}%Y%m%d-%H%M%S", time.gmtime())
        dest, n = base, 0
        while dest.exists() or dest.with_name(dest.name + ".partial").exists():  # two in one second
            n += 1
            dest = base.with_name(f"{base.name}-{n}")
        args.dest = str(dest)
    code = _backup(args)
    if code == 0 and args.keep is not None:
        for p in _prune(Path(args.dest).parent, args.keep, Path(args.dest)):
            print(f"removed the older backup {p} (--keep {args.keep})")
    return code


def _backup(args: argparse.Namespace) -> int:
    cfg = config.load()
    dest = Path(args.dest).expanduser().absolute()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        return _die(f"{dest} already exists and is not an empty folder; name a new folder for the backup "
                    f"(e.g. {dest.name}-{time.strftime('%Y%m%d-%H%M%S')})", 2)
    db = cfg.db_path
    if not db.is_file():
        return _die(f"there is no database at {db} to back up (is CODEFYUI_USER_DATA_DIR the server's?)", 1)
    partial = dest.with_name(dest.name + ".partial")
    if partial.exists():
        if not (partial / PARTIAL_MARK).is_file():
            return _die(f"{partial} exists and is not an unfinished backup of cdui; move it away first", 1)
        shutil.rmtree(partial)  # an earlier backup that was interrupted
    private_dir(partial / "user-data")
    (partial / PARTIAL_MARK).write_text("an unfinished cdui backup; the next backup to this place removes it\n")
    progress = _Progress()
    started = time.time()
    version = db_backup.copy_database(db, partial / DB_ENTRY, lambda d, t: progress("database", d, t))
    progress.end()
    verdict, _ = db_backup.check_database(partial / DB_ENTRY)
    if verdict != "ok":
        return _die(f"the copy of {db} failed sqlite's integrity check ({verdict}); the backup in {partial} is not "
                    f"usable: check the disk of {cfg.user_data} and sqlite's integrity check of the database itself", 1)
    files: list[dict[str, Any]] = [{"path": DB_ENTRY, "size": (partial / DB_ENTRY).stat().st_size,
                                    "sha256": _sha256(partial / DB_ENTRY)}]
    others = _sources(cfg)
    for i, (rel, src) in enumerate(others, 1):
        target = partial / rel
        private_dir(target.parent)
        try:
            shutil.copyfile(src, target)
        except OSError as exc:
            return _die(f"cannot copy {src} into the backup: {exc.strerror or exc}", 1)
        os.chmod(target, 0o600)
        files.append({"path": rel, "size": target.stat().st_size, "sha256": _sha256(target)})
        progress("files", i, len(others))
    progress.end()
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "cdui_version": __version__,
                "schema_version": version, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "user_data": str(cfg.user_data), "files": files}
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    (partial / PARTIAL_MARK).unlink()
    if dest.exists():
        dest.rmdir()
    os.replace(partial, dest)  # a backup is in place whole, or not at all
    size = sum(int(f["size"]) for f in files)
    print(f"backed up {db} (schema {version}) and {len(files) - 1} other files, {size} bytes, to {dest} "
          f"in {time.time() - started:.1f} s; restore with `cdui restore {dest}` while the server is stopped")
    return 0


# -- restore -----------------------------------------------------------------------------------
class Refused(Exception):
    pass


def _entry_path(rel: Any) -> tuple[str, ...]:
    if not isinstance(rel, str) or "\\" in rel or "\0" in rel:
        raise Refused(f"the manifest names {rel!r}, which is not a relative path")
    parts = tuple(rel.split("/"))
    if any(p in ("", ".", "..") for p in parts) or parts[0] not in ("user-data", "data", "config") or len(parts) < 2:
        raise Refused(f"the manifest names {rel!r}, a path outside what a cdui backup holds")
    if parts[0] == "data" and (len(parts) < 3 or parts[1] not in DATA_FOLDERS) \
            and not (len(parts) >= 4 and tuple(parts[1:3]) in DATA_SUBFOLDERS):
        kept = [*DATA_FOLDERS, *("/".join(fs) for fs in DATA_SUBFOLDERS)]
        raise Refused(f"the manifest names {rel!r}, not a file of {', '.join(kept)}")
    if parts[0] == "user-data" and rel != DB_ENTRY and parts[1] not in USER_DATA_FILES + USER_DATA_FOLDERS:
        raise Refused(f"the manifest names {rel!r}, not a file a cdui backup holds in the user data folder")
    return parts


def _check_backup(src: Path) -> tuple[dict[str, Any], list[tuple[tuple[str, ...], Path]]]:
    """The manifest and the (path parts, file) of every entry, once every check passed; else :class:`Refused`."""
    mf = src / MANIFEST
    try:
        with open(mf, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise Refused(f"cannot read {mf}: {exc.strerror or exc} (is {src} a folder made by `cdui backup`?)") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise Refused(f"{mf} is larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise Refused(f"{mf} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or not isinstance(manifest.get("files"), list):
        raise Refused(f"{mf} is not the manifest of a cdui backup")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise Refused(f"{mf} has format version {manifest.get('format_version')!r}; this cdui reads {FORMAT_VERSION}")
    entries: list[tuple[tuple[str, ...], Path]] = []
    for f in manifest["files"]:
        if not isinstance(f, dict):
            raise Refused(f"{mf} lists {f!r}, not a file entry")
        parts = _entry_path(f.get("path"))
        path = src.joinpath(*parts)
        if not path.is_file() or path.is_symlink():
            raise Refused(f"{path} is missing from the backup (the manifest lists it)")
        if path.stat().st_size != f.get("size") or _sha256(path) != f.get("sha256"):
            raise Refused(f"{path} does not match the sha256 the manifest records for it: the backup was changed "
                          f"or damaged after it was made")
        entries.append((parts, path))
    db = src.joinpath(*DB_ENTRY.split("/"))
    if not any(p == tuple(DB_ENTRY.split("/")) for p, _ in entries):
        raise Refused(f"the manifest of {src} lists no database ({DB_ENTRY})")
    verdict, version = db_backup.check_database(db)
    if verdict != "ok":
        raise Refused(f"the database in the backup fails sqlite's integrity check: {verdict}")
    known = db_backup.schema_version_known()
    if version > known:
        raise Refused(f"the database in the backup has schema version {version}, newer than this cdui "
                      f"({__version__}) knows ({known}); restore it with the cdui that made it "
                      f"({manifest.get('cdui_version')}) or a newer one")
    return manifest, entries


def cmd_restore(args: argparse.Namespace) -> int:
    cfg = config.load()
    ud: Path = cfg.user_data
    src = Path(args.src).expanduser().absolute()
    # The server and the agent each hold a pidfile naming their live process while they run (cdui start
    # --foreground under systemd too); a file naming a process that is gone does not count.
    for pidname, what, stop in (("cdui.pid", "the control plane", "`cdui stop` or `systemctl stop codefyui`"),
                                ("agent.pid", "an agent", "`cdui agent stop` or `systemctl stop codefyui-agent`")):
        pid = daemon.PidFile(ud / pidname).running()
        if pid:
            return _die(f"{what} is running (pid {pid}) on the user data folder {ud}; nothing was restored: stop "
                        f"it first ({stop}), then run `cdui restore {src}` again", 1)
    try:
        manifest, entries = _check_backup(src)
    except Refused as why:
        return _die(f"refusing to restore {src}: {why}; nothing was replaced", 1)
    layout: Layout = cfg.layout
    plan: list[tuple[Path, Path, str]] = []  # (file in the backup, where it goes, its path in the backup)
    skipped: list[str] = []
    for parts, path in entries:
        if parts[0] == "user-data":
            plan.append((path, ud.joinpath(*parts[1:]), "/".join(parts)))
        elif parts[0] == "data":
            plan.append((path, layout.folder(parts[1]).joinpath(*parts[2:]), "/".join(parts)))
        else:
            skipped.append(str(path))
    db = cfg.db_path
    # 1. Every new file is copied beside its place first (same folder, so the final rename is atomic): a
    #    copy that fails (a full disk) leaves everything as it was.
    staged: list[tuple[Path, Path, str]] = []
    try:
        for path, target, rel in plan:
            private = rel.startswith("user-data/")
            if private:
                private_dir(target.parent)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.restoring")
            shutil.copyfile(path, tmp)
            os.chmod(tmp, 0o600 if private else 0o644)
            staged.append((tmp, target, rel))
    except OSError as exc:
        for tmp, _, _ in staged:
            tmp.unlink(missing_ok=True)
        return _die(f"cannot copy the backup into place: {exc}; nothing was replaced", 1)
    # 2. What is replaced is kept aside, under its path in a backup, and the database's -wal and -shm go with
    #    it: a WAL left beside the restored database would be replayed into it.
    aside = private_dir(ud / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}")
    moved: list[str] = []
    for target, rel in [(t, r) for _, t, r in staged] + [(db.with_name(db.name + sfx), DB_ENTRY + sfx)
                                                          for sfx in ("-wal", "-shm")]:
        if target.exists():
            keep = aside.joinpath(*rel.split("/"))
            keep.parent.mkdir(parents=True, exist_ok=True)
            os.replace(target, keep)
            moved.append(rel)
    # 3. The new files take their places.
    for tmp, target, _ in staged:
        os.replace(tmp, target)
    print(f"restored {len(staged)} files from {src} (made {manifest.get('created_at')} by cdui "
          f"{manifest.get('cdui_version')}, schema {manifest.get('schema_version')}) into {ud}"
          + (" and the data folders" if any(r.startswith("data/") for _, _, r in staged) else ""))
    print(f"the {len(moved)} files it replaced are kept in {aside}" if moved else
          f"it replaced nothing (the folder {aside} is empty)")
    if skipped:
        print(f"not restored (copy by hand if wanted): {', '.join(skipped)}")
    return 0


# -- logs --------------------------------------------------------------------------------------
def _last_lines(f: Any, n: int) -> bytes:
    """The last ``n`` lines of the open file ``f``, which is left at its end."""
    end = f.seek(0, os.SEEK_END)
    pos, data = end, b""
    while pos > 0 and data.count(b"\n") <= n:
        step = min(65536, pos)
        pos -= step
        f.seek(pos)
        data = f.read(step) + data
    f.seek(end)
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-n:]) if n else b""


def _worker_logs(args: argparse.Namespace) -> int:
    """A worker's newest log lines, asked of its agent over its connection by the control plane."""
    if not 1 <= args.lines <= protocol.LOG_MAX_LINES:
        return _die(f"--lines {args.lines} is out of range for a worker's log: give 1 to {protocol.LOG_MAX_LINES}", 2)
    client = cli_workers._client(args)
    path = f"/api/workers/{quote(args.worker, safe='')}/log"
    after = 0
    while True:
        lines = args.lines if after == 0 else protocol.LOG_MAX_LINES
        answer = client.call("GET", f"{path}?after={after}&lines={lines}")
        if after and answer["first"] > after + 1:
            print(f"[... {answer['first'] - after - 1} lines dropped from the worker's memory ...]", flush=True)
        for line in answer["lines"]:
            print(line, flush=True)
        after = answer["last"]
        if not args.follow:
            return 0
        time.sleep(FOLLOW_WORKER_S)


def cmd_logs(args: argparse.Namespace) -> int:
    if args.worker is not None:
        return _worker_logs(args)
    cfg = config.load()
    if not 0 <= args.lines <= MAX_LINES:
        return _die(f"--lines {args.lines} is out of range: give 0 to {MAX_LINES}", 2)
    name, unit = ("agent.log", "codefyui-agent") if args.agent else ("cdui.log", "codefyui")
    path = cfg.user_data / name
    if not path.is_file():
        return _die(f"there is no log file {path}: a server or agent started in the background writes it; under "
                    f"systemd the log is in the journal (`journalctl -u {unit}`)", 1)
    out = sys.stdout.buffer
    f = open(path, "rb")
    try:
        out.write(_last_lines(f, args.lines))
        out.flush()
        while args.follow:  # until Ctrl+C; the file may be rotated meanwhile (by cdui or logrotate)
            chunk = f.read(1 << 20)
            if chunk:
                out.write(chunk)
                out.flush()
                continue
            time.sleep(0.5)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                continue  # between logrotate's rename and the new file
            mine = os.fstat(f.fileno())
            if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                rest = f.read()  # what was written to the old file before it was rotated away
                out.write(rest)
                out.flush()
                f.close()
                f = open(path, "rb")  # the new file, from its start
            elif now.st_size < f.tell():
                f.seek(0)  # truncated in place (logrotate's copytruncate)
    finally:
        f.close()
    return 0


# -- parser ------------------------------------------------------------------------------------
def add_commands(sub: Any) -> None:
    s = sub.add_parser("config", help="print the effective settings and where each came from (secrets masked)")
    s.add_argument("--changed", action="store_true", help="only the settings not at their default")
    s.add_argument("--json", action="store_true", help="as JSON")
    s.set_defaults(func=cmd_config)

    s = sub.add_parser("backup", help="copy the database (while the server runs) and the user data that matters")
    s.add_argument("dest", metavar="DEST", nargs="?", help="a new (or empty) folder for the backup")
    s.add_argument("--into", default=None, metavar="DIR",
                   help="instead of DEST: make the backup in DIR/cdui-YYYYMMDD-HHMMSS (UTC), for a timer")
    s.add_argument("--keep", type=int, default=None, metavar="N",
                   help="with --into: then remove all but the newest N backups made there")
    s.set_defaults(func=cmd_backup)

    s = sub.add_parser("restore", help="restore a backup made by `cdui backup` (the server must be stopped)")
    s.add_argument("src", metavar="SRC", help="the backup's folder")
    s.set_defaults(func=cmd_restore)

    s = sub.add_parser("logs", help="print the log of the background server (or agent, or a worker)")
    s.add_argument("--follow", "-f", action="store_true", help="keep printing what is written (Ctrl+C stops)")
    s.add_argument("--lines", "-n", type=int, default=50, metavar="N", help="the last N lines (default 50)")
    s.add_argument("--agent", action="store_true", help="the agent's log (agent.log) instead of the server's")
    s.add_argument("--worker", default=None, metavar="NAME",
                   help="a connected worker's newest log lines, asked of its agent by the control plane")
    s.add_argument("--control", default=None, help=CONTROL_HELP)
    s.add_argument("--ca-fingerprint", default=None, metavar="sha256:HEX",
                   help="through a TLS proxy with a self-signed certificate: its key's fingerprint (pinned)")
    s.set_defaults(func=cmd_logs)
