"""The example flag files (deploy/config/*.flags) and the flags the deployment files pass.

Each daemon reads the flag file of its example (absl --flagfile), the file names every flag the
daemon has (active or commented out with its default) and nothing else; the daemons start from
it with only addresses and sizes overridden after it on the command line, and a value from the
file takes effect. The same for the Kubernetes ConfigMap's flag files. Every flag the systemd
units and the Kubernetes containers pass exists.
"""

import os
import shutil
import sys
import tempfile
import unittest

from integration import harness
from integration.deploy import deploy_files

MiB = 1 << 20


def prom(address):
    status, body = harness.http_get(address, "/metrics")
    if status != 200:
        raise AssertionError("GET %s/metrics: %d" % (address, status))
    return harness.parse_prometheus(body)


class FlagFileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.master_bin = harness.binary("master/mc-master")
        cls.client_bin = harness.binary("client/mc-client")
        cls.master_flags = deploy_files.daemon_flags(cls.master_bin)
        cls.client_flags = deploy_files.daemon_flags(cls.client_bin)

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="mc-deploy-flags-")
        self.daemons = []
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.addCleanup(self.stop_all)

    def stop_all(self):
        for d in reversed(self.daemons):
            d.stop(grace_s=3)

    def run(self, result=None):
        result = super().run(result)
        if result is not None and (result.failures or result.errors):
            for d in getattr(self, "daemons", []):
                print("---- %s ----\n%s" % (d.name, d.log_tail(3000)), file=sys.stderr)
        return result

    def start(self, name, binary, flagfile_text, overrides):
        path = os.path.join(self.tmp, name + ".flags")
        with open(path, "w") as f:
            f.write(flagfile_text)
        d = harness.Daemon(name, binary, ["--flagfile=" + path] + overrides, self.tmp)
        self.daemons.append(d)
        return d.start()

    def start_pair(self, master_text, client_text, client_overrides=()):
        master = self.start("mc-master", self.master_bin, master_text,
                            ["--listen=127.0.0.1:0", "--http=127.0.0.1:0",
                             "--heartbeat_interval_ms=200"])
        client = self.start(
            "mc-client", self.client_bin, client_text,
            ["--master=" + master.ready["grpc"], "--data=127.0.0.1:0", "--http=127.0.0.1:0",
             "--advertise_host=", "--listen=", "--store_token_file=",
             "--unix_socket=" + os.path.join(self.tmp, "c.sock"), "--unix_socket_group=",
             "--client_id=deploy-c0"] + list(client_overrides))
        harness.wait_until(lambda: prom(master.ready["http"]).get("mc_clients_alive") == 1, 20,
                           what="the client registered")
        return master, client

    # -- the example files ---------------------------------------------------------------
    def test_example_files_name_every_flag_and_no_other(self):
        for name, flags in (("mc-master.flags", self.master_flags),
                            ("mc-client.flags", self.client_flags)):
            named = deploy_files.flagfile_flags(deploy_files.read("config", name))
            self.assertEqual(sorted(flags - named), [], "%s misses these flags" % name)
            self.assertEqual(sorted(named - flags), [], "%s names unknown flags" % name)

    def test_daemons_start_from_the_example_files(self):
        ssd = os.path.join(self.tmp, "ssd")
        os.mkdir(ssd)
        master, client = self.start_pair(
            deploy_files.read("config", "mc-master.flags"),
            deploy_files.read("config", "mc-client.flags"),
            ["--segment_size=%d" % (4 * MiB), "--offload_dir=" + ssd,
             "--offload_capacity=%d" % (64 * MiB), "--offload_direct_io=false"])
        # --segments=4 comes from the file: 4 segments of the overridden size.
        self.assertEqual(prom(master.ready["http"])["mc_memory_capacity_bytes"], 16 * MiB)
        # --offload_files=4 from the file: four data files.
        self.assertEqual(len(os.listdir(ssd)), 4, os.listdir(ssd))
        self.assertEqual(harness.http_get(client.ready["http"], "/healthz")[0], 200)

    # -- Kubernetes --------------------------------------------------------------------------
    def test_k8s_configmap_flag_files_start_the_daemons(self):
        (config,) = [d for d in deploy_files.k8s_documents("config.yaml")
                     if d["kind"] == "ConfigMap"]
        data = config["data"]
        for name, flags in (("mc-master.flags", self.master_flags),
                            ("mc-client.flags", self.client_flags)):
            named = deploy_files.flagfile_flags(data[name])
            self.assertEqual(sorted(named - flags), [], "ConfigMap %s: unknown flags" % name)
        master, _ = self.start_pair(data["mc-master.flags"], data["mc-client.flags"],
                                    ["--segment_size=%d" % (4 * MiB)])
        # --segments=2 from the ConfigMap.
        self.assertEqual(prom(master.ready["http"])["mc_memory_capacity_bytes"], 8 * MiB)

    def test_k8s_containers_pass_known_flags(self):
        seen = 0
        for file, kind, binary_flags in (("master.yaml", "StatefulSet", self.master_flags),
                                         ("client.yaml", "DaemonSet", self.client_flags)):
            for name, argv in deploy_files.k8s_containers(file, kind):
                unknown = deploy_files.argv_flags(argv) - binary_flags - {"flagfile"}
                self.assertEqual(sorted(unknown), [], "%s %s: unknown flags" % (file, name))
                self.assertIn("--flagfile=/etc/mcstore/%s.flags" % name, argv)
                seen += 1
        self.assertEqual(seen, 2)

    # -- systemd -------------------------------------------------------------------------
    def test_systemd_units_pass_known_flags(self):
        for unit, binary_flags in (("mc-master.service", self.master_flags),
                                   ("mc-client@.service", self.client_flags)):
            argv = deploy_files.exec_start(deploy_files.read("systemd", unit))
            unknown = deploy_files.argv_flags(argv[1:]) - binary_flags - {"flagfile"}
            self.assertEqual(sorted(unknown), [], "%s: unknown flags" % unit)
            self.assertTrue(any(a.startswith("--flagfile=/etc/mcstore/") for a in argv), unit)
            self.assertIn("--cluster_secret_file=%d/cluster.secret", argv, unit)


if __name__ == "__main__":
    unittest.main()
