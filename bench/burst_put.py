#!/usr/bin/env python3
"""Burst puts into memory + SSD tier: how fast a burst of FACTOR x memory is absorbed when every
acknowledged value must end up on the SSD tier (write-back, DESIGN.md invariant 7).

Starts mc-master and CLIENTS mc-clients (port 0, a temp dir under BENCH_DIR, SEGMENT bytes of
memory and an SSD tier of SSD bytes each), then THREADS writers put FACTOR x (total memory) of
VALUE-byte values, in batches of BATCH, through the clients in turn, as fast as they are taken
(zero-copy: slices of shared-memory buffers registered with the client, as a KV connector puts).
Prints one line: bytes, seconds, burst GB/s (until the last put answered), drain GB/s (until
every value is on an SSD tier), the puts that waited for write-back, the losses the master
counted, and a read-back check of a sample. Never asserts on time.

Env: MC_BUILD_DIR (default build), BENCH_DIR (default /var/tmp: not tmpfs, O_DIRECT),
     CLIENTS (1), SEGMENT (64 MiB), SSD (4 GiB), FACTOR (10), VALUE (1 MiB), BATCH (16),
     THREADS (4), PARALLELISM (--offload_parallelism, 4), EXTRA_CLIENT_ARGS.
Run from the repo root: python3 bench/burst_put.py
"""

import os
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("MC_BUILD_DIR", os.path.join(REPO, "build"))
os.environ["MC_BUILD_DIR"] = os.path.abspath(BUILD)
sys.path[:0] = [os.path.join(BUILD, "python_gen"), os.path.join(REPO, "python"),
                os.path.join(REPO, "tests")]

import tempfile  # noqa: E402

from integration import harness  # noqa: E402
from integration.client import client_cluster as cc  # noqa: E402

MiB = 1 << 20


def env_int(name, default):
    return int(os.environ.get(name, default))


def lost(master_http):
    total = 0.0
    for k, v in cc.metrics(master_http).items():
        if (k[0] if isinstance(k, tuple) else k) == "mc_objects_lost_total":
            total += v
    return total


def client_sum(c, n, name, **labels):
    return sum(cc.metric(c.http(i), name, **labels) for i in range(n))


def main():
    clients = env_int("CLIENTS", 1)
    segment = env_int("SEGMENT", 64 * MiB)
    ssd = env_int("SSD", 4096 * MiB)
    factor = env_int("FACTOR", 10)
    value = env_int("VALUE", MiB)
    batch = env_int("BATCH", 16)
    threads = env_int("THREADS", 4)
    parallelism = env_int("PARALLELISM", 4)
    bench_dir = os.environ.get("BENCH_DIR", "/var/tmp")
    extra = os.environ.get("EXTRA_CLIENT_ARGS", "").split()

    tempfile.tempdir = bench_dir  # the cluster's temp dir (and so the SSD tiers) live here
    c = cc.Cluster(clients=clients, segment_size=segment,
                   client_args=["--offload_parallelism", str(parallelism),
                                "--offload_poll_ms", "20"] + extra)
    for i in range(clients):
        c.per_client_args[i] = ["--offload_dir", os.path.join(c.tmp, "ssd-%d" % i),
                                "--offload_capacity", str(ssd)]
    c.start()
    try:
        n = factor * clients * segment // value
        block = cc.payload(value, 1)
        # Distinct values at low cost: the first 8 bytes carry the index.
        def val(i):
            return i.to_bytes(8, "little") + block[8:]
        stubs = [c.stub(i % clients) for i in range(threads)]
        # Zero-copy puts (as a KV connector does): each writer owns batch x value bytes of a
        # shared-memory buffer registered with its client, and stamps each value's index.
        bufs = []
        for t in range(threads):
            b = c.buffer(batch * value, stubs[t])
            for j in range(batch):
                b.write(j * value, block)
            bufs.append(b)
        next_batch = [0]
        lock = threading.Lock()
        errors = []

        def writer(t):
            stub, buf = stubs[t], bufs[t]
            while True:
                with lock:
                    b = next_batch[0]
                    next_batch[0] += batch
                if b >= n:
                    return
                idx = list(range(b, min(n, b + batch)))
                items = []
                for j, i in enumerate(idx):
                    buf.write(j * value, i.to_bytes(8, "little"))
                    items.append(cc.spb.PutItem(key=b"burst-%07d" % i,
                                                slices=[buf.slice(j * value, value)]))
                resp = stub.BatchPut(cc.spb.BatchPutRequest(items=items), timeout=600)
                for i, r in zip(idx, resp.results):
                    if r.code != cc.spb.OK:
                        errors.append("%d: %s %s" % (i, cc.code_name(r.code), r.message))

        t0 = time.monotonic()
        ws = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
        for w in ws:
            w.start()
        for w in ws:
            w.join()
        t_burst = time.monotonic() - t0
        acked = n - len(errors)
        harness.wait_until(
            lambda: client_sum(c, clients, "mc_client_offloads_total", result="ok") >= acked,
            600, interval_s=0.05, what="every value on SSD")
        t_drain = time.monotonic() - t0
        waits = client_sum(c, clients, "mc_client_put_write_back_waits_total")
        # Read back a sample (every 7th value) byte-exact.
        sample = list(range(0, n, 7))
        bad = 0
        for s in range(0, len(sample), 16):
            idx = sample[s:s + 16]
            for i, r in zip(idx, cc.get_inline(c.stub(0), [b"burst-%07d" % i for i in idx])):
                if r.code != cc.spb.OK or r.data != val(i):
                    bad += 1
        total = n * value
        print("burst_put clients=%d segment_MiB=%d factor=%d value_KiB=%d threads=%d "
              "parallelism=%d bytes=%d burst_s=%.2f burst_GBps=%.3f drain_s=%.2f drain_GBps=%.3f "
              "put_errors=%d write_back_waits=%d lost=%d sample_bad=%d"
              % (clients, segment // MiB, factor, value // 1024, threads, parallelism, total,
                 t_burst, total / t_burst / 1e9, t_drain, total / t_drain / 1e9, len(errors),
                 waits, lost(c.master_http()), bad))
        for e in errors[:5]:
            print("  put error:", e)
    finally:
        c.stop()


if __name__ == "__main__":
    main()
