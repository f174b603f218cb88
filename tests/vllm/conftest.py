"""pytest setup for the vLLM connector tests (run in the venv of deploy/python-venv.sh).

The gRPC stubs must match the venv's protobuf (build/python_gen holds Debian protoc's, which a
newer protobuf refuses), so they are generated here with the venv's grpc_tools into a temporary
directory, put first on sys.path, and named in $MCSTORE_STUBS_DIR for the engine processes.
"""

import atexit
import os
import shutil
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
for p in (os.path.join(ROOT, "python"), os.path.join(ROOT, "tests"),
          os.path.join(ROOT, "tests", "integration", "client")):
    if p not in sys.path:
        sys.path.insert(0, p)


def _generate_stubs():
    from mcstore import _protogen
    out = tempfile.mkdtemp(prefix="mcstore-vllm-gen-")
    atexit.register(shutil.rmtree, out, True)
    _protogen.generate(os.path.join(ROOT, "proto"), out)
    sys.path.insert(0, out)
    import mcstore
    mcstore.__path__[:] = [mcstore.__path__[0], os.path.join(out, "mcstore")]
    os.environ["MCSTORE_STUBS_DIR"] = out


_generate_stubs()
os.environ.setdefault("MC_BUILD_DIR", os.path.join(ROOT, "build"))
