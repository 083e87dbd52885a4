"""The one launcher of run subprocesses, and the recorder of their events.

:func:`launch` starts ``python -m cdui.run.runproc`` for one run, hands it the job
(secrets included) on stdin, and reads its events. The :class:`RunHandle` is
the run's *recorder*: it gives each event its ``src_seq`` (gapless from
``first_seq``), adds the status events only the parent can know (started,
crashed, killed) and delivers events in batches to ``on_events``.

Stop: :meth:`RunHandle.stop` writes ``stop`` to the run's stdin and gives it
``grace`` seconds. A run that ends by itself in time reports its own status
(``cancelled`` when it honoured the stop); one still alive after the grace is
killed and ends ``interrupted``. A run subprocess that dies on its own without
a result ends ``failed`` with ``run subprocess exited with code N``.

Devices: a run on slot ``cuda:N`` gets ``CUDA_VISIBLE_DEVICES`` set to the one
card that slot is (see :func:`map_slot_device`) and is told, in the job's
``process_device``, that its card is ``cuda:0``. The slot name
(``slot_device``) is what events and the run object show.

Warm start: given a :class:`cdui.run.spare.SparePool`, a run's process is
forked by the pool's zygote (torch already imported) when it would have been
started the same way, and gets the job on stdin just as a fresh one;
everything above holds for it unchanged.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from operator import itemgetter
from pathlib import Path
from typing import Any

from cdui.core import event_size
from cdui.core.errors import CduiError
from cdui.core.private import open_private_append, user_umask
from cdui.core.project import env_secrets
from cdui.graph.secrets import environment_secrets, project_secrets, redact_text, redact_value
from cdui.run import outputs
from cdui.run.spare import STREAM_LIMIT, RunProcess, SparePool, exit_text
from cdui.wire.devicesets import members
from cdui.wire.job import Job
from cdui.wire.protocol import MAX_NAME, Lines, event_refusal, usable_at, usual_events

# An event only the launcher reads (never stored): the run has finished executing nodes
# and is writing its recorded outputs (cdui/run/outputs.py).
OUTPUTS_WRITING = "outputs_writing"
_ACTED_ON = frozenset({"result", OUTPUTS_WRITING})  # the run's lines the launcher acts on, not records
# A usual line's event text (RunHandle._usual_lines): its number, then the line's keys as written.
_NUMBERED = '{{"src_seq": {}, {}'
_FIRST, _LAST, _AFTER_OPEN = itemgetter(0), itemgetter(-1), itemgetter(slice(1, None))
_OPENS, _CLOSES = {"{"}, {"}"}
WRITE_MARGIN_S = 5.0  # past the write timeout, so the run's own bound ends the writes first

log = logging.getLogger(__name__)

EventSink = Callable[[list[dict[str, Any]]], Awaitable[None]]
# A sink that also takes each event's JSON text as an ``events`` message carries it (``{"src_seq", "kind",
# "data", "at"}``, strict JSON), where the run's own line gave it: ``None`` where it must be encoded.
TextSink = Callable[[list[dict[str, Any]], list[str | None]], Awaitable[None]]
STOP_GRACE_S = 10.0
MAX_LOG_LINE = 4000
READ_CHUNK = 1 << 16  # bytes of event lines read at once
DELIVER_BATCH = 1000  # events handed to the sink at once (the store bounds its transactions likewise)
_NOT_DECODED = object()
# A chunk holding one of these is never passed through (see RunHandle._pass_through): a line of one of the
# kinds the launcher or the agent acts on (a kind is written as its quoted text, unless it is escaped).
_ACTED_ON_TEXTS = (b'"result"', b'"outputs_writing"', b'"artifact"', b'"status"')
MAX_LINES_BYTES = 1 << 20  # bytes of run lines passed through in one frame
# A sink of a run's lines passed through as they were written (see RunHandle.on_lines).
LinesSink = Callable[[Lines], Awaitable[None]]


def _visible_entries(inherited: str) -> list[str]:
    """The devices an inherited ``CUDA_VISIBLE_DEVICES`` lists, in order.

    CUDA reads the list up to its first invalid entry and ignores the rest
    (``-1`` is the usual way to hide every card), so an empty or negative
    entry ends it here too. Entries are kept as written: an index, a
    ``GPU-<uuid>`` or a ``MIG-<uuid>`` all select one device."""
    out: list[str] = []
    for raw in inherited.split(","):
        entry = raw.strip()
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return out


def map_slot_device(slot: str, inherited: str | None) -> tuple[str, str | None]:
    """Map a run's slot to what its subprocess needs.

    Returns ``(device, cuda_visible_devices)``: the device the run is told to
    use inside its own process, and the ``CUDA_VISIBLE_DEVICES`` it gets
    (``None``: leave the inherited environment as it is).

    Slot numbers count the devices this agent or server sees, and it sees
    only what its own ``CUDA_VISIBLE_DEVICES`` (set by SLURM, systemd or
    docker) lists: slot ``cuda:1`` under ``2,3`` is physical card ``3``. The
    run is given exactly that one card, so inside it the card is ``cuda:0``;
    telling it ``cuda:1`` would name a device its process does not have.
    Raises :class:`CduiError` when the slot names a card that is not there."""
    slot = str(slot or "cpu").strip()
    kind, _, index_text = slot.partition(":")
    if kind != "cuda":
        return slot, None
    index_text = index_text or "0"
    if not index_text.isdigit():
        raise CduiError("bad_device", f"device {slot!r} is not valid: the part after 'cuda:' must be a card number",
                        hint="use cuda or cuda:N with N = 0, 1, ...")
    index = int(index_text)
    if inherited is None:
        return "cuda:0", str(index)
    entries = _visible_entries(inherited)
    if index >= len(entries):
        seen = f"{len(entries)} card(s): {', '.join(entries)}" if entries else "no card"
        raise CduiError("device_not_visible",
                        f"run slot {slot!r} names card {index}, but CUDA_VISIBLE_DEVICES={inherited!r} "
                        f"leaves this process {seen}",
                        hint="offer only the cards this process can see (--devices), or start it with a "
                             "CUDA_VISIBLE_DEVICES that lists the card")
    return "cuda:0", entries[index]


def map_set(slot: str, inherited: str | None) -> tuple[str, str | None]:
    """A set's (device inside the run, the run's ``CUDA_VISIBLE_DEVICES``): the cards of a CUDA
    set are narrowed to exactly the set, in its order, and are ``cuda:0..N-1`` inside the run."""
    devs = members(slot)
    if not devs[0].startswith("cuda"):
        return devs[0], None
    visible = [map_slot_device(d, inherited)[1] for d in devs]
    return "cuda:0", ",".join(v for v in visible if v is not None)


def run_env(slot: str, base: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """The run subprocess's environment and the device it is told to use.

    ``base`` is the environment inherited (default: this process's)."""
    env = dict(os.environ if base is None else base)
    # Secrets never travel in the environment; make sure no stray one does.
    env.pop("CODEFYUI_AGENT_TOKEN", None)
    env["PYTHONUNBUFFERED"] = "1"
    if "," in (slot or ""):  # a device set (cdui/wire/devicesets.py): every card of it, and only those
        device, visible = map_set(slot, env.get("CUDA_VISIBLE_DEVICES"))
    else:
        device, visible = map_slot_device(slot or "cpu", env.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env, device


def process_shape(python: str | None = None) -> tuple[str, str, int, dict[str, str]]:
    """How a run process is started here: python, working folder, umask, and the environment
    before a slot narrows it (what a zygote is built with)."""
    return (python or sys.executable, str(Path(__file__).resolve().parents[2]), user_umask(),
            run_env("cpu")[0])


def prime_spare(spares: SparePool) -> None:
    """Start the pool's zygote now instead of at the first run."""
    spares.prime(*process_shape())


class RunHandle:
    def __init__(self, run_id: str, on_events: EventSink, log_path: Path | None,
                 secrets: list[Any], first_seq: int = 1, on_texts: TextSink | None = None,
                 line_texts: bool = False, on_lines: LinesSink | None = None) -> None:
        self.run_id = run_id
        self.on_events = on_events
        # Given, events are delivered here instead, each with its JSON text where the run's line gave it
        # (an agent spools and sends that text as is instead of encoding the event again).
        self.on_texts = on_texts
        # With on_texts: the texts are for a store that keeps them as they are (the control plane's own
        # runs), so each is the run's line itself, not numbered nor held to strict JSON (see _line_texts).
        self.line_texts = line_texts
        # The events go out in an agent's events messages (texts numbered for the wire, not kept as lines):
        # a line the control plane would refuse as an event (a kind too long, data that is not an object or
        # nests too deep, a time outside 2000-2100) must not be sent as one, or its message, and every
        # later one of the run, would be refused (see _event_line).
        self.wire = on_texts is not None and not line_texts
        # Given (an agent), a chunk of the run's lines with nothing in it to act on, cut or mask is not decoded
        # here: its lines go to this sink as they were written, numbered from the next src_seq, one event
        # each, and the control plane reads them by the same rules a local run's lines are read by.
        self.on_lines = on_lines
        self.log_path = log_path
        # The run's own secrets and this machine's API keys (a node reads them from the environment
        # it inherits): both are masked in everything the run reports.
        # The .env values of the project this process opened are masked too (the run gets them in its job).
        self.secrets = [*secrets, *environment_secrets(os.environ), *project_secrets()]
        # This machine's bound on one event (cdui/core/event_size.py), so an oversized one is cut before it is spooled.
        self.event_max_bytes = event_size.limit_from_env()
        self.next_seq = first_seq
        self.proc: RunProcess | None = None
        self.stop_requested = False
        self.stop_grace = STOP_GRACE_S  # the grace the stop was asked with (CODEFYUI_STOP_GRACE_S)
        # Recorded outputs: once the run says it is writing them, a stop waits up to the
        # job's write timeout (CODEFYUI_WORKER_OUTPUTS_WRITE_TIMEOUT_S) before the kill.
        self.outputs_write_timeout = 0.0
        self.writing_outputs = False
        self.killed = False
        self.result: dict[str, Any] | None = None
        self.final: dict[str, Any] | None = None
        # Recorded, not yet delivered: events, and with on_lines the blocks of lines passed through.
        self._pending: list[Any] = []
        self._blocks = 0  # how many of them are blocks of lines
        self._texts: list[str | None] = []  # with on_texts: each pending event's text, or None
        self._more = asyncio.Event()  # something was recorded (or the recorder closed) since the last look
        self._closed = False  # nothing is recorded after what is pending
        self._delivering = False  # the deliverer is handing a batch to the sink right now
        self._drained = asyncio.Event()  # set each time the deliverer has handed over everything pending
        self._done = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._stop_task: asyncio.Task[Any] | None = None
        self._readers: list[asyncio.Task[Any]] = []
        self.stop_event = asyncio.Event()
        self.stop_count = 0  # how many times Stop was asked for (a second press can mean "now")
        # Awaited after the process ended, before the final status is recorded.
        self.before_final: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None

    # -- recording -------------------------------------------------------
    def record(self, kind: str, data: dict[str, Any], at: float | None = None, line_bytes: int | None = None) -> None:
        """Number and queue one event. ``line_bytes``: the length of the JSON line it was read from;
        decoded JSON encodes again to at most a few times its length (``1e15`` becomes 18
        characters), so an event read from a line under an eighth of the bound is within it."""
        if line_bytes is None or line_bytes * 8 > self.event_max_bytes:
            data = event_size.bound_event(kind, data, self.event_max_bytes)
        self._pending.append({"src_seq": self.next_seq, "kind": kind, "data": data,
                              "at": at if at is not None else time.time()})
        if self.on_texts is not None:
            self._texts.append(None)  # encoded by the sink (the lines that are an event's text: _plain_lines)
        self.next_seq += 1
        self._more.set()

    async def _deliver(self) -> None:
        """Hand the recorded events to the sink in order, in batches of up to DELIVER_BATCH, one
        batch at a time: what is recorded meanwhile makes the next batch."""
        while True:
            await self._more.wait()
            self._more.clear()
            self._delivering = True
            while self._pending:
                if self._blocks:
                    batch = self._pending[:DELIVER_BATCH]
                    cut = next((i for i, e in enumerate(batch) if type(e) is Lines), len(batch))
                    if cut == 0:
                        await self._deliver_lines()
                        continue
                    n = cut
                else:
                    n = DELIVER_BATCH
                batch = self._pending[:n]
                del self._pending[:n]
                try:
                    if self.on_texts is not None:
                        texts = self._texts[:n]
                        del self._texts[:n]
                        await self.on_texts(batch, texts)
                    else:
                        await self.on_events(batch)
                except Exception:  # the sink must not kill the recorder; it logs its own failures
                    log.exception("run %s: delivering %d events failed", self.run_id, len(batch))
            self._delivering = False
            self._drained.set()
            if self._closed:
                return

    async def _deliver_lines(self) -> None:
        """Hand the passed-through lines at the head of the pending ones to the lines sink, the blocks that
        follow each other joined into one (up to DELIVER_BATCH lines, as a batch of events: the control plane
        reads a frame in one turn of its loop; and MAX_LINES_BYTES bytes)."""
        pending = self._pending
        block = pending[0]
        assert type(block) is Lines and self.on_lines is not None
        parts, n, size, taken = [block.data], block.n, len(block.data), 1
        while taken < len(pending):
            nxt = pending[taken]
            if type(nxt) is not Lines or n + nxt.n > DELIVER_BATCH or size + len(nxt.data) + 1 > MAX_LINES_BYTES:
                break
            parts.append(nxt.data)
            n += nxt.n
            size += len(nxt.data) + 1
            taken += 1
        del pending[:taken]
        if self.on_texts is not None:
            del self._texts[:taken]
        self._blocks -= taken
        if taken > 1:
            block = Lines(self.run_id, block.src_seq, b"\n".join(parts), n)
        try:
            await self.on_lines(block)
        except Exception:  # the sink must not kill the recorder; it logs its own failures
            log.exception("run %s: delivering %d lines failed", self.run_id, block.n)

    async def _delivered_so_far(self) -> None:
        """Until every event recorded so far has been through the sink. The sink acts on some (an agent
        queues an ``artifact`` event's file for upload there), and the finishing step must see them all:
        a run that ended while a batch was still on its way (a slow or cut link holds the sink in its send)
        would otherwise have its last uploads finished before its artifact was queued, and lose the file."""
        if not self._tasks or self._tasks[0].done():
            return
        while self._pending or self._delivering:
            self._drained.clear()
            await self._drained.wait()

    async def _read_events(self) -> None:
        """Read the event lines in chunks (the run writes them in batches), each chunk's
        whole lines at once; a line is at most the stream's limit long, like a readline's."""
        assert self.proc and self.proc.stdout
        stdout = self.proc.stdout
        partial: list[bytes] = []  # the start of a line that has not ended yet
        held = 0
        while True:
            chunk = await stdout.read(READ_CHUNK)
            if not chunk:
                if partial and held <= STREAM_LIMIT:
                    self._event_line(b"".join(partial), _NOT_DECODED, ended=False)
                return
            if self.on_lines is not None and self._pass_chunk(chunk, partial, held):
                cut = chunk.rfind(b"\n")
                partial, held = ([chunk[cut + 1:]], len(chunk) - cut - 1) if cut + 1 < len(chunk) else ([], 0)
                continue
            lines = chunk.split(b"\n")
            if len(lines) == 1:  # no end of line in it: keep (up to the limit) and read on
                held += len(chunk)
                if held <= STREAM_LIMIT:
                    partial.append(chunk)
                continue
            if partial:
                if held + len(lines[0]) <= STREAM_LIMIT:
                    lines[0] = b"".join([*partial, lines[0]])
                else:
                    lines[0] = b""  # longer than any event may be: dropped, said once
                    self.record("run_warning", {"kind": "event_too_large",
                                                "message": f"the run wrote an event line of more than "
                                                           f"{STREAM_LIMIT} bytes; it was dropped"})
                partial, held = [], 0
            tail = lines.pop()
            if tail:
                partial, held = [tail], len(tail)
            self._event_lines([line for line in lines if line])

    def _event_lines(self, lines: list[bytes]) -> None:
        # One decode for all the chunk's lines; a line that is not one JSON value (a node that
        # wrote fd 1 itself) makes them decode one by one, so it alone becomes a warning. The
        # separator holds a newline, which no JSON string may: no string runs across two lines.
        # A chunk of one line (a run that logs now and then) goes the same way, to be its event's text.
        if lines:
            joined = b"[" + b"\n,".join(lines) + b"]"
            if self.on_lines is not None and self._pass_through(lines, joined):
                return
            try:
                decoded = json.loads(joined)
            except ValueError:
                decoded = None
            if isinstance(decoded, list) and len(decoded) == len(lines):
                if self._plain(joined):
                    as_text = self.on_texts is not None and joined.isascii()
                    if as_text and self.line_texts:
                        # The lines as text, cut from the chunk's in one go (a JSON line holds no newline).
                        self._line_texts(decoded, joined[1:-1].decode("ascii").split("\n,"))
                    elif not (as_text and self._usual_lines(decoded, joined)):
                        self._plain_lines(lines, decoded, len(joined), as_text)
                    return
                for line, ev in zip(lines, decoded, strict=True):
                    # Sized by the whole chunk: no event in it can be larger than that allows.
                    self._event_line(line, ev, size=len(joined))
                return
        for line in lines:
            self._event_line(line, _NOT_DECODED)

    def _pass_chunk(self, chunk: bytes, partial: list[bytes], held: int) -> bool:
        """:meth:`_pass_through` of a chunk's whole lines (with the start of its first line held from the
        chunks before) as they are, not split into lines first: the usual chunk of a run that logs flat out.
        Returns False, having recorded nothing, where the chunk must be read line by line: no whole line in
        it, an empty line, the first line too long, or a line :meth:`_pass_through` would not pass."""
        cut = chunk.rfind(b"\n")
        if cut < 0 or (held and held + chunk.find(b"\n") > STREAM_LIMIT) or held + cut > MAX_LINES_BYTES:
            return False
        body = b"".join([*partial, chunk[:cut]]) if partial else chunk[:cut]
        # Its lines counted, and an empty one found, in two passes in C (a count and a search for two
        # newlines cost half as much again).
        lines = body.split(b"\n")
        if b"" in lines:
            return False  # an empty line, which the launcher skips
        if not self._passable(body):
            return False
        self._add_blocks(lines, body)
        return True

    def _passable(self, text: bytes) -> bool:
        """Whether lines may be passed through as written (see :meth:`_pass_through`)."""
        if len(text) > MAX_LINES_BYTES or not self._plain(text):
            return False
        # An escape could spell one of those kinds: looked for only where there is a backslash at all (one
        # search for a byte, where a search for the two is as slow as a search for a word).
        if b"\\" in text and b"\\u" in text:
            return False
        for acted_on in _ACTED_ON_TEXTS:
            if acted_on in text:
                return False
        return True

    def _pass_through(self, lines: list[bytes], joined: bytes) -> bool:
        """Record the chunk's lines as blocks for :attr:`on_lines`, not decoded, where nothing in them is for
        this side to act on, cut or mask: no secret (:meth:`_plain`), no line of a kind the launcher or the
        agent acts on (their kinds' texts are not in it, nor any ``\\u`` escape that could spell one). The
        control plane makes each line one event, a line that is not one a warning, as this side would
        have. Returns False, having recorded nothing, for any other chunk."""
        if not self._passable(joined):
            return False
        self._add_blocks(lines)
        return True

    def _add_blocks(self, lines: list[bytes], joined: bytes | None = None) -> None:
        """Record lines that may be passed through as blocks of up to DELIVER_BATCH (what the control plane
        reads in one turn of its loop). ``joined``: the lines already joined by newlines, used as it is where
        they make one block (not joined again)."""
        seq = self.next_seq
        for i in range(0, len(lines), DELIVER_BATCH):
            part = lines[i:i + DELIVER_BATCH]
            data = joined if joined is not None and len(part) == len(lines) else b"\n".join(part)
            self._pending.append(Lines(self.run_id, seq, data, len(part)))
            if self.on_texts is not None:
                self._texts.append(None)
            self._blocks += 1
            seq += len(part)
        self.next_seq = seq
        self._more.set()

    def _plain(self, joined: bytes) -> bool:
        """Whether nothing in the chunk's lines is cut or masked: it is within an eighth of the bound on
        one event (see :meth:`record`), and no secret of the run is in it. With a secret known, not even
        an escape: without one, each string in the text is its value as written, so that a secret in a
        value is in the text."""
        if len(joined) * 8 > self.event_max_bytes:
            return False
        if self.secrets:
            if not joined.isascii():
                return False
            text = joined.decode("ascii")
            return "\\" not in text and redact_text(text, self.secrets) is text
        return True

    def _plain_lines(self, lines: list[bytes], decoded: list[Any], size: int, as_text: bool) -> None:
        """:meth:`_event_line` of a chunk's decoded lines that :meth:`_plain` found nothing to cut or mask
        in: the usual event recorded here directly (a flood's hundreds of thousands a second), anything
        else there. ``as_text``: the chunk is ASCII, so that a line may be the event's text (see below)."""
        pending, texts = self._pending, self._texts
        on_texts = self.on_texts is not None
        seq = self.next_seq
        for line, ev in zip(lines, decoded, strict=True):
            kind = ev.get("kind") if type(ev) is dict else None
            if type(kind) is not str or kind == "result" or kind == OUTPUTS_WRITING:
                self.next_seq = seq
                self._event_line(line, ev, size=size)
                seq = self.next_seq
                continue
            raw, at = ev.get("data"), ev.get("at")
            if self.wire and (len(kind) > MAX_NAME or (raw is not None and type(raw) is not dict)
                              or (at is not None and not usable_at(at))
                              or (type(raw) is dict and not _strict_flat(raw) and event_refusal(
                                  {"src_seq": 1, "kind": kind, "data": raw}) is not None)):
                self.next_seq = seq
                self._event_line(line, ev, size=size)  # made into what the control plane takes
                seq = self.next_seq
                continue
            pending.append({"src_seq": seq, "kind": kind, "data": raw or {},
                            "at": at if at is not None else time.time()})
            if on_texts:
                # The line as the event's text, its number put in front of its keys: an object of exactly
                # these three keys (a line with one more, say its own src_seq, is encoded anew), whose
                # values are what an event's text holds in strict JSON (no NaN or infinity, which a line
                # may hold as NaN or 1e999: x - x is 0 for a finite float only).
                texts.append('{"src_seq": ' + str(seq) + ", " + line[1:].decode("ascii")
                             if as_text and len(ev) == 3 and type(at) is float and at > 0 and at - at == 0
                             and type(raw) is dict and _strict_flat(raw) and line[:1] == b"{"
                             and line[-1:] == b"}" else None)
            seq += 1
        self.next_seq = seq
        self._more.set()

    def _usual_lines(self, decoded: list[Any], joined: bytes) -> bool:
        """:meth:`_plain_lines` of an ASCII chunk whose every line is the usual event (see
        ``protocol.usual_events``: what the run process writes for a log line, a metric or a progress),
        done a pass at a time over the whole chunk instead of a line at a time: each decoded event gets
        its number, and its text is its line with the number put in front of its
        keys. Returns False, having recorded nothing, for a chunk with any other line in it (one the
        launcher acts on, a line that is not an object of exactly those keys, a NaN or an infinity in it,
        a line with blanks around its object): :meth:`_plain_lines` takes it line by line."""
        kinds = usual_events(decoded, numbered=False)
        if kinds is None or not _ACTED_ON.isdisjoint(kinds):
            return False
        lines = joined[1:-1].decode("ascii").split("\n,")
        if set(map(_FIRST, lines)) != _OPENS or set(map(_LAST, lines)) != _CLOSES:
            return False
        seq = self.next_seq
        numbers = range(seq, seq + len(decoded))
        # Its number first, as an event is laid out everywhere (its text is then what event_text makes of it).
        self._pending.extend([{"src_seq": n, "kind": ev["kind"], "data": ev["data"], "at": ev["at"]}
                              for n, ev in zip(numbers, decoded, strict=True)])
        self._texts.extend(map(_NUMBERED.format, numbers, map(_AFTER_OPEN, lines)))
        self.next_seq = numbers.stop
        self._more.set()
        return True

    def _line_texts(self, decoded: list[Any], lines: list[str]) -> None:
        """:meth:`_plain_lines` for a sink that stores each event's line as it is (``line_texts``): the
        text of an event read from a line is the line itself, wherever its data is an object and its
        time a number of seconds: the line decodes to that kind, data and time (whatever else it holds
        is not read), which is all a store needs. Not held to strict JSON, which only a message needs
        (a ``NaN`` in it reads back as the ``NaN`` it was)."""
        pending, texts = self._pending, self._texts
        seq = self.next_seq
        for line, ev in zip(lines, decoded, strict=True):
            kind = ev.get("kind") if type(ev) is dict else None
            if type(kind) is not str or kind == "result" or kind == OUTPUTS_WRITING:
                self.next_seq = seq
                self._event_line(line.encode("ascii"), ev, size=len(line))  # within an eighth, as its chunk
                seq = self.next_seq
                continue
            raw, at = ev.get("data"), ev.get("at")
            pending.append({"src_seq": seq, "kind": kind, "data": raw or {},
                            "at": at if at is not None else time.time()})
            texts.append(line if type(at) is float and type(raw) is dict else None)
            seq += 1
        self.next_seq = seq
        self._more.set()

    def _event_line(self, line: bytes, ev: Any, ended: bool = True, size: int | None = None) -> None:
        try:
            if ev is _NOT_DECODED:
                ev = json.loads(line)
            kind, data = str(ev["kind"]), ev.get("data") or {}
        except (ValueError, KeyError, TypeError, AttributeError):
            text = line.decode(errors="replace") + ("\n" if ended else "")  # the line as written
            self.record("log", {"message": redact_text(text[:MAX_LOG_LINE], self.secrets),
                                "level": "warning", "stream": "stdout"})
            return
        if kind == "result":
            self.result = data
            return
        if kind == OUTPUTS_WRITING:
            self._outputs_writing()
            return
        at = ev.get("at")
        if self.wire:
            if at is not None and not usable_at(at):
                at = None  # a time the control plane would refuse: the time the line was read
            refusal = event_refusal({"src_seq": 1, "kind": kind, "data": data})
            if refusal is not None:
                # Not an event the control plane takes (a node that wrote fd 1 itself): its line as a warning.
                text = line.decode(errors="replace")
                self.record("log", {"message": redact_text(f"the run wrote a line that is not an event a control "
                                                           f"plane takes ({refusal}): {text}"[:MAX_LOG_LINE],
                                                           self.secrets),
                                    "level": "warning", "stream": "stdout"})
                return
        # The run subprocess masks its own events; the parent knows the same
        # secrets and masks again, so a node that writes fd 1 itself cannot leak one.
        self.record(kind, redact_value(data, self.secrets), at, size or len(line))

    async def _read_stderr(self) -> None:
        assert self.proc and self.proc.stderr
        # The run log can hold anything the run printed: this user's alone.
        fh = open_private_append(self.log_path) if self.log_path else None
        try:
            while True:
                line = await self.proc.stderr.readline()
                if not line:
                    return
                text = redact_text(line.decode(errors="replace").rstrip("\n"), self.secrets)
                if fh:
                    fh.write((text + "\n").encode())
                    fh.flush()
                if text.strip():
                    self.record("log", {"message": text[:MAX_LOG_LINE], "level": "info", "stream": "stderr"})
        finally:
            if fh:
                fh.close()

    # -- lifecycle --------------------------------------------------------
    def open(self) -> None:
        """Start delivering events; :meth:`record` works from here on, before the process exists."""
        if not self._tasks:
            self._tasks.append(asyncio.create_task(self._deliver()))

    async def start(self, job: Job, python: str | None = None, spares: SparePool | None = None) -> None:
        self.outputs_write_timeout = _write_timeout(job)
        # This machine's project secrets (its own .env), never another machine's: set in the run's own
        # process from its job, so no warm process holds them before the job arrives.
        job = replace(job, env_secrets=env_secrets())
        self.open()
        try:
            env, device = run_env(job.slot_device)
        except CduiError as exc:
            # A slot this process cannot give (its card is not visible here) fails
            # the run with the reason, rather than running it on the wrong device.
            await self._close({"status": "failed", "error": str(exc)})
            return
        pool = spares if spares is not None else SparePool(enabled=False)
        try:
            if self.log_path:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.proc = await pool.process(*process_shape(python), env)
        except OSError as exc:
            # No process (the interpreter cannot be run as this user, the log folder cannot be made): the
            # run ends here with the reason. Unreported, it would stay `running` with nothing to end it.
            await self._close({"status": "failed", "error": f"the run process could not be started: {exc}"})
            return
        # Events and the run keep naming the slot; only the subprocess sees its own numbering.
        self.record("status", {"status": "running", "pid": self.proc.pid, "device": job.slot_device})
        assert self.proc.stdin
        try:
            # The job goes on the run's own pipe, forked or fresh, secrets
            # included: they are never in argv or the environment.
            self.proc.stdin.write((replace(job, process_device=device).to_json() + "\n").encode())
            await self.proc.stdin.drain()
            if self.stop_requested:
                # Stop was asked for while the run was being prepared: tell the process at once.
                self.proc.stdin.write(b"stop\n")
                await self.proc.stdin.drain()
                self._stop_task = asyncio.create_task(self._kill_after(self.stop_grace))
        except ConnectionError:
            pass  # it died before reading its job: _finish reports its exit code
        self._readers = [asyncio.create_task(self._read_events()), asyncio.create_task(self._read_stderr())]
        self._tasks.extend(self._readers)
        self._tasks.append(asyncio.create_task(self._finish()))

    async def _finish(self) -> None:
        assert self.proc
        rc = await self.proc.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)
        final: dict[str, Any]
        if self.killed:
            final = {"status": "interrupted",
                     "error": f"the run did not stop within {self.stop_grace:.0f} s and was killed"}
        elif self.result is not None:
            final = {"status": self.result.get("status", "failed"), "error": self.result.get("error")}
        else:
            final = {"status": "failed", "error": exit_text(self.proc, rc)}
        if self._stop_task:
            self._stop_task.cancel()
        await self._close(final)

    async def _close(self, final: dict[str, Any]) -> None:
        if self.before_final is not None:
            # e.g. the agent's final uploads: the end is reported only after them,
            # so a finished run's files are all there.
            await self._delivered_so_far()
            try:
                final = await self.before_final(final)
            except Exception:
                log.exception("run %s: finishing step failed", self.run_id)
        self.final = final
        self.record("status", dict(final))
        self._closed = True
        await self._tasks[0]
        self._done.set()

    async def finish_without_process(self, final: dict[str, Any]) -> None:
        """End a run that never got its subprocess (stopped or failed while preparing)."""
        self.open()
        await self._close(final)

    async def wait(self) -> dict[str, Any]:
        await self._done.wait()
        assert self.final is not None
        return self.final

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Ask the run to stop; kill it after ``grace`` seconds."""
        if self.done:
            return
        self.stop_count += 1
        if self.stop_requested:
            return
        if self.writing_outputs:
            grace = max(grace, self.outputs_write_timeout + WRITE_MARGIN_S)
        self.stop_grace = grace
        self.stop_requested = True
        self.stop_event.set()
        if not self.proc:
            return  # not started yet: whoever prepares it checks stop_event
        try:
            assert self.proc.stdin
            self.proc.stdin.write(b"stop\n")
        except (ConnectionError, RuntimeError, AssertionError):
            pass
        self._stop_task = asyncio.create_task(self._kill_after(grace))

    def _outputs_writing(self) -> None:
        """The run has stopped executing nodes and writes its recorded outputs: it bounds
        that by the write timeout itself, so a stop already counting down waits that long
        (plus a margin) instead of killing it at the stop grace."""
        self.writing_outputs = True
        if self._stop_task is not None and self.outputs_write_timeout > 0:
            self._stop_task.cancel()
            self.stop_grace = self.outputs_write_timeout + WRITE_MARGIN_S
            self._stop_task = asyncio.create_task(self._kill_after(self.stop_grace))

    async def _kill_after(self, grace: float) -> None:
        await asyncio.sleep(grace)
        if self.proc and self.proc.returncode is None:
            self.killed = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _strict_flat(data: dict[str, Any]) -> bool:
    """Whether ``data`` holds strings, numbers, booleans and nulls only, and no NaN or infinity (which a
    line may hold as ``NaN`` or ``1e999`` but strict JSON, what an events message is, may not):
    ``x - x`` is 0 for a finite float only."""
    for x in data.values():
        t = type(x)
        if t is str or t is int or x is None or t is bool or (t is float and x - x == 0):
            continue
        return False
    return True


def _write_timeout(job: Job) -> float:
    try:
        return max(0.0, float(job.options.get(outputs.OPT_TIMEOUT) or 0.0))
    except (TypeError, ValueError):
        return 0.0


async def launch(job: Job, on_events: EventSink, log_path: Path | None = None,
                 first_seq: int = 1, spares: SparePool | None = None,
                 on_texts: TextSink | None = None, line_texts: bool = False,
                 on_lines: LinesSink | None = None) -> RunHandle:
    handle = RunHandle(job.run_id, on_events, log_path, job.secret_pairs(), first_seq, on_texts, line_texts,
                       on_lines)
    await handle.start(job, spares=spares)
    return handle
