"""Raw data-plane frames for tests that talk to an mc-client's data port from a socket of their
own (transfer/tcp/frame.h, version 2): a 48-byte header, then for READ / WRITE / READ_DISK a
64-byte capability block, then the payload; and the handshake of an authenticated data plane."""

import hashlib
import hmac
import os
import socket
import struct

from integration import harness

MAGIC, VERSION = 0x4654434D, 2
READ, WRITE, READ_DISK, RDMA_CONNECT, AUTH = 1, 2, 3, 4, 5
RESPONSE = 0x8000
HEADER = struct.Struct("<IHHQQQQII")
CAP_SIZE = 64
OK_CODE, PERMISSION_DENIED = 0, 13


def frame(op, rid, segment, offset, length, cap=None, payload=b"", reserved=0):
    """A request frame; READ / WRITE / READ_DISK carry `cap` (zeros when None)."""
    out = HEADER.pack(MAGIC, VERSION, op, rid, segment, offset, length, 0, reserved)
    if op in (READ, WRITE, READ_DISK):
        out += cap if cap is not None else bytes(CAP_SIZE)
    return out + payload


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def read_response(sock):
    """The next response frame: {op, id, length, code, payload}."""
    _, _, op, rid, _, _, length, code, _ = HEADER.unpack(recv_exact(sock, HEADER.size))
    return {"op": op, "id": rid, "length": length, "code": code,
            "payload": recv_exact(sock, length) if length else b""}


def closed_without_data(sock, timeout_s=3.0):
    """True when the peer closes `sock` within the timeout without sending a byte."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1 << 20) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def data_plane_key():
    """The data-plane key derived from the test cluster's secret (common/auth)."""
    with open(harness.cluster_secret_file()) as f:
        secret = [l.strip() for l in f if l.strip() and not l.startswith("#")][0]
    return hmac.new(secret.encode(), b"mcstore/v1/data-plane", hashlib.sha256).digest()


def handshake(sock, key):
    """Runs the mutual data-plane handshake on `sock` with `key`; asserts that both proofs pass."""
    nc = os.urandom(32)
    sock.sendall(frame(AUTH, 1, 0, 0, 32, payload=nc))
    r = read_response(sock)
    assert r["code"] == OK_CODE and len(r["payload"]) == 64, r
    ns, server_mac = r["payload"][:32], r["payload"][32:]
    want = hmac.new(key, b"mcstore/v1/dp-server\n" + nc + ns, hashlib.sha256).digest()
    assert hmac.compare_digest(want, server_mac), "the server's proof does not verify"
    mine = hmac.new(key, b"mcstore/v1/dp-client\n" + nc + ns, hashlib.sha256).digest()
    sock.sendall(frame(AUTH, 2, 0, 1, 32, payload=mine))
    assert read_response(sock)["code"] == OK_CODE
