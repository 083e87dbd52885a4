"""CODEFYUI_SESSION_TOKEN_FILE: a session token kept across restarts, in a file only its owner may read."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cdui.core.errors import CduiError
from cdui.core.session_token import fixed_session_token


def test_a_missing_file_is_created_private_and_then_reused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    token = fixed_session_token(path)
    assert len(token) >= 32 and path.read_text() == token + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert fixed_session_token(path) == token
    path.write_text("my-lab-token-0123456789\n")
    assert fixed_session_token(path) == "my-lab-token-0123456789"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_file_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "token"
    path.write_text("my-lab-token-0123456789\n")
    os.chmod(path, mode)
    with pytest.raises(CduiError) as info:
        fixed_session_token(path)
    assert info.value.code == "bad_setting"
    assert str(info.value) == (f"CODEFYUI_SESSION_TOKEN_FILE={path} may be read by other users (mode {mode:04o}): "
                               f"whoever reads the token owns this server (make it the owner's alone with "
                               f"`chmod 600 {path}` and start again)")


@pytest.mark.parametrize("text", ["", "short\n", "has space in it 0123456789\n", "two\nlines-0123456789\n"])
def test_a_file_that_holds_no_token_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "token"
    path.write_text(text)
    os.chmod(path, 0o600)
    with pytest.raises(CduiError) as info:
        fixed_session_token(path)
    assert str(info.value).startswith(f"CODEFYUI_SESSION_TOKEN_FILE={path} does not hold a token: one line of 16 "
                                      "to 256 letters"), info.value


def test_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CduiError) as info:
        fixed_session_token(tmp_path)
    assert str(info.value).startswith(f"CODEFYUI_SESSION_TOKEN_FILE={tmp_path} is not a file"), info.value
