#include "offload/io_engine.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "common/status.h"
#include "gtest/gtest.h"
#include "offload/extent_allocator.h"
#include "tests/unit/offload/offload_test_util.h"

namespace mc::offload {
namespace {

using testing_util::RandomBytes;
using testing_util::TempDir;

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using Buf = std::unique_ptr<char, FreeDeleter>;
Buf Aligned(size_t n) { return Buf(static_cast<char*>(std::aligned_alloc(kPageSize, n))); }

class IoEngineTest : public ::testing::TestWithParam<bool /*force_posix*/> {
 protected:
  std::unique_ptr<IoEngine> MakeEngine() {
    return CreateIoEngine({.queue_depth = 8, .force_posix = GetParam()});
  }
};

TEST_P(IoEngineTest, BatchedReadWriteRoundTrip) {
  TempDir dir;
  const std::string path = dir.path() + "/f";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  auto engine = MakeEngine();
  EXPECT_EQ(engine->Name(), GetParam() ? "posix" : "io_uring");
  constexpr int kRequests = 40;  // more than the queue depth
  constexpr uint64_t kLen = 3 * kPageSize;
  const std::string data = RandomBytes(kRequests * kLen, 7);
  Buf out = Aligned(kRequests * kLen);
  std::memcpy(out.get(), data.data(), data.size());
  std::vector<IoRequest> writes;
  for (int i = 0; i < kRequests; ++i) {
    writes.push_back({IoOp::kWrite, fd, i * kLen, out.get() + i * kLen, kLen});
  }
  for (const IoResult& r : engine->SubmitAndWait(writes)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, kLen);
  }
  Buf in = Aligned(kRequests * kLen);
  std::vector<IoRequest> reads;
  for (int i = kRequests - 1; i >= 0; --i) {
    reads.push_back({IoOp::kRead, fd, i * kLen, in.get() + i * kLen, kLen});
  }
  for (const IoResult& r : engine->SubmitAndWait(reads)) ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(std::memcmp(in.get(), data.data(), data.size()), 0);
  EXPECT_TRUE(engine->SubmitAndWait({}).empty());
  ::close(fd);
}

TEST_P(IoEngineTest, ShortReadPastEndOfFileIsAnErrorAndOthersInBatchSucceed) {
  TempDir dir;
  const std::string path = dir.path() + "/f";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 6000), 0);
  auto engine = MakeEngine();
  Buf buf = Aligned(4 * kPageSize);
  std::vector<IoRequest> reqs = {{IoOp::kRead, fd, 0, buf.get(), 2 * kPageSize},
                                 {IoOp::kRead, fd, 0, buf.get() + 2 * kPageSize, 4096}};
  auto results = engine->SubmitAndWait(reqs);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(ToCode(results[0].status()), Code::kTransferFailed);
  ASSERT_TRUE(results[1].ok());
  EXPECT_EQ(*results[1], 4096u);
  // A bad fd fails its request only.
  reqs = {{IoOp::kWrite, -1, 0, buf.get(), 4096}, {IoOp::kWrite, fd, 0, buf.get(), 4096}};
  results = engine->SubmitAndWait(reqs);
  EXPECT_EQ(ToCode(results[0].status()), Code::kTransferFailed);
  EXPECT_TRUE(results[1].ok());
  ::close(fd);
}

TEST_P(IoEngineTest, ConcurrentCallersShareOneEngine) {
  TempDir dir;
  int fd = ::open((dir.path() + "/f").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  auto engine = MakeEngine();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      Buf buf = Aligned(kPageSize);
      for (int i = 0; i < 50; ++i) {
        std::memset(buf.get(), t + i, kPageSize);
        IoRequest w{IoOp::kWrite, fd, static_cast<uint64_t>(t) * kPageSize, buf.get(), kPageSize};
        if (!engine->SubmitAndWait({&w, 1})[0].ok()) ++failures;
        IoRequest r{IoOp::kRead, fd, static_cast<uint64_t>(t) * kPageSize, buf.get(), kPageSize};
        if (!engine->SubmitAndWait({&r, 1})[0].ok() || buf.get()[100] != static_cast<char>(t + i)) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ::close(fd);
}

TEST_P(IoEngineTest, SubmittedBatchesCompleteWhicheverIsWaitedForFirst) {
  TempDir dir;
  int fd = ::open((dir.path() + "/f").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  auto engine = MakeEngine();
  constexpr int kBatches = 12;  // with 2 requests each: more than the queue depth in flight
  constexpr uint64_t kLen = 2 * kPageSize;
  const std::string data = RandomBytes(kBatches * 2 * kLen, 11);
  Buf out = Aligned(data.size());
  std::memcpy(out.get(), data.data(), data.size());
  std::vector<std::unique_ptr<IoBatch>> batches;
  for (int b = 0; b < kBatches; ++b) {
    std::vector<IoRequest> reqs;  // goes out of scope at once: Submit copies the requests
    for (int i = 0; i < 2; ++i) {
      const uint64_t at = (2 * b + i) * kLen;
      reqs.push_back({IoOp::kWrite, fd, at, out.get() + at, kLen});
    }
    batches.push_back(engine->Submit(reqs));
  }
  // Wait for them newest first; the last three are never waited for: destroying them waits.
  for (int b = kBatches - 1; b >= 3; --b) {
    auto results = batches[b]->Wait();
    ASSERT_EQ(results.size(), 2u);
    for (const IoResult& r : results) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(*r, kLen);
    }
  }
  batches.clear();
  EXPECT_TRUE(engine->Submit({})->Wait().empty());
  Buf in = Aligned(data.size());
  IoRequest r{IoOp::kRead, fd, 0, in.get(), data.size()};
  auto read = engine->Submit({&r, 1})->Wait();
  ASSERT_EQ(read.size(), 1u);
  ASSERT_TRUE(read[0].ok()) << read[0].status();
  EXPECT_EQ(std::memcmp(in.get(), data.data(), data.size()), 0);
  // An error stays with its batch.
  IoRequest bad{IoOp::kWrite, -1, 0, out.get(), kPageSize};
  auto failed = engine->Submit({&bad, 1});
  EXPECT_EQ(ToCode(failed->Wait()[0].status()), Code::kTransferFailed);
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Engines, IoEngineTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Posix" : "Uring"; });

}  // namespace
}  // namespace mc::offload
