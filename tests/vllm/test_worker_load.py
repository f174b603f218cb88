"""Unit tests of the worker's load path (python/mcstore/vllm/worker.py WorkerSide._load) against
a fake Store client: each stored block's header is checked (one compare in the common case, the
reason named on a mismatch), the MatchPrefix lease is released off the load's completion path,
and the per-block logs are kept only when asked for. Logic only, no timing assertions."""

import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from mcstore import Code, GetResult
from mcstore.vllm import blocks as B
from mcstore.vllm.connector import BlockRef, LoadJob, MCStoreConnectorStats
from mcstore.vllm.worker import WorkerSide

NUM_BLOCKS = 8
BLOCK_BYTES = 4096
NS = B.digest16(b"namespace")


class FakeHeaders:
    """The header buffer: load slots first (block b at b * HEADER_SIZE), then save slots."""

    def __init__(self):
        self.data = bytearray(2 * NUM_BLOCKS * B.HEADER_SIZE)

    def memoryview(self, offset, length):
        return memoryview(self.data)[offset:offset + length]


class FakeMem:
    num_blocks = NUM_BLOCKS
    block_bytes = BLOCK_BYTES


class FakeClient:
    """get() 'lands' each block: writes the header the test chose into its load slot."""

    def __init__(self, headers, stored):
        self.headers, self.stored = headers, stored
        self.released = []
        self.release_gate = threading.Event()
        self.release_gate.set()

    def get(self, keys, into=None, lease=None):
        out = []
        for key, block_id in zip(keys, into):
            header = self.stored.get(key)
            if header is None:
                out.append(GetResult(Code.NOT_FOUND, "gone", key))
                continue
            slot = block_id * B.HEADER_SIZE
            self.headers.data[slot:slot + B.HEADER_SIZE] = header
            out.append(GetResult(Code.OK, "", key, size=BLOCK_BYTES + B.HEADER_SIZE,
                                 bytes_written=BLOCK_BYTES + B.HEADER_SIZE))
        return out

    def release_lease(self, lease_id):
        self.release_gate.wait(30)
        self.released.append(lease_id)
        return True


def worker(record_blocks=False):
    w = object.__new__(WorkerSide)
    w.cfg = {"record_blocks": record_blocks}
    w.record_blocks = record_blocks
    w.mem = FakeMem()
    w.headers = FakeHeaders()
    w.prefix = b"ns/m/tp0of1/0123456789abcdef/"
    w.ns_digest = NS
    w.lease_index = 0
    w.fault_hook = None
    w.loaded_log = []
    w.load_times = []
    w._load_layout = w._save_layout = None   # per-block destinations...
    w._prepared = lambda block_id, save: block_id   # ...and the fake client gets the block id
    w.pool = ThreadPoolExecutor(max_workers=2)
    w.stored = {}
    w.client = FakeClient(w.headers, w.stored)
    # What WorkerSide.__init__ sets up for the loads' bookkeeping.
    w.cfg.update(unavailable_backoff_s=2.0, address="unix:/test.sock")
    w.lock = threading.Lock()
    w.reg_lock = threading.RLock()
    w.reg_gen, w.next_reregister, w.saves_paused_until = 0, 0.0, 0.0
    w.failed, w.store_down, w.removed, w.buffer_ids = [], False, [], []
    w.interval = MCStoreConnectorStats()
    w.totals = defaultdict(float)
    return w


def refs(n):
    out, parent = [], b"\0" * 32
    for i in range(n):
        h = B.digest16(b"block %d" % i) * 2
        out.append(BlockRef(block_id=i + 1, block_hash=h, parent_hash=parent,
                            tokens=B.token_digest(list(range(i * 4, i * 4 + 4))), num_tokens=4))
        parent = h
    return out


def store(w, ref, **change):
    """Stores the block's header as a saver would write it, with fields optionally changed."""
    fields = dict(namespace_digest=NS, block_hash=ref.block_hash, parent_hash=ref.parent_hash,
                  tokens=ref.tokens, num_tokens=ref.num_tokens, payload_bytes=BLOCK_BYTES)
    fields.update(change)
    w.stored[w._key(ref.block_hash)] = B.BlockHeader(**fields).pack()


def test_each_header_is_checked_and_a_mismatch_names_the_field():
    w = worker()
    r = refs(5)
    store(w, r[0])
    store(w, r[1], tokens=B.token_digest([9, 9, 9, 9]))       # a hash collision
    store(w, r[2], namespace_digest=B.digest16(b"other model"))
    store(w, r[3], parent_hash=b"\1" * 32)
    # r[4] not stored: the daemon answers NOT_FOUND
    failed, st, removed = w._load(LoadJob("req", r, [0]))
    assert failed == {r[1].block_id, r[2].block_id, r[3].block_id, r[4].block_id}
    assert st["load_blocks"] == 1 and st["load_bytes"] == BLOCK_BYTES
    assert st["load_header_mismatch_blocks"] == 3 and st["load_error_blocks"] == 4
    assert removed == [r[1].block_hash, r[2].block_hash, r[3].block_hash, r[4].block_hash]
    assert w.loaded_log == [] and w.load_times == []   # record_blocks off: nothing kept
    # the reasons, as check() gives them for the stored headers
    assert B.BlockHeader(NS, r[1].block_hash, r[1].parent_hash, r[1].tokens, 4,
                         BLOCK_BYTES).check(w.stored[w._key(r[1].block_hash)]).startswith(
                             "token digest mismatch")
    # a single flipped padding byte is caught too (the compare covers all 128 bytes)
    key = w._key(r[0].block_hash)
    bad = bytearray(w.stored[key])
    bad[B.HEADER_SIZE - 1] ^= 1
    w.stored[key] = bytes(bad)
    failed, st, _ = w._load(LoadJob("req2", r[:1], [0]))
    assert failed == {r[0].block_id} and st["load_header_mismatch_blocks"] == 1
    w.pool.shutdown(wait=True)


def test_headers_of_blocks_whose_parent_is_not_the_block_before():
    """The expected headers reuse a block's key digest as the next block's parent digest only
    when that block is its parent: a job whose blocks are not a chain (a load starting after a
    local prefix, blocks listed out of order) still expects each block's own parent."""
    w = worker()
    r = refs(6)
    for ref in r:
        store(w, ref)
    job = [r[3], r[1], r[2], r[5]]      # r[1]'s parent is r[0], r[5]'s is r[4]
    assert w._packed_headers(job) == [w._header(x).pack() for x in job]
    failed, st, _ = w._load(LoadJob("req", job, [0]))
    assert failed == set() and st["load_blocks"] == 4
    # and a stored parent that differs is still caught when the previous block is the parent
    store(w, r[2], parent_hash=r[0].block_hash)
    failed, st, _ = w._load(LoadJob("req2", r[1:3], [0]))
    assert failed == {r[2].block_id} and st["load_header_mismatch_blocks"] == 1
    w.pool.shutdown(wait=True)


def test_loaded_blocks_are_logged_only_with_record_blocks():
    w = worker(record_blocks=True)
    r = refs(3)
    for ref in r:
        store(w, ref)
    failed, st, _ = w._load(LoadJob("req", r, [0]))
    assert not failed and st["load_blocks"] == 3
    assert w.loaded_log == [("req", ref.block_id, ref.block_hash) for ref in r]
    assert len(w.load_times) == 1 and 0 < w.load_times[0] <= st["load_s"]
    w.pool.shutdown(wait=True)


def test_the_lease_is_released_after_the_load_returns():
    w = worker()
    r = refs(2)
    for ref in r:
        store(w, ref)
    w.client.release_gate.clear()   # the release blocks until the test lets it go
    failed, st, _ = w._load(LoadJob("req", r, [77]))
    # The load is complete (the request may resume) while the release is still pending.
    assert not failed and st["load_blocks"] == 2
    assert w.client.released == []
    w.client.release_gate.set()
    w.pool.shutdown(wait=True)
    assert w.client.released == [77]


def test_the_lease_is_released_inline_once_the_pool_is_shut_down():
    w = worker()
    r = refs(1)
    store(w, r[0])
    w.pool.shutdown(wait=True)
    failed, _, _ = w._load(LoadJob("req", r, [5]))
    assert not failed and w.client.released == [5]


def test_no_lease_means_no_release():
    w = worker()
    r = refs(1)
    store(w, r[0])
    w._load(LoadJob("req", r, [0]))
    w.pool.shutdown(wait=True)
    assert w.client.released == []


def test_registration_is_retried_while_the_daemon_is_unavailable():
    from mcstore import StoreError, UnavailableError
    w = worker()
    w.cfg.update(connect_wait_s=30, address="unix:/nowhere.sock")
    calls = []

    def flaky(name, size):
        calls.append(name)
        if len(calls) < 3:
            raise UnavailableError("connection attempt timed out before receiving SETTINGS")
        return 42

    assert w._while_unavailable(flaky, "/kv", 4096) == 42 and calls == ["/kv"] * 3
    # other errors are not retried; with no wait configured UNAVAILABLE stands at once
    def denied(*_):
        calls.append("denied")
        raise StoreError(Code.PERMISSION_DENIED, "no")
    try:
        w._while_unavailable(denied)
        raise AssertionError("PERMISSION_DENIED was swallowed")
    except StoreError as e:
        assert e.code is Code.PERMISSION_DENIED and calls[-1] == "denied"
    w.cfg["connect_wait_s"] = 0
    calls.clear()
    try:
        w._while_unavailable(flaky, "/kv", 4096)
        raise AssertionError("UNAVAILABLE was swallowed")
    except UnavailableError:
        assert calls == ["/kv"]
    w.pool.shutdown(wait=True)


class OldDaemonClient:
    """An mc-client older than block layouts: a layout put stores an empty object (it sees
    items with neither data nor slices) and a layout get answers inline."""

    def __init__(self):
        self.objects = {}

    def put(self, keys, values, replicas=None):
        for k in keys:
            self.objects[k] = b""
        return [GetResult(Code.OK, "", k) for k in keys]

    def get(self, keys, into=None, lease=None):
        if into is not None:   # inline answer, nothing written: parse_get makes it INTERNAL
            return [GetResult(Code.INTERNAL, "daemon answered OK but 0 bytes written of 0", k)
                    for k in keys]
        return [GetResult(Code.OK, "", k, size=0, data=self.objects[k]) for k in keys]


class FakeLayout:
    def blocks(self, ids):
        return ("layout", list(ids))


def test_a_daemon_without_block_layouts_falls_back_to_per_block_slices(caplog):
    w = worker()
    w.cfg["address"] = "unix:/old.sock"
    w.client = OldDaemonClient()
    w._load_layout = w._save_layout = FakeLayout()
    assert w._blocks([3, 4], False) == ("layout", [3, 4])
    w._probe_block_layouts(b"probe", b"kv bytes")
    assert w._load_layout is None and w._save_layout is None
    assert "does not serve block layouts (read back: 0 bytes" in caplog.text
    assert w._blocks([3, 4], False) == [3, 4] and w._blocks([5], True) == [5]
