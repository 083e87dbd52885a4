"""Skips for tests that need a system command (slurmctld, sshd, nginx, ...): they skip
with a reason naming what is missing and the package list that has it; with
CDUI_TEST_REQUIRE_ALL=1 (CI) tests/conftest.py turns every skip into a failure, and
.ci/run installs the packages (its APT_NEEDS list)."""
from __future__ import annotations

import os
import shutil

import pytest


def require_commands(*commands):

    missing = [c for c in commands if shutil.which(c) is None and not os.path.exists(f"/usr/sbin/{c}")]
    return pytest.mark.skipif(bool(missing), reason=f"needs the system command(s) {', '.join(missing)} "
                                                     f"(Debian: see APT_NEEDS in .ci/run)")
