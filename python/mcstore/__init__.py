"""mcstore: the Python client of the mcstore distributed KV-cache store.

    from mcstore import Client
    with Client("unix:/run/mcstore/client.sock") as c:
        buf = c.create_buffer(1 << 20)
        arr = buf.numpy("float16", (512, 1024))       # a view of shared memory
        c.put([b"k"], [[buf.slice(0, arr.nbytes)]])     # zero-copy put
        c.get([b"k"], into=[[buf.slice(0, arr.nbytes)]])  # zero-copy get into `arr`

Exports: Client, AsyncClient, Lease, LeaseRef, AsyncLease, SharedBuffer, GpuBuffer, Slice, PreparedSlices,
BlockLayout, LayoutBlocks, BufferPool, Block, Code,
Result, GetResult, StoreError, UnavailableError, SessionLostError, raise_for_results, TlsConfig.
See docs/python.md.
"""

# The generated stubs (mcstore.v1) may live in another directory named mcstore on sys.path:
# the build's python_gen/ (CMake), a temporary directory (tests) or the installed package.
# Extending __path__ lets mcstore.v1 resolve from any of them.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)  # type: ignore[name-defined]

from typing import TYPE_CHECKING, Any

from mcstore._version import __version__

_EXPORTS = {
    "Client": "mcstore._client",
    "Lease": "mcstore._client",
    "LeaseRef": "mcstore._client",
    "AsyncClient": "mcstore._aio",
    "AsyncLease": "mcstore._aio",
    "SharedBuffer": "mcstore._buffers",
    "GpuBuffer": "mcstore._gpu",
    "BufferPool": "mcstore._pool",
    "Block": "mcstore._pool",
    "Slice": "mcstore._buffers",
    "PreparedSlices": "mcstore._core",
    "BlockLayout": "mcstore._core",
    "LayoutBlocks": "mcstore._core",
    "Code": "mcstore._errors",
    "Result": "mcstore._errors",
    "GetResult": "mcstore._errors",
    "StoreError": "mcstore._errors",
    "UnavailableError": "mcstore._errors",
    "SessionLostError": "mcstore._errors",
    "raise_for_results": "mcstore._errors",
    "TlsConfig": "mcstore._tls",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from mcstore._aio import AsyncClient, AsyncLease
    from mcstore._buffers import SharedBuffer, Slice
    from mcstore._gpu import GpuBuffer
    from mcstore._core import BlockLayout, LayoutBlocks, PreparedSlices
    from mcstore._client import Client, Lease, LeaseRef
    from mcstore._pool import Block, BufferPool
    from mcstore._tls import TlsConfig
    from mcstore._errors import (Code, GetResult, Result, SessionLostError, StoreError,
                                 UnavailableError, raise_for_results)


def __getattr__(name: str) -> Any:
    # Lazy: `import mcstore.v1.store_pb2` (the stubs alone) imports no grpc/numpy here.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError("module 'mcstore' has no attribute %r" % name)
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> Any:
    return sorted(list(globals()) + __all__)
