"""pytest setup for the mcstore Python client tests.

Package: the tests import the mcstore package installed in this checkout's venv
(deploy/python-venv.sh; tests/python/run_pytest.sh installs it from python/ when it changed),
with the gRPC stubs its build generated: never python/ itself. A stale or missing install stops
the session with the command that fixes it.

Daemons: `cluster` starts one mc-master and two mc-client daemons from $MC_BUILD_DIR (default
<repo>/build) with tests/integration/client/client_cluster.py, once per test module.
"""

import os
import sys

import pytest

SOURCE_DIR = os.environ.get("MC_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
_TESTS = os.path.join(SOURCE_DIR, "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import installed_package  # noqa: E402

installed_package.require(SOURCE_DIR)

if not os.environ.get("MC_BUILD_DIR"):
    os.environ["MC_BUILD_DIR"] = os.path.join(SOURCE_DIR, "build")
    _BUILD_DIR_GIVEN = False
else:
    _BUILD_DIR_GIVEN = True


def daemons_built():
    b = os.environ["MC_BUILD_DIR"]
    return all(os.access(os.path.join(b, p), os.X_OK)
               for p in ("master/mc-master", "client/mc-client"))


@pytest.fixture(scope="module")
def cluster():
    """A running mc-master + 2 mc-clients (16 MiB segments each)."""
    if not daemons_built():
        if _BUILD_DIR_GIVEN:
            pytest.fail("mc-master/mc-client are not built in MC_BUILD_DIR=%s"
                        % os.environ["MC_BUILD_DIR"])
        pytest.skip("daemons not built in %s (set MC_BUILD_DIR)" % os.environ["MC_BUILD_DIR"])
    from integration.client.client_cluster import Cluster
    c = Cluster(clients=2, segment_size=16 << 20)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # Print the daemons' logs when a test that used the cluster fails.
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and "cluster" in getattr(item, "funcargs", {}):
        item.funcargs["cluster"].dump_logs()
