"""Enrollment tokens and worker credentials: pure policy plus store calls.

- An enrollment token looks like ``abcdef.0123456789abcdef``: a public id and a
  secret. Only ``sha256(secret)`` is stored; the token is shown once.
- It has a lifetime (default 24 h) and a number of uses (default 1). A token
  bound to a worker (a *reissue*) enrolls only that worker and supersedes its
  credential.
- Refusals say which case applies: unknown, revoked, expired, used up.
- A worker credential is a long random secret; only its hash is stored.
  Superseded and revoked credential hashes are kept so that an agent holding
  one is told so (docs/remote-workers.md#managing-workers) instead of "unknown".
- Failed attempts are rate limited per token and source address (and, ten
  times looser, per address alone); successes are not counted, so agents
  sharing an address do not lock each other out, and one agent retrying a
  wrong token does not lock out the good tokens of others behind its address.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
import sqlite3
import string
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from cdui.core.errors import CduiError

ALPHABET = string.ascii_lowercase + string.digits
TOKEN_RE = re.compile(r"^([a-z0-9]{6})\.([a-z0-9]{16})$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> tuple[str, str, str]:
    """Returns (token, id, secret hash)."""
    tid = "".join(secrets.choice(ALPHABET) for _ in range(6))
    sec = "".join(secrets.choice(ALPHABET) for _ in range(16))
    return f"{tid}.{sec}", tid, hash_secret(sec)


def new_credential() -> tuple[str, str]:
    cred = "cdw_" + secrets.token_urlsafe(32)
    return cred, hash_secret(cred)


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise CduiError("bad_name", f"worker name {name!r} is not valid",
                        hint="use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name


def parse_token(token: Any) -> tuple[str, str]:
    m = TOKEN_RE.match(token.strip()) if isinstance(token, str) else None
    if not m:
        raise CduiError("bad_token", "the enrollment token is malformed (expected xxxxxx.yyyyyyyyyyyyyyyy)",
                        hint="copy the whole token printed by `cdui workers token`", status=401)
    return m.group(1), m.group(2)


MAX_TTL_S = 365 * 86400.0
MAX_USES = 10000


def check_token_request(ttl: Any, uses: Any) -> tuple[float, int]:
    """The lifetime and number of uses of a new token, or a 400 naming the bad value.

    Checked before anything is stored: an out-of-range lifetime once made a
    token row whose expiry could not even be shown."""
    if (not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or not math.isfinite(ttl)
            or ttl <= 0 or ttl > MAX_TTL_S):
        raise CduiError("bad_request", f"ttl_s={ttl!r} is not a lifetime this server issues",
                        hint=f"give a number of seconds above 0 and at most {MAX_TTL_S:.0f} (365 days), "
                             f"e.g. 3600; `cdui workers token --ttl 1h`")
    if not isinstance(uses, int) or isinstance(uses, bool) or uses < 1 or uses > MAX_USES:
        raise CduiError("bad_request", f"uses={uses!r} is not a number of uses this server issues",
                        hint=f"give a whole number from 1 to {MAX_USES}")
    return float(ttl), uses


def issue_token(c: sqlite3.Connection, ttl_s: float, uses: int, worker: str | None, now: float) -> dict[str, Any]:
    token, tid, h = new_token()
    c.execute("INSERT INTO enroll_tokens (id, secret_hash, uses_left, uses_total, expires_at, worker, created_at)"
              " VALUES (?,?,?,?,?,?,?)", (tid, h, uses, uses, now + ttl_s, worker, now))
    return {"token": token, "id": tid, "expires_at": now + ttl_s, "uses": uses, "worker": worker}


def consume_token(c: sqlite3.Connection, token: str, name: str | None, now: float) -> tuple[str, str | None]:
    """Check a token and use it once. Returns (worker name, reissue worker or None).

    Raises CduiError naming the exact reason (unknown / revoked / expired / used up / name taken).
    """
    tid, sec = parse_token(token)
    r = c.execute("SELECT * FROM enroll_tokens WHERE id=?", (tid,)).fetchone()
    if r is None or not secrets.compare_digest(r["secret_hash"], hash_secret(sec)):
        raise CduiError("token_unknown", f"enrollment token {tid}.… is not known to this control plane",
                        hint="check the --control URL points at the server that issued it, or make a new token "
                             "with `cdui workers token`", status=401)
    if r["revoked"]:
        raise CduiError("token_revoked", f"enrollment token {tid}.… was revoked",
                        hint="make a new token with `cdui workers token`", status=401)
    if r["expires_at"] <= now:
        raise CduiError("token_expired", f"enrollment token {tid}.… expired",
                        hint="make a new token with `cdui workers token` (--ttl sets its lifetime)", status=401)
    if r["uses_left"] <= 0:
        raise CduiError("token_used_up",
                        f"enrollment token {tid}.… is used up ({r['uses_total']} of {r['uses_total']} uses)",
                        hint="make a new token with `cdui workers token` (--uses sets how many agents may use it)",
                        status=401)
    bound = r["worker"]
    if bound:
        if name and name != bound:
            raise CduiError("token_bound", f"this token can only enroll worker {bound!r}, not {name!r}",
                            hint=f"start the agent with --name {bound}", status=403)
        name = bound
    else:
        name = check_name(name)
        if c.execute("SELECT 1 FROM workers WHERE name=?", (name,)).fetchone():
            raise CduiError("name_taken", f"worker name {name!r} is already enrolled",
                            hint=f"choose another --name, or reissue it: `cdui workers reissue {name}`", status=409)
    c.execute("UPDATE enroll_tokens SET uses_left=uses_left-1 WHERE id=?", (tid,))
    return name, bound


def enroll(c: sqlite3.Connection, token: str, name: str | None, devices: list[str], machine_id: str,
           now: float) -> dict[str, Any]:
    worker, reissue = consume_token(c, token, name, now)
    cred, h = new_credential()
    old = c.execute("SELECT credential_hash FROM workers WHERE name=?", (worker,)).fetchone()
    if old is not None:
        if old[0]:
            c.execute("INSERT OR REPLACE INTO old_credentials (credential_hash, worker, reason, at) VALUES (?,?,?,?)",
                      (old[0], worker, "superseded", now))
        c.execute("UPDATE workers SET credential_hash=?, devices=?, machine_id=? WHERE name=?",
                  (h, _json(devices), machine_id, worker))
    else:
        c.execute("INSERT INTO workers (name, credential_hash, devices, machine_id, created_at) VALUES (?,?,?,?,?)",
                  (worker, h, _json(devices), machine_id, now))
    # A reissue token's job is done once its worker enrolled: it cannot be reused for another copy.
    if reissue:
        c.execute("UPDATE enroll_tokens SET uses_left=0 WHERE worker=? AND uses_left>0", (worker,))
    return {"worker": worker, "credential": cred}


def _json(v: Any) -> str:
    return json.dumps(v)


class RateLimiter:
    """At most ``limit`` failed attempts per ``window`` seconds per key. Time is a parameter.

    Only failures are recorded (:meth:`failure`): many legitimate agents behind
    one address (a NAT, a SLURM array enrolling at once) never lock each other
    out, while guessing tokens from one address is still slowed down. The
    table is bounded: keys whose failures all left the window are pruned, and
    past ``max_keys`` the least recently failing key is dropped, so a flood of
    addresses cannot grow it without end.
    """

    def __init__(self, limit: int, window: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 4096) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self.max_keys = max_keys
        self.hits: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, key: str, now: float) -> deque[float] | None:
        q = self.hits.get(key)
        if q is None:
            return None
        while q and q[0] <= now - self.window:
            q.popleft()
        if not q:
            del self.hits[key]
            return None
        return q

    def blocked(self, key: str) -> float | None:
        """None if ``key`` may try now, else the seconds until it may."""
        now = self.clock()
        q = self._recent(key, now)
        if q is not None and len(q) >= self.limit:
            return q[0] + self.window - now
        return None

    def failure(self, key: str) -> None:
        """Record a failed attempt of ``key``."""
        now = self.clock()
        q = self._recent(key, now)
        if q is None:
            q = self.hits[key] = deque()
        q.append(now)
        while len(q) > self.limit:
            q.popleft()  # more than ``limit`` entries never changes the answer
        self.hits.move_to_end(key)
        if len(self.hits) > self.max_keys:
            for k in list(self.hits)[: len(self.hits) // 4]:
                self._recent(k, now)  # drops the key once its failures are old
            while len(self.hits) > self.max_keys:
                self.hits.popitem(last=False)


# An address is cut off only after this many times the per-token limit of failures in all: no
# single retrying agent reaches it (its backoff tops out at one attempt a minute), while one
# address trying token after token is still slowed down.
ADDRESS_FACTOR = 10


def token_key(token: Any) -> str:
    """Which bucket an attempt's failures count in: the token's public id (so guesses at one
    token's secret share it), or one bucket for anything that is not a token at all."""
    m = TOKEN_RE.match(token.strip()) if isinstance(token, str) else None
    return m.group(1) if m else "-"


class EnrollLimiter:
    """Failed enrollments, counted per (source address, token) and, with ``ADDRESS_FACTOR`` times
    the limit, per source address.

    Counting per address alone let one agent retrying an unknown token (which it now does: the
    address may lead to another server for a while) lock every other agent behind its address out,
    a valid token included. A token's own failures now block only that token there."""

    def __init__(self, limit: int, window: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 4096) -> None:
        self.per_token = RateLimiter(limit, window, clock, max_keys)
        self.per_address = RateLimiter(limit * ADDRESS_FACTOR, window, clock, max_keys)

    def blocked(self, address: str, token: Any) -> float | None:
        """None if this token may be tried from ``address`` now, else the seconds until it may."""
        waits = [w for w in (self.per_token.blocked(f"{address} {token_key(token)}"),
                             self.per_address.blocked(address)) if w is not None]
        return max(waits) if waits else None

    def failure(self, address: str, token: Any) -> None:
        self.per_token.failure(f"{address} {token_key(token)}")
        self.per_address.failure(address)
