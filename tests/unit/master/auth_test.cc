// Authentication, the master's side: registration and admin proofs (RpcAuthenticator), client ids
// bound to their session (the takeover rule), random session numbers, tokens and lease ids, leases
// owned by their caller, and per-call ownership of pending puts and DISK reports (MetadataService).
#include <atomic>
#include <set>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/master_credentials.h"
#include "gtest/gtest.h"
#include "master/rpc_auth.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

auth::ClusterKeysPtr Keys(const std::vector<std::string>& secrets) {
  auto keys = auth::ClusterKeys::FromSecrets(secrets);
  EXPECT_TRUE(keys.ok()) << keys.status();
  return *keys;
}

const std::string kSecretA(64, 'a');
const std::string kSecretB(64, 'b');
constexpr int64_t kNow = 1'700'000'000'000;

RpcAuthOptions FixedClockOptions() {
  RpcAuthOptions o;
  o.unix_now_ms = [] { return kNow; };
  return o;
}

class ProofTest : public ::testing::Test {
 protected:
  RpcAuthOptions Options() {
    RpcAuthOptions o;
    o.max_clock_skew_ms = 60'000;
    o.replay_cache_entries = 4;
    o.unix_now_ms = [this] { return now_.load(); };
    return o;
  }
  ProofTest() : auth_(Keys({kSecretA}), Options(), metrics_) {}

  absl::Status Check(const std::string& proof, std::string_view id = "c1",
                     std::string_view endpoint = "10.0.0.1:7000",
                     auth::ProofRole role = auth::ProofRole::kRegister) {
    last_reason_ = AuthFailure::kCount;
    return auth_.CheckProof(proof, role, id, endpoint, &last_reason_);
  }
  // A proof for auth_'s run unless `run` names another.
  std::string Proof(const auth::ClusterKeys& keys, int64_t at = kNow, std::string_view id = "c1",
                    std::string_view endpoint = "10.0.0.1:7000", const std::string* run = nullptr) {
    return auth::MakeProof(keys, auth::ProofRole::kRegister, id, endpoint, at,
                           run != nullptr ? *run : auth_.run_id());
  }

  MetricsRegistry metrics_;
  std::atomic<int64_t> now_{kNow};
  RpcAuthenticator auth_;
  AuthFailure last_reason_ = AuthFailure::kCount;
};

TEST_F(ProofTest, AFreshProofIsAcceptedOnceAndItsReplayRefused) {
  const std::string proof = Proof(*Keys({kSecretA}));
  EXPECT_TRUE(Check(proof).ok());
  absl::Status again = Check(proof);
  EXPECT_EQ(again.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(last_reason_, AuthFailure::kReplay);
}

TEST_F(ProofTest, AProofUnderAnotherSecretIsRefused) {
  EXPECT_EQ(Check(Proof(*Keys({kSecretB}))).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(last_reason_, AuthFailure::kBadMac);
  EXPECT_EQ(auth_.ReplayCacheSizeForTest(), 0u) << "junk never fills the replay cache";
}

TEST_F(ProofTest, DuringARotationBothSecretsVerify) {
  RpcAuthenticator rotating(Keys({kSecretB, kSecretA}), FixedClockOptions(), metrics_);
  AuthFailure reason;
  const std::string& run = rotating.run_id();
  EXPECT_TRUE(rotating
                  .CheckProof(Proof(*Keys({kSecretA}), kNow, "c1", "10.0.0.1:7000", &run),
                              auth::ProofRole::kRegister, "c1", "10.0.0.1:7000", &reason)
                  .ok());
  EXPECT_TRUE(rotating
                  .CheckProof(Proof(*Keys({kSecretB}), kNow, "c1", "10.0.0.1:7000", &run),
                              auth::ProofRole::kRegister, "c1", "10.0.0.1:7000", &reason)
                  .ok());
}

TEST_F(ProofTest, AProofOutsideTheClockWindowIsRefusedEitherWay) {
  auto keys = Keys({kSecretA});
  EXPECT_TRUE(Check(Proof(*keys, kNow - 59'000)).ok());
  EXPECT_TRUE(Check(Proof(*keys, kNow + 59'000)).ok());
  EXPECT_FALSE(Check(Proof(*keys, kNow - 61'000)).ok());
  EXPECT_EQ(last_reason_, AuthFailure::kStale);
  EXPECT_FALSE(Check(Proof(*keys, kNow + 61'000)).ok());
  EXPECT_EQ(last_reason_, AuthFailure::kStale);
}

TEST_F(ProofTest, TheProofBindsItsClientIdEndpointAndRole) {
  auto keys = Keys({kSecretA});
  EXPECT_FALSE(Check(Proof(*keys), "c2").ok());
  EXPECT_EQ(last_reason_, AuthFailure::kWrongClient);
  EXPECT_FALSE(Check(Proof(*keys), "c1", "10.6.6.6:7000").ok());
  EXPECT_EQ(last_reason_, AuthFailure::kBadMac);
  EXPECT_FALSE(Check(Proof(*keys), "c1", "10.0.0.1:7000", auth::ProofRole::kAdmin).ok());
  EXPECT_EQ(last_reason_, AuthFailure::kWrongRole);
}

// The replay cache lives in memory, so a proof captured on the wire
// was good again once the master restarted (or against a standby that took over). A proof names
// the run it is for; another run's (here: another authenticator, as after a restart) is refused.
TEST_F(ProofTest, AProofOfAnotherMasterRunIsRefused) {
  auto keys = Keys({kSecretA});
  RpcAuthenticator before_restart(Keys({kSecretA}), Options(), metrics_);
  ASSERT_NE(before_restart.run_id(), auth_.run_id()) << "each run draws its own id";
  EXPECT_EQ(before_restart.run_id().size(), auth::kRunIdSize);
  const std::string captured = Proof(*keys, kNow, "c1", "10.0.0.1:7000", &before_restart.run_id());
  AuthFailure reason;
  EXPECT_TRUE(before_restart
                  .CheckProof(captured, auth::ProofRole::kRegister, "c1", "10.0.0.1:7000", &reason)
                  .ok());
  EXPECT_EQ(Check(captured).code(), absl::StatusCode::kUnauthenticated) << "replayed after it";
  EXPECT_EQ(last_reason_, AuthFailure::kOtherRun);
  EXPECT_EQ(auth_.ReplayCacheSizeForTest(), 0u);
}

TEST_F(ProofTest, MalformedProofsAreRefusedAsMalformed) {
  const std::string good = Proof(*Keys({kSecretA}));
  const std::string mac(64, '0');
  const std::string nonce(32, '1');
  const std::string run = " " + auth::Hex(auth_.run_id()) + " ";
  // A version 1 proof (no run id) as the old daemons made it, with a valid MAC.
  const std::string v1_nonce = auth::Hex(auth::RandomBytes(16));
  const auth::Mac v1_mac = Keys({kSecretA})
                               ->Sign(auth::Purpose::kMasterRpc,
                                      "mcstore master v1\nregister\nc1\n" + std::to_string(kNow) +
                                          "\n" + v1_nonce + "\n10.0.0.1:7000");
  const std::string v1 =
      "v1 register c1 " + std::to_string(kNow) + " " + v1_nonce + " " +
      auth::Hex(std::string_view(reinterpret_cast<const char*>(v1_mac.data()), v1_mac.size()));
  for (const std::string& bad : std::vector<std::string>{
           "",
           "v2",
           v1,
           good + " extra",
           "v3" + good.substr(2),
           "v2 root c1 1 " + nonce + run + mac,
           "v2 register c1 -5 " + nonce + run + mac,
           "v2 register c1 12a " + nonce + run + mac,
           "v2 register c1 1 " + nonce.substr(1) + run + mac,
           "v2 register c1 1 " + std::string(32, 'z') + run + mac,
           "v2 register c1 1 " + std::string(32, 'A') + run + mac,
           "v2 register c1 1 " + nonce + " " + std::string(32, 'A') + " " + mac,
           "v2 register c1 1 " + nonce + " " + std::string(30, 'a') + " " + mac,
           "v2 register c1 1 " + nonce + " " + mac,
           "v2 register c1 1 " + nonce + run + mac.substr(2),
           "v2 register c1 1 " + nonce + run + mac + "00",
           "v2  register c1 1 " + nonce + run + mac,
           "v2 register " + std::string(200, 'c') + " 1 " + nonce + run + mac,
           std::string(100'000, 'v'),
           std::string("v2 register c\x01 1 ") + nonce + run + mac}) {
    EXPECT_EQ(Check(bad).code(), absl::StatusCode::kUnauthenticated) << bad.substr(0, 80);
    EXPECT_EQ(last_reason_, AuthFailure::kMalformed) << bad.substr(0, 80);
  }
}

TEST_F(ProofTest, TheReplayCacheIsBoundedAndForgetsAfterTwiceTheWindow) {
  auto keys = Keys({kSecretA});
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(Check(Proof(*keys)).ok());
  EXPECT_FALSE(Check(Proof(*keys)).ok()) << "full: fail closed";
  EXPECT_EQ(last_reason_, AuthFailure::kReplayCacheFull);
  now_ += 120'001;
  EXPECT_TRUE(Check(Proof(*keys, now_.load())).ok());
  EXPECT_EQ(auth_.ReplayCacheSizeForTest(), 1u);
}

TEST(SessionCredential, RoundTripsAndRefusesJunk) {
  const std::string token = auth::RandomBytes(auth::kSessionTokenSize);
  auto parsed = auth::ParseSessionCredential(auth::MakeSessionCredential("c1", token));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->client_id, "c1");
  EXPECT_EQ(parsed->token, token);
  for (const std::string& bad :
       {std::string(""), std::string("c1"), std::string("c1 zz"), "c1 " + std::string(30, 'a'),
        "c1 " + std::string(34, 'a'), "c1  " + std::string(32, 'a'),
        "c1 " + std::string(32, 'a') + " x", std::string(1000, 'a')}) {
    EXPECT_FALSE(auth::ParseSessionCredential(bad).ok()) << bad;
  }
}

// ---- MetadataService

ClientInfo Info(const std::string& id) {
  ClientInfo info;
  info.client_id = id;
  info.host = "h";
  info.endpoint = "10.0.0.1:1";
  return info;
}

TEST(ClientSessions, SessionsAndTokensAreRandomAndTokensMapToTheirSession) {
  MasterFixture m;
  auto a = m.svc().RegisterClient(Info("a"), {1 << 20});
  auto b = m.svc().RegisterClient(Info("b"), {1 << 20});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->session, 0u);
  EXPECT_GT(a->session > b->session ? a->session - b->session : b->session - a->session, 1u << 20);
  EXPECT_EQ(a->token.size(), auth::kSessionTokenSize);
  EXPECT_NE(a->token, b->token);
  EXPECT_EQ(m.svc().SessionOf("a", a->token), a->session);
  EXPECT_EQ(m.svc().SessionOf("a", b->token), std::nullopt) << "b's token is not a's";
  EXPECT_EQ(m.svc().SessionOf("b", std::string(16, '\0')), std::nullopt);
  EXPECT_EQ(m.svc().SessionOf("nobody", a->token), std::nullopt);
}

TEST(ClientSessions, ABoundRegistrationCannotTakeOverALiveIdUntilItIsSilent) {
  MasterFixture m;
  auto first = m.svc().RegisterClient(Info("c1"), {1 << 20});
  ASSERT_TRUE(first.ok());
  m.Put("c1", "mine", 100);
  m.clock().AdvanceMs(m.svc().options().client_takeover_after_ms - 1);
  auto stolen = m.svc().RegisterClient(Info("c1"), {1 << 20}, RegistrationAuth{true, ""});
  EXPECT_EQ(CodeOf(stolen.status()), Code::kUnavailable);
  auto wrong =
      m.svc().RegisterClient(Info("c1"), {1 << 20}, RegistrationAuth{true, std::string(16, 'x')});
  EXPECT_EQ(CodeOf(wrong.status()), Code::kUnavailable);
  EXPECT_TRUE(m.Exists("mine")) << "a refused registration changes nothing";
  EXPECT_EQ(m.svc().SessionOf("c1", first->token), first->session);
  EXPECT_EQ(m.CounterValue("mc_master_registrations_refused_total"), 2u);
  // The same daemon (it presents its token) re-registers at once.
  auto again = m.svc().RegisterClient(Info("c1"), {1 << 20}, RegistrationAuth{true, first->token});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->session, first->session);
  // A restarted daemon (no token) once the session missed its heartbeats long enough.
  m.clock().AdvanceMs(m.svc().options().client_takeover_after_ms);
  auto restarted = m.svc().RegisterClient(Info("c1"), {1 << 20}, RegistrationAuth{true, ""});
  EXPECT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(m.svc().SessionOf("c1", again->token), std::nullopt);
}

TEST(ClientSessions, AnUnboundRegistrationReplacesALiveSessionAsBefore) {
  MasterFixture m;
  ASSERT_TRUE(m.svc().RegisterClient(Info("c1"), {1 << 20}).ok());
  EXPECT_TRUE(m.svc().RegisterClient(Info("c1"), {1 << 20}).ok());
}

TEST(LeaseOwnership, LeaseIdsAreRandomAndOnlyTheirOwnerReleasesThem) {
  MasterFixture m;
  m.Register("c1", {1 << 20});
  m.Put("c1", "k", 100);
  LookupOptions mine;
  mine.lease_owner = 11;
  LookupBatch a = m.svc().GetReplicas({"k"}, mine);
  LookupBatch b = m.svc().GetReplicas({"k"}, mine);
  EXPECT_NE(a.lease_id, 0u);
  EXPECT_GT(a.lease_id > b.lease_id ? a.lease_id - b.lease_id : b.lease_id - a.lease_id, 1u << 20);
  EXPECT_EQ(m.svc().ReleaseLeases(a.lease_id, {"k"}, /*owner=*/12), 0u);
  EXPECT_EQ(m.svc().ReleaseLeases(a.lease_id, {"k"}, /*owner=*/0), 0u);
  EXPECT_EQ(m.CounterValue("mc_master_lease_releases_refused_total"), 2u);
  EXPECT_EQ(m.svc().ActiveLeaseCount(), 2u);
  EXPECT_EQ(m.svc().ReleaseLeases(a.lease_id, {"k"}, 11), 1u);
  EXPECT_EQ(m.svc().ReleaseLeases(b.lease_id, {"k"}, 11), 1u);
  EXPECT_EQ(m.svc().ActiveLeaseCount(), 0u);
}

TEST(PutOwnership, AnotherWritersPendingPutIsNotFoundAndItsGenerationNotTold) {
  MasterFixture m;
  m.Register("c1", {1 << 20});
  m.Register("c2", {1 << 20});
  PutStartOutcome started = m.Start("c1", "p", 100);
  ASSERT_TRUE(started.status.ok());
  const std::string gen = std::to_string(started.generation);
  for (const absl::Status& s :
       {m.End("c2", "p", started.generation), m.End("c2", "p", started.generation + 1),
        m.End("c1", "p", started.generation + 1),
        m.svc().PutRevoke("c2", {{"p", started.generation}})[0]}) {
    EXPECT_EQ(CodeOf(s), Code::kNotFound) << s;
    EXPECT_EQ(std::string(s.message()).find(gen), std::string::npos) << s;
  }
  EXPECT_FALSE(m.Exists("p"));
  EXPECT_TRUE(m.End("c1", "p", started.generation).ok());
  EXPECT_TRUE(m.Exists("p"));
  // Ended: another client's repeated PutEnd is not an oracle of the checksum either.
  EXPECT_EQ(CodeOf(m.End("c2", "p", started.generation)), Code::kNotFound);
}

TEST(DiskReports, ARecoveredReportNeverReplacesAKnownObject) {
  MasterFixture m;
  m.Register("c1", {1 << 20});
  m.Register("d1", {1 << 20}, /*disk_capacity=*/1 << 30);
  const uint64_t gen = m.Put("c1", "known", 100);  // checksum 42
  std::vector<DiskReplicaItem> forged = {
      {"known", gen, 0, 100, 43}, {"known", gen + 9, 0, 100, 42}, {"known", gen, 0, 99, 42}};
  std::vector<absl::Status> out = m.svc().AddDiskReplicas("d1", forged, /*recovered=*/true);
  EXPECT_EQ(CodeOf(out[0]), Code::kInvalidArgument);
  EXPECT_EQ(CodeOf(out[1]), Code::kNotFound);
  EXPECT_EQ(CodeOf(out[2]), Code::kInvalidArgument);
  EXPECT_EQ(m.CounterValue("mc_master_disk_reports_refused_total"), 3u);
  LookupOptions look;
  look.grant_lease = false;
  LookupBatch b = m.svc().GetReplicas({"known"}, look);
  EXPECT_EQ(b.results[0].generation, gen);
  EXPECT_EQ(b.results[0].checksum, 42u);
  ASSERT_EQ(b.results[0].replicas.size(), 1u);
  EXPECT_EQ(b.results[0].replicas[0].tier, ReplicaTier::kMemory);
}

}  // namespace
}  // namespace mc::master
