# --- CDUI_TEST_REQUIRE_ALL
# With CDUI_TEST_REQUIRE_ALL=1 (set by .ci/run) a skipped test, or a skipped test
# module, is reported as a failure carrying the skip reason: CI must run everything.
# xfail stays xfail. Keep this block first; append fixtures below it.
import os

import pytest

_REQUIRE_ALL = os.environ.get("CDUI_TEST_REQUIRE_ALL") == "1"


def _skip_to_failure(report):
    if not _REQUIRE_ALL or not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped, but CDUI_TEST_REQUIRE_ALL=1 forbids skips: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _skip_to_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _skip_to_failure(outcome.get_result())
# --- end CDUI_TEST_REQUIRE_ALL


# --- test tiers (the `e2e` marker)
# Tests marked `e2e` start real processes (servers, agents, run subprocesses, the
# launcher) and take most of the suite's time; everything else, including the
# in-process tier under tests/inproc/, runs in the default tier. A run that names
# no tests (no path, no -m, no -k: `bin/cdui test`, `bin/cdui test -q`) leaves
# the e2e tests out and says so; naming tests runs exactly what was named, and
# CDUI_TEST_TIER=all (set by .ci/run) or CDUI_TEST_REQUIRE_ALL=1 runs every tier.
def _default_tier_only(config):
    if os.environ.get("CDUI_TEST_TIER") == "all" or _REQUIRE_ALL:
        return False
    named = config.args_source != pytest.Config.ArgsSource.TESTPATHS
    return not (named or config.option.markexpr or config.option.keyword)


@pytest.hookimpl(tryfirst=True)  # before xdist's hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    group_shared_fixtures(config, items)
    if not _default_tier_only(config):
        return
    e2e = [i for i in items if i.get_closest_marker("e2e") is not None]
    if e2e:
        config.hook.pytest_deselected(items=e2e)
        items[:] = [i for i in items if i.get_closest_marker("e2e") is None]


def pytest_report_header(config):
    if _default_tier_only(config):
        return "cdui: default tier (e2e tests left out; run them with -m e2e, or everything with CDUI_TEST_TIER=all)"
    return None
# --- end test tiers


# --- parallel runs (pytest-xdist, as .ci/run uses it: -n N --dist loadgroup)
# Each test goes to whichever worker is free, except that tests sharing a module- or
# session-scoped fixture (a module's server, browser, nginx, SLURM cluster, the moto
# server) go to one worker together, so that the fixture is built once, not once per
# worker. Everything else a test touches is its own (tmp folders, free ports, the
# leftover sweep's per-process session marker), so tests are independent otherwise.
# Cheap fixtures every test may use: no reason to keep their tests together.
_CHEAP_SHARED = {"_cdui_process_logs_on_failure", "_end_module_leftovers", "need_command"}
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def group_shared_fixtures(config, items):
    """Marks tests that share one of our wider-scoped fixtures with one xdist_group (pytest's own
    session fixtures, tmp_path_factory and the like, cost nothing to repeat per worker)."""
    if getattr(config.option, "dist", "no") == "no":  # not a parallel run (or no xdist)
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        shared = set()
        for name, defs in (info.name2fixturedefs.items() if info is not None else ()):
            if name in _CHEAP_SHARED or not defs:
                continue
            code = getattr(defs[-1].func, "__code__", None)
            if code is None or not os.path.abspath(code.co_filename).startswith(_TESTS_DIR + os.sep):
                continue
            scope = defs[-1].scope
            if scope == "session":
                shared.add(f"session-{name}")
            elif scope in ("module", "package", "class"):
                shared.add(item.module.__name__ if item.module is not None else item.nodeid.split("::")[0])
        if shared:
            item.add_marker(pytest.mark.xdist_group("+".join(sorted(shared))))
    # Workers take tests (and groups) in this order (.ci/run passes --no-loadscope-reorder): the
    # longest first, so that none of them starts when the others are nearly done.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
# --- end parallel runs


# --- process helpers (tests/procs.py)
# A failing test's report carries the log tail of every cdui process it
# touched (servers, agents). Registered as a plugin object, so it adds no
# hook function names to this module.
@pytest.fixture(scope="session", autouse=True)
def _cdui_process_logs_on_failure(request):
    from procs import LogSectionsPlugin
    pm = request.config.pluginmanager
    if pm.get_plugin("cdui-process-logs") is None:
        pm.register(LogSectionsPlugin(), "cdui-process-logs")
    yield
# --- end process helpers


# --- leftover processes (tests/procs.py ProcessSweep)
# Every test, and every module, ends with no process it started still running:
# whatever it left (a server it forgot to stop, an agent, an orphaned run
# subprocess) gets SIGTERM, then SIGKILL, and the test's output says what was
# ended (a warning in the summary). Processes of longer-lived fixtures survive.
from procs import ProcessSweep, mark_session  # noqa: E402

mark_session()


class LeftoverProcessWarning(UserWarning):
    """A test (or module) left processes running; conftest ended them."""


def _end_leftovers(sweep, request, what):
    import warnings
    ended = sweep.end_leftovers(float(os.environ.get("CDUI_TEST_LEFTOVER_GRACE_S", "10")))
    if ended:
        lines = "\n  ".join(ended)
        msg = f"{what} {request.node.nodeid} left {len(ended)} process(es) running; ended them:\n  {lines}"
        warnings.warn(LeftoverProcessWarning(msg), stacklevel=1)
        import sys
        print(msg, file=sys.stderr)


@pytest.fixture(scope="module", autouse=True)
def _end_module_leftovers(request):
    sweep = ProcessSweep()
    yield
    _end_leftovers(sweep, request, "module")


@pytest.fixture(autouse=True)
def _end_test_leftovers(request):
    sweep = ProcessSweep()
    yield
    _end_leftovers(sweep, request, "test")
# --- end leftover processes


# --- required system packages
# A test needing a system command (nginx, openssl, ssh, ...) skips with the package
# to install when it is missing; CDUI_TEST_REQUIRE_ALL=1 (CI) turns that into a failure.
def require_command(command, package=None):
    """The absolute path of ``command`` (searched on PATH and in the sbin folders), or skip."""
    import shutil
    path = shutil.which(command) or shutil.which(command, path="/usr/sbin:/sbin:/usr/local/sbin")
    if path is None:
        pytest.skip(f"{command} is not installed (install the system package {package or command})")
    return path


@pytest.fixture(scope="session")
def need_command():
    """``need_command("nginx")``: :func:`require_command` for tests and fixtures (no import of conftest needed)."""
    return require_command


# require_commands (a skip mark) lives in tests/syspkgs.py: test modules import it from there,
# since `from conftest import` would find whichever conftest (tests/ or tests/inproc/) loaded first.
# --- end required system packages
# --- S3 backend: moto's standalone server (tests/s3server.py) as fixtures for tests/test_s3*.py
from s3server import enforcing, moto, moto_server  # noqa: E402,F401
from syspkgs import require_commands, requires_command  # noqa: E402,F401


@pytest.fixture
def store(tmp_path):
    """A fresh, opened store (cdui/plane/store/database.py) in the test's own folder, closed afterwards."""
    from cdui.plane.store import Store
    s = Store(tmp_path / "cdui.sqlite3")
    s.open()
    try:
        yield s
    finally:
        s.close()
