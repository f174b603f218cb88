// StoreGrpcService::MatchPrefix against the in-process master: a leased match keeps the master's
// answer as its pinned lookups (columns, or per-key records from an older master) and refuses a
// malformed one; later gets under the lease read exactly the pinned keys.
#include "client/store/store_service.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// A lease is released with its keys in the order they were matched, the order the master granted
// them (it matches that against its grant records instead of finding each object).
TEST_F(StoreService, ReleasingALeaseNamesItsKeysInTheOrderTheyWereMatched) {
  std::vector<std::string> keys, payloads;
  for (int i = 0; i < 48; ++i) {
    keys.push_back("order-" + std::to_string(i));
    payloads.push_back(Payload(100 + i, 500 + i));
  }
  for (const auto& s : Put(keys, payloads)) ASSERT_TRUE(s.ok()) << s;
  v1::MatchPrefixRequest req;
  for (const auto& k : keys) req.add_keys(k);
  req.set_lease_ttl_ms(60'000);
  v1::MatchPrefixResponse resp;
  ASSERT_TRUE(service_.MatchPrefix(nullptr, &req, &resp).ok());
  ASSERT_EQ(resp.matched(), keys.size());
  std::vector<std::string> released;
  bool packed = false;
  master_.SetBeforeReleaseLeases([&](const v1::ReleaseLeasesRequest& r) {
    packed = r.keys_size() == 0;
    absl::StatusOr<std::vector<std::string_view>> named = RequestKeys(r);
    ASSERT_TRUE(named.ok()) << named.status();
    released.assign(named->begin(), named->end());
  });
  v1::ReleaseLeaseRequest release;
  release.set_lease_id(resp.lease_id());
  v1::ReleaseLeaseResponse done;
  ASSERT_TRUE(service_.ReleaseLease(nullptr, &release, &done).ok());
  EXPECT_EQ(released, keys);
  EXPECT_TRUE(packed) << "one string for the master to parse, not one per key";
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
}

// A MatchPrefix that names a key twice: the master refuses a key repeated in one lookup, so the
// match ends before the repeat, and the release leaves no lease behind.
TEST_F(StoreService, APrefixThatRepeatsAKeyEndsBeforeTheRepeatAndLeavesNoLease) {
  for (const auto& s : Put({"twice-a", "twice-b"}, {Payload(100, 1), Payload(100, 2)})) {
    ASSERT_TRUE(s.ok()) << s;
  }
  v1::MatchPrefixRequest req;
  for (const char* k : {"twice-a", "twice-b", "twice-a"}) req.add_keys(k);
  req.set_lease_ttl_ms(60'000);
  v1::MatchPrefixResponse resp;
  ASSERT_TRUE(service_.MatchPrefix(nullptr, &req, &resp).ok());
  ASSERT_EQ(resp.matched(), 2u);
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 2u);
  v1::ReleaseLeaseRequest release;
  release.set_lease_id(resp.lease_id());
  v1::ReleaseLeaseResponse done;
  ASSERT_TRUE(service_.ReleaseLease(nullptr, &release, &done).ok());
  EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
}

// One daemon, one rest: an older master met by a MatchPrefix also makes the daemon's gets name
// their keys one by one (one lookup each, not a packed one first), until the rest is over.
TEST_F(StoreService, AnOlderMasterMetByMatchPrefixRestsPackingForGetsToo) {
  master_.SetIgnorePackedFields(true);
  v1::MatchPrefixResponse resp;
  ASSERT_TRUE(Match(0, &resp).ok());
  EXPECT_EQ(resp.matched(), 4u);
  auto get = [this] {
    const int before = Lookups();
    std::vector<GetRequestItem> items;
    for (const auto& k : keys_) items.push_back(InlineItem(k));
    StringSink sink(items.size());
    auto res = getter_.Get(items, 0, &sink);
    for (size_t i = 0; i < keys_.size(); ++i) {
      EXPECT_TRUE(res[i].status.ok()) << keys_[i] << ": " << res[i].status;
      EXPECT_EQ(sink.data(i), payloads_[i]) << keys_[i];
    }
    EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u);
    return Lookups() - before;
  };
  EXPECT_EQ(get(), 1) << "key by key at once: MatchPrefix found the older master";
  clock_.AdvanceMs(BatchGetOptions{}.packed_keys_retry_ms);
  EXPECT_EQ(get(), 2) << "packed again after the rest, then key by key";
}

// Only a master that saw none of the packed keys is an older master. One that saw some of them
// may have leased those: the match is refused and the leases given back, not asked again key by
// key (which would leave them to their TTL).
TEST_F(StoreService, PackedKeysSeenOnlyInPartFailTheMatchAndGiveBackItsLeases) {
  for (uint32_t seen : {1u, 3u, 6u}) {
    for (uint32_t ttl : {0u, 60'000u}) {
      spoil_ = [seen](v1::GetReplicasResponse* resp) { resp->set_keys_seen(seen); };
      v1::MatchPrefixResponse resp;
      const int before = Lookups();
      grpc::Status s = Match(ttl, &resp);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << seen << ": " << s.error_message();
      EXPECT_NE(s.error_message().find(absl::StrCat("master saw ", seen, " of 5 packed keys")),
                std::string::npos)
          << s.error_message();
      EXPECT_EQ(Lookups() - before, 1) << "not asked again key by key";
      EXPECT_EQ(prefix_leases_.Count(), 0u);
      EXPECT_EQ(master_.service().ActiveLeaseCount(), 0u) << "the master's leases are given back";
    }
  }
  EXPECT_FALSE(getter_.packed_keys().Resting()) << "not an older master: packing goes on";
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
  clock_.AdvanceMs(BatchGetOptions{}.packed_keys_retry_ms);
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
    spoil_ = [extra](v1::GetReplicasResponse* resp) { resp->set_matched(resp->matched() + extra); };
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

TEST_F(StoreService, ALeasesCapabilityLetsAnotherCallerUseAndReleaseIt) {
  v1::MatchPrefixResponse resp;
  ASSERT_TRUE(Match(60'000, &resp).ok());
  ASSERT_EQ(resp.lease_token().size(), PrefixLeases::kTokenBytes);
  v1::MatchPrefixResponse other;
  ASSERT_TRUE(Match(60'000, &other).ok());
  EXPECT_NE(resp.lease_token(), other.lease_token()) << "each lease has its own capability";
  // Another process of the engine: not the owner, but it presents the capability.
  const std::string worker = "session:worker";
  EXPECT_TRUE(prefix_leases_.Authorizes(resp.lease_id(), worker, resp.lease_token()));
  EXPECT_FALSE(prefix_leases_.Authorizes(resp.lease_id(), worker, ""));
  EXPECT_FALSE(prefix_leases_.Authorizes(resp.lease_id(), worker, other.lease_token()));
  std::string flipped = resp.lease_token();
  flipped[0] ^= 1;
  EXPECT_FALSE(prefix_leases_.Authorizes(resp.lease_id(), worker, flipped));
  EXPECT_FALSE(prefix_leases_.Take(resp.lease_id(), worker, flipped).has_value());
  EXPECT_FALSE(prefix_leases_.Take(resp.lease_id(), worker).has_value());
  EXPECT_TRUE(prefix_leases_.Take(resp.lease_id(), worker, resp.lease_token()).has_value());
  EXPECT_FALSE(prefix_leases_.Authorizes(resp.lease_id(), "", resp.lease_token())) << "released";
  // Through the service: released with the capability, the master's lease goes too.
  v1::ReleaseLeaseRequest release;
  release.set_lease_id(other.lease_id());
  release.set_lease_token(other.lease_token());
  v1::ReleaseLeaseResponse released;
  ASSERT_TRUE(service_.ReleaseLease(nullptr, &release, &released).ok());
  EXPECT_EQ(prefix_leases_.Count(), 0u);
  EXPECT_EQ(service_.ReleaseLease(nullptr, &release, &released).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(metrics_.lease_release_refusals.Value(), 1u);
}

// A POSIX shm object of `size` bytes mapped here, registered with `registry` (anonymous owner).
class SharedBuffer {
 public:
  SharedBuffer(BufferRegistry& registry, uint64_t size)
      : name_("/mc-store-service-test-" + std::to_string(getpid())), size_(size) {
    int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    base_ = static_cast<char*>(p);
    close(fd);
    absl::StatusOr<uint64_t> id = registry.Register(name_, size);
    EXPECT_TRUE(id.ok()) << id.status();
    id_ = id.value_or(0);
  }
  ~SharedBuffer() {
    munmap(base_, size_);
    shm_unlink(name_.c_str());
  }
  uint64_t id() const { return id_; }
  char* at(uint64_t offset) { return base_ + offset; }

 private:
  std::string name_;
  uint64_t size_;
  char* base_ = nullptr;
  uint64_t id_ = 0;
};

// Two runs per block, 1,000 bytes apart per block: [0, 100) and [500, 560) of block 0.
void AddTestLayout(uint64_t buffer_id, google::protobuf::RepeatedPtrField<v1::StridedSlice>* l) {
  v1::StridedSlice* a = l->Add();
  a->set_buffer_id(buffer_id);
  a->set_length(100);
  a->set_stride(1000);
  v1::StridedSlice* b = l->Add();
  b->set_buffer_id(buffer_id);
  b->set_offset(500);
  b->set_length(60);
  b->set_stride(1000);
}

TEST_F(StoreService, BlockLayoutItemsMoveTheRunsTheyStandFor) {
  SharedBuffer buf(buffers_, 64 << 10);
  for (uint64_t i = 0; i < (64 << 10); ++i) *buf.at(i) = static_cast<char>(i * 7 + i / 251);
  v1::BatchPutRequest put;
  AddTestLayout(buf.id(), put.mutable_block_layout());
  for (uint64_t block : {3, 7}) {
    v1::PutItem* item = put.add_items();
    item->set_key("layout-" + std::to_string(block));
    item->mutable_block()->set_index(block);
  }
  v1::BatchPutResponse put_resp;
  ASSERT_TRUE(service_.BatchPut(nullptr, &put, &put_resp).ok());
  ASSERT_EQ(put_resp.results_size(), 2);
  for (const auto& r : put_resp.results()) ASSERT_EQ(r.code(), v1::OK) << r.message();

  // Read back inline: the object is block 3's two runs, in layout order.
  v1::BatchGetRequest inline_get;
  inline_get.add_items()->set_key("layout-3");
  v1::BatchGetResponse inline_resp;
  ASSERT_TRUE(service_.BatchGet(nullptr, &inline_get, &inline_resp).ok());
  ASSERT_EQ(inline_resp.results(0).code(), v1::OK);
  EXPECT_EQ(inline_resp.results(0).data(),
            std::string(buf.at(3000), 100) + std::string(buf.at(3500), 60));

  // Into blocks 10 and 11 (block 0 too: index 0 is a block, not "none").
  v1::BatchGetRequest get;
  AddTestLayout(buf.id(), get.mutable_block_layout());
  const std::vector<std::pair<std::string, uint64_t>> wanted = {
      {"layout-3", 10}, {"layout-7", 11}, {"layout-7", 0}};
  for (const auto& [key, block] : wanted) {
    v1::GetItem* item = get.add_items();
    item->set_key(key);
    item->mutable_block()->set_index(block);
    std::memset(buf.at(block * 1000), 0, 100);
    std::memset(buf.at(block * 1000 + 500), 0, 60);
  }
  v1::BatchGetResponse get_resp;
  ASSERT_TRUE(service_.BatchGet(nullptr, &get, &get_resp).ok());
  ASSERT_EQ(get_resp.results_size(), 3);
  for (size_t i = 0; i < wanted.size(); ++i) {
    const v1::GetResult& r = get_resp.results(static_cast<int>(i));
    ASSERT_EQ(r.code(), v1::OK) << r.message();
    EXPECT_EQ(r.bytes_written(), 160u);
    EXPECT_TRUE(r.data().empty());
    const uint64_t from = wanted[i].first == "layout-3" ? 3 : 7;
    const uint64_t to = wanted[i].second;
    EXPECT_EQ(std::string(buf.at(to * 1000), 100), std::string(buf.at(from * 1000), 100));
    EXPECT_EQ(std::string(buf.at(to * 1000 + 500), 60), std::string(buf.at(from * 1000 + 500), 60));
  }
}

TEST_F(StoreService, BadBlockLayoutItemsFailAlone) {
  SharedBuffer buf(buffers_, 64 << 10);
  v1::BatchGetRequest get;
  AddTestLayout(buf.id(), get.mutable_block_layout());
  auto add = [&get, this](uint64_t block) {
    v1::GetItem* item = get.add_items();
    item->set_key(keys_[0]);
    item->mutable_block()->set_index(block);
    return item;
  };
  add(1u << 20);                           // past the buffer's end
  add(uint64_t{1} << 62);                  // offset overflows 64 bits
  v1::Slice* both = add(1)->add_slices();  // a block and slices
  both->set_buffer_id(buf.id());
  both->set_length(10);
  add(2);  // well formed: 160 bytes of slices for a 300-byte object
  v1::BatchGetResponse resp;
  ASSERT_TRUE(service_.BatchGet(nullptr, &get, &resp).ok());
  ASSERT_EQ(resp.results_size(), 4);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(resp.results(i).code(), v1::INVALID_ARGUMENT)
        << i << ": " << resp.results(i).message();
  }
  EXPECT_NE(resp.results(1).message().find("overflows"), std::string::npos);
  EXPECT_EQ(resp.results(3).code(), v1::SIZE_MISMATCH) << resp.results(3).message();

  // A block item in a request without a layout; a layout naming a buffer nobody registered.
  v1::BatchGetRequest bare;
  v1::GetItem* item = bare.add_items();
  item->set_key(keys_[0]);
  item->mutable_block()->set_index(0);
  v1::BatchPutRequest put;
  v1::StridedSlice* run = put.add_block_layout();
  run->set_buffer_id(buf.id() + 1000);
  run->set_length(10);
  v1::PutItem* p = put.add_items();
  p->set_key("never-stored");
  p->mutable_block()->set_index(0);
  v1::PutItem* both_put = put.add_items();
  both_put->set_key("never-stored-2");
  both_put->set_data("x");
  both_put->mutable_block()->set_index(0);
  v1::BatchGetResponse bare_resp;
  ASSERT_TRUE(service_.BatchGet(nullptr, &bare, &bare_resp).ok());
  EXPECT_EQ(bare_resp.results(0).code(), v1::INVALID_ARGUMENT);
  EXPECT_NE(bare_resp.results(0).message().find("no block_layout"), std::string::npos);
  v1::BatchPutResponse put_resp;
  ASSERT_TRUE(service_.BatchPut(nullptr, &put, &put_resp).ok());
  ASSERT_EQ(put_resp.results_size(), 2);
  EXPECT_EQ(put_resp.results(0).code(), v1::INVALID_ARGUMENT) << put_resp.results(0).message();
  EXPECT_NE(put_resp.results(0).message().find("unknown buffer id"), std::string::npos);
  EXPECT_EQ(put_resp.results(1).code(), v1::INVALID_ARGUMENT) << put_resp.results(1).message();
}

TEST_F(StoreService, BlockLayoutExpansionIsBounded) {
  SharedBuffer buf(buffers_, 64 << 10);
  StoreGrpcService capped(StoreServiceOptions{.client_id = kLocalId, .max_request_slices = 5},
                          buffers_, putter_, getter_, master_, prefix_leases_, clock_, metrics_);
  v1::BatchGetRequest get;
  AddTestLayout(buf.id(), get.mutable_block_layout());
  for (uint64_t block : {1, 2}) {
    v1::GetItem* item = get.add_items();
    item->set_key(keys_[0]);
    item->mutable_block()->set_index(block);
  }
  v1::BatchGetResponse resp;
  EXPECT_TRUE(capped.BatchGet(nullptr, &get, &resp).ok()) << "2 blocks x 2 runs = 4 <= 5";
  v1::GetItem* third = get.add_items();
  third->set_key(keys_[0]);
  third->mutable_block()->set_index(3);
  resp.Clear();
  grpc::Status s = capped.BatchGet(nullptr, &get, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("--store_max_request_slices=5"), std::string::npos)
      << s.error_message();
  v1::BatchPutRequest put;
  AddTestLayout(buf.id(), put.mutable_block_layout());
  for (uint64_t block : {1, 2, 3}) {
    v1::PutItem* item = put.add_items();
    item->set_key("capped-" + std::to_string(block));
    item->mutable_block()->set_index(block);
  }
  v1::BatchPutResponse put_resp;
  EXPECT_EQ(capped.BatchPut(nullptr, &put, &put_resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(put_resp.results_size(), 0);
}

}  // namespace
}  // namespace mc::client::testing
