"""The lines between a serving pool and its serving process (cdui/run/served.py): the version once, then only
each invoke's inputs. The line shapes and the inputs put into a kept plan as a table; then a real run
process (``python -m cdui.run.runproc``) sent those lines, good and bad, answering each invoke with its own
result whatever came before."""
from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cdui.core.layout import Layout
from cdui.graph.validate import validate_graph
from cdui.nodes.registry import build_registry
from cdui.run import canvas_proc, served
from cdui.wire.job import Job
from procs import edge, env_for, graph, node, trig

REPO = Path(__file__).resolve().parent.parent


def scale_graph() -> dict[str, Any]:
    """values (json) * 3 -> scaled; offset (number, optional, default 0.5) -> offset."""
    return graph([node("start", "Start"), node("in", "GraphInput", name="values", type="json"),
                  node("off", "GraphInput", name="offset", type="number", required=False, default="0.5"),
                  node("mul", "ScalarMultiply", scalar=3.0), node("out", "GraphOutput", name="scaled"),
                  node("out2", "GraphOutput", name="offset")],
                 [trig("start", "in"), trig("start", "off"), edge("in", "value", "mul", "tensor"),
                  edge("mul", "tensor", "out", "value"), edge("off", "value", "out2", "value")])


def version_job(tmp: Path, version_id: str = "app-scale-v1") -> Job:
    layout = Layout.for_data_dir(tmp / "data", install_root=REPO, user_data=tmp / "user_data")
    return Job(run_id=version_id, graph=scale_graph(), options={canvas_proc.SERVING: True}, slot_device="cpu",
               process_device="cpu", layout=layout.to_json())


# -- the line shapes -------------------------------------------------------------------------------------------
def test_lines_round_trip(tmp_path: Path) -> None:
    job = version_job(tmp_path)
    vid, got = served.parse_version(served.version_line("app-scale-v1", job).strip())
    assert (vid, got) == ("app-scale-v1", job)
    inv = served.parse_invoke(served.invoke_line("app-scale-v1", {"in": [1, {"a": None}]}).strip())
    assert inv == served.Invoke("app-scale-v1", {"in": [1, {"a": None}]})


BAD_LINES = [
    (served.VERSION + "{", "a version line is not JSON"),
    (served.VERSION + "[1]", "a version line holds a list, not an object"),
    (served.VERSION + '{"id": "", "job": {}}', "a version line's id '' is not a version id"),
    (served.VERSION + json.dumps({"id": "v" * 201, "job": {}}), "is not a version id"),
    (served.VERSION + '{"id": "v1"}', "version 'v1': job must be an object"),
    (served.VERSION + '{"id": "v1", "job": {"run_id": "r", "graph": []}}', "version 'v1': job: field 'graph'"),
    (served.INVOKE + "nope", "an invoke line is not JSON"),
    (served.INVOKE + '{"inputs": {}}', "an invoke line's id 'None' is not a version id"),
    (served.INVOKE + '{"id": "v1", "inputs": [1]}', "invoke of 'v1': inputs must be an object"),
]


@pytest.mark.parametrize("line,why", BAD_LINES, ids=[w for _l, w in BAD_LINES])
def test_bad_lines_are_refused_with_the_reason(line: str, why: str) -> None:
    parse = served.parse_version if line.startswith(served.VERSION) else served.parse_invoke
    with pytest.raises(served.ServedError) as refused:
        parse(line)
    assert why in str(refused.value)


def test_inputs_go_into_copies_of_their_graph_inputs_and_the_kept_plan_stays(tmp_path: Path) -> None:
    job = version_job(tmp_path)
    plan, errors = validate_graph(job.graph, build_registry(None, None))
    assert plan is not None, errors
    allowed = served.input_ids(plan)
    assert allowed == {"in", "off"}
    before = [dict(pn.params) for pn in plan.order]
    filled = served.with_inputs(plan, {"in": [1, 2]}, allowed)
    by_id = {pn.id: pn for pn in filled.order}
    assert by_id["in"].params["value"] == [1, 2] and "value" not in by_id["off"].params
    assert [pn.id for pn in filled.order] == [pn.id for pn in plan.order]
    assert [dict(pn.params) for pn in plan.order] == before, "the kept plan was changed"
    assert served.with_inputs(plan, {}, allowed) is plan
    for bad in ({"mul": 1}, {"start": 1}, {"nope": 1}):
        with pytest.raises(served.ServedError, match="not GraphInput nodes of the version"):
            served.with_inputs(plan, bad, allowed)


# -- a real serving process --------------------------------------------------------------------------------------
class Served:
    """A run process sent the canvas hello, read line by line."""

    def __init__(self, tmp: Path, cache_max_bytes: int = 1 << 20) -> None:
        (tmp / "data").mkdir(parents=True, exist_ok=True)
        # torch imported first, as in a process the zygote forks (a fresh one imports it with its first node).
        argv = ["-c", "import torch; from cdui.run import runproc, zygote; zygote.exit_now(runproc.main([]))"]
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env=env_for(tmp / "user_data", tmp / "data"), start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.send(canvas_proc.HELLO + json.dumps({"tab": "app-scale", "cache_max_bytes": cache_max_bytes}) + "\n")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def answer(self, text: str) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        """Send one line; the result it got, the GraphOutputs' values and the kinds of every line before it."""
        self.send(text)
        outputs: dict[str, Any] = {}
        kinds: list[str] = []
        while True:
            ev = json.loads(self.lines.get(timeout=120))
            if ev["kind"] == "result":
                return ev["data"], outputs, kinds
            kinds.append(ev["kind"])
            if ev["kind"] == "graph_output":
                outputs[ev["data"]["name"]] = ev["data"].get("value")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)


@pytest.mark.e2e  # a real run process, torch imported
def test_a_serving_process_runs_only_the_version_it_was_given(tmp_path: Path) -> None:
    p = Served(tmp_path)
    try:
        assert json.loads(p.lines.get(timeout=120))["kind"] == "canvas_stats"
        result, outputs, _kinds = p.answer(served.invoke_line("app-scale-v1", {"in": [1]}))
        assert result["status"] == "failed" and "it was given no version" in result["error"] and outputs == {}
        p.send(served.VERSION + "{not json\n")
        result, _o, _k = p.answer(served.invoke_line("app-scale-v1", {"in": [1]}))
        assert result["status"] == "failed" and "could not read its version: a version line is not JSON" \
            in result["error"]

        p.send(served.version_line("app-scale-v1", version_job(tmp_path)))
        result, outputs, kinds = p.answer(served.invoke_line("app-scale-v1", {"in": [1, 2], "off": 2}))
        assert result == {"status": "succeeded", "error": None}, result
        assert outputs == {"scaled": {"__type__": "tensor", "shape": [2], "dtype": "float32", "values": [3.0, 6.0]},
                           "offset": 2.0}
        assert set(kinds) == {"graph_output"}, "an invoke writes only what the pool reads"
        # The next invoke sees none of the previous one's values: the optional input answers its default.
        result, outputs, _k = p.answer(served.invoke_line("app-scale-v1", {"in": [5]}))
        assert result["status"] == "succeeded" and outputs["offset"] == 0.5 and outputs["scaled"]["values"] == [15.0]

        # Refused, each with its reason, running nothing; the process serves the next invoke after each.
        for line, why in ((served.invoke_line("app-scale-v2", {"in": [1]}),
                           "serves 'app-scale-v1', not 'app-scale-v2'"),
                          (served.invoke_line("app-scale-v1", {"mul": 1}), "['mul'], which are not GraphInput"),
                          (served.INVOKE + "{]\n", "could not read its invoke: an invoke line is not JSON")):
            result, outputs, _k = p.answer(line)
            assert result["status"] == "failed" and why in result["error"] and outputs == {}, result
        result, outputs, _k = p.answer(served.invoke_line("app-scale-v1", {"in": [2]}))
        assert result["status"] == "succeeded" and outputs["scaled"]["values"] == [6.0]
        # A bad input value fails that invoke as a run of the filled graph fails (the node coerces it).
        result, _o, _k = p.answer(served.invoke_line("app-scale-v1", {"in": [1], "off": "x"}))
        assert result["status"] == "failed" and "input 'offset' must be a finite number" in result["error"]
    finally:
        p.close()


@pytest.mark.e2e  # a real run process, torch imported
def test_each_invoke_draws_from_the_random_state_of_a_fresh_process(tmp_path: Path) -> None:
    """torch's seed at the start of every invoke, as a fresh run process has it (nothing cached here, so the random
    tensor is drawn again each time)."""
    g = graph([node("start", "Start"), node("in", "GraphInput", name="x", type="json"),
               node("rand", "TensorCreate", shape="4", fill="randn"), node("out", "GraphOutput", name="drawn"),
               node("out2", "GraphOutput", name="x")],
              [trig("start", "in"), trig("start", "rand"), edge("rand", "tensor", "out", "value"),
               edge("in", "value", "out2", "value")])
    p = Served(tmp_path, cache_max_bytes=0)
    try:
        p.send(served.version_line("app-rand-v1", replace(version_job(tmp_path, "app-rand-v1"), graph=g)))
        drawn = []
        for i in range(3):
            result, outputs, _k = p.answer(served.invoke_line("app-rand-v1", {"in": i}))
            assert result["status"] == "succeeded", result
            drawn.append(outputs["drawn"]["values"])
        # Each from the seed the process started with (torch picks one per process), not from where the last
        # invoke's draw left the generator.
        assert drawn[0] == drawn[1] == drawn[2], drawn
    finally:
        p.close()


# -- the worker's side ----------------------------------------------------------------------------------------
def test_a_worker_answers_an_invoke_without_the_job_of_a_version_it_has_not_prepared() -> None:
    """The control plane sends a version's job until the worker has prepared it; an invoke without it for a
    version the worker does not hold (it retired it meanwhile) is answered app_not_prepared, starting nothing,
    so that the control plane sends it again with the job."""
    from types import SimpleNamespace

    from cdui.agent.app_serving import AgentApps
    from cdui.core.config import load as load_config
    from cdui.run.spare import SparePool
    from cdui.wire import protocol

    async def main() -> None:
        agent = SimpleNamespace(name="w1", config=load_config({}))
        apps = AgentApps(agent, SparePool(enabled=False))
        try:
            answer = await apps.invoke(protocol.AppInvoke("r1", "scale", 1, "cpu", {"in": [1]}, 10.0))
            assert answer.error is not None and answer.error["code"] == "app_not_prepared", answer
            assert "has not prepared app 'scale' version 1" in answer.error["message"]
            assert apps.pool.procs == {} and apps.prepared == {}
            # The answer is one the control plane reads back (its code is one the protocol knows).
            assert protocol.parse_agent_message(answer.to_json()) == answer
        finally:
            await apps.close()
    asyncio.run(main())
