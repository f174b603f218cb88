// DiskTier's chunked pipeline: records spanning many chunks (and more than the staging buffer),
// several chunks in flight at once, the header inside the record's first request, failures in a
// middle chunk, and records laid out by the earlier one-round writer still reading back.
//
// LazyIoEngine (here rather than in tests/fakes/: only these tests use it) runs a batch's I/O only
// when the batch is waited for or destroyed, the latest an engine may: a tier that reused or
// consumed a staging slot before waiting for its I/O would write or read the wrong bytes and fail
// these round trips.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "common/checksum.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "offload/disk_tier.h"
#include "offload/record_format.h"
#include "tests/unit/offload/offload_test_util.h"

namespace mc::offload {
namespace {

using testing_util::Get;
using testing_util::OpenTier;
using testing_util::RandomBytes;
using testing_util::TempDir;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

class LazyIoEngine final : public IoEngine {
 public:
  explicit LazyIoEngine(IoEngine& real) : real_(real) {}

  struct Seen {
    IoOp op;
    uint64_t offset, length;
  };

  // The n-th request (0-based, counting from the last ResetCounts) of this kind fails, without
  // touching the file; -1 = none.
  std::atomic<int> fail_write_index{-1};
  std::atomic<int> fail_read_index{-1};

  std::vector<IoResult> SubmitAndWait(std::span<const IoRequest> requests) override {
    return Submit(requests)->Wait();
  }
  std::unique_ptr<IoBatch> Submit(std::span<const IoRequest> requests) override {
    std::vector<IoRequest> reqs(requests.begin(), requests.end());
    std::vector<bool> fail(reqs.size(), false);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < reqs.size(); ++i) {
        const bool write = reqs[i].op == IoOp::kWrite;
        const int n = write ? writes_++ : reads_++;
        fail[i] = n == (write ? fail_write_index.load() : fail_read_index.load());
        seen_.push_back({reqs[i].op, reqs[i].offset, reqs[i].length});
      }
      ++outstanding_;
      max_outstanding_ = std::max(max_outstanding_, outstanding_);
    }
    return std::make_unique<Batch>(*this, std::move(reqs), std::move(fail));
  }
  std::string_view Name() const override { return "lazy"; }

  void ResetCounts() {
    std::lock_guard<std::mutex> lock(mu_);
    writes_ = reads_ = 0;
    max_outstanding_ = 0;
    seen_.clear();
  }
  int max_outstanding() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_outstanding_;
  }
  int outstanding() {
    std::lock_guard<std::mutex> lock(mu_);
    return outstanding_;
  }
  std::vector<Seen> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  class Batch final : public IoBatch {
   public:
    Batch(LazyIoEngine& engine, std::vector<IoRequest> reqs, std::vector<bool> fail)
        : engine_(engine), reqs_(std::move(reqs)), fail_(std::move(fail)) {}
    ~Batch() override {
      if (!done_) Wait();
    }
    std::vector<IoResult> Wait() override {
      done_ = true;
      std::vector<IoResult> out;
      for (size_t i = 0; i < reqs_.size(); ++i) {
        if (fail_[i]) {
          out.push_back(McError(Code::kTransferFailed, "injected I/O error"));
        } else {
          out.push_back(std::move(engine_.real_.SubmitAndWait({&reqs_[i], 1})[0]));
        }
      }
      std::lock_guard<std::mutex> lock(engine_.mu_);
      --engine_.outstanding_;
      return out;
    }

   private:
    LazyIoEngine& engine_;
    std::vector<IoRequest> reqs_;
    std::vector<bool> fail_;
    bool done_ = false;
  };

  IoEngine& real_;
  std::mutex mu_;
  int writes_ = 0, reads_ = 0;
  int outstanding_ = 0, max_outstanding_ = 0;
  std::vector<Seen> seen_;
};

class DiskTierPipelineTest : public ::testing::Test {
 protected:
  DiskTierOptions Options(uint64_t chunk, uint64_t capacity = 64 * kMiB, int files = 1) {
    DiskTierOptions o;
    o.dir = dir_.path() + "/tier";
    o.capacity = capacity;
    o.num_files = files;
    o.io_chunk_bytes = chunk;
    o.io_engine = &lazy_;
    return o;
  }
  std::string DataFile() const { return dir_.path() + "/tier/data-000.mcs"; }
  static uint64_t OffsetOf(RecordRef ref) { return ref.locator & ((uint64_t{1} << 48) - 1); }

  TempDir dir_;
  std::unique_ptr<IoEngine> real_ = CreatePosixIoEngine();
  LazyIoEngine lazy_{*real_};
};

TEST_F(DiskTierPipelineTest, RecordsOfManyChunksRoundTripWithSeveralChunksInFlight) {
  auto tier = OpenTier(Options(16 * kKiB));
  uint64_t gen = 1;
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, 12 * kKiB, 16 * kKiB - 1, 16 * kKiB,
                        5 * 16 * kKiB + 7, kMiB + 3}) {
    const std::string data = RandomBytes(size, size + 1);
    const std::string key = "k" + std::to_string(size);
    lazy_.ResetCounts();
    const uint64_t a = size / 3;
    auto ref = tier->Write(key, gen, {{data.data(), a}, {data.data() + a, size - a}});
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(lazy_.outstanding(), 0);
    // The record's first write request starts at the record, holds the header block and payload,
    // and is the last one submitted (the header carries the checksum of the whole payload).
    const auto seen = lazy_.seen();
    ASSERT_FALSE(seen.empty());
    const uint64_t header = HeaderBlockSize(key.size());
    const LazyIoEngine::Seen& last = seen.back();
    EXPECT_EQ(last.offset, OffsetOf(*ref)) << size;
    EXPECT_EQ(last.length, std::min(16 * kKiB, RecordSize(key.size(), size))) << size;
    for (const auto& s : seen) EXPECT_EQ(s.op, IoOp::kWrite);
    const size_t chunks = seen.size();
    EXPECT_EQ(chunks, (RecordSize(key.size(), size) + 16 * kKiB - 1) / (16 * kKiB)) << size;
    if (chunks >= 2) {
      EXPECT_GE(lazy_.max_outstanding(), 2) << size;
    }
    if (size > 16 * kKiB - header) {
      EXPECT_GT(last.length, header);
    }

    lazy_.ResetCounts();
    std::string out(size + 2, '\0');
    ASSERT_TRUE(tier->Read(*ref, key, gen,
                           {{out.data() + 1, size / 2}, {out.data() + 1 + size / 2, size - size / 2}})
                    .ok())
        << size;
    EXPECT_EQ(out.substr(1, size), data) << size;
    EXPECT_EQ(lazy_.outstanding(), 0);
    if (chunks >= 2) {
      EXPECT_GE(lazy_.max_outstanding(), 2) << size;
    }
    ++gen;
  }
}

TEST_F(DiskTierPipelineTest, RecordLargerThanTheStagingBufferReusesItsSlots) {
  // 4 MiB chunks: the 32 MiB staging buffer holds 8, so a 40 MiB record cycles through them.
  auto tier = OpenTier(Options(4 * kMiB, 128 * kMiB));
  const std::string data = RandomBytes(40 * kMiB + 5, 3);
  auto ref = tier->Write("big", 1, {{data.data(), data.size()}});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::string out;
  ASSERT_TRUE(Get(*tier, *ref, "big", 1, &out).ok());
  EXPECT_TRUE(out == data);
  // And the automatic chunk size, through the same slots.
  tier.reset();
  tier = OpenTier(Options(0, 128 * kMiB));
  out.clear();
  ASSERT_TRUE(Get(*tier, *ref, "big", 1, &out).ok());
  EXPECT_TRUE(out == data);
  auto again = tier->Write("big2", 1, {{data.data(), data.size()}});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(Get(*tier, *again, "big2", 1, &out).ok());
  EXPECT_TRUE(out == data);
}

TEST_F(DiskTierPipelineTest, AutomaticChunksWriteSmallRecordsInOneRequestAndSplitLargerOnes) {
  auto tier = OpenTier(Options(0));
  const std::string small = RandomBytes(kMiB, 12), large = RandomBytes(3 * kMiB, 13);
  lazy_.ResetCounts();
  auto a = tier->Write("small", 1, {{small.data(), small.size()}});
  ASSERT_TRUE(a.ok()) << a.status();
  auto seen = lazy_.seen();
  ASSERT_EQ(seen.size(), 1u);  // header and payload in one request
  EXPECT_EQ(seen[0].length, RecordSize(5, small.size()));
  lazy_.ResetCounts();
  auto b = tier->Write("large", 1, {{large.data(), large.size()}});
  ASSERT_TRUE(b.ok()) << b.status();
  seen = lazy_.seen();
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ(seen.back().offset, OffsetOf(*b));  // the header's chunk goes last
  EXPECT_GE(lazy_.max_outstanding(), 2);
  uint64_t total = 0;
  for (const auto& r : seen) total += r.length;
  EXPECT_EQ(total, RecordSize(5, large.size()));
  lazy_.ResetCounts();
  std::string out;
  ASSERT_TRUE(Get(*tier, *a, "small", 1, &out).ok());
  EXPECT_EQ(out, small);
  EXPECT_GE(lazy_.seen().size(), 2u);  // reads are split even for small records
  ASSERT_TRUE(Get(*tier, *b, "large", 1, &out).ok());
  EXPECT_EQ(out, large);
}

TEST_F(DiskTierPipelineTest, HeaderOfALongKeySpansWhatWouldBeTwoChunks) {
  auto tier = OpenTier(Options(4 * kKiB));
  const std::string key(kMaxKeyBytes, 'K');  // 8 KiB header block
  const std::string data = RandomBytes(50 * kKiB + 1, 4);
  auto ref = tier->Write(key, 9, {{data.data(), data.size()}});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::string out;
  ASSERT_TRUE(Get(*tier, *ref, key, 9, &out).ok());
  EXPECT_EQ(out, data);
}

TEST_F(DiskTierPipelineTest, WriteFailingInAMiddleChunkIndexesAndPersistsNothing) {
  DiskTierOptions o = Options(16 * kKiB);
  auto tier = OpenTier(o);
  const std::string data = RandomBytes(200 * kKiB, 5);  // 13 chunks
  lazy_.ResetCounts();
  lazy_.fail_write_index = 5;
  auto ref = tier->Write("w", 1, {{data.data(), data.size()}});
  EXPECT_EQ(ToCode(ref.status()), Code::kTransferFailed);
  EXPECT_EQ(lazy_.outstanding(), 0);  // every submitted write finished before Write returned
  EXPECT_TRUE(tier->List().empty());
  EXPECT_EQ(tier->GetStats().used, 0u);
  EXPECT_EQ(tier->GetStats().write_failures, 1u);
  lazy_.fail_write_index = -1;
  tier.reset();
  tier = OpenTier(o);
  // The header, sent before the failure was known, was cleared: nothing to recover, nothing
  // counted as corrupt.
  EXPECT_EQ(tier->GetStats().records_recovered, 0u);
  EXPECT_EQ(tier->GetStats().records_skipped_corrupt, 0u);
  EXPECT_TRUE(tier->List().empty());
  // The same key writes fine afterwards.
  auto ok = tier->Write("w", 1, {{data.data(), data.size()}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  std::string out;
  ASSERT_TRUE(Get(*tier, *ok, "w", 1, &out).ok());
  EXPECT_EQ(out, data);
}

TEST_F(DiskTierPipelineTest, ReadFailingOrCorruptInAMiddleChunkIsReported) {
  auto tier = OpenTier(Options(16 * kKiB));
  const std::string data = RandomBytes(200 * kKiB, 6);
  auto ref = tier->Write("r", 1, {{data.data(), data.size()}});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::string out;
  lazy_.ResetCounts();
  lazy_.fail_read_index = 6;
  EXPECT_EQ(ToCode(Get(*tier, *ref, "r", 1, &out)), Code::kTransferFailed);
  EXPECT_EQ(lazy_.outstanding(), 0);
  EXPECT_EQ(tier->GetStats().read_failures, 1u);
  lazy_.fail_read_index = -1;

  // One flipped payload byte in the 8th chunk.
  const uint64_t at = OffsetOf(*ref) + 7 * 16 * kKiB + 123;
  int fd = ::open(DataFile().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(at)), 1);
  const char flipped = static_cast<char>(c ^ 0x40);
  ASSERT_EQ(::pwrite(fd, &flipped, 1, static_cast<off_t>(at)), 1);
  EXPECT_EQ(ToCode(Get(*tier, *ref, "r", 1, &out)), Code::kChecksumMismatch);
  EXPECT_EQ(lazy_.outstanding(), 0);
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(at)), 1);
  ASSERT_TRUE(Get(*tier, *ref, "r", 1, &out).ok());
  EXPECT_EQ(out, data);
  // A corrupt header is rejected while the later chunks are still in flight; they are waited for.
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(OffsetOf(*ref) + 20)), 1);
  const char g = static_cast<char>(c ^ 1);
  ASSERT_EQ(::pwrite(fd, &g, 1, static_cast<off_t>(OffsetOf(*ref) + 20)), 1);
  EXPECT_EQ(ToCode(Get(*tier, *ref, "r", 1, &out)), Code::kChecksumMismatch);
  EXPECT_EQ(lazy_.outstanding(), 0);
  ::close(fd);
  EXPECT_EQ(tier->GetStats().checksum_mismatches, 2u);
}

TEST_F(DiskTierPipelineTest, RecordsOfTheOneRoundWriterReadBackAndRecover) {
  // Lay out records as the writer before chunking did (one contiguous header | payload | padding
  // image per record, written front to back), with the current encoder of the unchanged format.
  DiskTierOptions o = Options(8 * kKiB, 16 * kMiB);
  { auto tier = OpenTier(o); }  // creates the data file
  std::vector<std::pair<std::string, std::string>> records = {
      {"old-a", RandomBytes(1, 7)}, {"old-b", RandomBytes(100 * kKiB + 9, 8)},
      {"old-c", RandomBytes(3 * kMiB, 9)}};
  int fd = ::open(DataFile().c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const auto& [key, payload] : records) {
    auto header = EncodeHeader(key, 42, payload.size(), Checksum(payload));
    ASSERT_TRUE(header.ok());
    std::string image = *header + payload;
    image.resize(RecordSize(key.size(), payload.size()), '\0');
    ASSERT_EQ(::pwrite(fd, image.data(), image.size(), static_cast<off_t>(offset)),
              static_cast<ssize_t>(image.size()));
    offsets.push_back(offset);
    offset += image.size();
  }
  ::close(fd);
  auto tier = OpenTier(o);
  EXPECT_EQ(tier->GetStats().records_recovered, records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& [key, payload] = records[i];
    RecordRef ref{offsets[i], payload.size()};
    std::string out;
    ASSERT_TRUE(Get(*tier, ref, key, 42, &out).ok()) << key;
    EXPECT_TRUE(out == payload) << key;
  }
  // A record the pipelined writer wrote is byte for byte that image too.
  const std::string payload = RandomBytes(70 * kKiB + 1, 10);
  auto ref = tier->Write("new", 43, {{payload.data(), payload.size()}});
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::string image(RecordSize(3, payload.size()), '\0');
  fd = ::open(DataFile().c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pread(fd, image.data(), image.size(), static_cast<off_t>(OffsetOf(*ref))),
            static_cast<ssize_t>(image.size()));
  ::close(fd);
  std::string expected = *EncodeHeader("new", 43, payload.size(), Checksum(payload)) + payload;
  expected.resize(image.size(), '\0');
  EXPECT_TRUE(image == expected);
}

TEST_F(DiskTierPipelineTest, RejectsAChunkSizeThatIsNotA4KiBMultipleOrTooLarge) {
  EXPECT_EQ(ToCode(DiskTier::Open(Options(6000)).status()), Code::kInvalidArgument);
  EXPECT_EQ(ToCode(DiskTier::Open(Options(kMaxIoChunkBytes + kKiB * 4)).status()),
            Code::kInvalidArgument);
}

// The real engines, small chunks, many threads: the io_uring ring thread gets new batches while
// others are in flight (woken through its eventfd), the posix engine runs them inline.
TEST(DiskTierPipelineEngines, ConcurrentMultiChunkWritesAndReadsOnBothEngines) {
  for (bool posix : {false, true}) {
    TempDir dir;
    DiskTierOptions o;
    o.dir = dir.path() + "/tier";
    o.capacity = 64 * kMiB;
    o.num_files = 2;
    o.io_chunk_bytes = 8 * kKiB;
    o.force_posix_io = posix;
    auto tier = DiskTier::Open(o);
    ASSERT_TRUE(tier.ok()) << tier.status();
    EXPECT_EQ((*tier)->io_engine_name(), posix ? "posix" : "io_uring");
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 10; ++i) {
          const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
          const std::string data = RandomBytes(1 + (t * 7919 + i * 40'961) % 400'000, t * 50 + i);
          auto ref = (*tier)->Write(key, 1, {{data.data(), data.size()}});
          std::string out(data.size(), '\0');
          if (!ref.ok() || !(*tier)->Read(*ref, key, 1, {{out.data(), out.size()}}).ok() ||
              out != data) {
            ++failures;
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0) << (posix ? "posix" : "io_uring");
    EXPECT_EQ((*tier)->List().size(), 40u);
  }
}

}  // namespace
}  // namespace mc::offload
