"""The node registry: built-in nodes, drop-in custom nodes, plugin packs.

- Built-in nodes are the :class:`~cdui.nodes.base.Node` subclasses defined in
  the modules of :mod:`cdui.nodes.builtin`.
- Custom nodes are ``*.py`` files in ``<data>/custom_nodes/``; every Node
  subclass with a ``NODE_NAME`` defined in such a file is registered. Loaded at
  start, so a new file is available after a restart.
- Plugin packs: those ``cdui plugin install`` locked in ``<user data>/plugins/installed.json``
  (cdui/nodes/packs.py), and drop-in folders ``<install>/plugins/<id>/cdui.plugin.toml``. A pack
  in CodefyUI's format has its node files in ``nodes/`` written against CodefyUI's node API
  (cdui/nodes/codefyui_compat.py); one in cdui's names its files::

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
import re
import sys
import traceback
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cdui.nodes.builtin
from cdui.nodes import codefyui_compat, packs
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
        self.packs: dict[str, str] = {}  # pack id -> its folder

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
        """The drop-in packs of ``plugins_dir`` (``<install>/plugins``): every ``*/cdui.plugin.toml``."""
        if not plugins_dir.is_dir():
            return
        for manifest in sorted(plugins_dir.glob(f"*/{packs.MANIFEST}")):
            self.load_pack(manifest.parent)

    def load_installed(self, store: Path) -> None:
        """The packs the lockfile of ``store`` (``<user data>/plugins``) records, installed or linked."""
        for entry, folder in packs.installed(store):
            if not (folder / packs.MANIFEST).is_file():
                self.load_errors.append({"file": str(folder), "error": f"pack {entry.get('id')!r} is in the "
                                         f"lockfile but its folder {folder} is gone (install it again)"})
                continue
            self.load_pack(folder, str(entry.get("id")))

    def load_pack(self, folder: Path, expect_id: str | None = None) -> None:
        m = packs.read_manifest(folder)
        if m.problems:
            self.load_errors.append({"file": str(folder / packs.MANIFEST), "error": "; ".join(m.problems)})
            log.warning("plugin pack in %s not loaded: %s", folder, "; ".join(m.problems))
            return
        pid = expect_id or m.id
        if pid in self.packs:
            self.load_errors.append({"file": str(folder), "error": f"pack {pid!r} is installed twice; "
                                     f"the one in {self.packs[pid]} is used"})
            return
        self.packs[pid] = str(folder)
        if m.fmt == "cdui":
            for rel in m.modules:
                path = (folder / rel).resolve()
                module = self._import_file(path, f"cdui_plugin_{pid}.{path.stem}")
                if module is not None:
                    for cls in _node_classes(module):
                        self.register(cls, f"{pid}:{cls.NODE_NAME}", source=f"plugin:{pid}")
            return
        # CodefyUI's format: the pack is a package (cdui_plugins.<id>), its node files modules of <nodes_dir>,
        # so their relative imports work; the module names CodefyUI's API lives under are provided first.
        codefyui_compat.install_modules()
        pkg = f"cdui_plugins.{re.sub(r'[^0-9a-zA-Z_]', '_', pid)}"
        for name in [k for k in sys.modules if k == pkg or k.startswith(pkg + ".")]:
            del sys.modules[name]  # a reload reads the files again
        _package("cdui_plugins", None)
        _package(pkg, folder)
        nodes_pkg = _package(f"{pkg}.{m.nodes_dir.replace('/', '.')}", folder / m.nodes_dir)
        if nodes_pkg is None:
            self.load_errors.append({"file": str(folder / m.nodes_dir / "__init__.py"),
                                     "error": "the nodes folder's __init__.py failed to import"})
            return
        for path in m.node_files():
            modname = f"{nodes_pkg.__name__}.{path.stem}"
            try:
                module = importlib.import_module(modname)
            except Exception as exc:  # a broken pack file must not take the server down
                sys.modules.pop(modname, None)
                self.load_errors.append({"file": str(path), "error": f"{type(exc).__name__}: {exc}",
                                         "traceback": traceback.format_exc(limit=3)})
                log.warning("could not load node file %s: %s", path, exc)
                continue
            for value in vars(module).values():
                if codefyui_compat.is_codefyui_node(value, modname):
                    name = f"{pid}:{value.NODE_NAME}"
                    self.register(codefyui_compat.adapt(value, name, pid), name, source=f"plugin:{pid}")
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


def _package(name: str, folder: Path | None) -> Any:
    """Module ``name`` as a package over ``folder`` (its ``__init__.py`` run when there is one); None when
    that ``__init__.py`` fails."""
    if name in sys.modules:
        return sys.modules[name]
    init = folder / "__init__.py" if folder is not None else None
    if init is not None and init.is_file():
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception:
            sys.modules.pop(name, None)
            return None
    else:
        module = types.ModuleType(name)
        module.__path__ = [str(folder)] if folder is not None else []
        sys.modules[name] = module
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, module)
    return module


def build_registry(custom_dir: Path | None = None, plugins_dir: Path | None = None,
                   plugin_store: Path | None = None) -> Registry:
    """Built-in nodes, then the installed packs of ``plugin_store`` (``<user data>/plugins``), the drop-in
    packs of ``plugins_dir`` and the custom nodes of ``custom_dir``."""
    reg = Registry()
    reg.load_builtin()
    if plugin_store is not None:
        reg.load_installed(plugin_store)
    if plugins_dir is not None:
        reg.load_plugins(plugins_dir)
    if custom_dir is not None:
        reg.load_custom_dir(custom_dir)
    for name in hidden_types():  # CODEFYUI_NODES_HIDE: left out as if it were not installed
        reg.nodes.pop(name, None)
        reg.sources.pop(name, None)
    return reg
