"""The canvas process: one per editor tab, kept alive between the tab's Runs (docs/canvas.md).

It is a run process (:mod:`cdui.run.runproc`, forked by the zygote or started fresh) whose first
stdin line is ``canvas {"tab": ..., "cache_max_bytes": N}`` instead of a job. From then on it runs
one job after another, each exactly as a run process runs its one job (the same events on fd 1,
ending with that run's ``result`` line; its secrets only on this pipe), and keeps between them:

- the **execution cache**: a node whose key is unchanged answers with the outputs it gave before
  (``node_status`` ``cached``, ``seconds: 0``) instead of running. The key covers the node's type,
  its params, its inputs' keys, the version of its code (its module file, and the files beside it)
  and what it reads outside the graph (each file param's size, mtime and, up to 8 MB, content; a
  folder's listing). A node declared not cacheable (:meth:`cdui.nodes.base.Node.cacheable`), and
  every node downstream of one, always runs. Outputs are bounded by their tensor bytes
  (least recently used dropped first); an output a later node changed in place (a tensor's
  version counter moved) is never handed out again.
- **kept weights**: with ``persist_weights`` on, the weights of each model a node built (an
  ``nn.Module`` with parameters among its outputs that was not among its inputs) are kept when the
  run succeeds and loaded into the model the same node builds in the next such run, as long as the
  node's key is the same (a change of its params or inputs means a new model: the kept weights are
  dropped). With it off nothing is loaded or kept. ``reset`` drops them all.

Later stdin lines: ``job <job json>`` (run it), ``stop`` (stop the running job), ``reset`` (drop the
kept weights; answered by a ``canvas_reset`` line). After each job's ``result`` a ``canvas_stats``
line says what the cache and the weights hold. A published app's serving process is sent its version
once (``version``) and then each invoke's inputs (``invoke``), see :mod:`cdui.run.served`.
The end of stdin ends the process (a running job is
asked to stop first and the process group is killed after the orphan grace, as for a run process).
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import random
import signal
import stat
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from cdui.core.layout import Layout
from cdui.graph.secrets import environment_secrets, project_secrets
from cdui.graph.validate import PlanNode
from cdui.nodes.base import MODEL, UPLOAD_FOLDERS, Node
from cdui.run import served
from cdui.wire.job import Job, JobError

HELLO = "canvas "
JOB = "job "
# A job option: the job is an invoke of a published app (cdui/plane/apps.py), whose process serves one
# version of one graph: what each run would look up again (the node registry, each node's code version)
# is kept from its first job on.
SERVING = "serving"
STOP = "stop"
RESET = "reset"
ORPHAN_GRACE_S = 10.0
HASH_CONTENT_MAX = 8 * 1024 * 1024  # files up to this size have their content in a key, not only size and mtime
HASHED_KEPT = 256    # content hashes remembered per process, by the file's identity, size and times
RACY_NS = 2_000_000_000  # ... only for a file last changed this long before it was hashed (see _content_hash)
FOLDER_ENTRIES_MAX = 10000  # a folder param with more entries than this makes its node uncacheable
WALK_DEPTH = 4

Emit = Callable[[str, dict[str, Any]], None]
MakeCache = Callable[[Job, Layout, str, Emit], "RunCache"]
RunJob = Callable[[Job, Emit, threading.Event, "MakeCache | None"], dict[str, Any]]


def _torch() -> Any:
    return sys.modules.get("torch")


def _tensors(value: Any, depth: int = 0, modules: bool = False) -> Iterator[Any]:
    """The tensors ``value`` holds: itself, in lists, tuples and dicts, a dataset's ``tensors``, a
    data loader's dataset; with ``modules``, a module's parameters and buffers too."""
    torch = _torch()
    if torch is None or depth > WALK_DEPTH:
        return
    if isinstance(value, torch.Tensor):
        yield value
    elif modules and isinstance(value, torch.nn.Module):
        yield from value.parameters()
        yield from value.buffers()
    elif isinstance(value, (list, tuple)):
        if value and not isinstance(value[0], (str, int, float, bool)):
            for v in value:
                yield from _tensors(v, depth + 1, modules)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, depth + 1, modules)
    else:
        for attr in ("tensors", "dataset"):
            inner = getattr(value, attr, None)
            if inner is not None and inner is not value:
                yield from _tensors(inner, depth + 1, modules)


def _module_tensors(value: Any) -> list[tuple[Any, tuple[int, ...]]]:
    """Each module among ``value``'s outputs with the identities of its parameters and buffers, as they are."""
    torch = _torch()
    if torch is None:
        return []
    return [(m, tuple(id(t) for t in (*m.parameters(), *m.buffers()))) for m in value.values()
            if isinstance(m, torch.nn.Module)]


def _has_weights(value: Any) -> bool:
    torch = _torch()
    if torch is None:
        return False
    if isinstance(value, torch.nn.Module):
        return any(True for _ in value.parameters())
    if isinstance(value, (list, tuple)):
        return any(_has_weights(v) for v in value[:64])
    if isinstance(value, dict):
        return any(_has_weights(v) for v in list(value.values())[:64])
    return False


def _serving_cacheable(cls: type[Node]) -> bool:
    """Whether an app's serving process may answer the node from its cache: as a canvas Run may, and also a node
    whose only outputs are models (SequentialModel, ModelLoader, ...: not cacheable in a Run, whose point is to
    train them), built or loaded from the version's own weights file the same at every invoke. The cache
    watches such a module's parameters and buffers, and never hands it out again once a later node changed
    them. Not a node that writes files, nor one with other outputs too (a training step's, an optimizer)."""
    if cls.cacheable():
        return True
    if cls.ALWAYS_WRITES or cls.WRITES_TO:
        return False
    if any(p.param_type == "output_path" or p.writes for p in cls.define_params()):
        return False
    outputs = [p.data_type for p in cls.define_outputs()]
    return bool(outputs) and all(t == MODEL for t in outputs)


class _Entry:
    __slots__ = ("outputs", "versions", "nbytes", "modules")

    def __init__(self, outputs: dict[str, Any], versions: list[tuple[Any, int]], nbytes: int,
                 modules: list[tuple[Any, tuple[int, ...]]]) -> None:
        self.outputs = outputs
        self.versions = versions
        self.nbytes = nbytes
        self.modules = modules  # each module output and the identities of its tensors when it was kept


class ExecutionCache:
    """Node outputs by key, least recently used dropped first once they hold more than ``max_bytes``
    of tensors."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[str, _Entry] = OrderedDict()
        self.nbytes = 0

    def get(self, key: str) -> dict[str, Any] | None:
        e = self.entries.get(key)
        if e is None:
            return None
        # A node downstream changed one of these tensors in place (or gave a kept module other tensors): they are
        # no longer what the node gave.
        if any(t._version != v for t, v in e.versions) or any(
                tuple(id(t) for t in (*m.parameters(), *m.buffers())) != ids for m, ids in e.modules):
            self.drop(key)
            return None
        self.entries.move_to_end(key)
        return dict(e.outputs)

    def put(self, key: str, outputs: dict[str, Any], modules: bool = False) -> None:
        """Keep ``outputs`` under ``key``. A module with weights is a live object training changes: it is kept
        only with ``modules`` (an app's serving process, whose frozen version builds and loads the same model at
        every invoke), its parameters and buffers watched as tensors are, so that one a later node trained or
        changed in place is never handed out again."""
        if self.max_bytes <= 0 or (not modules and _has_weights(outputs)):
            return
        seen: dict[int, Any] = {}
        for v in outputs.values():
            for t in _tensors(v, modules=modules):
                seen.setdefault(id(t), t)
        nbytes = sum(t.element_size() * t.nelement() for t in seen.values())
        if nbytes > self.max_bytes:
            return
        self.drop(key)
        while self.entries and self.nbytes + nbytes > self.max_bytes:
            self.drop(next(iter(self.entries)))
        self.entries[key] = _Entry(dict(outputs), [(t, t._version) for t in seen.values()], nbytes,
                                   _module_tensors(outputs) if modules else [])
        self.nbytes += nbytes

    def drop(self, key: str) -> None:
        e = self.entries.pop(key, None)
        if e is not None:
            self.nbytes -= e.nbytes


class KeptWeights:
    """The weights a tab's models were trained to, by (building node, output port)."""

    def __init__(self) -> None:
        self.kept: dict[tuple[str, str], tuple[str, str, dict[str, Any]]] = {}  # -> (key, class, state)

    def clear(self) -> int:
        n = len(self.kept)
        self.kept.clear()
        return n

    @property
    def nbytes(self) -> int:
        return sum(t.element_size() * t.nelement() for _k, _c, state in self.kept.values()
                   for t in state.values() if hasattr(t, "element_size"))


def _file_facts(path: Path) -> Any:
    try:
        st = path.stat()
    except OSError:
        return ["missing", str(path)]
    if stat.S_ISDIR(st.st_mode):
        listing: list[Any] = []
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                p = Path(root, name)
                try:
                    s = p.stat()
                except OSError:
                    continue
                listing.append([str(p.relative_to(path)), s.st_size, s.st_mtime_ns])
                if len(listing) > FOLDER_ENTRIES_MAX:
                    return None
        return ["folder", str(path), listing]
    facts: list[Any] = ["file", str(path), st.st_size, st.st_mtime_ns]
    if st.st_size <= HASH_CONTENT_MAX:
        try:
            facts.append(_content_hash(path, st))
        except OSError:
            return ["unreadable", str(path)]
    return facts


_hashed: OrderedDict[tuple[Any, ...], str] = OrderedDict()


def _content_hash(path: Path, st: os.stat_result) -> str:
    """The sha256 of a file's content, read again only when the file may have changed since it was last hashed
    here (an app's serving process reads its weights' facts at every invoke; a canvas Run at every Run).

    A file is known by its device, inode, size, modification and change times. Those alone could miss a rewrite
    of the same size within one tick of the file system's clock, so a hash is remembered only for a file whose
    times were already RACY_NS old when it was read (git's "racily clean" rule): any later write gives it newer
    times."""
    ident = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    got = _hashed.get(ident)
    if got is not None:
        return got
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
        _hashed[ident] = digest
        while len(_hashed) > HASHED_KEPT:
            _hashed.popitem(last=False)
    return digest


class RunCache:
    """One canvas run's view of its process's cache and kept weights (:class:`cdui.graph.executor.NodeCache`)."""

    def __init__(self, cache: ExecutionCache, weights: KeptWeights, persist: bool, layout: Layout,
                 device: str, emit: Emit, code: dict[str, str] | None = None, serving: bool = False,
                 resolved: dict[tuple[str, str], Path] | None = None) -> None:
        self.cache = cache
        self.weights = weights
        self.persist = persist
        self.layout = layout
        self.device = device
        self.emit = emit
        self._code: dict[str, str] = {} if code is None else code
        # An app's serving process keeps no weights, so a key serves only to look up and store outputs: a node
        # the cache may not answer for (itself or an input not cacheable) needs none, and no file of its is read.
        self.serving = serving and not persist
        # A serving process's version is frozen, and so are its path params and the folders they resolve in: each
        # is resolved (symlinks followed, private folders refused) at its first invoke, and its file's facts read
        # at every one. A canvas Run resolves them each time.
        self._resolved = resolved if self.serving else None
        self._seen: set[int] = set()  # modules some node of this run has output
        self.built: list[tuple[str, str, str, Any]] = []  # (node, port, key, module) this run built

    # -- the key ------------------------------------------------------------
    def code_version(self, cls: type) -> str:
        """The node's module file and every .py beside it (its helpers), by content for the module itself."""
        module = sys.modules.get(cls.__module__)
        file = getattr(module, "__file__", None)
        if not file:  # no file to read: the class object itself (a class made again is another version)
            return f"{cls.__module__}.{cls.__qualname__}@{id(cls):x}"
        if file not in self._code:
            h = hashlib.sha256()
            path = Path(file)
            try:
                h.update(path.read_bytes())
                for p in sorted(path.parent.glob("*.py")):
                    st = p.stat()
                    h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
            except OSError:
                h.update(str(time.time()).encode())  # unreadable: never the same key twice
            self._code[file] = h.hexdigest()
        return self._code[file]

    def outside(self, pn: PlanNode) -> tuple[Any, bool]:
        """What the node reads outside the graph, and whether it can be described."""
        facts: list[Any] = []
        for p in pn.cls.define_params():
            if p.param_type not in (*UPLOAD_FOLDERS, "path", "folder"):
                continue
            value = pn.params.get(p.name, p.when_absent())
            if not isinstance(value, str) or not value.strip():
                continue
            memo = (p.param_type, value)
            path = self._resolved.get(memo) if self._resolved is not None else None
            if path is None:
                try:
                    if p.param_type in UPLOAD_FOLDERS:
                        path = self.layout.resolve_upload(UPLOAD_FOLDERS[p.param_type], value)
                    else:
                        path = self.layout.resolve(value)
                except Exception as exc:  # noqa: BLE001 - the node will say why when it runs
                    facts.append([p.name, "unresolved", str(exc)])
                    continue
                if self._resolved is not None:
                    self._resolved[memo] = path
            f = _file_facts(path)
            if f is None:
                return None, False
            facts.append([p.name, f])
        try:
            extra = pn.cls.reads_outside(pn.params, self.layout)
        except Exception as exc:  # noqa: BLE001 - the node will say why when it runs
            extra, facts = [], [*facts, ["reads_outside", "unresolved", str(exc)]]
        for path in extra:
            f = _file_facts(Path(path))
            if f is None:
                return None, False
            facts.append(["reads_outside", f])
        return facts, True

    def key(self, pn: PlanNode, inputs: dict[str, tuple[str, bool, str]]) -> tuple[str, bool]:
        own = _serving_cacheable(pn.cls) if self.serving else pn.cls.cacheable()
        if self.serving and not (own and all(c for _k, c, _p in inputs.values())):
            return "", False
        outside, described = self.outside(pn)
        payload = {"type": pn.type, "params": pn.params, "code": self.code_version(pn.cls), "device": self.device,
                   "inputs": sorted([port, k, src_port] for port, (k, _c, src_port) in inputs.items()),
                   "outside": outside}
        text = json.dumps(payload, sort_keys=True, default=repr)
        key = hashlib.sha256(text.encode()).hexdigest()
        cacheable = described and own and all(c for _k, c, _p in inputs.values())
        return key, cacheable

    def lookup(self, key: str) -> dict[str, Any] | None:
        hit = self.cache.get(key)
        if hit is not None:
            self._note_modules(hit)
        return hit

    # -- after a node ran ---------------------------------------------------
    def _note_modules(self, result: dict[str, Any]) -> list[tuple[str, Any]]:
        torch = _torch()
        new: list[tuple[str, Any]] = []
        if torch is None:
            return new
        for port, value in result.items():
            if isinstance(value, torch.nn.Module) and id(value) not in self._seen:
                self._seen.add(id(value))
                new.append((port, value))
        return new

    def ran(self, pn: PlanNode, key: str, cacheable: bool, result: dict[str, Any]) -> None:
        for port, module in self._note_modules(result):
            if not any(True for _ in module.parameters()):
                continue
            self.built.append((pn.id, port, key, module))
            if self.persist:
                self._restore(pn, port, key, module)
        if cacheable:
            self.cache.put(key, result, modules=self.serving)

    def _restore(self, pn: PlanNode, port: str, key: str, module: Any) -> None:
        kept = self.weights.kept.get((pn.id, port))
        if kept is None:
            return
        kept_key, cls_name, state = kept
        if kept_key != key or cls_name != type(module).__name__:
            del self.weights.kept[(pn.id, port)]
            self.emit("log", {"message": f"{pn.id}: its params or inputs changed since the weights were kept; "
                                         "it starts from new weights", "level": "info", "node_id": pn.id})
            return
        own = module.state_dict()
        if set(own) != set(state) or any(getattr(own[k], "shape", None) != getattr(state[k], "shape", None)
                                         for k in own):
            del self.weights.kept[(pn.id, port)]
            self.emit("log", {"message": f"{pn.id}: the kept weights no longer fit its model; it starts from "
                                         "new weights", "level": "warning", "node_id": pn.id})
            return
        module.load_state_dict(state)
        self.emit("log", {"message": f"{pn.id}: continuing from the weights the tab's previous run trained "
                                     "(persist weights is on; Reset weights starts afresh)",
                          "level": "info", "node_id": pn.id})

    def keep_weights(self) -> None:
        """The run succeeded with persist weights on: keep what its models were trained to."""
        if not self.persist:
            return
        kept = 0
        for node, port, key, module in self.built:
            state = {k: v.detach().clone() for k, v in module.state_dict().items()}
            self.weights.kept[(node, port)] = (key, type(module).__name__, state)
            kept += 1
        if kept:
            self.emit("log", {"message": f"kept the trained weights of {kept} model(s) for the tab's next run "
                                         "(persist weights is on)", "level": "info"})


class _Maker:
    """Makes one run's :class:`RunCache` and remembers it (its weights are kept if the run succeeds)."""

    def __init__(self, cache: ExecutionCache, weights: KeptWeights, code: dict[str, str],
                 resolved: dict[tuple[str, str], Path] | None = None) -> None:
        self.cache, self.weights, self.code, self.resolved = cache, weights, code, resolved
        self.made: RunCache | None = None

    def __call__(self, job: Job, layout: Layout, device: str, emit: Emit) -> RunCache:
        # A serving process keeps each node's code version from its first job (its registry is kept too);
        # a canvas Run reads them again, so that an edited custom node runs as edited.
        serving = bool(job.options.get(SERVING))
        self.made = RunCache(self.cache, self.weights, bool(job.options.get("persist_weights")), layout, device, emit,
                             self.code if serving else None, serving, self.resolved)
        return self.made


def _cards_started(torch: Any) -> bool:
    """Whether torch.manual_seed would seed a card's generator now rather than queue it for the card's start:
    CUDA, XPU or MTIA initialised (or a torch without the check), MPS present, or a custom device."""
    for name in ("cuda", "xpu", "mtia"):
        started = getattr(getattr(torch, name, None), "is_initialized", None)
        if started is None or started():
            return True
    mps = getattr(getattr(torch, "backends", None), "mps", None)
    if mps is None or mps.is_available():
        return True
    return bool(torch._C._get_privateuse1_backend_name() != "privateuseone")


def stats(cache: ExecutionCache, weights: KeptWeights) -> dict[str, Any]:
    return {"cache_entries": len(cache.entries), "cache_bytes": cache.nbytes,
            "weights": len(weights.kept), "weights_bytes": weights.nbytes}


class ServedVersion(Protocol):
    """The version a serving process serves (cdui/run/served.py), planned once."""

    def run(self, invoke: served.Invoke, stop: threading.Event, make_cache: MakeCache | None) -> dict[str, Any]:
        """Run one invoke with its inputs; its result."""


ServeVersion = Callable[[str, Job], ServedVersion]


def serve(first: str, emit: Emit, secrets: list[Any], run_job: RunJob, kill_own_group: Callable[[], None],
          serve_version: ServeVersion | None = None) -> int:
    """The canvas process's loop, after its first line (``first``); ``run_job`` runs one job as a run
    process does and returns its result; ``serve_version`` plans an app version's job for its invokes
    (cdui/run/served.py)."""
    try:
        hello = json.loads(first[len(HELLO):])
        max_bytes = int(hello.get("cache_max_bytes", 0))
    except (ValueError, TypeError, AttributeError):
        print(f"cdui: a canvas process got {first[:200]!r} as its first line", file=sys.stderr, flush=True)
        return 2
    cache = ExecutionCache(max_bytes)
    weights = KeptWeights()
    code: dict[str, str] = {}
    resolved: dict[tuple[str, str], Path] = {}  # the served version's path params, resolved (RunCache.outside)
    torch = _torch()
    seed = torch.initial_seed() if torch is not None else None
    inbox: queue.Queue[str | None] = queue.Queue()
    running = [threading.Event()]  # the stop event of the job running now
    # The app version this process serves, or why it has none (a version line it could not read).
    version: tuple[str, Job, ServedVersion] | str = "it was given no version"

    def read_stdin() -> None:
        for line in sys.stdin:
            text = line.strip()
            if text == STOP:
                running[0].set()
            elif text:
                inbox.put(text)
        # The launcher is gone: stop what runs; nobody else is left to end a node that ignores it.
        running[0].set()
        inbox.put(None)
        time.sleep(ORPHAN_GRACE_S)
        kill_own_group()

    seeded = [False]  # torch.manual_seed(seed) was called once in this process

    def fresh(job: Job, invoke: bool = False) -> threading.Event:
        """A job's (or an app invoke's) start: its stop event, the random state and the secrets a fresh run
        process has."""
        stop = threading.Event()
        running[0] = stop
        # Each run starts from the random state a fresh run process has (torch's fixed default seed; python's
        # and numpy's from the OS), whatever earlier runs of this process drew.
        if torch is not None and seed is not None:
            if invoke and seeded[0] and not _cards_started(torch):
                # What torch.manual_seed does beyond this is queue the same seed for each card's generator until
                # the card starts, which the first call did; it formats a stack trace per card to do so, a
                # twentieth of a small model's invoke.
                torch.default_generator.manual_seed(seed)
            else:
                torch.manual_seed(seed)
                seeded[0] = True
        random.seed()
        np = sys.modules.get("numpy")
        if np is not None:
            try:
                np.random.seed()
            except Exception:  # noqa: BLE001 - a numpy without the legacy generator has no global state
                pass
        secrets[:] = [*job.secret_pairs(), *environment_secrets(os.environ), *project_secrets(job.env_secrets)]
        for key, value in job.env_secrets.items():  # the project's .env, as a run process sets it (runproc)
            os.environ.setdefault(key, value)
        return stop

    threading.Thread(target=read_stdin, daemon=True, name="canvas-stdin").start()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: running[0].set())
    emit("canvas_stats", stats(cache, weights))
    while True:
        msg = inbox.get()
        if msg is None:
            return 0
        if msg == RESET:
            emit("canvas_reset", {"reset": weights.clear(), **stats(cache, weights)})
            continue
        if msg.startswith(served.VERSION) and serve_version is not None:
            try:
                version_id, version_job = served.parse_version(msg)
                version = (version_id, version_job, serve_version(version_id, version_job))
                resolved.clear()
            except served.ServedError as exc:
                version = f"it could not read its version: {exc}"
            continue
        if msg.startswith(served.INVOKE) and serve_version is not None:
            try:
                invoke = served.parse_invoke(msg)
            except served.ServedError as exc:
                emit("result", {"status": "failed", "error": f"the serving process could not read its invoke: {exc}"})
                continue
            if isinstance(version, str):
                emit("result", {"status": "failed", "error": f"the serving process cannot run an invoke of "
                                f"{invoke.version_id!r}: {version}"})
                continue
            stop = fresh(version[1], invoke=True)
            result = version[2].run(invoke, stop, _Maker(cache, weights, code, resolved))
            emit("result", result)
            secrets[:] = []
            continue
        if not msg.startswith(JOB):
            emit("log", {"message": f"canvas process: unknown request {msg[:100]!r} ignored", "level": "warning"})
            continue
        try:
            job = Job.from_json(msg[len(JOB):])
        except JobError as exc:
            emit("result", {"status": "failed", "error": f"the canvas process could not read its job: {exc}"})
            continue
        stop = fresh(job)
        maker = _Maker(cache, weights, code)
        result = run_job(job, emit, stop, maker)
        if result.get("status") == "succeeded" and maker.made is not None:
            maker.made.keep_weights()
        emit("result", result)
        secrets[:] = []
        emit("canvas_stats", stats(cache, weights))
