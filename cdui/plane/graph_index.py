"""The index of saved graphs: what ``GET /api/graphs`` lists, without parsing a graph on the event loop.

A saved graph ``data/graphs/<name>.json`` has an index entry
``data/graphs/.index/<name>.json``: its size, mtime and inode when it was
described, its node count, title and API contract. The entry is written when
the graph is saved (``PUT``, from the graph the route already parsed), or, for
a graph saved before the index existed or changed by hand, by the helper
``python -m cdui.plane.graph_index`` in a process of its own.

Why a process and not a thread: ``json.loads`` holds the GIL for its whole
call, so a thread parsing a graph of a few megabytes stalls the event loop as
long as parsing on it would (seen: 20 graphs of 7.6 MB held ``/api/health``
for 20 s; workers' heartbeats wait the same).

Invariants:

- An entry is believed only while the graph file's (size, mtime_ns, inode) are
  the ones it records; anything else (a hand edit, a copy from elsewhere, a
  half-finished save) makes the graph "to be indexed" again. So an entry never
  describes other bytes than the file's, and a lost or wrong entry costs one
  re-index, nothing more.
- One helper at a time, one graph at a time in it, each at most
  ``CODEFYUI_MAX_GRAPH_BYTES``: memory is bounded by one graph.
- A listing waits for the helper at most ``budget_s``; graphs it has not
  reached by then are listed with ``"indexing": true`` (size and time only),
  and the helper goes on, owned by the index, so the next listing has them.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from cdui.core.atomic import atomic_write
from cdui.core.errors import CduiError
from cdui.graph.contract import contract_of

log = logging.getLogger(__name__)

# A saved graph's name (its file is <name>.json); never starts with '.', so the index folder is no graph.
GRAPH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
INDEX_DIR = ".index"
# Saved graphs listed at most.
MAX_LISTED = 1000
# How long one listing waits for graphs to be indexed before it answers without them.
LIST_BUDGET_S = 5.0
# A helper that has not finished its batch by then is killed (and its graphs tried again next time).
HELPER_TIMEOUT_S = 600.0
# The helper's working folder, from which `python -m cdui.plane.graph_index` imports this package
# (found once at import, not on the event loop).
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
# The index entry's version: an entry of another version is written again.
ENTRY_VERSION = 1


def entry_path(folder: Path, name: str) -> Path:
    return folder / INDEX_DIR / f"{name}.json"


def _key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def describe(graph: Any) -> dict[str, Any]:
    """What the listing shows of a parsed graph (pure)."""
    if not isinstance(graph, dict):
        return {"valid": False, "nodes": None, "title": None, "callable": False, "contract": None,
                "not_callable_because": "the saved graph is not a JSON object"}
    nodes = graph.get("nodes")
    title = graph.get("name")
    out: dict[str, Any] = {"valid": True, "nodes": len(nodes) if isinstance(nodes, list) else None,
                           "title": title if isinstance(title, str) else None}
    try:
        out["contract"], out["callable"] = contract_of(graph).to_json(), True
    except CduiError as exc:
        out["contract"], out["callable"], out["not_callable_because"] = None, False, exc.message
    return out


def write_entry(folder: Path, name: str, st: os.stat_result, meta: dict[str, Any]) -> None:
    """Record ``meta`` as the description of the graph file whose stat is ``st``."""
    index = folder / INDEX_DIR
    if not index.is_dir():
        index.mkdir(exist_ok=True)
        # The graphs folder may be a git repository (a project's graphs/): the index is a cache of it,
        # never part of it, and says so to git itself.
        (index / ".gitignore").write_text("*\n")
    atomic_write(entry_path(folder, name), json.dumps({"version": ENTRY_VERSION, "key": _key(st), **meta}))


def read_entry(folder: Path, name: str, st: os.stat_result) -> dict[str, Any] | None:
    """The entry of graph ``name`` if it describes the file whose stat is ``st``; else None."""
    try:
        d = json.loads(entry_path(folder, name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("version") != ENTRY_VERSION or d.get("key") != _key(st):
        return None
    return d


def remove_entry(folder: Path, name: str) -> None:
    entry_path(folder, name).unlink(missing_ok=True)


def index_file(path: Path, max_bytes: int, suffix: str = ".json") -> None:
    """Describe one saved graph and record it (the helper's work for each file).

    The file is opened without blocking or following a link to a non-file, and
    described by the stat of the very file read; if it changed while read, no
    entry is written (the next listing tries again)."""
    name = path.name[:-len(suffix)]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            meta: dict[str, Any] = {"valid": False, "callable": False, "contract": None, "nodes": None,
                                    "title": None, "not_callable_because": "it is not a regular file"}
        elif st.st_size > max_bytes:
            meta = {"valid": False, "callable": False, "contract": None, "nodes": None, "title": None,
                    "not_callable_because": f"saved graph {name!r} is larger than CODEFYUI_MAX_GRAPH_BYTES"}
        else:
            raw = fh.read(max_bytes + 1)
            try:
                meta = describe(json.loads(raw))
            except ValueError as exc:
                meta = {"valid": False, "callable": False, "contract": None, "nodes": None, "title": None,
                        "not_callable_because": f"saved graph {name!r} is not valid JSON ({exc})"}
    try:
        if _key(os.stat(path)) != _key(st):
            return
    except OSError:
        return
    write_entry(path.parent, name, st, meta)


def _helper_main(argv: list[str]) -> int:
    """``python -m cdui.plane.graph_index MAX_BYTES SUFFIX FILE...``: index each file; one line per file done."""
    max_bytes = int(argv[0])
    suffix = argv[1]
    for arg in argv[2:]:
        try:
            index_file(Path(arg), max_bytes, suffix)
        except Exception as exc:  # one odd file must not keep the others from being indexed
            print(f"cdui.plane.graph_index: {arg}: {exc}", file=sys.stderr)
        sys.stdout.write(arg + "\n")
        sys.stdout.flush()
    return 0


class GraphIndex:
    """The saved-graph listing of one control plane; its helper process is owned and stopped here."""

    def __init__(self, folder: Path, max_bytes: int, budget_s: float = LIST_BUDGET_S, suffix: str = ".json") -> None:
        self.folder = folder
        # A graph's file is <name><suffix>: ``.json`` in the data folder, ``.graph.json`` in a project.
        self.suffix = suffix
        self.max_bytes = max_bytes
        self.budget_s = budget_s
        self._task: asyncio.Task[None] | None = None
        self._batch: set[str] = set()
        # Every helper task not yet done (a new batch waits for the one before it): close() ends them all.
        self._tasks: set[asyncio.Task[None]] = set()

    # -- scanning (in a thread: stats and small entry files only) --
    def _scan(self, names: list[str] | None = None) -> tuple[list[dict[str, Any]], list[str]]:
        """(listing entries, names to index) for every saved graph, or for ``names``."""
        if names is None:
            paths = sorted(self.folder.glob(f"*{self.suffix}"))[:MAX_LISTED] if self.folder.is_dir() else []
            names = [n for n in (p.name[:-len(self.suffix)] for p in paths) if GRAPH_NAME.match(n)]
        out: list[dict[str, Any]] = []
        stale: list[str] = []
        for name in names:
            try:
                st = os.stat(self.folder / f"{name}{self.suffix}")
            except OSError:
                continue
            entry = read_entry(self.folder, name, st)
            row: dict[str, Any] = {"name": name, "size": st.st_size, "modified_at": st.st_mtime}
            if entry is None:
                stale.append(name)
                row.update(callable=None, contract=None, nodes=None, title=None, indexing=True)
            else:
                row.update(callable=entry.get("callable"), contract=entry.get("contract"), nodes=entry.get("nodes"),
                           title=entry.get("title"))
                if entry.get("not_callable_because"):
                    row["not_callable_because"] = entry["not_callable_because"]
            out.append(row)
        return out, stale

    async def listing(self) -> list[dict[str, Any]]:
        """Every saved graph (at most MAX_LISTED), waiting at most ``budget_s`` for unindexed ones."""
        rows, stale = await asyncio.to_thread(self._scan)
        if stale:
            await asyncio.wait({self._start(stale)}, timeout=self.budget_s)
            fresh, _ = await asyncio.to_thread(self._scan, stale)
            by_name = {r["name"]: r for r in fresh}
            rows = [by_name.get(r["name"], r) for r in rows]
        return rows

    async def read(self, name: str) -> tuple[dict[str, Any], bytes] | None:
        """(index entry, bytes) of one saved graph, the bytes being the ones the entry describes; None if
        there is no such graph. Indexes it first if needed, however long that takes (one graph)."""
        for _ in range(3):
            rows, stale = await asyncio.to_thread(self._scan, [name])
            if not rows:
                return None
            if stale:
                await asyncio.wait({self._start(stale)})
            got = await asyncio.to_thread(self._read_now, name)
            if got is not None:
                return got
        raise CduiError("graph_changing", f"saved graph {name!r} changed while it was read", status=409,
                        hint="try again once it is no longer being written")

    def _read_now(self, name: str) -> tuple[dict[str, Any], bytes] | None:
        path = self.folder / f"{name}{self.suffix}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            entry = read_entry(self.folder, name, st)
            if entry is None:
                return None
            if not entry.get("valid"):
                return entry, b""
            data = fh.read(self.max_bytes + 1)
        return entry, data

    def _start(self, names: list[str]) -> asyncio.Task[None]:
        """The helper task that indexes ``names``: the running one if it has them all, else a new one after it."""
        if self._task is not None and not self._task.done():
            if set(names) <= self._batch:
                return self._task
            previous: asyncio.Task[None] | None = self._task
        else:
            previous = None
        self._batch = set(names)
        self._task = asyncio.create_task(self._run_helper(list(names), previous))
        self._tasks.add(self._task)
        self._task.add_done_callback(self._tasks.discard)
        return self._task

    async def _run_helper(self, names: list[str], after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.wait({after})
        try:
            await self._helper(names)
        except Exception as exc:  # logged here: nobody may be waiting for this task any more
            log.warning("indexing saved graphs failed: %s", exc)

    async def _helper(self, names: list[str]) -> None:
        paths = [str(self.folder / f"{n}{self.suffix}") for n in names]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cdui.plane.graph_index", str(self.max_bytes), self.suffix, *paths,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            cwd=PACKAGE_PARENT)
        try:
            _, err = await asyncio.wait_for(proc.communicate(), HELPER_TIMEOUT_S)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0 or err:
            log.warning("indexing saved graphs: the helper exited %s: %s", proc.returncode,
                        err.decode(errors="replace").strip()[-500:])

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


if __name__ == "__main__":
    raise SystemExit(_helper_main(sys.argv[1:]))
