"""Upload names and listings that cannot be misread: a name with a bidi control or a character that
looks like a folder separator is refused, and a symbolic link is listed as one, never as the file it
points to. A real control plane in process."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from harness import Plane

from cdui.core.paths import check_name


async def _upload(cp: Plane, name: str, data: bytes = b"a,b\n") -> tuple[int, dict]:
    """A multipart upload with the name as browsers and curl send it: raw UTF-8 in ``filename``
    (aiohttp's own FormData would percent-encode it)."""
    assert cp.session is not None
    boundary = "cdui-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    async with cp.session.post(cp.url + "/api/files/upload", data=body,
                               headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("name, char", [
    ("invoice\u202egpj.exe", "U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("report\u2066.csv", "U+2066 (LEFT-TO-RIGHT ISOLATE)"),
    ("train\u200b.csv", "U+200B (ZERO WIDTH SPACE)"),
    ("models\u2044evil.pt", "U+2044 (FRACTION SLASH)"),
    ("models\u2215evil.pt", "U+2215 (DIVISION SLASH)"),
    ("models\uff0fevil.pt", "U+FF0F (FULLWIDTH SOLIDUS)"),
    ("models\uff3cevil.pt", "U+FF3C (FULLWIDTH REVERSE SOLIDUS)"),
    ("a\u29f8b.csv", "U+29F8 (BIG SOLIDUS)"),
    ("a\u2028b.csv", "U+2028 (LINE SEPARATOR)"),
])
async def test_deceptive_upload_names_are_refused(dirs: dict[str, Path], name: str, char: str) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        status, body = await _upload(cp, name)
        assert status == 400, body
        err = body["error"]
        assert err["code"] == "path_refused" and char in err["message"], err
        assert err["hint"] == "rename the file without it"
        assert await cp.call("GET", "/api/files") == []
        # The server kept serving: a plain name next.
        assert (await _upload(cp, "train.csv"))[0] == 201


@pytest.mark.parametrize("name", ["café.csv", "データ.csv", "ノート.csv", "a-b_c d.csv", "emoji-\U0001f600.csv"])
def test_ordinary_names_stay_allowed(name: str) -> None:
    assert check_name(name) == name


async def test_a_symlink_is_listed_as_a_symlink(dirs: dict[str, Path], tmp_path: Path) -> None:
    async with Plane(dirs["user_data"], dirs["data_dir"]) as cp:
        assert (await _upload(cp, "train.csv", b"x,y\n1,2\n"))[0] == 201
        files = cp.config.layout.folder("files")
        secret = tmp_path / "outside.txt"
        secret.write_text("not for the listing" * 100)
        os.symlink(secret, files / "outside.csv")
        os.symlink(files / "train.csv", files / "inside.csv")
        (tmp_path / "elsewhere").mkdir()
        os.symlink(tmp_path / "elsewhere", files / "linked-folder")
        assert await cp.call("GET", "/api/files") == [
            {"name": "inside.csv", "size": None, "type": "symlink"},
            {"name": "linked-folder", "size": None, "type": "symlink"},
            {"name": "outside.csv", "size": None, "type": "symlink"},
            {"name": "train.csv", "size": 8, "type": "file"},
        ]
