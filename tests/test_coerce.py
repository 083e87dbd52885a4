"""coerce_param as a table: the value a node gets, and the error codes recorded."""
from __future__ import annotations

from typing import Any

import pytest

from cdui.graph.validate import coerce_param
from cdui.nodes.base import Param

CASES: list[tuple[str, Any, Any, list[str]]] = [
    ("int", "3", 3, []), ("int", 4.0, 4, []), ("int", "2.0", 2, []),
    ("int", 2.5, 2.5, ["bad_param"]), ("int", True, True, ["bad_param"]), ("int", "x", "x", ["bad_param"]),
    ("int", 0, 0, ["param_out_of_range"]), ("int", 11, 11, ["param_out_of_range"]),
    ("float", "0.5", 0.5, []), ("float", False, False, ["bad_param"]), ("float", [], [], ["bad_param"]),
    ("bool", "Yes", True, []), ("bool", "off", False, []), ("bool", 0, False, []),
    ("bool", "maybe", "maybe", ["bad_param"]),
    ("select", "b", "b", []), ("select", "z", "z", ["bad_param"]),
    ("string", 12, 12, []), ("int", None, None, []),
]


@pytest.mark.parametrize("ptype, value, expected, codes", CASES)
def test_coerce_param(ptype: str, value: Any, expected: Any, codes: list[str]) -> None:
    p = Param("p", ptype, None, "", options=["a", "b"] if ptype == "select" else [],
              min_value=1 if ptype == "int" else None, max_value=10 if ptype == "int" else None)
    errors: list[dict[str, Any]] = []
    got = coerce_param(p, value, "n", errors)
    assert (got, type(got)) == (expected, type(expected))
    assert [e["code"] for e in errors] == codes
