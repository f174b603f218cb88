"""The fd side channel of an mc-client daemon: hands it shared memory as a file descriptor.

The daemon maps a buffer only from a file descriptor its caller passes over the fd socket
(SCM_RIGHTS on a Unix SOCK_SEQPACKET socket, by default "<unix socket>.fd"), never by name: the
kernel checked the caller's own rights when it opened the object. Each connection is a session
with an owner token; Store calls that use the session's buffers (slices, unregister) send it as
`x-mc-owner` metadata. When the connection closes (or the process dies), the daemon releases the
session's buffers. See docs/security.md.

Protocol: request = b"MCF1" + u32 op + u64 size (little-endian, 16 bytes); op 1 REGISTER with
one fd, op 2 HELLO with none, op 3 REGISTER_GPU with one POSIX-fd GPU handle (its reply's handle
is the decimal fd_ticket for RegisterGpuBuffer). Reply = "OK <owner> <handle>" or
"ERR <CODE> <message>".
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from typing import Optional

from mcstore._errors import Code, StoreError, UnavailableError

OP_REGISTER = 1
OP_HELLO = 2
OP_REGISTER_GPU = 3

_CODES = {"NOT_FOUND": Code.NOT_FOUND, "INVALID_ARGUMENT": Code.INVALID_ARGUMENT}


def request(op: int, size: int = 0) -> bytes:
    return b"MCF1" + struct.pack("<IQ", op, size)


def default_fd_socket(address: str) -> Optional[str]:
    """The fd socket next to a Unix-socket address ("unix:/p" or "/p"); None for TCP."""
    if address.startswith("unix:"):
        return address[len("unix:"):] + ".fd"
    if address.startswith("/"):
        return address + ".fd"
    return None


class FdSession:
    """One session on the daemon's fd socket. Thread-safe; close() ends it (and the daemon then
    releases the buffers registered through it)."""

    def __init__(self, path: str, timeout_s: float) -> None:
        self.path = path
        self._lock = threading.Lock()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except OSError as e:
            sock.close()
            raise UnavailableError("cannot reach the daemon's fd socket %s: %s (buffers are "
                                   "registered through it; is --unix_socket set?)" % (path, e),
                                   address=path) from None
        self._sock: Optional[socket.socket] = sock
        self.owner, _ = self._ask(request(OP_HELLO), [])

    def _ask(self, msg: bytes, fds: list) -> tuple:
        with self._lock:
            if self._sock is None:
                raise UnavailableError("fd session closed", address=self.path)
            try:
                if fds:
                    socket.send_fds(self._sock, [msg], fds)
                else:
                    self._sock.send(msg)
                reply = self._sock.recv(4096)
            except OSError as e:
                raise UnavailableError("fd socket %s: %s" % (self.path, e),
                                       address=self.path) from None
        text = reply.decode("utf-8", "replace")
        if not text:
            raise UnavailableError("fd socket %s closed the session" % self.path,
                                   address=self.path)
        parts = text.split(" ", 2)
        if parts[0] == "OK" and len(parts) == 3:
            return parts[1], parts[2]
        code = parts[1] if len(parts) > 1 else "INTERNAL"
        message = parts[2] if len(parts) > 2 else text
        if code == "RESOURCE_EXHAUSTED":
            raise StoreError(Code.NO_SPACE, "RESOURCE_EXHAUSTED: " + message, address=self.path)
        if code == "UNAVAILABLE":
            raise UnavailableError("%s: %s" % (code, message), address=self.path)
        raise StoreError(_CODES.get(code, Code.INTERNAL), "%s: %s" % (code, message),
                         address=self.path)

    def register_fd(self, fd: int, size: int) -> str:
        """Passes `fd` (open O_RDWR on a shm object or memfd) and returns the one-time handle
        for RegisterBuffer."""
        _, handle = self._ask(request(OP_REGISTER, size), [fd])
        return handle

    def register_gpu_fd(self, fd: int) -> int:
        """Passes a POSIX-fd GPU handle (cuMemExportToShareableHandle) and returns the one-time
        fd_ticket for RegisterGpuBuffer; only this session's owner may name it."""
        _, ticket = self._ask(request(OP_REGISTER_GPU), [fd])
        try:
            value = int(ticket)
        except ValueError:
            value = 0
        if not 0 < value < 1 << 64:
            raise StoreError(Code.INTERNAL, "the fd socket answered a bad ticket %r" % ticket,
                             address=self.path)
        return value

    def register_path(self, path: str, size: int) -> str:
        """Opens `path` (e.g. /dev/shm/<name>) read-write with this process's rights and passes
        it."""
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            return self.register_fd(fd, size)
        finally:
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._sock is None

    def close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
