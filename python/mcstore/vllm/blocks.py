"""What one stored KV block is: its key, its namespace, its header, and where its bytes live.

Pure Python (no vLLM import), so the rules can be unit-tested on their own:

- namespace(): one string per (model identity, KV dtype, KV layout, block size, TP shard, hash
  algorithm, user namespace). Two engines share blocks only when every one of these agrees.
- block_key(): the namespace's prefix, then vLLM's own chained block hash in hex.
- BlockHeader: 128 bytes stored in front of every block's KV bytes: a magic, the namespace digest,
  the block hash, the parent block hash and a digest of the block's token ids. A load checks all of
  them, so a hash collision, a foreign namespace or a torn object is a miss, never wrong KV.
- block_runs(): the byte ranges (offset, length) of one block inside a KV tensor's storage, read
  from the tensor's strides (no layout is hard-coded), merged where they touch.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

HEADER_SIZE = 128
_MAGIC = b"MCKVBLK1"
# magic, version, num_tokens, payload bytes, then four 16-byte digests; the rest is zero.
_HEADER = struct.Struct("<8sIIQ16s16s16s16s")
_PACKED = struct.Struct("<8sIIQ16s16s16s16s%dx" % (HEADER_SIZE - _HEADER.size))  # + zero padding
_VERSION = 1
_FINGERPRINT_SAMPLES = 16
_FINGERPRINT_CHUNK = 64 << 10


def digest16(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def token_digest(token_ids: Sequence[int]) -> bytes:
    """A digest of one block's token ids (as little-endian int64)."""
    return digest16(struct.pack("<%dq" % len(token_ids), *token_ids))


def model_fingerprint(model: str, revision: str | None = None) -> str:
    """Identity of the model's weights.

    A local directory is fingerprinted by content: config.json in full, and for every weight file
    its name, size and 16 chunks of 64 KiB spread over it (two checkpoints of one architecture with
    different weights differ there; hashing every byte of a large checkpoint would take minutes).
    A hub id is identified by its name and revision.
    """
    h = hashlib.sha256()
    if os.path.isdir(model):
        names = sorted(os.listdir(model))
        for name in names:
            path = os.path.join(model, name)
            if name == "config.json":
                with open(path, "rb") as f:
                    h.update(b"config.json\0" + f.read())
            elif name.endswith((".safetensors", ".bin", ".pt", ".gguf")):
                size = os.path.getsize(path)
                h.update(("%s\0%d\0" % (name, size)).encode())
                with open(path, "rb") as f:
                    for i in range(_FINGERPRINT_SAMPLES):
                        f.seek(size * i // _FINGERPRINT_SAMPLES)
                        h.update(f.read(_FINGERPRINT_CHUNK))
    else:
        h.update(("hub\0%s\0%s" % (model, revision or "")).encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class NamespaceSpec:
    """Everything that must agree for two engines to share a block's bytes."""
    user_namespace: str          # kv_connector_extra_config["namespace"], e.g. a deployment name
    model_name: str              # readable: the model path's last component or the hub id
    model_fingerprint: str       # model_fingerprint() or the operator's "model_id"
    kv_dtype: str                # e.g. "torch.float32"
    layout: str                  # resolved KV layout and per-layer page shape, e.g. "LBHNC:2x32x512"
    num_layers: int
    block_size: int
    hash_algo: str               # vLLM's prefix_caching_hash_algo
    shard: str                   # "tp0of1", or "mla" when every rank holds the same bytes

    def describe(self) -> str:
        return ("ns=%s model=%s fp=%s dtype=%s layout=%s layers=%d bs=%d hash=%s shard=%s"
                % (self.user_namespace, self.model_name, self.model_fingerprint, self.kv_dtype,
                   self.layout, self.num_layers, self.block_size, self.hash_algo, self.shard))

    def digest(self) -> bytes:
        return digest16(self.describe().encode())

    def key_prefix(self) -> bytes:
        """The readable head of every key of this namespace; its digest covers the rest."""
        safe_model = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.model_name)[-64:]
        return ("%s/%s/%s/%s/" % (self.user_namespace, safe_model, self.shard,
                                  self.digest().hex()[:16])).encode()


def block_key(prefix: bytes, block_hash: bytes) -> bytes:
    return prefix + bytes(block_hash).hex().encode()


def pack_header(namespace_digest: bytes, key_digest: bytes, parent_digest: bytes, tokens: bytes,
                num_tokens: int, payload_bytes: int) -> bytes:
    """The HEADER_SIZE bytes stored in front of a block, from digest16() of its block hash and of
    its parent's (what BlockHeader.pack() writes). For callers packing a chain of blocks, where a
    block's parent digest is the key digest of the block before it."""
    return _PACKED.pack(_MAGIC, _VERSION, num_tokens, payload_bytes, namespace_digest, key_digest,
                        parent_digest, tokens)


@dataclass(frozen=True)
class BlockHeader:
    namespace_digest: bytes
    block_hash: bytes
    parent_hash: bytes
    tokens: bytes                # token_digest() of the block's token ids
    num_tokens: int
    payload_bytes: int

    def pack(self) -> bytes:
        return pack_header(self.namespace_digest, digest16(bytes(self.block_hash)),
                           digest16(bytes(self.parent_hash)), self.tokens, self.num_tokens,
                           self.payload_bytes)

    def check(self, stored: bytes | memoryview) -> str | None:
        """None when `stored` is this header; otherwise why not (a load error, never KV)."""
        stored = bytes(stored[:HEADER_SIZE])
        if len(stored) != HEADER_SIZE:
            return "header truncated (%d bytes)" % len(stored)
        magic, version, ntok, payload, ns, key, parent, tokens = _HEADER.unpack_from(stored)
        if magic != _MAGIC or version != _VERSION:
            return "not a mcstore KV block (magic %r, version %d)" % (magic, version)
        if ns != self.namespace_digest:
            return "namespace mismatch"
        if key != digest16(bytes(self.block_hash)):
            return "block hash mismatch"
        if parent != digest16(bytes(self.parent_hash)):
            return "parent hash mismatch (hash collision?)"
        if tokens != self.tokens or ntok != self.num_tokens:
            return "token digest mismatch (hash collision?)"
        if payload != self.payload_bytes:
            return "payload size %d, expected %d" % (payload, self.payload_bytes)
        if any(stored[_HEADER.size:]):
            return "header padding not zero"
        return None


def block_runs(shape: Sequence[int], strides: Sequence[int], element_size: int,
               storage_offset: int, block: int) -> list[tuple[int, int]]:
    """Byte ranges (offset into the storage, length) holding block `block` of a tensor whose dim 0
    indexes blocks, in the tensor's logical order of the other dims, adjacent ranges merged.

    Works for any strides (a dense block is one range; a block whose heads lie apart is one range
    per head, and so on). Raises ValueError for overlapping or negative strides.
    """
    if len(shape) != len(strides) or not shape:
        raise ValueError("shape %r and strides %r do not match" % (tuple(shape), tuple(strides)))
    if block < 0 or block >= shape[0]:
        raise ValueError("block %d out of range [0, %d)" % (block, shape[0]))
    if any(s < 0 for s in strides):
        raise ValueError("negative strides %r" % (tuple(strides),))
    inner_shape = list(shape[1:])
    inner_strides = list(strides[1:])
    # Fold trailing dims into one contiguous run while they are dense.
    run_elems = 1
    while inner_shape and (inner_shape[-1] == 1 or inner_strides[-1] == run_elems):
        run_elems *= inner_shape[-1]
        inner_shape.pop()
        inner_strides.pop()
    base = storage_offset + block * strides[0]
    runs: list[tuple[int, int]] = []

    def walk(dim: int, offset: int) -> None:
        if dim == len(inner_shape):
            start, length = offset * element_size, run_elems * element_size
            if runs and runs[-1][0] + runs[-1][1] == start:
                runs[-1] = (runs[-1][0], runs[-1][1] + length)
            else:
                runs.append((start, length))
            return
        for i in range(inner_shape[dim]):
            walk(dim + 1, offset + i * inner_strides[dim])

    walk(0, base)
    total = sum(n for _, n in runs)
    expected = element_size
    for n in shape[1:]:
        expected *= n
    if total != expected:
        raise ValueError("block runs cover %d bytes, expected %d" % (total, expected))
    ordered = sorted(runs)
    for (a, n), (b, _) in zip(ordered, ordered[1:]):
        if a + n > b:
            raise ValueError("overlapping strides %r" % (tuple(strides),))
    return runs


def merge_runs(runs: Iterable[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Merges adjacent (buffer, offset, length) ranges that continue each other, keeping order."""
    out: list[tuple[int, int, int]] = []
    for buf, off, n in runs:
        if out and out[-1][0] == buf and out[-1][1] + out[-1][2] == off:
            out[-1] = (buf, out[-1][1], out[-1][2] + n)
        else:
            out.append((buf, off, n))
    return out
