"""pytest setup for the SGLang storage backend's tests (mcstore.sglang), run in this checkout's
SGLang venv (deploy/python-venv.sh --sglang: sglang from PyPI, pinned, with the torch it pins;
tests/python/run_pytest.sh --sglang installs this checkout's mcstore package into it).

SGLang's engine has no CPU build on PyPI (its CPU path needs sgl-kernel built from source), so
these tests drive SGLang's own host KV pool classes, its storage backend factory (the dynamic
backend, as --hicache-storage-backend dynamic loads it) and its HiCacheController's storage
threads on the CPU, against a real mc-master and mc-client."""

import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for p in (os.path.join(ROOT, "tests"),):
    if p not in sys.path:
        sys.path.insert(0, p)

import installed_package  # noqa: E402

installed_package.require(ROOT)
os.environ.setdefault("MC_BUILD_DIR", os.path.join(ROOT, "build"))


@pytest.fixture(scope="module")
def cluster():
    """A running mc-master + 1 mc-client (64 MiB segment)."""
    b = os.environ["MC_BUILD_DIR"]
    if not all(os.access(os.path.join(b, p), os.X_OK)
               for p in ("master/mc-master", "client/mc-client")):
        pytest.fail("mc-master/mc-client are not built in MC_BUILD_DIR=%s" % b)
    from integration.client.client_cluster import Cluster
    c = Cluster(clients=1, segment_size=64 << 20)
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and "cluster" in getattr(item, "funcargs", {}):
        item.funcargs["cluster"].dump_logs()
