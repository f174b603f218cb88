// Overflow-checked arithmetic on sizes, capacities, offsets and counters that come from the wire
// or are summed from such values. Every sum or product of externally supplied sizes goes through
// these helpers: a wrapped sum is an attack (a 2^64 - 128 MiB segment turning a capacity total
// into 4 KiB), never a value to compute with. Thread-safe: pure functions and a value type.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mc {

// a + b, or false (and *out untouched) when it does not fit in 64 bits.
inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}
// a * b, or false (and *out untouched) when it does not fit in 64 bits.
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return false;
  *out = r;
  return true;
}
// a + b, clamped to UINT64_MAX: for totals only reported (metrics), never allocated from.
inline uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<uint64_t>::max() : r;
}
// offset + length <= limit, without computing a sum that could wrap.
inline bool RangeWithin(uint64_t offset, uint64_t length, uint64_t limit) {
  return offset <= limit && length <= limit - offset;
}

// A running sum that remembers whether it ever overflowed (then value() is meaningless).
class CheckedSum {
 public:
  CheckedSum() = default;
  explicit CheckedSum(uint64_t start) : value_(start) {}
  CheckedSum& Add(uint64_t v) {
    if (ok_ && !CheckedAdd(value_, v, &value_)) ok_ = false;
    return *this;
  }
  // Adds a * b.
  CheckedSum& AddProduct(uint64_t a, uint64_t b) {
    uint64_t p = 0;
    if (!CheckedMul(a, b, &p)) ok_ = false;
    return Add(p);
  }
  bool ok() const { return ok_; }
  uint64_t value() const { return value_; }
  // The sum, or INVALID_ARGUMENT "<what> overflows 64 bits" (a payload-carrying McError).
  absl::StatusOr<uint64_t> Get(std::string_view what) const;

 private:
  uint64_t value_ = 0;
  bool ok_ = true;
};

// The sum of `values`, or INVALID_ARGUMENT naming `what`.
absl::StatusOr<uint64_t> CheckedTotal(std::initializer_list<uint64_t> values,
                                      std::string_view what);

}  // namespace mc
