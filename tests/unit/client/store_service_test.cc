// StoreGrpcService::MatchPrefix against the in-process master: a leased match keeps the master's
// answer as its pinned lookups (columns, or per-key records from an older master) and refuses a
// malformed one; later gets under the lease read exactly the pinned keys.
#include "client/store_service.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/packed_lookups.h"
#include "tests/unit/client/client_test_util.h"

namespace mc::client::testing {
namespace {

class StoreService : public ClientFixture {
 protected:
  StoreService()
      : service_(StoreServiceOptions{.client_id = kLocalId}, buffers_, putter_, getter_, master_,
                 prefix_leases_, clock_, metrics_) {}

  void SetUp() override {
    ClientFixture::SetUp();
    for (int i = 0; i < 4; ++i) {
      keys_.push_back("chain-" + std::to_string(i));
      payloads_.push_back(Payload(300 + 50 * i, 900 + i));
    }
    for (const auto& s : Put(keys_, payloads_)) ASSERT_TRUE(s.ok()) << s;
    master_.SetAfterGetReplicas([this](v1::GetReplicasResponse* resp) {
      answered_packed_ = resp->has_packed();
      if (spoil_) spoil_(resp);
    });
  }

  // MatchPrefix over the four stored keys followed by one that is not stored, the keys named one
  // by one or packed.
  v1::MatchPrefixRequest MatchRequest(uint32_t ttl_ms, bool packed = false) const {
    v1::MatchPrefixRequest req;
    std::vector<std::string> keys = keys_;
    keys.push_back("chain-missing");
    for (const auto& k : keys) {
      if (packed) {
        AppendPackedKey(k, req.mutable_packed_keys(), req.mutable_packed_key_sizes());
      } else {
        req.add_keys(k);
      }
    }
    req.set_lease_ttl_ms(ttl_ms);
    return req;
  }
  grpc::Status Match(uint32_t ttl_ms, v1::MatchPrefixResponse* resp, bool packed = false) {
    v1::MatchPrefixRequest req = MatchRequest(ttl_ms, packed);
    return service_.MatchPrefix(nullptr, &req, resp);
  }
  int Lookups() const { return master_.Calls(FakeMasterClient::Rpc::kGetReplicas); }

  // Gets the matched keys under `lease_id`; they must come from the pinned lookups.
  void ExpectPinnedGets(uint64_t lease_id) {
    const int lookups = master_.Calls(FakeMasterClient::Rpc::kGetReplicas);
    std::vector<GetRequestItem> items;
    for (const auto& k : keys_) items.push_back(InlineItem(k));
    StringSink sink(items.size());
    auto res = getter_.Get(items, lease_id, &sink);
    ASSERT_EQ(res.size(), keys_.size());
    for (size_t i = 0; i < keys_.size(); ++i) {
      EXPECT_TRUE(res[i].status.ok()) << keys_[i] << ": " << res[i].status;
      EXPECT_EQ(sink.data(i), payloads_[i]) << keys_[i];
    }
    EXPECT_EQ(master_.Calls(FakeMasterClient::Rpc::kGetReplicas), lookups)
        << "pinned keys need no lookup";
  }

  BufferRegistry buffers_;
  StoreGrpcService service_;
  std::vector<std::string> keys_;
  std::vector<std::string> payloads_;
  bool answered_packed_ = false;
  std::function<void(v1::GetReplicasResponse*)> spoil_;
};

TEST_F(StoreService, LeasedMatchPinsTheMastersPackedAnswer) {
  v1::MatchPrefixResponse resp;
  grpc::Status s = Match(60'000, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.matched(), 4u);
  ASSERT_NE(resp.lease_id(), 0u);
  EXPECT_TRUE(answered_packed_) << "a leased match asks for the columnar answer";
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 4u) << "exactly the matched keys are leased";
  ExpectPinnedGets(resp.lease_id());

  v1::ReleaseLeaseRequest release;
  release.set_lease_id(resp.lease_id());
  v1::ReleaseLeaseResponse released;
  ASSERT_TRUE(service_.ReleaseLease(nullptr, &release, &released).ok());
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
}

TEST_F(StoreService, PlainMatchAsksForTheCountAlone) {
  v1::MatchPrefixResponse resp;
  ASSERT_TRUE(Match(0, &resp).ok());
  EXPECT_EQ(resp.matched(), 4u);
  EXPECT_EQ(resp.lease_id(), 0u);
  EXPECT_FALSE(answered_packed_);
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
  EXPECT_EQ(prefix_leases_.Count(), 0u);
}

// A master older than packed keys and answers sees no keys in a packed lookup: the client asks
// again key by key (reading the per-key records it answers), and keeps doing so for a while.
TEST_F(StoreService, OlderMasterGetsTheKeysAgainOneByOne) {
  master_.SetIgnorePackedFields(true);
  for (bool leased : {true, false}) {
    v1::MatchPrefixResponse resp;
    const int before = Lookups();
    grpc::Status s = Match(leased ? 60'000 : 0, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.matched(), 4u);
    EXPECT_EQ(Lookups() - before, leased ? 2 : 1)
        << "packed once, then one by one; later calls one by one at once";
    if (leased) ExpectPinnedGets(resp.lease_id());
  }
  // Past packed_keys_retry_ms the client tries packed keys again.
  clock_.AdvanceMs(StoreServiceOptions{}.packed_keys_retry_ms);
  v1::MatchPrefixResponse resp;
  const int before = Lookups();
  ASSERT_TRUE(Match(0, &resp).ok());
  EXPECT_EQ(resp.matched(), 4u);
  EXPECT_EQ(Lookups() - before, 2);
}

TEST_F(StoreService, KeysFromTheApplicationMayComePacked) {
  for (uint32_t ttl : {0u, 60'000u}) {
    v1::MatchPrefixResponse resp;
    const int before = Lookups();
    grpc::Status s = Match(ttl, &resp, /*packed=*/true);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.matched(), 4u);
    EXPECT_EQ(resp.keys_seen(), 5u);
    EXPECT_EQ(Lookups() - before, 1);
    if (ttl != 0) ExpectPinnedGets(resp.lease_id());
  }
}

TEST_F(StoreService, KeysNamedBothWaysOrCutWrongAreRefused) {
  v1::MatchPrefixRequest both = MatchRequest(0, true);
  both.add_keys("chain-0");
  v1::MatchPrefixRequest short_sizes = MatchRequest(0, true);
  short_sizes.mutable_packed_key_sizes()->RemoveLast();
  v1::MatchPrefixRequest long_sizes = MatchRequest(0, true);
  long_sizes.add_packed_key_sizes(1);
  for (const auto* req : {&both, &short_sizes, &long_sizes}) {
    v1::MatchPrefixResponse resp;
    grpc::Status s = service_.MatchPrefix(nullptr, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  EXPECT_EQ(Lookups(), 0) << "refused before the master is asked";
}

TEST_F(StoreService, PackingTheMastersKeysCanBeTurnedOff) {
  master_.SetIgnorePackedFields(true);  // would cost a second lookup if the keys went packed
  StoreGrpcService unpacked(StoreServiceOptions{.client_id = kLocalId, .pack_master_keys = false},
                            buffers_, putter_, getter_, master_, prefix_leases_, clock_, metrics_);
  v1::MatchPrefixRequest req = MatchRequest(60'000, /*packed=*/true);
  v1::MatchPrefixResponse resp;
  ASSERT_TRUE(unpacked.MatchPrefix(nullptr, &req, &resp).ok());
  EXPECT_EQ(resp.matched(), 4u);
  EXPECT_EQ(Lookups(), 1);
  ExpectPinnedGets(resp.lease_id());
}

TEST_F(StoreService, MalformedPackedAnswerFailsTheMatch) {
  spoil_ = [](v1::GetReplicasResponse* resp) {
    resp->mutable_packed()->set_owners(0, 99);  // names a client the answer does not list
  };
  v1::MatchPrefixResponse resp;
  grpc::Status s = Match(60'000, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(s.error_message().find("malformed packed lookups"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(prefix_leases_.Count(), 0u) << "no lease is handed out on a bad answer";
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u) << "the master's leases are given back";
}

// A match that counts the miss, or more rows than were answered, would pin keys that are not
// there.
TEST_F(StoreService, MatchBeyondTheAnswersFoundRowsFailsTheMatch) {
  for (uint32_t extra : {1u, 2u}) {
    spoil_ = [extra](v1::GetReplicasResponse* resp) {
      resp->set_matched(resp->matched() + extra);
    };
    v1::MatchPrefixResponse resp;
    grpc::Status s = Match(60'000, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << extra << ": " << s.error_message();
    EXPECT_EQ(prefix_leases_.Count(), 0u);
    EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
  }
}

TEST_F(StoreService, RegisteringByShmNameIsOffByDefault) {
  v1::RegisterBufferRequest req;
  req.set_shm_name("/any-object-the-daemon-could-open");
  req.set_size(4096);
  v1::RegisterBufferResponse resp;
  grpc::Status s = service_.RegisterBuffer(nullptr, &req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_NE(s.error_message().find("--store_allow_named_buffers"), std::string::npos);
  v1::RegisterBufferRequest unknown;
  unknown.set_handle("0123456789abcdef0123456789abcdef");
  EXPECT_EQ(service_.RegisterBuffer(nullptr, &unknown, &resp).error_code(),
            grpc::StatusCode::NOT_FOUND);
  unknown.set_shm_name("/x");
  EXPECT_EQ(service_.RegisterBuffer(nullptr, &unknown, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(buffers_.Count(), 0u);
}

TEST_F(StoreService, PrefixLeasesPerCallerAreCapped) {
  StoreGrpcService capped(StoreServiceOptions{.client_id = kLocalId, .max_leases_per_caller = 1},
                          buffers_, putter_, getter_, master_, prefix_leases_, clock_, metrics_);
  v1::MatchPrefixRequest req = MatchRequest(60'000);
  v1::MatchPrefixResponse first;
  ASSERT_TRUE(capped.MatchPrefix(nullptr, &req, &first).ok());
  v1::MatchPrefixResponse second;
  grpc::Status s = capped.MatchPrefix(nullptr, &req, &second);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--store_max_leases_per_caller"), std::string::npos);
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 4u) << "the refused match leased nothing";
  v1::MatchPrefixRequest plain = MatchRequest(0);
  EXPECT_TRUE(capped.MatchPrefix(nullptr, &plain, &second).ok()) << "unleased matches go on";
  v1::ReleaseLeaseRequest release;
  release.set_lease_id(first.lease_id());
  v1::ReleaseLeaseResponse released;
  ASSERT_TRUE(capped.ReleaseLease(nullptr, &release, &released).ok());
  EXPECT_TRUE(capped.MatchPrefix(nullptr, &req, &second).ok());
  EXPECT_EQ(metrics_.registry()
                .GetCounter("mc_store_limit_refusals_total", "", {{"limit", "leases"}})
                .Value(),
            1u);
}

TEST_F(StoreService, LeasesBelongToTheirCaller) {
  v1::MatchPrefixResponse resp;
  ASSERT_TRUE(Match(60'000, &resp).ok());
  EXPECT_TRUE(prefix_leases_.OwnedBy(resp.lease_id(), ""));
  EXPECT_FALSE(prefix_leases_.OwnedBy(resp.lease_id(), "anon:unix"));
  EXPECT_FALSE(prefix_leases_.Take(resp.lease_id(), "anon:unix").has_value());
  EXPECT_EQ(prefix_leases_.CountOwned(""), 1u);
  EXPECT_TRUE(prefix_leases_.Take(resp.lease_id(), "").has_value());
  EXPECT_EQ(prefix_leases_.CountOwned(""), 0u);
}

}  // namespace
}  // namespace mc::client::testing
