"""Every message of ``/ws/worker``, as a typed shape with its validation.

JSON text frames, one object each, with a ``type`` field. The agent's first
message is ``hello``, and its first field is ``version``: the control plane
reads the version before anything else so that a future agent with other
fields still gets a readable refusal.

agent -> control plane
  hello      {version, name, devices, labels, machine_id, runs: [{run_id, running, last_seq}],
              one_shot, instance, capabilities}
  events     {run_id, events: [{src_seq, kind, data, at}]}   (in src_seq order)
  heartbeat  {runs: [run ids still running], labels}
control plane -> agent
  welcome    {version, worker, heartbeat_s, resume_grace_s, runs: {run_id: {acked, action}}}
             action: "continue" (replay after ``acked``), "stop" (stop it now: it ended here)
  refused    {code, message}  then close. Codes: version_mismatch, revoked, unknown_credential,
             name_in_use, bad_hello
  assign     {run_id, job}
  ack        {run_id, acked}
  stop       {run_id}
  revoked    {message}  (the worker was removed or its credential superseded; exit 2)
  error      {message}  (a malformed message; the connection stays up)
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_MESSAGE = 64 * 1024 * 1024


class ProtocolError(ValueError):
    """A message that does not fit its shape; the text says what and where."""


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


@dataclass
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


@dataclass
class Events:
    run_id: str
    events: list[dict[str, Any]]


@dataclass
class Heartbeat:
    runs: list[str]
    labels: dict[str, str] | None = None


def peek_version(raw: str) -> str | None:
    """The version of a hello, read before (and without) the rest of the message."""
    try:
        d = json.loads(raw)
    except ValueError:
        return None
    if isinstance(d, dict) and isinstance(d.get("version"), str):
        return d["version"]
    return None


def parse_agent_message(raw: str) -> Hello | Events | Heartbeat:
    if len(raw) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(raw)} bytes is over the {MAX_MESSAGE} byte limit")
    try:
        d = json.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(d, dict):
        raise ProtocolError(f"a message must be a JSON object, got {type(d).__name__}")
    t = d.get("type")
    if t == "hello":
        runs = []
        for i, r in enumerate(_opt(d, "runs", list, [], "hello")):
            if not isinstance(r, dict):
                raise ProtocolError(f"hello.runs[{i}] is not an object")
            runs.append(HeldRun(_req(r, "run_id", str, f"hello.runs[{i}]"), bool(r.get("running")),
                                int(_opt(r, "last_seq", int, 0, f"hello.runs[{i}]"))))
        devices = _req(d, "devices", list, "hello")
        if not all(isinstance(x, str) for x in devices):
            raise ProtocolError("hello: devices must be strings")
        labels = _opt(d, "labels", dict, {}, "hello")
        return Hello(_req(d, "version", str, "hello"), _req(d, "name", str, "hello"), devices,
                     {str(k): str(v) for k, v in labels.items()}, _opt(d, "machine_id", str, "", "hello"), runs,
                     bool(d.get("one_shot")), _opt(d, "instance", str, None, "hello"),
                     [str(x) for x in _opt(d, "capabilities", list, [], "hello")])
    if t == "events":
        evs = _req(d, "events", list, "events")
        for i, e in enumerate(evs):
            if not isinstance(e, dict):
                raise ProtocolError(f"events[{i}] is not an object")
            _req(e, "src_seq", int, f"events[{i}]")
            _req(e, "kind", str, f"events[{i}]")
            if not isinstance(e.get("data", {}), dict):
                raise ProtocolError(f"events[{i}].data is not an object")
        return Events(_req(d, "run_id", str, "events"), evs)
    if t == "heartbeat":
        runs = _opt(d, "runs", list, [], "heartbeat")
        labels = _opt(d, "labels", dict, None, "heartbeat")
        return Heartbeat([str(r) for r in runs], labels)
    raise ProtocolError(f"unknown message type {t!r}")


# -- control plane -> agent (built here so both sides agree) -------------------------
def welcome(version: str, worker: str, heartbeat_s: float, grace_s: float,
            runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"type": "welcome", "version": version, "worker": worker, "heartbeat_s": heartbeat_s,
            "resume_grace_s": grace_s, "runs": runs}


def refused(code: str, message: str) -> dict[str, Any]:
    return {"type": "refused", "code": code, "message": message}


def assign(run_id: str, job: dict[str, Any]) -> dict[str, Any]:
    return {"type": "assign", "run_id": run_id, "job": job}


def ack(run_id: str, acked: int) -> dict[str, Any]:
    return {"type": "ack", "run_id": run_id, "acked": acked}


def stop(run_id: str) -> dict[str, Any]:
    return {"type": "stop", "run_id": run_id}


def revoked(message: str) -> dict[str, Any]:
    return {"type": "revoked", "message": message}


def error(message: str) -> dict[str, Any]:
    return {"type": "error", "message": message}


def hello(version: str, name: str, devices: list[str], labels: dict[str, str], machine_id: str,
          runs: list[dict[str, Any]], one_shot: bool = False, instance: str | None = None) -> dict[str, Any]:
    # version first: the control plane reads it before anything else (SYNC-06).
    return {"version": version, "type": "hello", "name": name, "devices": devices, "labels": labels,
            "machine_id": machine_id, "runs": runs, "one_shot": one_shot, "instance": instance,
            "capabilities": []}
