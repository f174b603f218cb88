"""MCStoreConnector: vLLM's KV connector (v1 API) over an mcstore mc-client daemon.

Load it with
    kv_transfer_config = {"kv_connector": "MCStoreConnector",
                          "kv_connector_module_path": "mcstore.vllm", "kv_role": "kv_both",
                          "kv_load_failure_policy": "recompute",
                          "kv_connector_extra_config": {"address": "unix:/run/mcstore/client.sock"}}

How it works (docs/vllm.md has the full story):
- Scheduler side (engine core): one block list per request, computed once from vLLM's own chained
  block hashes (`request.block_hashes`) over the *full prompt blocks*; keys are those hashes under a
  namespace that carries model identity, KV dtype and layout, block size and TP shard (blocks.py).
  Lookup is one MatchPrefix per TP shard with a lease; the hit never covers the last prompt token.
  Saves are planned per step for the full prompt blocks the step completes (never a partial block,
  never a block that came from the local prefix cache or from mcstore).
- Worker side: at register_kv_caches the paged KV tensors' storage moves, in place, into a POSIX
  shared-memory object (torch's `share_memory_` path, file-system strategy) that is registered with
  the daemon; every tensor and view vLLM holds keeps pointing at the same storage. Each block is
  then an object of [128-byte header][the block's bytes in every layer], sent and received as
  Slices of that shared memory (the byte ranges come from the tensors' strides), so no KV byte is
  copied in Python. Loads and saves run on background threads: loads finish through get_finished
  (async) or before the forward pass (sync); a request's blocks stay allocated until its saves end.
- A block whose load fails (missing, evicted, checksum, foreign or colliding header, daemon gone)
  goes to get_block_ids_with_load_errors, so vLLM recomputes it.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.logger import init_logger

from mcstore.vllm import blocks as B

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = init_logger("mcstore.vllm")

_DEFAULTS = {
    "address": "",            # "unix:/path.sock" or "host:port" of the local mc-client
    "namespace": "default",   # deployments sharing one store but not their KV use different ones
    "model_id": "",           # overrides the model fingerprint (e.g. a release tag)
    "lease_ttl_ms": 30000,    # MatchPrefix lease; must outlast the load
    "timeout_s": 30.0,        # per Store RPC
    "load_async": True,       # True: loads overlap steps (get_finished); False: before forward
    "save": True,             # False: load only (a consumer)
    "load": True,             # False: save only (a producer)
    "replicas": 0,            # 0 = the daemon's default
    "io_threads": 2,          # background threads for loads and saves
}


def _config(vllm_config: "VllmConfig") -> dict[str, Any]:
    extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
    unknown = set(extra) - set(_DEFAULTS) - {"socket"}
    if unknown:
        raise ValueError("MCStoreConnector: unknown kv_connector_extra_config keys %s (known: %s)"
                         % (sorted(unknown), sorted(_DEFAULTS)))
    cfg = dict(_DEFAULTS)
    cfg.update(extra)
    if extra.get("socket") and not extra.get("address"):
        cfg["address"] = "unix:" + extra["socket"]
    if not cfg["address"]:
        cfg["address"] = os.environ.get("MCSTORE_ADDRESS", "")
    if not cfg["address"]:
        raise ValueError("MCStoreConnector: set kv_connector_extra_config['address'] (e.g. "
                         "'unix:/run/mcstore/client.sock') or MCSTORE_ADDRESS")
    return cfg


# -------------------------------------------------------------------------------------------
# Namespaces: derived alike in the scheduler and in every worker, from the configs only.

def _attention_spec(kv_cache_config: "KVCacheConfig"):
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise ValueError("MCStoreConnector supports models with one KV cache group (full "
                         "attention); this one has %d" % len(groups))
    spec = groups[0].kv_cache_spec
    if hasattr(spec, "kv_cache_specs"):  # UniformTypeKVCacheSpecs
        spec = next(iter(spec.kv_cache_specs.values()))
    return groups[0], spec


def namespaces(vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig",
               cfg: dict[str, Any]) -> list[B.NamespaceSpec]:
    """One NamespaceSpec per TP rank (index = rank). MLA: every rank shares one."""
    group, spec = _attention_spec(kv_cache_config)
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    tp = vllm_config.parallel_config.tensor_parallel_size
    fingerprint = cfg["model_id"] or B.model_fingerprint(model_config.model,
                                                         getattr(model_config, "revision", None))
    try:
        layout_name = cache_config.get_resolved_kv_cache_layout().name
    except Exception:  # not resolved (scheduler-only unit setups): the backend decides
        layout_name = "unresolved"
    page = "heads%d:hs%d:page%d" % (getattr(spec, "num_kv_heads", 0), getattr(spec, "head_size", 0),
                                      spec.page_size_bytes)
    mla = bool(getattr(model_config, "use_mla", False))
    out = []
    for rank in range(tp):
        out.append(B.NamespaceSpec(
            user_namespace=str(cfg["namespace"]),
            model_name=os.path.basename(os.path.normpath(model_config.model)) or model_config.model,
            model_fingerprint=fingerprint,
            kv_dtype=str(spec.dtype),
            layout="%s:%s" % (layout_name, page),
            num_layers=len(group.layer_names),
            block_size=spec.block_size,
            hash_algo=str(cache_config.prefix_caching_hash_algo),
            shard="mla" if mla else "tp%dof%d" % (rank, tp)))
    return out


# -------------------------------------------------------------------------------------------
# Scheduler -> worker metadata

@dataclass
class BlockRef:
    block_id: int
    block_hash: bytes
    parent_hash: bytes
    tokens: bytes            # token digest
    num_tokens: int


@dataclass
class LoadJob:
    req_id: str
    blocks: list[BlockRef]
    lease_ids: list[int]     # per TP rank (0 = none)


@dataclass
class SaveJob:
    req_id: str
    blocks: list[BlockRef]


@dataclass
class MCStoreConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)   # their blocks may be reused this step


@dataclass
class MCStoreWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler: block hashes saved (for BlockStored) and found gone (BlockRemoved)."""
    stored: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        assert isinstance(other, MCStoreWorkerMetadata)
        return MCStoreWorkerMetadata(self.stored + other.stored, self.removed + other.removed)


_STAT_KEYS = ("lookups", "lookup_hit_blocks", "lookup_miss_blocks", "lookup_errors",
              "load_blocks", "load_error_blocks", "load_header_mismatch_blocks", "load_bytes",
              "load_s",
              "save_blocks", "save_existing_blocks", "save_error_blocks", "save_bytes", "save_s")


@dataclass
class MCStoreConnectorStats(KVConnectorStats):
    """Counters since the last interval (summed over workers). reduce() gives the log line."""

    def __post_init__(self) -> None:
        for k in _STAT_KEYS:
            self.data.setdefault(k, 0)

    def reset(self) -> None:
        self.data = {k: 0 for k in _STAT_KEYS}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in (other.data or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        d = dict(self.data)
        d["load_GBps"] = round(d["load_bytes"] / d["load_s"] / 1e9, 3) if d["load_s"] else 0.0
        d["save_GBps"] = round(d["save_bytes"] / d["save_s"] / 1e9, 3) if d["save_s"] else 0.0
        return d

    def is_empty(self) -> bool:
        return not any(self.data.get(k) for k in _STAT_KEYS)


# -------------------------------------------------------------------------------------------
# The connector

class MCStoreConnector(KVConnectorBase_V1):
    """See the module docstring."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._cfg = _config(vllm_config)
        self._namespaces = namespaces(vllm_config, kv_cache_config, self._cfg)
        self._block_size = self._namespaces[0].block_size
        self._hash_algo = str(vllm_config.cache_config.prefix_caching_hash_algo)
        if role == KVConnectorRole.SCHEDULER:
            self._sched: Optional[_SchedulerSide] = _SchedulerSide(self)
            self._worker: Optional[_WorkerSide] = None
        else:
            self._sched = None
            self._worker = _WorkerSide(self)
        log.info("MCStoreConnector (%s) at %s: %s", role.name, self._cfg["address"],
                 self._namespaces[0].describe())

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped save is a later miss

    # -- worker side ---------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker.register(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        # Works when attn_metadata is None (an all-external hit runs no forward): the jobs come
        # from the connector's own metadata, never from the forward context.
        self._worker.start_loads(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # sync loads complete inside start_load_kv; async ones before the request runs

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return  # whole blocks are saved from shared memory once the step's forward is done

    def wait_for_save(self) -> None:
        if self.has_connector_metadata():
            self._worker.start_saves(self._get_connector_metadata())

    def get_finished(self, finished_req_ids: set[str]):
        return self._worker.finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        # Called every step, before the forward pass: the blocks of requests preempted in this
        # step may be reused by it, so no save may still read them.
        preempted = getattr(kv_connector_metadata, "preempted", None)
        if preempted:
            self._worker.drain_saves(preempted)

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        return self._worker.take_stats() if self._worker else None

    def build_connector_worker_meta(self) -> Optional[KVConnectorWorkerMetadata]:
        return self._worker.take_worker_meta() if self._worker else None

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
        if self._sched is not None:
            self._sched.shutdown()

    # -- scheduler side ------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int):
        return self._sched.num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        self._sched.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        return self._sched.build_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        self._sched.on_output(connector_output)

    def request_finished(self, request: "Request", block_ids: list[int]):
        return self._sched.request_finished(request, block_ids)

    def take_events(self):
        return self._sched.take_events() if self._sched else ()

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict[str, Any]] = None):
        return MCStoreConnectorStats(data=dict(data or {}))

    # -- introspection (tests, benchmarks) -----------------------------------------------
    @property
    def totals(self) -> dict[str, float]:
        """Counters since start (this side of the connector)."""
        side = self._worker or self._sched
        return dict(side.totals)


def _client(cfg: dict[str, Any]):
    from mcstore import Client
    return Client(cfg["address"], timeout_s=float(cfg["timeout_s"]))


# -------------------------------------------------------------------------------------------

@dataclass
class _ReqState:
    hashes: list[bytes]              # full prompt blocks only
    parents: list[bytes]
    tokens: list[bytes]
    prompt_len: int
    loadable: int                    # blocks that may be loaded (leave >= 1 prompt token)
    lookup: Optional[tuple[int, int, list[int]]] = None   # (local blocks, matched, lease ids)
    load_range: Optional[tuple[int, int]] = None          # set at alloc, emitted once
    block_ids: list[int] = field(default_factory=list)
    saved_upto: Optional[int] = None                      # blocks [.., saved_upto) planned
    has_saves: bool = False


class _SchedulerSide:
    def __init__(self, conn: MCStoreConnector) -> None:
        self.conn = conn
        self.cfg = conn._cfg
        self.bs = conn._block_size
        self.prefixes = [ns.key_prefix() for ns in conn._namespaces]
        if conn._namespaces[0].shard == "mla":
            self.prefixes = self.prefixes[:1]
        self.client = None
        self.reqs: dict[str, _ReqState] = {}
        self.pending_loads: list[LoadJob] = []
        self.events_info: dict[bytes, tuple[bytes, int]] = {}   # hash -> (parent, req block)
        self.stored_counts: dict[bytes, int] = defaultdict(int)
        self.events: list[Any] = []
        # Events pile up only when vLLM publishes them (it then drains them through take_events).
        kec = getattr(conn._vllm_config, "kv_events_config", None)
        self.events_enabled = bool(kec and getattr(kec, "enable_kv_cache_events", False))
        self.totals: dict[str, float] = defaultdict(float)
        self._warned = 0.0
        if conn._hash_algo.startswith("xxhash") and os.environ.get("PYTHONHASHSEED") is None:
            log.warning("prefix_caching_hash_algo=%s without PYTHONHASHSEED: block hashes differ "
                        "per process, so mcstore will never hit; set PYTHONHASHSEED on every "
                        "engine or use sha256", conn._hash_algo)

    def _get_client(self):
        if self.client is None:
            self.client = _client(self.cfg)
        return self.client

    def _state(self, request: "Request") -> _ReqState:
        st = self.reqs.get(request.request_id)
        if st is not None:
            return st
        bs = self.bs
        prompt = request.prompt_token_ids or []
        n_full = min(request.num_prompt_tokens // bs, len(request.block_hashes))
        hashes = [bytes(h) for h in request.block_hashes[:n_full]]
        parents = [b""] + hashes[:-1] if hashes else []
        tokens = [B.token_digest(prompt[i * bs:(i + 1) * bs]) for i in range(n_full)]
        loadable = min(n_full, max(request.num_prompt_tokens - 1, 0) // bs)
        if not prompt:  # prompt embeddings: no token ids to check a block against
            loadable = 0
            hashes, parents, tokens = [], [], []
        st = _ReqState(hashes, parents, tokens, request.num_prompt_tokens, loadable)
        self.reqs[request.request_id] = st
        return st

    def _release(self, lease_ids: list[int]) -> None:
        for lid in lease_ids:
            if lid:
                try:
                    self._get_client().release_lease(lid)
                except Exception as e:  # the lease then ends at its TTL
                    log.warning("release of lease %d failed: %s", lid, e)

    def num_new_matched_tokens(self, request: "Request", num_computed_tokens: int):
        if not self.cfg["load"]:
            return 0, False
        st = self._state(request)
        if st.lookup is not None:          # asked again: the previous answer's lease goes
            self._release(st.lookup[2])
            st.lookup = None
        local = num_computed_tokens // self.bs
        if st.loadable <= local:
            return 0, False
        self.totals["lookups"] += 1
        matched = st.loadable
        leases: list[int] = []
        try:
            client = self._get_client()
            for prefix in self.prefixes:
                keys = [B.block_key(prefix, h) for h in st.hashes[:st.loadable]]
                lease = client.match_prefix(keys, lease_ttl_ms=int(self.cfg["lease_ttl_ms"]))
                leases.append(lease.lease_id if lease.matched else 0)
                matched = min(matched, lease.matched)
        except Exception as e:
            self.totals["lookup_errors"] += 1
            self._release(leases)
            now = time.monotonic()
            if now - self._warned > 10:
                self._warned = now
                log.warning("mcstore lookup failed (treated as a miss): %s", e)
            return 0, False
        self.totals["lookup_hit_blocks"] += max(matched - local, 0)
        self.totals["lookup_miss_blocks"] += st.loadable - max(matched, local)
        if matched <= local:
            self._release(leases)
            return 0, False
        st.lookup = (local, matched, leases)
        return (matched - local) * self.bs, bool(self.cfg["load_async"])

    def after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                    num_external_tokens: int) -> None:
        st = self._state(request)
        if num_external_tokens == 0:
            if st.lookup is not None:
                self._release(st.lookup[2])
                st.lookup = None
            return
        local, matched, leases = st.lookup
        if num_external_tokens != (matched - local) * self.bs:
            raise AssertionError("vLLM allocated %d external tokens, the lookup found %d"
                                 % (num_external_tokens, (matched - local) * self.bs))
        block_ids = blocks.get_block_ids()[0]
        refs = [BlockRef(block_ids[i], st.hashes[i], st.parents[i], st.tokens[i], self.bs)
                for i in range(local, matched)]
        self.pending_loads.append(LoadJob(request.request_id, refs, leases))
        st.lookup = None                   # the worker releases the leases after the load
        self.totals["load_jobs"] += 1

    def build_meta(self, out: "SchedulerOutput") -> KVConnectorMetadata:
        meta = MCStoreConnectorMetadata(loads=self.pending_loads,
                                        preempted=set(out.preempted_req_ids or ()))
        self.pending_loads = []
        if not self.cfg["save"]:
            return meta
        for new in out.scheduled_new_reqs:
            st = self.reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            st.saved_upto = new.num_computed_tokens // self.bs
            self._plan_saves(meta, new.req_id, st,
                             new.num_computed_tokens + out.num_scheduled_tokens.get(new.req_id, 0))
        cached = out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self.reqs.get(rid)
            if st is None:
                continue
            new_ids = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids:
                st.block_ids = list(new_ids[0]) if new_ids else []
                st.saved_upto = cached.num_computed_tokens[i] // self.bs
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            if st.saved_upto is None:
                continue
            self._plan_saves(meta, rid, st,
                             cached.num_computed_tokens[i] + out.num_scheduled_tokens.get(rid, 0))
        return meta

    def _plan_saves(self, meta: MCStoreConnectorMetadata, rid: str, st: _ReqState,
                    done_tokens: int) -> None:
        full = min(done_tokens, st.prompt_len) // self.bs
        full = min(full, len(st.hashes), len(st.block_ids))
        if full <= st.saved_upto:
            return
        refs = [BlockRef(st.block_ids[i], st.hashes[i], st.parents[i], st.tokens[i], self.bs)
                for i in range(st.saved_upto, full)]
        if self.events_enabled:
            for r in refs:
                self.events_info[r.block_hash] = r.parent_hash
        st.saved_upto = full
        st.has_saves = True
        meta.saves.append(SaveJob(rid, refs))

    def on_output(self, output: Any) -> None:
        wm = getattr(output, "kv_connector_worker_meta", None)
        if not isinstance(wm, MCStoreWorkerMetadata):
            return
        self.totals["stored_blocks_reported"] += len(wm.stored)
        self.totals["removed_blocks_reported"] += len(wm.removed)
        if not self.events_enabled:
            self.events_info.clear()
            return
        from vllm.distributed.kv_events import BlockRemoved, BlockStored
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
        need = 1 if self.conn._namespaces[0].shard == "mla" else len(self.prefixes)
        for h in wm.stored:
            self.stored_counts[h] += 1
            if self.stored_counts[h] >= need:
                del self.stored_counts[h]
                parent = self.events_info.pop(h, b"")
                self.events.append(BlockStored(
                    block_hashes=[maybe_convert_block_hash(h)],
                    parent_block_hash=maybe_convert_block_hash(parent) if parent else None,
                    token_ids=[], block_size=self.bs, lora_id=None, medium="MCSTORE",
                    lora_name=None))
        if wm.removed:
            self.events.append(BlockRemoved(
                block_hashes=[maybe_convert_block_hash(h) for h in dict.fromkeys(wm.removed)],
                medium="MCSTORE"))

    def take_events(self):
        ev, self.events = self.events, []
        return ev

    def request_finished(self, request: "Request", block_ids: list[int]):
        st = self.reqs.pop(request.request_id, None)
        if st is None:
            return False, None
        if st.lookup is not None:
            self._release(st.lookup[2])
        # Saves planned for this request read its blocks: keep them until the worker is done.
        return st.has_saves, None

    def shutdown(self) -> None:
        if self.client is not None:
            self.client.close()


# -------------------------------------------------------------------------------------------

class _KVMemory:
    """The paged KV tensors, moved into shared memory registered with the daemon, and the byte
    ranges of each block read from their strides."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], layer_names: list[str],
                 num_blocks: int, page_bytes: int) -> None:
        self.layer_names = [n for n in layer_names if n in kv_caches]
        if len(self.layer_names) != len(kv_caches):
            extra = sorted(set(kv_caches) - set(layer_names))
            raise ValueError("KV tensors for layers outside the KV cache group: %s" % extra)
        self.tensors = [kv_caches[n] for n in self.layer_names]
        self.num_blocks = num_blocks
        # (data_ptr, shm object size, shm name, offset of data_ptr inside the object)
        self.storages: list[tuple[int, int, str, int]] = []
        seen: dict[int, int] = {}
        for t in self.tensors:
            if t.device.type != "cpu":
                raise ValueError("MCStoreConnector needs KV tensors in host memory; layer on %s"
                                 % t.device)
            st = t.untyped_storage()
            if st.data_ptr() in seen:
                continue
            name, size, offset = self._to_shared(t)
            seen[t.untyped_storage().data_ptr()] = len(self.storages)
            self.storages.append((t.untyped_storage().data_ptr(), size, name, offset))
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
        runs = self._runs_unregistered(0)
        total = sum(n for _, _, n in runs)
        if total != page_bytes * len(self.layers):
            raise ValueError("a block spans %d bytes in the KV tensors, the KV cache spec says "
                             "%d x %d" % (total, len(self.layers), page_bytes))
        self.block_bytes = total
        self.runs_per_block = len(runs)
        self._slice_cache: dict[tuple, list] = {}

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
        for idx, esize, shape, strides, off in self.layers:
            for o, n in B.block_runs(shape, strides, esize, off, block):
                runs.append((idx, o, n))
        return B.merge_runs(runs)

    def block_slices(self, buffer_ids: list[int], block: int):
        """The Slices of one block (memoized per block id and buffer ids: the geometry is fixed)."""
        from mcstore import Slice
        if block < 0 or block >= self.num_blocks:
            raise ValueError("block id %d outside [0, %d)" % (block, self.num_blocks))
        cache_key = (block, tuple(buffer_ids))
        hit = self._slice_cache.get(cache_key)
        if hit is None:
            hit = [Slice(buffer_ids[i], self.storages[i][3] + o, n)
                   for i, o, n in self._runs_unregistered(block)]
            self._slice_cache[cache_key] = hit
        return list(hit)

    def views(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.layer_names, self.tensors))


class _WorkerSide:
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
        self.mem: Optional[_KVMemory] = None
        self.buffer_ids: list[int] = []
        self.headers = None     # SharedBuffer: [load slots | save slots], HEADER_SIZE each
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
        self.loaded_log: list[tuple[str, int, bytes]] = []   # (req, block id, hash) loaded OK
        self.saved_log: list[tuple[str, int, bytes]] = []    # (req, block id, hash) saved
        self.fault_hook = None      # tests: called with (block_id) after a load, before checks

    # -- setup -----------------------------------------------------------------------------
    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        kcc = self.conn._kv_cache_config
        group, spec = _attention_spec(kcc)
        self.mem = _KVMemory(kv_caches, list(group.layer_names), kcc.num_blocks,
                             spec.page_size_bytes)
        self.buffer_ids = [self.client.register_buffer(name, size)
                           for _, size, name, _ in self.mem.storages]
        self.headers = self.client.create_buffer(2 * self.mem.num_blocks * B.HEADER_SIZE)
        self._check_bound_views()
        log.info("mcstore: %d KV layers, %d blocks of %d bytes in %d slice(s) each, shared "
                 "memory %s", len(self.mem.layers), self.mem.num_blocks, self.mem.block_bytes,
                 self.mem.runs_per_block, [s[2] for s in self.mem.storages])
        self._probe_layout()

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
            expected = b"".join(t[0].contiguous().view(torch.uint8).numpy().tobytes()
                                for t in tensors)
            res = self.client.put([key], [self.mem.block_slices(self.buffer_ids, 0)])
            if not res[0].ok:
                raise RuntimeError("layout probe put failed: %s %s" % (res[0].code.name,
                                                                      res[0].message))
            got = self.client.get([key])[0]
            if not got.ok or got.data != expected:
                raise RuntimeError("layout probe: the bytes mcstore read through the slices "
                                   "differ from the KV tensors' (%s); refusing to run"
                                   % (got.code.name if not got.ok else "content"))
        finally:
            for t, v in zip(tensors, saved):
                t[0].copy_(v)
            try:
                self.client.remove([key])
            except Exception:
                pass

    def _check_bound_views(self) -> None:
        """Every KV tensor the attention layers use must now live in the shared storage."""
        ranges = [(p, p + size - off) for p, size, _, off in self.mem.storages]
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

    def _key(self, h: bytes) -> bytes:
        return B.block_key(self.prefix, h)

    def _header(self, ref: BlockRef) -> B.BlockHeader:
        return B.BlockHeader(self.ns_digest, ref.block_hash, ref.parent_hash, ref.tokens,
                             ref.num_tokens, self.mem.block_bytes)

    # -- loads -----------------------------------------------------------------------------
    def start_loads(self, meta: MCStoreConnectorMetadata) -> None:
        if not meta.loads:
            return
        sync = not self.cfg["load_async"]
        for job in meta.loads:
            fut = self.pool.submit(self._load, job)
            if sync:
                self._finish_load(job.req_id, fut)
            else:
                with self.lock:
                    self.loads[job.req_id] = fut

    def _load(self, job: LoadJob) -> tuple[set[int], dict[str, float], list[bytes]]:
        t0 = time.perf_counter()
        failed: set[int] = set()
        removed: list[bytes] = []
        st = defaultdict(float)
        lease = job.lease_ids[self.lease_index] if self.lease_index < len(job.lease_ids) else 0
        hdr_buf = self.headers
        try:
            keys = [self._key(r.block_hash) for r in job.blocks]
            into = [[hdr_buf.slice(self._header_slot(r.block_id, False), B.HEADER_SIZE)]
                    + self.mem.block_slices(self.buffer_ids, r.block_id) for r in job.blocks]
            results = self.client.get(keys, into=into, lease=lease or None)
            for r, res in zip(job.blocks, results):
                if self.fault_hook is not None:
                    self.fault_hook(self, r.block_id)
                why = None
                if not res.ok:
                    why = "%s: %s" % (res.code.name, res.message)
                else:
                    raw = hdr_buf.memoryview(self._header_slot(r.block_id, False), B.HEADER_SIZE)
                    why = self._header(r).check(raw)
                    if why is not None:
                        st["load_header_mismatch_blocks"] += 1
                if why is None:
                    st["load_blocks"] += 1
                    st["load_bytes"] += self.mem.block_bytes
                    self.loaded_log.append((job.req_id, r.block_id, r.block_hash))
                else:
                    failed.add(r.block_id)
                    removed.append(r.block_hash)
                    log.warning("mcstore: block %d of request %s not loaded (%s); vLLM "
                                "recomputes it", r.block_id, job.req_id, why)
        except Exception as e:
            failed.update(r.block_id for r in job.blocks)
            log.warning("mcstore: load of %d blocks for request %s failed (%s); vLLM recomputes "
                        "them", len(job.blocks), job.req_id, e)
        st["load_s"] += time.perf_counter() - t0
        if lease:
            try:
                self.client.release_lease(lease)
            except Exception:
                pass  # ends at its TTL
        st["load_error_blocks"] += len(failed)
        return failed, st, removed

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
        for job in meta.saves:
            if not self.saves_enabled:
                fut: Future = Future()
                fut.set_result(({}, []))
            else:
                # The headers are written now, on this thread: the job's slots are its own.
                for r in job.blocks:
                    self.headers.memoryview(self._header_slot(r.block_id, True),
                                            B.HEADER_SIZE)[:] = self._header(r).pack()
                fut = self.pool.submit(self._save, job)
            with self.lock:
                self.saves[job.req_id].append(fut)

    def _save(self, job: SaveJob) -> tuple[dict[str, float], list[bytes]]:
        t0 = time.perf_counter()
        st = defaultdict(float)
        stored: list[bytes] = []
        try:
            keys = [self._key(r.block_hash) for r in job.blocks]
            values = [[self.headers.slice(self._header_slot(r.block_id, True), B.HEADER_SIZE)]
                      + self.mem.block_slices(self.buffer_ids, r.block_id) for r in job.blocks]
            results = self.client.put(keys, values, replicas=int(self.cfg["replicas"]) or None)
            for r, res in zip(job.blocks, results):
                if res.ok:
                    st["save_blocks"] += 1
                    st["save_bytes"] += self.mem.block_bytes
                    stored.append(r.block_hash)
                    self.saved_log.append((job.req_id, r.block_id, r.block_hash))
                elif res.code.name == "ALREADY_EXISTS":
                    st["save_existing_blocks"] += 1
                    stored.append(r.block_hash)
                else:
                    st["save_error_blocks"] += 1
                    log.warning("mcstore: save of block %d (request %s) failed: %s: %s",
                                r.block_id, job.req_id, res.code.name, res.message)
        except Exception as e:
            st["save_error_blocks"] += len(job.blocks)
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
    def finished(self, finished_req_ids: set[str]):
        done_recving: set[str] = set()
        done_sending: set[str] = set()
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
            if not self.stored and not self.removed:
                return None
            m = MCStoreWorkerMetadata(self.stored, self.removed)
            self.stored, self.removed = [], []
        return m

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True)
        try:
            if self.headers is not None:
                self.headers.close()
            self.client.close()
        except Exception:
            pass
