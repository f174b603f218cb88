"""BufferPool: fixed-size blocks of one registered SharedBuffer, handed out and taken back.

For callers that read objects of a known maximum size without managing offsets themselves:

    pool = BufferPool(client, block_size=2 << 20, blocks=64)
    with pool.acquire() as blk:
        [r] = client.get([key], into=[blk.slice(0, size)])
        arr = blk.numpy(np.float16, (size // 2,))   # a view of the block: no copy
"""

from __future__ import annotations

import threading
from typing import Any, List, Optional

from mcstore._buffers import SharedBuffer, ShapeLike, Slice, _check_int


class Block:
    """One block of a BufferPool: `index`, `offset` (in the pool's buffer), `size`. Views and
    slices are relative to the block and checked against its bounds. release() (or leaving a
    `with`) gives it back; using it after that raises ValueError."""

    def __init__(self, pool: "BufferPool", index: int) -> None:
        self.pool = pool
        self.index = index
        self.size = pool.block_size
        self.offset = index * pool.block_size
        self._released = False

    def _range(self, offset: int, length: int) -> int:
        if self._released:
            raise ValueError("block %d was released to its pool" % self.index)
        offset = _check_int(offset, "offset")
        length = _check_int(length, "length")
        if offset < 0 or length < 0 or offset > self.size or length > self.size - offset:
            raise ValueError("range [%d, %d) is outside a pool block of %d bytes"
                             % (offset, offset + length, self.size))
        return self.offset + offset

    def slice(self, offset: int = 0, length: Optional[int] = None) -> Slice:
        if length is None:
            length = self.size - _check_int(offset, "offset")
        return self.pool.buffer.slice(self._range(offset, length), length)

    def numpy(self, dtype: Any, shape: ShapeLike, offset: int = 0) -> Any:
        view = self.pool.buffer.numpy(dtype, shape, self.offset + _check_int(offset, "offset"))
        self._range(offset, view.nbytes)
        return view

    def torch(self, dtype: Any, shape: ShapeLike, offset: int = 0) -> Any:
        view = self.pool.buffer.torch(dtype, shape, self.offset + _check_int(offset, "offset"))
        self._range(offset, view.numel() * view.element_size())
        return view

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.pool._give_back(self.index)

    def __enter__(self) -> "Block":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class BufferPool:
    """`blocks` blocks of `block_size` bytes in one SharedBuffer registered with `client` (a
    Client, or an AsyncClient's buffers via its sync control client). Thread-safe."""

    def __init__(self, client: Any, block_size: int, blocks: int) -> None:
        block_size = _check_int(block_size, "block_size")
        blocks = _check_int(blocks, "blocks")
        if block_size <= 0 or blocks <= 0:
            raise ValueError("block_size and blocks must be > 0")
        control = getattr(client, "_control", client)
        self.block_size = block_size
        self.blocks = blocks
        self.buffer: SharedBuffer = control.create_buffer(block_size * blocks)
        self._free: List[int] = list(range(blocks - 1, -1, -1))
        self._cond = threading.Condition()

    def acquire(self, timeout: Optional[float] = None) -> Block:
        """A free block; waits up to `timeout` seconds (None: forever) and raises TimeoutError
        when none came free."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._free) or self.buffer.closed, timeout):
                raise TimeoutError("no free block in the pool after %ss" % timeout)
            if self.buffer.closed:
                raise ValueError("the pool is closed")
            return Block(self, self._free.pop())

    def free_blocks(self) -> int:
        with self._cond:
            return len(self._free)

    def _give_back(self, index: int) -> None:
        with self._cond:
            self._free.append(index)
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self.buffer.close()
            self._cond.notify_all()

    def __enter__(self) -> "BufferPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
