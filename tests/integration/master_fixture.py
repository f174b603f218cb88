"""The mc-master integration tests' fixture: a fresh real mc-master per test, driven over gRPC
as mc-clients would drive it, with the credentials mc-client sends (master_auth.py): Router
signs each call as its client, FakeClient registers and heartbeats, MasterFixture starts and
stops the daemon. Short TTLs and a fast maintenance loop keep time-based checks quick."""

import shutil
import tempfile
import threading
import unittest

import grpc

import harness
import master_auth
from mcstore.v1 import master_pb2 as pb
from mcstore.v1 import master_pb2_grpc
from mcstore.v1 import store_pb2

OK = store_pb2.OK
MiB = 1 << 20

CLIENT_TTL_MS = 1500
LEASE_TTL_MS = 1000
MAINTENANCE_MS = 50
TAKEOVER_MS = 600


class Router:
    """A Master stub that adds to each call the credentials its caller would have: a fresh
    registration proof (with the client's current token, as a re-registering mc-client sends
    it), an admin proof for GetStatus, else the session of the client the request names (or of
    the last registered client for requests that name none). Tokens answered by registrations
    are remembered."""

    def __init__(self, raw, keys):
        self.raw = raw
        self.keys = keys
        self.tokens = {}  # client id -> session token

    def metadata_for(self, name, req):
        if name == "RegisterClient":
            return self.keys.register_metadata(req, self.tokens.get(req.client_id))
        if name == "GetStatus":
            return self.keys.admin_metadata()
        cid = getattr(req, "client_id", "") or (list(self.tokens)[-1] if self.tokens else "")
        return master_auth.session_metadata(cid, self.tokens[cid]) if cid in self.tokens else []

    def __getattr__(self, name):
        method = getattr(self.raw, name)

        def call(req, timeout=None, metadata=None):
            md = self.metadata_for(name, req) if metadata is None else metadata
            resp = method(req, timeout=timeout, metadata=md)
            if name == "RegisterClient":
                self.tokens[req.client_id] = resp.session_token
            return resp
        return call


class FakeClient:
    """Registers with the master and heartbeats from a background thread until stopped."""

    def __init__(self, stub, client_id, segment_sizes, interval_s=0.2):
        self.stub = stub
        self.id = client_id
        resp = stub.RegisterClient(pb.RegisterClientRequest(
            client_id=client_id, host="host-" + client_id,
            data_endpoint="127.0.0.1:%d" % (10000 + len(client_id)),
            segments=[pb.SegmentSpec(local_index=i, size=s) for i, s in enumerate(segment_sizes)]),
            timeout=5)
        self.session = resp.session
        self.token = resp.session_token
        self.segment_ids = list(resp.segment_ids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, args=(interval_s,), daemon=True)
        self._thread.start()

    def _beat(self, interval_s):
        while not self._stop.wait(interval_s):
            try:
                self.stub.Heartbeat(pb.HeartbeatRequest(client_id=self.id, session=self.session),
                                    timeout=2)
            except grpc.RpcError:
                pass

    def stop_heartbeating(self):
        self._stop.set()
        self._thread.join(timeout=5)

    def heartbeat(self):
        """Whether the master knows this session (an unknown token is refused UNAUTHENTICATED,
        which mc-client takes as known=false)."""
        try:
            return self.stub.Heartbeat(
                pb.HeartbeatRequest(client_id=self.id, session=self.session), timeout=5).known
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                return False
            raise

    def put_start(self, items, replicas=1):
        return self.stub.PutStart(pb.PutStartRequest(
            client_id=self.id, replicas=replicas,
            items=[pb.PutStartItem(key=k, size=s) for k, s in items]), timeout=10)

    def put_end(self, items):
        return self.stub.PutEnd(pb.PutEndRequest(
            client_id=self.id,
            items=[pb.PutEndItem(key=k, generation=g, checksum=c) for k, g, c in items]), timeout=10)

    def put(self, items, replicas=1):
        """PutStart + PutEnd of [(key, size)]; returns the PutStart results."""
        started = self.put_start(items, replicas)
        ends = [(k, r.generation, 1234) for (k, _), r in zip(items, started.results) if r.code == OK]
        if ends:
            ended = self.put_end(ends)
            for r in ended.results:
                assert r.code == OK, r
        return started.results


MAX_BATCH = 5000


class MasterFixture(unittest.TestCase):
    """A fresh mc-master per test, and helpers; no tests of its own."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="mc-master-it-")
        self.clients = []
        self.master = harness.Daemon(
            "mc-master", harness.binary("master/mc-master"),
            ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
             "--client_ttl_ms", str(CLIENT_TTL_MS), "--lease_ttl_ms", str(LEASE_TTL_MS),
             "--maintenance_interval_ms", str(MAINTENANCE_MS), "--log_level", "warn",
             "--max_batch_items", str(MAX_BATCH),
             "--client_takeover_after_ms", str(TAKEOVER_MS)],
            self.tmp, ready_timeout_s=30)
        self.master.start()
        self._connect()

    def _connect(self):
        self.http = self.master.ready["http"]
        self.channel = grpc.insecure_channel(self.master.ready["grpc"])
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.raw = master_pb2_grpc.MasterStub(self.channel)
        self.keys = master_auth.Keys(harness.cluster_secret_file(), stub=self.raw)
        self.stub = Router(self.raw, self.keys)

    def restart_master(self):
        """Stops mc-master and starts it again with the same flags (it forgets everything; its
        ports change), and reconnects raw/stub/http. Fake clients must be stopped first."""
        self.channel.close()
        rc = self.master.stop()
        self.assertIn(rc, (0, -15), self.master.log_tail())
        self.master.start()
        self._connect()

    def tearDown(self):
        for c in self.clients:
            c.stop_heartbeating()
        self.channel.close()
        rc = self.master.stop()
        if self._failed():
            print("---- mc-master log ----\n" + self.master.log_tail())
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertIn(rc, (0, -15), "mc-master did not shut down cleanly:\n" + self.master.log_tail())

    def _failed(self):
        result = getattr(getattr(self, "_outcome", None), "result", None)
        if result is None:
            return False
        return any(t is self for t, _ in list(result.failures) + list(result.errors))

    def client(self, client_id, segment_sizes):
        c = FakeClient(self.stub, client_id, segment_sizes)
        self.clients.append(c)
        return c

    def metrics(self):
        status, body = harness.http_get(self.http, "/metrics")
        self.assertEqual(status, 200)
        return body, harness.parse_prometheus(body)

    def exist(self, keys):
        return list(self.stub.Exist(pb.ExistRequest(keys=keys), timeout=5).exists)
