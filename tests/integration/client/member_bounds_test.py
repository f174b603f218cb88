"""Members bound to their own identity: what a holder of the cluster secret
(a compromised member) could do through the master and the data plane beyond its own memory,
with real daemons on loopback. Each test is one attack as it was first found, sent from this
process with the credentials a member holds (master_auth.py, data_plane.py).

- One AddDiskReplicas(recovered=true) naming generation 2^63 - 1 pushed the master's generation
  counter to its end: every later put in the cluster failed INTERNAL until a restart.
"""

import os
import unittest

import grpc

from integration import harness
from integration import master_auth
from integration.client import client_cluster as cc
from mcstore.v1 import master_pb2 as mpb
from mcstore.v1 import master_pb2_grpc
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB


class MemberBoundsTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=2, segment_size=32 * MiB).start()
        cls.keys = master_auth.Keys(harness.cluster_secret_file())

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def master_stub(self):
        ch = grpc.insecure_channel(self.cluster.master.ready["grpc"])
        self.addCleanup(ch.close)
        return master_pb2_grpc.MasterStub(ch)

    def member(self, stub, **fields):
        """Registers a client of the test's own (a member: it holds the cluster secret) and
        returns (its session metadata, its registration answer)."""
        client_id = "member-" + os.urandom(4).hex()
        req = mpb.RegisterClientRequest(client_id=client_id, host="member", **fields)
        resp = stub.RegisterClient(req, metadata=self.keys.register_metadata(req, stub=stub),
                                   timeout=10)
        return master_auth.session_metadata(client_id, resp.session_token), resp

    def test_a_reported_generation_no_master_issued_is_refused(self):
        stub = self.master_stub()
        md, _ = self.member(stub, disk_capacity=1 << 30)
        resp = stub.AddDiskReplicas(mpb.AddDiskReplicasRequest(
            recovered=True, items=[mpb.DiskReplicaItem(
                key=b"gen-end", generation=(1 << 63) - 1, locator=4096, length=64,
                checksum=1)]), metadata=md, timeout=10)
        self.assertEqual(cc.code_name(resp.results[0].code), "INVALID_ARGUMENT",
                         resp.results[0].message)
        # Every put in the cluster still gets a generation.
        s0 = self.cluster.stub(0)
        self.assertCodes(cc.put_inline(s0, [(b"after-gen-end-%d" % i, b"x" * 100)
                                             for i in range(4)]), ["OK"] * 4)
        self.assertEqual(cc.exist(s0, [b"gen-end"]), [False])


if __name__ == "__main__":
    unittest.main()
