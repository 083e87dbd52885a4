"""``cdui run --device D`` and ``cdui runs clone --device D``: refused before anything is queued when no
machine the target may use offers D, with the list of what exists.

The API itself accepts such a run (it waits until a machine with that device connects, which is what a
lab about to enroll its GPU box wants); the command line refuses it because a mistyped or hopeful
``--device cuda`` on a CPU-only setup would otherwise wait for ever with no one noticing.
``--queue-anyway`` queues it all the same.
"""
from __future__ import annotations

from typing import Any

from cdui.core.errors import CduiError
from cdui.wire.devicesets import device_kind, device_matches
from cdui.wire.runopts import DEVICE_NAME
from cdui.wire.target import AnyWorker, Local, Worker, parse_target

QUEUE_ANYWAY = "--queue-anyway"


def _offers(devices: list[str], wanted: str) -> bool:
    return any(device_matches(wanted, d) for d in devices)


def _names(devices: list[str]) -> str:
    return ", ".join(devices) if devices else "no devices reported"


def check_device_offered(client: Any, target: Any, device: str | None, devices: int | None = None) -> None:
    """Raise :class:`CduiError` (``device_not_offered``) when ``device`` is offered by no machine ``target``
    (its JSON form, as the submit sends it) may run on. Says nothing when it cannot tell: no device or
    ``auto``, a name the control plane refuses in its own words, the one-shot pool (its machines are not
    known until one connects), a worker that is not enrolled, a control plane that does not list its
    own devices, or a device set (``devices`` above 1: the control plane refuses one no machine can hold)."""
    if (devices or 1) > 1 or not device or device_kind(device) == "auto" or not DEVICE_NAME.match(device):
        return
    try:
        parsed = parse_target(target if target is not None else "local")
    except CduiError:
        return  # the control plane refuses it with its own message
    listing = client.call("GET", "/api/workers")
    local = listing.get("local") if isinstance(listing, dict) else None
    if not isinstance(local, dict) or not isinstance(local.get("devices"), list):
        return  # an older control plane: it does not say what it has
    here = [str(d) for d in local["devices"]]
    workers: dict[str, tuple[str, list[str]]] = {}
    for w in listing.get("workers") or []:
        if isinstance(w, dict) and isinstance(w.get("name"), str):
            devs = [str(d.get("device")) for d in w.get("devices") or [] if isinstance(d, dict)]
            workers[w["name"]] = (str(w.get("status", "?")), devs)
    match parsed:
        case Local():
            may = ["local"]
        case AnyWorker():
            may = ["local", *workers]
        case Worker(name=name):
            if name not in workers:
                return  # unknown (or an instance NAME.ID): the control plane answers that
            may = [name]
        case _:
            return  # the one-shot pool
    offered = {"local": here, **{n: devs for n, (_, devs) in workers.items()}}
    if any(_offers(offered[n], device) for n in may):
        return
    elsewhere = [n for n in offered if n not in may and _offers(offered[n], device)]
    lines = [f"  this server (local): {_names(here)}"]
    lines += [f"  worker {n} ({status}): {_names(devs)}" for n, (status, devs) in sorted(workers.items())]
    if not workers:
        lines.append("  no workers are enrolled")
    todo = []
    if elsewhere:
        todo.append(f"target one that has it (--target {elsewhere[0]}" +
                    (" or --target any" if "local" not in elsewhere else "") + ")")
    else:
        todo.append("enroll a machine that has it (`cdui workers token` prints the agent command)")
    todo.append(f"choose a device that exists (--device {here[0].split(':')[0] if here else 'cpu'}, or leave "
                f"--device out for any free device)")
    todo.append(f"or queue it anyway, to wait until such a machine connects ({QUEUE_ANYWAY})")
    label = ("local (this server)" if isinstance(parsed, Local) else
             "any (this server and every enrolled worker)" if isinstance(parsed, AnyWorker) else f"worker {may[0]}")
    raise CduiError("device_not_offered",
                    f"no machine the target {label} may use offers a {device} device, so the run would wait "
                    "for ever; nothing was queued\nwhat exists:\n" + "\n".join(lines) + "\nwhat to do: " +
                    "; ".join(todo))
