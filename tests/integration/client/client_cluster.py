"""A loopback mcstore cluster for the mc-client integration and fault tests.

One mc-master and N mc-client daemons (port 0 everywhere, ready files, each client also on a Unix
socket), Store stubs per client (TCP with the cluster's Store token, and Unix socket), shared-memory
buffers registered with a daemon (their fd passed over its fd socket, in one fd session per daemon
whose owner token the stubs send), and metrics helpers. Built on tests/integration/harness.py. Every wait is bounded;
stop() kills every process, unlinks every shm object and removes the temp dir, even after a
failure (call it from tearDown / addCleanup).
"""

import collections
import os
import secrets
import shutil
import sys
import tempfile
import time
from multiprocessing import shared_memory

import grpc

from integration import harness
from mcstore._fdchannel import FdSession
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
        """Passes the object's fd over the fd socket of the stub's daemon (a Cluster stub), then
        registers the handle; a plain stub registers by name (--store_allow_named_buffers)."""
        size = self.size if size is None else size
        session = getattr(stub, "mc_session", None)
        if session is not None:
            handle = session().register_path("/dev/shm/" + self.shm.name, size)
            req = spb.RegisterBufferRequest(handle=handle)
        else:
            req = spb.RegisterBufferRequest(shm_name=self.shm_name, size=size)
        resp = stub.RegisterBuffer(req, timeout=RPC_TIMEOUT_S)
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
                 per_client_args=None, pure_clients=0, client_binary="client/mc-client",
                 per_client_env=None):
        self.n = clients
        # Relative to the build dir: tests/fakes/mc-client-fakegpu runs the daemon on the fake
        # CUDA device of tests/fakes/shm_fake_cuda.h.
        self.client_binary = client_binary
        self.per_client_env = per_client_env or {}   # client index -> extra environment
        self.pure = pure_clients
        self.segment_size = segment_size
        self.master_args = list(master_args)
        self.client_args = list(client_args)
        self.per_client_args = per_client_args or {}
        self.tmp = tempfile.mkdtemp(prefix="mc-client-it-")
        self._final_logs = None  # the daemons' log tails as the cluster stopped (dump_logs)
        self.master = None
        self.master_port = 0
        self.clients = []
        self._channels = []
        self._buffers = []
        self._sessions = {}
        # The Store token of every mc-client's TCP listener (a 0600 file).
        self.token = secrets.token_hex(24)
        self.token_file = os.path.join(self.tmp, "store.token")
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token + "\n")

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
                time.sleep(0.2)  # retry pause while the old port is released, inside the deadline

    def master_address(self):
        """What the clients' --master says (a subclass with standbys gives the list)."""
        return self.master.ready["grpc"]

    def _start_client(self, i):
        pure = i >= self.n
        sock = os.path.join(self.tmp, "c%d.sock" % i)
        args = ["--master", self.master_address(), "--listen", "127.0.0.1:0",
                "--http", "127.0.0.1:0", "--data", "127.0.0.1:0", "--unix_socket", sock,
                "--store_token_file", self.token_file,
                "--client_id", "c%d" % i,
                "--segment_size", str(0 if pure else self.segment_size),
                "--log_level", "warn"] + self.client_args + list(self.per_client_args.get(i, []))
        return harness.Daemon("mc-client-%d" % i, harness.binary(self.client_binary), args,
                              self.tmp, env=self.per_client_env.get(i)).start()

    def wait_clients_alive(self, n, timeout_s=20):
        harness.wait_until(lambda: metric(self.master.ready["http"], "mc_clients_alive") == n,
                           timeout_s, interval_s=0.05, what="%d clients alive at the master" % n)

    def stop(self):
        for b in self._buffers:
            b.close()
        self._buffers = []
        for sess in self._sessions.values():
            sess.close()
        self._sessions = {}
        for ch in self._channels:
            ch.close()
        self._channels = []
        for d in self.clients + ([self.master] if self.master else []):
            try:
                d.stop(grace_s=3)
            except Exception as e:  # keep stopping the others
                print("stopping %s: %s" % (d.name, e), file=sys.stderr)
        # The logs go with the directory: their tails are kept for dump_logs (a failed test's
        # post-mortem runs after its cleanups stopped the cluster).
        self._final_logs = self._log_tails()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _log_tails(self):
        return [(d.name, d.log_tail(4000))
                for d in ([self.master] if self.master else []) + self.clients]

    def dump_logs(self):
        for name, tail in self._final_logs or self._log_tails():
            print("---- %s ----\n%s" % (name, tail), file=sys.stderr)

    # -- access ------------------------------------------------------------------------------
    def session(self, i):
        """The fd session with daemon i (opened on first use, again after it broke)."""
        sess = self._sessions.get(i)
        if sess is None or sess.closed:
            sess = FdSession(self.clients[i].ready["fd_socket"], RPC_TIMEOUT_S)
            self._sessions[i] = sess
        return sess

    def _owner_md(self, i):
        sess = self._sessions.get(i)
        return [("x-mc-owner", sess.owner)] if sess is not None and not sess.closed else []

    def stub(self, i, token=True, session=True):
        """A Store stub over TCP sending the cluster's token (unless token=False, or a string
        to send instead) and the owner token of the cluster's fd session with daemon i."""
        ch = grpc.insecure_channel(self.clients[i].ready["grpc"], options=CHANNEL_OPTIONS)
        self._channels.append(ch)
        tok = self.token if token is True else token

        def md():
            out = [("authorization", "Bearer " + tok)] if tok else []
            return out + (self._owner_md(i) if session else [])
        stub = store_pb2_grpc.StoreStub(grpc.intercept_channel(ch, MetadataInterceptor(md)))
        if session:
            stub.mc_session = lambda: self.session(i)
        return stub

    def unix_stub(self, i, session=True):
        ch = grpc.insecure_channel("unix:" + self.clients[i].ready["unix_socket"],
                                   options=CHANNEL_OPTIONS)
        self._channels.append(ch)
        md = (lambda: self._owner_md(i)) if session else (lambda: [])
        stub = store_pb2_grpc.StoreStub(grpc.intercept_channel(ch, MetadataInterceptor(md)))
        if session:
            stub.mc_session = lambda: self.session(i)
        return stub

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


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                         "compression")), grpc.ClientCallDetails):
    pass


class MetadataInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Adds the metadata `fn()` returns to every unary call."""

    def __init__(self, fn):
        self._fn = fn

    def intercept_unary_unary(self, continuation, details, request):
        md = list(details.metadata or []) + list(self._fn())
        return continuation(_CallDetails(details.method, details.timeout, md,
                                         details.credentials, details.wait_for_ready,
                                         details.compression), request)


class ClusterTestMixin:
    """For unittest.TestCase classes that keep their Cluster in `cluster`: the daemons' logs are
    printed when a test fails, assertCodes compares per-item codes by name, assert_exact reads
    keys back byte-exact."""

    def run(self, result=None):
        failed_before = len(result.failures) + len(result.errors) if result is not None else 0
        result = super().run(result)
        if result is not None and len(result.failures) + len(result.errors) > failed_before:
            self.cluster.dump_logs()  # this test failed (not an earlier one of the run)
        return result

    def assertCodes(self, results, want):
        self.assertEqual([code_name(r.code) for r in results], want,
                         [r.message for r in results])

    def assert_exact(self, stub, kvs, what):
        """Every (key, value) of `kvs` reads back through `stub` with exactly its bytes (gets of
        64 keys); fails naming the keys served wrong, then those not OK."""
        lost, wrong = [], []
        for start in range(0, len(kvs), 64):
            chunk = kvs[start:start + 64]
            got = get_inline(stub, [k for k, _ in chunk])
            for (k, v), r in zip(chunk, got):
                if r.code != spb.OK:
                    lost.append((k, code_name(r.code), r.message))
                elif r.data != v:
                    wrong.append(k)
        self.assertEqual(wrong, [], "%s: served with wrong bytes" % what)
        self.assertEqual(lost, [], "%s: acknowledged keys lost" % what)


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
