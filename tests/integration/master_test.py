"""Integration tests of the real mc-master binary, driven over gRPC as two mc-clients would be.

Short TTLs and a fast maintenance loop keep the time-based checks quick; every wait is bounded.
The master authenticates (the harness's cluster secret): every call here carries the credentials
mc-client would send (master_auth.py), and the AuthTest cases are the attacks of issue 14, made
with just a socket: no, forged, stale or replayed proofs, and calls in another client's name.
"""

import os
import re
import shutil
import tempfile
import threading
import time
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
        self.http = self.master.ready["http"]
        self.channel = grpc.insecure_channel(self.master.ready["grpc"])
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.raw = master_pb2_grpc.MasterStub(self.channel)
        self.keys = master_auth.Keys(harness.cluster_secret_file())
        self.stub = Router(self.raw, self.keys)

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



class MasterIntegrationTest(MasterFixture):

    def test_put_get_release_remove(self):
        c1 = self.client("c1", [MiB])
        self.client("c2", [MiB])
        started = c1.put_start([(b"k1", 1000), (b"k2", 5000)], replicas=2)
        self.assertEqual([r.code for r in started.results], [OK, OK])
        for r in started.results:
            self.assertEqual(len(r.replicas), 2)
            self.assertEqual(r.replicas[0].client_id, "c1", "writer's client first")
            self.assertEqual({x.client_id for x in r.replicas}, {"c1", "c2"})
        self.assertGreater(started.write_deadline_ms, 0)
        g1, g2 = started.results[0].generation, started.results[1].generation
        self.assertNotEqual(g1, g2)

        pending = self.stub.GetReplicas(pb.GetReplicasRequest(client_id="c1", keys=[b"k1"]), timeout=5)
        self.assertEqual(pending.results[0].code, store_pb2.NOT_READY)
        self.assertEqual(self.exist([b"k1", b"k2"]), [False, False])

        ended = c1.put_end([(b"k1", g1, 111), (b"k2", g2, 222)])
        self.assertEqual([r.code for r in ended.results], [OK, OK])
        self.assertEqual(self.exist([b"k1", b"k2", b"nope"]), [True, True, False])

        got = self.stub.GetReplicas(
            pb.GetReplicasRequest(client_id="c2", keys=[b"k1", b"k2", b"nope"]), timeout=5)
        self.assertNotEqual(got.lease_id, 0)
        self.assertEqual(got.lease_ttl_ms, LEASE_TTL_MS)
        self.assertEqual([r.code for r in got.results], [OK, OK, store_pb2.NOT_FOUND])
        self.assertEqual((got.results[0].size, got.results[0].checksum, got.results[0].generation),
                         (1000, 111, g1))
        self.assertEqual(got.results[1].checksum, 222)
        _, m = self.metrics()
        self.assertEqual(m["mc_leases_active"], 2)

        removed = self.stub.Remove(pb.RemoveRequest(keys=[b"k1"]), timeout=5)
        self.assertEqual(removed.results[0].code, store_pb2.HAS_LEASE)
        rel = self.stub.ReleaseLeases(  # by c2, which holds the lease
            pb.ReleaseLeasesRequest(lease_id=got.lease_id, keys=[b"k1", b"k2"]), timeout=5,
            metadata=master_auth.session_metadata("c2", self.stub.tokens["c2"]))
        self.assertEqual(rel.released, 2)
        removed = self.stub.Remove(pb.RemoveRequest(keys=[b"k1", b"k2"]), timeout=5)
        self.assertEqual([r.code for r in removed.results], [OK, OK])
        self.assertEqual(self.exist([b"k1", b"k2"]), [False, False])
        status = self.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        self.assertEqual(status.mem_used, 0)
        self.assertEqual(status.keys, 0)

    def test_lease_expires_after_ttl(self):
        c1 = self.client("c1", [MiB])
        c1.put([(b"k", 100)])
        got = self.stub.GetReplicas(pb.GetReplicasRequest(client_id="c1", keys=[b"k"]), timeout=5)
        self.assertEqual(got.results[0].code, OK)
        self.assertEqual(self.stub.Remove(pb.RemoveRequest(keys=[b"k"]), timeout=5).results[0].code,
                         store_pb2.HAS_LEASE)
        harness.wait_until(lambda: self.metrics()[1].get("mc_leases_expired_total", 0) >= 1,
                           timeout_s=LEASE_TTL_MS / 1000 + 5, what="lease expiry")
        self.assertEqual(self.stub.Remove(pb.RemoveRequest(keys=[b"k"]), timeout=5).results[0].code,
                         OK)

    def test_lookup_carries_releases(self):
        c1 = self.client("c1", [MiB])
        c1.put([(b"r1", 100), (b"r2", 100), (b"r3", 100)])
        first = self.stub.GetReplicas(pb.GetReplicasRequest(client_id="c1", keys=[b"r1", b"r2"]),
                                      timeout=5)
        self.assertEqual(self.metrics()[1]["mc_leases_active"], 2)
        # The next lookup hands back the first one's leases: released before it looks up.
        second = self.stub.GetReplicas(pb.GetReplicasRequest(
            client_id="c1", keys=[b"r3"],
            releases=[pb.ReleaseLeasesRequest(lease_id=first.lease_id, keys=[b"r1", b"r2"])]),
            timeout=5)
        self.assertEqual(second.results[0].code, OK)
        _, m = self.metrics()
        self.assertEqual(m["mc_leases_active"], 1, "r3 leased, r1 and r2 released")
        self.assertEqual(m["mc_leases_released_total"], 2)
        removed = self.stub.Remove(pb.RemoveRequest(keys=[b"r1", b"r2", b"r3"]), timeout=5)
        self.assertEqual([r.code for r in removed.results], [OK, OK, store_pb2.HAS_LEASE])

    def test_prefix_lookup_stops_at_first_miss(self):
        c1 = self.client("c1", [MiB])
        c1.put([(b"a", 100), (b"c", 100)])
        got = self.stub.GetReplicas(pb.GetReplicasRequest(
            client_id="c1", keys=[b"a", b"b", b"c"], stop_at_first_miss=True), timeout=5)
        codes = [r.code for r in got.results]
        self.assertEqual(codes[0], OK)
        self.assertLessEqual(len(codes), 2)
        if len(codes) == 2:
            self.assertEqual(codes[1], store_pb2.NOT_FOUND)
        _, m = self.metrics()
        self.assertEqual(m["mc_leases_active"], 1, "only the matched prefix is leased")
        self.assertEqual(self.stub.Remove(pb.RemoveRequest(keys=[b"c"]), timeout=5).results[0].code,
                         OK)

    def test_prefix_count_only(self):
        c1 = self.client("c1", [MiB])
        keys = [b"cnt-%d" % i for i in range(300)]
        c1.put([(k, 64) for k in keys[:150] + keys[151:]])
        got = self.stub.GetReplicas(pb.GetReplicasRequest(
            client_id="c1", keys=keys, stop_at_first_miss=True, no_lease=True, count_only=True),
            timeout=5)
        self.assertEqual(got.matched, 150)
        self.assertEqual(len(got.results), 0, "count_only answers the count alone")
        self.assertEqual(got.lease_id, 0)
        full = self.stub.GetReplicas(pb.GetReplicasRequest(
            client_id="c1", keys=keys, stop_at_first_miss=True, no_lease=True), timeout=5)
        self.assertEqual(full.matched, 150)
        self.assertEqual(len(full.results), 151)
        with self.assertRaises(grpc.RpcError) as err:
            self.stub.GetReplicas(pb.GetReplicasRequest(client_id="c1", keys=keys,
                                                        count_only=True), timeout=5)
        self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_prefix_lookup_with_packed_keys_and_answer(self):
        c1 = self.client("c1", [MiB])
        keys = [b"pk-%d" % i for i in range(300)]
        c1.put([(k, 64 + i) for i, k in enumerate(keys) if i != 150])

        def packed(ks, **kw):
            return pb.GetReplicasRequest(client_id="c1", packed_keys=b"".join(ks),
                                         packed_key_sizes=[len(k) for k in ks],
                                         stop_at_first_miss=True, **kw)
        count = self.stub.GetReplicas(packed(keys, no_lease=True, count_only=True), timeout=5)
        self.assertEqual((count.matched, count.keys_seen), (150, 300))
        one_by_one = self.stub.GetReplicas(pb.GetReplicasRequest(
            client_id="c1", keys=keys, stop_at_first_miss=True, no_lease=True), timeout=5)
        cols = self.stub.GetReplicas(packed(keys, no_lease=True, packed=True), timeout=5)
        self.assertEqual(cols.matched, 150)
        self.assertEqual(len(cols.results), 0, "the rows come as columns")
        p = cols.packed
        self.assertEqual(len(p.codes), 151)
        self.assertEqual(list(p.codes), [r.code for r in one_by_one.results])
        self.assertEqual(list(p.sizes), [r.size for r in one_by_one.results])
        self.assertEqual(list(p.checksums), [r.checksum for r in one_by_one.results])
        self.assertEqual(list(p.generations), [r.generation for r in one_by_one.results])
        self.assertEqual(list(p.replica_counts), [len(r.replicas) for r in one_by_one.results])
        self.assertEqual(list(p.offsets), [r.replicas[0].offset for r in one_by_one.results[:150]])
        self.assertEqual(list(p.client_ids), ["c1"])
        self.assertEqual(set(p.owners), {0})
        self.assertEqual(p.messages[150], one_by_one.results[150].message)
        leased = self.stub.GetReplicas(packed(keys, packed=True), timeout=5)
        self.assertEqual(leased.matched, 150)
        _, m = self.metrics()
        self.assertEqual(m["mc_leases_active"], 150, "exactly the matched prefix is leased")
        self.stub.ReleaseLeases(pb.ReleaseLeasesRequest(lease_id=leased.lease_id, keys=keys[:150]),
                                timeout=5)
        bad = [pb.GetReplicasRequest(client_id="c1", keys=[b"x"], packed_keys=b"ab",
                                     packed_key_sizes=[2]),
               pb.GetReplicasRequest(client_id="c1", packed_keys=b"abc", packed_key_sizes=[2]),
               pb.GetReplicasRequest(client_id="c1", packed_keys=b"ab", packed_key_sizes=[2, 1])]
        for req in bad:
            with self.assertRaises(grpc.RpcError) as err:
                self.stub.GetReplicas(req, timeout=5)
            self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        over = [b"pk-over-%d" % i for i in range(MAX_BATCH + 1)]
        with self.assertRaises(grpc.RpcError) as err:
            self.stub.GetReplicas(packed(over), timeout=10)
        self.assertIn("exceeds the limit of %d" % MAX_BATCH, err.exception.details())

    def test_already_exists_and_bad_input_are_per_key(self):
        c1 = self.client("c1", [MiB])
        c1.put([(b"stored", 100)])
        res = c1.put_start([(b"", 10), (b"x" * 4097, 10), (b"zero", 0), (b"stored", 100),
                            (b"fresh", 100), (b"fresh", 100), (b"y" * 4096, 10)]).results
        self.assertEqual([r.code for r in res],
                         [store_pb2.INVALID_ARGUMENT, store_pb2.INVALID_ARGUMENT,
                          store_pb2.INVALID_ARGUMENT, store_pb2.ALREADY_EXISTS, OK,
                          store_pb2.ALREADY_EXISTS, OK])
        for r in res:
            if r.code != OK:
                self.assertTrue(r.message, "errors carry a message")
                self.assertEqual(len(r.replicas), 0)
        # A client the master does not know has no session: refused as a whole (mc-client takes
        # that as transient, a master restart before it re-registered, and registers again).
        with self.assertRaises(grpc.RpcError) as err:
            self.stub.PutStart(pb.PutStartRequest(
                client_id="ghost", items=[pb.PutStartItem(key=b"k", size=10)]), timeout=5)
        self.assertEqual(err.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        self.assertIn("register", err.exception.details())
        got = self.stub.GetReplicas(pb.GetReplicasRequest(
            client_id="c1", keys=[b"", b"x" * 4097, b"stored"]), timeout=5)
        self.assertEqual([r.code for r in got.results],
                         [store_pb2.INVALID_ARGUMENT, store_pb2.INVALID_ARGUMENT, OK])
        end = c1.put_end([(b"nope", 1, 1)])
        self.assertEqual(end.results[0].code, store_pb2.NOT_FOUND)
        status = self.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        self.assertEqual(status.keys, 3)  # stored, fresh, y*4096 (the last two pending)

    def test_eviction_under_pressure_every_put_succeeds(self):
        c1 = self.client("c1", [256 * 1024])
        c2 = self.client("c2", [256 * 1024])
        size = 4096
        n = 0
        deadline = time.monotonic() + 60
        for batch in range(100):  # 2000 puts of 4 KiB into 512 KiB: ~16x the capacity
            writer = c1 if batch % 2 == 0 else c2
            items = [(b"key-%06d" % (n + i), size) for i in range(20)]
            n += len(items)
            results = writer.put(items)
            bad = [(k, r.code, r.message) for (k, _), r in zip(items, results) if r.code != OK]
            self.assertEqual(bad, [])
            self.assertLess(time.monotonic(), deadline)
        body, m = self.metrics()
        attempts = m["mc_eviction_attempts_total"]
        successes = m["mc_eviction_successes_total"]
        failures = m["mc_eviction_failures_total"]
        self.assertGreater(attempts, 0)
        # A background pass may have started and not ended when /metrics was read: judge by the
        # passes that ended.
        self.assertLessEqual(failures, 0.01 * attempts, "%d/%d" % (failures, attempts))
        # Passes are serialized: at most one is in flight.
        self.assertGreaterEqual(successes + failures, attempts - 1, (successes, failures, attempts))
        self.assertGreater(m["mc_evicted_keys_total"], 1000)
        self.assertLessEqual(m["mc_memory_used_bytes"], m["mc_memory_capacity_bytes"])
        self.assertEqual(m.get("mc_put_no_space_total", 0), 0)
        self.assertTrue(self.exist([b"key-%06d" % (n - 1)])[0], "the newest key survives")
        _, line = harness.http_get(self.http, "/status")
        mm = re.search(r"Eviction: Success/Attempts=(\d+)/(\d+)", line)
        self.assertIsNotNone(mm, line)
        self.assertGreaterEqual(int(mm.group(1)), int(successes))

    def test_dead_client_loses_its_keys_other_client_keeps_its(self):
        c1 = self.client("c1", [MiB])
        c2 = self.client("c2", [MiB])
        k1 = [b"c1-%d" % i for i in range(20)]
        k2 = [b"c2-%d" % i for i in range(20)]
        for r in c1.put([(k, 1000) for k in k1]):
            self.assertEqual(r.replicas[0].client_id, "c1")
        for r in c2.put([(k, 1000) for k in k2]):
            self.assertEqual(r.replicas[0].client_id, "c2")
        pending = c1.put_start([(b"c1-pending", 1000)], replicas=2).results[0]
        self.assertEqual(pending.code, OK)
        c1.stop_heartbeating()
        harness.wait_until(lambda: not any(self.exist(k1)), timeout_s=CLIENT_TTL_MS / 1000 + 10,
                           what="c1's keys to go")
        self.assertEqual(self.exist(k2), [True] * 20)
        self.assertFalse(c1.heartbeat(), "an expired session is unknown")
        status = self.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        self.assertEqual([c.client_id for c in status.clients], ["c2"])
        self.assertEqual(status.mem_capacity, MiB)
        self.assertEqual(status.keys, 20)
        # 20 objects of 1000 bytes rounded to 1024; the dead writer's pending replica on c2 is freed.
        self.assertEqual(status.mem_used, 20 * 1024)
        _, m = self.metrics()
        self.assertEqual(m["mc_clients_alive"], 1)
        self.assertEqual(m["mc_clients_expired_total"], 1)

    def test_metrics_status_healthz(self):
        c1 = self.client("c1", [MiB])
        self.client("c2", [2 * MiB])
        c1.put([(b"a", 1000), (b"b", 1000)])
        status, body = harness.http_get(self.http, "/healthz")
        self.assertEqual(status, 200)
        self.assertEqual(body.strip(), "ok")
        body, m = self.metrics()
        for name in ["mc_memory_used_bytes", "mc_memory_capacity_bytes", "mc_keys",
                     "mc_clients_alive", "mc_eviction_attempts_total", "mc_eviction_successes_total",
                     "mc_eviction_failures_total", "mc_leases_active", "mc_master_rpc_requests_total",
                     "mc_master_rpc_latency_seconds_count"]:
            self.assertIn(name, m, "missing %s in /metrics" % name)
        self.assertIn("# TYPE mc_eviction_attempts_total counter", body)
        self.assertIn("# TYPE mc_keys gauge", body)
        self.assertEqual(m["mc_keys"], 2)
        self.assertEqual(m["mc_clients_alive"], 2)
        self.assertEqual(m["mc_memory_capacity_bytes"], 3 * MiB)
        self.assertEqual(m["mc_memory_used_bytes"], 2 * 1024)
        self.assertGreaterEqual(
            m[("mc_master_rpc_requests_total", frozenset({("rpc", "PutStart")}))], 1)
        status, line = harness.http_get(self.http, "/status")
        self.assertEqual(status, 200)
        pattern = (r"^Mem Storage: [\d.]+ [KMGT]?B / [\d.]+ [KMGT]?B \([\d.]+%\) \| Keys: (\d+) \| "
                   r"Clients: (\d+) \| Eviction: Success/Attempts=(\d+)/(\d+) \| "
                   r"SSD Storage: [\d.]+ [KMGT]?B / [\d.]+ [KMGT]?B \| "
                   r"Lost: 0 \(evicted unpersisted 0, SSD reclaimed 0\) \| Epoch: [0-9a-f]{8}$")
        mm = re.match(pattern, line.strip())
        self.assertIsNotNone(mm, line)
        self.assertEqual(mm.group(1), "2")
        self.assertEqual(mm.group(2), "2")
        grpc_status = self.stub.GetStatus(pb.GetStatusRequest(), timeout=5)
        self.assertEqual(grpc_status.status_line.strip(), line.strip())
        status, _ = harness.http_get(self.http, "/no-such-page")
        self.assertEqual(status, 404)

    def test_registration_reports_ssd_usage_at_once(self):
        resp = self.stub.RegisterClient(pb.RegisterClientRequest(
            client_id="ssd1", host="h", data_endpoint="127.0.0.1:1",
            segments=[pb.SegmentSpec(local_index=0, size=MiB)],
            disk_capacity=64 * MiB, disk_used=3 * MiB), timeout=5)
        self.assertNotEqual(resp.session, 0)
        _, m = self.metrics()
        self.assertEqual(m["mc_ssd_used_bytes"], 3 * MiB, "known before any heartbeat")
        self.assertEqual(m["mc_ssd_capacity_bytes"], 64 * MiB)

    def test_batches_over_the_limit_fail_whole_and_are_counted(self):
        c1 = self.client("c1", [MiB])
        c1.put([(b"lim", 100)])
        keys = [b"lim-%d" % i for i in range(MAX_BATCH + 1)]
        calls = [
            ("Exist", lambda: self.stub.Exist(pb.ExistRequest(keys=keys), timeout=10)),
            ("GetReplicas", lambda: self.stub.GetReplicas(
                pb.GetReplicasRequest(client_id="c1", keys=keys), timeout=10)),
            ("PutStart", lambda: self.stub.PutStart(pb.PutStartRequest(
                client_id="c1", items=[pb.PutStartItem(key=k, size=1) for k in keys]),
                timeout=10)),
        ]
        for rpc, call in calls:
            with self.assertRaises(grpc.RpcError) as err:
                call()
            self.assertEqual(err.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, rpc)
            self.assertIn("exceeds the limit of %d" % MAX_BATCH, err.exception.details())
        _, m = self.metrics()
        for rpc, _ in calls:
            self.assertEqual(m[("mc_master_rpc_failures_total", frozenset({("rpc", rpc)}))], 1, rpc)
        self.assertEqual(m["mc_leases_active"], 0)
        self.assertEqual(self.exist(keys[:MAX_BATCH]), [False] * MAX_BATCH)
        self.assertEqual(self.exist([b"lim"]), [True])

    def test_malformed_message_is_an_rpc_error_and_master_survives(self):
        self.client("c1", [MiB])
        md = master_auth.session_metadata("c1", self.stub.tokens["c1"])
        for method in ["/mcstore.v1.Master/PutStart", "/mcstore.v1.Master/GetReplicas",
                       "/mcstore.v1.Master/RegisterClient"]:
            raw = self.channel.unary_unary(method, request_serializer=None,
                                           response_deserializer=None)
            for garbage in [b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", b"\x0a\xff\xff\xff\x0f",
                            os.urandom(64)]:
                try:
                    raw(garbage, metadata=md, timeout=5)
                except grpc.RpcError as e:
                    self.assertNotEqual(e.code(), grpc.StatusCode.OK)
                # Random bytes may happen to parse; either way the master must keep serving.
        unknown = self.channel.unary_unary("/mcstore.v1.Master/NoSuchMethod",
                                           request_serializer=None, response_deserializer=None)
        with self.assertRaises(grpc.RpcError) as ctx:
            unknown(b"", timeout=5)
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
        # A truncated length-delimited field cannot parse: that one must fail.
        raw = self.channel.unary_unary("/mcstore.v1.Master/PutStart", request_serializer=None,
                                       response_deserializer=None)
        with self.assertRaises(grpc.RpcError) as ctx:
            raw(b"\x12\x7f\x0a", metadata=md, timeout=5)
        self.assertNotEqual(ctx.exception.code(), grpc.StatusCode.OK)
        self.assertTrue(self.master.alive())
        self.assertEqual(self.stub.GetStatus(pb.GetStatusRequest(), timeout=5).keys, 0)
        self.assertEqual(harness.http_get(self.http, "/healthz")[0], 200)

    def test_reregistration_drops_old_session_state(self):
        c1 = self.client("c1", [MiB])
        c1.put([(b"old", 1000)])
        again = self.stub.RegisterClient(pb.RegisterClientRequest(
            client_id="c1", host="h", data_endpoint="127.0.0.1:1",
            segments=[pb.SegmentSpec(size=2 * MiB)]), timeout=5)
        self.assertNotEqual(again.session, c1.session)
        self.assertFalse(c1.heartbeat())
        self.assertEqual(self.exist([b"old"]), [False])
        c1.session = again.session  # let the heartbeat thread keep the new session alive
        self.assertTrue(c1.heartbeat())
        self.assertEqual(self.stub.GetStatus(pb.GetStatusRequest(), timeout=5).mem_capacity, 2 * MiB)


class AuthTest(MasterFixture):
    """Issue 14: every master RPC is bound to its authenticated caller. Each case is an attack
    that worked with just a socket before authentication; each must now be refused, counted and
    change nothing."""

    def auth_failures(self, reason):
        _, m = self.metrics()
        return m.get(("mc_master_auth_failures_total", frozenset({("reason", reason)})), 0)

    def reg_request(self, cid="intruder", endpoint="127.0.0.1:9"):
        return pb.RegisterClientRequest(client_id=cid, host="h", data_endpoint=endpoint,
                                        segments=[pb.SegmentSpec(size=MiB)])

    def assert_refused(self, call, code):
        with self.assertRaises(grpc.RpcError) as err:
            call()
        self.assertEqual(err.exception.code(), code, err.exception.details())
        return err.exception.details()

    def clients_known(self):
        return sorted(c.client_id for c in self.stub.GetStatus(pb.GetStatusRequest(),
                                                               timeout=5).clients)

    def test_registration_needs_a_fresh_valid_proof(self):
        req = self.reg_request()
        key = self.keys.key
        wrong_key = master_auth.master_rpc_key("not-the-cluster-secret-" + "x" * 32)
        now = int(time.time() * 1000)
        good = master_auth.proof(key, "register", "intruder", "127.0.0.1:9")
        f = good.split(" ")
        bad = {
            "missing": [],
            "bad_mac": [("x-mc-auth", master_auth.proof(wrong_key, "register", "intruder",
                                                        "127.0.0.1:9"))],
            "stale": [("x-mc-auth", master_auth.proof(key, "register", "intruder", "127.0.0.1:9",
                                                      unix_ms=now - 10 * 60 * 1000))],
            "wrong_client": [("x-mc-auth", master_auth.proof(key, "register", "someone-else",
                                                             "127.0.0.1:9"))],
            "malformed": [("x-mc-auth", "v1 register intruder")],
        }
        malformed = [" ".join(f[:5]), " ".join(f + ["extra"]), " ".join(f[:4] + ["zz" * 16, f[5]]),
                     " ".join(f[:5] + [f[5][:-2]]), " ".join(f[:3] + ["-5"] + f[4:]),
                     "v2 " + " ".join(f[1:]), " ".join(f[:1] + ["root"] + f[2:]), "x" * 4000]
        for reason, md in bad.items():
            before = self.auth_failures(reason)
            code = (grpc.StatusCode.PERMISSION_DENIED if reason == "wrong_client"
                    else grpc.StatusCode.UNAUTHENTICATED)
            self.assert_refused(lambda: self.raw.RegisterClient(req, metadata=md, timeout=5), code)
            self.assertEqual(self.auth_failures(reason), before + 1, reason)
        for value in malformed:
            self.assert_refused(lambda: self.raw.RegisterClient(
                req, metadata=[("x-mc-auth", value)], timeout=5), grpc.StatusCode.UNAUTHENTICATED)
        # The proof binds the data endpoint: a captured proof cannot redirect puts elsewhere.
        moved = self.reg_request(endpoint="127.0.0.1:6666")
        self.assert_refused(lambda: self.raw.RegisterClient(
            moved, metadata=[("x-mc-auth", good)], timeout=5), grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self.clients_known(), [], "no refused registration took effect")
        ok = self.raw.RegisterClient(req, metadata=[("x-mc-auth", good)], timeout=5)
        self.assertEqual(len(ok.session_token), 16)
        # Replayed: the same proof a second time (even after the first succeeded) is refused.
        before = self.auth_failures("replay")
        self.assert_refused(lambda: self.raw.RegisterClient(
            req, metadata=[("x-mc-auth", good)], timeout=5), grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self.auth_failures("replay"), before + 1)
        _, m = self.metrics()
        self.assertEqual(m["mc_clients_alive"], 1)

    def test_every_client_call_needs_a_live_session(self):
        c1 = self.client("c1", [MiB])
        c1.put([(b"k", 100)])
        forged = master_auth.session_metadata("c1", os.urandom(16))
        calls = {
            "PutStart": pb.PutStartRequest(client_id="c1", items=[pb.PutStartItem(key=b"x",
                                                                                  size=10)]),
            "GetReplicas": pb.GetReplicasRequest(client_id="c1", keys=[b"k"]),
            "Exist": pb.ExistRequest(keys=[b"k"]),
            "Remove": pb.RemoveRequest(keys=[b"k"]),
            "UnregisterClient": pb.UnregisterClientRequest(client_id="c1", session=c1.session),
            "GetStatus": pb.GetStatusRequest(),
        }
        for name, req in calls.items():
            for md in ([], forged, [("x-mc-session", "c1 nothex")], [("x-mc-session", "c1")],
                       [("x-mc-session", "c1 " + "ab" * 400)]):
                self.assert_refused(lambda: getattr(self.raw, name)(req, metadata=md, timeout=5),
                                    grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self.exist([b"k"]), [True])
        self.assertTrue(c1.heartbeat())
        self.assertGreater(self.auth_failures("unknown_session"), 0)
        self.assertGreater(self.auth_failures("malformed"), 0)
        self.assertGreater(self.auth_failures("missing"), 0)

    def test_no_takeover_of_a_live_client_id(self):
        c1 = self.client("c1", [MiB])
        c1.put([(b"mine", 100)])
        # Without the secret: refused outright. With it (a second daemon configured with the same
        # id, or a member trying): refused while c1 heartbeats; its keys stay, its puts stay its.
        self.assert_refused(lambda: self.raw.RegisterClient(
            self.reg_request("c1"), timeout=5), grpc.StatusCode.UNAUTHENTICATED)
        req = self.reg_request("c1")
        details = self.assert_refused(lambda: self.raw.RegisterClient(
            req, metadata=self.keys.register_metadata(req), timeout=5),
            grpc.StatusCode.UNAVAILABLE)
        self.assertIn("live session", details)
        _, m = self.metrics()
        self.assertEqual(m["mc_master_registrations_refused_total"], 1)
        self.assertTrue(c1.heartbeat())
        self.assertEqual(self.exist([b"mine"]), [True])
        started = c1.put_start([(b"next", 100)]).results[0]
        self.assertEqual(started.replicas[0].data_endpoint, "127.0.0.1:%d" % (10000 + 2))
        # A restarted daemon (no token) gets the id once the old session is silent long enough.
        c1.stop_heartbeating()
        time.sleep(TAKEOVER_MS / 1000 + 0.3)
        new = self.raw.RegisterClient(req, metadata=self.keys.register_metadata(req), timeout=5)
        self.assertNotEqual(new.session, c1.session)
        self.assertFalse(c1.heartbeat(), "the old session is gone")

    def test_calls_in_another_clients_name_are_refused(self):
        c1 = self.client("c1", [MiB])
        c2 = self.client("c2", [MiB])
        c1.put([(b"k1", 100)])
        as_c2 = master_auth.session_metadata("c2", c2.token)
        disk = [pb.DiskReplicaItem(key=b"k1", generation=1, locator=0, length=100, checksum=1)]
        calls = {
            "UnregisterClient": pb.UnregisterClientRequest(client_id="c1", session=c1.session),
            "Heartbeat": pb.HeartbeatRequest(client_id="c1", session=c1.session),
            "TakeOffloadTasks": pb.TakeOffloadTasksRequest(client_id="c1", session=c1.session),
            "RemoveDiskReplicas": pb.RemoveDiskReplicasRequest(client_id="c1", items=disk,
                                                               corrupt=True),
            "AddDiskReplicas": pb.AddDiskReplicasRequest(client_id="c1", items=disk,
                                                         recovered=True),
            "PutStart": pb.PutStartRequest(client_id="c1", items=[pb.PutStartItem(key=b"x",
                                                                                  size=10)]),
            "PutEnd": pb.PutEndRequest(client_id="c1", items=[pb.PutEndItem(key=b"k1")]),
            "PromoteEnd": pb.PromoteEndRequest(client_id="c1", items=[pb.PromoteItem(key=b"k1")]),
            "GetReplicas": pb.GetReplicasRequest(client_id="c1", keys=[b"k1"]),
        }
        before = self.auth_failures("wrong_client")
        for name, req in calls.items():
            self.assert_refused(lambda: getattr(self.raw, name)(req, metadata=as_c2, timeout=5),
                                grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(self.auth_failures("wrong_client"), before + len(calls))
        self.assertTrue(c1.heartbeat())
        self.assertEqual(self.clients_known(), ["c1", "c2"])
        self.assertEqual(self.exist([b"k1", b"x"]), [True, False])

    def test_leases_are_random_and_only_their_owner_releases_them(self):
        c1 = self.client("c1", [MiB])
        c2 = self.client("c2", [MiB])
        c1.put([(b"a", 100), (b"b", 100)])
        l1 = c1.stub.GetReplicas(pb.GetReplicasRequest(client_id="c1", keys=[b"a", b"b"]),
                                 timeout=5)
        l2 = c1.stub.GetReplicas(pb.GetReplicasRequest(client_id="c1", keys=[b"a"]), timeout=5)
        self.assertGreater(abs(l2.lease_id - l1.lease_id), 1 << 20, "lease ids are not sequential")
        self.assertGreater(abs(c2.session - c1.session), 1 << 20, "sessions are not sequential")
        self.assertEqual(self.metrics()[1]["mc_leases_active"], 3)
        # c2 releases c1's leases, alone and piggy-backed on a lookup: nothing is released.
        as_c2 = master_auth.session_metadata("c2", c2.token)
        rel = self.raw.ReleaseLeases(pb.ReleaseLeasesRequest(lease_id=l1.lease_id,
                                                             keys=[b"a", b"b"]),
                                     metadata=as_c2, timeout=5)
        self.assertEqual(rel.released, 0)
        c2.stub.GetReplicas(pb.GetReplicasRequest(
            client_id="c2", keys=[b"zz"], no_lease=True,
            releases=[pb.ReleaseLeasesRequest(lease_id=l2.lease_id, keys=[b"a"])]), timeout=5)
        _, m = self.metrics()
        self.assertEqual(m["mc_leases_active"], 3)
        self.assertEqual(m["mc_master_lease_releases_refused_total"], 3)
        self.assertEqual(self.stub.Remove(pb.RemoveRequest(keys=[b"b"]), timeout=5).results[0].code,
                         store_pb2.HAS_LEASE)
        rel = self.raw.ReleaseLeases(pb.ReleaseLeasesRequest(lease_id=l1.lease_id,
                                                             keys=[b"a", b"b"]),
                                     metadata=master_auth.session_metadata("c1", c1.token),
                                     timeout=5)
        self.assertEqual(rel.released, 2)

    def test_another_writers_pending_put_is_not_found(self):
        c1 = self.client("c1", [MiB])
        c2 = self.client("c2", [MiB])
        started = c1.put_start([(b"p", 100)]).results[0]
        gen = started.generation
        for name, req in [
                ("PutEnd", pb.PutEndRequest(client_id="c2", items=[
                    pb.PutEndItem(key=b"p", generation=gen, checksum=5)])),
                ("PutEnd", pb.PutEndRequest(client_id="c2", items=[
                    pb.PutEndItem(key=b"p", generation=gen + 1, checksum=5)])),
                ("PutRevoke", pb.PutRevokeRequest(client_id="c2", items=[
                    pb.PutRevokeItem(key=b"p", generation=gen)]))]:
            r = getattr(c2.stub, name)(req, timeout=5).results[0]
            self.assertEqual(r.code, store_pb2.NOT_FOUND, (name, r))
            self.assertNotIn(str(gen), r.message, "the text leaks no generation")
        ended = c1.put_end([(b"p", gen, 77)])
        self.assertEqual(ended.results[0].code, OK)
        got = c1.stub.GetReplicas(pb.GetReplicasRequest(client_id="c1", keys=[b"p"], no_lease=True),
                                  timeout=5)
        self.assertEqual(got.results[0].checksum, 77)

    def test_recovered_disk_report_cannot_replace_a_known_object(self):
        resp = self.stub.RegisterClient(pb.RegisterClientRequest(
            client_id="d1", host="h", data_endpoint="127.0.0.1:2",
            segments=[pb.SegmentSpec(size=MiB)], disk_capacity=64 * MiB), timeout=5)
        self.assertTrue(resp.session_token)
        c1 = self.client("c1", [MiB])
        c1.put([(b"known", 100)])
        got = c1.stub.GetReplicas(pb.GetReplicasRequest(client_id="c1", keys=[b"known"],
                                                        no_lease=True), timeout=5).results[0]
        forged = [pb.DiskReplicaItem(key=b"known", generation=got.generation, locator=0,
                                     length=100, checksum=got.checksum + 1),
                  pb.DiskReplicaItem(key=b"known", generation=got.generation + 5, locator=0,
                                     length=100, checksum=9)]
        res = self.stub.AddDiskReplicas(pb.AddDiskReplicasRequest(
            client_id="d1", items=forged, recovered=True), timeout=5).results
        self.assertEqual([r.code for r in res], [store_pb2.INVALID_ARGUMENT, store_pb2.NOT_FOUND])
        after = c1.stub.GetReplicas(pb.GetReplicasRequest(client_id="c1", keys=[b"known"],
                                                          no_lease=True), timeout=5).results[0]
        self.assertEqual((after.generation, after.checksum), (got.generation, got.checksum))
        self.assertEqual([r.tier for r in after.replicas], [pb.MEMORY])
        _, m = self.metrics()
        self.assertEqual(m["mc_master_disk_reports_refused_total"], 2)
        # In another client's name (d1 holds the records, c1 asks): refused as a whole.
        self.assert_refused(lambda: self.raw.AddDiskReplicas(pb.AddDiskReplicasRequest(
            client_id="d1", items=[pb.DiskReplicaItem(key=b"new", generation=3, length=10,
                                                      checksum=1)], recovered=True),
            metadata=master_auth.session_metadata("c1", c1.token), timeout=5),
            grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(self.exist([b"new"]), [False])

    def test_admin_proof_reads_status_only(self):
        self.client("c1", [MiB])
        md = self.keys.admin_metadata()
        self.assertEqual(len(self.raw.GetStatus(pb.GetStatusRequest(), metadata=md,
                                                timeout=5).clients), 1)
        # An admin proof is not a session: no other call takes it, and it is good once.
        self.assert_refused(lambda: self.raw.Exist(pb.ExistRequest(keys=[b"k"]), metadata=md,
                                                   timeout=5), grpc.StatusCode.UNAUTHENTICATED)
        self.assert_refused(lambda: self.raw.GetStatus(pb.GetStatusRequest(), metadata=md,
                                                       timeout=5), grpc.StatusCode.UNAUTHENTICATED)
        reg_proof = [("x-mc-auth", master_auth.proof(self.keys.key, "register", "c1", ""))]
        self.assert_refused(lambda: self.raw.GetStatus(pb.GetStatusRequest(), metadata=reg_proof,
                                                       timeout=5),
                            grpc.StatusCode.PERMISSION_DENIED)


if __name__ == "__main__":
    unittest.main()
