"""The offline archive docs/install.md tells users to make carries none of the server's state.

The command is taken from the doc as it is written and run in a checkout (a small git repository
under a scratch HOME) that holds what a used server's checkout holds: the owner's session token
and the database in ``.codefyui_dev/``, an agent's user-data folder, saved graphs and models in
``data/``, a ``.venv``. The archive must hold exactly the tracked files and the wheelhouse."""
from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "install.md"
TOKEN = "owner-session-" + "9c2b7e41d0a5f3e8"


def documented_command() -> str:
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    made = [b for b in blocks if "cdui-offline.tar.gz" in b and "-czf" in b]
    assert len(made) == 1, f"docs/install.md should show one command that makes cdui-offline.tar.gz: {made}"
    return "\n".join(line.strip() for line in made[0].splitlines())


def write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("tar") is None, reason="needs git and tar")
def test_the_documented_offline_archive_holds_no_server_state(tmp_path: Path) -> None:
    home = tmp_path / "home"
    repo = home / "CodefyUI"
    tracked = {"README.md": "readme", "bin/cdui": "#!/bin/sh\n", "cdui/__init__.py": "", "data/samples/iris.csv": "1,2"}
    for name, text in tracked.items():
        write(repo / name, text)
    (repo / "bin" / "cdui").chmod(0o755)
    write(repo / ".gitignore", ".venv/\n.codefyui_dev/\n/data/*\n!/data/samples\n/wheelhouse/\n")
    env = {**os.environ, "HOME": str(home), "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q"], cwd=repo, env=env, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, env=env, check=True)
    # What a used checkout holds besides: none of it may travel.
    write(repo / ".codefyui_dev" / "session-token", TOKEN)
    write(repo / ".codefyui_dev" / "cdui.sqlite3", b"SQLite format 3\x00" + TOKEN.encode())
    write(repo / "agent-ud" / "credentials.json", TOKEN)  # an agent's user-data folder git does not know
    write(repo / "data" / "graphs" / "g.json", TOKEN)
    write(repo / "data" / "models" / "iris" / "model.pt", b"model")
    write(repo / ".venv" / "bin" / "python", b"python")
    write(repo / "wheelhouse" / "cdui-1.0-py3-none-any.whl", b"wheel")

    subprocess.run(["bash", "-euo", "pipefail", "-c", documented_command()], cwd=home, env=env, check=True)

    archive = home / "cdui-offline.tar.gz"
    names = subprocess.run(["tar", "-tzf", str(archive)], capture_output=True, text=True, check=True).stdout.split()
    assert sorted(names) == sorted(f"CodefyUI/{n}" for n in [*tracked, ".gitignore",
                                                               "wheelhouse/cdui-1.0-py3-none-any.whl"])
    raw = gzip.decompress(archive.read_bytes())
    assert TOKEN.encode() not in raw and b"SQLite format 3" not in raw
    # It unpacks into a working checkout.
    out = tmp_path / "lab"
    out.mkdir()
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(out)], check=True)
    assert os.access(out / "CodefyUI" / "bin" / "cdui", os.X_OK)
    assert (out / "CodefyUI" / "data" / "samples" / "iris.csv").read_text() == "1,2"
