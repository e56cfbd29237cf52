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


def pytest_collection_finish(session):
    # The eight-device tiers run in a child process: start each one selected
    # now, so that it runs beside the rest of the session (tests/test_multidevice.py).
    if MULTIDEVICE or session.config.option.collectonly:
        return
    from tests import test_multidevice as md

    names = {item.name for item in session.items} & set(md.MARKERS)
    if names:
        session.config.stash[md.TIERS] = {name: md.Tier(md.MARKERS[name]) for name in names}


def pytest_sessionfinish(session):
    md = sys.modules.get("tests.test_multidevice")
    for tier in session.config.stash.get(md.TIERS, {}).values() if md else ():
        tier.stop()
