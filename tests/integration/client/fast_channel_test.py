"""The fast channel (<unix_socket>.fast) with real daemons: puts and gets of registered shm
slices as raw datagrams (a small client of the wire format here, independent of the Python
package's), every byte checked, local and cross-host; the ATTACH rules and a lost session as a
real daemon answers them; and mc-bench over the fast channel and over gRPC."""

import re
import socket
import struct
import subprocess
import unittest

from integration import harness
from integration.client import client_cluster as cc
from mcstore.v1 import store_pb2 as spb

KiB = cc.KiB
MiB = cc.MiB
SENTINEL = 0x5A
ATTACH, BATCH_PUT, BATCH_GET, BATCH_EXIST, MATCH_PREFIX, RELEASE_LEASE, BATCH_REMOVE = range(1, 8)
OK, INVALID_ARGUMENT, FAILED_PRECONDITION, UNAUTHENTICATED = 0, 3, 9, 16


class FastConn:
    """One fast-channel connection: "MCQ1" u32 method u64 call_id body -> "MCR1" u32 code
    u64 call_id u32 M message body."""

    def __init__(self, path, token=""):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(cc.RPC_TIMEOUT_S)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MiB)
        self.sock.connect(path)
        self.call_id = 0
        code, msg, body = self.ask(ATTACH, token.encode())
        if code != OK:
            raise RuntimeError("ATTACH refused: %d %s" % (code, msg))
        self.limit = struct.unpack("<I", body)[0]

    def ask(self, method, body):
        self.call_id += 1
        self.sock.send(b"MCQ1" + struct.pack("<IQ", method, self.call_id) + body)
        reply = self.sock.recv(8 * MiB)
        if not reply:
            return None, "closed", b""
        assert reply[:4] == b"MCR1", reply[:4]
        code, call_id, m = struct.unpack("<IQI", reply[4:20])
        assert call_id in (self.call_id, 0), (call_id, self.call_id)
        return code, reply[20:20 + m].decode(), reply[20 + m:]

    def call(self, method, req, resp_type):
        code, msg, body = self.ask(method, req.SerializeToString())
        if code != OK:
            raise RuntimeError("fast call %d: code %d %s" % (method, code, msg))
        return resp_type.FromString(body)

    def close(self):
        self.sock.close()


class FastChannelTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=2, segment_size=64 * MiB).start()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def setUp(self):
        self.c = self.cluster
        self.conns = []

    def tearDown(self):
        for conn in self.conns:
            conn.close()

    def fast(self, i, token=None):
        token = self.c.session(i).owner if token is None else token
        conn = FastConn(self.c.clients[i].ready["fast_socket"], token)
        self.conns.append(conn)
        return conn

    def put_get(self, sizes, prefix, reader):
        """Puts `sizes` values from a shm buffer of daemon 0 over its fast channel, gets them
        over daemon `reader`'s into another, and checks every byte (and the untouched gaps)."""
        stub0 = self.c.unix_stub(0)
        vals = [cc.payload(n, 7 * len(prefix) + i) for i, n in enumerate(sizes)]
        total = sum(sizes)
        src = self.c.buffer(total, stub0)
        items, off = [], 0
        for i, v in enumerate(vals):
            src.write(off, v)
            items.append(spb.PutItem(key=b"%s-%d" % (prefix, i), slices=[src.slice(off, len(v))]))
            off += len(v)
        put = self.fast(0).call(BATCH_PUT, spb.BatchPutRequest(items=items), spb.BatchPutResponse)
        self.assertCodes(put.results, ["OK"] * len(vals))

        gap = 64
        dst = self.c.buffer(total + gap * len(vals), self.c.unix_stub(reader), fill=SENTINEL)
        gets, off = [], 0
        for i, v in enumerate(vals):
            gets.append(spb.GetItem(key=b"%s-%d" % (prefix, i), slices=[dst.slice(off, len(v))]))
            off += len(v) + gap
        got = self.fast(reader).call(BATCH_GET, spb.BatchGetRequest(items=gets),
                                     spb.BatchGetResponse)
        self.assertCodes(got.results, ["OK"] * len(vals))
        off = 0
        for i, v in enumerate(vals):
            self.assertEqual(got.results[i].bytes_written, len(v))
            self.assertFalse(got.results[i].data)
            self.assertTrue(dst.read(off, len(v)) == v, "value %d differs" % i)
            self.assertEqual(dst.read(off + len(v), gap), bytes([SENTINEL]) * gap)
            off += len(v) + gap
        return [b"%s-%d" % (prefix, i) for i in range(len(vals))]

    def test_local_put_get_of_shm_slices(self):
        before = cc.metric(self.c.http(0), "mc_store_fast_calls_total", method="BatchGet",
                           code="OK")
        keys = self.put_get([64 * KiB] * 16 + [1 * MiB + 3, 1], b"fast-local", reader=0)
        self.assertEqual(cc.metric(self.c.http(0), "mc_store_fast_calls_total",
                                   method="BatchGet", code="OK") - before, 1)
        conn = self.fast(0)
        ex = conn.call(BATCH_EXIST, spb.BatchExistRequest(keys=keys + [b"fast-none"]),
                       spb.BatchExistResponse)
        self.assertEqual(list(ex.exists), [True] * len(keys) + [False])
        rm = conn.call(BATCH_REMOVE, spb.BatchRemoveRequest(keys=keys), spb.BatchRemoveResponse)
        self.assertCodes(rm.results, ["OK"] * len(keys))

    def test_cross_host_get_of_shm_slices(self):
        self.put_get([64 * KiB] * 16 + [3 * MiB + 7], b"fast-xh", reader=1)

    def test_match_prefix_and_release_lease(self):
        keys = self.put_get([4 * KiB] * 3, b"fast-prefix", reader=0)
        conn = self.fast(0)
        m = conn.call(MATCH_PREFIX, spb.MatchPrefixRequest(keys=keys + [b"fast-gone"],
                                                           lease_ttl_ms=10000),
                      spb.MatchPrefixResponse)
        self.assertEqual(m.matched, 3)
        self.assertNotEqual(m.lease_id, 0)
        conn.call(RELEASE_LEASE, spb.ReleaseLeaseRequest(lease_id=m.lease_id),
                  spb.ReleaseLeaseResponse)

    def test_attach_rules_and_lost_session(self):
        path = self.c.clients[0].ready["fast_socket"]
        with self.assertRaisesRegex(RuntimeError, "ATTACH refused: 16"):
            FastConn(path, "f" * 32)
        anon = self.fast(0, token="")
        self.assertEqual(anon.limit, 262144)
        code, msg, _ = anon.ask(ATTACH, b"")
        self.assertEqual(code, FAILED_PRECONDITION, msg)
        code, msg, _ = anon.ask(BATCH_GET, b"\xff\xff")
        self.assertEqual(code, INVALID_ARGUMENT, msg)
        code, msg, _ = anon.ask(99, b"")
        self.assertEqual(code, INVALID_ARGUMENT, msg)
        self.assertEqual(anon.sock.recv(64), b"", "closed after an unknown method")
        # A session of its own that then ends: its calls answer "session lost:".
        sess = cc.FdSession(self.c.clients[0].ready["fd_socket"], cc.RPC_TIMEOUT_S)
        conn = self.fast(0, token=sess.owner)
        sess.close()
        req = spb.BatchExistRequest(keys=[b"k"]).SerializeToString()
        harness.wait_until(lambda: conn.ask(BATCH_EXIST, req)[0] == FAILED_PRECONDITION, 10,
                           what="the ended session is lost")
        code, msg, _ = conn.ask(BATCH_EXIST, req)
        self.assertTrue(msg.startswith("session lost:"), msg)

    def test_mc_bench_over_fast_and_grpc(self):
        bench = harness.binary("tools/mc-bench")
        base = [bench, "--client", "unix:" + self.c.clients[0].ready["unix_socket"],
                "--value_size", "64K", "--batch", "16", "--keys", "32", "--iterations", "3",
                "--runs", "1"]
        for flag, path in (("--store_fast=true", "fast"), ("--store_fast=false", "grpc")):
            out = subprocess.run(base + [flag], capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
            self.assertIn("puts over %s, gets over %s" % (path, path), out.stdout)
            line = [l for l in out.stdout.splitlines() if l.startswith("mc-bench run=1 op=get")][0]
            fields = dict(re.findall(r"(\S+)=(\S+)", line))
            self.assertEqual((fields["path"], fields["err"], fields["verify_fail"]),
                             (path, "0", "0"), line)


if __name__ == "__main__":
    unittest.main()
