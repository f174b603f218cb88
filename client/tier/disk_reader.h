// DiskReader: how the get path reads a DISK replica that this daemon's own SSD tier holds.
// A seam: OffloadDriver implements it over the DiskTier; tests may fake it.
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "transfer/transfer_engine.h"

namespace mc::client {

class DiskReader {
 public:
  virtual ~DiskReader() = default;
  // Reads the record (key, generation) at `locator` of `length` payload bytes into `dst`,
  // verified (key, generation, checksums) by the tier: never OK for bytes that differ. On OK,
  // `*checksum` is the XXH3-64 of the bytes now in `dst`, computed over `dst` itself (the get
  // path need not hash them again); `checksum` may be null.
  virtual absl::Status ReadLocal(std::string_view key, uint64_t generation, uint64_t locator,
                                 uint64_t length, const std::vector<transfer::LocalBuffer>& dst,
                                 uint64_t* checksum) = 0;
};

// The key tag a READ_DISK request carries (transfer::DiskRecord::key_tag): the low 32 bits of
// the key's XXH3-64, which the owner checks against the record's key.
uint32_t DiskKeyTag(std::string_view key);

}  // namespace mc::client
