#!/usr/bin/env python3
"""Time to first token of a long prompt on a real vLLM (CPU) engine: mcstore hit vs recompute,
and the connector's load/save throughput beside mc-bench's for the same object size.

Starts its own loopback mc-master + mc-client (from $MC_BUILD_DIR, default build/), writes a
tiny Llama (float32, 2 KV heads, head_dim 64) into a temp dir, then runs engines as fresh
processes (tests/vllm/engine_run.py):
  1. save:      one cold generate of the prompt (max_tokens=1) through MCStoreConnector
  2. hit:       a fresh engine; warm-up, then N generates of the prompt with vLLM's local prefix
                cache reset before each: every loadable block comes from mcstore
  3. recompute: a fresh engine without the connector; same N generates (local cache reset)
  4. mc-bench:  gets/puts of the same object size and batch (one request's blocks) from shm slices
Prints figures only; no assertion on time.

Run it with the venv's python (deploy/python-venv.sh path) and LD_PRELOAD from
`deploy/python-venv.sh env`:
    $(deploy/python-venv.sh path)/bin/python bench/vllm_ttft.py [--tokens 2048] [--reps 5]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "client"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--load-sync", action="store_true",
                    help="the connector's load_async=false (loads finish before the forward)")
    a = ap.parse_args()

    build = os.environ.setdefault("MC_BUILD_DIR", os.path.join(ROOT, "build"))
    env = dict(os.environ)
    pre = subprocess.run([os.path.join(ROOT, "deploy", "python-venv.sh"), "env"],
                         capture_output=True, text=True, check=True).stdout.strip()
    k, _, v = pre.partition("=")
    if v:
        env[k] = v
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    tmp = tempfile.mkdtemp(prefix="mc-vllm-bench-")
    # Stubs matching this interpreter's protobuf (build/python_gen holds Debian protoc's).
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from mcstore import _protogen
    stubs = os.path.join(tmp, "stubs")
    _protogen.generate(os.path.join(ROOT, "proto"), stubs)
    sys.path.insert(0, stubs)
    import mcstore
    mcstore.__path__[:] = [mcstore.__path__[0], os.path.join(stubs, "mcstore")]
    env["PYTHONPATH"] = os.pathsep.join([stubs, os.path.join(ROOT, "python"),
                                         os.path.join(ROOT, "tests")])
    model = os.path.join(tmp, "model")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "vllm", "tiny_model.py"), model,
                    "--layers", str(a.layers), "--hidden", str(a.hidden)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rng = random.Random(7)
    prompt = [rng.randrange(3, 2000) for _ in range(a.tokens)]
    warm = [rng.randrange(3, 2000) for _ in range(40)]
    files = {}
    for name, prompts in (("one", [prompt]), ("reps", [warm] + [prompt] * a.reps)):
        files[name] = os.path.join(tmp, name + ".json")
        with open(files[name], "w") as f:
            json.dump(prompts, f)

    from client_cluster import Cluster
    cluster = Cluster(clients=1, segment_size=1 << 30)
    cluster.start()
    try:
        addr = "unix:" + cluster.clients[0].ready["unix_socket"]
        common = ["--model", model, "--block-size", str(a.block_size), "--max-tokens", "1",
                  "--max-model-len", str(a.tokens + 64), "--max-num-batched-tokens",
                  str(a.tokens + 64), "--num-blocks", str(a.tokens // a.block_size * 3 + 16)]

        def engine(name, prompts, phases, *extra):
            out = os.path.join(tmp, name + ".out.json")
            with open(os.path.join(tmp, name + ".log"), "w") as log:
                subprocess.run([sys.executable, os.path.join(ROOT, "tests", "vllm",
                                                             "engine_run.py"),
                                "--address", addr, "--prompts", prompts, "--out", out,
                                "--phases", phases] + common + list(extra),
                               env=env, check=True, stdout=log, stderr=subprocess.STDOUT)
            with open(out) as f:
                return json.load(f)

        from client_cluster import metrics as daemon_metrics
        http = cluster.clients[0].ready["http"]

        def batch_gets():
            """The daemon's own count and summed latency of BatchGet RPCs so far."""
            m = daemon_metrics(http)
            label = frozenset({("rpc", "BatchGet")})
            return (m.get(("mc_client_rpc_latency_seconds_count", label), 0.0),
                    m.get(("mc_client_rpc_latency_seconds_sum", label), 0.0))

        save = engine("save", files["one"], "cold")
        gets_before = batch_gets()
        hit = engine("hit", files["reps"], "each", *(["--load-sync"] if a.load_sync else []))
        gets_after = batch_gets()
        rec = engine("recompute", files["reps"], "each", "--no-connector")
        hit_t = hit["phases"]["each"]["times_s"][1:]
        rec_t = rec["phases"]["each"]["times_s"][1:]
        hw, sw = hit["phases"]["each"]["worker"], save["phases"]["cold"]["worker"]
        loads_per_req = hw["load_blocks"] / a.reps if a.reps else 0
        block_bytes = (hw["load_bytes"] / hw["load_blocks"]) if hw.get("load_blocks") else 0
        print("prompt %d tokens, block %d tokens, %d layers, hidden %d: %d blocks loaded per "
              "hit of %d bytes (+128 B header)" % (a.tokens, a.block_size, a.layers, a.hidden,
                                                  loads_per_req, block_bytes))
        print("TTFT recompute: median %.1f ms (%s)" % (1e3 * statistics.median(rec_t),
                                                       ", ".join("%.1f" % (1e3 * t) for t in rec_t)))
        print("TTFT mcstore hit: median %.1f ms (%s)" % (1e3 * statistics.median(hit_t),
                                                         ", ".join("%.1f" % (1e3 * t) for t in hit_t)))
        print("hit / recompute = %.2f" % (statistics.median(hit_t) / statistics.median(rec_t)))
        if hw.get("load_s"):
            print("connector load: %.2f GB/s (%d bytes in %.1f ms over %d requests)"
                  % (hw["load_bytes"] / hw["load_s"] / 1e9, hw["load_bytes"],
                     1e3 * hw["load_s"], a.reps))
            lt = hit["phases"]["each"].get("load_times_s", [])
            if lt and block_bytes:
                # The first loads land in block ids not used before (their pages cold in the
                # caches): the mean above includes them, the median is a warm load.
                print("connector load per request: median %.2f ms (%.2f GB/s), first three %s ms"
                      % (1e3 * statistics.median(lt),
                         loads_per_req * block_bytes / statistics.median(lt) / 1e9,
                         ", ".join("%.2f" % (1e3 * t) for t in lt[:3])))
        n_gets = gets_after[0] - gets_before[0]
        if n_gets > 0:
            # Inside the daemon (its RPC latency histogram): where the connector's time goes.
            print("daemon-side BatchGet during the hit engine: %d RPCs, mean %.1f ms"
                  % (n_gets, 1e3 * (gets_after[1] - gets_before[1]) / n_gets))
        if sw.get("save_s"):
            print("connector save: %.2f GB/s (%d bytes in %.1f ms)"
                  % (sw["save_bytes"] / sw["save_s"] / 1e9, sw["save_bytes"], 1e3 * sw["save_s"]))
        if block_bytes:
            # The engine loads once per request, some tens of ms apart (about one TTFT): each
            # load meets an idle daemon. mc-bench and the Python client alone are measured both
            # back to back (their usual figure) and with that gap before each get.
            gap_ms = round(1e3 * statistics.median(hit_t), 1)
            for gap in (0.0, gap_ms):
                alone(addr, http, int(loads_per_req), int(block_bytes), 2 * a.layers, gap)
            bench = os.path.join(build, "tools", "mc-bench")
            value = int(block_bytes) + 128
            n = int(loads_per_req)
            # The same keys each get (source and destination stay in the L3); a working set of
            # 256 MiB; each spaced like the engine's loads. The connector's own pattern is the
            # last: the same objects (one prompt) loaded once per request, a TTFT apart.
            big = max(n, (256 << 20) // value)
            configs = (("same keys, back to back", n, 0.0), ("256 MiB, back to back", big, 0.0),
                       ("256 MiB, spaced", big, gap_ms), ("same keys, spaced", n, gap_ms))
            summaries = []
            for label, keys, gap in configs:
                cmd = [bench, "--client", addr, "--value_size", str(value), "--batch", str(n),
                       "--keys", str(keys), "--iterations", "20", "--runs", "3", "--dest", "shm",
                       "--get_gap_ms", str(gap)]
                print("$ " + " ".join(cmd[1:]))
                p = subprocess.run(cmd, capture_output=True, text=True)
                print(p.stdout.strip() or p.stderr.strip()[-2000:])
                summaries.append((label, mc_bench_get_summary(p.stdout)))
            lt = hit["phases"]["each"].get("load_times_s", [])
            if hw.get("load_s") and lt:
                mean_gbs = hw["load_bytes"] / hw["load_s"] / 1e9
                med_ms = 1e3 * statistics.median(lt)
                for label, (gbs, p50) in summaries:
                    if gbs and p50:
                        print("connector / mc-bench (%s, gap %.1f ms): %.2fx on the mean GB/s, "
                              "%.2fx on the median load vs p50" % (
                                  label, gap_ms if "spaced" in label else 0.0, mean_gbs / gbs,
                                  p50 / med_ms))
    finally:
        cluster.stop()
        subprocess.run(["rm", "-rf", tmp])


def mc_bench_get_summary(out):
    """(GB/s, p50 ms) of mc-bench's `summary op=get` line, or (None, None)."""
    for line in out.splitlines():
        if line.startswith("mc-bench summary op=get"):
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            return float(f.get("GB/s", 0)) or None, float(f.get("p50_ms", 0)) or None
    return None, None


def alone(addr, http, n, block_bytes, parts, gap_ms, reps=100):
    """The connector's request without the engine: n keys of a 128-byte header slot + block_bytes
    scattered over `parts` slices of one buffer laid out [part][block] (as vLLM's per-layer K
    and V tensors are), named through a block layout as the connector does, got under a
    MatchPrefix lease, from this process, gap_ms apart."""
    import time
    from mcstore import Client, raise_for_results
    from client_cluster import metrics as daemon_metrics
    label = frozenset({("rpc", "BatchGet")})
    blocks, part = 2 * n, block_bytes // parts

    def daemon_side():
        m = daemon_metrics(http)
        return (m.get(("mc_client_rpc_latency_seconds_count", label), 0.0),
                m.get(("mc_client_rpc_latency_seconds_sum", label), 0.0))

    with Client(addr) as c:
        kv, hd = c.create_buffer(parts * blocks * part), c.create_buffer(blocks * 128)
        size = parts * blocks * part
        kv.memoryview()[:] = (os.urandom(4096) * (size // 4096 + 1))[:size]

        layout = c.block_layout([(hd.slice(0, 128), 128)]
                                + [(kv.slice(p * blocks * part, part), part) for p in range(parts)])
        keys = [b"mc-vllm-bench-alone/%d" % i for i in range(n)]
        raise_for_results(c.put(keys, layout.blocks(range(n))))
        into = list(range(n, 2 * n))
        with c.match_prefix(keys, 60000) as lease:
            raise_for_results(c.get(keys, into=layout.blocks(into), lease=lease))
            before, times = daemon_side(), []
            for _ in range(reps):
                time.sleep(gap_ms / 1e3)
                t0 = time.perf_counter()
                raise_for_results(c.get(keys, into=layout.blocks(into), lease=lease))
                times.append(time.perf_counter() - t0)
            after = daemon_side()
        c.remove(keys)
    t = statistics.median(times)
    print("python client alone, the connector's request (%d keys x header + %d layout runs, "
          "under a lease, %d gets, gap %.1f ms): median %.2f ms, %.2f GB/s; daemon-side mean %.2f ms"
          % (n, parts, reps, gap_ms, 1e3 * t, n * (parts * part + 128) / t / 1e9,
             1e3 * (after[1] - before[1]) / max(1.0, after[0] - before[0])))


if __name__ == "__main__":
    main()
