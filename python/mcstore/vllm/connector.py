"""MCStoreConnector: vLLM's KV connector (v1 API) over an mcstore mc-client daemon.

Load it with
    kv_transfer_config = {"kv_connector": "MCStoreConnector",
                          "kv_connector_module_path": "mcstore.vllm", "kv_role": "kv_both",
                          "kv_load_failure_policy": "recompute",
                          "kv_connector_extra_config": {"address": "unix:/run/mcstore/client.sock"}}

How it works (docs/vllm.md has the full story):
- Scheduler side (scheduler.py, in the engine core): one block list per request, computed once from vLLM's own chained
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
    "tls_ca_file": None,      # TCP address with TLS: the CA the daemon's certificate chains to
    "tls_cert_file": None,    # ... a client certificate and key, when the daemon requires one
    "tls_key_file": None,
    "tls_server_name": None,  # ... the name to check instead of the address's host
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
            # Imported here: scheduler.py and worker.py build on this module's types.
            from mcstore.vllm.scheduler import SchedulerSide

            self._sched: Optional[SchedulerSide] = SchedulerSide(self)
            self._worker: Optional[WorkerSide] = None
        else:
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
    from mcstore import Client, TlsConfig
    # token_file / fd_socket: optional (a TCP address needs the token; buffers need the fd
    # socket, next to a Unix-socket address by default); tls_*: TLS to a TCP address.
    tls = None
    if cfg["tls_ca_file"]:
        tls = TlsConfig(ca_file=cfg["tls_ca_file"], cert_file=cfg["tls_cert_file"],
                        key_file=cfg["tls_key_file"], server_name=cfg["tls_server_name"])
    return Client(cfg["address"], timeout_s=float(cfg["timeout_s"]),
                  token_file=cfg["token_file"], fd_socket=cfg["fd_socket"], tls=tls)


# -------------------------------------------------------------------------------------------

# The scheduler side (SchedulerSide) is in scheduler.py, the worker side (WorkerSide) in
# worker.py; MCStoreConnector imports the one its role needs.
