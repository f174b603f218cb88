// Index notices: the payload of an INDEX frame (layout in transfer/tcp/frame.h). A writer tells
// the owner of each replica it wrote which object the bytes are (key, generation, size,
// checksum), with the replica's WRITE capability, so the owner can keep an index of its
// segments and report it to a restarted master. This file only encodes and decodes; the owner's
// checks (capability, segment) live with its handler (client/session/index_service.h).
// The payload is the same whichever data plane carries it (today INDEX is served over tcp,
// transfer/data_server.h). Decoding is defensive: any count, length or key size out of bounds, a
// truncated entry or trailing bytes reject the whole payload. Thread-safe: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/capability.h"
#include "common/keys.h"

namespace mc::transfer {

inline constexpr size_t kMaxIndexNoticeEntries = 4096;
inline constexpr size_t kMaxIndexNoticeBytes = size_t{8} << 20;  // 8 MiB
// Bytes of one entry besides its key.
inline constexpr size_t kIndexEntryFixedBytes = 5 * 8 + 4 + auth::kCapabilitySize;

struct IndexNoticeEntry {
  uint64_t segment_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t generation = 0;
  uint64_t checksum = 0;
  std::string key;
  auth::CapabilityBytes capability{};  // zeros without auth
};

// Encoded size of `entry` inside a payload.
inline size_t IndexEntryBytes(const IndexNoticeEntry& entry) {
  return kIndexEntryFixedBytes + entry.key.size();
}

// The payload for `entries` (1..kMaxIndexNoticeEntries of them, keys 1..kMaxKeyBytes,
// total at most kMaxIndexNoticeBytes): INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> EncodeIndexNotice(std::span<const IndexNoticeEntry> entries);
// The entries of a payload, or INVALID_ARGUMENT naming what is malformed.
absl::StatusOr<std::vector<IndexNoticeEntry>> DecodeIndexNotice(const uint8_t* data, size_t size);

}  // namespace mc::transfer
