"""#26's acceptance, as a user would do it: train iris twice with two learning rates from the CLI
(`bin/cdui run`), find both with `bin/cdui runs list`, compare them in the page (the loss chart overlays
each run's train_loss and val_loss with a legend; the params table shows the lr that differs), clone
the better one with 50 epochs onto a worker (`bin/cdui runs clone`) and download its model
(`bin/cdui runs download`, the sha256 checked). Real server, real agent, real torch, real Chromium."""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from canvas_page import LONG, module_fixtures
from procs import REPO_ROOT, load_example, spawn_agent, wait_for

pytestmark = pytest.mark.e2e

server, browser = module_fixtures("daily-use")
BIN = str(REPO_ROOT / "bin" / "cdui")
LRS = (0.01, 0.05)
EPOCHS = 10


def cdui(srv: Any, *args: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([BIN, *args], env=srv.env, cwd=str(REPO_ROOT), text=True, capture_output=True,
                       timeout=600, stdin=subprocess.DEVNULL)
    return r


def explain(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


def iris_file(tmp: Path, lr: float) -> Path:
    g = load_example()
    g["name"] = f"iris lr {lr}"
    for n in g["nodes"]:
        if n["id"] == "optimizer":
            n["data"]["params"]["lr"] = lr
        if n["id"] == "train":
            n["data"]["params"]["epochs"] = EPOCHS
    path = tmp / f"iris-{lr}.json"
    path.write_text(json.dumps(g))
    return path


def final(srv: Any, run_id: str, name: str) -> float:
    series = srv.call("GET", f"/api/runs/{run_id}/metrics", expect=200)["series"]
    value: float = next(s for s in series if s["name"] == name)["last"]["value"]
    return value


def test_train_twice_list_compare_clone_onto_a_worker_and_download(server, browser, tmp_path: Path) -> None:
    # Two learning rates, from the CLI, each followed to its end.
    ids = []
    for lr in LRS:
        r = cdui(server, "run", str(iris_file(tmp_path, lr)), "--wait")
        assert r.returncode == 0, explain(r)
        run_id = r.stdout.splitlines()[0]
        assert re.fullmatch(r"[0-9a-f]{12}", run_id), explain(r)
        ids.append(run_id)
    a, b = ids

    # Both in the list, newest first, with their names.
    r = cdui(server, "runs", "list", "--json")
    assert r.returncode == 0, explain(r)
    listed = {x["id"]: x for x in json.loads(r.stdout)}
    assert [x for x in json.loads(r.stdout) if x["id"] in ids][0]["id"] == b
    assert (listed[a]["status"], listed[a]["name"]) == ("succeeded", f"iris lr {LRS[0]}")
    assert (listed[b]["status"], listed[b]["name"]) == ("succeeded", f"iris lr {LRS[1]}")

    # Compared in the page: both runs' train_loss and val_loss on one chart with a legend; lr differs.
    errors: list[str] = []
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(LONG)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{server.url}/web/compare.html?runs={a},{b}")
    page.wait_for_selector("body[data-ready='1']")
    legend = page.eval_on_selector_all(
        "#compare-charts figure[data-family='loss'] .u-legend tr.u-series:not(:first-child):not([hidden]) .u-label",
        "els => els.map(e => e.textContent)")
    assert legend == [f"{a} iris lr {LRS[0]} · train_loss", f"{a} iris lr {LRS[0]} · val_loss",
                      f"{b} iris lr {LRS[1]} · train_loss", f"{b} iris lr {LRS[1]} · val_loss"]
    rows = page.eval_on_selector_all("#compare-params tbody tr",
                                     "rs => rs.map(r => [...r.children].map(c => c.textContent))")
    assert rows == [["optimizer.lr", str(LRS[0]), str(LRS[1])]]
    page.close()
    assert errors == []

    # The better one (the lower final val_loss), cloned with 50 epochs onto a worker.
    best = min(ids, key=lambda rid: final(server, rid, "val_loss"))
    agent = spawn_agent(server, tmp_path, "gpu-box")
    try:
        wait_for(lambda: any(w["name"] == "gpu-box" and w["online"]
                             for w in server.call("GET", "/api/workers")["workers"]),
                 180, 0.2, "worker gpu-box online", detail=agent.log_tail)
        r = cdui(server, "runs", "clone", best, "--param", "train.epochs=50", "--target", "gpu-box", "--wait")
        assert r.returncode == 0, explain(r) + agent.log_tail()
        new = r.stdout.splitlines()[0]
        assert f"cloned from run {best} onto gpu-box: train.epochs: {EPOCHS} -> 50\n" in r.stderr, explain(r)
        run = server.call("GET", f"/api/runs/{new}")
        assert (run["status"], run["worker_id"]) == ("succeeded", "gpu-box"), run
        params = {n["id"]: n["data"]["params"] for n in server.call("GET", f"/api/runs/{new}/graph")["graph"]["nodes"]}
        lr = LRS[ids.index(best)]
        assert (params["train"]["epochs"], params["optimizer"]["lr"]) == (50, lr)
        series = server.call("GET", f"/api/runs/{new}/metrics")["series"]
        assert next(x for x in series if x["name"] == "train_loss")["count"] == 50

        # Its model, downloaded and checked against the run's record.
        model = next(x for x in server.call("GET", f"/api/runs/{new}/artifacts") if x["kind"] == "model")
        out = tmp_path / "download"
        r = cdui(server, "runs", "download", new, "-o", f"{out}/")
        assert r.returncode == 0, explain(r)
        got = out / Path(model["path"]).name
        assert r.stdout == f"{got} ({got.stat().st_size / 1024:.1f} KiB, sha256 checked)\n", explain(r)
        assert hashlib.sha256(got.read_bytes()).hexdigest() == model["sha256"]
    finally:
        agent.stop()
