"""Queue and placement policy as tables: pure functions, no processes."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cdui.core.errors import CduiError
from cdui.nodes.registry import build_registry
from cdui.plane.sched.placement import GiB, analyze, no_mount_message, transfer_verdict
from cdui.plane.sched.queue import Caps, Placement, parse_caps, place
from cdui.wire.target import AnyWorker, Local, Pool, Worker


@dataclass
class Ex:
    name: str
    devs: list[str] = field(default_factory=lambda: ["cpu"])
    why: str | None = None
    has_mount: bool = False
    roots: list[str] = field(default_factory=list)

    def devices(self) -> list[str]:
        return self.devs

    def unavailable_reason(self) -> str | None:
        return self.why

    def mounted(self) -> bool:
        return self.has_mount

    def read_roots(self) -> list[str]:
        return self.roots


def execs(*xs: Ex) -> dict[str, Ex]:
    return {x.name: x for x in xs}


@pytest.mark.parametrize("spec,check", [
    ("", lambda c: c.total is None and c.slots("local", "cpu") == 1),
    ("2", lambda c: c.total == 2),
    ("cpu=3", lambda c: c.slots("w1", "cpu") == 3 and c.slots("local", "cpu") == 3),
    ("cuda=2", lambda c: c.slots("w1", "cuda:1") == 2),
    ("w1/cuda:0=4,cuda=2", lambda c: c.slots("w1", "cuda:0") == 4 and c.slots("w2", "cuda:0") == 2),
    ("local/cpu=2", lambda c: c.slots("local", "cpu") == 2 and c.slots("w1", "cpu") == 1),
])
def test_parse_caps(spec: str, check) -> None:
    """CODEFYUI_RUN_QUEUE_MAX_CONCURRENT: N, DEVICE=N and NAME/DEVICE=N."""
    assert check(parse_caps(spec))


@pytest.mark.parametrize("spec", ["x", "cpu=", "cpu=-1", "0", "w1/cpu=two"])
def test_parse_caps_refuses_bad_entries_by_name(spec: str) -> None:
    with pytest.raises(CduiError) as e:
        parse_caps(spec)
    assert "CODEFYUI_RUN_QUEUE_MAX_CONCURRENT" in e.value.message


def test_place_table() -> None:
    caps = Caps()
    local, w1 = Ex("local"), Ex("w1", ["cuda:0", "cuda:1", "cpu"])
    ex = execs(local, w1)
    assert place(Local(), "cpu", ex, {}, caps, 0, set()) == Placement("local", "cpu")
    assert place(Worker("w1"), "cuda", ex, {}, caps, 0, set()) == Placement("w1", "cuda:0")
    assert place(Worker("w1"), "cuda", ex, {("w1", "cuda:0"): 1}, caps, 1, set()) == Placement("w1", "cuda:1")
    busy = {("w1", "cuda:0"): 1, ("w1", "cuda:1"): 1}
    assert "all slots of w1 cuda:0/cuda:1 are in use" in place(Worker("w1"), "cuda", ex, busy, caps, 2, set())
    # auto prefers GPUs; `any` tries workers before this server.
    assert place(AnyWorker(), "auto", ex, {}, caps, 0, set()) == Placement("w1", "cuda:0")
    # An offline (not connected) named worker: the run waits, saying so.
    assert place(Worker("w9"), "cpu", ex, {}, caps, 0, set()) == \
        "waiting for worker w9 to connect (it is offline)"
    # A worker that offers no such device.
    assert "offers no cuda device" in place(Local(), "cuda", ex, {}, caps, 0, set())
    # Drained / disabled: the executor's reason.
    draining = execs(Ex("w1", why="worker w1 is draining"))
    assert "draining" in place(Worker("w1"), "cpu", draining, {}, caps, 0, set())
    # Pool runs wait for a one-shot worker offering the device.
    assert place(Pool(), "cuda", ex, {}, caps, 0, set()) == \
        "waiting for a one-shot worker that offers cuda"
    # The total cap.
    assert "the limit is 1" in place(Local(), "cpu", ex, {}, parse_caps("1"), 1, set())


def test_first_come_first_served_per_device_kind() -> None:
    """Once a run for a device kind waits on an executor, later ones of that kind do not overtake it."""
    ex = execs(Ex("local"))
    assert "an earlier run for cpu is waiting on local" in place(Local(), "cpu", ex, {}, Caps(), 0, {("local", "cpu")})
    assert place(Local(), "cpu", ex, {}, Caps(), 0, {("local", "cuda")}) == Placement("local", "cpu")


def test_file_runs_prefer_mounted_workers() -> None:
    """Uploads-only runs try mounted workers first, then transfer; mount-only runs skip unmounted."""
    ex = execs(Ex("a-plain"), Ex("b-mounted", has_mount=True))
    assert place(AnyWorker(), "cpu", ex, {}, Caps(), 0, set(), "transfer") == Placement("b-mounted", "cpu", "mount")
    assert place(AnyWorker(), "cpu", ex, {("b-mounted", "cpu"): 1}, Caps(), 1, set(), "transfer") == \
        Placement("a-plain", "cpu", "transfer")
    assert place(AnyWorker(), "cpu", ex, {}, Caps(), 0, set(), "none") == Placement("a-plain", "cpu", None)
    only_plain = execs(Ex("a-plain"))
    assert "a-plain has no `data` mount" in place(AnyWorker(), "cpu", only_plain, {}, Caps(), 0, set(), "mount")


@pytest.mark.parametrize("target, reads, expect", [
    # `any` goes only to a machine whose read roots cover the run's absolute paths, this server included
    (AnyWorker(), ["/datasets/a.csv"], Placement("b-datasets", "cpu")),
    (AnyWorker(), ["/scratch/x"], Placement("local", "cpu")),
    (AnyWorker(), ["/datasets/a.csv", "/scratch/x"], "waiting for a free cpu slot: not allowed to read /datasets/a.csv "
     "on 2 (a-none, local); not allowed to read /scratch/x on 1 (b-datasets)"),
    (AnyWorker(), [], Placement("a-none", "cpu")),
    (Worker("a-none"), ["/datasets/a.csv"],
     "waiting: a-none does not allow reading /datasets/a.csv (CODEFYUI_READ_ROOTS)"),
    (Worker("b-datasets"), ["/datasets/a.csv"], Placement("b-datasets", "cpu")),
    (Local(), ["/datasets/a.csv"], "waiting: local does not allow reading /datasets/a.csv (CODEFYUI_READ_ROOTS)"),
    (Pool(), ["/datasets/a.csv"],
     "waiting for a one-shot worker that offers cpu that may read /datasets/a.csv (CODEFYUI_READ_ROOTS)"),
])
def test_runs_reading_absolute_paths_go_where_they_may_be_read(target: object, reads: list[str],
                                                             expect: object) -> None:
    """A run reading /x/... is placed only on a machine whose CODEFYUI_READ_ROOTS allow /x."""
    ex = execs(Ex("a-none"), Ex("b-datasets", roots=["/datasets"]), Ex("local", roots=["/scratch"]))
    assert place(target, "cpu", ex, {}, Caps(), 0, set(), reads=reads) == expect


def g(*nodes: dict, edges: list | None = None, presets: list | None = None) -> dict:
    out = {"format_version": 1, "nodes": [{"id": "s", "type": "Start", "data": {"params": {}}}, *nodes],
           "edges": edges or [{"source": "s", "target": n["id"], "sourceHandle": "trigger", "type": "trigger"}
                              for n in nodes]}
    if presets:
        out["presets"] = presets
    return out


def n(nid: str, ntype: str, **params) -> dict:
    return {"id": nid, "type": ntype, "data": {"params": params}}


@pytest.fixture(scope="module")
def reg():
    return build_registry()


def verdict(reg, graph, have=None, enabled=True, limit=2 * GiB):
    have = have or {}
    return transfer_verdict(analyze(graph, reg), lambda f, nm: have.get(f"{f}/{nm}"), enabled, limit)


def test_which_runs_use_files(reg) -> None:
    """Whether a run uses files is derived from param declarations, after expanding presets and the
    presets a Map runs."""
    assert not verdict(reg, g(n("t", "TensorCreate"))).uses_files
    assert not verdict(reg, g(n("c", "CSVReader", path="data/samples/iris.csv"))).uses_files  # a plain path: no upload
    v = verdict(reg, g(n("c", "CSVReader", path="train.csv")), {"files/train.csv": ("ab" * 32, 10)})
    assert v.uses_files and v.transfer_ok and v.inputs == [{"folder": "files", "name": "train.csv",
                                                              "sha256": "ab" * 32, "size": 10}]
    v = verdict(reg, g(n("m", "ModelSaver", path="x.pt")))
    assert v.uses_files and v.transfer_ok and v.writes
    tl = verdict(reg, g(n("tl", "TrainingLoop", checkpoint_every=2)))
    assert tl.uses_files and tl.writes
    assert not verdict(reg, g(n("tl", "TrainingLoop"))).uses_files
    # A preset whose inner node reads an upload, run by Map.
    preset = {"preset_name": "P", "nodes": [{"id": "r", "type": "CSVReader", "params": {"path": "inner.csv"}}],
              "edges": [], "exposed_inputs": [], "exposed_outputs": [{"name": "t", "internal_node": "r",
                                                                      "internal_port": "tensor"}]}
    v = verdict(reg, g(n("map", "Map", subgraph="P"), presets=[preset]))
    assert v.uses_files and not v.transfer_ok and "upload files/inner.csv does not exist" in v.reason


def test_transfer_refusal_reasons(reg) -> None:
    """The transfer size limit, with its exact sentence."""
    plain = verdict(reg, g(n("f", "FileReader", path="examples/x.json")))
    assert not plain.transfer_ok and "plain path 'examples/x.json'" in plain.reason
    big = verdict(reg, g(n("c", "CSVReader", path="train.csv")), {"files/train.csv": ("0" * 64, int(3.1 * GiB))})
    assert big.reason == ("its inputs add up to 3.10 GiB, over the transfer limit of 2.00 GiB "
                          "(CODEFYUI_TRANSFER_MAX_INPUT_BYTES)")
    off = verdict(reg, g(n("m", "ModelSaver", path="x.pt")), enabled=False)
    assert off.reason == "the transfer backend is off (CODEFYUI_TRANSFER_ENABLED=0)"
    assert no_mount_message("gpu-box-1", big.reason) == (
        "worker gpu-box-1 has no `data` mount; add `--mount data=...` to its agent, or make the run fit the "
        "transfer backend: its inputs add up to 3.10 GiB, over the transfer limit of 2.00 GiB "
        "(CODEFYUI_TRANSFER_MAX_INPUT_BYTES)")


def test_plugin_pack_nodes_are_prefixed(tmp_path: Path) -> None:
    """Plugin packs: <install>/plugins/<id>/cdui.plugin.toml, node types named <id>:<NODE_NAME>;
    a broken file is reported, not fatal."""
    pack = tmp_path / "plugins" / "mypack"
    pack.mkdir(parents=True)
    (pack / "cdui.plugin.toml").write_text('[plugin]\nid = "mypack"\nmodules = ["nodes.py", "broken.py"]\n')
    (pack / "nodes.py").write_text(
        "from cdui.nodes.base import Node, Port\n"
        "class Shout(Node):\n    NODE_NAME = 'Shout'\n"
        "    @classmethod\n    def define_outputs(cls):\n        return [Port('value', 'STRING')]\n"
        "    def execute(self, inputs, params, ctx):\n        return {'value': 'HI'}\n")
    (pack / "broken.py").write_text("raise RuntimeError('boom')\n")
    reg = build_registry(None, tmp_path / "plugins")
    assert "mypack:Shout" in reg and "Shout" not in reg
    assert any("broken.py" in e["file"] and "boom" in e["error"] for e in reg.load_errors)


def test_any_tries_workers_in_the_given_order_and_this_server_last() -> None:
    """`any` follows the caller's least-recently-used order, so runs spread over free workers."""
    ex = execs(Ex("local"), Ex("a"), Ex("b"), Ex("c"))
    assert place(AnyWorker(), "cpu", ex, {}, Caps(), 0, set(), order=["c", "local", "a"]) == Placement("c", "cpu")
    assert place(AnyWorker(), "cpu", ex, {("c", "cpu"): 1}, Caps(), 1, set(), order=["c", "local", "a"]) == \
        Placement("a", "cpu")
    assert place(AnyWorker(), "cpu", ex, {("c", "cpu"): 1, ("a", "cpu"): 1}, Caps(), 2, set(),
                 order=["c", "local", "a"]) == Placement("local", "cpu")


def test_the_reason_over_many_workers_is_one_short_line() -> None:
    """500 busy workers make a reason of a few dozen characters, not one clause per worker."""
    ex = execs(*(Ex(f"w{i:03d}") for i in range(500)), Ex("x", why="worker x is draining (no new runs)"))
    busy = {(f"w{i:03d}", "cpu"): 1 for i in range(500)}
    why = place(AnyWorker(), "cpu", ex, busy, Caps(), 500, set())
    assert why == ("waiting for a free cpu slot: slots in use on 500 (w000, w001, w002, +497 more); "
                   "unavailable on 1 (x)")


def test_run_queue_lanes_keep_first_come_first_served() -> None:
    """A requeued run goes back to its old place; lanes group runs by target, device and file needs."""
    from cdui.plane.dispatch import RunQueue
    from cdui.plane.store import Run

    def run(rid: str, at: float, target: object = AnyWorker(), device: str = "cpu") -> Run:
        return Run(id=rid, status="queued", target=target, options={"device": device}, created_at=at)
    q = RunQueue()
    for r in (run("b", 2), run("c", 3), run("g", 1.5, device="cuda"), run("a", 1)):
        q.add(r)
    assert len(q) == 4 and len(q.lanes) == 2
    heads = sorted((lane.head_order()[0], lane.head().id) for lane in q.lanes.values())  # type: ignore[union-attr]
    assert heads == [(1, "a"), (1.5, "g")]
    q.remove("a")
    q.remove("g")
    assert [lane.head().id for lane in q.lanes.values()] == ["b"]  # type: ignore[union-attr]
    q.add(run("a", 1))  # requeued: it keeps its created_at, so it is first again
    assert [lane.head().id for lane in q.lanes.values()] == ["a"]  # type: ignore[union-attr]
    assert q.free_order(["y", "x", "z"]) == ["x", "y", "z"]
    q.used("x")
    assert q.free_order(["y", "x", "z"]) == ["y", "z", "x"]
    free = q.free_order(["y", "z"])
    q.insert_free(free, "x")  # a worker a run has just left joins the free list at its place in that order
    q.insert_free(free, "a")  # never given a run: first
    assert free == q.free_order(["x", "y", "z", "a"]) == ["a", "y", "z", "x"]


@dataclass
class OneShot(Ex):
    one_shot: bool = True


def test_held_slots_count_what_counting_every_run_would() -> None:
    """A dispatch pass copies HeldSlots.used instead of counting every running run: after every change
    (a new run, a run moved to another slot, a set of devices, an end by pop or del) it is exactly what
    slots_used counts from the entries, and a change that would bypass the counts is refused."""
    from cdui.plane.dispatch import HeldSlots
    from cdui.wire.devicesets import slots_used
    held = HeldSlots()
    steps: list[tuple[str, str, tuple[str, str] | None]] = [
        ("set", "r1", ("w1", "cpu")), ("set", "r2", ("w1", "cpu")), ("set", "r3", ("w2", "cuda:0,cuda:1")),
        ("set", "r1", ("w2", "cuda:1")),  # the same run again, elsewhere: its old slot is freed
        ("set", "r2", ("w1", "cpu")),  # the same run, the same slot (a claim confirms the pass's hold)
        ("pop", "r3", None), ("pop", "gone", None), ("del", "r2", None), ("set", "r4", ("local", "cpu")),
        ("pop", "r1", None), ("pop", "r4", None)]
    seen = []
    for op, rid, where in steps:
        if op == "set":
            assert where is not None
            held[rid] = where
        elif op == "pop":
            expected = dict(held).get(rid)
            assert held.pop(rid, None) == expected
        else:
            del held[rid]
        assert held.used == slots_used(held.values()), (op, rid)
        seen.append(dict(held.used))
    assert seen[3] == {("w1", "cpu"): 1, ("w2", "cuda:0"): 1, ("w2", "cuda:1"): 2}
    assert held.used == {} and len(held) == 0
    with pytest.raises(KeyError):
        held.pop("gone")
    for change in (lambda: held.update({"r": ("w1", "cpu")}), lambda: held.setdefault("r", ("w1", "cpu")),
                   held.clear, held.popitem):
        with pytest.raises(TypeError, match="only by item assignment"):
            change()


def test_one_mark_blocks_what_marking_every_executor_of_any_blocked() -> None:
    """A waiting `any` run blocks its device kind on every executor `any` may use with one mark: the
    same pairs as adding each of candidates() (this server, workers that are neither skipped for their
    catalog nor one-shot), and place() answers the same with either."""
    from cdui.plane.sched.queue import Blocked, block, candidates
    ex = execs(Ex("local"), Ex("a"), Ex("b", devs=["cpu", "cuda:0"]), Ex("skipped"), OneShot("once"))
    skips = {"skipped": "lacks node types"}
    compact = Blocked(executors=ex)
    block(compact, AnyWorker(), "cpu", ex, skips)
    block(compact, Worker("once"), "cuda", ex, skips)  # a named target still marks its one executor
    walked = {(n, "cpu") for n in candidates(AnyWorker(), ex, skips=skips)} | {("once", "cuda")}
    assert walked == {("a", "cpu"), ("b", "cpu"), ("local", "cpu"), ("once", "cuda")}
    pairs = [(n, k) for n in [*ex, "nobody"] for k in ("cpu", "cuda", "auto")]
    assert [p in compact for p in pairs] == [p in walked for p in pairs]
    copied = compact.copy()
    assert isinstance(copied, Blocked) and [p in copied for p in pairs] == [p in walked for p in pairs]
    for target in (Worker("a"), Worker("b"), Worker("once"), Local(), AnyWorker()):
        for device in ("cpu", "cuda"):
            assert place(target, device, ex, {}, Caps(), 0, compact, skips=skips) == \
                place(target, device, ex, {}, Caps(), 0, walked, skips=skips), (target, device)
    assert place(Worker("b"), "cpu", ex, {}, Caps(), 0, compact, skips=skips) == \
        "waiting: an earlier run for cpu is waiting on b"


def test_any_places_on_the_first_free_worker_in_order_however_many_there_are() -> None:
    """`any` tries workers in the given order and stops at the first that fits: skipped and one-shot
    workers are passed over, this server comes last, and with none free the reason names them all."""
    ex = execs(Ex("local"), *(Ex(f"w{i:03d}") for i in range(300)), OneShot("once"), Ex("skipped"))
    skips = {"skipped": "lacks node types"}
    order = ["once", "skipped", "local", "w299", *(f"w{i:03d}" for i in range(299))]
    assert place(AnyWorker(), "cpu", ex, {}, Caps(), 0, set(), order=order, skips=skips) == Placement("w299", "cpu")
    busy = {(f"w{i:03d}", "cpu"): 1 for i in range(300)}
    assert place(AnyWorker(), "cpu", ex, busy, Caps(), 300, set(), order=order, skips=skips) == \
        Placement("local", "cpu")
    busy[("local", "cpu")] = 1
    assert place(AnyWorker(), "cpu", ex, busy, Caps(), 301, set(), order=order, skips=skips) == (
        "waiting for a free cpu slot: no node catalog match on 1 (skipped); "
        "slots in use on 301 (w299, w000, w001, +298 more)")
    assert place(AnyWorker(), "cpu", ex, {}, Caps(), 0, set(), order=["once", "nobody"], skips=skips) == \
        "waiting for a worker to connect"
