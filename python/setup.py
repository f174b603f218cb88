"""Build hook: generate the gRPC stubs (mcstore/v1/*_pb2*.py) from the .proto files into the
build, and require the grpcio and protobuf runtimes that the generated code needs.

The stubs are not committed. They are generated with the build environment's grpcio-tools from
$MCSTORE_PROTO_DIR, else proto/ beside this file (what an sdist carries), else ../proto (a
repository checkout), and written into the build directory only, never into the source tree.
Generated code checks its runtimes when imported: protobuf must be at least the gencode's version
and of the same major, grpcio at least the grpcio-tools version. Those bounds become the package's
requirements, so pip never installs a runtime the shipped stubs refuse.
"""

import importlib.util
import os
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))


def _protogen():
    spec = importlib.util.spec_from_file_location(
        "_mcstore_protogen", os.path.join(HERE, "mcstore", "_protogen.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _requirements():
    """numpy, and the grpcio/protobuf that stubs generated here will accept."""
    gen = _protogen()
    out = tempfile.mkdtemp(prefix="mcstore-reqs-")
    try:
        gen.generate(gen.find_proto_dir(HERE), out)
        return ["numpy>=1.24"] + gen.runtime_requirements(os.path.join(out, "mcstore", "v1"))
    finally:
        shutil.rmtree(out, ignore_errors=True)


class BuildPyWithProtos(build_py):
    def run(self):
        super().run()
        if not self.dry_run:
            gen = _protogen()
            gen.generate(gen.find_proto_dir(HERE), self.build_lib)


class SdistWithProtos(sdist):
    """An sdist carries the .proto files (as proto/mcstore/v1/), so a wheel built from it (what
    `python -m build` does) finds them without the repository around it."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        gen = _protogen()
        src = gen.find_proto_dir(HERE)
        for rel in gen.PROTO_FILES:
            dst = os.path.join(base_dir, "proto", rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(os.path.join(src, rel), dst)


setup(cmdclass={"build_py": BuildPyWithProtos, "sdist": SdistWithProtos},
      install_requires=_requirements())
