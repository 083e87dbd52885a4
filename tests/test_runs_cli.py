"""`cdui runs`: list, show, logs, tag/note, stop, delete, download, clone and outputs, run through the
launcher a user types (bin/cdui) against a real server in the background; and the API they use
(`GET /api/runs` filters and pages, `PATCH /api/runs/{id}`, `GET /api/runs/{id}/graph`)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from procs import REPO_ROOT, csv_print_graph, env_for, free_port, load_example, pid_alive, wait_for

pytestmark = pytest.mark.e2e

BIN = str(REPO_ROOT / "bin" / "cdui")


class Cdui:
    """bin/cdui with this module's user data and data folders."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.user_data = tmp / "user_data"
        self.env = env_for(self.user_data, tmp / "data")
        self.port = free_port()

    def __call__(self, *args: str, timeout: float = 300, stdin: Any = subprocess.DEVNULL,
                 cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
        return subprocess.run([BIN, *args], env=self.env, cwd=str(cwd), text=True, capture_output=True,
                              timeout=timeout, stdin=stdin)

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        token = (self.user_data / "session-token").read_text().strip()
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"X-CodefyUI-Token": token, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def submit(self, graph: dict[str, Any], options: dict[str, Any] | None = None) -> str:
        status, run = self.api("POST", "/api/runs", {"graph": graph, "options": options or {}})
        assert status == 201, run
        return str(run["id"])

    def wait_status(self, run_id: str, statuses: set[str]) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            run = self.api("GET", f"/api/runs/{run_id}")[1]
            return run if run["status"] in statuses else None
        return wait_for(done, 300, 0.2, f"run {run_id} to be {statuses}")


def explain(r: subprocess.CompletedProcess[str]) -> str:
    return f"exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def cdui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cdui]:
    c = Cdui(tmp_path_factory.mktemp("runs-cli"))
    r = c("start", "--port", str(c.port), timeout=180)
    assert r.returncode == 0, explain(r)
    try:
        yield c
    finally:
        pid_text = (c.user_data / "cdui.pid").read_text().strip() if (c.user_data / "cdui.pid").exists() else ""
        c("stop", timeout=60)
        if pid_text.isdigit() and pid_alive(int(pid_text)):
            os.kill(int(pid_text), signal.SIGKILL)


def short_iris(epochs: int = 2) -> dict[str, Any]:
    g = load_example()
    for n in g["nodes"]:
        if n["id"] == "train":
            n["data"]["params"]["epochs"] = epochs
    return g


def test_list_filters_pages_tags_notes_and_show(cdui: Cdui) -> None:
    a = cdui.submit(csv_print_graph(label="first"))
    b = cdui.submit(csv_print_graph(label="second"))
    for run_id in (a, b):
        cdui.wait_status(run_id, {"succeeded"})
    r = cdui("runs", "tag", a, "baseline", "lr:0.01")
    assert (r.returncode, r.stdout) == (0, f"run {a}: tags baseline lr:0.01\n"), explain(r)
    r = cdui("runs", "note", a, "100% of the data_set")
    assert (r.returncode, r.stdout) == (0, f"run {a}: note set\n"), explain(r)

    def ids(*args: str) -> list[str]:
        r = cdui("runs", "list", "--json", *args)
        assert r.returncode == 0, explain(r)
        return [x["id"] for x in json.loads(r.stdout)]
    assert ids("--limit", "2") == [b, a]
    assert ids("--tag", "baseline") == [a]
    assert ids("--tag", "nothing") == []
    assert ids("--search", "0% of the data") == [a]  # a note's text
    assert ids("--search", "data_set") == [a] and ids("--search", "dataXset") == []  # _ is not a wildcard
    assert ids("--search", b[:8]) == [b]
    assert ids("--status", "succeeded", "--target", "local", "--limit", "2") == [b, a]
    assert ids("--target", "any") == []
    assert ids("--limit", "1", "--after", b) == [a]

    r = cdui("runs", "list", "--limit", "1")
    assert r.returncode == 0, explain(r)
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "TARGET", "DEVICE", "CREATED", "(UTC)", "TOOK", "NAME", "TAGS",
                                "ERROR", "OR", "WAIT"]
    assert lines[1].startswith(f"{b}  succeeded  local") and "csv-print" in lines[1]
    assert lines[2] == f"(the newest 1 shown; the next page: add --after {b})"

    r = cdui("runs", "show", a)
    assert r.returncode == 0, explain(r)
    shown = dict(re.split(r"\s{2,}", ln, maxsplit=1) for ln in r.stdout.splitlines() if re.match(r"^\w", ln)
                 and re.search(r"\s{2,}", ln))
    assert shown["run"] == f"{a} (csv-print)" and shown["status"] == "succeeded" and shown["target"] == "local"
    assert shown["worker"] == "this server" and shown["device"] == "cpu"
    assert shown["tags"] == "baseline lr:0.01" and shown["note"] == "100% of the data_set"

    r = cdui("runs", "logs", a)
    assert r.returncode == 0, explain(r)
    assert re.search(r"^\d\d:\d\d:\d\d status: succeeded$", r.stdout, re.M), r.stdout
    assert re.search(r"node print \(Print\): done \(\d+\.\d\d s\)$", r.stdout, re.M), r.stdout

    r = cdui("runs", "tag", a, "--remove", "lr:0.01")
    assert (r.returncode, r.stdout) == (0, f"run {a}: tags baseline\n"), explain(r)
    r = cdui("runs", "tag", a, "two words")
    assert (r.returncode, r.stdout) == (1, ""), explain(r)
    assert r.stderr == ("cdui: error: tag 'two words' is not valid: a tag is 1 to 64 letters, digits or _ . : + / -, "
                        "starting with a letter or digit (e.g. \"lr-sweep\" or \"baseline:v2\")\n")
    assert cdui.api("GET", f"/api/runs/{a}")[1]["tags"] == ["baseline"]  # nothing stored by the refusal
    r = cdui("runs", "note", a, "")
    assert (r.returncode, r.stdout) == (0, f"run {a}: note removed\n"), explain(r)
    r = cdui("runs", "show", "nosuchrun")
    assert (r.returncode, r.stderr) == (1, "cdui: error: run 'nosuchrun' does not exist (list runs with GET "
                                           "/api/runs)\n"), explain(r)


def test_the_listing_and_labels_api_refuse_bad_input(cdui: Cdui) -> None:
    run_id = cdui.submit(csv_print_graph())
    cdui.wait_status(run_id, {"succeeded"})
    for path, code, message in (
            ("/api/runs?after=nosuch", "bad_query", "after='nosuch': no such run to list the runs after"),
            ("/api/runs?tag=a%20b", "bad_tag", "tag= 'a b' is not valid"),
            ("/api/runs?target=", "bad_query", "target='': "),
            ("/api/runs?search=" + "x" * 201, "bad_query", "search= is 201 characters; at most 200")):
        status, body = cdui.api("GET", path)
        assert (status, body["error"]["code"]) == (400, code), body
        assert body["error"]["message"].startswith(message), body
    for body, code in (({}, "bad_request"), ({"tags": "x"}, "bad_tag"), ({"tags": ["ok"], "colour": 1}, "bad_request"),
                       ({"tags": [f"t{i}" for i in range(33)]}, "too_many_tags"),
                       ({"note": "n" * 10_001}, "note_too_long"), ({"note": 5}, "bad_request"), ([], "bad_request")):
        status, answer = cdui.api("PATCH", f"/api/runs/{run_id}", body)
        assert (status, answer["error"]["code"]) == (400, code), (body, answer)
    status, answer = cdui.api("PATCH", "/api/runs/nosuch", {"tags": ["x"]})
    assert (status, answer["error"]["code"]) == (404, "not_found"), answer
    status, run = cdui.api("PATCH", f"/api/runs/{run_id}", {"tags": ["b", "a", "b"], "note": "kept"})
    assert status == 200 and (run["tags"], run["note"]) == (["b", "a"], "kept"), run
    status, run = cdui.api("PATCH", f"/api/runs/{run_id}", {"note": None})
    assert (run["tags"], run["note"]) == (["b", "a"], None), run


def test_download_checks_the_artifact_sha256(cdui: Cdui, tmp_path: Path) -> None:
    run_id = cdui.submit(short_iris())
    cdui.wait_status(run_id, {"succeeded"})
    arts = cdui.api("GET", f"/api/runs/{run_id}/artifacts")[1]
    model = next(x for x in arts if x["kind"] == "model")
    out = tmp_path / "got"
    r = cdui("runs", "download", run_id, str(model["id"]), "-o", f"{out}/")  # a folder, made
    assert r.returncode == 0, explain(r)
    target = out / "model.pt"
    assert r.stdout == f"{target} ({target.stat().st_size / 1024:.1f} KiB, sha256 checked)\n", explain(r)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == model["sha256"]
    assert [p.name for p in out.iterdir()] == ["model.pt"]  # no partial file left beside it
    again = cdui("runs", "download", run_id, "model.pt", "-o", str(target))
    assert (again.returncode, again.stderr) == (1, f"cdui: error: {target} exists: nothing was downloaded (give "
                                                   f"another -o PATH, or --force to replace it)\n"), explain(again)
    r = cdui("runs", "download", run_id, "nosuch.pt", "-o", str(out))
    assert r.returncode == 1 and "has no artifact 'nosuch.pt'; it has: " in r.stderr, explain(r)


def test_clone_with_changed_params_and_outputs(cdui: Cdui) -> None:
    run_id = cdui.submit(short_iris())
    cdui.wait_status(run_id, {"succeeded"})
    r = cdui("runs", "clone", run_id, "--param", "optimizer.lr=0.05", "--param", "train.epochs=3",
             "--record-outputs", "--wait")
    assert r.returncode == 0, explain(r)
    new = r.stdout.splitlines()[0]
    assert re.fullmatch(r"[0-9a-f]{12}", new) and new != run_id, r.stdout
    assert (f"cloned from run {run_id} onto local: optimizer.lr: 0.01 -> 0.05; train.epochs: 2 -> 3\n"
            in r.stderr), explain(r)
    graph = cdui.api("GET", f"/api/runs/{new}/graph")[1]["graph"]
    params = {n["id"]: n["data"]["params"] for n in graph["nodes"]}
    assert (params["optimizer"]["lr"], params["train"]["epochs"]) == (0.05, 3)
    before = {n["id"]: n["data"]["params"] for n in cdui.api("GET", f"/api/runs/{run_id}/graph")[1]["graph"]["nodes"]}
    assert (before["optimizer"]["lr"], before["train"]["epochs"]) == (0.01, 2)  # the original's graph unchanged
    for change, message in (
            ("train.lr=1", "--param 'train.lr=1': node train (TrainingLoop) has no param 'lr' (its params: "),
            ("trian.epochs=1", "--param 'trian.epochs=1': the graph has no node 'trian'; did you mean train? "),
            ("epochs", "--param 'epochs' is not NODE.PARAM=VALUE")):
        r = cdui("runs", "clone", run_id, "--param", change)
        assert r.returncode == 1 and r.stderr.startswith("cdui: error: " + message), explain(r)
    r = cdui("runs", "outputs", new)
    assert r.returncode == 0, explain(r)
    assert r.stdout.splitlines()[0] == f"recorded outputs of run {new} (kept on this server):"
    assert "  norm  Normalize" in r.stdout.splitlines()
    r = cdui("runs", "outputs", new, "norm")
    assert r.returncode == 0, explain(r)
    assert re.search(r"^  tensor: tensor float32 shape \[150, 4\]  min -?\d", r.stdout, re.M), r.stdout
    r = cdui("runs", "outputs", run_id)
    assert r.stdout.startswith(f"run {run_id} was submitted without record_outputs"), explain(r)


def test_stop_and_delete_say_what_happens_and_need_yes_off_a_terminal(cdui: Cdui) -> None:
    # Queued for a device this server lacks: it waits until stopped.
    run_id = cdui.submit(csv_print_graph(), {"device": "cuda"})
    r = cdui("runs", "stop", run_id)
    assert r.returncode == 2, explain(r)
    assert r.stderr == (f"run {run_id} is queued: it is cancelled at once and never starts.\n"
                        "cdui: error: not on a terminal, so nothing was done: add --yes to go ahead\n")
    assert cdui.api("GET", f"/api/runs/{run_id}")[1]["status"] == "queued"
    r = cdui("runs", "delete", run_id, "--yes")
    assert (r.returncode, r.stderr) == (1, f"cdui: error: run {run_id} is queued: only an ended run can be deleted "
                                           f"(stop it first: cdui runs stop {run_id})\n"), explain(r)
    r = cdui("runs", "stop", run_id, "--yes")
    assert (r.returncode, r.stdout) == (0, f"run {run_id}: cancelled\n"), explain(r)
    r = cdui("runs", "delete", run_id)
    assert r.returncode == 2 and "This cannot be undone." in r.stderr, explain(r)
    assert cdui.api("GET", f"/api/runs/{run_id}")[0] == 200
    r = cdui("runs", "delete", run_id, "-y")
    assert (r.returncode, r.stdout) == (0, f"deleted run {run_id}\n"), explain(r)
    assert cdui.api("GET", f"/api/runs/{run_id}")[0] == 404


def test_run_wait_says_why_it_waits_and_ctrl_c_leaves_it_running(cdui: Cdui, tmp_path: Path) -> None:
    g = tmp_path / "g.json"
    g.write_text(json.dumps(csv_print_graph()))
    # No machine here offers cuda: --queue-anyway queues it all the same, and it waits.
    p = subprocess.Popen([BIN, "run", str(g), "--device", "cuda", "--queue-anyway", "--wait"], env=cdui.env,
                         cwd=str(REPO_ROOT), text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert p.stdout is not None
        run_id = p.stdout.readline().strip()
        lines = [p.stdout.readline() for _ in range(2)]
        assert lines == ["status: queued\n", "queued: waiting: local offers no cuda device (it has cpu)\n"], lines
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, (out, err)
    assert err.strip().endswith(f"run {run_id} keeps going; follow it with `cdui runs logs {run_id} --follow`, "
                                f"stop it with `cdui runs stop {run_id}`"), err
    assert cdui.api("GET", f"/api/runs/{run_id}")[1]["status"] == "queued"
    assert cdui("runs", "stop", run_id, "--yes").returncode == 0


def test_runs_without_a_subcommand_prints_its_help(cdui: Cdui) -> None:
    r = cdui("runs")
    assert r.returncode == 2, explain(r)
    assert [ln.split()[0] for ln in r.stdout.splitlines() if re.match(r"^    \w", ln)] == [
        "list", "show", "logs", "stop", "delete", "download", "clone", "outputs", "tag", "note"], r.stdout
