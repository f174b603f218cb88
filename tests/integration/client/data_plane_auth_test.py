"""The authenticated data plane with real daemons (docs/security.md): one test per
attack found against an mc-client's data port. Each sends raw frames from a socket of its own
and checks that the owner refused them, counted them in /metrics, and touched no byte (the
stored objects still read back whole through the Store service).

Frames are version 2 (transfer/tcp/frame.h): a 48-byte header, then for READ / WRITE / READ_DISK
a 64-byte capability block, then the payload. Legitimate capabilities come from the master, as
a reader or writer gets them (GetReplicas with a lease, PutStart)."""

import hashlib
import hmac
import os
import shutil
import socket
import struct
import tempfile
import time
import unittest

import grpc

from integration import harness
from integration import master_auth
from integration.client import client_cluster as cc
from integration.client.data_plane import (AUTH, CAP_SIZE, HEADER, MAGIC, OK_CODE,
                                          PERMISSION_DENIED, READ, READ_DISK, VERSION, WRITE,
                                          closed_without_data, data_plane_key, frame, handshake,
                                          read_response)
from mcstore.v1 import master_pb2 as mpb
from mcstore.v1 import master_pb2_grpc
from mcstore.v1 import store_pb2 as spb

SKEW_MS = 100


class DataPlaneAuthTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ssd = tempfile.mkdtemp(prefix="mc-auth-ssd-")
        cls.cluster = cc.Cluster(
            clients=2, segment_size=64 * cc.MiB,
            # Raw plaintext frames after a handshake: the owner's checks of each frame are the
            # same with or without encryption (tests/unit/transfer/tcp_encryption_test.cc
            # covers the encrypted connection), so these daemons run --data_encryption=off.
            client_args=["--capability_clock_skew_ms", str(SKEW_MS),
                         "--data_handshake_timeout_ms", "1000", "--data_encryption", "off"],
            per_client_args={0: ["--offload_dir", cls.ssd, "--offload_capacity",
                                 str(64 * cc.MiB)]}).start()
        c = cls.cluster
        cls.master = master_pb2_grpc.MasterStub(grpc.insecure_channel(c.master.ready["grpc"]))
        # The test talks to the master as a member would: a registered client of its own (no
        # segments), whose session every lookup and PutStart below presents.
        cls.md = master_auth.observer_session(
            cls.master, master_auth.Keys(harness.cluster_secret_file()))
        cls.s0 = c.stub(0)
        cls.vals = {b"auth-a": cc.payload(300 * cc.KiB, 1), b"auth-b": cc.payload(200 * cc.KiB, 2)}
        res = cc.put_inline(cls.s0, list(cls.vals.items()))
        assert [cc.code_name(r.code) for r in res] == ["OK", "OK"], res

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        shutil.rmtree(cls.ssd, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------------
    def owner_http(self):
        return self.cluster.http(0)

    def denied(self, reason):
        return cc.metric(self.owner_http(), "mc_data_capability_denied_total", reason=reason)

    def open_connections(self):
        return cc.metric(self.owner_http(), "mc_dataplane_connections")

    def auth_failures(self, reason):
        return cc.metric(self.owner_http(), "mc_data_auth_failures_total", reason=reason)

    def lookup(self, key, ttl_ms=10000):
        resp = self.master.GetReplicas(mpb.GetReplicasRequest(
            keys=[key], lease_ttl_ms=ttl_ms), metadata=self.md, timeout=10)
        rec = resp.results[0]
        self.assertEqual(rec.code, spb.OK, rec.message)
        rep = rec.replicas[0]
        self.assertEqual(rep.client_id, "c0")
        self.assertEqual(len(rep.capability), CAP_SIZE)
        return resp, rep

    def connect(self, authenticate=True):
        host, port = self.cluster.clients[0].ready["data"].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5)
        self.addCleanup(sock.close)
        if authenticate:
            handshake(sock, data_plane_key())
        return sock

    def assert_store_intact(self):
        got = cc.get_inline(self.cluster.stub(1), list(self.vals))
        for (key, want), r in zip(self.vals.items(), got):
            self.assertEqual(cc.code_name(r.code), "OK", r.message)
            self.assertEqual(r.data, want, key)

    # -- the attacks -------------------------------------------------------------------------
    def test_read_frame_without_handshake_is_closed_unanswered(self):
        _, rep = self.lookup(b"auth-a")
        before = self.auth_failures("no_handshake")
        sock = self.connect(authenticate=False)
        sock.sendall(frame(READ, 1, rep.segment_id, 0, 64 * cc.MiB))  # the whole segment
        self.assertTrue(closed_without_data(sock))
        harness.wait_until(lambda: self.auth_failures("no_handshake") == before + 1, 5,
                           what="auth failure counted")

    def test_wrong_secret_fails_the_handshake(self):
        before = self.auth_failures("bad_mac")
        sock = self.connect(authenticate=False)
        nc = os.urandom(32)
        sock.sendall(frame(AUTH, 1, 0, 0, 32, payload=nc))
        r = read_response(sock)
        ns = r["payload"][:32]
        forged = hmac.new(b"not the secret", b"mcstore/v1/dp-client\n" + nc + ns,
                          hashlib.sha256).digest()
        sock.sendall(frame(AUTH, 2, 0, 1, 32, payload=forged))
        self.assertEqual(read_response(sock)["code"], PERMISSION_DENIED)
        self.assertTrue(closed_without_data(sock))
        harness.wait_until(lambda: self.auth_failures("bad_mac") == before + 1, 5,
                           what="auth failure counted")

    def test_slow_handshake_is_cut_off(self):
        before = self.auth_failures("timeout")
        sock = self.connect(authenticate=False)
        sock.sendall(HEADER.pack(MAGIC, VERSION, AUTH, 1, 0, 0, 32, 0, 0)[:10])
        start = time.monotonic()
        self.assertTrue(closed_without_data(sock, timeout_s=5))
        self.assertLess(time.monotonic() - start, 4)
        harness.wait_until(lambda: self.auth_failures("timeout") == before + 1, 5,
                           what="timeout counted")

    def test_forged_capability_is_refused(self):
        _, rep = self.lookup(b"auth-a")
        before = self.denied("bad_mac")
        sock = self.connect()
        # The real grant, widened to the whole segment: the MAC no longer matches.
        cap = bytearray(rep.capability)
        struct.pack_into("<QQ", cap, 16, 0, 64 * cc.MiB)
        sock.sendall(frame(READ, 7, rep.segment_id, 0, 64 * cc.MiB, bytes(cap)))
        r = read_response(sock)
        self.assertEqual((r["code"], r["length"]), (PERMISSION_DENIED, 0))
        self.assertEqual(self.denied("bad_mac"), before + 1)
        # The connection stays usable for granted frames.
        sock.sendall(frame(READ, 8, rep.segment_id, rep.offset, rep.length, rep.capability))
        r = read_response(sock)
        self.assertEqual(r["code"], OK_CODE)
        self.assertEqual(r["payload"], self.vals[b"auth-a"])

    def test_capability_of_key_a_does_not_read_key_b(self):
        _, a = self.lookup(b"auth-a")
        _, b = self.lookup(b"auth-b")
        before = self.denied("out_of_range")
        sock = self.connect()
        sock.sendall(frame(READ, 1, b.segment_id, b.offset, b.length, a.capability))
        self.assertEqual(read_response(sock)["code"], PERMISSION_DENIED)
        sock.sendall(frame(READ, 2, a.segment_id, a.offset, a.length + 4096, a.capability))
        self.assertEqual(read_response(sock)["code"], PERMISSION_DENIED)
        self.assertEqual(self.denied("out_of_range"), before + 2)

    def test_capability_of_a_removed_key_expires(self):
        key = b"auth-removed"
        self.assertCodes(cc.put_inline(self.s0, [(key, cc.payload(64 * cc.KiB, 9))]), ["OK"])
        resp, rep = self.lookup(key, ttl_ms=300)
        self.master.ReleaseLeases(mpb.ReleaseLeasesRequest(lease_id=resp.lease_id, keys=[key]),
                                  metadata=self.md, timeout=10)
        removed = harness.wait_until(
            lambda: cc.code_name(self.s0.BatchRemove(spb.BatchRemoveRequest(keys=[key]),
                                                     timeout=10).results[0].code) == "OK",
            10, what="the key removed")
        time.sleep((300 + SKEW_MS + 300) / 1000)  # past the lease, the skew allowance, an RTT
        before = self.denied("expired")
        sock = self.connect()
        sock.sendall(frame(READ, 1, rep.segment_id, rep.offset, rep.length, rep.capability))
        r = read_response(sock)
        self.assertEqual((r["code"], r["length"]), (PERMISSION_DENIED, 0))
        self.assertEqual(self.denied("expired"), before + 1)

    def write_grant(self, key, size):
        # Two replicas, so one lands on c0 whatever the free space (the test's own client holds
        # no memory and cannot ask for c0's segments in c0's name).
        placed = self.master.PutStart(mpb.PutStartRequest(
            items=[mpb.PutStartItem(key=key, size=size)], replicas=2), metadata=self.md,
            timeout=10)
        res = placed.results[0]
        self.assertEqual(res.code, spb.OK, res.message)
        reps = [r for r in res.replicas if r.client_id == "c0"]
        self.assertEqual(len(reps), 1, res.replicas)
        return res.generation, reps[0]

    def test_write_outside_the_granted_range_is_refused(self):
        _, b = self.lookup(b"auth-b")
        _, w = self.write_grant(b"auth-pending-1", 4096)
        before_range, before_op = self.denied("out_of_range"), self.denied("wrong_op")
        sock = self.connect()
        junk = b"\xee" * b.length
        sock.sendall(frame(WRITE, 1, b.segment_id, b.offset, b.length, w.capability, junk))
        self.assertEqual(read_response(sock)["code"], PERMISSION_DENIED)
        _, a = self.lookup(b"auth-a")  # a read grant does not write
        sock.sendall(frame(WRITE, 2, a.segment_id, a.offset, 16, a.capability, b"\xee" * 16))
        self.assertEqual(read_response(sock)["code"], PERMISSION_DENIED)
        self.assertEqual(self.denied("out_of_range"), before_range + 1)
        self.assertEqual(self.denied("wrong_op"), before_op + 1)
        self.assert_store_intact()

    def test_half_sent_write_stays_invisible(self):
        key = b"auth-pending-2"
        _, w = self.write_grant(key, 256 * cc.KiB)
        open_before = self.open_connections()
        sock = self.connect()
        sock.sendall(frame(WRITE, 1, w.segment_id, w.offset, w.length, w.capability)
                     + b"\xcc" * (w.length // 2))
        sock.close()
        # The owner saw the connection end mid-payload (whatever it does with the half, it did).
        harness.wait_until(lambda: self.open_connections() <= open_before, 10,
                           what="the owner closed the half-sent write's connection")
        got = cc.get_inline(self.cluster.stub(1), [key])[0]
        self.assertNotEqual(cc.code_name(got.code), "OK")  # pending: nobody reads it
        self.assert_store_intact()

    def test_read_disk_without_a_capability_is_refused(self):
        before = self.denied("malformed") + self.denied("wrong_op")
        _, a = self.lookup(b"auth-a")
        sock = self.connect()
        sock.sendall(frame(READ_DISK, 1, 1, 0, 4096, None, reserved=0x1234))
        r = read_response(sock)
        self.assertEqual(r["code"], PERMISSION_DENIED)
        sock.sendall(frame(READ_DISK, 2, a.segment_id, a.offset, a.length, a.capability))
        self.assertEqual(read_response(sock)["code"], PERMISSION_DENIED)
        self.assertEqual(self.denied("malformed") + self.denied("wrong_op"), before + 2)


if __name__ == "__main__":
    unittest.main()
