"""mc-client Store paths with real daemons: cross-host (TCP data plane), local, Unix socket, pure
client (remote writes), inline and shared-memory slices, and duplicate keys in one BatchGet."""

import re
import subprocess
import time
import unittest

import grpc

from integration import harness
from integration.client import client_cluster as cc
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB
KiB = cc.KiB
SENTINEL = 0xA5


def tcp_bytes(cluster, i, op):
    return cc.metric(cluster.http(i), "mc_transfer_bytes_total", transport="tcp", op=op)


class StorePathsTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=2, pure_clients=1, segment_size=64 * MiB).start()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def setUp(self):
        self.c = self.cluster
        self.s0 = self.c.stub(0)
        self.s1 = self.c.stub(1)

    def test_cross_host_inline(self):
        kvs = [(b"xh-inline-%d" % i, cc.payload(n, i)) for i, n in
               enumerate([1, 100, 64 * KiB, 3 * MiB + 7])]
        before = tcp_bytes(self.c, 1, "read")
        self.assertCodes(cc.put_inline(self.s0, kvs), ["OK"] * len(kvs))
        got = cc.get_inline(self.s1, [k for k, _ in kvs])
        self.assertCodes(got, ["OK"] * len(kvs))
        for (k, v), r in zip(kvs, got):
            self.assertEqual(r.size, len(v), k)
            self.assertEqual(r.bytes_written, len(v), k)
            self.assertTrue(r.data == v, k)
        self.assertGreaterEqual(tcp_bytes(self.c, 1, "read") - before, sum(len(v) for _, v in kvs),
                                "client 1 read the replicas of client 0 over TCP")

    def test_cross_host_shm_slices(self):
        sizes = [4 * KiB, 1 * MiB, 2 * MiB + 3]
        vals = [cc.payload(n, 100 + i) for i, n in enumerate(sizes)]
        total = sum(sizes)
        src = self.c.buffer(total, self.s0)
        off = 0
        items = []
        for i, v in enumerate(vals):
            src.write(off, v)
            # Split each payload over two slices.
            h = len(v) // 2
            items.append(spb.PutItem(key=b"xh-shm-%d" % i,
                                     slices=[src.slice(off, h), src.slice(off + h, len(v) - h)]))
            off += len(v)
        resp = self.s0.BatchPut(spb.BatchPutRequest(items=items), timeout=cc.RPC_TIMEOUT_S)
        self.assertCodes(resp.results, ["OK"] * 3)

        dst = self.c.buffer(total, self.s1, fill=SENTINEL)
        before = tcp_bytes(self.c, 1, "read")
        off = 0
        gets = []
        for i, v in enumerate(vals):
            gets.append(spb.GetItem(key=b"xh-shm-%d" % i, slices=[dst.slice(off, len(v))]))
            off += len(v)
        got = self.s1.BatchGet(spb.BatchGetRequest(items=gets), timeout=cc.RPC_TIMEOUT_S).results
        self.assertCodes(got, ["OK"] * 3)
        off = 0
        for i, v in enumerate(vals):
            self.assertEqual(got[i].bytes_written, len(v))
            self.assertEqual(got[i].data, b"", "slice gets carry no inline data")
            self.assertTrue(dst.read(off, len(v)) == v, i)
            off += len(v)
        self.assertGreaterEqual(tcp_bytes(self.c, 1, "read") - before, total)

    def test_local_path(self):
        kvs = [(b"local-%d" % i, cc.payload(n, 200 + i)) for i, n in enumerate([10, 5 * MiB])]
        before = tcp_bytes(self.c, 0, "read")
        self.assertCodes(cc.put_inline(self.s0, kvs), ["OK", "OK"])
        got = cc.get_inline(self.s0, [k for k, _ in kvs])
        self.assertCodes(got, ["OK", "OK"])
        for (k, v), r in zip(kvs, got):
            self.assertTrue(r.data == v, k)
        buf = self.c.buffer(5 * MiB, self.s0, fill=SENTINEL)
        r = self.s0.BatchGet(spb.BatchGetRequest(items=[
            spb.GetItem(key=b"local-1", slices=[buf.slice(0, 5 * MiB)])]), timeout=30).results
        self.assertCodes(r, ["OK"])
        self.assertTrue(buf.read(0, 5 * MiB) == kvs[1][1])
        self.assertEqual(tcp_bytes(self.c, 0, "read"), before, "the local path uses no TCP")

    def test_unix_socket(self):
        us = self.c.unix_stub(1)
        kvs = [(b"unix-%d" % i, cc.payload(1000 + i, 300 + i)) for i in range(3)]
        self.assertCodes(cc.put_inline(us, kvs), ["OK"] * 3)
        got = cc.get_inline(us, [k for k, _ in kvs])
        self.assertCodes(got, ["OK"] * 3)
        self.assertEqual([r.data for r in got], [v for _, v in kvs])
        self.assertEqual(cc.exist(self.s0, [k for k, _ in kvs] + [b"unix-none"]),
                         [True, True, True, False])

    def test_pure_client_writes_and_reads_remotely(self):
        ps = self.c.stub(2)  # no segments: every byte goes over TCP
        v = cc.payload(2 * MiB + 1, 400)
        self.assertCodes(cc.put_inline(ps, [(b"pure-1", v)], replicas=2), ["OK"])
        for s in (ps, self.s0, self.s1):
            got = cc.get_inline(s, [b"pure-1"])
            self.assertCodes(got, ["OK"])
            self.assertTrue(got[0].data == v)

    def test_duplicates_in_one_batch_get(self):
        dup, other, last = b"dup-key", b"dup-other", b"dup-last"
        vd, vo, vl = cc.payload(256 * KiB + 3, 500), cc.payload(10 * KiB, 501), cc.payload(7, 502)
        self.assertCodes(cc.put_inline(self.s0, [(dup, vd), (other, vo), (last, vl)]),
                         ["OK"] * 3)
        # Read through client 1 (remote replicas) and client 0 (local replicas).
        for reader in (self.s1, self.s0):
            layout = [(dup, len(vd), 1), (other, len(vo), 1), (dup, len(vd), 3),
                      (b"dup-missing", 100, 1), (dup, len(vd), 2), (last, len(vl), 1)]
            total = sum(n for _, n, _ in layout)
            buf = self.c.buffer(total, reader, fill=SENTINEL)
            items, offs, off = [], [], 0
            for key, n, pieces in layout:
                step = n // pieces
                sl = []
                for p in range(pieces):
                    ln = n - step * (pieces - 1) if p == pieces - 1 else step
                    sl.append(buf.slice(off + p * step, ln))
                items.append(spb.GetItem(key=key, slices=sl))
                offs.append(off)
                off += n
            items.append(spb.GetItem(key=dup))  # and once inline
            got = reader.BatchGet(spb.BatchGetRequest(items=items), timeout=30).results
            self.assertCodes(got, ["OK", "OK", "OK", "NOT_FOUND", "OK", "OK", "OK"])
            want = {dup: vd, other: vo, last: vl}
            for i, (key, n, _) in enumerate(layout):
                if key in want:
                    self.assertEqual(got[i].bytes_written, n, i)
                    self.assertTrue(buf.read(offs[i], n) == want[key],
                                    "destination %d (%s) not fully written" % (i, key))
                else:
                    self.assertEqual(buf.read(offs[i], n), bytes([SENTINEL]) * n)
            self.assertTrue(got[6].data == vd)

    def test_match_prefix_with_and_without_lease(self):
        keys = [b"mp-%d" % i for i in range(300)]
        vals = [cc.payload(100 + i, 900 + i) for i in range(len(keys))]
        present = [i for i in range(len(keys)) if i != 200]  # the chain breaks at 200
        self.assertCodes(cc.put_inline(self.s0, [(keys[i], vals[i]) for i in present]),
                         ["OK"] * len(present))
        for reader in (self.s0, self.s1):
            plain = reader.MatchPrefix(spb.MatchPrefixRequest(keys=keys), timeout=cc.RPC_TIMEOUT_S)
            self.assertEqual(plain.matched, 200)
            self.assertEqual(plain.lease_id, 0, "no lease asked, none granted")
            self.assertEqual(reader.MatchPrefix(spb.MatchPrefixRequest(keys=[b"mp-none"] + keys),
                                                timeout=cc.RPC_TIMEOUT_S).matched, 0)
            leased = reader.MatchPrefix(spb.MatchPrefixRequest(keys=keys, lease_ttl_ms=60000),
                                        timeout=cc.RPC_TIMEOUT_S)
            self.assertEqual(leased.matched, 200)
            self.assertNotEqual(leased.lease_id, 0)
            # Pinned keys read under the lease; the key past the break still reads on its own.
            got = cc.get_inline(reader, keys[:200] + [keys[250]], lease_id=leased.lease_id)
            self.assertCodes(got, ["OK"] * 201)
            for i, r in zip(list(range(200)) + [250], got):
                self.assertTrue(r.data == vals[i], keys[i])
            # Leased keys cannot be removed; keys past the break were not left leased.
            self.assertEqual(cc.code_name(self.s0.BatchRemove(spb.BatchRemoveRequest(
                keys=[keys[5]]), timeout=cc.RPC_TIMEOUT_S).results[0].code), "HAS_LEASE")
            reader.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=leased.lease_id),
                                timeout=cc.RPC_TIMEOUT_S)
            # The same chain with its keys packed into one field.
            packed = dict(packed_keys=b"".join(keys), packed_key_sizes=[len(k) for k in keys])
            plain = reader.MatchPrefix(spb.MatchPrefixRequest(**packed), timeout=cc.RPC_TIMEOUT_S)
            self.assertEqual((plain.matched, plain.keys_seen, plain.lease_id), (200, 300, 0))
            leased = reader.MatchPrefix(spb.MatchPrefixRequest(lease_ttl_ms=60000, **packed),
                                        timeout=cc.RPC_TIMEOUT_S)
            self.assertEqual(leased.matched, 200)
            got = cc.get_inline(reader, keys[:200], lease_id=leased.lease_id)
            self.assertCodes(got, ["OK"] * 200)
            self.assertTrue(all(r.data == vals[i] for i, r in enumerate(got)))
            reader.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=leased.lease_id),
                                timeout=cc.RPC_TIMEOUT_S)
            for bad in (spb.MatchPrefixRequest(keys=keys[:1], **packed),
                        spb.MatchPrefixRequest(packed_keys=b"abc", packed_key_sizes=[2])):
                with self.assertRaises(grpc.RpcError) as err:
                    reader.MatchPrefix(bad, timeout=cc.RPC_TIMEOUT_S)
                self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        removed = self.s0.BatchRemove(spb.BatchRemoveRequest(keys=[keys[i] for i in present]),
                                      timeout=cc.RPC_TIMEOUT_S)
        self.assertCodes(removed.results, ["OK"] * len(present))

    def test_mc_bench_spaces_its_gets_by_get_gap_ms(self):
        """mc-bench --get_gap_ms: each get follows that much idle time (as an engine's loads do);
        the reported latencies count only the RPCs. Out-of-range gaps are refused."""
        bench = harness.binary("tools/mc-bench")
        base = [bench, "--client", "unix:" + self.c.clients[0].ready["unix_socket"],
                "--value_size", "4096", "--batch", "2", "--keys", "4", "--iterations", "2",
                "--runs", "1", "--mode", "get"]
        t0 = time.monotonic()
        out = subprocess.run(base + ["--get_gap_ms", "250"], capture_output=True, text=True,
                             timeout=120)
        elapsed = time.monotonic() - t0
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        line = [l for l in out.stdout.splitlines() if l.startswith("mc-bench run=1 op=get")][0]
        fields = dict(re.findall(r"(\S+)=(\S+)", line))
        self.assertEqual((fields["gap_ms"], fields["ok"], fields["err"], fields["verify_fail"]),
                         ("250", "4", "0", "0"), line)
        # 2 timed gets and 1 warm-up, each after 250 ms: the run took at least 0.75 s and its
        # timed part at least 0.5 s, while a get's latency (an 8 KiB RPC) leaves the gap out.
        self.assertGreaterEqual(elapsed, 0.75)
        self.assertGreaterEqual(float(fields["wall_s"]), 0.5)
        self.assertLess(float(fields["p50_ms"]), 250.0, line)
        for bad in ("-1", "60001", "nan"):
            r = subprocess.run(base + ["--get_gap_ms", bad], capture_output=True, text=True,
                               timeout=60)
            self.assertEqual(r.returncode, 2, (bad, r.stdout, r.stderr))
            self.assertIn("--get_gap_ms", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
