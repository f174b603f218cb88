"""Disk-full faults through the real daemons, the SSD tier on a small tmpfs the test mounts:
- a tier configured larger than its filesystem refuses to start, naming the file and ENOSPC (it
  preallocates its data files, so a full disk is found at start, not mid-burst);
- a filesystem filled by another writer after start does not reach the preallocated tier: a
  write-back burst of 4x memory is answered within its deadlines, every value read back is exact,
  and a key that cannot be read any more is accounted for in the master's loss counter.
Truncated and corrupt data files: tests/integration/offload/corruption_test.py.
"""

import os
import shutil
import subprocess
import tempfile
import time
import unittest

from integration import harness
from integration.offload import ssd_cluster as sc

MiB = sc.MiB


def mount_tmpfs(path, size):
    """Mounts a tmpfs of `size` bytes at `path`; None when that is not possible (not root, no
    mount namespace rights), with the reason."""
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d,mode=0700" % size, "tmpfs",
                            path], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if r.returncode == 0 else (r.stderr.strip() or "mount failed")


class FilesystemFullTest(unittest.TestCase):
    def make_cluster(self, fs_bytes, tier_bytes):
        """A cluster whose client 0 has 8 MiB of memory and a tier of `tier_bytes` on a tmpfs of
        `fs_bytes`; not started."""
        self.mnt_parent = tempfile.mkdtemp(prefix="mc-diskfull-")
        self.addCleanup(shutil.rmtree, self.mnt_parent, True)
        self.mnt = os.path.join(self.mnt_parent, "ssd-0")
        os.makedirs(self.mnt)
        why = mount_tmpfs(self.mnt, fs_bytes)
        if why is not None:
            self.skipTest("cannot mount a small tmpfs for the SSD tier: %s" % why)
        self.addCleanup(subprocess.run, ["umount", "-l", self.mnt], capture_output=True,
                        timeout=10)
        self.c = sc.SsdCluster(clients=1, segment_size=8 * MiB, ssd_clients=0, pure_clients=1)
        self.c.per_client_args[0] = sc.ssd_args(
            self.mnt_parent, 0, tier_bytes, extra=["--offload_files", "1",
                                                   "--put_write_back_wait_ms", "3000"])
        self.addCleanup(self.c.stop)
        return self.c

    def test_a_tier_larger_than_its_filesystem_refuses_to_start(self):
        """The tier preallocates its data files (fallocate) at start: a filesystem too small for
        --offload_capacity is found then, with the reason, not in the middle of a burst."""
        c = self.make_cluster(6 * MiB, 64 * MiB)
        with self.assertRaises(harness.DaemonError) as cm:
            c.start()
        text = str(cm.exception)
        self.assertRegex(text, r"cannot start")
        self.assertRegex(text, r"(?i)no space left")
        self.assertIn("data-000", text, "the error names the file")

    def test_a_full_filesystem_does_not_reach_a_preallocated_tier(self):
        """Another writer fills the tier's filesystem after start: offloads keep landing in the
        preallocated files; a burst of 4x memory is answered in time and read back exactly or
        counted as lost."""
        c = self.make_cluster(40 * MiB, 24 * MiB)
        c.start()
        try:
            # Fill what the tier left free.
            with open(os.path.join(self.mnt, "filler"), "wb") as f:
                chunk = b"\xff" * MiB
                try:
                    while True:
                        f.write(chunk)
                        f.flush()
                except OSError:
                    pass
            st = os.statvfs(self.mnt)
            self.assertLess(st.f_bavail * st.f_frsize, MiB, "the filesystem is full")
            stub = c.stub(0)
            n = 32
            keys = [b"df-%03d" % i for i in range(n)]
            values = [sc.value(i, salt=41) for i in range(n)]
            acked = []
            for k, v in zip(keys, values):
                t0 = time.monotonic()
                r = sc.cc.put_inline(stub, [(k, v)])[0]
                took = time.monotonic() - t0
                # put_write_back_wait_ms 3 s plus the master round trips: well under 15 s.
                self.assertLess(took, 15.0, "put %r took %.1f s" % (k, took))
                self.assertIn(r.code, (sc.OK, sc.cc.spb.NO_SPACE),
                              "put %r: %s %s" % (k, sc.cc.code_name(r.code), r.message))
                if r.code == sc.OK:
                    acked.append((k, v))
            self.assertGreater(len(acked), n // 2)
            self.assertGreater(c.offloads(0, "ok"), 0)
            for s in (stub, c.stub(1)):
                sc.assert_never_wrong(self, s, [k for k, _ in acked], [v for _, v in acked],
                                      allowed=(sc.NOT_FOUND,))
            res = sc.get_all(c.stub(1), [k for k, _ in acked])
            missing = sum(1 for r in res if r.code == sc.NOT_FOUND)
            lost = sc.cc.metric(c.master_http(), "mc_objects_lost_total")
            self.assertLessEqual(missing, lost,
                                 "%d acknowledged keys are gone but the master counts only %d "
                                 "lost objects" % (missing, lost))
            self.assertTrue(c.healthy(0))
            print("full filesystem: %d/%d puts acknowledged, %d gone and counted (lost=%d), "
                  "%d offloads ok, %d failed" % (len(acked), n, missing, lost,
                                                  c.offloads(0, "ok"), c.offloads(0, "failed")))
        except Exception:
            c.dump_logs()
            raise


if __name__ == "__main__":
    unittest.main()
