"""The command line explains itself: every argument of every command has help text, and a mistyped
command, subcommand, choice or flag is answered with the closest one ("did you mean"). In process: the
real parser, no server."""
from __future__ import annotations

import argparse

import pytest

from cdui.cli import cli


def _walk(parser: argparse.ArgumentParser, path: list[str]) -> list[tuple[str, argparse.Action]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _walk(sub, [*path, name])
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            out.append((" ".join(path), action))
    return out


def test_every_argument_of_every_command_has_help() -> None:
    actions = _walk(cli.build_parser(), ["cdui"])
    assert len(actions) > 100  # the walk reached the subcommands of subcommands
    missing = [f"{where} {a.option_strings or a.dest}" for where, a in actions
               if not a.help or (a.help == argparse.SUPPRESS and a.dest != "foreground_child")]
    assert missing == []


def test_every_command_has_help() -> None:
    def commands(parser: argparse.ArgumentParser, path: str) -> list[str]:
        out = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {c.dest for c in action._choices_actions if c.help}
                for name, sub in action.choices.items():
                    out += ([] if name in helped else [f"{path} {name}"]) + commands(sub, f"{path} {name}")
        return out
    assert commands(cli.build_parser(), "cdui") == []


@pytest.mark.parametrize(("argv", "line"), [
    (["strat"], "cdui: error: argument COMMAND: invalid choice: 'strat' (choose from 'start', 'stop', 'status', "
                "'token', 'run', 'api', 'install', 'test', 'wheelhouse', 'workers', 'agent', 'runs', 'sweep', 'study', "
                "'datasets', 'config', 'backup', 'restore', 'logs', 'release', 'update', 'plugin', 'project', "
                "'apps', 'keys'); did you mean start? (see `cdui --help`)"),
    (["runs", "lsit"], "cdui: error: argument SUBCOMMAND: invalid choice: 'lsit' (choose from 'list', 'show', 'logs', "
                       "'stop', 'delete', 'download', 'clone', 'outputs', 'tag', 'note'); did you mean list? (see "
                       "`cdui runs --help`)"),
    (["run", "g.json", "--wiat"], "cdui: error: unrecognized arguments: --wiat; did you mean --wait? (see "
                                  "`cdui run --help`)"),
    (["runs", "list", "--staus", "queued", "--limt=3"],
     "cdui: error: unrecognized arguments: --staus queued --limt=3; --staus: did you mean --status?; --limt=3: did "
     "you mean --limit? (see `cdui runs list --help`)"),
    (["workers", "share-by-memory", "w1", "onn"],
     "cdui: error: argument state: invalid choice: 'onn' (choose from 'on', 'off'); did you mean on? (see "
     "`cdui workers share-by-memory --help`)"),
    (["--badflag"], "cdui: error: unrecognized arguments: --badflag (see `cdui --help`)"),
    (["frobnicate"], "cdui: error: argument COMMAND: invalid choice: 'frobnicate' (choose from 'start', 'stop', "
                     "'status', 'token', 'run', 'api', 'install', 'test', 'wheelhouse', 'workers', 'agent', 'runs', "
                     "'sweep', 'study', 'datasets', 'config', 'backup', 'restore', 'logs', 'release', 'update', "
                     "'plugin', 'project', 'apps', 'keys') (see `cdui --help`)"),
])
def test_a_mistyped_command_or_flag_gets_a_did_you_mean(argv: list[str], line: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", line + "\n")
