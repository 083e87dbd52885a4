"""The agent's exit codes and what a failed enrollment does: the code's one table
(cdui/core/exit_codes.py, ``cli_workers.enroll_failure``) against the docs' tables,
which once said "exit 4" for answers the agent retried, and "4" for a name
already enrolled, which exits 2."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from cdui.cli.cli_workers import REFUSED_ENROLL_CODES, enroll_failure
from cdui.core import exit_codes
from cdui.core.errors import CduiError

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def section(page: str, heading: str) -> str:
    """The text of ``page`` from the line ``heading`` up to the next heading of any level."""
    text = (DOCS / page).read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    nxt = re.search(r"^#{1,6} ", text[start:], re.M)
    return text[start:start + nxt.start()] if nxt else text[start:]


def table_rows(text: str, first_header: str) -> list[list[str]]:
    """The body rows of the first markdown table in ``text`` whose first header cell is ``first_header``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_header:
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append([c.strip() for c in body.strip().strip("|").split("|")])
            return rows
    raise AssertionError(f"no table headed {first_header!r}")


@pytest.mark.parametrize("page, heading, within, codes", [
    ("remote-workers.md", "## Agent exit codes", None, exit_codes.LONG_RUNNING),
    ("one-shot-and-slurm.md", "## Exit codes", None, exit_codes.ONE_SHOT),
    # cli.md's `cdui agent start` covers both kinds of agent.
    ("cli.md", "### cdui agent start", "Exit codes:", exit_codes.ONE_SHOT),
])
def test_the_docs_exit_code_tables_list_the_codes_the_agent_uses(page: str, heading: str, within: str | None,
                                                                   codes: tuple[int, ...]) -> None:
    text = section(page, heading)
    if within is not None:
        text = text[text.index(within):]
    listed = [int(row[0]) for row in table_rows(text, "Code")]
    assert listed == sorted(codes), f"{page} {heading}: {listed}, the code uses {sorted(codes)}"


def enrollment_table() -> list[tuple[list[CduiError], int | None, int | None]]:
    """docs/remote-workers.md's table of enrollment answers: (errors named in a row, the exit code
    over TCP, through an SSH tunnel; None: retried). A code takes the HTTP status written before it
    in its cell; a status followed by no code is a proxy's page with that status."""
    rows = []
    for answer, outcome in table_rows(section("remote-workers.md", "## Agent exit codes"),
                                      "The answer to `POST /api/workers/enroll`"):
        errors, status, named = [], 400, True
        for num, code in re.findall(r"`(\d{3})`|`([a-z_]+)`", answer):
            if num:
                if not named:
                    errors.append(CduiError("http_error", "a page", status=status))
                status, named = int(num), False
            else:
                errors.append(CduiError(code, "refused", status=status))
                named = True
        if not named:
            errors.append(CduiError("http_error", "a page", status=status))
        m = re.fullmatch(r"(retried|exit (\d))(?:; exit (\d) through an SSH tunnel)?", outcome)
        assert m, f"unreadable outcome {outcome!r}"
        tcp = None if m.group(1) == "retried" else int(m.group(2))
        rows.append((errors, tcp, int(m.group(3)) if m.group(3) else tcp))
    return rows


def test_the_docs_enrollment_table_is_what_the_agent_does() -> None:
    seen = set()
    for errors, tcp, tunnel in enrollment_table():
        for err in errors:
            seen.add(err.code)
            assert (enroll_failure(err), enroll_failure(err, uds="/tmp/s")) == (tcp, tunnel), (err.code, err.status)
    # Every refusal enrollment itself can answer is in the table, and every code the decision names.
    raised = set(re.findall(r'CduiError\("(\w+)"', (ROOT / "cdui" / "plane" / "enroll.py").read_text()))
    named = {"unreachable", "http_error", "rate_limited", "version_mismatch", "untrusted_certificate"}
    assert raised | named | REFUSED_ENROLL_CODES <= seen, sorted(raised | named | REFUSED_ENROLL_CODES - seen)


@pytest.mark.parametrize("err, uds, want", [
    (CduiError("unreachable", "cannot reach"), None, None),
    (CduiError("unreachable", "cannot reach"), "/s", None),
    (CduiError("http_error", "HTTP 503 from /api/workers/enroll", status=503), None, None),
    (CduiError("http_error", "HTTP 404 from /api/workers/enroll", status=404), None, None),  # a proxy's page
    (CduiError("http_error", "HTTP 500 from /api/workers/enroll", status=500), None, None),
    (CduiError("http_error", "HTTP 404 from /api/workers/enroll", status=404), "/s", exit_codes.START),
    (CduiError("rate_limited", "too many", status=429), None, None),
    (CduiError("token_unknown", "not known", status=401), None, None),  # another server behind the name
    (CduiError("token_unknown", "not known", status=401), "/s", exit_codes.START),
    (CduiError("token_expired", "expired", status=401), None, exit_codes.START),
    (CduiError("token_used_up", "used up", status=401), None, exit_codes.START),
    (CduiError("token_revoked", "revoked", status=401), None, exit_codes.START),
    (CduiError("bad_token", "malformed", status=401), None, exit_codes.START),
    (CduiError("version_mismatch", "version mismatch", status=400), None, exit_codes.REFUSED),
    (CduiError("name_taken", "taken", status=409), None, exit_codes.REFUSED),
    (CduiError("pin_mismatch", "not the pinned key"), None, exit_codes.REFUSED),
])
def test_which_enrollment_failures_end_the_start(err: CduiError, uds: str | None, want: int | None) -> None:
    assert enroll_failure(err, uds) == want


@pytest.mark.parametrize("err, want", [
    (CduiError("unreachable", "cannot reach"), None),
    (CduiError("http_error", "HTTP 503 from /api/workers/enroll", status=503), None),
    (CduiError("rate_limited", "too many", status=429), None),
    (CduiError("http_error", "HTTP 404 from /api/workers/enroll", status=404), exit_codes.START),
    (CduiError("token_unknown", "not known", status=401), exit_codes.START),
    (CduiError("version_mismatch", "version mismatch", status=400), exit_codes.REFUSED),
])
def test_a_one_shot_agent_ends_at_an_address_that_may_never_heal(err: CduiError, want: int | None) -> None:
    """A batch job holding an allocation: "not now" is retried, but an unknown token or a foreign page
    ends it with "could not start" instead of waiting on an address that may never change."""
    assert enroll_failure(err, one_shot=True) == want

