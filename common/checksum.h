// XXH3-64 checksums of payloads, one-shot and streaming (for payloads gathered from slices).
// Thread-safe: Checksum() is pure; a StreamingChecksum belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace mc {

uint64_t Checksum(const void* data, size_t size);
inline uint64_t Checksum(std::string_view bytes) { return Checksum(bytes.data(), bytes.size()); }
// Which XXH3 code computes them, for the daemons' start-up log: "xxh3-dispatch" (the widest
// vector unit of this CPU, chosen at run time) or "xxh3-baseline" (SSE2 on x86-64). The values
// are the same either way.
const char* ChecksumImplementation();

class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;

  void Update(const void* data, size_t size);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mc
