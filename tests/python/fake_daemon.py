"""A fake mc-client daemon in Python for the client's unit tests: its gRPC Store service on a
Unix socket, its fd socket ("<sock>.fd": HELLO and REGISTER, owner tokens per session) and its
fast channel ("<sock>.fast", the wire of python/mcstore/_fastchannel.py). Answers are made up
from the requests (every item OK, gets as long as their slices); a test can replace the fast
channel's answer per call (`FakeFast.behaviour`) and reads what each path was asked."""

import os
import shutil
import socket
import struct
import tempfile
import threading
from concurrent import futures
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import grpc

from mcstore.v1 import store_pb2

REQUEST = struct.Struct("<4sIQ")
REPLY = struct.Struct("<4sIQI")
METHOD_NAMES = {2: "BatchPut", 3: "BatchGet", 4: "BatchExist", 5: "MatchPrefix",
                6: "ReleaseLease", 7: "BatchRemove"}
OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, UNAUTHENTICATED = 0, 3, 8, 9, 16


def answer(name: str, req: Any) -> Any:
    """The made-up answer of Store RPC `name`: every item OK."""
    spb = store_pb2
    if name == "BatchPut":
        return spb.BatchPutResponse(results=[spb.Result() for _ in req.items])
    if name == "BatchGet":
        out = spb.BatchGetResponse()
        for item in req.items:
            n = sum(s.length for s in item.slices)
            if item.slices:
                out.results.add(size=n, bytes_written=n)
            else:
                out.results.add(size=3, data=b"abc")
        if req.block_layout:
            n = sum(r.length for r in req.block_layout)
            for r in out.results:
                r.size = r.bytes_written = n
        return out
    if name == "BatchExist":
        return spb.BatchExistResponse(exists=[True] * len(req.keys))
    if name == "BatchRemove":
        return spb.BatchRemoveResponse(results=[spb.Result() for _ in req.keys])
    if name == "MatchPrefix":
        n = len(req.packed_key_sizes) or len(req.keys)
        lease = 7 if req.lease_ttl_ms and n else 0
        return spb.MatchPrefixResponse(matched=n, keys_seen=n, lease_id=lease,
                                       lease_token=b"t" * 16 if lease else b"")
    if name == "ReleaseLease":
        return spb.ReleaseLeaseResponse()
    raise AssertionError(name)


class FakeFd:
    """The fd socket: each connection is a session "owner-N", live until it closes."""

    def __init__(self, path: str) -> None:
        self.live: Set[str] = set()
        self._lock = threading.Lock()
        self._n = 0
        self._server = _Server(path, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        with self._lock:
            self._n += 1
            owner = "owner-%d" % self._n
            self.live.add(owner)
        try:
            while True:
                msg, fds, _, _ = socket.recv_fds(conn, 64, 1)
                for fd in fds:
                    os.close(fd)
                if not msg:
                    return
                conn.send(("OK %s h%d" % (owner, self._n)).encode())
        except OSError:
            return
        finally:
            with self._lock:
                self.live.discard(owner)

    def end_sessions(self) -> None:
        """The daemon forgets every session (as after a restart)."""
        with self._lock:
            self.live.clear()

    def close(self) -> None:
        self._server.close()


class FakeFast:
    """The fast channel. `behaviour(name, request, call_id)` may return None (answer as usual)
    or ("reply", status, message, body_bytes[, call_id]), ("hang",) (no answer until the
    client gives up: the connection is closed once the client closed it) or ("close",)."""

    def __init__(self, path: str, owners: Callable[[], Set[str]], limit: int = 262144) -> None:
        self.limit = limit
        self.owners = owners
        self.behaviour: Optional[Callable[[str, Any, int], Optional[Tuple]]] = None
        self.attaches: List[str] = []
        self.calls: List[Tuple[str, str]] = []  # (rpc, owner of the connection)
        self.refuse_attach = False
        self.lock = threading.Lock()
        self.connections = 0
        self.max_connections = 0
        self._server = _Server(path, self._serve)

    def _serve(self, conn: socket.socket) -> None:
        with self.lock:
            self.connections += 1
            self.max_connections = max(self.max_connections, self.connections)
        try:
            owner = self._attach(conn)
            while owner is not None:
                data = conn.recv(self.limit + 1)
                if not data or not self._one(conn, owner, data):
                    return
        except OSError:
            return
        finally:
            with self.lock:
                self.connections -= 1

    def _attach(self, conn: socket.socket) -> Optional[str]:
        data = conn.recv(4096)
        if len(data) < 16:
            return None
        magic, method, call_id = REQUEST.unpack_from(data)
        token = data[16:].decode()
        with self.lock:
            self.attaches.append(token)
        if magic != b"MCQ1" or method != 1:
            send_reply(conn, UNAUTHENTICATED, call_id, "attach first")
            return None
        if self.refuse_attach or (token and token not in self.owners()):
            send_reply(conn, UNAUTHENTICATED, call_id, "no such session")
            return None
        send_reply(conn, OK, call_id, "", struct.pack("<I", self.limit))
        return token

    def _one(self, conn: socket.socket, owner: str, data: bytes) -> bool:
        magic, method, call_id = REQUEST.unpack_from(data)
        name = METHOD_NAMES[method]
        req = getattr(store_pb2, name + "Request").FromString(data[16:])
        with self.lock:
            self.calls.append((name, owner))
        act = self.behaviour(name, req, call_id) if self.behaviour else None
        if act is None:
            send_reply(conn, OK, call_id, "", answer(name, req).SerializeToString())
            return True
        if act[0] == "reply":
            send_reply(conn, act[1], act[4] if len(act) > 4 else call_id, act[2], act[3])
            return True
        if act[0] == "hang":
            conn.recv(1)  # returns when the client closes its end
        return False

    def calls_of(self, name: str) -> int:
        with self.lock:
            return sum(1 for n, _ in self.calls if n == name)

    def close(self) -> None:
        self._server.close()


def send_reply(conn: socket.socket, status: int, call_id: int, message: str,
               body: bytes = b"") -> None:
    m = message.encode()
    conn.send(REPLY.pack(b"MCR1", status, call_id, len(m)) + m + body)


class _Server:
    """A SOCK_SEQPACKET listener serving each connection on a thread; close() ends them all."""

    def __init__(self, path: str, serve: Callable[[socket.socket], None]) -> None:
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.bind(path)
        self._sock.listen(64)
        self._serve = serve
        self._lock = threading.Lock()
        self._conns: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._run, args=(conn,), daemon=True)
            with self._lock:
                self._conns.append(conn)
                self._threads.append(t)
            t.start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self._serve(conn)
        finally:
            conn.close()

    def close(self) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        os.unlink(self._path)
        self._accepting.join(5)
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its thread
        for t in threads:
            t.join(5)


class FakeDaemon:
    """The three sockets in a fresh directory: `sock` (gRPC), `sock`.fd, `sock`.fast."""

    def __init__(self, fast: bool = True, limit: int = 262144) -> None:
        self.dir = tempfile.mkdtemp(prefix="mcfast", dir="/tmp")
        self.sock = os.path.join(self.dir, "d.sock")
        self.address = "unix:" + self.sock
        self.grpc_calls: List[Tuple[str, str]] = []  # (rpc, x-mc-owner)
        self._next_id = 0
        self._lock = threading.Lock()
        self.grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.grpc.add_generic_rpc_handlers((self._handlers(),))
        self.grpc.add_insecure_port(self.address)
        self.grpc.start()
        self.fd = FakeFd(self.sock + ".fd")
        self.fast: Optional[FakeFast] = None
        if fast:
            self.start_fast(limit)

    def start_fast(self, limit: int = 262144) -> FakeFast:
        self.fast = FakeFast(self.sock + ".fast", lambda: set(self.fd.live), limit)
        return self.fast

    def _handlers(self) -> Any:
        methods: Dict[str, Any] = {}
        for name in list(METHOD_NAMES.values()) + ["RegisterBuffer", "UnregisterBuffer"]:
            methods[name] = grpc.unary_unary_rpc_method_handler(
                self._handler(name),
                request_deserializer=getattr(store_pb2, name + "Request").FromString,
                response_serializer=lambda m: m.SerializeToString())
        return grpc.method_handlers_generic_handler("mcstore.v1.Store", methods)

    def _handler(self, name: str) -> Callable[[Any, Any], Any]:
        def handle(req: Any, context: Any) -> Any:
            owner = dict(context.invocation_metadata()).get("x-mc-owner", "")
            with self._lock:
                self.grpc_calls.append((name, owner))
                self._next_id += 1
                buffer_id = self._next_id
            if name == "RegisterBuffer":
                return store_pb2.RegisterBufferResponse(buffer_id=buffer_id)
            if name == "UnregisterBuffer":
                return store_pb2.UnregisterBufferResponse()
            return answer(name, req)
        return handle

    def grpc_calls_of(self, name: str) -> int:
        with self._lock:
            return sum(1 for n, _ in self.grpc_calls if n == name)

    def close(self) -> None:
        if self.fast is not None:
            self.fast.close()
        self.fd.close()
        self.grpc.stop(0).wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)
