"""GPU memory lent to mc-client (docs/gpu.md): torch CUDA tensors exported by CUDA IPC and
registered with the daemon's GpuBuffers service, so that get/put slices can name them.

Only the handle travels: this module never touches device memory and needs no CUDA itself
(torch is imported only by the caller's tensor)."""

from __future__ import annotations

import threading
from typing import Any, Callable, NamedTuple, Optional

from mcstore._buffers import Slice, _check_int

# GPU buffer ids have bit 63 set (client/gpu/gpu_buffers.h): they never collide with shm buffers.
GPU_BUFFER_ID_BIT = 1 << 63
CUDA_IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


class CudaIpcExport(NamedTuple):
    """What RegisterGpuBuffer needs to open a tensor's memory in mc-client."""

    device: int             # CUDA ordinal of the tensor, as this process numbers devices
    handle: bytes           # cudaIpcMemHandle_t of the allocation holding the tensor
    allocation_offset: int  # where the tensor's bytes start inside that allocation
    size: int               # bytes of the tensor


def export_cuda_tensor(tensor: Any) -> CudaIpcExport:
    """The CUDA IPC export of a contiguous torch CUDA tensor: the handle of the caching
    allocator's allocation that holds it and the tensor's byte range inside it.

    Raises TypeError for anything but a CUDA tensor, ValueError for a non-contiguous or empty
    one or a handle that is not a cudaIpcMemHandle_t (e.g. expandable segments, which CUDA
    IPC cannot share)."""
    if not getattr(tensor, "is_cuda", False) or not hasattr(tensor, "untyped_storage"):
        raise TypeError("expected a torch CUDA tensor, got %s%s" % (
            type(tensor).__name__,
            " on %s" % tensor.device if hasattr(tensor, "device") else ""))
    if not tensor.is_contiguous():
        raise ValueError("the tensor must be contiguous: a GPU buffer is one byte range")
    element = int(tensor.element_size())
    size = int(tensor.numel()) * element
    if size <= 0:
        raise ValueError("the tensor is empty")
    shared = tensor.untyped_storage()._share_cuda_()
    # torch: (device, handle, storage size, storage offset in the allocation (bytes), ...)
    device, handle, _storage_bytes, storage_offset = shared[0], shared[1], shared[2], shared[3]
    if not isinstance(handle, (bytes, bytearray)) or len(handle) != CUDA_IPC_HANDLE_BYTES:
        raise ValueError("torch returned no %d-byte CUDA IPC handle for this tensor (%r bytes); "
                         "memory from expandable segments (PYTORCH_CUDA_ALLOC_CONF="
                         "expandable_segments:True) cannot be shared by CUDA IPC"
                         % (CUDA_IPC_HANDLE_BYTES, len(handle) if handle is not None else None))
    offset = int(storage_offset) + int(tensor.storage_offset()) * element
    return CudaIpcExport(int(device), bytes(handle), offset, size)


class GpuBuffer:
    """A range of GPU memory registered with one mc-client (Client.register_cuda /
    register_gpu_handle). `slice()` names parts of it for get/put, alone or beside other
    slices of an item (docs/gpu.md).

    It holds a reference to the tensor (when made from one) so that the memory is not freed
    while registered; close() unregisters it (also done by the Client's close())."""

    def __init__(self, buffer_id: int, size: int, device: int, device_name: str,
                 unregister: Callable[[int], None], keep: Any = None) -> None:
        self.buffer_id = buffer_id
        self.size = size
        self.device = device
        self.device_name = device_name
        self._unregister = unregister
        self._keep = keep
        self._lock = threading.Lock()
        self.closed = False

    def slice(self, offset: int = 0, length: Optional[int] = None) -> Slice:
        """`length` bytes (default: to the end) at `offset` of this buffer."""
        if self.closed:
            raise ValueError("GPU buffer %d is closed" % self.buffer_id)
        offset = _check_int(offset, "offset")
        length = self.size - offset if length is None else _check_int(length, "length")
        if offset < 0 or length < 0 or offset > self.size or length > self.size - offset:
            raise ValueError("slice [%d, +%d) is outside GPU buffer %d of %d bytes"
                             % (offset, length, self.buffer_id, self.size))
        return Slice(self.buffer_id, offset, length)

    def close(self) -> None:
        """Unregisters the buffer (a transfer in flight keeps it open in the daemon until it
        ends). Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            self._unregister(self.buffer_id)
        finally:
            self._keep = None

    def __enter__(self) -> "GpuBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "GpuBuffer(id=%#x, size=%d, device=%d%s)" % (
            self.buffer_id, self.size, self.device, ", closed" if self.closed else "")
