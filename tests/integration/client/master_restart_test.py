"""A master restart, or a client that was dropped and comes back, loses nothing.

Real daemons on loopback (client_cluster.py). Each mc-client keeps an owner-side index of the
objects in its memory segments and reports it after every registration; the master rebuilds the
objects from the reports (docs/architecture.md "Restart and return"). Checked here:
- puts running from two writers while the master is SIGKILLed and restarted on its port: every
  put answered OK is readable afterwards with exactly its bytes (0 lost, 0 wrong); the time from
  the restart until every acknowledged key is readable again is printed;
- a removed key stays removed across a restart (the master tells owners what it freed);
- a client SIGSTOPped past its liveness TTL and resumed: its objects are readable again;
- a writer's frame aimed at a segment of the previous master run (authentication off, so no
  capability stands in the way) is refused by the owner and damages nothing: segment ids carry
  the master's epoch.
Every wait is bounded; the cluster is stopped even on failure."""

import socket
import threading
import time
import unittest

import grpc

from integration import harness
from integration.client import client_cluster as cc
from integration.client.data_plane import CAP_SIZE, HEADER, MAGIC, VERSION, WRITE, recv_exact
from mcstore.v1 import master_pb2 as mpb
from mcstore.v1 import master_pb2_grpc
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB
KiB = cc.KiB

class RestartTestBase(cc.ClusterTestMixin, unittest.TestCase):
    CLUSTER = {}

    def setUp(self):
        self.cluster = cc.Cluster(**self.CLUSTER)
        self.addCleanup(self.cluster.stop)
        self.cluster.start()

    def registrations(self, i):
        return cc.metric(self.cluster.http(i), "mc_client_registrations")

    def restart_master_and_wait(self):
        """SIGKILL + restart of the master; returns once every client (pure ones too: they read
        and write through it) registered with the new one."""
        everyone = range(self.cluster.n + self.cluster.pure)
        regs = [self.registrations(i) for i in everyone]
        self.cluster.restart_master()
        for i in everyone:
            harness.wait_until(lambda i=i: self.registrations(i) > regs[i], 30,
                               what="client %d registered with the new master" % i)

    def forgotten(self):
        """Index entries the data clients dropped because a heartbeat named them freed."""
        return sum(cc.metric(self.cluster.http(i), "mc_client_index_forgotten_total")
                   for i in range(self.cluster.n))

    @staticmethod
    def unknown(stub, keys):
        """What the reader says of `keys` now, for a failure message: the keys it does not know
        (a few of them), or the error its Exist answered."""
        try:
            missing = [k for k, known in zip(keys, cc.exist(stub, keys)) if not known]
        except grpc.RpcError as e:
            return "the reader's BatchExist failed: %s %s" % (e.code(), e.details())
        return "%d of %d keys unknown to the reader, e.g. %s" % (len(missing), len(keys),
                                                                   missing[:5])

    @staticmethod
    def all_exist(stub, keys):
        """Whether every key exists; False (not an error) while the daemon answers UNAVAILABLE:
        it is registering again after the restart, a transient state."""
        try:
            return all(cc.exist(stub, keys))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                return False
            raise


class MasterRestartUnderLoadTest(RestartTestBase):
    CLUSTER = dict(clients=2, pure_clients=1, segment_size=64 * MiB)
    # Each writer stops after this many acknowledged batches of 4 x ~16 KiB, so the cluster
    # (2 x 64 MiB) stays below its eviction watermark: every acknowledged key must stay.
    OK_BATCHES = 250

    def test_every_acknowledged_put_survives_a_master_restart(self):
        acked = []  # (key, value)
        answers = {}  # code name -> count
        errors = []
        stop = threading.Event()
        lock = threading.Lock()

        def writer(idx, stub, replicas):
            i = ok_batches = 0
            while not stop.is_set() and ok_batches < self.OK_BATCHES:
                batch = [(b"load-%d-%d-%d" % (idx, i, j),
                          cc.payload(16 * KiB + 64 * j, idx * 100000 + i * 8 + j))
                         for j in range(4)]
                i += 1
                try:
                    res = cc.put_inline(stub, batch, replicas=replicas)
                except grpc.RpcError as e:
                    # The local daemon is up throughout; an RPC error is a failure.
                    errors.append(repr(e))
                    return
                ok_batches += all(r.code == spb.OK for r in res)
                with lock:
                    for kv, r in zip(batch, res):
                        name = cc.code_name(r.code)
                        answers[name] = answers.get(name, 0) + 1
                        if r.code == spb.OK:
                            acked.append(kv)
                time.sleep(0.01)  # paces the writer: a steady load across the restart

        threads = [threading.Thread(target=writer, args=(0, self.cluster.stub(0), 1), daemon=True),
                   threading.Thread(target=writer, args=(1, self.cluster.stub(2), 2), daemon=True)]
        for t in threads:
            t.start()
        harness.wait_until(lambda: len(acked) >= 200 or errors, 60, what="puts running")
        with lock:
            before = list(acked)
        t0 = time.monotonic()
        self.restart_master_and_wait()
        reader = self.cluster.stub(2)
        try:
            harness.wait_until(lambda: self.all_exist(reader, [k for k, _ in before]), 30,
                               interval_s=0.05,
                               what="every key acknowledged before the restart known")
        except TimeoutError as e:
            self.fail("%s; %s" % (e, self.unknown(reader, [k for k, _ in before])))
        recover_s = time.monotonic() - t0
        n = len(acked)
        harness.wait_until(lambda: len(acked) >= n + 100 or errors
                           or not any(t.is_alive() for t in threads), 60,
                           what="puts acknowledged after the restart")
        stop.set()
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(errors, [])
        print("master restart under load: %d keys acknowledged (%d before the restart), all "
              "readable again %.2f s after the SIGKILL; answers %s"
              % (len(acked), len(before), recover_s, dict(sorted(answers.items()))))
        self.assertLessEqual(set(answers), {"OK", "UNAVAILABLE", "NOT_FOUND", "TIMEOUT",
                                            "NO_SPACE"}, answers)
        self.assert_exact(reader, acked, "after the master restart")
        self.assert_exact(self.cluster.stub(0), before, "after the master restart (writer 0)")

    def test_a_removed_key_stays_removed(self):
        stub = self.cluster.stub(0)
        kvs = [(b"rm-%d" % i, cc.payload(8 * KiB, 7 + i)) for i in range(6)]
        self.assertCodes(cc.put_inline(stub, kvs, replicas=1), ["OK"] * 6)
        removed = [k for k, _ in kvs[:3]]
        forgotten = self.forgotten()
        resp = stub.BatchRemove(spb.BatchRemoveRequest(keys=removed), timeout=cc.RPC_TIMEOUT_S)
        self.assertCodes(resp.results, ["OK"] * 3)
        # The master tells the owner what it freed in its next heartbeats (every 200 ms here):
        # one replica each, so three entries leave the owners' indexes.
        harness.wait_until(lambda: self.forgotten() >= forgotten + 3, 30,
                           what="the owners told of the removed keys")
        self.restart_master_and_wait()
        harness.wait_until(lambda: self.all_exist(stub, [k for k, _ in kvs[3:]]), 30,
                           what="the kept keys reported again")
        self.assertEqual(cc.exist(stub, removed), [False] * 3)
        self.assert_exact(self.cluster.stub(1), kvs[3:], "kept keys")


class ClientReturnsTest(RestartTestBase):
    CLUSTER = dict(clients=2, pure_clients=1, segment_size=32 * MiB,
                   master_args=["--client_ttl_ms", "1500"])

    def test_client_paused_past_its_ttl_comes_back_with_its_objects(self):
        owner = self.cluster.stub(0)
        kvs = [(b"paused-%d" % i, cc.payload(32 * KiB + i, 50 + i)) for i in range(32)]
        self.assertCodes(cc.put_inline(owner, kvs, replicas=1), ["OK"] * 32)
        reader = self.cluster.stub(2)
        regs = self.registrations(0)
        self.cluster.clients[0].pause()
        try:
            harness.wait_until(lambda: not any(cc.exist(reader, [k for k, _ in kvs])), 20,
                               what="the master dropped the paused client's objects")
        finally:
            self.cluster.clients[0].resume()
        harness.wait_until(lambda: self.registrations(0) > regs, 30,
                           what="client 0 registered again")
        harness.wait_until(lambda: self.all_exist(reader, [k for k, _ in kvs]), 30,
                           what="the returned client's objects known again")
        self.assert_exact(reader, kvs, "after the client returned")


class StaleWriterFrameTest(RestartTestBase):
    CLUSTER = dict(clients=2, segment_size=16 * MiB,
                   master_args=["--auth=false"], client_args=["--auth=false"])

    def lookup(self, master, key):
        resp = master.GetReplicas(mpb.GetReplicasRequest(keys=[key], lease_ttl_ms=1000),
                                  timeout=10)
        rec = resp.results[0]
        self.assertEqual(rec.code, spb.OK, rec.message)
        return rec.replicas[0]

    def test_frame_for_a_previous_master_runs_segment_is_refused(self):
        stub = self.cluster.stub(0)
        a = (b"stale-a", cc.payload(64 * KiB, 91))
        self.assertCodes(cc.put_inline(stub, [a], replicas=1), ["OK"])
        master = master_pb2_grpc.MasterStub(grpc.insecure_channel(self.cluster.master.ready["grpc"]))
        old = self.lookup(master, a[0])
        self.assertNotEqual(old.segment_id >> 32, 0, "segment ids carry the master's epoch")

        self.restart_master_and_wait()
        harness.wait_until(lambda: self.all_exist(stub, [a[0]]), 30, what="a reported again")
        b = (b"stale-b", cc.payload(64 * KiB, 92))
        self.assertCodes(cc.put_inline(stub, [b], replicas=1), ["OK"])
        master = master_pb2_grpc.MasterStub(grpc.insecure_channel(self.cluster.master.ready["grpc"]))
        new_a, new_b = self.lookup(master, a[0]), self.lookup(master, b[0])
        self.assertNotEqual(new_a.segment_id >> 32, old.segment_id >> 32, "a new epoch")
        self.assertNotIn(old.segment_id, (new_a.segment_id, new_b.segment_id))

        # The writer of the previous run finishes its write now: the owner has no such segment.
        host, port = old.data_endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            for rid, offset in ((1, old.offset), (2, new_b.offset)):
                junk = bytes([0xEE]) * 4096
                sock.sendall(HEADER.pack(MAGIC, VERSION, WRITE, rid, old.segment_id, offset,
                                         len(junk), 0, 0) + bytes(CAP_SIZE) + junk)
                magic, _, op, got_id, _, _, length, code, _ = HEADER.unpack(
                    recv_exact(sock, HEADER.size))
                self.assertEqual(got_id, rid)
                self.assertNotEqual(code, 0, "a write into a previous run's segment answered OK")
                if length:
                    recv_exact(sock, length)
        self.assert_exact(self.cluster.stub(1), [a, b], "after the stale writes")


if __name__ == "__main__":
    unittest.main()
