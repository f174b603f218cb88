"""pytest setup for the vLLM connector tests (run in this checkout's venv, deploy/python-venv.sh).

They import the mcstore package installed there from python/ (tests/python/run_pytest.sh
reinstalls it when it changed), never python/ itself; the engine processes they start use the
same interpreter and so the same package.
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for p in (os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "integration", "client")):
    if p not in sys.path:
        sys.path.insert(0, p)

import installed_package  # noqa: E402

installed_package.require(ROOT)
os.environ.setdefault("MC_BUILD_DIR", os.path.join(ROOT, "build"))
