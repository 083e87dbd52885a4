"""The node registry: built-in nodes, drop-in custom nodes, plugin packs.

- Built-in nodes are the :class:`~cdui.nodes.base.Node` subclasses defined in
  the modules of :mod:`cdui.nodes.builtin`.
- Custom nodes are ``*.py`` files in ``<data>/custom_nodes/``; every Node
  subclass with a ``NODE_NAME`` defined in such a file is registered. Loaded at
  start, so a new file is available after a restart.
- Plugin packs live in ``<install>/plugins/<id>/cdui.plugin.toml``::

      [plugin]
      id = "mypack"           # optional, defaults to the folder name
      name = "My pack"
      modules = ["nodes.py"]  # files beside the toml, relative

  Their node types are registered as ``<id>:<NODE_NAME>``.

A file that fails to import is reported in :attr:`Registry.load_errors` (and
the nodes catalog), never a crash of the server.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import pkgutil
import sys
import tomllib
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cdui.nodes.builtin
from cdui.nodes.base import Node

log = logging.getLogger(__name__)
HIDE_SETTING = "CODEFYUI_NODES_HIDE"


def hidden_types(env: Mapping[str, str] | None = None) -> set[str]:
    """Node types this installation leaves out of its registry (CODEFYUI_NODES_HIDE):
    a way to try a worker that lacks a type without uninstalling anything."""
    env = os.environ if env is None else env
    return {t.strip() for t in env.get(HIDE_SETTING, "").split(",") if t.strip()}


def _node_classes(module: Any) -> list[type[Node]]:
    out = []
    for value in vars(module).values():
        if (isinstance(value, type) and issubclass(value, Node) and value is not Node
                and value.NODE_NAME and value.__module__ == module.__name__):
            out.append(value)
    return out


class Registry:
    def __init__(self) -> None:
        self.nodes: dict[str, type[Node]] = {}
        self.sources: dict[str, str] = {}
        self.load_errors: list[dict[str, str]] = []

    def register(self, cls: type[Node], name: str | None = None, source: str = "builtin") -> None:
        self.nodes[name or cls.NODE_NAME] = cls
        self.sources[name or cls.NODE_NAME] = source

    def get(self, type_name: str) -> type[Node] | None:
        return self.nodes.get(type_name)

    def __contains__(self, type_name: str) -> bool:
        return type_name in self.nodes

    def preset_params(self, type_name: str) -> tuple[str, ...]:
        """The params by which a node of ``type_name`` runs a preset by name (none for an unknown type)."""
        cls = self.nodes.get(type_name)
        return cls.preset_params() if cls is not None else ()

    # -- loading ------------------------------------------------------------
    def load_builtin(self) -> None:
        pkg = cdui.nodes.builtin
        for info in pkgutil.iter_modules(pkg.__path__):
            module = importlib.import_module(f"{pkg.__name__}.{info.name}")
            for cls in _node_classes(module):
                self.register(cls)

    def _import_file(self, path: Path, module_name: str) -> Any | None:
        try:
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
            return module
        except Exception as exc:  # a broken drop-in file must not take the server down
            sys.modules.pop(module_name, None)
            self.load_errors.append({"file": str(path), "error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc(limit=3)})
            log.warning("could not load node file %s: %s", path, exc)
            return None

    def load_custom_dir(self, folder: Path) -> None:
        if not folder.is_dir():
            return
        for path in sorted(folder.glob("*.py")):
            if path.name.startswith("_"):
                continue
            module = self._import_file(path, f"cdui_custom_nodes.{path.stem}")
            if module is not None:
                for cls in _node_classes(module):
                    self.register(cls, source=f"custom:{path.name}")

    def load_plugins(self, plugins_dir: Path) -> None:
        if not plugins_dir.is_dir():
            return
        for manifest in sorted(plugins_dir.glob("*/cdui.plugin.toml")):
            try:
                meta = tomllib.loads(manifest.read_text(encoding="utf-8")).get("plugin", {})
            except (OSError, tomllib.TOMLDecodeError) as exc:
                self.load_errors.append({"file": str(manifest), "error": f"bad manifest: {exc}"})
                continue
            pid = str(meta.get("id") or manifest.parent.name)
            for rel in meta.get("modules", ["nodes.py"]):
                path = (manifest.parent / rel).resolve()
                if manifest.parent.resolve() not in path.parents:
                    self.load_errors.append({"file": str(manifest),
                                             "error": f"module {rel!r} is outside the plugin folder"})
                    continue
                module = self._import_file(path, f"cdui_plugin_{pid}.{path.stem}")
                if module is not None:
                    for cls in _node_classes(module):
                        self.register(cls, f"{pid}:{cls.NODE_NAME}", source=f"plugin:{pid}")

    def catalog(self) -> list[dict[str, Any]]:
        out = []
        for name in sorted(self.nodes):
            d = self.nodes[name].describe()
            d["type"] = name
            d["source"] = self.sources[name]
            out.append(d)
        return out


def build_registry(custom_dir: Path | None = None, plugins_dir: Path | None = None) -> Registry:
    reg = Registry()
    reg.load_builtin()
    if plugins_dir is not None:
        reg.load_plugins(plugins_dir)
    if custom_dir is not None:
        reg.load_custom_dir(custom_dir)
    for name in hidden_types():  # CODEFYUI_NODES_HIDE: left out as if it were not installed
        reg.nodes.pop(name, None)
        reg.sources.pop(name, None)
    return reg
