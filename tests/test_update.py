"""`cdui release bundle` and `cdui update`: the bundle checks (a table, no processes) and an update of a
control plane through the launcher itself (e2e).

The e2e module builds one bundle, of a copy of this checkout whose version is bumped, with
`bin/cdui release bundle`, and drives a launcher that lives in its own installation root (a copy of
bin/cdui beside a link to this checkout's .venv), so the update's envs/ never lands in the checkout.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdui import __version__
from cdui.cli import cli_workers
from cdui.core import bundle, envs
from cdui.plane.http import worker_routes
from procs import REPO_ROOT, Proc, env_for, free_port, graph, node, track_log, tracked_copy, trig, untrack_log, wait_for
from sshd import running as running_sshd
from syspkgs import requires_command

NEW_VERSION = f"{__version__}+update1"
# A node that runs until a file exists: a local run that is in flight for exactly as long as a test wants.
GATE = '''
import os, time
from cdui.nodes.base import Node, Param, Port


class Gate(Node):
    NODE_NAME = "Gate"
    CATEGORY = "test"

    @classmethod
    def define_params(cls):
        return [Param("path", "str", "")]

    @classmethod
    def define_outputs(cls):
        return [Port("value", "SCALAR")]

    def execute(self, inputs, params, ctx):
        while not os.path.exists(params["path"]):
            time.sleep(0.05)
        return {"value": 1.0}
'''
SHA_A = "a" * 64


# -- the manifest, as a table --------------------------------------------------------------------
def _manifest(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": "cdui-bundle", "format_version": 1, "version": "1.2.3",
                           "created": "2026-12-03T08:00:00Z", "cdui_wheel": "cdui-1.2.3-py3-none-any.whl",
                           "files": [{"name": "cdui-1.2.3-py3-none-any.whl", "sha256": SHA_A, "size": 10}]}
    doc.update(over)
    return doc


def _file(name: str, sha: Any = SHA_A, size: Any = 10) -> dict[str, Any]:
    return {"name": name, "sha256": sha, "size": size}


WHEEL = _file("cdui-1.2.3-py3-none-any.whl")


@pytest.mark.parametrize("doc, says", [
    (_manifest(format="cdui-backup"), "is not the manifest of a cdui release bundle"),
    (_manifest(format_version=2), "has format version 2"),
    (_manifest(version="../1"), "gives the version '../1', which is not a version number"),
    (_manifest(files=[]), "must list 1 to 1000 files"),
    (_manifest(files=[WHEEL, _file("../evil.whl")]), "names '../evil.whl', which is not a plain wheel file name"),
    (_manifest(files=[WHEEL, _file("sub/x.whl")]), "names 'sub/x.whl', which is not a plain wheel file name"),
    (_manifest(files=[WHEEL, _file(".hidden.whl")]), "names '.hidden.whl', which is not a plain wheel file name"),
    (_manifest(files=[WHEEL, _file("setup.py")]), "names 'setup.py', which is not a plain wheel file name"),
    (_manifest(files=[WHEEL, _file("a..b.whl")]), "names 'a..b.whl', which is not a plain wheel file name"),
    (_manifest(files=[WHEEL, WHEEL]), "lists cdui-1.2.3-py3-none-any.whl twice"),
    (_manifest(files=[_file(WHEEL["name"], sha="A" * 64)]), "is not 64 lowercase hex digits"),
    (_manifest(files=[_file(WHEEL["name"], size=0)]), "the size 0; a bundle file holds 1 to"),
    (_manifest(files=[_file(WHEEL["name"], size=True)]), "the size True; a bundle file holds 1 to"),
    (_manifest(files=[_file(WHEEL["name"], size=bundle.MAX_FILE_BYTES + 1)]), "a bundle file holds 1 to"),
    (_manifest(files=[_file(f"x{i}.whl", size=bundle.MAX_FILE_BYTES) for i in range(9)] + [WHEEL]),
     "more than the 68719476736 a bundle may hold"),
    (_manifest(cdui_wheel="other-1.2.3-py3-none-any.whl"), "names 'other-1.2.3-py3-none-any.whl' as cdui's wheel"),
    (_manifest(cdui_wheel="cdui-9.9-py3-none-any.whl",
               files=[WHEEL, _file("cdui-9.9-py3-none-any.whl")]), "it must be a listed file named cdui-1.2.3-"),
])
def test_a_bad_manifest_is_refused_naming_what_is_wrong(doc: dict[str, Any], says: str) -> None:
    with pytest.raises(bundle.BundleRefused) as err:
        bundle.parse_manifest(json.dumps(doc).encode())
    assert says in str(err.value)


def test_a_manifest_over_its_size_is_refused_unread() -> None:
    with pytest.raises(bundle.BundleRefused, match="larger than 1048576 bytes"):
        bundle.parse_manifest(b" " * (bundle.MAX_MANIFEST_BYTES + 1))


# -- staging: only listed files, each hashed -----------------------------------------------------
def _bundle_folder(tmp: Path, files: dict[str, bytes]) -> tuple[Path, bundle.Manifest]:
    folder = tmp / "b"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    wheel = next(n for n in files if n.startswith("cdui-"))
    m = bundle.make_manifest(folder, wheel.split("-")[1], wheel, files)
    (folder / bundle.MANIFEST).write_text(json.dumps(m.to_json()))
    return folder, m


FILES = {"cdui-1.2.3-py3-none-any.whl": b"the cdui wheel", "dep-1.0-py3-none-any.whl": b"a dependency"}


def test_a_folder_bundle_is_staged_file_by_file(tmp_path: Path) -> None:
    folder, m = _bundle_folder(tmp_path, FILES)
    (folder / "unlisted.whl").write_bytes(b"not in the manifest")
    got = bundle.stage(folder, tmp_path / "staged")
    assert got == m and got.dependency_wheels == (m.entry("dep-1.0-py3-none-any.whl"),)
    assert sorted(p.name for p in (tmp_path / "staged").iterdir()) == [*sorted(FILES), bundle.MANIFEST]
    assert (tmp_path / "staged" / "dep-1.0-py3-none-any.whl").read_bytes() == b"a dependency"
    assert (tmp_path / "staged").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("change, says", [
    (lambda f: f.write_bytes(b"the cdui wheeL"), "does not match the manifest: it has sha256 "),
    (lambda f: f.write_bytes(b"the cdui wheel, longer"), "does not match the manifest: it has more than 14 bytes"),
    (lambda f: f.write_bytes(b"short"), "does not match the manifest: it has 5 bytes"),
    (lambda f: f.unlink(), "is missing from the bundle or not a plain file"),
])
def test_a_changed_file_refuses_the_whole_bundle(tmp_path: Path, change: Any, says: str) -> None:
    folder, _ = _bundle_folder(tmp_path, FILES)
    change(folder / "cdui-1.2.3-py3-none-any.whl")
    with pytest.raises(bundle.BundleRefused) as err:
        bundle.stage(folder, tmp_path / "staged")
    assert str(folder / "cdui-1.2.3-py3-none-any.whl") in str(err.value) and says in str(err.value)
    assert not (tmp_path / "staged").exists()


def test_a_listed_file_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    folder, _ = _bundle_folder(tmp_path, FILES)
    secret = tmp_path / "secret"
    secret.write_bytes(b"a dependency")  # the same bytes: only the link itself is wrong
    (folder / "dep-1.0-py3-none-any.whl").unlink()
    (folder / "dep-1.0-py3-none-any.whl").symlink_to(secret)
    with pytest.raises(bundle.BundleRefused, match="is missing from the bundle or not a plain file"):
        bundle.stage(folder, tmp_path / "staged")


def _tar(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def test_a_tar_bundle_yields_only_its_listed_regular_files(tmp_path: Path) -> None:
    folder, m = _bundle_folder(tmp_path, FILES)
    members = {n: (folder / n).read_bytes() for n in [*FILES, bundle.MANIFEST]}
    members["../escape.whl"] = b"outside"
    tar = _tar(tmp_path / "b.tar", members, links={"evil.whl": "/etc/passwd"})
    assert bundle.read_manifest(tar) == m
    assert bundle.stage(tar, tmp_path / "staged") == m
    assert sorted(p.name for p in (tmp_path / "staged").iterdir()) == [*sorted(FILES), bundle.MANIFEST]
    assert not (tmp_path / "escape.whl").exists()


def test_a_tar_whose_listed_file_is_a_link_is_refused(tmp_path: Path) -> None:
    folder, _ = _bundle_folder(tmp_path, FILES)
    members = {n: (folder / n).read_bytes() for n in ["cdui-1.2.3-py3-none-any.whl", bundle.MANIFEST]}
    tar = _tar(tmp_path / "b.tar", members, links={"dep-1.0-py3-none-any.whl": "/etc/passwd"})
    with pytest.raises(bundle.BundleRefused, match="does not hold dep-1.0-py3-none-any.whl"):
        bundle.stage(tar, tmp_path / "staged")
    assert not (tmp_path / "staged").exists()


# -- the links: switch and rollback --------------------------------------------------------------
def test_switch_and_rollback_swap_current_and_previous(tmp_path: Path) -> None:
    e = envs.Envs(tmp_path)
    for name in ("1.0-1", "1.1-1", "0.9-1"):
        (e.folder / name / "bin").mkdir(parents=True)
        (e.folder / name / "bin" / "python").write_text("")
    with pytest.raises(envs.EnvError, match="there is nothing to roll back to"):
        e.rollback()
    assert e.switch("1.0-1") == envs.VENV_LINK
    assert (e.link(envs.CURRENT), e.link(envs.PREVIOUS)) == ("1.0-1", envs.VENV_LINK)
    assert e.switch("1.1-1") == "1.0-1"
    assert e.prune() == [e.folder / "0.9-1"]  # named by neither link
    assert e.rollback() == ("1.1-1", "1.0-1")
    assert (e.link(envs.CURRENT), e.link(envs.PREVIOUS)) == ("1.0-1", "1.1-1")
    assert e.rollback() == ("1.0-1", "1.1-1")  # a second rollback rolls forward again
    assert e.new_folder("1.1") == e.folder / "1.1-2"
    shutil.rmtree(e.folder / "1.0-1")
    with pytest.raises(envs.EnvError, match="the previous environment .*1.0-1 is gone; nothing was changed"):
        e.rollback()
    assert e.link(envs.CURRENT) == "1.1-1"


# -- a worker's update state, as the list and the page show it -----------------------------------
@pytest.mark.parametrize("version, updating, state, flag", [
    (__version__, None, {"state": "current"}, ""),
    ("0.0.1", None, {"state": "behind", "to": __version__}, f" [behind: the control plane runs {__version__}]"),
    ("0.0.1", {"to": __version__, "since": "T"}, {"state": "updating", "to": __version__, "since": "T"},
     f" [updating to {__version__} since T]"),
])
def test_a_workers_update_state(version: str, updating: dict[str, Any] | None, state: dict[str, Any],
                                flag: str) -> None:
    assert worker_routes.update_state(version, updating) == state
    assert cli_workers.update_flag(state) == flag


# -- e2e: the control plane through bin/cdui -----------------------------------------------------
class Install:
    """An installation root of its own: bin/cdui (a copy of the launcher), pyproject.toml (what the
    launcher's install stamp is checked against) and .venv (this checkout's, linked)."""

    def __init__(self, root: Path, ud: Path, data: Path) -> None:
        self.root, self.ud = root, ud
        (data / "custom_nodes").mkdir(parents=True)
        (data / "custom_nodes" / "gate.py").write_text(GATE)
        (root / "bin").mkdir(parents=True)
        shutil.copy2(REPO_ROOT / "bin" / "cdui", root / "bin" / "cdui")
        shutil.copy2(REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
        (root / ".venv").symlink_to(REPO_ROOT / ".venv")
        self.env = env_for(ud, data, {"CODEFYUI_INSTALL_ROOT": str(root)})

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([str(self.root / "bin" / "cdui"), *args], env=self.env, cwd=str(self.root.parent),
                           text=True, capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
        if check:
            assert r.returncode == 0, explain(r)
        return r

    def api(self, method: str, path: str, body: Any = None) -> Any:
        r = self("api", method, path, *([json.dumps(body)] if body is not None else []))
        return json.loads(r.stdout)

    def health(self) -> dict[str, Any]:
        info = json.loads((self.ud / "server.json").read_text())
        r = self("api", "GET", "/api/health")
        return {"pid": info["pid"], **json.loads(r.stdout)}


def explain(r: subprocess.CompletedProcess[str]) -> str:
    return f"{r.args}: exit {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Install, Path]]:
    """One installation with a background server, and one bundle of the bumped version for it."""
    tmp = tmp_path_factory.mktemp("update")
    inst = Install(tmp / "install", tmp / "ud", tmp / "data")
    src = tracked_copy(tmp / "src", untracked=True)
    init = src / "cdui" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{__version__}"', f'__version__ = "{NEW_VERSION}"'))
    out = tmp / "bundle"
    r = inst("release", "bundle", str(out), "--source", str(src))
    assert f"bundle of cdui {NEW_VERSION} written to {out}: 1 files" in r.stdout, explain(r)
    track_log(tmp / "ud" / "cdui.log", "cdui start (background, updated)")
    try:
        inst("start", "--port", str(free_port()))
        yield inst, out
    finally:
        inst("stop", check=False)
        untrack_log(tmp / "ud" / "cdui.log")


@pytest.mark.e2e
def test_release_bundle_lists_the_wheel_with_its_sha256(made: tuple[Install, Path]) -> None:
    _, out = made
    doc = json.loads((out / bundle.MANIFEST).read_text())
    (f,) = doc["files"]
    assert doc["version"] == NEW_VERSION and doc["cdui_wheel"] == f["name"]
    assert f["name"].startswith(f"cdui-{NEW_VERSION}-") and f["name"].endswith(".whl")
    assert f["sha256"] == bundle.sha256_file(out / f["name"]) and f["size"] == (out / f["name"]).stat().st_size


@pytest.mark.e2e
def test_update_from_a_folder_of_wheels_or_a_git_ref_of_the_checkout(made: tuple[Install, Path],
                                                                   tmp_path: Path) -> None:
    """`--from` also takes a folder of wheels without a manifest (a wheelhouse holding one cdui wheel) and a git
    ref of the installation's checkout, built into a bundle of cdui alone; --plan shows each one's version and
    changes nothing. A folder without a cdui wheel, and a name that is neither a path nor a ref, are refused."""
    _, out = made
    inst = Install(tmp_path / "inst", tmp_path / "ud", tmp_path / "data")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    shutil.copyfile(next(out.glob("cdui-*.whl")), wheels / next(out.glob("cdui-*.whl")).name)
    r = inst("update", "--from", str(wheels), "--plan")
    assert f"{wheels} is a folder of wheels (no manifest.json): its files are checked as they are now" in r.stdout
    assert f"control plane: cdui {__version__} -> {NEW_VERSION}" in r.stdout, explain(r)
    assert r.stdout.endswith("nothing was changed (--plan)\n") and not (inst.root / "envs").exists(), explain(r)
    empty = tmp_path / "no-cdui"
    empty.mkdir()
    r = inst("update", "--from", str(empty), "--plan", check=False)
    assert r.returncode == 1 and "has no manifest.json and 0 cdui wheels" in r.stderr, explain(r)

    # The installation as a git checkout: a tagged commit of the next version, then this version on top.
    git = shutil.which("git")
    if git is None:
        pytest.skip("no git command: a git ref cannot be read")

    def run_git(*args: str) -> None:
        subprocess.run([git, "-C", str(inst.root), "-c", "user.name=lab", "-c", "user.email=lab@example.com",
                        *args], check=True, capture_output=True, timeout=120)
    shutil.copytree(REPO_ROOT / "cdui", inst.root / "cdui", ignore=shutil.ignore_patterns("__pycache__"))
    init = inst.root / "cdui" / "__init__.py"
    mine = init.read_text()
    init.write_text(mine.replace(f'__version__ = "{__version__}"', f'__version__ = "{NEW_VERSION}"'))
    run_git("init", "-q")
    run_git("add", "pyproject.toml", "cdui")
    run_git("commit", "-q", "-m", "next")
    run_git("tag", "next-release")
    init.write_text(mine)
    run_git("commit", "-q", "-am", "this version")
    r = inst("update", "--from", "next-release", "--plan")
    assert "building a bundle of the checkout's next-release (" in r.stdout, explain(r)
    assert f"control plane: cdui {__version__} -> {NEW_VERSION}" in r.stdout, explain(r)
    assert r.stdout.endswith("nothing was changed (--plan)\n") and not (inst.root / "envs").exists(), explain(r)
    r = inst("update", "--from", "no-such-release", "--plan", check=False)
    assert r.returncode == 1 and "'no-such-release' is not a git ref of the checkout" in r.stderr, explain(r)


@pytest.mark.e2e
def test_update_plan_tamper_update_and_rollback_of_the_control_plane(made: tuple[Install, Path],
                                                                     tmp_path: Path) -> None:
    """--plan changes nothing; a bundle with one changed byte is refused with the old version still
    serving; the update moves the server to the new version; --rollback brings the old one back."""
    inst, out = made
    try:
        _update_plan_tamper_update_and_rollback(inst, out, tmp_path)
    finally:
        inst("stop", check=False)  # the server this test restarted is its own to end


def _update_plan_tamper_update_and_rollback(inst: Install, out: Path, tmp_path: Path) -> None:
    before = inst.health()
    assert before["version"] == __version__

    r = inst("update", "--from", str(out), "--plan")
    assert f"control plane: cdui {__version__} -> {NEW_VERSION}" in r.stdout, explain(r)
    assert "runs in flight: 0 on workers" in r.stdout and "workers: none enrolled" in r.stdout, explain(r)
    assert r.stdout.endswith("nothing was changed (--plan)\n"), explain(r)
    assert not (inst.root / "envs").exists()

    bad = tmp_path / "tampered"
    shutil.copytree(out, bad)
    wheel = next(bad.glob("cdui-*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01
    wheel.write_bytes(bytes(data))
    r = inst("update", "--from", str(bad), check=False)
    assert r.returncode == 1, explain(r)
    assert r.stderr.startswith(f"cdui: error: refusing the bundle {bad}: {wheel} does not match the manifest: "
                               f"it has sha256 "), explain(r)
    assert "nothing was installed, the running version is unchanged" in r.stderr, explain(r)
    assert not (inst.root / "envs" / "current").exists()
    assert inst.health() == before

    # A bundle whose wheel is no wheel, listed with its true hash: the install fails, nothing is switched.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / wheel.name).write_bytes(b"not a zip file")
    manifest = bundle.make_manifest(broken, NEW_VERSION, wheel.name, [wheel.name])
    (broken / bundle.MANIFEST).write_text(json.dumps(manifest.to_json()))
    r = inst("update", "--from", str(broken), check=False)
    assert r.returncode == 1, explain(r)
    assert f"installing cdui {NEW_VERSION} into {inst.root / 'envs' / (NEW_VERSION + '-1')} failed" in r.stderr
    assert "nothing was switched, the running version is unchanged" in r.stderr, explain(r)
    assert sorted(p.name for p in (inst.root / "envs").iterdir()) == []
    assert inst.health() == before

    # A run on the control plane itself is waited for: the restart comes after it succeeded.
    gate = tmp_path / "gate-open"
    run = inst.api("POST", "/api/runs", {"graph": _gated(gate)})
    wait_for(lambda: inst.api("GET", f"/api/runs/{run['id']}")["status"] == "running", 120, what="the gated run")
    update = subprocess.Popen([str(inst.root / "bin" / "cdui"), "update", "--from", str(out)], env=inst.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert update.stdout is not None
        lines = []
        for line in update.stdout:
            lines.append(line)
            if line.startswith("waiting for 1 runs on the control plane"):
                break
        assert lines[-1] == (f"waiting for 1 runs on the control plane to end before the restart: {run['id']} "
                             f"(Ctrl+C leaves the old version running)\n"), lines
        assert inst.health() == before
        gate.write_text("")
        rest, err = update.communicate(timeout=300)
    finally:
        if update.poll() is None:
            update.kill()
            update.wait()
    assert update.returncode == 0, (lines, rest, err)
    assert f"switched {inst.root / 'envs' / 'current'} to {NEW_VERSION}-1 (was ../.venv)" in rest, rest
    assert inst.api("GET", f"/api/runs/{run['id']}")["status"] == "succeeded"
    after = inst.health()
    assert after["version"] == NEW_VERSION and after["pid"] != before["pid"]
    assert inst("--version").stdout == f"cdui {NEW_VERSION}\n"
    assert os.readlink(inst.root / "envs" / "current") == f"{NEW_VERSION}-1"

    r = inst("update", "--rollback")
    assert f"from {NEW_VERSION}-1 back to ../.venv (cdui {__version__})" in r.stdout, explain(r)
    assert inst.health()["version"] == __version__
    assert inst("--version").stdout == f"cdui {__version__}\n"


def _gated(gate: Path) -> dict[str, Any]:
    return graph([node("start", "Start"), node("gate", "Gate", path=str(gate))], [trig("start", "gate")],
                 name="gated")


@pytest.mark.e2e
def test_an_opted_in_agent_follows_the_update_and_its_run_in_flight_succeeds(made: tuple[Install, Path],
                                                                            tmp_path: Path) -> None:
    """A direct agent with CODEFYUI_AGENT_AUTO_UPDATE=1 is refused by the updated control plane, fetches the
    bundle over its credential, installs it into its own installation's envs/, waits for its run (which
    was going during the update) and restarts itself on the new version, same pid: the run succeeds, and
    no command was run on the worker's side. A second agent, opted in from the Workers panel ("follow updates",
    its own setting left at its default) rather than by its setting, whose installation cannot take a new
    environment (its envs/ is a file), tries the update, keeps its version and ends as a refused agent does,
    saying why."""
    _, out = made
    cp = Install(tmp_path / "cp", tmp_path / "cp-ud", tmp_path / "cp-data")
    worker_root, broken_root = tmp_path / "worker", tmp_path / "broken"
    Install(worker_root, tmp_path / "w-ud", tmp_path / "w-data")  # the worker's own installation
    Install(broken_root, tmp_path / "w2-ud", tmp_path / "w2-data")
    (broken_root / "envs").write_text("not a folder")
    track_log(tmp_path / "cp-ud" / "cdui.log", "cdui start (background, control plane)")
    agent: Proc | None = None
    broken: Proc | None = None
    try:
        cp("start", "--port", str(free_port()))
        url = json.loads((tmp_path / "cp-ud" / "server.json").read_text())["url"]

        def opted_in(name: str, root: Path, by_setting: bool = True) -> Proc:
            token = cp.api("POST", "/api/workers/tokens", {"ttl_s": 600, "uses": 1})["token"]
            env = env_for(tmp_path / f"{name}-ud", tmp_path / "w-data", {"CODEFYUI_INSTALL_ROOT": str(root)})
            if by_setting:
                env["CODEFYUI_AGENT_AUTO_UPDATE"] = "1"
            else:
                env.pop("CODEFYUI_AGENT_AUTO_UPDATE", None)  # its default: as the Workers panel says
            env.pop(envs.LAUNCHER_ROOT_ENV, None)  # started as `python -m cdui`, not by a launcher
            a = Proc([sys.executable, "-m", "cdui", "agent", "start", "--control", url, "--token", token,
                      "--name", name, "--devices", "cpu", "--foreground"], env, tmp_path / f"{name}.log",
                     name=f"agent-{name}")
            a.spawn()
            return a
        agent, broken = opted_in("w1", worker_root), opted_in("w2", broken_root, by_setting=False)

        def worker() -> dict[str, Any] | None:
            return next((w for w in cp.api("GET", "/api/workers")["workers"] if w["name"] == "w1"), None)
        wait_for(lambda: (worker() or {}).get("online"), 120, what="w1 online", detail=agent.log_tail)
        wait_for(lambda: any(w["name"] == "w2" and w["online"] for w in cp.api("GET", "/api/workers")["workers"]),
                 120, what="w2 online", detail=broken.log_tail)
        assert worker()["version"] == __version__  # type: ignore[index]
        assert worker()["update"] == {"state": "current"}  # type: ignore[index]
        # w2 follows because its owner said so (the Workers panel's switch; here its command, through bin/cdui).
        r = cp("workers", "follow-updates", "w2", "on")
        assert r.stdout == ("worker w2: its agent follows `cdui update` (unless it has CODEFYUI_AGENT_AUTO_UPDATE=0)"
                            "\n"), explain(r)
        assert [w["follow_updates"] for w in cp.api("GET", "/api/workers")["workers"] if w["name"] in ("w1", "w2")] \
            == [False, True]

        gate = tmp_path / "gate-open"
        run = cp.api("POST", "/api/runs", {"graph": _gated(gate), "options": {"target": {"worker": "w1"}}})
        wait_for(lambda: cp.api("GET", f"/api/runs/{run['id']}")["status"] == "running", 120, what="the run on w1")

        r = cp("update", "--from", str(out))
        assert "runs in flight" not in r.stdout and f"to {NEW_VERSION}-1" in r.stdout, explain(r)
        assert cp.health()["version"] == NEW_VERSION

        wait_for(lambda: not broken.alive, 180, what="w2 to give up", detail=broken.log_tail)
        assert broken.returncode == 2, broken.log_tail()
        said = broken.log_text()
        assert f"this agent could not update itself and keeps cdui {__version__}: " in said, said[-3000:]
        assert (f"cdui: error: refused by the control plane: version mismatch: worker {__version__}, control plane "
                f"{NEW_VERSION}; the owner lets this worker follow the update") in said, said[-3000:]
        assert (broken_root / "envs").read_text() == "not a folder" and "restarting on the new version" not in said

        # Refused, the agent updates itself and then waits for its run: the gate holds the run until then.
        wait_for(lambda: f"waiting for 1 runs to end before restarting on the new version: {run['id']}"
                 in agent.log_text(), 180, what="the agent's update", detail=agent.log_tail)
        assert os.readlink(worker_root / "envs" / "current") == f"{NEW_VERSION}-1"
        shown = worker()
        assert shown is not None and shown["update"]["state"] == "updating", shown
        assert shown["update"]["to"] == NEW_VERSION and not shown["online"], shown
        r = cp("workers", "list")
        assert "w1 " in r.stdout and f"[updating to {NEW_VERSION} since " in r.stdout, explain(r)
        pid = agent.pid
        gate.write_text("")
        wait_for(lambda: (worker() or {}).get("online") and worker()["version"] == NEW_VERSION,  # type: ignore[index]
                 180, what="w1 back on the new version", detail=agent.log_tail)
        assert agent.alive and agent.pid == pid
        assert cp.api("GET", f"/api/runs/{run['id']}")["status"] == "succeeded"
        assert worker()["update"] == {"state": "current"}  # type: ignore[index]
        assert f"restarting on the new version: {worker_root / 'envs' / (NEW_VERSION + '-1')}/bin/python -P -m " \
               f"cdui agent start" in agent.log_text()
    finally:
        for a in (agent, broken):
            if a is not None:
                a.stop()
        cp("stop", check=False)
        untrack_log(tmp_path / "cp-ud" / "cdui.log")


@pytest.mark.e2e
@requires_command("sshd", "openssh-server")
@requires_command("ssh", "openssh-client")
def test_an_ssh_worker_follows_the_update_over_its_ssh_and_its_run_in_flight_succeeds(
        made: tuple[Install, Path], tmp_path: Path) -> None:
    """An SSH worker (real sshd) whose remote installation is not the control plane's: after `cdui update`
    its agent, which the control plane started with CODEFYUI_AGENT_AUTO_UPDATE=1, fetches the bundle through
    its tunnel, installs it into the remote installation's envs/ and restarts itself on it (same pid) once
    its run, going during the update, ended: the run succeeds, with no command run on the remote side."""
    _, out = made
    with running_sshd(tmp_path / "ssh") as sshd:
        cp = Install(tmp_path / "cp", tmp_path / "cp-ud", tmp_path / "cp-data")
        cp.env.update(sshd.env())
        remote = Install(tmp_path / "remote", sshd.home / "ud", sshd.home / "data")
        launcher = sshd.home / "CodefyUI" / "bin" / "cdui"  # what the control plane runs over ssh
        launcher.write_text(f"#!/bin/sh\nCODEFYUI_USER_DATA_DIR={sshd.home / 'ud'}; export CODEFYUI_USER_DATA_DIR\n"
                            f"CODEFYUI_DATA_DIR={sshd.home / 'data'}; export CODEFYUI_DATA_DIR\n"
                            f"CODEFYUI_LOCAL_DEVICES=cpu; export CODEFYUI_LOCAL_DEVICES\n"
                            f"exec {remote.root / 'bin' / 'cdui'} \"$@\"\n")
        track_log(tmp_path / "cp-ud" / "cdui.log", "cdui start (background, control plane)")
        try:
            cp("start", "--port", str(free_port()))
            cp.api("POST", "/api/workers/ssh", {"target": "root@localhost", "port": sshd.port, "name": "s1"})

            def worker() -> dict[str, Any]:
                return next((w for w in cp.api("GET", "/api/workers")["workers"] if w["name"] == "s1"), {})
            wait_for(lambda: worker().get("online"), 180, what="s1 online", detail=worker)
            assert worker()["version"] == __version__
            (pid,) = sshd.agent_pids()

            gate = tmp_path / "gate-open"
            run = cp.api("POST", "/api/runs", {"graph": _gated(gate), "options": {"target": {"worker": "s1"}}})
            wait_for(lambda: cp.api("GET", f"/api/runs/{run['id']}")["status"] == "running", 120,
                     what="the run on s1")

            r = cp("update", "--from", str(out))
            assert f"to {NEW_VERSION}-1" in r.stdout, explain(r)
            agent_log = next((sshd.home / ".codefyui-ssh").glob("*/agent.log"))
            wait_for(lambda: f"waiting for 1 runs to end before restarting on the new version: {run['id']}"
                     in agent_log.read_text(), 180, what="the SSH agent's update",
                     detail=lambda: agent_log.read_text()[-3000:])
            assert os.readlink(remote.root / "envs" / "current") == f"{NEW_VERSION}-1"
            gate.write_text("")
            wait_for(lambda: worker().get("online") and worker()["version"] == NEW_VERSION, 180,
                     what="s1 back on the new version", detail=lambda: agent_log.read_text()[-3000:])
            assert sshd.agent_pids() == [pid]
            assert cp.api("GET", f"/api/runs/{run['id']}")["status"] == "succeeded"
        finally:
            cp("stop", check=False)
            untrack_log(tmp_path / "cp-ud" / "cdui.log")
