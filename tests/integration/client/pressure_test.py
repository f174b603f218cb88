"""Memory pressure through real daemons: a 2 x 32 MiB pool takes 3x its capacity in 1 MiB puts
(every put succeeds, eviction passes succeed), keys pinned by a MatchPrefix lease survive intact,
and once the lease is released they become evictable. A put into a pool that is full of leased
keys waits for the reads to end instead of failing (--put_no_space_wait_ms)."""

import threading
import time
import unittest

from integration.client import client_cluster as cc
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB
SEGMENT = 32 * MiB
VALUE = MiB
PINNED = 4


def value(i):
    # Cheap, distinct per key: an 8-byte index tag repeated.
    return (b"%08d" % i) * (VALUE // 8)


class PressureTest(cc.ClusterTestMixin, unittest.TestCase):
    def setUp(self):
        self.cluster = cc.Cluster(clients=2, segment_size=SEGMENT)
        self.addCleanup(self.cluster.stop)
        self.cluster.start()
        self.s0 = self.cluster.stub(0)
        self.s1 = self.cluster.stub(1)

    def put_range(self, stub, start, count, batch=4):
        for b in range(start, start + count, batch):
            keys = list(range(b, min(b + batch, start + count)))
            res = cc.put_inline(stub, [(b"p-%d" % i, value(i)) for i in keys])
            for i, r in zip(keys, res):
                self.assertEqual(r.code, spb.OK, "put p-%d: %s %s" % (i, cc.code_name(r.code),
                                                                      r.message))

    def test_three_times_capacity_with_pinned_prefix(self):
        capacity = 2 * SEGMENT
        # The pinned prefix, read back through the other client under its lease.
        self.put_range(self.s0, 0, PINNED)
        pinned_keys = [b"p-%d" % i for i in range(PINNED)]
        m = self.s1.MatchPrefix(spb.MatchPrefixRequest(keys=pinned_keys + [b"p-none"],
                                                       lease_ttl_ms=600000), timeout=30)
        self.assertEqual(m.matched, PINNED)
        self.assertNotEqual(m.lease_id, 0)

        # 3x capacity, alternating writers.
        total = 3 * capacity // VALUE
        for start in range(PINNED, total, 8):
            self.put_range(self.s0 if (start // 8) % 2 else self.s1, start,
                           min(8, total - start))

        master = cc.metrics(self.cluster.master_http())
        attempts = master.get("mc_eviction_attempts_total", 0)
        failures = master.get("mc_eviction_failures_total", 0)
        self.assertGreater(attempts, 0, "the pool overflowed, eviction must have run")
        # Failures, not attempts - successes: the background pass may be running as we read.
        self.assertLessEqual(failures, 0.01 * attempts, (failures, attempts))
        self.assertEqual(master.get("mc_put_no_space_total", 0), 0)
        self.assertLessEqual(master.get("mc_memory_used_bytes"), capacity)

        # Pinned keys survived, through the lease and through a plain get.
        got = self.s1.BatchGet(spb.BatchGetRequest(items=[spb.GetItem(key=k) for k in pinned_keys],
                                                   lease_id=m.lease_id), timeout=30).results
        for i, r in enumerate(got):
            self.assertEqual(r.code, spb.OK, r.message)
            self.assertTrue(r.data == value(i), "pinned key %d intact" % i)
        got = cc.get_inline(self.s0, pinned_keys)
        self.assertEqual([r.code for r in got], [spb.OK] * PINNED)
        self.assertEqual(cc.exist(self.s0, pinned_keys), [True] * PINNED)
        # Removal of a leased key is refused while the lease holds.
        rm = self.s0.BatchRemove(spb.BatchRemoveRequest(keys=pinned_keys[:1]), timeout=30).results
        self.assertEqual(cc.code_name(rm[0].code), "HAS_LEASE", rm[0].message)

        # Released: evictable again. Another capacity's worth of puts pushes them out.
        self.s1.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=m.lease_id), timeout=30)
        self.put_range(self.s0, total, capacity // VALUE + 8)
        alive = cc.exist(self.s0, pinned_keys)
        if any(alive):
            # Still present (LRU chose others): they must at least be removable now.
            rm = self.s0.BatchRemove(spb.BatchRemoveRequest(
                keys=[k for k, a in zip(pinned_keys, alive) if a]), timeout=30).results
            self.assertEqual([cc.code_name(r.code) for r in rm], ["OK"] * sum(alive),
                             [r.message for r in rm])
        self.assertEqual(cc.exist(self.s0, pinned_keys), [False] * PINNED)
        self.assertTrue(self.cluster.healthy(0) and self.cluster.healthy(1))


class SmallPoolTest(cc.ClusterTestMixin, unittest.TestCase):
    """One client with 4 MiB (puts wait up to 20 s for room). The background eviction pass is off
    (high watermark 1.0): filling memory to the brim must not make it evict on its own."""

    def setUp(self):
        self.cluster = cc.Cluster(clients=1, segment_size=4 * MiB,
                            master_args=["--high_watermark", "1.0"],
                            client_args=["--put_no_space_wait_ms", "20000"])
        self.addCleanup(self.cluster.stop)
        self.cluster.start()
        self.s = self.cluster.stub(0)

    def retries(self):
        return cc.metric(self.cluster.http(0), "mc_client_put_no_space_retries_total")

    def test_put_waits_for_the_reads_to_end(self):
        keys = [b"held-%d" % i for i in range(4)]
        res = cc.put_inline(self.s, [(k, value(i)) for i, k in enumerate(keys)])
        self.assertEqual([r.code for r in res], [spb.OK] * 4, [r.message for r in res])
        m = self.s.MatchPrefix(spb.MatchPrefixRequest(keys=keys, lease_ttl_ms=600000), timeout=30)
        self.assertEqual(m.matched, 4)

        answer = []
        writer = threading.Thread(
            target=lambda: answer.extend(cc.put_inline(self.s, [(b"late", value(99))])))
        writer.start()
        try:
            # The put is waiting (it was answered NO_SPACE and is being retried) ...
            deadline = time.monotonic() + 15
            while self.retries() == 0 and time.monotonic() < deadline:
                time.sleep(0.02)  # the poll interval, inside the deadline above
            self.assertGreater(self.retries(), 0, "the put never met a full pool")
            self.assertTrue(writer.is_alive(), "the put must still be waiting")
        finally:
            # ... until the reader lets go; then eviction makes room and it lands.
            self.s.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=m.lease_id), timeout=30)
            writer.join(timeout=30)
        self.assertFalse(writer.is_alive())
        self.assertEqual(len(answer), 1)
        self.assertEqual(answer[0].code, spb.OK, "%s %s" % (cc.code_name(answer[0].code),
                                                             answer[0].message))
        got = cc.get_inline(self.s, [b"late"])
        self.assertEqual(got[0].code, spb.OK)
        self.assertTrue(got[0].data == value(99))
        self.assertGreater(cc.metric(self.cluster.master_http(), "mc_put_no_space_total"), 0)

    def test_an_object_no_segment_holds_fails_at_once_and_evicts_nothing(self):
        keys = [b"kept-%d" % i for i in range(4)]
        res = cc.put_inline(self.s, [(k, value(i)) for i, k in enumerate(keys)])
        self.assertEqual([r.code for r in res], [spb.OK] * 4, [r.message for r in res])
        big = cc.put_inline(self.s, [(b"too-big", b"x" * (5 * MiB))])
        self.assertEqual(big[0].code, spb.NO_SPACE, big[0].message)
        self.assertIn("largest segment", big[0].message)
        self.assertEqual(self.retries(), 0, "no wait can cure it: not retried")
        self.assertEqual(cc.metric(self.cluster.master_http(), "mc_evicted_keys_total"), 0)
        self.assertEqual(cc.exist(self.s, keys), [True] * 4)


if __name__ == "__main__":
    unittest.main()
