"""A plugin pack's ``[python_deps]``: read from its manifest, checked against cdui's environment, installed offline.

CodefyUI's manifest lists the Python distributions a pack's nodes import as ``name = "constraint"`` pairs: a
constraint that starts with an operator is used as written (``">=0.27"``), a bare version is pinned (``"1.2.0"``
is ``==1.2.0``), an empty one means any version; extras, URLs and ``git+`` sources are refused. cdui downloads
nothing: at install each one must already be in cdui's environment, or come from the lab's own wheels (the folders
of CODEFYUI_PLUGIN_SOURCES and CODEFYUI_WHEELHOUSE) with ``--install-deps``, which runs pip with ``--no-index``.
"""
from __future__ import annotations

import importlib.metadata
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")
VERSION_RE = re.compile(r"^[0-9A-Za-z.*+!_-]{1,64}$")
CLAUSE_RE = re.compile(r"^(===|==|!=|~=|<=|>=|<|>)\s*([0-9A-Za-z.*+!_-]{1,64})$")
MAX_DEPS = 64
PIP_TIMEOUT_S = 900.0


def parse(table: Any) -> tuple[dict[str, str], list[str]]:
    """``[python_deps]`` as ``{name: requirement}`` (``httpx>=0.27``, ``numpy==1.2.0``, ``rich``) and the problems
    of the entries that are refused, each naming the entry and what is accepted."""
    if table is None:
        return {}, []
    if not isinstance(table, dict):
        return {}, ["[python_deps] must be a table of name = \"constraint\" pairs"]
    if len(table) > MAX_DEPS:
        return {}, [f"[python_deps] lists {len(table)} distributions; at most {MAX_DEPS} are read"]
    deps: dict[str, str] = {}
    problems: list[str] = []
    for name, constraint in table.items():
        where = f"[python_deps] {name} = {constraint!r}"
        if not isinstance(name, str) or not NAME_RE.match(name):
            problems.append(f"{where}: not a distribution name (extras like name[x] are refused)")
            continue
        if not isinstance(constraint, str):
            problems.append(f"{where}: the constraint must be a string")
            continue
        spec = constraint.strip()
        if spec and spec[0] not in "<>=!~":
            if not VERSION_RE.match(spec):  # a URL, a git+ source, a path: nothing a wheelhouse resolves offline
                problems.append(f"{where}: only version constraints are accepted (\">=1.2\", \"1.2.0\" or \"\"), "
                                "not URLs, git+ sources or paths")
                continue
            spec = f"=={spec}"
        clauses = [c.strip() for c in spec.split(",")] if spec else []
        if not all(CLAUSE_RE.match(c) for c in clauses):
            problems.append(f"{where}: not a version constraint (e.g. \">=1.2,<2\")")
            continue
        deps[name] = name + ",".join(c.replace(" ", "") for c in clauses)
    return deps, problems


@dataclass(frozen=True)
class DepState:
    requirement: str
    installed: str | None  # the installed version, None when the distribution is not installed
    satisfied: bool

    def describe(self) -> str:
        if self.installed is None:
            return f"{self.requirement}: not installed"
        unmet = "" if self.satisfied else ", which does not satisfy it"
        return f"{self.requirement}: {self.installed} installed{unmet}"


def _satisfies(requirement: str, name: str, version: str) -> bool:
    spec = requirement[len(name):]
    if not spec:
        return True
    try:  # packaging, the reference implementation of version specifiers, is in every pip-built environment
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - without it only "is it installed" is checked
        return True
    try:
        return Version(version) in SpecifierSet(spec)
    except (InvalidSpecifier, InvalidVersion):
        return False


def check(deps: dict[str, str]) -> list[DepState]:
    """Each requirement with what cdui's environment has of it."""
    out = []
    for name, requirement in sorted(deps.items()):
        try:
            version: str | None = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = None
        out.append(DepState(requirement, version, version is not None and _satisfies(requirement, name, version)))
    return out


def pip_argv(requirements: Sequence[str], find_links: Iterable[Path], python: str = sys.executable) -> list[str]:
    """pip installing ``requirements`` from the ``find_links`` folders only: ``--no-index`` keeps it off the network."""
    argv = [python, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", "--no-input"]
    for folder in find_links:
        argv += ["--find-links", str(folder)]
    return argv + list(requirements)


def offline_hint(requirements: Sequence[str]) -> str:
    """What to run to install ``requirements`` without the network."""
    quoted = " ".join(shlex.quote(r) for r in requirements)
    return (f"install them from your wheels into cdui's environment: `{shlex.quote(sys.executable)} -m pip install "
            f"--no-index --find-links WHEELHOUSE {quoted}` (make the wheelhouse on a connected machine with "
            f"`pip download -d WHEELHOUSE {quoted}`), or install the pack again with --install-deps to take them "
            "from the folders of CODEFYUI_PLUGIN_SOURCES and CODEFYUI_WHEELHOUSE")


def install(requirements: Sequence[str], find_links: Sequence[Path]) -> tuple[bool, str]:
    """Run pip offline; (whether it succeeded, its last lines)."""
    try:
        r = subprocess.run(pip_argv(requirements, find_links), capture_output=True, text=True, timeout=PIP_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-6:])
    return r.returncode == 0, tail
