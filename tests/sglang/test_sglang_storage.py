"""mcstore.sglang.MCStoreStorage against SGLang (PyPI, pinned) and a real mc-client: loaded by
SGLang's StorageBackendFactory as a dynamic backend; pages of SGLang's own MHA host pool classes
in each page layout stored and loaded zero-copy (memfd pool) and by copying (default pool); the
tensor interface; SGLang's HiCacheController backing pages up and prefetching them through it;
and every kind of wrong page (corrupted or foreign header, another model, dtype or layout, wrong
size) a miss."""

import queue
import threading
import uuid

import pytest
import torch
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.utils import get_storage_hash_str

import mcstore
from mcstore.sglang.storage import HEADER, MCStoreStorage

PAGE, LAYERS, HEADS, HEAD_DIM, TOKENS = 4, 3, 2, 8, 64
LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
WAIT_S = 60


def device_pool(dtype=torch.bfloat16):
    return MHATokenToKVPool(size=TOKENS, page_size=PAGE, dtype=dtype, head_num=HEADS,
                            head_dim=HEAD_DIM, layer_num=LAYERS, device="cpu",
                            enable_memory_saver=False)


def host_pool(dev, layout="page_first", allocator="shm"):
    return MHATokenToKVPoolHost(dev._mha_buffer_info(), 2.0, 0, PAGE, layout, pin_memory=False,
                                device="cpu", allocator_type=allocator,
                                device_capacity_tokens=TOKENS, start_layer=0, end_layer=LAYERS)


def extra_config(cluster, **over):
    e = {"backend_name": "mcstore", "module_path": "mcstore.sglang",
         "class_name": "MCStoreStorage", "interface_v1": 1,
         "address": "unix:" + cluster.clients[0].ready["unix_socket"],
         "namespace": "test", "model_id": "model-a"}
    e.update(over)
    return e


def storage_config(extra, mla=False):
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                                is_page_first_layout=False, model_name="/models/tiny",
                                extra_config=extra)


def backend(cluster, host, **over):
    """A backend as SGLang makes one: StorageBackendFactory, "dynamic", then the host pool."""
    b = StorageBackendFactory.create_backend("dynamic",
                                             storage_config(extra_config(cluster, **over)), host)
    assert isinstance(b, MCStoreStorage)
    b.register_mem_pool_host(host)
    return b


def indices(pages):
    return torch.tensor([p * PAGE + j for p in pages for j in range(PAGE)], dtype=torch.int64)


def fill(host, pages, seed):
    """Random KV in `pages`; returns each page's flat bytes."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in pages:
        view = host.get_data_page(p * PAGE, flat=False)
        view.copy_(torch.randn(view.shape, generator=g).to(view.dtype))
        out.append(host.get_data_page(p * PAGE, flat=True).clone())
    return out


def page(host, p):
    return host.get_data_page(p * PAGE, flat=True)


def new_keys(n):
    return [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(n)]   # SGLang's: 64 hex digits


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("allocator", ["shm", "default"])
def test_pages_round_trip_in_every_layout(cluster, layout, allocator):
    host = host_pool(device_pool(), layout, allocator)
    b = backend(cluster, host)
    try:
        assert b.zero_copy == (allocator == "shm")
        keys = new_keys(4)
        want = fill(host, [1, 2, 3, 5], seed=1)
        assert b.batch_exists(keys) == 0
        assert b.batch_set_v1(keys, indices([1, 2, 3, 5])) == [True] * 4
        assert b.batch_set_v1(keys[:1], indices([1])) == [True]   # stored already: fine
        assert b.batch_exists(keys) == 4 and b.exists(keys[3])
        for p in (7, 8, 9, 10):
            page(host, p).zero_()
        assert b.batch_get_v1(keys, indices([7, 8, 9, 10])) == [True] * 4
        for p, w in zip((7, 8, 9, 10), want):
            assert torch.equal(page(host, p), w)
        assert b.stats["pages_loaded"] == 4 and b.stats["header_mismatches"] == 0
    finally:
        b.close()


def test_zero_copy_and_copying_backends_share_pages(cluster):
    """The object format does not depend on how bytes moved: a page stored from a memfd pool
    loads into a default pool and back."""
    dev = device_pool()
    shm, plain = host_pool(dev, allocator="shm"), host_pool(dev, allocator="default")
    a, b = backend(cluster, shm), backend(cluster, plain)
    try:
        assert a.zero_copy and not b.zero_copy
        keys = new_keys(3)
        want = fill(shm, [4, 5, 6], seed=2)
        assert a.batch_set_v1(keys, indices([4, 5, 6])) == [True] * 3
        assert b.batch_get_v1(keys, indices([1, 2, 3])) == [True] * 3
        assert all(torch.equal(page(plain, p), w) for p, w in zip((1, 2, 3), want))
        keys2 = new_keys(2)
        want2 = fill(plain, [9, 10], seed=3)
        assert b.batch_set_v1(keys2, indices([9, 10])) == [True] * 2
        assert a.batch_get_v1(keys2, indices([11, 12])) == [True] * 2
        assert all(torch.equal(page(shm, p), w) for p, w in zip((11, 12), want2))
    finally:
        a.close()
        b.close()


def test_tensor_interface(cluster):
    """Without interface_v1 SGLang hands the backend flat page tensors (batch_set/batch_get)."""
    host = host_pool(device_pool(), "layer_first", "default")
    b = backend(cluster, host, interface_v1=0)
    try:
        keys = new_keys(3)
        want = fill(host, [1, 2, 3], seed=4)
        assert b.batch_set(keys, [page(host, p) for p in (1, 2, 3)])
        assert b.set(keys[0], page(host, 1))
        got = b.batch_get(keys, [host.get_dummy_flat_data_page() for _ in keys])
        assert all(torch.equal(g, w) for g, w in zip(got, want))
        assert b.get(new_keys(1)[0], host.get_dummy_flat_data_page()) is None
        assert b.batch_get(keys + new_keys(1), None)[3] is None
    finally:
        b.close()


def stored_object(cluster, b, key, mutate):
    """Puts, under `b`'s mcstore key for `key`, a page object that mutate(bytearray) altered."""
    obj = bytearray(b._header(key).pack() + bytes(b.page_bytes))
    mutate(obj)
    with mcstore.Client("unix:" + cluster.clients[0].ready["unix_socket"]) as c:
        r = c.put([b._key(key)], [bytes(obj)])
        assert r[0].ok, r


def test_wrong_pages_are_misses(cluster):
    host = host_pool(device_pool(), "page_first", "shm")
    b = backend(cluster, host)
    keys = new_keys(3)
    want = fill(host, [1, 2, 3], seed=5)
    assert b.batch_set_v1(keys, indices([1, 2, 3])) == [True] * 3
    others = []
    try:
        # Another model, dtype or layout: another namespace, so other keys: nothing to find.
        for over, pool in ((dict(model_id="model-b"), host),
                           ({}, host_pool(device_pool(torch.float16), "page_first", "shm")),
                           ({}, host_pool(device_pool(), "layer_first", "shm"))):
            o = backend(cluster, pool, **over)
            others.append(o)
            assert o.prefix != b.prefix
            assert o.batch_exists(keys) == 0
            assert o.batch_get_v1(keys, indices([5, 6, 7])) == [False] * 3
        # Objects under this backend's own keys that are not its pages: each one a miss.
        other = others[0]
        bad = new_keys(4)
        stored_object(cluster, b, bad[0], lambda o: o.__setitem__(0, o[0] ^ 0xFF))  # magic
        stored_object(cluster, b, bad[1], lambda o: o.__setitem__(
            slice(0, HEADER), other._header(bad[1]).pack()))                        # namespace
        stored_object(cluster, b, bad[2], lambda o: o.__setitem__(
            slice(0, HEADER), b._header(bad[0]).pack()))                            # key
        stored_object(cluster, b, bad[3], lambda o: o.extend(b"x"))                 # size
        mixed = [keys[0]] + bad + [keys[1]]
        before = b.stats["header_mismatches"]
        for p in range(8, 14):
            page(host, p).fill_(7)
        assert b.batch_get_v1(mixed, indices(range(8, 14))) == [True, False, False, False,
                                                                 False, True]
        assert b.stats["header_mismatches"] - before == 3   # the size: refused by the daemon
        assert torch.equal(page(host, 8), want[0]) and torch.equal(page(host, 13), want[1])
        # The copying path checks the same way.
        plain = host_pool(device_pool(), "page_first", "default")
        c = backend(cluster, plain)
        others.append(c)
        assert c.prefix == b.prefix and not c.zero_copy
        assert c.batch_get_v1(mixed, indices(range(8, 14))) == [True, False, False, False,
                                                                 False, True]
    finally:
        b.close()
        for o in others:
            o.close()


@pytest.fixture(scope="module")
def single_rank():
    """SGLang's parallel context of one rank (what a launched TP=1 server publishes)."""
    from sglang.srt.runtime_context import get_parallel
    get_parallel().override_permanently(attn_dcp_size=1, attn_dcp_rank=0, tp_rank=0, tp_size=1,
                                        pp_rank=0, pp_size=1)


def wait_ack(q, what):
    try:
        return q.get(timeout=WAIT_S)
    except queue.Empty:
        pytest.fail("no %s from SGLang's HiCacheController within %d s" % (what, WAIT_S))


def test_hicache_controller_backs_up_and_prefetches_through_mcstore(cluster, single_rank):
    """SGLang's own HiCacheController, storage backend "dynamic" with this backend's extra
    config: its backup thread stores host pages, its prefetch threads find and load them into
    other host pages; a wrong page stops the prefetch there, as SGLang's counting of leading
    successes does with any miss."""
    from sglang.srt.managers.cache_controller import HiCacheController
    dev = device_pool()
    allocator = PagedTokenToKVPoolAllocator(TOKENS, PAGE, torch.bfloat16, "cpu", dev, False)
    host = host_pool(dev, "page_first", "shm")
    extra = extra_config(cluster, allocator="shm", namespace="controller-%s" % uuid.uuid4().hex)
    cc = HiCacheController(allocator, host, PAGE, None, threading.Event(),
                           storage_backend="dynamic", model_name="/models/tiny",
                           storage_backend_extra_config=extra, io_backend="direct")
    try:
        b = cc.storage_backend
        assert isinstance(b, MCStoreStorage) and b.zero_copy
        assert cc.page_get_func == cc._page_get_zero_copy
        tokens = list(range(1000, 1000 + 6 * PAGE))
        hashes = get_storage_hash_str(tokens, None, page_size=PAGE)
        src = host.alloc(len(tokens))
        want = fill(host, [int(i) // PAGE for i in src[::PAGE]], seed=6)
        cc.write_storage(src, tokens, hash_value=hashes)
        op = wait_ack(cc.ack_backup_queue, "backup ack")
        assert op.completed_tokens == len(tokens)

        def prefetch(rid):
            op = cc.prefetch(rid, tokens)
            hit = wait_ack(cc.prefetch_hit_queue, "storage hit")
            assert hit is op
            dst = host.alloc(op.storage_hit_count)
            op.host_indices = dst
            cc.prefetch_buffer.put(op)
            done = 0
            while True:
                ack = wait_ack(cc.ack_prefetch_queue, "prefetch ack")
                if ack.completed_tokens is not None:
                    done = ack.completed_tokens
                if ack.completed_req:
                    return op, dst, done

        op, dst, done = prefetch("r1")
        assert op.storage_hit_count == len(tokens) and done == len(tokens)
        for i, w in zip(dst[::PAGE], want):
            assert torch.equal(page(host, int(i) // PAGE), w)

        # Page 3 of the chain replaced by an object whose header names another page.
        with mcstore.Client(extra["address"]) as c:
            assert c.remove([b._key(hashes[3])])[0].ok
        stored_object(cluster, b, hashes[3], lambda o: o.__setitem__(
            slice(0, HEADER), b._header(hashes[0]).pack()))
        op, dst, done = prefetch("r2")
        assert op.storage_hit_count == len(tokens)    # all six keys are there...
        assert done == 3 * PAGE                       # ...but only the three before it load
        for i, w in zip(dst[:3 * PAGE:PAGE], want[:3]):
            assert torch.equal(page(host, int(i) // PAGE), w)
    finally:
        cc.detach_storage_backend()
