"""The SSD tier when it is full: a tier too small for any record (offloads fail, counted, and the
memory path keeps working), and a tier filled past its watermark while a MatchPrefix lease holds
keys that live only on disk (the lease blocks their reclaim; once released they can go)."""

import unittest

from integration import harness
from integration.offload import ssd_cluster as sc
from mcstore.v1 import store_pb2 as spb

MiB = sc.MiB


class FullDiskTest(unittest.TestCase):
    def setUp(self):
        # 256 KiB in one file: no 1 MiB record ever fits.
        self.c = sc.SsdCluster(clients=1, segment_size=8 * MiB, ssd_capacity=256 * sc.KiB,
                               ssd_extra=["--offload_files", "1"], pure_clients=1)
        self.addCleanup(self.c.stop)
        self.c.start()

    def test_offloads_fail_and_memory_keeps_working(self):
        try:
            stub = self.c.stub(0)
            n = 32
            keys = [b"fd-%03d" % i for i in range(n)]
            values = [sc.value(i, salt=21) for i in range(n)]
            for k, v in zip(keys, values):
                r = sc.cc.put_inline(stub, [(k, v)])[0]
                self.assertEqual(r.code, sc.OK, "put %r: %s" % (k, r.message))
            harness.wait_until(
                lambda: self.c.offloads(0, "failed") + self.c.client_metric(
                    0, "mc_ssd_failures_total") > 0, 30, what="failed offloads counted")
            self.assertEqual(self.c.offloads(0, "ok"), 0)
            self.assertEqual(self.c.ssd_records(0), 0)
            # Let the master's background pass bring memory under its high watermark first: an
            # eviction racing with the reads below could otherwise pick a key they just touched.
            def settled():
                used = sc.cc.metric(self.c.master_http(), "mc_memory_used_bytes")
                cap = sc.cc.metric(self.c.master_http(), "mc_memory_capacity_bytes")
                return cap > 0 and used <= 0.95 * cap
            harness.wait_until(settled, 30, what="memory under the high watermark")
            # Every acknowledged value is exact or a miss; the newest ones are in memory.
            # (Newest first: a batch get makes its keys equally recent, at ms resolution, so
            # reading everything first could let eviction pick any of them next.)
            for s in (stub, self.c.stub(1)):
                sc.assert_exact(self, s, keys[-4:], values[-4:], what="newest")
                sc.assert_never_wrong(self, s, keys, values, allowed=(sc.NOT_FOUND,))
            # Small values still offload? No: nothing fits. Memory puts and gets keep working.
            small = [(b"fd-small-%d" % i, sc.value(i, 8192, salt=22)) for i in range(16)]
            for r in sc.cc.put_inline(stub, small):
                self.assertEqual(r.code, sc.OK)
            sc.assert_exact(self, self.c.stub(1), [k for k, _ in small], [v for _, v in small])
        except Exception:
            self.c.dump_logs()
            raise


class LeasedDiskReplicaTest(unittest.TestCase):
    def setUp(self):
        # 24 MiB of SSD in one file (about 22 records of 1 MiB below its 0.95 watermark): filling
        # it forces the tier's own eviction, which must ask the master first.
        self.c = sc.SsdCluster(clients=1, segment_size=8 * MiB, ssd_capacity=24 * MiB,
                               ssd_extra=["--offload_files", "1"], pure_clients=1)
        self.addCleanup(self.c.stop)
        self.c.start()
        self.s0 = self.c.stub(0)
        self.s1 = self.c.stub(1)

    def memory_replica_gone(self, keys):
        """True once none of `keys` is in memory any more (a get of each counts an SSD read)."""
        before = self.c.client_metric(0, "mc_ssd_reads_total")
        res = sc.get_all(self.s0, keys)
        return all(r.code == sc.OK for r in res) and \
            self.c.client_metric(0, "mc_ssd_reads_total") - before >= len(keys)

    def test_lease_blocks_reclaim_until_released(self):
        try:
            pinned = [b"ls-pin-%d" % i for i in range(3)]
            pvals = [sc.value(i, salt=31) for i in range(3)]
            # Then 10 MiB more (paced): the pinned keys, offloaded first, leave memory.
            filler = [b"ls-fill-%03d" % i for i in range(10)]
            fvals = [sc.value(i, salt=32) for i in range(10)]
            sc.paced_put(self, self.c, self.s0, pinned + filler, pvals + fvals)
            self.assertTrue(self.memory_replica_gone(pinned), "pinned keys must be on disk only")

            m = self.s1.MatchPrefix(spb.MatchPrefixRequest(keys=pinned, lease_ttl_ms=600000),
                                    timeout=30)
            self.assertEqual(m.matched, 3)
            self.assertNotEqual(m.lease_id, 0)

            # Fill the tier well past its watermark: its eviction runs, the leased keys stay.
            more = [b"ls-more-%03d" % i for i in range(24)]
            mvals = [sc.value(i, salt=33) for i in range(24)]
            sc.paced_put(self, self.c, self.s0, more, mvals)
            harness.wait_until(lambda: self.c.client_metric(0, "mc_ssd_evictions_total") > 0, 30,
                               what="SSD tier evictions")
            self.assertEqual(self.c.offloads(0, "failed"), 0)
            got = self.s1.BatchGet(spb.BatchGetRequest(
                items=[spb.GetItem(key=k) for k in pinned], lease_id=m.lease_id), timeout=30)
            for k, v, r in zip(pinned, pvals, got.results):
                self.assertEqual(r.code, sc.OK, "leased %r: %s" % (k, r.message))
                self.assertTrue(r.data == v)
            sc.assert_exact(self, self.s0, pinned, pvals, what="leased, plain get")
            # Every other key: exact or reclaimed (a miss), never wrong.
            sc.assert_never_wrong(self, self.s1, filler + more, fvals + mvals,
                                  allowed=(sc.NOT_FOUND,))

            # Released: the tier may reclaim them. More puts push them out.
            self.s1.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=m.lease_id), timeout=30)
            extra = [b"ls-extra-%03d" % i for i in range(24)]
            evals = [sc.value(i, salt=34) for i in range(24)]
            sc.paced_put(self, self.c, self.s0, extra, evals)
            harness.wait_until(lambda: not any(sc.cc.exist(self.s0, pinned)), 30,
                               what="released keys reclaimed")
            sc.assert_never_wrong(self, self.s1, pinned + extra, pvals + evals,
                                  allowed=(sc.NOT_FOUND,))
        except Exception:
            self.c.dump_logs()
            raise


if __name__ == "__main__":
    unittest.main()
