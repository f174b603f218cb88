"""Raw data-plane frames for tests that talk to an mc-client's data port from a socket of their
own (transfer/tcp/frame.h, version 2): a 48-byte header, then for READ / WRITE / READ_DISK a
64-byte capability block, then the payload; and the handshake of an authenticated data plane,
with the encrypted connection it may open (transfer/tcp/sealed_records.h, written again here from
docs/security.md "Encryption": a second implementation of the wire format)."""

import hashlib
import hmac
import os
import socket
import struct

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

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


MAX_RECORD = 256 << 10


class SealedSocket:
    """An encrypted data-plane connection over `sock`: sendall(one frame) seals the frame's header
    (+ capability block) as one record and its payload in records of at most 256 KiB; recv(n)
    opens records (AESGCM raises InvalidTag on a bad one)."""

    def __init__(self, sock, base):
        def expand(label):
            return hmac.new(base, label, hashlib.sha256).digest()
        prefixes = expand(b"mcstore/v1/dp-nonce-prefixes")
        self.sock = sock
        self.up = [AESGCM(expand(b"mcstore/v1/dp-key-to-server")), prefixes[:4], 0]
        self.down = [AESGCM(expand(b"mcstore/v1/dp-key-to-requester")), prefixes[4:8], 0]
        self.opened = b""

    def _seal(self, data):
        aead, prefix, n = self.up
        self.up[2] += 1
        length = struct.pack("<I", len(data))
        return length + aead.encrypt(prefix + struct.pack("<Q", n), data, length)

    def sendall(self, frame_bytes):
        op = struct.unpack_from("<H", frame_bytes, 6)[0]
        head = HEADER.size + (CAP_SIZE if op in (READ, WRITE, READ_DISK) else 0)
        out = self._seal(frame_bytes[:head])
        for at in range(head, len(frame_bytes), MAX_RECORD):
            out += self._seal(frame_bytes[at:at + MAX_RECORD])
        self.sock.sendall(out)

    def recv(self, n):
        if not self.opened:
            try:
                length = recv_exact(self.sock, 4)
            except ConnectionError:
                return b""
            size = struct.unpack("<I", length)[0]
            assert 1 <= size <= MAX_RECORD, size
            aead, prefix, count = self.down
            self.down[2] += 1
            self.opened = aead.decrypt(prefix + struct.pack("<Q", count),
                                       recv_exact(self.sock, size + 16), length)
        out, self.opened = self.opened[:n], self.opened[n:]
        return out


def handshake(sock, key, encrypt=False):
    """Runs the mutual data-plane handshake on `sock` with `key`; asserts that both proofs pass.
    Returns what to send frames on: `sock` itself, or with `encrypt` a SealedSocket over it."""
    nc = os.urandom(32)
    sock.sendall(frame(AUTH, 1, 1 if encrypt else 0, 0, 32, payload=nc))
    _, _, _, _, answer, _, length, code, _ = HEADER.unpack(recv_exact(sock, HEADER.size))
    payload = recv_exact(sock, length) if length else b""
    assert code == OK_CODE and len(payload) == 64, (code, length)
    assert answer == (1 if encrypt else 0), answer
    mode = b"\x01" if encrypt else b""
    ns, server_mac = payload[:32], payload[32:]
    want = hmac.new(key, b"mcstore/v1/dp-server\n" + nc + ns + mode, hashlib.sha256).digest()
    assert hmac.compare_digest(want, server_mac), "the server's proof does not verify"
    mine = hmac.new(key, b"mcstore/v1/dp-client\n" + nc + ns + mode, hashlib.sha256).digest()
    sock.sendall(frame(AUTH, 2, 0, 1, 32, payload=mine))
    assert read_response(sock)["code"] == OK_CODE
    if not encrypt:
        return sock
    return SealedSocket(sock, hmac.new(key, b"mcstore/v1/dp-session\n" + nc + ns,
                                       hashlib.sha256).digest())
