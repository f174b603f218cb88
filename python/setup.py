"""Build hook: generate the gRPC stubs (mcstore/v1/*_pb2*.py) from ../proto into the build.

The stubs are not committed. `build_py` runs grpc_tools.protoc over the .proto files (found in
$MCSTORE_PROTO_DIR or ../proto beside this file) and writes them into the build directory only,
never into the source tree.
"""

import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _protogen():
    spec = importlib.util.spec_from_file_location(
        "_mcstore_protogen", os.path.join(HERE, "mcstore", "_protogen.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithProtos(build_py):
    def run(self):
        super().run()
        if not self.dry_run:
            gen = _protogen()
            gen.generate(gen.find_proto_dir(HERE), self.build_lib)


setup(cmdclass={"build_py": BuildPyWithProtos})
