"""The enrollment token of ``cdui agent start … --token T`` never stays in the command line.

Every local user can read ``/proc/PID/cmdline``; only the process's own user (and root) can read
``/proc/PID/environ``. The command the web page and ``cdui workers token`` print keeps ``--token
T`` (it is the documented one), so the process moves the token into ``CODEFYUI_AGENT_TOKEN`` and
executes itself again without it, before anything slow (an install, an import of torch, the
enrollment's retries) runs. The launcher ``bin/cdui`` does the same in bash before it starts
Python; this module covers ``python -m cdui`` and the wheel's ``cdui`` script. An SSH worker's
agent gets its token the same way, in the environment (cdui/plane/ssh/ssh.py).

``CODEFYUI_AGENT_TOKEN_FROM_ARGV=1`` tells the new process the token came from ``--token``, so it
behaves exactly as with the flag (it notes a token given beside a stored credential, and its own
children do not inherit it).
"""
from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from typing import Any

TOKEN_ENV = "CODEFYUI_AGENT_TOKEN"
MOVED_ENV = "CODEFYUI_AGENT_TOKEN_FROM_ARGV"


def split_token(args: list[str]) -> tuple[list[str], str | None]:
    """``args`` without ``--token T`` / ``--token=T``, and T (None when there is none).

    ``--token`` as the last word (no value) is left for argparse to refuse."""
    out: list[str] = []
    token: str | None = None
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out += args[i:]
            break
        if a == "--token" and i + 1 < len(args):
            token = args[i + 1]
            i += 2
            continue
        if a.startswith("--token="):
            token = a[len("--token="):]
            i += 1
            continue
        out.append(a)
        i += 1
    return out, token


def hide_token_from_argv() -> None:
    """Execute this process again with ``--token T`` moved to the environment (no return then)."""
    if sys.argv[1:2] != ["agent"]:
        return
    orig = list(getattr(sys, "orig_argv", []))
    tail = len(sys.argv) - 1
    if not orig or tail <= 0 or orig[-tail:] != sys.argv[1:]:
        return  # not a command line we can rebuild; argparse reads it as it is
    rest, token = split_token(sys.argv[1:])
    if token is None:
        return
    os.environ[TOKEN_ENV] = token
    os.environ[MOVED_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(sys.executable, orig[:-tail] + rest)
    except OSError as exc:
        # The interpreter cannot be run again by this user (seen: a process started by root with
        # setpriv, whose interpreter lies under a folder only root may enter). The command still
        # works with the token where it was; say that it stays visible and how to avoid that.
        del os.environ[TOKEN_ENV], os.environ[MOVED_ENV]
        print(f"cdui: warning: could not start this command again without --token in its command line "
              f"({sys.executable}: {exc.strerror}); the token stays visible to other users of this machine "
              f"while the agent enrolls. Give it in {TOKEN_ENV} instead", file=sys.stderr, flush=True)


def restore_token(args: Any, env: MutableMapping[str, str] | None = None) -> None:
    """After parsing: a token that came from ``--token`` is ``args.token`` again, and leaves the environment."""
    env = os.environ if env is None else env
    if env.pop(MOVED_ENV, None) is None:
        return
    token = env.pop(TOKEN_ENV, None)
    if hasattr(args, "token") and getattr(args, "token", None) is None and token is not None:
        args.token = token
