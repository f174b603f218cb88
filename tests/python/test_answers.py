"""The client's cheap paths for the requests and answers of every call (mcstore._core): a block
layout's request written by hand, an all-OK answer recognised by its bytes instead of parsed, and
the results built without the dataclass constructor. Each is checked against the real protobuf
messages and the slow path it stands in for, over random inputs: never a request of another
layout or key set, never an OK the answer does not say byte for byte."""

import dataclasses
import pickle
import random
from typing import Any, List, Optional

import pytest

from mcstore import Code, GetResult, Result, Slice, StoreError
from mcstore import _answers, _core, _errors
from mcstore.v1 import store_pb2

ADDRESS = "unix:/test.sock"


class _Owner:
    pass


def _checker() -> _core.SliceChecker:
    checker = _core.SliceChecker(_Owner())
    checker.sizes[77] = 1 << 40
    checker.sizes[78] = 1 << 30
    return checker


def _reference(keys: List[bytes], layout: _core.BlockLayout, indices: List[int], get: bool,
               field2: int, token: bytes) -> bytes:
    """The request the generated message classes write for the same batch."""
    if get:
        ref = store_pb2.BatchGetRequest(lease_id=field2, lease_token=token)
    else:
        ref = store_pb2.BatchPutRequest(replicas=field2)
    for k, i in zip(keys, indices):
        ref.items.add(key=k).block.index = i
    for (b, o, n, st) in layout._runs:
        ref.block_layout.add(buffer_id=b, offset=o, length=n, stride=st)
    return ref.SerializeToString()


def test_layout_requests_are_the_message_bytes_for_every_layout_and_key_set():
    """Two layouts and changing key sets, interleaved: each request is exactly what protobuf
    writes for that layout and those keys (nothing of an earlier call is reused)."""
    rng = random.Random(11)
    checker = _checker()
    layouts = [_core.BlockLayout([(Slice(77, 5, 300), 1 << 20), (Slice(78, 0, 7), 0)], checker),
               _core.BlockLayout([(Slice(78, 4096, 65536), 65536)], checker)]
    for trial in range(400):
        layout = layouts[trial % 2]
        n = rng.choice([0, 1, 2, 16, 63])
        lengths = [rng.choice([0, 1, 50, 110, 113, 114, 127, 128, 129, 300]) for _ in range(n)]
        keys = [bytes(rng.getrandbits(8) for _ in range(m)) for m in lengths]
        high = min(layout.num_blocks, 1 << 20)
        indices = [rng.choice([0, 1, 127, 128, 16383, 16384, rng.randrange(high)]) % high
                   for _ in range(n)]
        blocks = layout.blocks(indices)
        lease_id = rng.choice([0, 1, 300, (1 << 64) - 1])
        token = rng.choice([b"", b"t" * 16])
        raw, bkeys, want = _core.build_get(keys, blocks, (lease_id, token), checker)
        assert raw == _reference(keys, layout, indices, True, lease_id, token), trial
        assert bkeys == keys and want == [layout.block_length] * n
        replicas = rng.choice([None, 1, 3, (1 << 32) - 1])
        raw, _ = _core.build_put(keys, blocks, replicas, checker)
        assert raw == _reference(keys, layout, indices, False, replicas or 0, b""), trial


def test_layout_requests_of_equal_length_keys_are_the_message_bytes():
    """Batches whose keys are all of one length (the requests written without a loop), at and
    around the lengths where an item's or a key's length takes a second or third varint byte,
    with block indices 0 (an empty LayoutBlock), 1..127 and beyond: each request is what
    protobuf writes."""
    rng = random.Random(12)
    checker = _checker()
    layout = _core.BlockLayout([(Slice(78, 4096, 65536), 65536)], checker)
    for trial in range(600):
        n = rng.choice([1, 2, 16, 63])
        m = rng.choice([1, 16, 100, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127, 128,
                        129, 200, 16383, 16384])
        keys = [bytes(rng.getrandbits(8) for _ in range(m)) for _ in range(n)]
        pick = rng.random()
        indices = [rng.choice([0, 1, 127] if pick < 0.3 else [0, 1, 5, 127, 128, 300])
                   if pick < 0.8 else rng.randrange(128) for _ in range(n)]
        blocks = layout.blocks(indices)
        assert blocks._small == (max(indices) < 128)
        lease_id = rng.choice([0, 1, 300])
        raw, _, _ = _core.build_get(keys, blocks, (lease_id, b""), checker)
        assert raw == _reference(keys, layout, indices, True, lease_id, b""), trial
        raw, _ = _core.build_put(keys, blocks, 2, checker)
        assert raw == _reference(keys, layout, indices, False, 2, b""), trial
    assert len(_core._heads) <= _core._HEADS_CACHE_MAX


def test_keys_are_copied_not_kept():
    keys = [b"a", b"b"]
    out = _core.encode_keys(keys)
    assert out == keys and out is not keys
    assert _core.encode_keys([b"a", "b", bytearray(b"c")]) == [b"a", b"b", b"c"]
    assert _core.encode_keys(["a", "\u00e9"]) == [b"a", "\u00e9".encode("utf-8")]
    with pytest.raises(UnicodeEncodeError):
        _core.encode_keys(["\ud800"])  # a lone surrogate is no UTF-8, on either path
    with pytest.raises(UnicodeEncodeError):
        _core.encode_key("\ud800")
    with pytest.raises(TypeError):
        _core.encode_keys([b"a", 3])


def test_ok_answers_are_what_protobuf_serializes():
    for lengths in ([], [0], [65536] * 16, [1, 127, 128, 1 << 40, 0, 65536]):
        raw = _answers.ok_get_answer(lengths)
        ref = store_pb2.BatchGetResponse()
        for w in lengths:
            ref.results.add(code=store_pb2.OK, size=w, bytes_written=w)
        assert raw == ref.SerializeToString(), lengths
    assert _answers.ok_get_answer([5, None]) is None  # inline data: never read by its bytes
    for rpc in ("BatchPut", "BatchRemove"):
        for n in (0, 1, 16):
            ref = getattr(store_pb2, rpc + "Response")(results=[store_pb2.Result()] * n)
            assert _answers.ok_results_answer(rpc, n) == ref.SerializeToString()


def _outcome(fn: Any) -> Any:
    """fn()'s results as tuples of their fields, or the error it raised."""
    try:
        return [dataclasses.astuple(r) + (type(r),) for r in fn()]
    except StoreError as e:
        return (type(e), e.code, str(e))


def _random_get_answer(rng: random.Random, lengths: List[Optional[int]]) -> bytes:
    resp = store_pb2.BatchGetResponse()
    count = len(lengths) + (rng.choice([-1, 1]) if rng.random() < 0.05 else 0)
    for j in range(max(count, 0)):
        w = lengths[j] if j < len(lengths) else 7
        w = 3 if w is None else w
        r = resp.results.add(size=w, bytes_written=w)
        roll = rng.random()
        if roll < 0.08:
            r.code = rng.choice([1, 6, 7, 9, 12, 99])
        elif roll < 0.12:
            r.size = w + rng.choice([-1, 1, 1 << 33]) if w else 1
        elif roll < 0.16:
            r.bytes_written = rng.randrange(w) if w else 2
        elif roll < 0.18:
            r.message = "note"
        elif roll < 0.20:
            r.data = b"x" * min(w, 64) if w else b"y"
    raw = resp.SerializeToString()
    if rng.random() < 0.03 and raw:
        raw = raw[:-1]  # a truncated answer: does not parse
    return raw


def test_reading_a_get_answer_by_its_bytes_is_parsing_it():
    """read_get_answer of the raw bytes makes exactly the results (or the error) that parsing
    them and checking each item makes: an all-OK answer is read by comparison, any other one
    (a failed item, a short write, an extra field, a count off by one) is parsed."""
    rng = random.Random(5)
    seen_fast = seen_slow = 0
    for trial in range(3000):
        n = rng.choice([0, 1, 3, 16])
        w = rng.choice([0, 1, 4096, 65536, 1 << 40])
        lengths: List[Optional[int]] = (
            [w] * n if rng.random() < 0.6 else [rng.choice([1, 127, 128, 65536]) for _ in range(n)])
        keys = [b"k%d" % j for j in range(n)]
        # Sometimes the answer of another batch: another layout's block size, the same lengths
        # in another order, or one layout's size for a batch of mixed lengths.
        answered = lengths
        roll = rng.random()
        if n and roll < 0.1:
            answered = [rng.choice([1, 127, 128, 65536])] * n
        elif n and roll < 0.2:
            answered = rng.sample(lengths, n)
        elif n and roll < 0.3:
            answered = [lengths[0]] * n
        raw = _random_get_answer(rng, answered)
        fast = raw == _answers.ok_get_answer(lengths)
        seen_fast += fast
        seen_slow += not fast

        def slow() -> List[GetResult]:
            try:
                resp = store_pb2.BatchGetResponse.FromString(raw)
            except Exception as e:
                raise StoreError(Code.INTERNAL, "BatchGet: a fast channel answer that does not "
                                 "parse: %s" % e, address=ADDRESS) from None
            return _answers.parse_get(resp, keys, lengths, ADDRESS)

        got = _outcome(lambda: _answers.read_get_answer(raw, keys, lengths, ADDRESS))
        assert got == _outcome(slow), (trial, raw, lengths)
    assert seen_fast > 500 and seen_slow > 500


def test_an_ok_answer_of_another_batch_is_not_ok():
    lengths = [65536] * 16
    keys = [b"k%d" % j for j in range(16)]
    raw = _answers.ok_get_answer(lengths)
    assert all(r.ok for r in _answers.read_get_answer(raw, keys, lengths, ADDRESS))
    other = _answers.read_get_answer(raw, keys, [65535] * 16, ADDRESS)  # another layout's size
    assert [r.code for r in other] == [Code.INTERNAL] * 16
    assert "object of 65536 bytes into slices of 65535" in other[0].message
    with pytest.raises(StoreError, match="answered 16 results for 15 items"):
        _answers.read_get_answer(raw, keys[:15], lengths[:15], ADDRESS)
    one_failed = store_pb2.BatchGetResponse.FromString(raw)
    one_failed.results[9].code = store_pb2.NOT_FOUND
    got = _answers.read_get_answer(one_failed.SerializeToString(), keys, lengths, ADDRESS)
    assert [r.code for r in got] == [Code.OK] * 9 + [Code.NOT_FOUND] + [Code.OK] * 6
    short = store_pb2.BatchGetResponse.FromString(raw)
    short.results[15].bytes_written = 65535
    got = _answers.read_get_answer(short.SerializeToString(), keys, lengths, ADDRESS)
    assert got[15].code is Code.INTERNAL and "65535 bytes written of 65536" in got[15].message
    with pytest.raises(StoreError, match="does not parse"):
        _answers.read_get_answer(raw[:-1], keys, lengths, ADDRESS)


def test_reading_put_and_remove_answers_by_their_bytes_is_parsing_them():
    rng = random.Random(9)
    for trial in range(2000):
        rpc = rng.choice(["BatchPut", "BatchRemove"])
        n = rng.choice([0, 1, 2, 16])
        keys = [b"k%d" % j for j in range(n)]
        resp = getattr(store_pb2, rpc + "Response")()
        for _ in range(n + (rng.choice([-1, 1]) if rng.random() < 0.05 else 0)):
            r = resp.results.add()
            if rng.random() < 0.1:
                r.code = rng.choice([1, 2, 3, 11, 99])
            if rng.random() < 0.05:
                r.message = "m"
        raw = resp.SerializeToString()
        got = _outcome(lambda: _answers.read_results_answer(raw, keys, rpc, ADDRESS))
        ref = _outcome(lambda: _answers.parse_results(resp, keys, rpc, ADDRESS))
        assert got == ref, (trial, raw)
    raw = _answers.ok_results_answer("BatchPut", 4)
    failed = store_pb2.BatchPutResponse.FromString(raw)
    failed.results[2].code = store_pb2.ALREADY_EXISTS
    got = _answers.read_results_answer(failed.SerializeToString(), [b"a", b"b", b"c", b"d"],
                                    "BatchPut", ADDRESS)
    assert [r.code for r in got] == [Code.OK, Code.OK, Code.ALREADY_EXISTS, Code.OK]
    with pytest.raises(StoreError, match="answered 4 results for 3 items"):
        _answers.read_results_answer(raw, [b"a", b"b", b"c"], "BatchPut", ADDRESS)


def test_cheap_results_are_the_dataclasses():
    fast = _errors.make_get_result(Code.OK, "", b"k", 5, 5)
    slow = GetResult(Code.OK, "", b"k", size=5, bytes_written=5)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.astuple(fast) == dataclasses.astuple(slow)
    assert pickle.loads(pickle.dumps(fast)) == slow
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.code = Code.NOT_FOUND  # type: ignore[misc]
    r = _errors.make_result(Code.NOT_FOUND, "gone", b"k")
    assert r == Result(Code.NOT_FOUND, "gone", b"k") and not r.ok
    with pytest.raises(StoreError, match="NOT_FOUND: gone"):
        r.raise_for_status()


def test_bulk_ok_results_are_the_dataclasses_one_object_each():
    keys = [b"k%d" % j for j in range(5)]
    lengths = [5, 5, 7, 5, 0]
    fast = _errors.ok_get_results(keys, lengths)
    slow = [GetResult(Code.OK, "", k, size=w, bytes_written=w) for k, w in zip(keys, lengths)]
    assert fast == slow and [repr(r) for r in fast] == [repr(r) for r in slow]
    assert [vars(r) for r in fast] == [vars(r) for r in slow]
    assert [list(vars(r)) for r in fast] == [list(vars(r)) for r in slow]  # field order too
    assert [hash(r) for r in fast] == [hash(r) for r in slow]
    assert pickle.loads(pickle.dumps(fast)) == slow
    assert len({id(vars(r)) for r in fast}) == len(fast)  # no dict shared between results
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast[0].size = 1  # type: ignore[misc]
    results = _errors.ok_results(keys)
    assert results == [Result(Code.OK, "", k) for k in keys]
    assert [repr(r) for r in results] == [repr(Result(Code.OK, "", k)) for k in keys]
    assert type(results[0]) is Result and len({id(vars(r)) for r in results}) == len(keys)
    assert _errors.ok_results([]) == [] and _errors.ok_get_results([], []) == []


def test_single_slice_requests_are_the_message_bytes_and_checked_alike():
    """A batch whose every item is one Slice is written as bytes; [s] (a list of one Slice)
    still goes through the message classes: both must be the same request, and refuse the same
    slices with the same error."""
    rng = random.Random(3)
    checker = _checker()
    for trial in range(300):
        n = rng.choice([1, 2, 16])
        keys = [rng.choice([b"", b"k%d" % j, b"x" * 200 + b"%d" % j]) for j in range(n)]
        slices = [Slice(rng.choice([77, 78]), rng.choice([0, 1, 127, 128, 1 << 20, 1 << 29]),
                        rng.choice([0, 1, 65536, 1 << 20])) for _ in range(n)]
        lease = rng.choice([None, 5, (1 << 64) - 1, (9, b"c" * 16)])
        raw, bkeys, lengths = _core.build_get(keys, slices, lease, checker)
        ref, _, ref_lengths = _core.build_get(keys, [[s] for s in slices], lease, checker)
        assert type(raw) is bytes and raw == ref.SerializeToString(), trial
        assert lengths == ref_lengths == [s.length for s in slices]
        replicas = rng.choice([None, 2])
        raw, _ = _core.build_put(keys, slices, replicas, checker)
        ref, _ = _core.build_put(keys, [[s] for s in slices], replicas, checker)
        assert type(raw) is bytes and raw == ref.SerializeToString(), trial
    bad = [Slice(79, 0, 1),                    # not registered here
           Slice(78, (1 << 30) - 1, 2)]       # past the buffer's end
    for s in bad:
        for build in (lambda v: _core.build_get([b"a", b"b"], v, None, checker),
                      lambda v: _core.build_put([b"a", b"b"], v, None, checker)):
            with pytest.raises(ValueError) as one:
                build([Slice(77, 0, 1), s])
            with pytest.raises(ValueError) as listed:
                build([[Slice(77, 0, 1)], [s]])
            assert str(one.value) == str(listed.value) and "item 1, slice 0" in str(one.value)
