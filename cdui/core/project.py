"""Project directories: CodefyUI's layout of a lab's graph repository, opened with ``--project DIR``.

A project is a folder holding ``codefyui.project.toml`` (the manifest), ``graphs/<name>.graph.json``
(each graph's logic: nodes, edges, params, presets), ``layout/<name>.layout.json`` (where its nodes sit
on the canvas), ``assets/{images,models,data}/``, ``presets/``, ``custom_nodes/``, a committed
``.env.example`` and an uncommitted ``.env`` of secrets. The split keeps review honest: a drag on the
canvas changes only ``layout/``, an edited param only ``graphs/``.

Opened by ``cdui start --project DIR`` (or ``cdui agent start --project DIR``), the project is the data
folder (:mod:`cdui.core.layout` reads :data:`PROJECT_SETTING`), except uploads, which stay in the
installation's ``data/files`` (they are the installation's, not the repository's).

``.env`` values are secrets of this machine: they are read into this process's memory only
(:func:`load_env`), handed to each run's process inside its job on the stdin pipe, set there in the run's
own environment (nodes read API keys from the environment, as in CodefyUI), and masked in whatever a run
writes (events, logs, errors). They never enter the environment of a warm process or of any process
started before a job arrives.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cdui.core.atomic import atomic_write
from cdui.core.errors import CduiError

MANIFEST = "codefyui.project.toml"
PROJECT_SETTING = "CODEFYUI_PROJECT_DIR"
GRAPH_SUFFIX = ".graph.json"
LAYOUT_SUFFIX = ".layout.json"
FORMAT_VERSION = 1
ASSET_FOLDERS = ("images", "models", "data")
# The data folders that live under assets/ in a project (CodefyUI's names); the others sit at its top.
ASSET_DATA_FOLDERS = ("images", "models", "media", "output")
# A .env is small: a bigger one is a mistake (a data file under the wrong name), not secrets.
MAX_ENV_BYTES = 256 * 1024
MAX_ENV_KEYS = 500
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Note geometry that belongs to the canvas, not to the graph's behaviour.
NOTE_LAYOUT_KEYS = ("boundToNodeId", "boundOffset", "noteWidth", "noteHeight")
GIT_TIMEOUT_S = 5.0

MANIFEST_TEXT = """[project]
name = "{name}"
format_version = 1

[plugins]
# written by `cdui project freeze`; installed by `cdui project restore`

[publish]
# graph = "my-graph"
"""

GITIGNORE_TEXT = """.env
*.pt
*.pth
*.safetensors
*.ckpt
*.onnx
__pycache__/
# files a node writes while a run goes (ImageWriter, checkpoints): results, not sources
assets/output/
assets/media/
runs/
"""

GITATTRIBUTES_TEXT = """*.json text eol=lf
layout/*.layout.json linguist-generated=true
"""

ENV_EXAMPLE_TEXT = """# Secrets this project's graphs read from the environment, one KEY=VALUE a line.
# Copy this file to .env (never committed) and fill in the values.
# OPENAI_API_KEY=
"""

README_TEXT = """# {name}

A CodefyUI project: `graphs/` holds each graph's logic, `layout/` where its nodes sit,
`assets/` the images, models and data files the graphs read.

    cdui project validate .      # the CI gate: every graph checked
    cdui start --project .       # open it in cdui
"""


def _err(message: str, hint: str) -> CduiError:
    return CduiError("bad_project", message, hint=hint)


def find(folder: str | os.PathLike[str]) -> Path:
    """The project folder ``folder`` names, absolute; refuses one without a manifest."""
    p = Path(folder).expanduser().absolute()
    if not p.is_dir():
        raise _err(f"project folder {p} does not exist", f"create it with `cdui project init {folder}`")
    if not (p / MANIFEST).is_file():
        raise _err(f"{p} is not a project folder: it has no {MANIFEST}",
                   f"create one with `cdui project init {folder}`, or name the folder that holds {MANIFEST}")
    return p


def manifest(project: Path) -> dict[str, Any]:
    """The parsed manifest; a clear error naming the file and the line when it is not TOML."""
    path = project / MANIFEST
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _err(f"cannot read {path}: {exc.strerror or exc}", "check the file's permissions") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise _err(f"{path} is not valid TOML: {exc}", f"fix {MANIFEST} (see docs/projects.md)") from None
    return data


def name_of(project: Path) -> str:
    got = (manifest(project).get("project") or {}).get("name")
    return got if isinstance(got, str) and got else project.name


def scaffold(folder: str | os.PathLike[str]) -> tuple[Path, list[str]]:
    """Create CodefyUI's project layout in ``folder``; (the folder, what was created).

    An empty or missing folder is filled; a folder that already is a project gets what it lacks (no file
    is overwritten); any other non-empty folder is refused, so init never mixes a project into something
    else."""
    p = Path(folder).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise _err(f"{p} exists and is not a folder", "name a new or empty folder")
    if p.is_dir() and any(p.iterdir()) and not (p / MANIFEST).is_file():
        there = sorted(x.name for x in p.iterdir())
        shown = ", ".join(there[:5]) + (f" and {len(there) - 5} more" if len(there) > 5 else "")
        raise _err(f"{p} is not empty (it holds {shown}) and is not a project (no {MANIFEST})",
                   "name a new or empty folder, or add a project to this one by hand (docs/projects.md)")
    created: list[str] = []
    p.mkdir(parents=True, exist_ok=True)
    for sub in ("graphs", "layout", "presets", "custom_nodes", *(f"assets/{a}" for a in ASSET_FOLDERS)):
        d = p / sub
        if not d.is_dir():
            d.mkdir(parents=True)
            (d / ".gitkeep").touch()
            created.append(sub + "/")
    name = p.name
    for rel, text in ((MANIFEST, MANIFEST_TEXT.format(name=name.replace('"', ""))), (".gitignore", GITIGNORE_TEXT),
                      (".gitattributes", GITATTRIBUTES_TEXT), (".env.example", ENV_EXAMPLE_TEXT),
                      ("README.md", README_TEXT.format(name=name))):
        f = p / rel
        if not f.exists():
            f.write_text(text, encoding="utf-8")
            created.append(rel)
    return p, created


def git_init(project: Path) -> str:
    """``git init`` the project if git is here and it is no repository yet; what was done, in words."""
    git = shutil.which("git")
    if git is None:
        return "git is not installed: no repository was made (run `git init` there later)"
    if (project / ".git").exists():
        return "already a git repository"
    r = subprocess.run([git, "init", "-q", str(project)], capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0:
        return f"`git init` failed: {r.stderr.strip()[:300]}"
    return "git repository initialised (nothing committed)"


def _git(project: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    git = shutil.which("git")
    if git is None or not (project / ".git").exists():
        return None
    try:
        return subprocess.run([git, "-C", str(project), *args], capture_output=True, encoding="utf-8",
                              errors="replace", timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None


def git_state(project: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the project's repository; (None, None) when it is none, has no commit yet, or
    git is missing. dirty counts untracked files too (``git status --porcelain``)."""
    head = _git(project, "rev-parse", "HEAD")
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None, None
    status = _git(project, "status", "--porcelain")
    dirty = None if status is None or status.returncode != 0 else bool(status.stdout.strip())
    return head.stdout.strip(), dirty


def tracked(project: Path, rel: str) -> bool:
    """Whether git tracks ``rel`` in the project's repository (False without one)."""
    r = _git(project, "ls-files", "--error-unmatch", "--", rel)
    return r is not None and r.returncode == 0


def parse_env(text: str, where: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (a leading ``export``, quotes around the value and ``#`` comments are allowed);
    a line of another shape is refused naming its number, never its content (it may be a secret)."""
    out: dict[str, str] = {}
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not ENV_KEY.match(key):
            raise _err(f"{where} line {i} is not KEY=VALUE with a KEY of letters, digits and '_'",
                       f"fix that line of {where} (its content is not shown: it may hold a secret)")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
        if len(out) > MAX_ENV_KEYS:
            raise _err(f"{where} has more than {MAX_ENV_KEYS} keys", "keep only the secrets the graphs read")
    return out


def read_env(project: Path) -> dict[str, str]:
    """The project's ``.env`` (none: empty). ``CODEFYUI_*`` keys are left out: the settings are read before
    the file is, so one there would seem to work and would not."""
    path = project / ".env"
    try:
        if path.stat().st_size > MAX_ENV_BYTES:
            raise _err(f"{path} is larger than {MAX_ENV_BYTES} bytes", "a .env holds KEY=VALUE secrets only")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise _err(f"cannot read {path}: {exc}", "make it a readable UTF-8 text file of KEY=VALUE lines") from None
    return {k: v for k, v in parse_env(text, str(path)).items() if not k.startswith("CODEFYUI_")}


# -- this process's project and its secrets ------------------------------------------------------------
_LOADED: dict[str, str] = {}


def open_project(env: Mapping[str, str] | None = None) -> Path | None:
    """The project this process's settings open (``CODEFYUI_PROJECT_DIR``), checked; None without one."""
    env = os.environ if env is None else env
    raw = env.get(PROJECT_SETTING)
    return find(raw) if raw else None


def load_env(project: Path) -> list[str]:
    """Read the project's ``.env`` into this process's memory (never its environment); the keys."""
    values = read_env(project)
    _LOADED.clear()
    _LOADED.update(values)
    return sorted(values)


def env_secrets() -> dict[str, str]:
    """The ``.env`` values this process loaded at start (a copy): what each run it starts gets."""
    return dict(_LOADED)


class GitCache:
    """(commit, dirty) of a project, asked of git at most once per ``ttl_s``: ``/api/health`` answers
    anyone, so a flood of health checks must not become a flood of git processes."""

    def __init__(self, project: Path, ttl_s: float = 5.0) -> None:
        self.project = project
        self.ttl_s = ttl_s
        self._at = -1e9
        self._value: tuple[str | None, bool | None] = (None, None)

    def get(self) -> tuple[str | None, bool | None]:
        now = time.monotonic()
        if now - self._at >= self.ttl_s:
            self._value = git_state(self.project)
            self._at = now
        return self._value


# -- logic and layout ----------------------------------------------------------------------------------
def _xy(pos: Any) -> dict[str, Any] | None:
    if not isinstance(pos, dict) or not all(isinstance(pos.get(k), (int, float)) and not isinstance(pos.get(k), bool)
                                            for k in ("x", "y")):
        return None
    # Whole pixels: a float that prints differently after a round trip would dirty the file for nothing.
    return {"x": int(round(pos["x"])), "y": int(round(pos["y"]))}


def _split_nodes(nodes: Any, positions: dict[str, Any], notes: dict[str, Any]) -> Any:
    if not isinstance(nodes, list):
        return nodes
    out = []
    for node in nodes:
        if not isinstance(node, dict):
            out.append(node)
            continue
        n = {k: v for k, v in node.items() if k not in ("position", "positionAbsolute", "width", "height",
                                                          "selected", "dragging")}
        nid = node.get("id")
        xy = _xy(node.get("position"))
        if isinstance(nid, str) and xy is not None:
            positions[nid] = xy
        data = node.get("data")
        if node.get("type") == "note" and isinstance(data, dict) and isinstance(nid, str):
            geometry = {k: data[k] for k in NOTE_LAYOUT_KEYS if k in data}
            if geometry:
                notes[nid] = geometry
                n["data"] = {k: v for k, v in data.items() if k not in NOTE_LAYOUT_KEYS}
        out.append(n)
    return out


def split_graph(graph: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(logic, layout) of a graph as the page sends it. The layout holds every node's position (those
    inside a preset definition under ``preset:<name>/<id>``), note geometry and ``segmentGroups``;
    the logic holds the rest, so a drag changes only the layout."""
    positions: dict[str, Any] = {}
    notes: dict[str, Any] = {}
    logic = {k: v for k, v in graph.items() if k not in ("segmentGroups", "layout_missing", "viewport")}
    logic["nodes"] = _split_nodes(graph.get("nodes"), positions, notes)
    presets = graph.get("presets")
    if isinstance(presets, list):
        new_presets = []
        for p in presets:
            if isinstance(p, dict) and isinstance(p.get("nodes"), list):
                inner: dict[str, Any] = {}
                p = {**p, "nodes": _split_nodes(p["nodes"], inner, notes)}
                pname = str(p.get("preset_name") or p.get("name"))
                positions.update({f"preset:{pname}/{k}": v for k, v in inner.items()})
            new_presets.append(p)
        logic["presets"] = new_presets
    logic.setdefault("format_version", FORMAT_VERSION)
    layout: dict[str, Any] = {"format_version": FORMAT_VERSION, "positions": positions, "notes": notes,
                              "segmentGroups": graph.get("segmentGroups") or []}
    return logic, layout


def _merge_nodes(nodes: Any, positions: dict[str, Any], notes: dict[str, Any], prefix: str) -> tuple[Any, bool]:
    if not isinstance(nodes, list):
        return nodes, False
    missing = False
    out = []
    for node in nodes:
        if not isinstance(node, dict):
            out.append(node)
            continue
        n = dict(node)
        nid = node.get("id")
        xy = _xy(positions.get(f"{prefix}{nid}")) if isinstance(nid, str) else None
        if xy is not None:
            n["position"] = xy
        elif _xy(node.get("position")) is None:
            missing = True
        geometry = notes.get(nid) if isinstance(nid, str) and not prefix else None
        if isinstance(geometry, dict) and isinstance(node.get("data"), dict):
            n["data"] = {**{k: v for k, v in geometry.items() if k in NOTE_LAYOUT_KEYS}, **node["data"]}
        out.append(n)
    return out, missing


def merge_graph(logic: dict[str, Any], layout: dict[str, Any] | None) -> dict[str, Any]:
    """The graph the page loads: the logic with the layout's positions put back. A node the layout does
    not place keeps no position (the page lays it out); ``layout_missing`` says so."""
    lay: dict[str, Any] = layout if isinstance(layout, dict) else {}
    got_positions, got_notes = lay.get("positions"), lay.get("notes")
    positions: dict[str, Any] = got_positions if isinstance(got_positions, dict) else {}
    notes: dict[str, Any] = got_notes if isinstance(got_notes, dict) else {}
    merged = dict(logic)
    merged["nodes"], missing = _merge_nodes(logic.get("nodes"), positions, notes, "")
    presets = logic.get("presets")
    if isinstance(presets, list):
        out = []
        for p in presets:
            if isinstance(p, dict) and isinstance(p.get("nodes"), list):
                pname = str(p.get("preset_name") or p.get("name"))
                p = {**p, "nodes": _merge_nodes(p["nodes"], positions, notes, f"preset:{pname}/")[0]}
            out.append(p)
        merged["presets"] = out
    if isinstance(lay.get("segmentGroups"), list) and lay["segmentGroups"]:
        merged["segmentGroups"] = lay["segmentGroups"]
    if layout is None or missing:
        merged["layout_missing"] = True
    return merged


def dumps(obj: Any) -> str:
    """How graph and layout files are written: indented, LF, a final newline (reviewable diffs)."""
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` unless the file already holds exactly it (a save that moved nothing touches nothing)."""
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, text)
    return True


def graph_names(project: Path) -> list[str]:
    """Names of the graphs in ``graphs/`` (``<name>.graph.json``), sorted."""
    folder = project / "graphs"
    if not folder.is_dir():
        return []
    return sorted(p.name[:-len(GRAPH_SUFFIX)] for p in folder.glob(f"*{GRAPH_SUFFIX}") if p.is_file())


def load_graph(project: Path, name: str, max_bytes: int) -> dict[str, Any]:
    """A project graph, its logic and layout merged; errors name the file."""
    path = project / "graphs" / f"{name}{GRAPH_SUFFIX}"
    logic = _read_json(path, max_bytes)
    if not isinstance(logic, dict):
        raise _err(f"{path} is not a JSON object", "a graph file holds one object with a 'nodes' list")
    lpath = project / "layout" / f"{name}{LAYOUT_SUFFIX}"
    layout = _read_json(lpath, max_bytes) if lpath.exists() else None
    return merge_graph(logic, layout if isinstance(layout, dict) else None)


def _read_json(path: Path, max_bytes: int) -> Any:
    try:
        if path.stat().st_size > max_bytes:
            raise _err(f"{path} is larger than {max_bytes} bytes", "raise CODEFYUI_MAX_GRAPH_BYTES or split it")
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CduiError("not_found", f"{path} does not exist", status=404,
                        hint="list the graphs with GET /api/graphs") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _err(f"{path} is not valid JSON: {exc}", "fix the file, or save the graph again") from None


def describe_git(commit: str | None, dirty: bool | None) -> str:
    if commit is None:
        return "no git commit: not a repository, or nothing committed yet"
    return f"git {commit[:12]}" + (", uncommitted changes" if dirty else "" if dirty is False else ", state unknown")


def open_at_start(log: Any) -> Path | None:
    """For ``cdui start`` and ``cdui agent start``: the project this process opens (None: none), its
    ``.env`` loaded into memory, and one log line saying which project, which commit, and how many
    secrets (never their values)."""
    project = open_project()
    if project is None:
        return None
    keys = load_env(project)
    log.info("project: %s (%s); %d secret(s) from .env%s", project, describe_git(*git_state(project)), len(keys),
             f" ({', '.join(keys)})" if keys else "")
    short = sorted(k for k, v in _LOADED.items() if 0 < len(v) < 4)
    if short:
        log.warning("project .env values of %s are shorter than 4 characters: runs get them, but they cannot be "
                    "masked in what a run writes (use the real secret, or leave such settings out of .env)",
                    ", ".join(short))
    return project
