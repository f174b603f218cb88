"""Standby masters under an etcd that only trusted masters may use (master/etcd_http.h;
docs/operations.md "HA deployment"): whoever can write the election key decides which master
serves, so production etcd is reached over https, and either with a client certificate (etcd
--client-cert-auth) or as an etcd user whose role may touch only mcstore's prefix. Not both at
once: etcd 3.4's JSON gateway refuses client certificates while authentication is on.

Real daemons on loopback; a CA, etcd's server certificate and a client certificate are made here
with openssl. For each of the two set-ups, two masters with the right credentials and two
without: one of the right ones leads, the other stands by, the wrong ones never lead (and say
why in their log); SIGKILL the leader and the other right one takes over; puts and gets work
before and after. mc-master refuses a password file that others may read, a user without a
password, and TLS files with http:// endpoints.
Every wait is bounded; every process is stopped even on failure."""

import base64
import os
import shutil
import subprocess
import tempfile
import time
import unittest

from integration import harness
from integration.client import client_cluster as cc
from integration.ha.failover_test import LEADER_TTL_S, HaCluster
from mcstore.v1 import store_pb2 as spb

KiB = cc.KiB
MiB = cc.MiB
USER, PASSWORD = "mcstore", "s3cret-for-the-test"


def openssl(*args, cwd):
    r = subprocess.run(["openssl"] + list(args), cwd=cwd, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError("openssl %s: %s" % (" ".join(args), r.stderr))


class Certs:
    """A throw-away CA, etcd's server certificate (127.0.0.1; also usable as a client, which
    etcd's own gateway needs under --client-cert-auth) and a client certificate; plus a second
    CA that signed nothing of etcd's."""

    def __init__(self, d):
        self.dir = d
        p = lambda n: os.path.join(d, n)  # noqa: E731
        self.ca, self.cert, self.key = p("ca.crt"), p("server.crt"), p("server.key")
        self.client_cert, self.client_key = p("client.crt"), p("client.key")
        self.other_ca = p("other-ca.crt")
        for ca in ("ca", "other-ca"):
            openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca + ".key",
                    "-out", ca + ".crt", "-days", "2", "-subj", "/CN=mcstore test " + ca,
                    cwd=d)
        with open(p("server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
        with open(p("client.ext"), "w") as f:
            f.write("extendedKeyUsage=clientAuth\n")
        for name, cn in (("server", "etcd-test-server"), ("client", "mc-master-client")):
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", name + ".key", "-out",
                    name + ".csr", "-subj", "/CN=" + cn, cwd=d)
            openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                    "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile",
                    name + ".ext", cwd=d)


def b64(s):
    return base64.b64encode(s.encode()).decode()


class PasswordEtcdCluster(HaCluster):
    """etcd over https (server certificate only) with authentication on and a user whose role
    reads and writes only /mcstore/."""

    def prepare_etcd(self):
        e = self.etcd
        steps = [
            ("/v3/auth/user/add", {"name": "root", "password": "root-" + PASSWORD}),
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            ("/v3/auth/user/add", {"name": USER, "password": PASSWORD}),
            ("/v3/auth/role/add", {"name": "mcstore"}),
            ("/v3/auth/role/grant", {"name": "mcstore", "perm": {
                "permType": "READWRITE", "key": b64("/mcstore/"), "range_end": b64("/mcstore0")}}),
            ("/v3/auth/user/grant", {"user": USER, "role": "mcstore"}),
            ("/v3/auth/enable", {}),
        ]
        for path, body in steps:
            # user/add hashes the password with bcrypt: seconds on a loaded machine (a 2 s read
            # timeout failed it once during the gate's sanitizer stage).
            status, text = e.request(path, body, timeout_s=15.0)
            if status != 200:
                raise RuntimeError("etcd %s: HTTP %d %s" % (path, status, text))
        status, text = e.request("/v3/kv/range", {"key": b64("/mcstore/leader")})
        if status == 200:
            raise RuntimeError("etcd answered a range without a token: auth is not on (%s)" % text)


def private_file(path, text):
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(text + "\n")
    return path


class SecureEtcdTestBase(cc.ClusterTestMixin, unittest.TestCase):
    """Masters 0 and 1 have the right credentials, 2 and 3 do not (per_master_args)."""

    def make_cluster(self, certs):
        raise NotImplementedError

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mc-etcd-tls-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.certs = Certs(self.dir)
        self.cluster = self.make_cluster(self.certs)
        self.addCleanup(self.cluster.stop)
        self.cluster.start()

    def put_and_check(self, tag):
        kvs = [(b"tls-%s-%d" % (tag, i), cc.payload(16 * KiB + i, 500 + i)) for i in range(8)]
        res = cc.put_inline(self.cluster.stub(1), kvs)
        self.assertEqual([cc.code_name(r.code) for r in res], ["OK"] * len(kvs),
                         [r.message for r in res])
        got = cc.get_inline(self.cluster.stub(0), [k for k, _ in kvs])
        self.assertEqual([r.data for r in got], [v for _, v in kvs])
        return kvs

    def try_put(self):
        try:
            res = cc.put_inline(self.cluster.stub(1), [(b"tls-probe", b"x" * 100)])
            return res[0].code == spb.OK
        except Exception:
            return False

    @staticmethod
    def etcd_errors(daemon):
        return [l for l in daemon.log_tail(20000).splitlines()
                if "etcd" in l.lower() and (" W " in l or " E " in l)]

    def check_only_the_right_masters_lead(self, setup):
        cl = self.cluster
        try:
            m = cl.masters
            self.assertIn(cl.master, m[:2], "a master without valid credentials leads")
            before = self.put_and_check(b"before")
            for bad in m[2:]:  # each has tried and failed; none leads
                harness.wait_until(lambda: self.etcd_errors(bad), 10,
                                   what="%s logs why etcd refused it" % bad.name)
            self.assertEqual(cl.leaders(), [cl.master])
            old = cl.master
            t0 = time.monotonic()
            old.kill()
            new = cl.wait_leader(exclude=(old,), timeout_s=LEADER_TTL_S + 20)
            took = time.monotonic() - t0
            self.assertIs(new, m[1] if old is m[0] else m[0])
            cl.master = new
            harness.wait_until(self.try_put, 30, interval_s=0.2, what="puts through the new leader")
            self.put_and_check(b"after")

            def readable():
                got = cc.get_inline(cl.stub(0), [k for k, _ in before])
                return all(r.code == spb.OK and r.data == v for (_, v), r in zip(before, got))
            harness.wait_until(readable, 30, interval_s=0.2, what="pre-kill keys readable")
            self.assertEqual(cl.leaders(), [new])
            print("%s: the standby took over %.2f s after the leader's SIGKILL; the masters "
                  "without credentials never led: %s" % (setup, took, " | ".join(
                      "%s: %s" % (b.name, self.etcd_errors(b)[-1][-150:]) for b in m[2:])))
        except Exception:
            cl.dump_logs()
            raise


class ClientCertificateEtcdTest(SecureEtcdTestBase):
    def make_cluster(self, c):
        good = ["--etcd_ca_file", c.ca, "--etcd_cert_file", c.client_cert,
                "--etcd_key_file", c.client_key]
        return HaCluster(
            masters=4, etcd_tls=c, etcd_client_cert_auth=True, clients=1, pure_clients=1,
            segment_size=32 * MiB, client_args=["--master_rpc_timeout_ms", "2000"],
            per_master_args={
                0: good, 1: good,
                2: ["--etcd_ca_file", c.ca],  # no client certificate
                3: ["--etcd_ca_file", c.other_ca, "--etcd_cert_file", c.client_cert,
                    "--etcd_key_file", c.client_key]})  # does not trust etcd's certificate

    def test_only_masters_with_a_certificate_lead(self):
        self.check_only_the_right_masters_lead("etcd with --client-cert-auth")


class PasswordEtcdTest(SecureEtcdTestBase):
    def make_cluster(self, c):
        pw = private_file(os.path.join(self.dir, "etcd.password"), PASSWORD)
        wrong = private_file(os.path.join(self.dir, "wrong.password"), "not-the-password")
        tls = ["--etcd_ca_file", c.ca]
        return PasswordEtcdCluster(
            masters=4, etcd_tls=c, clients=1, pure_clients=1, segment_size=32 * MiB,
            client_args=["--master_rpc_timeout_ms", "2000"],
            per_master_args={
                0: tls + ["--etcd_user", USER, "--etcd_password_file", pw],
                1: tls + ["--etcd_user", USER, "--etcd_password_file", pw],
                2: tls + ["--etcd_user", USER, "--etcd_password_file", wrong],
                3: tls})  # no user: etcd refuses every request

    def test_only_masters_with_the_password_lead(self):
        self.check_only_the_right_masters_lead("etcd with authentication")


class FlagsTest(unittest.TestCase):
    def run_master(self, *args):
        return subprocess.run([harness.binary("master/mc-master"), "--listen", "127.0.0.1:0",
                               "--http", "127.0.0.1:0", "--auth=false"] + list(args),
                              capture_output=True, text=True, timeout=30)

    def test_a_password_file_others_may_read_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "pw")
            with open(f, "w") as out:
                out.write("pw")
            os.chmod(f, 0o644)
            r = self.run_master("--etcd_endpoints", "http://127.0.0.1:1", "--etcd_user", "u",
                                "--etcd_password_file", f)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("etcd_password_file", r.stderr)

    def test_tls_files_with_an_http_endpoint_are_refused(self):
        r = self.run_master("--etcd_endpoints", "http://127.0.0.1:1", "--etcd_ca_file",
                            "/etc/ssl/certs/ca-certificates.crt")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("https://", r.stderr)

    def test_a_user_without_a_password_is_refused(self):
        r = self.run_master("--etcd_endpoints", "http://127.0.0.1:1", "--etcd_user", "u")
        self.assertEqual(r.returncode, 2, r.stderr)


if __name__ == "__main__":
    unittest.main()
