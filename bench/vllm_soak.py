#!/usr/bin/env python3
"""The serving soak as a benchmark: two real vLLM engines (CPU) on two mc-clients, the store over
95% full, faults spread over the run, figures per minute (tests/vllm/soak.py does the work; the
test suite runs a short version, tests/vllm/test_vllm_soak.py).

    $(deploy/python-venv.sh path)/bin/python bench/vllm_soak.py [--minutes 10] [--every 60]
        [--no-faults] [--workdir DIR] [--json OUT]

Per interval: requests served, hit rate, lookups per request, most leases active at the master,
loads that failed, the share of saves that failed, how full memory ran, evictions succeeded /
attempted, and the median latency of a request that loaded KV against one that recomputed it
(TTFT-like: max_tokens is 4). At the end, what each process held before the engines came, at
most during the run and once they were gone (fds, threads, buffers, connections). Faults (each
once, at 1/8, 3/8, 5/8 and 7/8 of the run): a corrupt segment range, a holder SIGKILLed and
restarted, an engine's own daemon restarted, the master restarted. Figures, never assertions
(bench/README.md).
"""
import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "vllm"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import soak  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--every", type=float, default=60, help="seconds per row")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--json", default="", help="write the whole report here")
    args = ap.parse_args()
    duration = args.minutes * 60
    faults = [] if args.no_faults else [(duration * k / 8, f) for k, f in zip(
        (1, 3, 5, 7), ("corrupt", "kill_holder", "restart_own", "restart_master"))]
    workdir = args.workdir or tempfile.mkdtemp(prefix="mc-vllm-soak-")
    rep = soak.Soak(workdir, duration_s=duration, faults=faults).run()
    rows = soak.per_minute(rep, args.every)
    cols = ["t", "requests", "hit_rate", "lookups_per_request", "leases_max", "failed_loads",
            "save_fail_ratio", "mem_used", "evictions", "latency_hit_s", "latency_recompute_s",
            "latency_ratio"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in cols))
    for f in rep["faults"]:
        print("fault at %.0f s: %s (%.1f s)%s" % (f["t"], f["fault"], f["took_s"],
                                                 "" if f["ok"] else " FAILED"))
    for name, e in rep["engines"].items():
        last = e["stats"][-1]
        print("%s: %d requests, %d with hits, wrong outputs %d, worker %s" % (
            name, last["requests"], last["hits"], len(e["wrong_outputs"]),
            {k: v for k, v in last["worker"].items() if not k.endswith(("_s", "_bytes"))}))
    print("evictions %d/%d succeeded, leases at the end: %s" % (
        soak.accumulate(rep["samples"], "evict_successes"),
        soak.accumulate(rep["samples"], "evict_attempts"),
        {k: v for k, v in rep["final"].items() if k.endswith("leases")}))
    held = ("fds", "threads", "buffers", "fast_connections", "fd_sessions",
            "dataplane_connections", "lane_connections")
    for name in ("master", "client1", "client2"):
        keys = [name + "_" + h for h in held if name + "_" + h in rep["final"]]
        print("%s held, idle before the engines -> most during the run -> at the end: %s" % (
            name, ", ".join("%s %g -> %g -> %g" % (
                k[len(name) + 1:], rep["idle"].get(k, float("nan")),
                max(s.get(k, 0) for s in rep["samples"]), rep["final"][k]) for k in keys)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "report": rep}, f)
    print("workdir %s" % workdir)


if __name__ == "__main__":
    main()
