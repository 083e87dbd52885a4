"""The docs say what the code does: the README's feature list and the stop waits.

A user reads "planned" and looks elsewhere for a feature cdui has; an admin
sizes a systemd unit from a number in the docs. Both must follow the code, so
these read the pages and compare them with the CLI's parser and constants.
"""
from __future__ import annotations

import re
from pathlib import Path

import cdui.core.config
from cdui.agent.agent import stop_wait_s
from cdui.cli.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def section(text: str, start: str, end: str) -> str:
    """From ``start`` to the next ``end`` (or the end of the text)."""
    i = text.index(start)
    j = text.find(end, i + len(start))
    return text[i:] if j == -1 else text[i:j]


def cdui_commands(text: str) -> list[list[str]]:
    """The words after `cdui` of each `cdui ...` code span (flags dropped)."""
    return [[w for w in span.split()[1:] if not w.startswith("-")]
            for span in re.findall(r"`(cdui [^`]+)`", text)]


def is_command(words: list[str]) -> bool:
    """Whether the CLI has the command ``cdui WORDS`` (its subcommand path, not its arguments)."""
    parser = build_parser()
    for word in words:
        subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not subs:
            return True  # the rest are arguments of a command that exists
        choices = subs[0].choices  # type: ignore[attr-defined]
        if word not in choices:
            return False
        parser = choices[word]
    return True


def test_readme_lists_shipped_commands_as_working_and_absent_ones_as_not_yet() -> None:
    """Each feature in the README's "Works now" list names a command the CLI has; each in
    "Not in cdui yet" names one it does not have, so shipping it fails this test until the
    README moves it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    works = section(readme, "Works now", "Not in cdui yet")
    later = section(readme, "Not in cdui yet", "\n## ")
    shipped, planned = cdui_commands(works), cdui_commands(later)
    # The list of what is not in cdui yet may name no command at all (what is left of a shipped command is
    # said in words there); a command it names must not exist.
    assert len(shipped) >= 6, (shipped, planned)
    assert [c for c in shipped if not is_command(c)] == []
    assert [c for c in planned if is_command(c)] == []
    # Sweeps and studies (a search choosing a sweep's next variants) shipped: `cdui study` exists, and the
    # README lists studies as working, not as later.
    assert is_command(["study"]) and is_command(["sweep"])
    assert "Studies:" in works and "(`cdui study`)" in works and "studies" not in later.lower(), later
    assert "planned" not in readme.lower().replace("not in cdui yet (later issues)", "")
    assert "Not yet available" not in (ROOT / "docs" / "remote-workers.md").read_text(encoding="utf-8")


def test_documented_agent_stop_wait_is_the_code_s() -> None:
    """`cdui agent stop` waits stop_wait_s(default write timeout); the pages say that number."""
    timeout = float(cdui.core.config.load({})["CODEFYUI_WORKER_OUTPUTS_WRITE_TIMEOUT_S"])
    wait = f"{stop_wait_s(timeout):.0f} s"
    cli = section((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"), "### cdui agent stop", "\n### ")
    assert f"waits up to\n{wait}" in cli or f"waits up to {wait}" in cli, cli
    workers = (ROOT / "docs" / "remote-workers.md").read_text(encoding="utf-8")
    assert f"did not stop within {wait}" in workers
    assert f"agent's own stop wait ({wait}" in workers
    for text in (cli, workers):
        assert not re.search(r"agent did not stop within (60|70) s", text)
