#!/usr/bin/env python3
"""The Python client's throughput beside mc-bench's for the same bytes (prints, never asserts).

Starts an mc-master and two mc-clients (tests/integration/client/client_cluster.py), then per
case: `keys` values of `size` bytes put through client 0, and gets in batches of `batch` into
slices of a registered buffer (zero-copy) or inline, through client 0 (local path) and client 1
(cross-daemon TCP path). Each figure is the median of RUNS runs. mc-bench (build/tools/mc-bench)
runs the same case on the same daemons when built. Also the Python-side cost of a get of many
small keys into slices (what a connector loading 1000 KV blocks pays per call), and the fast
channel against gRPC: put from and get into shm slices through the local daemon, 16 x 64 KiB
and 16 x 1 MiB per call, the two paths interleaved, per-call p50 latency. Prints which path
each Client's calls took (Client.transport_stats()).

    MC_BUILD_DIR=build PYTHONPATH=<stubs>:python:tests $MC_VENV/bin/python bench/py_client_bench.py
        [--fast-vs-grpc [--address unix:/path/to/client.sock]]
    --fast-vs-grpc: only the fast channel against gRPC, on a cluster of its own or, with
    --address, through a running daemon (e.g. deploy/local-cluster.sh start 2, MC_AUTH=0)
"""

import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests")]
os.environ.setdefault("MC_BUILD_DIR", os.path.join(ROOT, "build"))

RUNS = int(os.environ.get("RUNS", "5"))
MiB = 1 << 20


def stubs():
    import tempfile
    from mcstore import _protogen
    out = tempfile.mkdtemp(prefix="mcstore-bench-gen-")
    _protogen.generate(os.path.join(ROOT, "proto"), out)
    sys.path.insert(0, out)
    import mcstore
    mcstore.__path__.insert(1, os.path.join(out, "mcstore"))


def remove(c, names):
    """Removes names, retrying those a get's read lease still holds (released a moment later)."""
    from mcstore import Code, raise_for_results
    for _ in range(500):
        res = c.remove(names)
        names = [r.key for r in res if r.code == Code.HAS_LEASE]
        raise_for_results([r for r in res if r.code != Code.HAS_LEASE])
        if not names:
            return
        time.sleep(0.01)
    raise RuntimeError("keys still leased: %d" % len(names))


def py_case(put_c, get_c, size, keys, batch, iters, dest):
    import numpy as np
    from mcstore import raise_for_results
    src = put_c.create_buffer(size * batch)
    dst = get_c.create_buffer(size * batch)
    src.numpy(np.uint8, size * batch)[:] = np.random.default_rng(7).integers(
        0, 255, size * batch, dtype=np.uint8)
    rates = []
    for run in range(RUNS):
        names = [b"pyb-%d-%d-%d" % (os.getpid(), run, i) for i in range(keys)]
        for i in range(0, keys, batch):
            raise_for_results(put_c.put(names[i:i + batch],
                                        [src.slice(j * size, size) for j in range(batch)]))
        into = [dst.slice(j * size, size) for j in range(batch)]
        t0 = time.perf_counter()
        moved = 0
        for it in range(iters):
            i = (it * batch) % keys
            res = get_c.get(names[i:i + batch], into=into if dest == "shm" else None)
            raise_for_results(res)
            moved += sum(r.size for r in res)
        rates.append(moved / (time.perf_counter() - t0) / 1e9)
        remove(put_c, names)
    src.close()
    dst.close()
    return statistics.median(rates)


def mc_bench(put_addr, get_addr, size, keys, batch, iters, dest):
    path = os.path.join(os.environ["MC_BUILD_DIR"], "tools", "mc-bench")
    if not os.access(path, os.X_OK):
        return None
    r = subprocess.run([path, "--client", get_addr, "--put_client", put_addr,
                        "--value_size", str(size), "--keys", str(keys), "--batch", str(batch),
                        "--iterations", str(iters), "--runs", str(RUNS), "--dest", dest,
                        "--mode", "get"], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return "mc-bench failed: " + r.stderr.strip()[-200:]
    m = re.search(r"mc-bench summary op=get .*? GB/s=([0-9.]+)", r.stdout)
    return float(m.group(1)) if m else "unparsed: " + r.stdout.strip()[-200:]


def many_small(c, n=1024, size=4096):
    import numpy as np
    from mcstore import raise_for_results
    buf = c.create_buffer(n * size)
    buf.numpy(np.uint8, n * size)[:] = 1
    names = [b"pys-%d-%d" % (os.getpid(), i) for i in range(n)]
    raise_for_results(c.put(names, [buf.slice(i * size, size) for i in range(n)]))
    from mcstore import _core
    build, total = [], []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        _core.build_get(names, [buf.slice(i * size, size) for i in range(n)], None, c._checker)
        build.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        raise_for_results(c.get(names, into=[buf.slice(i * size, size) for i in range(n)]))
        total.append(time.perf_counter() - t0)
    remove(c, names)
    buf.close()
    return statistics.median(build), statistics.median(total)


def paths(c):
    """Which path a Client's data calls took, in words."""
    s = c.transport_stats()
    if s["fast_channel"] is None:
        return "gRPC only (fast channel off): %d calls" % s["grpc"]
    not_sent = ", ".join("%s %d" % kv for kv in sorted(s["fast_not_sent"].items()) if kv[1])
    return "fast channel %s (limit %d B): %d calls; gRPC: %d calls%s" % (
        s["fast_channel"], s["fast_limit"], s["fast"], s["grpc"],
        " (not sent fast: %s)" % not_sent if not_sent else "")


def fast_vs_grpc(addr, rounds, sizes=((64 << 10, 100), (1 * MiB, 16)), batch=16):
    """p50 per-call latency of put (from shm slices) and get (into shm slices) through the
    local daemon, over the fast channel and over gRPC, interleaved round by round."""
    import numpy as np
    from mcstore import Client, raise_for_results
    with Client(addr, timeout_s=60) as fast, \
            Client(addr, timeout_s=60, fast_channel=False) as grpc_only:
        clients = (("fast", fast), ("grpc", grpc_only))
        print("fast channel vs gRPC, local daemon, shm slices, %d values per call, p50 of %d "
              "rounds (ms per call; GB/s at that latency)" % (batch, rounds))
        for size, iters in sizes:
            bufs = {}
            for name, c in clients:
                src, dst = c.create_buffer(size * batch), c.create_buffer(size * batch)
                src.numpy(np.uint8, size * batch)[:] = np.random.default_rng(3).integers(
                    0, 255, size * batch, dtype=np.uint8)
                bufs[name] = (src, dst)
            lat = {(n, op): [] for n, _ in clients for op in ("put", "get")}
            cpu = {key: 0.0 for key in lat}  # this process's CPU (gRPC's threads included)
            for rnd in range(rounds):
                for name, c in (clients if rnd % 2 == 0 else clients[::-1]):
                    src, dst = bufs[name]
                    names = [b"pyab-%d-%s-%d-%d" % (os.getpid(), name.encode(), rnd, i)
                             for i in range(batch * iters)]
                    put_from = [src.slice(j * size, size) for j in range(batch)]
                    get_into = [dst.slice(j * size, size) for j in range(batch)]
                    c0 = time.process_time()
                    for it in range(iters):
                        t0 = time.perf_counter()
                        raise_for_results(c.put(names[it * batch:(it + 1) * batch], put_from))
                        lat[(name, "put")].append(time.perf_counter() - t0)
                    c1 = time.process_time()
                    for it in range(iters):
                        t0 = time.perf_counter()
                        raise_for_results(c.get(names[it * batch:(it + 1) * batch],
                                                into=get_into))
                        lat[(name, "get")].append(time.perf_counter() - t0)
                    cpu[(name, "put")] += c1 - c0
                    cpu[(name, "get")] += time.process_time() - c1
                    if bytes(dst.memoryview(0, size)) != bytes(src.memoryview(0, size)):
                        raise RuntimeError("%s: got bytes differ from those put" % name)
                    remove(c, names)
            for op in ("put", "get"):
                f, g = (statistics.median(lat[(n, op)]) for n in ("fast", "grpc"))
                fc, gc = (cpu[(n, op)] / len(lat[(n, op)]) for n in ("fast", "grpc"))
                print("  %4d KiB x %d %s: fast %.3f ms (%.2f GB/s), gRPC %.3f ms (%.2f GB/s), "
                      "fast/gRPC time %.2f; client CPU per call: fast %.0f us, gRPC %.0f us"
                      % (size >> 10, batch, op, f * 1e3, size * batch / f / 1e9, g * 1e3,
                         size * batch / g / 1e9, f / g, fc * 1e6, gc * 1e6))
            for src, dst in bufs.values():
                src.close()
                dst.close()
        for name, c in clients:
            print("  %s client: %s" % (name, paths(c)))


def main():
    stubs()
    args = sys.argv[1:]
    if "--address" in args:
        fast_vs_grpc(args[args.index("--address") + 1], max(RUNS, 6))
        return
    from integration.client.client_cluster import Cluster
    from mcstore import Client
    cl = Cluster(clients=2, segment_size=512 * MiB).start()
    try:
        a0 = "unix:" + cl.clients[0].ready["unix_socket"]
        a1 = "unix:" + cl.clients[1].ready["unix_socket"]
        if "--fast-vs-grpc" in sys.argv[1:]:
            fast_vs_grpc(a0, max(RUNS, 6))
            return
        with Client(a0, timeout_s=60) as c0, Client(a1, timeout_s=60) as c1:
            print("case                          python GB/s   mc-bench GB/s   (median of %d)"
                  % RUNS)
            for size, keys, batch, iters in ((1 * MiB, 64, 16, 40), (4 * MiB, 64, 16, 12)):
                for path, gc, ga in (("local", c0, a0), ("cross", c1, a1)):
                    for dest in ("shm", "inline"):
                        py = py_case(c0, gc, size, keys, batch, iters, dest)
                        mb = mc_bench(a0, ga, size, keys, batch, iters, dest)
                        print("%-5s %-6s %2d MiB x %-2d      %8.2f       %s"
                              % (path, dest, size // MiB, batch, py,
                                 "%.2f" % mb if isinstance(mb, float) else mb))
            b, t = many_small(c0)
            print("get of 1024 x 4 KiB into slices, local: %.1f ms per call, of which %.1f ms "
                  "building the request in Python" % (t * 1e3, b * 1e3))
            print("client 0: %s\nclient 1: %s" % (paths(c0), paths(c1)))
        fast_vs_grpc(a0, max(RUNS, 6))
    finally:
        cl.stop()


if __name__ == "__main__":
    main()
