"""Where an app's invoke runs (cdui/plane/sched/app_placement.py): a pure decision, tested as a table."""
from __future__ import annotations

import pytest

from cdui.plane.sched.app_placement import Refuse, Serve, check_serve_on, place_app

LOCAL_DEVICES = ["cpu", "cuda:0"]
WORKERS = {"w2": ["cpu"], "gpu1": ["cpu", "cuda:0", "cuda:1"]}

CASES = [
    # serve_on, device, workers, warm -> decision
    ("local", None, WORKERS, {}, Serve("local", "cuda:0")),  # a card before the cpu
    ("local", "cpu", WORKERS, {}, Serve("local", "cpu")),
    ("local", "cuda:3", WORKERS, {}, Refuse("bad_device", "", "", 400)),
    ("w2", None, WORKERS, {}, Serve("w2", "cpu")),
    ("gpu1", "cuda:1", WORKERS, {}, Serve("gpu1", "cuda:1")),
    ("gpu1", "cuda", WORKERS, {}, Serve("gpu1", "cuda:0")),
    ("w2", "cuda:0", WORKERS, {}, Refuse("bad_device", "", "", 400)),
    ("w9", None, WORKERS, {}, Refuse("app_worker_offline", "", "", 503)),
    ("any", None, WORKERS, {}, Serve("gpu1", "cuda:0")),  # by name when none is warm
    ("any", None, WORKERS, {"w2": 1}, Serve("w2", "cpu")),  # the warm one first
    ("any", "cuda:1", WORKERS, {"w2": 1}, Serve("gpu1", "cuda:1")),  # unless it lacks the device
    ("any", None, {}, {}, Serve("local", "cuda:0")),  # no worker: this server
    ("any", "tpu", {}, {}, Refuse("bad_device", "", "", 400)),
]


@pytest.mark.parametrize("serve_on,device,workers,warm,want", CASES)
def test_place_app(serve_on: str, device: str | None, workers: dict[str, list[str]], warm: dict[str, int],
                   want: Serve | Refuse) -> None:
    got = place_app(serve_on, device, LOCAL_DEVICES, workers, warm)
    if isinstance(want, Refuse):
        assert isinstance(got, Refuse) and (got.code, got.status) == (want.code, want.status), got
        if want.code == "app_worker_offline":
            assert "'w9'" in got.message
    else:
        assert got == want


@pytest.mark.parametrize("value,ok", [("local", True), ("any", True), ("w2", True), ("gpu-1.lab", True),
                                      ("", False), ("../x", False), ("a b", False), (7, False), (None, False)])
def test_check_serve_on(value: object, ok: bool) -> None:
    why = check_serve_on(value)
    assert (why is None) == ok, why
    if not ok:
        assert "serve_on=" in str(why) and "local" in str(why)
