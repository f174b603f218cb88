"""Result codes, per-key results and exceptions of the mcstore client.

`Code` mirrors `mcstore.v1.Code` in proto/mcstore/v1/store.proto value for value (a unit test
checks it against the generated enum). Per-key outcomes come back as `Result` / `GetResult`;
exceptions are `StoreError` (an RPC failed as a whole, or `raise_for_status()`) and its subclass
`UnavailableError` (the daemon cannot be reached or did not answer in time).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Dict, Iterable, List, Optional, Sequence

import grpc


class Code(enum.IntEnum):
    """Per-key result code; equal to mcstore.v1.Code on the wire."""

    OK = 0
    NOT_FOUND = 1
    ALREADY_EXISTS = 2
    NO_SPACE = 3
    INVALID_ARGUMENT = 4
    NOT_READY = 5
    SIZE_MISMATCH = 6
    CHECKSUM_MISMATCH = 7
    LEASE_EXPIRED = 8
    TRANSFER_FAILED = 9
    UNAVAILABLE = 10
    HAS_LEASE = 11
    INTERNAL = 12
    PERMISSION_DENIED = 13

    @classmethod
    def from_wire(cls, value: int) -> "Code":
        """The Code of a wire integer; values this client does not know become INTERNAL."""
        return _CODES.get(value, cls.INTERNAL)


# Code by wire value: a dict lookup, not Enum's call (per result item on every batch).
_CODES = {c.value: c for c in Code}


def _key_text(key: Optional[bytes]) -> str:
    if key is None:
        return ""
    shown = key[:64]
    try:
        text = shown.decode("utf-8")
        if text.isprintable():
            return repr(text + ("..." if len(key) > 64 else ""))
    except UnicodeDecodeError:
        pass
    return "0x" + shown.hex() + ("..." if len(key) > 64 else "")


class StoreError(Exception):
    """An mcstore operation failed. `code` is the Code, `message` the daemon's (or the client's)
    explanation, `key` the key concerned (per-key errors) and `address` the daemon's address
    (RPC errors). str() starts with the Code's name: "NOT_FOUND: ..."."""

    def __init__(self, code: Code, message: str, *, key: Optional[bytes] = None,
                 address: Optional[str] = None) -> None:
        self.code = Code(code)
        self.message = message
        self.key = key
        self.address = address
        super().__init__(str(self))

    def __str__(self) -> str:
        text = "%s: %s" % (self.code.name, self.message or "(no message)")
        if self.key is not None:
            text += " [key %s]" % _key_text(self.key)
        if self.address:
            text += " [mcstore daemon %s]" % self.address
        return text

    def __reduce__(self) -> Any:
        return (_rebuild_error, (type(self), self.code, self.message, self.key, self.address))


def _rebuild_error(cls: type, code: Code, message: str, key: Optional[bytes],
                   address: Optional[str]) -> "StoreError":
    return cls(code, message, key=key, address=address)


class UnavailableError(StoreError):
    """The mc-client daemon could not be reached, or did not answer within the timeout
    (code UNAVAILABLE), or answered that the store behind it (the master) is unavailable."""

    def __init__(self, message: str, *, code: Code = Code.UNAVAILABLE,
                 key: Optional[bytes] = None, address: Optional[str] = None) -> None:
        super().__init__(code, message, key=key, address=address)


def _rebuild_unavailable(cls: type, code: Code, message: str, key: Optional[bytes],
                         address: Optional[str]) -> "StoreError":
    return cls(message, code=code, key=key, address=address)


UnavailableError.__reduce__ = lambda self: (  # type: ignore[method-assign]
    _rebuild_unavailable, (type(self), self.code, self.message, self.key, self.address))


class SessionLostError(StoreError):
    """The daemon no longer knows this client's fd session (code NOT_READY): it restarted, or
    the session was closed. Every buffer id and lease this Client got from it is void: the
    Client has dropped its session; register the buffers again (SharedBuffer.reregister(),
    register_buffer(), register_cuda()) and make new slices and layouts. Not retried on its
    own: the caller decides when its memory is registered again."""

    def __init__(self, message: str, *, code: Code = Code.NOT_READY,
                 key: Optional[bytes] = None, address: Optional[str] = None) -> None:
        super().__init__(code, message, key=key, address=address)


SessionLostError.__reduce__ = lambda self: (  # type: ignore[method-assign]
    _rebuild_unavailable, (type(self), self.code, self.message, self.key, self.address))


@dataclass(frozen=True)
class Result:
    """The outcome of one item of a batch (put, remove): `code`, `message`, and the `key`."""

    code: Code
    message: str = ""
    key: Optional[bytes] = None

    @property
    def ok(self) -> bool:
        return self.code == Code.OK

    def raise_for_status(self) -> None:
        """Raises StoreError (naming the Code and the key) unless the item succeeded."""
        if self.code != Code.OK:
            raise StoreError(self.code, self.message, key=self.key)


@dataclass(frozen=True)
class GetResult(Result):
    """The outcome of one item of a get. `size` is the object's size in bytes (also set on
    SIZE_MISMATCH, so a caller can size its buffer); `bytes_written` how many bytes were written
    into the item's slices; `data` the object's bytes when it was read inline (no `into`),
    otherwise None. Data is only ever present on OK."""

    size: int = 0
    bytes_written: int = 0
    data: Optional[bytes] = None


_new = object.__new__
_set = object.__setattr__


def make_result(code: Code, message: str, key: Optional[bytes]) -> Result:
    """Result(code, message, key), built without the frozen dataclass's __init__ (one
    object.__setattr__ per field): the same object at a fraction of the cost, for the answer
    readers that make one per item of every batch."""
    r = _new(Result)
    _set(r, "__dict__", {"code": code, "message": message, "key": key})
    return r


def make_get_result(code: Code, message: str, key: Optional[bytes], size: int,
                    bytes_written: int, data: Optional[bytes] = None) -> GetResult:
    """GetResult(code, message, key, size=, bytes_written=, data=), as make_result."""
    r = _new(GetResult)
    _set(r, "__dict__", {"code": code, "message": message, "key": key, "size": size,
                         "bytes_written": bytes_written, "data": data})
    return r


def _from_templates(cls: Any, keys: Sequence[bytes],
                    templates: Iterable[Dict[str, Any]]) -> List[Any]:
    """One `cls` per key, its fields copied from that key's template dict (shared, never
    changed), the key set last: about half the cost of make_result per item."""
    new = _new
    out: List[Any] = []
    append = out.append
    for k, template in zip(keys, templates):
        r = new(cls)
        d = r.__dict__
        d.update(template)
        d["key"] = k
        append(r)
    return out


def ok_results(keys: Sequence[bytes]) -> List[Result]:
    """make_result(Code.OK, "", k) for each of `keys`."""
    return _from_templates(Result, keys, repeat({"code": Code.OK, "message": "", "key": None}))


def ok_get_results(keys: Sequence[bytes], lengths: Sequence[int]) -> List[GetResult]:
    """make_get_result(Code.OK, "", k, w, w) for each key k read whole into w bytes of slices
    (one template per distinct length)."""
    templates = {w: {"code": Code.OK, "message": "", "key": None, "size": w, "bytes_written": w,
                     "data": None} for w in set(lengths)}
    return _from_templates(GetResult, keys, map(templates.__getitem__, lengths))


def raise_for_results(results: Sequence[Result]) -> None:
    """Raises StoreError for the first failed item of `results`, if any."""
    for r in results:
        r.raise_for_status()


# gRPC status codes the daemon answers for a whole RPC, back to our Codes. The daemon converts
# its Code to a canonical code (common/status.cc); the payload with the exact Code does not
# cross gRPC, so this inverts that table (HAS_LEASE and NOT_READY share FAILED_PRECONDITION).
_FROM_GRPC = {
    grpc.StatusCode.NOT_FOUND: Code.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS: Code.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Code.NO_SPACE,
    grpc.StatusCode.INVALID_ARGUMENT: Code.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION: Code.NOT_READY,
    grpc.StatusCode.OUT_OF_RANGE: Code.SIZE_MISMATCH,
    grpc.StatusCode.DATA_LOSS: Code.CHECKSUM_MISMATCH,
    grpc.StatusCode.ABORTED: Code.TRANSFER_FAILED,
    grpc.StatusCode.UNAVAILABLE: Code.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: Code.UNAVAILABLE,
    grpc.StatusCode.CANCELLED: Code.UNAVAILABLE,
    grpc.StatusCode.INTERNAL: Code.INTERNAL,
    grpc.StatusCode.UNKNOWN: Code.INTERNAL,
    grpc.StatusCode.UNIMPLEMENTED: Code.INTERNAL,
    grpc.StatusCode.PERMISSION_DENIED: Code.INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED: Code.INVALID_ARGUMENT,
}


def code_from_grpc(status: grpc.StatusCode) -> Code:
    """Our Code for a gRPC status code of a failed RPC."""
    return _FROM_GRPC.get(status, Code.INTERNAL)


def _session_lost(err: Any) -> bool:
    """The daemon's `x-mc-error: session-lost` trailing metadata (client/access/grpc_caller.h)."""
    try:
        trailing = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None
    except Exception:  # a call that never reached the server has none
        return False
    for entry in trailing or ():
        key, value = (entry.key, entry.value) if hasattr(entry, "key") else entry
        if key == "x-mc-error" and value == "session-lost":
            return True
    return False


def grpc_status(value: int) -> grpc.StatusCode:
    """The gRPC status code of its numeric value (the fast channel's replies carry numbers);
    values gRPC does not define become UNKNOWN."""
    return _GRPC_BY_NUMBER.get(value, grpc.StatusCode.UNKNOWN)


_GRPC_BY_NUMBER = {s.value[0]: s for s in grpc.StatusCode}


def error_from_rpc(err: grpc.RpcError, rpc: str, address: str) -> StoreError:
    """The StoreError (UnavailableError, SessionLostError) for a failed gRPC call `rpc` to
    `address`."""
    status = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    lost = status == grpc.StatusCode.FAILED_PRECONDITION and _session_lost(err)
    return error_from_status(status, details, rpc, address, session_lost=lost)


def error_from_status(status: grpc.StatusCode, details: str, rpc: str, address: str, *,
                      session_lost: bool = False) -> StoreError:
    """The StoreError for a call `rpc` to `address` that failed with `status` and `details`,
    whichever path carried it (gRPC, or the fast channel's numeric code and message).
    `session_lost`: the daemon said the caller's fd session is gone (SessionLostError)."""
    code = code_from_grpc(status)
    if status == grpc.StatusCode.FAILED_PRECONDITION and session_lost:
        return SessionLostError("%s: %s" % (rpc, details), address=address)
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return UnavailableError("%s: no answer within the deadline (%s)" % (rpc, details),
                                address=address)
    if status == grpc.StatusCode.CANCELLED:
        return UnavailableError("%s: cancelled (%s)" % (rpc, details), address=address)
    if code == Code.UNAVAILABLE:
        return UnavailableError("%s: %s" % (rpc, details or "unavailable"), address=address)
    return StoreError(code, "%s: %s (gRPC %s)" % (rpc, details, status.name), address=address)
