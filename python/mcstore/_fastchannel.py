"""The fast channel of an mc-client daemon: Store calls over a Unix SOCK_SEQPACKET socket.

The daemon serves the data calls of its Store service (BatchPut, BatchGet, BatchExist,
MatchPrefix, ReleaseLease, BatchRemove) on "<unix socket>.fast" as one datagram each way: the
same protobuf request and response messages as gRPC, with the same semantics for the same caller,
without HTTP/2 and grpcio's per-call work. gRPC stays the control path and the fallback.

Wire (little-endian; the contract the daemon implements):
  request  b"MCQ1" + u32 method + u64 call_id + body (the serialized request message)
  reply    b"MCR1" + u32 gRPC status code + u64 call_id + u32 M + M bytes of message + body
A connection's first datagram is ATTACH (method 1) whose body is the owner token of the caller's
fd session (empty: the anonymous Unix caller); its OK body is the daemon's u32 limit on any
datagram (max_message_bytes). One call at a time per connection: FastChannel pools a few.

What is sent here and what goes to gRPC is decided by the caller (Client): only calls whose
answer fits a datagram (no inline get data). FastChannel.call answers None when the call was
not sent (no socket, ATTACH refused, every connection busy, request over the limit): the caller
then uses gRPC. Once a request was sent, a failure is an error, never a resend (puts are not
idempotent). Thread-safe.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import grpc

from mcstore._errors import (Code, StoreError, UnavailableError, error_from_status,
                             grpc_status)
from mcstore._proto import store_pb2

log = logging.getLogger("mcstore")

METHOD_ATTACH = 1
_ATTACH_ID = 1  # the call_id of ATTACH; calls count on from it (0 answers an unreadable header)
# Store RPC -> method number on the wire.
METHODS: Dict[str, int] = {"BatchPut": 2, "BatchGet": 3, "BatchExist": 4, "MatchPrefix": 5,
                           "ReleaseLease": 6, "BatchRemove": 7}
_REQUEST = struct.Struct("<4sIQ")  # magic, method, call_id
_REPLY = struct.Struct("<4sIQI")  # magic, status, call_id, message length
_REQ_MAGIC = b"MCQ1"
_REPLY_MAGIC = b"MCR1"
OWNER_MAX = 128  # bytes of an ATTACH token
LIMIT_MIN = 4096  # the daemon's accepted range of max_message_bytes
LIMIT_MAX = 4 << 20
SNDBUF_SLACK = 64  # the kernel refuses a datagram larger than SO_SNDBUF - 32
RETRY_AFTER_S = 30.0  # after the channel could not be opened, gRPC only for this long
CONNECT_TIMEOUT_S = 2.0  # connect + ATTACH, at most (then gRPC)
MAX_CONNECTIONS = 4  # per Client: more concurrent calls than this go to gRPC
SESSION_LOST = "session lost:"  # the daemon's message prefix (StoreAuth::kSessionLost)
ANSWER_ITEM_BOUND = 128  # bytes one put/remove result item may add to its answer, beyond its key
_OVERSIZE = "exceeds the fast channel's limit"
_IDEMPOTENT = frozenset(("BatchGet", "BatchExist"))  # safe to redo on gRPC: read only


_CHANNELS: "weakref.WeakSet[FastChannel]" = weakref.WeakSet()


def _reset_after_fork() -> None:
    for channel in list(_CHANNELS):
        channel._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def default_fast_socket(address: str) -> Optional[str]:
    """The fast socket next to a Unix-socket address ("unix:/p" or "/p"); None for TCP."""
    if address.startswith("unix:"):
        return address[len("unix:"):] + ".fast"
    if address.startswith("/"):
        return address + ".fast"
    return None


def resolve_path(arg: Any, address: str) -> Tuple[Optional[str], bool]:
    """(socket path or None, whether it was asked for explicitly) for Client's `fast_channel`:
    False = never; a str = that path; None = $MCSTORE_FAST_SOCKET (a path, or "off"/"0"/""
    for never) when set, else "<unix socket>.fast" for a Unix-socket address."""
    if arg is False:
        return None, False
    if isinstance(arg, str):
        if not arg:
            raise ValueError("fast_channel must be a socket path, False or None")
        return arg, True
    if arg is not None and arg is not True:
        raise TypeError("fast_channel must be a socket path (str), False or None, got %s"
                        % type(arg).__name__)
    env = os.environ.get("MCSTORE_FAST_SOCKET")
    if env is not None:
        if env.strip().lower() in ("", "0", "off", "false", "no"):
            return None, False
        return env, True
    path = default_fast_socket(address)
    if path is None and arg is True:
        raise ValueError("fast_channel=True needs a Unix-socket address; pass the socket path")
    return path, False


_TIMEVAL = struct.Struct("@ll")  # struct timeval: tv_sec, tv_usec
_DEADLINE_MAX_S = 1 << 30  # a longer (or infinite) timeout waits this long


def _set_deadline(sock: socket.socket, timeout_s: float) -> None:
    """Sets the blocking socket's send and receive timeouts to `timeout_s` (> 0): rounded up to
    a whole microsecond, as a timeval of 0 would mean no timeout at all."""
    micros = int(min(timeout_s, _DEADLINE_MAX_S) * 1e6)
    micros = max(micros, 1)
    tv = _TIMEVAL.pack(micros // 1000000, micros % 1000000)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def parse_answer(parse: Callable[[bytes], Any], rpc: str, payload: bytes, address: str) -> Any:
    """The response message `parse` reads from a fast channel answer; StoreError (INTERNAL)
    when the bytes do not parse."""
    try:
        return parse(payload)
    except Exception as e:  # a protobuf DecodeError: the answer is unusable
        raise StoreError(Code.INTERNAL, "%s: a fast channel answer that does not parse: %s"
                         % (rpc, e), address=address) from None


class _NotSent(Exception):
    """The call could not be handed to the daemon; nothing reached it."""


class FastConnection:
    """One attached connection; one call at a time (its owner, FastChannel, sees to that)."""

    __slots__ = ("sock", "owner", "limit", "_buf", "_view", "_next_id", "_timeout")

    def __init__(self, path: str, owner: str, timeout_s: float) -> None:
        token = owner.encode("ascii", "replace")
        if len(token) > OWNER_MAX:
            raise _NotSent("an owner token of %d bytes (ATTACH takes %d)"
                           % (len(token), OWNER_MAX))
        self.owner = owner
        self._next_id = _ATTACH_ID + 1
        self._timeout = timeout_s
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = sock
        try:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.send(_REQUEST.pack(_REQ_MAGIC, METHOD_ATTACH, _ATTACH_ID) + token)
            reply = sock.recv(4096)
            limit = self._attached(reply)
            # The kernel refuses a datagram larger than SO_SNDBUF - 32: make room for the
            # largest request, and send no more than it grants (it may cap below the ask).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limit + SNDBUF_SLACK)
            granted = sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            # From here the socket blocks and the kernel keeps the deadline (SO_RCVTIMEO,
            # SO_SNDTIMEO): a call is one sendmsg and one recvmsg, where Python's own timeout
            # would poll() before each of them.
            sock.settimeout(None)
            _set_deadline(sock, timeout_s)
        except _NotSent:
            sock.close()
            raise
        except OSError as e:  # socket.timeout included
            sock.close()
            raise _NotSent("%s: %s" % (path, e)) from None
        self.limit = min(limit, granted - SNDBUF_SLACK)
        self._buf = bytearray(limit)  # replies are at most the daemon's limit
        self._view = memoryview(self._buf)

    @staticmethod
    def _attached(reply: bytes) -> int:
        if len(reply) < _REPLY.size:
            raise _NotSent("ATTACH: the daemon closed the connection" if not reply else
                           "ATTACH: a reply of %d bytes" % len(reply))
        magic, status, call_id, m = _REPLY.unpack_from(reply)
        if magic != _REPLY_MAGIC or call_id != _ATTACH_ID or m > len(reply) - _REPLY.size:
            raise _NotSent("ATTACH: a malformed reply")
        if status != 0:
            text = reply[_REPLY.size:_REPLY.size + m].decode("utf-8", "replace")
            raise _NotSent("ATTACH refused: %s: %s" % (grpc_status(status).name, text))
        body = reply[_REPLY.size + m:]
        if len(body) != 4:
            raise _NotSent("ATTACH: an answer of %d bytes, not 4" % len(body))
        (limit,) = struct.unpack("<I", body)
        if not LIMIT_MIN <= limit <= LIMIT_MAX:
            raise _NotSent("ATTACH: a limit of %d bytes, outside %d..%d"
                           % (limit, LIMIT_MIN, LIMIT_MAX))
        return limit

    def call(self, method: int, body: bytes, timeout_s: float,
             rpc: str, address: str) -> Tuple[int, str, bytes]:
        """Sends one request and waits for its reply: (gRPC status, message, body). Raises
        _NotSent when the request could not be sent, StoreError when it was sent but no
        good reply came (the caller then closes this connection)."""
        call_id = self._next_id
        self._next_id = call_id + 1
        sock = self.sock
        if timeout_s != self._timeout:
            try:
                _set_deadline(sock, timeout_s)
            except OSError as e:
                raise _NotSent(str(e)) from None
            self._timeout = timeout_s
        try:
            sock.sendmsg([_REQUEST.pack(_REQ_MAGIC, method, call_id), body])
        except OSError as e:  # a datagram goes whole or not at all (EAGAIN: SO_SNDTIMEO)
            raise _NotSent(str(e)) from None
        try:
            n = sock.recv_into(self._buf, 0, socket.MSG_TRUNC)
        except (BlockingIOError, socket.timeout):  # SO_RCVTIMEO ran out: EAGAIN
            raise UnavailableError("%s: no answer within the deadline (Deadline Exceeded on the "
                                   "fast channel after %.3g s)" % (rpc, timeout_s),
                                   address=address) from None
        except OSError as e:
            raise UnavailableError("%s: the fast channel broke after the request was sent: %s"
                                   % (rpc, e), address=address) from None
        if n == 0:
            raise UnavailableError("%s: the daemon closed the fast channel after the request was "
                                   "sent" % rpc, address=address)
        if n > len(self._buf) or n < _REPLY.size:
            raise StoreError(Code.INTERNAL, "%s: a fast channel reply of %d bytes (limit %d)"
                             % (rpc, n, len(self._buf)), address=address)
        magic, status, reply_id, m = _REPLY.unpack_from(self._buf)
        if magic != _REPLY_MAGIC or m > n - _REPLY.size:
            raise StoreError(Code.INTERNAL, "%s: a malformed fast channel reply" % rpc,
                             address=address)
        start = _REPLY.size + m
        message = str(self._view[_REPLY.size:start], "utf-8", "replace") if m else ""
        if reply_id != call_id:
            if reply_id == 0 and status != 0:  # the daemon could not read our header
                raise error_from_status(grpc_status(status), message, rpc, address)
            raise StoreError(Code.INTERNAL, "%s: the fast channel answered call %d to call %d"
                             % (rpc, reply_id, call_id), address=address)
        return status, message, self._view[start:n].tobytes()

    def close(self) -> None:
        self.sock.close()


class FastChannel:
    """A bounded pool of attached connections to one daemon's fast socket, per owner token."""

    def __init__(self, path: str, address: str, explicit: bool,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.path = path
        self.address = address
        self.explicit = explicit
        self.max_connections = max_connections
        spb = store_pb2()
        self._parse = {rpc: getattr(spb, rpc + "Response").FromString for rpc in METHODS}
        self._lock = threading.Lock()
        self._idle: List[FastConnection] = []
        self._open = 0  # idle and busy connections
        self._owner: Optional[str] = None  # the owner the pooled connections attached with
        self._down_until = 0.0
        self._logged = False
        self.limit = 0  # the last learned request limit (0: none yet)
        self.closed = False
        # Calls answered over the fast channel, and why others were not sent over it.
        self.stats: Dict[str, int] = {"fast": 0, "failed": 0, "oversize": 0, "busy": 0,
                                      "down": 0, "connect_failed": 0, "stale": 0}
        _CHANNELS.add(self)

    def _after_fork_in_child(self) -> None:
        """A forked child must not share its parent's connections (both would read the same
        replies): it closes its copies and opens its own. The lock may have been held by a
        thread that does not exist here."""
        self._lock = threading.Lock()
        idle, self._idle = self._idle, []
        self._open = 0
        self._owner = None
        for c in idle:
            c.close()

    # -- the pool --------------------------------------------------------------------------
    def _acquire(self, owner: str, timeout_s: float) -> Optional[FastConnection]:
        """An idle connection attached as `owner`, else a new one when there is room and the
        socket is not known to be down; None: use gRPC."""
        reserved = False
        with self._lock:
            if self.closed:
                return None
            if owner != self._owner:  # a new fd session: connections of the old one are void
                stale, self._idle = self._idle, []
                self._open -= len(stale)
                self._owner = owner
                self._down_until = 0.0
            else:
                stale = []
            conn = self._idle.pop() if self._idle else None
            if conn is None:
                if self._open >= self.max_connections:
                    self.stats["busy"] += 1
                elif time.monotonic() < self._down_until:
                    self.stats["down"] += 1
                else:
                    self._open += 1
                    reserved = True
        for c in stale:
            c.close()
        if not reserved:
            return conn
        try:
            conn = FastConnection(self.path, owner, min(timeout_s, CONNECT_TIMEOUT_S))
        except _NotSent as e:
            self._opening_failed(str(e))
            return None
        with self._lock:
            self.limit = conn.limit
            if not self.closed and owner == self._owner:
                return conn
            self._open -= 1  # closed, or the session changed, meanwhile
        conn.close()
        return None

    def _opening_failed(self, why: str) -> None:
        with self._lock:
            self._open -= 1
            self.stats["connect_failed"] += 1
            if self._open == 0:  # none works: gRPC only for a while
                self._down_until = time.monotonic() + RETRY_AFTER_S
            first = not self._logged
            self._logged = True
        level = logging.INFO if first and self.explicit else logging.DEBUG
        log.log(level, "mcstore: fast channel %s unavailable (%s); Store calls go over gRPC "
                "(retried after %.0f s)", self.path, why, RETRY_AFTER_S)

    def _release(self, conn: FastConnection, reuse: bool, stat: str) -> None:
        with self._lock:
            self.stats[stat] += 1
            if reuse and not self.closed and conn.owner == self._owner:
                self._idle.append(conn)
                return
            self._open -= 1
        conn.close()

    def drop(self) -> None:
        """Closes the idle connections (the fd session they attached with ended); busy ones
        are closed when their call returns."""
        with self._lock:
            stale, self._idle = self._idle, []
            self._open -= len(stale)
            self._owner = None
        for c in stale:
            c.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self.drop()

    @property
    def open_connections(self) -> int:
        return self._open

    def snapshot(self) -> Dict[str, int]:
        """A copy of `stats`."""
        with self._lock:
            return dict(self.stats)

    # -- calls -----------------------------------------------------------------------------
    def call(self, rpc: str, body: bytes, owner: str, timeout_s: float, items: int = 0,
             raw: bool = False) -> Any:
        """The response message of `rpc` sent over the fast channel, or None when it was not
        sent (the caller uses gRPC). Raises StoreError as the gRPC path would for the same
        answer (SessionLostError included); UnavailableError when the connection broke or no
        answer came in time after the request was sent.

        `items`: for a call that must not be sent twice (put, remove), its number of result
        items: it is sent only when its answer is sure to fit a datagram too (an answer over
        the limit would be lost after the daemon acted on the request).
        `raw`: the answer's serialized bytes instead of the message, for a caller that reads
        them itself (mcstore._answers.read_get_answer / read_results_answer); the status and the
        rest of the reply are checked as for a message."""
        if timeout_s <= 0:
            return None  # already past its deadline: gRPC says so without sending
        size = _REQUEST.size + len(body) + ANSWER_ITEM_BOUND * items
        if self.limit and size > self.limit:
            with self._lock:
                self.stats["oversize"] += 1
            return None
        for _ in range(2):  # a pooled connection the daemon closed (restart): one fresh try
            conn = self._acquire(owner, timeout_s)
            if conn is None:
                return None
            if size > conn.limit:
                self._release(conn, True, "oversize")
                return None
            try:
                status, message, payload = conn.call(METHODS[rpc], body, timeout_s, rpc,
                                                     self.address)
            except _NotSent:
                self._release(conn, False, "stale")
                self.drop_idle()  # its siblings are as dead
                continue
            except BaseException:
                self._release(conn, False, "failed")
                raise
            if status == 0:
                self._release(conn, True, "fast")
                return payload if raw else self._answer(rpc, payload)
            return self._refused(rpc, conn, status, message)
        return None

    def _answer(self, rpc: str, payload: bytes) -> Any:
        return parse_answer(self._parse[rpc], rpc, payload, self.address)

    def _refused(self, rpc: str, conn: FastConnection, status: int, message: str) -> None:
        """Raises the error of a call the daemon answered with `status` (not OK); returns None
        (use gRPC) only for a read whose answer did not fit a datagram."""
        code = grpc_status(status)
        # After some refusals the daemon closes the connection; the next send finds it closed
        # (nothing is sent then). An access refusal leaves nothing worth keeping.
        oversize = (code == grpc.StatusCode.RESOURCE_EXHAUSTED and _OVERSIZE in message)
        self._release(conn, code != grpc.StatusCode.UNAUTHENTICATED,
                      "oversize" if oversize else "fast")
        if oversize and rpc in _IDEMPOTENT:
            return None  # a read is safe to ask again, over gRPC
        lost = code == grpc.StatusCode.FAILED_PRECONDITION and message.startswith(SESSION_LOST)
        raise error_from_status(code, message, rpc, self.address, session_lost=lost)

    def drop_idle(self) -> None:
        """Closes the idle connections but keeps the owner (a daemon restart closed them)."""
        with self._lock:
            stale, self._idle = self._idle, []
            self._open -= len(stale)
        for c in stale:
            c.close()
