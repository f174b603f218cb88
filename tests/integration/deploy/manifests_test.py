"""What the Kubernetes schemas cannot say about deploy/k8s (deploy/check-deploy.sh checks those).

Every pod meets the "restricted" Pod Security rules (non-root, no privilege escalation, all
capabilities dropped, RuntimeDefault seccomp, read-only root) except for the one hostPath volume
of the client DaemonSet, which is why the namespace enforces "privileged" and warns against
"restricted"; the daemons' probes target the admin port their flags bind; the secret reaches the
daemons as a 0600 copy; the clients list every master the StatefulSet runs.
"""

import re
import unittest

from integration.deploy import deploy_files

FILES = ["namespace.yaml", "secrets.yaml", "config.yaml", "etcd.yaml", "master.yaml",
         "client.yaml"]


def workloads():
    for name in FILES:
        for doc in deploy_files.k8s_documents(name):
            if doc["kind"] in ("StatefulSet", "DaemonSet", "Deployment"):
                yield name, doc


class ManifestsTest(unittest.TestCase):
    def test_pods_are_restricted_but_for_the_client_socket_volume(self):
        problems, host_paths = [], []
        for name, doc in workloads():
            pod = doc["spec"]["template"]["spec"]
            psc = pod.get("securityContext", {})
            where = "%s %s" % (name, doc["metadata"]["name"])
            if psc.get("runAsNonRoot") is not True or psc.get("seccompProfile", {}).get(
                    "type") != "RuntimeDefault":
                problems.append(where + ": pod not runAsNonRoot with RuntimeDefault seccomp")
            for c in pod.get("initContainers", []) + pod["containers"]:
                sc = c.get("securityContext", {})
                if (sc.get("allowPrivilegeEscalation") is not False or
                        sc.get("capabilities", {}).get("drop") != ["ALL"] or
                        sc.get("capabilities", {}).get("add") or
                        sc.get("readOnlyRootFilesystem") is not True or sc.get("privileged")):
                    problems.append("%s container %s: not restricted" % (where, c["name"]))
            for v in pod.get("volumes", []):
                if "hostPath" in v:
                    host_paths.append((doc["metadata"]["name"], v["hostPath"]["path"]))
            if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
                problems.append(where + ": host namespaces")
        self.assertEqual(problems, [])
        self.assertEqual(host_paths, [("mc-client", "/run/mcstore")])
        (ns,) = deploy_files.k8s_documents("namespace.yaml")
        labels = ns["metadata"]["labels"]
        self.assertEqual(labels["pod-security.kubernetes.io/warn"], "restricted")
        self.assertEqual(labels["pod-security.kubernetes.io/audit"], "restricted")

    def test_probes_target_the_admin_port_the_flags_bind(self):
        (config,) = [d for d in deploy_files.k8s_documents("config.yaml")
                     if d["kind"] == "ConfigMap"]
        for name, doc in workloads():
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if not c["name"].startswith("mc-"):
                    continue
                http = re.search(r"^--http=0\.0\.0\.0:(\d+)$",
                                 config["data"][c["name"] + ".flags"], re.M)
                self.assertIsNotNone(http, c["name"])
                ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                self.assertEqual(ports["admin"], int(http.group(1)))
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    self.assertEqual(c[probe]["httpGet"], {"path": "/healthz", "port": "admin"},
                                     "%s %s" % (c["name"], probe))
                annotations = doc["spec"]["template"]["metadata"]["annotations"]
                self.assertEqual(annotations["prometheus.io/port"], http.group(1))

    def test_secret_is_copied_0600_for_the_daemons(self):
        for name, doc in workloads():
            pod = doc["spec"]["template"]["spec"]
            if not doc["metadata"]["name"].startswith("mc-"):
                continue
            (init,) = pod["initContainers"]
            self.assertEqual(init["command"][:3], ["install", "-m", "0600"])
            (daemon,) = pod["containers"]
            self.assertIn("--cluster_secret_file=/secrets/cluster.secret", daemon["args"])
            volumes = {v["name"]: v for v in pod["volumes"]}
            self.assertEqual(volumes["secrets"]["emptyDir"]["medium"], "Memory")
            self.assertEqual(volumes["cluster-secret"]["secret"]["secretName"],
                             "mcstore-cluster-secret")

    def test_clients_list_every_master(self):
        (master,) = [d for _, d in workloads() if d["metadata"]["name"] == "mc-master"]
        want = ",".join("mc-master-%d.mc-master:50051" % i
                        for i in range(master["spec"]["replicas"]))
        (config,) = [d for d in deploy_files.k8s_documents("config.yaml")
                     if d["kind"] == "ConfigMap"]
        self.assertIn("--master=%s\n" % want, config["data"]["mc-client.flags"])

    def test_placeholder_secrets_are_refused_by_the_daemons(self):
        # The daemons refuse secrets and tokens shorter than 32 characters (docs/security.md).
        for doc in deploy_files.k8s_documents("secrets.yaml"):
            for value in doc["stringData"].values():
                self.assertLess(len(value), 32)


if __name__ == "__main__":
    unittest.main()
