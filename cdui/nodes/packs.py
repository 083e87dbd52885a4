"""Plugin packs: manifests, the safety check, hostile-archive-safe unpacking, the lockfile, install.

A pack is a folder with ``cdui.plugin.toml``. Two formats are read:

- **CodefyUI's**: ``[plugin]`` ``id`` / ``name`` / ``version`` / ``schema_version`` (1) /
  ``requires_codefyui``, ``[content]`` ``nodes_dir`` / ``examples_dir`` (default ``nodes`` and
  ``examples``); node files import CodefyUI's node API, which cdui provides
  (cdui/nodes/codefyui_compat.py).
- **cdui's own**: ``[plugin] modules = ["nodes.py"]``, files of :class:`cdui.nodes.base.Node` s.

Installed packs are copied to ``<user data>/plugins/<id>/`` and recorded in
``<user data>/plugins/installed.json`` (the lockfile: id, version, source, sha256 of the archive
or tree); a linked pack is recorded with its own folder, which is loaded in place. Every process
that builds a node registry (the control plane, an agent, a run) reads the lockfile, so an
install is seen by new runs at once and by a server's catalog after ``cdui plugin reload``.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from cdui.nodes import pack_deps

MANIFEST = "cdui.plugin.toml"
LOCKFILE = "installed.json"
ID_RE = re.compile(r"^[a-z0-9](?:[a-z0-9_-]*[a-z0-9])?$")
# Bounds on what an archive may unpack to (it came from somewhere else: a hostile one must not fill the disk).
MAX_MEMBERS = 5000
MAX_FILE_BYTES = 64 * 1024 ** 2
MAX_TOTAL_BYTES = 256 * 1024 ** 2
MAX_MANIFEST_BYTES = 256 * 1024
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
PRESETS_DIR = "presets"
MAX_PRESET_BYTES = 1 << 20


class PackError(Exception):
    """A pack that cannot be installed: every problem found, one per line."""

    def __init__(self, what: str, problems: list[str], hint: str = "") -> None:
        self.what = what
        self.problems = problems
        self.hint = hint
        super().__init__(what + "".join(f"\n  - {p}" for p in problems) + (f"\n({hint})" if hint else ""))


@dataclass
class Manifest:
    folder: Path
    id: str
    name: str
    version: str
    description: str = ""
    fmt: str = "codefyui"  # or "cdui"
    schema_version: int | None = None
    requires: str | None = None
    nodes_dir: str = "nodes"
    examples_dir: str = "examples"
    modules: list[str] = field(default_factory=list)
    capabilities: list[str] = field(default_factory=list)
    allowed_modules: list[str] = field(default_factory=list)
    python_deps: dict[str, str] = field(default_factory=dict)
    frontend_entry: str | None = None  # [frontend] entry, a file under frontend/ (recorded, not served: see docs)
    problems: list[str] = field(default_factory=list)

    def node_files(self) -> list[Path]:
        if self.fmt == "cdui":
            return [self.folder / m for m in self.modules]
        d = self.folder / self.nodes_dir
        return sorted(p for p in d.glob("*.py") if not p.name.startswith("_")) if d.is_dir() else []

    def examples(self) -> list[str]:
        """The example graphs the pack ships, as paths relative to its folder."""
        d = self.folder / self.examples_dir
        if not d.is_dir():
            return []
        return sorted(str(p.relative_to(self.folder)) for p in d.rglob("*.json") if p.is_file())

    def preset_files(self) -> list[Path]:
        """The presets the pack ships: ``presets/*.json`` (a fixed folder name, as in CodefyUI)."""
        d = self.folder / PRESETS_DIR
        return sorted(p for p in d.glob("*.json") if p.is_file() and not p.is_symlink()) if d.is_dir() else []

    def frontend_files(self) -> list[str]:
        """The files of ``frontend/``, relative to the pack (at most 200 listed)."""
        d = self.folder / "frontend"
        if not d.is_dir():
            return []
        return sorted(str(p.relative_to(self.folder)) for p in d.rglob("*") if p.is_file())[:200]


def _inside(folder: Path, rel: str) -> bool:
    try:
        return (folder / rel).resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


def read_manifest(folder: Path) -> Manifest:
    """The manifest of the pack in ``folder``, with what is wrong with it in ``problems`` (never raises)."""
    path = folder / MANIFEST
    problems: list[str] = []
    data: dict[str, Any] = {}
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            problems.append(f"{MANIFEST} is over {MAX_MANIFEST_BYTES // 1024} KiB")
        else:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"no {MANIFEST} in {folder} (a pack is a folder with that manifest)")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        problems.append(f"{MANIFEST} is not valid TOML: {exc}")
    plugin = data.get("plugin")
    if data and not isinstance(plugin, dict):
        problems.append(f"{MANIFEST} has no [plugin] table")
        plugin = {}
    plugin = plugin or {}
    pid = plugin.get("id", folder.name)
    if not isinstance(pid, str) or not ID_RE.match(pid):
        problems.append(f"id {pid!r} is not a valid pack id (lower-case letters, digits, '-' and '_', "
                        "starting and ending with a letter or digit)")
        pid = str(pid)
    content = data.get("content") if isinstance(data.get("content"), dict) else {}
    assert isinstance(content, dict)
    fmt = "cdui" if "modules" in plugin else "codefyui"
    m = Manifest(folder=folder, id=pid, name=str(plugin.get("name") or pid), version=str(plugin.get("version", "")),
                 description=str(plugin.get("description", "")), fmt=fmt, problems=problems,
                 requires=str(plugin["requires_codefyui"]) if "requires_codefyui" in plugin else None)
    if "schema_version" in plugin:
        sv = plugin["schema_version"]
        m.schema_version = sv if isinstance(sv, int) else None
        if sv != 1:
            problems.append(f"schema_version {sv!r} is not supported (only 1 is)")
    for key in ("nodes_dir", "examples_dir"):
        v = content.get(key, getattr(m, key))
        if not isinstance(v, str) or not v or not _inside(folder, v):
            problems.append(f"[content] {key} {v!r} is not a folder inside the pack")
        else:
            setattr(m, key, v)
    if fmt == "cdui":
        mods = plugin.get("modules")
        if not isinstance(mods, list) or not all(isinstance(x, str) for x in mods):
            problems.append("[plugin] modules must be a list of file names")
        else:
            m.modules = mods
            problems.extend(f"module {x!r} is outside the pack folder" for x in mods if not _inside(folder, x))
    elif not (folder / m.nodes_dir).is_dir() and not problems:
        if (folder / "nodes.py").is_file():  # a cdui pack that left `modules` at its default
            m.fmt, m.modules = "cdui", ["nodes.py"]
        else:
            problems.append(f"no {m.nodes_dir}/ folder of node files")
    sec = data.get("security") if isinstance(data.get("security"), dict) else {}
    assert isinstance(sec, dict)
    caps = sec.get("capabilities", [])
    if not isinstance(caps, list) or not all(isinstance(c, str) and c in CAPABILITIES for c in caps):
        problems.append(f"[security] capabilities {caps!r} must be a list of {', '.join(CAPABILITIES)}")
    else:
        m.capabilities = caps
    m.python_deps, dep_problems = pack_deps.parse(data.get("python_deps"))
    problems.extend(dep_problems)
    front = data.get("frontend") if isinstance(data.get("frontend"), dict) else {}
    assert isinstance(front, dict)
    entry = front.get("entry")
    # CodefyUI's rule: a relative POSIX path under frontend/; anything else counts as no frontend.
    if isinstance(entry, str) and entry.startswith("frontend/") and ".." not in entry.split("/") \
            and _inside(folder, entry):
        m.frontend_entry = entry
    allowed = sec.get("allowed_modules", [])
    if not isinstance(allowed, list) or not all(isinstance(c, str) for c in allowed):
        problems.append("[security] allowed_modules must be a list of module names")
    else:
        m.allowed_modules = allowed
    return m


# -- the safety check ------------------------------------------------------------------------------
# Module roots a pack may not import unless a declared capability names them, or at all (the rest).
CAPABILITIES: dict[str, frozenset[str]] = {
    "network": frozenset({"requests", "urllib", "urllib3", "http", "socket", "ssl", "_socket", "_ssl", "httpx",
                          "ftplib", "smtplib", "aiohttp"}),
    "filesystem": frozenset({"pathlib", "tempfile", "shutil", "zipfile", "tarfile", "gzip", "bz2", "lzma",
                             "codecs", "sqlite3", "_sqlite3", "glob", "fileinput", "readline"}),
    "process-env": frozenset({"os", "ntpath", "posixpath", "genericpath", "nt", "posix"}),
}
NEVER = frozenset({"subprocess", "sys", "importlib", "ctypes", "pickle", "marshal", "dill", "shelve", "runpy",
                   "code", "codeop", "signal", "atexit", "webbrowser", "threading", "_thread", "asyncio",
                   "multiprocessing", "builtins", "gc", "inspect", "pty", "cffi", "mmap", "resource", "pdb"})
PURE_PATH_NAMES = frozenset({"join", "basename", "dirname", "split", "splitext", "splitdrive", "normpath",
                             "normcase", "isabs", "commonpath", "commonprefix", "sep", "altsep", "extsep",
                             "pathsep", "curdir", "pardir", "defpath"})
REFLECTION_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "globals", "breakpoint"})
REFLECTION_ATTRS = frozenset({"__class__", "__globals__", "__subclasses__", "__bases__", "__base__", "__mro__",
                              "__builtins__", "__code__", "__closure__", "__getattribute__", "__loader__",
                              "__spec__", "__import__", "__dict__", "__reduce__", "__reduce_ex__",
                              "f_globals", "f_locals", "f_back", "f_builtins", "f_code", "gi_frame", "cr_frame",
                              "ag_frame", "tb_frame", "tb_next"})
# Methods on values of allowed libraries that write files or fetch code from the network.
RISKY_METHODS = frozenset({"hub", "load_state_dict_from_url", "download_url_to_file", "system", "popen"})
BINARY_SUFFIXES = (".pyc", ".pyo", ".pyd", ".so", ".dylib", ".dll")


def _module_problems(name: str, allowed: set[str], where: str) -> list[str]:
    root = name.split(".")[0]
    if root in allowed or name in allowed:
        return []
    for cap, roots in CAPABILITIES.items():
        if root in roots:
            return [f"{where}: imports {name!r}, which needs the {cap!r} capability ([security] capabilities)"]
    if root in NEVER:
        return [f"{where}: imports {name!r}, which can run code or reach the interpreter"]
    return []


def scan_source(text: str, rel: str, capabilities: Iterable[str] = (),
                allowed_modules: Iterable[str] = ()) -> list[str]:
    """Obviously unsafe constructs in one Python file of a pack, as ``file:line: what`` lines: imports of
    modules that run code, reach the network, the file libraries or the environment (unless a declared
    capability names them), reflection (``eval``/``exec``/``compile``/``__import__``, dunder and frame
    attributes), ``torch.load`` without ``weights_only=True`` and remote-code helpers (``torch.hub``). A
    guardrail against mistakes and drive-by code, not a sandbox: it reads the pack's own statements."""
    allowed = set(allowed_modules)
    for cap in capabilities:
        allowed |= CAPABILITIES.get(cap, frozenset())
    try:
        tree = ast.parse(text, filename=rel)
    except (SyntaxError, ValueError) as exc:
        return [f"{rel}: does not parse as Python: {exc}"]
    out: list[str] = []
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for a in node.names:
                out += _module_problems(a.name, allowed, where)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "os.path" and all(a.name in PURE_PATH_NAMES for a in node.names):
                continue
            out += _module_problems(node.module, allowed, where)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in REFLECTION_BUILTINS:
                out.append(f"{where}: calls {f.id}(), which runs code the check cannot see")
            if isinstance(f, ast.Name) and f.id in ("getattr", "setattr", "delattr") and len(node.args) > 1 \
                    and isinstance(node.args[1], ast.Constant) and str(node.args[1].value) in REFLECTION_ATTRS:
                out.append(f"{where}: {f.id}(..., {node.args[1].value!r}) reaches the interpreter's internals")
            if isinstance(f, ast.Attribute) and f.attr == "load" and isinstance(f.value, ast.Name) \
                    and f.value.id == "torch":
                safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                           for k in node.keywords)
                if not safe:
                    out.append(f"{where}: torch.load without weights_only=True can run code stored in the file")
        elif isinstance(node, ast.Attribute):
            if node.attr in REFLECTION_ATTRS:
                out.append(f"{where}: attribute {node.attr!r} reaches the interpreter's internals")
            elif node.attr in RISKY_METHODS:
                out.append(f"{where}: attribute {node.attr!r} fetches or runs code from elsewhere")
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__"):
            out.append(f"{where}: name {node.id!r} reaches the interpreter's internals")
    return out


def scan_pack(m: Manifest) -> list[str]:
    """Every problem of the pack in ``m.folder``: its manifest's, then each Python file's (every ``.py``
    anywhere in it, since a node file may import any of them), and compiled files, which cannot be read."""
    problems = list(m.problems)
    for p in sorted(m.folder.rglob("*")):
        rel = str(p.relative_to(m.folder))
        if "__pycache__" in p.parts:
            continue
        if p.is_symlink():
            problems.append(f"{rel}: a link (a pack holds plain files)")
        elif p.suffix in BINARY_SUFFIXES:
            problems.append(f"{rel}: compiled code cannot be checked; ship the source")
        elif p.suffix in (".py", ".pyw") and p.is_file():
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(f"{rel}: unreadable: {exc}")
                continue
            problems += scan_source(text, rel, m.capabilities, m.allowed_modules)
    return problems


# -- archives --------------------------------------------------------------------------------------
def _safe_member(name: str) -> PurePosixPath:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        raise ValueError(f"member {name!r} has an absolute path")
    if ".." in p.parts:
        raise ValueError(f"member {name!r} climbs out of the archive with '..'")
    return p  # no parts: the archive's own root ("./"), which only a folder entry may name


def extract_archive(archive: Path, dest: Path) -> None:
    """Unpack a ``.tar.gz``/``.tgz``/``.tar``/``.zip`` pack into ``dest``, refusing (ValueError, nothing
    left behind worth keeping) absolute names, ``..``, links, devices and other special files, and more than
    the bounds allow; sizes are counted as bytes are written, not as the archive claims."""
    total = 0
    count = 0

    def write(rel: PurePosixPath, src: io.BufferedIOBase | Any) -> None:
        nonlocal total
        target = dest.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        with open(target, "xb") as out:
            while chunk := src.read(1024 * 1024):
                size += len(chunk)
                total += len(chunk)
                if size > MAX_FILE_BYTES:
                    raise ValueError(f"member {str(rel)!r} is over {MAX_FILE_BYTES // 1024 ** 2} MiB")
                if total > MAX_TOTAL_BYTES:
                    raise ValueError(f"the archive unpacks to over {MAX_TOTAL_BYTES // 1024 ** 2} MiB")
                out.write(chunk)

    def counted() -> None:
        nonlocal count
        count += 1
        if count > MAX_MEMBERS:
            raise ValueError(f"the archive has over {MAX_MEMBERS} members")

    name = archive.name.lower()
    if name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                counted()
                rel = _safe_member(info.filename)
                mode = (info.external_attr >> 16) & 0o170000
                if mode and mode not in (stat.S_IFREG, stat.S_IFDIR):
                    raise ValueError(f"member {info.filename!r} is a link or special file")
                if info.is_dir():
                    dest.joinpath(*rel.parts).mkdir(parents=True, exist_ok=True)
                    continue
                if not rel.parts:
                    raise ValueError(f"member {info.filename!r} has an empty name")
                with zf.open(info) as src:
                    write(rel, src)
        return
    if not name.endswith((".tar.gz", ".tgz", ".tar")):
        raise ValueError(f"{archive.name}: not a pack archive (use {', '.join(ARCHIVE_SUFFIXES)})")
    with tarfile.open(archive, "r:*") as tf:
        for member in tf:
            counted()
            rel = _safe_member(member.name)
            if member.isdir():
                dest.joinpath(*rel.parts).mkdir(parents=True, exist_ok=True)
                continue
            if not rel.parts:
                raise ValueError(f"member {member.name!r} has an empty name")
            if not member.isreg():
                kind = "link" if member.issym() or member.islnk() else "special file"
                raise ValueError(f"member {member.name!r} is a {kind}")
            member_src = tf.extractfile(member)
            assert member_src is not None
            write(rel, member_src)


def pack_root(folder: Path) -> Path:
    """The folder holding the manifest: ``folder`` or its single sub-folder (archives often wrap one)."""
    if (folder / MANIFEST).is_file():
        return folder
    subs = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
    if len(subs) == 1 and (subs[0] / MANIFEST).is_file():
        return subs[0]
    return folder


# -- hashing ---------------------------------------------------------------------------------------
def _skip(rel: Path) -> bool:
    return "__pycache__" in rel.parts or any(part.startswith(".") for part in rel.parts)


def tree_sha256(folder: Path) -> str:
    """One hash over a pack folder's files (names and contents, in name order; caches and dot-files left
    out): equal on every machine that has the same files."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if _skip(rel) or not p.is_file() or p.is_symlink():
            continue
        h.update(rel.as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).hexdigest().encode() + b"\n")
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


# -- the lockfile ----------------------------------------------------------------------------------
def store_dir(user_data: Path) -> Path:
    return user_data / "plugins"


def read_lock(store: Path) -> dict[str, dict[str, Any]]:
    """The lockfile's entries by pack id ({} when there is none or it is unreadable)."""
    try:
        data = json.loads((store / LOCKFILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    plugins = data.get("plugins") if isinstance(data, dict) else None
    return {str(k): v for k, v in plugins.items() if isinstance(v, dict)} if isinstance(plugins, dict) else {}


def write_lock(store: Path, entries: dict[str, dict[str, Any]]) -> None:
    store.mkdir(parents=True, exist_ok=True)
    tmp = store / f".{LOCKFILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"version": 1, "plugins": dict(sorted(entries.items()))}, indent=2) + "\n",
                   encoding="utf-8")
    os.replace(tmp, store / LOCKFILE)


def pack_folder(store: Path, entry: dict[str, Any]) -> Path:
    """Where a locked pack's files are: its own folder for a linked one, else its copy in the store."""
    if entry.get("source_kind") == "local" and entry.get("path"):
        return Path(str(entry["path"]))
    return store / str(entry.get("id"))


def installed(store: Path) -> list[tuple[dict[str, Any], Path]]:
    """Each locked pack's entry and folder, in id order."""
    return [(e, pack_folder(store, {**e, "id": pid})) for pid, e in sorted(read_lock(store).items())]


def pins(store: Path) -> dict[str, dict[str, str]]:
    """``{id: {"version", "sha256"}}`` of every installed pack: what a worker reports and a project freezes."""
    return {pid: {"version": str(e.get("version", "")), "sha256": str(e.get("sha256", ""))}
            for pid, e in sorted(read_lock(store).items())}


# -- install ---------------------------------------------------------------------------------------
def find_named(name: str, search: Iterable[Path]) -> Path | None:
    """A pack called ``name`` in one of the ``search`` folders (a lab's pack directory, the wheelhouse, a
    copy of CodefyUI's repository): ``NAME/``, ``plugins/NAME/``, ``NAME.tar.gz``, ``NAME-VERSION.tar.gz``,
    ``NAME.zip`` (the newest-named archive when there are several versions)."""
    for root in search:
        for cand in (root / name, root / "plugins" / name):
            if (cand / MANIFEST).is_file():
                return cand
        archives = sorted(p for p in root.glob(f"{name}*") if p.is_file() and p.name.lower().endswith(ARCHIVE_SUFFIXES)
                          and re.match(rf"^{re.escape(name)}(-[0-9][^/]*)?\.(tar\.gz|tgz|tar|zip)$", p.name, re.I))
        if archives:
            return archives[-1]
    return None


def search_folders(env: Mapping[str, str] | None = None) -> list[Path]:
    """Where a pack named on the command line is looked for: CODEFYUI_PLUGIN_SOURCES, then the wheelhouse."""
    env = os.environ if env is None else env
    out = [Path(x.strip()).expanduser() for x in env.get("CODEFYUI_PLUGIN_SOURCES", "").split(",") if x.strip()]
    if env.get("CODEFYUI_WHEELHOUSE"):
        out.append(Path(env["CODEFYUI_WHEELHOUSE"]).expanduser())
    return out


@dataclass
class Installed:
    entry: dict[str, Any]
    manifest: Manifest
    problems: list[str]  # the safety check's, installed anyway under --trust
    deps_installed: list[str] = field(default_factory=list)  # [python_deps] pip installed (--install-deps)


def _ensure_deps(m: Manifest, what: Path, search: list[Path], install_deps: bool) -> list[str]:
    """The pack's ``[python_deps]`` that cdui's environment lacks, installed from the ``search`` folders' wheels
    when ``install_deps`` (pip with ``--no-index``), else refused naming each; the requirements installed."""
    missing = [d for d in pack_deps.check(m.python_deps) if not d.satisfied]
    if not missing:
        return []
    reqs = [d.requirement for d in missing]
    hint = pack_deps.offline_hint(reqs)
    if not install_deps:
        raise PackError(f"{what}: pack {m.id!r} needs Python distributions that cdui's environment lacks",
                        [d.describe() for d in missing], hint=hint)
    folders = [f for f in search if f.is_dir()]
    if not folders:
        raise PackError(f"{what}: --install-deps has no folder of wheels to install {', '.join(reqs)} from", [],
                        hint="set CODEFYUI_PLUGIN_SOURCES or CODEFYUI_WHEELHOUSE to folders holding their wheels")
    ok, tail = pack_deps.install(reqs, folders)
    still = [d for d in pack_deps.check(m.python_deps) if not d.satisfied]
    if not ok or still:
        raise PackError(f"{what}: {', '.join(reqs)} could not be installed from {', '.join(map(str, folders))} "
                        "(pip --no-index)", [d.describe() for d in still] + ([tail] if tail else []), hint=hint)
    return reqs


def install(source: str, store: Path, search: Iterable[Path] = (), *, trust: bool = False,
            force: bool = False, expect_sha256: str | None = None, install_deps: bool = False) -> Installed:
    """Install one pack from ``source`` (a folder, an archive, or a name found in ``search``) into ``store``
    and lock it. Raises :class:`PackError` listing every problem (with ``trust``, the safety check's
    findings are installed anyway and returned; manifest problems never are). A pack whose ``[python_deps]``
    cdui's environment lacks is refused, or with ``install_deps`` they are installed from the wheels in the
    ``search`` folders, offline."""
    search = list(search)
    path = Path(source).expanduser()
    kind = "folder" if path.is_dir() else "archive" if path.is_file() else "name"
    if kind == "name":
        found = find_named(source, search)
        if found is None:
            where = ", ".join(str(s) for s in search) or "none set"
            raise PackError(f"no pack {source!r}: not a folder, an archive or a pack found by name", [],
                            hint=f"give the path of the pack's folder or archive, or put it in a folder of "
                                 f"CODEFYUI_PLUGIN_SOURCES or CODEFYUI_WHEELHOUSE (looked in: {where})")
        path = found
    store.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".unpack-", dir=store) as tmp:
        if path.is_file():
            sha = file_sha256(path)
            try:
                extract_archive(path, Path(tmp))
            except (ValueError, OSError, tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
                raise PackError(f"{path}: refused, the archive is not a safe pack archive", [str(exc)],
                                hint="build the archive from the pack folder with plain files only") from None
            root = pack_root(Path(tmp))
        else:
            root = path
            sha = tree_sha256(root)
        if expect_sha256 and sha != expect_sha256:
            raise PackError(f"{path}: sha256 {sha} is not the pinned {expect_sha256}", [],
                            hint="get the pack version the project pins, or freeze the project again")
        m = read_manifest(root)
        if m.problems:
            raise PackError(f"{path}: not a valid pack", m.problems, hint="fix the manifest")
        found_problems = scan_pack(m)
        if found_problems and not trust:
            raise PackError(f"{path}: refused, the safety check found {len(found_problems)} problem(s)",
                            found_problems, hint="remove them, or install anyway with --trust if you trust "
                                                 "whoever wrote the pack (it runs as you)")
        deps_installed = _ensure_deps(m, path, search, install_deps)
        lock = read_lock(store)
        old = lock.get(m.id)
        if old is not None and not force and old.get("sha256") != sha:
            raise PackError(f"pack {m.id!r} is already installed (version {old.get('version')}, "
                            f"sha256 {str(old.get('sha256'))[:12]})", [],
                            hint=f"uninstall it first (`cdui plugin uninstall {m.id}`) or pass --force")
        target = store / m.id
        staged = Path(tmp) / ".staged"
        shutil.copytree(root, staged, ignore=shutil.ignore_patterns("__pycache__", ".git"), symlinks=True)
        if target.exists() and not (old or {}).get("source_kind") == "local":
            shutil.rmtree(target)
        os.replace(staged, target)
    entry = {"id": m.id, "name": m.name, "version": m.version, "format": m.fmt, "source": str(path),
             "source_kind": kind, "sha256": sha, "installed_at": int(time.time()),
             "trusted": bool(found_problems)}
    if m.python_deps:
        entry["python_deps"] = sorted(m.python_deps.values())
    lock[m.id] = entry
    write_lock(store, lock)
    return Installed(entry, read_manifest(target), found_problems, deps_installed)


def install_pushed(pack_id: str, version: str, pin: str, tree: str, data: bytes, store: Path) -> Installed:
    """Install a pack the control plane pushed (a .tar.gz in ``data``): unpacked and checked as any archive,
    its files must hash to ``tree``, its id be ``pack_id``; locked with the control plane's ``pin`` so both
    sides report the same sha256. Raises :class:`PackError`."""
    store.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".pushed-", suffix=".tar.gz", dir=store)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        done = install(tmp, store, force=True)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    got = tree_sha256(store / done.entry["id"])
    if done.entry["id"] != pack_id or got != tree:
        uninstall(done.entry["id"], store)
        raise PackError(f"the pushed pack is not {pack_id!r} with files of sha256 {tree[:12]}", [
            f"it unpacked as {done.entry['id']!r} with files of sha256 {got[:12]}"], hint="push it again")
    lock = read_lock(store)
    lock[pack_id] = {**done.entry, "version": version or done.entry["version"], "sha256": pin,
                     "source": "pushed by the control plane", "source_kind": "pushed"}
    write_lock(store, lock)
    return Installed(lock[pack_id], done.manifest, [])


MAX_PUSHED_BYTES = 64 * 1024 ** 2  # a pushed archive read from a stream (ssh); more is refused before reading on
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def receive_pushed(stream: Any, size: int, pack_id: str, version: str, pin: str, tree: str,
                   store: Path) -> Installed:
    """Install a pack whose archive arrives on ``stream`` (``size`` bytes: an SSH worker's side of ``cdui plugin
    push``), checked as :func:`install_pushed` checks one from the connection. Every value is checked before
    any byte is read; a stream that ends early is refused. Raises :class:`PackError`."""
    if not ID_RE.match(pack_id):
        raise PackError(f"{pack_id!r} is not a pack id", [], hint="the control plane sends the installed pack's id")
    bad = [f"{name} {value!r} is not a sha256 (64 hex digits)" for name, value in (("--pin", pin), ("--tree", tree))
           if not SHA256_RE.match(value)]
    if bad:
        raise PackError("the pushed pack's checksums are malformed", bad, hint="push it again")
    if not 0 < size <= MAX_PUSHED_BYTES:
        raise PackError(f"a pushed archive of {size} bytes is refused (1 to {MAX_PUSHED_BYTES // 1024 ** 2} MiB)",
                        [], hint="install a larger pack on the worker with `cdui plugin install`")
    buf = bytearray()
    while len(buf) < size:
        chunk = stream.read(min(1024 * 1024, size - len(buf)))
        if not chunk:
            raise PackError(f"the pushed archive ended after {len(buf)} of {size} bytes", [], hint="push it again")
        buf += chunk
    return install_pushed(pack_id, version, pin, tree, bytes(buf), store)


def link(folder: Path, store: Path) -> Installed:
    """Record a pack folder that is loaded in place (for a pack being written): no copy, no safety check."""
    folder = folder.expanduser().resolve()
    m = read_manifest(folder)
    if m.problems:
        raise PackError(f"{folder}: not a valid pack", m.problems, hint="fix the manifest")
    lock = read_lock(store)
    old = lock.get(m.id)
    if old is not None and old.get("source_kind") != "local":
        raise PackError(f"pack {m.id!r} is already installed from {old.get('source')}", [],
                        hint=f"uninstall it first: `cdui plugin uninstall {m.id}`")
    entry = {"id": m.id, "name": m.name, "version": m.version, "format": m.fmt, "source": str(folder),
             "source_kind": "local", "path": str(folder), "sha256": tree_sha256(folder),
             "installed_at": int(time.time()), "trusted": True}
    lock[m.id] = entry
    write_lock(store, lock)
    return Installed(entry, m, [])


def uninstall(pid: str, store: Path, *, linked: bool | None = None) -> dict[str, Any]:
    """Remove pack ``pid`` from the lockfile, and its copy (never a linked folder). ``linked``: True for
    unlink (only a linked pack), False for uninstall (any)."""
    lock = read_lock(store)
    entry = lock.get(pid)
    if entry is None:
        known = ", ".join(sorted(lock)) or "none"
        raise PackError(f"no pack {pid!r} is installed (installed: {known})", [], hint="see `cdui plugin list`")
    if linked and entry.get("source_kind") != "local":
        raise PackError(f"pack {pid!r} is installed, not linked", [], hint=f"`cdui plugin uninstall {pid}`")
    del lock[pid]
    write_lock(store, lock)
    if entry.get("source_kind") != "local":
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(store / pid)
    return entry


def node_names(m: Manifest) -> list[str]:
    """The node types a pack declares (``<id>:<NODE_NAME>``), read from its files without importing them."""
    names = []
    for f in m.node_files():
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NODE_NAME"
                                                        for t in stmt.targets) \
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str) \
                        and stmt.value.value:
                    names.append(f"{m.id}:{stmt.value.value}")
    return sorted(names)


def describe(entry: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A locked pack for ``cdui plugin list/info`` and ``GET /api/plugins``."""
    m = read_manifest(folder)
    out = {**entry, "folder": str(folder), "present": (folder / MANIFEST).is_file(),
           "description": m.description, "nodes": node_names(m) if not m.problems else [],
           "examples": m.examples() if not m.problems else [],
           "python_deps": [{"requirement": d.requirement, "installed": d.installed, "satisfied": d.satisfied}
                           for d in pack_deps.check(m.python_deps)],
           "presets": sorted(pack_presets(m)), "frontend": m.frontend_entry,
           "frontend_files": m.frontend_files()}
    if m.problems:
        out["problems"] = m.problems
    return out



def pack_presets(m: Manifest) -> dict[str, dict[str, Any]]:
    """The presets a pack ships (``presets/*.json``, a fixed folder name as in CodefyUI) by their names under the
    pack's namespace, ``<id>:<name>`` (the name: the file's ``preset_name`` or ``name``, else its stem), as its
    node types are; a file that is not a JSON object, or over 1 MiB, is left out."""
    out: dict[str, dict[str, Any]] = {}
    for p in m.preset_files():
        try:
            if p.stat().st_size > MAX_PRESET_BYTES:
                continue
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(d, dict):
            name = f"{m.id}:{d.get('preset_name') or d.get('name') or p.stem}"
            out[name] = {**d, "preset_name": name}
    return out
