"""The mcstore Python client against real daemons (one mc-master, two mc-clients on loopback):
inline and zero-copy round trips, duplicate keys, match_prefix leases, exist/remove, overlapping
async and futures calls, every bad input, and a daemon that is down."""

import asyncio
import os
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from mcstore import (AsyncClient, Client, Code, GetResult, LeaseRef, SessionLostError, Slice,
                     StoreError, UnavailableError, raise_for_results)


def uniq(prefix="k"):
    return ("%s-%s" % (prefix, uuid.uuid4().hex)).encode()


@pytest.fixture(scope="module")
def c0(cluster):
    with Client("unix:" + cluster.clients[0].ready["unix_socket"], timeout_s=30) as c:
        yield c


@pytest.fixture(scope="module")
def c1(cluster):
    # over TCP: the Store token, and the fd socket for buffers
    with Client(cluster.clients[1].ready["grpc"], timeout_s=30, token=cluster.token,
                fd_socket=cluster.clients[1].ready["fd_socket"]) as c:
        yield c


def codes(results):
    return [r.code.name for r in results]


def remove_eventually(c, keys, timeout_s=10.0):
    """remove(), retried for the keys answering HAS_LEASE while a finished get's read lease is
    still being released (the daemon releases it after --lease_release_delay_us); one Result
    per key, in order."""
    import time
    deadline = time.monotonic() + timeout_s
    final = {}
    todo = list(keys)
    while todo:
        for r in c.remove(todo):
            final[r.key] = r
        todo = [k for k in todo if final[k].code is Code.HAS_LEASE]
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)  # the poll interval, inside the deadline above
    return [final[k] for k in keys]


# -- round trips ------------------------------------------------------------------------------
def test_inline_round_trip_exist_remove(c0, c1):
    keys = [uniq() for _ in range(3)]
    values = [b"a" * 10, np.arange(100, dtype=np.int32), memoryview(b"xyz" * 1000)]
    raise_for_results(c0.put(keys, values))
    got = c1.get(keys + [uniq("missing")])
    assert codes(got) == ["OK", "OK", "OK", "NOT_FOUND"]
    assert got[0].data == b"a" * 10 and got[0].size == 10
    assert np.array_equal(np.frombuffer(got[1].data, np.int32), np.arange(100))
    assert got[2].data == b"xyz" * 1000
    assert got[3].data is None and got[3].key.startswith(b"missing-")
    with pytest.raises(StoreError, match="NOT_FOUND.*missing-"):
        got[3].raise_for_status()
    assert c1.exist(keys + [uniq()]) == [True, True, True, False]
    assert codes(c0.put(keys[:1], [b"other"])) == ["ALREADY_EXISTS"]
    assert codes(remove_eventually(c1, keys[:2])) == ["OK", "OK"]
    assert codes(c1.remove(keys[:1])) == ["NOT_FOUND"]
    assert c0.exist(keys) == [False, False, True]
    assert c0.exist([]) == []


def test_str_keys_and_replicas(c0, c1):
    key = "text-key-%s" % uuid.uuid4().hex
    raise_for_results(c0.put([key], [b"v"], replicas=2))
    assert c1.get([key.encode()])[0].data == b"v"


def test_zero_copy_round_trip_across_daemons(c0, c1):
    n = 3 << 20
    src = c0.create_buffer(2 * n)
    dst = c1.create_buffer(2 * n)
    a = src.numpy(np.float16, (n // 2,))
    a[:] = np.random.default_rng(1).standard_normal(n // 2).astype(np.float16)
    keys = [uniq("zc"), uniq("zc")]
    # one object from one slice, one from two discontiguous slices of the same buffer
    b = src.numpy(np.uint8, n, offset=n)
    b[:] = np.arange(n, dtype=np.uint64).astype(np.uint8)
    raise_for_results(c0.put(keys, [src.slice_of(a),
                                    [src.slice(n, n // 2), src.slice(n + n // 2, n - n // 2)]]))
    out_a = dst.numpy(np.float16, (n // 2,))
    out_b = dst.numpy(np.uint8, n, offset=n)
    res = c1.get(keys, into=[[dst.slice_of(out_a)],
                             [dst.slice(n + n // 2, n // 2), dst.slice(n, n - n // 2)]])
    raise_for_results(res)
    assert [r.bytes_written for r in res] == [n, n] and all(r.data is None for r in res)
    assert np.array_equal(out_a, a)  # landed in the caller's view
    assert bytes(out_b[n // 2:]) == bytes(b[:n // 2]) and bytes(out_b[:n // 2]) == bytes(b[n // 2:])
    # the same objects read inline agree
    assert c0.get(keys[:1])[0].data == a.tobytes()
    src.close()
    dst.close()


def test_prepared_slices_send_the_same_request_and_are_rechecked_per_use(c0, c1):
    n = 64 << 10
    src = c0.create_buffer(4 * n)
    src.numpy(np.uint8, 4 * n)[:] = np.random.default_rng(3).integers(0, 255, 4 * n,
                                                                       dtype=np.uint8)
    # one object scattered over a shared buffer and a buffer registered by hand (by id)
    raw = c0.create_buffer(2 * n)
    raw.numpy(np.uint8, 2 * n)[:] = 5
    bid = c0.register_buffer(raw.name, 2 * n)
    slices = [src.slice(3 * n, n), Slice(bid, n, n), src.slice(0, n)]
    prepared = c0.prepare_slices(slices)
    assert prepared.length == 3 * n and prepared.count == 3
    k1, k2 = uniq("prep"), uniq("prep")
    raise_for_results(c0.put([k1, k2], [prepared, slices]))
    expect = bytes(src.numpy(np.uint8, n, offset=3 * n)) + b"\x05" * n + bytes(
        src.numpy(np.uint8, n))
    assert c0.get([k1])[0].data == expect and c0.get([k2])[0].data == expect
    # as a destination, twice: the same bytes land where plain slices put them
    dst = c0.create_buffer(3 * n)
    into = c0.prepare_slices([dst.slice(2 * n, n), dst.slice(0, 2 * n)])
    for key in (k1, k2):
        dst.numpy(np.uint8, 3 * n)[:] = 0
        res = c0.get([key], into=[into])
        raise_for_results(res)
        assert res[0].bytes_written == 3 * n
        got = bytes(dst.numpy(np.uint8, 3 * n))
        assert got[2 * n:] + got[:2 * n] == expect
    # too small a destination is the daemon's SIZE_MISMATCH, as for plain slices
    small = c0.prepare_slices([dst.slice(0, n)])
    assert c0.get([k1], into=[small])[0].code is Code.SIZE_MISMATCH
    # another client's prepared slices, an unregistered id, a closed buffer: refused before
    # anything is sent
    with pytest.raises(ValueError, match="another client"):
        c1.get([k1], into=[into])
    c0.unregister_buffer(bid)
    with pytest.raises(ValueError, match="no longer registered"):
        c0.put([uniq()], [prepared])
    dst.close()
    with pytest.raises(ValueError, match="closed or re-registered"):
        c0.get([k1], into=[into])
    with pytest.raises(ValueError, match="not registered through this client"):
        c0.prepare_slices([Slice(bid, 0, 16)])
    src.close()
    raw.close()


def test_block_layout_moves_the_same_bytes_as_its_slices(c0, c1):
    """A paged buffer of 8 blocks with two runs each (a K run and a V run 64 KiB apart): blocks
    put through the layout read back inline as their runs; gets into other blocks land where
    the expanded slices say, also from the other daemon; a too-small layout is SIZE_MISMATCH and
    bad input is refused before anything is sent."""
    run, blocks = 4096, 8
    buf = c0.create_buffer(2 * run * blocks)
    mem = buf.numpy(np.uint8, 2 * run * blocks)
    mem[:] = np.random.default_rng(5).integers(0, 255, mem.size, dtype=np.uint8)
    layout = c0.block_layout([(buf.slice(0, run), run), (buf.slice(run * blocks, run), run)])
    assert layout.num_blocks == blocks and layout.block_length == 2 * run
    keys = [uniq("layout") for _ in range(3)]
    src = [1, 0, 7]
    expect = [bytes(mem[i * run:(i + 1) * run]) + bytes(mem[(blocks + i) * run:(blocks + i + 1)
                                                             * run]) for i in src]
    raise_for_results(c0.put(keys, layout.blocks(src)))
    assert [r.data for r in c0.get(keys)] == expect
    # into blocks 2, 3, 4: exactly what the same Slices would have written
    dst = [2, 3, 4]
    for i in dst:
        for sl in layout.slices(i):
            mem[sl.offset:sl.end] = 0
    res = c0.get(keys, into=layout.blocks(dst), lease=None)
    raise_for_results(res)
    assert [r.bytes_written for r in res] == [2 * run] * 3
    for i, e in zip(dst, expect):
        assert b"".join(bytes(mem[sl.offset:sl.end]) for sl in layout.slices(i)) == e
    # the other daemon's client reads c0's blocks into its own layout (remote path)
    other = c1.create_buffer(2 * run * 2)
    olayout = c1.block_layout([(other.slice(0, run), run), (other.slice(2 * run, run), run)])
    raise_for_results(c1.get(keys[:2], into=olayout.blocks([1, 0])))
    view = other.numpy(np.uint8, 4 * run)
    assert bytes(view[run:2 * run]) + bytes(view[3 * run:]) == expect[0]
    assert bytes(view[:run]) + bytes(view[2 * run:3 * run]) == expect[1]
    # a layout whose blocks are smaller than the object: the daemon's SIZE_MISMATCH
    half = c0.block_layout([(buf.slice(0, run), run)])
    assert c0.get(keys[:1], into=half.blocks([5]))[0].code is Code.SIZE_MISMATCH
    # bad input never reaches the daemon
    with pytest.raises(ValueError, match="outside the layout"):
        c0.get(keys[:1], into=layout.blocks([blocks]))
    with pytest.raises(ValueError, match="another client"):
        c1.get(keys[:1], into=layout.blocks([0]))

    async def main():
        async with AsyncClient(c0.address) as a:
            abuf = await a.create_buffer(2 * run)
            alayout = a.block_layout([(abuf.slice(0, run), run)])
            got = await a.get(keys[:1], into=alayout.blocks([0]))
            assert got[0].code is Code.SIZE_MISMATCH   # 1 run of 4 KiB for an 8 KiB object
            k = uniq("alayout")
            raise_for_results(await a.put([k], alayout.blocks([1])))
            assert (await a.get([k]))[0].data == bytes(abuf.numpy(np.uint8, 2 * run)[run:])

    asyncio.run(main())
    buf.close()
    with pytest.raises(ValueError, match="closed or re-registered"):
        c0.get(keys[:1], into=layout.blocks([0]))
    other.close()


def test_zero_copy_torch(c0, c1):
    torch = pytest.importorskip("torch")
    src = c0.create_buffer(1 << 20)
    dst = c1.create_buffer(1 << 20)
    t = src.torch(torch.bfloat16, (16, 256))
    t.copy_(torch.randn(16, 256, dtype=torch.bfloat16))
    keys = [uniq("t%d" % i) for i in range(16)]
    raise_for_results(c0.put(keys, [src.slice_of(t[i]) for i in range(16)]))
    out = dst.torch(torch.bfloat16, (16, 256), offset=4096)
    raise_for_results(c1.get(keys[::-1], into=[dst.slice_of(out[i]) for i in range(16)]))
    assert torch.equal(out, t.flip(0))
    src.close()
    dst.close()


def test_duplicate_keys_in_one_get(c0, c1):
    k, other = uniq(), uniq()
    payload = os.urandom(100_000)
    raise_for_results(c0.put([k, other], [payload, b"o"]))
    res = c1.get([k, other, k, k])
    assert codes(res) == ["OK"] * 4 and res[0].data == res[2].data == res[3].data == payload
    buf = c1.create_buffer(300_000)
    res = c1.get([k, k, k], into=[buf.slice(0, 100_000), buf.slice(100_000, 100_000),
                                  [buf.slice(250_000, 50_000), buf.slice(200_000, 50_000)]])
    raise_for_results(res)
    assert buf.memoryview(0, 100_000) == payload and buf.memoryview(100_000, 100_000) == payload
    assert bytes(buf.memoryview(200_000, 50_000)) + bytes(buf.memoryview(250_000, 50_000)) == \
        payload[50_000:] + payload[:50_000]
    buf.close()


def test_match_prefix_and_lease(c0, c1):
    keys = [uniq("p%d" % i) for i in range(5)]
    raise_for_results(c0.put(keys[:3] + keys[4:], [b"v0", b"v1", b"v2", b"v4"]))
    plain = c1.match_prefix(keys)
    assert plain.matched == 3 and plain.lease_id == 0 and plain.keys == keys[:3]
    plain.release()  # nothing to release: no RPC, no error
    assert c1.match_prefix([]).matched == 0
    with c1.match_prefix(keys, lease_ttl_ms=30_000) as lease:
        assert lease.matched == 3 and lease.lease_id != 0 and lease.expiry_ms > 0
        res = c1.get(keys[:lease.matched], lease=lease)
        assert [r.data for r in res] == [b"v0", b"v1", b"v2"]
        # leased keys cannot be removed while the lease holds them
        assert codes(c0.remove(keys[:1])) == ["HAS_LEASE"]
    assert lease.released
    assert not c1.release_lease(lease.lease_id)  # already released: unknown now
    assert codes(remove_eventually(c0, keys[:1])) == ["OK"]
    with c1.match_prefix(keys, lease_ttl_ms=30_000) as lease:
        assert lease.matched == 0 and lease.lease_id == 0


def _daemon_metric(cluster, i, name, **labels):
    from integration.client.client_cluster import metric
    return metric(cluster.http(i), name, **labels)


def test_lease_capability_lets_another_process_read_and_release(cluster, c0):
    """One process of an engine takes a lease (the scheduler), another uses and releases it
    (the worker, with its own fd session): the lease's capability lets it; the id alone does
    not. After the release nothing is leased, on the daemon or at the master."""
    from integration.client.client_cluster import metric
    addr = "unix:" + cluster.clients[0].ready["unix_socket"]
    keys = [uniq("cap%d" % i) for i in range(3)]
    raise_for_results(c0.put(keys, [b"a" * 100, b"b" * 100, b"c" * 100]))
    with Client(addr, timeout_s=30) as sched, Client(addr, timeout_s=30) as worker:
        buf = worker.create_buffer(4096)  # the worker's own fd session: another caller
        lease = sched.match_prefix(keys, lease_ttl_ms=30_000)
        assert lease.matched == 3 and len(lease.token) == 16
        ref = lease.ref
        assert isinstance(ref, LeaseRef) and ref == (lease.lease_id, lease.token)
        lookups = metric(cluster.master_http(), "mc_master_rpc_requests_total", rpc="GetReplicas")
        res = worker.get(keys, into=[buf.slice(100 * i, 100) for i in range(3)], lease=ref)
        assert [r.code for r in res] == [Code.OK] * 3
        assert bytes(buf.memoryview(0, 300)) == b"a" * 100 + b"b" * 100 + b"c" * 100
        assert metric(cluster.master_http(), "mc_master_rpc_requests_total",
                      rpc="GetReplicas") == lookups, "read from the lease's pinned lookups"
        assert not worker.release_lease(lease.lease_id), "the id alone is another caller's"
        forged = LeaseRef(lease.lease_id, bytes(16))
        assert not worker.release_lease(forged)
        assert worker.release_lease(ref)
        assert not sched.release_lease(lease), "released already"
        assert _daemon_metric(cluster, 0, "mc_client_prefix_leases") == 0
        assert _daemon_metric(cluster, 0, "mc_client_prefix_lease_releases_total", by="token") >= 1
        assert _daemon_metric(cluster, 0, "mc_client_prefix_lease_release_refusals_total") >= 3
        from integration import harness
        harness.wait_until(lambda: metric(cluster.master_http(), "mc_leases_active") == 0, 10,
                           interval_s=0.05, what="the master's leases to end")
        buf.close()


def test_futures_overlap(c0, c1):
    keys = [uniq("f") for _ in range(16)]
    vals = [os.urandom(10_000 + i) for i in range(16)]
    puts = [c0.put_async([k], [v]) for k, v in zip(keys, vals)]
    for f in puts:
        raise_for_results(f.result(timeout=60))
    gets = [c1.get_async([k]) for k in keys]
    exists = c1.exist_async(keys)
    assert [f.result(timeout=60)[0].data for f in gets] == vals
    assert exists.result(timeout=60) == [True] * 16
    removed = c1.remove_async(keys).result(timeout=60)
    assert set(codes(removed)) <= {"OK", "HAS_LEASE"}  # HAS_LEASE: a get's lease not yet released
    assert codes(remove_eventually(c1, [r.key for r in removed if not r.ok])) == \
        ["OK"] * sum(not r.ok for r in removed)


def test_async_client_overlapping_calls(cluster):
    async def main():
        async with AsyncClient("unix:" + cluster.clients[0].ready["unix_socket"]) as a, \
                AsyncClient(cluster.clients[1].ready["grpc"], token_file=cluster.token_file,
                            fd_socket=cluster.clients[1].ready["fd_socket"]) as b:
            keys = [uniq("as") for _ in range(24)]
            vals = [os.urandom(5000 + i) for i in range(24)]
            results = await asyncio.gather(*[a.put([k], [v]) for k, v in zip(keys, vals)])
            assert all(r[0].ok for r in results)
            got = await asyncio.gather(*[b.get([k]) for k in keys], b.exist(keys))
            assert [g[0].data for g in got[:-1]] == vals and got[-1] == [True] * 24
            # zero-copy through the async API
            buf = await b.create_buffer(1 << 16)
            views = [buf.numpy(np.uint8, 5000 + i, offset=8192 * (i % 8)) for i in range(8)]
            res = await asyncio.gather(*[b.get([keys[i]], into=[buf.slice_of(views[i])])
                                         for i in range(8)])
            assert all(r[0].ok for r in res)
            assert all(bytes(views[i]) == vals[i] for i in range(8))
            async with await b.match_prefix(keys, lease_ttl_ms=10_000) as lease:
                assert lease.matched == 24 and lease.lease_id != 0
                assert all(r.ok for r in await b.get(keys, lease=lease))
            assert lease.released
            removed = await a.remove(keys)
            assert {r.code for r in removed} <= {Code.OK, Code.HAS_LEASE}
            buf.close()
    asyncio.run(main())


# -- bad input ------------------------------------------------------------------------------
def test_buffer_too_small_or_too_large_is_size_mismatch(c0, c1):
    k = uniq()
    raise_for_results(c0.put([k], [os.urandom(1000)]))
    buf = c1.create_buffer(4096)
    small, large = c1.get([k, k], into=[buf.slice(0, 999), buf.slice(1024, 1001)])
    for r in (small, large):
        assert r.code is Code.SIZE_MISMATCH and r.size == 1000 and r.bytes_written == 0
        assert not r.ok and r.data is None
        with pytest.raises(StoreError, match="SIZE_MISMATCH"):
            r.raise_for_status()
    buf.close()


def test_slices_out_of_bounds_and_closed_buffers_rejected_before_sending(c0):
    buf = c0.create_buffer(4096)
    with pytest.raises(ValueError, match="outside shared buffer"):
        buf.slice(4000, 100)
    forged = Slice(buf.id, 4000, 100)  # no buffer attached: checked against the registry
    with pytest.raises(ValueError, match="not registered through this client"):
        c0.get([b"k"], into=[forged])
    ok_slice = buf.slice(0, 100)
    buf.close()
    with pytest.raises(ValueError, match="closed"):
        c0.put([b"k"], [ok_slice])
    with pytest.raises(ValueError, match="closed"):
        c0.get([b"k"], into=[ok_slice])
    with pytest.raises(ValueError, match="closed"):
        buf.numpy(np.uint8, 4)


def test_buffer_of_another_daemon_rejected(c0, c1):
    buf = c1.create_buffer(4096)
    with pytest.raises(ValueError, match="another client"):
        c0.put([uniq()], [buf.slice(0, 10)])
    buf.close()


def test_register_buffer_errors_and_raw_slices(c0):
    with pytest.raises(StoreError, match="NOT_FOUND.*no shm object") as info:
        c0.register_buffer("/mcstore-no-such-%s" % uuid.uuid4().hex, 4096)
    assert info.value.code is Code.NOT_FOUND
    with pytest.raises(ValueError, match="bad shm name"):
        c0.register_buffer("no-slash", 4096)
    buf = c0.create_buffer(8192)
    with pytest.raises(StoreError, match="INVALID_ARGUMENT.*has 8192 bytes"):
        c0.register_buffer(buf.name, 8193)
    # the same object registered by hand: Slices by id, bounds checked against its size
    bid = c0.register_buffer(buf.name, 4096)
    buf.numpy(np.uint8, 4096)[:] = 7
    k = uniq()
    raise_for_results(c0.put([k], [Slice(bid, 0, 4096)]))
    with pytest.raises(ValueError, match="outside buffer"):
        c0.put([uniq()], [Slice(bid, 4000, 97)])
    assert c0.get([k])[0].data == b"\x07" * 4096
    c0.unregister_buffer(bid)
    with pytest.raises(ValueError, match="not registered"):
        c0.get([k], into=[Slice(bid, 0, 4096)])
    buf.close()


def test_gpu_buffers_on_a_daemon_without_cuda_device(c0):
    """mc-client without --cuda_device does not serve GpuBuffers: registering says how to get
    it; a GPU buffer id in a slice is refused by the daemon per item, never served."""
    with pytest.raises(StoreError, match="--cuda_device") as info:
        c0.register_gpu_handle(bytes(64), 4096)
    assert info.value.code is Code.INVALID_ARGUMENT
    handle = os.memfd_create("not-a-gpu-handle")
    try:
        with pytest.raises(StoreError, match="--cuda_device") as info:
            c0.register_gpu_fd(handle, 4096)  # refused by the fd socket itself
        assert info.value.code is Code.INVALID_ARGUMENT
    finally:
        os.close(handle)
    k = uniq()
    raise_for_results(c0.put([k], [b"x" * 4096]))
    gpu_id = (1 << 63) | 1
    c0._checker.sizes[gpu_id] = 4096  # past the client's own check, to reach the daemon's
    try:
        [r] = c0.get([k], into=[Slice(gpu_id, 0, 4096)])
        assert r.code is Code.INVALID_ARGUMENT and "--cuda_device" in r.message, r
        [p] = c0.put([uniq()], [Slice(gpu_id, 0, 4096)])
        assert p.code is Code.INVALID_ARGUMENT, p
    finally:
        c0._checker.sizes.pop(gpu_id)


def test_daemon_rejects_bad_items_per_key(c0):
    good = uniq()
    res = c0.put([b"", good, uniq(), b"x" * 5000], [b"v", b"v", b"", b"v"])
    assert codes(res) == ["INVALID_ARGUMENT", "OK", "INVALID_ARGUMENT", "INVALID_ARGUMENT"]
    assert "empty payload" in res[2].message


def test_dtype_and_contiguity_errors(c0):
    buf = c0.create_buffer(4096)
    with pytest.raises(TypeError):
        buf.numpy(object, 4)
    view = buf.numpy(np.float32, (8, 8))
    with pytest.raises(ValueError, match="not C-contiguous"):
        buf.slice_of(view[:, 1])
    with pytest.raises(ValueError, match="not C-contiguous"):
        c0.put([uniq()], [view.T])
    buf.close()


# -- daemon down ----------------------------------------------------------------------------
def test_unreachable_socket_is_unavailable(cluster):
    addr = "unix:" + os.path.join(cluster.tmp, "nobody.sock")
    with Client(addr, timeout_s=5) as c:
        with pytest.raises(UnavailableError, match="nobody.sock") as info:
            c.get([b"k"])
        assert info.value.code is Code.UNAVAILABLE


def test_daemon_killed_mid_session():
    from integration.client.client_cluster import Cluster
    cl = Cluster(clients=1, segment_size=8 << 20).start()
    try:
        addr = "unix:" + cl.clients[0].ready["unix_socket"]
        c = Client(addr, timeout_s=5)
        buf = c.create_buffer(4096)
        k = uniq()
        raise_for_results(c.put([k], [buf.slice(0, 100)]))
        cl.clients[0].kill()
        for call in (lambda: c.get([k]), lambda: c.exist([k]), lambda: c.put([k], [b"v"]),
                     lambda: c.match_prefix([k], lease_ttl_ms=1000),
                     lambda: c.get_async([k]).result(timeout=30)):
            with pytest.raises(UnavailableError, match=cl.clients[0].ready["unix_socket"]):
                call()
        # The daemon comes back on the same socket: the client reconnects within seconds (not
        # gRPC's default backoff); the buffer is registered again under a new id.
        time.sleep(2)  # let the channel back off a few times (the point of this test)
        cl.clients[0].start()
        harness_wait(lambda: _answers(c), 10, "the client to reconnect")
        # The new daemon never issued this client's fd session: one distinct error, not a
        # per-item INVALID_ARGUMENT for every buffer id the client still names.
        assert isinstance(c._last_answer_error, SessionLostError), c._last_answer_error
        assert c._last_answer_error.code is Code.NOT_READY
        # Then calls go on without the dead session (once the new daemon has registered).
        harness_wait(lambda: _answers(c) and c._last_answer_error is None, 15,
                     "calls without the dead session")
        stale = Slice(buf.id + 1000, 0, 10, buf)  # a slice naming an id the buffer no longer has
        buf.reregister()
        with pytest.raises(ValueError, match="re-registered"):
            c.put([uniq()], [stale])
        buf.numpy(np.uint8, 100)[:] = 9
        k2 = uniq()
        raise_for_results(c.put([k2], [buf.slice(0, 100)]))
        assert c.get([k2])[0].data == b"\x09" * 100
        buf.close()
        c.close()
    finally:
        cl.stop()


def _answers(c):
    c._last_answer_error = None
    try:
        c.exist([b"x"])
        return True
    except SessionLostError as e:  # it answered: our session is gone
        c._last_answer_error = e
        return True
    except UnavailableError:
        return False


def harness_wait(pred, timeout_s, what):
    from integration import harness
    return harness.wait_until(pred, timeout_s, interval_s=0.05, what=what)


def test_dead_daemon_buffer_close_is_quiet():
    from integration.client.client_cluster import Cluster
    cl = Cluster(clients=1, segment_size=8 << 20).start()
    try:
        c = Client("unix:" + cl.clients[0].ready["unix_socket"], timeout_s=5)
        buf = c.create_buffer(4096)
        cl.clients[0].kill()
        buf.close()  # unregistering from a dead daemon is not an error
        assert buf.closed
        c.close()
    finally:
        cl.stop()


# -- CLI ------------------------------------------------------------------------------------
def run_cli(cluster, *args, stdin=None):
    env = dict(os.environ)
    env["MCSTORE_TOKEN_FILE"] = cluster.token_file
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-m", "mcstore", *args], input=stdin,
                          capture_output=True, env=env, timeout=60)


def test_cli(cluster, tmp_path):
    addr = cluster.clients[0].ready["grpc"]
    key = "cli-%s" % uuid.uuid4().hex
    r = run_cli(cluster, "-a", addr, "put", key, "hello")
    assert r.returncode == 0, r.stderr
    r = run_cli(cluster, "-a", addr, "put", key + "-2", "-", stdin=b"\x00\x01binary")
    assert r.returncode == 0, r.stderr
    r = run_cli(cluster, "-a", addr, "get", key)
    assert r.returncode == 0 and r.stdout == b"hello"
    out = tmp_path / "v"
    r = run_cli(cluster, "-a", addr, "get", key + "-2", "-o", str(out))
    assert r.returncode == 0 and out.read_bytes() == b"\x00\x01binary"
    r = run_cli(cluster, "-a", addr, "put", key, "again")
    assert r.returncode == 1 and b"ALREADY_EXISTS" in r.stderr
    r = run_cli(cluster, "-a", addr, "ls", key, key + "-nope")
    assert r.returncode == 1
    assert r.stdout.decode().splitlines() == ["present\t" + key, "absent\t" + key + "-nope"]
    r = run_cli(cluster, "-a", addr, "ls")
    assert r.returncode == 2 and b"no listing RPC" in r.stderr
    r = run_cli(cluster, "-a", addr, "--hex", "exist", key.encode().hex())
    assert r.returncode == 0 and r.stdout.decode().startswith("present\t")
    for _ in range(100):  # a get's read lease is released a moment after it answered
        r = run_cli(cluster, "-a", addr, "rm", key, key + "-2")
        if b"HAS_LEASE" not in r.stderr:
            break
    assert r.returncode == 0, r.stderr
    r = run_cli(cluster, "-a", addr, "get", key)
    assert r.returncode == 1 and b"NOT_FOUND" in r.stderr
    r = run_cli(cluster, "-a", addr, "status", "--admin", cluster.http(0))
    assert r.returncode == 0, r.stderr
    assert b"Client c0" in r.stdout and b"reachable" in r.stdout
    r = run_cli(cluster, "-a", "unix:/nonexistent/x.sock", "--timeout", "3", "status")
    assert r.returncode == 2 and b"UNAVAILABLE" in r.stderr and b"/nonexistent/x.sock" in r.stderr
