"""Promotion through the real daemons (mc-client --promote_on_hit): a value that lives only on the
SSD tier is read (from SSD), written back into memory from a re-verified private copy, and the
next read of it is a memory read with the same bytes."""

import unittest

from integration.offload import ssd_cluster as sc
from integration.client import client_cluster as cc
from integration import harness

MiB = sc.MiB
N = 24


class PromoteTest(unittest.TestCase):
    def setUp(self):
        self.c = sc.SsdCluster(clients=1, segment_size=8 * MiB, ssd_capacity=256 * MiB,
                               ssd_extra=("--promote_on_hit",))
        self.addCleanup(self.c.stop)
        self.c.start()
        self.s0 = self.c.stub(0)

    def test_ssd_hit_is_promoted_and_then_read_from_memory(self):
        keys = [b"pr-%03d" % i for i in range(N)]
        values = [sc.value(i, salt=7) for i in range(N)]
        try:
            sc.paced_put(self, self.c, self.s0, keys, values)
            # Wait until the first key has left memory (its DISK replica is all that is left).
            harness.wait_until(lambda: self.ssd_reads_for(keys[0]) > 0, 30, interval_s=0.1,
                               what="first key served from the SSD tier")
            promoted = self.c.client_metric(0, "mc_client_promotions_total", result="ok")
            self.assertGreaterEqual(promoted, 1, "an SSD hit was not promoted")
            self.assertEqual(self.c.client_metric(0, "mc_client_promotions_total",
                                                  result="failed"), 0)
            # The promoted copy serves the next read from memory, byte for byte.
            before = self.c.client_metric(0, "mc_ssd_reads_total")
            sc.assert_exact(self, self.s0, [keys[0]], [values[0]], what="after promotion")
            self.assertEqual(self.c.client_metric(0, "mc_ssd_reads_total"), before,
                             "the promoted key was read from SSD again")
            sc.assert_exact(self, self.s0, keys, values, what="all")
        except Exception:
            self.c.dump_logs()
            raise

    def ssd_reads_for(self, key):
        """Reads `key` (checking its bytes) and returns how many SSD reads that took."""
        before = self.c.client_metric(0, "mc_ssd_reads_total")
        sc.assert_exact(self, self.s0, [key], [sc.value(0, salt=7)], what="probe")
        return self.c.client_metric(0, "mc_ssd_reads_total") - before


if __name__ == "__main__":
    unittest.main()
