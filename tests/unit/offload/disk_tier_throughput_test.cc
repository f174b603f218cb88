// Throughput figures of DiskTier writes and reads in /tmp (prints; asserts nothing about time).
// Disabled by default: run with --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'.
#include <chrono>
#include <cstdio>

#include "gtest/gtest.h"
#include "offload/disk_tier.h"
#include "tests/unit/offload/offload_test_util.h"

namespace mc::offload {
namespace {

TEST(DiskTierThroughput, DISABLED_WriteAndReadGBps) {
  testing_util::TempDir dir;
  constexpr uint64_t kMiB = 1 << 20;
  constexpr uint64_t kTotal = 512 * kMiB;  // per record size and direction
  for (bool posix : {false, true}) {
    for (uint64_t size : {kMiB, 4 * kMiB, 16 * kMiB}) {
      DiskTierOptions o;
      o.dir = dir.path() + "/t" + std::to_string(size) + (posix ? "p" : "u");
      o.capacity = kTotal + 64 * kMiB;
      o.force_posix_io = posix;
      auto tier = DiskTier::Open(o);
      ASSERT_TRUE(tier.ok()) << tier.status();
      const std::string data = testing_util::RandomBytes(size, size);
      std::string out(size, '\0');
      const int n = static_cast<int>(kTotal / size);
      std::vector<RecordRef> refs;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) {
        auto ref = (*tier)->Write("key" + std::to_string(i), 1, {{data.data(), size}});
        ASSERT_TRUE(ref.ok()) << ref.status();
        refs.push_back(*ref);
      }
      auto t1 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(
            (*tier)->Read(refs[i], "key" + std::to_string(i), 1, {{out.data(), size}}).ok());
      }
      auto t2 = std::chrono::steady_clock::now();
      const double w = std::chrono::duration<double>(t1 - t0).count();
      const double r = std::chrono::duration<double>(t2 - t1).count();
      std::printf("[throughput] engine=%s record=%3llu MiB x %d: write %.2f GB/s, read %.2f GB/s\n",
                  (*tier)->io_engine_name().data(), static_cast<unsigned long long>(size / kMiB), n,
                  kTotal / w / 1e9, kTotal / r / 1e9);
    }
  }
}

}  // namespace
}  // namespace mc::offload
