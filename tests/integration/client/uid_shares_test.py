"""Fair shares for local callers against the real daemon: every fd session of one uid shares
that uid's buffer budget, so opening more sessions does not multiply a caller's share, and a
uid at its cap leaves the rest of the daemon's budget to other uids.

Client 0 runs with --unix_socket_mode 0666 (so that uid 65534 may connect), 2 buffers per
caller, 3 per uid and 5 in all. Before per-uid budgets, the first uid's second session got its
second buffer and a third session more, up to the daemon's total."""

import os
import subprocess
import sys
import unittest

from integration import harness
from integration.client import client_cluster as cc
from mcstore._errors import StoreError
from mcstore._fdchannel import FdSession

MiB = cc.MiB
NOBODY = 65534

# Run as uid 65534: registers two buffers of its own (memfds) over the fd socket.
_OTHER_UID = r'''
import os, sys
from mcstore._fdchannel import FdSession
sess = FdSession(sys.argv[1], 10)
for i in range(2):
    fd = os.memfd_create("other-uid-%d" % i)
    os.ftruncate(fd, 4096)
    try:
        sess.register_fd(fd, 4096)
        print("registered")
    except Exception as e:
        print("refused: %s" % e)
'''


class UidSharesTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=1, segment_size=16 * MiB, client_args=[
            "--unix_socket_mode", "0666", "--store_max_buffers_per_caller", "2",
            "--store_max_buffers_per_uid", "3", "--store_max_buffers_total", "5"]).start()
        os.chmod(cls.cluster.tmp, 0o711)  # other uids reach the sockets in the temp dir

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def register(self, sess):
        fd = os.memfd_create("uid-share")
        try:
            os.ftruncate(fd, 4096)
            return sess.register_fd(fd, 4096)
        finally:
            os.close(fd)

    def test_sessions_of_one_uid_share_its_budget_and_other_uids_keep_theirs(self):
        c = self.cluster
        fd_socket = c.clients[0].ready["fd_socket"]
        refused = cc.metric(c.http(0), "mc_store_limit_refusals_total", limit="buffers_uid")
        sessions = [FdSession(fd_socket, 10) for _ in range(3)]
        for s in sessions:
            self.addCleanup(s.close)
        self.register(sessions[0])
        self.register(sessions[0])
        self.register(sessions[1])  # 3 for this uid: its share
        for s in sessions[1:]:  # each under its own per-caller cap, together over the uid's
            with self.assertRaises(StoreError) as e:
                self.register(s)
            self.assertIn("RESOURCE_EXHAUSTED", str(e.exception))
            self.assertIn("--store_max_buffers_per_uid", str(e.exception))
        self.assertEqual(cc.metric(c.http(0), "mc_store_limit_refusals_total",
                                   limit="buffers_uid"), refused + 2)

        if os.geteuid() != 0:
            self.skipTest("needs root to run a second uid (%d)" % NOBODY)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        try:
            out = subprocess.run(["/usr/bin/python3", "-c", _OTHER_UID, fd_socket],
                                 user=NOBODY, group=NOBODY, extra_groups=[], env=env, cwd="/",
                                 capture_output=True, timeout=60)
        except (PermissionError, OSError) as e:
            self.skipTest("cannot run a process as uid %d here: %s" % (NOBODY, e))
        lines = out.stdout.decode().split("\n")
        self.assertEqual(lines[:2], ["registered", "registered"],
                         "another uid keeps the rest of the daemon's budget: %s %s"
                         % (out.stdout, out.stderr))

        # A session that ends gives its share back to its uid.
        # (the daemon's fd loop sees the close and releases the buffers on its own thread: the
        # register is tried again until then, within the deadline).
        sessions[0].close()

        def registers():
            try:
                self.register(sessions[2])
                return True
            except StoreError as e:
                self.assertIn("--store_max_buffers_per_uid", str(e))
                return False
        harness.wait_until(registers, 20, what="the closed session's share back")

    def test_limits_that_would_let_one_uid_take_everything_refuse_to_start(self):
        for args, flag in (
                (["--store_max_buffers_per_uid", "4096"], "--store_max_buffers_total"),
                (["--store_max_inflight_slices_per_uid", "1000"],
                 "--store_max_inflight_slices_per_uid")):
            out = subprocess.run([harness.binary("client/mc-client"), "--master",
                                  "127.0.0.1:1"] + args, capture_output=True, timeout=30)
            self.assertEqual(out.returncode, 2, out)
            self.assertIn(flag, out.stderr.decode())


if __name__ == "__main__":
    unittest.main()
