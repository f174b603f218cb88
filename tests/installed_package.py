"""Checks, for the pytest suites that run in a checkout's venv (tests/python, tests/vllm,
tests/sglang), that `import mcstore` finds the package installed from this checkout's python/
(what users get: built, with generated stubs), not the source tree, and not a stale install."""

import filecmp
import os
import sys


def problem(source_dir: str) -> "str | None":
    """None when mcstore is this checkout's installed package; otherwise what is wrong."""
    tree = os.path.realpath(os.path.join(source_dir, "python", "mcstore"))
    for p in sys.path:
        if p and os.path.realpath(p) == os.path.dirname(tree):
            return "python/ is on sys.path (%s): the tests must import the installed package" % p
    try:
        import mcstore
        import mcstore.v1.store_pb2  # noqa: F401  the generated stubs ship with the package
    except ImportError as e:
        return "cannot import the installed mcstore package: %s" % e
    installed = os.path.realpath(os.path.dirname(mcstore.__file__))
    if installed == tree:
        return "mcstore is imported from the source tree %s, not installed" % tree
    for dirpath, _, files in os.walk(tree):
        rel = os.path.relpath(dirpath, tree)
        if rel.split(os.sep)[0] in ("v1", "__pycache__"):
            continue
        for f in files:
            if not f.endswith(".py"):
                continue
            mine = os.path.join(installed, rel, f)
            if not os.path.exists(mine) or not filecmp.cmp(os.path.join(dirpath, f), mine,
                                                           shallow=False):
                name = os.path.normpath(os.path.join(rel, f))
                return ("the installed mcstore (%s) differs from python/mcstore/%s: reinstall "
                        "with ./deploy/python-venv.sh install" % (installed, name))
    return None


def require(source_dir: str) -> None:
    """Stops the pytest session with the reason when problem() finds one."""
    why = problem(source_dir)
    if why is not None:
        import pytest
        pytest.exit("mcstore package check: " + why, returncode=1)
