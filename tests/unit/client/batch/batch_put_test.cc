// BatchPutter against the real master (in-process) and a real transfer engine: per-key
// ALREADY_EXISTS, bad input per item, PutRevoke after a failed replica write, master failures,
// NO_SPACE retried while memory is leased.
#include "client/batch/batch_put.h"

#include <thread>

#include "absl/time/clock.h"
#include "common/checksum.h"
#include "gtest/gtest.h"
#include "tests/unit/client/client_test_util.h"

namespace mc::client::testing {
namespace {

using Rpc = FakeMasterClient::Rpc;

class BatchPut : public ClientFixture {
 protected:
  std::string GetInline(const std::string& key, absl::Status* status) {
    std::vector<GetRequestItem> items = {InlineItem(key)};
    StringSink sink(1);
    auto res = getter_.Get(items, 0, &sink);
    *status = res[0].status;
    return res[0].status.ok() ? sink.data(0) : std::string();
  }

  // Fills the local client's memory (2 segments of 1 MiB) with two objects and leases both, as
  // reads in progress would; returns the lease to release.
  v1::ReleaseLeasesRequest FillAndLease() {
    PutOk("full-0", Payload(1 << 20, 20));
    PutOk("full-1", Payload(1 << 20, 21));
    v1::GetReplicasRequest req;
    req.set_client_id(kLocalId);
    req.add_keys("full-0");
    req.add_keys("full-1");
    v1::GetReplicasResponse resp;
    EXPECT_TRUE(master_.GetReplicas(req, &resp).ok());
    v1::ReleaseLeasesRequest release;
    release.set_lease_id(resp.lease_id());
    release.add_keys("full-0");
    release.add_keys("full-1");
    return release;
  }
};

TEST_F(BatchPut, StoresPayloadsGatheredFromPieces) {
  const std::string p = Payload(123'457, 1);
  auto s = Put({"multi"}, {p}, 1, /*pieces=*/5);
  ASSERT_TRUE(s[0].ok()) << s[0];
  absl::Status gs;
  EXPECT_EQ(GetInline("multi", &gs), p);
  EXPECT_TRUE(gs.ok()) << gs;
  EXPECT_EQ(metrics_.bytes_in.Value(), p.size());
  EXPECT_EQ(Lookup("multi").checksum(), Checksum(p));
}

TEST_F(BatchPut, StoredKeyReportsAlreadyExistsPerKey) {
  const std::string first = Payload(1000, 2);
  PutOk("k1", first);
  auto s = Put({"k1", "k2", "k3", "k3"},
               {Payload(1000, 3), Payload(2000, 4), Payload(300, 5), Payload(300, 5)});
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(CodeOf(s[0]), Code::kAlreadyExists) << s[0];
  EXPECT_TRUE(s[1].ok()) << s[1];
  // A key named twice in one batch: one put wins, the other is ALREADY_EXISTS.
  EXPECT_EQ(static_cast<int>(s[2].ok()) + static_cast<int>(s[3].ok()), 1) << s[2] << " / " << s[3];
  EXPECT_TRUE(CodeOf(s[2]) == Code::kAlreadyExists || CodeOf(s[3]) == Code::kAlreadyExists);
  absl::Status gs;
  EXPECT_EQ(GetInline("k1", &gs), first) << "an ALREADY_EXISTS put must not overwrite";
  EXPECT_EQ(GetInline("k2", &gs), Payload(2000, 4));
  EXPECT_EQ(GetInline("k3", &gs), Payload(300, 5));
}

TEST_F(BatchPut, BadItemsFailAloneAndReachNoOne) {
  const std::string long_key(4097, 'k');
  std::vector<PutRequestItem> items(5);
  std::string good = Payload(64, 6), other = Payload(64, 7);
  items[0].key = "";
  items[0].pieces = {{good.data(), good.size()}};
  items[1].key = long_key;
  items[1].pieces = {{good.data(), good.size()}};
  items[2].key = "empty-payload";
  items[3].key = "flagged";
  items[3].pieces = {{good.data(), good.size()}};
  items[3].input_error = McError(Code::kInvalidArgument, "bad slice");
  items[4].key = "fine";
  items[4].pieces = {{other.data(), other.size()}};
  auto s = putter_.Put(items, 1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(CodeOf(s[i]), Code::kInvalidArgument) << i << s[i];
  EXPECT_TRUE(s[4].ok()) << s[4];
  EXPECT_EQ(master_.service().KeyCount(), 1u);

  auto too_many = Put({"r"}, {good}, /*replicas=*/9);
  EXPECT_EQ(CodeOf(too_many[0]), Code::kInvalidArgument);
}

TEST_F(BatchPut, FailedReplicaWriteRevokesThePutAndKeyIsNotReadable) {
  // A second client whose data plane is unreachable: the put's second replica cannot be written.
  transfer::SegmentTable unused;
  auto dead = Register("client-dead", "127.0.0.1:1", unused, 1, 1 << 20);
  const uint64_t used_before = master_.service().Snapshot().mem_used;
  auto s = Put({"doomed", "doomed-2"}, {Payload(5000, 8), Payload(7000, 9)}, /*replicas=*/2);
  for (const auto& st : s) EXPECT_EQ(CodeOf(st), Code::kTransferFailed) << st;
  EXPECT_EQ(master_.Calls(Rpc::kPutRevoke), 1) << "one PutRevoke RPC for the batch";
  EXPECT_EQ(master_.Calls(Rpc::kPutEnd), 0);
  v1::ExistRequest ereq;
  ereq.add_keys("doomed");
  ereq.add_keys("doomed-2");
  v1::ExistResponse eresp;
  ASSERT_TRUE(master_.Exist(ereq, &eresp).ok());
  EXPECT_FALSE(eresp.exists(0));
  EXPECT_FALSE(eresp.exists(1));
  absl::Status gs;
  GetInline("doomed", &gs);
  EXPECT_EQ(CodeOf(gs), Code::kNotFound) << gs;
  EXPECT_EQ(master_.service().Snapshot().mem_used, used_before) << "revoke frees the allocation";

  // The same key can be put again (one replica: placed on the writer's own segments).
  auto again = Put({"doomed"}, {Payload(5000, 8)}, 1);
  EXPECT_TRUE(again[0].ok()) << again[0];
}

TEST_F(BatchPut, MasterUnavailableAtPutStartFailsEveryItem) {
  master_.FailNext(Rpc::kPutStart, 1);
  auto s = Put({"a", "b"}, {Payload(10, 1), Payload(10, 2)});
  for (const auto& st : s) EXPECT_EQ(CodeOf(st), Code::kUnavailable) << st;
  EXPECT_EQ(master_.service().KeyCount(), 0u);
  auto ok = Put({"a", "b"}, {Payload(10, 1), Payload(10, 2)});
  for (const auto& st : ok) EXPECT_TRUE(st.ok()) << st;
}

TEST_F(BatchPut, MasterUnavailableAtPutEndIsUnavailableNotOk) {
  master_.FailNext(Rpc::kPutEnd, 1);
  auto s = Put({"a"}, {Payload(10, 1)});
  EXPECT_EQ(CodeOf(s[0]), Code::kUnavailable) << s[0];
  absl::Status gs;
  GetInline("a", &gs);
  EXPECT_FALSE(gs.ok()) << "a put whose PutEnd failed is not readable";
}

TEST_F(BatchPut, NoSpaceWhileMemoryIsLeasedIsRetriedUntilTheReadsEnd) {
  v1::ReleaseLeasesRequest release = FillAndLease();
  BatchPutter patient(PutOptions(60'000), master_, engine_, clock_, metrics_);
  // The reads end while the put waits (once it has met NO_SPACE and pauses on the clock): it then
  // evicts one of them and lands.
  int pauses = 0;
  clock_.SetOnSleep([&](int64_t) {
    if (pauses++ == 0) {
      EXPECT_TRUE(master_.ReleaseLeases(release).ok());
    }
  });
  const std::string p = Payload(1 << 20, 22);
  std::vector<PutRequestItem> items(1);
  items[0].key = "late";
  items[0].pieces = {{const_cast<char*>(p.data()), p.size()}};
  const int starts = master_.Calls(Rpc::kPutStart);
  auto s = patient.Put(items, 1);
  clock_.SetOnSleep(nullptr);
  ASSERT_TRUE(s[0].ok()) << s[0];
  EXPECT_EQ(pauses, 1) << "one pause, then the put landed";
  EXPECT_EQ(metrics_.put_no_space_retries.Value(), 1u);
  EXPECT_EQ(master_.Calls(Rpc::kPutStart), starts + 2)
      << "the NO_SPACE item went to the master again";
  absl::Status gs;
  EXPECT_EQ(GetInline("late", &gs), p);
}

TEST_F(BatchPut, NoSpaceThatOutlastsTheWaitIsAnsweredWithWhatWasTried) {
  v1::ReleaseLeasesRequest release = FillAndLease();
  // Each pause moves the fake clock: the wait ends once the pauses (1, 2, 4, 8, 16 ms) pass 20 ms.
  BatchPutter patient(PutOptions(20), master_, engine_, clock_, metrics_);
  const int64_t started_ms = clock_.NowMs();
  const std::string p = Payload(1 << 20, 23), small = Payload(100, 24);
  std::vector<PutRequestItem> items(2);
  items[0].key = "never";
  items[0].pieces = {{const_cast<char*>(p.data()), p.size()}};
  items[1].key = "full-0";  // stored: answered at once, not retried
  items[1].pieces = {{const_cast<char*>(small.data()), small.size()}};
  auto s = patient.Put(items, 1);
  EXPECT_EQ(CodeOf(s[0]), Code::kNoSpace) << s[0];
  EXPECT_NE(s[0].message().find("retries"), std::string::npos) << s[0];
  EXPECT_EQ(clock_.NowMs() - started_ms, 31) << "1 + 2 + 4 + 8 + 16 ms of pauses";
  EXPECT_EQ(metrics_.put_no_space_retries.Value(), 5u);
  EXPECT_EQ(CodeOf(s[1]), Code::kAlreadyExists) << s[1];
  EXPECT_EQ(master_.service().KeyCount(), 2u) << "the failed put left no pending object";
  EXPECT_TRUE(master_.ReleaseLeases(release).ok());
}

TEST_F(BatchPut, AnObjectNoSegmentCanHoldIsAnsweredAtOnceAndEvictsNothing) {
  PutOk("kept", Payload(1000, 26));
  BatchPutter patient(PutOptions(60'000), master_, engine_, clock_, metrics_);
  const std::string p = Payload((1 << 20) + 1, 27);  // the segments hold 1 MiB each
  std::vector<PutRequestItem> items(1);
  items[0].key = "too-big";
  items[0].pieces = {{const_cast<char*>(p.data()), p.size()}};
  const int starts = master_.Calls(Rpc::kPutStart);
  auto s = patient.Put(items, 1);
  EXPECT_EQ(CodeOf(s[0]), Code::kNoSpace) << s[0];
  EXPECT_NE(s[0].message().find("largest segment"), std::string::npos) << s[0];
  EXPECT_EQ(master_.Calls(Rpc::kPutStart), starts + 1) << "a final NO_SPACE is not retried";
  EXPECT_EQ(metrics_.put_no_space_retries.Value(), 0u);
  absl::Status gs;
  EXPECT_EQ(GetInline("kept", &gs), Payload(1000, 26)) << "nothing was evicted for it";
}

TEST_F(BatchPut, NoSpaceIsAnsweredAtOnceWithoutAWait) {
  FillAndLease();
  const int starts = master_.Calls(Rpc::kPutStart);
  auto s = Put({"now"}, {Payload(1 << 20, 25)});  // the fixture's putter: no wait
  EXPECT_EQ(CodeOf(s[0]), Code::kNoSpace) << s[0];
  EXPECT_EQ(master_.Calls(Rpc::kPutStart), starts + 1);
  EXPECT_EQ(metrics_.put_no_space_retries.Value(), 0u);
}

}  // namespace
}  // namespace mc::client::testing
