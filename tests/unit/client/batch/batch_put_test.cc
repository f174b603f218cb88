// BatchPutter against the real master (in-process) and a real transfer engine: per-key
// ALREADY_EXISTS, bad input per item, PutRevoke after a failed replica write, master failures,
// NO_SPACE retried while memory is leased; the checksum recorded is that of the bytes stored
// (hashed as the local replica is copied), and a source changed during the put fails it.
#include "client/batch/batch_put.h"

#include <functional>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "common/checksum.h"
#include "gtest/gtest.h"
#include "tests/unit/client/client_test_util.h"
#include "transfer/transport.h"

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

// A put's second replica, on a "remote" daemon (endpoint tamper:1) served by a test transport
// that copies into its own segments and, before each write, runs a hook: the application
// changing its buffer while the put is under way. It proves nothing, as tcp and rdma do not.
struct Tamper {
  transfer::SegmentTable table;
  std::function<void()> before_write;
  int writes = 0;
};

class TamperTransport final : public transfer::Transport {
 public:
  explicit TamperTransport(Tamper& tamper) : tamper_(tamper) {}
  std::string_view name() const override { return "tamper"; }
  bool Claims(const transfer::TransferRequest& r) override { return r.endpoint == "tamper:1"; }
  void Submit(std::span<const transfer::TransferRequest* const> requests,
              std::span<transfer::TransferResult> results, int64_t /*deadline_ms*/) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const transfer::TransferRequest& r = *requests[i];
      const transfer::SegmentRange* range = transfer::AsSegmentRange(r);
      absl::StatusOr<char*> seg =
          range == nullptr
              ? absl::StatusOr<char*>(McError(Code::kInvalidArgument, "no range"))
              : tamper_.table.Resolve(range->segment_id, range->offset, transfer::TotalLength(r));
      if (!seg.ok() || r.direction != transfer::Direction::kWrite) {
        results[i].status =
            seg.ok() ? McError(Code::kInvalidArgument, "writes only") : seg.status();
        continue;
      }
      ++tamper_.writes;
      if (tamper_.before_write) tamper_.before_write();
      for (const LocalBuffer& b : r.local) {
        std::memcpy(*seg + results[i].bytes, b.data, b.length);
        results[i].bytes += b.length;
      }
    }
  }

 private:
  Tamper& tamper_;
};

class BatchPutProof : public ClientFixture {
 protected:
  BatchPutProof() : BatchPutProof(std::make_shared<Tamper>()) {}
  explicit BatchPutProof(std::shared_ptr<Tamper> tamper)
      : ClientFixture(FakeMasterClient::DefaultOptions(), WithTamper(tamper)),
        tamper_(std::move(tamper)) {}

  static transfer::TransferEngineOptions WithTamper(const std::shared_ptr<Tamper>& tamper) {
    transfer::TransferEngineOptions o = EngineOptions();
    o.extra_transports.push_back([tamper](const transfer::TransportContext&) {
      return std::make_unique<TamperTransport>(*tamper);
    });
    return o;
  }

  void SetUp() override {
    ClientFixture::SetUp();
    tampered_ = Register("client-t", "tamper:1", tamper_->table, 1, 1 << 20);
  }

  // The bytes of `key`'s replica held by `segs`, or "" when it holds none.
  std::string Stored(const std::string& key, const FakeSegments& segs) {
    const v1::KeyReplicas found = Lookup(key);
    for (const auto& rep : found.replicas()) {
      if (rep.client_id() != segs.client_id) continue;
      const char* p = segs.Resolve(rep.segment_id(), rep.offset(), rep.length());
      return p == nullptr ? std::string() : std::string(p, rep.length());
    }
    return std::string();
  }

  std::shared_ptr<Tamper> tamper_;
  std::unique_ptr<FakeSegments> tampered_;
};

// One replica, in this daemon's segments: the checksum recorded is the XXH3 of the bytes stored,
// taken while they were copied; the source is not read a second time to hash it.
TEST_F(BatchPutProof, ALocalReplicaIsRecordedWithTheHashOfTheBytesItStored) {
  const std::string a = Payload(700'001, 31), b = Payload(300'000, 32);
  auto s = Put({"a", "b"}, {a, b}, /*replicas=*/1, /*pieces=*/3);
  ASSERT_TRUE(s[0].ok()) << s[0];
  ASSERT_TRUE(s[1].ok()) << s[1];
  EXPECT_EQ(Stored("a", *local_), a);
  EXPECT_EQ(Lookup("a").checksum(), Checksum(Stored("a", *local_)));
  EXPECT_EQ(Lookup("b").checksum(), Checksum(Stored("b", *local_)));
  EXPECT_EQ(Lookup("b").checksum(), Checksum(b));
  EXPECT_EQ(metrics_.put_source_hashes.Value(), 0u) << "one pass over each source: the copy";
  EXPECT_EQ(tamper_->writes, 0);
}

// A local and a remote replica: the local one is written and hashed first, the source is hashed
// again after the remote write and must agree. Unchanged, both replicas hold the bytes recorded.
TEST_F(BatchPutProof, ALocalAndARemoteReplicaAgreeWithTheRecordedHash) {
  const std::string p = Payload(600'000, 33);
  auto s = Put({"two"}, {p}, /*replicas=*/2, /*pieces=*/2);
  ASSERT_TRUE(s[0].ok()) << s[0];
  EXPECT_EQ(tamper_->writes, 1);
  EXPECT_EQ(Stored("two", *local_), p);
  EXPECT_EQ(Stored("two", *tampered_), p);
  EXPECT_EQ(Lookup("two").checksum(), Checksum(p));
  EXPECT_EQ(metrics_.put_source_hashes.Value(), 1u);
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 0u);
}

// The application changes its buffer after the local replica was copied and before the remote
// one is sent: the replicas differ, so no checksum is right for both. The put fails, is revoked
// and nothing is recorded (hashing the source once before the writes recorded the local bytes'
// hash, and the remote replica then held other bytes).
TEST_F(BatchPutProof, ASourceChangedDuringThePutFailsItInsteadOfRecordingAWrongHash) {
  std::string p = Payload(500'000, 34);
  const std::string original = p;
  bool changed = false;
  tamper_->before_write = [&p, &changed] {
    if (!changed) p[1234] ^= 0x40;  // once, before the first remote write ("torn"'s)
    changed = true;
  };
  const int revokes = master_.Calls(Rpc::kPutRevoke);
  const std::string calm = Payload(1000, 35);
  std::vector<PutRequestItem> items(2);
  items[0].key = "torn";
  items[0].pieces = {{p.data(), 200'000}, {p.data() + 200'000, p.size() - 200'000}};
  items[1].key = "calm";
  items[1].pieces = {{const_cast<char*>(calm.data()), calm.size()}};
  auto s = putter_.Put(items, /*replicas=*/2);
  EXPECT_EQ(CodeOf(s[0]), Code::kChecksumMismatch) << s[0];
  EXPECT_NE(s[0].message().find("changed during the put"), std::string::npos) << s[0];
  EXPECT_TRUE(s[1].ok()) << s[1] << ": its neighbour's failure stays its own";
  EXPECT_EQ(master_.Calls(Rpc::kPutRevoke), revokes + 1);
  EXPECT_EQ(metrics_.checksum_mismatches.Value(), 1u);
  v1::ExistRequest ereq;
  ereq.add_keys("torn");
  v1::ExistResponse eresp;
  ASSERT_TRUE(master_.Exist(ereq, &eresp).ok());
  EXPECT_FALSE(eresp.exists(0)) << "a put whose replicas differ is never stored";
  EXPECT_NE(original, p);

  // The buffer left alone, the same put succeeds.
  tamper_->before_write = nullptr;
  items.resize(1);
  auto again = putter_.Put(items, 2);
  ASSERT_TRUE(again[0].ok()) << again[0];
  EXPECT_EQ(Lookup("torn").checksum(), Checksum(p));
}

}  // namespace
}  // namespace mc::client::testing
