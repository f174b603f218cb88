"""The paged KV tensors of one vLLM worker as mcstore sees them (KVMemory): where they live
(host shared memory, a CUDA device, or the tests' fake GPU), how they are lent to the daemon,
and the byte ranges of each block read from their strides. Used by worker.py's WorkerSide."""
from __future__ import annotations

import os
from typing import NamedTuple, Optional

import torch

from mcstore.vllm import blocks as B


class KVStorage(NamedTuple):
    """One storage holding KV tensors: where it is and, in host memory, the shared-memory
    object it lives in."""
    ptr: int                  # data_ptr() of the storage's first byte
    nbytes: int
    shm_name: Optional[str]   # host memory: the POSIX shm object; None on a GPU
    shm_size: int             # bytes of that object
    shm_offset: int           # where the storage's first byte is inside it


# kv_connector_extra_config "fake_gpu": tests only. Host KV tensors are registered as GPU
# buffers (CUDA IPC handles naming their shm objects) with mc-client-fakegpu, the daemon built
# on the fake CUDA device of tests/fakes/shm_fake_cuda.h, so that a CPU engine drives the
# connector's GPU path and every GPU path of the daemon. A real mc-client refuses the handles.
FAKE_GPU_HANDLE_MAGIC = b"MCFAKESHM:"


def fake_gpu_handle(shm_name: str) -> bytes:
    from mcstore._gpu import CUDA_IPC_HANDLE_BYTES
    raw = FAKE_GPU_HANDLE_MAGIC + shm_name.encode()
    if len(raw) >= CUDA_IPC_HANDLE_BYTES:
        raise ValueError("shm name %r too long for a fake GPU handle" % shm_name)
    return raw.ljust(CUDA_IPC_HANDLE_BYTES, b"\0")


class KVMemory:
    """The paged KV tensors and the byte ranges of each block read from their strides.

    Host tensors are moved into shared memory registered with the daemon ("host"); tensors on
    a CUDA device stay where they are and are lent to the daemon by CUDA IPC ("cuda"; the
    daemon copies blocks between them and its segments on its own streams, docs/gpu.md);
    "fake-gpu" is the tests' host memory posing as GPU memory (fake_gpu above)."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], layer_names: list[str],
                 num_blocks: int, page_bytes: int, fake_gpu: bool = False) -> None:
        self.layer_names = [n for n in layer_names if n in kv_caches]
        if len(self.layer_names) != len(kv_caches):
            extra = sorted(set(kv_caches) - set(layer_names))
            raise ValueError("KV tensors for layers outside the KV cache group: %s" % extra)
        self.tensors = [kv_caches[n] for n in self.layer_names]
        self.num_blocks = num_blocks
        devices = {t.device for t in self.tensors}
        if len(devices) != 1:
            raise ValueError("MCStoreConnector needs every KV tensor on one device; got %s"
                             % sorted(str(d) for d in devices))
        self.torch_device = next(iter(devices))
        if self.torch_device.type == "cuda":
            if fake_gpu:
                raise ValueError("fake_gpu is for host KV tensors (tests); these are on %s"
                                 % self.torch_device)
            self.device = "cuda"
        elif self.torch_device.type == "cpu":
            self.device = "fake-gpu" if fake_gpu else "host"
        else:
            raise ValueError("MCStoreConnector needs KV tensors in host or CUDA memory; got %s"
                             % self.torch_device)
        self.storages: list[KVStorage] = []
        self._storage_objs: list[torch.UntypedStorage] = []
        seen: dict[int, int] = {}
        for t in self.tensors:
            st = t.untyped_storage()
            if st.data_ptr() in seen:
                continue
            if self.device == "cuda":
                storage = KVStorage(st.data_ptr(), st.nbytes(), None, 0, 0)
            else:
                name, size, offset = self._to_shared(t)
                storage = KVStorage(t.untyped_storage().data_ptr(), st.nbytes(), name, size,
                                    offset)
            seen[storage.ptr] = len(self.storages)
            self.storages.append(storage)
            self._storage_objs.append(t.untyped_storage())
        # Where each storage's first byte is in the buffer it is registered as: its shm object
        # (host), or a GPU buffer starting at the storage.
        self.bases = [s.shm_offset if self.device == "host" else 0 for s in self.storages]
        # Per layer: (storage index, element size, shape, strides, storage offset), dim 0 = block.
        self.layers = []
        for t in self.tensors:
            if t.shape[0] != num_blocks:
                if t.shape[0] % num_blocks:
                    raise ValueError("KV tensor of %d blocks for %d manager blocks"
                                     % (t.shape[0], num_blocks))
                t = t.unflatten(0, (num_blocks, t.shape[0] // num_blocks))  # kernel blocks
            idx = seen[t.untyped_storage().data_ptr()]
            self.layers.append((idx, t.element_size(), tuple(t.shape), tuple(t.stride()),
                                t.storage_offset()))
        self.page_bytes = page_bytes
        # Per layer: block 0's byte runs and the bytes between blocks (dim 0's stride): block b's
        # runs are block 0's shifted by b strides, as block_runs would walk them.
        self._layer_runs = [(idx, B.block_runs(shape, strides, esize, off, 0),
                             strides[0] * esize)
                            for idx, esize, shape, strides, off in self.layers]
        runs = self._runs_unregistered(0)
        total = sum(n for _, _, n in runs)
        if total != page_bytes * len(self.layers):
            raise ValueError("a block spans %d bytes in the KV tensors, the KV cache spec says "
                             "%d x %d" % (total, len(self.layers), page_bytes))
        self.block_bytes = total
        self.runs_per_block = len(runs)

    @property
    def on_gpu(self) -> bool:
        return self.device != "host"

    def storage_tensor(self, i: int) -> torch.Tensor:
        """Storage i as one contiguous uint8 tensor (what a GPU registration exports)."""
        return torch.empty(0, dtype=torch.uint8, device=self.torch_device).set_(
            self._storage_objs[i], 0, (self.storages[i].nbytes,), (1,))

    def ready_event(self) -> Optional[object]:
        """On a GPU: an event recorded on the engine's current stream, so that a transfer
        waits for the kernels queued so far (the forward that wrote a saved block, any earlier
        use of a block a load overwrites) before the daemon touches the bytes. None in host
        memory, where vLLM's CPU kernels have finished when it calls the connector."""
        if self.device != "cuda":
            return None
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.torch_device))
        return ev

    def synchronize(self) -> None:
        """Waits for the engine's queued GPU work (no-op in host memory)."""
        if self.device == "cuda":
            torch.cuda.current_stream(self.torch_device).synchronize()

    @staticmethod
    def _to_shared(t: torch.Tensor) -> tuple[str, int, int]:
        """Moves the tensor's storage into a named shared-memory object, in place: torch swaps
        the storage's data pointer, so every tensor and view on that storage (vLLM's per-layer
        views, kernel-block views, the runner's list) follows. Returns (shm name, size of the
        shm object, offset of the storage's first byte inside it) -- torch keeps a small
        refcount header in front of the data, so the offset is read from /proc/self/maps."""
        st = t.untyped_storage()
        _, handle, _size = st._share_filename_cpu_()
        name = handle.decode() if isinstance(handle, bytes) else str(handle)
        path = "/dev/shm" + name
        ptr = st.data_ptr()
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[5] == path:
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    if lo <= ptr < hi:
                        offset = ptr - lo + int(parts[2], 16)
                        break
            else:
                raise RuntimeError("shared KV storage %s is not mapped from %s" % (name, path))
        size = os.stat(path).st_size
        if offset + st.nbytes() > size:
            raise RuntimeError("shared KV storage %s: %d bytes at offset %d exceed the object's %d"
                               % (name, st.nbytes(), offset, size))
        return name, size, offset

    def _runs_unregistered(self, block: int) -> list[tuple[int, int, int]]:
        runs = []
        for idx, block0, step in self._layer_runs:
            shift = block * step
            runs.extend((idx, o + shift, n) for o, n in block0)
        return B.merge_runs(runs)

    def block_slices(self, buffer_ids: list[int], block: int):
        """The Slices of one block, read from the tensors' strides."""
        from mcstore import Slice
        if block < 0 or block >= self.num_blocks:
            raise ValueError("block id %d outside [0, %d)" % (block, self.num_blocks))
        return [Slice(buffer_ids[i], self.bases[i] + o, n)
                for i, o, n in self._runs_unregistered(block)]

    def layout_runs(self, buffer_ids: list[int]):
        """Block 0's runs, each with the bytes between blocks: block b is every run shifted by
        b strides. Runs merge only where they continue each other for every block (same
        storage, same stride), so a block's bytes come in block_slices' order."""
        from mcstore import Slice
        runs: list[list[int]] = []   # [storage index, offset, length, stride]
        for idx, block0, step in self._layer_runs:
            for o, n in block0:
                last = runs[-1] if runs else None
                if last and last[0] == idx and last[3] == step and last[1] + last[2] == o:
                    last[2] += n
                else:
                    runs.append([idx, o, n, step])
        return [(Slice(buffer_ids[i], self.bases[i] + o, n), step)
                for i, o, n, step in runs]

    def views(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.layer_names, self.tensors))
