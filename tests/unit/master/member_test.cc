// Member credentials (docs/security.md "Member credentials"): what `mc-admin issue-member` writes
// and mc-client loads (common/auth.h), the v3 member proof (common/master_credentials.h), and the
// master's side (RpcAuthenticator: a member registers as its own id only, revocations; the owner
// key wrapped under the member's own keys by CapabilityMinter).
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/capability.h"
#include "common/master_credentials.h"
#include "gtest/gtest.h"
#include "master/capability_minter.h"
#include "master/rpc_auth.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using auth::ClusterKeysPtr;
using auth::Purpose;

const std::string kSecretA(64, 'a');
const std::string kSecretB(64, 'b');
constexpr int64_t kNow = 1'700'000'000'000;
constexpr char kEndpoint[] = "10.0.0.1:7000";

ClusterKeysPtr Keys(const std::vector<std::string>& secrets) {
  auto keys = auth::ClusterKeys::FromSecrets(secrets);
  EXPECT_TRUE(keys.ok()) << keys.status();
  return *keys;
}

ClusterKeysPtr Member(const ClusterKeysPtr& cluster, const std::string& id, uint64_t serial) {
  absl::StatusOr<std::string> text = auth::FormatMemberCredential(*cluster, id, serial);
  EXPECT_TRUE(text.ok()) << text.status();
  absl::StatusOr<ClusterKeysPtr> keys = auth::ParseMemberCredential(*text);
  EXPECT_TRUE(keys.ok()) << keys.status();
  return *keys;
}

// ---- The credential file ----

TEST(MemberCredential, RoundTripsWithItsIdentityAndOnlyTheMemberPurposes) {
  ClusterKeysPtr cluster = Keys({kSecretA});
  ClusterKeysPtr member = Member(cluster, "host-7", 3);
  ASSERT_TRUE(member->member().has_value());
  EXPECT_EQ(member->member()->client_id, "host-7");
  EXPECT_EQ(member->member()->serial, 3u);
  // The data-plane key is the cluster's (the handshake is mutual between members), so the
  // fingerprint operators compare is the cluster's too.
  EXPECT_EQ(member->fingerprint(), cluster->fingerprint());
  EXPECT_EQ(member->PurposeKey(0, Purpose::kDataPlane),
            cluster->PurposeKey(0, Purpose::kDataPlane));
  // No issuing key, and master-RPC / capability keys of its own, never the cluster's.
  EXPECT_FALSE(member->Has(0, Purpose::kMember));
  ASSERT_TRUE(member->Has(0, Purpose::kMasterRpc));
  EXPECT_NE(member->PurposeKey(0, Purpose::kMasterRpc),
            cluster->PurposeKey(0, Purpose::kMasterRpc));
  EXPECT_NE(member->PurposeKey(0, Purpose::kCapability),
            cluster->PurposeKey(0, Purpose::kCapability));
  // Another id or serial gives other keys.
  EXPECT_NE(Member(cluster, "host-8", 3)->PurposeKey(0, Purpose::kMasterRpc),
            member->PurposeKey(0, Purpose::kMasterRpc));
  EXPECT_NE(Member(cluster, "host-7", 4)->PurposeKey(0, Purpose::kMasterRpc),
            member->PurposeKey(0, Purpose::kMasterRpc));
}

TEST(MemberCredential, HoldsNoSecretAndCannotIssue) {
  ClusterKeysPtr cluster = Keys({kSecretA});
  absl::StatusOr<std::string> text = auth::FormatMemberCredential(*cluster, "c1", 1);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->find(kSecretA), std::string::npos);
  ClusterKeysPtr member = Member(cluster, "c1", 1);
  EXPECT_FALSE(auth::FormatMemberCredential(*member, "c2", 1).ok());
  // A purpose it lacks signs with a MAC that verifies nowhere.
  const auth::Mac mac = member->Sign(Purpose::kMember, "c2\n1");
  EXPECT_FALSE(cluster->Verify(Purpose::kMember, "c2\n1", mac.data(), mac.size()));
  EXPECT_FALSE(member->Verify(Purpose::kMember, "c2\n1", mac.data(), mac.size()));
}

TEST(MemberCredential, CarriesEveryDataPlaneKeyDuringARotation) {
  ClusterKeysPtr rotating = Keys({kSecretB, kSecretA});
  ClusterKeysPtr member = Member(rotating, "c1", 1);
  EXPECT_EQ(member->secret_count(), 2u);
  const auth::Mac old_mac = Keys({kSecretA})->Sign(Purpose::kDataPlane, "hello");
  EXPECT_TRUE(member->Verify(Purpose::kDataPlane, "hello", old_mac.data(), old_mac.size()));
}

TEST(MemberCredential, MalformedFilesAreRefusedNamingTheLine) {
  const std::string good = *auth::FormatMemberCredential(*Keys({kSecretA}), "c1", 1);
  const std::string key_line = good.substr(good.find("member_key"));
  struct Case {
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"", "empty"},
      {"mcstore v1\n", "line 1"},
      {"mcstore-member v1\nclient_id c1\nserial 1\n", "incomplete"},
      {"mcstore-member v1\nclient_id c1\nclient_id c2\n", "line 3"},
      {"mcstore-member v1\nclient_id has space\n", "line 2"},
      {"mcstore-member v1\nserial -1\n", "line 2"},
      {"mcstore-member v1\nserial 99999999999999999999\n", "line 2"},
      {"mcstore-member v1\nmember_key abc\n", "64 hex"},
      {"mcstore-member v1\nmember_key " + std::string(64, 'G') + "\n", "hex"},
      {"mcstore-member v1\nsecret " + kSecretA + "\n", "unknown field"},
      {"mcstore-member v1\nclient_id c1\nserial 1\n" + key_line + key_line, "repeated"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ClusterKeysPtr> keys = auth::ParseMemberCredential(c.text);
    ASSERT_FALSE(keys.ok()) << c.text;
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(keys.status().message().find(c.says), std::string::npos) << keys.status();
  }
  std::string many = "mcstore-member v1\nclient_id c1\nserial 1\n" + key_line;
  const std::string dp = good.substr(good.find("data_plane_key"));
  for (size_t i = 0; i <= auth::kMaxSecrets; ++i) many += dp;
  EXPECT_FALSE(auth::ParseMemberCredential(many).ok());
}

class TempFile {
 public:
  explicit TempFile(const std::string& name) : path_(::testing::TempDir() + "/" + name) {
    unlink(path_.c_str());
  }
  ~TempFile() { unlink(path_.c_str()); }
  void Write(const std::string& content, mode_t mode = 0600) const {
    const std::string tmp = path_ + ".new";
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, content.data(), content.size()), static_cast<ssize_t>(content.size()));
    ASSERT_EQ(fchmod(fd, mode), 0);
    ASSERT_EQ(close(fd), 0);
    ASSERT_EQ(rename(tmp.c_str(), path_.c_str()), 0);  // a new inode: the reload notices
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(MemberCredential, TheDaemonsFlagsTakeExactlyOneOfSecretAndCredential) {
  TempFile secret("member_test_secret");
  secret.Write(kSecretA + "\n");
  TempFile cred("member_test_cred");
  cred.Write(*auth::FormatMemberCredential(*Keys({kSecretA}), "c1", 1));
  absl::StatusOr<ClusterKeysPtr> member = auth::KeysFromFlags(true, "", cred.path());
  ASSERT_TRUE(member.ok()) << member.status();
  EXPECT_EQ((*member)->member()->client_id, "c1");
  EXPECT_FALSE(auth::KeysFromFlags(true, secret.path(), cred.path()).ok());
  EXPECT_FALSE(auth::KeysFromFlags(false, "", cred.path()).ok());
  // A credential given where the secret is expected says so.
  absl::StatusOr<ClusterKeysPtr> as_secret = auth::ClusterKeys::Load(cred.path());
  ASSERT_FALSE(as_secret.ok());
  EXPECT_NE(as_secret.status().message().find("member credential"), std::string::npos);
  // Readable by others: refused like the secret.
  cred.Write(*auth::FormatMemberCredential(*Keys({kSecretA}), "c1", 1), 0644);
  EXPECT_FALSE(auth::KeysFromFlags(true, "", cred.path()).ok());
}

// ---- The master's side ----

class MemberProofTest : public ::testing::Test {
 protected:
  MemberProofTest() : revoked_("member_test_revoked") {}

  RpcAuthOptions Options(bool with_revocations = false) {
    RpcAuthOptions o;
    o.unix_now_ms = [] { return kNow; };
    if (with_revocations) o.revoked_members_file = revoked_.path();
    return o;
  }
  std::string Proof(const auth::ClusterKeys& keys, const RpcAuthenticator& auth,
                    std::string_view id = "c1", auth::ProofRole role = auth::ProofRole::kRegister) {
    return auth::MakeProof(keys, role, id, kEndpoint, kNow, auth.run_id());
  }
  absl::Status Check(RpcAuthenticator& auth, const std::string& proof, std::string_view id = "c1",
                     auth::ProofRole role = auth::ProofRole::kRegister) {
    reason_ = AuthFailure::kCount;
    caller_ = Caller{};
    return auth.CheckProof(proof, role, id, kEndpoint, &reason_, &caller_);
  }

  MetricsRegistry metrics_;
  TempFile revoked_;
  AuthFailure reason_ = AuthFailure::kCount;
  Caller caller_;
};

TEST_F(MemberProofTest, AMemberRegistersAsItsOwnIdOnceAndNoOtherId) {
  ClusterKeysPtr cluster = Keys({kSecretA});
  RpcAuthenticator auth(cluster, Options(), metrics_);
  ClusterKeysPtr member = Member(cluster, "c1", 5);
  const std::string proof = Proof(*member, auth);
  EXPECT_EQ(proof.rfind("v3 member c1 5 ", 0), 0u) << proof;
  ASSERT_TRUE(Check(auth, proof).ok());
  EXPECT_TRUE(caller_.member);
  EXPECT_EQ(caller_.member_serial, 5u);
  ASSERT_NE(caller_.wrap_keys, nullptr);
  EXPECT_EQ(Check(auth, proof).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(reason_, AuthFailure::kReplay);
  // Whatever id it asks for, its proof names its own: refused for another registering id.
  absl::Status other = Check(auth, Proof(*member, auth, "c2"), "c2");
  EXPECT_EQ(other.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(reason_, AuthFailure::kWrongClient);
  EXPECT_NE(other.message().find("member credential is for client c1"), std::string::npos);
  // A cluster-secret registration is no member one.
  ASSERT_TRUE(Check(auth, Proof(*cluster, auth)).ok());
  EXPECT_FALSE(caller_.member);
  EXPECT_EQ(caller_.wrap_keys, nullptr);
}

TEST_F(MemberProofTest, AnAlteredIdOrSerialOrAForeignIssuerDoesNotVerify) {
  ClusterKeysPtr cluster = Keys({kSecretA});
  RpcAuthenticator auth(cluster, Options(), metrics_);
  const std::string proof = Proof(*Member(cluster, "c1", 5), auth);
  std::string other_serial = proof;
  other_serial.replace(other_serial.find(" 5 "), 3, " 6 ");
  EXPECT_EQ(Check(auth, other_serial).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(reason_, AuthFailure::kBadMac);
  std::string other_id = proof;
  other_id.replace(other_id.find(" c1 "), 4, " c9 ");
  EXPECT_EQ(Check(auth, other_id, "c9").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(reason_, AuthFailure::kBadMac);
  EXPECT_FALSE(Check(auth, Proof(*Member(Keys({kSecretB}), "c1", 5), auth)).ok());
  EXPECT_EQ(reason_, AuthFailure::kBadMac);
  EXPECT_EQ(auth.ReplayCacheSizeForTest(), 0u) << "refused proofs never fill the replay cache";
}

TEST_F(MemberProofTest, ACredentialIssuedBeforeARotationStillRegisters) {
  ClusterKeysPtr member = Member(Keys({kSecretA}), "c1", 1);
  RpcAuthenticator rotating(Keys({kSecretB, kSecretA}), Options(), metrics_);
  EXPECT_TRUE(Check(rotating, Proof(*member, rotating)).ok()) << AuthFailureName(reason_);
  RpcAuthenticator rotated(Keys({kSecretB}), Options(), metrics_);
  EXPECT_FALSE(Check(rotated, Proof(*member, rotated)).ok());
}

TEST_F(MemberProofTest, AMemberProofIsNeverAnAdminProof) {
  ClusterKeysPtr cluster = Keys({kSecretA});
  RpcAuthenticator auth(cluster, Options(), metrics_);
  ClusterKeysPtr member = Member(cluster, "c1", 1);
  // Its register proof offered as admin: wrong role.
  EXPECT_FALSE(Check(auth, Proof(*member, auth), "c1", auth::ProofRole::kAdmin).ok());
  EXPECT_EQ(reason_, AuthFailure::kWrongRole);
  // An admin proof it signs itself: not under the cluster's master-RPC key.
  EXPECT_FALSE(Check(auth, Proof(*member, auth, "admin", auth::ProofRole::kAdmin), "admin",
                     auth::ProofRole::kAdmin)
                   .ok());
  EXPECT_EQ(reason_, AuthFailure::kBadMac);
}

TEST_F(MemberProofTest, RevokedCredentialsAreRefusedAndTheirSessionsHandedForEnding) {
  ClusterKeysPtr cluster = Keys({kSecretA});
  revoked_.Write("# revoked members\n");
  RpcAuthenticator auth(cluster, Options(true), metrics_);
  ASSERT_TRUE(Check(auth, Proof(*Member(cluster, "c1", 1), auth)).ok());
  auth.NoteRegistration("c1", 11, true, 1);
  ASSERT_TRUE(Check(auth, Proof(*Member(cluster, "c2", 1), auth), "c2").ok());
  auth.NoteRegistration("c2", 12, true, 1);
  auth.NoteRegistration("c3", 13, false, 0);  // a cluster-secret registration
  EXPECT_TRUE(auth.TakeRevokedSessions().empty());

  revoked_.Write("c1 1\nc3 *\n");
  std::vector<RpcAuthenticator::RevokedSession> ended = auth.TakeRevokedSessions();
  ASSERT_EQ(ended.size(), 1u) << "c3 holds no member credential";
  EXPECT_EQ(ended[0].client_id, "c1");
  EXPECT_EQ(ended[0].session, 11u);
  EXPECT_TRUE(auth.TakeRevokedSessions().empty()) << "handed once";

  absl::Status s = Check(auth, Proof(*Member(cluster, "c1", 1), auth));
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(reason_, AuthFailure::kRevoked);
  // The operator re-issues a higher serial: it registers; c2 was never touched.
  EXPECT_TRUE(Check(auth, Proof(*Member(cluster, "c1", 2), auth)).ok());
  EXPECT_TRUE(Check(auth, Proof(*Member(cluster, "c2", 1), auth), "c2").ok());
  revoked_.Write("c1 *\n");
  EXPECT_EQ(Check(auth, Proof(*Member(cluster, "c1", 2), auth)).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(MemberProofTest, AnUnreadableRevocationListRefusesEveryMemberButNotTheSecret) {
  ClusterKeysPtr cluster = Keys({kSecretA});
  revoked_.Write("c1 not-a-serial\n");
  RpcAuthenticator auth(cluster, Options(true), metrics_);
  EXPECT_EQ(Check(auth, Proof(*Member(cluster, "c2", 1), auth), "c2").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(reason_, AuthFailure::kRevocationUnreadable);
  EXPECT_TRUE(Check(auth, Proof(*cluster, auth)).ok());
  auth.NoteRegistration("c2", 12, true, 1);
  EXPECT_TRUE(auth.TakeRevokedSessions().empty()) << "nothing is ended on an unreadable list";
  unlink(revoked_.path().c_str());
  EXPECT_EQ(Check(auth, Proof(*Member(cluster, "c2", 1), auth), "c2").code(),
            absl::StatusCode::kUnavailable);
  revoked_.Write("\n");  // repaired: read again
  EXPECT_TRUE(Check(auth, Proof(*Member(cluster, "c2", 1), auth), "c2").ok());
}

TEST(MemberOwnerKey, OnlyTheMemberItWasIssuedToUnwrapsItsOwnerKey) {
  ClusterKeysPtr cluster = Keys({kSecretA});
  MetricsRegistry metrics;
  RpcAuthOptions options;
  options.unix_now_ms = [] { return kNow; };
  RpcAuthenticator auth(cluster, options, metrics);
  ClusterKeysPtr c1 = Member(cluster, "c1", 1);
  AuthFailure reason = AuthFailure::kCount;
  Caller caller;
  ASSERT_TRUE(auth.CheckProof(auth::MakeProof(*c1, auth::ProofRole::kRegister, "c1", kEndpoint,
                                              kNow, auth.run_id()),
                              auth::ProofRole::kRegister, "c1", kEndpoint, &reason, &caller)
                  .ok());
  testing::MasterFixture m;
  CapabilityMinter minter(cluster, m.clock());
  const std::string wrapped = minter.Register("c1", 1, caller.wrap_keys.get());
  absl::StatusOr<std::string> mine = auth::UnwrapOwnerKey(*c1, "c1", wrapped);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(mine->size(), 32u);
  EXPECT_FALSE(auth::UnwrapOwnerKey(*Member(cluster, "c2", 1), "c1", wrapped).ok());
  EXPECT_FALSE(auth::UnwrapOwnerKey(*Member(cluster, "c1", 2), "c1", wrapped).ok());
  EXPECT_FALSE(auth::UnwrapOwnerKey(*cluster, "c1", wrapped).ok())
      << "not even the cluster secret's holders open a member's owner key";
  // A cluster-secret registration is wrapped under the cluster keys as before.
  EXPECT_TRUE(auth::UnwrapOwnerKey(*cluster, "c3", minter.Register("c3", 2)).ok());
}

}  // namespace
}  // namespace mc::master
