#include "common/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace mc {

struct StreamingChecksum::State {
  XXH3_state_t xxh;
};

uint64_t Checksum(const void* data, size_t size) { return XXH3_64bits(data, size); }

StreamingChecksum::StreamingChecksum() : state_(std::make_unique<State>()) {
  XXH3_64bits_reset(&state_->xxh);
}
StreamingChecksum::~StreamingChecksum() = default;

void StreamingChecksum::Update(const void* data, size_t size) {
  XXH3_64bits_update(&state_->xxh, data, size);
}

uint64_t StreamingChecksum::Digest() const { return XXH3_64bits_digest(&state_->xxh); }

}  // namespace mc
