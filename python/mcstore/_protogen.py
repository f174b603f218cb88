"""Generates the Python gRPC stubs of mcstore's .proto files (standard library + grpc_tools).

Used by setup.py when the package is built (the wheel ships the stubs), by CMake for the C++-side
tests, and by hand from a source tree:

    python -m mcstore._protogen PROTO_DIR OUT_DIR   # writes OUT_DIR/mcstore/v1/*.py
"""

import glob
import os
import re
import sys

PROTO_FILES = ("mcstore/v1/store.proto", "mcstore/v1/master.proto", "mcstore/v1/gpu.proto")


def find_proto_dir(package_root):
    """The directory holding mcstore/v1/*.proto: $MCSTORE_PROTO_DIR, proto/ inside
    `package_root` (an sdist carries a copy there), or ../proto next to it (the python/ directory
    of a repository checkout)."""
    candidates = []
    if os.environ.get("MCSTORE_PROTO_DIR"):
        candidates.append(os.environ["MCSTORE_PROTO_DIR"])
    root = os.path.abspath(package_root)
    candidates.append(os.path.join(root, "proto"))
    candidates.append(os.path.join(os.path.dirname(root), "proto"))
    for c in candidates:
        if os.path.isfile(os.path.join(c, PROTO_FILES[0])):
            return c
    raise RuntimeError("mcstore: cannot find %s in %s; build from a repository checkout or an "
                       "sdist, or set MCSTORE_PROTO_DIR"
                       % (PROTO_FILES[0], " or ".join(candidates)))


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


# protoc >= 3.26 writes the gencode's version into every _pb2.py and checks it on import: the
# runtime must be that version or newer, of the same major.
_GENCODE = re.compile(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,"
                      r"\s*(\d+),\s*(\d+),\s*(\d+),\s*'([^']*)'")
# grpc_tools writes its own version into every _pb2_grpc.py and refuses an older grpcio.
_GRPC_GENERATED = re.compile(r"GRPC_GENERATED_VERSION = '([0-9][0-9.]*)'")


def runtime_requirements(v1_dir):
    """The grpcio and protobuf requirements that the stubs generated in `v1_dir` (its
    *_pb2*.py) accept when imported, as pip requirement strings."""
    protobuf = "protobuf>=4.21"   # gencode older than 3.26 carries no check of its own
    grpcio = "grpcio>=1.51"
    for path in sorted(glob.glob(os.path.join(v1_dir, "*_pb2*.py"))):
        with open(path) as f:
            text = f.read()
        m = _GENCODE.search(text)
        if m:
            major, minor, patch, suffix = int(m.group(1)), m.group(2), m.group(3), m.group(4)
            protobuf = "protobuf>=%d.%s.%s%s,<%d" % (major, minor, patch, suffix, major + 1)
        m = _GRPC_GENERATED.search(text)
        if m:
            grpcio = "grpcio>=" + m.group(1)
    return [grpcio, protobuf]


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m mcstore._protogen PROTO_DIR OUT_DIR")
    for path in generate(sys.argv[1], sys.argv[2]):
        print(path)
