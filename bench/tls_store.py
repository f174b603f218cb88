#!/usr/bin/env python3
"""What TLS costs the TCP Store listener (prints, never asserts): the Python client puts 16
values of 1 MiB inline (one BatchPut), then gets them back inline (one BatchGet), through an
mc-client whose --listen is plaintext and through one whose --listen serves TLS (a throwaway CA
from deploy/make-tls-certs.sh). Both daemons hold the data in their own memory (local path), so
the difference is the listener's. Each figure is the median of RUNS rounds (default 15). Also
the latency of a small call (BatchExist of one key, median of 500), as the master's RPCs are.

    MC_BUILD_DIR=build PYTHONPATH=build/python_gen:python:tests python3 bench/tls_store.py
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests")]
os.environ.setdefault("MC_BUILD_DIR", os.path.join(ROOT, "build"))

RUNS = int(os.environ.get("RUNS", "15"))
MiB = 1 << 20
ITEMS = 16


def remove(c, names):
    """Removes names, retrying those a get's read lease still holds (released a moment later)."""
    from mcstore import Code, raise_for_results
    for _ in range(500):
        res = c.remove(names)
        names = [r.key for r in res if r.code == Code.HAS_LEASE]
        raise_for_results([r for r in res if r.code != Code.HAS_LEASE])
        if not names:
            return
        time.sleep(0.01)  # the lease of the get just made is released a moment later
    raise RuntimeError("keys still leased: %d" % len(names))


def measure(client, values):
    from mcstore import raise_for_results
    keys = [b"tls-bench-%d" % i for i in range(ITEMS)]
    put_s, get_s = [], []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        raise_for_results(client.put(keys, values))
        t1 = time.perf_counter()
        got = client.get(keys)
        t2 = time.perf_counter()
        raise_for_results(got)
        assert all(g.data == v for g, v in zip(got, values))
        put_s.append(t1 - t0)
        get_s.append(t2 - t1)
        remove(client, keys)
    small = []
    for _ in range(500):
        t0 = time.perf_counter()
        client.exist([b"tls-bench-small"])
        small.append(time.perf_counter() - t0)
    return statistics.median(put_s), statistics.median(get_s), statistics.median(small)


def main():
    from integration.client import client_cluster as cc
    from mcstore import Client, TlsConfig
    pki = tempfile.mkdtemp(prefix="mc-tls-bench-")
    subprocess.run([os.path.join(ROOT, "deploy", "make-tls-certs.sh"), pki], check=True)
    pair = ["--tls_cert_file", os.path.join(pki, "cert.pem"),
            "--tls_key_file", os.path.join(pki, "cert.key")]
    cluster = cc.Cluster(clients=2, segment_size=64 * MiB, per_client_args={1: pair}).start()
    try:
        values = [os.urandom(MiB) for _ in range(ITEMS)]
        plain = Client(cluster.clients[0].ready["grpc"], token_file=cluster.token_file)
        tls = Client(cluster.clients[1].ready["grpc"], token_file=cluster.token_file,
                     tls=TlsConfig(ca_file=os.path.join(pki, "ca.pem")))
        rows = []
        for name, c in (("plaintext", plain), ("tls", tls)):
            measure(c, values)  # warm-up: connection, handshake, first allocations
            rows.append((name,) + measure(c, values))
            c.close()
        mb = ITEMS * MiB / 1e6
        print("%-10s %10s %10s %10s %10s %12s" % ("listener", "put ms", "get ms", "put MB/s",
                                                  "get MB/s", "exist(1) us"))
        for name, p, g, e in rows:
            print("%-10s %10.2f %10.2f %10.0f %10.0f %12.0f" % (name, p * 1e3, g * 1e3, mb / p,
                                                               mb / g, e * 1e6))
        (_, pp, pg, pe), (_, tp, tg, te) = rows
        print("tls/plaintext time: put %.2fx, get %.2fx, exist(1) %.2fx (%d x 1 MiB)"
              % (tp / pp, tg / pg, te / pe, ITEMS))
    finally:
        cluster.stop()
        subprocess.run(["rm", "-rf", pki])


if __name__ == "__main__":
    main()
