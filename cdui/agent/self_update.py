"""An opted-in agent (``CODEFYUI_AGENT_AUTO_UPDATE=1``) updates itself when the control plane refuses its version.

Steps, each leaving the running version as it is when it fails (the agent then stops as any refused agent
does, with the refusal's line):

1. ``GET /api/worker-update/manifest`` with the agent's own credential: the control plane's bundle, offered
   only while it is of the control plane's version;
2. each listed file is fetched by its manifest name (``GET /api/worker-update/files/{name}``) into a
   private staging folder of the user data folder, hashed as it is written
   (:class:`cdui.core.bundle.CheckedWriter`): one byte more than listed, or another sha256, refuses it;
3. the staged bundle is installed into a new environment under this machine's installation root
   (:func:`cdui.core.envs.install`) and ``envs/current`` switched to it;
4. the agent waits for its runs to end (their events are spooled as on any disconnect), then
   :func:`reexec` replaces the process with the new environment's ``cdui agent start``: same pid, same
   arguments; the new agent replays the spool, so the control plane sees those runs end as after any
   agent reconnect.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

import aiohttp

from cdui.core import bundle, envs
from cdui.core.errors import CduiError
from cdui.core.private import private_dir

log = logging.getLogger("cdui.agent.self_update")
FETCH_TIMEOUT_S = 3600.0  # one file; a CUDA torch wheel over a slow link
_BLOCK = 1 << 20


class UpdateFailed(CduiError):
    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__("update_failed", message, hint)


async def _get_manifest(session: aiohttp.ClientSession, control: str, headers: dict[str, str]) -> bundle.Manifest:
    async with session.get(f"{control}/api/worker-update/manifest", headers=headers,
                           timeout=aiohttp.ClientTimeout(total=60)) as r:
        raw = await r.content.read(bundle.MAX_MANIFEST_BYTES + 1)
        if r.status != 200:
            raise UpdateFailed(f"the control plane offers no update bundle (HTTP {r.status}: "
                               f"{raw[:300].decode(errors='replace')})")
    return bundle.parse_manifest(raw, f"{control}/api/worker-update/manifest")


async def _fetch(session: aiohttp.ClientSession, control: str, headers: dict[str, str], entry: bundle.BundleFile,
                 dest: Path) -> None:
    url = f"{control}/api/worker-update/files/{entry.name}"
    async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)) as r:
        if r.status != 200:
            raise UpdateFailed(f"fetching {entry.name} of the update bundle failed: HTTP {r.status}")
        w = bundle.CheckedWriter(entry, dest, url)
        async for block in r.content.iter_chunked(_BLOCK):
            w.write(block)
        w.finish()


async def install_offered(session: aiohttp.ClientSession, control: str, credential: str, user_data: Path,
                          install_root: Path, running: str) -> Path:
    """Fetch, check and install the control plane's bundle; switch ``envs/current``. Returns the new
    environment's interpreter. :class:`UpdateFailed` or :class:`cdui.core.bundle.BundleRefused` when any
    step fails (then nothing was switched)."""
    headers = {"Authorization": f"Bearer {credential}"}
    manifest = await _get_manifest(session, control, headers)
    if manifest.version == running:
        raise UpdateFailed(f"the control plane offers cdui {manifest.version}, the version this agent runs already")
    log.info("updating this agent from cdui %s to %s: fetching %d files (%d bytes) from %s", running,
             manifest.version, len(manifest.files), sum(f.size for f in manifest.files), control)
    parent = private_dir(user_data / "agent-update")
    with tempfile.TemporaryDirectory(prefix="staging-", dir=parent) as tmp:
        staged = Path(tmp) / "bundle"
        staged.mkdir(mode=0o700)
        for entry in manifest.files:
            await _fetch(session, control, headers, entry, staged / entry.name)
        e = envs.Envs(install_root)
        new = await asyncio.to_thread(envs.install, e, staged, manifest)
    was = e.switch(new.name)
    e.prune()
    log.info("installed cdui %s into %s and switched %s to it (was %s)", manifest.version, new,
             e.folder / envs.CURRENT, was)
    return new / "bin" / "python"


def reexec(python: Path, install_root: Path) -> NoReturn:
    """Become ``python -P -m cdui <this process's arguments>``: the updated agent, same pid."""
    os.environ[envs.INSTALL_ROOT_SETTING] = str(install_root)  # a wheel's cdui does not find it by itself
    argv = [str(python), "-P", "-m", "cdui", *sys.argv[1:]]
    log.info("restarting on the new version: %s", " ".join(argv))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
