"""Network faults with a real network: the holder of every replica runs in a network namespace the
test creates, joined to the host by a veth pair; the master and a pure client (the reader) stay in
the host's namespace. A partition is a pair of blackhole routes (packets vanish silently, as on a
broken switch, instead of failing fast), healed by deleting them.

- A short partition (below the master's client TTL): gets through the reader are answered within
  a bounded time, never with wrong bytes; after healing every key reads back exactly.
- A long partition (past the TTL): the master drops the holder; the holder re-registers after
  healing; every get is exact or a miss, never wrong bytes, and the cluster takes new puts.
- Delay and loss with `tc netem` run where the kernel has sch_netem (this project's CI kernel
  has not: the test says so and skips those cases).

Needs root (ip netns); skips otherwise. Names carry the test's pid; cleanup removes them.
"""

import os
import subprocess
import time
import unittest

from integration import harness
from integration.client import client_cluster as cc

MiB = cc.MiB
SUBNET = 10 + os.getpid() % 240  # 10.213.SUBNET.0/30


def sh(*cmd, check=True):
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r


class NetnsCluster(cc.Cluster):
    """Master and client 1 (pure, the reader) in the host namespace; client 0 (the holder) in
    namespace `ns`, reachable at `b_addr`."""

    def __init__(self, ns, a_addr, b_addr, **kw):
        super().__init__(clients=1, pure_clients=1, segment_size=32 * MiB, **kw)
        self.ns, self.a_addr, self.b_addr = ns, a_addr, b_addr

    def start_master(self, port=0):
        args = ["--listen", "%s:%d" % (self.a_addr, port), "--http", "127.0.0.1:0",
                "--maintenance_interval_ms", "50", "--client_ttl_ms", "3000",
                "--heartbeat_interval_ms", "200", "--log_level", "warn"] + self.master_args
        self.master = harness.Daemon("mc-master", harness.binary("master/mc-master"), args,
                                     self.tmp).start()
        return self.master

    def _start_client(self, i):
        in_ns = i == 0
        host = self.b_addr if in_ns else "127.0.0.1"
        args = ["--master", self.master.ready["grpc"], "--listen", "%s:0" % host,
                "--http", "%s:0" % host, "--data", "%s:0" % (self.b_addr if in_ns else self.a_addr),
                "--client_id", "n%d" % i, "--segment_size", str(self.segment_size if in_ns else 0),
                "--log_level", "warn", "--cluster_secret_file", harness.cluster_secret_file(),
                "--store_token_file", self.token_file]
        if in_ns:
            return harness.Daemon("mc-client-%d" % i, "/usr/sbin/ip",
                                  ["netns", "exec", self.ns, harness.binary("client/mc-client")] +
                                  args, self.tmp).start()
        return harness.Daemon("mc-client-%d" % i, harness.binary("client/mc-client"), args,
                              self.tmp).start()


class PartitionTest(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root for ip netns")
        tag = "%d" % (os.getpid() % 100000)
        self.ns = "mcf" + tag
        self.veth_a, self.veth_b = "mcfa" + tag, "mcfb" + tag
        self.a_addr, self.b_addr = "10.213.%d.1" % SUBNET, "10.213.%d.2" % SUBNET
        try:
            sh("ip", "netns", "add", self.ns)
        except RuntimeError as e:
            self.skipTest("cannot create a network namespace: %s" % e)
        self.addCleanup(sh, "ip", "netns", "del", self.ns, check=False)
        sh("ip", "link", "add", self.veth_a, "type", "veth", "peer", "name", self.veth_b)
        self.addCleanup(sh, "ip", "link", "del", self.veth_a, check=False)
        sh("ip", "link", "set", self.veth_b, "netns", self.ns)
        sh("ip", "addr", "add", self.a_addr + "/30", "dev", self.veth_a)
        sh("ip", "link", "set", self.veth_a, "up")
        ns = ["ip", "netns", "exec", self.ns]
        sh(*ns, "ip", "addr", "add", self.b_addr + "/30", "dev", self.veth_b)
        sh(*ns, "ip", "link", "set", self.veth_b, "up")
        sh(*ns, "ip", "link", "set", "lo", "up")
        # The short partition must stay below the client TTL: the holder's gets fail after the
        # data plane's deadline (~5 s), so that test runs with a 15 s TTL.
        ttl = "15000" if self._testMethodName == "test_short_partition" else "3000"
        self.c = NetnsCluster(self.ns, self.a_addr, self.b_addr,
                              master_args=["--client_ttl_ms", ttl])
        self.addCleanup(self.c.stop)
        self.addCleanup(self.heal)
        self.c.start()
        self.reader = self.c.stub(1)
        self.keys = [b"np-%03d" % i for i in range(16)]
        self.values = [cc.payload(256 * 1024, 7000 + i) for i in range(16)]
        for r in cc.put_inline(self.reader, list(zip(self.keys, self.values))):
            self.assertEqual(r.code, cc.spb.OK, r.message)

    def partition(self):
        sh("ip", "route", "add", "blackhole", self.b_addr + "/32")
        sh("ip", "netns", "exec", self.ns, "ip", "route", "add", "blackhole", self.a_addr + "/32")

    def heal(self):
        sh("ip", "route", "del", "blackhole", self.b_addr + "/32", check=False)
        sh("ip", "netns", "exec", self.ns, "ip", "route", "del", "blackhole",
           self.a_addr + "/32", check=False)

    def read_all(self):
        return cc.get_inline(self.reader, self.keys)

    def assert_never_wrong(self, results, what):
        for k, v, r in zip(self.keys, self.values, results):
            if r.code == cc.spb.OK:
                self.assertTrue(r.data == v, "%s: wrong bytes for %r" % (what, k))

    def test_short_partition(self):
        try:
            for r, v in zip(self.read_all(), self.values):
                self.assertEqual(r.code, cc.spb.OK)
                self.assertTrue(r.data == v)
            self.partition()
            t0 = time.monotonic()
            during = self.read_all()
            took = time.monotonic() - t0
            self.assert_never_wrong(during, "during the partition")
            codes = sorted({cc.code_name(r.code) for r in during})
            print("short partition: a batch get answered in %.1f s with %s" % (took, codes))
            self.assertLess(took, 40.0, "a get during a partition must be answered in bounded time")
            self.heal()

            def all_exact():
                res = self.read_all()
                self.assert_never_wrong(res, "after healing")
                return all(r.code == cc.spb.OK for r in res)
            harness.wait_until(all_exact, 30, interval_s=0.5, what="every key readable again")
        except Exception:
            self.c.dump_logs()
            raise

    def test_partition_past_the_client_ttl(self):
        try:
            self.partition()
            harness.wait_until(
                lambda: cc.metric(self.c.master_http(), "mc_clients_alive") == 1, 20,
                what="the master drops the partitioned holder")
            during = self.read_all()
            self.assert_never_wrong(during, "while the holder is dropped")
            self.heal()
            self.c.wait_clients_alive(2, timeout_s=30)
            after = self.read_all()
            self.assert_never_wrong(after, "after the holder came back")
            readable = sum(1 for r in after if r.code == cc.spb.OK)
            print("partition past the TTL: %d/%d keys readable after the holder came back "
                  "(a returning client does not re-report memory objects yet: issue 16)"
                  % (readable, len(self.keys)))
            fresh = [(b"np-new-%d" % i, cc.payload(64 * 1024, 7100 + i)) for i in range(4)]
            for r in cc.put_inline(self.reader, fresh):
                self.assertEqual(r.code, cc.spb.OK, r.message)
            for (k, v), r in zip(fresh, cc.get_inline(self.reader, [k for k, _ in fresh])):
                self.assertEqual(r.code, cc.spb.OK)
                self.assertTrue(r.data == v)
        except Exception:
            self.c.dump_logs()
            raise

    def test_delay_and_loss(self):
        probe = sh("ip", "netns", "exec", self.ns, "tc", "qdisc", "add", "dev", self.veth_b,
                   "root", "netem", "delay", "20ms", "loss", "2%", check=False)
        if probe.returncode != 0:
            self.skipTest("tc netem unavailable on this kernel: %s" % probe.stderr.strip())
        try:
            t0 = time.monotonic()
            for _ in range(3):
                res = self.read_all()
                self.assert_never_wrong(res, "under delay and loss")
                for r in res:
                    self.assertEqual(r.code, cc.spb.OK, cc.code_name(r.code))
            print("delay 20 ms + 2%% loss: 3 batch gets of 16 x 256 KiB in %.1f s"
                  % (time.monotonic() - t0))
        except Exception:
            self.c.dump_logs()
            raise


if __name__ == "__main__":
    unittest.main()
