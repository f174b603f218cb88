"""MCStoreStorage: SGLang's HiCacheStorage (the L3 tier under its host KV pool) over the Store
service of an mc-client daemon.

What a stored page is, and when a stored page may be loaded, follow the vLLM connector's rules
(mcstore.vllm.blocks, engine-neutral): one object per page, the key = a namespace prefix + SGLang's
page key (the chained SHA-256 of the page's tokens); the namespace digest covers the model's
identity, the KV dtype, the host pool's class, layout and page shape, the page size and the shard
(TP rank, or "mla" where every rank holds the same bytes; PP and context-parallel ranks when used);
every object is a 128-byte BlockHeader and then the page's bytes in SGLang's flat page order. A
load checks the header against the namespace, the key and the size, so an object of another
model, dtype, layout or shard, a torn or corrupted header, or a hash collision with another
namespace is a miss for that page (its result is False), never KV handed to SGLang.

Moving bytes: where SGLang's host pool lives in a memfd (its "shm" allocator, extra_config
"allocator": "shm") and SGLang passes host page indices (extra_config "interface_v1": 1), the
backend lends the memfd to mc-client and names pages as blocks of one BlockLayout whose runs are
read from the pool's strides (any of SGLang's MHA/MLA page layouts): the daemon copies between its
segments and the pool, no copy in this process. Otherwise pages are staged through a shared-memory
buffer of this process (one copy each way).

Thread-safety: SGLang calls a backend from its prefetch, prefetch-I/O and backup threads at once;
mcstore.Client is thread-safe, the zero-copy path keeps one header slot per host page, and each
staging buffer has its own lock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage, HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo)

from mcstore import Client, Code, Slice, StoreError
from mcstore.vllm import blocks as B   # keys, namespaces, headers, byte runs: engine-neutral

log = logging.getLogger("mcstore.sglang")

HASH_SCHEME = "sglang-page-sha256"   # NamespaceSpec.hash_algo: SGLang's chained page keys
HEADER = B.HEADER_SIZE
MAX_KEY_CHARS = 256                  # SGLang's keys are 64 hex digits
STAGE_PAGES = 32                     # pages per staging buffer (the copying path)
# The header's token-digest field: SGLang hands a backend keys, not token ids; its keys are
# already chained digests of every token up to the page's end.
_NO_TOKENS = B.digest16(b"mcstore.sglang: the key is the chained hash of the page's tokens")


class MCStoreStorage(HiCacheStorage):
    """A HiCacheStorage storing SGLang's KV pages in mcstore. Made by SGLang's
    StorageBackendFactory (dynamic backend) as MCStoreStorage(storage_config, kwargs); options
    come from storage_config.extra_config (--hicache-storage-backend-extra-config):

    address       the mc-client's Store address (default $MCSTORE_ADDRESS, else
                  unix:/run/mcstore/client.sock)
    namespace     a deployment name keys start with ("default")
    model_id      the model's identity in the namespace (default: a fingerprint of the model
                  directory's config and weights, or of the hub id)
    model_path    the directory to fingerprint, when SGLang's model_path is not it
    token_file    the daemon's Store token file (TCP only; default $MCSTORE_TOKEN_FILE)
    timeout_s     seconds per daemon call (10)
    replicas      copies of each page (default: the daemon's --replicas)
    """

    def __init__(self, storage_config: HiCacheStorageConfig,
                 kwargs: Optional[Dict[str, Any]] = None) -> None:
        extra = dict(storage_config.extra_config or {})
        if getattr(storage_config, "dcp_size", 1) > 1:
            raise ValueError("mcstore.sglang: decode context parallelism (dcp_size %d) is not "
                             "supported" % storage_config.dcp_size)
        if getattr(storage_config, "should_split_heads", False):
            raise ValueError("mcstore.sglang: tp_lcm_size (pages split by heads across TP "
                             "sizes) is not supported")
        self.config = storage_config
        self.user_namespace = str(extra.get("namespace") or "default")
        self.address = str(extra.get("address") or os.environ.get("MCSTORE_ADDRESS")
                           or "unix:/run/mcstore/client.sock")
        self.replicas = extra.get("replicas")
        self._model_id = extra.get("model_id")
        self._model_path = extra.get("model_path")
        kw: Dict[str, Any] = {}
        if extra.get("token_file"):
            kw["token_file"] = str(extra["token_file"])
        self.client = Client(self.address, timeout_s=float(extra.get("timeout_s", 10.0)), **kw)
        self.mem_pool_host: Any = None
        self.prefix = b""
        self.page_size = 0
        self.page_bytes = 0
        self.zero_copy = False
        self.spec: Optional[B.NamespaceSpec] = None
        self._ns_digest = b""
        self._layout: Any = None
        self._headers: Any = None      # zero copy: one header slot per host page
        self._stages: Dict[str, Tuple[threading.Lock, Any]] = {}
        self._stage_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.stats = {"pages_stored": 0, "pages_loaded": 0, "pages_missed": 0,
                      "header_mismatches": 0, "errors": 0}
        self._last_error_log = 0.0

    # -- attaching the host pool -----------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        host = mem_pool_host
        try:
            page0 = host.get_data_page(0, flat=False)
        except (NotImplementedError, ValueError) as e:
            raise ValueError("mcstore.sglang: host pool %s (layout %s) has no flat page format: "
                             "%s" % (type(host).__name__, host.layout, e)) from e
        self.page_size = int(host.page_size)
        self.page_bytes = page0.numel() * page0.element_size()
        self.spec = namespace_spec(self.config, host, tuple(page0.shape), self.user_namespace,
                                   self._model_id, self._model_path)
        self._ns_digest = self.spec.digest()
        self.prefix = self.spec.key_prefix()
        runs = page_runs(host)
        fd = getattr(host, "fd", None)
        base = fd_offset(fd, host.kv_buffer) if runs is not None and fd is not None else None
        if runs is not None and base is not None:
            self._attach_zero_copy(fd, base, runs, int(host.page_num))
        log.info("mcstore.sglang: %s, %s, pages of %d bytes %s",
                 self.address, self.spec.describe(), self.page_bytes,
                 "zero copy from the host pool's memfd" if self.zero_copy else
                 "staged through a copy (no memfd host pool%s)"
                 % ("" if runs is not None else ", or no strided page layout"))

    def _attach_zero_copy(self, fd: int, base: int, runs: Tuple[List[Tuple[int, int]], int],
                          page_num: int) -> None:
        page_runs_, stride = runs
        size = os.fstat(fd).st_size
        kv_id = self.client.register_fd(fd, size)
        self._headers = self.client.create_buffer(page_num * HEADER)
        layout_runs = [(self._headers.slice(0, HEADER), HEADER)]
        layout_runs += [(Slice(kv_id, base + off, n), stride) for off, n in page_runs_]
        self._layout = self.client.block_layout(layout_runs)
        if self._layout.num_blocks < page_num:
            raise ValueError("mcstore.sglang: the host pool's pages reach past its memfd")
        self.zero_copy = True

    # -- keys and headers ------------------------------------------------------------------
    def _key(self, key: str) -> bytes:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
            raise ValueError("mcstore.sglang: bad page key %r" % (key,))
        return self.prefix + key.encode("utf-8")

    def _header(self, key: str) -> B.BlockHeader:
        return B.BlockHeader(namespace_digest=self._ns_digest, block_hash=key.encode("utf-8"),
                             parent_hash=b"", tokens=_NO_TOKENS, num_tokens=self.page_size,
                             payload_bytes=self.page_bytes)

    def _check_header(self, key: str, stored: Any) -> bool:
        why = self._header(key).check(stored)
        if why is None:
            return True
        self._count("header_mismatches")
        log.warning("mcstore.sglang: page %s is a miss: %s", key, why)
        return False

    def _pages(self, host_indices: Any, n: int) -> List[int]:
        """The host pages that `host_indices` (n pages of page_size token slots) name."""
        ps = self.page_size
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        if len(idx) != n * ps:
            raise ValueError("mcstore.sglang: %d host indices for %d pages of %d"
                             % (len(idx), n, ps))
        pages = []
        for i in range(n):
            first = int(idx[i * ps])
            if first % ps or not 0 <= first // ps < self._num_pages():
                raise ValueError("mcstore.sglang: host index %d is not a page start" % first)
            pages.append(first // ps)
        return pages

    def _num_pages(self) -> int:
        return int(self.mem_pool_host.page_num)

    # -- SGLang's page interface (interface_v1: host page indices) -------------------------
    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        host = self.mem_pool_host

        def staged(pages: List[int]) -> List[bool]:
            return self._staged_put(keys, [lambda p=p: host.get_data_page(p * self.page_size,
                                                                          flat=True)
                                           for p in pages])

        def direct(mkeys: List[bytes], pages: List[int]) -> List[bool]:
            view = self._headers.memoryview()
            for k, p in zip(keys, pages):
                view[p * HEADER:(p + 1) * HEADER] = self._header(k).pack()
            return self._stored(self.client.put(mkeys, self._layout.blocks(pages),
                                                replicas=self.replicas))

        return self._page_batch("store", keys, host_indices, staged, direct)

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        host = self.mem_pool_host

        def staged(pages: List[int]) -> List[bool]:
            sinks = [lambda data, p=p: host.set_from_flat_data_page(
                p * self.page_size, data.view(host.dtype)) for p in pages]
            return self._staged_get(keys, sinks)

        def direct(mkeys: List[bytes], pages: List[int]) -> List[bool]:
            results = self.client.get(mkeys, into=self._layout.blocks(pages))
            view = self._headers.memoryview()
            out = []
            for k, p, r in zip(keys, pages, results):
                ok = r.ok and self._check_header(k, view[p * HEADER:(p + 1) * HEADER])
                out.append(ok)
            self._count_loads(out)
            return out

        return self._page_batch("load", keys, host_indices, staged, direct)

    def _page_batch(self, what: str, keys: List[str], host_indices: Any,
                    staged: Callable[[List[int]], List[bool]],
                    direct: Callable[[List[bytes], List[int]], List[bool]]) -> List[bool]:
        """What batch_set_v1 and batch_get_v1 share: the host pages `host_indices` names, moved
        through a staging buffer (`staged(pages)`) or, zero-copy, straight from or into the
        host pool (`direct(mcstore keys, pages)`); on an error (logged and counted as `what`)
        every page is False."""
        if not keys:
            return []
        try:
            pages = self._pages(host_indices, len(keys))
            if not self.zero_copy:
                return staged(pages)
            return direct([self._key(k) for k in keys], pages)
        except (StoreError, ValueError, OSError) as e:
            self._error(what, e)
            return [False] * len(keys)

    # -- the tensor interface (without interface_v1) ---------------------------------------
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        if not keys:
            return []
        targets = list(target_locations or [None] * len(keys))
        for i, t in enumerate(targets):
            if t is None:
                targets[i] = self.mem_pool_host.get_dummy_flat_data_page()

        def sink(i: int):
            def put_into(data: torch.Tensor) -> None:
                dst = targets[i]
                if dst.numel() * dst.element_size() != self.page_bytes:
                    raise ValueError("mcstore.sglang: a target of %d bytes for a page of %d"
                                     % (dst.numel() * dst.element_size(), self.page_bytes))
                dst.view(-1).view(torch.uint8).copy_(data)
            return put_into
        try:
            ok = self._staged_get(keys, [sink(i) for i in range(len(keys))])
        except (StoreError, ValueError, OSError) as e:
            self._error("load", e)
            return [None] * len(keys)
        return [t if good else None for t, good in zip(targets, ok)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        if not keys:
            return True
        values = list(values or [])
        if len(values) != len(keys):
            return False
        try:
            return all(self._staged_put(keys, [lambda v=v: v for v in values]))
        except (StoreError, ValueError, OSError) as e:
            self._error("store", e)
            return False

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """How many leading pages are stored (a load still checks each one's header)."""
        if not keys:
            return 0
        try:
            return int(self.client.match_prefix([self._key(k) for k in keys]).matched)
        except (StoreError, ValueError, OSError) as e:
            self._error("lookup", e)
            return 0

    def clear(self) -> bool:
        # The store is shared with other engines: a backend never empties it.
        return False

    def get_stats(self) -> None:
        return None

    def close(self) -> None:
        self.client.close()

    # -- the copying path ------------------------------------------------------------------
    def _stage(self, kind: str) -> Tuple[threading.Lock, Any]:
        with self._stage_lock:
            st = self._stages.get(kind)
            if st is None:
                st = (threading.Lock(),
                      self.client.create_buffer(STAGE_PAGES * (HEADER + self.page_bytes)))
                self._stages[kind] = st
            return st

    def _staged_put(self, keys: Sequence[str], sources: Sequence[Any]) -> List[bool]:
        """Stores pages whose bytes sources[i]() returns (a tensor of page_bytes), through a
        staging buffer."""
        slot = HEADER + self.page_bytes
        lock, buf = self._stage("put")
        out: List[bool] = []
        with lock:
            for start in range(0, len(keys), STAGE_PAGES):
                chunk = list(keys[start:start + STAGE_PAGES])
                view = buf.memoryview()
                values = []
                for j, k in enumerate(chunk):
                    data = sources[start + j]().reshape(-1).contiguous().view(torch.uint8)
                    if data.numel() != self.page_bytes:
                        raise ValueError("mcstore.sglang: a page of %d bytes, expected %d"
                                         % (data.numel(), self.page_bytes))
                    off = j * slot
                    view[off:off + HEADER] = self._header(k).pack()
                    torch.frombuffer(view[off + HEADER:off + slot], dtype=torch.uint8).copy_(data)
                    values.append(buf.slice(off, slot))
                out += self._stored(self.client.put([self._key(k) for k in chunk], values,
                                                    replicas=self.replicas))
        return out

    def _staged_get(self, keys: Sequence[str], sinks: Sequence[Any]) -> List[bool]:
        """Loads pages through a staging buffer; sinks[i](uint8 tensor) takes page i's bytes
        once its header checked out."""
        slot = HEADER + self.page_bytes
        lock, buf = self._stage("get")
        out: List[bool] = []
        with lock:
            for start in range(0, len(keys), STAGE_PAGES):
                chunk = list(keys[start:start + STAGE_PAGES])
                into = [buf.slice(j * slot, slot) for j in range(len(chunk))]
                results = self.client.get([self._key(k) for k in chunk], into=into)
                view = buf.memoryview()
                for j, (k, r) in enumerate(zip(chunk, results)):
                    off = j * slot
                    ok = r.ok and self._check_header(k, view[off:off + HEADER])
                    if ok:
                        sinks[start + j](torch.frombuffer(view[off + HEADER:off + slot],
                                                          dtype=torch.uint8))
                    out.append(ok)
        self._count_loads(out)
        return out

    # -- results and counters --------------------------------------------------------------
    def _stored(self, results: Sequence[Any]) -> List[bool]:
        # An existing key holds the same page (keys are digests of the tokens): stored.
        out = [r.code is Code.OK or r.code is Code.ALREADY_EXISTS for r in results]
        self._count("pages_stored", sum(out))
        return out

    def _count_loads(self, ok: Sequence[bool]) -> None:
        self._count("pages_loaded", sum(ok))
        self._count("pages_missed", len(ok) - sum(ok))

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            self.stats[name] += n

    def _error(self, what: str, e: BaseException) -> None:
        self._count("errors")
        now = time.monotonic()
        if now - self._last_error_log >= 10.0:   # rate-limited: a daemon outage is one line
            self._last_error_log = now
            log.warning("mcstore.sglang: %s failed (counted as misses): %s", what, e)


def namespace_spec(config: HiCacheStorageConfig, host: Any, page_shape: Tuple[int, ...],
                   user_namespace: str, model_id: Optional[str] = None,
                   model_path: Optional[str] = None) -> B.NamespaceSpec:
    """Everything two SGLang engines must agree on to share a page's bytes."""
    tag = getattr(host, "storage_format_tag", None)
    name = config.model_name or ""
    path = name[:-len(tag) - 1] if tag and name.endswith("-" + tag) else name
    fingerprint = str(model_id) if model_id else B.model_fingerprint(model_path or path)
    if config.is_mla_model:
        shard = "mla"
    else:
        shard = "tp%dof%d" % (config.tp_rank, config.tp_size)
    if config.pp_size > 1:
        shard += "-pp%dof%d" % (config.pp_rank, config.pp_size)
    if config.attn_cp_size > 1:
        shard += "-cp%dof%d" % (config.attn_cp_rank, config.attn_cp_size)
    layout = "sglang:%s:%s:page%s:fmt%s" % (type(host).__name__, host.layout,
                                            "x".join(str(d) for d in page_shape), tag or "-")
    return B.NamespaceSpec(user_namespace=user_namespace,
                           model_name=os.path.basename(path.rstrip("/")) or path or "model",
                           model_fingerprint=fingerprint, kv_dtype=str(host.dtype),
                           layout=layout, num_layers=int(host.layer_num),
                           block_size=int(host.page_size), hash_algo=HASH_SCHEME, shard=shard)


def page_runs(host: Any) -> Optional[Tuple[List[Tuple[int, int]], int]]:
    """Page 0's byte runs inside the host pool's kv_buffer storage (in the flat page order
    SGLang stores), and the bytes between one page and the next, read from the strides of
    get_data_page()'s views; None when pages are not evenly strided views of one buffer (then
    the backend copies)."""
    buf = getattr(host, "kv_buffer", None)
    if not isinstance(buf, torch.Tensor) or host.page_num < 2:
        return None
    ps = int(host.page_size)
    try:
        views = [host.get_data_page(p * ps, flat=False) for p in (0, 1, int(host.page_num) - 1)]
    except (NotImplementedError, ValueError):
        return None
    if any(v.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr() for v in views):
        return None
    esize = views[0].element_size()
    step = views[1].storage_offset() - views[0].storage_offset()
    shape, strides = tuple(views[0].shape), tuple(views[0].stride())
    try:
        def runs(v: torch.Tensor) -> List[Tuple[int, int]]:
            return B.block_runs((1,) + tuple(v.shape), (0,) + tuple(v.stride()), esize,
                                v.storage_offset(), 0)
        first = runs(views[0])
        for p, v in zip((1, int(host.page_num) - 1), views[1:]):
            if tuple(v.shape) != shape or tuple(v.stride()) != strides:
                return None
            if runs(v) != [(o + p * step * esize, n) for o, n in first]:
                return None
    except ValueError:
        return None
    return first, step * esize


def fd_offset(fd: int, tensor: torch.Tensor) -> Optional[int]:
    """Where the first byte of `tensor`'s storage lies in the file `fd` names, read from
    /proc/self/maps (the mapping that holds it must be of that file); None if it is not there."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    ptr = tensor.untyped_storage().data_ptr()
    nbytes = tensor.untyped_storage().nbytes()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 5:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= ptr < hi and int(parts[4]) == st.st_ino:
                off = ptr - lo + int(parts[2], 16)
                if ptr + nbytes <= hi and off + nbytes <= st.st_size:
                    return off
                return None
    return None
