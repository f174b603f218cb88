"""The Store service's access control against the real daemons, one test per attack:

- an unprivileged caller cannot register (map through the daemon) memory it cannot itself open
  read-write: a root-only 0600 shm object, by name or by a read-only fd;
- a TCP Store call without the token, or with a wrong one, is refused UNAUTHENTICATED and counted;
- another caller's buffer id cannot be used or unregistered (counted);
- the Unix socket and the fd socket carry the configured mode and group (default 0660);
- a session that ends releases its buffers;
- per-caller limits answer RESOURCE_EXHAUSTED naming their flag (counted);
- bad flags refuse to start.

Client 0 runs with --unix_socket_mode 0666 (so that uid 65534 may connect) and small limits."""

import os
import secrets
import stat
import subprocess
import sys
import tempfile
import unittest

import grpc

from integration import harness
from integration.client import client_cluster as cc
from mcstore._errors import StoreError
from mcstore._fdchannel import OP_REGISTER, FdSession, request
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB
NOBODY = 65534

# Run as uid/gid 65534 by test_unprivileged_caller_cannot_register_memory_it_cannot_open: what
# the kernel and the daemon let it do with root's objects. Prints one line per attempt.
_UNPRIVILEGED = r'''
import os, socket, sys, grpc
from mcstore.v1 import store_pb2 as spb, store_pb2_grpc
from mcstore._fdchannel import OP_REGISTER, request
unix_sock, fd_sock, secret_name, readable_name = sys.argv[1:5]
try:
    os.open("/dev/shm/" + secret_name, os.O_RDWR)
    print("open-secret: opened")
except PermissionError:
    print("open-secret: EACCES")
stub = store_pb2_grpc.StoreStub(grpc.insecure_channel("unix:" + unix_sock))
try:
    stub.RegisterBuffer(spb.RegisterBufferRequest(shm_name="/" + secret_name, size=4096),
                        timeout=10)
    print("by-name: registered")
except grpc.RpcError as e:
    print("by-name: " + e.code().name)
fd = os.open("/dev/shm/" + readable_name, os.O_RDONLY)
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(10)
s.connect(fd_sock)
socket.send_fds(s, [request(OP_REGISTER, 4096)], [fd])
print("read-only-fd: " + s.recv(512).decode())
'''


class StoreSecurityTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=1, segment_size=16 * MiB, client_args=[
            "--unix_socket_mode", "0666", "--store_max_buffers_per_caller", "2",
            "--store_max_leases_per_caller", "1"]).start()
        # Let other uids reach the sockets in the cluster's (0700) temp dir.
        os.chmod(cls.cluster.tmp, 0o711)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def setUp(self):
        self.c = self.cluster
        self.http = self.c.http(0)

    def counter(self, name, **labels):
        return cc.metric(self.http, name, **labels)

    def root_shm(self, mode, fill):
        """A root-owned shm object of 4096 bytes with `mode`, removed after the test."""
        name = "mc-it-root-%s" % secrets.token_hex(6)
        path = "/dev/shm/" + name
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode)
        os.fchmod(fd, mode)
        os.write(fd, bytes([fill]) * 4096)
        os.close(fd)
        self.addCleanup(os.unlink, path)
        return name

    # -- attack: map root's memory through the daemon ------------------------------------------
    def test_unprivileged_caller_cannot_register_memory_it_cannot_open(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to create another uid's object and to switch to uid %d"
                          % NOBODY)
        secret = self.root_shm(0o600, 0x5E)
        readable = self.root_shm(0o644, 0x11)
        buffers_before = self.counter("mc_client_buffers")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        ready = self.c.clients[0].ready
        try:
            out = subprocess.run(
                ["/usr/bin/python3", "-c", _UNPRIVILEGED, ready["unix_socket"],
                 ready["fd_socket"], secret, readable],
                user=NOBODY, group=NOBODY, extra_groups=[], env=env, cwd="/",
                capture_output=True, timeout=60)
        except (PermissionError, OSError) as e:
            self.skipTest("cannot run a process as uid %d here: %s" % (NOBODY, e))
        text = out.stdout.decode()
        self.assertEqual(out.returncode, 0, text + out.stderr.decode())
        self.assertIn("open-secret: EACCES", text, "the kernel refuses uid 65534 the object")
        self.assertIn("by-name: PERMISSION_DENIED", text,
                      "registering by name (the daemon's rights) is off")
        self.assertIn("read-only-fd: ERR INVALID_ARGUMENT", text)
        self.assertIn("O_RDWR", text)
        self.assertEqual(self.counter("mc_client_buffers"), buffers_before)

    # -- attack: TCP without the token ---------------------------------------------------------
    def test_tcp_call_without_or_with_wrong_token_is_refused_and_counted(self):
        missing = self.counter("mc_store_auth_failures_total", reason="missing_token")
        wrong = self.counter("mc_store_auth_failures_total", reason="wrong_token")
        for token, reason in ((False, "missing"), ("x" * 48, "wrong"),
                              (self.c.token[:-1], "wrong")):
            stub = self.c.stub(0, token=token, session=False)
            with self.assertRaises(grpc.RpcError) as e:
                cc.exist(stub, [b"k"])
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED, reason)
            with self.assertRaises(grpc.RpcError) as e:
                cc.put_inline(stub, [(b"tcp-no-token", b"v")])
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED, reason)
        self.assertEqual(self.counter("mc_store_auth_failures_total", reason="missing_token"),
                         missing + 2)
        self.assertEqual(self.counter("mc_store_auth_failures_total", reason="wrong_token"),
                         wrong + 4)
        self.assertEqual(cc.exist(self.c.stub(0, session=False), [b"tcp-no-token"]), [False])
        ch = grpc.insecure_channel(self.c.clients[0].ready["grpc"])
        self.addCleanup(ch.close)
        md = [("x-mc-store-token", self.c.token)]
        from mcstore.v1 import store_pb2_grpc
        resp = store_pb2_grpc.StoreStub(ch).BatchExist(spb.BatchExistRequest(keys=[b"k"]),
                                                       metadata=md, timeout=10)
        self.assertEqual(list(resp.exists), [False])

    def test_tools_read_the_token_only_from_a_private_file(self):
        """mc-admin (and mc-bench, same helper) read --token_file / $MCSTORE_TOKEN_FILE through
        the daemons' rule: a token file others can read is refused, naming the fix."""
        admin = harness.binary("tools/mc-admin")
        base = [admin, "--client", self.c.clients[0].ready["grpc"], "--timeout_ms", "10000"]
        ok = subprocess.run(base + ["--token_file", self.c.token_file, "exist", "tool-k"],
                            capture_output=True, text=True, timeout=60)
        # exit 1: the key is missing (the call itself went through with the token)
        self.assertEqual((ok.returncode, ok.stdout), (1, "tool-k: missing\n"), ok.stderr)
        # The keys' rule (common/keys.h) holds in the tool too, with the daemons' message.
        long_key = subprocess.run(base + ["--token_file", self.c.token_file, "exist", "k" * 4097],
                                  capture_output=True, text=True, timeout=60)
        self.assertEqual(long_key.returncode, 2, long_key.stderr)
        self.assertIn("key of 4097 bytes exceeds the limit of 4096", long_key.stderr)
        loose = os.path.join(self.c.tmp, "loose.token")
        with open(loose, "w") as f:
            f.write(self.c.token + "\n")
        os.chmod(loose, 0o644)
        env = dict(os.environ, MCSTORE_TOKEN_FILE=loose)
        for args, env_ in ((["--token_file", loose], None), ([], env)):
            bad = subprocess.run(base + args + ["exist", "tool-k"], capture_output=True,
                                 text=True, timeout=60, env=env_)
            self.assertEqual(bad.returncode, 2, bad.stderr)
            self.assertIn("chmod", bad.stderr)

    def test_unix_socket_needs_no_token(self):
        self.assertEqual(cc.exist(self.c.unix_stub(0, session=False), [b"unix-k"]), [False])

    # -- attack: another caller's buffer -------------------------------------------------------
    def test_another_callers_buffer_cannot_be_used_or_unregistered(self):
        mine = self.c.unix_stub(0)
        buf = self.c.buffer(8192, mine, fill=0x42)
        mismatches = self.counter("mc_store_buffer_owner_mismatches_total")
        other = FdSession(self.c.clients[0].ready["fd_socket"], 10)
        self.addCleanup(other.close)
        ch = grpc.insecure_channel("unix:" + self.c.clients[0].ready["unix_socket"])
        self.addCleanup(ch.close)
        from mcstore.v1 import store_pb2_grpc
        raw = store_pb2_grpc.StoreStub(ch)
        for md in ([("x-mc-owner", other.owner)], []):
            put = raw.BatchPut(spb.BatchPutRequest(items=[spb.PutItem(
                key=b"steal-%s" % secrets.token_hex(4).encode(),
                slices=[buf.slice(0, 4096)])]), metadata=md, timeout=10)
            self.assertCodes(put.results, ["INVALID_ARGUMENT"])
            self.assertIn("unknown buffer id", put.results[0].message)
            got = raw.BatchGet(spb.BatchGetRequest(items=[spb.GetItem(
                key=b"x", slices=[buf.slice(0, 16)])]), metadata=md, timeout=10)
            self.assertCodes(got.results, ["INVALID_ARGUMENT"])
            with self.assertRaises(grpc.RpcError) as e:
                raw.UnregisterBuffer(spb.UnregisterBufferRequest(buffer_id=buf.buffer_id),
                                     metadata=md, timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(self.counter("mc_store_buffer_owner_mismatches_total"), mismatches + 6)
        # A made-up session token is no session at all: every call is refused whole (session
        # lost), before any buffer id is looked at.
        forged = [("x-mc-owner", "0" * 32)]
        for call in (lambda: raw.BatchPut(spb.BatchPutRequest(items=[spb.PutItem(
                         key=b"steal-x", slices=[buf.slice(0, 4096)])]), metadata=forged,
                         timeout=10),
                     lambda: raw.UnregisterBuffer(spb.UnregisterBufferRequest(
                         buffer_id=buf.buffer_id), metadata=forged, timeout=10)):
            with self.assertRaises(grpc.RpcError) as e:
                call()
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn(("x-mc-error", "session-lost"), e.exception.trailing_metadata())
        self.assertEqual(self.counter("mc_store_buffer_owner_mismatches_total"), mismatches + 6)
        key = b"mine-%s" % secrets.token_hex(4).encode()
        self.assertCodes(mine.BatchPut(spb.BatchPutRequest(items=[spb.PutItem(
            key=key, slices=[buf.slice(0, 4096)])]), timeout=10).results, ["OK"])
        self.assertEqual(cc.get_inline(mine, [key])[0].data, b"\x42" * 4096)

    def test_closed_session_releases_its_buffers(self):
        before = self.counter("mc_client_buffers")
        sess = FdSession(self.c.clients[0].ready["fd_socket"], 10)
        shm = cc.ShmBuffer(4096)
        self.addCleanup(shm.close)
        handle = sess.register_path("/dev/shm/" + shm.shm.name, 4096)
        self.c.unix_stub(0, session=False).RegisterBuffer(
            spb.RegisterBufferRequest(handle=handle), timeout=10)
        self.assertEqual(self.counter("mc_client_buffers"), before + 1)
        sess.close()  # as when the process dies
        harness.wait_until(lambda: self.counter("mc_client_buffers") == before, 10,
                           what="the ended session's buffer released")

    # -- limits --------------------------------------------------------------------------------
    def test_limits_answer_resource_exhausted(self):
        refused = self.counter("mc_store_limit_refusals_total", limit="buffers")
        sess = FdSession(self.c.clients[0].ready["fd_socket"], 10)
        self.addCleanup(sess.close)
        shm = cc.ShmBuffer(4096)
        self.addCleanup(shm.close)
        path = "/dev/shm/" + shm.shm.name
        sess.register_path(path, 4096)
        sess.register_path(path, 4096)
        with self.assertRaises(StoreError) as e:
            sess.register_path(path, 4096)
        self.assertIn("RESOURCE_EXHAUSTED", str(e.exception))
        self.assertIn("--store_max_buffers_per_caller", str(e.exception))
        self.assertEqual(self.counter("mc_store_limit_refusals_total", limit="buffers"),
                         refused + 1)
        # Prefix leases: one per caller here.
        stub = self.c.unix_stub(0)
        key = b"lease-limit-%s" % secrets.token_hex(4).encode()
        self.assertCodes(cc.put_inline(stub, [(key, b"v")]), ["OK"])
        self.c.session(0)  # the stub's caller is the cluster's session from now on
        first = stub.MatchPrefix(spb.MatchPrefixRequest(keys=[key], lease_ttl_ms=30000),
                                 timeout=10)
        self.assertNotEqual(first.lease_id, 0)
        with self.assertRaises(grpc.RpcError) as e:
            stub.MatchPrefix(spb.MatchPrefixRequest(keys=[key], lease_ttl_ms=30000), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("--store_max_leases_per_caller", e.exception.details())
        # Another caller still gets one, and cannot release this caller's.
        other = self.c.unix_stub(0, session=False)
        with self.assertRaises(grpc.RpcError) as e:
            other.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=first.lease_id), timeout=10)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        leased = other.MatchPrefix(spb.MatchPrefixRequest(keys=[key], lease_ttl_ms=30000),
                                   timeout=10)
        other.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=leased.lease_id), timeout=10)
        stub.ReleaseLease(spb.ReleaseLeaseRequest(lease_id=first.lease_id), timeout=10)
        self.assertGreaterEqual(self.counter("mc_store_limit_refusals_total", limit="leases"), 1)

    # -- socket files and flags ----------------------------------------------------------------
    def test_socket_files_carry_the_configured_mode(self):
        ready = self.c.clients[0].ready
        for path in (ready["unix_socket"], ready["fd_socket"]):
            st = os.stat(path)
            self.assertTrue(stat.S_ISSOCK(st.st_mode), path)
            self.assertEqual(stat.S_IMODE(st.st_mode), 0o666, path)

    def daemon_args(self, tmp, *extra):
        return ["--master", self.c.master.ready["grpc"], "--http", "", "--data", "127.0.0.1:0",
                "--segment_size", "0", "--log_level", "warn",
                "--unix_socket", os.path.join(tmp, "d.sock")] + list(extra)

    def test_default_socket_mode_is_0660_and_group_applies(self):
        tmp = tempfile.mkdtemp(prefix="mc-sec-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", tmp]))
        args = self.daemon_args(tmp)
        if os.geteuid() == 0:
            args += ["--unix_socket_group", str(NOBODY)]
        with harness.Daemon("mc-client-modes", harness.binary("client/mc-client"), args,
                            tmp) as d:
            for path in (d.ready["unix_socket"], d.ready["fd_socket"]):
                st = os.stat(path)
                self.assertEqual(stat.S_IMODE(st.st_mode), 0o660, path)
                if os.geteuid() == 0:
                    self.assertEqual(st.st_gid, NOBODY, path)
            self.assertEqual(d.ready["grpc"], "", "no TCP listener by default")

    def test_bad_flags_refuse_to_start(self):
        tmp = tempfile.mkdtemp(prefix="mc-sec-")
        self.addCleanup(lambda: subprocess.run(["rm", "-rf", tmp]))
        loose = os.path.join(tmp, "loose.token")
        with open(loose, "w") as f:
            f.write("t" * 40)
        os.chmod(loose, 0o644)
        short = os.path.join(tmp, "short.token")
        with open(short, "w") as f:
            f.write("t" * 8)
        os.chmod(short, 0o600)
        cases = [
            (["--listen", "127.0.0.1:0"], "--store_token_file"),
            (["--listen", "127.0.0.1:0", "--store_token_file", loose], "chmod 600"),
            (["--listen", "127.0.0.1:0", "--store_token_file", short], "at least 32"),
            (["--unix_socket_mode", "0999"], "bad --unix_socket_mode"),
            (["--unix_socket_mode", "0066"], "bad --unix_socket_mode"),
            (["--unix_socket_group", "no-such-group-mc"], "no such group"),
        ]
        binary = harness.binary("client/mc-client")
        # The cluster credential, where the harness has one: only the Store flags are wrong here.
        auth_args = getattr(harness, "auth_args", lambda path, args: [])
        for extra, want in cases:
            args = self.daemon_args(tmp, *extra)
            r = subprocess.run([binary] + args + auth_args(binary, args), capture_output=True,
                               timeout=30)
            self.assertNotEqual(r.returncode, 0, extra)
            self.assertIn(want, r.stderr.decode(), extra)


if __name__ == "__main__":
    unittest.main()
