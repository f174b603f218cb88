"""Generates the Python gRPC stubs of mcstore's .proto files (standard library + grpc_tools).

Used by setup.py at build/install time and by the tests, which generate stubs matching the
running interpreter's protobuf into a temporary directory:

    python -m mcstore._protogen PROTO_DIR OUT_DIR   # writes OUT_DIR/mcstore/v1/*.py
"""

import glob
import os
import sys

PROTO_FILES = ("mcstore/v1/store.proto", "mcstore/v1/master.proto", "mcstore/v1/gpu.proto")


def find_proto_dir(package_root):
    """The directory holding mcstore/v1/*.proto: $MCSTORE_PROTO_DIR, or ../proto next to
    `package_root` (the python/ directory of the repository)."""
    candidates = []
    if os.environ.get("MCSTORE_PROTO_DIR"):
        candidates.append(os.environ["MCSTORE_PROTO_DIR"])
    candidates.append(os.path.join(os.path.dirname(os.path.abspath(package_root)), "proto"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, PROTO_FILES[0])):
            return c
    raise RuntimeError("mcstore: cannot find %s in %s; build from a repository checkout or set "
                       "MCSTORE_PROTO_DIR" % (PROTO_FILES[0], " or ".join(candidates)))


def generate(proto_dir, out_dir):
    """Runs grpc_tools.protoc: writes out_dir/mcstore/v1/{store,master,gpu}_pb2{,_grpc}.py and an
    __init__.py. Raises RuntimeError when protoc fails."""
    try:
        from grpc_tools import protoc
        import grpc_tools
    except ImportError as e:
        raise RuntimeError("mcstore: generating the gRPC stubs needs grpcio-tools "
                           "(pip install grpcio-tools): %s" % e) from e
    os.makedirs(os.path.join(out_dir, "mcstore", "v1"), exist_ok=True)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    args = ["grpc_tools.protoc", "--proto_path=" + proto_dir, "--proto_path=" + well_known,
            "--python_out=" + out_dir, "--grpc_python_out=" + out_dir]
    args += list(PROTO_FILES)
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError("mcstore: grpc_tools.protoc failed (%d) on %s" % (rc, proto_dir))
    init = os.path.join(out_dir, "mcstore", "v1", "__init__.py")
    with open(init, "w") as f:
        f.write('"""Generated gRPC stubs of mcstore.v1 (not committed)."""\n')
    return sorted(glob.glob(os.path.join(out_dir, "mcstore", "v1", "*.py")))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m mcstore._protogen PROTO_DIR OUT_DIR")
    for path in generate(sys.argv[1], sys.argv[2]):
        print(path)
