"""The in-process tier: ``async def`` tests run in a fresh event loop each.

No plugin is needed for that: the hook below runs a coroutine test with
``asyncio.run``, so the control plane, its sqlite writer and the fake agents
live and die inside the one test."""
from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    args = {a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**args))
    return True


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    """A user data folder and a data folder for one control plane (more with new names)."""
    return {"user_data": tmp_path / "ud", "data_dir": tmp_path / "data"}


@pytest.fixture
def settings() -> dict[str, Any]:
    return {}
