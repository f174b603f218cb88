"""Connections that never speak must not take what authenticated peers
need.

Item 1: the data plane counted connections still in their handshake against the same caps as
authenticated ones, so silent sockets from a few addresses blocked new peer connections. They
now have their own small budget (--data_max_pending_connections, the oldest dropped when it is
full; --data_max_pending_per_peer per address).

Item 2: the gRPC listeners (mc-master, mc-client's Store service over TCP and its
Unix socket) accepted connections and held them for gRPC's default 120 s handshake deadline
before any token check, so silent connections from anyone who could reach the port exhausted the
daemon's fds. --grpc_handshake_timeout_ms (here 1000) closes a connection that has not completed
its HTTP/2 handshake in time; legitimate calls go on meanwhile.

Item 3: the admin HTTP endpoint's connection cap was filled from a few addresses and /healthz
went unanswered; a new connection at the cap now closes the oldest one still waiting for its
request."""

import shutil
import socket
import tempfile
import time
import unittest

from integration import harness
from integration.client import client_cluster as cc
from mcstore.v1 import master_pb2 as mpb
from mcstore.v1 import master_pb2_grpc
from mcstore.v1 import store_pb2 as spb

import grpc

SILENT = 64
TIMEOUT_MS = 1000


def open_silent(address, n):
    """n connections to `address` ("host:port" or "unix:path") that never send a byte."""
    out = []
    for _ in range(n):
        if address.startswith("unix:"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(address[len("unix:"):])
        else:
            host, port = address.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=5)
        out.append(s)
    return out


def wait_all_closed(socks, timeout_s):
    """Waits until the peer closed every socket (EOF or reset); returns how many stayed open."""
    deadline = time.monotonic() + timeout_s
    open_ = list(socks)
    while open_ and time.monotonic() < deadline:
        still = []
        for s in open_:
            s.settimeout(0.05)
            try:
                data = s.recv(65536)  # gRPC may send its SETTINGS first; EOF means closed
                if data:
                    still.append(s)
            except socket.timeout:
                still.append(s)
            except OSError:
                pass  # reset: closed
        open_ = still
    return len(open_)


class ListenerHandshakeTimeoutTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        flag = ["--grpc_handshake_timeout_ms", str(TIMEOUT_MS)]
        cls.cluster = cc.Cluster(clients=1, master_args=flag, client_args=flag).start()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def check_listener(self, address, call):
        socks = open_silent(address, SILENT)
        try:
            call()  # a legitimate caller is served while the silent ones wait
            start = time.monotonic()
            left = wait_all_closed(socks, timeout_s=10)
            took = time.monotonic() - start
            self.assertEqual(left, 0, "%d of %d silent connections to %s still open after 10 s"
                             % (left, SILENT, address))
            print("%s: %d silent connections closed within %.1f s" % (address, SILENT, took))
            call()
        finally:
            for s in socks:
                s.close()

    def test_master_listener_closes_silent_connections(self):
        address = self.cluster.master.ready["grpc"]
        with grpc.insecure_channel(address) as ch:
            stub = master_pb2_grpc.MasterStub(ch)
            self.check_listener(address, lambda: stub.Hello(mpb.HelloRequest(), timeout=5))

    def test_store_tcp_listener_closes_silent_connections(self):
        stub = self.cluster.stub(0, session=False)
        self.check_listener(self.cluster.clients[0].ready["grpc"],
                            lambda: stub.BatchExist(spb.BatchExistRequest(keys=[b"k"]),
                                                    timeout=5))

    def test_store_unix_listener_closes_silent_connections(self):
        stub = self.cluster.unix_stub(0, session=False)
        self.check_listener("unix:" + self.cluster.clients[0].ready["unix_socket"],
                            lambda: stub.BatchExist(spb.BatchExistRequest(keys=[b"k"]),
                                                    timeout=5))
        self.assertTrue(self.cluster.healthy(0))


class DataPlanePendingBudgetTest(cc.ClusterTestMixin, unittest.TestCase):
    """Silent sockets from many loopback addresses (127.0.0.2..) at client 0's data port; client
    1 (from 127.0.0.1) then writes a replica there. The authenticated cap is set low (48), the
    handshake deadline long (20 s), so on a data plane without a separate pending budget the
    silent sockets hold every slot for the whole test and the put fails."""

    ADDRESSES = 16
    PER_ADDRESS = 16  # 256 in all: twice the default pending budget (128), 16 per address (32)

    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=2, client_args=[
            "--data_max_connections", "48", "--data_handshake_timeout_ms", "20000"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_silent_sockets_cannot_block_a_peer(self):
        host, port = self.cluster.clients[0].ready["data"].rsplit(":", 1)
        gauge = lambda: cc.metric(self.cluster.http(0), "mc_dataplane_connections")
        self.assertEqual(gauge(), 0, "no peer connection yet: the put below opens the first")
        socks = []
        try:
            for a in range(self.ADDRESSES):
                for _ in range(self.PER_ADDRESS):
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    s.bind(("127.0.0.%d" % (a + 2), 0))
                    s.settimeout(5)
                    s.connect((host, int(port)))
                    socks.append(s)
            # The data server has taken them in (none is authenticated).
            harness.wait_until(lambda: gauge() >= 48, 5, what="the silent sockets accepted")
            start = time.monotonic()
            vals = [(b"pending-budget-%d" % i, cc.payload(64 * cc.KiB, i)) for i in range(4)]
            res = cc.put_inline(self.cluster.stub(1), vals, replicas=2)
            took = time.monotonic() - start
            self.assertEqual([cc.code_name(r.code) for r in res], ["OK"] * 4,
                             "a put with a replica on the flooded client (took %.1f s)" % took)
            self.assertLess(took, 5.0)
            self.assert_exact(self.cluster.stub(0), vals, "read back on the flooded client")
            evicted = cc.metric(self.cluster.http(0), "mc_dataplane_pending_evicted_total") or 0
            print("%d silent sockets from %d addresses; put with a replica there took %.2f s; "
                  "%d pending evicted" % (len(socks), self.ADDRESSES, took, evicted))
            self.assertGreater(evicted, 0, "the pending budget (128) was full: oldest dropped")
            self.assertTrue(self.cluster.healthy(0))
        finally:
            for s in socks:
                s.close()


class HttpAdminFloodTest(unittest.TestCase):
    """The admin HTTP cap (here 16, 4 per address, requests allowed 10 s) was
    filled by silent sockets from a few addresses and /healthz went unanswered (503). When the
    cap is reached a new connection now closes the oldest one still waiting for its request."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="mc-http-flood-")
        self.master = harness.Daemon(
            "mc-master", harness.binary("master/mc-master"),
            ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log_level", "warn",
             "--http_max_connections", "16", "--http_max_connections_per_peer", "4",
             "--http_request_timeout_ms", "10000"], self.tmp).start()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.addCleanup(self.master.stop)

    def test_healthz_answers_under_a_flood_of_silent_connections(self):
        host, port = self.master.ready["http"].rsplit(":", 1)
        socks = []
        try:
            for a in range(8):
                for _ in range(4):
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    s.bind(("127.0.0.%d" % (a + 2), 0))
                    s.settimeout(5)
                    s.connect((host, int(port)))
                    socks.append(s)
            answered = 0
            for _ in range(20):
                try:
                    status, _ = harness.http_get(self.master.ready["http"], "/healthz",
                                                 timeout_s=5)
                except OSError:
                    status = None
                answered += status == 200
            print("/healthz answered %d of 20 probes under %d silent connections"
                  % (answered, len(socks)))
            self.assertEqual(answered, 20)
        finally:
            for s in socks:
                s.close()


if __name__ == "__main__":
    unittest.main()
