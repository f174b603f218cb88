"""mc-client fault tests with real daemons: a client holding the only replica is SIGKILLed before
and during batch gets (its keys fail, never OK; keys held by live clients stay OK), a holder is
SIGKILLed during puts with two replicas (every put answered OK reads back exact), and the master
is killed and restarted on the same port (clients re-register, the cluster takes puts again).

Hardening against faults that once crashed or hung the daemon: a registered shm buffer truncated
under the daemon (no crash, that item fails), a replica holder and an owner stopped with SIGSTOP
mid-put and mid-get (answers within the deadline, never OK with fewer replicas or wrong bytes),
the master stopped and restarted during puts (transient UNAVAILABLE, never INVALID_ARGUMENT),
slow clients on every port (health checks still answer), and the data plane at its fd limit
(accept backs off, no spin). Every call carries a deadline; each test stays within a few seconds
of daemon time."""

import collections
import os
import resource
import socket
import threading
import time
import unittest

import grpc

from integration import harness
from integration import master_auth
from integration.client import client_cluster as cc
from mcstore.v1 import master_pb2 as mpb
from mcstore.v1 import master_pb2_grpc as mpb_grpc
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

    def run_through_holder_kill(self, step, what, start_timeout_s, after_timeout_s):
        """Calls step(round) in a loop on a thread; step returns a list of what went wrong
        (empty when nothing did). SIGKILLs client 0 once 3 rounds ran, lets 5 more rounds run,
        then stops the loop and asserts that nothing went wrong and the thread ended."""
        stop = threading.Event()
        errors, rounds = [], [0]

        def loop():
            try:
                while not stop.is_set():
                    errors.extend(step(rounds[0]))
                    rounds[0] += 1
            except Exception as e:  # surfaced below
                errors.append(repr(e))

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        harness.wait_until(lambda: rounds[0] >= 3 or errors, start_timeout_s,
                           what="%s running" % what)
        self.c.clients[0].kill()
        killed_at = rounds[0]
        harness.wait_until(lambda: rounds[0] >= killed_at + 5 or errors, after_timeout_s,
                           what="%s after the kill" % what)
        stop.set()
        t.join(timeout=after_timeout_s)
        self.assertFalse(t.is_alive())
        self.assertEqual(errors, [])

    def test_kill_during_batch_gets(self):
        def step(_round):
            errors = []
            for (k, v), r in zip(self.batch, self.get_batch()):
                if r.code == spb.OK and r.data != v:
                    errors.append("%s OK with wrong bytes" % k)
                if k.startswith(b"survivor") and r.code != spb.OK:
                    errors.append("%s failed: %s" % (k, r.message))
            return errors

        self.run_through_holder_kill(step, "reads", 20, 30)
        self.check(self.get_batch())

    def test_kill_during_batch_puts(self):
        """A holder SIGKILLed while puts with replicas=2 write to it: every put is answered
        within its deadline; every put answered OK had both replicas written, so it reads back
        exact from the survivor; the others fail with a code, never OK."""
        acked, failed = [], collections.Counter()
        writer = self.c.stub(2)

        def step(n):
            kvs = [(b"mid-put-%d-%d" % (n, i), cc.payload(256 * KiB, 300 + 4 * n + i))
                   for i in range(4)]
            t0 = time.monotonic()
            res = cc.put_inline(writer, kvs, replicas=2)
            took = time.monotonic() - t0
            for kv, r in zip(kvs, res):
                if r.code == spb.OK:
                    acked.append(kv)
                else:
                    failed[cc.code_name(r.code)] += 1
            return ["a put batch took %.1f s" % took] if took > cc.RPC_TIMEOUT_S else []

        self.run_through_holder_kill(step, "puts", 30, 60)
        print("holder killed during puts: %d acknowledged, failures %s"
              % (len(acked), dict(failed)))
        self.assertGreater(len(acked), 0)
        self.assertGreater(sum(failed.values()), 0, "puts after the kill must not all be OK")
        for i in range(0, len(acked), 8):
            chunk = acked[i:i + 8]
            got = cc.get_inline(self.reader, [k for k, _ in chunk])
            for (k, v), r in zip(chunk, got):
                if r.code != spb.OK:
                    self.c.dump_logs()
                self.assertEqual(cc.code_name(r.code), "OK", "%s acknowledged but %s: %s"
                                 % (k, cc.code_name(r.code), r.message))
                self.assertTrue(r.data == v, "%s: wrong bytes" % k)


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


def cpu_seconds(pid):
    """utime + stime of a process, from /proc (needs no fd in the process itself)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class ShmTruncatedTest(unittest.TestCase):
    """The issue: a registered 4 MiB buffer shrunk to 0 with ftruncate killed mc-client with
    SIGBUS on the next BatchPut or BatchGet."""

    def setUp(self):
        self.c = cc.Cluster(clients=1, segment_size=16 * MiB)
        self.addCleanup(self.c.stop)
        self.c.start()

    def test_truncated_buffer_fails_its_items_and_the_daemon_lives(self):
        stub = self.c.stub(0)
        buf = self.c.buffer(4 * MiB, stub, fill=7)
        value = cc.payload(64 * KiB, 5)
        self.assertEqual([r.code for r in cc.put_inline(stub, [(b"kept", value)])], [spb.OK])
        os.truncate("/dev/shm/" + buf.shm_name.lstrip("/"), 0)  # never touch buf.buf after this
        start = time.monotonic()
        put = stub.BatchPut(spb.BatchPutRequest(items=[
            spb.PutItem(key=b"from-truncated", slices=[buf.slice(0, 1 * MiB)]),
            spb.PutItem(key=b"inline-neighbour", data=value)]), timeout=10).results
        self.assertEqual(cc.code_name(put[0].code), "INVALID_ARGUMENT", put[0].message)
        self.assertIn("truncated", put[0].message)
        self.assertEqual(put[1].code, spb.OK, put[1].message)
        got = stub.BatchGet(spb.BatchGetRequest(items=[
            spb.GetItem(key=b"kept", slices=[buf.slice(0, 64 * KiB)]),
            spb.GetItem(key=b"kept")]), timeout=10).results
        self.assertEqual(cc.code_name(got[0].code), "INVALID_ARGUMENT", got[0].message)
        self.assertEqual(got[1].code, spb.OK, got[1].message)
        self.assertEqual(got[1].data, value)
        self.assertLess(time.monotonic() - start, 10)
        self.assertTrue(self.c.clients[0].alive() and self.c.healthy(0))
        self.assertFalse(any(cc.exist(stub, [b"from-truncated"])))


class StalledPeerTest(unittest.TestCase):
    """SIGSTOP of a replica holder mid-put and of an owner mid-get: answered within the
    deadlines, never OK with fewer replicas than asked, never wrong bytes."""

    def setUp(self):
        # c0 writes and holds one replica, c1 the other; c2 (pure) reads.
        self.c = cc.Cluster(clients=2, pure_clients=1, segment_size=16 * MiB,
                            master_args=["--lease_ttl_ms", "1500", "--client_ttl_ms", "60000"],
                            client_args=["--put_write_timeout_ms", "1500"])
        self.addCleanup(self.c.stop)
        self.c.start()
        self.addCleanup(self.c.clients[1].resume)

    # Once an open bug (about 1 run in 10 answered one item OK while its second holder was
    # stopped, before the data-plane authentication work); 40 of 40 runs passed since
    # (2026-12-01), so it runs again. If it fails, the diagnostics below say where the master
    # placed the item.
    def test_put_with_a_stopped_second_holder(self):
        s0 = self.c.stub(0)
        before = [(b"two-before-%d" % i, cc.payload(32 * KiB, 50 + i)) for i in range(2)]
        self.assertEqual([r.code for r in cc.put_inline(s0, before, replicas=2)], [spb.OK] * 2)
        self.c.clients[1].pause()
        kvs = [(b"two-%d" % i, cc.payload(32 * KiB, 60 + i)) for i in range(3)]
        start = time.monotonic()
        res = cc.put_inline(s0, kvs, replicas=2)
        took = time.monotonic() - start
        self.assertLess(took, 8, "bounded by --put_write_timeout_ms, not the master's 30 s")
        for (k, _), r in zip(kvs, res):
            if r.code == spb.OK:  # diagnose before failing: where the master says it lives
                with grpc.insecure_channel(self.c.master.ready["grpc"]) as ch:
                    stub = mpb_grpc.MasterStub(ch)
                    md = master_auth.observer_session(
                        stub, master_auth.Keys(harness.cluster_secret_file()))
                    print(stub.GetReplicas(mpb.GetReplicasRequest(keys=[k], no_lease=True),
                                           metadata=md, timeout=5))
                print(self.c.clients[0].log_tail(3000))
            self.assertNotEqual(r.code, spb.OK, "%s OK with a replica holder stopped" % k)
            self.assertIn(cc.code_name(r.code), ("TRANSFER_FAILED", "UNAVAILABLE"), r.message)
        self.c.clients[1].resume()
        # Afterwards: the failed keys are absent or whole, never torn.
        for (k, v), r in zip(kvs, cc.get_inline(self.c.stub(2), [k for k, _ in kvs])):
            if r.code == spb.OK:
                self.assertEqual(r.data, v, k)
        res = cc.put_inline(s0, [(b"two-after", cc.payload(1000, 70))], replicas=2)
        self.assertEqual(res[0].code, spb.OK, res[0].message)

    def test_get_from_a_stopped_owner(self):
        s1 = self.c.stub(1)
        kvs = [(b"on-c1-%d" % i, cc.payload(48 * KiB, 80 + i)) for i in range(3)]
        self.assertEqual([r.code for r in cc.put_inline(s1, kvs, replicas=1)], [spb.OK] * 3)
        self.c.clients[1].pause()
        start = time.monotonic()
        got = cc.get_inline(self.c.stub(2), [k for k, _ in kvs])
        took = time.monotonic() - start
        self.assertLess(took, 8, "bounded by the read lease (1.5 s)")
        for (k, v), r in zip(kvs, got):
            self.assertNotEqual(r.code, spb.OK, k)
            self.assertEqual(r.data, b"")
            self.assertEqual(cc.code_name(r.code), "TRANSFER_FAILED", r.message)
        self.c.clients[1].resume()
        got = cc.get_inline(self.c.stub(2), [k for k, _ in kvs])
        self.assertEqual([r.data for r in got], [v for _, v in kvs])


class MasterStalledAndRestartedDuringPutsTest(unittest.TestCase):
    def setUp(self):
        self.c = cc.Cluster(clients=1, segment_size=16 * MiB,
                            client_args=["--master_rpc_timeout_ms", "1000"])
        self.addCleanup(self.c.stop)
        self.c.start()

    def test_stopped_master_answers_unavailable_within_the_deadline(self):
        stub = self.c.stub(0)
        self.c.master.pause()
        try:
            start = time.monotonic()
            res = cc.put_inline(stub, [(b"while-stopped", cc.payload(1000, 1))])
            self.assertLess(time.monotonic() - start, 6)
            self.assertEqual(cc.code_name(res[0].code), "UNAVAILABLE", res[0].message)
        finally:
            self.c.master.resume()
        res = cc.put_inline(stub, [(b"after-resume", cc.payload(1000, 2))])
        self.assertEqual(res[0].code, spb.OK, res[0].message)

    def test_puts_across_a_master_restart(self):
        stub = self.c.stub(0)
        stop = threading.Event()
        answers = []  # (key, value, code, message, seconds)
        errors = []

        def loop():
            i = 0
            while not stop.is_set():
                k, v = b"restart-%d" % i, cc.payload(4 * KiB, 100 + i)
                t0 = time.monotonic()
                try:
                    r = cc.put_inline(stub, [(k, v)])[0]
                    answers.append((k, v, r.code, r.message, time.monotonic() - t0))
                except Exception as e:  # surfaced below
                    errors.append(repr(e))
                i += 1
                time.sleep(0.02)  # paces the writer: a steady trickle of puts across the restart

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        harness.wait_until(lambda: len(answers) >= 5 or errors, 20, what="puts running")
        self.c.restart_master()
        self.c.wait_clients_alive(1, timeout_s=20)
        n = len(answers)
        harness.wait_until(lambda: (len(answers) >= n + 5 and answers[-1][2] == spb.OK)
                           or errors, 30, what="puts OK again after the restart")
        stop.set()
        t.join(timeout=30)
        self.assertEqual(errors, [])
        codes = {cc.code_name(c) for _, _, c, _, _ in answers}
        self.assertNotIn("INVALID_ARGUMENT", codes, [m for *_, m, _ in answers])
        self.assertLessEqual(codes, {"OK", "UNAVAILABLE", "NOT_FOUND"}, codes)
        self.assertLess(max(s for *_, s in answers), 15, "every put answered within its deadline")
        ok = [(k, v) for k, v, c, _, _ in answers if c == spb.OK]
        for (k, v), r in zip(ok, cc.get_inline(stub, [k for k, _ in ok])):
            if r.code == spb.OK:
                self.assertEqual(r.data, v, k)


class SlowClientsOnEveryPortTest(unittest.TestCase):
    """The issue: eight slow HTTP clients made /healthz time out (a liveness probe would then
    restart the daemon and lose its memory)."""

    def setUp(self):
        self.c = cc.Cluster(clients=2, segment_size=16 * MiB)
        self.addCleanup(self.c.stop)
        self.c.start()

    def slow(self, address, partial):
        host, port = address.rsplit(":", 1)
        socks = []
        for _ in range(12):
            s = socket.create_connection((host, int(port)), timeout=5)
            s.sendall(partial)
            socks.append(s)
        self.addCleanup(lambda: [s.close() for s in socks])
        return socks

    def test_health_and_data_survive_slow_clients(self):
        for i in range(2):
            self.slow(self.c.http(i), b"GET /heal")
            self.slow(self.c.clients[i].ready["data"], b"MCTF\x01")
            self.slow(self.c.clients[i].ready["grpc"], b"PRI * HTTP/2.0\r\n")
        self.slow(self.c.master_http(), b"GET /metr")
        start = time.monotonic()
        for i in range(2):
            self.assertTrue(self.c.healthy(i))
        self.assertEqual(harness.http_get(self.c.master_http(), "/healthz", timeout_s=5)[0], 200)
        self.assertLess(time.monotonic() - start, 3)
        kvs = [(b"slow-%d" % i, cc.payload(40 * KiB, 120 + i)) for i in range(4)]
        self.assertEqual([r.code for r in cc.put_inline(self.c.stub(0), kvs)], [spb.OK] * 4)
        got = cc.get_inline(self.c.stub(1), [k for k, _ in kvs])  # over the data plane
        self.assertEqual([r.data for r in got], [v for _, v in kvs])


class DataPlaneFdExhaustionTest(unittest.TestCase):
    """The issue: at the fd limit the data-plane accept loop spun at 99% CPU."""

    def setUp(self):
        self.c = cc.Cluster(clients=1, segment_size=16 * MiB)
        self.addCleanup(self.c.stop)
        self.c.start()

    def test_accept_failures_back_off(self):
        cache = os.path.join(harness.build_dir(), "CMakeCache.txt")
        if os.path.exists(cache) and "MC_SANITIZE:STRING=address" in open(cache).read():
            # Not a bug of ours: UBSan's -fsanitize=vptr check tests whether memory is readable
            # by writing it into a pipe (sanitizer_common's IsAccessibleMemoryRange); at the fd
            # limit pipe() fails, so the first virtual call (fmt's buffer, in the log line about
            # the failing accept) is reported as "invalid vptr" and the daemon halts. Reproduced
            # with a 12-line program (a virtual call after exhausting RLIMIT_NOFILE). The release
            # and clang stages run this test.
            self.skipTest("UBSan's vptr check needs a free fd (it probes memory through a pipe)")
        d = self.c.clients[0]
        pid = d.proc.pid
        open_fds = len(os.listdir("/proc/%d/fd" % pid))
        soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        self.addCleanup(resource.prlimit, pid, resource.RLIMIT_NOFILE, (soft, hard))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds + 8, hard))
        host, port = d.ready["data"].rsplit(":", 1)
        socks = []
        self.addCleanup(lambda: [s.close() for s in socks])
        for _ in range(24):
            socks.append(socket.create_connection((host, int(port)), timeout=5))
        # Lets the accept loop meet the fd limit before the window; nothing can be asked meanwhile
        # (the daemon's HTTP endpoint is at the same limit), the count is checked after it.
        time.sleep(0.5)
        before = cpu_seconds(pid)
        time.sleep(2.0)  # the measuring window: CPU used over 2 s of wall time is what is tested
        used = cpu_seconds(pid) - before
        self.assertLess(used, 0.8, "the accept loop spins at the fd limit (%.2f s CPU in 2 s)"
                        % used)
        for s in socks:
            s.close()
        socks.clear()
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        harness.wait_until(lambda: self.c.healthy(0), 10, what="healthy again")
        self.assertGreater(cc.metric(self.c.http(0), "mc_dataplane_accept_errors_total"), 0)
        kvs = [(b"after-fds", cc.payload(1000, 9))]
        self.assertEqual([r.code for r in cc.put_inline(self.c.stub(0), kvs)], [spb.OK])


if __name__ == "__main__":
    unittest.main()
