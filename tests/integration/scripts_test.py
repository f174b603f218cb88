"""deploy/local-cluster.sh with absolute and relative MC_RUN_DIR / MC_BUILD_DIR, called from a
directory other than the repository root (the issue: an absolute MC_RUN_DIR became
$PWD//abs/path and the Unix socket could not be created)."""

import os
import shutil
import subprocess
import tempfile
import unittest

from integration import harness

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "deploy", "local-cluster.sh")


class LocalClusterPathsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="mc-scripts-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def run_script(self, cwd, env_extra, *args):
        env = dict(os.environ)
        env.update(env_extra)
        env["MC_SEGMENT_SIZE"] = str(4 << 20)
        return subprocess.run([SCRIPT] + list(args), cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=60)

    def start_and_check(self, cwd, env, run_dir):
        self.addCleanup(self.run_script, cwd, env, "stop")
        res = self.run_script(cwd, env, "start", "1")
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        for f in ("master.json", "client1.json", "client1.sock", "master.log"):
            self.assertTrue(os.path.exists(os.path.join(run_dir, f)), f)
        self.assertIn("unix:" + os.path.join(run_dir, "client1.sock"), res.stdout)
        # TLS on the master by default, with a throwaway CA whose keys only the owner reads.
        self.assertIn("TLS (master), CA " + os.path.join(run_dir, "tls", "ca.pem"), res.stdout)
        for key in ("ca.key", "cert.key"):
            self.assertEqual(os.stat(os.path.join(run_dir, "tls", key)).st_mode & 0o777, 0o600)
        # The client holds its own member credential, not the cluster secret.
        cred = os.path.join(run_dir, "client1.member")
        self.assertEqual(os.stat(cred).st_mode & 0o777, 0o600)
        with open(os.path.join(run_dir, "client1.log")) as f:
            self.assertIn("with the member credential of client1 serial 1", f.read())
        res = self.run_script(cwd, env, "stop")
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertFalse(any(f.endswith(".pid") for f in os.listdir(run_dir)))

    def test_absolute_run_dir(self):
        run_dir = os.path.join(self.tmp, "abs", "cluster")
        self.start_and_check(self.tmp, {"MC_RUN_DIR": run_dir,
                                        "MC_BUILD_DIR": harness.build_dir()}, run_dir)

    def test_relative_run_and_build_dirs_from_another_directory(self):
        cwd = os.path.join(self.tmp, "here")
        os.makedirs(cwd)
        build = os.path.relpath(harness.build_dir(), cwd)
        self.start_and_check(cwd, {"MC_RUN_DIR": "rel/cluster", "MC_BUILD_DIR": build},
                             os.path.join(cwd, "rel", "cluster"))


if __name__ == "__main__":
    unittest.main()
