// PackedLookups: rows written by PackedLookupsWriter unpack to the records they came from, and a
// reader refuses columns that disagree instead of reading past them.
#include "proto/packed_lookups.h"

#include <google/protobuf/util/message_differencer.h>

#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"

namespace mc {
namespace {

namespace v1 = mcstore::v1;

v1::KeyReplicas Record(v1::Code code, uint64_t size, int replicas, const std::string& owner = "") {
  v1::KeyReplicas r;
  r.set_code(code);
  if (code != v1::OK) r.set_message("no such key");
  r.set_size(size);
  r.set_checksum(0xfedcba9876543210ull ^ size);
  r.set_generation(1000 + size);
  for (int i = 0; i < replicas; ++i) {
    v1::Replica* rep = r.add_replicas();
    rep->set_tier(i == 0 ? v1::MEMORY : v1::DISK);
    const std::string id = owner.empty() ? "client-" + std::to_string(i) : owner;
    rep->set_client_id(id);
    rep->set_data_endpoint("10.0.0." + id.substr(id.size() - 1) + ":7000");
    rep->set_segment_id(3 + i);
    rep->set_offset(size * 4096 + i);
    rep->set_length(size);
  }
  return r;
}

// Rows of every shape (no replica, one, several, an error row) round-trip.
std::vector<v1::KeyReplicas> Records() {
  return {Record(v1::OK, 10, 1), Record(v1::OK, 20, 3), Record(v1::OK, 30, 0),
          Record(v1::OK, 40, 1, "client-7"), Record(v1::NOT_FOUND, 0, 0)};
}

v1::PackedLookups Pack(const std::vector<v1::KeyReplicas>& records) {
  v1::PackedLookups packed;
  PackedLookupsWriter writer(&packed, records.size());
  for (const auto& r : records) writer.AddRow(r);
  return packed;
}

TEST(PackedKeys, ARequestsKeysReadTheSameEitherWay) {
  const std::vector<std::string> keys = {"alpha", "", "a-much-longer-key-of-forty-bytes-or-so!!",
                                         "z"};
  v1::GetReplicasRequest one_by_one;
  v1::GetReplicasRequest packed;
  for (const auto& k : keys) {
    one_by_one.add_keys(k);
    AppendPackedKey(k, packed.mutable_packed_keys(), packed.mutable_packed_key_sizes());
  }
  for (const auto* req : {&one_by_one, &packed}) {
    auto got = RequestKeys(*req);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(std::vector<std::string>(got->begin(), got->end()), keys);
  }
  EXPECT_TRUE(RequestKeys(v1::GetReplicasRequest())->empty());
}

TEST(PackedKeys, SizesThatDoNotFitOrBothFormsAreRefused) {
  v1::GetReplicasRequest base;
  AppendPackedKey("abc", base.mutable_packed_keys(), base.mutable_packed_key_sizes());
  AppendPackedKey("de", base.mutable_packed_keys(), base.mutable_packed_key_sizes());
  v1::GetReplicasRequest both = base;
  both.add_keys("f");
  v1::GetReplicasRequest too_short = base;
  too_short.set_packed_key_sizes(1, 1);  // a byte left over
  v1::GetReplicasRequest too_long = base;
  too_long.set_packed_key_sizes(1, 3);  // past the end
  v1::GetReplicasRequest huge = base;
  huge.set_packed_key_sizes(0, UINT32_MAX);  // must not wrap around
  v1::GetReplicasRequest bytes_only;
  bytes_only.set_packed_keys("abc");  // no sizes: the bytes are not accounted for
  for (const auto* req : {&both, &too_short, &too_long, &huge, &bytes_only}) {
    auto got = RequestKeys(*req);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(ToCode(got.status()), Code::kInvalidArgument) << got.status();
  }
}

// A release's keys packed (as a lookup carries them) and named one by one again (for a master
// that does not read them) come back as they were; malformed packed keys are refused untouched.
TEST(PackedKeys, PackingARequestsKeysAndUndoingItKeepsThem) {
  const std::vector<std::string> keys = {"alpha", "", "a-much-longer-key-of-forty-bytes-or-so!!",
                                         "z"};
  v1::ReleaseLeasesRequest release;
  release.set_lease_id(7);
  for (const auto& k : keys) release.add_keys(k);
  PackRequestKeys(&release);
  EXPECT_EQ(release.keys_size(), 0);
  EXPECT_EQ(release.packed_key_sizes_size(), 4);
  auto packed = RequestKeys(release);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(std::vector<std::string>(packed->begin(), packed->end()), keys);
  PackRequestKeys(&release);  // already packed: left as is
  EXPECT_EQ(release.packed_key_sizes_size(), 4);
  ASSERT_TRUE(NameRequestKeysOneByOne(&release).ok());
  EXPECT_TRUE(release.packed_keys().empty());
  EXPECT_EQ(release.packed_key_sizes_size(), 0);
  EXPECT_EQ(std::vector<std::string>(release.keys().begin(), release.keys().end()), keys);
  EXPECT_EQ(release.lease_id(), 7u);
  ASSERT_TRUE(NameRequestKeysOneByOne(&release).ok());  // already one by one: left as is
  EXPECT_EQ(release.keys_size(), 4);

  v1::ReleaseLeasesRequest cut;
  AppendPackedKey("abc", cut.mutable_packed_keys(), cut.mutable_packed_key_sizes());
  cut.set_packed_key_sizes(0, 4);  // past the end
  const v1::ReleaseLeasesRequest before = cut;
  EXPECT_EQ(ToCode(NameRequestKeysOneByOne(&cut)), Code::kInvalidArgument);
  EXPECT_EQ(cut.SerializeAsString(), before.SerializeAsString()) << "left unchanged";
}

TEST(PackedLookups, RowsUnpackToTheRecordsTheyWereWrittenFrom) {
  const auto records = Records();
  const v1::PackedLookups packed = Pack(records);
  auto reader = PackedLookupsReader::Open(packed);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(reader->rows(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    v1::KeyReplicas out;
    reader->Unpack(i, &out);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(out, records[i]))
        << "row " << i << ": " << out.ShortDebugString() << " vs " << records[i].ShortDebugString();
  }
}

TEST(PackedLookups, EachOwnerIsWrittenOnce) {
  const v1::PackedLookups packed = Pack(Records());
  // client-0, client-1, client-2 and client-7, whatever the number of replicas naming them.
  EXPECT_EQ(packed.client_ids_size(), 4);
  EXPECT_EQ(packed.data_endpoints_size(), 4);
  EXPECT_EQ(packed.owners_size(), 5);
  // Only the error row carries a message.
  EXPECT_EQ(packed.messages_size(), 1);
  EXPECT_EQ(packed.messages().at(4), "no such key");
}

TEST(PackedLookups, AWriterAppendsToRowsAlreadyThere) {
  const auto records = Records();
  v1::PackedLookups packed = Pack({records[0], records[1]});
  PackedLookupsWriter more(&packed);
  more.AddRow(records[3]);
  more.AddRow(records[0]);
  EXPECT_EQ(packed.client_ids_size(), 4) << "client-0 is reused, client-7 is new";
  auto reader = PackedLookupsReader::Open(packed);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(reader->rows(), 4u);
  v1::KeyReplicas out;
  reader->Unpack(3, &out);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(out, records[0]));
}

// AddOwner appends a column without looking among those there (its caller indexes owners
// itself): replicas named by its indices read back with their owner, a repeat is a second column
// with the same names that reads the same, and Owner() may add such an owner again.
TEST(PackedLookups, OwnersAddedByIndexReadBackAsTheirReplicasOwners) {
  v1::PackedLookups packed;
  PackedLookupsWriter writer(&packed);
  const uint32_t a = writer.AddOwner("client-a", "10.0.0.1:7000");
  const uint32_t b = writer.AddOwner("client-b", "10.0.0.2:7000");
  const uint32_t a_again = writer.AddOwner("client-a", "10.0.0.1:7000");
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 1u);
  EXPECT_EQ(a_again, 2u);
  writer.AddRow(v1::OK, "", 10, 1, 1);
  writer.AddReplica(v1::MEMORY, b, 1, 0, 10);
  writer.AddReplica(v1::MEMORY, a, 2, 0, 10);
  writer.AddRow(v1::OK, "", 20, 2, 2);
  writer.AddReplica(v1::MEMORY, a_again, 3, 0, 20);
  writer.AddReplica(v1::MEMORY, writer.Owner("client-b", "10.0.0.2:7000"), 4, 0, 20);
  EXPECT_EQ(packed.client_ids_size(), 4) << "Owner() does not look among AddOwner's columns";
  auto reader = PackedLookupsReader::Open(packed);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(reader->rows(), 2u);
  v1::KeyReplicas first, second;
  reader->Unpack(0, &first);
  reader->Unpack(1, &second);
  ASSERT_EQ(first.replicas_size(), 2);
  ASSERT_EQ(second.replicas_size(), 2);
  EXPECT_EQ(first.replicas(0).client_id(), "client-b");
  EXPECT_EQ(first.replicas(0).data_endpoint(), "10.0.0.2:7000");
  EXPECT_EQ(first.replicas(1).client_id(), "client-a");
  EXPECT_EQ(second.replicas(0).client_id(), "client-a");
  EXPECT_EQ(second.replicas(0).data_endpoint(), "10.0.0.1:7000");
  EXPECT_EQ(second.replicas(1).client_id(), "client-b");
  EXPECT_EQ(second.replicas(1).segment_id(), 4u);
}

TEST(PackedLookups, AnEmptyAnswerHasNoRows) {
  v1::PackedLookups empty;
  auto reader = PackedLookupsReader::Open(empty);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->rows(), 0u);
}

// Each way the columns can disagree is refused (INTERNAL), never read.
TEST(PackedLookups, ColumnsThatDisagreeAreRefused) {
  const v1::PackedLookups good = Pack(Records());
  struct Case {
    const char* name;
    void (*spoil)(v1::PackedLookups*);
  };
  const std::vector<Case> cases = {
      {"a row column is short", [](v1::PackedLookups* p) { p->mutable_sizes()->RemoveLast(); }},
      {"a checksum too many", [](v1::PackedLookups* p) { p->add_checksums(1); }},
      {"replica counts exceed the replicas",
       [](v1::PackedLookups* p) { p->set_replica_counts(0, p->replica_counts(0) + 1); }},
      {"a replica column is short",
       [](v1::PackedLookups* p) { p->mutable_offsets()->RemoveLast(); }},
      {"a replica without a count",
       [](v1::PackedLookups* p) {
         p->add_tiers(v1::MEMORY);
         p->add_owners(0);
         p->add_segment_ids(1);
         p->add_offsets(0);
         p->add_lengths(1);
       }},
      {"an owner past the clients", [](v1::PackedLookups* p) { p->set_owners(0, 4); }},
      {"an endpoint missing",
       [](v1::PackedLookups* p) { p->mutable_data_endpoints()->RemoveLast(); }},
      {"a message for no row", [](v1::PackedLookups* p) { (*p->mutable_messages())[5] = "x"; }},
  };
  for (const Case& c : cases) {
    v1::PackedLookups bad = good;
    c.spoil(&bad);
    auto reader = PackedLookupsReader::Open(bad);
    ASSERT_FALSE(reader.ok()) << c.name;
    EXPECT_EQ(ToCode(reader.status()), Code::kInternal) << c.name;
    EXPECT_NE(reader.status().message().find("malformed packed lookups"), absl::string_view::npos)
        << reader.status();
  }
}

// Seeded random damage to a valid answer, on the wire (bytes replaced, cut short) and in its
// columns (entries dropped or added, counts and owners changed): whatever the reader accepts, it
// must be able to unpack every row of without reading out of bounds (ASan builds check that).
TEST(PackedLookups, DamagedAnswersAreRefusedOrReadSafely) {
  const v1::PackedLookups good = Pack(Records());
  std::string wire;
  ASSERT_TRUE(good.SerializeToString(&wire));
  std::mt19937_64 rng(20261130);
  int accepted = 0;
  int refused = 0;
  for (int round = 0; round < 20'000; ++round) {
    v1::PackedLookups damaged;
    if (round % 2 == 0) {
      std::string bytes = wire;
      for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i) {
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
      }
      if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
      if (!damaged.ParseFromString(bytes)) continue;
    } else {
      damaged = good;
      switch (rng() % 6) {
        case 0:
          damaged.set_replica_counts(static_cast<int>(rng() % 5), static_cast<uint32_t>(rng() % 8));
          break;
        case 1:
          damaged.set_owners(static_cast<int>(rng() % 5), static_cast<uint32_t>(rng() % 8));
          break;
        case 2:
          damaged.mutable_tiers()->RemoveLast();
          break;
        case 3:
          damaged.add_codes(v1::OK);
          break;
        case 4:
          damaged.mutable_client_ids()->RemoveLast();
          break;
        default:
          (*damaged.mutable_messages())[static_cast<uint32_t>(rng() % 8)] = "x";
          break;
      }
    }
    auto reader = PackedLookupsReader::Open(damaged);
    if (!reader.ok()) {
      ++refused;
      continue;
    }
    ++accepted;
    for (size_t row = 0; row < reader->rows(); ++row) {
      v1::KeyReplicas out;
      reader->Unpack(row, &out);
      EXPECT_LE(out.replicas_size(), damaged.tiers_size());
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace mc

namespace mc {
namespace {

// Capabilities ride in their own column, one per replica once any replica has one; rows
// before the first one unpack with none.
TEST(PackedLookups, CapabilitiesRoundTripPerReplica) {
  std::vector<v1::KeyReplicas> records = {Record(v1::OK, 10, 1), Record(v1::OK, 20, 2),
                                          Record(v1::NOT_FOUND, 0, 0), Record(v1::OK, 30, 1)};
  records[1].mutable_replicas(0)->set_capability(std::string(64, 'a'));
  records[1].mutable_replicas(1)->set_capability(std::string(64, 'b'));
  records[3].mutable_replicas(0)->set_capability(std::string(64, 'c'));
  const v1::PackedLookups packed = Pack(records);
  EXPECT_EQ(packed.capabilities().size(), 4 * kPackedCapabilitySize);
  auto reader = PackedLookupsReader::Open(packed);
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (size_t i = 0; i < records.size(); ++i) {
    v1::KeyReplicas out;
    reader->Unpack(i, &out);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(out, records[i])) << i;
  }
  // Without any, the column stays empty.
  EXPECT_TRUE(Pack(Records()).capabilities().empty());
  // A column of the wrong length is refused.
  v1::PackedLookups bad = packed;
  bad.mutable_capabilities()->push_back('x');
  EXPECT_FALSE(PackedLookupsReader::Open(bad).ok());
}

}  // namespace
}  // namespace mc
