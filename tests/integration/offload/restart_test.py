"""Persistence of the SSD tier across restarts: after a SIGTERM or a SIGKILL of the owning
client, and after a SIGKILL of the master, every offloaded value reads back byte-exact, through
the owner (its own tier) and through a pure client (--segment_size 0, remote kReadDisk)."""

import signal
import unittest

from integration import harness
from integration.offload import ssd_cluster as sc

MiB = sc.MiB
N = 24


class RestartTest(unittest.TestCase):
    def setUp(self):
        self.c = sc.SsdCluster(clients=1, segment_size=8 * MiB, pure_clients=1)
        self.addCleanup(self.c.stop)
        self.c.start()
        self.keys = [b"rs-%03d" % i for i in range(N)]
        self.values = [sc.value(i, salt=7) for i in range(N)]
        sc.paced_put(self, self.c, self.c.stub(0), self.keys, self.values)
        # Everything persisted before the crash (memory replicas die with the client).
        self.c.wait_offloaded(0, N)

    def check_all(self, what):
        sc.assert_exact(self, self.c.stub(0), self.keys, self.values, what=what + ", owner")
        sc.assert_exact(self, self.c.stub(1), self.keys, self.values, what=what + ", pure client")

    def restart_client_and_check(self, sig):
        try:
            self.c.restart_client(0, sig)
            self.c.wait_reported(0, N)
            self.assertEqual(self.c.ssd_records(0), N)
            self.check_all("after %s" % signal.Signals(sig).name)
            self.assertGreaterEqual(self.c.client_metric(0, "mc_ssd_records_recovered_total"), N)
            self.assertEqual(self.c.client_metric(0, "mc_ssd_records_skipped_total"), 0)
        except Exception:
            self.c.dump_logs()
            raise

    def test_client_sigterm(self):
        self.restart_client_and_check(signal.SIGTERM)

    def test_client_sigkill(self):
        self.restart_client_and_check(signal.SIGKILL)

    def test_client_sigkill_twice_then_new_puts(self):
        self.restart_client_and_check(signal.SIGKILL)
        self.restart_client_and_check(signal.SIGKILL)
        # New puts after recovery get fresh generations and persist next to the old records.
        more = [b"rs-new-%d" % i for i in range(8)]
        vals = [sc.value(i, salt=8) for i in range(8)]
        sc.paced_put(self, self.c, self.c.stub(0), more, vals)
        self.c.wait_offloaded(0, 8)
        self.c.restart_client(0, signal.SIGKILL)
        self.c.wait_reported(0, N + 8)
        self.check_all("after third restart")
        sc.assert_exact(self, self.c.stub(1), more, vals, what="new puts")

    def test_master_sigkill(self):
        try:
            old_regs = self.c.client_metric(0, "mc_client_registrations")
            self.c.restart_master()
            harness.wait_until(
                lambda: self.c.client_metric(0, "mc_client_registrations") > old_regs, 30,
                what="client 0 registered with the new master")
            self.c.wait_clients_alive(2)
            harness.wait_until(lambda: all(sc.cc.exist(self.c.stub(1), self.keys)), 30,
                               what="every key known to the new master")
            self.check_all("after master restart")
            used, _ = self.c.master_ssd_used()
            self.assertGreater(sc.leading_bytes_as_number(used), 0)
        except Exception:
            self.c.dump_logs()
            raise


if __name__ == "__main__":
    unittest.main()
