// The master's capabilities (docs/security.md): owners get their own key at registration; every
// replica a lookup, put or promotion answers carries a capability for exactly its range, under the
// owner's key, expiring with the lease or the write deadline; nothing is granted without a lease.
#include "master/capability_minter.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/capability.h"
#include "master/grpc_service.h"
#include "proto/packed_lookups.h"
#include "tests/unit/master/master_test_util.h"

namespace mc::master {
namespace {

namespace v1 = mcstore::v1;
using auth::Denial;
using auth::Right;

class Capabilities : public ::testing::Test {
 protected:
  Capabilities()
      : keys_(*auth::ClusterKeys::FromSecrets({std::string(40, 's')})),
        minter_(keys_, m_.clock()),
        grpc_(m_.svc(), m_.metrics(), 1000) {
    grpc_.SetCapabilityMinter(&minter_);
  }
  // Registers through the RPC handler; returns a verifier holding the key it was given.
  std::unique_ptr<auth::CapabilityVerifier> Register(const std::string& id) {
    v1::RegisterClientRequest req;
    req.set_client_id(id);
    req.set_data_endpoint("10.0.0.1:" + std::to_string(id.size()));
    req.add_segments()->set_size(64 << 20);
    v1::RegisterClientResponse resp;
    EXPECT_TRUE(grpc_.DoRegisterClient(Caller{}, &req, &resp).ok());
    EXPECT_EQ(resp.capability_clock_ms(), static_cast<uint64_t>(m_.clock().NowMs()));
    auto verifier = std::make_unique<auth::CapabilityVerifier>(
        auth::CapabilityVerifierOptions{.clock_skew_ms = 0}, m_.clock());
    auto key = auth::UnwrapOwnerKey(*keys_, id, resp.capability_key());
    EXPECT_TRUE(key.ok()) << key.status();
    verifier->SetKey(key.ok() ? *key : "");
    verifier->SetMasterClock(static_cast<int64_t>(resp.capability_clock_ms()), m_.clock().NowMs());
    return verifier;
  }
  static Denial Check(const auth::CapabilityVerifier& v, const v1::Replica& r, Right right,
                      uint64_t offset, uint64_t length) {
    if (r.capability().size() != auth::kCapabilitySize) return Denial::kMalformed;
    return v.Check(reinterpret_cast<const uint8_t*>(r.capability().data()),
                   {right, r.segment_id(), offset, length});
  }
  v1::PutStartResponse PutStart(const std::string& client, const std::string& key) {
    v1::PutStartRequest req;
    req.set_client_id(client);
    auto* item = req.add_items();
    item->set_key(key);
    item->set_size(1000);
    v1::PutStartResponse resp;
    EXPECT_TRUE(grpc_.DoPutStart(Caller{}, &req, &resp).ok());
    return resp;
  }
  void PutEnd(const std::string& client, const std::string& key, uint64_t generation) {
    v1::PutEndRequest req;
    req.set_client_id(client);
    auto* item = req.add_items();
    item->set_key(key);
    item->set_generation(generation);
    item->set_checksum(1);
    v1::PutEndResponse resp;
    ASSERT_TRUE(grpc_.DoPutEnd(Caller{}, &req, &resp).ok());
    ASSERT_EQ(resp.results(0).code(), v1::OK);
  }
  v1::GetReplicasResponse Lookup(const std::string& key, bool packed, bool lease = true) {
    v1::GetReplicasRequest req;
    req.set_client_id("reader");
    req.add_keys(key);
    req.set_packed(packed);
    req.set_no_lease(!lease);
    v1::GetReplicasResponse resp;
    EXPECT_TRUE(grpc_.DoGetReplicas(Caller{}, &req, &resp).ok());
    return resp;
  }
  static v1::KeyReplicas Row(const v1::GetReplicasResponse& resp) {
    if (resp.has_packed()) {
      auto reader = PackedLookupsReader::Open(resp.packed());
      EXPECT_TRUE(reader.ok());
      v1::KeyReplicas row;
      if (reader.ok() && reader->rows() > 0) reader->Unpack(0, &row);
      return row;
    }
    return resp.results_size() > 0 ? resp.results(0) : v1::KeyReplicas();
  }

  testing::MasterFixture m_;
  auth::ClusterKeysPtr keys_;
  CapabilityMinter minter_;
  MasterGrpcService grpc_;
};

TEST_F(Capabilities, PutGrantsWriteOnExactlyThePendingRangeUntilTheWriteDeadline) {
  auto owner = Register("c1");
  v1::PutStartResponse put = PutStart("c1", "k");
  ASSERT_EQ(put.results(0).code(), v1::OK);
  const v1::Replica& r = put.results(0).replicas(0);
  EXPECT_EQ(Check(*owner, r, Right::kWrite, r.offset(), r.length()), Denial::kNone);
  EXPECT_EQ(Check(*owner, r, Right::kWrite, r.offset(), r.length() + 1), Denial::kOutOfRange);
  EXPECT_EQ(Check(*owner, r, Right::kRead, r.offset(), r.length()), Denial::kWrongOp);
  // A pending put is not readable: the lookup grants nothing for it.
  EXPECT_EQ(Row(Lookup("k", false)).replicas_size(), 0);
  m_.clock().AdvanceMs(static_cast<int64_t>(put.write_deadline_ms()) + 1);
  EXPECT_EQ(Check(*owner, r, Right::kWrite, r.offset(), r.length()), Denial::kExpired);
}

// Each WRITE grant of a batch names its own item's key, which the owner checks
// on INDEX notice entries (and PromoteStart's the same way, through the same path).
TEST_F(Capabilities, EachWriteGrantBindsItsItemsKey) {
  auto owner = Register("c1");
  v1::PutStartRequest req;
  req.set_client_id("c1");
  for (const char* key : {"first", "second"}) {
    auto* item = req.add_items();
    item->set_key(key);
    item->set_size(1000);
  }
  v1::PutStartResponse put;
  ASSERT_TRUE(grpc_.DoPutStart(Caller{}, &req, &put).ok());
  ASSERT_EQ(put.results_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const v1::Replica& r = put.results(i).replicas(0);
    const auto* cap = reinterpret_cast<const uint8_t*>(r.capability().data());
    const uint64_t gen = put.results(i).generation();
    EXPECT_EQ(owner->CheckIndexEntry(cap, r.segment_id(), r.offset(), r.length(), gen,
                                     req.items(i).key()),
              Denial::kNone);
    EXPECT_EQ(owner->CheckIndexEntry(cap, r.segment_id(), r.offset(), r.length(), gen,
                                     req.items(1 - i).key()),
              Denial::kWrongKey);
    EXPECT_EQ(owner->CheckIndexEntry(cap, r.segment_id(), r.offset(), r.length(), gen + 1,
                                     req.items(i).key()),
              Denial::kOutOfRange);
  }
}

TEST_F(Capabilities, LookupsGrantReadUntilTheLeaseEndsInBothAnswerForms) {
  auto owner = Register("c1");
  v1::PutStartResponse put = PutStart("c1", "k");
  PutEnd("c1", "k", put.results(0).generation());
  for (bool packed : {false, true}) {
    v1::GetReplicasResponse resp = Lookup("k", packed);
    v1::KeyReplicas row = Row(resp);
    ASSERT_EQ(row.replicas_size(), 1) << packed;
    const v1::Replica& r = row.replicas(0);
    EXPECT_EQ(Check(*owner, r, Right::kRead, r.offset(), r.length()), Denial::kNone);
    EXPECT_EQ(Check(*owner, r, Right::kRead, r.offset(), 64 << 20), Denial::kOutOfRange);
    EXPECT_EQ(Check(*owner, r, Right::kWrite, r.offset(), r.length()), Denial::kWrongOp);
    auto cap = auth::DecodeCapability(reinterpret_cast<const uint8_t*>(r.capability().data()),
                                      r.capability().size());
    ASSERT_TRUE(cap.ok());
    EXPECT_EQ(cap->expiry_ms, m_.clock().NowMs() + static_cast<int64_t>(resp.lease_ttl_ms()));
  }
  // Unleased lookups (Exist-like) grant nothing.
  EXPECT_TRUE(Row(Lookup("k", false, /*lease=*/false)).replicas(0).capability().empty());
}

// A fleet's lookup answers keys of many owners, interleaved: each replica's capability is under
// its own owner's key, however often the owner changes from one row to the next, as records or
// as columns. Columns name each row's owner by index: answers built one after the other on one
// thread (owners met in another order each time) each index their own owners.
TEST_F(Capabilities, ABatchOverManyOwnersGrantsEachReplicaUnderItsOwnersKey) {
  std::vector<std::unique_ptr<auth::CapabilityVerifier>> owners;
  std::vector<std::string> keys;
  for (int round = 0; round < 2; ++round) {
    for (int c = 0; c < 3; ++c) {
      const std::string id = "c" + std::to_string(c);
      if (round == 0) owners.push_back(Register(id));
      const std::string key = "k" + std::to_string(round) + id;
      v1::PutStartResponse put = PutStart(id, key);
      PutEnd(id, key, put.results(0).generation());
      keys.push_back(key);
    }
  }
  for (bool packed : {false, true}) {
    for (int order = 0; order < 3; ++order) {
      v1::GetReplicasRequest req;
      req.set_client_id("reader");
      req.set_packed(packed);
      std::vector<int> rows_owner;  // the owner of each requested key, in request order
      for (int i = 0; i < 6; ++i) {
        const int k = order == 0 ? i : order == 1 ? 5 - i : (i * 5) % 6;
        req.add_keys(keys[static_cast<size_t>(k)]);
        rows_owner.push_back(k % 3);
      }
      v1::GetReplicasResponse resp;
      ASSERT_TRUE(grpc_.DoGetReplicas(Caller{}, &req, &resp).ok());
      std::vector<v1::KeyReplicas> rows;
      if (packed) {
        ASSERT_TRUE(resp.has_packed());
        auto reader = PackedLookupsReader::Open(resp.packed());
        ASSERT_TRUE(reader.ok()) << reader.status();
        EXPECT_EQ(resp.packed().client_ids_size(), 3) << "each owner listed once";
        for (size_t row = 0; row < reader->rows(); ++row) reader->Unpack(row, &rows.emplace_back());
      } else {
        rows.assign(resp.results().begin(), resp.results().end());
      }
      ASSERT_EQ(rows.size(), 6u);
      for (size_t row = 0; row < 6; ++row) {
        SCOPED_TRACE(::testing::Message()
                     << "packed " << packed << ", order " << order << ", row " << row);
        ASSERT_EQ(rows[row].replicas_size(), 1);
        const v1::Replica& r = rows[row].replicas(0);
        const int owner = rows_owner[row];
        ASSERT_EQ(r.client_id(), "c" + std::to_string(owner));
        EXPECT_EQ(r.data_endpoint(), "10.0.0.1:2") << "as Register() names it";
        EXPECT_EQ(
            Check(*owners[static_cast<size_t>(owner)], r, Right::kRead, r.offset(), r.length()),
            Denial::kNone);
        EXPECT_EQ(Check(*owners[static_cast<size_t>((owner + 1) % 3)], r, Right::kRead, r.offset(),
                        r.length()),
                  Denial::kBadMac);
      }
    }
  }
}

// A daemon reads the replicas it holds itself directly (local copy, its own SSD tier), so a
// lookup it asks grants those nothing; another holder's replicas in the same answer are granted
// as before, and another asker (or none named) gets the asker's replicas granted.
TEST_F(Capabilities, ALookupGrantsNothingForTheAskersOwnReplicas) {
  auto c1 = Register("c1");
  auto c2 = Register("c2");
  for (const auto& [id, key] : {std::pair{"c1", "mine"}, std::pair{"c2", "theirs"}}) {
    v1::PutStartResponse put = PutStart(id, key);
    PutEnd(id, key, put.results(0).generation());
  }
  auto client = [](const char* id, uint64_t session) {
    Caller c;
    c.kind = Caller::Kind::kClient;
    c.client_id = id;
    c.session = session;
    return c;
  };
  const Caller as_c1 = client("c1", 7), as_c2 = client("c2", 8);
  const std::vector<const Caller*> askers = {&as_c1, &as_c2, nullptr};
  for (bool packed : {false, true}) {
    for (const Caller* asker : askers) {
      SCOPED_TRACE(::testing::Message()
                   << "packed " << packed << ", asker " << (asker ? asker->client_id : "none"));
      v1::GetReplicasRequest req;
      req.set_client_id(asker ? asker->client_id : "reader");
      req.set_packed(packed);
      req.add_keys("mine");
      req.add_keys("theirs");
      v1::GetReplicasResponse resp;
      ASSERT_TRUE(grpc_.DoGetReplicas(asker ? *asker : Caller{}, &req, &resp).ok());
      std::vector<v1::KeyReplicas> rows;
      if (packed) {
        auto reader = PackedLookupsReader::Open(resp.packed());
        ASSERT_TRUE(reader.ok()) << reader.status();
        for (size_t row = 0; row < reader->rows(); ++row) reader->Unpack(row, &rows.emplace_back());
      } else {
        rows.assign(resp.results().begin(), resp.results().end());
      }
      ASSERT_EQ(rows.size(), 2u);
      const auth::CapabilityVerifier* holder[] = {c1.get(), c2.get()};
      for (size_t row = 0; row < 2; ++row) {
        ASSERT_EQ(rows[row].replicas_size(), 1);
        const v1::Replica& r = rows[row].replicas(0);
        ASSERT_EQ(r.client_id(), row == 0 ? "c1" : "c2");
        EXPECT_GT(r.length(), 0u) << "the range is answered either way";
        if (asker != nullptr && r.client_id() == asker->client_id) {
          EXPECT_TRUE(r.capability().empty()) << "row " << row;
        } else {
          EXPECT_EQ(Check(*holder[row], r, Right::kRead, r.offset(), r.length()), Denial::kNone)
              << "row " << row;
        }
      }
    }
  }
}

TEST_F(Capabilities, AnotherMembersKeyVerifiesNoneOfThem) {
  auto owner = Register("c1");
  auto other = Register("c2");
  v1::PutStartResponse put = PutStart("c1", "k");
  const v1::Replica& r = put.results(0).replicas(0);
  ASSERT_EQ(r.client_id(), "c1");
  EXPECT_EQ(Check(*other, r, Right::kWrite, r.offset(), r.length()), Denial::kBadMac);
  // Re-registration (a new session) gives a new key: old grants die with the old session.
  auto again = Register("c1");
  EXPECT_EQ(Check(*again, r, Right::kWrite, r.offset(), r.length()), Denial::kBadMac);
}

// The owner keys are a snapshot per answer: an answer begun after a Forget mints nothing for that
// owner, one begun after a re-registration mints under the new key, and an answer already begun
// keeps the keys it started with (its capabilities die with the old session's key). The same for
// replicas as the table stores them, whose owner keys a batch keeps per holder in a table per
// thread: batches of both snapshots alive at once on one thread each keep their own.
TEST(CapabilityMinter, EachAnswerMintsUnderTheOwnerKeysOfItsStart) {
  for (bool stored : {false, true}) {
    SCOPED_TRACE(stored ? "stored replicas" : "replicas");
    FakeClock clock;
    auth::ClusterKeysPtr keys = *auth::ClusterKeys::FromSecrets({std::string(40, 's')});
    CapabilityMinter minter(keys, clock);
    auto owner_key = [&](const std::string& wrapped) {
      auto key = auth::UnwrapOwnerKey(*keys, "c1", wrapped);
      EXPECT_TRUE(key.ok());
      return auth::OwnerKey(key.ok() ? *key : "");
    };
    const auth::OwnerKey first = owner_key(minter.Register("c1", 1));
    minter.Register("c2", 1);
    const Replica replica{ReplicaTier::kMemory, MemoryLocation{"c1", "e", 5, 0, 100, 1}};
    const Replica other{ReplicaTier::kMemory, MemoryLocation{"c2", "e", 6, 0, 100, 1}};
    auth::CapabilityBytes cap;
    auto mint = [&](CapabilityMinter::Batch& batch, const Replica& r, const char* key) {
      return stored ? batch.Mint(StoredReplica::Of(r), Right::kRead, 1, key, 1000, cap)
                    : batch.Mint(r, Right::kRead, 1, key, 1000, cap);
    };
    CapabilityMinter::Batch before(minter);
    ASSERT_TRUE(mint(before, replica, "k"));
    EXPECT_TRUE(auth::CapabilityMacValid(first, cap.data()));
    minter.Forget("c1");
    minter.Forget("absent");  // forgetting an unknown owner changes nothing
    CapabilityMinter::Batch after_forget(minter);
    EXPECT_FALSE(mint(after_forget, replica, "k"));
    EXPECT_FALSE(mint(after_forget, replica, "k")) << "asked again";
    EXPECT_TRUE(mint(after_forget, other, "k2")) << "c2 is kept";
    const auth::OwnerKey second = owner_key(minter.Register("c1", 2));
    CapabilityMinter::Batch after_register(minter);
    ASSERT_TRUE(mint(after_register, replica, "k"));
    EXPECT_TRUE(auth::CapabilityMacValid(second, cap.data()));
    EXPECT_FALSE(auth::CapabilityMacValid(first, cap.data()));
    ASSERT_TRUE(mint(before, replica, "k"));
    EXPECT_TRUE(auth::CapabilityMacValid(first, cap.data())) << "the older answer's snapshot";
    EXPECT_FALSE(auth::CapabilityMacValid(second, cap.data()));
    EXPECT_FALSE(mint(after_forget, replica, "k")) << "still the snapshot without c1";
    ASSERT_TRUE(mint(after_register, replica, "k"));
    EXPECT_TRUE(auth::CapabilityMacValid(second, cap.data()));
  }
}

TEST_F(Capabilities, WithoutAMinterNothingIsGranted) {
  MasterGrpcService plain(m_.svc(), m_.metrics(), 1000);
  v1::RegisterClientRequest req;
  req.set_client_id("c1");
  req.set_data_endpoint("10.0.0.1:1");
  req.add_segments()->set_size(64 << 20);
  v1::RegisterClientResponse resp;
  ASSERT_TRUE(plain.DoRegisterClient(Caller{}, &req, &resp).ok());
  EXPECT_TRUE(resp.capability_key().empty());
  v1::PutStartRequest put;
  put.set_client_id("c1");
  put.add_items()->set_key("k");
  put.mutable_items(0)->set_size(100);
  v1::PutStartResponse placed;
  ASSERT_TRUE(plain.DoPutStart(Caller{}, &put, &placed).ok());
  ASSERT_EQ(placed.results(0).code(), v1::OK);
  EXPECT_TRUE(placed.results(0).replicas(0).capability().empty());
}

}  // namespace
}  // namespace mc::master
