"""A real vLLM engine (CPU build) through faults of the store, and prefill/decode disaggregation
through it. One engine process runs phases with pauses in between, during which the
test breaks the store:

  cold, warm   saves every prompt block; warm is the reference (vLLM's local prefix cache)
  each#2       one stored block was made corrupt (a member recorded other bytes than the
               checksum): the load fails its checksum, the replica is dropped, vLLM recomputes
               it and the connector saves it again; the block is not retried without bound
  each#3       the engine's own mc-client was SIGKILLed and restarted (its memory is gone): the
               connector notices the lost session, registers its KV cache again, saves anew
  each#4       hits again
  each#5       the master was SIGKILLed and restarted: the objects come back from the daemon's
               report; hits again

Every phase's outputs equal the reference; no lease outlives a phase; no release is refused.
Then a prefill engine (kv_role kv_producer) on one daemon and a decode engine (kv_consumer) on
another: the decode engine loads every loadable block and its outputs equal a single engine's.
"""

import os
import threading

import grpc
import pytest

from test_vllm_e2e import (BS, NAMES, PROMPTS, address, env, loadable_blocks,  # noqa: F401
                           models, prompts_file, run_engine, workdir)

PAUSED_PHASES = "cold,warm,each,each,each,each"


@pytest.fixture(scope="module")
def cluster(env, workdir):  # noqa: F811
    from client_cluster import Cluster
    # Info logs: a failed check prints the daemons' story of the faults.
    c = Cluster(clients=2, segment_size=256 << 20, master_args=["--log_level", "info"],
                client_args=["--log_level", "info"])
    c.start()
    yield c
    c.stop()


def leases_back_to_zero(cluster, timeout_s=20):
    """Waits until no prefix lease is held on any daemon and no read lease at the master."""
    from integration import harness
    from client_cluster import metric

    def zero():
        return (all(metric(cluster.http(i), "mc_client_prefix_leases") == 0
                    for i in range(len(cluster.clients)))
                and metric(cluster.master_http(), "mc_leases_active") == 0)
    harness.wait_until(zero, timeout_s, interval_s=0.1, what="every lease released")


class Member:
    """The test as a cluster member (it holds the cluster secret): it may look keys up at the
    master and write through the authenticated data plane, as a lying writer could."""

    def __init__(self, cluster):
        from integration import harness, master_auth
        from mcstore.v1 import master_pb2_grpc
        self.cluster = cluster
        self.master = master_pb2_grpc.MasterStub(
            grpc.insecure_channel(cluster.master.ready["grpc"]))
        self.md = master_auth.observer_session(self.master,
                                               master_auth.Keys(harness.cluster_secret_file()))

    def lookup(self, key):
        from mcstore.v1 import master_pb2 as mpb
        return self.master.GetReplicas(mpb.GetReplicasRequest(keys=[key], no_lease=True),
                                       metadata=self.md, timeout=10).results[0]

    def corrupt(self, key):
        """Replaces `key` by an object with the same recorded checksum and other bytes."""
        from client_cluster import get_inline, put_inline  # noqa: F401
        from data_plane import OK_CODE, WRITE, data_plane_key, frame, handshake, read_response
        from mcstore.v1 import master_pb2 as mpb
        from mcstore.v1 import store_pb2 as spb
        import socket
        stub = self.cluster.stub(0)
        good = stub.BatchGet(spb.BatchGetRequest(items=[spb.GetItem(key=key)]),
                             timeout=30).results[0]
        assert good.code == spb.OK, good.message
        checksum = self.lookup(key).checksum
        res = stub.BatchRemove(spb.BatchRemoveRequest(keys=[key]), timeout=30).results[0]
        assert res.code == spb.OK, res.message
        placed = self.master.PutStart(mpb.PutStartRequest(
            items=[mpb.PutStartItem(key=key, size=len(good.data))], replicas=1),
            metadata=self.md, timeout=10).results[0]
        assert placed.code == spb.OK, placed.message
        endpoints = {d.ready["client_id"]: d.ready["data"] for d in self.cluster.clients}
        bad = bytes(b ^ 0x5A for b in good.data)
        for rep in placed.replicas:
            host, port = endpoints[rep.client_id].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                handshake(sock, data_plane_key())
                sock.sendall(frame(WRITE, 1, rep.segment_id, rep.offset, len(bad),
                                   rep.capability, bad))
                assert read_response(sock)["code"] == OK_CODE
        end = self.master.PutEnd(mpb.PutEndRequest(items=[mpb.PutEndItem(
            key=key, generation=placed.generation, checksum=checksum)]), metadata=self.md,
            timeout=10).results[0]
        assert end.code == spb.OK, end.message
        return good.data


def test_an_engine_rides_through_a_corrupt_block_and_restarts(env, workdir, models, cluster,
                                                              prompts_file):
    pause_dir = os.path.join(workdir, "pauses")
    os.makedirs(pause_dir)
    events = {}
    result = {}

    def run():
        try:
            result["res"] = run_engine(env, workdir, "faults", models["a"], address(cluster),
                                       prompts_file, PAUSED_PHASES, "--pause-dir", pause_dir)
        except BaseException as e:  # surfaced below
            result["error"] = e

    engine = threading.Thread(target=run, daemon=True)
    engine.start()
    from integration import harness

    def at(n, action):
        harness.wait_until(lambda: os.path.exists(os.path.join(pause_dir, "ready-%d" % n))
                           or not engine.is_alive(), 600, interval_s=0.1,
                           what="the engine idle before phase %d" % n)
        assert engine.is_alive(), result.get("error")
        leases_back_to_zero(cluster)
        import time
        print("at %d: action at %.3f" % (n, time.time()))
        events[n] = action() if action else None
        print("at %d: go at %.3f" % (n, time.time()))
        open(os.path.join(pause_dir, "go-%d" % n), "w").close()

    victim = {}

    def corrupt_a_block():
        member = Member(cluster)
        key = victim["key"] = saved_key(member, pause_dir)
        victim["bytes"] = member.corrupt(key)

    def registrations(i):
        from client_cluster import metric
        return metric(cluster.http(i), "mc_client_registrations")

    def store_serves(before):
        """Waits until every daemon registered again since `before` (its registration counts)
        and a put through each succeeds. The engine's connector itself must notice what changed
        under it."""
        from mcstore.v1 import store_pb2 as spb
        import uuid

        def put_ok(i):
            item = spb.PutItem(key=b"probe-" + uuid.uuid4().hex.encode(), data=b"x")
            try:
                res = cluster.stub(i).BatchPut(spb.BatchPutRequest(items=[item]), timeout=5)
            except grpc.RpcError:
                return False
            return res.results[0].code == spb.OK
        harness.wait_until(lambda: all(registrations(i) > n for i, n in enumerate(before))
                           and put_ok(0) and put_ok(1), 60, interval_s=0.05,
                           what="both daemons registered again and serving puts")

    def restart_client():
        cluster.clients[0].kill()
        cluster.clients[0].start()
        # The master lets the restarted id take over once the old session has missed heartbeats
        # for --client_takeover_after_ms (the new process counts from 0).
        store_serves([0, registrations(1) - 1])

    def restart_master():
        before = [registrations(i) for i in range(len(cluster.clients))]
        cluster.restart_master()
        store_serves(before)

    at(1, None)
    at(2, corrupt_a_block)
    at(3, restart_client)
    at(4, restart_master)
    at(5, None)
    engine.join(timeout=900)
    assert not engine.is_alive()
    assert "error" not in result, result.get("error")
    leases_back_to_zero(cluster)
    try:
        check_fault_phases(cluster, result["res"]["phases"], victim)
    except AssertionError:
        cluster.dump_logs()
        raise


def check_fault_phases(cluster, ph, victim):
    ref = ph["warm#1"]["outputs"]
    for name in ("each#2", "each#3", "each#4", "each#5"):
        assert ph[name]["outputs"] == ref, name
        assert ph[name]["worker"].get("lease_release_failures", 0) == 0, name
        # Lookups stay bounded by the requests, never by the failures.
        assert ph[name]["sched"].get("lookups", 0) <= 2 * len(NAMES), (name, ph[name]["sched"])
    # The corrupt block failed once (one request looked it up), was recomputed and saved again.
    w2 = ph["each#2"]["worker"]
    assert w2.get("load_error_blocks", 0) >= 1
    from mcstore.v1 import store_pb2 as spb
    again = cluster.stub(0).BatchGet(spb.BatchGetRequest(items=[spb.GetItem(key=victim["key"])]),
                                     timeout=30).results[0]
    # Before self-repair the bad replica stayed, matched every lookup, failed every load, and
    # the recomputed block was refused ALREADY_EXISTS. Now it was dropped and stored again.
    assert again.code == spb.OK and again.data == victim["bytes"], again.message
    # The restarted daemon: the worker registered its KV cache again and went on.
    w3 = ph["each#3"]["worker"]
    assert w3.get("reregistrations", 0) >= 1, w3
    assert w3.get("save_blocks", 0) > 0
    assert ph["each#4"]["worker"].get("load_blocks", 0) > 0, "hits again after the restart"
    assert ph["each#4"]["worker"].get("load_error_blocks", 0) == 0
    assert ph["each#5"]["worker"].get("load_blocks", 0) > 0, "hits again after the master's"


def saved_key(member, pause_dir):
    """The key of the third block of "long" (a block no other prompt shares), which the engine
    saved in its cold phase (its state file before phase 2 says so)."""
    import json
    with open(os.path.join(pause_dir, "state-2.json")) as f:
        state = json.load(f)
    saved = state["phases"]["cold#0"]["saved_by_prompt"][NAMES.index("long")]
    key = state["key_prefix"].encode() + saved[2].encode()
    assert member.lookup(key).code == 0, key
    return key


def test_prefill_and_decode_engines_share_kv_through_the_store(env, workdir, models, cluster,
                                                                prompts_file):
    prefill = run_engine(env, workdir, "prefill", models["a"], address(cluster, 0), prompts_file,
                         "cold,warm", "--kv-role", "kv_producer", "--namespace", "pd")
    decode = run_engine(env, workdir, "decode", models["a"], address(cluster, 1), prompts_file,
                        "each", "--kv-role", "kv_consumer", "--namespace", "pd", "--log-stats")
    cold = prefill["phases"]["cold"]
    assert cold["sched"].get("lookups", 0) == 0, "a producer never looks up"
    assert cold["worker"]["save_blocks"] > 0
    each = decode["phases"]["each"]
    loads = [len(x) for x in each["loaded_by_prompt"]]
    assert loads == [loadable_blocks(len(PROMPTS[n])) for n in NAMES]
    assert each["worker"].get("save_blocks", 0) == 0, "a consumer never saves"
    assert each["worker"].get("load_error_blocks", 0) == 0
    assert each["outputs"] == prefill["phases"]["warm"]["outputs"]
    leases_back_to_zero(cluster)
    # What an operator reads through vLLM (LLM.get_metrics(), `vllm serve`'s /metrics): the
    # connector's counters, the scheduler's lookups and the worker's loads alike.
    vm = decode["vllm_metrics"]
    print("vllm:mcstore metrics of the decode engine: %s" % vm)
    assert vm["vllm:mcstore_load_blocks"] == sum(loads)
    assert vm["vllm:mcstore_lookup_hit_blocks"] >= sum(loads)
