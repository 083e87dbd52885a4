"""Code and tests say why, not which clause of a spec.

The product spec the code was built from is not part of this repository, so a comment or docstring that
cites a spec id (the spec numbers its requirements as a short prefix, a dash and two digits) points
nowhere for a reader of the code. Each place gives the reason in words instead, or links one of our own
pages under docs/.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# A capital prefix of 2 to 5 letters, a dash, exactly two digits: the spec's ids. Longer numbers
# (SHA-256, ISO-8601) and one digit (UTF-8) are not ids.
SPEC_ID = re.compile(r"\b[A-Z]{2,5}-\d\d\b")


def spec_ids(text: str) -> list[str]:
    return SPEC_ID.findall(text)


def test_the_pattern_finds_spec_ids_and_nothing_else() -> None:
    assert spec_ids("resume after a cut (DISC-05); hosts (CONN-04..06); ENR-29/30") == \
        ["DISC-05", "CONN-04", "ENR-29"]
    assert spec_ids("sha256 (SHA-256), UTF-8, ISO-8601, cuda:0, w1/cuda:0=2, e-05, py-311") == []


def test_code_and_tests_cite_no_spec_ids() -> None:
    hits = []
    for top in ("cdui", "tests"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path == Path(__file__).resolve():
                continue  # this file's own examples above are the pattern's test
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # a binary fixture
            for no, line in enumerate(text.splitlines(), 1):
                if spec_ids(line):
                    hits.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert hits == [], "replace each spec id with its reason in words:\n" + "\n".join(hits)
