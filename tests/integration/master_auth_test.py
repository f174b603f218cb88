"""Attacks on the real mc-master, made with just a socket (master_fixture.py): no,
forged, stale or replayed proofs, and calls in another client's name. Each must be refused,
counted and change nothing."""

import os
import time
import unittest

import grpc

import master_auth
from master_fixture import (MiB, OK, TAKEOVER_MS, MasterFixture)
from mcstore.v1 import master_pb2 as pb
from mcstore.v1 import store_pb2


class AuthTest(MasterFixture):
    """Every master RPC is bound to its authenticated caller. Each case is an attack
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
        run = master_auth.run_id(self.raw)
        good = master_auth.proof(key, "register", "intruder", "127.0.0.1:9", run=run)
        f = good.split(" ")  # v2 role id time nonce run mac
        bad = {
            "missing": [],
            "bad_mac": [("x-mc-auth", master_auth.proof(wrong_key, "register", "intruder",
                                                        "127.0.0.1:9", run=run))],
            "stale": [("x-mc-auth", master_auth.proof(key, "register", "intruder", "127.0.0.1:9",
                                                      unix_ms=now - 10 * 60 * 1000, run=run))],
            "wrong_client": [("x-mc-auth", master_auth.proof(key, "register", "someone-else",
                                                             "127.0.0.1:9", run=run))],
            "malformed": [("x-mc-auth", "v2 register intruder")],
            # A proof made for another master run (captured before a restart).
            "other_run": [("x-mc-auth", master_auth.proof(key, "register", "intruder",
                                                          "127.0.0.1:9", run=os.urandom(16)))],
        }
        malformed = [" ".join(f[:6]), " ".join(f + ["extra"]), " ".join(f[:4] + ["zz" * 16] + f[5:]),
                     " ".join(f[:6] + [f[6][:-2]]), " ".join(f[:3] + ["-5"] + f[4:]),
                     " ".join(f[:5] + ["zz" * 16, f[6]]), "v3 " + " ".join(f[1:]),
                     "v1 " + " ".join(f[1:5] + f[6:]), " ".join(f[:1] + ["root"] + f[2:]),
                     "x" * 4000]
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

    def test_a_proof_captured_before_a_restart_is_refused_after_it(self):
        """The replay cache lives in memory, so a registration proof captured
        on the wire registered again once the master had restarted. A proof names the master
        run it was made for; after a restart it is refused as other_run."""
        req = self.reg_request("victim")
        captured = self.keys.register_metadata(req)
        self.assertEqual(len(self.raw.RegisterClient(req, metadata=captured,
                                                     timeout=5).session_token), 16)
        run_before = master_auth.run_id(self.raw)
        self.restart_master()
        self.assertNotEqual(master_auth.run_id(self.raw), run_before, "each run draws its own id")
        before = self.auth_failures("other_run")
        self.assert_refused(lambda: self.raw.RegisterClient(req, metadata=captured, timeout=5),
                            grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self.auth_failures("other_run"), before + 1)
        self.assertEqual(self.clients_known(), [], "the replay registered nobody")
        # The daemon itself proves again for this run and gets in.
        ok = self.raw.RegisterClient(req, metadata=self.keys.register_metadata(req), timeout=5)
        self.assertEqual(len(ok.session_token), 16)
        self.assertEqual(self.clients_known(), ["victim"])

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
        # The takeover window runs on the master's clock and nothing signals its end: wait it out.
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
        reg_proof = [("x-mc-auth", master_auth.proof(self.keys.key, "register", "c1", "",
                                                     run=master_auth.run_id(self.raw)))]
        self.assert_refused(lambda: self.raw.GetStatus(pb.GetStatusRequest(), metadata=reg_proof,
                                                       timeout=5),
                            grpc.StatusCode.PERMISSION_DENIED)


if __name__ == "__main__":
    unittest.main()
