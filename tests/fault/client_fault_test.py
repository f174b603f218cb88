"""mc-client fault tests with real daemons: a client holding the only replica is SIGKILLed before
and during batch gets (its keys fail, never OK; keys held by live clients stay OK), and the master
is killed and restarted on the same port (clients re-register, the cluster takes puts again)."""

import threading
import time
import unittest

from integration import harness
from integration.client import client_cluster as cc
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB
KiB = cc.KiB


class KillReplicaHolderTest(unittest.TestCase):
    def setUp(self):
        # c0 holds the victims, c1 the survivors, c2 (no segments) reads.
        self.c = cc.Cluster(clients=2, pure_clients=1, segment_size=32 * MiB,
                            master_args=["--client_ttl_ms", "1500"])
        self.addCleanup(self.c.stop)
        self.c.start()
        self.victims = [(b"victim-%d" % i, cc.payload(64 * KiB + i, 10 + i)) for i in range(4)]
        self.survivors = [(b"survivor-%d" % i, cc.payload(64 * KiB + i, 20 + i))
                          for i in range(4)]
        for stub, kvs in ((self.c.stub(0), self.victims), (self.c.stub(1), self.survivors)):
            res = cc.put_inline(stub, kvs, replicas=1)
            self.assertEqual([r.code for r in res], [spb.OK] * len(kvs),
                             [r.message for r in res])
        self.reader = self.c.stub(2)
        # Interleave victims and survivors in one batch, with a duplicate of each kind.
        self.batch = []
        for (vk, vv), (sk, sv) in zip(self.victims, self.survivors):
            self.batch += [(vk, vv), (sk, sv)]
        self.batch += [self.victims[0], self.survivors[0]]

    def get_batch(self):
        return cc.get_inline(self.reader, [k for k, _ in self.batch])

    def check(self, got, victims_must_fail=True):
        for (k, v), r in zip(self.batch, got):
            if r.code == spb.OK:
                self.assertTrue(r.data == v, "%s OK with wrong bytes" % k)
            if k.startswith(b"survivor"):
                self.assertEqual(r.code, spb.OK, "%s: %s %s" % (k, cc.code_name(r.code),
                                                                r.message))
            elif victims_must_fail:
                self.assertNotEqual(r.code, spb.OK, "%s must fail once its holder died" % k)
                self.assertEqual(r.data, b"")

    def test_kill_before_batch_get(self):
        self.check(self.get_batch(), victims_must_fail=False)
        self.c.clients[0].kill()
        # Before the master notices: the transfer from the dead peer fails.
        got = self.get_batch()
        self.check(got)
        codes = {cc.code_name(r.code) for (k, _), r in zip(self.batch, got)
                 if k.startswith(b"victim")}
        self.assertTrue(codes <= {"TRANSFER_FAILED", "NOT_FOUND"}, codes)
        # After the master expired it: a plain miss.
        self.c.wait_clients_alive(2, timeout_s=15)
        harness.wait_until(lambda: not any(cc.exist(self.reader, [k for k, _ in self.victims])),
                           10, what="victims forgotten by the master")
        got = self.get_batch()
        self.check(got)
        for (k, _), r in zip(self.batch, got):
            if k.startswith(b"victim"):
                self.assertEqual(cc.code_name(r.code), "NOT_FOUND", r.message)
        self.assertTrue(self.c.healthy(2) and self.c.healthy(1))

    def test_kill_during_batch_gets(self):
        stop = threading.Event()
        errors = []
        rounds = [0]

        def loop():
            try:
                while not stop.is_set():
                    got = self.get_batch()
                    for (k, v), r in zip(self.batch, got):
                        if r.code == spb.OK and r.data != v:
                            errors.append("%s OK with wrong bytes" % k)
                        if k.startswith(b"survivor") and r.code != spb.OK:
                            errors.append("%s failed: %s" % (k, r.message))
                    rounds[0] += 1
            except Exception as e:  # surfaced below
                errors.append(repr(e))

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        harness.wait_until(lambda: rounds[0] >= 3 or errors, 20, what="reader running")
        self.c.clients[0].kill()
        killed_at = rounds[0]
        harness.wait_until(lambda: rounds[0] >= killed_at + 5 or errors, 30,
                           what="reads after the kill")
        stop.set()
        t.join(timeout=30)
        self.assertFalse(t.is_alive())
        self.assertEqual(errors, [])
        self.check(self.get_batch())


class MasterRestartTest(unittest.TestCase):
    def setUp(self):
        self.c = cc.Cluster(clients=2, segment_size=16 * MiB)
        self.addCleanup(self.c.stop)
        self.c.start()

    def registrations(self, i):
        return cc.metric(self.c.http(i), "mc_client_registrations")

    def test_clients_reregister_and_cluster_takes_puts(self):
        s0, s1 = self.c.stub(0), self.c.stub(1)
        old = [(b"before-%d" % i, cc.payload(10 * KiB, 30 + i)) for i in range(3)]
        self.assertEqual([r.code for r in cc.put_inline(s0, old)], [spb.OK] * 3)
        regs = [self.registrations(i) for i in range(2)]
        self.assertEqual(regs, [1.0, 1.0])
        port = self.c.master_port

        self.c.restart_master()
        self.assertEqual(self.c.master_port, port)
        for i in range(2):
            harness.wait_until(lambda i=i: self.registrations(i) >= regs[i] + 1, 30,
                               what="client %d re-registered" % i)
        self.c.wait_clients_alive(2, timeout_s=30)

        new = [(b"after-%d" % i, cc.payload(100 * KiB, 40 + i)) for i in range(4)]

        def put_ok():
            res = cc.put_inline(s1, new)
            return all(r.code in (spb.OK, spb.ALREADY_EXISTS) for r in res)
        harness.wait_until(put_ok, 30, interval_s=0.2, what="puts accepted after restart")
        for stub in (s0, s1):
            got = cc.get_inline(stub, [k for k, _ in new])
            self.assertEqual([r.code for r in got], [spb.OK] * 4, [r.message for r in got])
            self.assertEqual([r.data for r in got], [v for _, v in new])
        # Whatever the new master says of the old keys, an OK carries the right bytes.
        for (k, v), r in zip(old, cc.get_inline(s0, [k for k, _ in old])):
            if r.code == spb.OK:
                self.assertEqual(r.data, v, k)
        self.assertTrue(self.c.healthy(0) and self.c.healthy(1))


if __name__ == "__main__":
    unittest.main()
