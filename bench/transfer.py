"""Benchmark 4: a 1 GiB input fetched and a 1 GiB output uploaded by a real agent, vs curl; a 10 GiB input.

A control plane and an agent process that counts as another machine (so the
run uses the transfer backend). A custom node (``BigIO``) reads an upload,
writes an output of the same size, then waits for a flag file. Measured, on
the same loopback server and in the same run:

- the agent fetching the input (streamed to disk, sha256 checked before it
  enters the cache) vs ``curl`` GETting the same download route with the
  worker's credential;
- the agent uploading the output after the run (``POST .../artifacts/upload``,
  the server hashing it on the way) vs ``curl`` POSTing the same file to the
  same route with the worker's credential, while the run waits on the flag;
- the agent's peak RSS (``VmHWM``, reset before each phase) over its idle RSS
  during each transfer, and during the download of a second, 10 GiB input (a
  sparse file on the control plane: memory does not depend on the bytes, and
  the disk is spared 10 GiB): transfers stream, so it stays flat whatever the
  file size.

The agent's download is timed from its temporary file appearing to the
checked file in its cache; its upload from the server's temporary file
appearing to the stored file (the agent hashes the file before it sends it:
that pass is reported on its own). The files are deleted afterwards.

Beside each upload's rate, the CPU each side spent on it (the sender: the
agent process, or curl; the receiver: the control plane), per GiB: on a busy
machine the rates swing with the neighbours, the CPU per byte much less. Each
timed transfer starts with the disk's dirty pages written out (``sync``), so
that none is slowed by the writes of the one before, and every round ends by
removing all it stored (its kept artifacts included), so that each starts as
the first did.

curl's own rate swings from one minute to the next on a shared machine, so the
agent and curl take turns: ``--pairs`` rounds (5 by default; 1 in the smoke
run), each a fresh input fetched by the agent then by curl, and the run's output
uploaded by curl then by the agent. A ratio is the median of the rounds' own
ratios (each of a pair on the same minute), a rate the median of the rounds'.

    .venv/bin/python bench/transfer.py [--mib 1024] [--big-mib 10240] [--pairs 3]
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from common import AgentProc, Figure, Server, cpu_s, parser, report, rss_mb, say, wait_run

BIGIO_NODE = '''
import os
import time
from pathlib import Path

from cdui.nodes.base import Node, Param, Port


class BigIO(Node):
    """Reads an upload, writes ``mib`` MiB to output/<out>, waits for ``flag`` (benchmark only)."""
    NODE_NAME = "BigIO"
    CATEGORY = "bench"
    WRITES_TO = "output"

    @classmethod
    def define_params(cls):
        return [Param("input", "data_file", ""), Param("out", "output_path", "big.bin"), Param("mib", "int", 1),
                Param("flag", "string", "")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        size = ctx.resolve_upload("files", params["input"]).stat().st_size
        p = ctx.output_path("output", params["out"])
        block = os.urandom(8 << 20)
        with open(p, "wb") as fh:
            for _ in range(int(params["mib"]) // 8):
                fh.write(block)
        ctx.log(f"read {size} bytes, wrote {p.stat().st_size}")
        while params["flag"] and not Path(params["flag"]).exists():
            if ctx.should_stop():
                break
            time.sleep(0.02)
        return {"value": float(size)}
'''

GIB = 1 << 30


def install_bigio(data_dir: Path) -> None:
    (data_dir / "custom_nodes").mkdir(parents=True, exist_ok=True)
    (data_dir / "custom_nodes" / "bigio.py").write_text(BIGIO_NODE)


def bigio_graph(mib: int, flag: Path, name: str = "big.bin") -> dict[str, Any]:
    return {"format_version": 1, "name": "transfer", "nodes": [
        {"id": "start", "type": "Start", "position": {"x": 0, "y": 0}, "data": {"params": {}}},
        {"id": "b", "type": "BigIO", "position": {"x": 0, "y": 0},
         "data": {"params": {"input": name, "out": name, "mib": mib, "flag": str(flag)}}}],
        "edges": [{"id": "t", "source": "start", "sourceHandle": "trigger", "target": "b", "targetHandle": None,
                   "type": "trigger"}]}


def write_random(path: Path, mib: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    block = os.urandom(8 << 20)
    with open(path, "wb") as fh:
        for _ in range(mib // 8):
            fh.write(block)


def reset_hwm(pid: int) -> None:
    """Start the process's peak RSS afresh (Linux: 5 > /proc/PID/clear_refs), so that a phase's peak is its own."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass  # then the peak is the process's whole life's: an upper bound


def hwm_mb(pid: int) -> float:
    """Peak resident set size of one process so far, in MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e6
    return 0.0


def watch(appears: Any, done: Any, timeout: float = 600, on_start: Any = None) -> tuple[float, float]:
    """Poll until ``appears()`` and then ``done()`` hold; the monotonic time each was first seen.
    ``on_start()`` is called once, when the start is seen."""
    deadline = time.monotonic() + timeout
    t_start: float | None = None
    while True:
        now = time.monotonic()
        if t_start is None and (appears() or done()):
            t_start = now
            if on_start is not None:
                on_start()
        if t_start is not None and done():
            return t_start, now
        if now > deadline:
            raise TimeoutError("the transfer did not finish within the benchmark's timeout")
        time.sleep(0.002)


def settle_disk() -> None:
    """Write out the dirty pages before a timed transfer: each phase writes a GiB or more, and one that
    started while the last one's pages were still being written would be throttled by them, not by its own
    sender or receiver (the agent's upload comes last, after five of them)."""
    os.sync()


def curl(args: list[str]) -> tuple[float, float]:
    """Run curl; (the seconds it took, the CPU seconds it used)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run(["curl", "-sS", "--fail-with-body", "-o", os.devnull if "-F" in args else args.pop(0),
                          *args], capture_output=True, text=True)
    took = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise RuntimeError(f"curl exited {res.returncode}: {res.stderr[-500:]} {res.stdout[-500:]}")
    return took, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def measure(mib: int, big_mib: int, pairs: int) -> list[Figure]:
    most = max(4 * GIB, (big_mib << 20) + GIB)
    env = {"CODEFYUI_MAX_UPLOAD_SIZE": str(4 * GIB), "CODEFYUI_TRANSFER_MAX_INPUT_BYTES": str(most)}
    with tempfile.TemporaryDirectory(prefix="cdui-bench-", dir=os.environ.get("CDUI_BENCH_TMP")) as tmp:
        srv = Server(Path(tmp), env)
        install_bigio(srv.data_dir)  # before it starts: custom nodes are read at start
        srv.start()
        try:
            figures = _measure(srv, mib, big_mib, pairs)
        finally:
            srv.stop()
    return figures


def _measure(srv: Server, mib: int, big_mib: int, pairs: int) -> list[Figure]:
    size = mib << 20
    agent = AgentProc(srv, "w1", extra_env={"CODEFYUI_MACHINE_ID": "another-machine"})
    install_bigio(agent.data_dir)
    agent.start()
    try:
        idle = rss_mb(agent.pid)
        rounds = [one_round(srv, agent, mib, k) for k in range(pairs)]
        big_get, peak_big = fetch_big(srv, agent, big_mib)
    finally:
        agent.stop()
        for p in (srv.data_dir / "files", srv.data_dir / "output", srv.data_dir / "runs",
                  agent.user_data / "agent-cache", agent.user_data / "agent-runs"):
            shutil.rmtree(p, ignore_errors=True)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    def ratio(a: str, b: str) -> float:
        return statistics.median(r[a] / r[b] for r in rounds)

    def each(a: str, b: str) -> str:
        return ", ".join(f"{r[a] / r[b]:.2f}" for r in rounds)

    B = "transfer"
    mb = 1e6
    gib, big = size_text(mib), size_text(big_mib)
    per_gib = size / GIB
    of = f"median of {pairs}" if pairs > 1 else "1 round"
    def pairs_note(a: str, b: str) -> str:
        return (f"median of the {pairs} rounds' ratios, {each(a, b)}; agent and curl in turn, on the same minute"
                if pairs > 1 else "1 round")
    hashed = ", ".join(f"{r['hash_s']:.1f}" for r in rounds)
    return [
        Figure(B, f"agent fetches a {gib} input (sha256 checked)", med("agent_get") / mb, "MB/s", note=of),
        Figure(B, f"curl GETs the same {gib} from the same route", med("curl_get") / mb, "MB/s", note=of),
        Figure(B, "agent/curl download throughput (sha256 checked)", ratio("agent_get", "curl_get"), "x", 0.9,
               better="higher", note=pairs_note("agent_get", "curl_get")),
        Figure(B, f"agent uploads a {gib} output", med("agent_put") / mb, "MB/s",
               note=f"{of}; after {hashed} s hashing it and ending the run"),
        Figure(B, f"curl POSTs the same {gib} to the same route", med("curl_put") / mb, "MB/s", note=of),
        Figure(B, "agent/curl upload throughput", ratio("agent_put", "curl_put"), "x", 1.0, better="higher",
               note=pairs_note("agent_put", "curl_put")),
        Figure(B, "CPU of the sender per GiB uploaded: the agent", med("agent_cpu") / per_gib, "s", note=of),
        Figure(B, "CPU of the sender per GiB uploaded: curl", med("curl_cpu") / per_gib, "s", note=of),
        Figure(B, "CPU of the control plane per GiB received: from the agent", med("srv_cpu_agent") / per_gib, "s",
               note=of),
        Figure(B, "CPU of the control plane per GiB received: from curl", med("srv_cpu_curl") / per_gib, "s",
               note=of),
        Figure(B, "agent idle RSS", idle, "MB"),
        Figure(B, f"agent peak RSS over idle, during the {gib} download", max(r["peak_get"] for r in rounds) - idle,
               "MB", 64.0, note=f"the highest of {pairs}" if pairs > 1 else ""),
        Figure(B, f"agent peak RSS over idle, during the {gib} upload", max(r["peak_put"] for r in rounds) - idle,
               "MB", 64.0, note=f"the highest of {pairs}" if pairs > 1 else ""),
        Figure(B, f"agent fetches a {big} input (sha256 checked)", big_get / mb, "MB/s"),
        Figure(B, f"agent peak RSS over idle, during the {big} download", peak_big - idle, "MB", 64.0),
    ]


def one_round(srv: Server, agent: AgentProc, mib: int, k: int) -> dict[str, float]:
    """One round, on the same minute: the agent fetches a fresh input (its own bytes: never in the agent's
    cache), curl GETs it, curl POSTs the run's output, the agent uploads it. Rates in bytes/s, CPU in s."""
    size = mib << 20
    name = f"big-{k}.bin"
    say(f"round {k + 1}: writing the {mib} MiB input")
    write_random(srv.data_dir / "files" / name, mib)
    cache = agent.user_data / "agent-cache"
    flag = srv.root / f"flag-{k}"
    settle_disk()
    run = srv.call("POST", "/api/runs", {"graph": bigio_graph(mib, flag, name),
                                         "options": {"target": "w1", "device": "cpu"}})
    inp = (run.get("options") or {}).get("files", {}).get("inputs") or []
    sha = inp[0]["sha256"] if inp else None
    if sha is None:
        raise RuntimeError(f"the run is not a transfer run: {json.dumps(run.get('options'))[:500]}")
    say(f"round {k + 1}: the agent fetches the input")
    reset_hwm(agent.pid)
    t0, t1 = watch(lambda: cache.is_dir() and any(p.name.endswith(".tmp") for p in cache.iterdir()),
                   lambda: (cache / sha).is_file())
    r: dict[str, float] = {"agent_get": size / (t1 - t0), "peak_get": hwm_mb(agent.pid)}
    out = agent.user_data / "agent-runs" / run["id"] / "data" / "output" / name
    # The run now writes its output and waits on the flag; the run stays active for curl's turn.
    deadline = time.monotonic() + 600
    while not (out.is_file() and out.stat().st_size == size
               and any(e["kind"] == "log" for e in srv.call("GET", f"/api/runs/{run['id']}/events?after=0"))):
        if time.monotonic() > deadline:
            raise TimeoutError("the run did not write its output")
        time.sleep(0.05)
    auth = f"Authorization: Bearer {agent.credential()}"
    say(f"round {k + 1}: curl fetches the input")
    settle_disk()
    got = srv.root / "curl-got.bin"
    r["curl_get"] = size / curl([str(got), "-H", auth, f"{srv.url}/api/files/download/{name}"])[0]
    got.unlink()
    say(f"round {k + 1}: curl uploads the output")
    settle_disk()
    meta = json.dumps({"group": "artifact", "kind": "output", "name": f"curl-{k}.bin"})
    srv_cpu = cpu_s(srv.pid)
    took, r["curl_cpu"] = curl(["-H", auth, "-F", f"meta={meta};type=application/json",
                                "-F", f"file=@{out};type=application/octet-stream",
                                f"{srv.url}/api/runs/{run['id']}/artifacts/upload"])
    r["curl_put"], r["srv_cpu_curl"] = size / took, cpu_s(srv.pid) - srv_cpu
    # curl's upload is gone before the agent's, kept copy included (each upload is kept under its sha256, a
    # hard link in data/artifacts), as curl's download was before curl's upload: each sender's upload then
    # meets the same page cache. Left in place, the agent's upload alone wrote with a GiB more of it cached,
    # and the control plane's kernel time per GiB received doubled on the days this VM charges for that.
    shutil.rmtree(srv.data_dir / "runs" / run["id"] / "output", ignore_errors=True)
    shutil.rmtree(srv.data_dir / "artifacts", ignore_errors=True)
    say(f"round {k + 1}: the agent uploads the output")
    settle_disk()
    dest = srv.data_dir / "output"
    before_hash = time.monotonic()
    reset_hwm(agent.pid)
    flag.touch()
    cpu0: list[float] = []
    t2, t3 = watch(lambda: dest.is_dir() and any(p.name.startswith(".upload-") for p in dest.iterdir()),
                   lambda: (dest / name).is_file(),
                   on_start=lambda: cpu0.extend((cpu_s(agent.pid), cpu_s(srv.pid))))
    r["agent_cpu"], r["srv_cpu_agent"] = cpu_s(agent.pid) - cpu0[0], cpu_s(srv.pid) - cpu0[1]
    # A small file (the smoke size) can be sent whole between two polls of the watcher: never 0 s.
    r["agent_put"] = size / max(t3 - t2, 1e-6)
    r["hash_s"] = t2 - before_hash
    r["peak_put"] = hwm_mb(agent.pid)
    end = wait_run(srv, run["id"], interval=0.05)
    if end["status"] != "succeeded":
        raise RuntimeError(f"run {run['id']} ended {end['status']}: {end['error']}")
    # The round's kept artifacts too (each upload is kept under its sha256, a hard link in data/artifacts): left
    # in place, a GiB more of them stayed in the page cache each round, and from the fourth round on the control
    # plane spent twice the kernel time per GiB received in the round's last phase, the agent's upload (with
    # sendfile or without; dropping the page cache between rounds cured it as well: the machine's memory, not
    # either sender). Every round starts as the first did.
    for q in (srv.data_dir / "files", srv.data_dir / "output", srv.data_dir / "runs", cache,
              agent.user_data / "agent-runs", srv.data_dir / "artifacts"):
        shutil.rmtree(q, ignore_errors=True)
    gib = size / GIB
    say(f"round {k + 1}: download agent {r['agent_get'] / 1e6:.0f} / curl {r['curl_get'] / 1e6:.0f} MB/s; upload agent "
        f"{r['agent_put'] / 1e6:.0f} / curl {r['curl_put'] / 1e6:.0f} MB/s, the control plane's CPU per GiB received "
        f"{r['srv_cpu_agent'] / gib:.2f} / {r['srv_cpu_curl'] / gib:.2f} s")
    return r


def size_text(mib: int) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib} MiB"


def fetch_big(srv: Server, agent: AgentProc, mib: int) -> tuple[float, float]:
    """A run that only reads a ``mib`` MiB input: (the agent's download rate in bytes/s, its peak RSS in MB)."""
    size = mib << 20
    src = srv.data_dir / "files" / "huge.bin"
    src.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "wb") as fh:
        fh.truncate(size)  # sparse: no disk space, and read back as fast as the page cache
    graph = bigio_graph(0, Path(""))
    graph["nodes"][1]["data"]["params"].update({"input": "huge.bin", "flag": ""})
    say(f"the agent fetches a {size_text(mib)} input (the control plane hashes it first)")
    run = srv.call("POST", "/api/runs", {"graph": graph, "options": {"target": agent.name, "device": "cpu"}},
                   timeout=1800)
    sha = run["options"]["files"]["inputs"][0]["sha256"]
    cache = agent.user_data / "agent-cache"
    reset_hwm(agent.pid)
    try:
        t0, t1 = watch(lambda: cache.is_dir() and any(p.name.endswith(".tmp") for p in cache.iterdir()),
                       lambda: (cache / sha).is_file(), timeout=3600)
        peak = hwm_mb(agent.pid)
        end = wait_run(srv, run["id"], timeout=3600, interval=0.1)
        if end["status"] != "succeeded":
            raise RuntimeError(f"run {run['id']} ended {end['status']}: {end['error']}")
    finally:
        src.unlink(missing_ok=True)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(agent.user_data / "agent-runs", ignore_errors=True)
    return size / (t1 - t0), peak


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--mib", type=int, default=1024, help="size of the input and of the output, in MiB")
    p.add_argument("--big-mib", type=int, default=10240, help="size of the input whose download's memory is "
                                                               "measured, in MiB")
    p.add_argument("--pairs", type=int, default=5, help="rounds of agent then curl, each way (the ratios are "
                                                         "the median of the rounds' own)")
    a = p.parse_args()
    mib = 16 if a.smoke else max(8, a.mib - a.mib % 8)
    big = 32 if a.smoke else max(8, a.big_mib)
    report(measure(mib, big, 1 if a.smoke else max(1, a.pairs)), a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
