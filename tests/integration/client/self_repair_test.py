"""Self-repair with real daemons (DESIGN.md invariant 10).

A corrupt memory replica is made the way a lying writer would: the test, registered with the
master as a member, starts a put, writes other bytes than the checksum it then records (through
the authenticated data plane, with the master's own write grants), and ends the put. A get then
finds the replica bad, confirms it on a private copy, reports it; the master drops it, the get
falls back within the same call, and a key left without a good replica can be stored again. A
holder whose daemon is gone is reported by the readers that find its port closed and dropped by
the master long before its heartbeat TTL.
"""

import socket
import unittest

import grpc

from integration import harness
from integration import master_auth
from integration.client import client_cluster as cc
from integration.client.data_plane import OK_CODE, WRITE, data_plane_key, frame, handshake
from integration.client.data_plane import read_response
from mcstore.v1 import master_pb2 as mpb
from mcstore.v1 import master_pb2_grpc
from mcstore.v1 import store_pb2 as spb


class CorruptReplicaTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=2, segment_size=16 * cc.MiB).start()
        c = cls.cluster
        cls.master = master_pb2_grpc.MasterStub(grpc.insecure_channel(c.master.ready["grpc"]))
        cls.keys = master_auth.Keys(harness.cluster_secret_file())

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def member(self):
        # A fresh member session per test (the master drops one that stops heartbeating).
        return master_auth.observer_session(self.master, self.keys)

    def checksum_of(self, md, value):
        """The XXH3-64 the daemons record for `value` (stored once under a throw-away key)."""
        ref = b"ref-%d-%d" % (len(value), hash(value) & 0xFFFF)
        cc.put_inline(self.cluster.stub(0), [(ref, value)])
        resp = self.master.GetReplicas(mpb.GetReplicasRequest(keys=[ref], no_lease=True),
                                       metadata=md, timeout=10)
        self.assertEqual(resp.results[0].code, spb.OK, resp.results[0].message)
        return resp.results[0].checksum

    def lying_put(self, key, good, bad_on, replicas):
        """Stores `key` with `replicas` replicas whose recorded checksum is good's; the replicas
        on the clients in `bad_on` hold other bytes."""
        md = self.member()
        checksum = self.checksum_of(md, good)
        placed = self.master.PutStart(mpb.PutStartRequest(
            items=[mpb.PutStartItem(key=key, size=len(good))], replicas=replicas),
            metadata=md, timeout=10)
        res = placed.results[0]
        self.assertEqual(res.code, spb.OK, res.message)
        endpoints = {d.ready["client_id"]: d.ready["data"] for d in self.cluster.clients}
        for rep in res.replicas:
            body = bytes(b ^ 0xFF for b in good) if rep.client_id in bad_on else good
            host, port = endpoints[rep.client_id].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                # A member: it holds the secret, so it can open an encrypted connection (as a
                # daemon with --data_encryption=on does; an `off` owner follows the wish).
                conn = handshake(sock, data_plane_key(), encrypt=True)
                conn.sendall(frame(WRITE, 1, rep.segment_id, rep.offset, len(body),
                                   rep.capability, body))
                self.assertEqual(read_response(conn)["code"], OK_CODE)
        end = self.master.PutEnd(mpb.PutEndRequest(items=[mpb.PutEndItem(
            key=key, generation=res.generation, checksum=checksum)]), metadata=md, timeout=10)
        self.assertEqual(end.results[0].code, spb.OK, end.results[0].message)
        return [r.client_id for r in res.replicas]

    def holders(self, key):
        resp = self.master.GetReplicas(mpb.GetReplicasRequest(keys=[key], no_lease=True),
                                       metadata=self.member(), timeout=10)
        r = resp.results[0]
        return [x.client_id for x in r.replicas] if r.code == spb.OK else None

    def master_metric(self, name, **labels):
        return cc.metric(self.cluster.master_http(), name, **labels)

    def test_a_bad_replica_is_dropped_and_the_get_reads_the_good_one(self):
        good = cc.payload(200 * cc.KiB, 1)
        holders = self.lying_put(b"repair-two", good, bad_on={"c0"}, replicas=2)
        self.assertEqual(sorted(holders), ["c0", "c1"])
        dropped = self.master_metric("mc_replicas_dropped_total", tier="memory", reason="corrupt")
        # c0 reads its own replica first: bad; confirmed on a private copy; reported; the get
        # goes on to c1's within the same call.
        got = cc.get_inline(self.cluster.stub(0), [b"repair-two"])[0]
        self.assertEqual(cc.code_name(got.code), "OK", got.message)
        self.assertTrue(got.data == good)
        self.assertEqual(self.holders(b"repair-two"), ["c1"])
        self.assertEqual(self.master_metric("mc_replicas_dropped_total", tier="memory",
                                            reason="corrupt"), dropped + 1)
        self.assertGreaterEqual(cc.metric(self.cluster.http(0),
                                          "mc_client_replica_faults_reported_total",
                                          fault="corrupt"), 1)
        mismatches = cc.metric(self.cluster.http(0), "mc_client_checksum_mismatches_total")
        got = cc.get_inline(self.cluster.stub(0), [b"repair-two"])[0]
        self.assertEqual(cc.code_name(got.code), "OK", got.message)
        self.assertEqual(cc.metric(self.cluster.http(0), "mc_client_checksum_mismatches_total"),
                         mismatches, "the bad replica is no longer read")

    def test_a_key_whose_only_replica_is_bad_can_be_stored_again(self):
        good = cc.payload(64 * cc.KiB, 2)
        self.lying_put(b"repair-one", good, bad_on={"c0", "c1"}, replicas=1)
        got = cc.get_inline(self.cluster.stub(1), [b"repair-one"])[0]
        self.assertEqual(cc.code_name(got.code), "CHECKSUM_MISMATCH", got.message)
        self.assertEqual(got.data, b"")
        self.assertIsNone(self.holders(b"repair-one"), "the key went with its last replica")
        # Before self-repair every later save answered ALREADY_EXISTS, for ever.
        self.assertCodes(cc.put_inline(self.cluster.stub(1), [(b"repair-one", good)]), ["OK"])
        got = cc.get_inline(self.cluster.stub(0), [b"repair-one"])[0]
        self.assertEqual(cc.code_name(got.code), "OK", got.message)
        self.assertTrue(got.data == good)


class DeadHolderTest(cc.ClusterTestMixin, unittest.TestCase):
    def test_a_dead_holder_is_dropped_long_before_its_ttl(self):
        # A TTL far beyond the test: only the readers' reports can drop the dead holder.
        c = cc.Cluster(clients=3, segment_size=16 * cc.MiB,
                       master_args=["--client_ttl_ms", "120000"],
                       client_args=["--holder_backoff_ms", "300"]).start()
        self.addCleanup(c.stop)
        kvs = [(b"dead-holder-%d" % i, cc.payload(32 * cc.KiB, 10 + i)) for i in range(8)]
        self.assertCodes(cc.put_inline(c.stub(2), kvs), ["OK"] * len(kvs))  # on c2 itself
        c.clients[2].kill()
        reader = c.stub(0)
        deadline_s = 20
        harness.wait_until(
            lambda: (cc.get_inline(reader, [k for k, _ in kvs]) and
                     cc.metric(c.master_http(), "mc_master_clients_dropped_total",
                               reason="unreachable") == 1),
            deadline_s, interval_s=0.1, what="the dead holder dropped on the readers' reports")
        self.assertEqual(cc.metric(c.master_http(), "mc_clients_alive"), 2)
        got = cc.get_inline(reader, [k for k, _ in kvs])
        self.assertEqual({cc.code_name(r.code) for r in got}, {"NOT_FOUND"},
                         "a plain miss now, no dial of the dead port")


if __name__ == "__main__":
    unittest.main()
