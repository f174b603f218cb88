"""The Python client's GPU buffers against real daemons: mc-master and two mc-client-fakegpu
(mc-client on the fake CUDA device of tests/fakes/shm_fake_cuda.h, --cuda_device=0), whose
"device memory" is POSIX shared memory of this process named by a fake CUDA IPC handle.
Everything but the CUDA calls is the production path: GpuBuffers registration, puts from GPU
slices (one-slice items written from GPU memory into the daemon's own segments, the rest
staged through host memory, each proved by the device hash of its source), gets into them from the local daemon (direct) and
from the other one over TCP (pinned staging, device hash per slice), mixed host + GPU items and
block layouts, and the owner checks."""

import os
from multiprocessing import shared_memory

import numpy as np
import pytest

from mcstore import Client, Code, StoreError, raise_for_results
from integration.client.client_cluster import metric
from test_client_integration import uniq

GPU_BIT = 1 << 63


def fake_handle(shm):
    raw = b"MCFAKESHM:/" + shm.name.lstrip("/").encode()
    assert len(raw) < 64
    return raw.ljust(64, b"\0")


@pytest.fixture(scope="module")
def gpu_cluster():
    from conftest import daemons_built
    fake = os.path.join(os.environ["MC_BUILD_DIR"], "tests/fakes/mc-client-fakegpu")
    if not daemons_built() or not os.access(fake, os.X_OK):
        pytest.fail("mc-master / tests/fakes/mc-client-fakegpu not built in %s"
                    % os.environ["MC_BUILD_DIR"])
    from integration.client.client_cluster import Cluster
    c = Cluster(clients=2, segment_size=16 << 20, client_binary="tests/fakes/mc-client-fakegpu",
                client_args=["--cuda_device", "0"])
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture()
def device_memory():
    """Fake device memory: shm objects (numpy views) that outlive the test's buffers."""
    made = []

    def make(nbytes, seed=None):
        shm = shared_memory.SharedMemory(create=True, size=nbytes)
        made.append(shm)
        mem = np.ndarray((nbytes,), dtype=np.uint8, buffer=shm.buf)
        mem[:] = 0 if seed is None else np.random.default_rng(seed).integers(
            0, 255, nbytes, dtype=np.uint8)
        return shm, mem
    yield make
    for shm in made:
        shm.close()
        shm.unlink()


def client(cluster, i):
    return Client("unix:" + cluster.clients[i].ready["unix_socket"], timeout_s=30)


def test_gpu_buffer_registered_before_any_shm_buffer_stays_usable(gpu_cluster, device_memory):
    """The owner a GPU buffer is filed under is this Client's fd session, opened before the
    registration: a create_buffer() afterwards (which needs the session) must not orphan it.
    Before the fix, this put answered INVALID_ARGUMENT "gpu buffer: unknown id"."""
    shm, mem = device_memory(64 << 10, seed=1)
    with client(gpu_cluster, 0) as c:
        gpu = c.register_gpu_handle(fake_handle(shm), 64 << 10)
        assert gpu.buffer_id & GPU_BIT
        host = c.create_buffer(4096)
        k = uniq("gpu-first")
        raise_for_results(c.put([k], [[gpu.slice(0, 8192)]]))
        assert c.get([k])[0].data == bytes(mem[:8192])
        host.close()


def test_put_from_gpu_and_get_into_gpu_locally_and_across_daemons(gpu_cluster, device_memory):
    n, size = 16, 16 << 10
    src_shm, src = device_memory(n * size, seed=2)
    dst_shm, dst = device_memory(n * size)
    far_shm, far = device_memory(n * size)
    with client(gpu_cluster, 0) as c0, client(gpu_cluster, 1) as c1:
        g_src = c0.register_gpu_handle(fake_handle(src_shm), n * size)
        g_dst = c0.register_gpu_handle(fake_handle(dst_shm), n * size)
        g_far = c1.register_gpu_handle(fake_handle(far_shm), n * size)
        keys = [uniq("gpu") for _ in range(n)]
        counts = ("mc_client_gpu_put_direct_total", "mc_client_gpu_put_direct_staged_total")
        before = [metric(gpu_cluster.http(0), name) for name in counts]
        raise_for_results(c0.put(keys, [[g_src.slice(i * size, size)] for i in range(n)],
                                 replicas=1))
        # One-slice items: written from GPU memory into c0's own segments (direct), or, placed
        # on c1 (over TCP), staged through host memory after all; every item one or the other.
        direct, staged = (metric(gpu_cluster.http(0), name) - b for name, b in zip(counts, before))
        assert direct + staged == n, (direct, staged)
        assert direct > 0, "the master places a put on the putting daemon first"
        assert [r.data for r in c1.get(keys[:2])] == [bytes(src[:size]),
                                                     bytes(src[size:2 * size])]
        # into GPU memory: from this daemon (a lone local slice: the direct path) ...
        res = c0.get(keys, into=[[g_dst.slice(i * size, size)] for i in reversed(range(n))])
        raise_for_results(res)
        assert all(r.bytes_written == size for r in res)
        for i in range(n):
            j = n - 1 - i
            assert bytes(dst[j * size:(j + 1) * size]) == bytes(src[i * size:(i + 1) * size])
        # ... and from the other daemon's replica over TCP (through its pinned staging)
        raise_for_results(c1.get(keys, into=[[g_far.slice(i * size, size)] for i in range(n)]))
        assert bytes(far) == bytes(src)


def test_mixed_items_and_block_layouts_with_gpu_runs(gpu_cluster, device_memory):
    """A vLLM-like block: a 128-byte host header and two GPU runs (K and V far apart), put
    through a block layout and read back inline, then got into other blocks of the layout on
    the other daemon; scattered GPU slices of one item are each proved on the device."""
    run, blocks = 4096, 4
    kv_shm, kv = device_memory(2 * run * blocks, seed=3)
    kv2_shm, kv2 = device_memory(2 * run * blocks)
    with client(gpu_cluster, 0) as c0, client(gpu_cluster, 1) as c1:
        g = c0.register_gpu_handle(fake_handle(kv_shm), 2 * run * blocks)
        hdr = c0.create_buffer(128 * blocks)
        hdr.memoryview()[:] = bytes(range(128)) * blocks
        layout = c0.block_layout([(hdr.slice(0, 128), 128), (g.slice(0, run), run),
                                  (g.slice(run * blocks, run), run)])
        keys = [uniq("gpu-layout") for _ in range(2)]
        raise_for_results(c0.put(keys, layout.blocks([1, 2])))
        expect = [bytes(range(128)) + bytes(kv[b * run:(b + 1) * run])
                  + bytes(kv[(blocks + b) * run:(blocks + b + 1) * run]) for b in (1, 2)]
        assert [r.data for r in c0.get(keys)] == expect
        g2 = c1.register_gpu_handle(fake_handle(kv2_shm), 2 * run * blocks)
        hdr2 = c1.create_buffer(128 * blocks)
        layout2 = c1.block_layout([(hdr2.slice(0, 128), 128), (g2.slice(0, run), run),
                                   (g2.slice(run * blocks, run), run)])
        res = c1.get(keys, into=layout2.blocks([3, 0]))
        raise_for_results(res)
        for b, e in zip((3, 0), expect):
            got = (bytes(hdr2.memoryview(128 * b, 128)) + bytes(kv2[b * run:(b + 1) * run])
                   + bytes(kv2[(blocks + b) * run:(blocks + b + 1) * run]))
            assert got == e
        # a too-small GPU destination is SIZE_MISMATCH, nothing claimed written
        small = c1.get(keys[:1], into=[[g2.slice(0, run)]])[0]
        assert small.code is Code.SIZE_MISMATCH and small.bytes_written == 0
        hdr.close()
        hdr2.close()


def test_gpu_buffers_are_their_owners(gpu_cluster, device_memory):
    """Another Client (another fd session: another owner) on the same daemon cannot name a GPU
    buffer it did not register; a closed GpuBuffer is refused before anything is sent; the
    daemon refuses a handle it cannot open."""
    shm, _ = device_memory(8192, seed=4)
    with client(gpu_cluster, 0) as a, client(gpu_cluster, 0) as b:
        g = a.register_gpu_handle(fake_handle(shm), 8192)
        b.create_buffer(4096).close()   # b has its own session (owner)
        from mcstore import Slice
        stolen = Slice(g.buffer_id, 0, 4096)
        with pytest.raises(ValueError, match="not registered through this client"):
            b.put([uniq("steal")], [[stolen]])
        b._checker.sizes[g.buffer_id] = 8192   # a hostile caller skips the client's check
        r = b.put([uniq("steal")], [[stolen]])[0]
        assert r.code is Code.INVALID_ARGUMENT and "gpu buffer" in r.message, r
        g.close()
        with pytest.raises(ValueError, match="closed"):
            g.slice(0, 16)
        with pytest.raises(StoreError) as e:
            a.register_gpu_handle(b"MCFAKESHM:/no-such-object".ljust(64, b"\0"), 4096)
        assert e.value.code is Code.INVALID_ARGUMENT
