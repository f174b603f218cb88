"""Standby masters with leader election through etcd; clients follow the leader.

Real daemons on loopback: one etcd (started here on free ports, temp data dir), three mc-masters
with --etcd_endpoints, two mc-clients with segments and one pure client, all with --master a,b,c.
A new leader starts empty; the clients re-register with it and report their objects
(docs/architecture.md "Restart and return"). Checked here:
- two writers (replicas 1 and 2) put while the leader is SIGKILLed: every put answered OK, before
  and after, is readable afterwards with exactly its bytes (0 lost, 0 wrong), the answers are
  only OK/UNAVAILABLE/NOT_FOUND/NO_SPACE/TIMEOUT, and the time from the kill until puts succeed
  again and until every pre-kill key is readable is printed;
- the leader SIGSTOPped past its lease TTL: a standby takes over; SIGCONT: the old leader does not
  serve again (it exits non-zero), and no acknowledged key is lost.
If etcd's binary is missing the test fails (run deploy/install-deps.sh). Every wait is bounded;
every process, etcd too, is stopped even on failure."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import grpc

from integration import harness
from integration.client import client_cluster as cc
from mcstore.v1 import master_pb2 as mpb
from mcstore.v1 import master_pb2_grpc
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB
KiB = cc.KiB
ETCD = os.environ.get("MC_ETCD", "/usr/bin/etcd")
LEADER_TTL_S = 3
ALLOWED = {"OK", "UNAVAILABLE", "NOT_FOUND", "TIMEOUT", "NO_SPACE"}


def stopped(daemon):
    """True once every thread of the SIGSTOPped daemon is stopped (state T in /proc)."""
    with open("/proc/%d/stat" % daemon.proc.pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """One etcd member on loopback with a temp data dir. With `tls` (an object with ca, cert,
    key, client_cert, client_key paths) it serves https only; with `client_cert_auth` too it
    requires client certificates signed by that CA."""

    def __init__(self, tls=None, client_cert_auth=False):
        if not os.path.exists(ETCD):
            raise AssertionError("etcd not found at %s: run deploy/install-deps.sh (it installs "
                                 "Debian's etcd-server)" % ETCD)
        self.tls = tls
        self.dir = tempfile.mkdtemp(prefix="mc-etcd-")
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = "%s://127.0.0.1:%d" % ("https" if tls else "http", self.client_port)
        peer = "http://127.0.0.1:%d" % self.peer_port
        extra = []
        self.client_cert_auth = tls is not None and client_cert_auth
        if tls:
            extra = ["--cert-file", tls.cert, "--key-file", tls.key]
        if self.client_cert_auth:
            extra += ["--trusted-ca-file", tls.ca, "--client-cert-auth"]
        self.log = open(os.path.join(self.dir, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "t=" + peer] + extra,
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            harness.wait_until(self._healthy, 20, interval_s=0.1, what="etcd healthy")
        except Exception:
            self.stop()
            raise

    def request(self, path, body=None, token=None, timeout_s=2.0):
        """(HTTP status, body text) of a GET (body None) or a JSON POST to etcd."""
        import json
        import ssl
        import urllib.error
        import urllib.request
        ctx = None
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.tls.ca)
            if self.client_cert_auth:
                ctx.load_cert_chain(self.tls.client_cert, self.tls.client_key)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data)
        if token:
            req.add_header("Authorization", token)
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=ctx) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def _healthy(self):
        if self.proc.poll() is not None:
            raise RuntimeError("etcd exited: %s" % self.log_tail())
        try:
            status, body = self.request("/health", timeout_s=1.0)
            return status == 200 and "true" in body
        except OSError:
            return False

    def log_tail(self):
        try:
            with open(os.path.join(self.dir, "etcd.log"), "rb") as f:
                return f.read()[-3000:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class HaCluster(cc.Cluster):
    """etcd + 3 masters (one leads) + the clients of cc.Cluster, which get --master a,b,c."""

    def __init__(self, masters=3, etcd_tls=None, etcd_client_cert_auth=False,
                 per_master_args=None, **kw):
        super().__init__(**kw)
        self.n_masters = masters
        self.masters = []
        self.etcd = None
        self.etcd_tls = etcd_tls
        self.etcd_client_cert_auth = etcd_client_cert_auth
        self.per_master_args = per_master_args or {}

    def prepare_etcd(self):
        """Called once etcd answers, before the masters start (users, roles)."""

    def start_master(self, port=0):
        self.etcd = Etcd(self.etcd_tls, self.etcd_client_cert_auth)
        self.prepare_etcd()
        for i in range(self.n_masters):
            self.masters.append(self._start_one_master(i))
        self.master = self.wait_leader()
        return self.master

    def _start_one_master(self, i):
        args = ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                "--etcd_endpoints", self.etcd.url, "--leader_ttl_s", str(LEADER_TTL_S),
                "--maintenance_interval_ms", "50", "--client_ttl_ms", "3000",
                "--heartbeat_interval_ms", "200", "--log_level", "info"] + self.master_args + \
            self.per_master_args.get(i, [])
        return harness.Daemon("mc-master-%d" % i, harness.binary("master/mc-master"), args,
                              self.tmp).start()

    def master_address(self):
        return ",".join(m.ready["grpc"] for m in self.masters)

    def leaders(self, exclude=()):
        out = []
        for m in self.masters:
            if m in exclude or not m.alive():
                continue
            try:
                if cc.metric(m.ready["http"], "mc_master_leader") == 1:
                    out.append(m)
            except OSError:
                pass
        return out

    def wait_clients_alive(self, n, timeout_s=20):
        """As cc.Cluster's, asking the leader of the moment: on a loaded machine a leader whose
        lease refresh ran late exits (fail-stop, by design) and another takes over."""
        def alive():
            if not self.master.alive():
                self.master = self.wait_leader()
            try:
                return cc.metric(self.master.ready["http"], "mc_clients_alive") == n
            except OSError:   # exiting just now: the next poll finds it dead
                return False
        harness.wait_until(alive, timeout_s, interval_s=0.05,
                           what="%d clients alive at the master" % n)

    def wait_leader(self, exclude=(), timeout_s=30):
        got = harness.wait_until(lambda: self.leaders(exclude), timeout_s, interval_s=0.05,
                                 what="a leader elected")
        return got[0]

    def stop(self):
        others = [m for m in self.masters if m is not self.master]
        try:
            super().stop()  # clients, the current leader and the temp dir
        finally:
            for m in others:
                try:
                    m.stop(grace_s=3)
                except Exception as e:  # keep stopping the others
                    print("stopping %s: %s" % (m.name, e))
            if self.etcd is not None:
                self.etcd.stop()

    def _log_tails(self):
        return super()._log_tails() + [(m.name, m.log_tail(4000))
                                       for m in self.masters if m is not self.master]

    def dump_logs(self):
        super().dump_logs()
        if self.etcd is not None:
            print("---- etcd ----\n%s" % self.etcd.log_tail())


class FailoverTestBase(cc.ClusterTestMixin, unittest.TestCase):
    CLUSTER = dict(clients=2, pure_clients=1, segment_size=64 * MiB,
                   client_args=["--master_rpc_timeout_ms", "2000"])
    # Each writer stops after this many acknowledged batches of 4 x ~16 KiB (2 x 64 MiB stays
    # below the eviction watermark: every acknowledged key must stay).
    OK_BATCHES = 250

    def setUp(self):
        self.cluster = HaCluster(**self.CLUSTER)
        self.addCleanup(self.cluster.stop)
        self.cluster.start()
        self.acked = []  # (key, value, monotonic time the put was sent, time of its answer)
        self.answers = {}
        self.errors = []
        self.stop_load = threading.Event()
        self.lock = threading.Lock()
        self.threads = []

    def start_load(self):
        def writer(idx, stub, replicas):
            i = ok_batches = 0
            while not self.stop_load.is_set() and ok_batches < self.OK_BATCHES:
                batch = [(b"ha-%d-%d-%d" % (idx, i, j),
                          cc.payload(16 * KiB + 64 * j, idx * 100000 + i * 8 + j))
                         for j in range(4)]
                i += 1
                sent = time.monotonic()
                try:
                    res = cc.put_inline(stub, batch, replicas=replicas)
                except grpc.RpcError as e:
                    self.errors.append(repr(e))  # the local daemon is up throughout
                    return
                now = time.monotonic()
                ok_batches += all(r.code == spb.OK for r in res)
                with self.lock:
                    for (k, v), r in zip(batch, res):
                        name = cc.code_name(r.code)
                        self.answers[name] = self.answers.get(name, 0) + 1
                        if r.code == spb.OK:
                            self.acked.append((k, v, sent, now))
                time.sleep(0.01)  # paces the writer: a steady load across the failover

        self.threads = [
            threading.Thread(target=writer, args=(0, self.cluster.stub(0), 1), daemon=True),
            threading.Thread(target=writer, args=(1, self.cluster.stub(2), 2), daemon=True)]
        for t in self.threads:
            t.start()
        harness.wait_until(lambda: len(self.acked) >= 200 or self.errors, 60, what="puts running")
        self.assertEqual(self.errors, [])

    def finish_load(self, after, t0, t_down):
        """Waits for `after` puts sent once the old leader was down (`t_down`) and acknowledged,
        stops the writers; returns the seconds from `t0` (the signal) until the first of them
        was acknowledged."""
        harness.wait_until(lambda: sum(1 for a in self.acked if a[2] > t_down) >= after
                           or self.errors or not any(t.is_alive() for t in self.threads), 60,
                           what="puts acknowledged after the failover")
        self.stop_load.set()
        for t in self.threads:
            t.join(timeout=60)
        self.assertEqual(self.errors, [])
        first = [a[3] for a in self.acked if a[2] > t_down]
        self.assertTrue(first, "no put acknowledged after the failover")
        return min(first) - t0

    def wait_readable(self, kvs, timeout_s=30):
        reader = self.cluster.stub(2)
        keys = [k for k, _ in kvs]
        def known():
            try:
                return all(all(cc.exist(reader, keys[s:s + 512]))
                           for s in range(0, len(keys), 512))
            except grpc.RpcError as e:  # UNAVAILABLE until this client registered again
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                return False
        harness.wait_until(known, timeout_s, interval_s=0.05,
                           what="every acknowledged key known again")

    def check_all(self, what):
        kvs = [(k, v) for k, v, _, _ in self.acked]
        self.assertLessEqual(set(self.answers), ALLOWED, self.answers)
        self.wait_readable(kvs)
        self.assert_exact(self.cluster.stub(2), kvs, what + " (pure client)")
        self.assert_exact(self.cluster.stub(0), kvs, what + " (client 0)")
        return kvs

    def standby_answer(self, master):
        """The answer of a master to a GetStatus: (code, message, x-mc-leader)."""
        ch = grpc.insecure_channel(master.ready["grpc"])
        try:
            stub = master_pb2_grpc.MasterStub(ch)
            try:
                stub.GetStatus(mpb.GetStatusRequest(), timeout=5)
                return grpc.StatusCode.OK, "", None
            except grpc.RpcError as e:
                leader = dict(e.trailing_metadata() or ()).get("x-mc-leader")
                return e.code(), e.details(), leader
        finally:
            ch.close()


class LeaderKilledTest(FailoverTestBase):
    def test_leader_sigkilled_under_load_loses_nothing(self):
        cl = self.cluster
        old = cl.master
        # A standby answers UNAVAILABLE naming the leader, and /healthz answers it is alive.
        standby = next(m for m in cl.masters if m is not old)
        code, msg, leader = self.standby_answer(standby)
        self.assertEqual(code, grpc.StatusCode.UNAVAILABLE, msg)
        self.assertEqual(leader, old.ready["grpc"])
        self.assertIn("standby; leader is " + old.ready["grpc"], msg)
        self.assertEqual(harness.http_get(standby.ready["http"], "/healthz")[0], 200)
        _, status = harness.http_get(standby.ready["http"], "/status")
        self.assertIn("role=standby", status)

        self.start_load()
        with self.lock:
            before = [(k, v) for k, v, _, _ in self.acked]
        t0 = time.monotonic()
        old.kill()  # returns once it is dead
        t_down = time.monotonic()
        new = cl.wait_leader(exclude=(old,), timeout_s=LEADER_TTL_S + 20)
        elected_s = time.monotonic() - t0
        cl.master = new
        self.wait_readable(before)
        readable_s = time.monotonic() - t0
        first_put_s = self.finish_load(100, t0, t_down)
        kvs = self.check_all("after the leader was killed")
        self.assertEqual(cc.metric(new.ready["http"], "mc_master_elections_won_total"), 1)
        _, status = harness.http_get(new.ready["http"], "/status")
        self.assertIn("role=leader leader=" + new.ready["grpc"], status)
        # mc-admin with the list asks each master in turn; the new leader answers.
        admin = subprocess.run(
            [harness.binary("tools/mc-admin"), "--master", cl.master_address(),
             "--cluster_secret_file", harness.cluster_secret_file(), "status"],
            capture_output=True, text=True, timeout=30)
        self.assertEqual(admin.returncode, 0, admin.stderr)
        self.assertIn("Clients: 3", admin.stdout)
        print("leader SIGKILLed under load: new leader elected %.2f s after the kill, puts "
              "succeed again after %.2f s, every pre-kill key (%d) readable after %.2f s; "
              "%d keys acknowledged in all; answers %s"
              % (elected_s, first_put_s, len(before), readable_s, len(kvs),
                 dict(sorted(self.answers.items()))))


class LeaderPausedTest(FailoverTestBase):
    def test_leader_paused_past_its_ttl_never_serves_again(self):
        cl = self.cluster
        old = cl.master
        self.start_load()
        t0 = time.monotonic()
        old.pause()
        try:
            harness.wait_until(lambda: stopped(old), 5, interval_s=0.001, what="leader stopped")
            t_down = time.monotonic()
            new = cl.wait_leader(exclude=(old,), timeout_s=LEADER_TTL_S + 20)
            elected_s = time.monotonic() - t0
            cl.master = new
            harness.wait_until(lambda: sum(1 for a in self.acked if a[2] > t_down) >= 20
                               or self.errors, 60, what="puts acknowledged by the new leader")
        finally:
            old.resume()
        # The old leader's lease is gone: it refuses at once (fenced) and exits non-zero.
        harness.wait_until(lambda: not old.alive(), 15, what="the resumed old leader exits")
        self.assertNotEqual(old.proc.returncode, 0)
        self.assertIn("lost the leadership", old.log_tail(20000))
        first_put_s = self.finish_load(100, t0, t_down)
        kvs = self.check_all("after the paused leader was replaced")
        print("leader SIGSTOPped: new leader elected %.2f s after the stop, puts succeed again "
              "after %.2f s; the resumed old leader exited with %s; %d keys acknowledged; "
              "answers %s" % (elected_s, first_put_s, old.proc.returncode, len(kvs),
                              dict(sorted(self.answers.items()))))


if __name__ == "__main__":
    unittest.main()
