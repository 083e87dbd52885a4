"""What a canvas Run's cache and an app's serving process know of a file a node reads (cdui/run/canvas_proc.py
``_file_facts``): its size, times and, up to a size, its content. A content hash is remembered only for a file
that had not changed for a while when it was read, so that no rewrite is missed, even one of the same size
within one tick of the file system's clock."""
from __future__ import annotations

import os
import time
from pathlib import Path

from cdui.run import canvas_proc
from cdui.run.canvas_proc import _file_facts

HOUR_NS = 3600 * 10**9


def test_a_file_rewritten_at_once_with_the_same_size_and_time_gives_other_facts(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"aaaa")
    first = _file_facts(f)
    st = f.stat()
    f.write_bytes(b"bbbb")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same size and modification time as before
    second = _file_facts(f)
    assert first[:4] == second[:4] == ["file", str(f), 4, st.st_mtime_ns]
    assert first[4] != second[4]
    assert not any(k[0] == str(f) for k in canvas_proc._hashed)  # changed just now: never remembered


def test_an_old_file_is_hashed_once_and_again_once_it_changes(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"aaaa")
    old = f.stat().st_mtime_ns - HOUR_NS
    os.utime(f, ns=(old, old))
    # Its change time (which no call can set back) must be old too: wait until it is.
    time.sleep(canvas_proc.RACY_NS / 1e9 + 0.2)
    first = _file_facts(f)
    remembered = [k for k in canvas_proc._hashed if k[0] == str(f)]
    assert len(remembered) == 1
    assert canvas_proc._hashed[remembered[0]] == first[4]
    assert _file_facts(f) == first
    f.write_bytes(b"bbbb")  # the same size, and set back to the same modification time: its change time moved
    os.utime(f, ns=(old, old))
    second = _file_facts(f)
    assert second[:4] == first[:4]
    assert second[4] != first[4]


def test_a_folder_lists_its_files(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.csv").write_text("1,2\n")
    facts = _file_facts(tmp_path / "d")
    assert facts[0] == "folder" and [e[:2] for e in facts[2]] == [["x.csv", 4]]
