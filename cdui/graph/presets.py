"""The installed preset library: CodefyUI's three built-in presets (LSTM
Sequence, Simple CNN Classifier, Training Pipeline), shipped as package data in
``cdui/graph/builtin_presets/``, the presets of the installed plugin packs (their
``presets/*.json``, named ``<pack>:<name>``), plus the presets a user saves in the data
folder's ``presets/`` (a file there replaces a built-in of the same name).

A graph's own embedded presets are used only for names the library lacks
(CodefyUI's order: the registry first); see cdui.graph.model.parse.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from cdui.core.layout import package_dir
from cdui.nodes import packs

log = logging.getLogger(__name__)
BUILTIN_DIR = package_dir("graph/builtin_presets")
# A preset file larger than this is not read (the built-in ones are a few KiB).
MAX_PRESET_FILE_BYTES = 1 << 20


def _read_folder(folder: Path, into: dict[str, dict[str, Any]]) -> None:
    if not folder.is_dir():
        return
    for p in sorted(folder.glob("*.json")):
        try:
            if p.stat().st_size > MAX_PRESET_FILE_BYTES:
                log.warning("preset file %s is larger than %d bytes; skipped", p, MAX_PRESET_FILE_BYTES)
                continue
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("preset file %s could not be read (%s); skipped", p, exc)
            continue
        if isinstance(d, dict):
            into[str(d.get("preset_name") or d.get("name") or p.stem)] = d


def preset_library(user_folder: Path | None = None, plugin_store: Path | None = None) -> dict[str, dict[str, Any]]:
    lib: dict[str, dict[str, Any]] = {}
    _read_folder(BUILTIN_DIR, lib)
    if plugin_store is not None:
        for _entry, folder in packs.installed(plugin_store):
            m = packs.read_manifest(folder)
            if not m.problems:
                lib.update(packs.pack_presets(m))
    if user_folder is not None:
        _read_folder(user_folder, lib)
    return lib
