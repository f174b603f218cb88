"""The synchronous mcstore Client (grpcio), its Lease, and futures for overlapping calls."""

from __future__ import annotations

import concurrent.futures
import os
import stat
import threading
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, TypeVar

import grpc

from mcstore import _answers, _channel, _core
from mcstore._buffers import SharedBuffer, Slice, _check_int, check_shm_name
from mcstore._core import IntoArg, KeyLike, ValuesArg
from mcstore._errors import (Code, GetResult, Result, SessionLostError, StoreError,
                             error_from_rpc)
from mcstore._fastchannel import MAX_CONNECTIONS as FAST_CONNECTIONS
from mcstore._fastchannel import METHODS as FAST_METHODS
from mcstore._fastchannel import FastChannel, resolve_path as fast_socket_path
from mcstore._fdchannel import FdSession, default_fd_socket
from mcstore._gpu import (CUDA_IPC_HANDLE_BYTES, GPU_BUFFER_ID_BIT, GpuBuffer,
                          export_cuda_tensor)
from mcstore._proto import GPU_SERVICE, gpu_pb2, store_pb2
from mcstore._tls import TlsArg, TlsConfig, tls_config

T = TypeVar("T")


class LeaseRef(NamedTuple):
    """A lease as another process uses it: its id and its capability (`token`). Whoever
    presents both to the same mc-client may read under the lease (get(..., lease=ref)) and
    release it (release_lease(ref)), e.g. an engine's worker process using the lease its
    scheduler process took. Treat the token as secret as the keys it pins."""
    lease_id: int
    token: bytes


class _LeaseFields:
    """What Lease and AsyncLease share: match_prefix's answer (`matched`, `lease_id`,
    `expiry_ms`, `keys`, `token`), `ref`, and `released` (a lease is released once)."""

    def __init__(self, matched: int, lease_id: int, expiry_ms: int, keys: List[bytes],
                 token: bytes = b"") -> None:
        self.matched = matched
        self.lease_id = lease_id
        self.expiry_ms = expiry_ms
        self.keys = keys
        self.token = token
        self.released = lease_id == 0

    @property
    def ref(self) -> LeaseRef:
        """The lease's id and capability, for another process (see LeaseRef)."""
        return LeaseRef(self.lease_id, self.token)

    def _claim_release(self) -> bool:
        """True the first time only, for a lease that was taken: the caller releases it now."""
        if self.released:
            return False
        self.released = True
        return True

    def _repr(self, name: str) -> str:
        return "%s(matched=%d, lease_id=%d, expiry_ms=%d)" % (name, self.matched, self.lease_id,
                                                              self.expiry_ms)


class Lease(_LeaseFields):
    """The answer of match_prefix: `matched` leading keys are stored and readable now. With a
    lease (lease_ttl_ms > 0 and matched > 0) they stay pinned until release() or `expiry_ms`
    (wall-clock milliseconds since the epoch). Pass it as get(..., lease=lease), or hand
    `ref` (id and capability) to another process of the same application. A context
    manager: the lease is released on exit. `keys` are the matched keys."""

    def __init__(self, matched: int, lease_id: int, expiry_ms: int, keys: List[bytes],
                 release: Optional[Callable[[Any], Any]], token: bytes = b"") -> None:
        super().__init__(matched, lease_id, expiry_ms, keys, token)
        self._release = release

    def release(self) -> None:
        """Releases the lease now (idempotent; an already expired lease is not an error).
        Raises UnavailableError if the daemon cannot be reached (the lease then expires)."""
        if self._claim_release() and self._release is not None:
            self._release(self.ref)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.release()
        except StoreError:
            if exc_type is None:
                raise  # do not hide the error that is already propagating

    def __repr__(self) -> str:
        return self._repr("Lease")


class Client:
    """A connection to one mc-client daemon's Store service.

        with Client("unix:/run/mcstore/client.sock") as c:
            c.put([b"k"], [b"v"])[0].raise_for_status()
            [r] = c.get([b"k"])            # r.data == b"v"

    `address` is "unix:/path", "/path" (a Unix socket) or "host:port". `timeout_s` is the
    deadline of each call (methods take timeout_s= to override it). Nothing is sent until the
    first call; a daemon that cannot be reached raises UnavailableError naming the address.
    Thread-safe: share one Client between threads.

    Access: over TCP the daemon wants its Store token: `token=` (the string), or `token_file=`
    (default: the file named by $MCSTORE_TOKEN_FILE); it goes in each call's metadata as
    `authorization: Bearer <token>`. Over the Unix socket the socket file's mode decides.
    Buffers are registered by passing their file descriptor over the daemon's fd socket
    (`fd_socket=`, default "<unix socket>.fd", or $MCSTORE_FD_SOCKET); the session this opens
    owns them until close(), and its owner token goes with every call as `x-mc-owner`.

    TLS: for a daemon whose TCP listener serves TLS (--tls_cert_file), pass `tls=` a TlsConfig
    (CA file, optional client certificate and key, optional server name) or just the CA file's
    path. Unix-socket addresses take no TLS (ValueError).

    Fast channel: put, get (into registered slices only), exist, remove, match_prefix and
    release_lease go over the daemon's fast socket ("<unix socket>.fast": the same Store
    messages, one datagram each way, no gRPC) when it is there and the request fits its limit;
    everything else, and every call when it is absent or cannot be opened (retried after 30 s),
    over gRPC. `fast_channel`: None (default) = $MCSTORE_FAST_SOCKET when set (a path, or "off"),
    else "<unix socket>.fast" when `address` is a Unix socket; a str = that socket; False =
    never. `fast_connections` (default 4, 1..64): connections this Client keeps to it, one call
    each at a time; more concurrent calls go over gRPC (each connection holds a daemon thread and
    counts against the daemon's per-uid limit, --store_fast_max_connections_per_uid, 32). The
    *_async methods use gRPC. transport_stats() counts the calls of each path.
    """

    def __init__(self, address: str, timeout_s: float = 10.0, *, token: Optional[str] = None,
                 token_file: Optional[str] = None, fd_socket: Optional[str] = None,
                 tls: TlsArg = None, fast_channel: Any = None,
                 fast_connections: int = FAST_CONNECTIONS) -> None:
        self.address = address
        if type(fast_connections) is not int or not 1 <= fast_connections <= 64:
            raise ValueError("fast_connections must be an int in 1..64, got %r"
                             % (fast_connections,))
        self.timeout_s = float(timeout_s)
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self._token = read_token(token, token_file)
        self.fd_socket = (fd_socket or default_fd_socket(address)
                          or os.environ.get("MCSTORE_FD_SOCKET") or None)
        self._fd_session: Optional[FdSession] = None
        self.tls: Optional[TlsConfig] = tls_config(tls)
        self._channel = _channel.open_channel(grpc, address, self.tls)
        self._rpc: Dict[str, Any] = _channel.unary_stubs(self._channel, (
            "RegisterBuffer", "UnregisterBuffer", "BatchPut", "BatchGet", "BatchExist",
            "MatchPrefix", "ReleaseLease", "BatchRemove"))
        self._checker = _core.SliceChecker(self)
        self._buffers: List[SharedBuffer] = []
        self._gpu_buffers: List[GpuBuffer] = []
        self._gpu_rpc: Optional[Dict[str, Any]] = None
        self._lock = threading.Lock()
        self._packed_match = True
        path, explicit = fast_socket_path(fast_channel, address)
        self._fast: Optional[FastChannel] = (FastChannel(path, address, explicit,
                                                         max_connections=fast_connections)
                                             if path else None)
        self._grpc_calls = 0
        self.closed = False

    # -- plumbing --------------------------------------------------------------------------
    def _timeout(self, timeout_s: Optional[float]) -> float:
        return self.timeout_s if timeout_s is None else float(timeout_s)

    def _metadata(self) -> Tuple[Tuple[str, str], ...]:
        md: List[Tuple[str, str]] = []
        if self._token:
            md.append(("authorization", "Bearer " + self._token))
        session = self._fd_session
        if session is not None and not session.closed:
            md.append(("x-mc-owner", session.owner))
        return tuple(md)

    def _session(self, fresh: bool = False) -> FdSession:
        """The fd session (opened on first use; `fresh`: a new one, e.g. after a restart)."""
        with self._lock:
            if self._fd_session is not None and (fresh or self._fd_session.closed):
                self._fd_session.close()
                self._fd_session = None
            if self._fd_session is None:
                if not self.fd_socket:
                    raise StoreError(Code.INVALID_ARGUMENT,
                                     "registering a buffer needs the daemon's fd socket: connect "
                                     "through its Unix socket, or pass fd_socket= (or set "
                                     "$MCSTORE_FD_SOCKET)", address=self.address)
                self._fd_session = FdSession(self.fd_socket, self.timeout_s)
            return self._fd_session

    def _call(self, rpc: str, req: Any, timeout_s: Optional[float], fast: bool = False,
              items: int = 0, raw: bool = False) -> Any:
        """Sends `rpc`; `fast`: over the fast channel when it takes it (see FastChannel.call,
        and `items` and `raw` there: a raw answer comes back as its bytes), else over gRPC
        (a response message)."""
        if self.closed:
            raise ValueError("the mcstore Client for %s is closed" % self.address)
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)  # _timeout
        channel = self._fast
        if fast and channel is not None:
            body = req if type(req) is bytes else req.SerializeToString()
            session = self._fd_session
            owner = session.owner if session is not None and not session.closed else ""
            try:
                resp = channel.call(rpc, body, owner, timeout, items, raw)
            except SessionLostError:
                self._forget_session()
                raise
            if resp is not None:
                return resp
            req = body  # not sent: gRPC takes the bytes as they are
        if rpc in FAST_METHODS:
            with self._lock:
                self._grpc_calls += 1
        try:
            return self._rpc[rpc](req, timeout=timeout, metadata=self._metadata())
        except grpc.RpcError as e:
            raise self._error(e, rpc) from None

    def transport_stats(self) -> Dict[str, Any]:
        """How this Client's data calls (put, get, exist, remove, match_prefix, release_lease;
        not the *_async ones) went: "grpc" (over gRPC, the fast channel's fallbacks included),
        "fast" (answered over the fast channel), "fast_channel" (its
        socket path, or None when off), "fast_connections" (open now), "fast_limit" (the
        daemon's datagram limit, 0 before the first connection) and "fast_not_sent" (why calls
        meant for it went to gRPC: oversize, busy, down, connect_failed, stale; "failed": calls
        that broke after being sent)."""
        with self._lock:
            grpc_calls = self._grpc_calls
        out: Dict[str, Any] = {"grpc": grpc_calls, "fast": 0, "fast_channel": None,
                               "fast_connections": 0, "fast_limit": 0, "fast_not_sent": {}}
        channel = self._fast
        if channel is not None:
            stats = channel.snapshot()
            out.update(fast=stats.pop("fast"), fast_channel=channel.path,
                       fast_connections=channel.open_connections, fast_limit=channel.limit,
                       fast_not_sent=stats)
        return out

    def _error(self, err: grpc.RpcError, rpc: str) -> StoreError:
        error = error_from_rpc(err, rpc, self.address)
        if isinstance(error, SessionLostError):
            self._forget_session()
        return error

    def _forget_session(self) -> None:
        """The daemon lost our fd session (it restarted): drop it, and the ids of buffers
        registered through it, so later calls go out without the dead owner token and a new
        registration opens a new session (SessionLostError says what the caller must redo)."""
        with self._lock:
            if self._fd_session is not None:
                self._fd_session.close()
                self._fd_session = None
            self._checker.sizes.clear()
        if self._fast is not None:
            self._fast.drop()  # attached with the lost session's owner token

    def _future(self, rpc: str, req: Any, timeout_s: Optional[float],
                parse: Callable[[Any], T]) -> "concurrent.futures.Future[T]":
        if self.closed:
            raise ValueError("the mcstore Client for %s is closed" % self.address)
        out: concurrent.futures.Future = concurrent.futures.Future()
        out.set_running_or_notify_cancel()
        call = self._rpc[rpc].future(req, timeout=self._timeout(timeout_s),
                                     metadata=self._metadata())

        def done(f: Any) -> None:
            try:
                resp = f.result()
            except grpc.RpcError as e:
                out.set_exception(self._error(e, rpc))
                return
            except Exception as e:  # cancelled or unexpected: never lose the error
                out.set_exception(StoreError(Code.UNAVAILABLE, "%s: %r" % (rpc, e),
                                             address=self.address))
                return
            try:
                out.set_result(parse(resp))
            except Exception as e:
                out.set_exception(e)

        call.add_done_callback(done)
        return out

    # -- data ------------------------------------------------------------------------------
    def put(self, keys: Sequence[KeyLike], values: ValuesArg,
            replicas: Optional[int] = None, *, timeout_s: Optional[float] = None) -> List[Result]:
        """Stores values[i] under keys[i]; one Result per item, in order.

        A value is bytes / bytearray / memoryview / a C-contiguous numpy array / a contiguous
        CPU torch tensor (sent inline), or a Slice or list of Slices of registered buffers
        (zero-copy: the daemon reads the bytes from shared memory, their concatenation is the
        object). `replicas`: memory replicas (None = the daemon's --replicas). An existing key
        answers ALREADY_EXISTS (objects are immutable)."""
        req, bkeys = _core.build_put(keys, values, replicas, self._checker)
        resp = self._call("BatchPut", req, timeout_s, True, len(bkeys), raw=True)
        return _answers.read_results_answer(resp, bkeys, "BatchPut", self.address)

    def get(self, keys: Sequence[KeyLike], into: IntoArg = None,
            lease: Any = None, *, timeout_s: Optional[float] = None) -> List[GetResult]:
        """Reads keys; one GetResult per key, in order (duplicates included).

        Without `into` each object comes back in GetResult.data. With `into`, into[i] is a
        Slice or a list of Slices of registered buffers (or None for inline) and the object is
        scattered over them in order, zero-copy; their total length must equal the object's
        size, else the item answers SIZE_MISMATCH with GetResult.size set. `lease`: the Lease
        (or lease id) of a match_prefix whose keys these are."""
        req, bkeys, lengths = _core.build_get(keys, into, lease, self._checker)
        # Inline data comes back only over gRPC (a datagram holds the answer of slices only).
        resp = self._call("BatchGet", req, timeout_s, None not in lengths, raw=True)
        return _answers.read_get_answer(resp, bkeys, lengths, self.address)

    def exist(self, keys: Sequence[KeyLike], *, timeout_s: Optional[float] = None) -> List[bool]:
        """Whether each key is stored (a snapshot: it may be evicted right after)."""
        bkeys = _core.encode_keys(keys)
        req = store_pb2().BatchExistRequest(keys=bkeys)
        return _answers.parse_exist(self._call("BatchExist", req, timeout_s, True), bkeys,
                                 self.address)

    def remove(self, keys: Sequence[KeyLike], *,
               timeout_s: Optional[float] = None) -> List[Result]:
        """Removes keys; one Result per key (NOT_FOUND for a missing key, HAS_LEASE for a key
        being read)."""
        bkeys = _core.encode_keys(keys)
        req = store_pb2().BatchRemoveRequest(keys=bkeys)
        resp = self._call("BatchRemove", req, timeout_s, True, len(bkeys), raw=True)
        return _answers.read_results_answer(resp, bkeys, "BatchRemove", self.address)

    def match_prefix(self, keys: Sequence[KeyLike], lease_ttl_ms: int = 0, *,
                     timeout_s: Optional[float] = None) -> Lease:
        """How many leading keys are all stored and readable now (Lease.matched). With
        lease_ttl_ms > 0 those keys are also pinned (not evicted or removed) until the Lease is
        released or expires; the TTL is capped at 600 s by the daemon and at the
        master's --max_lease_ttl_ms."""
        packed = self._packed_match
        req, bkeys = _core.build_match(keys, lease_ttl_ms, packed)
        resp = self._call("MatchPrefix", req, timeout_s, True)
        if packed and _answers.needs_unpacked_retry(resp, bkeys):
            self._packed_match = False  # a daemon older than packed keys: it saw none
            req, bkeys = _core.build_match(keys, lease_ttl_ms, False)
            resp = self._call("MatchPrefix", req, timeout_s, True)
        matched, lease_id, expiry, token = _answers.parse_match(resp, bkeys, lease_ttl_ms,
                                                             self.address)
        return Lease(matched, lease_id, expiry, bkeys[:matched], self.release_lease, token)

    def release_lease(self, lease: Any, *, timeout_s: Optional[float] = None) -> bool:
        """Releases a lease (a Lease, a LeaseRef, or a bare id of a lease this Client took);
        False if it was unknown, already expired, or another caller's and no capability was
        given."""
        lease_id, token = _core.lease_of(lease)
        req = store_pb2().ReleaseLeaseRequest(lease_id=lease_id, lease_token=token)
        try:
            self._call("ReleaseLease", req, timeout_s, True)
        except StoreError as e:
            if e.code == Code.NOT_FOUND:
                return False
            raise
        return True

    # -- futures (overlap calls from threads without asyncio) ------------------------------
    def put_async(self, keys: Sequence[KeyLike], values: ValuesArg,
                  replicas: Optional[int] = None, *,
                  timeout_s: Optional[float] = None) -> "concurrent.futures.Future[List[Result]]":
        """put() as a concurrent.futures.Future. Bad input raises at once; RPC errors come out
        of Future.result(). Buffers behind slices must stay open until it is done. The *_async
        methods always go over gRPC (never the fast channel)."""
        req, bkeys = _core.build_put(keys, values, replicas, self._checker)
        return self._future("BatchPut", req, timeout_s,
                            lambda r: _answers.parse_results(r, bkeys, "BatchPut", self.address))

    def get_async(self, keys: Sequence[KeyLike], into: IntoArg = None,
                  lease: Any = None, *, timeout_s: Optional[float] = None
                  ) -> "concurrent.futures.Future[List[GetResult]]":
        """get() as a concurrent.futures.Future (see put_async)."""
        req, bkeys, lengths = _core.build_get(keys, into, lease, self._checker)
        return self._future("BatchGet", req, timeout_s,
                            lambda r: _answers.parse_get(r, bkeys, lengths, self.address))

    def exist_async(self, keys: Sequence[KeyLike], *, timeout_s: Optional[float] = None
                    ) -> "concurrent.futures.Future[List[bool]]":
        bkeys = _core.encode_keys(keys)
        req = store_pb2().BatchExistRequest(keys=bkeys)
        return self._future("BatchExist", req, timeout_s,
                            lambda r: _answers.parse_exist(r, bkeys, self.address))

    def remove_async(self, keys: Sequence[KeyLike], *, timeout_s: Optional[float] = None
                     ) -> "concurrent.futures.Future[List[Result]]":
        bkeys = _core.encode_keys(keys)
        req = store_pb2().BatchRemoveRequest(keys=bkeys)
        return self._future("BatchRemove", req, timeout_s,
                            lambda r: _answers.parse_results(r, bkeys, "BatchRemove",
                                                          self.address))

    # -- buffers ---------------------------------------------------------------------------
    def prepare_slices(self, slices: Any) -> "_core.PreparedSlices":
        """Checks a Slice or list of Slices once and returns it ready to send: pass it as a put
        value or a get destination any number of times. Worth it for many slices per item that
        are reused (a vLLM block: one slice per layer and K/V); each use re-checks only that its
        buffers are still registered and open."""
        return _core.PreparedSlices(slices, self._checker)

    def block_layout(self, runs: Sequence[Tuple[Slice, int]]) -> "_core.BlockLayout":
        """A paged layout: `runs` are (Slice of block 0, stride) pairs, block i being each
        run's slice shifted by i * stride, in run order. Pass `layout.blocks(indices)` as get's
        `into` or put's `values`: the request then carries the runs once and one index per
        key, and nothing is prepared per block (see docs/python.md, "Block layouts")."""
        return _core.BlockLayout(runs, self._checker)

    def create_buffer(self, nbytes: int) -> SharedBuffer:
        """Creates a shared-memory buffer of nbytes (mode 0600), registers it with the daemon
        and returns it. It is closed (unregistered, unlinked) by close() or with this Client."""
        buf = SharedBuffer(nbytes, self._register_raw, self._unregister_quiet, self)
        with self._lock:
            self._buffers = [b for b in self._buffers if not b.closed]
            self._buffers.append(buf)
        return buf

    def register_buffer(self, shm_name: str, size: int) -> int:
        """Registers an existing POSIX shm object ("/name", which this process can open for
        reading and writing: it is opened here and its fd passed to the daemon) of `size`
        bytes; returns the buffer id for Slices made by hand: Slice(buffer_id, offset, length).
        The buffer is this Client's: other callers cannot use it, and it is released when this
        Client closes (or its process dies)."""
        buffer_id = self._register_raw(shm_name, size)
        self._checker.sizes[buffer_id] = size
        return buffer_id

    def register_fd(self, fd: int, size: int) -> int:
        """Registers `size` bytes of a file descriptor open O_RDWR on a shm object or a memfd
        (os.memfd_create); returns the buffer id. The caller keeps (and may close) its fd."""
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError("size must be an int > 0")
        handle = self._session().register_fd(fd, size)
        buffer_id = self._claim(handle)
        self._checker.sizes[buffer_id] = size
        return buffer_id

    def _claim(self, handle: str) -> int:
        req = store_pb2().RegisterBufferRequest(handle=handle)
        return self._call("RegisterBuffer", req, None).buffer_id

    def unregister_buffer(self, buffer_id: int) -> None:
        """Unregisters a buffer registered with register_buffer()."""
        self._checker.sizes.pop(buffer_id, None)
        req = store_pb2().UnregisterBufferRequest(buffer_id=buffer_id)
        self._call("UnregisterBuffer", req, None)

    def _register_raw(self, shm_name: str, size: int) -> int:
        check_shm_name(shm_name)
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError("size must be an int")
        if size <= 0:
            raise ValueError("size must be > 0, got %d" % size)
        path = "/dev/shm/" + shm_name.lstrip("/")
        try:
            handle = self._session().register_path(path, size)
        except FileNotFoundError:
            raise StoreError(Code.NOT_FOUND, "no shm object %s (%s)" % (shm_name, path),
                             address=self.address) from None
        except PermissionError as e:
            raise StoreError(Code.INVALID_ARGUMENT, "cannot open shm object %s read-write: %s"
                             % (shm_name, e), address=self.address) from None
        except StoreError as e:
            if e.code != Code.UNAVAILABLE:
                raise
            # The session broke (the daemon restarted?): one more try on a fresh one.
            handle = self._session(fresh=True).register_path(path, size)
        return self._claim(handle)

    # -- GPU memory (docs/gpu.md) -----------------------------------------------------------
    def register_cuda(self, tensor: Any, *, device: Optional[int] = None,
                      device_uuid: Optional[str] = None) -> GpuBuffer:
        """Lends the daemon a contiguous torch CUDA tensor's memory (CUDA IPC; the daemon must
        run with --cuda_device on the same GPU) and returns its GpuBuffer: `buf.slice(off, n)`
        names bytes of it in get's `into` and put's `values` (and block layouts). The
        buffer keeps the tensor alive and is unregistered by its close() or this Client's.
        `device`: the GPU's ordinal as mc-client numbers them, when it differs from the
        tensor's (other CUDA_VISIBLE_DEVICES); by default the tensor's. `device_uuid` (e.g.
        str(torch.cuda.get_device_properties(i).uuid)): the daemon then refuses the
        registration unless its `device` is that GPU."""
        export = export_cuda_tensor(tensor)
        return self.register_gpu_handle(
            export.handle, export.size, device=export.device if device is None else device,
            allocation_offset=export.allocation_offset, device_uuid=device_uuid, keep=tensor)

    def register_gpu_handle(self, handle: bytes, size: int, *, device: int = 0,
                            allocation_offset: int = 0, device_uuid: Optional[str] = None,
                            keep: Any = None) -> GpuBuffer:
        """Registers `size` bytes at `allocation_offset` of the device allocation whose
        cudaIpcMemHandle_t (64 bytes) is `handle`. The caller keeps the memory allocated until
        the returned GpuBuffer is closed (`keep` is held by it until then)."""
        if not isinstance(handle, (bytes, bytearray)) or len(handle) != CUDA_IPC_HANDLE_BYTES:
            raise ValueError("handle must be the %d bytes of a cudaIpcMemHandle_t"
                             % CUDA_IPC_HANDLE_BYTES)
        gpb = gpu_pb2()
        req = gpb.RegisterGpuBufferRequest(
            version=1, kind=gpb.GPU_HANDLE_CUDA_IPC, handle=bytes(handle),
            **self._gpu_fields(size, device, allocation_offset, device_uuid))
        return self._register_gpu(req, keep)

    def register_gpu_fd(self, fd: int, size: int, *, device: int = 0, allocation_offset: int = 0,
                        device_uuid: Optional[str] = None, keep: Any = None) -> GpuBuffer:
        """Registers `size` bytes at `allocation_offset` of the device allocation exported as a
        POSIX file descriptor (cuMemExportToShareableHandle(..., POSIX_FILE_DESCRIPTOR)): the fd
        goes over the daemon's fd socket (so only this process, as the kernel saw it, can have
        sent it; you keep your fd), then RegisterGpuBuffer names it by its one-time ticket. The
        authenticated alternative to CUDA IPC handles (docs/gpu.md)."""
        fields = self._gpu_fields(size, device, allocation_offset, device_uuid)
        if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
            raise ValueError("fd must be an open file descriptor")
        try:
            ticket = self._session().register_gpu_fd(fd)
        except StoreError as e:
            if e.code != Code.UNAVAILABLE:
                raise
            ticket = self._session(fresh=True).register_gpu_fd(fd)  # the daemon restarted?
        gpb = gpu_pb2()
        req = gpb.RegisterGpuBufferRequest(version=1, kind=gpb.GPU_HANDLE_POSIX_FD,
                                           fd_ticket=ticket, **fields)
        return self._register_gpu(req, keep)

    @staticmethod
    def _gpu_fields(size: int, device: int, allocation_offset: int,
                    device_uuid: Optional[str]) -> Dict[str, Any]:
        size = _check_int(size, "size")
        device = _check_int(device, "device")
        allocation_offset = _check_int(allocation_offset, "allocation_offset")
        if size <= 0 or size >= 1 << 64:
            raise ValueError("size must be in 1..2^64-1, got %d" % size)
        if not 0 <= device <= 1023:
            raise ValueError("device must be a CUDA ordinal in 0..1023, got %d" % device)
        if not 0 <= allocation_offset < 1 << 64:
            raise ValueError("allocation_offset must be in 0..2^64-1")
        if device_uuid is not None and (not isinstance(device_uuid, str)
                                        or not 0 < len(device_uuid) <= 64):
            raise ValueError("device_uuid must be a GPU UUID string (\"GPU-xxxxxxxx-...\")")
        return dict(size=size, device=device, allocation_offset=allocation_offset,
                    device_uuid=device_uuid or "")

    def _register_gpu(self, req: Any, keep: Any) -> GpuBuffer:
        size, device = req.size, req.device
        if self.fd_socket:
            # The daemon files a buffer under the caller's owner (x-mc-owner, the fd session's):
            # opened now, before the first registration, the owner stays the same for this
            # Client's later calls, and a later create_buffer() cannot orphan the GPU buffer.
            self._session()
        resp = self._gpu_call("RegisterGpuBuffer", req)
        buffer_id = resp.buffer_id
        if not buffer_id & GPU_BUFFER_ID_BIT:
            self._unregister_gpu_quiet(buffer_id)
            raise StoreError(Code.INTERNAL, "the daemon answered buffer id %#x for a GPU buffer, "
                             "without bit 63" % buffer_id, address=self.address)
        buf = GpuBuffer(buffer_id, size, device, resp.device_name, self._unregister_gpu_quiet,
                        keep)
        with self._lock:
            self._checker.sizes[buffer_id] = size
            self._gpu_buffers = [b for b in self._gpu_buffers if not b.closed]
            self._gpu_buffers.append(buf)
        return buf

    def _gpu_call(self, rpc: str, req: Any) -> Any:
        if self.closed:
            raise ValueError("the mcstore Client for %s is closed" % self.address)
        with self._lock:
            if self._gpu_rpc is None:
                gpb = gpu_pb2()
                self._gpu_rpc = {name: self._channel.unary_unary(
                    GPU_SERVICE + name, request_serializer=_channel.serialize,
                    response_deserializer=getattr(gpb, name + "Response").FromString)
                    for name in ("RegisterGpuBuffer", "UnregisterGpuBuffer")}
            stub = self._gpu_rpc[rpc]
        try:
            return stub(req, timeout=self.timeout_s, metadata=self._metadata())
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise StoreError(Code.INVALID_ARGUMENT,
                                 "%s: this mc-client serves no GPU buffers: start it with "
                                 "--cuda_device=N on a host with that CUDA device (docs/gpu.md)"
                                 % rpc, address=self.address) from None
            raise self._error(e, rpc) from None

    def _unregister_gpu_quiet(self, buffer_id: int) -> None:
        with self._lock:
            self._checker.sizes.pop(buffer_id, None)
        if self.closed:
            return
        try:
            self._gpu_call("UnregisterGpuBuffer",
                           gpu_pb2().UnregisterGpuBufferRequest(buffer_id=buffer_id))
        except StoreError:
            pass  # gone or restarted: nothing to unregister there (NOT_FOUND alike)

    def _unregister_quiet(self, buffer_id: int) -> None:
        if self.closed:
            return
        try:
            self._call("UnregisterBuffer",
                       store_pb2().UnregisterBufferRequest(buffer_id=buffer_id),
                       min(self.timeout_s, 2.0))
        except StoreError:
            pass  # the daemon is gone or restarted: nothing to unregister there

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Closes this client's buffers, then the channel. Idempotent."""
        if self.closed:
            return
        with self._lock:
            buffers, self._buffers = self._buffers, []
            gpu_buffers, self._gpu_buffers = self._gpu_buffers, []
        for b in buffers:
            b.close()
        for g in gpu_buffers:
            g.close()
        self.closed = True
        self._channel.close()
        if self._fast is not None:
            self._fast.close()
        with self._lock:
            session, self._fd_session = self._fd_session, None
        if session is not None:
            session.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "Client(%r%s)" % (self.address, ", closed" if self.closed else "")


def read_token(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    """The Store token: `token`, else the (stripped) content of `token_file` or of the file
    named by $MCSTORE_TOKEN_FILE, else None. The file must be a regular file that group and
    others cannot access (the rule the daemons and mc-admin apply): PermissionError otherwise."""
    if token:
        return token.strip()
    path = token_file or os.environ.get("MCSTORE_TOKEN_FILE")
    if not path:
        return None
    with open(path, "r", encoding="utf-8") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise PermissionError("token file %s is not a regular file" % path)
        if st.st_mode & 0o077:
            raise PermissionError("token file %s may be read by group or others (mode %o): "
                                  "chmod 600 %s" % (path, st.st_mode & 0o777, path))
        value = f.read().strip()
    if not value:
        raise ValueError("token file %s is empty" % path)
    return value
