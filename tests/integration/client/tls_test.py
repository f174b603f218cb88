"""TLS on the gRPC listeners against the real daemons (docs/security.md, "TLS on the gRPC
listeners").

A CA made by the test (deploy/make-tls-certs.sh: openssl) signs one certificate for
127.0.0.1/localhost. mc-master serves TLS and requires client certificates; both mc-clients call
it over TLS with that certificate as their client certificate, and serve their TCP Store listener
over TLS; client 1 also requires client certificates there. Checked:

- put/get through the Python client over TLS, across the two daemons (master calls over mTLS);
- a plaintext caller is refused (Store listener and master);
- a caller trusting another CA is refused;
- a listener requiring client certificates refuses a caller without one;
- mc-admin status (and a Store command) work over TLS, and fail without --tls_ca_file;
- bad TLS flags keep a daemon from starting, each naming its flag."""

import os
import shutil
import subprocess
import tempfile
import unittest

import grpc

from integration import harness
from integration.client import client_cluster as cc
from mcstore import Client, TlsConfig
from mcstore._errors import StoreError
from mcstore.v1 import master_pb2, master_pb2_grpc

MiB = cc.MiB
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
MAKE_CERTS = os.path.join(ROOT, "deploy", "make-tls-certs.sh")


def make_certs(directory):
    subprocess.run([MAKE_CERTS, directory], check=True, capture_output=True, timeout=60)
    return {name: os.path.join(directory, name)
            for name in ("ca.pem", "ca.key", "cert.pem", "cert.key")}


class TlsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mc-tls-")
        cls.pki = make_certs(os.path.join(cls.tmp, "pki"))
        cls.other = make_certs(os.path.join(cls.tmp, "other"))
        p = cls.pki
        pair = ["--tls_cert_file", p["cert.pem"], "--tls_key_file", p["cert.key"]]
        cls.c = cc.Cluster(
            clients=2, segment_size=32 * MiB,
            master_args=pair + ["--tls_client_ca_file", p["ca.pem"]],
            client_args=pair + ["--master_tls_ca_file", p["ca.pem"]],
            per_client_args={1: ["--tls_client_ca_file", p["ca.pem"]]})
        try:
            cls.c.start()
        except Exception:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        cls.c.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.addCleanup(lambda: self._outcome.success or self.c.dump_logs())

    def client(self, i, tls, timeout_s=10.0):
        c = Client(self.c.clients[i].ready["grpc"], timeout_s=timeout_s,
                   token_file=self.c.token_file, tls=tls)
        self.addCleanup(c.close)
        return c

    def mutual(self):
        return TlsConfig(ca_file=self.pki["ca.pem"], cert_file=self.pki["cert.pem"],
                         key_file=self.pki["cert.key"])

    def test_put_and_get_over_tls_across_daemons(self):
        value = os.urandom(MiB)
        writer = self.client(0, self.pki["ca.pem"])  # the CA path alone: server-side TLS
        writer.put([b"tls-k"], [value])[0].raise_for_status()
        self.assertEqual(writer.get([b"tls-k"])[0].data, value)
        # Client 1 requires a client certificate; its get reads client 0's memory through the
        # master (mTLS) and the data plane.
        reader = self.client(1, self.mutual())
        [got] = reader.get([b"tls-k"])
        got.raise_for_status()
        self.assertEqual(got.data, value)

    def test_server_name_override(self):
        tls = TlsConfig(ca_file=self.pki["ca.pem"], server_name="localhost")
        self.assertEqual(self.client(0, tls).exist([b"nothing"]), [False])
        wrong = TlsConfig(ca_file=self.pki["ca.pem"], server_name="not-in-the-san.example")
        with self.assertRaises(StoreError):
            self.client(0, wrong, timeout_s=3).exist([b"nothing"])

    def test_plaintext_caller_is_refused(self):
        with self.assertRaises(StoreError):
            self.client(0, None, timeout_s=3).exist([b"k"])
        ch = grpc.insecure_channel(self.c.master.ready["grpc"])
        self.addCleanup(ch.close)
        with self.assertRaises(grpc.RpcError) as e:
            master_pb2_grpc.MasterStub(ch).Hello(master_pb2.HelloRequest(), timeout=3)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_caller_trusting_another_ca_is_refused(self):
        with self.assertRaises(StoreError):
            self.client(0, self.other["ca.pem"], timeout_s=3).exist([b"k"])

    def test_listener_requiring_client_certificates_refuses_a_caller_without_one(self):
        with self.assertRaises(StoreError):
            self.client(1, self.pki["ca.pem"], timeout_s=3).exist([b"k"])
        # A certificate from another CA is no better.
        foreign = TlsConfig(ca_file=self.pki["ca.pem"], cert_file=self.other["cert.pem"],
                            key_file=self.other["cert.key"])
        with self.assertRaises(StoreError):
            self.client(1, foreign, timeout_s=3).exist([b"k"])
        self.assertEqual(self.client(1, self.mutual()).exist([b"k"]), [False])
        # The master requires them too (the daemons registered with theirs).
        with open(self.pki["ca.pem"], "rb") as f:
            ca = f.read()
        with open(self.pki["cert.pem"], "rb") as f:
            cert = f.read()
        with open(self.pki["cert.key"], "rb") as f:
            key = f.read()
        for creds, refused in ((grpc.ssl_channel_credentials(ca), True),
                               (grpc.ssl_channel_credentials(ca, key, cert), False)):
            ch = grpc.secure_channel(self.c.master.ready["grpc"], creds)
            self.addCleanup(ch.close)
            try:
                master_pb2_grpc.MasterStub(ch).Hello(master_pb2.HelloRequest(), timeout=5)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
            self.assertEqual(code == grpc.StatusCode.UNAVAILABLE, refused, code)

    def test_mc_admin_over_tls(self):
        admin = harness.binary("tools/mc-admin")
        base = [admin, "--master", self.c.master.ready["grpc"], "--timeout_ms", "5000",
                "--cluster_secret_file", harness.cluster_secret_file()]
        tls = ["--tls_ca_file", self.pki["ca.pem"], "--tls_cert_file", self.pki["cert.pem"],
               "--tls_key_file", self.pki["cert.key"]]
        ok = subprocess.run(base + tls + ["status"], capture_output=True, text=True, timeout=60)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        plain = subprocess.run(base + ["status"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(plain.returncode, 0, plain.stdout)
        store = subprocess.run(
            [admin, "--client", self.c.clients[0].ready["grpc"], "--token_file",
             self.c.token_file, "--tls_ca_file", self.pki["ca.pem"], "exist", "admin-k"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual((store.returncode, store.stdout), (1, "admin-k: missing\n"),
                         store.stderr)
        loose = os.path.join(self.tmp, "loose.key")
        shutil.copy(self.pki["cert.key"], loose)
        os.chmod(loose, 0o644)
        bad = subprocess.run(base + tls[:4] + ["--tls_key_file", loose, "status"],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2, bad.stderr)
        self.assertIn("chmod 600", bad.stderr)

    def test_bad_tls_flags_refuse_to_start(self):
        p = self.pki
        loose = os.path.join(self.tmp, "loose2.key")
        shutil.copy(p["cert.key"], loose)
        os.chmod(loose, 0o640)
        master = harness.binary("master/mc-master")
        client = harness.binary("client/mc-client")
        bases = {master: ["--listen", "127.0.0.1:0", "--http", "", "--auth=false"],
                 client: ["--http", "", "--auth=false"]}
        cases = [
            (master, ["--tls_cert_file", p["cert.pem"]], "--tls_cert_file and --tls_key_file"),
            (master, ["--tls_cert_file", p["cert.pem"], "--tls_key_file", loose], "chmod 600"),
            (master, ["--tls_cert_file", p["cert.pem"], "--tls_key_file", self.other["cert.key"]],
             "is not the key of the certificate"),
            (master, ["--tls_cert_file", p["ca.key"], "--tls_key_file", p["cert.key"]],
             "holds no PEM certificate"),
            (master, ["--tls_client_ca_file", p["ca.pem"]], "--tls_client_ca_file needs"),
            (client, ["--master_tls_ca_file", os.path.join(self.tmp, "missing.pem")],
             "--master_tls_ca_file: cannot open"),
            (client, ["--master_tls_server_name", "x"], "--master_tls_server_name needs"),
        ]
        for binary, extra, want in cases:
            r = subprocess.run([binary] + bases[binary] + extra, capture_output=True, text=True,
                               timeout=30)
            self.assertEqual(r.returncode, 2, (extra, r.stderr))
            self.assertIn(want, r.stderr, extra)


if __name__ == "__main__":
    unittest.main()
