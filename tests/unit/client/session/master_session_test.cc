// MasterSession's object report and forgotten ranges, against the real master in-process (the
// fake answers ReportObjects itself: the master side is not part of this fake yet).
#include "client/session/master_session.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>

#include "common/checksum.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_master_client.h"

namespace mc::client {
namespace {

using Rpc = FakeMasterClient::Rpc;

class MasterSessionReport : public ::testing::Test {
 protected:
  static master::MasterOptions Options() {
    master::MasterOptions o = FakeMasterClient::DefaultOptions();
    o.heartbeat_interval_ms = 3'600'000;  // the session thread stays quiet: tests heartbeat
    return o;
  }
  MasterSessionReport() : master_(clock_, Options()) {
    pool_ = *SegmentPool::Create({.segment_size = 1 << 16, .segment_count = 2});
    index_ = std::make_unique<ObjectIndex>(std::vector<uint64_t>{1 << 16, 1 << 16});
    master_.SetReportObjectsHandler(
        [this](const v1::ReportObjectsRequest& req, v1::ReportObjectsResponse* resp) {
          std::lock_guard<std::mutex> lock(mu_);
          reports_.push_back(req);
          for (const auto& item : req.items()) {
            resp->add_results()->set_code(refuse_.count(item.key()) ? v1::NOT_FOUND : v1::OK);
          }
          return absl::OkStatus();
        });
  }
  ~MasterSessionReport() override {
    if (session_) session_->Stop();
  }

  std::unique_ptr<MasterSession> MakeSession(size_t chunk_items = 4096) {
    auto s = std::make_unique<MasterSession>(MasterSessionOptions{.client_id = "owner",
                                                                  .host = "host",
                                                                  .data_endpoint = "owner:1",
                                                                  .retry_interval_ms = 10,
                                                                  .report_chunk_items = chunk_items,
                                                                  .metrics = &metrics_,
                                                                  .clock = &clock_},
                                             master_, *pool_, table_);
    s->SetObjectIndex(index_.get());
    return s;
  }
  // Writes an object's bytes into local segment `seg` and indexes it.
  void Put(size_t seg, uint64_t offset, const std::string& key, uint64_t generation) {
    std::string bytes(100 + offset % 37, static_cast<char>('a' + generation % 26));
    std::memcpy(pool_->segments()[seg].base + offset, bytes.data(), bytes.size());
    ASSERT_TRUE(index_->Insert(seg, offset, {key, generation, bytes.size(), Checksum(bytes)}).ok());
  }
  std::vector<v1::ReportObjectsRequest> Reports() {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }

  FakeClock clock_;
  FakeMasterClient master_;
  MetricsRegistry metrics_;
  transfer::SegmentTable table_;
  std::unique_ptr<SegmentPool> pool_;
  std::unique_ptr<ObjectIndex> index_;
  std::unique_ptr<MasterSession> session_;
  std::mutex mu_;
  std::vector<v1::ReportObjectsRequest> reports_;
  std::set<std::string> refuse_;
};

TEST_F(MasterSessionReport, ReportsInChunksUnderTheNewIdsAndDropsRefusedEntries) {
  for (uint64_t i = 0; i < 5; ++i) Put(i % 2, 1000 * i, "k" + std::to_string(i), 10 + i);
  refuse_ = {"k3"};
  session_ = MakeSession(/*chunk_items=*/2);
  ASSERT_TRUE(session_->Start().ok());
  EXPECT_TRUE(session_->registered());
  const std::vector<v1::ReportObjectsRequest> reports = Reports();
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0].items_size(), 2);
  EXPECT_EQ(reports[1].items_size(), 2);
  EXPECT_EQ(reports[2].items_size(), 1);
  EXPECT_FALSE(reports[0].last());
  EXPECT_FALSE(reports[1].last());
  EXPECT_TRUE(reports[2].last());
  const std::vector<uint64_t> ids = pool_->published_ids();
  ASSERT_EQ(ids.size(), 2u);
  for (const auto& r : reports) {
    EXPECT_EQ(r.client_id(), "owner");
    EXPECT_EQ(r.session(), session_->session());
    for (const auto& item : r.items()) {
      const int i = std::stoi(item.key().substr(1));
      EXPECT_EQ(item.segment_id(), ids[i % 2]);
      EXPECT_EQ(item.offset(), 1000u * i);
      EXPECT_EQ(item.generation(), 10u + i);
      EXPECT_EQ(item.size(), 100u + (1000u * i) % 37);
    }
  }
  const MasterSession::ReportStats stats = session_->last_report();
  EXPECT_EQ(stats.reported, 5u);
  EXPECT_EQ(stats.kept, 4u);
  EXPECT_EQ(stats.dropped, 1u);
  EXPECT_EQ(stats.chunks, 3u);
  EXPECT_EQ(index_->size(), 4u) << "the refused entry left the index";
  EXPECT_EQ(
      metrics_.GetCounter("mc_client_index_reported_total", "", {{"result", "dropped"}}).Value(),
      1u);
}

TEST_F(MasterSessionReport, EntriesWhoseBytesChangedAreNotReported) {
  Put(0, 0, "intact", 1);
  Put(0, 4096, "scribbled", 2);
  pool_->segments()[0].base[4096 + 5] ^= 1;
  session_ = MakeSession();
  ASSERT_TRUE(session_->Start().ok());
  const std::vector<v1::ReportObjectsRequest> reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  ASSERT_EQ(reports[0].items_size(), 1);
  EXPECT_EQ(reports[0].items(0).key(), "intact");
  EXPECT_TRUE(reports[0].last());
  EXPECT_EQ(session_->last_report().verify_failed, 1u);
  EXPECT_EQ(index_->size(), 1u);
  EXPECT_EQ(metrics_.GetCounter("mc_client_index_verify_failed_total", "").Value(), 1u);
}

TEST_F(MasterSessionReport, AnEmptyIndexSendsOneEmptyLastChunk) {
  session_ = MakeSession();
  ASSERT_TRUE(session_->Start().ok());
  const std::vector<v1::ReportObjectsRequest> reports = Reports();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].items_size(), 0);
  EXPECT_TRUE(reports[0].last());
}

TEST_F(MasterSessionReport, AFailedReportFailsTheRegistrationUntilARetryReports) {
  Put(1, 64, "k", 3);
  master_.FailNext(Rpc::kReportObjects, 1);
  session_ = MakeSession();
  EXPECT_FALSE(session_->Start().ok());
  EXPECT_FALSE(session_->registered());
  EXPECT_EQ(index_->size(), 1u) << "nothing is dropped for a failed call";
  // The session thread registers again after retry_interval_ms (10, on the fake clock) and
  // reports again.
  ASSERT_TRUE(clock_.AwaitWaiting(1));
  clock_.AdvanceMs(10);
  ASSERT_TRUE(clock_.AwaitWaitsBegun(2)) << "the thread's round ended";
  EXPECT_EQ(session_->rounds(), 1u);
  ASSERT_TRUE(session_->registered());
  EXPECT_GE(session_->registrations(), 1u);
  const std::vector<v1::ReportObjectsRequest> reports = Reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_EQ(reports.back().items_size(), 1);
  EXPECT_EQ(reports.back().items(0).segment_id(), pool_->published_ids()[1]);
  EXPECT_EQ(metrics_.GetCounter("mc_client_index_reports_failed_total", "").Value(), 1u);
}

TEST_F(MasterSessionReport, AMasterWithoutReportsIsServedAnyway) {
  Put(0, 0, "k", 1);
  master_.SetReportObjectsHandler([](const v1::ReportObjectsRequest&, v1::ReportObjectsResponse*) {
    return absl::UnimplementedError("unknown method ReportObjects");
  });
  session_ = MakeSession();
  EXPECT_TRUE(session_->Start().ok());
  EXPECT_TRUE(session_->registered());
  EXPECT_EQ(index_->size(), 1u) << "nothing was refused: the index stays";
}

TEST_F(MasterSessionReport, WithoutAnIndexNothingIsReported) {
  auto s = std::make_unique<MasterSession>(
      MasterSessionOptions{.client_id = "plain", .host = "host", .data_endpoint = "plain:1"},
      master_, *pool_, table_);
  ASSERT_TRUE(s->Start().ok());
  EXPECT_EQ(master_.Calls(Rpc::kReportObjects), 0);
  s->Stop();
}

TEST_F(MasterSessionReport, ForgottenRangesLeaveTheIndexAndMoreForgottenAsksAgain) {
  Put(0, 0, "a", 1);
  Put(0, 1000, "b", 2);
  Put(1, 0, "c", 3);
  session_ = MakeSession();
  ASSERT_TRUE(session_->Start().ok());
  const std::vector<uint64_t> ids = pool_->published_ids();
  std::atomic<int> answers{0};
  master_.SetAfterHeartbeat([&](v1::HeartbeatResponse* resp) {
    const int n = answers.fetch_add(1);
    if (n == 0) {
      auto* ref = resp->add_forgotten();
      ref->set_segment_id(ids[0]);
      ref->set_offset(0);
      auto* stale = resp->add_forgotten();  // an id of another registration: ignored
      stale->set_segment_id(ids[1] ^ (uint64_t{1} << 40));
      stale->set_offset(0);
      resp->set_more_forgotten(true);
    } else if (n == 1) {
      auto* ref = resp->add_forgotten();
      ref->set_segment_id(ids[0]);
      ref->set_offset(1000);
    }
  });
  const int before = master_.Calls(Rpc::kHeartbeat);
  session_->HeartbeatForTest();
  EXPECT_EQ(master_.Calls(Rpc::kHeartbeat) - before, 2) << "asked again at once, then stopped";
  EXPECT_EQ(session_->forgotten(), 2u);
  ASSERT_EQ(index_->size(), 1u);
  EXPECT_EQ(index_->Snapshot()[0].object.key, "c");
}

// The master frees a range, reuses it for a newer object whose notice reached the index first,
// then its forget entry arrives: only the entry of the generation it names goes.
TEST_F(MasterSessionReport, AForgetOfAnOlderGenerationKeepsTheNewerObjectThatReusedTheRange) {
  Put(0, 0, "old", 5);
  Put(0, 4096, "kept", 6);
  session_ = MakeSession();
  ASSERT_TRUE(session_->Start().ok());
  Put(0, 0, "new", 9);  // the range reused (Insert replaced "old")
  const std::vector<uint64_t> ids = pool_->published_ids();
  master_.SetAfterHeartbeat([&](v1::HeartbeatResponse* resp) {
    if (resp->known()) {
      for (auto [offset, generation] : {std::pair<uint64_t, uint64_t>{0, 5}, {4096, 6}}) {
        auto* ref = resp->add_forgotten();
        ref->set_segment_id(ids[0]);
        ref->set_offset(offset);
        ref->set_generation(generation);
      }
    }
    resp->set_more_forgotten(false);
  });
  session_->HeartbeatForTest();
  EXPECT_EQ(session_->forgotten(), 1u) << "only 'kept' (generation 6) matched";
  ASSERT_EQ(index_->size(), 1u);
  EXPECT_EQ(index_->Snapshot()[0].object.key, "new");
}

TEST_F(MasterSessionReport, MoreForgottenIsBounded) {
  session_ = MakeSession();
  ASSERT_TRUE(session_->Start().ok());
  master_.SetAfterHeartbeat([](v1::HeartbeatResponse* resp) { resp->set_more_forgotten(true); });
  const int before = master_.Calls(Rpc::kHeartbeat);
  session_->HeartbeatForTest();
  EXPECT_EQ(master_.Calls(Rpc::kHeartbeat) - before, 16);
}

}  // namespace
}  // namespace mc::client
