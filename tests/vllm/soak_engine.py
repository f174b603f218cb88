"""One vLLM engine (CPU build) serving a stream of requests through mcstore, for the serving soak
(soak.py: tests/vllm/test_vllm_soak.py and bench/vllm_soak.py).

    python soak_engine.py --model DIR --address unix:SOCK --prompts FILE --order-seed N
        --stats FILE --out FILE --stop FILE [--no-connector] [--passes N]

Requests are the prompts of FILE (a JSON list of token-id lists) in an order drawn from
--order-seed, one or two at a time, until the file --stop exists (or --passes passes ended, for a
reference engine). Every few seconds a JSON line goes to --stats: time, requests, requests that
loaded blocks, the connector's scheduler and worker counters, request latencies with and without
a hit. At the end --out gets, per prompt index, every distinct output seen.
"""

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import engine_run  # noqa: E402  (the environment set-up and make_llm)

STATS_EVERY_S = 5.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--address", default="")
    ap.add_argument("--namespace", default="soak")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--order-seed", type=int, default=0)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--stop", default="")
    ap.add_argument("--passes", type=int, default=0,
                    help="stop after this many passes over the prompts (0: until --stop)")
    ap.add_argument("--no-connector", action="store_true")
    ap.add_argument("--num-blocks", type=int, default=96)
    ap.add_argument("--max-tokens", type=int, default=4)
    args = ap.parse_args()

    with open(args.prompts) as f:
        prompts = json.load(f)
    ns = argparse.Namespace(
        model=args.model, address=args.address, namespace=args.namespace, load_sync=False,
        fake_gpu=False, block_size=32, max_model_len=1024, no_prefix_cache=False, max_num_seqs=4,
        max_num_batched_tokens=4096, num_blocks=args.num_blocks, tp=1,
        no_connector=args.no_connector, kv_role="kv_both", kv_events_port=0)
    llm = engine_run.make_llm(ns)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    conn = None if args.no_connector else engine_run.worker_connector()
    sconn = None if args.no_connector else engine_run.scheduler_connector(llm)
    outputs = {}
    rng = random.Random(args.order_seed)
    order = []
    t0 = time.monotonic()
    last_stats = t0
    done = hits = 0
    lat_hit, lat_miss = [], []
    passes = 0
    stats = open(args.stats, "a")

    def flush_stats(final=False):
        nonlocal lat_hit, lat_miss
        # "mono" is CLOCK_MONOTONIC, one clock for every process of the machine: the driver
        # places these lines on its own time axis with it (its faults, its samples).
        now = time.monotonic()
        line = {"t": round(now - t0, 3), "mono": now, "requests": done, "hits": hits,
                "lat_hit": lat_hit, "lat_miss": lat_miss, "final": final}
        if conn is not None:
            line["worker"] = dict(conn.totals)
            line["sched"] = dict(sconn.totals) if sconn is not None else {}
        stats.write(json.dumps(line) + "\n")
        stats.flush()
        lat_hit, lat_miss = [], []

    flush_stats()   # the first line says the engine is up: the driver starts its clock then
    while True:
        if args.stop and os.path.exists(args.stop):
            break
        if not order:
            if args.passes and passes >= args.passes:
                break
            order = list(range(len(prompts)))
            rng.shuffle(order)
            passes += 1
        i = order.pop()
        loaded_before = len(conn._worker.loaded_log) if conn is not None else 0
        t1 = time.monotonic()
        out = llm.generate([TokensPrompt(prompt_token_ids=prompts[i])], sp, use_tqdm=False)[0]
        took = time.monotonic() - t1
        toks = list(out.outputs[0].token_ids)
        seen = outputs.setdefault(i, [])
        if toks not in seen:
            seen.append(toks)
        done += 1
        loaded = conn is not None and len(conn._worker.loaded_log) > loaded_before
        if loaded:
            hits += 1
            lat_hit.append(round(took, 4))
        else:
            lat_miss.append(round(took, 4))
        if time.monotonic() - last_stats >= STATS_EVERY_S:
            last_stats = time.monotonic()
            flush_stats()
    if conn is not None:
        engine_run.drain(conn)
    flush_stats(final=True)
    with open(args.out, "w") as f:
        json.dump({str(k): v for k, v in outputs.items()}, f)
    stats.close()
    if conn is not None:
        conn.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
