"""Every message of ``/ws/worker``, as a typed shape with its validation.

JSON text frames, one object each, with a ``type`` field. The agent's first
message is ``hello``, and its first field is ``version``: the control plane
reads the version before anything else so that a future agent with other
fields still gets a readable refusal.

agent -> control plane
  hello      {version, name, devices, labels, machine_id, runs: [{run_id, running, last_seq}],
              one_shot, instance, capabilities, run_id,
              catalog: {types, hash} | null, catalog_error, fingerprint: {...} | null,
              device_memory: {device: {total_mb, free_mb}} | null,
              tls: {pin, next} | null}  (a pinned agent over TLS: the key it matched, its next pin)
              (``instance`` and ``run_id``: one-shot agents only, see :mod:`cdui.plane.oneshot`)
  events     {run_id, events: [{src_seq, kind, data, at}]}   (in src_seq order)
  lines      a binary frame: {type: "lines", run_id, src_seq}, a newline, then lines a run wrote, as written
             (one event each, numbered on from src_seq: the control plane reads them by the rules the
             launcher reads a local run's lines by, see :func:`parse_lines` and docs/api.md)
  heartbeat  {runs: [run ids still running], labels, tls, gpu, serving: [{slug, version, device, pid, state}]}
  outputs_answer {request_id, run_id, node_id, nodes, summary, error}  (recorded outputs, see cdui.run.outputs)
  raw_answer {request_id, chunk, size, sha256, data, error, code}  (one chunk of a recorded raw tensor file)
  probe_answer {nonce, cannot_read, cannot_write: {folder: reason}}  (the answer to ``probe``)
  log_answer {request_id, lines, first, last}  (the newest lines of the agent's own log, bounded)
  plugin_push_answer {request_id, pack_id, ok, message}  (the answer to ``plugin_push``)
  app_answer {request_id, result: {status, error, node_id} | null, outputs, output_error,
             error: {code, message, hint, details} | null}  (the end of an ``app_invoke``)
control plane -> agent
  probe      {nonce_file, folders}  (before the welcome, only to an agent whose hello names the control
             plane's machine id: can it read that file and write those folders? see cdui.wire.same_machine)
  welcome    {version, worker, heartbeat_s, resume_grace_s, runs: {run_id: {acked, action}}}
             action: "continue" (replay after ``acked``), "stop" (stop it now: it ended here),
             "drop" (not this worker's run: forget it)
  refused    {code, message}  then close. Codes: version_mismatch, revoked, unknown_credential,
             name_in_use, bad_hello
  assign     {run_id, job}  (the job's shape: :class:`cdui.wire.job.Job`)
  ack        {run_id, acked}
  s3_credentials {run_id, credentials}  (fresh bucket credentials of an s3 run: cdui.wire.s3.S3Credentials)
  stop       {run_id}
  revoked    {message}  (the worker was removed or its credential superseded; exit 2)
  error      {message}  (a malformed message; the connection stays up)
  outputs_request {request_id, run_id, node_id}  (node_id null: which nodes have recorded outputs)
  raw_request {request_id, run_id, node_id, port, chunk}  (chunk k of a recorded output's raw tensor file)
  log_request {request_id, after, lines}  (the agent's log lines after number ``after``; 0: the last ``lines``)
  plugin_push {request_id, pack_id, version, pin, tree_sha256, data}  (a plugin pack, base64 of its .tar.gz:
             an agent started with CODEFYUI_AGENT_ACCEPT_PLUGINS=1 installs it, see docs/plugins.md)
  app_invoke {request_id, slug, version, device, inputs, timeout_s, job}  (one invoke of a published app this
             worker serves, on its warm process for that version: docs/apps.md; ``job`` null once it has the version)
  app_retire {slug, keep}  (end the app's serving processes but version ``keep``'s, once their invokes answered)
  app_release_idle {idle_s, devices}  (runs wait for those devices' slots: end the serving processes idle that long)

Each message is a dataclass below with one ``to_json()`` for the way out; the
way in is :func:`parse_agent_message` on the control plane and
:func:`parse_server_message` on the agent, which check every field and bound
(sizes, NaN and infinities, nesting) once, at the edge, so that the code behind
them handles typed values only.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from itertools import chain, compress, repeat
from operator import is_, itemgetter, setitem
from typing import Any, ClassVar, cast

from cdui.wire import node_outputs
from cdui.wire.devicesets import MAX_MEMORY_DEVICES, MAX_MEMORY_MB
from cdui.wire.event import event_json_strict
from cdui.wire.job import Job, JobError
from cdui.wire.s3 import S3Credentials

# Bounds on what a worker may send (a worker may be hostile). Events come in
# batches of at most a few hundred; a message is encoded by :func:`encode_events`
# on the agent so that it always fits.
MAX_MESSAGE = 8 * 1024 * 1024     # bytes of one WebSocket message
MAX_EVENTS = 2000                 # events in one message
MAX_NAME = 128                    # run ids, names, devices, kinds, label keys, machine ids
MAX_LABEL_VALUE = 4096            # a label's value may be a path
MAX_ITEMS = 10000                 # runs in a hello or heartbeat
MAX_SMALL_LIST = 64               # devices, labels, capabilities
MAX_DEPTH = 16                    # nesting of an event's ``data``
MAX_TYPES = 4096                  # node types in a hello's catalog
MAX_FINGERPRINT = 32 * 1024       # bytes of a hello's fingerprint, encoded
MAX_FINGERPRINT_DEPTH = 4
MAX_SEQ = 2 ** 53                 # src_seq stays exact in JSON numbers
# ``at`` is a UNIX time; anything outside 2000-01-01 .. 2100-01-01 is a bug or an attack.
MIN_AT, MAX_AT = 946684800.0, 4102444800.0


MAX_LINES_HEAD = 1024             # bytes of a lines frame's header
MAX_LINE_TEXT = 4000              # characters of a line kept in the warning that says it is not an event


class ProtocolError(ValueError):
    """A message that does not fit its shape; the text says what and where."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:40]} is out of range for a number")
    return v


# One decoder for every message: json.loads with hooks builds a new decoder per call, which cost
# as much as decoding a heartbeat itself.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


# An events message as agents write it (encode_events) is decoded by this one instead, without a Python
# call per number to refuse an overflow to infinity: its events are proved finite by usual_events, a
# pass over the whole message, and a message of any other events is decoded again by _DECODER.
_LAX_DECODER = json.JSONDecoder(parse_constant=_reject_constant)
_EVENTS_HEAD = '{"type": "events", '


def loads(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN, Infinity and numbers that overflow to them,
    and turns nesting too deep to parse into a ValueError."""
    try:
        if not isinstance(text, str):
            return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        if text.startswith("\ufeff"):
            raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")  # as json.loads says
        return _DECODER.decode(text)
    except RecursionError:
        raise ValueError("the JSON nests too deeply") from None


def _req(d: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ProtocolError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise ProtocolError(f"{where}: field {key!r} has type {type(v).__name__}")
    return v


def _opt(d: dict[str, Any], key: str, typ: type | tuple[type, ...], default: Any, where: str) -> Any:
    if key not in d or d[key] is None:
        return default
    return _req(d, key, typ, where)


def _str(v: Any, where: str, limit: int = MAX_NAME) -> str:
    if not isinstance(v, str):
        raise ProtocolError(f"{where} must be a string, got {type(v).__name__}")
    if len(v) > limit:
        raise ProtocolError(f"{where} is {len(v)} characters long, over the limit of {limit}")
    return v


def _list(v: Any, where: str, limit: int) -> list[Any]:
    if not isinstance(v, list):
        raise ProtocolError(f"{where} must be a list, got {type(v).__name__}")
    if len(v) > limit:
        raise ProtocolError(f"{where} has {len(v)} items, over the limit of {limit}")
    return v


def _labels(v: Any, where: str) -> dict[str, str]:
    if not isinstance(v, dict):
        raise ProtocolError(f"{where} must be an object, got {type(v).__name__}")
    if len(v) > MAX_SMALL_LIST:
        raise ProtocolError(f"{where} has {len(v)} labels, over the limit of {MAX_SMALL_LIST}")
    return {_str(k, f"{where} key"): _str(val, f"{where}[{k[:40]!r}]", MAX_LABEL_VALUE) for k, val in v.items()}


def _int(v: Any, where: str, low: int = 0, high: int = MAX_SEQ) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise ProtocolError(f"{where} must be an integer, got {type(v).__name__}")
    if not low <= v <= high:
        raise ProtocolError(f"{where}={v} is out of range ({low}..{high})")
    return v


def _check_depth(data: Any, where: str) -> None:
    """Refuse ``data`` nested deeper than MAX_DEPTH (iteratively: no recursion to exhaust)."""
    stack = [(data, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ProtocolError(f"{where} nests deeper than {MAX_DEPTH} levels")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)


@dataclass(frozen=True)
class HeldRun:
    run_id: str
    running: bool
    last_seq: int


@dataclass
class Hello:
    version: str
    name: str
    devices: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    machine_id: str = ""
    runs: list[HeldRun] = field(default_factory=list)
    one_shot: bool = False
    instance: str | None = None
    capabilities: list[str] = field(default_factory=list)
    run_id: str | None = None  # a one-shot agent's --run-id: the one run it takes
    # The node catalog the agent's helper reported ({types, hash}); None: the
    # helper failed (catalog_error says why) or the agent predates catalogs.
    catalog: dict[str, Any] | None = None
    catalog_error: str | None = None
    fingerprint: dict[str, Any] | None = None
    # Each offered device's memory, {device: {total_mb, free_mb}} (cdui/wire/devicesets.py); None: not reported.
    device_memory: dict[str, dict[str, int]] | None = None
    # Drawn once per agent process and presented on every connection it opens: a connection
    # with the id of the open one under the same name is that agent back after a drop the
    # control plane has not noticed yet, so it replaces the open one (not another agent).
    agent_id: str | None = None
    # A pinned agent over TLS: {pin: the key its handshake matched, next: the next pin it holds}.
    tls: dict[str, str | None] | None = None
    type: ClassVar[str] = "hello"

    def to_json(self) -> str:
        # version first: the control plane reads it before anything else, so that an
        # agent of another version with other fields still gets a readable refusal.
        return json.dumps({"version": self.version, "type": self.type, "name": self.name, "devices": self.devices,
                           "labels": self.labels, "machine_id": self.machine_id,
                           "runs": [{"run_id": r.run_id, "running": r.running, "last_seq": r.last_seq}
                                    for r in self.runs],
                           "one_shot": self.one_shot, "instance": self.instance,
                           "capabilities": self.capabilities, "run_id": self.run_id, "catalog": self.catalog,
                           "catalog_error": self.catalog_error, "fingerprint": self.fingerprint,
                           "device_memory": self.device_memory, "agent_id": self.agent_id, "tls": self.tls})


@dataclass
class Events:
    run_id: str
    events: list[dict[str, Any]]
    # Each event's own JSON text as the message carried it, where the message is laid out as agents
    # write it and every event is one the store may keep as its text (see _texts_as_written); None
    # for any other message. Not sent: the texts are the message.
    texts: list[str | None] | None = field(default=None, compare=False, repr=False)
    type: ClassVar[str] = "events"

    def to_json(self) -> str:
        """One message, however big; the agent sends :func:`encode_events` instead,
        which splits a batch to fit the control plane's limit."""
        return json.dumps({"type": self.type, "run_id": self.run_id, "events": [_safe(e) for e in self.events]},
                          default=str, allow_nan=False)


@dataclass
class Heartbeat:
    runs: list[str]
    labels: dict[str, str] | None = None
    tls: dict[str, str | None] | None = None  # as in the hello: its next pin may have changed since
    # Each CUDA card's use now, [{device, util, used_mb, total_mb}] (cdui/agent/gpu_usage.py); sent at a
    # bounded rate, absent in between (the last one stands) and always on a machine without CUDA cards.
    gpu: list[dict[str, Any]] | None = None
    # The published apps' serving processes it holds, [{slug, version, device, pid, state}]
    # (cdui/agent/app_serving.py); absent from an agent that never served an app.
    serving: list[dict[str, Any]] | None = None
    type: ClassVar[str] = "heartbeat"

    def to_json(self) -> str:
        d: dict[str, Any] = {"type": self.type, "runs": self.runs}
        if self.serving is not None:
            d["serving"] = self.serving
        if self.labels is not None:
            d["labels"] = self.labels
        if self.tls is not None:
            d["tls"] = self.tls
        if self.gpu is not None:
            d["gpu"] = self.gpu
        return json.dumps(d)


_CARD = re.compile(r"cuda:\d{1,3}")
MAX_GPU_MB = 1 << 24  # 16 TiB in MiB: no card has more


def _gpu(v: Any, where: str) -> list[dict[str, Any]] | None:
    """``[{device, util, used_mb, total_mb}]``: a CUDA card, its utilisation (0-100 %) and its memory in use
    and in all (whole MiB); a figure the agent could not read is null. At most 64 cards."""
    if v is None:
        return None
    cards = _list(v, where, 64)
    out = []
    for i, c in enumerate(cards):
        if not isinstance(c, dict):
            raise ProtocolError(f"{where}[{i}] must be an object, got {type(c).__name__}")
        dev = c.get("device")
        if not (isinstance(dev, str) and _CARD.fullmatch(dev)):
            raise ProtocolError(f"{where}[{i}].device is not a CUDA card (cuda:N): {str(dev)[:40]!r}")
        row: dict[str, Any] = {"device": dev}
        for key, high in (("util", 100), ("used_mb", MAX_GPU_MB), ("total_mb", MAX_GPU_MB)):
            x = c.get(key)
            if x is not None and not (isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= high):
                raise ProtocolError(f"{where}[{i}].{key} is not a whole number from 0 to {high}: {str(x)[:40]!r}")
            row[key] = x
        out.append(row)
    return out


MAX_SERVING = 256  # serving processes one heartbeat reports
SERVING_STATES = ("busy", "idle")


def _serving(v: Any, where: str) -> list[dict[str, Any]] | None:
    """``[{slug, version, device, pid, state}]``: each serving process of a published app on the worker."""
    if v is None:
        return None
    out = []
    for i, p in enumerate(_list(v, where, MAX_SERVING)):
        if not isinstance(p, dict):
            raise ProtocolError(f"{where}[{i}] must be an object, got {type(p).__name__}")
        state = _str(_req(p, "state", str, f"{where}[{i}]"), f"{where}[{i}].state")
        if state not in SERVING_STATES:
            raise ProtocolError(f"{where}[{i}].state={state!r} is not one of {', '.join(SERVING_STATES)}")
        out.append({"slug": _str(_req(p, "slug", str, f"{where}[{i}]"), f"{where}[{i}].slug", 64),
                    "version": _int(_req(p, "version", int, f"{where}[{i}]"), f"{where}[{i}].version", 1),
                    "device": _str(_req(p, "device", str, f"{where}[{i}]"), f"{where}[{i}].device"),
                    "pid": _int(_req(p, "pid", int, f"{where}[{i}]"), f"{where}[{i}].pid"), "state": state})
    return out


_PIN = re.compile(r"sha256:[0-9a-f]{64}")


def _tls(v: Any, where: str) -> dict[str, str | None] | None:
    """``{pin, next}``: each a key fingerprint (cdui/core/trust.py) or null."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ProtocolError(f"{where} must be an object or null, got {type(v).__name__}")
    out: dict[str, str | None] = {}
    for key in ("pin", "next"):
        x = v.get(key)
        if x is not None and not (isinstance(x, str) and _PIN.fullmatch(x)):
            raise ProtocolError(f"{where}.{key} is not a key fingerprint (sha256:<64 hex>): {str(x)[:80]!r}")
        out[key] = x
    return out


def peek_version(raw: str) -> str | None:
    """The version of a hello, read before (and without) the rest of the message."""
    if len(raw) > MAX_MESSAGE:
        return None
    try:
        d = loads(raw)
    except ValueError:
        return None
    version = d.get("version") if isinstance(d, dict) else None
    return version[:MAX_NAME] if isinstance(version, str) else None


def _event(e: Any, where: str) -> dict[str, Any]:
    if not isinstance(e, dict):
        raise ProtocolError(f"{where} is not an object")
    _int(_req(e, "src_seq", int, where), f"{where}.src_seq", 1)
    _str(_req(e, "kind", str, where), f"{where}.kind")
    data = e.get("data", {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProtocolError(f"{where}.data is not an object")
    _check_depth(data, f"{where}.data")
    at = e.get("at")
    if at is not None and not usable_at(at):
        raise ProtocolError(f"{where}.at={at!r} is not a UNIX time between 2000 and 2100")
    return e


def event_refusal(e: dict[str, Any]) -> str | None:
    """Why the control plane would refuse an events message holding event ``e`` (what :func:`_event` says),
    or None: an agent records a line it cannot send as such as a warning instead (cdui/run/runner.py), since
    a refused message would hold back every later event of the run."""
    try:
        _event(e, "the event")
    except ProtocolError as exc:
        return str(exc)
    return None


def usable_at(at: Any) -> bool:
    """Whether ``at`` is a time an event may carry: a number of seconds (not a boolean) in 2000-2100."""
    return (type(at) is float or type(at) is int) and MIN_AT <= at <= MAX_AT


def _events(evs: list[Any]) -> bool:
    """Check a batch of events as :func:`_event` does, in one pass: the usual event (an object with
    an int src_seq, a short kind, a flat data object and a time) costs a few type checks; anything
    else is checked by :func:`_event`, which says what is wrong with it. Returns whether every event
    was the usual one with its time given (a float): what the store needs to keep an event's text."""
    timed = True
    for i, e in enumerate(evs):
        if type(e) is dict:
            s, k, data, at = e.get("src_seq"), e.get("kind"), e.get("data"), e.get("at")
            if (type(s) is int and 1 <= s <= MAX_SEQ and type(k) is str and len(k) <= MAX_NAME
                    and type(data) is dict and (type(at) is float and MIN_AT <= at <= MAX_AT or at is None)
                    and _FLAT.issuperset(map(type, data.values()))):
                if at is None:
                    timed = False
                continue
        _event(e, f"events[{i}]")
        timed = False
    return timed


_FLAT = frozenset({str, int, float, bool, type(None)})
_DICT, _STR, _FLOAT, _INT = {dict}, {str}, {float}, {int}
_KIND, _DATA, _AT, _SEQ = itemgetter("kind"), itemgetter("data"), itemgetter("at"), itemgetter("src_seq")


def usual_events(evs: list[Any], numbered: bool = True) -> list[str] | None:
    """The kinds of ``evs`` where every one of them is the usual event, else None.

    The usual event is an object of exactly ``kind`` (a string of at most MAX_NAME characters),
    ``data`` (an object of strings, numbers, booleans and nulls), ``at`` (a float UNIX time between 2000
    and 2100) and, when ``numbered``, ``src_seq`` (an int from 1 to MAX_SEQ), with no NaN or infinity
    anywhere (what strict JSON, an events message, holds). Checked one property at a time over the whole
    batch, each pass a loop in C (``map``, ``set``, ``sum``), instead of event by event in Python: a
    flood's message or chunk of a thousand events is the usual case. Floats are proved finite by their
    sum: a NaN or an infinity makes it NaN or infinite (so does a sum past the largest float, which only
    sends the batch to the checks one event at a time)."""
    if not evs:
        return None
    try:
        if set(map(type, evs)) != _DICT or set(map(len, evs)) != ({4} if numbered else {3}):
            return None
        kinds, datas, ats = list(map(_KIND, evs)), list(map(_DATA, evs)), list(map(_AT, evs))
        seqs = list(map(_SEQ, evs)) if numbered else None
    except KeyError:
        return None
    if set(map(type, kinds)) != _STR or max(map(len, kinds)) > MAX_NAME:
        return None
    if set(map(type, ats)) != _FLOAT or not MIN_AT <= min(ats) or not max(ats) <= MAX_AT:
        return None
    total = sum(ats)
    if total - total != 0:  # a NaN, which min and max may miss
        return None
    if set(map(type, datas)) != _DICT:
        return None
    values = list(chain.from_iterable(map(dict.values, datas)))
    types = set(map(type, values))
    if not _FLAT.issuperset(types):
        return None
    if float in types:
        total = sum(compress(values, map(is_, map(type, values), repeat(float))))
        if total - total != 0:
            return None
    if seqs is not None and (set(map(type, seqs)) != _INT or min(seqs) < 1 or max(seqs) > MAX_SEQ):
        return None
    return kinds


def _catalog(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ProtocolError(f"hello.catalog must be an object, got {type(v).__name__}")
    types = [_str(t, "hello.catalog.types[]") for t in _list(_req(v, "types", list, "hello.catalog"),
                                                             "hello.catalog.types", MAX_TYPES)]
    return {"types": types, "hash": _str(_req(v, "hash", str, "hello.catalog"), "hello.catalog.hash")}


def _fingerprint(v: Any) -> dict[str, Any] | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ProtocolError(f"hello.fingerprint must be an object, got {type(v).__name__}")
    size = len(json.dumps(v))
    if size > MAX_FINGERPRINT:
        raise ProtocolError(f"hello.fingerprint is {size} bytes, over the limit of {MAX_FINGERPRINT}")
    stack = [(v, 1)]
    while stack:  # only objects of strings, numbers and booleans, MAX_FINGERPRINT_DEPTH deep
        obj, depth = stack.pop()
        if depth > MAX_FINGERPRINT_DEPTH:
            raise ProtocolError(f"hello.fingerprint nests deeper than {MAX_FINGERPRINT_DEPTH} levels")
        for k, x in obj.items():
            if isinstance(x, dict):
                stack.append((x, depth + 1))
            elif x is not None and not isinstance(x, (str, int, float, bool)):
                raise ProtocolError(f"hello.fingerprint field {str(k)[:40]!r} has type {type(x).__name__}")
    return v


def parse_memory_report(v: Any, where: str = "hello.device_memory") -> dict[str, dict[str, int]] | None:
    """A worker's ``device_memory`` report, bounded: ``{device: {total_mb, free_mb}}``."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ProtocolError(f"{where} must be an object, got {type(v).__name__}")
    if len(v) > MAX_MEMORY_DEVICES:
        raise ProtocolError(f"{where} lists {len(v)} devices, over the limit of {MAX_MEMORY_DEVICES}")
    out: dict[str, dict[str, int]] = {}
    for dev, facts in v.items():
        if not isinstance(dev, str) or not dev or len(dev) > MAX_NAME:
            raise ProtocolError(f"{where} has a device name that is not a short string")
        if not isinstance(facts, dict):
            raise ProtocolError(f"{where}[{dev!r}] must be an object")
        entry: dict[str, int] = {}
        for k in ("total_mb", "free_mb"):
            x = facts.get(k)
            if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_MEMORY_MB:
                raise ProtocolError(f"{where}[{dev!r}].{k}={str(x)[:40]!r} is not a whole number of MiB "
                                    f"from 0 to {MAX_MEMORY_MB}")
            entry[k] = x
        out[dev] = entry
    return out


# Between two events of a message as agents write it (encode_events): how an event's text starts.
_EVENT_START = '{"src_seq": '
_NEXT_EVENT = "," + _EVENT_START


def _texts_as_written(raw: str, run_id: str, evs: list[dict[str, Any]]) -> list[str | None] | None:
    """Each event's own text in an events message ``raw`` already decoded and checked (``evs``, of
    ``run_id``), where the message is laid out as agents write it, or None.

    The control plane stores those texts as they are instead of encoding each event's data again
    (cdui/plane/store/event_chunks.py), so a text must be exactly the text its event was decoded from,
    whatever a worker sends. Taken only where that follows from a few counts over the text: the message
    starts with the agents' head and ends with the events list and the object; it is ASCII (a text's
    length is then its size in bytes, which the store bounds); each event is an object with an object
    of data (what the check of ``evs`` found), and the text between head and end holds exactly two
    ``{`` per event: those two, none in a string, no other object anywhere. So every ``{`` that
    follows a comma starts an event, and where there are exactly as many ``,{"src_seq": `` as events
    less one, the text splits there into the events' texts (a later key after the list, or the list
    given twice, would hold an object: one ``{`` too many). A log line holding a ``{`` makes its
    message fall back to its events encoded again, as before."""
    head = '{"type": "events", "run_id": ' + json.dumps(run_id) + ', "events": ['
    if not (raw.isascii() and raw.startswith(head) and raw.endswith("}]}")):
        return None
    body = raw[len(head):-2]
    n = len(evs)
    if not body.startswith(_EVENT_START) or body.count("{") != 2 * n:
        return None
    parts = body.split(_NEXT_EVENT)
    if len(parts) != n:
        return None
    return [parts[0], *[_EVENT_START + t for t in parts[1:]]]


def _usual_events_message(raw: str) -> Events | None:
    """``raw`` as an events message of usual events only (see :func:`usual_events`), decoded and checked a
    pass at a time over the whole message; None for anything else, which the checks one field and one
    event at a time take (and explain, if it is wrong). A flood's every message is one of these."""
    try:
        d = _LAX_DECODER.decode(raw)
    except (ValueError, RecursionError):
        return None
    if type(d) is not dict or d.get("type") != "events":
        return None
    evs, run_id = d.get("events"), d.get("run_id")
    if type(evs) is not list or len(evs) > MAX_EVENTS or type(run_id) is not str or usual_events(evs) is None:
        return None
    run_id = _str(run_id, "events.run_id")
    return Events(run_id, evs, _texts_as_written(raw, run_id, evs))


@dataclass
class Lines:
    """Lines a run wrote, passed through by the agent as written: one event each, numbered on from
    ``src_seq``. Sent as one binary frame (its header, a newline, the lines joined by newlines), not
    decoded by the agent; the control plane reads them with :func:`parse_lines`."""
    run_id: str
    src_seq: int
    data: bytes  # the lines, joined by b"\n" (none of them empty, none holding a newline)
    n: int       # how many: data.count(b"\n") + 1
    type: ClassVar[str] = "lines"

    @property
    def last(self) -> int:
        return self.src_seq + self.n - 1

    def head(self) -> bytes:
        return b'{"type": "lines", "run_id": %s, "src_seq": %d}\n' % (json.dumps(self.run_id).encode(),
                                                                       self.src_seq)

    def frame(self) -> bytes:
        return self.head() + self.data


_LINE_OPENS, _LINE_CLOSES = {"{"}, {"}"}
_LINE_FIRST, _LINE_LAST = itemgetter(0), itemgetter(-1)


def parse_lines(frame: bytes, now: float) -> Events:
    """A ``lines`` frame as the events it stands for: each line is one event, numbered on from the
    header's ``src_seq``, whatever it holds (a worker may be hostile, and one bad line must not hold
    back the run's later events as a refused message would): an object with a ``kind`` that an events
    message could carry is that event (no ``at``, or one outside 2000-2100: ``now``); anything else
    becomes a warning that quotes the line, as a local run's line that is not an event does. Raises
    :class:`ProtocolError` for a frame that is not laid out as one (its header, the bounds)."""
    if len(frame) > MAX_MESSAGE:
        raise ProtocolError(f"lines frame of {len(frame)} bytes is over the {MAX_MESSAGE} byte limit")
    cut = frame.find(b"\n", 0, MAX_LINES_HEAD)
    if cut < 0:
        raise ProtocolError(f"a binary frame must start with a lines header of at most {MAX_LINES_HEAD} bytes "
                            "and a newline (binary frames carry nothing else)")
    try:
        head = loads(frame[:cut])
    except ValueError as exc:
        raise ProtocolError(f"lines header is not JSON: {exc}") from None
    if not isinstance(head, dict) or head.get("type") != "lines":
        raise ProtocolError("a binary frame's header must be an object of type 'lines'")
    run_id = _str(_req(head, "run_id", str, "lines"), "lines.run_id")
    first = _int(_req(head, "src_seq", int, "lines"), "lines.src_seq", 1)
    lines = frame[cut + 1:].split(b"\n")
    if len(lines) > MAX_EVENTS:
        raise ProtocolError(f"lines frame of {len(lines)} lines is over the {MAX_EVENTS} line limit")
    if first + len(lines) - 1 > MAX_SEQ:
        raise ProtocolError(f"lines.src_seq={first} numbers its lines past {MAX_SEQ}")
    events, texts = line_events(lines, first, now)
    return Events(run_id, events, texts)


def line_events(lines: list[bytes], first: int, now: float) -> tuple[list[dict[str, Any]], list[str | None] | None]:
    """The events of ``lines`` numbered on from ``first`` (see :func:`parse_lines`), and each one's
    text where it may be stored as its line (the usual events of an ASCII block), else None."""
    joined = b"[" + b"\n,".join(lines) + b"]"
    try:
        decoded = json.loads(joined)  # NaN and infinities are let through here and caught below
    except (ValueError, RecursionError):
        decoded = None
    if type(decoded) is list and len(decoded) == len(lines):
        kinds = usual_events(decoded, numbered=False)
        if kinds is not None:
            # Each decoded object (exactly kind, data and at) gets its number: set in one pass in C, not
            # made into a new dict per event (a flood's hundreds of thousands a second).
            events: list[dict[str, Any]] = decoded
            list(map(setitem, events, repeat("src_seq"), range(first, first + len(lines))))
            if not joined.isascii():
                return events, None
            texts = joined[1:-1].decode("ascii").split("\n,")
            # A line with blanks around its object is stored encoded anew, as a local run's is.
            if set(map(_LINE_FIRST, texts)) != _LINE_OPENS or set(map(_LINE_LAST, texts)) != _LINE_CLOSES:
                return events, None
            return events, cast("list[str | None]", texts)
    else:
        decoded = [_UNREAD] * len(lines)
    return [_line_event(line, ev, first + i, now)
            for i, (line, ev) in enumerate(zip(lines, decoded, strict=True))], None


_UNREAD = object()


def _line_event(line: bytes, ev: Any, seq: int, now: float) -> dict[str, Any]:
    """One line as its event (see :func:`parse_lines`); ``ev``: the line decoded, or _UNREAD."""
    if ev is _UNREAD:
        try:
            ev = json.loads(line)
        except (ValueError, RecursionError):
            ev = None
    # A kind that is not text is made text, as the agent's launcher reads a line (cdui/run/runner.py).
    kind = str(ev["kind"]) if type(ev) is dict and "kind" in ev else None
    text = line.decode(errors="replace")
    if kind is not None:
        data, at = ev.get("data") or {}, ev.get("at")
        refusal = event_refusal({"src_seq": 1, "kind": kind, "data": data})
        if refusal is None:
            # NaN and infinities as the strings a run process writes them as (an event is strict JSON).
            return {"src_seq": seq, "kind": kind, "data": _safe(data),
                    "at": float(at) if usable_at(at) else now}
        message = f"the run wrote a line that is not an event a control plane takes ({refusal}): {text}"
    else:
        message = text + "\n"  # the line as written, as a local run's
    return {"src_seq": seq, "kind": "log", "at": now,
            "data": {"message": message[:MAX_LINE_TEXT], "level": "warning", "stream": "stdout"}}


def parse_agent_message(raw: str) -> AgentMessage:
    if len(raw) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(raw)} bytes is over the {MAX_MESSAGE} byte limit")
    if raw.startswith(_EVENTS_HEAD):
        usual = _usual_events_message(raw)
        if usual is not None:
            return usual
    try:
        d = loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(d, dict):
        raise ProtocolError(f"a message must be a JSON object, got {type(d).__name__}")
    t = d.get("type")
    if t == "hello":
        runs = []
        for i, r in enumerate(_list(_opt(d, "runs", list, [], "hello"), "hello.runs", MAX_ITEMS)):
            if not isinstance(r, dict):
                raise ProtocolError(f"hello.runs[{i}] is not an object")
            runs.append(HeldRun(_str(_req(r, "run_id", str, f"hello.runs[{i}]"), f"hello.runs[{i}].run_id"),
                                bool(r.get("running")),
                                _int(_opt(r, "last_seq", int, 0, f"hello.runs[{i}]"), f"hello.runs[{i}].last_seq")))
        devices = [_str(x, "hello.devices[]") for x in _list(_req(d, "devices", list, "hello"), "hello.devices",
                                                              MAX_SMALL_LIST)]
        labels = _labels(_opt(d, "labels", dict, {}, "hello"), "hello.labels")
        caps = [_str(x, "hello.capabilities[]") for x in _list(_opt(d, "capabilities", list, [], "hello"),
                                                               "hello.capabilities", MAX_SMALL_LIST)]
        instance = _opt(d, "instance", str, None, "hello")
        wanted = _opt(d, "run_id", str, None, "hello")
        cat_error = _opt(d, "catalog_error", str, None, "hello")
        agent_id = _opt(d, "agent_id", str, None, "hello")
        return Hello(_str(_req(d, "version", str, "hello"), "hello.version"),
                     _str(_req(d, "name", str, "hello"), "hello.name"), devices, labels,
                     _str(_opt(d, "machine_id", str, "", "hello"), "hello.machine_id"), runs,
                     bool(d.get("one_shot")), None if instance is None else _str(instance, "hello.instance"), caps,
                     None if wanted is None else _str(wanted, "hello.run_id"),
                     _catalog(d.get("catalog")), None if cat_error is None else _str(cat_error, "hello.catalog_error",
                                                                                      MAX_TEXT),
                     _fingerprint(d.get("fingerprint")), parse_memory_report(d.get("device_memory")),
                     None if agent_id is None else _str(agent_id, "hello.agent_id"),
                     _tls(d.get("tls"), "hello.tls"))
    if t == "events":
        evs = _list(_req(d, "events", list, "events"), "events.events", MAX_EVENTS)
        timed = _events(evs)
        run_id = _str(_req(d, "run_id", str, "events"), "events.run_id")
        return Events(run_id, evs, _texts_as_written(raw, run_id, evs) if timed and evs else None)
    if t == "heartbeat":
        running = [_str(r, "heartbeat.runs[]") for r in _list(_opt(d, "runs", list, [], "heartbeat"),
                                                              "heartbeat.runs", MAX_ITEMS)]
        labels = _opt(d, "labels", dict, None, "heartbeat")
        return Heartbeat(running, None if labels is None else _labels(labels, "heartbeat.labels"),
                         _tls(d.get("tls"), "heartbeat.tls"), _gpu(d.get("gpu"), "heartbeat.gpu"),
                         _serving(d.get("serving"), "heartbeat.serving"))
    if t == "outputs_answer":
        return _outputs_answer(d)
    if t == "raw_answer":
        return _raw_answer(d)
    if t == "log_answer":
        return _log_answer(d)
    if t == "app_answer":
        return _app_answer(d)
    if t == "plugin_push_answer":
        w = "plugin_push_answer"
        ok = _req(d, "ok", bool, w)
        return PluginPushAnswer(_str(_req(d, "request_id", str, w), f"{w}.request_id"),
                                _str(_req(d, "pack_id", str, w), f"{w}.pack_id", 128), bool(ok),
                                _str(_opt(d, "message", str, "", w), f"{w}.message", MAX_TEXT))
    if t == "probe_answer":
        nonce = _opt(d, "nonce", str, None, "probe_answer")
        cannot_read = _opt(d, "cannot_read", str, None, "probe_answer")
        raw_cw = _opt(d, "cannot_write", dict, {}, "probe_answer")
        if len(raw_cw) > MAX_SMALL_LIST:
            raise ProtocolError(f"probe_answer.cannot_write has {len(raw_cw)} items, over the limit of "
                                f"{MAX_SMALL_LIST}")
        cannot_write = {_str(k, "probe_answer.cannot_write key", MAX_LABEL_VALUE):
                        _str(v, "probe_answer.cannot_write value", MAX_TEXT) for k, v in raw_cw.items()}
        return ProbeAnswer(None if nonce is None else _str(nonce, "probe_answer.nonce"),
                           None if cannot_read is None else _str(cannot_read, "probe_answer.cannot_read", MAX_TEXT),
                           cannot_write)
    raise ProtocolError(f"unknown message type {str(t)[:64]!r}")


def _safe(obj: Any) -> Any:
    """A JSON-able copy without NaN/Infinity (sent as strings, as the run process does)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_safe(v) for v in obj]
    return obj


def event_text(ev: dict[str, Any]) -> str:
    """One event as strict JSON, as an ``events`` message carries it (and the agent's spool keeps it)."""
    try:
        return event_json_strict(ev)
    except (ValueError, TypeError):  # NaN, infinity or a key that is not a string: the rare event is walked
        return json.dumps(_safe(ev), default=str, allow_nan=False)


def encode_events(run_id: str, events: list[dict[str, Any]], limit: int = MAX_MESSAGE,
                  encoded: list[str] | None = None) -> list[str]:
    """``events`` messages for the agent to send, each within ``limit`` bytes and MAX_EVENTS events.

    Split by encoded size, in order. An event too big for any message on its own is
    replaced by a ``run_warning`` with the same src_seq saying so, so that the
    sequence stays gapless and the control plane can acknowledge past it.
    ``encoded``: each event's :func:`event_text` already made (the spool's lines), not made again."""
    head = len(json.dumps({"type": "events", "run_id": run_id, "events": []}))
    if encoded is not None and 0 < len(encoded) <= MAX_EVENTS:
        # The usual batch fits one message whole: sized at once (the loop below would measure each
        # event); the same message, since each event that fits with all the others fits alone.
        body = ",".join(encoded)
        if head + (len(body) if body.isascii() else len(body.encode())) + 1 <= limit:
            return [f'{{"type": "events", "run_id": {json.dumps(run_id)}, "events": [{body}]}}']
    out: list[str] = []
    batch: list[str] = []
    size = head
    for i, ev in enumerate(events):
        text = encoded[i] if encoded is not None else event_text(ev)
        # Its size in bytes: the length of the str, unless it holds something other than ASCII.
        if head + (len(text) if text.isascii() else len(text.encode())) + 1 > limit:
            text = json.dumps({"src_seq": ev.get("src_seq"), "kind": "run_warning", "at": ev.get("at"),
                               "data": {"kind": "event_too_large",
                                        "message": f"a {str(ev.get('kind'))[:64]} event of {len(text)} bytes was "
                                                   f"too large to send and was dropped"}})
        n = (len(text) if text.isascii() else len(text.encode())) + 1
        if batch and (size + n > limit or len(batch) >= MAX_EVENTS):
            out.append(_events_text(run_id, batch))
            batch, size = [], head
        batch.append(text)
        size += n
    if batch:
        out.append(_events_text(run_id, batch))
    return out


def _events_text(run_id: str, encoded: list[str]) -> str:
    """An events message around events already encoded (their size was counted as encoded)."""
    return f'{{"type": "events", "run_id": {json.dumps(run_id)}, "events": [{",".join(encoded)}]}}'


# -- control plane -> agent ------------------------------------------------------------
ACTIONS = ("continue", "stop", "drop")
MAX_TEXT = 64 * 1024  # an error's or refusal's message


@dataclass(frozen=True)
class RunAnswer:
    """The welcome's word on one run the agent said it holds: ``acked`` is the last
    event the control plane has; ``action`` ``continue`` (replay what follows),
    ``stop`` (it ended here: stop it now) or ``drop`` (not this worker's: forget it)."""

    acked: int
    action: str

    def to_dict(self) -> dict[str, Any]:
        return {"acked": self.acked, "action": self.action}


@dataclass(frozen=True)
class Welcome:
    version: str
    worker: str
    heartbeat_s: float
    resume_grace_s: float
    runs: dict[str, RunAnswer] = field(default_factory=dict)
    type: ClassVar[str] = "welcome"

    def to_json(self) -> str:
        return json.dumps({"type": self.type, "version": self.version, "worker": self.worker,
                           "heartbeat_s": self.heartbeat_s, "resume_grace_s": self.resume_grace_s,
                           "runs": {k: v.to_dict() for k, v in self.runs.items()}})


class _Flat:
    """A message whose fields are plain JSON values: ``{"type", <fields in order>}``."""

    type: ClassVar[str]

    def to_json(self) -> str:
        return json.dumps({"type": self.type, **asdict(self)})  # type: ignore[call-overload]


@dataclass(frozen=True)
class Probe(_Flat):
    """Before the welcome: read ``nonce_file``, try to write in each of ``folders`` (cdui/wire/same_machine.py)."""
    nonce_file: str
    folders: list[str]
    type: ClassVar[str] = "probe"


@dataclass(frozen=True)
class ProbeAnswer(_Flat):
    """What the agent found: the nonce it read (None: it could not, ``cannot_read`` says why) and, per
    folder it could not create a file in, the reason."""
    nonce: str | None
    cannot_read: str | None
    cannot_write: dict[str, str]
    type: ClassVar[str] = "probe_answer"


@dataclass(frozen=True)
class Refused(_Flat):
    code: str
    message: str
    # With code version_mismatch: the owner let this worker follow `cdui update` (the Workers panel), so an
    # agent that did not refuse updates itself (CODEFYUI_AGENT_AUTO_UPDATE=0) fetches the update. Older agents
    # read no such field: they stay refused, as before.
    update: bool = False
    type: ClassVar[str] = "refused"

    def to_json(self) -> str:
        d: dict[str, Any] = {"type": self.type, "code": self.code, "message": self.message}
        if self.update:
            d["update"] = True  # absent otherwise: the message is the one every agent version knows
        return json.dumps(d)


@dataclass(frozen=True)
class Assign:
    run_id: str
    job: Job
    type: ClassVar[str] = "assign"

    def to_json(self) -> str:
        return json.dumps({"type": self.type, "run_id": self.run_id, "job": self.job.to_dict()}, allow_nan=False)


@dataclass(frozen=True)
class S3CredentialsMessage:
    """Fresh bucket credentials for a running s3 run (renewal, or after a reconnect). Like the
    assignment's, they are secrets: left out of ``repr``, never logged."""

    run_id: str
    credentials: dict[str, Any] = field(repr=False)
    type: ClassVar[str] = "s3_credentials"

    def to_json(self) -> str:
        return json.dumps({"type": self.type, "run_id": self.run_id, "credentials": self.credentials},
                          allow_nan=False)


@dataclass(frozen=True)
class Ack(_Flat):
    run_id: str
    acked: int
    type: ClassVar[str] = "ack"


@dataclass(frozen=True)
class Stop(_Flat):
    run_id: str
    type: ClassVar[str] = "stop"


@dataclass(frozen=True)
class Revoked(_Flat):
    message: str
    type: ClassVar[str] = "revoked"


@dataclass(frozen=True)
class Error(_Flat):
    message: str
    type: ClassVar[str] = "error"


@dataclass(frozen=True)
class OutputsRequest(_Flat):
    request_id: str
    run_id: str
    node_id: str | None
    type: ClassVar[str] = "outputs_request"


@dataclass(frozen=True)
class OutputsAnswer(_Flat):
    """A worker's answer: the recorded nodes (``node_id`` None) or one node's summary, or an error.
    ``nodes`` and ``summary`` are rebuilt field by field by :mod:`cdui.wire.node_outputs` when parsed."""

    request_id: str
    run_id: str
    node_id: str | None
    nodes: list[dict[str, str]] | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None
    type: ClassVar[str] = "outputs_answer"


def _outputs_answer(d: dict[str, Any]) -> OutputsAnswer:
    w = "outputs_answer"
    node_id = _opt(d, "node_id", str, None, w)
    node_id = None if node_id is None else _str(node_id, f"{w}.node_id", node_outputs.MAX_NODE_ID)
    error = _opt(d, "error", str, None, w)
    try:
        nodes = None if d.get("nodes") is None else node_outputs.clean_nodes(d["nodes"])
        summary = None if d.get("summary") is None or node_id is None else node_outputs.clean_summary(d["summary"],
                                                                                                  node_id)
    except ValueError as exc:
        raise ProtocolError(f"{w}: {exc}") from None
    return OutputsAnswer(_str(_req(d, "request_id", str, w), f"{w}.request_id"),
                         _str(_req(d, "run_id", str, w), f"{w}.run_id"), node_id, nodes, summary,
                         None if error is None else _str(error, f"{w}.error", MAX_TEXT))


# A recorded raw tensor file travels from a worker in chunks of this many bytes, each asked for on its
# own, so one large file never holds the connection's other messages for longer than one chunk.
RAW_CHUNK_BYTES = 1024 * 1024
MAX_RAW_DATA = 4 * ((RAW_CHUNK_BYTES + 2) // 3)  # one chunk's base64 text
RAW_CODES = ("not_kept", "too_large", "bad_chunk", "failed")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class RawRequest(_Flat):
    """Chunk ``chunk`` (from 0) of a recorded output's raw tensor file: the worker finds the file from
    the run id, node id and port itself (cdui.run.outputs.find_raw), never from a path."""

    request_id: str
    run_id: str
    node_id: str
    port: str
    chunk: int
    type: ClassVar[str] = "raw_request"


@dataclass(frozen=True)
class RawAnswer(_Flat):
    """One chunk of the file (``data``: base64 of at most RAW_CHUNK_BYTES bytes), with the whole file's
    ``size``, and for chunk 0 its ``sha256``; or ``error`` with its ``code`` (one of RAW_CODES)."""

    request_id: str
    chunk: int
    size: int = 0
    sha256: str = ""
    data: str = ""
    error: str | None = None
    code: str | None = None
    type: ClassVar[str] = "raw_answer"


def _raw_answer(d: dict[str, Any]) -> RawAnswer:
    w = "raw_answer"
    data = _opt(d, "data", str, "", w)
    if len(data) > MAX_RAW_DATA:
        raise ProtocolError(f"{w}.data has {len(data)} characters, over the {MAX_RAW_DATA} of one chunk")
    sha = _opt(d, "sha256", str, "", w)
    if sha and not _SHA256.fullmatch(sha):
        raise ProtocolError(f"{w}.sha256={sha[:80]!r} is not 64 lowercase hex digits")
    error = _opt(d, "error", str, None, w)
    code = _opt(d, "code", str, None, w)
    if (error is None) != (code is None) or (code is not None and code not in RAW_CODES):
        raise ProtocolError(f"{w}: an error needs a code, one of {', '.join(RAW_CODES)} (got {str(code)[:40]!r})")
    return RawAnswer(_str(_req(d, "request_id", str, w), f"{w}.request_id"),
                     _int(_req(d, "chunk", int, w), f"{w}.chunk"), _int(_opt(d, "size", int, 0, w), f"{w}.size"),
                     sha, data, None if error is None else _str(error, f"{w}.error", MAX_TEXT), code)


# A worker's log read over its connection (`cdui logs --worker`): the agent keeps its newest log lines in
# memory (cdui.core.logfile.LogRing) and sends at most this many lines, each cut to LOG_LINE_CHARS, and
# LOG_ANSWER_CHARS in all; the control plane never opens a file for it, and refuses a bigger answer.
LOG_MAX_LINES = 1000
LOG_LINE_CHARS = 4096
LOG_ANSWER_CHARS = 256 * 1024


@dataclass(frozen=True)
class LogRequest(_Flat):
    request_id: str
    after: int
    lines: int
    type: ClassVar[str] = "log_request"


@dataclass(frozen=True)
class LogAnswer(_Flat):
    """Lines numbered ``last - len(lines) + 1`` to ``last``; ``first``: the oldest number the agent still holds
    (lines before it were dropped from its memory)."""

    request_id: str
    lines: list[str]
    first: int
    last: int
    type: ClassVar[str] = "log_answer"


def _log_answer(d: dict[str, Any]) -> LogAnswer:
    w = "log_answer"
    lines = [_str(x, f"{w}.lines[]", LOG_LINE_CHARS) for x in _list(_req(d, "lines", list, w), f"{w}.lines",
                                                                   LOG_MAX_LINES)]
    if sum(len(x) for x in lines) > LOG_ANSWER_CHARS:
        raise ProtocolError(f"{w}.lines hold more than {LOG_ANSWER_CHARS} characters")
    return LogAnswer(_str(_req(d, "request_id", str, w), f"{w}.request_id"), lines,
                     _int(_req(d, "first", int, w), f"{w}.first"), _int(_req(d, "last", int, w), f"{w}.last"))



@dataclass(frozen=True)
class PluginPush(_Flat):
    """A plugin pack for the agent to install: ``data`` is the base64 of a .tar.gz of the pack's folder, whose
    files must hash to ``tree_sha256`` once unpacked; ``pin`` is the control plane's lockfile sha256 for it."""
    request_id: str
    pack_id: str
    version: str
    pin: str
    tree_sha256: str
    data: str
    type: ClassVar[str] = "plugin_push"


@dataclass(frozen=True)
class PluginPushAnswer(_Flat):
    request_id: str
    pack_id: str
    ok: bool
    message: str
    type: ClassVar[str] = "plugin_push_answer"


# A pushed pack's base64 text: what fits in one message beside its other fields.
MAX_PUSH_DATA = MAX_MESSAGE - 64 * 1024

# -- published apps served by a worker (docs/apps.md; the agent's side is cdui/agent/app_serving.py) -----
# The worker keeps one warm process per app version it serves; the control plane sends each invoke as the
# caller's inputs, with the version's job (its graph, its files) only until the worker has prepared it, and
# waits for its answer by request id. A worker that has not prepared the version answers app_not_prepared
# (it restarted its serving state, or retired the version meanwhile): the invoke is sent again with the job.
APP_ERROR_CODES = ("app_process_lost", "timeout", "app_prepare_failed", "app_failed", "app_not_prepared")
MAX_APP_OUTPUTS = 256  # GraphOutput values in one answer
MAX_APP_TIMEOUT_S = 3600.0
_APP_SLUG = re.compile(r"[a-z][a-z0-9-]{0,63}")


@dataclass(frozen=True)
class AppInvoke:
    """Run app ``slug`` version ``version`` with ``inputs`` (the callers' values by GraphInput node id) on its warm
    process on ``device`` (started if there is none); stop it past ``timeout_s``. ``job``: the version's job
    (its graph without the callers' values; its files name the version's weights, fetched once by sha256),
    sent until the worker has prepared the version, None after."""

    request_id: str
    slug: str
    version: int
    device: str
    inputs: dict[str, Any]
    timeout_s: float
    job: Job | None = None
    type: ClassVar[str] = "app_invoke"

    def to_json(self) -> str:
        return json.dumps({"type": self.type, "request_id": self.request_id, "slug": self.slug,
                           "version": self.version, "device": self.device, "timeout_s": self.timeout_s,
                           "inputs": self.inputs, "job": None if self.job is None else self.job.to_dict()},
                          allow_nan=False)


@dataclass(frozen=True)
class AppRetire(_Flat):
    """Every serving process of ``slug`` but version ``keep``'s (None: all) ends once its invokes answered."""

    slug: str
    keep: int | None
    type: ClassVar[str] = "app_retire"


@dataclass(frozen=True)
class AppReleaseIdle(_Flat):
    """Runs wait for slots of ``devices``: end every serving process on one of them that has been idle ``idle_s``
    (the next invoke starts one)."""

    idle_s: float
    devices: list[str]
    type: ClassVar[str] = "app_release_idle"


@dataclass(frozen=True)
class AppAnswer(_Flat):
    """The end of one invoke: the run's ``result`` ({status, error, node_id}), the values its GraphOutputs
    gave and the first GraphOutput error; or ``error`` ({code, message, hint, details}, the code one of
    APP_ERROR_CODES) where the invoke did not run to a result."""

    request_id: str
    result: dict[str, Any] | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    output_error: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    type: ClassVar[str] = "app_answer"

    def to_json(self) -> str:
        # Its fields as they are (asdict would copy the outputs, a model's whole answer, value by value first).
        return json.dumps({"type": self.type, "request_id": self.request_id, "result": self.result,
                           "outputs": self.outputs, "output_error": self.output_error, "error": self.error})


def _app_invoke(d: dict[str, Any]) -> AppInvoke:
    w = "app_invoke"
    slug = _str(_req(d, "slug", str, w), f"{w}.slug", 64)
    if not _APP_SLUG.fullmatch(slug):
        raise ProtocolError(f"{w}.slug={slug!r} is not an app slug")
    try:
        job = None if d.get("job") is None else Job.from_dict(_req(d, "job", dict, w))
    except JobError as exc:
        raise ProtocolError(f"{w}: {exc}") from None
    inputs = _req(d, "inputs", dict, w)
    for k in inputs:
        _str(k, f"{w}.inputs key")
    return AppInvoke(_str(_req(d, "request_id", str, w), f"{w}.request_id"), slug,
                     _int(_req(d, "version", int, w), f"{w}.version", 1),
                     _str(_req(d, "device", str, w), f"{w}.device"), inputs,
                     _number(d, "timeout_s", w, 0.001, MAX_APP_TIMEOUT_S), job)


def _small_object(v: Any, where: str, keys: dict[str, type | tuple[type, ...]]) -> dict[str, Any]:
    """An object of the given keys only (others dropped), each of its type or null, strings bounded."""
    if not isinstance(v, dict):
        raise ProtocolError(f"{where} must be an object, got {type(v).__name__}")
    out: dict[str, Any] = {}
    for k, typ in keys.items():
        x = v.get(k)
        if x is None:
            out[k] = None
        elif not isinstance(x, typ) or isinstance(x, bool) and typ is not bool:
            raise ProtocolError(f"{where}.{k} has type {type(x).__name__}")
        elif isinstance(x, str):
            out[k] = _str(x, f"{where}.{k}", MAX_TEXT)
        else:
            _check_depth(x, f"{where}.{k}")
            out[k] = x
    return out


def _app_answer(d: dict[str, Any]) -> AppAnswer:
    w = "app_answer"
    result = None if d.get("result") is None else _small_object(
        d["result"], f"{w}.result", {"status": str, "error": str, "node_id": str})
    if result is not None and (result["status"] is None or len(result["status"]) > MAX_NAME):
        raise ProtocolError(f"{w}.result.status must be a run status")
    outputs = _opt(d, "outputs", dict, {}, w)
    if len(outputs) > MAX_APP_OUTPUTS:
        raise ProtocolError(f"{w}.outputs has {len(outputs)} values, over the limit of {MAX_APP_OUTPUTS}")
    for k in outputs:
        _str(k, f"{w}.outputs key")
    _check_depth(outputs, f"{w}.outputs")
    output_error = None if d.get("output_error") is None else _small_object(
        d["output_error"], f"{w}.output_error", {"code": str, "message": str, "node_id": str, "details": dict})
    error = None if d.get("error") is None else _small_object(
        d["error"], f"{w}.error", {"code": str, "message": str, "hint": str, "details": dict})
    if error is not None and error["code"] not in APP_ERROR_CODES:
        raise ProtocolError(f"{w}.error.code={str(error['code'])[:40]!r} is not one of {', '.join(APP_ERROR_CODES)}")
    if (result is None) == (error is None):
        raise ProtocolError(f"{w}: give exactly one of result and error")
    return AppAnswer(_str(_req(d, "request_id", str, w), f"{w}.request_id"), result, outputs, output_error, error)


ServerMessage = (Welcome | Refused | Assign | Ack | Stop | Revoked | Error | S3CredentialsMessage | OutputsRequest
                 | Probe | RawRequest | LogRequest | PluginPush | AppInvoke | AppRetire | AppReleaseIdle)
AgentMessage = (Hello | Events | Heartbeat | OutputsAnswer | ProbeAnswer | RawAnswer | LogAnswer | PluginPushAnswer
                | AppAnswer)


def _number(d: dict[str, Any], key: str, where: str, low: float, high: float) -> float:
    v = _req(d, key, (int, float), where)
    if isinstance(v, bool) or not low <= v <= high:
        raise ProtocolError(f"{where}: {key}={v!r} is out of range ({low}..{high})")
    return float(v)


def parse_server_message(raw: str | bytes) -> ServerMessage:
    """The control plane's message, checked once at the agent's edge.

    The control plane is trusted more than a worker, but a proxy, a wrong URL or
    a control plane of another version can still send what does not fit: the
    text of the error says what, so the agent can log it and go on."""
    if len(raw) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(raw)} bytes is over the {MAX_MESSAGE} byte limit")
    try:
        d = loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(d, dict):
        raise ProtocolError(f"a message must be a JSON object, got {type(d).__name__}")
    t = d.get("type")
    if t == "welcome":
        runs: dict[str, RunAnswer] = {}
        raw_runs = _opt(d, "runs", dict, {}, "welcome")
        if len(raw_runs) > MAX_ITEMS:
            raise ProtocolError(f"welcome.runs has {len(raw_runs)} items, over the limit of {MAX_ITEMS}")
        for run_id, a in raw_runs.items():
            where = f"welcome.runs[{run_id[:40]!r}]"
            _str(run_id, f"{where} key")
            if not isinstance(a, dict):
                raise ProtocolError(f"{where} is not an object")
            action = _str(_req(a, "action", str, where), f"{where}.action")
            if action not in ACTIONS:
                raise ProtocolError(f"{where}.action={action!r} is not one of {', '.join(ACTIONS)}")
            runs[run_id] = RunAnswer(_int(_opt(a, "acked", int, 0, where), f"{where}.acked"), action)
        return Welcome(_str(_req(d, "version", str, "welcome"), "welcome.version"),
                       _str(_req(d, "worker", str, "welcome"), "welcome.worker"),
                       _number(d, "heartbeat_s", "welcome", 0.01, 86400.0),
                       _number(d, "resume_grace_s", "welcome", 0.0, 30 * 86400.0), runs)
    if t == "refused":
        return Refused(_str(_req(d, "code", str, "refused"), "refused.code"),
                       _str(_opt(d, "message", str, "", "refused"), "refused.message", MAX_TEXT),
                       bool(_opt(d, "update", bool, False, "refused")))
    if t == "assign":
        run_id = _str(_req(d, "run_id", str, "assign"), "assign.run_id")
        try:
            job = Job.from_dict(_req(d, "job", dict, "assign"))
        except JobError as exc:
            raise ProtocolError(f"assign: {exc}") from None
        if job.run_id != run_id:
            raise ProtocolError(f"assign: the job is for run {job.run_id[:64]!r}, the message for {run_id!r}")
        return Assign(run_id, job)
    if t == "s3_credentials":
        run_id = _str(_req(d, "run_id", str, "s3_credentials"), "s3_credentials.run_id")
        creds = _req(d, "credentials", dict, "s3_credentials")
        try:
            S3Credentials.from_dict(creds)
        except ValueError as exc:
            raise ProtocolError(f"s3_credentials: {exc}") from None
        return S3CredentialsMessage(run_id, creds)
    if t == "ack":
        return Ack(_str(_req(d, "run_id", str, "ack"), "ack.run_id"), _int(_req(d, "acked", int, "ack"), "ack.acked"))
    if t == "stop":
        return Stop(_str(_req(d, "run_id", str, "stop"), "stop.run_id"))
    if t == "revoked":
        return Revoked(_str(_opt(d, "message", str, "the credential was revoked", "revoked"), "revoked.message",
                            MAX_TEXT))
    if t == "error":
        return Error(_str(_opt(d, "message", str, "", "error"), "error.message", MAX_TEXT))
    if t == "probe":
        folders = [_str(x, "probe.folders[]", MAX_LABEL_VALUE)
                   for x in _list(_req(d, "folders", list, "probe"), "probe.folders", MAX_SMALL_LIST)]
        return Probe(_str(_req(d, "nonce_file", str, "probe"), "probe.nonce_file", MAX_LABEL_VALUE), folders)
    if t == "outputs_request":
        node = _opt(d, "node_id", str, None, "outputs_request")
        return OutputsRequest(_str(_req(d, "request_id", str, "outputs_request"), "outputs_request.request_id"),
                              _str(_req(d, "run_id", str, "outputs_request"), "outputs_request.run_id"),
                              None if node is None else _str(node, "outputs_request.node_id", 256))
    if t == "raw_request":
        w = "raw_request"
        return RawRequest(_str(_req(d, "request_id", str, w), f"{w}.request_id"),
                          _str(_req(d, "run_id", str, w), f"{w}.run_id"),
                          _str(_req(d, "node_id", str, w), f"{w}.node_id", 256),
                          _str(_req(d, "port", str, w), f"{w}.port", 128),
                          _int(_req(d, "chunk", int, w), f"{w}.chunk", 0, 1 << 20))
    if t == "log_request":
        w = "log_request"
        return LogRequest(_str(_req(d, "request_id", str, w), f"{w}.request_id"),
                          _int(_req(d, "after", int, w), f"{w}.after"),
                          _int(_req(d, "lines", int, w), f"{w}.lines", 1, LOG_MAX_LINES))
    if t == "plugin_push":
        w = "plugin_push"
        pin, tree = _str(_req(d, "pin", str, w), f"{w}.pin", 64), _str(_req(d, "tree_sha256", str, w), f"{w}.tree", 64)
        if not (_SHA256.fullmatch(pin) and _SHA256.fullmatch(tree)):
            raise ProtocolError(f"{w}: pin and tree_sha256 must be sha256 hex digests")
        return PluginPush(_str(_req(d, "request_id", str, w), f"{w}.request_id"),
                          _str(_req(d, "pack_id", str, w), f"{w}.pack_id", 128),
                          _str(_opt(d, "version", str, "", w), f"{w}.version", 128), pin, tree,
                          _str(_req(d, "data", str, w), f"{w}.data", MAX_PUSH_DATA))
    if t == "app_invoke":
        return _app_invoke(d)
    if t == "app_release_idle":
        w = "app_release_idle"
        return AppReleaseIdle(_number(d, "idle_s", w, 0.0, 86400.0),
                              [_str(x, f"{w}.devices[]") for x in _list(_req(d, "devices", list, w), f"{w}.devices",
                                                                        MAX_SMALL_LIST)])
    if t == "app_retire":
        keep = d.get("keep")
        return AppRetire(_str(_req(d, "slug", str, "app_retire"), "app_retire.slug", 64),
                         None if keep is None else _int(keep, "app_retire.keep", 1))
    raise ProtocolError(f"unknown message type {str(t)[:64]!r}")


def hello(version: str, name: str, devices: list[str], labels: dict[str, str], machine_id: str,
          runs: list[dict[str, Any]], one_shot: bool = False, instance: str | None = None) -> dict[str, Any]:
    """A hello as a plain object, for tests and tools that write raw frames
    (some of them on purpose not quite right); the agent sends :class:`Hello`."""
    held = [HeldRun(r["run_id"], bool(r.get("running")), int(r.get("last_seq", 0))) for r in runs]
    obj: dict[str, Any] = json.loads(Hello(version, name, devices, labels, machine_id, held, one_shot,
                                           instance).to_json())
    return obj
