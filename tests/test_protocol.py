"""The /ws/worker messages and the job as values: every message survives its own
``to_json()`` and the parser of the other side unchanged, and every malformed
message is refused with a text that says what was wrong.

Pure functions, no server: the hostile-worker tests drive the same parser through
a real connection."""
from __future__ import annotations

import json
from typing import Any

import pytest

from cdui.wire import protocol
from cdui.wire.job import Job, JobError, JobFiles

JOB = Job(run_id="r1", graph={"nodes": [{"id": "a", "type": "Start", "params": {"token": ""}}], "edges": []},
          options={"device": "cpu", "graph_max_nodes": 500}, slot_device="cuda:1", process_device="cuda:0",
          layout={"data_dir": "/data"}, custom_nodes_dir="/c", plugins_dir=None,
          files=JobFiles("transfer", ({"folder": "datasets", "name": "iris.csv", "sha256": "ab", "size": 3},), "data"),
          secrets=((("nodes", 0, "params", "token"), "s3cr3t-value-long"),))

AGENT_MESSAGES: list[protocol.AgentMessage] = [
    protocol.Hello("1.0", "w1", ["cpu", "cuda:0"], {"data": "/mnt/data"}, "m1",
                   [protocol.HeldRun("r1", True, 7), protocol.HeldRun("r2", False, 0)], True, "i-1", ["x"]),
    protocol.Hello("1.0", "w1", ["cpu"]),
    protocol.Events("r1", [{"src_seq": 1, "kind": "log", "data": {"message": "hi"}, "at": 1.7e9},
                           {"src_seq": 2, "kind": "status", "data": {"status": "running"}, "at": 1.7e9}]),
    protocol.Events("r1", []),
    protocol.Heartbeat(["r1", "r2"], {"data": "/mnt"}),
    protocol.Heartbeat([]),
    protocol.Heartbeat(["r1"], None, None, [{"device": "cuda:0", "util": 37, "used_mb": 1200, "total_mb": 81559},
                                            {"device": "cuda:1", "util": None, "used_mb": None, "total_mb": None}]),
    protocol.OutputsAnswer("q1", "r1", None, nodes=[{"node_id": "n", "type": "T"}]),
    protocol.OutputsAnswer("q2", "r1", "n", summary={"node_id": "n", "type": "T", "outputs": [
        {"port": "p", "kind": "tensor", "shape": [2], "dtype": "float32", "min": 0.0, "max": 1.0, "mean": 0.5}]}),
    protocol.OutputsAnswer("q3", "r1", "n", error="no recorded outputs of run r1 are kept here"),
    protocol.Heartbeat(["r1"], serving=[{"slug": "iris", "version": 2, "device": "cuda:0", "pid": 41,
                                         "state": "busy"}]),
    protocol.Heartbeat([], serving=[]),
    protocol.AppAnswer("a1", result={"status": "succeeded", "error": None, "node_id": None},
                       outputs={"class": {"__type__": "tensor", "shape": [], "values": 2}}),
    protocol.AppAnswer("a2", result={"status": "failed", "error": "boom", "node_id": "n"},
                       output_error={"code": "bad", "message": "m", "node_id": "out", "details": {"k": 1}}),
    protocol.AppAnswer("a3", error={"code": "app_process_lost", "message": "the process died", "hint": "call again",
                                    "details": {"stderr_tail": ["x"]}}),
]

SERVER_MESSAGES: list[protocol.ServerMessage] = [
    protocol.Welcome("1.0", "w1", 10.0, 300.0, {"r1": protocol.RunAnswer(4, "continue"),
                                                "r2": protocol.RunAnswer(0, "stop"),
                                                "r3": protocol.RunAnswer(9, "drop")}),
    protocol.Welcome("1.0", "w1", 0.5, 0.0),
    protocol.Refused("name_in_use", "worker w1 is already connected"),
    protocol.Refused("version_mismatch", "version mismatch: worker 1, control plane 2", update=True),
    protocol.Assign("r1", JOB),
    protocol.Assign("r2", Job(run_id="r2", graph={})),
    protocol.Ack("r1", 12),
    protocol.Stop("r1"),
    protocol.Revoked("worker w1 was removed"),
    protocol.Error("malformed message: not JSON"),
    protocol.OutputsRequest("q1", "r1", None),
    protocol.OutputsRequest("q2", "r1", "node"),
    protocol.AppInvoke("a1", "iris", 3, "cpu", {"in": [1, 2]}, 60.0, JOB),
    protocol.AppInvoke("a2", "iris", 3, "cuda:0", {}, 60.0),
    protocol.AppRetire("iris", 3),
    protocol.AppRetire("iris", None),
    protocol.AppReleaseIdle(2.0, ["cpu", "cuda:0"]),
]


@pytest.mark.parametrize("msg", AGENT_MESSAGES, ids=lambda m: type(m).__name__)
def test_agent_messages_round_trip(msg: protocol.AgentMessage) -> None:
    assert protocol.parse_agent_message(msg.to_json()) == msg


@pytest.mark.parametrize("msg", SERVER_MESSAGES, ids=lambda m: type(m).__name__)
def test_server_messages_round_trip(msg: protocol.ServerMessage) -> None:
    assert protocol.parse_server_message(msg.to_json()) == msg


def test_hello_sends_its_version_first() -> None:
    """The control plane reads the version before the rest, so it must lead the text."""
    text = protocol.Hello("9.9", "w1", ["cpu"]).to_json()
    assert text.startswith('{"version": "9.9", "type": "hello"')
    assert protocol.peek_version(text) == "9.9"


def _events(**ev: Any) -> str:
    e = {"src_seq": 1, "kind": "log", "data": {}, "at": 1.7e9, **ev}
    return json.dumps({"type": "events", "run_id": "r1", "events": [e]})


def _nested(n: int) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for _ in range(n):
        d = {"x": d}
    return d


AGENT_REFUSALS = [
    ("not json", "not JSON"),
    ("[1]", "must be a JSON object"),
    ('{"type": "events", "run_id": "r1", "events": [{"src_seq": 1, "kind": "log", "data": {"v": NaN}}]}', "NaN"),
    ('{"type": "events", "run_id": "r1", "events": [{"src_seq": 1, "kind": "log", "data": {"v": Infinity}}]}',
     "Infinity"),
    ('{"type": "events", "run_id": "r1", "events": [{"src_seq": 1, "kind": "log", "data": {}, "at": 1e999}]}',
     "out of range"),
    # Every other way a number overflows to infinity: a long exponent (leading zeros too), a long integer part.
    ('{"type": "events", "run_id": "r1", "events": [{"src_seq": 1, "kind": "log", "data": {"v": 1E+0000400}}]}',
     "out of range"),
    ('{"type": "events", "run_id": "r1", "events": [{"src_seq": 1, "kind": "log", "data": {"v": 1' + "0" * 210
     + 'e99}}]}', "out of range"),
    ('{"type": "events", "run_id": "r1", "events": [{"src_seq": 1, "kind": "log", "data": {"v": -1' + "0" * 320
     + '.5}}]}', "out of range"),
    (_events(at=-1), "UNIX time"),
    (_events(at=True), "UNIX time"),
    (_events(src_seq=0), "src_seq=0 is out of range"),
    (_events(src_seq=True), "type bool"),
    (_events(kind="k" * 1000), "over the limit"),
    (_events(data=_nested(protocol.MAX_DEPTH + 1)), "nests deeper"),
    (_events(data=[1]), "not an object"),
    (json.dumps({"type": "events", "run_id": "r1", "events": [{"src_seq": i + 1, "kind": "log"}
                                                              for i in range(protocol.MAX_EVENTS + 1)]}),
     "over the limit"),
    ('{"type": "events", "events": []}', "missing field 'run_id'"),
    ("[" * 100000 + "]" * 100000, "nests too deeply"),
    ('{"type": "surprise"}', "unknown message type 'surprise'"),
    ('{"type": "heartbeat", "runs": [1]}', "must be a string"),
    ('{"type": "heartbeat", "labels": {"k": {"n": 1}}}', "must be a string"),
    ('{"type": "hello", "version": "1", "name": "w"}', "missing field 'devices'"),
    ('{"type": "hello", "version": "1", "name": "w", "devices": ["cpu"], "runs": [{"running": true}]}',
     "missing field 'run_id'"),
    ('{"type": "hello", "version": "1", "name": "w", "devices": ["cpu"], "runs": [{"run_id": "r", "last_seq": -1}]}',
     "out of range"),
    (json.dumps({"type": "hello", "version": "1", "name": "w", "devices": ["d"] * (protocol.MAX_SMALL_LIST + 1)}),
     "over the limit"),
    ('"x' + "y" * protocol.MAX_MESSAGE + '"', "byte limit"),
    ('{"type": "outputs_answer", "run_id": "r1"}', "missing field 'request_id'"),
    (json.dumps({"type": "outputs_answer", "request_id": "q", "run_id": "r1",
                 "nodes": [{"node_id": "n", "type": "T"}] * 10001}), "nodes must be a list of at most 10000"),
    (json.dumps({"type": "outputs_answer", "request_id": "q", "run_id": "r1", "node_id": "n",
                 "summary": {"node_id": "m", "outputs": []}}), "outputs_answer: the summary is for another node"),
    (json.dumps({"type": "outputs_answer", "request_id": "q", "run_id": "r1", "node_id": "n" * 257}),
     "outputs_answer.node_id is 257 characters long"),
    (json.dumps({"type": "heartbeat", "serving": [{"slug": "a", "version": 1, "device": "cpu", "pid": 1,
                                                   "state": "asleep"}]}), "'asleep' is not one of busy, idle"),
    (json.dumps({"type": "heartbeat", "serving": [{"slug": "a", "version": 0, "device": "cpu", "pid": 1,
                                                   "state": "idle"}]}), "serving[0].version=0 is out of range"),
    (json.dumps({"type": "heartbeat", "serving": [{}] * (protocol.MAX_SERVING + 1)}), "over the limit of 256"),
    ('{"type": "app_answer", "request_id": "a"}', "app_answer: give exactly one of result and error"),
    (json.dumps({"type": "app_answer", "request_id": "a", "result": {"status": "succeeded"},
                 "error": {"code": "timeout"}}), "give exactly one of result and error"),
    (json.dumps({"type": "app_answer", "request_id": "a", "error": {"code": "teapot", "message": "m"}}),
     "app_answer.error.code='teapot' is not one of"),
    (json.dumps({"type": "app_answer", "request_id": "a", "result": {"error": "x"}}),
     "app_answer.result.status must be a run status"),
    (json.dumps({"type": "app_answer", "request_id": "a", "result": {"status": "succeeded"},
                 "outputs": {f"o{i}": 1 for i in range(protocol.MAX_APP_OUTPUTS + 1)}}), "over the limit of 256"),
    (json.dumps({"type": "app_answer", "request_id": "a", "result": {"status": "succeeded"},
                 "outputs": {"o": json.loads("[" * 17 + "]" * 17)}}), "app_answer.outputs nests deeper than 16"),
    (json.dumps({"type": "app_answer", "request_id": "a", "result": {"status": "succeeded", "error": 5}}),
     "app_answer.result.error has type int"),
    (json.dumps({"type": "app_answer", "request_id": "a", "error": {"code": "app_failed",
                                                                  "message": "m" * (protocol.MAX_TEXT + 1)}}),
     "app_answer.error.message is 65537 characters long"),
]


@pytest.mark.parametrize("raw,why", AGENT_REFUSALS, ids=[w for _, w in AGENT_REFUSALS])
def test_malformed_agent_messages_are_refused_with_the_reason(raw: str, why: str) -> None:
    with pytest.raises(protocol.ProtocolError) as err:
        protocol.parse_agent_message(raw)
    assert why in str(err.value)


def _assign(job: dict[str, Any], run_id: str = "r1") -> str:
    return json.dumps({"type": "assign", "run_id": run_id, "job": job})


SERVER_REFUSALS = [
    ("not json", "not JSON"),
    ("[]", "must be a JSON object"),
    ('{"type": "welcome", "version": "1", "worker": "w", "heartbeat_s": NaN, "resume_grace_s": 1}', "NaN"),
    ('{"type": "welcome", "version": "1", "worker": "w", "heartbeat_s": 0, "resume_grace_s": 1}', "out of range"),
    ('{"type": "welcome", "version": "1", "worker": "w", "heartbeat_s": true, "resume_grace_s": 1}', "out of range"),
    ('{"type": "welcome", "version": "1", "heartbeat_s": 1, "resume_grace_s": 1}', "missing field 'worker'"),
    ('{"type": "welcome", "version": "1", "worker": "w", "heartbeat_s": 1, "resume_grace_s": 1, '
     '"runs": {"r1": {"acked": 1, "action": "explode"}}}', "'explode' is not one of continue, stop, drop"),
    ('{"type": "welcome", "version": "1", "worker": "w", "heartbeat_s": 1, "resume_grace_s": 1, '
     '"runs": {"r1": {"acked": -1, "action": "stop"}}}', "out of range"),
    ('{"type": "welcome", "version": "1", "worker": "w", "heartbeat_s": 1, "resume_grace_s": 1, "runs": {"r1": 3}}',
     "is not an object"),
    ('{"type": "refused", "message": "no"}', "missing field 'code'"),
    ('{"type": "ack", "run_id": "r1"}', "missing field 'acked'"),
    ('{"type": "ack", "run_id": "r1", "acked": 1.5}', "type float"),
    ('{"type": "stop"}', "missing field 'run_id'"),
    ('{"type": "stop", "run_id": 7}', "type int"),
    (json.dumps({"type": "error", "message": "m" * (protocol.MAX_TEXT + 1)}), "over the limit"),
    ('{"type": "assign", "run_id": "r1"}', "missing field 'job'"),
    (_assign({"run_id": "r2", "graph": {}}), "the job is for run 'r2'"),
    (_assign({"graph": {}}), "job: missing field 'run_id'"),
    (_assign({"run_id": "r1", "graph": []}), "job: field 'graph' has type list"),
    (_assign({"run_id": "r1", "graph": {}, "secrets": ["bare"]}), "secrets[0] is not a [path, value] pair"),
    (_assign({"run_id": "r1", "graph": {}, "files": {"backend": "ftp"}}), "files.backend='ftp'"),
    (_assign({"run_id": "r1", "graph": {}, "files": {"inputs": [1]}}), "files.inputs item must be an object"),
    (_assign({"run_id": "r1", "graph": {}, "slot_device": 0}), "field 'slot_device' has type int"),
    ('{"type": "hello"}', "unknown message type 'hello'"),
    ('"x' + "y" * protocol.MAX_MESSAGE + '"', "byte limit"),
    ('{"type": "outputs_request", "request_id": "q"}', "missing field 'run_id'"),
    (json.dumps({"type": "app_invoke", "request_id": "a", "slug": "Bad Slug", "version": 1, "timeout_s": 1,
                 "job": {"run_id": "r", "graph": {}}}), "app_invoke.slug='Bad Slug' is not an app slug"),
    (json.dumps({"type": "app_invoke", "request_id": "a", "slug": "iris", "version": 0, "timeout_s": 1,
                 "device": "cpu", "inputs": {}, "job": {"run_id": "r", "graph": {}}}),
     "app_invoke.version=0 is out of range"),
    (json.dumps({"type": "app_invoke", "request_id": "a", "slug": "iris", "version": 1, "timeout_s": 1e9,
                 "device": "cpu", "inputs": {}, "job": {"run_id": "r", "graph": {}}}),
     "timeout_s=1000000000.0 is out of range"),
    (json.dumps({"type": "app_invoke", "request_id": "a", "slug": "iris", "version": 1, "timeout_s": 1,
                 "device": "cpu", "inputs": [1]}), "field 'inputs' has type list"),
    (json.dumps({"type": "app_invoke", "request_id": "a", "slug": "iris", "version": 1, "timeout_s": 1,
                 "inputs": {}}), "missing field 'device'"),
    (json.dumps({"type": "app_invoke", "request_id": "a", "slug": "iris", "version": 1, "timeout_s": 1,
                 "job": {"run_id": "r", "graph": []}}), "app_invoke: job: field 'graph' has type list"),
    ('{"type": "app_retire", "slug": "iris", "keep": -1}', "app_retire.keep=-1 is out of range"),
    ('{"type": "app_release_idle", "idle_s": -1, "devices": []}', "idle_s=-1 is out of range"),
    ('{"type": "app_release_idle", "idle_s": 1}', "missing field 'devices'"),
]


@pytest.mark.parametrize("raw,why", SERVER_REFUSALS, ids=[w for _, w in SERVER_REFUSALS])
def test_malformed_server_messages_are_refused_with_the_reason(raw: str, why: str) -> None:
    with pytest.raises(protocol.ProtocolError) as err:
        protocol.parse_server_message(raw)
    assert why in str(err.value)


def test_job_round_trips_through_its_json() -> None:
    assert Job.from_json(JOB.to_json()) == JOB


def test_job_keeps_secrets_out_of_its_repr() -> None:
    """A job in a log line or a traceback must not show a secret value."""
    assert "s3cr3t" not in repr(JOB)
    assert "s3cr3t" not in repr(protocol.Assign("r1", JOB))
    assert "s3cr3t" in JOB.to_json()  # the pipe and the assign message still carry it


def test_job_for_another_machine_is_a_new_value() -> None:
    other = JOB.without_local_paths()
    assert (other.layout, other.custom_nodes_dir, other.plugins_dir) == (None, None, None)
    assert (JOB.layout, JOB.custom_nodes_dir) == ({"data_dir": "/data"}, "/c")
    with pytest.raises(AttributeError):
        JOB.run_id = "other"  # type: ignore[misc]


@pytest.mark.parametrize("text,why", [
    ("{", "the job is not JSON"),
    ("[]", "a job must be a JSON object, got list"),
    ('{"run_id": "r", "graph": {}, "options": []}', "field 'options' has type list"),
    ('{"run_id": "r", "graph": {}, "layout": "x"}', "field 'layout' has type str"),
])
def test_malformed_jobs_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(JobError) as err:
        Job.from_json(text)
    assert why in str(err.value)


# -- an events message's texts ---------------------------------------------------------------------
def _flood(n: int = 5, **data: Any) -> list[dict[str, Any]]:
    return [{"src_seq": i, "kind": "log", "data": {"message": f"event {i}", "v": i / 3, **data}, "at": 1764694000.5 + i}
            for i in range(1, n + 1)]


def test_an_events_message_as_agents_write_it_carries_each_event_s_text() -> None:
    """Each text is exactly the slice its event was decoded from: what the control plane stores as is."""
    evs = _flood()
    raw = protocol.encode_events("r_1", evs, encoded=[protocol.event_text(e) for e in evs])[0]
    m = protocol.parse_agent_message(raw)
    assert isinstance(m, protocol.Events) and m.events == evs
    assert m.texts == [protocol.event_text(e) for e in evs]
    assert all(t is not None and t in raw and json.loads(t) == e for t, e in zip(m.texts, evs, strict=True))
    # Without encoded lines the agent's messages are laid out the same way.
    assert protocol.parse_agent_message(protocol.encode_events("r_1", evs)[0]).texts == m.texts


def test_an_events_message_laid_out_otherwise_carries_no_texts_and_is_still_taken() -> None:
    """A layout the counts cannot vouch for gives no texts (its events are encoded again), whatever a
    worker does to make a text say something other than its event; the events are checked as ever."""
    evs = _flood(3)
    texts = [protocol.event_text(e) for e in evs]
    head = '{"type": "events", "run_id": "r_1", "events": ['
    body = ",".join(texts)
    other = {
        "a brace in a string": protocol.encode_events("r_1", _flood(3, note="{x}"))[0],
        "a space between events": head + ", ".join(texts) + "]}",
        "the list given twice": head + texts[0] + '], "events": [' + body + "]}",
        "an empty list first": head + '], "events": [' + body + "]}",
        "a key after the list": head + body + '], "x": [{}]}',
        "a key after the list, no object": head + body + '], "x": ["}"]}',
        "another run id after": head + body + '], "run_id": "r_2", "events": [' + body + "]}",
        "text other than ASCII": protocol.encode_events("r_1", _flood(3, note="é"))[0].replace("\\u00e9", "é"),
        "an event without a time": head + body.replace(', "at": 1764694001.5', "", 1) + "]}",
        "nested data": head + texts[0][:-1] + ', "data": {"a": {"src_seq": 9}}}' + "," + ",".join(texts[1:]) + "]}",
        "spaces around the list": head + " " + body + " ]}",
    }
    for what, raw in other.items():
        m = protocol.parse_agent_message(raw)
        assert isinstance(m, protocol.Events), what
        assert m.texts is None, what
    # A text is never given for what was not decoded into its event.
    m = protocol.parse_agent_message(other["another run id after"])
    assert isinstance(m, protocol.Events) and m.run_id == "r_2"


def test_plugin_push_and_its_answer_round_trip_and_bad_digests_are_refused() -> None:
    push = protocol.PluginPush("q1", "labpack", "0.2.0", "a" * 64, "b" * 64, "H4sI")
    assert protocol.parse_server_message(push.to_json()) == push
    answer = protocol.PluginPushAnswer("q1", "labpack", False, "this agent does not accept pushed plugin packs")
    assert protocol.parse_agent_message(answer.to_json()) == answer
    with pytest.raises(protocol.ProtocolError, match="sha256 hex digests"):
        protocol.parse_server_message(json.dumps({**json.loads(push.to_json()), "tree_sha256": "not-a-digest"}))
    with pytest.raises(protocol.ProtocolError, match="data is .* over the limit"):
        too_long = "A" * (protocol.MAX_MESSAGE - 1000)
        protocol.parse_server_message(json.dumps({**json.loads(push.to_json()), "data": too_long}))



def _strict_layout(raw: str) -> str:
    """The same message with its first two keys the other way round: read by the checks one field and one
    event at a time (only a message that starts as agents write it is tried in passes first)."""
    other = raw.replace('{"type": "events", "run_id": "r_1", ', '{"run_id": "r_1", "type": "events", ', 1)
    assert other != raw
    return other


def test_an_events_message_of_usual_events_is_read_in_passes_as_the_one_by_one_checks_read_it() -> None:
    """A flood's message is checked a property at a time over all its events (protocol.usual_events);
    whatever it holds, it is taken or refused exactly as the checks one event at a time take or refuse it."""
    usual = _flood(50, ok=True, none=None, big=2 ** 60, empty="")
    raw = protocol.encode_events("r_1", usual)[0]
    fast = protocol._usual_events_message(raw)
    assert fast is not None and fast.events == usual and fast.texts == [protocol.event_text(e) for e in usual]
    m = protocol.parse_agent_message(_strict_layout(raw))
    assert isinstance(m, protocol.Events) and m.events == fast.events and m.run_id == fast.run_id
    variants = {  # what: (its events, whether they are usual ones)
        "the longest kind": ([{**usual[0], "kind": "k" * protocol.MAX_NAME}], True),
        "the highest number": ([{**usual[0], "src_seq": protocol.MAX_SEQ}], True),
        "empty data": ([{**usual[0], "data": {}}], True),
        "a time given as an int": ([{**usual[0], "at": 1764694000}], False),
        "no time": ([{k: v for k, v in usual[0].items() if k != "at"}], False),
        "no data": ([{k: v for k, v in usual[0].items() if k != "data"}], False),
        "nested data": ([{**usual[0], "data": {"a": {"b": 1}}}], False),
        "a list in the data": ([{**usual[0], "data": {"a": [1, 2]}}], False),
        "a key of its own": ([{**usual[0], "x": 1}], False),
        "floats that add up past the largest": ([{**usual[0], "data": {"v": 1e308}},
                                                 {**usual[1], "data": {"v": 1e308}}], False),
        "no events": ([], False),
    }
    for what, (evs, in_passes) in variants.items():
        raw = '{"type": "events", "run_id": "r_1", "events": ' + json.dumps(evs) + "}"
        assert (protocol._usual_events_message(raw) is not None) == in_passes, what
        m, strict = protocol.parse_agent_message(raw), protocol.parse_agent_message(_strict_layout(raw))
        assert isinstance(m, protocol.Events) and isinstance(strict, protocol.Events), what
        assert (m.run_id, m.events) == (strict.run_id, strict.events) == ("r_1", evs), what
    refused = {
        "a time out of range": '{"src_seq": 1, "kind": "log", "data": {}, "at": 5.0}',
        "an overflowing time": '{"src_seq": 1, "kind": "log", "data": {}, "at": 1e999}',
        "an overflowing value": '{"src_seq": 1, "kind": "log", "data": {"v": -1e999}, "at": 1764694000.5}',
        "NaN": '{"src_seq": 1, "kind": "log", "data": {"v": NaN}, "at": 1764694000.5}',
        "a number 0": '{"src_seq": 0, "kind": "log", "data": {}, "at": 1764694000.5}',
        "a number too high": '{"src_seq": ' + str(protocol.MAX_SEQ + 1) + ', "kind": "log", "data": {}, "at": 1.8e9}',
        "a kind too long": '{"src_seq": 1, "kind": "' + "k" * 129 + '", "data": {}, "at": 1764694000.5}',
        "a kind not text": '{"src_seq": 1, "kind": 7, "data": {}, "at": 1764694000.5}',
        "data not an object": '{"src_seq": 1, "kind": "log", "data": [1], "at": 1764694000.5}',
        "an event not an object": '"log"',
    }
    good = protocol.event_text(usual[1])
    for what, ev in refused.items():
        for raw in ('{"type": "events", "run_id": "r_1", "events": [' + good + "," + ev + "]}",
                    '{"type": "events", "run_id": "r_1", "events": [' + ev + "," + good + "]}"):
            assert protocol._usual_events_message(raw) is None, what
            with pytest.raises(protocol.ProtocolError) as err:
                protocol.parse_agent_message(raw)
            with pytest.raises(protocol.ProtocolError) as again:
                protocol.parse_agent_message(_strict_layout(raw))
            assert str(err.value) == str(again.value), what
    # A run id too long is refused in passes as one field at a time would refuse it.
    raw = protocol.encode_events("r" * 129, usual[:1])[0]
    with pytest.raises(protocol.ProtocolError, match="events.run_id is 129 characters long"):
        protocol.parse_agent_message(raw)
