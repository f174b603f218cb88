"""Runs one real vLLM engine (CPU) with MCStoreConnector in this process and writes what happened.

Used by the end-to-end tests (each engine is a fresh process, as a second server would be) and by
bench/vllm_ttft.py. Phases run in order in the same engine:
  cold     generate every prompt in one call (saves through mcstore)
  warm     generate them again: vLLM's own local prefix cache hits (the reference for B)
  each     one generate call per prompt, vLLM's local prefix cache reset before each one, so
           every loadable block must come from mcstore
  each-corrupt  the same, with --corrupt-nth-load armed (fault injection) during this phase only
  partial  one generate call per prompt, the local prefix cache reset once at the start: a prompt
           sharing a prefix with an earlier one has part of it locally and loads the rest
Per phase: greedy output token ids, the connector's counters (worker and scheduler side), the
blocks it loaded / saved (request, block hash), and optionally the KV bytes of those blocks as
they sit in vLLM's paged KV tensors right after the phase (--dump DIR).

    python engine_run.py --model DIR --address unix:/x.sock --prompts p.json --out o.json \
        --phases cold,warm [--dump DIR] [--corrupt-nth-load N] [--kill-pid PID --kill-at-load N]
"""

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
# The in-process executor skips the OpenMP set-up vLLM's supported multiprocess path makes for its
# CPU workers (vllm/utils/ompmultiprocessing.py sets these two with Intel OpenMP). Without it an
# OpenMP worker spins for Intel's default 200 ms after every forward: on a 2-core machine it holds
# a core through the connector's next load, which then shares one core with the daemon's copy
# (measured: 4.0-4.5 ms per load instead of 2.7; docs/vllm.md "Tuning").
os.environ.setdefault("KMP_BLOCKTIME", "5")
os.environ.setdefault("KMP_TPAUSE", "0")


def make_llm(args):
    from vllm import LLM
    from vllm.config import KVTransferConfig
    extra = {"address": args.address, "namespace": args.namespace,
             "load_async": not args.load_sync, "record_blocks": True,
             "fake_gpu": args.fake_gpu}
    ktc = KVTransferConfig(kv_connector="MCStoreConnector",
                           kv_connector_module_path="mcstore.vllm", kv_role=args.kv_role,
                           kv_load_failure_policy="recompute",
                           kv_connector_extra_config=extra)
    kwargs = dict(model=args.model, tokenizer=args.model, skip_tokenizer_init=True,
                  dtype="float32", max_model_len=args.max_model_len, block_size=args.block_size,
                  enable_prefix_caching=not args.no_prefix_cache, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.max_num_batched_tokens, seed=0,
                  num_gpu_blocks_override=args.num_blocks, enforce_eager=True)
    if args.tp > 1:
        # Workers in their own processes: the connector's worker side is not in this one
        # (only the scheduler side's counters are read here).
        kwargs.update(tensor_parallel_size=args.tp, distributed_executor_backend="mp")
    if not args.no_connector:
        kwargs["kv_transfer_config"] = ktc
    if getattr(args, "log_stats", False):
        kwargs["disable_log_stats"] = False
    with open(os.path.join(args.model, "config.json")) as f:
        mla = "kv_lora_rank" in json.load(f)
    if mla:
        # On a CPU with AMX vLLM picks its AMX MLA backend, which needs bf16/fp16 weights (these
        # are float32): the reference CPU MLA backend runs everywhere.
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        kwargs["attention_config"] = {"backend": AttentionBackendEnum.CPU_MLA}
    if args.kv_events_port:
        from vllm.config import KVEventsConfig
        kwargs["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq",
            endpoint="tcp://127.0.0.1:%d" % args.kv_events_port, topic="kv")
    return LLM(**kwargs)


class EventSubscriber:
    """Collects what vLLM's own KV event publisher sends (ZMQ PUB: topic, sequence, msgpack of
    a KVEventBatch) on a thread: the events a router consuming vLLM's stream would see."""

    def __init__(self, port):
        import threading
        import zmq
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, 100)
        # vLLM's PUB binds only wildcard endpoints and connects to others: the subscriber binds
        # loopback and the engine connects to it (as a router collecting from engines would).
        self.sock.bind("tcp://127.0.0.1:%d" % port)
        self.events = []  # decoded event dicts, in order
        self.lock = threading.Lock()
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import msgspec
        import zmq
        while not self.stop:
            try:
                _topic, _seq, payload = self.sock.recv_multipart()
            except zmq.Again:
                continue
            batch = msgspec.msgpack.decode(payload)  # [ts, [event, ...], ...] (array_like)
            with self.lock:
                self.events.extend(batch[1])

    def settle(self, quiet_s=0.5, max_s=5.0):
        """Waits until nothing new arrived for quiet_s (at most max_s); returns the count."""
        end = time.monotonic() + max_s
        last, since = -1, time.monotonic()
        while time.monotonic() < end:
            with self.lock:
                n = len(self.events)
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
            time.sleep(0.05)  # the poll interval of the quiet-period check, inside max_s
        return last

    def take(self):
        with self.lock:
            ev, self.events = self.events, []
        return ev


def summarize_events(events, saved_hex):
    """What the publisher carried of the connector's events (medium MCSTORE): stored block
    hashes, how many of them this phase did not save, removed hashes, and vLLM's own events."""
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
    saved = {maybe_convert_block_hash(bytes.fromhex(h)) for h in saved_hex}
    stored, removed, other = [], [], 0
    for e in events:
        if not isinstance(e, dict) or e.get("medium") != "MCSTORE":
            other += 1
        elif e.get("type") == "BlockStored":
            stored += e["block_hashes"]
        elif e.get("type") == "BlockRemoved":
            removed += e["block_hashes"]
    return {"mcstore_stored": len(stored), "mcstore_stored_distinct": len(set(map(repr, stored))),
            "mcstore_stored_not_saved": sum(1 for h in stored if h not in saved),
            "mcstore_removed": len(removed), "other_events": other}


def wait_for_go(pause_dir, n, state):
    """Tells the test the engine is idle before phase n (writing `state`, JSON, first) and waits
    for its go (bounded)."""
    with open(os.path.join(pause_dir, "state-%d.json" % n), "w") as f:
        json.dump(state, f)
    open(os.path.join(pause_dir, "ready-%d" % n), "w").close()
    go = os.path.join(pause_dir, "go-%d" % n)
    deadline = time.monotonic() + 600
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise SystemExit("no go for phase %d within 600 s" % n)
        time.sleep(0.05)   # a file poll, bounded by the deadline above


def worker_connector():
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group
    return get_kv_transfer_group() if has_kv_transfer_group() else None


def scheduler_connector(llm):
    core = llm.llm_engine.engine_core
    for path in ("engine_core.scheduler.connector", "scheduler.connector"):
        obj = core
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    return None


def block_bytes(conn, block_id):
    """The bytes of one block as the connector stores them (all layers, in its slice order)."""
    import ctypes
    w = conn._worker
    out = []
    for idx, off, n in w.mem._runs_unregistered(block_id):
        base = w.mem.storages[idx][0]
        out.append(ctypes.string_at(base + off, n))
    return b"".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--address", default="")
    ap.add_argument("--namespace", default="test")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--phases", default="cold")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--num-blocks", type=int, default=512)
    ap.add_argument("--no-prefix-cache", action="store_true")
    ap.add_argument("--no-connector", action="store_true")
    ap.add_argument("--load-sync", action="store_true")
    ap.add_argument("--fake-gpu", action="store_true",
                    help="the connector's GPU path on host KV (needs mc-client-fakegpu)")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor parallel size (>1: worker processes; set "
                         "VLLM_CPU_OMP_THREADS_BIND, e.g. '0|1', on a one-NUMA-node machine)")
    ap.add_argument("--kv-events-port", type=int, default=0,
                    help="publish vLLM's KV events on tcp://127.0.0.1:PORT and record, per "
                         "phase, what a subscriber received of the connector's")
    ap.add_argument("--dump", default="")
    ap.add_argument("--log-stats", action="store_true",
                    help="vLLM's stats on: the output gets the connector's counters as "
                         "LLM.get_metrics() reports them (vllm:mcstore_*)")
    ap.add_argument("--kv-role", default="kv_both",
                    choices=("kv_both", "kv_producer", "kv_consumer"))
    ap.add_argument("--pause-dir", default="",
                    help="before each phase after the first, create DIR/ready-N and wait (at "
                         "most 600 s) for DIR/go-N: the test restarts daemons in between")
    ap.add_argument("--corrupt-nth-load", type=int, default=0,
                    help="fault injection: flip bytes of the Nth block loaded (1-based) after "
                         "its get, before the connector's checks")
    ap.add_argument("--corrupt-header-nth-load", type=int, default=0,
                    help="fault injection: flip a byte of the Nth loaded block's stored header "
                         "(as a hash collision or a torn object would look) before the checks")
    ap.add_argument("--corrupt-phase", default="each-corrupt",
                    help="the phase during which --corrupt-nth-load is armed")
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--kill-at-load", type=int, default=0,
                    help="SIGKILL --kill-pid just before the Nth load job's get")
    ap.add_argument("--remove-at-load", type=int, default=0,
                    help="try to remove the Nth load job's keys (another client) between its "
                         "lookup and its get; the codes go to the output's fault_log")
    args = ap.parse_args()

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    with open(args.prompts) as f:
        prompts = json.load(f)
    subscriber = EventSubscriber(args.kv_events_port) if args.kv_events_port else None
    t0 = time.perf_counter()
    llm = make_llm(args)
    startup_s = time.perf_counter() - t0
    conn = None if args.no_connector else worker_connector()
    sconn = None if args.no_connector else scheduler_connector(llm)
    if conn is not None:
        install_faults(conn, args)
        if args.dump:
            install_capture(conn, lambda _what, hx, data: CAPTURED.__setitem__(hx, data))
    elif args.tp > 1 and args.dump and not args.no_connector:
        llm.collective_rpc(_rank_install_capture)
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True,
                        logprobs=2)
    result = {"block_size": llm.llm_engine.vllm_config.cache_config.block_size,
              "startup_s": startup_s, "phases": {},
              "kv_device": conn._worker.mem.device if conn else None,
              "gpu_buffer_ids": [g.buffer_id for g in conn._worker.gpu_buffers] if conn else []}
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
    for n, phase in enumerate(args.phases.split(",")):
        if args.pause_dir and n > 0:
            print("phase %d (%s) waits for its go at %.3f" % (n, phase, time.time()), flush=True)
            wait_for_go(args.pause_dir, n, {
                "key_prefix": conn._worker.prefix.decode() if conn else "",
                "phases": result["phases"]})
        if args.pause_dir:
            print("phase %d (%s) starts at %.3f" % (n, phase, time.time()), flush=True)
        w0 = len(conn._worker.loaded_log) if conn else 0
        s0 = len(conn._worker.saved_log) if conn else 0
        l0 = len(conn._worker.load_times) if conn else 0
        before = conn.totals if conn else {}
        sbefore = sconn.totals if sconn else {}
        t0 = time.perf_counter()
        outs = []
        if phase in ("cold", "warm"):
            res = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp,
                               use_tqdm=False)
            outs = res
            times = []
        elif phase in ("each", "each-corrupt", "partial"):
            ARMED["corrupt"] = phase == args.corrupt_phase
            times = []
            reset_local_cache(llm)
            for p in prompts:
                if phase != "partial":
                    reset_local_cache(llm)
                t1 = time.perf_counter()
                outs += llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)
                times.append(time.perf_counter() - t1)
                if conn is not None:
                    drain(conn)
        else:
            raise SystemExit("unknown phase %s" % phase)
        ARMED["corrupt"] = False
        wall = time.perf_counter() - t0
        if conn is not None:
            drain(conn)
        ph = {"wall_s": wall, "times_s": times,
              "outputs": [list(o.outputs[0].token_ids) for o in outs],
              "margins": [min_margin(o) for o in outs],
              "req_ids": [o.request_id for o in outs]}
        if sconn is not None:
            ph["sched"] = {k: v - sbefore.get(k, 0) for k, v in sconn.totals.items()}
        if conn is not None:
            after = conn.totals
            ph["worker"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            ph["loaded"] = [[r, b, h.hex()] for r, b, h in conn._worker.loaded_log[w0:]]
            ph["saved"] = [[r, b, h.hex()] for r, b, h in conn._worker.saved_log[s0:]]
            ph["load_times_s"] = conn._worker.load_times[l0:]
            # Per prompt, in order (the engine core's request ids extend the output's).
            ids = [o.request_id for o in outs]
            for what in ("loaded", "saved"):
                per = [[] for _ in ids]
                for r, _b, h in ph[what]:
                    for i, rid in enumerate(ids):
                        if r == rid or r.startswith(rid + "-"):
                            per[i].append(h)
                            break
                    else:
                        raise SystemExit("%s block of unknown request %s" % (what, r))
                ph[what + "_by_prompt"] = per
            if subscriber is not None:
                subscriber.settle()
                ph["events"] = summarize_events(subscriber.take(),
                                                [h for _r, _b, h in ph["saved"]])
            if args.dump:
                for hx, data in CAPTURED.items():
                    with open(os.path.join(args.dump, "%s.%s.bin" % (phase, hx)), "wb") as f:
                        f.write(data)
        CAPTURED.clear()
        if conn is None and args.tp > 1 and args.dump and not args.no_connector:
            # Per rank: <phase>.<load|save>.<hash>.r<rank>.bin
            for rank, got in llm.collective_rpc(_rank_take_captured):
                for (what, hx), data in got.items():
                    name = "%s.%s.%s.r%d.bin" % (phase, what, hx, rank)
                    with open(os.path.join(args.dump, name), "wb") as f:
                        f.write(data)
        result["phases"]["%s#%d" % (phase, n) if args.pause_dir else phase] = ph
    result["fault_log"] = FAULT_LOG
    if args.log_stats:
        result["vllm_metrics"] = {m.name: getattr(m, "value", None) for m in llm.get_metrics()
                                  if m.name.startswith("vllm:mcstore")}
    with open(args.out, "w") as f:
        json.dump(result, f)
    if conn is not None:
        conn.shutdown()
    # Intel OpenMP (LD_PRELOADed) registers itself in /dev/shm and unregisters at a normal exit,
    # which os._exit skips.
    import glob
    for path in glob.glob("/dev/shm/__KMP_REGISTERED_LIB_%d_*" % os.getpid()):
        try:
            os.unlink(path)
        except OSError:
            pass
    os._exit(0)  # vLLM's teardown on CPU is slow and not what is tested


def reset_local_cache(llm):
    """Empties vLLM's local prefix cache. A request whose saves were in flight when it finished
    keeps its blocks until a later engine step carries its finish to the worker, so step the
    idle engine until the reset succeeds."""
    for _ in range(200):
        if llm.reset_prefix_cache():
            return
        llm.llm_engine.step()
        time.sleep(0.005)  # between engine steps, 200 at most
    raise SystemExit("vLLM's local prefix cache could not be reset")


def min_margin(out):
    """Smallest gap between the chosen token's logprob and the runner-up's over the output."""
    best = None
    for lp in out.outputs[0].logprobs or []:
        vals = sorted((v.logprob for v in lp.values()), reverse=True)
        if len(vals) >= 2:
            gap = vals[0] - vals[1]
            best = gap if best is None else min(best, gap)
    return best


def drain(conn):
    """Waits until the connector has no load or save in flight and counts their results."""
    w = conn._worker
    w.drain_saves()
    w.finished(set())


ARMED = {"corrupt": False}
CAPTURED = {}   # block hash hex -> KV bytes of the current phase, taken when loaded / saved


def install_capture(conn, record):
    """Calls record(what, block hash hex, KV bytes) for each block the moment it was loaded
    ("load", after the connector's checks, before vLLM runs on it) or is handed to the saves
    ("save", whether or not this rank saves: MLA ranks other than 0 do not). Later the block may
    be freed and reused by another request."""
    w = conn._worker
    load, start_saves = w._load, w.start_saves

    def load_and_capture(job, *rest):
        out = load(job, *rest)
        for r in job.blocks:
            if r.block_id not in out[0]:
                record("load", r.block_hash.hex(), block_bytes(conn, r.block_id))
        return out

    def capture_and_start_saves(meta):
        for job in meta.saves or ():
            for r in job.blocks:
                record("save", r.block_hash.hex(), block_bytes(conn, r.block_id))
        return start_saves(meta)
    w._load, w.start_saves = load_and_capture, capture_and_start_saves


def _rank_install_capture(_worker):
    """Runs in each TP rank process (LLM.collective_rpc): install_capture into a dict kept on the
    worker connector, which persists in that process, keyed (what, block hash hex)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    conn = get_kv_transfer_group()
    conn._worker.mc_captured = {}
    install_capture(conn, lambda what, hx, data: conn._worker.mc_captured.__setitem__(
        (what, hx), data))


def _rank_take_captured(_worker):
    """Runs in each TP rank: (rank, the blocks captured since the last call), then forgets them."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    w = get_kv_transfer_group()._worker
    got, w.mc_captured = w.mc_captured, {}
    return get_tensor_model_parallel_rank(), got   # w.rank is 0 on every MLA rank


FAULT_LOG = []


def install_faults(conn, args):
    w = conn._worker
    if args.corrupt_nth_load:
        count = {"n": 0}

        def corrupt(worker, block_id):
            if not ARMED["corrupt"]:
                return
            count["n"] += 1
            if count["n"] == args.corrupt_nth_load:
                import ctypes
                idx, off, n = worker.mem._runs_unregistered(block_id)[0]
                addr = worker.mem.storages[idx][0] + off + n // 2
                buf = (ctypes.c_ubyte * 64).from_address(addr)
                for i in range(64):
                    buf[i] ^= 0x5A
                print("fault: corrupted loaded block %d" % block_id, file=sys.stderr)
        w.fault_hook = corrupt
    if args.corrupt_header_nth_load:
        hcount = {"n": 0}

        def corrupt_header(worker, block_id):
            hcount["n"] += 1
            if hcount["n"] == args.corrupt_header_nth_load:
                slot = worker._header_slot(block_id, False)
                view = worker.headers.memoryview(slot + 40, 1)   # inside the block-hash digest
                view[0] ^= 0xFF
                FAULT_LOG.append(["header", block_id])
        w.fault_hook = corrupt_header
    if (args.kill_pid and args.kill_at_load) or args.remove_at_load:
        import threading
        jobs = {"n": 0}
        lock = threading.Lock()
        earlier_done = threading.Event()
        orig = w._load

        def load_then_maybe_kill(job, *rest):
            with lock:
                jobs["n"] += 1
                n = jobs["n"]
            if n == args.remove_at_load:
                from mcstore import Client
                with Client(args.address) as c:
                    res = c.remove([w._key(r.block_hash) for r in job.blocks])
                FAULT_LOG.append(["remove", n, [r.code.name for r in res]])
            if n == args.kill_at_load:
                earlier_done.wait(60)   # every earlier job's get completes first
                os.kill(args.kill_pid, signal.SIGKILL)
                print("fault: killed mc-client %d before load job %d" % (args.kill_pid, n),
                      file=sys.stderr)
            try:
                return orig(job, *rest)
            finally:
                if n < args.kill_at_load:
                    with lock:
                        jobs["done"] = jobs.get("done", 0) + 1
                        if jobs["done"] == args.kill_at_load - 1:
                            earlier_done.set()
        w._load = load_then_maybe_kill


if __name__ == "__main__":
    main()
