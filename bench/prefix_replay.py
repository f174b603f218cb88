#!/usr/bin/env python3
"""Prefix-caching replay: do memory and SSD tiers work as one cache?

A synthetic workload of an LLM server's prefix cache: CONVS conversations, picked with Zipf(ZIPF)
popularity; each pick is one more turn of that conversation, whose prompt is the conversation's
previous prompt plus a few more blocks (chained block keys: block j of a conversation has the same
key in every turn, as content-addressed KV blocks do). Per request the engine asks MatchPrefix for
the prompt's keys, loads the matched blocks (BatchGet), and puts the missing ones back.

The same sequence runs against a real cluster (mc-master, CLIENTS mc-clients with SEGMENT bytes of
memory and SSD bytes of SSD tier each; requests go to the client of their conversation) and
against an ideal LRU cache of the combined capacity (all memory + all SSD, in blocks), and one of
the memory alone. Printed: block hit rates (all requests, and the second half: steady state), the
ratio real / ideal, losses and write-back waits the master counted. Never asserts on time.

Env: MC_BUILD_DIR (build), BENCH_DIR (/var/tmp), CLIENTS (2), SEGMENT (8 MiB), SSD (32 MiB),
     BLOCK (64 KiB), CONVS (300), REQUESTS (2000), ZIPF (1.0), SEED (1), MAX_BLOCKS (48),
     EXTRA_CLIENT_ARGS (e.g. --promote_on_hit).
Run from the repo root: python3 bench/prefix_replay.py
"""

import collections
import os
import random
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("MC_BUILD_DIR", os.path.join(REPO, "build"))
os.environ["MC_BUILD_DIR"] = os.path.abspath(BUILD)
sys.path[:0] = [os.path.join(BUILD, "python_gen"), os.path.join(REPO, "python"),
                os.path.join(REPO, "tests")]

from integration.client import client_cluster as cc  # noqa: E402
from mcstore.v1 import store_pb2 as spb  # noqa: E402

MiB = 1 << 20


def env(name, default, conv=int):
    return conv(os.environ.get(name, default))


def workload(convs, requests, zipf, seed, max_blocks):
    """[(conversation, prompt length in blocks)] for each request."""
    rnd = random.Random(seed)
    weights = [1.0 / (i + 1) ** zipf for i in range(convs)]
    base = [rnd.randint(2, 8) for _ in range(convs)]  # first prompt (system + question)
    length = [0] * convs
    out = []
    for c in rnd.choices(range(convs), weights, k=requests):
        length[c] = base[c] if length[c] == 0 else length[c] + rnd.randint(1, 4)
        if length[c] > max_blocks:  # a new conversation in that slot
            length[c] = base[c]  # the chain restarts under a new epoch
            out.append((c, length[c], True))
        else:
            out.append((c, length[c], False))
    return out


class Lru:
    def __init__(self, capacity):
        self.capacity = capacity
        self.d = collections.OrderedDict()

    def request(self, keys):
        hit = 0
        for k in keys:
            if k not in self.d:
                break
            hit += 1
        for k in keys:
            if k in self.d:
                self.d.move_to_end(k)
            else:
                self.d[k] = True
        while len(self.d) > self.capacity:
            self.d.popitem(last=False)
        return hit


def keys_of(c, epoch, n):
    return [b"conv%05d-e%03d-b%03d" % (c, epoch, j) for j in range(n)]


def main():
    clients = env("CLIENTS", 2)
    segment = env("SEGMENT", 8 * MiB)
    ssd = env("SSD", 32 * MiB)
    block = env("BLOCK", 64 * 1024)
    convs = env("CONVS", 300)
    requests = env("REQUESTS", 2000)
    zipf = env("ZIPF", 1.0, float)
    seed = env("SEED", 1)
    max_blocks = env("MAX_BLOCKS", 48)
    extra = os.environ.get("EXTRA_CLIENT_ARGS", "").split()
    tempfile.tempdir = os.environ.get("BENCH_DIR", "/var/tmp")

    mem_blocks = clients * segment // block
    all_blocks = clients * (segment + ssd) // block
    seq = workload(convs, requests, zipf, seed, max_blocks)
    epochs = [0] * convs
    plan = []
    for c, n, restart in seq:
        if restart:
            epochs[c] += 1
        plan.append((c, keys_of(c, epochs[c], n)))

    ideal = Lru(all_blocks)
    ideal_mem = Lru(mem_blocks)
    half = len(plan) // 2
    stats = collections.Counter()
    for r, (c, keys) in enumerate(plan):
        h, hm = ideal.request(keys), ideal_mem.request(keys)
        stats["ideal"] += h
        stats["ideal_mem"] += hm
        stats["blocks"] += len(keys)
        if r >= half:
            stats["ideal_2"] += h
            stats["ideal_mem_2"] += hm
            stats["blocks_2"] += len(keys)

    c = cc.Cluster(clients=clients, segment_size=segment,
                   client_args=["--offload_poll_ms", "20"] + extra)
    for i in range(clients):
        c.per_client_args[i] = ["--offload_dir", os.path.join(c.tmp, "ssd-%d" % i),
                                "--offload_capacity", str(ssd), "--offload_files", "1"]
    c.start()
    try:
        stubs = [c.stub(i) for i in range(clients)]
        payload = cc.payload(block, 7)
        for r, (conv, keys) in enumerate(plan):
            stub = stubs[conv % clients]
            m = stub.MatchPrefix(spb.MatchPrefixRequest(keys=keys, lease_ttl_ms=10000),
                                 timeout=60)
            matched = m.matched
            if matched:
                got = stub.BatchGet(spb.BatchGetRequest(
                    items=[spb.GetItem(key=k) for k in keys[:matched]], lease_id=m.lease_id),
                    timeout=60)
                ok = 0
                for k, res in zip(keys, got.results):
                    if res.code != spb.OK or res.data[:len(k)] != k:
                        stats["load_failed"] += 1
                        break
                    ok += 1
                matched = ok
                stub.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=m.lease_id), timeout=60)
            stats["real"] += matched
            if r >= half:
                stats["real_2"] += matched
            missing = [(k, k + payload[len(k):]) for k in keys[matched:]]
            for b in range(0, len(missing), 16):
                for res in cc.put_inline(stub, missing[b:b + 16]):
                    if res.code not in (spb.OK, spb.ALREADY_EXISTS):
                        stats["put_failed"] += 1
        lost = 0.0
        for k, v in cc.metrics(c.master_http()).items():
            if (k[0] if isinstance(k, tuple) else k) == "mc_objects_lost_total":
                lost += v
        waits = sum(cc.metric(c.http(i), "mc_client_put_write_back_waits_total")
                    for i in range(clients))
    finally:
        c.stop()

    def rate(k, n="blocks"):
        return stats[k] / max(1, stats[n])

    print("prefix_replay clients=%d segment_MiB=%d ssd_MiB=%d block_KiB=%d convs=%d requests=%d "
          "zipf=%.2f blocks=%d mem_blocks=%d all_blocks=%d extra=%s"
          % (clients, segment // MiB, ssd // MiB, block // 1024, convs, requests, zipf,
             stats["blocks"], mem_blocks, all_blocks, "_".join(extra) or "none"))
    print("hit_rate all: real=%.3f ideal_lru=%.3f ratio=%.3f memory_only_ideal=%.3f"
          % (rate("real"), rate("ideal"), rate("real") / max(1e-9, rate("ideal")),
             rate("ideal_mem")))
    print("hit_rate steady (2nd half): real=%.3f ideal_lru=%.3f ratio=%.3f "
          "memory_only_ideal=%.3f"
          % (rate("real_2", "blocks_2"), rate("ideal_2", "blocks_2"),
             rate("real_2", "blocks_2") / max(1e-9, rate("ideal_2", "blocks_2")),
             rate("ideal_mem_2", "blocks_2")))
    print("load_failed=%d put_failed=%d lost=%d write_back_waits=%d"
          % (stats["load_failed"], stats["put_failed"], lost, waits))


if __name__ == "__main__":
    main()
