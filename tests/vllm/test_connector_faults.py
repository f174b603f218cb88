"""The connector under faults, without a vLLM engine (python/mcstore/vllm): leases handed from
the scheduler to the worker by capability and their releases checked; a failed block looked up
neither again for its request nor, for a while, for others; the store found down pauses lookups
instead of storming it; a daemon restart makes the worker register its KV cache again and go on.
"""

import pytest

from mcstore import Code, GetResult, LeaseRef, SessionLostError, UnavailableError
from mcstore.vllm import scheduler as scheduler_module
from mcstore.vllm.connector import LoadJob, MCStoreConnectorStats, MCStoreWorkerMetadata
from mcstore.vllm.scheduler import SchedulerSide, _ReqState

from test_worker_load import refs, store, worker


class FakeTime:
    """The scheduler side's clock (it reads only time.monotonic), moved by the test."""

    def __init__(self, now=1000.0):
        self.now = now

    def monotonic(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(scheduler_module, "time", fake)
    return fake


def take_meta(w):
    """The worker metadata of the step (the fixture's `stored` is its fake store: set aside)."""
    fake_store, w.stored = w.stored, []
    try:
        return w.take_worker_meta()
    finally:
        w.stored = fake_store


# -- worker ---------------------------------------------------------------------------------

def test_the_worker_reads_under_the_schedulers_lease_and_releases_it_by_capability():
    w = worker()
    r = refs(2)
    for ref in r:
        store(w, ref)
    seen = []
    get = w.client.get
    w.client.get = lambda keys, into=None, lease=None: seen.append(lease) or get(keys, into)
    ref = LeaseRef(77, b"c" * 16)
    failed, _, _ = w._load(LoadJob("req", r, [ref]))
    w.pool.shutdown(wait=True)
    assert not failed
    assert seen == [ref] and w.client.released == [ref]
    assert w.totals.get("lease_release_failures", 0) == 0


def test_a_refused_release_is_counted():
    w = worker()
    r = refs(1)
    store(w, r[0])
    w.client.release_lease = lambda lease: False   # unknown, expired, or another's
    w.pool.shutdown(wait=True)
    w._load(LoadJob("req", r, [LeaseRef(5, b"x" * 16)]))
    assert w.totals["lease_release_failures"] == 1


def test_failed_blocks_go_to_the_scheduler_with_their_request():
    w = worker()
    r = refs(3)
    store(w, r[0])        # r[1] and r[2] are gone from the store
    failed, _, _ = w._load(LoadJob("req-7", r, [0]))
    assert failed == {r[1].block_id, r[2].block_id}
    meta = take_meta(w)
    assert meta.failed == [("req-7", r[1].block_hash), ("req-7", r[2].block_hash)]
    assert not meta.store_down
    assert take_meta(w) is None


def test_a_daemon_that_is_down_is_reported_once_per_step():
    w = worker()
    r = refs(2)

    def down(keys, into=None, lease=None):
        raise UnavailableError("BatchGet: connection refused")
    w.client.get = down
    failed, _, _ = w._load(LoadJob("req", r, [0]))
    assert failed == {x.block_id for x in r}
    meta = take_meta(w)
    assert meta.store_down and len(meta.failed) == 2
    assert take_meta(w) is None


def test_a_restarted_daemon_gets_the_kv_cache_registered_again_and_the_load_goes_on():
    w = worker()
    r = refs(2)
    for ref in r:
        store(w, ref)
    registrations = []
    w._register_with_daemon = lambda call, layouts: registrations.append(layouts)
    get = w.client.get
    calls = {"n": 0}

    def restarted(keys, into=None, lease=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise SessionLostError("BatchGet: session lost: x-mc-owner names no live session")
        return get(keys, into)
    w.client.get = restarted
    failed, st, _ = w._load(LoadJob("req", r, [0]))
    assert not failed and st["load_blocks"] == 2
    assert registrations == [False] and w.reg_gen == 1   # per-block slices: no layouts
    assert w.totals["reregistrations"] == 1
    # A second thread that met the same loss does not register again.
    assert w._reregister(0) is True and registrations == [False]


def test_a_registration_that_fails_is_retried_after_the_backoff_only():
    w = worker()
    attempts = []

    def refuse(call, layouts):
        attempts.append(1)
        raise UnavailableError("RegisterBuffer: still starting")
    w._register_with_daemon = refuse
    assert w._reregister(0) is False and len(attempts) == 1
    assert w._reregister(0) is False and len(attempts) == 1, "backing off"
    assert take_meta(w).store_down
    w.next_reregister = 0.0
    assert w._reregister(0) is False and len(attempts) == 2


# -- scheduler ------------------------------------------------------------------------------

class FakeLease:
    def __init__(self, matched, lease_id):
        self.matched, self.lease_id = matched, lease_id
        self.ref = LeaseRef(lease_id, b"t" * 16)


class FakeSchedClient:
    def __init__(self, stored):
        self.stored = stored          # number of leading blocks stored
        self.matches, self.released = [], []
        self.down = False
        self.next_id = 1
        self.release_ok = True

    def match_prefix(self, keys, lease_ttl_ms=0):
        if self.down:
            raise UnavailableError("MatchPrefix: connection refused")
        self.matches.append(len(keys))
        self.next_id += 1
        return FakeLease(min(self.stored, len(keys)), self.next_id)

    def release_lease(self, lease):
        self.released.append(lease)
        return self.release_ok


def scheduler(stored=8, **cfg):
    s = object.__new__(SchedulerSide)
    s.cfg = {"load": True, "load_async": True, "lease_ttl_ms": 30000, "negative_cache_s": 5.0,
             "negative_cache_blocks": 4096, "unavailable_backoff_s": 2.0}
    s.cfg.update(cfg)
    s.bs = 4
    s.prefixes = [b"ns/"]
    s.client = FakeSchedClient(stored)
    s.reqs = {}
    s.totals, s.interval = {}, MCStoreConnectorStats()
    from collections import OrderedDict, defaultdict
    s.totals = defaultdict(float)
    s.negative = OrderedDict()
    s.paused_until = 0.0
    s.reuse_s = 5.0
    s._warned = 0.0
    s.pending_loads = []
    s.events_enabled, s.events_info = False, {}
    return s


class Req:
    def __init__(self, rid, n_blocks, bs=4, salt=b""):
        self.request_id = rid
        self.block_hashes = [b"%s-h%d" % (salt, i) for i in range(n_blocks)]
        self.prompt_token_ids = list(range(n_blocks * bs + 1))
        self.num_prompt_tokens = len(self.prompt_token_ids)


def test_a_block_that_failed_is_not_looked_up_again_for_its_request():
    s = scheduler()
    req = Req("r1", 8)
    assert s.num_new_matched_tokens(req, 0) == (8 * 4, True)
    s.reqs["r1"].lookup = None          # vLLM took the hit (after_alloc) and the load failed
    s.on_output(type("Out", (), {"kv_connector_worker_meta": MCStoreWorkerMetadata(
        failed=[("r1", req.block_hashes[3])])})())
    # vLLM re-schedules the request with nothing computed: only blocks 0..2 may load.
    assert s.num_new_matched_tokens(req, 0) == (3 * 4, True)
    assert s.client.matches == [8, 3]
    # Block 0 failed: no lookup at all (not one RPC per scheduler step).
    s.reqs["r1"].lookup = None
    s.on_output(type("Out", (), {"kv_connector_worker_meta": MCStoreWorkerMetadata(
        failed=[("r1", req.block_hashes[0])])})())
    for _ in range(10):
        assert s.num_new_matched_tokens(req, 0) == (0, False)
    assert s.client.matches == [8, 3]


def test_a_failed_block_is_a_miss_for_every_request_for_a_while(clock):
    s = scheduler(negative_cache_s=0.25)   # times in binary fractions: exact sums
    a, b = Req("a", 6), Req("b", 6)   # same prefix
    s._note_failed([("a", a.block_hashes[2])])
    assert s.num_new_matched_tokens(b, 0) == (2 * 4, True)
    assert s.totals["lookup_negative_blocks"] == 4
    clock.now += 0.125
    s._negative_cut(s.reqs["b"], 6)
    assert s.negative, "still inside negative_cache_s"
    clock.now += 0.125
    s._negative_cut(s.reqs["b"], 6)
    assert not s.negative, "expired after negative_cache_s"
    s.reqs["b"].lookup = None
    c = Req("c", 6)
    assert s.num_new_matched_tokens(c, 0) == (6 * 4, True)


def test_the_negative_cache_is_bounded():
    s = scheduler(negative_cache_blocks=3)
    s._note_failed([("x", b"h%d" % i) for i in range(10)])
    assert list(s.negative) == [b"h7", b"h8", b"h9"]


def test_a_store_that_is_down_pauses_lookups_instead_of_storming_it(clock):
    s = scheduler(unavailable_backoff_s=0.3)
    s.client.down = True
    assert s.num_new_matched_tokens(Req("a", 4), 0) == (0, False)
    s.client.down = False
    for i in range(20):   # every request of the next moments: a miss, no RPC
        assert s.num_new_matched_tokens(Req("p%d" % i, 4), 0) == (0, False)
    assert s.client.matches == []
    assert s.totals["lookups_skipped_store_down"] == 20
    assert s.paused_until == clock.now + 0.3
    clock.now += 0.3   # the backoff has passed
    assert s.num_new_matched_tokens(Req("b", 4), 0) == (4 * 4, True)
    # A worker that found the daemon down pauses them too.
    s.on_output(type("Out", (), {"kv_connector_worker_meta": MCStoreWorkerMetadata(
        store_down=True)})())
    assert s.num_new_matched_tokens(Req("c", 4), 0) == (0, False)


def test_a_request_waiting_for_kv_blocks_keeps_its_lookup_and_lease():
    s = scheduler()
    req = Req("r", 5)
    for _ in range(10):   # vLLM asks every step while it cannot allocate the request
        assert s.num_new_matched_tokens(req, 0) == (5 * 4, True)
    assert s.client.matches == [5] and s.client.released == []
    assert s.totals["lookups_reused"] == 9
    s.request_finished(req, [])
    assert len(s.client.released) == 1 and s.client.released[0].lease_id == 2


def test_refused_releases_are_counted_on_the_scheduler_too():
    s = scheduler()
    s.client.release_ok = False
    req = Req("r", 5)
    s.num_new_matched_tokens(req, 0)
    s.request_finished(req, [])
    st = s.take_stats()
    assert st.data["lease_release_failures"] == 1 and st.data["lookups"] == 1
    assert s.take_stats() is None
