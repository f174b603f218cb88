"""Loads the generated message classes (mcstore.v1.store_pb2) with a clear error if missing."""

from __future__ import annotations

from types import ModuleType


def store_pb2() -> ModuleType:
    try:
        from mcstore.v1 import store_pb2 as spb
    except ImportError as e:
        raise ImportError(
            "mcstore: the generated gRPC stubs (mcstore.v1.store_pb2) are missing: install the "
            "package (pip install ./python), or generate them with "
            "`python -m mcstore._protogen proto OUT` and put OUT on PYTHONPATH (%s)" % e) from e
    return spb


def gpu_pb2() -> ModuleType:
    try:
        from mcstore.v1 import gpu_pb2 as gpb
    except ImportError as e:
        raise ImportError(
            "mcstore: the generated gRPC stubs of the GpuBuffers service (mcstore.v1.gpu_pb2) "
            "are missing: reinstall the package (pip install ./python) "
            "(%s)" % e) from e
    return gpb


SERVICE = "/mcstore.v1.Store/"
GPU_SERVICE = "/mcstore.v1.GpuBuffers/"
