"""Every refusal the `cdui` command line can be sent is printed as one clear line, never a traceback.

The real CLI (``cdui.cli.cli.main``, in a thread: it is a blocking client) against
a real control plane in this process; a worker whose catalog lacks a type is a
fake agent speaking the real protocol. The shapes no cdui server sends (a
proxy's HTML error page, ``{"error": "text"}``) come from a small aiohttp app
standing in for that proxy. One case runs ``bin/cdui`` itself, in a process
(tests/test_cli.py, ``test_run_refusals_are_one_line``).
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from harness import FakeAgent, Plane, graph

from cdui.cli import cli
from cdui.run import catalog


async def cdui(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``cdui ARGV``."""
    capsys.readouterr()
    rc = await asyncio.to_thread(cli.main, list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cdui: error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def env(dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("CODEFYUI_USER_DATA_DIR", str(dirs["user_data"]))
    monkeypatch.setenv("CODEFYUI_DATA_DIR", str(dirs["data_dir"]))
    return dirs


def _graph_file(tmp: Path, g: dict[str, Any], name: str = "g.json") -> str:
    path = tmp / name
    path.write_text(json.dumps(g))
    return str(path)


async def test_run_refusals_of_the_control_plane(env: dict[str, Path], tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    async with Plane(**env, CODEFYUI_RUN_QUEUE_MAX_CONCURRENT="local/cpu=0") as cp:
        agent = await FakeAgent(cp, catalog=None).enroll()
        own = catalog.node_catalog(cp.runs.registry)
        agent.catalog = {"types": [t for t in own["types"] if t != "TensorCreate"], "hash": "sha256:" + "0" * 64}
        await agent.connect()
        g = _graph_file(tmp_path, graph())
        c = ["--control", cp.url]
        cases = [
            # (argv, the code the API answers the same request with, the one line the CLI prints)
            (["run", g, "--target", "w1", *c], "missing_node_types",
             "cdui: error: worker w1 lacks node type(s) the graph uses: TensorCreate (it is degraded: its node catalog "
             "differs from the control plane's) (install the same plugins and custom nodes on w1 and restart its "
             "agent, or target another worker (see docs/workers-in-sync.md))"),
            (["run", g, "--target", "nosuch", *c], "unknown_worker",
             "cdui: error: no worker named 'nosuch' is enrolled (enrolled workers: w1; add one with `cdui workers "
             "token`)"),
            (["run", g, "--device", "tpu", *c], "bad_device",
             "cdui: error: device 'tpu' is not valid (use cpu, cuda, cuda:N or auto)"),
            (["run", g, "--device", "cuda:-1", *c], "bad_device",
             "cdui: error: device 'cuda:-1' is not valid (use cpu, cuda, cuda:N or auto)"),
            (["run", g, "--device", "cpu", "--devices", "2", *c], "device_set_too_large", None),
            (["run", g, "--device", "cuda:0", "--devices", "2", *c], "bad_devices",
             "cdui: error: a set of 2 devices cannot be on the one device 'cuda:0' (name the kind (\"device\": "
             "\"cuda\" or \"cpu\") and the count (\"devices\": N))"),
            (["run", g, "--memory-mb", "0", *c], "bad_memory_mb", None),
            (["workers", "drain", "nosuch", *c], "not_found", None),
        ]
        for argv, code, line in cases:
            if argv[0] == "run":
                status, body = await cp.api("POST", "/api/runs", {"graph": graph(), "options": cli_options(argv)})
                assert status == 400 and body["error"]["code"] == code, body
            rc, out, err = await cdui(capsys, *argv)
            assert (rc, out) == (1, ""), err
            assert one_line(err) == line or line is None
        await agent.close()


def cli_options(argv: list[str]) -> dict[str, Any]:
    """The options `cdui run` sends for ``argv`` (to ask the API the same question directly)."""
    args = cli.build_parser().parse_args(argv)
    options: dict[str, Any] = {"target": cli._target(args.target)}
    if args.device:
        options["device"] = args.device
    if args.devices is not None:
        options["devices"] = args.devices
    if args.memory_mb is not None:
        options["memory_mb"] = args.memory_mb
    return options


async def test_too_large_and_unauthorized(env: dict[str, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    async with Plane(**env, CODEFYUI_MAX_GRAPH_BYTES="2KiB") as cp:
        big = graph()
        big["nodes"][1]["data"]["params"]["label"] = "x" * 4096
        rc, _, err = await cdui(capsys, "run", _graph_file(tmp_path, big), "--control", cp.url)
        assert rc == 1 and "CODEFYUI_MAX_GRAPH_BYTES" in one_line(err), err
        (env["user_data"] / "session-token").write_text("not-the-token")
        rc, _, err = await cdui(capsys, "run", _graph_file(tmp_path, graph()), "--control", cp.url)
        assert rc == 1, err
        assert one_line(err).startswith("cdui: error: "), err


async def test_answers_in_shapes_no_cdui_server_sends(env: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A reverse proxy in front of the server answers with its own pages; each is one line naming the status."""
    answers = {
        "/html": web.Response(status=502, text="<html>\n<body><h1>502 Bad Gateway</h1>\n</body></html>",
                              content_type="text/html"),
        "/text-error": web.json_response({"error": "upstream timed out\nretry later"}, status=504),
        "/empty": web.Response(status=503),
        "/list-details": web.json_response({"error": {"code": "invalid_graph", "message": "bad",
                                                      "details": ["not a dict"]}}, status=400),
        "/null": web.json_response(None, status=500),
    }

    async def handler(request: web.Request) -> web.StreamResponse:
        return answers[request.path.removesuffix("/api/runs").rstrip("/") or "/"]

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    proxy = TestServer(app, host="127.0.0.1")
    await proxy.start_server()
    try:
        (env["user_data"]).mkdir(parents=True, exist_ok=True)
        g = _graph_file(tmp_path, graph())
        expect = {
            "/html": "cdui: error: POST /api/runs answered HTTP 502: <html> <body><h1>502 Bad Gateway</h1> "
                     "</body></html>",
            "/text-error": "cdui: error: upstream timed out retry later",
            "/empty": "cdui: error: POST /api/runs answered HTTP 503",
            "/list-details": "cdui: error: bad",
            "/null": "cdui: error: POST /api/runs answered HTTP 500",
        }
        for prefix, line in expect.items():
            rc, out, err = await cdui(capsys, "run", g, "--control", str(proxy.make_url(prefix)))
            assert (rc, out, one_line(err)) == (1, "", line)
    finally:
        await proxy.close()


async def test_status_counts_every_run(env: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """`cdui status` counts every run the server has, not the newest 1,000 of them."""
    import os
    import time
    from dataclasses import replace

    from cdui.plane.appkeys import STORE
    from cdui.plane.store import Run
    from cdui.wire.target import Local
    async with Plane(**env) as cp:
        store = cp.app[STORE]
        base = Run(id="", name="r", status="succeeded", target=Local(), options={"target": "local"},
                   graph={"nodes": []}, created_at=time.time())
        await asyncio.gather(*(store.create_run(replace(base, id=f"old{i:04}")) for i in range(1200)))
        await asyncio.gather(*(store.create_run(replace(base, id=f"q{i}", status="failed")) for i in range(5)))
        # What `cdui start` records for the command line: its URL and pid (this process stands in for it).
        (env["user_data"] / "server.json").write_text(json.dumps({"url": cp.url, "pid": os.getpid()}))
        (env["user_data"] / "cdui.pid").write_text(str(os.getpid()))
        rc, out, err = await cdui(capsys, "status", "--once")
        assert (rc, err) == (0, ""), err
        assert out.rstrip("\n").endswith("; runs: 5 failed, 1200 succeeded"), out
        assert await cp.call("GET", "/api/runs/counts") == {"counts": {"failed": 5, "succeeded": 1200},
                                                           "total": 1205}
