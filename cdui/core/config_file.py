"""Settings from a file, as systemd's ``EnvironmentFile=`` reads it, and secrets from files.

A lab install keeps its settings in ``/etc/cdui/cdui.env`` (or the file named by
``CODEFYUI_CONFIG``), the same file the systemd units name in ``EnvironmentFile=``,
so ``cdui config`` run in a shell sees what the service sees. :func:`apply` reads it
once when a command starts and puts every setting it holds into the environment,
unless the environment already has that name: the environment overrides the file.
Child processes (the daemons, runs) inherit the result, so they never read the file
again.

A secret setting (``Setting.secret``) may also be given as ``NAME_FILE=/path``: the
value is the file's content. Such a file must be readable by its owner alone and
belong to the user running cdui, so that a secret kept out of the world-readable
settings file is not world-readable after all; anything else is refused with the
file's mode and the ``chmod`` that fixes it.

Where each value came from is kept in :data:`SOURCES` for ``cdui config``.
"""
from __future__ import annotations

import difflib
import os
import stat
import sys
from collections.abc import MutableMapping
from pathlib import Path

from cdui.core.config import SETTINGS, SETTINGS_BY_NAME
from cdui.core.errors import CduiError

DEFAULT_PATH = Path("/etc/cdui/cdui.env")
MAX_FILE_BYTES = 256 * 1024  # a settings file is a few dozen lines; more is a wrong path
MAX_SECRET_BYTES = 64 * 1024
SECRET_SUFFIX = "_FILE"

# name -> where its value came from: "env", "env (NAME_FILE=path)", "file PATH", "file PATH (NAME_FILE=...)".
SOURCES: dict[str, str] = {}
# The settings file read by apply(), if any.
USED_FILE: list[Path] = []


def _bad(what: str, hint: str) -> CduiError:
    return CduiError("bad_setting", what, hint=hint)


def parse(text: str, path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd's ``EnvironmentFile=`` reads them: blank lines and lines starting
    with ``#`` or ``;`` are skipped, a value in matching single or double quotes loses them, a trailing
    backslash continues the line. A line without ``=`` is refused (systemd skips it silently, which hides
    a typo)."""
    out: dict[str, str] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        no = i + 1
        line = lines[i]
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + lines[i]
        i += 1
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        key, eq, value = s.partition("=")
        key = key.strip()
        if not eq or not key or not (key.replace("_", "").isalnum() and not key[0].isdigit()):
            raise _bad(f"{path} line {no} is not a setting: {s[:80]!r}",
                       "write NAME=VALUE, or start the line with # to keep it as a comment")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


def read_file(path: Path) -> dict[str, str]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _bad(f"cannot read the settings file {path}: {exc.strerror or exc}",
                   "fix CODEFYUI_CONFIG, or make the file readable by this user") from None
    if len(data) > MAX_FILE_BYTES:
        raise _bad(f"the settings file {path} is larger than {MAX_FILE_BYTES} bytes",
                   "point CODEFYUI_CONFIG at a file of NAME=VALUE lines")
    try:
        return parse(data.decode("utf-8"), path)
    except UnicodeDecodeError:
        raise _bad(f"the settings file {path} is not UTF-8 text", "write it as NAME=VALUE lines") from None


def read_secret(name: str, path_text: str) -> str:
    """The content of a secret file named by ``NAME_FILE`` (one trailing newline dropped)."""
    path = Path(path_text).expanduser()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise _bad(f"{name}{SECRET_SUFFIX}={path_text!r}: cannot read it: {exc.strerror or exc}",
                   f"name a regular file readable by this user (not a symlink), or unset {name}{SECRET_SUFFIX}") \
            from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _bad(f"{name}{SECRET_SUFFIX}={path_text!r} is not a regular file",
                       "name the file that holds the secret")
        if st.st_mode & 0o077:
            raise _bad(f"{name}{SECRET_SUFFIX}={path_text!r} may be read by other users "
                       f"(mode {stat.S_IMODE(st.st_mode):04o})",
                       f"`chmod 600 {path}` so that only its owner reads the secret")
        if st.st_uid != os.getuid():
            raise _bad(f"{name}{SECRET_SUFFIX}={path_text!r} belongs to uid {st.st_uid}, not to this user "
                       f"(uid {os.getuid()})", "`chown` it to the user that runs cdui, mode 600")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise _bad(f"{name}{SECRET_SUFFIX}={path_text!r} is larger than {MAX_SECRET_BYTES} bytes",
                   "the file must hold the secret alone")
    text = data.decode("utf-8", "replace")
    return text[:-1] if text.endswith("\n") else text


def settings_path(env: MutableMapping[str, str]) -> Path | None:
    """``CODEFYUI_CONFIG`` (which must exist), else ``/etc/cdui/cdui.env`` when it exists, else None."""
    named = env.get("CODEFYUI_CONFIG", "").strip()
    if named:
        p = Path(named).expanduser()
        if not p.is_file():
            raise _bad(f"CODEFYUI_CONFIG={named!r} is not a file", "create it, or unset CODEFYUI_CONFIG")
        return p.absolute()
    return DEFAULT_PATH if DEFAULT_PATH.is_file() else None


def _secret_names() -> list[str]:
    return [s.name for s in SETTINGS if s.secret]


def apply(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Fill ``env`` (default ``os.environ``) from the settings file and the ``NAME_FILE`` secrets.

    A name already in ``env`` keeps its value. Returns :data:`SOURCES`."""
    env = os.environ if env is None else env
    SOURCES.clear()
    USED_FILE.clear()
    for s in SETTINGS:
        if env.get(s.name) is not None:
            SOURCES[s.name] = "env"
    for name in _secret_names():  # env NAME_FILE, before any file
        ref = env.get(name + SECRET_SUFFIX)
        if name not in SOURCES and ref:
            env[name] = read_secret(name, ref)
            SOURCES[name] = f"env ({name}{SECRET_SUFFIX}={ref})"
    path = settings_path(env)
    if path is None:
        return SOURCES
    USED_FILE.append(path)
    values = read_file(path)
    for key, value in values.items():
        if key.startswith("CODEFYUI_") and key not in SETTINGS_BY_NAME and not (
                key.endswith(SECRET_SUFFIX) and key[: -len(SECRET_SUFFIX)] in _secret_names()):
            close = difflib.get_close_matches(key, list(SETTINGS_BY_NAME), 1, 0.8)
            print(f"cdui: warning: {path}: {key} is not a setting of this cdui and is ignored"
                  f"{f'; did you mean {close[0]}?' if close else ''} (see docs/configuration.md)", file=sys.stderr)
            continue
        if key.endswith(SECRET_SUFFIX) and key[: -len(SECRET_SUFFIX)] in _secret_names():
            continue  # below, once plain values are in
        if key in env:
            continue  # the environment overrides the file
        env[key] = value
        if key in SETTINGS_BY_NAME:
            SOURCES[key] = f"file {path}"
    for name in _secret_names():
        ref = values.get(name + SECRET_SUFFIX)
        if ref and name not in env:
            env[name] = read_secret(name, ref)
            SOURCES[name] = f"file {path} ({name}{SECRET_SUFFIX}={ref})"
    return SOURCES


def source_of(name: str) -> str:
    return SOURCES.get(name, "default")
