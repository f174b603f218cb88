// Test helpers for the offload tests: a temp dir removed at scope exit, deterministic payloads,
// opening a tier and reading a record whole.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <memory>
#include <string>
#include <string_view>

#include "gtest/gtest.h"
#include "offload/disk_tier.h"

namespace mc::offload::testing_util {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "offload_test_XXXXXX";
    char* made = ::mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string RandomBytes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    for (uint64_t j = 0; j < 8 && i + j < n; ++j) s[i + j] = static_cast<char>(v >> (8 * j));
  }
  return s;
}

// Opens a tier; on failure reports it to gtest and returns null.
inline std::unique_ptr<DiskTier> OpenTier(const DiskTierOptions& o) {
  auto tier = DiskTier::Open(o);
  EXPECT_TRUE(tier.ok()) << tier.status();
  return tier.ok() ? std::move(*tier) : nullptr;
}

// Reads the record at `ref` whole into `out`.
inline absl::Status Get(DiskTier& t, RecordRef ref, std::string_view key, uint64_t gen,
                        std::string* out) {
  out->assign(ref.length, '\0');
  return t.Read(ref, key, gen, {{out->data(), out->size()}});
}

}  // namespace mc::offload::testing_util
