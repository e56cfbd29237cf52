"""Session-wide test setup: one CPU device, as users get by default.

With one device, ``backend="auto"`` is the native handler on CPU, so the
default path is what these tests exercise.  The tests that need eight
devices live in tests/multidevice/ and run in their own process
(tests/test_multidevice.py launches it; XLA reads its device-count flag
once per process, so the two cannot share one).
"""

import os
import sys

import pytest

# Tests that check bits compare against NumPy; keep JAX on the host CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

MULTIDEVICE = os.environ.get("JAS_MULTIDEVICE") == "1"

# Collected only by the multi-device process (tests/multidevice/conftest.py).
collect_ignore = [] if MULTIDEVICE else ["multidevice"]


@pytest.fixture(scope="module")
def double(tmp_path_factory):
    """The CANN test double (tests/cann_double), built once per session."""
    from tests.cann_double import control

    return control.shared(tmp_path_factory)


@pytest.fixture
def cann(double, monkeypatch):
    """The double's "full" installation, fresh, with the Ascend loader pointed at it."""
    from tests import ascend_harness
    from tests.cann_double import control

    control.use(monkeypatch, double, "full")
    yield double
    ascend_harness.testing().release_workspaces()
    double.reset()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # The GPU tier (tests/gpu_tier.py): a test asking for a native handler
    # this platform lacks is skipped with the library's message, off the CPU.
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not report.failed or "jax" not in sys.modules:
        return
    import jax

    from tests.gpu_tier import missing_native_handler

    reason = missing_native_handler(call.excinfo.value, jax.default_backend())
    if reason is not None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, reason)


def pytest_collection_finish(session):
    # The eight-device tiers run in a child process: start each one selected
    # now, so that it runs beside the rest of the session (tests/test_multidevice.py).
    if MULTIDEVICE or session.config.option.collectonly:
        return
    from tests import test_multidevice as md

    names = {item.name for item in session.items} & set(md.MARKERS)
    if names:
        session.config.stash[md.TIERS] = {name: md.Tier(name) for name in names}


def pytest_sessionfinish(session, exitstatus):
    md = sys.modules.get("tests.test_multidevice")
    interrupted = exitstatus == pytest.ExitCode.INTERRUPTED or bool(session.shouldstop)
    for tier in session.config.stash.get(md.TIERS, {}).values() if md else ():
        tier.stop(interrupted)
