"""Worker side of MCStoreConnector: the loads and saves of blocks between the paged KV tensors
(kv_memory.py's KVMemory: host shared memory or GPU buffers) and mcstore (WorkerSide).

One WorkerSide per vLLM worker process, created by MCStoreConnector for the WORKER role; the
scheduler side is in scheduler.py, the metadata passed between the two and the stats in
connector.py.
"""
from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Optional

import torch

from mcstore.vllm import blocks as B
from mcstore.vllm.kv_memory import KVMemory, fake_gpu_handle
from mcstore.vllm.connector import (
    BlockRef,
    LoadJob,
    MCStoreConnectorMetadata,
    MCStoreConnectorStats,
    MCStoreWorkerMetadata,
    SaveJob,
    _attention_spec,
    _client,
    log,
)

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

    from mcstore._gpu import GpuBuffer
    from mcstore.vllm.connector import MCStoreConnector

_NO_BLOCK = object()    # before the first block of a job: no parent digest to reuse


class WorkerSide:
    def __init__(self, conn: MCStoreConnector) -> None:
        self.conn = conn
        self.cfg = conn._cfg
        rank = 0
        if conn._namespaces[0].shard != "mla" and len(conn._namespaces) > 1:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            rank = get_tensor_model_parallel_rank()
        self.rank = rank
        self.ns = conn._namespaces[rank]
        self.prefix = self.ns.key_prefix()
        self.ns_digest = self.ns.digest()
        # MLA: ranks hold the same bytes; rank 0 saves, every rank loads.
        self.saves_enabled = bool(self.cfg["save"]) and (self.ns.shard != "mla" or rank == 0)
        self.lease_index = 0 if self.ns.shard == "mla" else rank
        self.client = _client(self.cfg)
        self.mem: Optional[KVMemory] = None
        self.buffer_ids: list[int] = []
        self.gpu_buffers: list[GpuBuffer] = []   # per storage when the KV cache is on a GPU
        self.headers = None     # SharedBuffer: [load slots | save slots], HEADER_SIZE each
        # Block layouts (header slot + KV runs) for loads and saves: one request names the runs
        # once and each block by its id. None when the daemon predates block layouts (the
        # probe says so): then PreparedSlices per block id, made on first use.
        self._load_layout = None
        self._save_layout = None
        self._prepared_loads: dict[int, object] = {}   # block id -> PreparedSlices
        self._prepared_saves: dict[int, object] = {}
        self.pool = ThreadPoolExecutor(max_workers=max(1, int(self.cfg["io_threads"])),
                                       thread_name_prefix="mcstore-kv")
        self.lock = threading.Lock()
        self.loads: dict[str, Future] = {}          # req id -> load future
        self.saves: dict[str, list[Future]] = defaultdict(list)
        self.finishing: set[str] = set()
        self.load_errors: set[int] = set()
        self.interval = MCStoreConnectorStats()
        self.totals: dict[str, float] = defaultdict(float)
        self.stored: list[bytes] = []
        self.removed: list[bytes] = []
        self.failed: list[tuple[str, bytes]] = []   # (request, block hash) of failed loads
        self.store_down = False     # found the daemon unreachable or restarted since last step
        # Registration with the daemon (buffers, header slots, block layouts): redone when the
        # daemon restarted under us (SessionLostError); reg_gen counts the registrations, so
        # threads that met the same loss re-register once. reg_lock guards the ids and layouts.
        self.reg_lock = threading.RLock()
        self.reg_gen = 0
        self.next_reregister = 0.0
        self.saves_paused_until = 0.0   # the store unavailable: saves skipped until then
        # (req, block id, hash) of each block loaded OK / saved, kept only with record_blocks
        # (tests, debugging): they grow with every block moved.
        self.record_blocks = bool(self.cfg["record_blocks"])
        self.loaded_log: list[tuple[str, int, bytes]] = []
        self.saved_log: list[tuple[str, int, bytes]] = []
        self.load_times: list[float] = []   # seconds of each load job, likewise
        self.fault_hook = None      # tests: called with (block_id) after a load, before checks

    # -- setup -----------------------------------------------------------------------------
    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        kcc = self.conn._kv_cache_config
        group, spec = _attention_spec(kcc)
        self.mem = KVMemory(kv_caches, list(group.layer_names), kcc.num_blocks,
                             spec.page_size_bytes, fake_gpu=bool(self.cfg["fake_gpu"]))
        with self.reg_lock:
            self._register_with_daemon(self._while_unavailable, layouts=True)
        self._check_bound_views()
        log.info("mcstore: %d KV layers, %d blocks of %d bytes in %d slice(s) each, %s",
                 len(self.mem.layers), self.mem.num_blocks, self.mem.block_bytes,
                 self.mem.runs_per_block,
                 "shared memory %s" % [s.shm_name for s in self.mem.storages]
                 if self.mem.device == "host" else "%d GPU buffer(s) on %s%s" % (
                     len(self.gpu_buffers), self.mem.torch_device,
                     " (FAKE GPU: tests only)" if self.mem.device == "fake-gpu" else ""))
        self._probe_layout()

    def _register_with_daemon(self, call, layouts: bool) -> None:
        """Registers the KV memory and the header slots with the daemon (`call(fn, *args)`
        runs each registration) and makes the block layouts over the new ids (or keeps using
        per-block slices when `layouts` is False: a daemon without block layouts). Under
        reg_lock. At start-up, and again after the daemon restarted (_reregister)."""
        self._close_gpu_buffers()
        if self.mem.on_gpu:
            self.gpu_buffers = [call(self._register_gpu, i)
                                for i in range(len(self.mem.storages))]
            self.buffer_ids = [g.buffer_id for g in self.gpu_buffers]
            self.totals["gpu_buffers"] = len(self.gpu_buffers)
        else:
            self.buffer_ids = [call(self.client.register_buffer, s.shm_name, s.shm_size)
                               for s in self.mem.storages]
        if self.headers is None:
            self.headers = call(self.client.create_buffer, 2 * self.mem.num_blocks * B.HEADER_SIZE)
        else:   # the same memory (saves' header slots stay written), a new id
            call(self.headers.reregister)
        self._prepared_loads.clear()   # they name the buffers registered before, if any
        self._prepared_saves.clear()
        if not layouts:
            self._load_layout = self._save_layout = None
            return
        kv_runs = self.mem.layout_runs(self.buffer_ids)
        self._load_layout = self.client.block_layout(
            [(self.headers.slice(self._header_slot(0, False), B.HEADER_SIZE), B.HEADER_SIZE)]
            + kv_runs)
        self._save_layout = self.client.block_layout(
            [(self.headers.slice(self._header_slot(0, True), B.HEADER_SIZE), B.HEADER_SIZE)]
            + kv_runs)

    def _reregister(self, seen_gen: int) -> bool:
        """After SessionLostError (the daemon restarted and knows none of our buffers): registers
        everything again, once for all the threads that met the same loss (seen_gen), at most
        every unavailable_backoff_s while it fails. True when the registration is fresh."""
        with self.reg_lock:
            if self.reg_gen != seen_gen:
                return True
            now = time.monotonic()
            if now < self.next_reregister:
                return False
            try:
                self._register_with_daemon(lambda fn, *a: fn(*a),
                                           layouts=self._load_layout is not None)
            except Exception as e:
                self.next_reregister = now + max(0.5, float(self.cfg["unavailable_backoff_s"]))
                self.store_down = True
                log.warning("mcstore: registering the KV cache again with %s failed (%s); loads "
                            "are misses and saves are skipped until it works",
                            self.cfg["address"], e)
                return False
            self.reg_gen += 1
        with self.lock:
            self._count({"reregistrations": 1})
        log.warning("mcstore: daemon %s restarted: the KV cache is registered again (%d "
                    "buffer(s)); loads and saves go on", self.cfg["address"],
                    len(self.buffer_ids))
        return True

    def _with_registration(self, fn):
        """fn() (a Store call naming our buffers); after SessionLostError the KV cache is
        registered again and fn() runs once more (it must rebuild its slices)."""
        from mcstore import SessionLostError
        gen = self.reg_gen
        try:
            return fn()
        except SessionLostError:
            if not self._reregister(gen):
                raise
            return fn()

    def _register_gpu(self, i: int):
        """Storage i lent to the daemon as one GPU buffer: by CUDA IPC on a GPU (the daemon's
        --cuda_device must be the same GPU: the device UUID is sent and checked), by a fake
        handle with fake_gpu."""
        s = self.mem.storages[i]
        if self.mem.device == "fake-gpu":
            return self.client.register_gpu_handle(fake_gpu_handle(s.shm_name), s.nbytes,
                                                   allocation_offset=s.shm_offset,
                                                   keep=self.mem.tensors)
        index = self.mem.torch_device.index
        index = torch.cuda.current_device() if index is None else index
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        device = self.cfg["cuda_device"]
        return self.client.register_cuda(self.mem.storage_tensor(i),
                                         device=None if device is None else int(device),
                                         device_uuid=str(uuid) if uuid is not None else None)

    def _close_gpu_buffers(self) -> None:
        for g in self.gpu_buffers:
            try:
                g.close()
            except Exception as e:   # the daemon drops them with the connection anyway
                log.debug("mcstore: unregistering GPU buffer %s failed: %s", g, e)
        self.gpu_buffers = []

    def _while_unavailable(self, fn, *args):
        """fn(*args), retried while the daemon answers UNAVAILABLE (starting, restarting, or
        too busy to finish a connection) for up to connect_wait_s; then its error stands."""
        from mcstore import UnavailableError
        deadline = time.monotonic() + float(self.cfg["connect_wait_s"])
        while True:
            try:
                return fn(*args)
            except UnavailableError as e:
                if time.monotonic() >= deadline:
                    raise
                log.warning("mcstore: daemon %s unavailable at start-up (%s); retrying for up "
                            "to %.0f s more", self.cfg["address"], e,
                            deadline - time.monotonic())
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def _probe_layout(self) -> None:
        """Measures, not assumes, that the slices name the tensors' bytes: block 0 (vLLM's
        null block, never a real request's) gets a random pattern through the tensors, is put
        through its slices, read back inline from the daemon and compared with the tensors'
        bytes in logical order; then the block is restored and the probe object removed."""
        tensors = self.mem.tensors
        saved = [t[0].clone() for t in tensors]
        key = self.prefix + b"layout-probe-" + os.urandom(8).hex().encode()
        try:
            gen = torch.Generator().manual_seed(1234)
            for t in tensors:
                t[0].copy_(torch.randint(0, 255, t[0].shape, generator=gen,
                                         dtype=torch.uint8).to(t.dtype))
            expected = self._block0_bytes()
            self.mem.synchronize()   # the daemon reads the tensors on its own streams
            res = self.client.put([key], [self.mem.block_slices(self.buffer_ids, 0)])
            if not res[0].ok:
                raise RuntimeError("layout probe put failed: %s %s" % (res[0].code.name,
                                                                      res[0].message))
            got = self.client.get([key])[0]
            if not got.ok or got.data != expected:
                raise RuntimeError("layout probe: the bytes mcstore read through the slices "
                                   "differ from the KV tensors' (%s); refusing to run"
                                   % (got.code.name if not got.ok else "content"))
            self._probe_block_layouts(key + b"-layout", expected)
        finally:
            for t, v in zip(tensors, saved):
                t[0].copy_(v)
            self.mem.synchronize()
            try:
                self.client.remove([key, key + b"-layout"])
            except Exception:
                pass

    def _probe_block_layouts(self, key: bytes, expected: bytes) -> None:
        """Block 0 through the block layouts: put through the save layout, it must read back
        inline as its save header slot and KV bytes, and a get through the load layout must
        write it whole. An mc-client older than block layouts fails this (it stores an empty
        object, answers the get inline): the layouts are then dropped for per-block slices."""
        hdr = bytes(self.headers.memoryview(self._header_slot(0, True), B.HEADER_SIZE))
        put = self.client.put([key], self._save_layout.blocks([0]))[0]
        if not put.ok:
            why = "put: %s %s" % (put.code.name, put.message)
        else:
            got = self.client.get([key])[0]
            if not got.ok or got.data != hdr + expected:
                why = "read back: %s" % (got.code.name if not got.ok else
                                         "%d bytes differ from the block's" % len(got.data))
            else:
                # Block 0 zeroed first: what the get wrote through the load layout is compared,
                # not what the put left there.
                for t in self.mem.tensors:
                    t[0].zero_()
                self.mem.synchronize()
                back = self.client.get([key], into=self._load_layout.blocks([0]))[0]
                if back.ok and self._block0_bytes() == expected:
                    return
                if back.ok:
                    raise RuntimeError("layout probe: a get through the block layout wrote "
                                       "other bytes than the KV block's; refusing to run")
                why = "get: %s %s" % (back.code.name, back.message)
        log.warning("mcstore: daemon %s does not serve block layouts (%s; an mc-client older "
                    "than this connector?): loads and saves name each block's slices instead, "
                    "at a higher cost per block", self.cfg["address"], why)
        self._load_layout = self._save_layout = None

    def _block0_bytes(self) -> bytes:
        """Block 0 of every KV tensor, in logical order (copied to the host from a GPU)."""
        return b"".join(t[0].contiguous().cpu().view(torch.uint8).numpy().tobytes()
                        for t in self.mem.tensors)

    def _check_bound_views(self) -> None:
        """Every KV tensor the attention layers use must now live in the shared storage."""
        ranges = [(s.ptr, s.ptr + s.nbytes) for s in self.mem.storages]
        ctx = getattr(self.conn._vllm_config.compilation_config, "static_forward_context", {})
        for name in self.mem.layer_names:
            layer = ctx.get(name)
            kv = getattr(layer, "kv_cache", None)
            kvs = kv if isinstance(kv, (list, tuple)) else [kv]
            for t in kvs:
                if isinstance(t, torch.Tensor) and t.numel():
                    p = t.untyped_storage().data_ptr()
                    if not any(a <= p < b for a, b in ranges):
                        raise RuntimeError("layer %s computes on a KV tensor outside the "
                                           "shared memory mcstore reads" % name)

    def _header_slot(self, block_id: int, save: bool) -> int:
        return ((self.mem.num_blocks if save else 0) + block_id) * B.HEADER_SIZE

    def _blocks(self, block_ids: list[int], save: bool):
        """The destinations (a load) or sources (a save) of these blocks, header slot first:
        the block layout's blocks, or each block's PreparedSlices without one."""
        with self.reg_lock:
            layout = self._save_layout if save else self._load_layout
            if layout is not None:
                return layout.blocks(block_ids)
            return [self._prepared(b, save) for b in block_ids]

    def _prepared(self, block_id: int, save: bool):
        """The block's header slot and KV runs as PreparedSlices, made once per block id and
        direction (the geometry never changes; each use re-checks only the two buffers)."""
        cache = self._prepared_saves if save else self._prepared_loads
        p = cache.get(block_id)
        if p is None:
            p = self.client.prepare_slices(
                [self.headers.slice(self._header_slot(block_id, save), B.HEADER_SIZE)]
                + self.mem.block_slices(self.buffer_ids, block_id))
            cache[block_id] = p
        return p

    def _key(self, h: bytes) -> bytes:
        return B.block_key(self.prefix, h)

    def _header(self, ref: BlockRef) -> B.BlockHeader:
        return B.BlockHeader(self.ns_digest, ref.block_hash, ref.parent_hash, ref.tokens,
                             ref.num_tokens, self.mem.block_bytes)

    def _packed_headers(self, refs: list[BlockRef]) -> list[bytes]:
        """The header each block is stored with (what _header(ref).pack() gives), in order. A
        block's parent is usually the block before it in the job, whose key digest is then its
        parent digest: one digest per block instead of two."""
        ns, payload, pack, digest = self.ns_digest, self.mem.block_bytes, B.pack_header, B.digest16
        out = []
        prev_hash: object = _NO_BLOCK
        prev_digest = b""
        for r in refs:
            key_digest = digest(bytes(r.block_hash))
            parent_digest = (prev_digest if r.parent_hash == prev_hash
                             else digest(bytes(r.parent_hash)))
            out.append(pack(ns, key_digest, parent_digest, r.tokens, r.num_tokens, payload))
            prev_hash, prev_digest = r.block_hash, key_digest
        return out

    # -- loads -----------------------------------------------------------------------------
    def start_loads(self, meta: MCStoreConnectorMetadata) -> None:
        if not meta.loads:
            return
        sync = not self.cfg["load_async"]
        # A step that computes nothing has this thread idle until a transfer completes
        # (_wait_while_idle): a lone load then runs here, without the hand-off to a pool
        # thread and back. Loads beside a forward, or several at once, go to the pool.
        inline = not sync and meta.idle and len(meta.loads) == 1
        ready = self._ready_event()
        for job in meta.loads:
            if inline:
                fut = Future()
                try:
                    fut.set_result(self._load(job, ready))
                except Exception as e:   # _load reports its own errors; this is a bug
                    fut.set_exception(e)
            else:
                fut = self.pool.submit(self._load, job, ready)
            if sync:
                self._finish_load(job.req_id, fut)
            else:
                with self.lock:
                    self.loads[job.req_id] = fut

    def _ready_event(self) -> Optional[object]:
        return self.mem.ready_event() if self.mem is not None else None

    def _load(self, job: LoadJob, ready: Optional[object] = None
              ) -> tuple[set[int], dict[str, float], list[bytes]]:
        t0 = time.perf_counter()
        failed: set[int] = set()
        removed: list[bytes] = []
        st = defaultdict(float)
        lease = job.leases[self.lease_index] if self.lease_index < len(job.leases) else 0
        try:
            keys = [self._key(r.block_hash) for r in job.blocks]
            if ready is not None:
                ready.synchronize()   # kernels queued before the load are done with its blocks
            ids = [r.block_id for r in job.blocks]
            results = self._with_registration(
                lambda: self.client.get(keys, into=self._blocks(ids, False), lease=lease or None))
            headers = self.headers.memoryview(0, self.mem.num_blocks * B.HEADER_SIZE)  # load slots
            loaded = 0
            for r, res, expected in zip(job.blocks, results, self._packed_headers(job.blocks)):
                if self.fault_hook is not None:
                    self.fault_hook(self, r.block_id)
                why = None
                if not res.ok:
                    why = "%s: %s" % (res.code.name, res.message)
                else:
                    slot = self._header_slot(r.block_id, False)
                    raw = headers[slot:slot + B.HEADER_SIZE]
                    # The common case is one compare with the header this block is saved with;
                    # only a mismatch is parsed, to say which field differs.
                    if raw != expected:
                        why = self._header(r).check(raw) or "header differs"
                        st["load_header_mismatch_blocks"] += 1
                if why is None:
                    loaded += 1
                    if self.record_blocks:
                        self.loaded_log.append((job.req_id, r.block_id, r.block_hash))
                else:
                    failed.add(r.block_id)
                    removed.append(r.block_hash)
                    log.warning("mcstore: block %d of request %s not loaded (%s); vLLM "
                                "recomputes it", r.block_id, job.req_id, why)
            st["load_blocks"] += loaded
            st["load_bytes"] += loaded * self.mem.block_bytes
        except Exception as e:
            failed.update(r.block_id for r in job.blocks)
            self._note_store_error(e)
            log.warning("mcstore: load of %d blocks for request %s failed (%s); vLLM recomputes "
                        "them", len(job.blocks), job.req_id, e)
        elapsed = time.perf_counter() - t0
        st["load_s"] += elapsed
        if self.record_blocks:
            self.load_times.append(elapsed)
        if lease:
            # Off the load's completion path: the request may resume now; the keys stay
            # pinned a moment longer (at most the lease TTL if the release fails).
            try:
                self.pool.submit(self._release_lease, lease)
            except RuntimeError:   # the pool is shutting down
                self._release_lease(lease)
        st["load_error_blocks"] += len(failed)
        if failed:
            # The scheduler looks these blocks up no more for this request (vLLM recomputes
            # them), nor for any request for a while (negative_cache_s).
            hashes = [r.block_hash for r in job.blocks if r.block_id in failed]
            with self.lock:
                self.failed.extend((job.req_id, h) for h in hashes)
        return failed, st, removed

    def _release_lease(self, lease) -> None:
        """Releases the scheduler's lease with its capability; a release the daemon refuses
        (or cannot take) is counted (lease_release_failures): the lease then pins its keys until
        its TTL, which is what this must not do."""
        try:
            released = self.client.release_lease(lease)
        except Exception as e:
            released = False
            log.debug("mcstore: releasing lease %r failed (%s); it ends at its TTL", lease, e)
        if not released:
            with self.lock:
                self._count({"lease_release_failures": 1})

    def _pause_saves(self) -> None:
        """Saves are skipped for unavailable_backoff_s (counted save_skipped_blocks), and the
        scheduler pauses its lookups as long."""
        self.saves_paused_until = time.monotonic() + float(self.cfg["unavailable_backoff_s"])
        self.store_down = True

    def _note_store_error(self, e: BaseException) -> None:
        """A whole call failed: if the daemon is down or restarted, the scheduler is told (it
        then answers lookups as misses for a while instead of scheduling loads that fail)."""
        from mcstore import SessionLostError, UnavailableError
        if isinstance(e, (UnavailableError, SessionLostError)):
            self.store_down = True

    def _finish_load(self, req_id: str, fut: Future) -> None:
        failed, st, removed = fut.result()
        with self.lock:
            self.load_errors.update(failed)
            self.removed.extend(removed)
            self._count(st)

    def _count(self, st: dict[str, float]) -> None:
        for k, v in st.items():
            self.interval.data[k] = self.interval.data.get(k, 0) + v
            self.totals[k] += v

    # -- saves -----------------------------------------------------------------------------
    def start_saves(self, meta: MCStoreConnectorMetadata) -> None:
        if not meta.saves or self.mem is None:
            return
        ready = self._ready_event() if self.saves_enabled else None
        for job in meta.saves:
            if not self.saves_enabled:
                fut: Future = Future()
                fut.set_result(({}, []))
            else:
                # The headers are written now, on this thread: the job's slots are its own.
                for r, packed in zip(job.blocks, self._packed_headers(job.blocks)):
                    self.headers.memoryview(self._header_slot(r.block_id, True),
                                            B.HEADER_SIZE)[:] = packed
                fut = self.pool.submit(self._save, job, ready)
            with self.lock:
                self.saves[job.req_id].append(fut)

    def _save(self, job: SaveJob, ready: Optional[object] = None
              ) -> tuple[dict[str, float], list[bytes]]:
        t0 = time.perf_counter()
        st = defaultdict(float)
        stored: list[bytes] = []
        if time.monotonic() < self.saves_paused_until:
            # The store was found unavailable moments ago: a cache skips the save (a later
            # miss) instead of sending every block into the same failure.
            st["save_skipped_blocks"] += len(job.blocks)
            return st, stored
        try:
            keys = [self._key(r.block_hash) for r in job.blocks]
            if ready is not None:
                ready.synchronize()   # the forward that wrote these blocks has finished
            ids = [r.block_id for r in job.blocks]
            replicas = int(self.cfg["replicas"]) or None
            results = self._with_registration(
                lambda: self.client.put(keys, self._blocks(ids, True), replicas=replicas))
            for r, res in zip(job.blocks, results):
                if res.ok:
                    st["save_blocks"] += 1
                    st["save_bytes"] += self.mem.block_bytes
                    stored.append(r.block_hash)
                    if self.record_blocks:
                        self.saved_log.append((job.req_id, r.block_id, r.block_hash))
                elif res.code.name == "ALREADY_EXISTS":
                    st["save_existing_blocks"] += 1
                    stored.append(r.block_hash)
                else:
                    st["save_error_blocks"] += 1
                    if res.code.name == "UNAVAILABLE":
                        self._pause_saves()   # the daemon answers, its master does not
                    log.warning("mcstore: save of block %d (request %s) failed: %s: %s",
                                r.block_id, job.req_id, res.code.name, res.message)
        except Exception as e:
            st["save_error_blocks"] += len(job.blocks)
            self._note_store_error(e)
            from mcstore import SessionLostError, UnavailableError
            if isinstance(e, (UnavailableError, SessionLostError)):
                self._pause_saves()
            log.warning("mcstore: save of %d blocks for request %s failed: %s",
                        len(job.blocks), job.req_id, e)
        st["save_s"] += time.perf_counter() - t0
        return st, stored

    def drain_saves(self, req_ids: Optional[set[str]] = None) -> None:
        """Waits for the in-flight saves of `req_ids` (default: all)."""
        with self.lock:
            futs = [f for rid, fs in self.saves.items() if req_ids is None or rid in req_ids
                    for f in fs]
        for f in futs:
            f.exception()   # waits; errors are counted by the job itself

    # -- completion ------------------------------------------------------------------------
    def finished(self, finished_req_ids: set[str], idle: bool = False):
        done_recving: set[str] = set()
        done_sending: set[str] = set()
        if idle:
            self._wait_while_idle()
        with self.lock:
            loads = [(rid, f) for rid, f in self.loads.items() if f.done()]
            for rid, _ in loads:
                del self.loads[rid]
        for rid, f in loads:
            self._finish_load(rid, f)
            done_recving.add(rid)
        with self.lock:
            self.finishing.update(finished_req_ids)
            for rid in list(self.saves):
                futs = self.saves[rid]
                done = [f for f in futs if f.done()]
                for f in done:
                    st, stored = f.result()
                    self._count(st)
                    self.stored.extend(stored)
                    futs.remove(f)
                if not futs and rid in self.finishing:
                    del self.saves[rid]
                    self.finishing.discard(rid)
                    done_sending.add(rid)
            # Finished requests that never saved need no answer.
            self.finishing &= set(self.saves)
        return (done_sending or None), (done_recving or None)

    def _wait_while_idle(self) -> None:
        """A step that scheduled no tokens is vLLM polling for transfers: instead of returning
        at once (the engine loop then spins, holding the GIL the transfer threads need to
        finish), block until one transfer completes or idle_wait_ms passes. Returns at once
        when one is already done or none is in flight."""
        wait_s = float(self.cfg["idle_wait_ms"]) / 1e3
        if wait_s <= 0:
            return
        with self.lock:
            futs = list(self.loads.values())
            for rid in self.finishing:
                futs.extend(self.saves.get(rid, ()))
        if not futs or any(f.done() for f in futs):
            return
        t0 = time.perf_counter()
        wait(futs, timeout=wait_s, return_when=FIRST_COMPLETED)
        self.totals["idle_wait_s"] += time.perf_counter() - t0

    def take_load_errors(self) -> set[int]:
        with self.lock:
            errs, self.load_errors = self.load_errors, set()
        return errs

    def take_stats(self) -> Optional[KVConnectorStats]:
        with self.lock:
            if self.interval.is_empty():
                return None
            st, self.interval = self.interval, MCStoreConnectorStats()
        return st

    def take_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        with self.lock:
            if not self.stored and not self.removed and not self.failed and not self.store_down:
                return None
            m = MCStoreWorkerMetadata(self.stored, self.removed, self.failed, self.store_down)
            self.stored, self.removed, self.failed = [], [], []
            self.store_down = False
        return m

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
        self._close_gpu_buffers()
        try:
            if self.headers is not None:
                self.headers.close()
            self.client.close()
        except Exception:
            pass
