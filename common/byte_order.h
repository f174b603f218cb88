// Little-endian encoding of unsigned integers, the byte order of every format of ours on the
// wire and on disk (data-plane frames, index notices, capabilities, SSD records, fd-channel
// requests). Loops over bytes, so they work on any host and at any alignment; compilers turn them
// into single loads and stores on little-endian machines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace mc {

// Writes `v` at `dst` (sizeof(T) bytes).
template <typename T>
inline void StoreLe(void* dst, T v) {
  static_assert(std::is_unsigned_v<T>);
  auto* p = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Reads a T from `src` (sizeof(T) bytes).
template <typename T>
inline T LoadLe(const void* src) {
  static_assert(std::is_unsigned_v<T>);
  const auto* p = static_cast<const unsigned char*>(src);
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
  return v;
}

// Appends `v` to `out`.
template <typename T>
inline void AppendLe(std::string& out, T v) {
  char bytes[sizeof(T)];
  StoreLe(bytes, v);
  out.append(bytes, sizeof(T));
}

// Writes `v` at `p` and advances it.
template <typename T>
inline void PutLe(uint8_t*& p, T v) {
  StoreLe(p, v);
  p += sizeof(T);
}

// Reads a T at `p` and advances it. The caller has checked that sizeof(T) bytes remain.
template <typename T>
inline T GetLe(const uint8_t*& p) {
  const T v = LoadLe<T>(p);
  p += sizeof(T);
  return v;
}

}  // namespace mc
