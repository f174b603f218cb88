// Keys: the one rule of what a key may be, for mc-master, mc-client, the SSD tier, the wire's
// index notices and the tools. A key is 1..kMaxKeyBytes bytes of anything (binary is fine);
// ValidateKey answers every caller with the same INVALID_ARGUMENT message.
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace mc {

// The longest key, in bytes. SSD records and index notices carry keys up to this length too.
inline constexpr size_t kMaxKeyBytes = 4096;

// OK for a key of 1..kMaxKeyBytes bytes; else INVALID_ARGUMENT ("empty key", or "key of N bytes
// exceeds the limit of 4096").
absl::Status ValidateKey(std::string_view key);

}  // namespace mc
