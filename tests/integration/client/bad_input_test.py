"""mc-client bad input: per-item errors with the right codes, the daemon stays up, and nothing in
the cluster changes. Client 0 runs with --max_inline_bytes=1 MiB."""

import time
import unittest

import grpc

from integration.client import client_cluster as cc
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB
KiB = cc.KiB
SENTINEL = 0x5C


class BadInputTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=2, segment_size=32 * MiB,
                                 per_client_args={0: ["--max_inline_bytes", str(MiB)]}).start()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def setUp(self):
        self.c = self.cluster
        self.s = self.c.stub(0)
        self.good = [(b"good-%d" % i, cc.payload(1000 + i, 700 + i)) for i in range(2)]
        results = cc.put_inline(self.s, self.good)
        self.assertTrue(all(r.code in (spb.OK, spb.ALREADY_EXISTS) for r in results))

    def state(self, want=None):
        """(keys, memory used, live leases) at the master. With `want`, waits up to 5 s for it:
        a get's lease release is sent as it answers, not awaited, so it may land just after."""
        deadline = time.monotonic() + 5
        while True:
            m = cc.metrics(self.c.master_http())
            got = (m.get("mc_keys"), m.get("mc_memory_used_bytes"), m.get("mc_leases_active"))
            if want is None or got == want or time.monotonic() > deadline:
                return got
            time.sleep(0.01)  # the poll interval, inside the deadline above

    def assertStillUp(self):
        self.assertTrue(self.c.healthy(0), "client 0 /healthz")
        got = cc.get_inline(self.s, [k for k, _ in self.good])
        self.assertCodes(got, ["OK", "OK"])
        self.assertEqual([r.data for r in got], [v for _, v in self.good])

    def test_bad_put_items_fail_alone_and_change_nothing(self):
        buf = self.c.buffer(64 * KiB, self.s)
        before = self.state()
        items = [
            spb.PutItem(key=b"", data=b"x"),
            spb.PutItem(key=b"k" * (5 * KiB), data=b"x"),
            spb.PutItem(key=b"bad-unknown-buffer", slices=[spb.Slice(buffer_id=999999, offset=0,
                                                                     length=10)]),
            spb.PutItem(key=b"bad-past-end", slices=[buf.slice(64 * KiB - 10, 11)]),
            spb.PutItem(key=b"bad-overflow", slices=[buf.slice(2**64 - 5, 10)]),
            spb.PutItem(key=b"bad-inline-too-big", data=cc.payload(MiB + KiB, 1)),
            spb.PutItem(key=b"bad-empty", data=b""),
            spb.PutItem(key=b"bad-both", data=b"abc", slices=[buf.slice(0, 3)]),
            spb.PutItem(key=self.good[0][0], data=self.good[0][1]),
        ]
        resp = self.s.BatchPut(spb.BatchPutRequest(items=items), timeout=30)
        self.assertCodes(resp.results, ["INVALID_ARGUMENT"] * 8 + ["ALREADY_EXISTS"])
        self.assertIn("max_inline_bytes", resp.results[5].message)
        self.assertEqual(self.state(want=before), before)
        self.assertEqual(cc.exist(self.s, [b"bad-unknown-buffer", b"bad-past-end",
                                           b"bad-inline-too-big", b"bad-empty", b"bad-both"]),
                         [False] * 5)
        self.assertStillUp()

    def test_bad_get_items_fail_alone(self):
        buf = self.c.buffer(64 * KiB, self.s, fill=SENTINEL)
        gk, gv = self.good[0]
        before = self.state()
        items = [
            spb.GetItem(key=b""),
            spb.GetItem(key=b"k" * (5 * KiB)),
            spb.GetItem(key=gk, slices=[spb.Slice(buffer_id=424242, offset=0, length=len(gv))]),
            spb.GetItem(key=gk, slices=[buf.slice(64 * KiB - 10, len(gv))]),
            spb.GetItem(key=b"never-put"),
            spb.GetItem(key=gk, slices=[buf.slice(0, len(gv) - 1)]),
            spb.GetItem(key=gk, slices=[buf.slice(4096, len(gv))]),
        ]
        got = self.s.BatchGet(spb.BatchGetRequest(items=items), timeout=30).results
        self.assertCodes(got, ["INVALID_ARGUMENT", "INVALID_ARGUMENT", "INVALID_ARGUMENT",
                               "INVALID_ARGUMENT", "NOT_FOUND", "SIZE_MISMATCH", "OK"])
        for r in got[:6]:
            self.assertEqual(r.data, b"")
        self.assertEqual(buf.read(0, len(gv) - 1), bytes([SENTINEL]) * (len(gv) - 1))
        self.assertEqual(buf.read(4096, len(gv)), gv)
        self.assertEqual(self.state(want=before), before)
        self.assertStillUp()

    def test_inline_get_over_the_limit(self):
        # Stored through client 1 (no small limit); client 0 cannot hand it out inline.
        big = cc.payload(MiB + KiB, 2)
        s1 = self.c.stub(1)
        r = cc.put_inline(s1, [(b"big-for-inline", big)])
        self.assertIn(cc.code_name(r[0].code), ("OK", "ALREADY_EXISTS"))
        got = cc.get_inline(self.s, [b"big-for-inline", self.good[0][0]])
        self.assertCodes(got, ["INVALID_ARGUMENT", "OK"])
        self.assertEqual(got[1].data, self.good[0][1])
        buf = self.c.buffer(len(big), self.s, fill=SENTINEL)
        got = self.s.BatchGet(spb.BatchGetRequest(items=[
            spb.GetItem(key=b"big-for-inline", slices=[buf.slice(0, len(big))])]),
            timeout=30).results
        self.assertCodes(got, ["OK"])
        self.assertTrue(buf.read(0, len(big)) == big)
        self.assertStillUp()

    def test_register_buffer_errors_are_rpc_errors(self):
        buffers_before = cc.metric(self.c.http(0), "mc_client_buffers")
        # By name: off by default (the daemon would open it with its own rights).
        with self.assertRaises(grpc.RpcError) as e:
            self.s.RegisterBuffer(spb.RegisterBufferRequest(shm_name="/mc-it-no-such-shm-x",
                                                            size=4096), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED,
                         e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            self.s.RegisterBuffer(spb.RegisterBufferRequest(handle="0" * 32), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, e.exception.details())
        shm = cc.ShmBuffer(8192)
        try:
            with self.assertRaises(Exception) as e:  # refused on the fd socket already
                shm.register(self.s, size=8193)
            self.assertIn("has 8192 bytes", str(e.exception))
        finally:
            shm.close()
        self.assertEqual(cc.metric(self.c.http(0), "mc_client_buffers"), buffers_before)
        with self.assertRaises(grpc.RpcError) as e:
            self.s.UnregisterBuffer(spb.UnregisterBufferRequest(buffer_id=987654), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertStillUp()

    def test_release_of_unknown_lease_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.s.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=123456789), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertStillUp()


if __name__ == "__main__":
    unittest.main()
