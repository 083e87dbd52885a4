"""Saved graphs, and calling a saved graph as an API function.

- ``PUT /api/graphs/{name}`` saves a graph (the body is the graph, or
  ``{"graph": ...}``) as ``data/graphs/<name>.json``; ``GET /api/graphs`` lists
  them with their contracts from the index (cdui.plane.graph_index), never parsing a
  graph on the event loop; ``GET`` / ``DELETE /api/graphs/{name}``.
- ``POST /api/graph/run/{name}`` ``{inputs, timeout_s, device, target,
  record_outputs}`` submits the graph as an ordinary run (so it is queued,
  placed on ``target`` — a worker name runs it there — logged and kept like
  any run), waits for it to end, and answers CodefyUI's envelope
  ``{status, run_id, graph, app, version, device, outputs, error, timing}``
  with each GraphOutput's value under its name. A broken contract is 409
  (cdui.graph.contract); a call that outlives ``timeout_s`` stops its run and
  answers 504 with status ``timeout``.

In project mode (``cdui start --project DIR``, cdui/core/project.py) a graph is two files, as in
CodefyUI: ``graphs/<name>.graph.json`` (its logic) and ``layout/<name>.layout.json`` (where its nodes
sit). ``PUT`` splits what the page sends and writes only the file whose content changed, so a save
after a drag changes only the layout file; ``GET`` and a call merge the two back.

A saved graph never holds a secret: ``PUT`` blanks every ``secret``-typed
param (a Webhook's or LLMChat's key) before the file is written, as a run
does before its graph is stored, and answers where it blanked one
(``secrets_removed``); ``GET`` blanks them too (a file saved by an older
version may still hold one). A call gets its secrets in its own body,
``"secrets": {NODE_ID: {PARAM: value}}``, which live in memory for that run
only, as a submitted run's do (LLMChat may instead use this machine's
``OPENAI_API_KEY``/``ANTHROPIC_API_KEY`` for the provider's own host).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from cdui import __version__
from cdui.core import project
from cdui.core.atomic import atomic_write
from cdui.core.errors import CduiError, NotFound
from cdui.graph.contract import contract_of, fill_inputs
from cdui.graph.secrets import describe_path, split_secrets
from cdui.nodes.builtin.graph_io import GRAPH_OUTPUT_EVENT
from cdui.plane import graph_index
from cdui.plane.appkeys import GRAPH_INDEX
from cdui.plane.http.httpjson import read_json
from cdui.plane.runs import RUNS
from cdui.plane.store import TERMINAL

GRAPH_NAME = graph_index.GRAPH_NAME
# Names that read as route words, never graph names.
RESERVED = {"validate", "run"}
DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S = 300.0, 7 * 86400.0


def _folder(request: web.Request) -> Path:
    return Path(request.app[RUNS].layout.folder("graphs"))


def _project(request: web.Request) -> Path | None:
    """The open project's folder, or None when graphs are single files in the data folder."""
    opened = request.app[RUNS].config["CODEFYUI_PROJECT_DIR"]
    return Path(opened) if opened else None


def _suffix(request: web.Request) -> str:
    return project.GRAPH_SUFFIX if _project(request) is not None else ".json"


def _name(request: web.Request) -> str:
    return check_name(request.match_info["name"])


def _load(request: web.Request, name: str) -> dict[str, Any]:
    limit = request.app[RUNS].config["CODEFYUI_MAX_GRAPH_BYTES"]
    opened = _project(request)
    if opened is not None:
        if not (opened / "graphs" / f"{name}{project.GRAPH_SUFFIX}").is_file():
            raise NotFound("graph", name, hint="save it with PUT /api/graphs/{name}; list them with GET /api/graphs")
        return project.load_graph(opened, name, limit)
    path = _folder(request) / f"{name}.json"
    try:
        if path.stat().st_size > limit:
            raise CduiError("graph_too_large", f"saved graph {name!r} is larger than CODEFYUI_MAX_GRAPH_BYTES")
        graph = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NotFound("graph", name, hint="save it with PUT /api/graphs/{name}; list them with GET /api/graphs") \
            from None
    except ValueError as exc:
        raise CduiError("bad_graph", f"saved graph {name!r} is not valid JSON ({exc})", status=500,
                        hint="save it again with PUT /api/graphs/{name}") from None
    if not isinstance(graph, dict):
        raise CduiError("bad_graph", f"saved graph {name!r} is not a JSON object", status=500)
    return graph


def load_saved(request: web.Request, name: str) -> dict[str, Any]:
    """A saved graph by its (checked) name, as a call of it reads it; 404 when there is none."""
    return _load(request, name)


# An index entry written by _save describes a graph whose secrets were blanked before it was written.
SECRETS_BLANKED = "secrets_blanked"


def _save(path: Path, graph: dict[str, Any], name: str, opened: Path | None = None) -> dict[str, Any]:
    """Write the graph (its secrets already blanked) and its index entry (in a thread); its listing entry.

    In a project, the logic goes to ``path`` and the positions to the layout file, each written only when
    its content changed."""
    if opened is None:
        atomic_write(path, json.dumps(graph))
    else:
        logic, layout = project.split_graph(graph)
        # The layout first: a save cut short leaves the logic as it was, which is what a reviewer reads.
        project.write_if_changed(opened / "layout" / f"{name}{project.LAYOUT_SUFFIX}", project.dumps(layout))
        project.write_if_changed(path, project.dumps(logic))
    st = path.stat()
    meta = {**graph_index.describe(graph), SECRETS_BLANKED: True}
    graph_index.write_entry(path.parent, name, st, meta)
    out = {"name": name, "size": st.st_size, "modified_at": st.st_mtime,
           **{k: meta[k] for k in ("callable", "contract", "nodes", "title")}}
    if meta.get("not_callable_because"):
        out["not_callable_because"] = meta["not_callable_because"]
    return out


async def put_graph(request: web.Request) -> web.Response:
    name = _name(request)
    service = request.app[RUNS]
    body = await read_json(request, service.config["CODEFYUI_MAX_GRAPH_BYTES"], "CODEFYUI_MAX_GRAPH_BYTES")
    graph = body["graph"] if isinstance(body, dict) and isinstance(body.get("graph"), dict) else body
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise CduiError("bad_graph", "the body must be a graph (an object with a 'nodes' list) or {\"graph\": ...}",
                        hint="send the graph JSON CodefyUI exports")
    out, created = await save_graph(request, name, graph)
    return web.json_response(out, status=201 if created else 200)


def check_name(name: str) -> str:
    """``name`` as a saved graph's name, or :class:`CduiError` ``bad_name``."""
    if not GRAPH_NAME.match(name) or name.endswith(".json") or name in RESERVED:
        raise CduiError("bad_name", f"graph name {name[:100]!r} is not valid",
                        hint="use up to 100 letters, digits, '_', '-' and '.', starting with a letter or digit "
                             f"(not ending in .json, not {sorted(RESERVED)})")
    return name


async def save_graph(request: web.Request, name: str, graph: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Save ``graph`` as ``name`` as ``PUT /api/graphs/{name}`` does (a study's best graph is saved through
    this too); its listing entry and whether it was new."""
    service = request.app[RUNS]
    # Blank secrets before anything is written: the file, and every answer made from it, never holds one.
    stored, removed = await asyncio.to_thread(split_secrets, graph, service.registry, service.preset_library())
    folder = _folder(request)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}{_suffix(request)}"
    created = not path.exists()
    # Two saves of one name at once: the index entry carries the stat of the file it was made from,
    # so an entry that lost the race describes no file and the graph is indexed again.
    out = await asyncio.to_thread(_save, path, stored, name, _project(request))
    out["secrets_removed"] = sorted({describe_path(graph, p) for p, _v in removed if p})
    # Where it went, in the words the page shows after a save.
    out["saved_as"] = (f"graphs/{name}{project.GRAPH_SUFFIX} and layout/{name}{project.LAYOUT_SUFFIX}"
                       if _project(request) is not None else f"data/graphs/{name}.json")
    return out, created


async def list_graphs(request: web.Request) -> web.Response:
    return web.json_response({"graphs": await request.app[GRAPH_INDEX].listing()})


async def get_graph(request: web.Request) -> web.Response:
    # The saved bytes as they are: parsing and re-encoding a graph of megabytes would hold the event loop.
    name = _name(request)
    index = request.app[GRAPH_INDEX]
    got = await index.read(name)
    if got is None:
        raise NotFound("graph", name, hint="save it with PUT /api/graphs/{name}; list them with GET /api/graphs")
    entry, data = got
    if not entry.get("valid"):
        raise CduiError("bad_graph", entry.get("not_callable_because") or f"saved graph {name!r} cannot be read",
                        status=500, hint="save it again with PUT /api/graphs/{name}")
    opened = _project(request)
    if opened is not None:
        # A project's files are the lab's repository: a read never writes them. What is served is the
        # logic and layout merged, with any secret a hand-edited file holds blanked (validate names it).
        service = request.app[RUNS]

        def merged() -> bytes:
            graph = project.load_graph(opened, name, service.config["CODEFYUI_MAX_GRAPH_BYTES"])
            if not entry.get(SECRETS_BLANKED):
                graph, _removed = split_secrets(graph, service.registry, service.preset_library())
            return json.dumps(graph).encode()
        data = await asyncio.to_thread(merged)
    elif not entry.get(SECRETS_BLANKED):
        # Saved by an older version or by hand: it may hold a key. Blank it once and write it back, so
        # the key leaves the disk too and later reads serve the bytes as they are.
        service = request.app[RUNS]
        library = service.preset_library()

        def blank() -> bytes:
            stored, _removed = split_secrets(json.loads(data), service.registry, library)
            _save(_folder(request) / f"{name}.json", stored, name)
            return json.dumps(stored).encode()
        data = await asyncio.to_thread(blank)
    return web.Response(body=data, content_type="application/json")


def _with_secrets(graph: dict[str, Any], given: Any, registry: Any) -> dict[str, Any]:
    """The graph with the call's ``secrets`` ({node id: {param: value}}) put into its nodes' params.

    Only ``secret``-typed params of the graph's own nodes are taken: anything else is a mistake
    the caller must hear about, not a way to change other params."""
    if given is None:
        return graph
    hint = 'send "secrets": {NODE_ID: {PARAM: "value"}} for the secret params of the saved graph\'s nodes'
    if not isinstance(given, dict):
        raise CduiError("bad_secrets", f"secrets must be an object, got {type(given).__name__}", hint=hint)
    nodes = {n.get("id"): n for n in graph.get("nodes") or [] if isinstance(n, dict)}
    out = json.loads(json.dumps(graph))
    by_id = {n.get("id"): n for n in out.get("nodes") or [] if isinstance(n, dict)}
    for node_id, params in given.items():
        node = nodes.get(node_id)
        if node is None:
            raise CduiError("bad_secrets", f"secrets names node {str(node_id)[:100]!r}, which the saved graph "
                            f"does not have", hint=hint)
        cls = registry.get(node.get("type")) if isinstance(node.get("type"), str) else None
        names = {p.name for p in cls.define_params() if p.param_type == "secret"} if cls is not None else set()
        if not isinstance(params, dict):
            raise CduiError("bad_secrets", f"secrets[{node_id!r}] must be an object of param: value", hint=hint)
        for param, value in params.items():
            if param not in names:
                raise CduiError("bad_secrets", f"secrets[{node_id!r}] names {str(param)[:100]!r}, which is not a "
                                f"secret param of its {node.get('type')!r} node (its secret params: "
                                f"{sorted(names) or 'none'})", hint=hint)
            if not isinstance(value, str):
                raise CduiError("bad_secrets", f"secrets[{node_id!r}][{param!r}] must be a string", hint=hint)
            data = by_id[node_id].get("data")
            if not isinstance(data, dict):
                data = by_id[node_id]["data"] = {}
            if not isinstance(data.get("params"), dict):
                data["params"] = {}
            data["params"][param] = value
    return out


async def delete_graph(request: web.Request) -> web.Response:
    name = _name(request)
    path = _folder(request) / f"{name}{_suffix(request)}"
    if not path.exists():
        raise NotFound("graph", name, hint="list them with GET /api/graphs")
    path.unlink()
    opened = _project(request)
    if opened is not None:
        (opened / "layout" / f"{name}{project.LAYOUT_SUFFIX}").unlink(missing_ok=True)
    graph_index.remove_entry(path.parent, name)
    return web.json_response({"deleted": name})


def _timeout(body: dict[str, Any]) -> float:
    raw = body.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= MAX_TIMEOUT_S:
        raise CduiError("bad_timeout", f"timeout_s={raw!r} is not a number of seconds in (0, {MAX_TIMEOUT_S:.0f}]")
    return float(raw)


async def _wait(service: Any, run_id: str, timeout: float) -> dict[str, Any] | None:
    """The run once it has ended, or None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    queue = service.subscribe(run_id)
    try:
        while True:
            run: dict[str, Any] = await service.get(run_id)
            if run["status"] in TERMINAL:
                return run
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(queue.get(), timeout=min(left, 2.0))
            except TimeoutError:
                pass
    finally:
        service.unsubscribe(run_id, queue)


async def _outputs(service: Any, run_id: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    outputs: dict[str, Any] = {}
    error: dict[str, Any] | None = None
    after = 0
    while True:
        page = await service.store.events(run_id, after)
        for ev in page:
            if ev["kind"] == GRAPH_OUTPUT_EVENT and isinstance(ev["data"], dict):
                d = ev["data"]
                if "error" in d and error is None:
                    error = {**d["error"], "node_id": d.get("node_id")}
                elif "value" in d:
                    outputs[str(d.get("name"))] = d["value"]
        if len(page) < 10000:
            return outputs, error
        after = page[-1]["seq"]


async def run_graph(request: web.Request) -> web.Response:
    started = time.monotonic()
    name = _name(request)
    service = request.app[RUNS]
    body = await read_json(request, service.config["CODEFYUI_MAX_GRAPH_BYTES"], "CODEFYUI_MAX_GRAPH_BYTES",
                           default={})
    if not isinstance(body, dict):
        raise CduiError("bad_request", "the body must be an object: {inputs, timeout_s, device, target}")
    graph = _with_secrets(_load(request, name), body.get("secrets"), service.registry)
    contract = contract_of(graph)
    timeout = _timeout(body)
    filled = fill_inputs(graph, contract, body.get("inputs"))
    options = {k: body[k] for k in ("device", "target", "record_outputs") if k in body}
    run = await service.submit({**filled, "name": filled.get("name") or name}, options)
    done = await _wait(service, run["id"], timeout)
    envelope: dict[str, Any] = {"status": None, "run_id": run["id"], "graph": name, "app": "cdui",
                                "version": __version__, "device": None, "outputs": {}, "error": None,
                                "timing": {}}
    if done is None:
        await service.stop(run["id"])
        envelope.update(status="timeout", error={"code": "timeout", "message": f"the run did not end within "
                        f"{timeout:g} s; it was stopped", "node_id": None, "details": None})
        envelope["timing"] = {"total_s": round(time.monotonic() - started, 3)}
        return web.json_response(envelope, status=504)
    outputs, out_error = await _outputs(service, run["id"])
    envelope.update(status=done["status"], device=done.get("device"), outputs=outputs)
    if done["status"] != "succeeded":
        envelope["error"] = out_error or {"code": f"run_{done['status']}", "message": done.get("error") or
                                          done["status"], "node_id": None, "details": None}
        envelope["error"].setdefault("details", None)
    else:
        missing = sorted(set(contract.outputs) - set(outputs))
        if missing:
            envelope["status"] = "failed"
            envelope["error"] = {"code": "missing_outputs", "message": f"the run ended without output(s) {missing}",
                                 "node_id": None, "details": None}
    envelope["timing"] = {"total_s": round(time.monotonic() - started, 3)}
    return web.json_response(envelope)


async def _index_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[GRAPH_INDEX].close()  # a helper still indexing is stopped with the server


def setup(app: web.Application) -> None:
    service = app[RUNS]
    app[GRAPH_INDEX] = graph_index.GraphIndex(Path(service.layout.folder("graphs")),
                                              service.config["CODEFYUI_MAX_GRAPH_BYTES"],
                                              suffix=project.GRAPH_SUFFIX if service.config["CODEFYUI_PROJECT_DIR"]
                                              else ".json")
    app.cleanup_ctx.append(_index_ctx)
    r = app.router
    r.add_get("/api/graphs", list_graphs)
    r.add_put("/api/graphs/{name}", put_graph)
    r.add_get("/api/graphs/{name}", get_graph)
    r.add_delete("/api/graphs/{name}", delete_graph)
    r.add_post("/api/graph/run/{name}", run_graph)
