"""Python environments side by side under the installation root, for updates that can be rolled back.

Layout (``<root>`` is the installation root, the folder holding ``bin/cdui``)::

    <root>/.venv/                 what `bin/cdui install` made: the checkout, installed editable
    <root>/envs/0.2.0-1/          a venv with the wheel of a release bundle installed
    <root>/envs/current -> …      the environment bin/cdui runs (absent: .venv)
    <root>/envs/previous -> …     the one before it, what `cdui update --rollback` returns to

``current`` and ``previous`` are symlinks, relative (``0.2.0-1`` or ``../.venv``), each replaced in one
``rename(2)``: a launcher started at any moment runs the old environment or the new one, never half of each.
Installing never touches the running environment: a failed install removes its own new folder and leaves
``current`` as it was.

How a new environment gets cdui's dependencies: a bundle that carries dependency wheels is installed
whole from them (``pip install --no-index --find-links``), so the new environment holds all it needs. A
bundle of cdui's wheel alone (the common case between two releases with the same dependencies, and what
the tests build) is layered over the installing environment: a ``cdui-deps.pth`` line names that
environment's site-packages, so torch and aiohttp are not copied again, while cdui itself comes only from
the new wheel (a plain path line in a ``.pth`` does not run that folder's own ``.pth`` files, so an editable
checkout there stays out). Such an environment needs the one it was layered over: pruning keeps it.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from cdui.core.bundle import Manifest
from cdui.core.errors import CduiError
from cdui.core.layout import install_root_from_env

ENVS = "envs"
CURRENT = "current"
PREVIOUS = "previous"
VENV_LINK = "../.venv"  # the launcher's own environment, as a link target from envs/
DEPS_PTH = "cdui-deps.pth"
INSTALL_ROOT_SETTING = "CODEFYUI_INSTALL_ROOT"
# Set by bin/cdui to its own installation root: the envs/ an update switches must be the one that launcher
# reads, whichever checkout the running package was imported from.
LAUNCHER_ROOT_ENV = "CDUI_LAUNCHER_ROOT"
_ENV_NAME = re.compile(r"[0-9][0-9A-Za-z.+!-]{0,63}-[0-9]{1,6}")
INSTALL_TIMEOUT_S = 1800.0
# What `cdui update` sends the control plane it restarts: it stops as on SIGTERM, except that runs on workers
# are not told to stop; they go on, and the next start adopts them (cdui/plane/server.py).
HANDOVER_SIGNAL = signal.SIGUSR2


def launcher_root() -> Path:
    """The installation whose ``envs/`` is updated: the launcher's that started this process, else the
    installation root of the settings (``CODEFYUI_INSTALL_ROOT``, or the checkout the package runs from)."""
    v = os.environ.get(LAUNCHER_ROOT_ENV)
    return Path(v) if v and os.path.isabs(v) else install_root_from_env()


class EnvError(CduiError):
    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__("update_failed", message, hint)


@dataclass(frozen=True)
class Envs:
    root: Path

    @property
    def folder(self) -> Path:
        return self.root / ENVS

    def link(self, which: str) -> str | None:
        """The target of ``current`` or ``previous`` (``0.2.0-1`` or ``../.venv``), or None when unset."""
        try:
            return os.readlink(self.folder / which)
        except OSError:
            return None

    def python(self, target: str | None) -> Path:
        """The interpreter of an environment named by a link target (None: the launcher's .venv)."""
        if target in (None, VENV_LINK):  # envs/ itself may not exist yet
            return self.root / ".venv" / "bin" / "python"
        return self.folder / str(target) / "bin" / "python"

    def new_folder(self, version: str) -> Path:
        self.folder.mkdir(mode=0o755, exist_ok=True)
        n = 1
        while (self.folder / f"{version}-{n}").exists():
            n += 1
        return self.folder / f"{version}-{n}"

    def point(self, which: str, target: str) -> None:
        """Make ``which`` a link to ``target`` in one rename (readers see the old link or the new one)."""
        tmp = self.folder / f".{which}.tmp-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, self.folder / which)

    def switch(self, new: str) -> str:
        """``current`` → ``new``, ``previous`` → what was current (the .venv when none was). Returns that."""
        old = self.link(CURRENT) or VENV_LINK
        self.point(PREVIOUS, old)
        self.point(CURRENT, new)
        return old

    def rollback(self) -> tuple[str, str]:
        """Swap ``current`` and ``previous``; returns (from, to). Rolling back twice rolls forward again."""
        prev = self.link(PREVIOUS)
        if prev is None:
            raise EnvError(f"there is nothing to roll back to: {self.folder / PREVIOUS} does not exist (no "
                           f"`cdui update` has switched this installation yet)")
        if not self.python(prev).exists():
            raise EnvError(f"the previous environment {self.folder / prev} is gone; nothing was changed")
        cur = self.link(CURRENT) or VENV_LINK
        self.point(PREVIOUS, cur)
        self.point(CURRENT, prev)
        return cur, prev

    def prune(self) -> list[Path]:
        """Remove environments that neither ``current`` nor ``previous`` names (nor one of those layers over)."""
        keep = {t for t in (self.link(CURRENT), self.link(PREVIOUS)) if t}
        for t in list(keep):
            keep |= {Path(p).parent.parent.parent.name for p in _deps_lines(self.folder / t)}
        gone = []
        for p in sorted(self.folder.iterdir()) if self.folder.is_dir() else []:
            if p.is_dir() and not p.is_symlink() and _ENV_NAME.fullmatch(p.name) and p.name not in keep:
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p)
        return gone


def _deps_lines(env: Path) -> list[str]:
    try:
        pth = next(env.glob(f"lib/python*/site-packages/{DEPS_PTH}"))
        return [ln.strip() for ln in pth.read_text().splitlines() if ln.strip()]
    except (StopIteration, OSError):
        return []


def pip_argv(new_python: Path, staged: Path, manifest: Manifest) -> list[str]:
    """The pip command that installs the staged bundle into the environment of ``new_python``: run by the
    installing interpreter's pip (the new venv has none), from the staged files only, never an index."""
    base = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(new_python), "install",
            "-q", "--no-index"]
    if manifest.dependency_wheels:
        return [*base, "--only-binary", ":all:", "--find-links", str(staged), f"cdui=={manifest.version}"]
    return [*base, "--no-deps", str(staged / manifest.cdui_wheel)]


def _run(argv: list[str], what: str) -> None:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, cwd="/",
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvError(f"{what} failed: {exc}") from None
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-15:])
        raise EnvError(f"{what} failed (exit {r.returncode}):\n{tail}")


def installed_version(python: Path) -> str:
    """``cdui.__version__`` as ``python`` imports it (from / with no PYTHONPATH: what a launcher would run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(python), "-P", "-c", "import cdui; print(cdui.__version__)"], capture_output=True,
                       text=True, timeout=120, cwd="/", env=env, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise EnvError(f"{python} cannot import cdui: {r.stderr.strip().splitlines()[-1:] or r.returncode}")
    return r.stdout.strip()


def install(envs: Envs, staged: Path, manifest: Manifest) -> Path:
    """A new environment under ``envs/`` with the staged bundle installed and checked; returns its folder.
    Nothing is switched. On any failure the new folder is removed and :class:`EnvError` says why."""
    # Made in place (a venv's scripts name their folder, so it is not renamed afterwards): a folder that
    # an interrupted install leaves is named by no link, and the next prune removes it.
    work = final = envs.new_folder(manifest.version)
    try:
        _run([sys.executable, "-m", "venv", "--without-pip", str(work)], f"creating the environment {work}")
        py = work / "bin" / "python"
        if not manifest.dependency_wheels:
            site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())
            # The installing interpreter's own site-packages, and what its own cdui-deps.pth names (an agent
            # that runs a layered environment already): a .pth line does not follow the folder's .pth files.
            mine = Path(sys.prefix)
            paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                                   *_deps_lines(mine)])
            (site / DEPS_PTH).write_text("".join(f"{p}\n" for p in paths))
        _run(pip_argv(py, staged, manifest), f"installing cdui {manifest.version} into {work}")
        got = installed_version(final / "bin" / "python")
        if got != manifest.version:
            raise EnvError(f"the new environment {final} imports cdui {got}, not the bundle's {manifest.version}")
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final
