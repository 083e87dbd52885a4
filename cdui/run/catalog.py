"""Keeping workers in sync: a machine's node catalog and environment fingerprint,
and the checks the control plane makes with them.

- **Catalog**: the node types a machine loads the way a run does (built-ins,
  plugin packs, custom nodes) and one hash over their definitions. The agent
  learns its own at start from a short helper subprocess,
  ``python -m cdui.run.catalog`` (the agent itself never imports torch or a plugin:
  a plugin that crashes or hangs must not take the agent with it). The control
  plane computes its own from the registry it already loaded.
- **Fingerprint**: what code and environment a run executes with (cdui
  version and commit, Python, torch build, accelerator, plugin versions and
  custom node files, the environment variables that change numerics). The same
  helper reports the agent's; the run subprocess reports its own at its start
  (:func:`run_facts`), which replaces the agent's for that run. Both describe
  the devices as the agent sees them, before a run's device set narrows
  ``CUDA_VISIBLE_DEVICES`` (the agent passes its view to the run in
  :data:`SEEN_ACCELERATOR_ENV`).
- **Checks** (pure, the control plane's policy): in :mod:`cdui.plane.sched.catalog_check`.

The report comes from a worker, which may be hostile: :mod:`cdui.wire.protocol`
bounds it before anything here sees it, and nothing here opens a path it names.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import platform
import subprocess
import sys
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdui import __version__
from cdui.nodes import packs
from cdui.nodes.registry import build_registry
from cdui.wire import devicesets

log = logging.getLogger("cdui.run.catalog")

HELPER_TIMEOUT_S = 120.0
# Set by the launcher for a run subprocess: the accelerator as the agent saw it,
# before CUDA_VISIBLE_DEVICES was narrowed to the run's device set.
SEEN_ACCELERATOR_ENV = "CDUI_SEEN_ACCELERATOR"
# The environment variables that change what numbers a run computes.
NUMERICS_ENV = ("CUBLAS_WORKSPACE_CONFIG", "CUDA_LAUNCH_BLOCKING", "NVIDIA_TF32_OVERRIDE",
                "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "TORCH_CUDNN_V8_API_DISABLED", "OMP_NUM_THREADS",
                "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_CBWR", "PYTHONHASHSEED")
# -- what a machine has ------------------------------------------------------------
# What a node's description says about this machine's packages, not about the node: left out of the
# catalog's hash, so two machines with the same nodes and other extras installed have the same hash.
MACHINE_FIELDS = ("available", "install")


def node_catalog(registry: Any) -> dict[str, Any]:
    """``{"types": [...], "hash": "sha256:..."}`` of a loaded registry; the hash covers the nodes'
    definitions (ports, params, declared needs), not whether this machine has their packages."""
    described = registry.catalog()
    definitions = [{k: v for k, v in d.items() if k not in MACHINE_FIELDS} for d in described]
    text = json.dumps(definitions, sort_keys=True, default=str)
    return {"types": [d["type"] for d in described], "hash": "sha256:" + hashlib.sha256(text.encode()).hexdigest()}


@functools.cache
def _commit(root: Path) -> str | None:
    """The installation's commit, once per process: the code a process runs is what it imported at its
    start (a zygote's children report the zygote's), and asking git costs a subprocess per run."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _accelerator() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return f"{len(names)} x cuda: " + ", ".join(names)
    except Exception:  # a broken CUDA install: what the machine offers is the CPU
        pass
    return f"cpu ({platform.machine() or 'unknown'})"


def _torch_build() -> str:
    try:
        import torch
    except Exception as exc:  # no torch: the fingerprint says so instead of failing
        return f"not importable ({type(exc).__name__})"
    extra = [f"cuda {torch.version.cuda}"] if torch.version.cuda else []
    extra += [f"hip {torch.version.hip}"] if getattr(torch.version, "hip", None) else []
    return torch.__version__ + (f" ({', '.join(extra)})" if extra else "")


def _file_hash(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    except OSError:
        return "unreadable"


def _plugins(plugins_dir: Path | None) -> dict[str, str]:
    out: dict[str, str] = {}
    if plugins_dir is None or not plugins_dir.is_dir():
        return out
    for manifest in sorted(plugins_dir.glob("*/cdui.plugin.toml")):
        try:
            meta = tomllib.loads(manifest.read_text(encoding="utf-8")).get("plugin", {})
        except (OSError, tomllib.TOMLDecodeError):
            out[manifest.parent.name] = "bad manifest"
            continue
        pid = str(meta.get("id") or manifest.parent.name)
        code = hashlib.sha256()
        for rel in meta.get("modules", ["nodes.py"]):
            code.update(_file_hash(manifest.parent / str(rel)).encode())
        out[pid] = f"{meta.get('version', 'no version')} (code {code.hexdigest()[:12]})"
    return out


def _packs(plugin_store: Path | None) -> dict[str, dict[str, str]]:
    return packs.pins(plugin_store) if plugin_store is not None else {}


def _custom_nodes(custom_dir: Path | None) -> dict[str, str]:
    if custom_dir is None or not custom_dir.is_dir():
        return {}
    return {p.name: _file_hash(p) for p in sorted(custom_dir.glob("*.py")) if not p.name.startswith("_")}


def installation_commit() -> str | None:
    return _commit(Path(__file__).resolve().parents[2])


def fingerprint(custom_dir: Path | None, plugins_dir: Path | None,
                env: Mapping[str, str] | None = None, plugin_store: Path | None = None) -> dict[str, Any]:
    """This process's environment fingerprint (imports torch)."""
    env = os.environ if env is None else env
    return {
        "cdui": __version__,
        "commit": installation_commit(),
        "python": platform.python_version(),
        "torch": _torch_build(),
        "accelerator": env.get(SEEN_ACCELERATOR_ENV) or _accelerator(),
        "plugins": {**_plugins(plugins_dir), **{pid: f"{p['version'] or 'no version'} (sha256 {p['sha256'][:12]})"
                                                 for pid, p in _packs(plugin_store).items()}},
        # The installed packs (cdui plugin install), as the Workers panel compares them with the control plane's.
        "packs": _packs(plugin_store),
        "custom_nodes": _custom_nodes(custom_dir),
        "env": {k: env[k] for k in NUMERICS_ENV if k in env},
    }


def summary(fp: Mapping[str, Any] | None) -> str:
    """One line for the worker card and the run: equal fingerprints give equal lines."""
    if not fp:
        return "not reported"
    plugins = fp.get("plugins") or {}
    custom = fp.get("custom_nodes") or {}
    envs = fp.get("env") or {}
    parts = [f"cdui {fp.get('cdui')}" + (f" ({fp['commit']})" if fp.get("commit") else ""),
             f"Python {fp.get('python')}", f"torch {fp.get('torch')}", str(fp.get("accelerator")),
             "plugins: " + (", ".join(f"{k} {v}" for k, v in sorted(plugins.items())) or "none"),
             "custom nodes: " + (", ".join(f"{k} {v}" for k, v in sorted(custom.items())) or "none")]
    if envs:
        parts.append("env: " + " ".join(f"{k}={v}" for k, v in sorted(envs.items())))
    return "; ".join(parts)


def numerics() -> dict[str, Any]:
    """The torch settings that change a run's numbers, as the run's process has them."""
    import torch
    out: dict[str, Any] = {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "num_threads": torch.get_num_threads(),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "default_dtype": str(torch.get_default_dtype()),
    }
    return out


def run_facts(registry: Any, custom_dir: Path | None, plugins_dir: Path | None,
              plugin_store: Path | None = None) -> dict[str, Any]:
    """What the run subprocess reports at its start: the ``execution_facts`` event's data."""
    fp = fingerprint(custom_dir, plugins_dir, plugin_store=plugin_store)
    return {"fingerprint": summary(fp), "fingerprint_detail": fp, "catalog_hash": node_catalog(registry)["hash"],
            "resolved": {"numerics": numerics()}}


# -- the helper subprocess ------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """What the helper reported: a catalog and fingerprint, or why it could not."""

    catalog: dict[str, Any] | None = None
    fingerprint: dict[str, Any] | None = None
    error: str | None = None
    # Each CUDA card's memory as the helper saw it ({"cuda:0": {total_mb, free_mb}}): for share by memory.
    cards: dict[str, Any] | None = None


def _helper_main(argv: list[str]) -> int:
    # torch warns at import when numpy is absent; numpy is not a dependency of ours.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    custom = Path(argv[0]) if len(argv) > 0 and argv[0] else None
    plugins = Path(argv[1]) if len(argv) > 1 and argv[1] else None
    store = Path(argv[2]) if len(argv) > 2 and argv[2] else None
    registry = build_registry(custom, plugins, store)
    out = {"catalog": node_catalog(registry), "fingerprint": fingerprint(custom, plugins, plugin_store=store),
           "device_memory": devicesets.cuda_memory(),
           "load_errors": [f"{e.get('file')}: {e.get('error')}" for e in registry.load_errors][:20]}
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    return 0


def probe(custom_dir: Path | None, plugins_dir: Path | None, timeout: float = HELPER_TIMEOUT_S,
          plugin_store: Path | None = None) -> Probe:
    """Run the helper; a helper that fails, hangs or answers nonsense gives no catalog, and the reason."""
    cmd = [sys.executable, "-m", "cdui.run.catalog", str(custom_dir or ""), str(plugins_dir or ""),
           str(plugin_store or "")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              cwd=str(Path(__file__).resolve().parents[2]))
    except subprocess.TimeoutExpired:
        return Probe(error=f"the node catalog helper did not answer within {timeout:g} s")
    except OSError as exc:
        return Probe(error=f"the node catalog helper could not start: {exc}")
    tail = (proc.stderr or "").strip()[-500:]
    if proc.returncode != 0:
        return Probe(error=f"the node catalog helper exited with code {proc.returncode}"
                           + (f": {tail}" if tail else ""))
    try:
        d = json.loads(proc.stdout.strip().splitlines()[-1])
        cat, fp = d["catalog"], d["fingerprint"]
        if not (isinstance(cat, dict) and isinstance(cat.get("types"), list) and isinstance(cat.get("hash"), str)
                and isinstance(fp, dict)):
            raise ValueError("unexpected shape")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        return Probe(error=f"the node catalog helper's answer could not be read ({exc})")
    for err in d.get("load_errors") or []:
        log.warning("node catalog: %s", err)
    cards = d.get("device_memory")
    return Probe(cat, fp, cards=cards if isinstance(cards, dict) else None)


# -- execution facts ----------------------------------------------------------------------
MAX_FACT_TEXT = 4096
MAX_NUMERICS = 32


def start_facts(facts: Mapping[str, Any] | None, fp: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's facts as it is sent to a worker: the worker's fingerprint summary, or
    ``not reported`` when the connection brought none (never an older one)."""
    out = dict(facts or {})
    out["fingerprint"] = summary(fp)
    out["fingerprint_source"] = "worker"
    return out


def with_run_report(facts: Mapping[str, Any] | None, data: Mapping[str, Any], src: str) -> dict[str, Any]:
    """A run's facts once its own process reported (an ``execution_facts`` event from
    ``src``), bounded: a worker may send anything in that event."""
    out = dict(facts or {})
    fp = data.get("fingerprint")
    if isinstance(fp, str):
        out["fingerprint"] = fp[:MAX_FACT_TEXT]
        out["fingerprint_source"] = "worker-run" if src.startswith("worker:") else "local-run"
    num = (data.get("resolved") or {}).get("numerics") if isinstance(data.get("resolved"), dict) else None
    if isinstance(num, dict):
        out["resolved"] = {"numerics": {str(k)[:64]: v if isinstance(v, (bool, int, float)) or v is None
                                        else str(v)[:256] for k, v in list(num.items())[:MAX_NUMERICS]}}
    devices = devicesets.facts_from_report(data)  # the device set its process was given and saw
    if devices is not None:
        out["devices"] = devices
    return out


if __name__ == "__main__":
    sys.exit(_helper_main(sys.argv[1:]))
