"""Member credentials (docs/security.md "Member credentials"), with real daemons on loopback.

The master holds the cluster secret; each mc-client holds only the member credential that
`mc-admin issue-member` wrote for its client id. Shown here:

- members put and get across daemons (registration, owner keys wrapped per member, capabilities,
  the data-plane handshake) exactly as with the secret, also with the data plane encrypted;
- a credential registers its own client id only: a daemon started with another --client_id
  refuses to start, naming the flag;
- revoking one member's serial (--revoked_members_file, re-read on change) ends that member's
  session and keeps it out, while the other member goes on; a re-issued serial gets back in;
- mc-admin issue-member refuses to overwrite a file, needs the secret (not a credential), and
  writes mode 0600; a credential given as --cluster_secret_file is named for what it is.
"""

import os
import stat
import subprocess
import unittest

from integration import harness
from integration.client import client_cluster as cc

MiB = cc.MiB


def admin(*args):
    return subprocess.run([harness.binary("tools/mc-admin")] + list(args), capture_output=True,
                          text=True, timeout=60)


def issue(tmp, client_id, serial):
    path = os.path.join(tmp, "%s-%d.member" % (client_id, serial))
    r = admin("--cluster_secret_file", harness.cluster_secret_file(), "issue-member",
              "--client_id", client_id, "--serial", str(serial), "--out", path)
    if r.returncode != 0:
        raise RuntimeError("mc-admin issue-member: %s" % r.stderr)
    return path


class MemberCredentialsTest(cc.ClusterTestMixin, unittest.TestCase):
    ENCRYPT = "off"

    @classmethod
    def setUpClass(cls):
        cls.cluster = cc.Cluster(clients=2, segment_size=16 * MiB,
                                 client_args=["--data_encryption", cls.ENCRYPT])
        tmp = cls.cluster.tmp
        cls.revoked = os.path.join(tmp, "revoked-members")
        with open(cls.revoked, "w") as f:
            f.write("# CLIENT_ID SERIAL | CLIENT_ID *\n")
        cls.cluster.master_args += ["--revoked_members_file", cls.revoked]
        cls.cluster.per_client_args = {
            i: ["--member_credential_file", issue(tmp, "c%d" % i, 1)] for i in range(2)}
        try:
            cls.cluster.start()
        except Exception:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def auth_failures(self, reason):
        return cc.metric(self.cluster.master_http(), "mc_master_auth_failures_total",
                         reason=reason)

    def alive(self):
        return cc.metric(self.cluster.master_http(), "mc_clients_alive")

    def test_a_members_put_and_get_across_daemons(self):
        kvs = [(b"member-%s-%d" % (self.ENCRYPT.encode(), i), cc.payload(64 * 1024 + i, i))
               for i in range(16)]
        self.assertCodes(cc.put_inline(self.cluster.stub(0), kvs), ["OK"] * len(kvs))
        # Every get from daemon 1 reads daemon 0's memory: its capabilities were minted under
        # c0's owner key, which only c0's credential unwrapped.
        self.assert_exact(self.cluster.stub(1), kvs, "cross-daemon gets between members")
        denied = [v for k, v in cc.metrics(self.cluster.http(0)).items()
                  if isinstance(k, tuple) and k[0] == "mc_data_capability_denied_total"]
        self.assertEqual(sum(denied), 0)
        if self.ENCRYPT == "on":
            encrypted = sum(cc.metric(self.cluster.http(i), "mc_dataplane_encrypted_connections_total")
                            for i in range(2))
            self.assertGreater(encrypted, 0)

    def test_b_a_credential_registers_its_own_id_only(self):
        cred = self.cluster.per_client_args[0][1]
        r = subprocess.run(
            [harness.binary("client/mc-client"), "--master", self.cluster.master_address(),
             "--listen", "", "--http", "", "--data", "127.0.0.1:0", "--segment_size", "0",
             "--client_id", "not-c0", "--member_credential_file", cred],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--client_id not-c0 is not the client id of the member credential", r.stderr)
        both = subprocess.run(
            [harness.binary("client/mc-client"), "--master", self.cluster.master_address(),
             "--member_credential_file", cred, "--cluster_secret_file",
             harness.cluster_secret_file()], capture_output=True, text=True, timeout=60)
        self.assertEqual(both.returncode, 2, both.stderr)
        self.assertIn("give exactly one", both.stderr)

    def test_c_revoking_one_member_ends_it_alone(self):
        c = self.cluster
        harness.wait_until(lambda: self.alive() == 2, 20, what="both members alive")
        before = self.auth_failures("revoked")
        with open(self.revoked + ".new", "w") as f:
            f.write("c1 1\n")
        os.replace(self.revoked + ".new", self.revoked)
        # The maintenance pass ends c1's session; its re-registrations are refused as revoked.
        harness.wait_until(lambda: self.alive() == 1, 20, what="c1's session ended")
        harness.wait_until(lambda: self.auth_failures("revoked") > before, 20,
                           what="c1's re-registration refused as revoked")
        self.assertIn("revoked", c.clients[1].log_tail())
        kvs = [(b"after-revoke-%d" % i, cc.payload(4096, i)) for i in range(4)]
        self.assertCodes(cc.put_inline(c.stub(0), kvs), ["OK"] * len(kvs))
        self.assert_exact(c.stub(0), kvs, "the other member goes on")
        # A re-issued serial gets c1 back in (the daemon restarted with its new credential).
        c.clients[1].stop()
        c.per_client_args[1] = ["--member_credential_file", issue(c.tmp, "c1", 2)]
        c.clients[1] = c._start_client(1)
        c.wait_clients_alive(2)
        self.assert_exact(c.stub(1), kvs, "the re-issued member reads again")

    def test_d_mc_admin_issue_member(self):
        tmp = self.cluster.tmp
        path = issue(tmp, "host-x", 7)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        with open(path) as f:
            text = f.read()
        self.assertTrue(text.startswith("mcstore-member v1\n"), text)
        with open(harness.cluster_secret_file()) as f:
            self.assertNotIn(f.read().strip(), text, "the secret never leaves")
        again = admin("--cluster_secret_file", harness.cluster_secret_file(), "issue-member",
                      "--client_id", "host-x", "--out", path)
        self.assertEqual(again.returncode, 1, again.stderr)
        self.assertIn("never overwritten", again.stderr)
        from_member = admin("--cluster_secret_file", path, "issue-member", "--client_id", "y",
                            "--out", os.path.join(tmp, "y.member"))
        self.assertEqual(from_member.returncode, 2, from_member.stderr)
        self.assertIn("is a member credential, not the cluster secret", from_member.stderr)
        bad_id = admin("--cluster_secret_file", harness.cluster_secret_file(), "issue-member",
                       "--client_id", "has space", "--out", os.path.join(tmp, "z.member"))
        self.assertEqual(bad_id.returncode, 2, bad_id.stderr)


class EncryptedMemberCredentialsTest(MemberCredentialsTest):
    """The same with --data_encryption=on: record keys come from the handshake under the
    cluster's data-plane key, which a member credential carries."""
    ENCRYPT = "on"


if __name__ == "__main__":
    unittest.main()
