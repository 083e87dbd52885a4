"""The documentation keeps up with the code (no server needed).

- every setting of ``cdui.core.config.SETTINGS`` is in docs/configuration.md;
- every command, action and flag of ``cdui.cli.cli.build_parser()`` is in docs/cli.md;
- every route the server registers is in docs/api.md, as ``METHOD PATH``;
- every ``cdui ...`` command line in the docs' shell examples parses;
- relative links in README.md and docs/*.md point at files that exist.
"""
from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

import cdui.core.clock
import cdui.core.config
import cdui.plane.server
from cdui.cli.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# Pages owned by the docs; install.md is checked for links too when present.
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md"] + sorted(DOCS.glob("*.md"))
# Commands the launcher (bin/cdui) handles before Python starts.
LAUNCHER_COMMANDS = {"install", "test", "wheelhouse"}


def read(path: Path) -> str:
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    return path.read_text(encoding="utf-8")


def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (command path, parser) of the CLI, the top level included."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, prefix + (name,))


def visible_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [opt for a in parser._actions if a.help != argparse.SUPPRESS and a.option_strings
            for opt in a.option_strings if opt.startswith("--") and opt != "--help"]


def test_every_setting_is_documented() -> None:
    """configuration.md names every CODEFYUI_* setting of the SETTINGS table."""
    text = read(DOCS / "configuration.md")
    missing = [s.name for s in cdui.core.config.SETTINGS if f"`{s.name}`" not in text]
    assert missing == [], f"docs/configuration.md does not document {missing}"


def test_every_command_and_flag_is_documented() -> None:
    """cli.md has a line for every command and action (`cdui workers drain`) and
    names every flag of each."""
    text = read(DOCS / "cli.md")
    missing = []
    for path, parser in walk(build_parser()):
        if path and f"cdui {' '.join(path)}" not in text:
            missing.append("cdui " + " ".join(path))
        for flag in visible_flags(parser):
            if flag not in text:
                missing.append(f"{' '.join(('cdui',) + path)} {flag}")
    assert missing == [], f"docs/cli.md does not document {missing}"


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("docs-app")
    cfg = cdui.core.config.load({"CODEFYUI_USER_DATA_DIR": str(tmp), "CODEFYUI_DATA_DIR": str(tmp / "data")})
    # build_app only wires (nothing is opened until startup), so there is nothing to close.
    app = cdui.plane.server.build_app(cfg, cdui.core.clock.SystemClock())
    out = []
    for r in app.router.routes():
        if r.method == "HEAD" or r.resource is None:
            continue
        path = r.resource.canonical
        if isinstance(r.resource, cdui.plane.server.web.StaticResource):
            path = path.rstrip("/") + "/{file}"
        out.append((r.method, path))
    assert len(out) > 20, f"suspiciously few routes: {out}"
    return out


def test_every_route_is_documented(routes: list[tuple[str, str]]) -> None:
    """api.md names every route the server registers as `METHOD PATH`."""
    text = read(DOCS / "api.md")
    missing = [f"{m} {p}" for m, p in routes
               if not re.search(rf"`{m} {re.escape(p)}(?![\w{{}}/.-])", text)]
    assert missing == [], f"docs/api.md does not document {missing}"


SEPARATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "(", ")"}


def shell_commands(text: str) -> Iterator[list[str]]:
    """The argument lists of `cdui ...` commands in ```sh blocks (launcher paths,
    environment assignments and sudo dropped; a command ends at ; | && or >)."""
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if not line or line.startswith("#"):
                continue
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            command: list[str] = []
            for word in list(lex) + [";"]:
                if word not in SEPARATORS:
                    command.append(word)
                    continue
                for i, w in enumerate(command):
                    if w == "cdui" or w.endswith("/cdui"):
                        yield command[i + 1:]
                        break
                command = []


def test_documented_commands_parse() -> None:
    """Every `cdui ...` line of the docs' shell examples is accepted by the CLI's parser."""
    parser = build_parser()
    seen = 0
    bad = []
    for page in PAGES:
        for args in shell_commands(read(page)):
            if args and args[0] in LAUNCHER_COMMANDS:
                continue
            seen += 1
            try:
                parser.parse_args(args)
            except SystemExit as exc:
                if exc.code:
                    bad.append(f"{page.name}: cdui {' '.join(args)}")
    assert seen > 20, f"only {seen} command lines found; did the code blocks lose their sh tag?"
    assert bad == [], f"these documented commands do not parse: {bad}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    """Relative links (README.md's included) point at files that exist, and
    #anchors into our pages point at a heading."""
    broken = []
    for target in LINK.findall(read(page)):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(target)
            continue
        if anchor and dest.suffix == ".md":
            if anchor not in {slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), re.M)}:
                broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)} has broken links: {broken}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def test_readme_links_every_docs_page() -> None:
    """README.md links every page under docs/."""
    text = read(ROOT / "README.md")
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if f"(docs/{p.name})" not in text]
    assert missing == [], f"README.md does not link {missing}"
