#include "offload/disk_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include "common/checksum.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "offload/record_format.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fault_io_engine.h"
#include "tests/unit/offload/offload_test_util.h"

namespace mc::offload {
namespace {

using testing_util::Get;
using testing_util::OpenTier;
using testing_util::RandomBytes;
using testing_util::TempDir;

constexpr uint64_t kMiB = 1 << 20;

class DiskTierTest : public ::testing::Test {
 protected:
  DiskTierOptions Options(uint64_t capacity = 64 * kMiB, int files = 4) {
    DiskTierOptions o;
    o.dir = dir_.path() + "/tier";
    o.capacity = capacity;
    o.num_files = files;
    o.metrics = &metrics_;
    o.clock = &clock_;
    return o;
  }
  static absl::StatusOr<RecordRef> Put(DiskTier& t, std::string_view key, uint64_t gen,
                                       const std::string& data) {
    return t.Write(key, gen, {{data.data(), data.size()}});
  }
  // Path of the data file holding `ref`, and the byte offset of its record in it.
  std::string FileOf(RecordRef ref) const {
    char name[32];
    std::snprintf(name, sizeof(name), "/tier/data-%03d.mcs", static_cast<int>(ref.locator >> 48));
    return dir_.path() + name;
  }
  static uint64_t OffsetOf(RecordRef ref) { return ref.locator & ((uint64_t{1} << 48) - 1); }
  static void FlipByte(const std::string& path, uint64_t offset) {
    int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
    c ^= 0x20;
    ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
    ::close(fd);
  }

  TempDir dir_;
  MetricsRegistry metrics_;
  FakeClock clock_;
};

TEST_F(DiskTierTest, RoundTripOfPayloadsFromOneByteTo8MiBInPieces) {
  auto tier = OpenTier(Options());
  uint64_t gen = 1;
  for (uint64_t size : {uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{4097},
                        uint64_t{100'000}, kMiB, 8 * kMiB}) {
    const std::string data = RandomBytes(size, size);
    const std::string key = "key-" + std::to_string(size);
    // Three unaligned source pieces (one may be empty).
    const uint64_t a = size / 3, b = size / 2;
    auto ref = tier->Write(
        key, gen, {{data.data(), a}, {data.data() + a, b - a}, {data.data() + b, size - b}});
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(ref->length, size);
    std::string out(size + 3, '\0');
    uint64_t checksum = 0;
    ASSERT_TRUE(
        tier->Read(*ref, key, gen,
                   {{out.data() + 1, size / 2}, {out.data() + 1 + size / 2, size - size / 2}},
                   &checksum)
            .ok());
    EXPECT_EQ(out.substr(1, size), data) << size;
    EXPECT_EQ(checksum, Checksum(data)) << "the XXH3 of what landed in the destination";
    ++gen;
  }
  const auto stats = tier->GetStats();
  EXPECT_EQ(stats.records, 7u);
  EXPECT_EQ(stats.writes, 7u);
  EXPECT_EQ(stats.reads, 7u);
  EXPECT_GT(stats.used, 9 * kMiB);
  EXPECT_EQ(metrics_.GetCounter("mc_ssd_writes_total", "").Value(), 7u);
  EXPECT_EQ(metrics_.GetCounter("mc_ssd_reads_total", "").Value(), 7u);
  EXPECT_EQ(metrics_.GetGauge("mc_ssd_used_bytes", "").Value(), static_cast<int64_t>(stats.used));
  EXPECT_EQ(metrics_.GetGauge("mc_ssd_capacity_bytes", "").Value(),
            64 * static_cast<int64_t>(kMiB));
}

TEST_F(DiskTierTest, ReadChecksSizeKeyGenerationAndRef) {
  auto tier = OpenTier(Options());
  const std::string data = RandomBytes(10'000, 1);
  auto ref = Put(*tier, "k", 3, data);
  ASSERT_TRUE(ref.ok());
  std::string out(9'999, '\0');
  EXPECT_EQ(ToCode(tier->Read(*ref, "k", 3, {{out.data(), out.size()}})), Code::kSizeMismatch);
  EXPECT_EQ(ToCode(Get(*tier, *ref, "k", 4, &out)), Code::kNotFound);
  EXPECT_EQ(ToCode(Get(*tier, *ref, "other", 3, &out)), Code::kNotFound);
  RecordRef moved = *ref;
  moved.locator += kPageSize;
  EXPECT_EQ(ToCode(Get(*tier, moved, "k", 3, &out)), Code::kNotFound);
  EXPECT_EQ(ToCode(tier->Write(std::string(kMaxKeyBytes + 1, 'k'), 1, {}).status()),
            Code::kInvalidArgument);
}

TEST_F(DiskTierTest, WriteWithExpectedChecksumPersistsOnlyMatchingBytes) {
  const std::string data = RandomBytes(3 * kMiB + 123, 9);
  const uint64_t sum = Checksum(data.data(), data.size());
  {
    auto tier = OpenTier(Options());
    std::string changed = data;
    changed[2 * kMiB] ^= 1;  // the bytes changed under the writer
    EXPECT_EQ(ToCode(tier->Write("k", 1, {{changed.data(), changed.size()}}, sum).status()),
              Code::kChecksumMismatch);
    EXPECT_TRUE(tier->List().empty());
    EXPECT_EQ(tier->GetStats().write_failures, 0u);
    EXPECT_EQ(tier->GetStats().used, 0u) << "the extent is given back";
    auto ref = tier->Write("k", 1, {{data.data(), data.size()}}, sum);
    ASSERT_TRUE(ref.ok()) << ref.status();
    std::string out;
    ASSERT_TRUE(Get(*tier, *ref, "k", 1, &out).ok());
    EXPECT_EQ(out, data);
  }
  auto tier = OpenTier(Options());  // the refused write left no record behind
  ASSERT_EQ(tier->List().size(), 1u);
  EXPECT_EQ(tier->List()[0].checksum, sum);
}

TEST_F(DiskTierTest, RecordsPersistAcrossCloseAndReopen) {
  std::vector<std::pair<RecordRef, std::string>> written;
  {
    auto tier = OpenTier(Options());
    for (int i = 0; i < 20; ++i) {
      std::string data = RandomBytes(1000 + i * 7919, i);
      auto ref = Put(*tier, "key" + std::to_string(i), 100 + i, data);
      ASSERT_TRUE(ref.ok());
      written.emplace_back(*ref, std::move(data));
    }
  }
  auto tier = OpenTier(Options());
  auto stats = tier->GetStats();
  EXPECT_EQ(stats.records_recovered, 20u);
  EXPECT_EQ(stats.records_skipped_corrupt, 0u);
  EXPECT_EQ(tier->List().size(), 20u);
  for (int i = 0; i < 20; ++i) {
    std::string out;
    ASSERT_TRUE(Get(*tier, written[i].first, "key" + std::to_string(i), 100 + i, &out).ok());
    EXPECT_EQ(out, written[i].second);
  }
  // Rewriting a recovered record is a no-op that returns the same ref.
  auto again = Put(*tier, "key3", 103, written[3].second);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, written[3].first);
  EXPECT_EQ(tier->GetStats().writes, 0u);
  EXPECT_EQ(metrics_.GetCounter("mc_ssd_records_recovered_total", "").Value(), 20u);
}

TEST_F(DiskTierTest, FlippedByteIsChecksumMismatchForThatRecordOnly) {
  auto tier = OpenTier(Options());
  std::vector<RecordRef> refs;
  std::vector<std::string> data;
  for (int i = 0; i < 4; ++i) {
    data.push_back(RandomBytes(50'000, i));
    refs.push_back(*Put(*tier, "k" + std::to_string(i), 1, data.back()));
  }
  FlipByte(FileOf(refs[1]), OffsetOf(refs[1]) + kPageSize + 12'345);  // payload of k1
  FlipByte(FileOf(refs[2]), OffsetOf(refs[2]) + kFixedHeaderSize);    // key byte of k2
  std::string out;
  EXPECT_EQ(ToCode(Get(*tier, refs[1], "k1", 1, &out)), Code::kChecksumMismatch);
  EXPECT_EQ(ToCode(Get(*tier, refs[2], "k2", 1, &out)), Code::kChecksumMismatch);
  for (int i : {0, 3}) {
    ASSERT_TRUE(Get(*tier, refs[i], "k" + std::to_string(i), 1, &out).ok());
    EXPECT_EQ(out, data[i]);
  }
  EXPECT_EQ(tier->GetStats().checksum_mismatches, 2u);
  EXPECT_EQ(metrics_.GetCounter("mc_ssd_checksum_mismatches_total", "").Value(), 2u);
  tier.reset();
  tier = OpenTier(Options());
  EXPECT_EQ(tier->GetStats().records_recovered, 2u);
  EXPECT_EQ(tier->GetStats().records_skipped_corrupt, 2u);
}

TEST_F(DiskTierTest, TruncatedDataFileSkipsAffectedRecordsAtReopen) {
  RecordRef a, b;
  const std::string da = RandomBytes(10'000, 1), db = RandomBytes(200'000, 2);
  {
    auto tier = OpenTier(Options(8 * kMiB, 1));
    a = *Put(*tier, "a", 1, da);
    b = *Put(*tier, "b", 1, db);
    ASSERT_TRUE(Put(*tier, "c", 1, RandomBytes(30'000, 3)).ok());
  }
  ASSERT_EQ(::truncate(FileOf(b).c_str(), static_cast<off_t>(OffsetOf(b) + 100'000)), 0);
  auto tier = OpenTier(Options(8 * kMiB, 1));
  const auto stats = tier->GetStats();
  EXPECT_EQ(stats.records_recovered, 1u);
  EXPECT_GE(stats.records_skipped_corrupt, 1u);
  EXPECT_EQ(metrics_.GetCounter("mc_ssd_records_skipped_total", "").Value(),
            stats.records_skipped_corrupt);
  auto list = tier->List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].key, "a");
  std::string out;
  ASSERT_TRUE(Get(*tier, a, "a", 1, &out).ok());
  EXPECT_EQ(out, da);
  EXPECT_EQ(ToCode(Get(*tier, b, "b", 1, &out)), Code::kNotFound);
  // The space of the lost records is reusable.
  EXPECT_TRUE(Put(*tier, "b", 2, db).ok());
}

TEST_F(DiskTierTest, TinyCapacityReportsNoSpaceWithoutLosingRecords) {
  auto tier = OpenTier(Options(64 * 1024, 1));
  const std::string da = RandomBytes(20'000, 1);
  auto a = Put(*tier, "a", 1, da);
  ASSERT_TRUE(a.ok());
  tier->Pin("a", 1);
  EXPECT_EQ(ToCode(Put(*tier, "b", 1, RandomBytes(40'000, 2)).status()), Code::kNoSpace);
  tier->Unpin("a", 1);
  EXPECT_EQ(ToCode(Put(*tier, "huge", 1, RandomBytes(kMiB, 3)).status()), Code::kNoSpace);
  std::string out;
  ASSERT_TRUE(Get(*tier, *a, "a", 1, &out).ok());
  EXPECT_EQ(out, da);
  EXPECT_TRUE(tier->TakeEvicted().empty());
  EXPECT_EQ(tier->GetStats().records, 1u);
  EXPECT_GE(metrics_.GetCounter("mc_ssd_failures_total", "", {{"reason", "no_space"}}).Value(), 2u);
}

TEST_F(DiskTierTest, DuplicateWritesFromEightThreadsMakeOneRecord) {
  auto tier = OpenTier(Options());
  const std::string data = RandomBytes(3 * kMiB, 9);
  std::vector<absl::StatusOr<RecordRef>> refs(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] { refs[t] = Put(*tier, "dup", 7, data); });
  }
  for (auto& th : threads) th.join();
  for (const auto& r : refs) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, *refs[0]);
  }
  EXPECT_EQ(tier->List().size(), 1u);
  EXPECT_EQ(tier->GetStats().writes, 1u);
  EXPECT_EQ(tier->GetStats().used, RecordSize(3, data.size()));
}

TEST_F(DiskTierTest, PinnedRecordIsNotEvictedWhileUnpinnedOnesAre) {
  DiskTierOptions o = Options(kMiB, 1);
  o.high_watermark = 0.9;
  o.low_watermark = 0.5;
  auto tier = OpenTier(o);
  const std::string payload = RandomBytes(60 * 1024, 5);  // 64 KiB records: 16 fill the tier
  auto pinned = Put(*tier, "k0", 1, payload);
  ASSERT_TRUE(pinned.ok());
  tier->Pin("k0", 1);
  std::set<std::string> evicted;
  for (int i = 1; i < 60; ++i) {
    ASSERT_TRUE(Put(*tier, "k" + std::to_string(i), 1, payload).ok()) << i;
    for (auto& e : tier->TakeEvicted()) evicted.insert(e.key);
    ASSERT_LE(tier->GetStats().used, kMiB);
  }
  EXPECT_FALSE(evicted.empty());
  EXPECT_EQ(evicted.count("k0"), 0u);
  EXPECT_EQ(tier->GetStats().evictions, evicted.size());
  std::string out;
  ASSERT_TRUE(Get(*tier, *pinned, "k0", 1, &out).ok());
  EXPECT_EQ(out, payload);
  for (const auto& e : tier->List()) EXPECT_EQ(evicted.count(e.key), 0u) << e.key;
  // Evicted records stay gone after a restart (their headers were cleared).
  const size_t live = tier->List().size();
  tier.reset();
  tier = OpenTier(o);
  EXPECT_EQ(tier->List().size(), live);
}

TEST_F(DiskTierTest, RemoveOfPinnedRecordReportsHasLease) {
  DiskTierOptions o = Options();
  auto tier = OpenTier(o);
  auto ref = Put(*tier, "r", 1, RandomBytes(5000, 1));
  ASSERT_TRUE(ref.ok());
  tier->Pin("r", 1);
  tier->Pin("r", 1);
  EXPECT_EQ(ToCode(tier->Remove("r", 1)), Code::kHasLease);
  tier->Unpin("r", 1);
  EXPECT_EQ(ToCode(tier->Remove("r", 1)), Code::kHasLease);
  tier->Unpin("r", 1);
  EXPECT_TRUE(tier->Remove("r", 1).ok());
  EXPECT_EQ(ToCode(tier->Remove("r", 1)), Code::kNotFound);
  std::string out;
  EXPECT_EQ(ToCode(Get(*tier, *ref, "r", 1, &out)), Code::kNotFound);
  EXPECT_EQ(tier->GetStats().used, 0u);
  tier.reset();
  tier = OpenTier(o);
  EXPECT_TRUE(tier->List().empty());  // not resurrected
}

TEST_F(DiskTierTest, ForcedPosixFallbackWorks) {
  DiskTierOptions o = Options();
  o.force_posix_io = true;
  const std::string data = RandomBytes(2 * kMiB + 5, 4);
  RecordRef ref;
  {
    auto tier = OpenTier(o);
    EXPECT_EQ(tier->io_engine_name(), "posix");
    ref = *Put(*tier, "p", 1, data);
  }
  auto tier = OpenTier(o);
  std::string out;
  ASSERT_TRUE(Get(*tier, ref, "p", 1, &out).ok());
  EXPECT_EQ(out, data);
  o.force_posix_io = false;
  o.direct_io = false;
  tier.reset();
  tier = OpenTier(o);
  EXPECT_EQ(tier->io_engine_name(), "io_uring");
  ASSERT_TRUE(Get(*tier, ref, "p", 1, &out).ok());
}

TEST_F(DiskTierTest, IoErrorFailsTheWriteAndIndexesNothing) {
  auto real = CreatePosixIoEngine();
  FaultIoEngine faulty(*real);
  DiskTierOptions o = Options();
  o.io_engine = &faulty;
  auto tier = OpenTier(o);
  const std::string data = RandomBytes(70'000, 6);
  faulty.fail_writes = true;
  EXPECT_EQ(ToCode(Put(*tier, "w", 1, data).status()), Code::kTransferFailed);
  EXPECT_TRUE(tier->List().empty());
  EXPECT_EQ(tier->GetStats().used, 0u);
  EXPECT_EQ(tier->GetStats().write_failures, 1u);
  faulty.fail_writes = false;
  auto ref = Put(*tier, "w", 1, data);
  ASSERT_TRUE(ref.ok());
  faulty.fail_reads = true;
  std::string out;
  EXPECT_EQ(ToCode(Get(*tier, *ref, "w", 1, &out)), Code::kTransferFailed);
  EXPECT_EQ(tier->GetStats().read_failures, 1u);
  faulty.fail_reads = false;
  ASSERT_TRUE(Get(*tier, *ref, "w", 1, &out).ok());
  EXPECT_EQ(out, data);
}

TEST_F(DiskTierTest, ConcurrentWritersAndReadersOfDistinctKeys) {
  auto tier = OpenTier(Options());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
        const std::string data = RandomBytes(1 + (t * 131 + i * 4099) % 300'000, t * 100 + i);
        auto ref = Put(*tier, key, 1, data);
        std::string out;
        if (!ref.ok() || !Get(*tier, *ref, key, 1, &out).ok() || out != data) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(tier->List().size(), 120u);
}

}  // namespace
}  // namespace mc::offload
