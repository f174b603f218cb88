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
- Worker side (worker.py): at register_kv_caches the paged KV tensors' storage moves, in place, into a POSIX
  shared-memory object (torch's `share_memory_` path, file-system strategy) that is registered with
  the daemon; every tensor and view vLLM holds keeps pointing at the same storage. Each block is
  then an object of [128-byte header][the block's bytes in every layer], sent and received as
  Slices of that shared memory (the byte ranges come from the tensors' strides), so no KV byte is
  copied in Python. A KV cache on a GPU stays where it is: each storage is lent to the daemon
  as a GPU buffer (CUDA IPC) and every transfer first waits for an event on the engine's stream.
  Loads and saves run on background threads: loads finish through get_finished (async) or
  before the forward pass (sync); a request's blocks stay allocated until its saves end.
- A block whose load fails (missing, evicted, checksum, foreign or colliding header, daemon gone)
  goes to get_block_ids_with_load_errors, so vLLM recomputes it.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict, defaultdict
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

    from mcstore.vllm.worker import WorkerSide

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
    "idle_wait_ms": 20,       # a step that computes nothing waits up to this for a transfer
    "record_blocks": False,   # keep (request, block id, hash) of every block moved: tests only
    "connect_wait_s": 60.0,   # start-up: retry registering while the daemon is UNAVAILABLE
    "negative_cache_s": 5.0,  # a block whose load failed is not looked up again for this long
    "negative_cache_blocks": 4096,  # ... at most this many blocks remembered
    "unavailable_backoff_s": 2.0,   # the store down: lookups are misses this long, not RPCs
    "token_file": None,       # Store token over TCP (default: $MCSTORE_TOKEN_FILE)
    "fd_socket": None,        # where buffers are passed (default: <unix socket>.fd)
    "cuda_device": None,      # KV cache on a GPU: mc-client's ordinal of it (default: vLLM's)
    "fake_gpu": False,        # tests only: host KV posing as GPU memory (mc-client-fakegpu)
}


def _config(vllm_config: "VllmConfig") -> dict[str, Any]:
    extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
    unknown = set(extra) - set(_DEFAULTS) - {"socket"}
    if unknown:
        raise ValueError("MCStoreConnector: unknown kv_connector_extra_config keys %s (known: %s)"
                         % (sorted(unknown), sorted(_DEFAULTS)))
    cfg = dict(_DEFAULTS)
    cfg.update(extra)
    wait = cfg["idle_wait_ms"]
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= 1000:
        raise ValueError("MCStoreConnector: idle_wait_ms must be a number of milliseconds in "
                         "[0, 1000], got %r" % (wait,))
    connect_wait = cfg["connect_wait_s"]
    if (isinstance(connect_wait, bool) or not isinstance(connect_wait, (int, float))
            or not 0 <= connect_wait <= 3600):
        raise ValueError("MCStoreConnector: connect_wait_s must be a number of seconds in "
                         "[0, 3600], got %r" % (connect_wait,))
    dev = cfg["cuda_device"]
    if dev is not None and (isinstance(dev, bool) or not isinstance(dev, int)
                            or not 0 <= dev <= 1023):
        raise ValueError("MCStoreConnector: cuda_device must be mc-client's CUDA ordinal "
                         "(0..1023) or unset, got %r" % (dev,))
    for name, hi in (("negative_cache_s", 3600), ("unavailable_backoff_s", 3600),
                     ("negative_cache_blocks", 1 << 24)):
        v = cfg[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
            raise ValueError("MCStoreConnector: %s must be a number in [0, %d], got %r"
                             % (name, hi, v))
    if not isinstance(cfg["fake_gpu"], bool):
        raise ValueError("MCStoreConnector: fake_gpu must be true or false, got %r"
                         % (cfg["fake_gpu"],))
    # A prefill engine that only produces KV (kv_producer) saves and never looks up; a decode
    # engine that only consumes it (kv_consumer) loads and never saves, unless told otherwise.
    role = getattr(vllm_config.kv_transfer_config, "kv_role", "kv_both")
    if role == "kv_producer" and "load" not in extra:
        cfg["load"] = False
    if role == "kv_consumer" and "save" not in extra:
        cfg["save"] = False
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
    # Per TP rank: the lease the scheduler took, as (lease id, capability) (mcstore.LeaseRef),
    # which the worker reads under and releases although another process took it; 0 = none.
    leases: list[Any]


@dataclass
class SaveJob:
    req_id: str
    blocks: list[BlockRef]


@dataclass
class MCStoreConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadJob] = field(default_factory=list)
    saves: list[SaveJob] = field(default_factory=list)
    preempted: set[str] = field(default_factory=set)   # their blocks may be reused this step
    idle: bool = False   # the step schedules no tokens: nothing but transfers is in flight


@dataclass
class MCStoreWorkerMetadata(KVConnectorWorkerMetadata):
    """Worker -> scheduler: block hashes saved (for BlockStored) and found gone (BlockRemoved);
    (request id, block hash) of every block whose load failed (the scheduler looks neither it
    nor its successors up again for that request, nor for any request for a while); and whether
    the store was found down (the daemon unreachable or restarted: lookups pause)."""
    stored: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)
    failed: list[tuple[str, bytes]] = field(default_factory=list)
    store_down: bool = False

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        assert isinstance(other, MCStoreWorkerMetadata)
        return MCStoreWorkerMetadata(self.stored + other.stored, self.removed + other.removed,
                                     self.failed + other.failed,
                                     self.store_down or other.store_down)


_STAT_KEYS = ("lookups", "lookup_hit_blocks", "lookup_miss_blocks", "lookup_errors",
              "lookups_reused", "lookups_skipped_store_down", "lookup_negative_blocks",
              "load_blocks", "load_error_blocks", "load_header_mismatch_blocks", "load_bytes",
              "load_s", "lease_release_failures", "reregistrations",
              "save_blocks", "save_existing_blocks", "save_error_blocks", "save_skipped_blocks",
              "save_bytes", "save_s")


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
            self._worker: Optional[WorkerSide] = None
        else:
            # Imported here: worker.py builds on this module's types.
            from mcstore.vllm.worker import WorkerSide

            self._sched = None
            self._worker = WorkerSide(self)
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
        meta = getattr(self, "_connector_metadata", None)
        idle = isinstance(meta, MCStoreConnectorMetadata) and meta.idle
        return self._worker.finished(finished_req_ids, idle=idle)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.take_load_errors()

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        # Called every step, before the forward pass: the blocks of requests preempted in this
        # step may be reused by it, so no save may still read them.
        preempted = getattr(kv_connector_metadata, "preempted", None)
        if preempted:
            self._worker.drain_saves(preempted)

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        # vLLM asks both sides and sums them: lookups are the scheduler's, transfers the workers'.
        return self._worker.take_stats() if self._worker else self._sched.take_stats()

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

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig", metric_types: dict[type, type],
                           labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]):
        """The connector's counters as vLLM Prometheus counters (vllm:mcstore_<counter>_total),
        so that `vllm serve`'s /metrics and an offline `LLM(...).get_metrics()` (with
        disable_log_stats=False) report them: lookups and hits (the scheduler's), loads, saves,
        failures and re-registrations (the workers', summed)."""
        return _MCStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- introspection (tests, benchmarks) -----------------------------------------------
    @property
    def totals(self) -> dict[str, float]:
        """Counters since start (this side of the connector)."""
        side = self._worker or self._sched
        return dict(side.totals)


def _prom_base():
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics
    return KVConnectorPromMetrics


class _MCStorePromMetrics(_prom_base()):
    """One vLLM Prometheus counter per connector counter (MCStoreConnectorStats)."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        from vllm.v1.metrics.utils import create_metric_per_engine
        self._counters = {}
        for key in _STAT_KEYS:
            counter = self._counter_cls(
                name="vllm:mcstore_%s_total" % key,
                documentation="MCStoreConnector: %s (docs/vllm.md, Metrics)" % key,
                labelnames=labelnames)
            self._counters[key] = create_metric_per_engine(counter, self.per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        for key, value in (transfer_stats_data or {}).items():
            per_engine = self._counters.get(key)
            if per_engine is not None and value:
                per_engine[engine_idx].inc(value)


def _client(cfg: dict[str, Any]):
    from mcstore import Client
    # token_file / fd_socket: optional (a TCP address needs the token; buffers need the fd
    # socket, next to a Unix-socket address by default).
    return Client(cfg["address"], timeout_s=float(cfg["timeout_s"]),
                  token_file=cfg["token_file"], fd_socket=cfg["fd_socket"])


# -------------------------------------------------------------------------------------------

@dataclass
class _ReqState:
    hashes: list[bytes]              # full prompt blocks only
    parents: list[bytes]
    tokens: list[bytes]
    prompt_len: int
    loadable: int                    # blocks that may be loaded (leave >= 1 prompt token)
    lookup: Optional[tuple[int, int, list[Any]]] = None   # (local blocks, matched, leases)
    lookup_at: float = 0.0                                # monotonic time of that lookup
    failed_from: Optional[int] = None                     # first block whose load failed
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
        self.interval = MCStoreConnectorStats()
        self._warned = 0.0
        # Blocks whose load failed lately (hash -> monotonic expiry), oldest first: a hot prefix
        # that fails is not looked up again by every request.
        self.negative: "OrderedDict[bytes, float]" = OrderedDict()
        # The store was found down (a lookup failed, or a worker reported it): lookups are
        # misses without an RPC until then.
        self.paused_until = 0.0
        # A lookup answered moments ago is reused while its lease has most of its TTL left, so
        # a request waiting for KV blocks does not take a new lease every scheduler step.
        self.reuse_s = min(float(self.cfg["lease_ttl_ms"]) / 4000.0, 5.0)
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

    def _count(self, key: str, n: float = 1) -> None:
        self.totals[key] += n
        self.interval.data[key] = self.interval.data.get(key, 0) + n

    def take_stats(self) -> Optional[KVConnectorStats]:
        if self.interval.is_empty():
            return None
        st, self.interval = self.interval, MCStoreConnectorStats()
        return st

    def _release(self, leases: list[Any]) -> None:
        for lease in leases:
            if not lease:
                continue
            try:
                released = self._get_client().release_lease(lease)
            except Exception as e:  # the lease then ends at its TTL
                released = False
                log.warning("release of lease %r failed: %s", lease[0], e)
            if not released:
                self._count("lease_release_failures")

    def _negative_cut(self, st: _ReqState, upto: int) -> int:
        """The first of blocks [0, upto) this request may not load: one whose load already
        failed for it, or (for any request) moments ago; `upto` when none."""
        if st.failed_from is not None:
            upto = min(upto, st.failed_from)
        if not self.negative:
            return upto
        now = time.monotonic()
        while self.negative:   # drop the expired, oldest first
            h, expiry = next(iter(self.negative.items()))
            if expiry > now:
                break
            del self.negative[h]
        for i in range(upto):
            if st.hashes[i] in self.negative:
                self._count("lookup_negative_blocks", upto - i)
                return i
        return upto

    def _note_failed(self, failed: list[tuple[str, bytes]]) -> None:
        ttl = float(self.cfg["negative_cache_s"])
        cap = int(self.cfg["negative_cache_blocks"])
        now = time.monotonic()
        for rid, h in failed:
            st = self.reqs.get(rid)
            if st is not None:
                try:
                    i = st.hashes.index(h)
                except ValueError:
                    i = None
                if i is not None and (st.failed_from is None or i < st.failed_from):
                    st.failed_from = i
            if ttl > 0 and cap > 0:
                self.negative.pop(h, None)
                self.negative[h] = now + ttl
                while len(self.negative) > cap:
                    self.negative.popitem(last=False)

    def _pause(self, why: str) -> None:
        backoff = float(self.cfg["unavailable_backoff_s"])
        if backoff > 0:
            self.paused_until = max(self.paused_until, time.monotonic() + backoff)
        now = time.monotonic()
        if now - self._warned > 10:
            self._warned = now
            log.warning("mcstore unavailable (%s): lookups are misses for %.1f s", why, backoff)

    def num_new_matched_tokens(self, request: "Request", num_computed_tokens: int):
        if not self.cfg["load"]:
            return 0, False
        st = self._state(request)
        local = num_computed_tokens // self.bs
        if st.lookup is not None:
            prev_local, prev_matched, _ = st.lookup
            if (prev_local == local and st.failed_from is None
                    and time.monotonic() - st.lookup_at < self.reuse_s):
                # Asked again (the request waited for KV blocks): the answer and its lease hold.
                self._count("lookups_reused")
                return (prev_matched - local) * self.bs, bool(self.cfg["load_async"])
            self._release(st.lookup[2])    # stale: its lease goes, the keys are asked again
            st.lookup = None
        loadable = self._negative_cut(st, st.loadable)
        if loadable <= local:
            return 0, False
        if time.monotonic() < self.paused_until:
            self._count("lookups_skipped_store_down")
            return 0, False
        self._count("lookups")
        matched = loadable
        leases: list[Any] = []
        try:
            client = self._get_client()
            for prefix in self.prefixes:
                keys = [B.block_key(prefix, h) for h in st.hashes[:loadable]]
                lease = client.match_prefix(keys, lease_ttl_ms=int(self.cfg["lease_ttl_ms"]))
                leases.append(lease.ref if lease.matched else 0)
                matched = min(matched, lease.matched)
        except Exception as e:
            self._count("lookup_errors")
            self._release(leases)
            from mcstore import UnavailableError
            self._pause("lookup: %s" % e if isinstance(e, UnavailableError) else "%s" % e)
            return 0, False
        self._count("lookup_hit_blocks", max(matched - local, 0))
        self._count("lookup_miss_blocks", loadable - max(matched, local))
        if matched <= local:
            self._release(leases)
            return 0, False
        st.lookup = (local, matched, leases)
        st.lookup_at = time.monotonic()
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
                                        preempted=set(out.preempted_req_ids or ()),
                                        idle=out.total_num_scheduled_tokens == 0)
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
        if wm.failed:
            self._note_failed(wm.failed)
        if wm.store_down:
            self._pause("a worker found the daemon down or restarted")
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
