"""Uploads and downloads of ``files``, ``images`` and ``models``.

Uploads stream to a temporary file in the target folder while hashing, and
are refused past ``CODEFYUI_MAX_UPLOAD_SIZE`` without touching what is stored.
The name is confined to its folder by :func:`cdui.core.paths.check_name`. An
existing file of the same name is replaced only when the upload completed.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from cdui.core.errors import CduiError, NotFound
from cdui.core.paths import check_name, safe_join
from cdui.core.units import size_text
from cdui.plane.appkeys import CONFIG
from cdui.plane.apps import APPS
from cdui.plane.files.receive import TEMP_PREFIX, receive, refuse_temporary_name, sweep_stale
from cdui.plane.files.transfer import worker_may_download
from cdui.plane.runs import RUNS

FOLDERS = {"files": "files", "images": "images", "models": "models"}


def _folder(request: web.Request) -> tuple[str, Path]:
    kind = request.match_info["kind"]
    if kind not in FOLDERS:
        raise CduiError("not_found", f"no such upload folder {kind!r}", hint="use files, images or models", status=404)
    return kind, request.app[CONFIG].layout.folder(FOLDERS[kind])


async def upload(request: web.Request) -> web.Response:
    kind, folder = _folder(request)
    limit = request.app[CONFIG]["CODEFYUI_MAX_UPLOAD_SIZE"]
    if request.content_length and request.content_length > limit + 1024 * 1024:
        raise _too_large(limit, request.content_length)
    field = await _file_part(request)
    name = _plain_name(field.filename)
    folder.mkdir(parents=True, exist_ok=True)
    target = safe_join(folder, name)
    got = await receive(field, folder, limit, lambda size: _too_large(limit, size))
    try:
        got.commit(target)
    finally:
        got.discard()
    digest, size = got.sha256, got.size
    await request.app[RUNS].store.record_upload(kind, name, digest, size)
    return web.json_response({"name": name, "sha256": digest, "size": size, "path": f"data/{kind}/{name}"}, status=201)


async def _file_part(request: web.Request) -> Any:
    """The multipart part named ``file`` (with a file name), the parts before it skipped unread."""
    try:
        reader = await request.multipart()
    except (AssertionError, ValueError, KeyError):
        raise CduiError("bad_upload", "expected a multipart/form-data body with a field named 'file'",
                        hint="curl -F file=@train.csv ...") from None
    field: Any = None
    while True:
        try:
            part = await reader.next()
        except (HttpProcessingError, ValueError) as exc:
            # e.g. a control character in a part's headers: the client's mistake, not ours
            raise CduiError("bad_upload", f"the multipart body is malformed: {getattr(exc, 'message', exc)}",
                            hint="send a multipart/form-data body with a field named 'file'") from None
        if part is None:
            break
        if getattr(part, "name", None) == "file":
            field = part
            break
        await part.release()
    if field is None or not field.filename:
        raise CduiError("bad_upload", "no field named 'file' with a file name in the upload",
                        hint="curl -F file=@train.csv ...")
    return field


def _plain_name(filename: str) -> str:
    """The upload's file name, refused unless it is a plain name (no folders) that check_name accepts."""
    name = check_name(Path(filename.replace("\\", "/")).name if "/" in filename or "\\" in filename else filename)
    if filename != name:
        raise CduiError("path_refused",
                        f"file name {filename!r} refused: it must be a plain name without folders",
                        hint="rename the file, e.g. to " + repr(name))
    refuse_temporary_name(name)
    return name


def _too_large(limit: int, size: int) -> CduiError:
    return CduiError("too_large",
                     f"upload of {size_text(size)} is over the limit of {size_text(limit)} (CODEFYUI_MAX_UPLOAD_SIZE)",
                     hint="raise CODEFYUI_MAX_UPLOAD_SIZE on the server, or upload a smaller file", status=413)


async def download(request: web.Request) -> web.StreamResponse:
    kind, folder = _folder(request)
    name = request.match_info["name"]
    if request.get("auth") == "worker":
        apps = request.app.get(APPS)
        # An input of one of its runs, or a file a version of an app it serves reads (the version's weights).
        if not (apps is not None and apps.may_download(request["worker"], kind, name)) \
                and not await worker_may_download(request, kind, name):
            raise CduiError("forbidden", f"worker {request['worker']} may not download {kind}/{name}: it is not an "
                                         f"input of one of its runs", status=403)
    path = safe_join(folder, name)
    if not path.is_file():
        raise NotFound(kind[:-1] if kind.endswith("s") else kind, name, hint=f"list them with GET /api/{kind}")
    return web.FileResponse(path, headers={"Content-Disposition": f'attachment; filename="{path.name}"'})


async def listing(request: web.Request) -> web.Response:
    kind, folder = _folder(request)
    return web.json_response(await asyncio.to_thread(list_folder, folder))


def list_folder(folder: Path) -> list[dict[str, Any]]:
    """Every file under ``folder``: ``{"name", "size", "type": "file"}``, and each symbolic link as
    ``{"name", "size": None, "type": "symlink"}``. A link is never shown as the file it points to (it may
    point out of the folder, and downloads refuse it then); nothing is read through it."""
    out: list[dict[str, Any]] = []
    if not folder.is_dir():
        return out
    for p in sorted(folder.rglob("*")):  # rglob does not descend into linked folders
        if p.name.startswith(TEMP_PREFIX):
            continue
        if p.is_symlink():
            out.append({"name": str(p.relative_to(folder)), "size": None, "type": "symlink"})
        elif p.is_file():
            out.append({"name": str(p.relative_to(folder)), "size": p.stat().st_size, "type": "file"})
    return out


async def _sweep_stale(app: web.Application) -> None:
    layout = app[CONFIG].layout
    # the upload folders and the folders workers' outputs arrive in (transfer.py)
    sweep_stale({layout.folder(f) for f in ("files", "images", "models", "media", "output")} | {layout.runs_dir()})


def setup(app: web.Application) -> None:
    app.on_startup.append(_sweep_stale)
    app.router.add_post("/api/{kind}/upload", upload)
    app.router.add_get("/api/{kind}/download/{name:.+}", download)
    app.router.add_get("/api/{kind:files|images|models}", listing)
