"""Standby masters serving TLS: the clients follow the new leader over TLS.

etcd + two mc-masters with --tls_cert_file (a CA made by the test, deploy/make-tls-certs.sh,
certificate for 127.0.0.1), one mc-client with --master_tls_ca_file and --master a,b. Keys put
before the leader's SIGKILL are readable after it, and puts go through the new leader: the
client reached it over TLS with the same CA (the standby's answer names it by its advertised
address, which the certificate's SAN must name). Every wait is bounded."""

import os
import shutil
import subprocess
import tempfile
import unittest

from integration import harness
from integration.client import client_cluster as cc
from integration.ha.failover_test import LEADER_TTL_S, HaCluster
from mcstore.v1 import store_pb2 as spb

KiB = cc.KiB
MiB = cc.MiB
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


class TlsFailoverTest(cc.ClusterTestMixin, unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mc-ha-tls-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        subprocess.run([os.path.join(ROOT, "deploy", "make-tls-certs.sh"), self.dir],
                       check=True, capture_output=True, timeout=60)
        pem = lambda name: os.path.join(self.dir, name)  # noqa: E731
        self.cluster = HaCluster(
            masters=2, clients=1, segment_size=32 * MiB,
            master_args=["--tls_cert_file", pem("cert.pem"), "--tls_key_file", pem("cert.key")],
            client_args=["--master_tls_ca_file", pem("ca.pem"), "--master_rpc_timeout_ms", "2000"])
        self.addCleanup(self.cluster.stop)
        self.cluster.start()

    def put(self, tag):
        kvs = [(b"ha-tls-%s-%d" % (tag, i), cc.payload(16 * KiB + i, i)) for i in range(4)]
        res = cc.put_inline(self.cluster.stub(0), kvs)
        return kvs if all(r.code == spb.OK for r in res) else None

    def test_clients_follow_the_new_leader_over_tls(self):
        cl = self.cluster
        before = self.put(b"before")
        self.assertIsNotNone(before)
        old = cl.master
        old.kill()
        cl.master = cl.wait_leader(exclude=(old,), timeout_s=LEADER_TTL_S + 20)
        harness.wait_until(lambda: self.put(b"after"), 30, interval_s=0.2,
                           what="puts through the new leader over TLS")

        def readable():
            got = cc.get_inline(cl.stub(0), [k for k, _ in before])
            return all(r.code == spb.OK and r.data == v for (_, v), r in zip(before, got))
        harness.wait_until(readable, 30, interval_s=0.2, what="pre-kill keys readable")


if __name__ == "__main__":
    unittest.main()
