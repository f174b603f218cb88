"""Issue 35, item 2: the gRPC listeners (mc-master, mc-client's Store service over TCP and its
Unix socket) accepted connections and held them for gRPC's default 120 s handshake deadline
before any token check, so silent connections from anyone who could reach the port exhausted the
daemon's fds. --grpc_handshake_timeout_ms (here 1000) closes a connection that has not completed
its HTTP/2 handshake in time; legitimate calls go on meanwhile."""

import socket
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


if __name__ == "__main__":
    unittest.main()
