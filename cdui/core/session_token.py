"""A session token fixed across restarts (``CODEFYUI_SESSION_TOKEN_FILE``), for labs that bookmark the page.

Without the setting the server draws a new token at every start. With it, the token is the file's
content; a file that does not exist yet is created (mode 0600) holding a new token, which later starts
reuse. Whoever reads the file owns the server, so a file another user may read, or that belongs to
another user, is refused at start with what to do, as is a content that cannot be a token.
"""
from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

from cdui.core.errors import CduiError
from cdui.core.private import FILE_MODE

SETTING = "CODEFYUI_SESSION_TOKEN_FILE"
TOKEN_RE = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")


def fixed_session_token(path: Path) -> str:
    """The token in ``path``; a new one written there (0600) when the file does not exist."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return _read(path)
    except OSError as exc:
        raise CduiError("bad_setting", f"{SETTING}={path}: cannot create it: {exc.strerror or exc}",
                        hint="name a file in a folder this user may write, or unset it for a new token each start"
                        ) from None
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), FILE_MODE)
        fh.write(token + "\n")
    return token


def _read(path: Path) -> str:
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise CduiError("bad_setting", f"{SETTING}={path} is not a file",
                            hint="name a file holding the token, or one that does not exist yet (it is created)")
        if st.st_uid != os.getuid():
            raise CduiError("bad_setting", f"{SETTING}={path} belongs to uid {st.st_uid}, not to this user "
                            f"(uid {os.getuid()}): whoever owns it can read the token",
                            hint="use a file of this user's, mode 0600")
        if st.st_mode & 0o077:
            raise CduiError("bad_setting", f"{SETTING}={path} may be read by other users (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}): whoever reads the token owns this server",
                            hint=f"make it the owner's alone with `chmod 600 {path}` and start again")
        text = path.read_text(encoding="utf-8", errors="replace").strip()
    except CduiError:
        raise
    except OSError as exc:
        raise CduiError("bad_setting", f"{SETTING}={path}: cannot read it: {exc.strerror or exc}",
                        hint="fix its permissions, or unset it for a new token each start") from None
    if not TOKEN_RE.fullmatch(text):
        raise CduiError("bad_setting", f"{SETTING}={path} does not hold a token: one line of 16 to 256 letters, "
                        "digits and . _ ~ + / = - is expected",
                        hint=f"delete it (a new token is written there at the next start) or write one, e.g. "
                             f"`python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > {path}`")
    return text
