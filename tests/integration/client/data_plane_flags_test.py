"""mc-client's data-plane flags with real daemons: small tcp frames, no receive helpers and small
socket buffers still move every byte of a cross-daemon get (each value in many frames, hashed in
order as they land) and of a remote put; out-of-range values stop the daemon at start with exit
code 2 and a message naming the flag."""

import os
import subprocess
import tempfile
import unittest

from integration import harness
from integration.client import client_cluster as cc
from mcstore.v1 import store_pb2 as spb

MiB = cc.MiB
KiB = cc.KiB
SENTINEL = 0x5A


class SmallFramesTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(
            clients=2, pure_clients=1, segment_size=64 * MiB,
            client_args=["--tcp_frame_bytes", str(64 * KiB), "--tcp_receive_threads", "0",
                         "--tcp_socket_buffer_bytes", str(256 * KiB),
                         "--connections_per_peer", "2"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_cross_daemon_get_in_many_frames(self):
        c = self.cluster
        s0, s1 = c.stub(0), c.stub(1)
        # Sizes around the frame size and a few MiB (dozens of frames each), one key twice.
        sizes = [1, 64 * KiB - 1, 64 * KiB, 64 * KiB + 1, 3 * MiB + 5, 5 * MiB]
        vals = [cc.payload(n, 700 + i) for i, n in enumerate(sizes)]
        keys = [b"frames-%d" % i for i in range(len(sizes))]
        self.assertCodes(cc.put_inline(s0, list(zip(keys, vals))), ["OK"] * len(keys))

        order = list(range(len(keys))) + [4]
        total = sum(sizes[i] for i in order)
        dst = c.buffer(total, s1, fill=SENTINEL)
        items, offs, off = [], [], 0
        for i in order:
            items.append(spb.GetItem(key=keys[i], slices=[dst.slice(off, sizes[i])]))
            offs.append(off)
            off += sizes[i]
        before = cc.metric(c.http(1), "mc_transfer_bytes_total", transport="tcp", op="read")
        got = s1.BatchGet(spb.BatchGetRequest(items=items), timeout=cc.RPC_TIMEOUT_S).results
        self.assertCodes(got, ["OK"] * len(order))
        for n, i in enumerate(order):
            self.assertEqual(got[n].bytes_written, sizes[i])
            self.assertTrue(dst.read(offs[n], sizes[i]) == vals[i], "item %d (key %d)" % (n, i))
        moved = cc.metric(c.http(1), "mc_transfer_bytes_total", transport="tcp", op="read") - before
        self.assertGreaterEqual(moved, sum(sizes), "the values came over the tcp data plane")
        self.assertEqual(cc.metric(c.http(1), "mc_client_checksum_mismatches_total"), 0)

    def test_remote_put_in_many_frames(self):
        c = self.cluster
        pure = c.stub(2)  # no segment of its own: the put writes a peer's memory over tcp
        v = cc.payload(2 * MiB + 3, 800)
        self.assertCodes(cc.put_inline(pure, [(b"frames-put", v)], replicas=2), ["OK"])
        for i in (0, 1, 2):
            got = cc.get_inline(c.stub(i), [b"frames-put"])
            self.assertCodes(got, ["OK"])
            self.assertTrue(got[0].data == v, "through client %d" % i)


class BadFlagsTest(unittest.TestCase):
    def start_client(self, flag, value, auth=None):
        """Runs mc-client with one bad flag (no master needed: it must refuse before connecting).
        auth: the authentication flags (default: the test cluster's secret file)."""
        with tempfile.TemporaryDirectory(prefix="mc-flags-") as tmp:
            ready = os.path.join(tmp, "ready.json")
            if auth is None:
                auth = ["--cluster_secret_file", harness.cluster_secret_file()]
            proc = subprocess.run(
                [harness.binary("client/mc-client"), "--master", "127.0.0.1:1",
                 "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", "127.0.0.1:0",
                 "--segment_size", "0", "--ready_file", ready, "--%s=%s" % (flag, value)] + auth,
                capture_output=True, text=True, timeout=30)
            self.assertFalse(os.path.exists(ready), "it must not start serving")
        return proc

    def test_out_of_range_values_exit_2_naming_the_flag(self):
        for flag, value in [("tcp_frame_bytes", "0"), ("tcp_frame_bytes", str((1 << 30) + 1)),
                            ("tcp_receive_threads", "-1"), ("copy_threads", "-2"),
                            ("tcp_socket_buffer_bytes", "-2"), ("tcp_send_buffer_bytes", "-1"),
                            ("tcp_receive_buffer_bytes", "-1"),
                            ("tcp_receive_buffer_floor_bytes", "-1"),
                            ("gpu_put_staging_bytes", "1000"), ("gpu_get_staging_bytes", "1000"),
                            ("gpu_get_staging_bytes", str((1 << 40) + 1)),
                            ("gpu_put_staging_bytes", str((1 << 40) + 1)),
                            ("gpu_max_buffers", "0"), ("gpu_max_buffers_per_caller", "0"),
                            ("cuda_streams", "0"), ("get_speculative_max_keys", "0"),
                            ("get_speculative_max_keys", "4097"),
                            ("get_speculative_max_bytes", "4095"),
                            ("get_speculative_max_bytes", str((1 << 30) + 1))]:
            with self.subTest(flag=flag, value=value):
                proc = self.start_client(flag, value)
                self.assertEqual(proc.returncode, 2, proc.stderr)
                self.assertIn("--" + flag, proc.stderr)

    def test_every_problem_is_named_at_once(self):
        """Options validate as a whole: one start with several bad flags names each of them
        (one line each), not only the first; mc-master likewise."""
        with tempfile.TemporaryDirectory(prefix="mc-flags-") as tmp:
            ready = os.path.join(tmp, "ready.json")
            proc = subprocess.run(
                [harness.binary("client/mc-client"), "--master", "127.0.0.1:1", "--auth=false",
                 "--segment_size", "0", "--ready_file", ready, "--tcp_frame_bytes=0",
                 "--put_write_timeout_ms=0", "--transport=carrier-pigeon",
                 "--offload_parallelism=65", "--log_level=loud", "--unix_socket_mode=abc"],
                capture_output=True, text=True, timeout=30)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertFalse(os.path.exists(ready), "it must not start serving")
            lines = [l for l in proc.stderr.splitlines() if l.startswith("mc-client: ")]
            for flag in ("--tcp_frame_bytes", "--put_write_timeout_ms", "--transport",
                         "--offload_parallelism", "--log_level", "--unix_socket_mode"):
                self.assertEqual(sum(flag in l for l in lines), 1, (flag, proc.stderr))
            master = subprocess.run(
                [harness.binary("master/mc-master"), "--auth=false", "--listen", "127.0.0.1:0",
                 "--http", "", "--leader_ttl_s=1", "--high_watermark=2", "--forget_batch=0"],
                capture_output=True, text=True, timeout=30)
            self.assertEqual(master.returncode, 2, master.stderr)
            for flag in ("--leader_ttl_s", "--high_watermark", "--forget_batch"):
                self.assertIn(flag, master.stderr)

    def test_no_cluster_secret_refuses_to_start(self):
        """Authentication is on by default: without a secret file (and no --auth=false) the
        daemons exit 2 and say how to make one; a secret file others can read is refused too."""
        proc = self.start_client("log_level", "info", auth=[])
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("--cluster_secret_file", proc.stderr)
        self.assertIn("gen-secret", proc.stderr)
        with tempfile.TemporaryDirectory(prefix="mc-flags-") as tmp:
            loose = os.path.join(tmp, "secret")
            with open(loose, "w") as f:
                f.write("x" * 64 + "\n")
            os.chmod(loose, 0o644)
            proc = self.start_client("log_level", "info", auth=["--cluster_secret_file", loose])
            self.assertEqual(proc.returncode, 2, proc.stderr)
            self.assertIn("chmod 600", proc.stderr)
            master = subprocess.run([harness.binary("master/mc-master"), "--listen",
                                     "127.0.0.1:0", "--http", ""],
                                    capture_output=True, text=True, timeout=30)
            self.assertEqual(master.returncode, 2, master.stderr)
            self.assertIn("--cluster_secret_file", master.stderr)


if __name__ == "__main__":
    unittest.main()
