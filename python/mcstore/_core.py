"""Request building and input validation shared by Client and AsyncClient.

Everything here is pure: it turns Python arguments into Store requests (raising TypeError or
ValueError on bad input before anything is sent). Answers are read in mcstore._answers.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from mcstore import _wire as W
from mcstore._buffers import Slice, SharedBuffer
from mcstore._proto import store_pb2

KeyLike = Union[bytes, bytearray, str]
ValueLike = Any  # bytes | bytearray | memoryview | numpy.ndarray | torch.Tensor | Slice | list[Slice]
IntoLike = Optional[Union[Slice, Sequence[Slice], "PreparedSlices"]]
# get's `into` and put's `values` for a whole batch: one per key, or a LayoutBlocks.
IntoArg = Optional[Union[Sequence[IntoLike], "LayoutBlocks"]]
ValuesArg = Union[Sequence[ValueLike], "LayoutBlocks"]

_UINT32_MAX = (1 << 32) - 1
_UINT64_MAX = (1 << 64) - 1


# The hand-written request bytes below (prepared slices, block layouts) take every field key
# from mcstore._wire, which reads them from the generated store.proto descriptors.


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint of an unsigned 64-bit integer."""
    if n < 0x80:
        return _SMALL_VARINTS[n]
    return W.varint(n)


_SMALL_VARINTS = [bytes((i,)) for i in range(0x80)]


def _slice_body(buffer_id: int, offset: int, length: int) -> bytes:
    """A Slice message's bytes, as protobuf writes them (fields in order, zeros left out)."""
    return ((W.SLICE_BUFFER_ID + _varint(buffer_id) if buffer_id else b"")
            + (W.SLICE_OFFSET + _varint(offset) if offset else b"")
            + (W.SLICE_LENGTH + _varint(length) if length else b""))


def _strided_body(buffer_id: int, offset: int, length: int, stride: int) -> bytes:
    """A StridedSlice message's bytes (a block layout's run), as protobuf writes them."""
    return ((W.STRIDED_BUFFER_ID + _varint(buffer_id) if buffer_id else b"")
            + (W.STRIDED_OFFSET + _varint(offset) if offset else b"")
            + (W.STRIDED_LENGTH + _varint(length) if length else b"")
            + (W.STRIDED_STRIDE + _varint(stride) if stride else b""))


def _field(key: bytes, body: bytes) -> bytes:
    """One length-delimited field: its key (mcstore._wire), the body's length, the body."""
    return key + _varint(len(body)) + body


def encode_key(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytearray, memoryview)):
        return bytes(key)
    raise TypeError("a key must be bytes or str, got %s" % type(key).__name__)


_BYTES_ONLY = {bytes}
_STR_ONLY = {str}
_SLICE_ONLY = {Slice}
_INT_ONLY = {int}


def encode_keys(keys: Any) -> List[bytes]:
    if type(keys) is list:  # the common cases, every key bytes or every key str: one pass in C
        types = set(map(type, keys))
        if types == _BYTES_ONLY:
            return keys[:]
        if types == _STR_ONLY:
            return list(map(str.encode, keys))  # UTF-8, as encode_key
    if isinstance(keys, (bytes, str, bytearray)):
        raise TypeError("keys must be a sequence of keys, not a single %s (wrap it in a list)"
                        % type(keys).__name__)
    try:
        return [encode_key(k) for k in keys]
    except TypeError as e:
        if "key must be" in str(e):
            raise
        raise TypeError("keys must be a sequence of bytes or str, got %s"
                        % type(keys).__name__) from None


class SliceChecker:
    """Checks Slices against the buffers one client knows: its SharedBuffers (open, owned by
    this client) and the (id -> size) of buffers registered with register_buffer()."""

    def __init__(self, owner: object) -> None:
        self.owner = owner
        self.sizes: Dict[int, int] = {}

    def check(self, s: Any, what: Any) -> None:
        """Raises TypeError/ValueError unless `s` is a Slice of a buffer this client knows, in
        bounds; `what` names it in the error (a str, or a (format, value) pair formatted only
        then)."""
        if not isinstance(s, Slice):
            raise TypeError("%s: expected a mcstore.Slice, got %s"
                            % (_what(what), type(s).__name__))
        if s.buffer is not None:
            if s.buffer._owner is not self.owner:
                raise ValueError("%s: the slice's buffer %s is registered with another client "
                                 "(buffer ids are per daemon)" % (_what(what), s.buffer.name))
            if s.buffer.id != s.buffer_id:
                raise ValueError("%s: the slice names buffer id %d but its buffer is now id %d "
                                 "(re-registered): make the slice again"
                                 % (_what(what), s.buffer_id, s.buffer.id))
            s.buffer._check_range(s.offset, s.length)  # also raises when the buffer is closed
            return
        size = self.sizes.get(s.buffer_id)
        if size is None:
            raise ValueError("%s: buffer id %d is not registered through this client"
                             % (_what(what), s.buffer_id))
        if s.offset > size or s.length > size - s.offset:
            raise ValueError("%s: slice [%d, %d) is outside buffer %d of %d bytes"
                             % (_what(what), s.offset, s.end, s.buffer_id, size))

    def slices(self, value: Any, what: str) -> List[Slice]:
        items = [value] if isinstance(value, Slice) else list(value)
        if not items:
            raise ValueError("%s: an empty list of slices" % what)
        for j, s in enumerate(items):
            self.check(s, "%s, slice %d" % (what, j))
        return items


class PreparedSlices:
    """The Slices of one item, checked once and kept as a ready request fragment, for callers
    that move the same geometry again and again (the vLLM connector: a block id's slices never
    change). Pass it where a list of Slices goes (`put` values, `get` into). Each use checks
    only that its buffers are still registered, open and the same (per buffer, not per slice).
    Made by Client.prepare_slices(); valid with the Client that made it."""

    __slots__ = ("_owner", "length", "count", "_shared", "_registered", "_get_raw", "_put_raw")

    def __init__(self, slices: Any, checker: "SliceChecker") -> None:
        items = checker.slices(slices, "prepare_slices")
        self._owner = checker.owner
        self.count = len(items)
        # Kept as the repeated Slice field's wire bytes (GetItem.slices, PutItem.slices):
        # a batch of prepared items is then written as bytes (build_get/build_put), not built
        # message by message, and a mixed batch merges them in (MergeFromString).
        bodies = []
        total = 0
        shared: Dict[int, Tuple[SharedBuffer, int]] = {}
        registered: Dict[int, int] = {}
        for sl in items:
            bodies.append(_slice_body(sl.buffer_id, sl.offset, sl.length))
            total += sl.length
            if sl.buffer is not None:
                shared[id(sl.buffer)] = (sl.buffer, sl.buffer_id)
            else:
                registered[sl.buffer_id] = checker.sizes[sl.buffer_id]
        self.length = total
        self._get_raw = b"".join([_field(W.GET_ITEM_SLICES, b) for b in bodies])
        self._put_raw = b"".join([_field(W.PUT_ITEM_SLICES, b) for b in bodies])
        self._shared = list(shared.values())
        self._registered = list(registered.items())

    def check(self, checker: "SliceChecker", what: str) -> None:
        """Raises ValueError unless every buffer is still as when it was prepared."""
        if self._owner is not checker.owner:
            raise ValueError("%s: slices prepared by another client (buffer ids are per "
                             "daemon)" % what)
        for buf, buffer_id in self._shared:
            if buf.closed or buf.id != buffer_id:
                raise ValueError("%s: prepared slices name buffer %s (id %d), which is now "
                                 "closed or re-registered: prepare them again"
                                 % (what, buf.name, buffer_id))
        for buffer_id, size in self._registered:
            if checker.sizes.get(buffer_id) != size:
                raise ValueError("%s: prepared slices name buffer id %d, which is no longer "
                                 "registered through this client" % (what, buffer_id))

    def __repr__(self) -> str:
        return "PreparedSlices(%d slices, %d bytes)" % (self.count, self.length)


class BlockLayout:
    """Slices that repeat for every block of paged buffers (a vLLM KV cache: one run per layer
    and K/V, block i at offset + i * stride). A batch of such blocks is sent as the runs once
    plus one block index per item (BatchGetRequest/BatchPutRequest.block_layout): nothing is
    prepared or kept per block, and the daemon expands each item into exactly the slices it
    stands for, with the same checks. Made by Client.block_layout(); valid with that Client.
    Pass `layout.blocks(indices)` as get's `into` or put's `values`.

    Needs an mc-client that knows block layouts: an older one answers a layout get with
    bytes_written 0 (an INTERNAL result here, never OK) and stores a layout put as an empty
    object, so prove it once (put then get one block) where an older daemon may run."""

    __slots__ = ("_prepared", "strides", "block_length", "num_blocks", "_raw_get", "_raw_put",
                 "_runs")

    def __init__(self, runs: Any, checker: "SliceChecker") -> None:
        runs = list(runs)
        if not runs:
            raise ValueError("block_layout: no runs")
        firsts = []
        strides = []
        for j, run in enumerate(runs):
            if not isinstance(run, tuple) or len(run) != 2:
                raise TypeError("block_layout run %d: expected (Slice of block 0, stride), got %r"
                                % (j, run))
            sl, stride = run
            if isinstance(stride, bool) or not isinstance(stride, int):
                raise TypeError("block_layout run %d: stride must be an int" % j)
            if stride < 0 or stride > _UINT64_MAX:
                raise ValueError("block_layout run %d: stride %d outside [0, 2^64)" % (j, stride))
            firsts.append(sl)
            strides.append(stride)
        # Checks every run's block 0 (type, buffer, bounds) and keeps the per-request check.
        self._prepared = PreparedSlices(firsts, checker)
        self.strides = tuple(strides)
        self.block_length = self._prepared.length
        # Blocks [0, num_blocks) lie inside every run's buffer.
        limit: Optional[int] = None
        for sl, stride in zip(firsts, strides):
            size = sl.buffer.size if sl.buffer is not None else checker.sizes[sl.buffer_id]
            if stride:
                n = (size - sl.offset - sl.length) // stride + 1
                limit = n if limit is None else min(limit, n)
        self.num_blocks = limit if limit is not None else _UINT64_MAX + 1
        self._runs = [(sl.buffer_id, sl.offset, sl.length, st) for sl, st in zip(firsts, strides)]
        bodies = [_strided_body(b, o, n, st) for b, o, n, st in self._runs]
        self._raw_get = b"".join(_field(W.GET_BLOCK_LAYOUT, b) for b in bodies)
        self._raw_put = b"".join(_field(W.PUT_BLOCK_LAYOUT, b) for b in bodies)

    def blocks(self, indices: Sequence[int]) -> "LayoutBlocks":
        """The blocks `indices` (one per key, in order), as get's `into` or put's `values`."""
        return LayoutBlocks(self, indices)

    def slices(self, index: int) -> List[Slice]:
        """Block `index` as the Slices it stands for (what the daemon reads or writes)."""
        i = self._index(index, "block_layout")
        return [Slice(b, o + i * st, n) for b, o, n, st in self._runs]

    def _index(self, i: Any, what: Any) -> int:
        """i as a block index of this layout; `what` (or what % j for a (format, j) pair,
        formatted only on an error) names it in the exception."""
        if type(i) is not int:   # numpy integers are fine; bools, floats and strings are not
            if isinstance(i, bool) or not hasattr(i, "__index__"):
                raise TypeError("%s: a block index must be an int, got %s"
                                % (_what(what), type(i).__name__))
            i = i.__index__()
        if i < 0 or i >= self.num_blocks:
            raise ValueError("%s: block %d outside the layout's [0, %d)"
                             % (_what(what), i, self.num_blocks))
        return i

    def __repr__(self) -> str:
        return "BlockLayout(%d runs, %d bytes per block, %d blocks)" % (
            len(self.strides), self.block_length, self.num_blocks)


def _what(what: Any) -> str:
    return what[0] % what[1] if isinstance(what, tuple) else what


class LayoutBlocks:
    """Blocks of one BlockLayout, one per key: BlockLayout.blocks(indices). Immutable: the
    indices are checked against the layout once, here, and a request is written from them
    without checking again (a changed index could name another block's bytes)."""

    __slots__ = ("_layout", "_indices", "_small")

    def __init__(self, layout: BlockLayout, indices: Sequence[int]) -> None:
        if isinstance(indices, (bytes, str, int)):
            raise TypeError("blocks: indices must be a sequence of ints")
        self._layout = layout
        checked = tuple(indices)
        if checked and set(map(type, checked)) == _INT_ONLY:
            high = max(checked)
            if min(checked) >= 0 and high < layout.num_blocks:
                self._indices = checked  # plain ints in range: checked in one pass
                self._small = high < 0x80  # each index's LayoutBlock is in _GET/_PUT_TAILS
                return
        index = layout._index
        self._indices = tuple(index(i, ("blocks item %d", j)) for j, i in enumerate(checked))
        self._small = bool(self._indices) and max(self._indices) < 0x80

    @property
    def layout(self) -> BlockLayout:
        return self._layout

    @property
    def indices(self) -> Tuple[int, ...]:
        """The block indices, one per key (a tuple: fixed once checked)."""
        return self._indices

    def __len__(self) -> int:
        return len(self._indices)

    def __repr__(self) -> str:
        return "LayoutBlocks(%d blocks of %r)" % (len(self._indices), self._layout)


def _block_body(index: int) -> bytes:
    """A LayoutBlock naming `index`, length-prefixed (what follows GetItem/PutItem.block's key)."""
    inner = W.LAYOUT_BLOCK_INDEX + W.varint(index) if index else b""
    return W.varint(len(inner)) + inner


_BLOCK_BODIES = [_block_body(i) for i in range(0x80)]
# GetItem/PutItem.block's key and body, per block index below 0x80.
_GET_TAILS = [W.GET_ITEM_BLOCK + b for b in _BLOCK_BODIES]
_PUT_TAILS = [W.PUT_ITEM_BLOCK + b for b in _BLOCK_BODIES]
_HEADS_CACHE_MAX = 64  # key lengths whose item heads are kept (then the cache restarts)
# (get, key length) -> per block index below 0x80: what precedes an item's key in a layout
# request (the items field's key, the item's length, the key field's key, the key's length).
_heads: Dict[Tuple[bool, int], List[bytes]] = {}


def _item_heads(get: bool, n: int) -> List[bytes]:
    """Per block index below 0x80, the bytes before an item's key of `n` > 0 bytes."""
    heads = _heads.get((get, n))
    if heads is None:
        items_key, key_key, tails = ((W.GET_ITEMS, W.GET_ITEM_KEY, _GET_TAILS) if get
                                     else (W.PUT_ITEMS, W.PUT_ITEM_KEY, _PUT_TAILS))
        key_field = key_key + _varint(n)
        heads = [items_key + _varint(len(key_field) + n + len(t)) + key_field for t in tails]
        if len(_heads) >= _HEADS_CACHE_MAX:
            _heads.clear()
        _heads[(get, n)] = heads
    return heads


def _layout_request(bkeys: List[bytes], blocks: LayoutBlocks, get: bool, field2: int,
                    checker: SliceChecker, token: bytes = b"") -> bytes:
    """A BatchGetRequest (get) or BatchPutRequest naming each item's block of one layout,
    written as bytes: the items (key, then block: a LayoutBlock naming the index), lease_id /
    replicas (`field2`) when not zero, then the layout's runs (block_layout), then a get's
    lease_token when not empty (protobuf's own order: by field number)."""
    indices = blocks._indices
    if len(indices) != len(bkeys):
        raise ValueError("%s: %d keys but %d blocks" % ("get" if get else "put", len(bkeys),
                                                         len(indices)))
    layout = blocks._layout
    layout._prepared.check(checker, "block layout")
    if get:
        items_key, key_key, block_key, field2_key = (W.GET_ITEMS, W.GET_ITEM_KEY,
                                                     W.GET_ITEM_BLOCK, W.GET_LEASE_ID)
    else:
        items_key, key_key, block_key, field2_key = (W.PUT_ITEMS, W.PUT_ITEM_KEY,
                                                     W.PUT_ITEM_BLOCK, W.PUT_REPLICAS)
    tails = _GET_TAILS if get else _PUT_TAILS
    key_overhead = len(key_key) + 1
    lengths = set(map(len, bkeys)) if blocks._small else set()
    n = lengths.pop() if len(lengths) == 1 else 0
    if n > 0:
        # Every key of one length, every index below 0x80 (the common batch): the items are
        # (head, key, tail) triples laid out by slice assignment, no loop in Python.
        heads = _heads.get((get, n)) or _item_heads(get, n)
        parts = [b""] * (3 * len(bkeys))
        parts[0::3] = map(heads.__getitem__, indices)
        parts[1::3] = bkeys
        parts[2::3] = map(tails.__getitem__, indices)
    else:
        parts = []
        small = _SMALL_VARINTS
        extend = parts.extend
        for k, i in zip(bkeys, indices):
            tail = tails[i] if i < 0x80 else block_key + _block_body(i)
            n = len(k)
            size = key_overhead + n + len(tail)
            if 0 < n and size < 0x80:  # both lengths are one-byte varints
                extend((items_key, small[size], key_key, small[n], k, tail))
            else:
                item = (_field(key_key, k) if k else b"") + tail
                parts.append(items_key + _varint(len(item)) + item)
    append = parts.append
    if field2:
        append(field2_key + _varint(field2))
    append(layout._raw_get if get else layout._raw_put)
    if token:
        append(_field(W.GET_LEASE_TOKEN, token))
    return b"".join(parts)


def _is_torch_tensor(v: Any) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "data_ptr")


def inline_bytes(value: Any, what: str) -> bytes:
    """The bytes of an inline put value (a copy is unavoidable: gRPC sends them)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, memoryview):
        if not value.c_contiguous:
            raise ValueError("%s: memoryview is not C-contiguous" % what)
        return value.tobytes()
    if isinstance(value, str):
        raise TypeError("%s: a value must be bytes-like, not str (encode it)" % what)
    if _is_torch_tensor(value):
        if value.device.type != "cpu":
            raise ValueError("%s: tensor is on %s; copy it to the CPU or into a SharedBuffer"
                             % (what, value.device))
        if not value.is_contiguous():
            raise ValueError("%s: tensor is not contiguous (strides %s)"
                             % (what, tuple(value.stride())))
        import ctypes
        return ctypes.string_at(value.data_ptr(), value.numel() * value.element_size())
    import numpy as np  # a dependency; imported late to keep `import mcstore` light
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("%s: numpy array of dtype %s holds Python objects, not bytes"
                            % (what, value.dtype))
        if not value.flags["C_CONTIGUOUS"]:
            raise ValueError("%s: numpy array is not C-contiguous (strides %s)"
                             % (what, value.strides))
        return value.tobytes()
    raise TypeError("%s: unsupported value type %s (bytes, memoryview, numpy array, torch "
                    "tensor, Slice or list of Slices)" % (what, type(value).__name__))


def _is_slices(value: Any) -> bool:
    if isinstance(value, Slice):
        return True
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(s, Slice) for s in value):
            return True
        if any(isinstance(s, Slice) for s in value):
            raise TypeError("a value mixes Slices and other objects")
        if not value:
            raise ValueError("an empty list of slices")
    return False


def _add_slices(repeated: Any, slices: List[Slice]) -> int:
    """Appends `slices` to a repeated Slice field; returns their total length."""
    total = 0
    add = repeated.add
    for s in slices:
        add(buffer_id=s.buffer_id, offset=s.offset, length=s.length)
        total += s.length
    return total


def check_replicas(replicas: Optional[int]) -> int:
    if replicas is None:
        return 0
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise TypeError("replicas must be an int, got %s" % type(replicas).__name__)
    if replicas < 1 or replicas > _UINT32_MAX:
        raise ValueError("replicas must be >= 1 (or None for the daemon's default), got %d"
                         % replicas)
    return replicas


def build_put(keys: Sequence[KeyLike], values: ValuesArg, replicas: Optional[int],
              checker: SliceChecker) -> Tuple[Any, List[bytes]]:
    bkeys = encode_keys(keys)
    if isinstance(values, (bytes, bytearray, str, memoryview)):
        raise TypeError("values must be a sequence with one value per key")
    if type(values) is LayoutBlocks:
        return _layout_request(bkeys, values, False, check_replicas(replicas), checker), bkeys
    values = list(values)
    if len(values) != len(bkeys):
        raise ValueError("put: %d keys but %d values" % (len(bkeys), len(values)))
    n_replicas = check_replicas(replicas)
    if values and all(type(v) is PreparedSlices for v in values):
        return _prepared_request(bkeys, values, False, n_replicas, checker), bkeys
    if values and set(map(type, values)) == _SLICE_ONLY:
        return _one_slice_request(bkeys, values, False, n_replicas, checker), bkeys
    req = store_pb2().BatchPutRequest(replicas=n_replicas)
    items = req.items
    for i, (k, v) in enumerate(zip(bkeys, values)):
        if isinstance(v, bytes):  # the common inline case first
            items.add(key=k, data=v)
            continue
        what = "put item %d" % i
        if type(v) is PreparedSlices:
            v.check(checker, what)
            items.add(key=k).MergeFromString(v._put_raw)
            continue
        try:
            slices = _is_slices(v)
        except (TypeError, ValueError) as e:
            raise type(e)("%s: %s" % (what, e)) from None
        if slices:
            _add_slices(items.add(key=k).slices, checker.slices(v, what))
        else:
            items.add(key=k, data=inline_bytes(v, what))
    return req, bkeys


def build_get(keys: Sequence[KeyLike], into: IntoArg, lease: Any,
              checker: SliceChecker) -> Tuple[Any, List[bytes], List[Optional[int]]]:
    """The request, the keys, and per item the total length of its slices (None = inline)."""
    bkeys = encode_keys(keys)
    lease_id, token = (0, b"") if lease is None else lease_of(lease)
    if type(into) is LayoutBlocks:
        return (_layout_request(bkeys, into, True, lease_id, checker, token), bkeys,
                [into.layout.block_length] * len(bkeys))
    if into is not None:
        into = list(into)
        if len(into) != len(bkeys):
            raise ValueError("get: %d keys but %d destinations in `into`"
                             % (len(bkeys), len(into)))
        if into and all(type(d) is PreparedSlices for d in into):
            return (_prepared_request(bkeys, into, True, lease_id, checker, token), bkeys,
                    [d.length for d in into])
        if into and set(map(type, into)) == _SLICE_ONLY:
            return (_one_slice_request(bkeys, into, True, lease_id, checker, token), bkeys,
                    [d.length for d in into])
    lengths: List[Optional[int]] = [None] * len(bkeys)
    req = store_pb2().BatchGetRequest(lease_id=lease_id, lease_token=token)
    items = req.items
    for i, k in enumerate(bkeys):
        item = items.add(key=k)
        dest = None if into is None else into[i]
        if dest is None:
            continue
        what = "get item %d" % i
        if type(dest) is PreparedSlices:
            dest.check(checker, what)
            item.MergeFromString(dest._get_raw)
            lengths[i] = dest.length
            continue
        if not isinstance(dest, (Slice, list, tuple)):
            raise TypeError("%s: `into` entries must be a Slice, a list of Slices, "
                            "PreparedSlices or None, got %s"
                            % (what, type(dest).__name__))
        lengths[i] = _add_slices(item.slices, checker.slices(dest, what))
    return req, bkeys, lengths


_SLICE_BODY_CACHE_MAX = 1 << 16  # Slice messages kept written (then the cache restarts)
_slice_bodies: Dict[Tuple[int, int, int], bytes] = {}


def _slice_field(key: bytes, s: Slice) -> bytes:
    """GetItem/PutItem.slices (`key`) holding the one Slice `s`, as protobuf writes it."""
    geometry = (s.buffer_id, s.offset, s.length)
    body = _slice_bodies.get(geometry)
    if body is None:
        body = _slice_body(*geometry)
        if len(_slice_bodies) >= _SLICE_BODY_CACHE_MAX:
            _slice_bodies.clear()
        _slice_bodies[geometry] = body
    return key + _SMALL_VARINTS[len(body)] + body  # three keys and varints: under 0x80 bytes


def _one_slice_request(bkeys: List[bytes], slices: List[Slice], get: bool, field2: int,
                       checker: SliceChecker, token: bytes = b"") -> bytes:
    """A BatchGetRequest (get) or BatchPutRequest whose every item is one Slice, checked as
    SliceChecker.slices checks it on the message path and written as bytes, byte for byte what
    that path serializes (see _prepared_request for the order)."""
    if get:
        items_key, key_key, slices_key, field2_key, what = (
            W.GET_ITEMS, W.GET_ITEM_KEY, W.GET_ITEM_SLICES, W.GET_LEASE_ID, "get item %d, slice 0")
    else:
        items_key, key_key, slices_key, field2_key, what = (
            W.PUT_ITEMS, W.PUT_ITEM_KEY, W.PUT_ITEM_SLICES, W.PUT_REPLICAS, "put item %d, slice 0")
    check = checker.check
    parts = []
    append = parts.append
    for i, (k, s) in enumerate(zip(bkeys, slices)):
        check(s, (what, i))
        item = (_field(key_key, k) if k else b"") + _slice_field(slices_key, s)
        append(items_key + _varint(len(item)) + item)
    if field2:
        append(field2_key + _varint(field2))
    if token:
        append(_field(W.GET_LEASE_TOKEN, token))
    return b"".join(parts)


def _prepared_request(bkeys: List[bytes], items: List["PreparedSlices"], get: bool,
                      field2: int, checker: SliceChecker, token: bytes = b"") -> bytes:
    """A BatchGetRequest (get) or BatchPutRequest whose every item is PreparedSlices, written
    directly as bytes, byte for byte what the message path serializes: the items (key, then the
    prepared slices), then lease_id in the one and replicas in the other (`field2`), a varint
    left out when zero, then a get's lease_token when not empty."""
    what = "get item %d" if get else "put item %d"
    items_key, key_key, field2_key = ((W.GET_ITEMS, W.GET_ITEM_KEY, W.GET_LEASE_ID) if get
                                      else (W.PUT_ITEMS, W.PUT_ITEM_KEY, W.PUT_REPLICAS))
    parts = []
    for i, (k, p) in enumerate(zip(bkeys, items)):
        p.check(checker, what % i)
        parts.append(_field(items_key, (_field(key_key, k) if k else b"")
                            + (p._get_raw if get else p._put_raw)))
    if field2:
        parts.append(field2_key + _varint(field2))
    if token:
        parts.append(_field(W.GET_LEASE_TOKEN, token))
    return b"".join(parts)


_TOKEN_MAX = 64  # bytes; the daemon's capabilities are 16


def lease_of(lease: Any) -> Tuple[int, bytes]:
    """(lease id, capability) of a Lease, a LeaseRef, a (lease_id, token) pair, a bare lease id
    (no capability: only the caller that took it may use it) or None (0, b"")."""
    if lease is None:
        return 0, b""
    if isinstance(lease, tuple) and len(lease) == 2:
        lease_id, token = lease
    else:
        lease_id = getattr(lease, "lease_id", lease)
        token = getattr(lease, "token", b"")
    if isinstance(lease_id, bool) or not isinstance(lease_id, int) or lease_id < 0:
        raise TypeError("lease must be a Lease, a LeaseRef, a lease id (int >= 0) or None, got "
                        "%r" % (lease,))
    if lease_id > _UINT64_MAX:
        raise ValueError("lease id %d does not fit in 64 bits" % lease_id)
    if token is None:
        token = b""
    if not isinstance(token, (bytes, bytearray)) or len(token) > _TOKEN_MAX:
        raise TypeError("a lease token must be bytes (at most %d), got %r"
                        % (_TOKEN_MAX, type(token).__name__))
    return lease_id, bytes(token)


def lease_id_of(lease: Any) -> int:
    return lease_of(lease)[0]


def build_match(keys: Sequence[KeyLike], lease_ttl_ms: int, packed: bool) -> Tuple[Any, List[bytes]]:
    spb = store_pb2()
    bkeys = encode_keys(keys)
    if isinstance(lease_ttl_ms, bool) or not isinstance(lease_ttl_ms, int):
        raise TypeError("lease_ttl_ms must be an int")
    if lease_ttl_ms < 0 or lease_ttl_ms > _UINT32_MAX:
        raise ValueError("lease_ttl_ms must be in [0, 2^32), got %d" % lease_ttl_ms)
    if packed and bkeys:
        for k in bkeys:
            if len(k) > _UINT32_MAX:
                raise ValueError("key too long")
        req = spb.MatchPrefixRequest(packed_keys=b"".join(bkeys),
                                     packed_key_sizes=[len(k) for k in bkeys],
                                     lease_ttl_ms=lease_ttl_ms)
    else:
        req = spb.MatchPrefixRequest(keys=bkeys, lease_ttl_ms=lease_ttl_ms)
    return req, bkeys
