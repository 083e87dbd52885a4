"""Size bounds, checked before work is done: graph expansion (preset bombs),
request bodies, enrollment tokens, the enrollment rate limit and the
server's in-memory tables. The control plane runs in this test process
(``InProcServer``), so "the server's memory" is this process's
/proc/<pid>/status: an expansion or a body read whole would show there."""
from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from threaded import InProcServer

from cdui.graph.model import DEFAULT_MAX_NODES
from cdui.plane.enroll import EnrollLimiter, RateLimiter
from cdui.plane.server import HostCheck
from procs import ServerProc, node, trig

MB = 1024 * 1024


@pytest.fixture
def cp(tmp_path):
    s = InProcServer(tmp_path).start()
    yield s
    s.stop()


def rss(server: ServerProc) -> int:
    """Resident memory of the server process, in bytes."""
    for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def preset_of(name: str, inner_type: str, width: int) -> dict[str, Any]:
    return {"preset_name": name, "nodes": [{"id": f"n{i}", "type": inner_type} for i in range(width)]}


def bomb(width: int = 8, depth: int = 9) -> dict[str, Any]:
    """Presets nested ``width`` wide and ``depth`` deep: 8 x 9 is 134 million nodes from ~3 KB."""
    presets = [preset_of("P1", "TensorCreate", width)]
    for d in range(2, depth + 1):
        presets.append(preset_of(f"P{d}", f"preset:P{d - 1}", width))
    return {"format_version": 1, "name": "bomb", "presets": presets,
            "nodes": [node("start", "Start"), node("b", f"preset:P{depth}")], "edges": [trig("start", "b")]}


def near_limit(total: int) -> dict[str, Any]:
    """A valid graph of exactly ``total`` nodes once expanded (Start, one TensorCreate, presets, fillers)."""
    presets = [preset_of("Hundred", "TensorCreate", 100)]
    nodes = [node("start", "Start"), node("t", "TensorCreate")]
    hundreds, rest = divmod(total - 2, 100)
    nodes += [node(f"h{i}", "preset:Hundred") for i in range(hundreds)]
    nodes += [node(f"f{i}", "TensorCreate") for i in range(rest)]
    return {"format_version": 1, "name": "big", "presets": presets, "nodes": nodes, "edges": [trig("start", "t")]}


def test_preset_bomb_is_refused_before_expanding(cp):
    """A 3 KB preset bomb gets 400 graph_too_large on both graph routes, with the server's memory flat."""
    g = bomb()
    assert len(json.dumps(g, separators=(",", ":"))) < 3 * 1024
    before = rss(cp)
    for path, body in (("/api/runs", {"graph": g, "options": {}}), ("/api/graphs/validate", {"graph": g})):
        status, answer = cp.api("POST", path, body, timeout=60)
        assert status == 400, (path, status, answer)
        e = answer["error"]
        assert e["code"] == "graph_too_large", answer
        assert f"more than {DEFAULT_MAX_NODES} nodes" in e["message"]
        assert f"limit of {DEFAULT_MAX_NODES}" in e["message"]
        assert "CODEFYUI_GRAPH_MAX_NODES" in e["hint"]
    assert rss(cp) - before < 50 * MB
    assert cp.call("GET", "/api/runs", expect=200) == []  # nothing stored
    assert cp.raw("GET", "/api/health", token=False).status == 200


def test_graph_at_the_limit_validates_and_one_more_node_is_refused(cp):
    status, answer = cp.api("POST", "/api/graphs/validate", {"graph": near_limit(DEFAULT_MAX_NODES)})
    assert status == 200 and answer["valid"] is True, answer
    status, answer = cp.api("POST", "/api/graphs/validate", {"graph": near_limit(DEFAULT_MAX_NODES + 1)})
    assert status == 400 and answer["error"]["code"] == "graph_too_large", answer
    assert f"expand to {DEFAULT_MAX_NODES + 1} nodes" in answer["error"]["message"], answer


def test_graph_max_nodes_setting_is_read(tmp_path):
    s = InProcServer(tmp_path, extra_env={"CODEFYUI_GRAPH_MAX_NODES": "150"}).start()
    try:
        status, answer = s.api("POST", "/api/graphs/validate", {"graph": near_limit(150)})
        assert status == 200 and answer["valid"] is True, answer
        status, answer = s.api("POST", "/api/graphs/validate", {"graph": near_limit(151)})
        assert status == 400 and "limit of 150" in answer["error"]["message"], answer
    finally:
        s.stop()


def raw_post(server: ServerProc, path: str, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, dict[str, Any]]:
    """POST over a plain socket, so the test decides what is declared and what is sent."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        sock.sendall(head.encode())
        try:
            for c in chunks:
                sock.sendall(c)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the whole body went out: what we want
        data = b""
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
            got = sock.recv(65536)
            if not got:
                break
            data += got
    status = int(data.split(b" ", 2)[1])
    body = data.split(b"\r\n\r\n", 1)[1]
    return status, json.loads(body)


def _length(data: bytes) -> int:
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    for line in head.split("\r\n"):
        if line.startswith("content-length:"):
            return int(line.split(":", 1)[1])
    return 0


def test_enroll_refuses_a_huge_body_without_reading_it(cp):
    """POST /api/workers/enroll is public: a declared 500 MB body is refused with 413 from its
    Content-Length, and a chunked one at the limit, with the server's memory flat."""
    before = rss(cp)
    status, body = raw_post(cp, "/api/workers/enroll",
                            {"Content-Type": "application/json", "Content-Length": str(500 * 1000 * 1000)},
                            [b'{"token": "' + b"a" * MB] * 4)
    assert status == 413 and body["error"]["code"] == "too_large", body
    assert "over this route's limit of 16 KiB" in body["error"]["message"], body
    chunk = b'{"token": "' + b"a" * (64 * 1024)
    status, body = raw_post(cp, "/api/workers/enroll",
                            {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                            [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * 64 + [b"0\r\n\r\n"])
    assert status == 413 and body["error"]["code"] == "too_large", body
    assert rss(cp) - before < 50 * MB
    assert cp.raw("GET", "/api/health", token=False).status == 200


def test_json_routes_have_small_body_limits(cp):
    """Authenticated JSON routes take 64 KiB, graph routes CODEFYUI_MAX_GRAPH_BYTES (8 MiB)."""
    big = json.dumps({"ttl_s": 60, "pad": "x" * (65 * 1024)}).encode()
    r = cp.raw("POST", "/api/workers/tokens", big, headers={"Content-Type": "application/json"})
    assert r.status == 413 and r.json()["error"]["code"] == "too_large", r.body[:300]
    graph_body = json.dumps({"graph": {"nodes": [], "pad": "x" * (9 * MB)}}).encode()
    for path in ("/api/runs", "/api/graphs/validate"):
        r = cp.raw("POST", path, graph_body, headers={"Content-Type": "application/json"})
        assert r.status == 413, (path, r.status, r.body[:300])
        assert "CODEFYUI_MAX_GRAPH_BYTES" in r.json()["error"]["message"], r.body[:300]
    assert cp.call("GET", "/api/workers/tokens", expect=200) == []


BAD_TOKEN_BODIES = [
    b'{"ttl_s": 0}', b'{"ttl_s": -5}', b'{"ttl_s": 1e308}', b'{"ttl_s": 1e999}', b'{"ttl_s": NaN}',
    b'{"ttl_s": Infinity}', b'{"ttl_s": 31536001}', b'{"ttl_s": true}', b'{"ttl_s": "3600"}',
    b'{"uses": 0}', b'{"uses": 10001}', b'{"uses": true}', b'{"uses": "2"}', b'{"uses": 1.5}', b'{"uses": -1}',
]


def test_tokens_out_of_range_are_refused_and_nothing_is_stored(cp):
    for raw in BAD_TOKEN_BODIES:
        r = cp.raw("POST", "/api/workers/tokens", raw, headers={"Content-Type": "application/json"})
        assert r.status == 400, (raw, r.status, r.body[:300])
        err = r.json()["error"]
        assert err["code"] in ("bad_request", "bad_json") and err.get("hint"), (raw, err)
    assert cp.call("GET", "/api/workers/tokens", expect=200) == []
    # Reissue's lifetime gets the same checks (for an enrolled worker).
    tok = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 1}, expect=201)
    status, body = cp.api("POST", "/api/workers/enroll", {"token": tok["token"], "name": "w1", "devices": ["cpu"]},
                          token=False)
    assert status == 201, body
    for raw in (b'{"ttl_s": 0}', b'{"ttl_s": 1e308}', b'{"ttl_s": NaN}', b'{"ttl_s": "x"}'):
        r = cp.raw("POST", "/api/workers/w1/reissue", raw, headers={"Content-Type": "application/json"})
        assert r.status == 400, (raw, r.status, r.body[:300])
    listed = cp.call("GET", "/api/workers/tokens", expect=200)
    assert [t["id"] for t in listed] == [tok["id"]], listed
    assert cp.call("POST", "/api/workers/w1/reissue", {"ttl_s": 60}, expect=201)["worker"] == "w1"


def test_enrollment_rate_limit_counts_failures_only_and_per_token(cp):
    """25 agents behind one address enroll with one multi-use token (successes do not count);
    20 failed attempts with one unknown token then get 429 for that token, which names the wait,
    while a valid token from the same address still enrolls."""
    tok = cp.call("POST", "/api/workers/tokens", {"ttl_s": 3600, "uses": 30}, expect=201)["token"]
    for i in range(25):
        status, body = cp.api("POST", "/api/workers/enroll", {"token": tok, "name": f"a{i}", "devices": ["cpu"]},
                              token=False)
        assert status == 201, (i, body)
    for i in range(20):
        status, body = cp.api("POST", "/api/workers/enroll", {"token": "aaaaaa.bbbbbbbbbbbbbbbb", "name": f"x{i}"},
                              token=False)
        assert status == 401 and body["error"]["code"] == "token_unknown", (i, body)
    status, body = cp.api("POST", "/api/workers/enroll", {"token": "aaaaaa.bbbbbbbbbbbbbbbb", "name": "x20"},
                          token=False)
    assert status == 429 and body["error"]["code"] == "rate_limited", body
    assert "try again in" in body["error"]["hint"]
    status, body = cp.api("POST", "/api/workers/enroll", {"token": tok, "name": "late", "devices": ["cpu"]},
                          token=False)
    assert status == 201 and body["worker"] == "late", body


# (failures: [(address, token)], then the attempt, whether it is blocked)
T1, T2, T3 = "aaaaaa.0123456789abcdef", "bbbbbb.0123456789abcdef", "cccccc.0123456789abcdef"
LIMITER_TABLE = [
    ("a token's own failures block it", [("10.0.0.1", T1)] * 3, ("10.0.0.1", T1), True),
    ("another token from that address still goes through", [("10.0.0.1", T1)] * 3, ("10.0.0.1", T2), False),
    ("that token from another address goes through", [("10.0.0.1", T1)] * 3, ("10.0.0.2", T1), False),
    ("guesses at one token's secret share its bucket", [("10.0.0.1", "aaaaaa.zzzzzzzzzzzzzzzz"),
                                                         ("10.0.0.1", "aaaaaa.yyyyyyyyyyyyyyyy"),
                                                         ("10.0.0.1", "aaaaaa.xxxxxxxxxxxxxxxx")],
     ("10.0.0.1", T1), True),
    ("anything that is not a token shares one bucket", [("10.0.0.1", None), ("10.0.0.1", 7), ("10.0.0.1", "x")],
     ("10.0.0.1", "junk"), True),
    ("below the limit", [("10.0.0.1", T1)] * 2, ("10.0.0.1", T1), False),
    ("token after token: the address is cut off at ten times the limit",
     [("10.0.0.1", f"{i:06d}.0123456789abcdef") for i in range(30)], ("10.0.0.1", T3), True),
    ("... but not before", [("10.0.0.1", f"{i:06d}.0123456789abcdef") for i in range(29)], ("10.0.0.1", T3), False),
]


@pytest.mark.parametrize("why, failures, attempt, blocked", LIMITER_TABLE, ids=[r[0] for r in LIMITER_TABLE])
def test_enroll_limiter_counts_per_token_and_address(why, failures, attempt, blocked):
    now = [1000.0]
    rl = EnrollLimiter(3, window=60, clock=lambda: now[0])
    for address, token in failures:
        rl.failure(address, token)
    assert (rl.blocked(*attempt) is not None) == blocked
    now[0] += 61  # a minute later every bucket is open again
    assert rl.blocked(*attempt) is None


def test_rate_limiter_table_is_bounded_and_pruned():
    now = [1000.0]
    rl = RateLimiter(3, window=60, clock=lambda: now[0], max_keys=100)
    for _ in range(3):
        rl.failure("a")
    assert rl.blocked("a") == pytest.approx(60)
    now[0] += 61
    assert rl.blocked("a") is None and "a" not in rl.hits  # old failures are pruned, key and all
    for i in range(1000):
        rl.failure(f"10.0.{i // 256}.{i % 256}")
    assert len(rl.hits) <= 100
    assert "10.0.3.231" in rl.hits  # the latest stays


def test_host_check_cache_is_bounded():
    hc = HostCheck(8000, [])
    for i in range(2000):
        hc.allowed(f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}:8000")
    assert len(hc._cache) == HostCheck.CACHE_SIZE
    assert hc.allowed("127.0.0.1:8000")
