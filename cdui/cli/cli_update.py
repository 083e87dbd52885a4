"""``cdui release bundle`` (on a connected machine) and ``cdui update`` (offline, on the control plane).

See docs/updating.md. The steps of ``cdui update --from BUNDLE``, each leaving the old version running when
it fails:

1. the bundle is staged: every file the manifest lists is copied into a private folder and hashed
   (:func:`cdui.core.bundle.stage`); one mismatch refuses the whole bundle;
2. ``--plan`` stops here, printing the versions, the workers and the runs in flight;
3. a new environment is installed beside the running one and checked to import the bundle's version
   (:mod:`cdui.core.envs`);
4. runs executing on the control plane itself are waited for (worker runs go on: their agents keep them
   and the restarted control plane adopts them);
5. ``envs/current`` is switched in one rename and a background server (``cdui start``) is restarted by the
   launcher; ``--rollback`` switches back the same way.

The launcher (``bin/cdui``) runs ``update`` and ``release`` from the installation's own ``.venv``, never
from ``envs/current``: a broken new environment can always be rolled back.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from cdui.cli import daemon
from cdui.cli.cli_util import _die
from cdui.cli.client import Client, server_info
from cdui.core import bundle, config, envs
from cdui.core.errors import CduiError
from cdui.core.private import private_dir

WAIT_LOCAL_S = 1.0  # how often the update asks whether the control plane's own runs have ended
HANDOVER_WAIT_S = 60.0  # how long the old server gets to stop before `cdui stop` ends it
LAUNCHER = Path("bin") / "cdui"


# -- release bundle ------------------------------------------------------------------------------
def _checkout(source: str | None) -> Path:
    if source is not None:
        src = Path(source).expanduser().absolute()
    else:
        src = Path(__file__).resolve().parents[2]
    if not (src / "pyproject.toml").is_file() or not (src / "cdui" / "__init__.py").is_file():
        raise CduiError("bad_source", f"{src} is not a cdui checkout (no pyproject.toml and cdui/ there)",
                        "run `bin/cdui release bundle` from a checkout, or give --source CHECKOUT")
    return src


def build_bundle(src: Path, folder: Path, wheelhouse: Path | None, tmp: Path) -> bundle.Manifest:
    """cdui's wheel built from the checkout ``src`` (and the other wheels of ``wheelhouse``) into ``folder``,
    with the manifest of them all. Built from a copy of what the wheel holds, so the checkout gains no build/
    folder; ``--no-build-isolation``: setuptools from this environment, so an offline machine builds too."""
    copy = tmp / "src"
    copy.mkdir()
    shutil.copy2(src / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(src / "cdui", copy / "cdui", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "-w", str(folder), str(copy)], capture_output=True, text=True,
                       cwd=tmp, stdin=subprocess.DEVNULL)
    wheels = sorted(folder.glob("cdui-*.whl"))
    if r.returncode != 0 or len(wheels) != 1:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-10:])
        raise CduiError("build_failed", f"building cdui's wheel from {src} failed (exit {r.returncode}):\n{tail}")
    return _manifest_of(folder, wheels[0].name, wheelhouse)


def _manifest_of(folder: Path, wheel: str, wheelhouse: Path | None) -> bundle.Manifest:
    """Copy the other wheels of ``wheelhouse`` beside cdui's ``wheel`` in ``folder`` and write the manifest."""
    names = [wheel]
    for p in sorted(wheelhouse.glob("*.whl")) if wheelhouse else []:
        if p.is_file() and not p.is_symlink() and not p.name.startswith("cdui-"):
            shutil.copyfile(p, folder / p.name)
            names.append(p.name)
    manifest = bundle.make_manifest(folder, wheel.split("-")[1], wheel, names)
    (folder / bundle.MANIFEST).write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    return manifest


def cmd_release_bundle(args: argparse.Namespace) -> int:
    try:
        src = _checkout(args.source)
    except CduiError as err:
        return _die(str(err), 2)
    out = Path(args.out).expanduser().absolute()
    as_tar = out.suffix == ".tar"
    if out.exists():
        return _die(f"{out} already exists; name a new folder (or .tar) for the bundle", 2)
    wheelhouse = Path(args.wheelhouse).expanduser().absolute() if args.wheelhouse else None
    if wheelhouse is not None and not wheelhouse.is_dir():
        return _die(f"--wheelhouse {wheelhouse} is not a folder (make one with `bin/cdui wheelhouse DIR`)", 2)
    with tempfile.TemporaryDirectory(prefix="cdui-bundle-") as tmp:
        folder = Path(tmp) / "bundle" if as_tar else out.with_name(out.name + ".partial")
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        try:
            try:
                manifest = build_bundle(src, folder, wheelhouse, Path(tmp))
            except CduiError as err:
                return _die(str(err), 1)
            version = manifest.version
            if as_tar:
                with tarfile.open(out, "w") as tar:
                    for name in [bundle.MANIFEST, *(f.name for f in manifest.files)]:
                        tar.add(folder / name, arcname=name)
            else:
                folder.rename(out)
        finally:
            if not as_tar and folder.exists():
                shutil.rmtree(folder)
    size = sum(f.size for f in manifest.files)
    deps = len(manifest.files) - 1
    held = (f"cdui and {deps} dependency wheels" if deps else
            "cdui only; dependencies: those of the installation it updates")
    print(f"bundle of cdui {version} written to {out}: {len(manifest.files)} files, {size} bytes ({held})")
    print(f"on the control plane: cdui update --from {out} --plan   then   cdui update --from {out}")
    return 0


# -- update --------------------------------------------------------------------------------------
def _root() -> Path:
    root = envs.launcher_root()
    if not (root / LAUNCHER).is_file():
        raise CduiError("no_launcher", f"the installation root {root} has no {LAUNCHER}: `cdui update` updates an "
                        f"installation made by install.sh (a checkout with bin/cdui)",
                        "set CODEFYUI_INSTALL_ROOT to the installation, or update a pip-installed cdui with pip")
    return root


def _server(cfg: Any) -> tuple[int | None, dict[str, Any] | None]:
    pid = daemon.PidFile(cfg.user_data / "cdui.pid").running()
    return pid, (server_info(cfg.user_data) if pid else None)


def _running_runs(client: Client) -> list[dict[str, Any]]:
    return [r for r in client.call("GET", "/api/runs?status=running&limit=1000") if isinstance(r, dict)]


def _on_worker(run: dict[str, Any]) -> str | None:
    """The worker a running run is on, or None for the control plane's own (``worker_id`` "local")."""
    w = run.get("worker_id")
    return w if isinstance(w, str) and w and w != "local" else None


def _plan_lines(root: Path, e: envs.Envs, manifest: bundle.Manifest, src: Path, client: Client | None,
                pid: int | None) -> list[str]:
    cur = e.link(envs.CURRENT) or envs.VENV_LINK
    try:
        now = envs.installed_version(e.python(cur))
    except (CduiError, OSError, subprocess.SubprocessError):
        now = "?"
    deps = manifest.dependency_wheels
    lines = [f"update plan for the installation {root} from {src} (made {manifest.created or '?'}):",
             f"  control plane: cdui {now} -> {manifest.version}, into a new environment under {e.folder} "
             f"(now: {e.python(cur).parent.parent})",
             f"  bundle: {len(manifest.files)} files, {sum(f.size for f in manifest.files)} bytes, every sha256 "
             f"checked; " + (f"{len(deps)} dependency wheels installed with it" if deps else
                             "cdui's wheel alone: the dependencies stay those of the running environment")]
    if pid is None or client is None:
        lines.append("  server: not running; the next `cdui start` runs the new version")
        return lines
    lines.append(f"  server: running at {client.base} (pid {pid}): restarted on the new version after the switch")
    workers = client.call("GET", "/api/workers").get("workers", [])
    for w in workers:
        kind = "ssh" if w.get("ssh") else "direct"
        if w.get("version") == manifest.version:
            what = "already at that version"
        elif w.get("ssh"):
            what = "follows: its agent updates itself through its tunnel, after its runs"
        elif w.get("follow_updates"):
            what = ("follows: \"follow updates\" is on in the Workers panel (unless its agent has "
                    "CODEFYUI_AGENT_AUTO_UPDATE=0)")
        else:
            what = ("follows if its agent has CODEFYUI_AGENT_AUTO_UPDATE=1 (or with \"follow updates\" on in the "
                    "Workers panel); else refused until updated on its machine (`cdui update --from BUNDLE` there)")
        lines.append(f"  worker {w.get('name')} ({kind}, {w.get('status')}, cdui {w.get('version') or '?'}): {what}")
    if not workers:
        lines.append("  workers: none enrolled")
    runs = _running_runs(client)
    remote = [r for r in runs if _on_worker(r)]
    local = [r for r in runs if not _on_worker(r)]
    lines.append(f"  runs in flight: {len(remote)} on workers (they go on, and are adopted after the restart), "
                 f"{len(local)} on the control plane (waited for before the restart)"
                 + (": " + ", ".join(str(r.get("id")) for r in local) if local else ""))
    return lines


def _wait_local_runs(client: Client) -> None:
    said = False
    while True:
        local = [r for r in _running_runs(client) if not _on_worker(r)]
        if not local:
            return
        if not said:
            print(f"waiting for {len(local)} runs on the control plane to end before the restart: "
                  f"{', '.join(str(r.get('id')) for r in local)} (Ctrl+C leaves the old version running)",
                  flush=True)
            said = True
        time.sleep(WAIT_LOCAL_S)


def _restart(root: Path, pid: int, info: dict[str, Any] | None) -> None:
    """Stop the background server for a handover (its worker runs go on, to be adopted) and start it again
    through the launcher, so on ``envs/current``."""
    launcher = str(root / LAUNCHER)
    try:
        os.kill(pid, envs.HANDOVER_SIGNAL)
    except ProcessLookupError:
        pass
    if not daemon.wait_gone(pid, HANDOVER_WAIT_S):
        subprocess.run([launcher, "stop"], check=False, stdin=subprocess.DEVNULL)
    argv = [launcher, "start"]
    if info and info.get("host"):
        argv += ["--host", str(info["host"])]
    if info and info.get("port"):
        argv += ["--port", str(info["port"])]
    r = subprocess.run(argv, check=False, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise CduiError("restart_failed", f"`{' '.join(argv)}` failed (exit {r.returncode}) after the switch",
                        "see `cdui logs`; `cdui update --rollback` returns to the previous version")


def _bundle_from(given: str, root: Path, tmp: Path) -> Path:
    """What ``--from`` names, as a bundle to stage: a bundle (a folder with its manifest, or a ``.tar``) as it
    is; a folder of wheels without a manifest (a wheelhouse, e.g. from `bin/cdui wheelhouse`: one cdui wheel and
    its dependencies), given a manifest of its files as they are now; or a git ref of the installation's checkout
    (a tag, branch or commit), built into a bundle of cdui alone. Only a release bundle's manifest was made on the
    machine that built it: the other two are checked against themselves, which guards the copy, not the source."""
    path = Path(given).expanduser()
    if path.exists():
        path = path.absolute()
        if path.is_dir() and not (path / bundle.MANIFEST).exists():
            wheels = sorted(p for p in path.glob("cdui-*.whl") if p.is_file() and not p.is_symlink())
            if len(wheels) != 1:
                raise bundle.BundleRefused(
                    f"{path} has no {bundle.MANIFEST} and {len(wheels)} cdui wheels (cdui-*.whl): a wheelhouse for "
                    f"`cdui update` holds exactly one (make a bundle with `cdui release bundle` instead)")
            folder = tmp / "wheelhouse"
            folder.mkdir()
            shutil.copyfile(wheels[0], folder / wheels[0].name)
            print(f"{path} is a folder of wheels (no {bundle.MANIFEST}): its files are checked as they are now",
                  flush=True)
            _manifest_of(folder, wheels[0].name, path)
            return folder
        return path
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        raise bundle.BundleRefused(f"no bundle, folder of wheels or .tar at {path}, and "
                                   + (f"{root} is not a git checkout" if git else "no git command here")
                                   + " to read a git ref from: give the path of a bundle made by `cdui release bundle`")
    if given.startswith("-") or len(given) > 200:
        raise bundle.BundleRefused(f"{given[:80]!r} is not a bundle path or a git ref")
    r = subprocess.run([git, "-C", str(root), "rev-parse", "--verify", "--quiet", f"{given}^{{commit}}"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise bundle.BundleRefused(f"no bundle at {path}, and {given!r} is not a git ref of the checkout {root} "
                                   f"(`git -C {root} tag` and `git -C {root} branch -a` list them)")
    commit = r.stdout.strip()
    checkout = tmp / "ref"
    checkout.mkdir()
    archive = subprocess.run([git, "-C", str(root), "archive", "--format=tar", commit, "pyproject.toml", "cdui"],
                             capture_output=True, stdin=subprocess.DEVNULL)
    if archive.returncode != 0:
        raise bundle.BundleRefused(f"git archive of {given} ({commit[:12]}) failed: "
                                   f"{archive.stderr.decode(errors='replace').strip()[-300:]}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(checkout, filter="data")
    print(f"building a bundle of the checkout's {given} ({commit[:12]})...", flush=True)
    folder = tmp / "built"
    folder.mkdir()
    try:
        build_bundle(_checkout(str(checkout)), folder, None, tmp)
    except CduiError as err:
        raise bundle.BundleRefused(err.message) from None
    return folder


def cmd_update(args: argparse.Namespace) -> int:
    if (args.src is None) == (not args.rollback):
        return _die("give the bundle (`cdui update --from BUNDLE`) or `cdui update --rollback`, one of the two", 2)
    if args.plan and args.rollback:
        return _die("--plan goes with --from BUNDLE", 2)
    try:
        root = _root()
        cfg = config.load()
        e = envs.Envs(root)
        pid, info = _server(cfg)
        client = Client.for_user_data(cfg.user_data) if pid else None
        if args.rollback:
            was, now = e.rollback()
            print(f"switched {e.folder / envs.CURRENT} from {was} back to {now} "
                  f"(cdui {envs.installed_version(e.python(now))})")
        else:
            ud = private_dir(cfg.user_data)
            keep = bundle.offered_dir(ud)
            with tempfile.TemporaryDirectory(prefix="staging-", dir=private_dir(keep.parent)) as tmp:
                staged = Path(tmp) / "bundle"
                try:
                    src = _bundle_from(args.src, root, Path(tmp))
                    manifest = bundle.stage(src, staged)
                except bundle.BundleRefused as err:
                    return _die(f"refusing the bundle {args.src}: {err}; nothing was installed, the running "
                                f"version is unchanged", 1)
                if args.plan:
                    for line in _plan_lines(root, e, manifest, src, client, pid):
                        print(line)
                    print("nothing was changed (--plan)")
                    return 0
                print(f"bundle {args.src}: cdui {manifest.version}, {len(manifest.files)} files, every sha256 matches; "
                      f"installing into a new environment...", flush=True)
                try:
                    new = envs.install(e, staged, manifest)
                except envs.EnvError as err:
                    return _die(f"{err}; nothing was switched, the running version is unchanged", 1)
                # Kept, checked, for the agents that update themselves from this control plane.
                shutil.rmtree(keep, ignore_errors=True)
                staged.rename(keep)
            if client is not None:
                _wait_local_runs(client)
            was = e.switch(new.name)
            print(f"switched {e.folder / envs.CURRENT} to {new.name} (was {was})")
            gone = e.prune()
            if gone:
                print(f"removed older environments: {', '.join(p.name for p in gone)}")
        if pid is None:
            print("no background server is running; the next `cdui start` runs the switched version")
        elif args.no_restart:
            print(f"the server (pid {pid}) still runs the old version: restart it (`cdui stop` then `cdui start`, "
                  f"or `systemctl restart codefyui`)")
        else:
            try:
                _restart(root, pid, info)
            except CduiError as err:
                if args.rollback:
                    raise
                was, now = e.rollback()
                print(f"the new version did not start; switched {e.folder / envs.CURRENT} back to {now}",
                      flush=True)
                _restart(root, pid, info)
                return _die(f"{err}; rolled back to the version before, which runs again", 1)
    except CduiError as err:
        return _die(str(err), 1)
    return 0


# -- parser --------------------------------------------------------------------------------------
def add_commands(sub: Any) -> None:
    s = sub.add_parser("release", help="make what an offline update needs (`cdui release bundle OUT`)")
    rsub = s.add_subparsers(dest="release_command", metavar="COMMAND", required=True)
    b = rsub.add_parser("bundle", help="build cdui's wheel (and copy dependency wheels) into a checked bundle")
    b.add_argument("out", metavar="OUT", help="a new folder, or OUT.tar, for the bundle")
    b.add_argument("--wheelhouse", default=None, metavar="DIR",
                   help="also carry the dependency wheels of DIR (made by `bin/cdui wheelhouse DIR`)")
    b.add_argument("--source", default=None, metavar="CHECKOUT",
                   help="build from this checkout (default: the one this cdui runs from)")
    b.set_defaults(func=cmd_release_bundle)

    s = sub.add_parser("update", help="update this installation from a release bundle, offline (or roll back)")
    s.add_argument("--from", dest="src", default=None, metavar="BUNDLE",
                   help="the bundle folder or .tar made by `cdui release bundle`, a folder of wheels (one of them "
                        "cdui's), or a git ref of this checkout (a tag, branch or commit)")
    s.add_argument("--plan", action="store_true", help="print what would change, change nothing")
    s.add_argument("--rollback", action="store_true", help="return to the environment before the last switch")
    s.add_argument("--no-restart", action="store_true",
                   help="switch, but leave the running server to be restarted by hand (or by systemd)")
    s.set_defaults(func=cmd_update)
