"""Where files live: the installation root, the data folders, the user data dir.

Relative paths in node params resolve against the installation root (the
folder holding ``data/``) on every machine, whatever the current directory.
A path that starts with ``data/`` always resolves inside the data folders,
wherever ``CODEFYUI_DATA_DIR`` or a per-folder variable (or, on a worker, the
run's own folder) puts them. Built-in samples (``data/samples/``) fall back to
the installation's copy.

No node path may reach the user data folder (credentials, the database, the
session token), even though the default one, ``<install>/.codefyui_dev``, sits
inside the installation root that relative paths resolve against. Every
resolved path is checked after following symlinks against the layout's user
data folder and the one this process's own settings name (a worker's run
subprocess knows both). The run's own data folders may lie inside a user data
folder (a worker's transfer runs live in ``<user-data>/agent-runs/``); what is
under them is the run's, and stays readable. Below the folder a path is read
from, no ``.git``, ``.venv`` or other agent's user data folder is reached
either (:func:`cdui.core.paths.protected_folder`).

An absolute path (``/datasets/imagenet``) is read only inside the data
folders (a node's output names its file so) or under a folder this machine's
``CODEFYUI_READ_ROOTS`` lists (a lab's ``/datasets``, ``/scratch``);
none is listed by default, so absolute paths are refused. Each machine lists
its own: the control plane for its local runs, each agent for the runs it
runs (it reports them to the control plane, which places a run only where its
absolute paths may be read, see :mod:`cdui.plane.sched.placement`). Writing stays inside
the data folders.

The installation root is configuration (``CODEFYUI_INSTALL_ROOT``). Without
it, a package imported from a checkout (``pyproject.toml`` and ``bin/cdui``
beside it) uses the checkout, and an installed wheel uses ``~/CodefyUI``,
the spec's installation folder: a wheel's parent folder is ``site-packages``,
which is no place for data. The web page and the built-in samples are package
data (``cdui/plane/web/``, ``cdui/nodes/samples/``), read from wherever the package is,
so a wheel serves the UI with no checkout at all.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from cdui.core.errors import PathRefused
from cdui.core.paths import protected_folder, safe_join
from cdui.core.project import ASSET_DATA_FOLDERS, PROJECT_SETTING

_PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def _default_install_root() -> Path:
    if (_PACKAGE_PARENT / "pyproject.toml").is_file() and (_PACKAGE_PARENT / "bin" / "cdui").is_file():
        return _PACKAGE_PARENT
    return Path.home() / "CodefyUI"


def install_root_from_env(env: Mapping[str, str] | None = None) -> Path:
    """The installation root this process's settings name (see the module docstring for the default)."""
    env = os.environ if env is None else env
    v = env.get("CODEFYUI_INSTALL_ROOT")
    return Path(v).expanduser().absolute() if v else _default_install_root()


def package_dir(name: str) -> Path:
    """A folder of package data (``plane/web``, ``nodes/samples``) as a real path: aiohttp serves
    static files from a directory, so the package must be installed unzipped, as pip does."""
    return Path(str(resources.files("cdui").joinpath(name)))


INSTALL_ROOT = install_root_from_env()
WEB_DIR = package_dir("plane/web")
SAMPLES_DIR = package_dir("nodes/samples")
DATA_FOLDERS = ("files", "images", "models", "media", "output", "graphs", "presets",
                "samples", "custom_nodes")
FOLDER_ENV = {
    "files": "CODEFYUI_DATA_FILES_DIR",
    "images": "CODEFYUI_IMAGES_DIR",
    "models": "CODEFYUI_MODELS_DIR",
    "media": "CODEFYUI_MEDIA_DIR",
}


def user_data_from_env(env: Mapping[str, str] | None = None) -> Path:
    """The user data folder this process's settings name (the default sits inside the installation)."""
    env = os.environ if env is None else env
    v = env.get("CODEFYUI_USER_DATA_DIR")
    return Path(v).expanduser().absolute() if v else install_root_from_env(env) / ".codefyui_dev"


READ_ROOTS_SETTING = "CODEFYUI_READ_ROOTS"


def parse_read_roots(value: str) -> tuple[Path, ...]:
    """``CODEFYUI_READ_ROOTS``: comma-separated absolute folders; ValueError names a relative one."""
    roots = []
    for item in (x.strip() for x in value.split(",")):
        if not item:
            continue
        p = Path(item).expanduser()
        if not p.is_absolute():
            raise ValueError(f"{item!r} is not an absolute folder")
        roots.append(Path(os.path.normpath(p)))
    return tuple(roots)


def read_roots_from_env(env: Mapping[str, str] | None = None) -> tuple[Path, ...]:
    """The folders this process's settings allow absolute node paths to read (none by default)."""
    env = os.environ if env is None else env
    return parse_read_roots(env.get(READ_ROOTS_SETTING) or "")


# The worker label an agent reports its read roots in, beside its mounts (comma-separated, as the setting).
READ_ROOTS_LABEL = "read-roots"


def read_roots_label(roots: tuple[Path, ...]) -> dict[str, str]:
    """The label that tells the control plane where this agent's runs may read absolute paths."""
    return {READ_ROOTS_LABEL: ",".join(str(r) for r in roots)} if roots else {}


def read_roots_in(labels: Mapping[str, str]) -> list[str]:
    """The read roots a worker reported in its labels (none: it reads no absolute path)."""
    return [r.strip() for r in str(labels.get(READ_ROOTS_LABEL) or "").split(",") if r.strip().startswith("/")]


def project_folders(project: Path, install_data: Path) -> dict[str, Path]:
    """The data folders of a project (cdui/core/project.py): CodefyUI's ``assets/`` names for what nodes
    read and write, the project's own graphs, presets and custom nodes, and the installation's uploads
    (``install_data/files``) and samples, which belong to the machine, not to the repository."""
    folders = {name: (project / "assets" / name if name in ASSET_DATA_FOLDERS else project / name)
               for name in DATA_FOLDERS}
    folders.update(files=install_data / "files", samples=install_data / "samples", assets=project / "assets")
    return folders


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@dataclass
class Layout:
    install_root: Path
    data_dir: Path
    folders: dict[str, Path] = field(default_factory=dict)
    user_data: Path | None = None
    read_roots: tuple[Path, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 install_root: Path | None = None) -> Layout:
        env = os.environ if env is None else env
        root = Path(install_root or install_root_from_env(env))
        data = Path(env.get("CODEFYUI_DATA_DIR") or root / "data").expanduser().absolute()
        folders = {name: data / name for name in DATA_FOLDERS}
        if env.get(PROJECT_SETTING):
            # A project is the data folder; uploads and the samples stay the installation's.
            project = Path(env[PROJECT_SETTING]).expanduser().absolute()
            folders = project_folders(project, data)
            data = project
        for name, var in FOLDER_ENV.items():
            if env.get(var):
                folders[name] = Path(env[var]).expanduser().absolute()
        return cls(root, data, folders, user_data_from_env(env), read_roots_from_env(env))

    @classmethod
    def for_data_dir(cls, data_dir: Path, install_root: Path | None = None,
                     user_data: Path | None = None, read_roots: tuple[Path, ...] | None = None) -> Layout:
        """A layout whose every folder sits under ``data_dir`` (a worker's run folder)."""
        data_dir = Path(data_dir).absolute()
        return cls(Path(install_root or install_root_from_env()), data_dir,
                   {name: data_dir / name for name in DATA_FOLDERS},
                   Path(user_data).absolute() if user_data else user_data_from_env(),
                   read_roots_from_env() if read_roots is None else tuple(read_roots))

    def with_project(self, project: Path) -> Layout:
        """This layout with ``project`` as its data folder (a worker whose ``data`` mount is a project
        folder treats it as that project); uploads and samples stay where this layout has them."""
        return replace(self, data_dir=project,
                       folders={**project_folders(project, self.data_dir),
                                "files": self.folder("files"), "samples": self.folder("samples")})

    def to_json(self) -> dict[str, str]:
        d = {"install_root": str(self.install_root), "data_dir": str(self.data_dir),
             **{f"folder:{k}": str(v) for k, v in self.folders.items()}}
        if self.user_data is not None:
            d["user_data"] = str(self.user_data)
        d.update({f"read_root:{i}": str(r) for i, r in enumerate(self.read_roots)})
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, str]) -> Layout:
        folders = {k.split(":", 1)[1]: Path(v) for k, v in d.items() if k.startswith("folder:")}
        roots = tuple(Path(v) for k, v in sorted(d.items(), key=lambda kv: kv[0]) if k.startswith("read_root:"))
        return cls(Path(d["install_root"]), Path(d["data_dir"]), folders,
                   Path(d["user_data"]) if d.get("user_data") else None, roots)

    def private_roots(self) -> list[Path]:
        """Folders no node path may reach: this layout's user data and this process's own."""
        roots = [self.user_data] if self.user_data is not None else []
        roots.append(user_data_from_env())
        return roots

    def check_not_private(self, path: Path, value: str) -> Path:
        """Refuse ``path`` if, symlinks followed, it lies in a user data folder (outside the run's own folders)."""
        resolved = path.resolve()
        for root in self.private_roots():
            r = root.resolve()
            if not _within(resolved, r):
                continue
            own = [f.resolve() for f in (self.data_dir, *self.folders.values())]
            if any(_within(f, r) and f != r and _within(resolved, f) for f in own):
                continue
            raise PathRefused(value, f"it leads into the user data folder {root} (credentials, the database and "
                                     "the session token live there), which nodes may not read or write",
                              hint="put the file under data/files/ and give data/files/NAME")
        # Below the deepest folder it is read from: no .git, .venv, nor any agent's user data folder.
        bases = [b.resolve() for b in (self.install_root, self.data_dir, *self.folders.values(), *self.read_roots)]
        inside = [b for b in bases if _within(resolved, b)]
        if inside:
            base = max(inside, key=lambda b: len(b.parts))
            bad = protected_folder(resolved, base)
            if bad is not None:
                what = (f"a {bad.name} folder" if bad.name in (".git", ".venv") else
                        "a project's secrets file" if bad.name == ".env" else "a cdui user data folder")
                raise PathRefused(value, f"it leads into {bad}, {what} (credentials, code or a database), "
                                         "which nodes may not read or write",
                                  hint="put the file under data/files/ and give data/files/NAME")
        return path

    def folder(self, name: str) -> Path:
        return self.folders.get(name, self.data_dir / name)

    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    def run_dir(self, run_id: str) -> Path:
        return safe_join(self.runs_dir(), run_id)

    def mount_roots(self) -> list[Path]:
        """Where this server may see a mounted worker's data folder: its own data folder, then each
        folder that holds a data folder a setting moved elsewhere under its own name (the NFS example
        of docs/remote-workers.md: ``CODEFYUI_MODELS_DIR=/mnt/codefyui/data/models`` while the
        database stays local gives ``/mnt/codefyui/data``, where a worker's run folders ``runs/`` lie)."""
        roots = [self.data_dir]
        for name in FOLDER_ENV:
            folder = self.folder(name)
            if folder.name == name and folder.parent not in roots and not _within(folder, self.data_dir):
                roots.append(folder.parent)
        return roots

    def mount_run_dirs(self, run_id: str) -> list[Path]:
        """The folders where a mount run's own files (checkpoints, TensorBoard logs) may lie here."""
        return [safe_join(root / "runs", run_id) for root in self.mount_roots()]

    def ensure(self) -> None:
        for name in ("files", "images", "models", "media", "output", "custom_nodes"):
            self.folder(name).mkdir(parents=True, exist_ok=True)

    # -- resolving node params --------------------------------------------
    def resolve(self, value: str) -> Path:
        """Resolve a relative path from a node param (for reading), or an absolute one under a read root."""
        if isinstance(value, str) and value.strip().startswith("/"):
            return self.check_not_private(self._resolve_absolute(value), value)
        try:
            path = self._resolve(value)
        except PathRefused as exc:
            # Say the most useful reason, naming the whole value the user gave:
            # a symlink or '..' that leads into the user data folder says so.
            naive = self._naive(value)
            if naive is not None:
                self.check_not_private(naive, value)
            if exc.value != value:
                raise PathRefused(value, exc.reason, exc.hint) from None
            raise
        return self.check_not_private(path, value)

    def _resolve_absolute(self, value: str) -> Path:
        """An absolute path, read only under one of this machine's read roots (symlinks may not leave it)."""
        v = value.strip()
        if ".." in v.split("/"):
            raise PathRefused(value, "'..' is not allowed", "name the file by its path without '..'")
        target = Path(v)
        # The run's own data folders are readable however they are named: a path a node output (VideoWrite's
        # `path`, wired into VideoLoad) is absolute.
        for root in (*self.read_roots, self.data_dir, *self.folders.values()):
            if _within(target, root):
                # safe_join refuses what the lexical check cannot see: '..', control characters, and a
                # symbolic link out of the root.
                try:
                    return safe_join(root, str(target.relative_to(root)) if target != root else "",
                                     allow_empty=True)
                except PathRefused as exc:  # name the whole path the user gave, not its part below the root
                    raise PathRefused(value, exc.reason, exc.hint) from None
        listed = ", ".join(str(r) for r in self.read_roots) or "none"
        raise PathRefused(value, f"absolute paths are read only under the folders {READ_ROOTS_SETTING} lists "
                                 f"on the machine that runs the graph (here: {listed})",
                          hint=f"add its folder to {READ_ROOTS_SETTING} on that machine (see "
                               "docs/configuration.md), or put the file under data/files/ and give data/files/NAME")

    def _naive(self, value: str) -> Path | None:
        """Where ``value`` would point without any of safe_join's checks (only to word an error)."""
        if not isinstance(value, str) or "\x00" in value:
            return None
        v = value.strip().replace("\\", "/")
        if v.startswith("data/"):
            head, _, tail = v[5:].partition("/")
            return (self.folder(head) / tail) if head in self.folders and tail else self.data_dir / v[5:]
        return self.install_root / v

    def _resolve(self, value: str) -> Path:
        if not isinstance(value, str) or not value.strip():
            raise PathRefused(repr(value), "empty path", "choose a file")
        v = value.strip().replace("\\", "/")
        if v.startswith("assets/") and "assets" in self.folders:
            # A project's assets, named as CodefyUI's project graphs name them (assets/data/x.csv).
            return safe_join(self.folder("assets"), v[len("assets/"):])
        if v.startswith("data/") or v == "data":
            rest = v[5:]
            head, _, tail = rest.partition("/")
            if head in self.folders and tail:
                p = safe_join(self.folder(head), tail)
                if head == "samples" and not p.exists():
                    # the installation's own samples, else the ones shipped in the package
                    for base in (self.install_root / "data" / "samples", SAMPLES_DIR):
                        builtin = safe_join(base, tail)
                        if builtin.exists():
                            return builtin
                return p
            return safe_join(self.data_dir, rest, allow_empty=True)
        return safe_join(self.install_root, v)

    def resolve_upload(self, folder: str, value: str) -> Path:
        """Resolve an upload field value: a path inside ``folder`` or a ``data/...`` path."""
        v = value.strip().replace("\\", "/")
        if v.startswith("data/") or v.startswith("/"):
            return self.resolve(v)
        return self.check_not_private(safe_join(self.folder(folder), v), value)

    def resolve_output(self, folder: str, value: str) -> Path:
        """Resolve a path a node writes, relative to its own folder (``models/``, ``output/``).

        ``data/models/...``, ``data/output/...`` and ``data/media/...`` are accepted too;
        any other ``data/`` folder (graphs, presets, custom nodes) is cdui's own and refused.
        """
        v = value.strip().replace("\\", "/")
        if v.startswith("data/"):
            head = v[5:].partition("/")[0]
            if head not in ("models", "output", "media"):
                raise PathRefused(value,
                                  f"nodes may write into data/models, data/output or data/media, not data/{head}",
                                  hint=f"give a path relative to {folder}/")
            return self.resolve(v)
        return self.check_not_private(safe_join(self.folder(folder), v), value)
