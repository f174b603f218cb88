"""Authenticating to mc-master from Python as mc-client and mc-admin do (docs/security.md),
with the standard library's hmac: registration and admin proofs (x-mc-auth, version 2: bound to
the run id the master answers to Hello) and session credentials (x-mc-session). Tests that drive
the Master service directly use these; nothing here imports harness, so callers pass
harness.cluster_secret_file() themselves."""

import hashlib
import hmac
import os
import time

PROOF_HEADER = "x-mc-auth"
SESSION_HEADER = "x-mc-session"


def read_secret(path):
    """The signing (first) secret of a cluster secret file."""
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                return line
    raise ValueError("no secret in %s" % path)


def master_rpc_key(secret):
    """The per-purpose key derived from a secret (common/auth.cc DeriveKeys)."""
    return hmac.new(secret.encode(), b"mcstore/v1/master-rpc", hashlib.sha256).digest()


def run_id(stub, timeout=10):
    """The run id the master behind `stub` answers to Hello (a proof is good for that run only)."""
    from mcstore.v1 import master_pb2 as mpb
    return stub.Hello(mpb.HelloRequest(), timeout=timeout).run_id


def proof(key, role, ident, endpoint="", unix_ms=None, nonce_hex=None, run=b""):
    """An x-mc-auth value for the master run `run` (HelloResponse.run_id): role "register"
    (ident = client id, endpoint = its data endpoint) or "admin" (endpoint empty)."""
    unix_ms = int(time.time() * 1000) if unix_ms is None else unix_ms
    nonce_hex = os.urandom(16).hex() if nonce_hex is None else nonce_hex
    message = "mcstore master v2\n%s\n%s\n%d\n%s\n%s\n%s" % (
        role, ident, unix_ms, nonce_hex, run.hex(), endpoint)
    mac = hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
    return "v2 %s %s %d %s %s %s" % (role, ident, unix_ms, nonce_hex, run.hex(), mac)


def session_metadata(client_id, token):
    return [(SESSION_HEADER, "%s %s" % (client_id, token.hex()))]


class Keys:
    """The master-rpc key of a secret file, and the metadata built with it. Each proof asks the
    master (`stub` of the call, else the one given here) for its run id first."""

    def __init__(self, secret_file, stub=None):
        self.key = master_rpc_key(read_secret(secret_file))
        self.stub = stub

    def _run(self, stub):
        stub = stub or self.stub
        if stub is None:
            raise ValueError("a proof needs the master's run id: pass its stub")
        return run_id(stub)

    def register_metadata(self, req, previous_token=None, stub=None):
        md = [(PROOF_HEADER, proof(self.key, "register", req.client_id, req.data_endpoint,
                                   run=self._run(stub)))]
        if previous_token:
            md += session_metadata(req.client_id, previous_token)
        return md

    def admin_metadata(self, stub=None):
        return [(PROOF_HEADER, proof(self.key, "admin", "test-admin", run=self._run(stub)))]


def observer_session(stub, keys, client_id=None):
    """Registers a client with no segments (it holds nothing and is never a placement target) and
    returns its session metadata, for tests that look at the master's tables directly. A fresh id
    each time: the master lets nobody else take over a live client id."""
    from mcstore.v1 import master_pb2 as mpb
    client_id = client_id or "test-observer-" + os.urandom(4).hex()
    req = mpb.RegisterClientRequest(client_id=client_id, host="test")
    resp = stub.RegisterClient(req, metadata=keys.register_metadata(req, stub=stub), timeout=10)
    return session_metadata(client_id, resp.session_token)
