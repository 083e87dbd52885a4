"""Queue policy: targets, device slots, concurrency caps, queue reasons.

Pure functions only; :mod:`cdui.plane.runs` calls them from its dispatch loop.

- A *target* is a :data:`cdui.wire.target.Target`: :class:`Local`, :class:`AnyWorker`,
  :class:`Worker` or :class:`Pool` (``options.device`` gives the device kind).
- Every device of an executor has slots (1 by default).
  ``CODEFYUI_RUN_QUEUE_MAX_CONCURRENT`` is a comma-separated list of
  ``N`` (at most N runs at once in total), ``DEVICE=N`` (slots per device on
  every executor: ``cpu=2``, ``cuda:0=2``, ``cuda=2`` for every CUDA device) and
  ``NAME/DEVICE=N`` (slots of one worker's device; ``local/cpu=2`` for this
  server).
- First come, first served per device kind: once a run for a device kind
  waits on an executor, later runs of that kind do not overtake it there.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from cdui.core.errors import CduiError
from cdui.plane.sched import device_fit
from cdui.plane.sched.catalog_check import any_skips
from cdui.plane.sched.placement import unreadable
from cdui.wire.devicesets import device_kind, device_matches
from cdui.wire.target import AnyWorker, Local, Pool, Target, Worker


@dataclass
class Caps:
    total: int | None = None
    per_device: dict[str, int] = field(default_factory=dict)
    per_executor: dict[tuple[str, str], int] = field(default_factory=dict)

    def slots(self, executor: str, device: str) -> int:
        kind = device.split(":")[0]
        # An instance NAME.ID has its own NAME.ID/DEVICE entry, else its credential's NAME/DEVICE one.
        for name in (executor, executor.rpartition(".")[0]):
            if (name, device) in self.per_executor:
                return self.per_executor[(name, device)]
            if (name, kind) in self.per_executor:
                return self.per_executor[(name, kind)]
        if device in self.per_device:
            return self.per_device[device]
        if kind in self.per_device:
            return self.per_device[kind]
        return 1


def parse_caps(spec: str) -> Caps:
    caps = Caps()
    for item in [x.strip() for x in (spec or "").split(",") if x.strip()]:
        try:
            if "=" not in item:
                caps.total = int(item)
                if caps.total < 1:
                    raise ValueError
                continue
            key, _, n = item.partition("=")
            value = int(n)
            if value < 0:
                raise ValueError
            if "/" in key:
                name, _, dev = key.partition("/")
                caps.per_executor[(name.strip(), dev.strip())] = value
            else:
                caps.per_device[key.strip()] = value
        except ValueError:
            raise CduiError("bad_setting", f"CODEFYUI_RUN_QUEUE_MAX_CONCURRENT entry {item!r} is not valid",
                            hint="use N, DEVICE=N or NAME/DEVICE=N, e.g. 2,cpu=1,w1/cuda:0=2") from None
    return caps




class ExecutorView(Protocol):
    name: str

    def devices(self) -> list[str]: ...

    def unavailable_reason(self) -> str | None: ...

    def mounted(self) -> bool: ...

    def read_roots(self) -> list[str]: ...


@dataclass
class Placement:
    executor: str
    device: str
    backend: str | None = None  # "mount" | "transfer" | None (the run uses no files)


def choose_device(ex: ExecutorView, wanted: str | None, used: dict[tuple[str, str], int],
                  caps: Caps) -> str | None:
    return _free_device(ex.name, [d for d in ex.devices() if device_matches(wanted, d)], wanted, used, caps)


def _free_device(name: str, matching: list[str], wanted: str | None, used: dict[tuple[str, str], int],
                 caps: Caps) -> str | None:
    """:func:`choose_device` of an executor whose devices that match ``wanted`` are ``matching``."""
    devs = matching
    if wanted in (None, "", "auto"):
        devs = sorted(matching, key=lambda d: (d == "cpu", d))  # GPUs first when the run does not care
    for d in devs:
        if used.get((name, d), 0) < caps.slots(name, d):
            return d
    return None


# -- one-shot workers (cdui.plane.oneshot keeps their state) --------------------------------
def is_one_shot(ex: object) -> bool:
    return bool(getattr(ex, "one_shot", False))


def not_one_shot(names: list[str], executors: Mapping[str, ExecutorView]) -> list[str]:
    """``any`` never goes to a one-shot worker: it would exit after that run."""
    return [n for n in names if not is_one_shot(executors[n])]


def place_pool(wanted: str | None, executors: Mapping[str, ExecutorView], used: dict[tuple[str, str], int],
               caps: Caps, needs: str = "none", reads: Sequence[str] = ()) -> Placement | str:
    """A pool run's one-shot worker now, or why it waits. Executors are tried in name order;
    the dispatch loop reads runs oldest first, so each device kind is served first come, first served."""
    kind = device_kind(wanted)
    for name in sorted(executors):
        ex = executors[name]
        if not is_one_shot(ex) or ex.unavailable_reason():
            continue
        if any(used.get((name, d), 0) for d in ex.devices()):
            continue  # placed in this same pass: it takes one run only
        if needs == "mount" and not ex.mounted():
            continue
        if unreadable(reads, ex.read_roots()):
            continue
        dev = choose_device(ex, wanted, used, caps)
        if dev is not None:
            backend = None if needs == "none" else ("mount" if ex.mounted() else "transfer")
            return Placement(name, dev, backend)
    what = "a device" if kind == "auto" else kind
    return (f"waiting for a one-shot worker that offers {what}" + (" with a `data` mount" if needs == "mount" else "")
            + (f" that may read {reads[0]} (CODEFYUI_READ_ROOTS)" if reads else ""))


class Blocked(set[tuple[str, str]]):
    """The (executor, device kind) pairs on which an earlier run waits: later runs of that kind do not
    overtake it there (first come, first served per device kind).

    A waiting ``any`` run blocks every executor ``any`` may use; :meth:`block_any` marks that in one
    entry per device kind instead of one per executor, so a run that must wait behind thousands of
    busy workers costs a dispatch pass nothing more than a run behind one. Membership reads the mark
    exactly as :func:`candidates` lists ``any``'s executors (this server, and every worker that is
    neither skipped for its catalog nor one-shot)."""

    def __init__(self, pairs: Iterable[tuple[str, str]] = (), executors: Mapping[str, ExecutorView] | None = None
                 ) -> None:
        super().__init__(pairs)
        self.executors: Mapping[str, ExecutorView] = executors if executors is not None else {}
        self.any_kinds: dict[str, Mapping[str, str]] = {}  # device kind -> the skips of the `any` run blocking it

    def block_any(self, kind: str, skips: Mapping[str, str]) -> None:
        self.any_kinds.setdefault(kind, skips)

    def __contains__(self, pair: object) -> bool:
        if set.__contains__(self, pair):
            return True
        if not self.any_kinds or not isinstance(pair, tuple) or len(pair) != 2:
            return False
        name, kind = pair
        skips = self.any_kinds.get(kind)
        if skips is None or name not in self.executors:
            return False
        return name == "local" or (name not in skips and not is_one_shot(self.executors[name]))

    def copy(self) -> Blocked:
        out = Blocked(self, self.executors)
        out.any_kinds = dict(self.any_kinds)
        return out


def block(blocked: set[tuple[str, str]], target: Target, kind: str, executors: Mapping[str, ExecutorView],
          skips: Mapping[str, str]) -> None:
    """A run for ``target`` and device kind ``kind`` must wait: every executor it may use is blocked for
    that kind (for ``any``, one mark whatever the number of workers, where ``blocked`` is a :class:`Blocked`)."""
    if isinstance(target, AnyWorker) and isinstance(blocked, Blocked):
        blocked.block_any(kind, skips)
        return
    for name in candidates(target, executors, skips=skips):
        blocked.add((name, kind))


def candidates(target: Target, executors: Mapping[str, ExecutorView], order: Iterable[str] | None = None,
               skips: Mapping[str, str] | None = None) -> list[str]:
    """The executors a target may use, in the order they are tried. ``order``: the
    executors to try for ``any`` (the caller's least recently used first; by
    default every executor by name); workers come before this server. ``skips``:
    ``any_skips(executors)`` when the caller has it already (it reads every executor)."""
    match target:
        case Local():
            return ["local"] if "local" in executors else []
        case AnyWorker():
            names = sorted(executors) if order is None else [n for n in order if n in executors]
            # Not a one-shot worker, nor one that lacks node types or reported no catalog (see any_skips).
            skipped = any_skips(executors) if skips is None else skips
            remote = not_one_shot([n for n in names if n != "local" and n not in skipped], executors)
            return remote + (["local"] if "local" in names else [])
        case Worker(name=name):
            return [name] if name in executors else []
        case Pool():
            return []  # the pool is placed by its own rule (place_pool)


def _any_in_order(executors: Mapping[str, ExecutorView], order: Iterable[str] | None,
                  skips: Mapping[str, str]) -> Iterator[str]:
    """What :func:`candidates` lists for ``any``, one at a time: placing a run stops at the first
    executor that takes it, so a placement costs the same with five hundred free workers as with one."""
    local = False
    for name in sorted(executors) if order is None else order:
        if name not in executors:
            continue
        if name == "local":
            local = True
        elif name not in skips and not is_one_shot(executors[name]):
            yield name
    if local:
        yield "local"


def place(target: Target, wanted: str | None, executors: Mapping[str, ExecutorView],
          used: dict[tuple[str, str], int], caps: Caps, running_total: int,
          blocked: set[tuple[str, str]], needs: str = "none", order: Iterable[str] | None = None,
          ask: device_fit.Ask | None = None, reads: Sequence[str] = (),
          skips: Mapping[str, str] | None = None) -> Placement | str:
    """Where a queued run goes now, or the reason it waits.

    ``needs``: "none" (no files), "transfer" (uploads only: mounted workers
    first, then unmounted ones through the transfer backend) or "mount" (only
    workers with the ``data`` mount). ``order``: which executors ``any`` tries,
    in that order (see :func:`candidates`). ``ask``: a device set or shared devices
    (see :mod:`cdui.plane.sched.device_fit`); None: one slot. ``reads``: the absolute paths the run reads;
    only an executor whose read roots cover them all may take it. ``skips``: ``any_skips(executors)``
    when the caller has it (a dispatch pass reads it once, not once per run). With several candidates
    the reason is a short summary by cause, so it stays small however many workers there are."""
    kind = device_kind(wanted)
    match target:
        case Pool():
            return place_pool(wanted, executors, used, caps, needs, reads)
        case Worker(name=name) if name not in executors:
            return f"waiting for worker {name} to connect (it is offline)"
    skips = (any_skips(executors) if skips is None else skips) if isinstance(target, AnyWorker) else {}
    names: Iterable[str]
    if isinstance(target, AnyWorker) and needs == "none":
        names = _any_in_order(executors, order, skips)
    else:
        names = candidates(target, executors, order, skips)
        if needs != "none":
            names.sort(key=lambda n: not executors[n].mounted())  # stable: mounted workers first
    if caps.total is not None and running_total >= caps.total:
        return (f"waiting: {running_total} runs are running, the limit is {caps.total} "
                "(CODEFYUI_RUN_QUEUE_MAX_CONCURRENT)")
    # `any` never goes to a one-shot worker, so its catalog is no reason for the wait.
    reasons: list[tuple[str, str, str]] = [  # (cause, executor, text)
        ("no node catalog match", n, why) for n, why in skips.items() if not_one_shot([n], executors)]
    tried = 0
    for name in names:
        tried += 1
        ex = executors[name]
        why = ex.unavailable_reason()
        if why:
            reasons.append(("unavailable", name, why))
            continue
        if needs == "mount" and not ex.mounted():
            reasons.append(("no data mount", name, f"{name} has no `data` mount"))
            continue
        # A run that reads no absolute path needs no read roots (reading them parses the worker's labels):
        # the reason over hundreds of busy workers is worked out on the event loop.
        missing = unreadable(reads, ex.read_roots()) if reads else None
        if missing:
            reasons.append((f"not allowed to read {missing[0]}", name,
                            f"{name} does not allow reading {missing[0]} (CODEFYUI_READ_ROOTS)"))
            continue
        devices = ex.devices()
        busy = [d for d in devices if device_matches(wanted, d)]
        if not busy:
            reasons.append((f"no {wanted} device", name,
                            f"{name} offers no {wanted} device (it has {', '.join(devices) or 'none'})"))
            continue
        if (name, kind) in blocked:
            reasons.append((f"an earlier {kind} run waits", name, f"an earlier run for {kind} is waiting on {name}"))
            continue
        dev = (_free_device(name, busy, wanted, used, caps) if ask is None
               else device_fit.choose(ex, wanted, used, caps, ask))
        if dev is not None:
            backend = None if needs == "none" else ("mount" if ex.mounted() else "transfer")
            return Placement(name, dev, backend)
        reasons.append(("slots in use", name, f"all slots of {name} {'/'.join(busy)} are in use" if ask is None
                        else device_fit.busy_text(name, wanted, ask, ex.devices())))
    if not tried:
        return "waiting for a worker to connect" if isinstance(target, AnyWorker) else "no executor for this target"
    if len(reasons) <= 2:
        return "waiting: " + "; ".join(text for _, _, text in reasons)
    if ask is not None and ask.count > 1:
        return device_fit.fits_text(wanted, ask.count) + ": " + summarize(kind, reasons).partition(": ")[2]
    return summarize(kind, reasons)


def summarize(kind: str, reasons: list[tuple[str, str, str]], shown: int = 3) -> str:
    """One short line for many executors: each cause, how many, and the first few names."""
    by_cause: dict[str, list[str]] = {}
    for cause, name, _ in reasons:
        by_cause.setdefault(cause, []).append(name)
    parts = []
    for cause, names in by_cause.items():
        more = f", +{len(names) - shown} more" if len(names) > shown else ""
        parts.append(f"{cause} on {len(names)} ({', '.join(names[:shown])}{more})")
    slot = "a free slot" if kind == "auto" else f"a free {kind} slot"
    return f"waiting for {slot}: " + "; ".join(parts)
