"""Reading the daemon's answers to Store calls (gRPC messages, or the fast channel's raw answer
bytes) into the client's results, every count and size checked (split from _core)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from mcstore._errors import (Code, GetResult, Result, StoreError, make_get_result, make_result,
                             ok_get_results, ok_results)
from mcstore._fastchannel import parse_answer
from mcstore._proto import store_pb2


def _count_check(n_answers: int, n_asked: int, rpc: str, address: str) -> None:
    if n_answers != n_asked:
        raise StoreError(Code.INTERNAL, "%s: the daemon answered %d results for %d items"
                         % (rpc, n_answers, n_asked), address=address)


def parse_results(resp: Any, keys: List[bytes], rpc: str, address: str) -> List[Result]:
    _count_check(len(resp.results), len(keys), rpc, address)
    from_wire = Code.from_wire
    return [make_result(from_wire(r.code), r.message, k) for r, k in zip(resp.results, keys)]


def parse_get(resp: Any, keys: List[bytes], lengths: List[Optional[int]],
              address: str) -> List[GetResult]:
    _count_check(len(resp.results), len(keys), "BatchGet", address)
    out: List[GetResult] = []
    append = out.append
    from_wire = Code.from_wire
    ok = Code.OK
    for r, k, want in zip(resp.results, keys, lengths):
        code = from_wire(r.code)
        size = r.size
        written = r.bytes_written
        data: Optional[bytes] = None
        if code is ok:
            # Never hand out an OK the answer does not back up byte for byte.
            problem = None
            if want is None:
                data = r.data
                if len(data) != size:
                    problem = "%d inline bytes for an object of %d" % (len(data), size)
            elif size != want:
                problem = "object of %d bytes into slices of %d" % (size, want)
            elif written != size:
                problem = "%d bytes written of %d" % (written, size)
            if problem is not None:
                append(make_get_result(Code.INTERNAL, "daemon answered OK but " + problem, k,
                                       size, written))
                continue
            append(make_get_result(code, r.message, k, size, written, data))
        else:
            append(make_get_result(code, r.message, k, size, written))
    return out


# Reading a fast channel answer. An answer in which every item succeeded is, byte for byte, one
# string per batch, the one protobuf itself serializes for it (made here by the generated
# classes, never by hand): an answer equal to it is read without parsing, into exactly the
# results parse_get / parse_results would make of it. Any other answer (a failed item, a size
# off by one, a field this client does not know) is parsed and checked item by item.

_OK_ITEM_CACHE_MAX = 4096  # slice lengths whose OK get item is kept (then the cache restarts)
_ok_get_items: Dict[int, bytes] = {}
# (length, count) -> the answer of a batch of `count` items of `length` bytes each, all OK; kept
# for batches of at most _OK_BATCH_ITEMS_MAX items, at most _OK_BATCH_CACHE_MAX of them.
_OK_BATCH_ITEMS_MAX = 1024
_OK_BATCH_CACHE_MAX = 64
_ok_get_batches: Dict[Tuple[int, int], bytes] = {}
_ok_result_items: Dict[str, bytes] = {}


def _ok_get_item(length: int) -> bytes:
    """The serialized BatchGetResponse.results entry of an item read OK into `length` bytes of
    slices (code OK, size = bytes_written = length, no message, no data)."""
    item = _ok_get_items.get(length)
    if item is None:
        spb = store_pb2()
        item = spb.BatchGetResponse(results=[spb.GetResult(
            code=0, size=length, bytes_written=length)]).SerializeToString()
        if len(_ok_get_items) >= _OK_ITEM_CACHE_MAX:
            _ok_get_items.clear()
        _ok_get_items[length] = item
    return item


def ok_get_answer(lengths: Sequence[Optional[int]]) -> Optional[bytes]:
    """The serialized BatchGetResponse of a get into slices of `lengths` in which every item was
    read whole; None when an item is inline (its answer carries data)."""
    n = len(lengths)
    first = lengths[0] if n else None
    if first is not None and lengths.count(first) == n:  # a block layout: every item alike
        answer = _ok_get_batches.get((first, n))
        if answer is None:
            answer = _ok_get_item(first) * n
            if n <= _OK_BATCH_ITEMS_MAX:
                if len(_ok_get_batches) >= _OK_BATCH_CACHE_MAX:
                    _ok_get_batches.clear()
                _ok_get_batches[(first, n)] = answer
        return answer
    if None in lengths:
        return None
    return b"".join([_ok_get_item(w) for w in lengths])  # type: ignore[arg-type]


def ok_results_answer(rpc: str, n: int) -> bytes:
    """The serialized answer of a BatchPut or BatchRemove (`rpc`) of n items, every one OK."""
    item = _ok_result_items.get(rpc)
    if item is None:
        spb = store_pb2()
        resp = getattr(spb, rpc + "Response")(results=[spb.Result(code=0)])
        item = _ok_result_items[rpc] = resp.SerializeToString()
    return item * n


def read_get_answer(resp: Any, keys: List[bytes], lengths: List[Optional[int]],
                    address: str) -> List[GetResult]:
    """parse_get of a BatchGetResponse, or of the fast channel's raw answer bytes."""
    if type(resp) is bytes:
        if resp == ok_get_answer(lengths):
            return ok_get_results(keys, lengths)  # type: ignore[arg-type]
        resp = parse_answer(store_pb2().BatchGetResponse.FromString, "BatchGet", resp, address)
    return parse_get(resp, keys, lengths, address)


def read_results_answer(resp: Any, keys: List[bytes], rpc: str, address: str) -> List[Result]:
    """parse_results of a BatchPutResponse / BatchRemoveResponse (`rpc`), or of the fast
    channel's raw answer bytes."""
    if type(resp) is bytes:
        if resp == ok_results_answer(rpc, len(keys)):
            return ok_results(keys)
        resp = parse_answer(getattr(store_pb2(), rpc + "Response").FromString, rpc, resp,
                            address)
    return parse_results(resp, keys, rpc, address)


def parse_exist(resp: Any, keys: List[bytes], address: str) -> List[bool]:
    _count_check(len(resp.exists), len(keys), "BatchExist", address)
    return list(resp.exists)


def parse_match(resp: Any, keys: List[bytes], lease_ttl_ms: int,
                address: str) -> Tuple[int, int, int, bytes]:
    if resp.matched > len(keys):
        raise StoreError(Code.INTERNAL, "MatchPrefix: %d matched of %d keys"
                         % (resp.matched, len(keys)), address=address)
    if lease_ttl_ms > 0 and resp.matched > 0 and resp.lease_id == 0:
        raise StoreError(Code.INTERNAL, "MatchPrefix: %d keys matched but no lease was granted"
                         % resp.matched, address=address)
    return resp.matched, resp.lease_id, resp.lease_expiry_ms, resp.lease_token


def needs_unpacked_retry(resp: Any, keys: List[bytes]) -> bool:
    """An mc-client older than packed keys answers keys_seen 0 to a packed request."""
    return len(keys) > 0 and resp.keys_seen != len(keys)
