"""End to end: real vLLM engines (CPU build) saving and loading KV through real mcstore daemons.

One loopback cluster (mc-master + one mc-client with a Unix socket) for the module; every engine
is a fresh process (engine_run.py), as a second server would be:

  A       cold generate of every prompt (saves through mcstore), then the same prompts again
          (vLLM's local prefix cache: the reference outputs for B)
  B       a fresh engine, empty local cache: each prompt alone; it must load every loadable
          block (all full prompt blocks that leave the last prompt token to compute) from
          mcstore, the loaded paged KV bytes must equal A's, and its outputs A's warm outputs
  model2  other weights, same prompts: never hits A's blocks
  kill    mc-client SIGKILLed before B's second load: every request completes with A's tokens
  fault   one loaded block flipped after the get (fault injection): the comparisons must fail

Prompts cover lengths bs*k-1, bs*k, bs*k+1, a shared prefix, and a divergence inside a block.
"""

import json
import os
import random
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BS = 32
ENGINE_TIMEOUT_S = 600


def _prompts():
    rng = random.Random(12)
    tok = lambda n: [rng.randrange(3, 2000) for _ in range(n)]  # noqa: E731
    shared = tok(2 * BS)
    tail = tok(40)
    prompts = {
        "bs-1": tok(BS - 1),
        "bs": tok(BS),
        "bs+1": tok(BS + 1),
        "3bs-1": tok(3 * BS - 1),
        "3bs": tok(3 * BS),
        "3bs+1": tok(3 * BS + 1),
        "shared-a": shared + tail,
        "shared-b": shared + tok(40),
        # Same first 2 blocks and 10 tokens of the third, then different: diverges in block 2.
        "diverge": shared + tail[:10] + tok(30),
        "long": tok(10 * BS + 7),
    }
    return prompts


PROMPTS = _prompts()
NAMES = list(PROMPTS)


def loadable_blocks(n):
    """Blocks the connector may load: full prompt blocks that leave >= 1 token to compute."""
    return min(n // BS, (n - 1) // BS)


@pytest.fixture(scope="module")
def env():
    e = dict(os.environ)
    extra = subprocess.run([os.path.join(ROOT, "deploy", "python-venv.sh"), "env"],
                           capture_output=True, text=True, check=True).stdout.strip()
    k, _, v = extra.partition("=")
    if v:
        e[k] = v
    build = os.environ.get("MC_BUILD_DIR", os.path.join(ROOT, "build"))
    e["MC_BUILD_DIR"] = build
    e["PYTHONPATH"] = os.path.join(ROOT, "tests")  # mcstore: the venv's installed package
    e["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    e["OMP_NUM_THREADS"] = e.get("OMP_NUM_THREADS", "2")
    os.environ["MC_BUILD_DIR"] = build
    return e


@pytest.fixture(scope="module")
def workdir():
    d = tempfile.mkdtemp(prefix="mc-vllm-e2e-")
    yield d
    if os.environ.get("MC_KEEP_TEST_DIR"):
        print("kept %s" % d)
    else:
        subprocess.run(["rm", "-rf", d])


@pytest.fixture(scope="module")
def models(env, workdir):
    out = {}
    for name, seed in (("a", 0), ("b", 1)):
        path = os.path.join(workdir, "model-" + name)
        subprocess.run([sys.executable, os.path.join(HERE, "tiny_model.py"), path,
                        "--seed", str(seed)], env=env, check=True, timeout=300)
        out[name] = path
    return out


@pytest.fixture(scope="module")
def cluster(env, workdir):
    from client_cluster import Cluster
    c = Cluster(clients=1, segment_size=256 << 20)
    c.start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def prompts_file(workdir):
    path = os.path.join(workdir, "prompts.json")
    with open(path, "w") as f:
        json.dump([PROMPTS[n] for n in NAMES], f)
    return path


def run_engine(env, workdir, name, model, address, prompts_file, phases, *extra):
    out = os.path.join(workdir, name + ".json")
    dump = os.path.join(workdir, name + "-kv")
    log = os.path.join(workdir, name + ".log")
    cmd = [sys.executable, os.path.join(HERE, "engine_run.py"), "--model", model,
           "--address", address, "--prompts", prompts_file, "--out", out, "--phases", phases,
           "--block-size", str(BS), "--dump", dump] + list(extra)
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                           timeout=ENGINE_TIMEOUT_S)
    if p.returncode != 0:
        with open(log) as f:
            raise AssertionError("engine %s failed (%d):\n%s" % (name, p.returncode, f.read()[-6000:]))
    with open(out) as f:
        res = json.load(f)
    res["dump"] = dump
    res["log"] = log
    return res


def address(cluster, i=0):
    return "unix:" + cluster.clients[i].ready["unix_socket"]


@pytest.fixture(scope="module")
def engine_a(env, workdir, models, cluster, prompts_file):
    # A also publishes vLLM's KV events (ZMQ on loopback) and records what a subscriber got.
    return run_engine(env, workdir, "A", models["a"], address(cluster), prompts_file, "cold,warm",
                      "--kv-events-port", str(free_port()))


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine_b(env, workdir, models, cluster, prompts_file, engine_a):
    # Phase each-corrupt (after the clean phase) flips one loaded block: the fault test's input.
    return run_engine(env, workdir, "B", models["a"], address(cluster), prompts_file,
                      "each,partial,each-corrupt", "--corrupt-nth-load", "3",
                      # MC_TEST_CORRUPT_PHASE=each proves the suite fails on one wrong block.
                      "--corrupt-phase", os.environ.get("MC_TEST_CORRUPT_PHASE", "each-corrupt"))


def kv_of(res, phase, block_hash):
    with open(os.path.join(res["dump"], "%s.%s.bin" % (phase, block_hash)), "rb") as f:
        return f.read()


def by_request(res, phase, what):
    """[per prompt: [block hashes]] of the loads/saves of a phase, in order."""
    return res["phases"][phase][what + "_by_prompt"]


def test_a_saves_every_full_prompt_block_once(engine_a):
    cold = engine_a["phases"]["cold"]
    assert engine_a["block_size"] == BS
    saved = [h for _r, _b, h in cold["saved"]]
    assert len(saved) == len(set(saved)), "a block was stored twice"
    w = cold["worker"]
    assert w.get("save_error_blocks", 0) == 0
    # Every full prompt block of every prompt is in the store (saved here or already there).
    full = sum(len(PROMPTS[n]) // BS for n in NAMES)
    shared_dups = 2 + 2  # shared-b and diverge reuse shared-a's first two blocks
    assert w["save_blocks"] + w.get("save_existing_blocks", 0) >= full - shared_dups
    assert w["save_blocks"] == len(set(saved))
    # The worker told the scheduler side which blocks were stored (what BlockStored rides on);
    # the last saves' report may land in a later step, hence only a lower bound.
    reported = cold["sched"].get("stored_blocks_reported", 0)
    assert 0 < reported <= w["save_blocks"] + w.get("save_existing_blocks", 0)


def test_block_stored_events_reach_vllms_publisher(engine_a):
    """The connector's BlockStored events travel vLLM's own KV event stream (what a KV-aware
    router subscribes to): one per reported block, medium MCSTORE, each naming a block this
    engine saved, next to vLLM's own events."""
    cold = engine_a["phases"]["cold"]
    ev = cold["events"]
    print("KV events on vLLM's publisher (cold phase): %s" % ev)
    assert ev["mcstore_stored"] == cold["sched"]["stored_blocks_reported"] > 0
    assert ev["mcstore_stored_distinct"] == ev["mcstore_stored"]
    assert ev["mcstore_stored_not_saved"] == 0
    assert ev["other_events"] > 0  # vLLM's own (GPU medium) events share the stream


def test_b_loads_every_loadable_block_from_mcstore(engine_a, engine_b):
    each = engine_b["phases"]["each"]
    loads = by_request(engine_b, "each", "loaded")
    for i, n in enumerate(NAMES):
        assert len(loads[i]) == loadable_blocks(len(PROMPTS[n])), (n, loads[i])
    assert each["worker"].get("load_error_blocks", 0) == 0
    assert each["worker"]["load_blocks"] == sum(loadable_blocks(len(PROMPTS[n])) for n in NAMES)


def test_b_loaded_kv_is_byte_equal_to_a(engine_a, engine_b):
    compared = 0
    for _req, _block, h in engine_b["phases"]["each"]["loaded"]:
        assert kv_of(engine_b, "each", h) == kv_of(engine_a, "cold", h), h
        compared += 1
    assert compared > 0


def test_b_outputs_equal_a_with_local_prefix_cache(engine_a, engine_b):
    warm = engine_a["phases"]["warm"]["outputs"]
    assert engine_b["phases"]["each"]["outputs"] == warm
    # Cold vs warm may differ only where the top-2 logprobs nearly tie.
    cold = engine_a["phases"]["cold"]
    for i, (c, w) in enumerate(zip(cold["outputs"], warm)):
        if c != w:
            assert cold["margins"][i] is not None and cold["margins"][i] < 1e-3, NAMES[i]


def test_shared_prefix_shares_blocks(engine_b):
    loads = by_request(engine_b, "each", "loaded")
    a, b, d = NAMES.index("shared-a"), NAMES.index("shared-b"), NAMES.index("diverge")
    assert loads[a][:2] == loads[b][:2] == loads[d][:2]
    # "diverge" shares tokens 64..73 with shared-a's third block, but not the block.
    assert len(loads[d]) == 3 and loads[d][2] != loads[a][2] and loads[d][2] != loads[b][2]


def test_partial_local_hit_loads_the_rest(engine_a, engine_b):
    """Phase partial: shared-b and diverge find their first two blocks in vLLM's local cache
    (from shared-a) and load only their third block from mcstore, at a non-zero offset."""
    part = engine_b["phases"]["partial"]
    loads = by_request(engine_b, "partial", "loaded")
    full = by_request(engine_b, "each", "loaded")
    a, b, d = NAMES.index("shared-a"), NAMES.index("shared-b"), NAMES.index("diverge")
    assert loads[a] == full[a]
    assert loads[b] == full[b][2:] and loads[d] == full[d][2:]
    for _req, _block, h in part["loaded"]:
        assert kv_of(engine_b, "partial", h) == kv_of(engine_a, "cold", h), h
    assert part["outputs"] == engine_a["phases"]["warm"]["outputs"]
    assert part["worker"].get("load_error_blocks", 0) == 0


def test_other_model_never_hits(env, workdir, models, cluster, prompts_file, engine_a):
    """Same prompts (so the same vLLM block hashes), other weights: A's blocks are invisible.
    model2 computes and saves all 25 distinct blocks itself (none answered ALREADY_EXISTS), and
    the only blocks it loads are its own, saved by an earlier prompt of its run (shared-b and
    diverge reuse shared-a's first two blocks), whose bytes differ from A's."""
    res = run_engine(env, workdir, "model2", models["b"], address(cluster), prompts_file, "each")
    each = res["phases"]["each"]
    w = each["worker"]
    assert w["save_blocks"] == engine_a["phases"]["cold"]["worker"]["save_blocks"]
    assert w.get("save_existing_blocks", 0) == 0
    own = {h for _r, _b, h in each["saved"]}
    loaded = [h for _r, _b, h in each["loaded"]]
    assert set(loaded) <= own and len(loaded) == 4
    for h in loaded:
        assert kv_of(res, "each", h) != kv_of(engine_a, "cold", h)


def test_one_wrong_block_is_caught(engine_a, engine_b):
    """The test's own power: in B's each-corrupt phase one loaded block is flipped after its get,
    past the connector's checks, and the byte comparison against A must notice it."""
    loaded = engine_b["phases"]["each-corrupt"]["loaded"]
    assert len(loaded) == engine_b["phases"]["each"]["worker"]["load_blocks"]
    mismatched = [h for _r, _b, h in loaded
                  if kv_of(engine_b, "each-corrupt", h) != kv_of(engine_a, "cold", h)]
    assert len(mismatched) == 1


def test_sync_loads_give_the_same_kv_and_tokens(env, workdir, models, cluster, prompts_file,
                                                engine_a, engine_b):
    """load_async=False: the connector loads inside start_load_kv, before the forward pass,
    instead of overlapping steps. Same loads, same bytes, same tokens as the async engine B."""
    res = run_engine(env, workdir, "B-sync", models["a"], address(cluster), prompts_file, "each",
                     "--load-sync")
    each = res["phases"]["each"]
    loads = by_request(res, "each", "loaded")
    for i, n in enumerate(NAMES):
        assert len(loads[i]) == loadable_blocks(len(PROMPTS[n])), (n, loads[i])
    assert each["worker"].get("load_error_blocks", 0) == 0
    for _req, _block, h in each["loaded"]:
        assert kv_of(res, "each", h) == kv_of(engine_a, "cold", h), h
    assert each["outputs"] == engine_b["phases"]["each"]["outputs"]
    assert each["outputs"] == engine_a["phases"]["warm"]["outputs"]


def test_no_lease_outlives_the_engines(cluster, engine_a, engine_b):
    """Every MatchPrefix lease the engines' schedulers took was released by their workers (with
    the lease's capability), so nothing stays pinned once the engines are gone."""
    from test_vllm_faults import leases_back_to_zero
    leases_back_to_zero(cluster)
    for res in (engine_a, engine_b):
        for name, ph in res["phases"].items():
            assert ph["worker"].get("lease_release_failures", 0) == 0, name
            assert ph["sched"].get("lease_release_failures", 0) == 0, name


def test_client_killed_during_loads_still_right_tokens(env, workdir, models, cluster,
                                                       prompts_file, engine_a, engine_b):
    """Last in the module: it kills the module's mc-client before B2's third load job. B2 runs
    with vLLM's local prefix cache off and every prompt in one batch (loads of several requests
    in flight together); the blocks it did load must still equal A's."""
    pid = cluster.clients[0].proc.pid
    res = run_engine(env, workdir, "B2-kill", models["a"], address(cluster), prompts_file,
                     "cold", "--no-prefix-cache", "--kill-pid", str(pid), "--kill-at-load", "3",
                     "--remove-at-load", "1", "--corrupt-header-nth-load", "1")
    each = res["phases"]["cold"]
    # Between the first job's lookup and its get, another client tried to remove its keys: the
    # MatchPrefix lease protects them (HAS_LEASE), and the load then succeeded.
    removes = [f for f in res["fault_log"] if f[0] == "remove"]
    (_what, _job, codes), = removes
    assert codes and set(codes) == {"HAS_LEASE"}, codes
    # The first loaded block's stored header was altered after the get (a hash collision or a
    # torn object looks like that): the connector must report it as a load error, not use it.
    assert [f for f in res["fault_log"] if f[0] == "header"]
    assert each["worker"].get("load_header_mismatch_blocks", 0) == 1
    for _req, _block, h in each["loaded"]:
        assert kv_of(res, "cold", h) == kv_of(engine_a, "cold", h), h
    assert each["outputs"] == engine_a["phases"]["warm"]["outputs"]
    assert each["worker"].get("load_error_blocks", 0) > 1    # the header, then the dead daemon
    assert each["worker"].get("load_blocks", 0) > 0          # the second job worked
    # The blocks that failed with the daemon gone were not looked up again for their requests
    # (nor while the worker reported the store down): lookups stay bounded by the requests.
    assert each["sched"].get("lookups", 0) <= 2 * len(NAMES), each["sched"]
