"""Where an invoke of a published app runs (docs/apps.md): a pure decision from the app's ``serve_on``, the
device asked for, the machines connected now and where the version is already warm.

``serve_on`` is ``local`` (this server), a worker's name, or ``any`` (a connected worker, the one already
warm for the version first, else the first by name; the control plane itself when no connected worker has
the device). A device (``cpu``, ``cuda:0``, ``cuda``) narrows the machine's devices; without
one a card is preferred to the cpu.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from cdui.wire.devicesets import device_matches

LOCAL = "local"
ANY = "any"
WORKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")  # as enrollment names workers


@dataclass(frozen=True)
class Serve:
    executor: str  # LOCAL or a worker's name
    device: str


@dataclass(frozen=True)
class Refuse:
    code: str
    message: str
    hint: str
    status: int


def check_serve_on(value: object) -> str | None:
    """What is wrong with ``value`` as a ``serve_on``, or None when it is one."""
    if not isinstance(value, str) or not (value in (LOCAL, ANY) or WORKER_NAME.match(value)):
        return (f"serve_on={str(value)[:80]!r} is not where an app can be served: give \"local\" (this server), "
                "\"any\" (a connected worker, else this server) or a worker's name")
    return None


def _fits(devices: list[str], wanted: str | None) -> list[str]:
    fits = [d for d in devices if device_matches(wanted, d)]
    if wanted in (None, "", "auto"):
        fits.sort(key=lambda d: (d == "cpu", d))
    return fits


def place_app(serve_on: str, wanted: str | None, local_devices: list[str], workers: dict[str, list[str]],
              warm: dict[str, int]) -> Serve | Refuse:
    """``workers``: each connected worker that may serve apps, with its devices; ``warm``: per machine
    (LOCAL or a worker's name), how many serving processes of this app version it holds."""
    if serve_on == ANY:
        # A worker already warm for the version first (its model is loaded), then by name: steady placement.
        order = sorted(workers, key=lambda w: (not warm.get(w), w))
        for w in order:
            fits = _fits(workers[w], wanted)
            if fits:
                return Serve(w, fits[0])
        fits = _fits(local_devices, wanted)
        if fits:
            return Serve(LOCAL, fits[0])
        return Refuse("bad_device", f"no connected worker nor this server has a device {wanted!r}",
                      "leave device out, or name a device a worker offers (cdui workers lists them)", 400)
    if serve_on == LOCAL:
        fits = _fits(local_devices, wanted)
        if fits:
            return Serve(LOCAL, fits[0])
        return Refuse("bad_device", f"device {wanted!r} is not one of the control plane's: {', '.join(local_devices)}",
                      "leave device out, or name one of those", 400)
    devices = workers.get(serve_on)
    if devices is None:
        return Refuse("app_worker_offline", f"the app is served on worker {serve_on!r}, which is not connected",
                      f"start the agent of worker {serve_on}, or serve the app elsewhere: "
                      "PATCH /api/apps/{slug} {\"serve_on\": \"local\"}", 503)
    fits = _fits(devices, wanted)
    if fits:
        return Serve(serve_on, fits[0])
    return Refuse("bad_device", f"device {wanted!r} is not one of worker {serve_on}'s: {', '.join(devices)}",
                  "leave device out, or name one of those", 400)
