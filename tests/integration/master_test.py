"""Integration tests of the real mc-master binary, driven over gRPC as two mc-clients would be
(master_fixture.py). Every wait is bounded. The attacks on its authentication are in
master_auth_test.py."""

import os
import re
import time
import unittest

import grpc

import harness
import master_auth
from master_fixture import (MiB, OK, CLIENT_TTL_MS, LEASE_TTL_MS, MAX_BATCH, MasterFixture)
from mcstore.v1 import master_pb2 as pb
from mcstore.v1 import store_pb2


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


if __name__ == "__main__":
    unittest.main()
