"""The admin endpoint's HTML status page, in a real cluster and in headless Chromium.

mc-master and two mc-clients (one with an id full of HTML), puts and gets (a hit and a miss):
/status.html and / answer text/html on both daemons with the cluster, clients, capacity per
tier, hits, evictions, lost objects, checksum mismatches and refused callers, every value from
data escaped; /status and `mc-admin status` still print the one status line. Chromium renders
both pages: a screenshot of each goes to $MC_BUILD_DIR/test-output/status_page/ (for a person to
look at) and the rendered DOM must show the hostile id as text. Without Chromium the browser
part is skipped, or fails when MC_REQUIRE_DEPLOY_TOOLS=1 (deploy/test.sh).
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

from integration import harness
from integration.client import client_cluster as cc

MiB = 1 << 20
HOSTILE_ID = 'c1<script>alert("x")</script>&amp;'
ESCAPED_ID = "c1&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;amp;"
# The same text as the browser serializes its DOM (quotes need no escape in a text node).
DOM_ID = '<td>c1&lt;script&gt;alert("x")&lt;/script&gt;&amp;amp;</td>'
STATUS_LINE = re.compile(r"^Mem Storage: .* \| Keys: \d+ \| Clients: \d+ \| Eviction: "
                         r"Success/Attempts=\d+/\d+ \| SSD Storage: .* \| Lost: \d+ .* \| "
                         r"Epoch: [0-9a-f]{8}$")


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def get(address, path):
    """(status, content type, body) of GET http://address/path."""
    import urllib.request
    with urllib.request.urlopen("http://%s%s" % (address, path), timeout=10) as resp:
        return resp.status, resp.headers.get("Content-Type"), resp.read().decode()


class StatusPageTest(cc.ClusterTestMixin, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=2, segment_size=16 * MiB,
                                 per_client_args={1: ["--client_id", HOSTILE_ID]}).start()
        try:
            cc.put_inline(cls.cluster.stub(0), [(b"page-k%d" % i, b"v" * 1000) for i in range(3)])
            cc.get_inline(cls.cluster.stub(1), [b"page-k0", b"page-missing"])
        except Exception:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def test_master_page(self):
        for path in ("/status.html", "/"):
            status, ctype, html = get(self.cluster.master_http(), path)
            self.assertEqual(status, 200)
            self.assertEqual(ctype, "text/html; charset=utf-8")
            for want in ("Cluster", "Clients alive", "Capacity per tier", "Memory", "SSD",
                         "Evictions", "Objects lost", "SSD replicas failing their checksum",
                         "Auth failures", "<td>c0</td>", ESCAPED_ID, "default-src 'none'"):
                self.assertIn(want, html)
            self.assertNotIn("<script", html)
            self.assertRegex(html, r"<td>Keys</td><td>3</td>")

    def test_client_page(self):
        status, ctype, html = get(self.cluster.http(1), "/status.html")
        self.assertEqual((status, ctype), (200, "text/html; charset=utf-8"))
        for want in ("This client", "Capacity per tier", "Get hits", "Get misses",
                     "Checksum mismatches", "Refused callers", ESCAPED_ID):
            self.assertIn(want, html)
        self.assertNotIn("<script", html)
        self.assertRegex(html, r"<td>Get hits</td><td>1</td>")
        self.assertRegex(html, r"<td>Get misses \(NOT_FOUND\)</td><td>1</td>")
        self.assertRegex(html, r"<td>Hit ratio</td><td>50.0%</td>")

    def test_status_line_and_mc_admin_status_unchanged(self):
        status, ctype, line = get(self.cluster.master_http(), "/status")
        self.assertEqual((status, ctype), (200, "text/plain"))
        self.assertRegex(line.strip(), STATUS_LINE)
        out = subprocess.run(
            [harness.binary("tools/mc-admin"), "--master", self.cluster.master.ready["grpc"],
             "--cluster_secret_file", harness.cluster_secret_file(), "status"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30, check=True)
        # Its first line; a table of the clients follows.
        self.assertRegex(out.stdout.decode().splitlines()[0], STATUS_LINE)
        status, _, client_line = get(self.cluster.http(0), "/status")
        self.assertRegex(client_line, r"^Client c0 \| Registered: yes \| Segments: 1 ")

    def test_rendered_in_headless_chromium(self):
        browser = chromium()
        if browser is None:
            if os.environ.get("MC_REQUIRE_DEPLOY_TOOLS") == "1":
                self.fail("no chromium (deploy/install-deps.sh installs it)")
            self.skipTest("no chromium (deploy/install-deps.sh installs it)")
        out_dir = os.path.join(harness.build_dir(), "test-output", "status_page")
        os.makedirs(out_dir, exist_ok=True)
        profile = tempfile.mkdtemp(prefix="mc-chromium-")
        self.addCleanup(shutil.rmtree, profile, True)
        base = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-extensions", "--disable-background-networking",
                "--user-data-dir=" + profile, "--hide-scrollbars", "--window-size=1280,900"]
        for name, address in (("master", self.cluster.master_http()),
                              ("client", self.cluster.http(1))):
            url = "http://%s/status.html" % address
            png = os.path.join(out_dir, name + ".png")
            if os.path.exists(png):
                os.unlink(png)
            subprocess.run(base + ["--screenshot=" + png, url], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=90, check=True)
            with open(png, "rb") as f:
                data = f.read()
            self.assertTrue(data.startswith(b"\x89PNG\r\n\x1a\n"), png)
            self.assertGreater(len(data), 10000, "%s looks empty" % png)
            dom = subprocess.run(base + ["--dump-dom", url], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, timeout=90, check=True).stdout.decode()
            # The browser shows the hostile id as text: no element came out of it.
            self.assertIn(DOM_ID, dom)
            self.assertNotIn("<script", dom)
            print("status page screenshot: %s (%d bytes)" % (png, len(data)))


if __name__ == "__main__":
    unittest.main()
