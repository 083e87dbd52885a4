"""Where files live: the installation root, the data folders, the user data dir.

Relative paths in node params resolve against the installation root (the
folder holding ``data/``) on every machine, whatever the current directory.
A path that starts with ``data/`` always resolves inside the data folders,
wherever ``CODEFYUI_DATA_DIR`` or a per-folder variable (or, on a worker, the
run's own folder) puts them. Built-in samples (``data/samples/``) fall back to
the installation's copy.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from cdui.errors import PathRefused
from cdui.paths import safe_join

INSTALL_ROOT = Path(__file__).resolve().parent.parent
DATA_FOLDERS = ("files", "images", "models", "media", "output", "graphs", "presets",
                "samples", "custom_nodes")
FOLDER_ENV = {
    "files": "CODEFYUI_DATA_FILES_DIR",
    "images": "CODEFYUI_IMAGES_DIR",
    "models": "CODEFYUI_MODELS_DIR",
    "media": "CODEFYUI_MEDIA_DIR",
}


@dataclass
class Layout:
    install_root: Path
    data_dir: Path
    folders: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None,
                 install_root: Path | None = None) -> "Layout":
        env = os.environ if env is None else env
        root = Path(install_root or INSTALL_ROOT)
        data = Path(env.get("CODEFYUI_DATA_DIR") or root / "data").expanduser().absolute()
        folders = {name: data / name for name in DATA_FOLDERS}
        for name, var in FOLDER_ENV.items():
            if env.get(var):
                folders[name] = Path(env[var]).expanduser().absolute()
        return cls(root, data, folders)

    @classmethod
    def for_data_dir(cls, data_dir: Path, install_root: Path | None = None) -> "Layout":
        """A layout whose every folder sits under ``data_dir`` (a worker's run folder)."""
        data_dir = Path(data_dir).absolute()
        return cls(Path(install_root or INSTALL_ROOT), data_dir,
                   {name: data_dir / name for name in DATA_FOLDERS})

    def to_json(self) -> dict[str, str]:
        return {"install_root": str(self.install_root), "data_dir": str(self.data_dir),
                **{f"folder:{k}": str(v) for k, v in self.folders.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, str]) -> "Layout":
        folders = {k.split(":", 1)[1]: Path(v) for k, v in d.items() if k.startswith("folder:")}
        return cls(Path(d["install_root"]), Path(d["data_dir"]), folders)

    def folder(self, name: str) -> Path:
        return self.folders.get(name, self.data_dir / name)

    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    def run_dir(self, run_id: str) -> Path:
        return safe_join(self.runs_dir(), run_id)

    def ensure(self) -> None:
        for name in ("files", "images", "models", "media", "output", "custom_nodes"):
            self.folder(name).mkdir(parents=True, exist_ok=True)

    # -- resolving node params --------------------------------------------
    def resolve(self, value: str) -> Path:
        """Resolve a relative path from a node param (for reading)."""
        if not isinstance(value, str) or not value.strip():
            raise PathRefused(repr(value), "empty path", "choose a file")
        v = value.strip().replace("\\", "/")
        if v.startswith("data/") or v == "data":
            rest = v[5:]
            head, _, tail = rest.partition("/")
            if head in self.folders and tail:
                p = safe_join(self.folder(head), tail)
                if head == "samples" and not p.exists():
                    builtin = safe_join(self.install_root / "data" / "samples", tail)
                    if builtin.exists():
                        return builtin
                return p
            return safe_join(self.data_dir, rest, allow_empty=True)
        return safe_join(self.install_root, v)

    def resolve_upload(self, folder: str, value: str) -> Path:
        """Resolve an upload field value: a path inside ``folder`` or a ``data/...`` path."""
        v = value.strip().replace("\\", "/")
        if v.startswith("data/"):
            return self.resolve(v)
        return safe_join(self.folder(folder), v)

    def resolve_output(self, folder: str, value: str) -> Path:
        """Resolve a path a node writes, relative to its own folder (``models/``, ``output/``).

        ``data/models/...``, ``data/output/...`` and ``data/media/...`` are accepted too;
        any other ``data/`` folder (graphs, presets, custom nodes) is cdui's own and refused.
        """
        v = value.strip().replace("\\", "/")
        if v.startswith("data/"):
            head = v[5:].partition("/")[0]
            if head not in ("models", "output", "media"):
                raise PathRefused(value, f"nodes may write into data/models, data/output or data/media, not data/{head}",
                                  hint=f"give a path relative to {folder}/")
            return self.resolve(v)
        return safe_join(self.folder(folder), v)
