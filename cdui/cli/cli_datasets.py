"""``cdui datasets``: put the image datasets the Dataset node reads into this
machine's data folder, from archives downloaded elsewhere (cdui never
downloads). See cdui.nodes.offline_datasets for the layouts and the checksums."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cdui.cli.cli_util import _die
from cdui.core.config import load
from cdui.nodes.offline_datasets import NAMES, import_archive, missing_files, spec


def cmd_import(args: argparse.Namespace) -> int:
    root = load().layout.data_dir
    name = args.name
    for raw in args.archives:
        path = Path(raw)
        try:
            written = import_archive(name, path, root)
        except ValueError as exc:
            return _die(f"{path}: {exc}", 1)
        for p in written:
            print(f"{name}: {p}")
    s = spec(name)
    for split in s.splits:
        left = missing_files(root, name, split)
        state = "ready" if not left else f"still missing {', '.join(p.name for p in left)}"
        print(f"{name} {split}: {state}")
    return 0


def add_commands(sub: Any) -> None:
    d = sub.add_parser("datasets", help="put image datasets (MNIST, FashionMNIST, CIFAR10) into the data folder")
    dsub = d.add_subparsers(dest="datasets_command", metavar="COMMAND", parser_class=type(d))
    s = dsub.add_parser("import", help="check downloaded archives against their published MD5 and unpack them")
    s.add_argument("name", choices=NAMES, metavar="NAME", help=f"one of {', '.join(NAMES)}")
    s.add_argument("archives", nargs="+", metavar="ARCHIVE",
                   help="the files as published (e.g. train-images-idx3-ubyte.gz, cifar-10-python.tar.gz)")
    s.set_defaults(func=cmd_import)
    d.set_defaults(func=lambda _args: d.print_help() or 2)
