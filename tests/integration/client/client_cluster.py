"""A loopback mcstore cluster for the mc-client integration and fault tests.

One mc-master and N mc-client daemons (port 0 everywhere, ready files, each client also on a Unix
socket), Store stubs per client (TCP and Unix socket), shared-memory buffers registered with a
daemon, and metrics helpers. Built on tests/integration/harness.py. Every wait is bounded;
stop() kills every process, unlinks every shm object and removes the temp dir, even after a
failure (call it from tearDown / addCleanup).
"""

import os
import shutil
import sys
import tempfile
import time
from multiprocessing import shared_memory

import grpc

from integration import harness
from mcstore.v1 import store_pb2 as spb
from mcstore.v1 import store_pb2_grpc

MiB = 1 << 20
KiB = 1 << 10
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 512 * MiB),
                   ("grpc.max_receive_message_length", 512 * MiB)]
RPC_TIMEOUT_S = 30


def metrics(address):
    status, body = harness.http_get(address, "/metrics")
    if status != 200:
        raise RuntimeError("GET %s/metrics: %s" % (address, status))
    return harness.parse_prometheus(body)


def metric(address, name, **labels):
    m = metrics(address)
    if labels:
        return m.get((name, frozenset(labels.items())), 0.0)
    return m.get(name, 0.0)


class ShmBuffer:
    """A SharedMemory object, optionally registered with one daemon's Store."""

    def __init__(self, size, fill=0):
        self.shm = shared_memory.SharedMemory(create=True, size=size)
        self.size = size
        self.shm_name = "/" + self.shm.name
        self.buffer_id = None
        self._stub = None
        if fill:
            self.fill(fill)

    @property
    def buf(self):
        return self.shm.buf

    def fill(self, byte, offset=0, length=None):
        length = self.size - offset if length is None else length
        self.shm.buf[offset:offset + length] = bytes([byte]) * length

    def write(self, offset, data):
        self.shm.buf[offset:offset + len(data)] = data

    def read(self, offset, length):
        return bytes(self.shm.buf[offset:offset + length])

    def register(self, stub, size=None):
        resp = stub.RegisterBuffer(spb.RegisterBufferRequest(
            shm_name=self.shm_name, size=self.size if size is None else size),
            timeout=RPC_TIMEOUT_S)
        self.buffer_id = resp.buffer_id
        self._stub = stub
        return self.buffer_id

    def slice(self, offset, length):
        return spb.Slice(buffer_id=self.buffer_id, offset=offset, length=length)

    def close(self):
        if self._stub is not None and self.buffer_id is not None:
            try:
                self._stub.UnregisterBuffer(spb.UnregisterBufferRequest(buffer_id=self.buffer_id),
                                            timeout=5)
            except grpc.RpcError:
                pass  # the daemon may be dead already
            self._stub = None
        if self.shm is not None:
            try:
                self.shm.close()
            except BufferError:
                pass  # an exported memoryview still alive; unlink anyway
            try:
                self.shm.unlink()
            except FileNotFoundError:
                pass
            self.shm = None


class Cluster:
    """mc-master + N mc-clients on loopback. See the module docstring."""

    def __init__(self, clients=2, segment_size=64 * MiB, master_args=(), client_args=(),
                 per_client_args=None, pure_clients=0):
        self.n = clients
        self.pure = pure_clients
        self.segment_size = segment_size
        self.master_args = list(master_args)
        self.client_args = list(client_args)
        self.per_client_args = per_client_args or {}
        self.tmp = tempfile.mkdtemp(prefix="mc-client-it-")
        self.master = None
        self.master_port = 0
        self.clients = []
        self._channels = []
        self._buffers = []

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self):
        try:
            self.start_master()
            for i in range(self.n + self.pure):
                self.clients.append(self._start_client(i))
            self.wait_clients_alive(self.n + self.pure)
        except Exception:
            self.stop()
            raise
        return self

    def start_master(self, port=0):
        args = ["--listen", "127.0.0.1:%d" % port, "--http", "127.0.0.1:0",
                "--maintenance_interval_ms", "50", "--client_ttl_ms", "3000",
                "--heartbeat_interval_ms", "200", "--log_level", "warn"] + self.master_args
        self.master = harness.Daemon("mc-master", harness.binary("master/mc-master"), args,
                                     self.tmp).start()
        self.master_port = int(self.master.ready["grpc"].rsplit(":", 1)[1])
        return self.master

    def restart_master(self):
        """SIGKILL the master and start a new one on the same port (bounded retries: the port
        may linger a moment)."""
        self.master.kill()
        deadline = time.monotonic() + 20
        while True:
            try:
                return self.start_master(self.master_port)
            except harness.DaemonError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _start_client(self, i):
        pure = i >= self.n
        sock = os.path.join(self.tmp, "c%d.sock" % i)
        args = ["--master", self.master.ready["grpc"], "--listen", "127.0.0.1:0",
                "--http", "127.0.0.1:0", "--data", "127.0.0.1:0", "--unix_socket", sock,
                "--client_id", "c%d" % i,
                "--segment_size", str(0 if pure else self.segment_size),
                "--log_level", "warn"] + self.client_args + list(self.per_client_args.get(i, []))
        return harness.Daemon("mc-client-%d" % i, harness.binary("client/mc-client"), args,
                              self.tmp).start()

    def wait_clients_alive(self, n, timeout_s=20):
        harness.wait_until(lambda: metric(self.master.ready["http"], "mc_clients_alive") == n,
                           timeout_s, interval_s=0.05, what="%d clients alive at the master" % n)

    def stop(self):
        for b in self._buffers:
            b.close()
        self._buffers = []
        for ch in self._channels:
            ch.close()
        self._channels = []
        for d in self.clients + ([self.master] if self.master else []):
            try:
                d.stop(grace_s=3)
            except Exception as e:  # keep stopping the others
                print("stopping %s: %s" % (d.name, e), file=sys.stderr)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def dump_logs(self):
        for d in ([self.master] if self.master else []) + self.clients:
            print("---- %s ----\n%s" % (d.name, d.log_tail(4000)), file=sys.stderr)

    # -- access ------------------------------------------------------------------------------
    def stub(self, i):
        ch = grpc.insecure_channel(self.clients[i].ready["grpc"], options=CHANNEL_OPTIONS)
        self._channels.append(ch)
        return store_pb2_grpc.StoreStub(ch)

    def unix_stub(self, i):
        ch = grpc.insecure_channel("unix:" + self.clients[i].ready["unix_socket"],
                                   options=CHANNEL_OPTIONS)
        self._channels.append(ch)
        return store_pb2_grpc.StoreStub(ch)

    def http(self, i):
        return self.clients[i].ready["http"]

    def master_http(self):
        return self.master.ready["http"]

    def buffer(self, size, stub=None, fill=0):
        b = ShmBuffer(size, fill)
        self._buffers.append(b)
        if stub is not None:
            b.register(stub)
        return b

    def healthy(self, i):
        try:
            return harness.http_get(self.http(i), "/healthz", timeout_s=5)[0] == 200
        except OSError:
            return False


class ClusterTestMixin:
    """For unittest.TestCase classes that keep their Cluster in `cluster`: the daemons' logs are
    printed when a test fails, and assertCodes compares per-item codes by name."""

    def run(self, result=None):
        result = super().run(result)
        if result is not None and (result.failures or result.errors):
            self.cluster.dump_logs()
        return result

    def assertCodes(self, results, want):
        self.assertEqual([code_name(r.code) for r in results], want,
                         [r.message for r in results])


# -- Store call helpers ----------------------------------------------------------------------
def put_inline(stub, kvs, replicas=0):
    resp = stub.BatchPut(spb.BatchPutRequest(
        items=[spb.PutItem(key=k, data=v) for k, v in kvs], replicas=replicas),
        timeout=RPC_TIMEOUT_S)
    return list(resp.results)


def get_inline(stub, keys, lease_id=0):
    resp = stub.BatchGet(spb.BatchGetRequest(items=[spb.GetItem(key=k) for k in keys],
                                             lease_id=lease_id), timeout=RPC_TIMEOUT_S)
    return list(resp.results)


def exist(stub, keys):
    return list(stub.BatchExist(spb.BatchExistRequest(keys=keys), timeout=RPC_TIMEOUT_S).exists)


def payload(size, seed):
    """Deterministic bytes of `size` for `seed` (fast: a repeated random block)."""
    import random
    rnd = random.Random(seed)
    block = bytes(rnd.getrandbits(8) for _ in range(min(size, 4099)))
    reps = size // len(block) + 1 if block else 0
    return (block * reps)[:size]


def code_name(code):
    return spb.Code.Name(code)
