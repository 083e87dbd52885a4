"""The one atomic-write helper: whole content or the old one, the mode asked for, no leftovers."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cdui.core.atomic import atomic_write, replacing, write_private


def test_atomic_write_replaces_and_sets_mode_despite_umask(tmp_path: Path) -> None:
    target = tmp_path / "token"
    target.write_text("old")
    old = os.umask(0o077)
    try:
        atomic_write(target, "new", mode=0o640)
    finally:
        os.umask(old)
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]


def test_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "model.pt"
    target.write_bytes(b"previous checkpoint")
    with pytest.raises(RuntimeError):
        with replacing(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("the save failed")
    assert target.read_bytes() == b"previous checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt"]


def test_write_private_makes_a_new_folder_private(tmp_path: Path) -> None:
    path = tmp_path / "ud" / "session-token"
    write_private(path, "secret")
    assert path.read_text() == "secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
