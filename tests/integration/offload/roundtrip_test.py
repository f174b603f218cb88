"""SSD round trip through the real daemons: 64 MiB of 1 MiB values through an 8 MiB memory
segment. Offload keeps up (puts are paced on mc_client_offloads_total), every value reads back
exactly (mostly from the SSD tier), and the master's status line and the client's metrics show
the tier at work."""

import unittest

from integration.offload import ssd_cluster as sc
from integration.client import client_cluster as cc

MiB = sc.MiB
N = 64


class RoundTripTest(unittest.TestCase):
    def setUp(self):
        self.c = sc.SsdCluster(clients=1, segment_size=8 * MiB, ssd_capacity=256 * MiB,
                               pure_clients=1)
        self.addCleanup(self.c.stop)
        self.c.start()
        self.s0 = self.c.stub(0)
        self.s1 = self.c.stub(1)  # pure client: reads remote DISK replicas over kReadDisk

    def test_data_set_eight_times_memory_reads_back_exactly(self):
        keys = [b"rt-%03d" % i for i in range(N)]
        values = [sc.value(i) for i in range(N)]
        try:
            sc.paced_put(self, self.c, self.s0, keys, values)
            # Memory holds at most 8 of them: the rest must come from the SSD tier.
            master = cc.metrics(self.c.master_http())
            self.assertLessEqual(master["mc_memory_used_bytes"], 8 * MiB)
            self.assertEqual(master.get("mc_put_no_space_total", 0), 0)
            sc.assert_exact(self, self.s0, keys, values, what="owner")
            sc.assert_exact(self, self.s1, keys, values, what="pure client")
            used, capacity = self.c.master_ssd_used()
            self.assertGreater(sc.leading_bytes_as_number(used), 0, self.c.master_status())
            self.assertGreater(sc.leading_bytes_as_number(capacity), 0)
            self.assertGreater(self.c.client_metric(0, "mc_ssd_reads_total"), 0)
            self.assertGreaterEqual(self.c.offloads(0), N - 8)
            self.assertEqual(self.c.offloads(0, "failed"), 0)
            self.assertGreater(self.c.client_metric(0, "mc_client_disk_reads_total", result="ok"), 0)
        except Exception:
            self.c.dump_logs()
            raise


if __name__ == "__main__":
    unittest.main()
