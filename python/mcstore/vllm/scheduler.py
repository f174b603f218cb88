"""Scheduler side of MCStoreConnector (engine core): which prompt blocks mcstore holds, their
leases, which loads and saves each step plans (SchedulerSide).

One SchedulerSide per engine, created by MCStoreConnector for the SCHEDULER role; the worker side
is in worker.py, the metadata passed between the two and the stats in connector.py.
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from mcstore.vllm import blocks as B
from mcstore.vllm.connector import (
    BlockRef,
    LoadJob,
    MCStoreConnectorMetadata,
    MCStoreConnectorStats,
    MCStoreWorkerMetadata,
    SaveJob,
    _client,
    log,
)

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

    from mcstore.vllm.connector import MCStoreConnector


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


class SchedulerSide:
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
