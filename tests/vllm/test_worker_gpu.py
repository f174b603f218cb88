"""Unit tests of the worker's GPU pieces (python/mcstore/vllm/worker.py) without a GPU: the
fake_gpu registration (KVMemory's bases, the fake handle), and the ordering of every transfer
after the engine's queued GPU work (a ready event waited on before the get or put). Logic
only; the end-to-end run is test_vllm_fake_gpu.py."""


import pytest
import torch

from mcstore.vllm.connector import LoadJob, SaveJob
from mcstore.vllm.kv_memory import KVMemory, fake_gpu_handle
from test_worker_load import FakeMem, refs, store, worker

NUM_BLOCKS = 4


PAGE = 2 * 64 * 4   # K and V of one block: 64 float32 each


def kv(n_layers=2):
    # Per layer one storage of [2 (K/V), blocks, 64] float32, viewed with the block first (as
    # a K/V-outer layout is): block b's K at b * 256 bytes, its V at (blocks + b) * 256.
    return {"layer.%d" % i: torch.arange(2 * NUM_BLOCKS * 64, dtype=torch.float32).reshape(
        2, NUM_BLOCKS, 64).transpose(0, 1) for i in range(n_layers)}


def test_host_memory_slices_start_at_the_storage_offset_in_its_shm_object():
    caches = kv()
    mem = KVMemory(caches, list(caches), NUM_BLOCKS, PAGE)
    assert mem.device == "host" and not mem.on_gpu
    assert mem.bases == [s.shm_offset for s in mem.storages]
    assert all(s.shm_name and s.shm_size >= s.nbytes for s in mem.storages)
    assert mem.ready_event() is None


def test_fake_gpu_slices_start_at_zero_of_buffers_covering_each_storage():
    caches = kv()
    mem = KVMemory(caches, list(caches), NUM_BLOCKS, PAGE, fake_gpu=True)
    assert mem.device == "fake-gpu" and mem.on_gpu
    assert mem.bases == [0, 0]
    sl = mem.block_slices([7, 9], 1)
    # block 1: K at 1 * 256 bytes, V at (4 + 1) * 256, in each layer's buffer
    assert [(s.buffer_id, s.offset, s.length) for s in sl] == [
        (7, 256, 256), (7, 5 * 256, 256), (9, 256, 256), (9, 5 * 256, 256)]
    assert mem.ready_event() is None   # no CUDA stream to order against
    assert mem.storage_tensor(1).numel() == mem.storages[1].nbytes
    assert mem.storage_tensor(1).data_ptr() == mem.storages[1].ptr


def test_fake_gpu_handle_names_the_shm_object():
    h = fake_gpu_handle("/torch_123_456_0")
    assert len(h) == 64 and h.startswith(b"MCFAKESHM:/torch_123_456_0\0")
    with pytest.raises(ValueError):
        fake_gpu_handle("/" + "x" * 60)


def test_kv_on_two_devices_is_refused():
    caches = kv()
    caches["layer.1"] = caches["layer.1"].to("meta")
    with pytest.raises(ValueError, match="one device"):
        KVMemory(caches, list(caches), NUM_BLOCKS, PAGE)


def test_kv_on_an_unknown_device_is_refused():
    caches = {k: v.to("meta") for k, v in kv().items()}
    with pytest.raises(ValueError, match="host or CUDA"):
        KVMemory(caches, list(caches), NUM_BLOCKS, PAGE)


class Ready:
    """A CUDA event stand-in: records when it was waited on, relative to the client's calls."""

    def __init__(self, trace):
        self.trace = trace

    def synchronize(self):
        self.trace.append("ready")


def test_a_load_waits_for_the_engines_queued_work_before_its_get():
    w = worker()
    trace = []
    get = w.client.get
    w.client.get = lambda *a, **k: (trace.append("get"), get(*a, **k))[1]
    r = refs(2)
    for ref in r:
        store(w, ref)
    failed, st, _ = w._load(LoadJob("req", r, [0]), Ready(trace))
    assert not failed and st["load_blocks"] == 2
    assert trace == ["ready", "get"]
    w.pool.shutdown(wait=True)


def test_a_failing_ready_event_fails_the_load_not_the_engine():
    w = worker()

    class Broken:
        def synchronize(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    r = refs(2)
    failed, st, _ = w._load(LoadJob("req", r, [0]), Broken())
    assert failed == {ref.block_id for ref in r} and st["load_error_blocks"] == 2
    w.pool.shutdown(wait=True)


def test_a_save_waits_for_the_forward_before_its_put():
    w = worker()
    trace = []

    class Client:
        def put(self, keys, values, replicas=None):
            from mcstore import Code, Result
            trace.append("put")
            return [Result(Code.OK, "", k) for k in keys]

    w.client = Client()
    w.cfg["replicas"] = 1
    w.saved_log = []
    w.mem = FakeMem()
    st, stored = w._save(SaveJob("req", refs(3)), Ready(trace))
    assert trace == ["ready", "put"] and st["save_blocks"] == 3 and len(stored) == 3
    w.pool.shutdown(wait=True)


def test_config_checks_the_gpu_keys():
    from types import SimpleNamespace

    from mcstore.vllm.connector import _config

    def cfg(**extra):
        ktc = SimpleNamespace(kv_connector_extra_config=dict(address="unix:/x.sock", **extra))
        return _config(SimpleNamespace(kv_transfer_config=ktc))

    assert cfg()["cuda_device"] is None and cfg()["fake_gpu"] is False
    assert cfg(cuda_device=3)["cuda_device"] == 3
    for bad in (-1, 1024, True, "0", 1.0):
        with pytest.raises(ValueError, match="cuda_device"):
            cfg(cuda_device=bad)
    with pytest.raises(ValueError, match="fake_gpu"):
        cfg(fake_gpu="yes")


def test_config_passes_tls_to_the_client(tmp_path):
    from types import SimpleNamespace

    from mcstore import TlsConfig
    from mcstore.vllm.connector import _client, _config

    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    ktc = SimpleNamespace(kv_connector_extra_config=dict(
        address="127.0.0.1:1", tls_ca_file=str(ca), tls_server_name="store.example"))
    c = _client(_config(SimpleNamespace(kv_transfer_config=ktc)))
    assert c.tls == TlsConfig(ca_file=str(ca), server_name="store.example")
    c.close()
    ktc.kv_connector_extra_config = dict(address="127.0.0.1:1")
    c = _client(_config(SimpleNamespace(kv_transfer_config=ktc)))
    assert c.tls is None
    c.close()
