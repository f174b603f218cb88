// Restart and return (master side), through MetadataService with a FakeClock: the run's
// epoch in segment ids, owners' reports rebuilding objects (ReportObjects), held segments, and
// the forget queue handed out with heartbeats; and the same through the gRPC handlers.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "master/grpc_service.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

using testing::CodeOf;
using testing::MasterFixture;

constexpr uint64_t kSegment = 1 << 20;

std::vector<Code> Codes(const std::vector<absl::Status>& statuses) {
  std::vector<Code> out;
  for (const auto& s : statuses) out.push_back(CodeOf(s));
  return out;
}

// A fixture whose clients can register with will_report_objects and report.
class Report : public ::testing::Test {
 protected:
  static MasterOptions Options() {
    MasterOptions o = MasterFixture::DefaultOptions();
    o.epoch = 0x5eed0001;
    o.object_report_timeout_ms = 30'000;
    return o;
  }
  explicit Report(MasterOptions options = Options()) : m_(options) {}

  // Registers `id` (one segment of kSegment bytes unless told); returns the registration.
  Registration Register(const std::string& id, bool will_report,
                        std::vector<uint64_t> segments = {kSegment}) {
    ClientInfo info;
    info.client_id = id;
    info.host = "host-" + id;
    info.endpoint = "10.0.0.1:" + std::to_string(2000 + id.size());
    auto reg = m_.svc().RegisterClient(info, segments, {}, will_report);
    EXPECT_TRUE(reg.ok()) << reg.status();
    return reg.ok() ? *reg : Registration{};
  }
  absl::StatusOr<std::vector<absl::Status>> Send(const std::string& id, const Registration& reg,
                                                 const std::vector<ReportedObjectItem>& items,
                                                 bool last = true) {
    return m_.svc().ReportObjects(id, reg.session, items, last);
  }
  std::vector<Code> SendCodes(const std::string& id, const Registration& reg,
                              const std::vector<ReportedObjectItem>& items, bool last = true) {
    auto out = Send(id, reg, items, last);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? Codes(*out) : std::vector<Code>{};
  }
  LookupOutcome Find(std::string_view key) {
    return m_.svc().GetReplicas({key}, {.grant_lease = false}).results[0];
  }
  uint64_t Reported(const char* result) {
    return m_.CounterValue("mc_master_objects_reported_total", {{"result", result}});
  }
  // Drops `id` by silence (its segments and the objects only it held go), keeping `alive`.
  void Expire(const std::string& id, const std::string& alive, uint64_t alive_session) {
    (void)id;
    const int64_t ttl = m_.svc().options().client_ttl_ms;
    for (int64_t t = 0; t <= ttl; t += ttl / 4) {
      m_.clock().AdvanceMs(ttl / 4);
      ASSERT_TRUE(m_.svc().Heartbeat(alive, alive_session, 0));
      m_.svc().RunMaintenance();
    }
  }

  MasterFixture m_;
};

TEST(Epoch, SegmentIdsCarryARandomNonzeroEpochDistinctPerRun) {
  MasterFixture a;
  MasterFixture b;
  EXPECT_NE(a.svc().epoch(), 0u);
  EXPECT_NE(b.svc().epoch(), 0u);
  EXPECT_NE(a.svc().epoch(), b.svc().epoch());
  ClientInfo info;
  info.client_id = "c";
  info.host = "h";
  info.endpoint = "e:1";
  auto ra = a.svc().RegisterClient(info, {kSegment, kSegment});
  auto rb = b.svc().RegisterClient(info, {kSegment});
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_EQ(ra->epoch, a.svc().epoch());
  EXPECT_EQ(ra->segment_ids[0], (uint64_t{a.svc().epoch()} << 32) | 1);
  EXPECT_EQ(ra->segment_ids[1], (uint64_t{a.svc().epoch()} << 32) | 2);
  EXPECT_EQ(rb->segment_ids[0], (uint64_t{b.svc().epoch()} << 32) | 1);
  // Counters never repeat within a run, across registrations.
  auto again = a.svc().RegisterClient(info, {kSegment});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->segment_ids[0], (uint64_t{a.svc().epoch()} << 32) | 3);
}

TEST(Epoch, AnInjectedEpochIsUsedAndShownInStatusAndMetrics) {
  MasterOptions o = MasterFixture::DefaultOptions();
  o.epoch = 0x00c0ffee;
  MasterFixture m(o);
  EXPECT_EQ(m.svc().epoch(), 0x00c0ffeeu);
  EXPECT_NE(m.svc().StatusLine().find("| Epoch: 00c0ffee"), std::string::npos)
      << m.svc().StatusLine();
  EXPECT_EQ(m.metrics().GetGauge("mc_master_epoch", "").Value(), 0x00c0ffee);
}

TEST_F(Report, ARestartedMasterRebuildsReportedObjectsWithTheirReplicas) {
  // The previous run: c1 stored three objects. What c1's owner-side index would report.
  MasterFixture before;
  before.Register("c1", {kSegment});
  std::vector<std::string> keys{"alpha", "beta", "gamma"};
  std::vector<LookupOutcome> stored;
  for (size_t i = 0; i < keys.size(); ++i) {
    before.Put("c1", keys[i], 1000 * (i + 1));
    stored.push_back(before.svc().GetReplicas({keys[i]}, {.grant_lease = false}).results[0]);
  }
  // This run: c1 registers its same memory (new segment ids) and reports it.
  Registration reg = Register("c1", /*will_report=*/true);
  std::vector<ReportedObjectItem> items;
  for (size_t i = 0; i < keys.size(); ++i) {
    const StoredReplica& r = stored[i].replicas[0];
    items.push_back({keys[i], stored[i].generation, stored[i].size, stored[i].checksum,
                     reg.segment_ids[0], r.offset});
  }
  EXPECT_EQ(SendCodes("c1", reg, items), std::vector<Code>(3, Code::kOk));
  for (size_t i = 0; i < keys.size(); ++i) {
    LookupOutcome got = Find(keys[i]);
    ASSERT_TRUE(got.status.ok()) << keys[i] << ": " << got.status;
    EXPECT_EQ(got.generation, stored[i].generation);
    EXPECT_EQ(got.size, stored[i].size);
    EXPECT_EQ(got.checksum, stored[i].checksum);
    ASSERT_EQ(got.replicas.size(), 1u);
    const MemoryLocation loc = got.replicas[0].location();
    EXPECT_EQ(got.replicas[0].tier, ReplicaTier::kMemory);
    EXPECT_EQ(loc.client_id, "c1");
    EXPECT_EQ(loc.endpoint, "10.0.0.1:2002");
    EXPECT_EQ(loc.segment_id, reg.segment_ids[0]);
    EXPECT_EQ(loc.offset, stored[i].replicas[0].offset);
    EXPECT_EQ(loc.length, stored[i].size);
  }
  EXPECT_EQ(m_.svc().Snapshot().mem_used, before.svc().Snapshot().mem_used);
  EXPECT_EQ(Reported("restored"), 3u);
  EXPECT_EQ(Reported("joined"), 0u);
  EXPECT_EQ(Reported("refused"), 0u);
  // Restored objects are ordinary: removable, their space reusable.
  EXPECT_TRUE(m_.svc().Remove({"beta"})[0].ok());
  EXPECT_EQ(m_.svc().Snapshot().mem_used, 1024u + 3008);
}

TEST_F(Report, TheGenerationCounterIsRaisedPastTheLargestReported) {
  Registration reg = Register("c1", false);
  const uint64_t future = m_.Put("c1", "probe", 64) + 1'000'000'000;
  EXPECT_EQ(SendCodes("c1", reg, {{"far", future, 64, 1, reg.segment_ids[0], 4096}}),
            std::vector<Code>{Code::kOk});
  EXPECT_GT(m_.Put("c1", "next", 64), future);
}

TEST_F(Report, OverlappingRangesAreRefusedAndFreedRangesReused) {
  Registration reg = Register("c1", true);
  const uint64_t seg = reg.segment_ids[0];
  std::vector<ReportedObjectItem> items{{"a", 5, 1000, 1, seg, 0},
                                        {"b", 5, 100, 1, seg, 512},  // inside a
                                        {"c", 5, 64, 1, seg, 1024},  // right after a
                                        {"d", 5, 64, 1, seg, 1024}};
  EXPECT_EQ(SendCodes("c1", reg, items), (std::vector<Code>{Code::kOk, Code::kInvalidArgument,
                                                            Code::kOk, Code::kInvalidArgument}));
  EXPECT_FALSE(m_.Exists("b"));
  EXPECT_FALSE(m_.Exists("d"));
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").used, 1024u + 64);
  EXPECT_EQ(Reported("refused"), 2u);
  // After the report a put lands elsewhere; a later report of a range it took is refused.
  PutStartOutcome put = m_.Start("c1", "new", 64);
  ASSERT_TRUE(put.status.ok());
  const uint64_t taken = put.replicas[0].location.offset;
  EXPECT_EQ(SendCodes("c1", reg, {{"late", 5, 64, 1, seg, taken}}),
            std::vector<Code>{Code::kInvalidArgument});
}

TEST_F(Report, BadItemsAreRefusedOneByOne) {
  Registration reg = Register("c1", true);
  Registration other = Register("c2", false);
  const uint64_t seg = reg.segment_ids[0];
  const uint64_t max = m_.svc().options().max_object_size;
  std::vector<ReportedObjectItem> items{
      {"", 5, 64, 1, seg, 0},                           // empty key
      {"size0", 5, 0, 1, seg, 0},                       // empty object
      {"huge", 5, max + 1, 1, seg, 0},                  // past max_object_size
      {"gen0", 0, 64, 1, seg, 0},                       // generation 0
      {"genmax", kGenerationLimit, 64, 1, seg, 0},      // generation past the limit
      {"genend", kGenerationLimit - 1, 64, 1, seg, 0},  // one no master issued
      {"foreign", 5, 64, 1, other.segment_ids[0], 0},
      {"unknown", 5, 64, 1, seg + 1000, 0},
      {"unaligned", 5, 64, 1, seg, 32},
      {"outside", 5, 128, 1, seg, kSegment - 64},
      {"good", 5, 64, 1, seg, 0}};
  std::vector<Code> want(items.size() - 1, Code::kInvalidArgument);
  want.push_back(Code::kOk);
  EXPECT_EQ(SendCodes("c1", reg, items), want);
  EXPECT_EQ(m_.svc().KeyCount(), 1u);
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").used, 64u);
  EXPECT_EQ(m_.svc().ClientSegmentStats("c2").used, 0u);
  EXPECT_LT(m_.Put("c2", "after", 64), kGenerationLimit) << "the refused generation raised nothing";
}

TEST_F(Report, AStaleOrUnknownSessionIsRefusedWhole) {
  Registration first = Register("c1", true);
  Registration second = Register("c1", true);
  auto stale = Send("c1", first, {{"k", 5, 64, 1, second.segment_ids[0], 0}});
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  auto unknown = Send("nobody", first, {{"k", 5, 64, 1, second.segment_ids[0], 0}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(m_.svc().KeyCount(), 0u);
  EXPECT_EQ(m_.svc().Snapshot().mem_used, 0u);
  EXPECT_TRUE(m_.svc().SegmentsHeldForTest("c1")) << "a stale report ends nothing";
  // The first registration's segments went with it: the current session cannot name them.
  EXPECT_EQ(SendCodes("c1", second, {{"k", 5, 64, 1, first.segment_ids[0], 0}}),
            std::vector<Code>{Code::kInvalidArgument});
}

TEST_F(Report, AReturningClientsStaleObjectsAreSupersededAndFreed) {
  const uint64_t s2 = m_.Register("c2", {kSegment});
  Registration c1 = Register("c1", false);
  const uint64_t old_gen = m_.Put("c1", "k", 1000);
  const uint64_t offset = Find("k").replicas[0].offset;
  const uint64_t same_gen = m_.Put("c1", "same", 1000);
  const uint64_t same_off = Find("same").replicas[0].offset;
  Expire("c1", "c2", s2);
  ASSERT_FALSE(m_.Exists("k"));
  // Meanwhile: k put again (a newer generation), p being put, "same" recreated from elsewhere
  // with the generation c1 knows but another checksum (a forged or corrupt index entry).
  const uint64_t new_gen = m_.Put("c2", "k", 1000);
  ASSERT_GT(new_gen, old_gen);
  ASSERT_TRUE(m_.Start("c2", "p", 1000).status.ok());
  Registration back = Register("c1", true);
  const uint64_t seg = back.segment_ids[0];
  EXPECT_EQ(SendCodes("c1", back, {{"same", same_gen, 1000, 42, seg, same_off}}, false),
            std::vector<Code>{Code::kOk});
  std::vector<ReportedObjectItem> items{{"k", old_gen, 1000, 42, seg, offset},
                                        {"p", old_gen, 1000, 42, seg, 8192},
                                        {"same", same_gen, 1000, 42, seg, 16384},
                                        {"same", same_gen, 999, 42, seg, 32768}};
  EXPECT_EQ(SendCodes("c1", back, items),
            (std::vector<Code>{Code::kNotFound, Code::kNotFound, Code::kNotFound,
                               Code::kChecksumMismatch}))
      << "k: a newer generation; p: being put; 'same': c1 holds it already, then another size "
         "(a conflict with the reported object: both go)";
  EXPECT_EQ(Find("k").generation, new_gen);
  EXPECT_EQ(Find("k").replicas[0].client_id(), "c2");
  EXPECT_FALSE(m_.Exists("same"));
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").used, 0u) << "nothing holds space";
  // The refused ranges are forgotten: the owner drops them at its next heartbeat.
  std::vector<ReplicaRef> forgotten;
  bool more = true;
  ASSERT_TRUE(m_.svc().Heartbeat("c1", back.session, 0, &forgotten, &more));
  EXPECT_FALSE(more);
  std::vector<ReplicaRef> want{{seg, offset, old_gen},
                               {seg, 8192, old_gen},
                               {seg, 16384, same_gen},
                               {seg, 32768, same_gen},
                               {seg, same_off, same_gen}};
  std::sort(forgotten.begin(), forgotten.end(),
            [](const ReplicaRef& a, const ReplicaRef& b) { return a.offset < b.offset; });
  std::sort(want.begin(), want.end(),
            [](const ReplicaRef& a, const ReplicaRef& b) { return a.offset < b.offset; });
  EXPECT_EQ(forgotten, want);
  (void)c1;
}

TEST_F(Report, ASizeOrChecksumMismatchOfTheSameGenerationIsInvalid) {
  const uint64_t s2 = m_.Register("c2", {kSegment});
  Register("c1", false);
  const uint64_t gen = m_.Put("c1", "k", 1000, 2);  // on c1 and c2
  Expire("c1", "c2", s2);
  ASSERT_TRUE(m_.Exists("k"));
  Registration back = Register("c1", true);
  const uint64_t seg = back.segment_ids[0];
  EXPECT_EQ(SendCodes("c1", back, {{"k", gen, 1000, 43, seg, 0}, {"k", gen, 1064, 42, seg, 4096}}),
            (std::vector<Code>{Code::kInvalidArgument, Code::kInvalidArgument}));
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").used, 0u);
}

// After a master restart the first report of a key won, so a member
// that had an owner record (or itself reported) its own bytes under an existing key made that key
// answer with them. Conflicting reports are not resolved first-come: the key is dropped and stays
// disputed until a put of this run ends (a miss, never wrong bytes).
TEST_F(Report, ConflictingReportsOfAKeyDropItAndNoLaterReportRestoresIt) {
  Register("writer", false);
  const uint64_t gen = m_.Put("writer", "probe", 64);  // a generation a master issued
  Registration honest = Register("honest", true);
  Registration member = Register("member", true);
  Registration third = Register("third", true);
  // The member's report comes first (on main it won: the honest one was refused).
  EXPECT_EQ(SendCodes("member", member, {{"k", gen, 1000, 0xbad, member.segment_ids[0], 0}}),
            std::vector<Code>{Code::kOk});
  EXPECT_EQ(SendCodes("honest", honest, {{"k", gen, 1000, 42, honest.segment_ids[0], 4096}}),
            std::vector<Code>{Code::kChecksumMismatch});
  EXPECT_EQ(Find("k").status.code(), absl::StatusCode::kNotFound) << "neither version is served";
  EXPECT_EQ(m_.CounterValue("mc_master_report_conflicts_total", {}), 1u);
  EXPECT_EQ(m_.svc().ClientSegmentStats("member").used, 0u) << "the dropped replica's range";
  EXPECT_EQ(m_.svc().ClientSegmentStats("honest").used, 0u);
  // Whoever reports it next, with either version, does not restore it.
  EXPECT_EQ(SendCodes("third", third,
                      {{"k", gen, 1000, 0xbad, third.segment_ids[0], 0},
                       {"k", gen, 1000, 42, third.segment_ids[0], 4096}}),
            (std::vector<Code>{Code::kChecksumMismatch, Code::kChecksumMismatch}));
  EXPECT_FALSE(m_.Exists("k"));
  // The honest order (honest first) ends the same way, for another key.
  EXPECT_EQ(SendCodes("honest", honest, {{"k2", gen, 1000, 42, honest.segment_ids[0], 8192}}),
            std::vector<Code>{Code::kOk});
  EXPECT_EQ(SendCodes("member", member, {{"k2", gen, 1000, 0xbad, member.segment_ids[0], 8192}}),
            std::vector<Code>{Code::kChecksumMismatch});
  EXPECT_FALSE(m_.Exists("k2"));
  // Agreeing reports still join, and a put of this run makes the key ordinary again.
  EXPECT_EQ(SendCodes("honest", honest, {{"k3", gen, 1000, 42, honest.segment_ids[0], 16384}}),
            std::vector<Code>{Code::kOk});
  EXPECT_EQ(SendCodes("third", third, {{"k3", gen, 1000, 42, third.segment_ids[0], 16384}}),
            std::vector<Code>{Code::kOk});
  EXPECT_EQ(Find("k3").replicas.size(), 2u);
  m_.Put("writer", "k", 1000);
  EXPECT_TRUE(m_.Exists("k"));
  EXPECT_EQ(m_.CounterValue("mc_master_report_conflicts_total", {}), 2u);
}

TEST_F(Report, AReturningClientsReplicaJoinsTheKnownObject) {
  const uint64_t s2 = m_.Register("c2", {kSegment});
  Register("c1", false);
  const uint64_t gen = m_.Put("c1", "k", 1000, 2);  // on c1 and c2
  LookupOutcome was = Find("k");
  ASSERT_EQ(was.replicas.size(), 2u);
  uint64_t offset = 0;
  for (const StoredReplica& r : was.replicas) {
    if (r.client_id() == "c1") offset = r.offset;
  }
  Expire("c1", "c2", s2);
  ASSERT_EQ(Find("k").replicas.size(), 1u);
  Registration back = Register("c1", true);
  EXPECT_EQ(SendCodes("c1", back, {{"k", gen, 1000, 42, back.segment_ids[0], offset}}),
            std::vector<Code>{Code::kOk});
  LookupOutcome now = Find("k");
  ASSERT_EQ(now.replicas.size(), 2u);
  EXPECT_EQ(now.replicas[1].client_id(), "c1");
  EXPECT_EQ(now.replicas[1].segment_id, back.segment_ids[0]);
  EXPECT_EQ(now.replicas[1].offset, offset);
  EXPECT_EQ(Reported("joined"), 1u);
  EXPECT_EQ(Reported("restored"), 0u);
  // Once more (another range): c1 already holds it.
  EXPECT_EQ(SendCodes("c1", back, {{"k", gen, 1000, 42, back.segment_ids[0], 65536}}),
            std::vector<Code>{Code::kNotFound});
  EXPECT_EQ(Reported("refused"), 1u);
  EXPECT_EQ(m_.svc().ClientSegmentStats("c1").used, 1024u);
}

TEST_F(Report, HeldSegmentsGetNoPlacementUntilTheLastChunk) {
  Registration c1 = Register("c1", true);
  EXPECT_TRUE(m_.svc().SegmentsHeldForTest("c1"));
  // Alone and held: nothing can be placed, and the answer is a retry, not a final NO_SPACE.
  PutStartOutcome refused = m_.Start("c1", "x", 1000);
  EXPECT_EQ(CodeOf(refused.status), Code::kNoSpace);
  EXPECT_FALSE(refused.no_space_final);
  Register("c2", false);
  for (int i = 0; i < 8; ++i) {
    PutStartOutcome o = m_.Start("c1", "k" + std::to_string(i), 1000);
    ASSERT_TRUE(o.status.ok()) << o.status;
    EXPECT_EQ(o.replicas[0].location.client_id, "c2") << "not even as the writer's own client";
  }
  EXPECT_EQ(CodeOf(m_.Start("c2", "two", 1000, 2).status), Code::kNoSpace);
  // A chunk that is not the last keeps the hold.
  EXPECT_EQ(SendCodes("c1", c1, {{"r", 5, 64, 1, c1.segment_ids[0], 0}}, false),
            std::vector<Code>{Code::kOk});
  EXPECT_TRUE(m_.svc().SegmentsHeldForTest("c1"));
  EXPECT_EQ(SendCodes("c1", c1, {}, true), std::vector<Code>{});
  EXPECT_FALSE(m_.svc().SegmentsHeldForTest("c1"));
  PutStartOutcome o = m_.Start("c1", "mine", 1000);
  ASSERT_TRUE(o.status.ok());
  EXPECT_EQ(o.replicas[0].location.client_id, "c1");
  EXPECT_NE(o.replicas[0].location.offset, 0u) << "the reported range stays";
  EXPECT_TRUE(m_.Start("c2", "two", 1000, 2).status.ok());
}

TEST_F(Report, HeldSegmentsAreReleasedAtTheTimeout) {
  Registration c1 = Register("c1", true);
  Registration c2 = Register("c2", false);
  const int64_t timeout = m_.svc().options().object_report_timeout_ms;
  for (int64_t t = 0; t + 1000 < timeout; t += 1000) {
    m_.clock().AdvanceMs(1000);
    ASSERT_TRUE(m_.svc().Heartbeat("c2", c2.session, 0));
    ASSERT_TRUE(m_.svc().Heartbeat("c1", c1.session, 0));
    m_.svc().RunMaintenance();
    ASSERT_TRUE(m_.svc().SegmentsHeldForTest("c1")) << t;
  }
  m_.clock().AdvanceMs(1000);
  ASSERT_TRUE(m_.svc().Heartbeat("c1", c1.session, 0));
  m_.svc().RunMaintenance();
  EXPECT_FALSE(m_.svc().SegmentsHeldForTest("c1"));
  EXPECT_EQ(m_.CounterValue("mc_master_object_reports_timed_out_total"), 1u);
  EXPECT_EQ(m_.Start("c1", "mine", 1000).replicas.at(0).location.client_id, "c1");
  // A late last chunk is still applied (against whatever is placed by then).
  EXPECT_EQ(SendCodes("c1", c1, {{"late", 5, 64, 1, c1.segment_ids[0], 65536}}),
            std::vector<Code>{Code::kOk});
}

class Forget : public Report {
 protected:
  static MasterOptions Options() {
    MasterOptions o = Report::Options();
    o.forget_batch = 2;
    o.forget_queue_limit = 5;
    o.eviction.high_watermark = 0.5;
    o.eviction.low_watermark = 0.25;
    return o;
  }
  Forget() : Report(Options()) {}
  // Everything the heartbeats hand out, asking again while more_forgotten.
  std::vector<ReplicaRef> Drain(const std::string& id, uint64_t session, int* answers) {
    std::vector<ReplicaRef> all;
    bool more = true;
    *answers = 0;
    while (more && *answers < 100) {
      std::vector<ReplicaRef> got;
      EXPECT_TRUE(m_.svc().Heartbeat(id, session, 0, &got, &more));
      EXPECT_LE(got.size(), 2u);
      all.insert(all.end(), got.begin(), got.end());
      ++*answers;
    }
    return all;
  }
  ReplicaRef RefOf(std::string_view key) {
    const LookupOutcome found = Find(key);
    const MemoryLocation loc = found.replicas.at(0).location();
    EXPECT_EQ(loc.generation, found.generation) << key << ": the replica names its generation";
    return {loc.segment_id, loc.offset, loc.generation};
  }
};

TEST_F(Forget, RemoveRevokeTimeoutAndEvictionQueueTheRangeForItsOwner) {
  Registration c1 = Register("c1", false);
  m_.Put("c1", "removed", 1000);
  const ReplicaRef removed = RefOf("removed");
  ASSERT_TRUE(m_.svc().Remove({"removed"})[0].ok());
  PutStartOutcome revoked = m_.Start("c1", "revoked", 1000);
  ASSERT_TRUE(m_.svc().PutRevoke("c1", {{"revoked", revoked.generation}})[0].ok());
  int answers = 0;
  std::vector<ReplicaRef> got = Drain("c1", c1.session, &answers);
  EXPECT_EQ(answers, 1);
  const MemoryLocation& r = revoked.replicas[0].location;
  EXPECT_EQ(got, (std::vector<ReplicaRef>{removed, {r.segment_id, r.offset, revoked.generation}}));
  // A timed-out put.
  PutStartOutcome late = m_.Start("c1", "late", 1000);
  m_.clock().AdvanceMs(m_.svc().options().put_timeout_ms + 1);
  ASSERT_TRUE(m_.svc().Heartbeat("c1", c1.session, 0));
  m_.svc().RunMaintenance();
  got = Drain("c1", c1.session, &answers);
  const MemoryLocation& l = late.replicas[0].location;
  EXPECT_EQ(got, (std::vector<ReplicaRef>{{l.segment_id, l.offset, late.generation}}));
  // Eviction above the high watermark (the queue's bound drops the oldest, counted).
  std::vector<ReplicaRef> stored;
  for (int i = 0; i < 9; ++i) {
    const std::string key = "e" + std::to_string(i);
    m_.Put("c1", key, 64 << 10);
    stored.push_back(RefOf(key));
  }
  m_.svc().RunMaintenance();  // 9 x 64 KiB of 1 MiB: evicts down to a quarter (the 5 oldest)
  got = Drain("c1", c1.session, &answers);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(answers, 3) << "2 + 2 + 1, more_forgotten between";
  for (const ReplicaRef& ref : got) {
    EXPECT_NE(std::find(stored.begin(), stored.end(), ref), stored.end());
  }
  EXPECT_EQ(m_.CounterValue("mc_master_forget_dropped_total"), 0u);
  for (int i = 0; i < 7; ++i) {
    const std::string key = "x" + std::to_string(i);
    m_.Put("c1", key, 64);
    ASSERT_TRUE(m_.svc().Remove({key})[0].ok());
  }
  EXPECT_EQ(m_.CounterValue("mc_master_forget_dropped_total"), 2u);
  EXPECT_EQ(Drain("c1", c1.session, &answers).size(), 5u);
}

TEST_F(Forget, TheQueueGoesWithTheRegistrationAndAStaleHeartbeatGetsNothing) {
  Registration c1 = Register("c1", false);
  m_.Put("c1", "k", 1000);
  ASSERT_TRUE(m_.svc().Remove({"k"})[0].ok());
  Registration again = Register("c1", false);
  std::vector<ReplicaRef> got{{1, 1}};
  bool more = true;
  EXPECT_FALSE(m_.svc().Heartbeat("c1", c1.session, 0, &got, &more));
  int answers = 0;
  EXPECT_TRUE(Drain("c1", again.session, &answers).empty());
}

TEST_F(Report, TheGrpcHandlersCarryEpochReportsAndForgottenRanges) {
  namespace v1 = mcstore::v1;
  MasterGrpcService grpc(m_.svc(), m_.metrics(), 1000);
  v1::RegisterClientRequest reg_req;
  reg_req.set_client_id("c1");
  reg_req.set_data_endpoint("10.0.0.9:1");
  reg_req.add_segments()->set_size(kSegment);
  reg_req.set_will_report_objects(true);
  v1::RegisterClientResponse reg;
  ASSERT_TRUE(grpc.DoRegisterClient(Caller{}, &reg_req, &reg).ok());
  EXPECT_EQ(reg.epoch(), 0x5eed0001u);
  EXPECT_EQ(reg.segment_ids(0) >> 32, 0x5eed0001u);
  EXPECT_TRUE(m_.svc().SegmentsHeldForTest("c1"));

  v1::ReportObjectsRequest req;
  req.set_client_id("c1");
  req.set_session(reg.session());
  req.set_last(true);
  for (auto [key, offset] :
       {std::pair<const char*, uint64_t>{"k0", 0}, {"k0", 8192}, {"k1", 4096}}) {
    v1::ReportedObject* item = req.add_items();
    item->set_key(key);
    item->set_generation(7);
    item->set_size(100);
    item->set_checksum(9);
    item->set_segment_id(reg.segment_ids(0));
    item->set_offset(offset);
  }
  // An authenticated caller reporting for another session than its own: refused whole.
  Caller stale;
  stale.kind = Caller::Kind::kClient;
  stale.client_id = "c1";
  stale.session = reg.session() + 1;
  v1::ReportObjectsResponse resp;
  grpc::Status s = grpc.DoReportObjects(stale, &req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(resp.results_size(), 0);
  Caller self = stale;
  self.session = reg.session();
  ASSERT_TRUE(grpc.DoReportObjects(self, &req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 3);
  EXPECT_EQ(resp.results(0).code(), v1::OK);
  EXPECT_EQ(resp.results(1).code(), v1::NOT_FOUND) << "k0 twice: the replica is held already";
  EXPECT_EQ(resp.results(2).code(), v1::OK);
  EXPECT_FALSE(m_.svc().SegmentsHeldForTest("c1"));
  req.set_session(reg.session() + 1);  // unauthenticated: the master checks the session itself
  s = grpc.DoReportObjects(Caller{}, &req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  ASSERT_TRUE(m_.svc().Remove({"k0"})[0].ok());
  v1::HeartbeatRequest hb;
  hb.set_client_id("c1");
  hb.set_session(reg.session());
  v1::HeartbeatResponse hb_resp;
  ASSERT_TRUE(grpc.DoHeartbeat(self, &hb, &hb_resp).ok());
  EXPECT_TRUE(hb_resp.known());
  ASSERT_EQ(hb_resp.forgotten_size(), 2) << "k0's second report (refused) and its removal";
  EXPECT_EQ(hb_resp.forgotten(0).offset(), 8192u);
  EXPECT_EQ(hb_resp.forgotten(1).segment_id(), reg.segment_ids(0));
  EXPECT_EQ(hb_resp.forgotten(1).offset(), 0u);
  EXPECT_FALSE(hb_resp.more_forgotten());
}

}  // namespace
}  // namespace mc::master
