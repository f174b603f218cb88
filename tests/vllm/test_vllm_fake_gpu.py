"""The connector's GPU path end to end, on a machine without a GPU: real vLLM engines (CPU
build) whose KV tensors are registered as GPU buffers (kv_connector_extra_config fake_gpu) with
mc-client-fakegpu -- mc-client built on the fake CUDA device of tests/fakes/shm_fake_cuda.h,
where "device memory" is the engine's shared memory and device copies and XXH3 hashes run on
the CPU. Everything else is the production code: the connector's GPU registration, its
ordering events (no-ops off a GPU) and layout probe; the daemon's GPU buffer registry, the
staged gets into GPU buffers with a device hash per slice, GPU put sources hashed on the
"device", block layouts mixing a host header with GPU runs.

  A-gpu   cold generate of every prompt (saves from "GPU" KV), then the same prompts again
  B-gpu   a fresh engine: each prompt alone, every loadable block loaded into "GPU" KV; its
          loaded bytes must equal A's and its outputs A's warm outputs
  C-host  a fresh engine on the host path against the same daemon: the blocks A saved from
          GPU memory load byte-equal into host KV (one object format for both)
  D-lies  a fresh GPU engine on the second daemon, whose fake device flips a byte in every
          CORRUPT_EVERY-th copy it reports done: each such block fails its device hash and is
          recomputed by vLLM; every block that loads is byte-equal to A's, and the outputs
          are A's

The real-GPU counterpart is bench/gpu_check.sh (docs/gpu.md).
"""

import os

import pytest

from test_vllm_e2e import (  # noqa: F401  (fixtures)
    NAMES, PROMPTS, by_request, env, kv_of, loadable_blocks, models, prompts_file, run_engine,
    workdir)

GPU_BUFFER_ID_BIT = 1 << 63
CORRUPT_EVERY = 11   # a block is ~4 device copies (2 layers, K and V): some blocks fail, most load


@pytest.fixture(scope="module")
def cluster(env, workdir):
    from client_cluster import Cluster
    c = Cluster(clients=2, segment_size=256 << 20, client_binary="tests/fakes/mc-client-fakegpu",
                client_args=["--cuda_device", "0"],
                per_client_env={1: {"MC_FAKE_GPU_CORRUPT_EVERY_NTH_COPY": str(CORRUPT_EVERY)}})
    c.start()
    yield c
    c.stop()


def address(cluster, i=0):
    return "unix:" + cluster.clients[i].ready["unix_socket"]


@pytest.fixture(scope="module")
def engine_a(env, workdir, models, cluster, prompts_file):
    return run_engine(env, workdir, "A-gpu", models["a"], address(cluster), prompts_file,
                      "cold,warm", "--fake-gpu")


@pytest.fixture(scope="module")
def engine_b(env, workdir, models, cluster, prompts_file, engine_a):
    return run_engine(env, workdir, "B-gpu", models["a"], address(cluster), prompts_file,
                      "each", "--fake-gpu")


def test_kv_registered_as_gpu_buffers(engine_a, engine_b):
    for res in (engine_a, engine_b):
        assert res["kv_device"] == "fake-gpu"
        ids = res["gpu_buffer_ids"]
        assert ids and all(i & GPU_BUFFER_ID_BIT for i in ids), ids


def test_a_saves_every_block_from_gpu_memory(engine_a):
    cold = engine_a["phases"]["cold"]["worker"]
    assert cold.get("save_error_blocks", 0) == 0
    full = sum(len(PROMPTS[n]) // 32 for n in NAMES)
    assert cold["save_blocks"] + cold.get("save_existing_blocks", 0) >= full - 4
    assert cold["save_blocks"] > 0


def test_b_loads_every_block_into_gpu_memory_byte_equal(engine_a, engine_b):
    each = engine_b["phases"]["each"]
    loads = by_request(engine_b, "each", "loaded")
    for i, n in enumerate(NAMES):
        assert len(loads[i]) == loadable_blocks(len(PROMPTS[n])), (n, loads[i])
    assert each["worker"].get("load_error_blocks", 0) == 0
    compared = 0
    for _req, _block, h in each["loaded"]:
        assert kv_of(engine_b, "each", h) == kv_of(engine_a, "cold", h), h
        compared += 1
    assert compared == each["worker"]["load_blocks"] > 0
    assert each["outputs"] == engine_a["phases"]["warm"]["outputs"]


def test_gpu_saved_blocks_load_into_host_kv(env, workdir, models, cluster, prompts_file,
                                            engine_a, engine_b):
    res = run_engine(env, workdir, "C-host", models["a"], address(cluster), prompts_file, "each")
    assert res["kv_device"] == "host" and not res["gpu_buffer_ids"]
    each = res["phases"]["each"]
    assert each["worker"].get("load_error_blocks", 0) == 0
    assert each["worker"]["load_blocks"] == sum(loadable_blocks(len(PROMPTS[n])) for n in NAMES)
    for _req, _block, h in each["loaded"]:
        assert kv_of(res, "each", h) == kv_of(engine_a, "cold", h), h
    assert each["outputs"] == engine_a["phases"]["warm"]["outputs"]



def test_lying_device_copies_are_caught_and_recomputed(env, workdir, models, cluster,
                                                       prompts_file, engine_a, engine_b):
    from client_cluster import metric
    http = cluster.clients[1].ready["http"]
    before = metric(http, "mc_client_checksum_mismatches_total")
    res = run_engine(env, workdir, "D-lies", models["a"], address(cluster, 1), prompts_file,
                     "each", "--fake-gpu")
    caught = metric(http, "mc_client_checksum_mismatches_total") - before
    each = res["phases"]["each"]
    w = each["worker"]
    print("D-lies: %d blocks loaded, %d load errors, %d checksum mismatches counted by the "
          "daemon" % (w.get("load_blocks", 0), w.get("load_error_blocks", 0), caught))
    assert caught > 0                             # the daemon's device hashes caught them ...
    assert w.get("load_error_blocks", 0) > 0      # ... the connector saw the failures ...
    assert w.get("load_blocks", 0) > 0            # ... and the other blocks loaded
    for _req, _block, h in each["loaded"]:
        assert kv_of(res, "each", h) == kv_of(engine_a, "cold", h), h
    assert each["outputs"] == engine_a["phases"]["warm"]["outputs"]
