"""pytest setup for the mcstore Python client tests.

Stubs: the generated gRPC code must match the running interpreter's protobuf, so this generates
mcstore.v1 with the interpreter's grpc_tools into a temporary directory and puts it first on
sys.path (mcstore's __init__ extends its __path__, so mcstore.v1 resolves there). Without
grpc_tools it falls back to whatever is already on the path (build/python_gen).

Daemons: `cluster` starts one mc-master and two mc-client daemons from $MC_BUILD_DIR (default
<repo>/build) with tests/integration/client/client_cluster.py, once per test module.
"""

import atexit
import os
import shutil
import sys
import tempfile

import pytest

SOURCE_DIR = os.environ.get("MC_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
for p in (os.path.join(SOURCE_DIR, "tests"), os.path.join(SOURCE_DIR, "python")):
    if p not in sys.path:
        sys.path.insert(0, p)


def _generate_stubs():
    if "mcstore" in sys.modules:
        return  # too late to choose; use what is loaded
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        return
    sys.path.insert(0, os.path.join(SOURCE_DIR, "python"))
    from mcstore import _protogen
    out = tempfile.mkdtemp(prefix="mcstore-pytest-gen-")
    atexit.register(shutil.rmtree, out, True)
    _protogen.generate(os.path.join(SOURCE_DIR, "proto"), out)
    sys.path.insert(0, out)
    import mcstore
    mcstore.__path__[:] = [mcstore.__path__[0], os.path.join(out, "mcstore")] + [
        p for p in mcstore.__path__[1:] if p != os.path.join(out, "mcstore")]


_generate_stubs()

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
