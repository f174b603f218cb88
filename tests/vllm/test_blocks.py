"""Unit tests of mcstore.vllm.blocks: keys, namespaces, block headers, block byte ranges."""


import pytest

from mcstore.vllm import blocks as B


def ns(**over):
    base = dict(user_namespace="prod", model_name="llama", model_fingerprint="f" * 16,
                kv_dtype="torch.float32", layout="LBHNC:heads2:hs64:page16384", num_layers=2,
                block_size=32, hash_algo="sha256", shard="tp0of1")
    base.update(over)
    return B.NamespaceSpec(**base)


@pytest.mark.parametrize("field,value", [
    ("user_namespace", "other"), ("model_fingerprint", "e" * 16), ("kv_dtype", "torch.bfloat16"),
    ("layout", "LBNHC:heads2:hs64:page16384"), ("num_layers", 3), ("block_size", 64),
    ("hash_algo", "xxhash"), ("shard", "tp1of2")])
def test_every_namespace_field_changes_the_keys(field, value):
    h = bytes(range(32))
    assert B.block_key(ns().key_prefix(), h) != B.block_key(ns(**{field: value}).key_prefix(), h)
    assert ns().digest() != ns(**{field: value}).digest()


def test_key_is_prefix_then_vllm_hash_hex():
    h = bytes(range(32))
    assert B.block_key(b"p/", h) == b"p/" + h.hex().encode()


def _hdr(**over):
    base = dict(namespace_digest=ns().digest(), block_hash=b"h" * 32, parent_hash=b"p" * 32,
                tokens=B.token_digest(list(range(32))), num_tokens=32, payload_bytes=4096)
    base.update(over)
    return B.BlockHeader(**base)


def test_header_round_trip():
    raw = _hdr().pack()
    assert len(raw) == B.HEADER_SIZE
    assert _hdr().check(raw) is None


@pytest.mark.parametrize("over,why", [
    (dict(namespace_digest=ns(shard="tp1of2").digest()), "namespace"),
    (dict(block_hash=b"x" * 32), "block hash"),
    (dict(parent_hash=b"q" * 32), "parent"),
    (dict(tokens=B.token_digest(list(range(1, 33)))), "token"),
    (dict(payload_bytes=8192), "payload")])
def test_header_mismatch_is_a_miss_with_a_reason(over, why):
    stored = _hdr(**over).pack()
    assert why in _hdr().check(stored)


def test_header_rejects_garbage_and_truncation():
    assert "magic" in _hdr().check(bytes(B.HEADER_SIZE))
    assert "truncated" in _hdr().check(_hdr().pack()[:100])
    raw = bytearray(_hdr().pack())
    raw[-1] = 1
    assert "padding" in _hdr().check(bytes(raw))


def test_token_digest_depends_on_order_and_values():
    assert B.token_digest([1, 2]) != B.token_digest([2, 1])
    assert B.token_digest([1, 2]) != B.token_digest([1, 2, 0])


def test_runs_of_dense_blocks():
    # [B=4, H=2, N=32, C=128] float32, contiguous: one run per block.
    shape, esize = (4, 2, 32, 128), 4
    strides = (2 * 32 * 128, 32 * 128, 128, 1)
    assert B.block_runs(shape, strides, esize, 0, 0) == [(0, 2 * 32 * 128 * 4)]
    assert B.block_runs(shape, strides, esize, 10, 3) == [((10 + 3 * 8192) * 4, 32768)]


def test_runs_follow_strides_not_assumptions():
    # Heads outermost ([H, B, N, C] memory) viewed as [B, H, N, C]: one run per head.
    H, NB, N, C = 2, 4, 32, 128
    strides = (N * C, NB * N * C, C, 1)
    runs = B.block_runs((NB, H, N, C), strides, 2, 0, 1)
    assert runs == [(1 * N * C * 2, N * C * 2), ((NB * N * C + N * C) * 2, N * C * 2)]
    # Layers outermost with blocks inside (cross-layer view) merge when adjacent.
    assert B.merge_runs([(0, 0, 10), (0, 10, 5), (1, 15, 1), (0, 15, 2)]) == [
        (0, 0, 15), (1, 15, 1), (0, 15, 2)]


@pytest.mark.parametrize("shape,strides,offset", [
    ((4, 2, 32, 128), (2 * 32 * 128, 32 * 128, 128, 1), 10),           # dense
    ((4, 2, 32, 128), (32 * 128, 4 * 32 * 128, 128, 1), 0),            # heads outermost
    ((6, 2, 2, 16, 8), (2 * 16 * 8, 6 * 2 * 2 * 16 * 8, 6 * 16 * 8, 8, 1), 3),  # K/V and heads apart
])
def test_a_blocks_runs_are_block_zeros_shifted(shape, strides, offset):
    # The connector computes block b's runs as block 0's shifted by b * stride[0] bytes.
    esize = 2
    block0 = B.block_runs(shape, strides, esize, offset, 0)
    for b in range(shape[0]):
        shifted = [(o + b * strides[0] * esize, n) for o, n in block0]
        assert B.block_runs(shape, strides, esize, offset, b) == shifted


def test_runs_reject_bad_geometry():
    with pytest.raises(ValueError):
        B.block_runs((4, 8), (8, 1), 4, 0, 4)
    with pytest.raises(ValueError):
        B.block_runs((4, 2, 8), (16, 4, 1), 4, 0, 0)  # overlapping elements
    with pytest.raises(ValueError):
        B.block_runs((4, 8), (-8, 1), 4, 0, 0)


def test_fingerprint_differs_for_other_weights(tmp_path):
    for name, seed in (("a", 1), ("b", 2)):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text("{}")
        (d / "model.safetensors").write_bytes(bytes([seed]) * 300000)
    assert B.model_fingerprint(str(tmp_path / "a")) != B.model_fingerprint(str(tmp_path / "b"))
    assert B.model_fingerprint("org/model", "r1") != B.model_fingerprint("org/model", "r2")


def test_pack_header_is_what_the_header_packs():
    """The worker packs from digests (pack_header); it must write and expect exactly the bytes
    BlockHeader.pack() gives, padding zero."""
    h = _hdr()
    raw = B.pack_header(h.namespace_digest, B.digest16(h.block_hash), B.digest16(h.parent_hash),
                        h.tokens, h.num_tokens, h.payload_bytes)
    assert raw == h.pack() and len(raw) == B.HEADER_SIZE
    assert h.check(raw) is None
    assert raw[-40:] == bytes(40)
