// The object state machine through MetadataService: PutStart -> PENDING -> PutEnd -> COMPLETE,
// idempotent ALREADY_EXISTS, generations, PutEnd/PutRevoke errors, put timeouts, bad input.
#include <set>
#include <string>
#include <vector>

#include "common/master_credentials.h"
#include "gtest/gtest.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

class PutLifecycle : public ::testing::Test {
 protected:
  void SetUp() override {
    m_.Register("c1", {1 << 20});
    m_.Register("c2", {1 << 20});
  }
  MasterFixture m_;
};

TEST_F(PutLifecycle, PutStartMakesPendingObjectInvisibleToReaders) {
  PutStartOutcome o = m_.Start("c1", "k", 1000);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_NE(o.generation, 0u);
  ASSERT_EQ(o.replicas.size(), 1u);
  EXPECT_EQ(o.replicas[0].location.client_id, "c1") << "writer's own client is preferred";
  EXPECT_EQ(o.replicas[0].location.length, 1000u);
  EXPECT_EQ(m_.Lookup("k", /*lease=*/true), Code::kNotReady);
  EXPECT_FALSE(m_.Exists("k"));
  EXPECT_EQ(m_.svc().ActiveLeaseCount(), 0u) << "no lease on a pending object";
  EXPECT_EQ(m_.svc().KeyCount(), 1u);
  EXPECT_EQ(CodeOf(m_.svc().Remove({"k"})[0]), Code::kNotReady);
}

TEST_F(PutLifecycle, PutEndMakesObjectCompleteAndReadable) {
  PutStartOutcome o = m_.Start("c1", "k", 1000, 2);
  ASSERT_TRUE(o.status.ok());
  ASSERT_TRUE(m_.End("c1", "k", o.generation, 0xabcdef).ok());
  EXPECT_TRUE(m_.Exists("k"));
  LookupBatch b = m_.svc().GetReplicas({"k"}, {});
  ASSERT_TRUE(b.results[0].status.ok());
  EXPECT_EQ(b.results[0].size, 1000u);
  EXPECT_EQ(b.results[0].checksum, 0xabcdefu);
  EXPECT_EQ(b.results[0].generation, o.generation);
  EXPECT_EQ(b.results[0].replicas.size(), 2u);
}

TEST_F(PutLifecycle, PutEndTwiceWithSameChecksumIsIdempotent) {
  PutStartOutcome o = m_.Start("c1", "k", 100);
  ASSERT_TRUE(m_.End("c1", "k", o.generation, 7).ok());
  EXPECT_TRUE(m_.End("c1", "k", o.generation, 7).ok());
  EXPECT_EQ(CodeOf(m_.End("c1", "k", o.generation, 8)), Code::kInvalidArgument);
  EXPECT_EQ(m_.svc().GetReplicas({"k"}, {}).results[0].checksum, 7u);
}

TEST_F(PutLifecycle, PutOfStoredKeyReportsAlreadyExists) {
  uint64_t gen = m_.Put("c1", "k", 100);
  auto snap = m_.Fingerprint();
  PutStartOutcome again = m_.Start("c2", "k", 100);
  EXPECT_EQ(CodeOf(again.status), Code::kAlreadyExists);
  EXPECT_EQ(again.generation, 0u);
  EXPECT_TRUE(again.replicas.empty());
  EXPECT_EQ(m_.Fingerprint(), snap);
  EXPECT_EQ(m_.svc().GetReplicas({"k"}, {.grant_lease = false}).results[0].generation, gen);
}

TEST_F(PutLifecycle, PutOfKeyBeingStoredReportsAlreadyExists) {
  PutStartOutcome first = m_.Start("c1", "k", 100);
  ASSERT_TRUE(first.status.ok());
  PutStartOutcome second = m_.Start("c2", "k", 100);
  EXPECT_EQ(CodeOf(second.status), Code::kAlreadyExists);
  // The first put is unharmed.
  EXPECT_TRUE(m_.End("c1", "k", first.generation).ok());
  EXPECT_TRUE(m_.Exists("k"));
}

TEST_F(PutLifecycle, AlreadyExistsFailsOnlyItsOwnItemsInABatch) {
  m_.Put("c1", "stored", 100);
  m_.Start("c1", "pending", 100);
  auto out = m_.svc().PutStart(
      "c1", {{"new1", 100}, {"stored", 100}, {"new2", 100}, {"pending", 100}, {"new1", 100}}, 1);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_TRUE(out[0].status.ok()) << out[0].status;
  EXPECT_EQ(CodeOf(out[1].status), Code::kAlreadyExists);
  EXPECT_TRUE(out[2].status.ok()) << out[2].status;
  EXPECT_EQ(CodeOf(out[3].status), Code::kAlreadyExists);
  EXPECT_EQ(CodeOf(out[4].status), Code::kAlreadyExists) << "duplicate in the same batch";
  EXPECT_TRUE(out[4].replicas.empty());
  EXPECT_EQ(out[1].generation, 0u);
  EXPECT_EQ(out[4].generation, 0u);
  EXPECT_TRUE(m_.End("c1", "new1", out[0].generation).ok());
  EXPECT_TRUE(m_.End("c1", "new2", out[2].generation).ok());
  EXPECT_TRUE(m_.Exists("new1"));
  EXPECT_TRUE(m_.Exists("new2"));
  // new1 holds exactly one allocation: the duplicate allocated nothing.
  EXPECT_EQ(m_.svc().Snapshot().mem_used, 4u * 128);
}

TEST_F(PutLifecycle, GenerationsStrictlyIncreaseAndAreNeverReused) {
  std::set<uint64_t> seen;
  uint64_t last = 0;
  for (int round = 0; round < 50; ++round) {
    std::string key = "k" + std::to_string(round % 5);
    PutStartOutcome o = m_.Start("c1", key, 64);
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_GT(o.generation, last);
    last = o.generation;
    EXPECT_TRUE(seen.insert(o.generation).second) << "generation reused";
    if (round % 2 == 0) {
      ASSERT_TRUE(m_.End("c1", key, o.generation).ok());
      ASSERT_TRUE(m_.svc().Remove({key})[0].ok());
    } else {
      ASSERT_TRUE(m_.svc().PutRevoke("c1", {{key, o.generation}})[0].ok());
    }
  }
  // Within one batch the order is unspecified (shard order), but every generation is new.
  auto batch = m_.svc().PutStart("c1", {{"x", 64}, {"y", 64}, {"z", 64}}, 1);
  for (const auto& o : batch) {
    EXPECT_GT(o.generation, last);
    EXPECT_TRUE(seen.insert(o.generation).second) << "generation reused";
  }
}

TEST_F(PutLifecycle, PutEndOfUnknownKeyIsNotFound) {
  EXPECT_EQ(CodeOf(m_.End("c1", "nope", 12345)), Code::kNotFound);
  EXPECT_EQ(m_.svc().KeyCount(), 0u);
}

// A generation other than the pending one names a put that no longer exists (generations are
// never reused): NOT_FOUND, as for a key with no pending put at all, and as PutRevoke answers.
TEST_F(PutLifecycle, PutEndWithAnotherGenerationIsNotFoundAndLeavesPutPending) {
  PutStartOutcome o = m_.Start("c1", "k", 100);
  EXPECT_EQ(CodeOf(m_.End("c1", "k", o.generation + 1)), Code::kNotFound);
  EXPECT_EQ(CodeOf(m_.End("c1", "k", o.generation - 1)), Code::kNotFound);
  EXPECT_FALSE(m_.Exists("k"));
  EXPECT_TRUE(m_.End("c1", "k", o.generation).ok());
}

// The storm the SSD duplicate test ran into: a put's only replica is on a client that dies
// before the writer ends the put; the key is put again (new generation) by another writer; the
// first writer's PutEnd must say its put is gone (NOT_FOUND, which mc-client reports as
// UNAVAILABLE "revoked"), not INVALID_ARGUMENT, and must not touch the new put.
TEST_F(PutLifecycle, PutEndAfterItsReplicaHolderDiedAndTheKeyWasPutAgainIsNotFound) {
  // Only "holder" has a segment large enough for the object (c1 and c2 have 1 MiB).
  constexpr uint64_t kSize = 3 << 19;  // 1.5 MiB
  const uint64_t holder = m_.Register("holder", {2 << 20});
  m_.Register("w1", {});
  m_.Register("w2", {});
  PutStartOutcome first = m_.Start("w1", "k", kSize);
  ASSERT_TRUE(first.status.ok()) << first.status;
  ASSERT_EQ(first.replicas[0].location.client_id, "holder");
  ASSERT_TRUE(m_.svc().UnregisterClient("holder", holder).ok());
  EXPECT_EQ(m_.CounterValue("mc_puts_timed_out_total"), 0u);
  m_.Register("holder", {2 << 20});  // back, empty
  PutStartOutcome second = m_.Start("w2", "k", kSize);
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_GT(second.generation, first.generation);

  absl::Status late = m_.End("w1", "k", first.generation);
  EXPECT_EQ(CodeOf(late), Code::kNotFound) << late;
  EXPECT_FALSE(m_.Exists("k")) << "the second put is still pending";
  EXPECT_TRUE(m_.End("w2", "k", second.generation).ok());
  EXPECT_TRUE(m_.Exists("k"));
  // The first put's pending entry went with its object: its timeout revokes nothing later.
  m_.clock().AdvanceMs(m_.svc().options().put_timeout_ms + 1);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.CounterValue("mc_puts_timed_out_total"), 0u);
  EXPECT_TRUE(m_.Exists("k"));
}

TEST_F(PutLifecycle, PutEndByAnotherClientFailsAndLeavesPutPending) {
  PutStartOutcome o = m_.Start("c1", "k", 100);
  // NOT_FOUND, as for a put that does not exist: another writer's put is not the caller's to
  // end (authentication binds a put to its writer; the answer tells nothing about it).
  EXPECT_EQ(CodeOf(m_.End("c2", "k", o.generation)), Code::kNotFound);
  EXPECT_FALSE(m_.Exists("k"));
  EXPECT_TRUE(m_.End("c1", "k", o.generation).ok());
}

TEST_F(PutLifecycle, PutEndErrorsArePerKey) {
  PutStartOutcome a = m_.Start("c1", "a", 100);
  PutStartOutcome b = m_.Start("c1", "b", 100);
  auto out = m_.svc().PutEnd(
      "c1", {{"a", a.generation, 1}, {"missing", 1, 1}, {"b", b.generation + 5, 1}, {"", 1, 1}});
  EXPECT_TRUE(out[0].ok());
  EXPECT_EQ(CodeOf(out[1]), Code::kNotFound);
  EXPECT_EQ(CodeOf(out[2]), Code::kNotFound);
  EXPECT_EQ(CodeOf(out[3]), Code::kInvalidArgument);
  EXPECT_TRUE(m_.Exists("a"));
  EXPECT_FALSE(m_.Exists("b"));
}

TEST_F(PutLifecycle, PutRevokeFreesSpaceAndForgetsKey) {
  auto before = m_.Fingerprint();
  PutStartOutcome o = m_.Start("c1", "k", 10'000, 2);
  ASSERT_TRUE(o.status.ok());
  EXPECT_GT(m_.svc().Snapshot().mem_used, 0u);
  // Only the writer may revoke, and only the right generation.
  EXPECT_EQ(CodeOf(m_.svc().PutRevoke("c2", {{"k", o.generation}})[0]), Code::kNotFound);
  EXPECT_EQ(CodeOf(m_.svc().PutRevoke("c1", {{"k", o.generation + 1}})[0]), Code::kNotFound);
  ASSERT_TRUE(m_.svc().PutRevoke("c1", {{"k", o.generation}})[0].ok());
  EXPECT_EQ(m_.Fingerprint(), before);
  EXPECT_EQ(CodeOf(m_.End("c1", "k", o.generation)), Code::kNotFound);
  // The key can be put again, with a new generation.
  PutStartOutcome again = m_.Start("c1", "k", 10'000);
  ASSERT_TRUE(again.status.ok());
  EXPECT_GT(again.generation, o.generation);
}

TEST_F(PutLifecycle, PutRevokeOfCompleteObjectIsRefused) {
  uint64_t gen = m_.Put("c1", "k", 100);
  EXPECT_EQ(CodeOf(m_.svc().PutRevoke("c1", {{"k", gen}})[0]), Code::kInvalidArgument);
  EXPECT_TRUE(m_.Exists("k"));
}

TEST_F(PutLifecycle, PutTimeoutFreesSpaceAndPutEndAnswersNotFound) {
  auto before = m_.Fingerprint();
  PutStartOutcome o = m_.Start("c1", "k", 10'000, 2);
  ASSERT_TRUE(o.status.ok());
  m_.clock().AdvanceMs(m_.svc().options().put_timeout_ms - 1);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.svc().KeyCount(), 1u) << "revoked before its timeout";
  m_.clock().AdvanceMs(2);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_EQ(m_.Fingerprint(), before);
  EXPECT_EQ(m_.CounterValue("mc_puts_timed_out_total"), 1u);
  EXPECT_EQ(CodeOf(m_.End("c1", "k", o.generation)), Code::kNotFound);
  EXPECT_FALSE(m_.Exists("k"));
}

TEST_F(PutLifecycle, CompletedPutIsNotRevokedByTimeout) {
  m_.Put("c1", "k", 100);
  m_.clock().AdvanceMs(m_.svc().options().put_timeout_ms * 2);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();
  EXPECT_TRUE(m_.Exists("k"));
  EXPECT_EQ(m_.CounterValue("mc_puts_timed_out_total"), 0u);
}

TEST_F(PutLifecycle, BadInputGivesPerKeyErrorsAndChangesNothing) {
  m_.Put("c1", "existing", 100);
  auto before = m_.Fingerprint();
  const std::string long_key(4097, 'x');
  const std::string max_key(4096, 'y');
  uint64_t too_big = m_.svc().options().max_object_size + 1;
  auto out = m_.svc().PutStart("c1", {{"", 10}, {long_key, 10}, {"zero", 0}, {"huge", too_big}}, 1);
  ASSERT_EQ(out.size(), 4u);
  for (const auto& o : out) {
    EXPECT_EQ(CodeOf(o.status), Code::kInvalidArgument) << o.status;
    EXPECT_EQ(o.generation, 0u);
    EXPECT_TRUE(o.replicas.empty());
  }
  auto unknown = m_.svc().PutStart("ghost", {{"k", 10}}, 1);
  EXPECT_EQ(CodeOf(unknown[0].status), Code::kUnavailable) << "transient (master restart)";
  auto too_many = m_.svc().PutStart("c1", {{"k", 10}}, m_.svc().options().max_replicas + 1);
  EXPECT_EQ(CodeOf(too_many[0].status), Code::kInvalidArgument);
  EXPECT_EQ(m_.Fingerprint(), before);

  // Lookups, removal and lease release with bad input change nothing either.
  LookupBatch b = m_.svc().GetReplicas({"", long_key, "existing", "existing"}, {});
  EXPECT_EQ(CodeOf(b.results[0].status), Code::kInvalidArgument);
  EXPECT_EQ(CodeOf(b.results[1].status), Code::kInvalidArgument);
  EXPECT_TRUE(b.results[2].status.ok());
  EXPECT_EQ(CodeOf(b.results[3].status), Code::kInvalidArgument) << "repeated key";
  EXPECT_EQ(m_.svc().ReleaseLeases(b.lease_id, {"existing"}), 1u);
  EXPECT_EQ(m_.svc().ReleaseLeases(999'999, {"existing", "nope", ""}), 0u);
  auto rm = m_.svc().Remove({"", long_key, "nope"});
  EXPECT_EQ(CodeOf(rm[0]), Code::kInvalidArgument);
  EXPECT_EQ(CodeOf(rm[1]), Code::kInvalidArgument);
  EXPECT_EQ(CodeOf(rm[2]), Code::kNotFound);
  EXPECT_EQ(m_.Fingerprint(), before);

  // A 4096-byte key is fine.
  EXPECT_TRUE(m_.Start("c1", max_key, 10).status.ok());
}

TEST_F(PutLifecycle, BadItemsDoNotFailTheirBatchNeighbours) {
  auto out = m_.svc().PutStart("c1", {{"", 10}, {"good", 10}, {"zero", 0}}, 1);
  EXPECT_EQ(CodeOf(out[0].status), Code::kInvalidArgument);
  EXPECT_TRUE(out[1].status.ok());
  EXPECT_EQ(CodeOf(out[2].status), Code::kInvalidArgument);
  EXPECT_EQ(m_.svc().KeyCount(), 1u);
}

TEST_F(PutLifecycle, RegisterRejectsBadInput) {
  ClientInfo info;
  EXPECT_EQ(CodeOf(m_.svc().RegisterClient(info, {}).status()), Code::kInvalidArgument);
  info.client_id = "x";
  EXPECT_EQ(CodeOf(m_.svc().RegisterClient(info, {1 << 20}).status()), Code::kInvalidArgument)
      << "segments without an endpoint";
  info.endpoint = "h:1";
  EXPECT_EQ(CodeOf(m_.svc().RegisterClient(info, {8}).status()), Code::kInvalidArgument);
  EXPECT_EQ(m_.svc().Snapshot().clients, 2u);
}

// The wrap-around: one segment of 2^64 - 128 MiB + 4096 bytes next to 128 MiB made the
// capacity total wrap to 4 KiB, and the watermark sweep then evicted everything.
TEST_F(PutLifecycle, RegisterRefusesSegmentsThatWouldWrapTheCapacity) {
  m_.Register("big", {128ull << 20});
  auto before = m_.Fingerprint();
  ClientInfo info;
  info.client_id = "attacker";
  info.endpoint = "h:1";
  const uint64_t huge = UINT64_MAX - (128ull << 20) + 1 + 4096;
  EXPECT_EQ(CodeOf(m_.svc().RegisterClient(info, {huge}).status()), Code::kInvalidArgument);
  // Sizes each under the per-segment limit whose sum still cannot wrap the total.
  EXPECT_EQ(CodeOf(m_.svc().RegisterClient(info, {UINT64_MAX / 2, UINT64_MAX / 2 + 2}).status()),
            Code::kInvalidArgument);
  info.disk_capacity = UINT64_MAX;
  EXPECT_EQ(CodeOf(m_.svc().RegisterClient(info, {1 << 20}).status()), Code::kInvalidArgument);
  EXPECT_EQ(m_.Fingerprint(), before);
  ClientInfo a;
  a.client_id = "a";
  a.host = "h";
  a.endpoint = "h:2";
  EXPECT_TRUE(m_.svc().RegisterClient(a, {1 << 20}).ok());
}

TEST_F(PutLifecycle, RegisterCapsSegmentCountAndSize) {
  MasterOptions o = MasterFixture::DefaultOptions();
  o.min_segment_size = 1 << 20;
  o.max_segments_per_client = 4;
  MasterFixture m(o);
  ClientInfo info;
  info.client_id = "junk";
  info.endpoint = "h:1";
  EXPECT_EQ(CodeOf(m.svc().RegisterClient(info, {4096}).status()), Code::kInvalidArgument)
      << "below --min_segment_size";
  EXPECT_EQ(CodeOf(m.svc().RegisterClient(info, std::vector<uint64_t>(5, 1 << 20)).status()),
            Code::kInvalidArgument)
      << "above --max_segments_per_client";
  EXPECT_TRUE(m.svc().RegisterClient(info, std::vector<uint64_t>(4, 1 << 20)).ok());
  EXPECT_EQ(m.svc().Snapshot().mem_capacity, 4u << 20);
}

// A recovered record with generation 2^64 - 1 made the next generation 0 ("never reserved"):
// the next put was answered OK with no replica written.
TEST_F(PutLifecycle, RecoveredGenerationsNeverWrapTheCounter) {
  m_.Register("ssd", {1 << 20}, /*disk_capacity=*/1 << 30);
  auto out = m_.svc().AddDiskReplicas(
      "ssd", {{"rec", UINT64_MAX, 5, 1000, 42}, {"rec0", 0, 6, 1000, 42}, {"ok", 77, 7, 1000, 42}},
      /*recovered=*/true);
  EXPECT_EQ(CodeOf(out[0]), Code::kInvalidArgument);
  EXPECT_NE(out[0].message().find("generation"), std::string_view::npos) << out[0];
  EXPECT_EQ(CodeOf(out[1]), Code::kInvalidArgument);
  EXPECT_TRUE(out[2].ok()) << out[2];
  EXPECT_FALSE(m_.Exists("rec"));
  PutStartOutcome o = m_.Start("c1", "next", 100);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_NE(o.generation, 0u);
  EXPECT_LT(o.generation, kGenerationLimit);
  // One recovered record with generation 2^63 - 1 (any member may send one)
  // pushed the counter to its end, and every later put in the cluster failed INTERNAL
  // "generation numbers exhausted" until a restart. A generation no master can have issued
  // (beyond the wall clock kGenerationLeadMs ahead, << 20) is refused and raises nothing.
  const uint64_t next_hour = static_cast<uint64_t>(auth::UnixNowMs() + kGenerationLeadMs) << 20;
  out = m_.svc().AddDiskReplicas(
      "ssd",
      {{"last", kGenerationLimit - 1, 8, 1000, 42},
       {"ahead", next_hour + (1ull << 30), 9, 1000, 42},
       {"past", static_cast<uint64_t>(auth::UnixNowMs() - 86'400'000) << 20, 10, 1000, 42}},
      true);
  EXPECT_EQ(CodeOf(out[0]), Code::kInvalidArgument) << out[0];
  EXPECT_EQ(CodeOf(out[1]), Code::kInvalidArgument) << out[1];
  EXPECT_TRUE(out[2].ok()) << "a generation of an earlier run: " << out[2];
  for (int i = 0; i < 3; ++i) {
    PutStartOutcome after = m_.Start("c1", "after" + std::to_string(i), 100);
    ASSERT_TRUE(after.status.ok()) << after.status;
    EXPECT_LT(after.generation, next_hour) << "the refused generations raised nothing";
  }
}

// The issue: a put with replicas=2 whose second holder was lost meanwhile was answered OK with
// one replica. PutEnd now fails it (and frees what is left).
TEST_F(PutLifecycle, PutEndWithAReplicaHolderLostMeanwhileFails) {
  PutStartOutcome o = m_.Start("c1", "two", 5000, 2);
  ASSERT_TRUE(o.status.ok()) << o.status;
  ASSERT_EQ(o.replicas.size(), 2u);
  m_.Register("c2", {1 << 20});  // c2 restarts: its old segments, and the replica, are gone
  absl::Status s = m_.End("c1", "two", o.generation);
  EXPECT_EQ(CodeOf(s), Code::kUnavailable) << s;
  EXPECT_NE(s.message().find("1 of 2"), std::string_view::npos) << s;
  EXPECT_FALSE(m_.Exists("two"));
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").used, 0u) << "the surviving replica is freed";
  // A put whose replicas are all still there is unaffected.
  EXPECT_NE(m_.Put("c1", "two-again", 5000, 2), 0u);
}

// Right after a master restart clients are unknown until they re-register: transient, so
// UNAVAILABLE with a hint, not INVALID_ARGUMENT.
TEST_F(PutLifecycle, UnknownClientIsUnavailable) {
  PutStartOutcome o = m_.Start("not-registered-yet", "k", 100);
  EXPECT_EQ(CodeOf(o.status), Code::kUnavailable) << o.status;
  EXPECT_NE(o.status.message().find("retry"), std::string_view::npos) << o.status;
}

TEST_F(PutLifecycle, RemoveFreesSpaceOfCompleteObject) {
  auto before = m_.Fingerprint();
  m_.Put("c1", "k", 5000, 2);
  ASSERT_TRUE(m_.svc().Remove({"k"})[0].ok());
  EXPECT_EQ(m_.Fingerprint(), before);
  EXPECT_EQ(m_.Lookup("k"), Code::kNotFound);
}

TEST_F(PutLifecycle, MoreReplicasThanClientsIsNoSpaceAndReservesNothing) {
  auto before = m_.Fingerprint();
  PutStartOutcome o = m_.Start("c1", "k", 100, 3);
  EXPECT_EQ(CodeOf(o.status), Code::kNoSpace);
  EXPECT_EQ(m_.Fingerprint(), before);
  EXPECT_EQ(m_.Lookup("k"), Code::kNotFound);
  EXPECT_EQ(m_.CounterValue("mc_put_no_space_total"), 1u);
}

// Master memory per object: what only a put in progress needs lives in a transient
// record that the end of the put frees; the writer stays, so a repeated PutEnd still answers.
TEST_F(PutLifecycle, EndedPutFreesItsTransientStateAndStillAnswersARepeatedEnd) {
  PutStartOutcome o = m_.Start("c1", "k", 100);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(m_.svc().TransientCountForTest(), 1u) << "a pending put holds its transient state";
  ASSERT_TRUE(m_.End("c1", "k", o.generation).ok());
  EXPECT_EQ(m_.svc().TransientCountForTest(), 0u);
  EXPECT_TRUE(m_.End("c1", "k", o.generation).ok()) << "repeated PutEnd by the writer";
  EXPECT_EQ(CodeOf(m_.End("c2", "k", o.generation)), Code::kNotFound) << "another writer";
  EXPECT_EQ(m_.svc().TransientCountForTest(), 0u);
}

TEST_F(PutLifecycle, RevokedOrFailedPutsLeaveNoTransientState) {
  PutStartOutcome a = m_.Start("c1", "a", 100);
  ASSERT_TRUE(a.status.ok());
  ASSERT_TRUE(m_.svc().PutRevoke("c1", {{"a", a.generation}})[0].ok());
  PutStartOutcome b = m_.Start("c1", "b", 100);
  ASSERT_TRUE(b.status.ok());
  m_.clock().AdvanceMs(m_.svc().options().put_timeout_ms + 1);
  m_.HeartbeatAll();
  m_.svc().RunMaintenance();  // b times out
  EXPECT_EQ(m_.CounterValue("mc_puts_timed_out_total"), 1u);
  EXPECT_EQ(m_.svc().KeyCount(), 0u);
  EXPECT_EQ(m_.svc().TransientCountForTest(), 0u);
}

}  // namespace
}  // namespace mc::master
