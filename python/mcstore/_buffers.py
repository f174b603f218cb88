"""Shared-memory buffers registered with an mc-client daemon, and the Slices that name their
bytes.

A SharedBuffer is a POSIX shared-memory object this process creates (mode 0600, name
"/mcstore-<pid>-<random>"), maps, and registers with the daemon (RegisterBuffer). The daemon maps
the same object, so a get into a Slice of the buffer lands directly in the caller's memory and a
put from a Slice sends no payload bytes over gRPC. numpy() and torch() return views of the
mapping (no copy). close() unregisters, unlinks the name and unmaps; while views are still alive
the mapping stays until the last of them is gone (never a dangling view).

The daemon opens the object by name with shm_open(O_RDWR): it must run as the same user (or
root) in the same IPC namespace (/dev/shm) as this process.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Tuple, Union

try:
    import _posixshmem  # CPython's shm_open/shm_unlink (what multiprocessing uses)
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

if TYPE_CHECKING:
    import numpy
    import torch

ShapeLike = Union[int, Sequence[int]]

# The daemon's limit on an shm name (client/buffers/buffer_registry.cc): "/name", at most 255 bytes.
MAX_SHM_NAME = 255


def _check_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        # numpy integers are fine; floats and strings are not
        try:
            import numpy as np
            if isinstance(value, np.integer):
                return int(value)
        except ImportError:  # pragma: no cover
            pass
        raise TypeError("%s must be an int, got %s" % (what, type(value).__name__))
    return value


def check_shm_name(name: str) -> str:
    """Validates an shm_open name the way the daemon does: "/name", no other '/', <= 255."""
    if not isinstance(name, str):
        raise TypeError("shm name must be a str, got %s" % type(name).__name__)
    if (not name.startswith("/") or len(name) < 2 or "/" in name[1:]
            or len(name.encode()) > MAX_SHM_NAME or "\0" in name):
        raise ValueError("bad shm name %r: expected \"/name\" (one leading '/', no other, at "
                         "most %d bytes)" % (name, MAX_SHM_NAME))
    return name


class Slice:
    """`length` bytes at `offset` of the registered buffer `buffer_id`. Immutable; equal when
    (buffer_id, offset, length) are.

    Make them with SharedBuffer.slice() / slice_of() (then `buffer` is set and the client checks
    the buffer is open and the bounds), or directly for a buffer registered with
    Client.register_buffer() (the client checks the bounds against the registered size)."""

    __slots__ = ("buffer_id", "offset", "length", "buffer")
    buffer_id: int
    offset: int
    length: int
    buffer: Optional["SharedBuffer"]

    def __init__(self, buffer_id: int, offset: int, length: int,
                 buffer: Optional["SharedBuffer"] = None) -> None:
        if not (type(buffer_id) is int and type(offset) is int and type(length) is int):
            buffer_id = _check_int(buffer_id, "Slice.buffer_id")
            offset = _check_int(offset, "Slice.offset")
            length = _check_int(length, "Slice.length")
        if buffer_id < 0 or offset < 0 or length < 0:
            raise ValueError("Slice fields must be >= 0, got buffer_id=%d offset=%d length=%d"
                             % (buffer_id, offset, length))
        if buffer is not None:
            buffer._check_range(offset, length)
        setter = object.__setattr__
        setter(self, "buffer_id", buffer_id)
        setter(self, "offset", offset)
        setter(self, "length", length)
        setter(self, "buffer", buffer)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Slice is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Slice):
            return NotImplemented
        return (self.buffer_id, self.offset, self.length) == (
            other.buffer_id, other.offset, other.length)

    def __hash__(self) -> int:
        return hash((self.buffer_id, self.offset, self.length))

    def __repr__(self) -> str:
        return "Slice(buffer_id=%d, offset=%d, length=%d)" % (self.buffer_id, self.offset,
                                                              self.length)

    def __reduce__(self) -> Any:
        return (Slice, (self.buffer_id, self.offset, self.length))

    @property
    def end(self) -> int:
        return self.offset + self.length


def _normalize_shape(shape: ShapeLike) -> Tuple[int, ...]:
    if isinstance(shape, (list, tuple)):
        dims = tuple(_check_int(d, "shape dimension") for d in shape)
    else:
        dims = (_check_int(shape, "shape"),)
    for d in dims:
        if d < 0:
            raise ValueError("negative dimension in shape %r" % (dims,))
    return dims


class _ShmMapping:
    """A created-and-mapped POSIX shm object (mode 0600). unlink() removes the name; release()
    unmaps unless views still export the mapping (then it goes with the last view)."""

    def __init__(self, nbytes: int) -> None:
        if _posixshmem is None:  # pragma: no cover
            raise OSError("POSIX shared memory is not available on this platform")
        self.name = "/mcstore-%d-%s" % (os.getpid(), secrets.token_hex(8))
        fd = _posixshmem.shm_open(self.name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        self._unlinked = False
        try:
            os.fchmod(fd, 0o600)  # regardless of the umask
            os.ftruncate(fd, nbytes)
            self.mmap: Optional[mmap.mmap] = mmap.mmap(fd, nbytes, mmap.MAP_SHARED,
                                                       mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)
        anchor = ctypes.c_char.from_buffer(self.mmap)
        self.address = ctypes.addressof(anchor)
        del anchor  # releases its export of the mapping

    def unlink(self) -> None:
        if not self._unlinked:
            self._unlinked = True
            try:
                _posixshmem.shm_unlink(self.name)
            except FileNotFoundError:
                pass

    def release(self) -> bool:
        """Unmaps; False if views still hold the mapping (it is unmapped when they are gone)."""
        m, self.mmap = self.mmap, None
        if m is None:
            return True
        try:
            m.close()
            return True
        except BufferError:
            return False  # exported views: dropping our reference leaves it to them


def _finalize(mapping: _ShmMapping, unregister: Optional[Callable[[], None]]) -> None:
    # At garbage collection or interpreter exit: best effort, never raises.
    if unregister is not None:
        try:
            unregister()
        except Exception:
            pass
    try:
        mapping.unlink()
    except Exception:
        pass
    mapping.release()


class SharedBuffer:
    """A shared-memory buffer registered with one mc-client daemon (see the module docstring).
    Made by Client.create_buffer(nbytes); do not construct directly.

    Attributes: `id` (the daemon's buffer id), `size` (bytes), `name` (the shm_open name),
    `closed`. Use as a context manager to close on exit."""

    def __init__(self, nbytes: int, register: Callable[[str, int], int],
                 unregister: Callable[[int], None], owner: object) -> None:
        nbytes = _check_int(nbytes, "nbytes")
        if nbytes <= 0:
            raise ValueError("a buffer needs at least 1 byte, got %d" % nbytes)
        self._mapping = _ShmMapping(nbytes)
        self.size = nbytes
        self.name = self._mapping.name
        self._owner = owner
        self._register = register
        self._unregister = unregister
        self._lock = threading.Lock()
        self.closed = False
        try:
            self.id = register(self.name, nbytes)
        except BaseException:
            self._mapping.unlink()
            self._mapping.release()
            raise
        # Runs on close(), garbage collection or interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _finalize, self._mapping,
                                           _bind_unregister(unregister, self.id))

    # -- views -----------------------------------------------------------------------------
    def _check_open(self) -> mmap.mmap:
        m = self._mapping.mmap
        if self.closed or m is None:
            raise ValueError("shared buffer %s (id %s) is closed" % (self.name, self.id))
        return m

    def _check_range(self, offset: int, length: int) -> None:
        if self.closed or self._mapping.mmap is None:
            self._check_open()
        if not (type(offset) is int and type(length) is int):
            offset = _check_int(offset, "offset")
            length = _check_int(length, "length")
        if offset < 0 or length < 0:
            raise ValueError("negative offset/length (%d, %d)" % (offset, length))
        if offset > self.size or length > self.size - offset:
            raise ValueError("range [%d, %d) is outside shared buffer %s (id %d) of %d bytes"
                             % (offset, offset + length, self.name, self.id, self.size))

    def memoryview(self, offset: int = 0, length: Optional[int] = None) -> memoryview:
        """A writable memoryview of [offset, offset+length) (default: to the end). No copy."""
        m = self._check_open()
        if length is None:
            length = self.size - _check_int(offset, "offset")
        self._check_range(offset, length)
        return memoryview(m)[offset:offset + length]

    def numpy(self, dtype: Any, shape: ShapeLike, offset: int = 0) -> "numpy.ndarray":
        """A C-contiguous numpy VIEW of `shape` elements of `dtype` starting at byte `offset`.
        Raises TypeError for a dtype that is not plain data, ValueError when the view does not
        fit or `offset` is not aligned to the dtype."""
        import numpy as np
        try:
            dt = np.dtype(dtype)
        except TypeError as e:
            raise TypeError("not a numpy dtype: %r (%s)" % (dtype, e)) from None
        if dt.hasobject or dt.itemsize == 0:
            raise TypeError("dtype %s cannot live in shared memory (objects or zero size)" % dt)
        dims = _normalize_shape(shape)
        count = 1
        for d in dims:
            count *= d
        offset = _check_int(offset, "offset")
        self._check_range(offset, count * dt.itemsize)
        if offset % dt.alignment:
            raise ValueError("offset %d is not aligned to %s (%d bytes)"
                             % (offset, dt, dt.alignment))
        view = self.memoryview(offset, count * dt.itemsize)
        return np.frombuffer(view, dtype=dt, count=count).reshape(dims)

    def torch(self, dtype: "torch.dtype", shape: ShapeLike, offset: int = 0) -> "torch.Tensor":
        """A contiguous CPU torch VIEW of `shape` elements of `dtype` at byte `offset` (needs
        torch). TypeError for a dtype that is not a torch.dtype; ValueError as for numpy()."""
        try:
            import torch
        except ImportError as e:
            raise ImportError("SharedBuffer.torch() needs torch (pip install torch)") from e
        if not isinstance(dtype, torch.dtype):
            raise TypeError("dtype must be a torch.dtype (e.g. torch.float16), got %r" % (dtype,))
        dims = _normalize_shape(shape)
        count = 1
        for d in dims:
            count *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        offset = _check_int(offset, "offset")
        self._check_range(offset, count * itemsize)
        if offset % itemsize:
            raise ValueError("offset %d is not aligned to %s (%d bytes)" % (offset, dtype,
                                                                            itemsize))
        if count == 0:
            return torch.empty(dims, dtype=dtype)
        # The memoryview keeps the mapping exported for as long as the tensor lives, so close()
        # cannot unmap memory under it.
        view = self.memoryview(offset, count * itemsize)
        return torch.frombuffer(view, dtype=dtype, count=count).view(dims)

    # -- slices ----------------------------------------------------------------------------
    def slice(self, offset: int = 0, length: Optional[int] = None) -> Slice:
        """The Slice of [offset, offset+length) (default: to the end), checked against the
        buffer's bounds."""
        offset = _check_int(offset, "offset")
        if length is None:
            length = self.size - offset
        return Slice(self.id, offset, length, self)

    def slice_of(self, view: Any) -> Slice:
        """The Slice covering a numpy array or CPU torch tensor that is a view of this buffer.
        Raises ValueError when it is not contiguous or not inside the buffer."""
        self._check_open()
        address, nbytes = _address_of(view)
        base = self._mapping.address
        if address < base or address + nbytes > base + self.size:
            raise ValueError("the %s does not lie inside shared buffer %s (id %d)"
                             % (type(view).__name__, self.name, self.id))
        return Slice(self.id, address - base, nbytes, self)

    # -- lifecycle -------------------------------------------------------------------------
    def reregister(self) -> int:
        """Registers the buffer again (e.g. after the daemon restarted) and returns the new id.
        Slices made before carry the old id: make new ones."""
        self._check_open()
        with self._lock:
            self.id = self._register(self.name, self.size)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, _finalize, self._mapping,
                                               _bind_unregister(self._unregister, self.id))
        return self.id

    def close(self) -> None:
        """Unregisters from the daemon (errors ignored if it is gone), unlinks the shm name and
        unmaps (once no numpy/torch view is left). Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._finalizer()

    def __enter__(self) -> "SharedBuffer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "SharedBuffer(id=%s, name=%r, size=%d%s)" % (self.id, self.name, self.size,
                                                            ", closed" if self.closed else "")


def _bind_unregister(unregister: Callable[[int], None], buffer_id: int) -> Callable[[], None]:
    return lambda: unregister(buffer_id)


def _address_of(view: Any) -> Tuple[int, int]:
    """(address, nbytes) of a C-contiguous numpy array or CPU torch tensor."""
    mod = type(view).__module__
    if mod.startswith("torch"):
        if view.device.type != "cpu":
            raise ValueError("tensor is on %s; only CPU tensors can be views of a shared buffer"
                             % view.device)
        if not view.is_contiguous():
            raise ValueError("tensor is not contiguous (strides %s); use a contiguous view"
                             % (tuple(view.stride()),))
        return view.data_ptr(), view.numel() * view.element_size()
    import numpy as np  # a dependency; imported late to keep `import mcstore` light
    if isinstance(view, np.ndarray):
        if not view.flags["C_CONTIGUOUS"]:
            raise ValueError("numpy array is not C-contiguous (strides %s)" % (view.strides,))
        return view.__array_interface__["data"][0], view.nbytes
    raise TypeError("expected a numpy array or a torch tensor, got %s" % type(view).__name__)
