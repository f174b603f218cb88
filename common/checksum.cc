#include "common/checksum.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack and in State
#include <xxhash.h>

#if MC_XXH3_DISPATCH
// Debian's libxxhash carries the x86 dispatcher: the same XXH3 values, computed with the widest
// vector unit the CPU has (SSE2, AVX2 or AVX-512), chosen at run time. Without it XXH3 runs on
// SSE2, the baseline x86-64 code is compiled for: 21 GB/s per core against 61 (AVX2) and 91
// (AVX-512) on a Zen 4 VM, where the verifying copy of a get then ran at half the memcpy rate.
#include <xxh_x86dispatch.h>
#endif

namespace mc {

namespace {

uint64_t Hash(const void* data, size_t size) {
#if MC_XXH3_DISPATCH
  return XXH3_64bits_dispatch(data, size);
#else
  return XXH3_64bits(data, size);
#endif
}

void HashUpdate(XXH3_state_t* state, const void* data, size_t size) {
  // XXH_OK unless `data` is null with size > 0.
#if MC_XXH3_DISPATCH
  (void)XXH3_64bits_update_dispatch(state, data, size);
#else
  (void)XXH3_64bits_update(state, data, size);
#endif
}

// The dispatcher picks its implementation on first use, without a lock (each thread would store
// the same pointer). Picking it here, while the process starts and has one thread, keeps that
// first use out of concurrent code. The one-shot hash of a long input and the streaming update
// each have their own pointer, hence both calls.
[[maybe_unused]] const bool kDispatchChosen = [] {
  char block[1024] = {};
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  HashUpdate(&state, block, sizeof(block));
  return Hash(block, sizeof(block)) == XXH3_64bits_digest(&state);
}();

}  // namespace

struct StreamingChecksum::State {
  XXH3_state_t xxh;
};

uint64_t Checksum(const void* data, size_t size) { return Hash(data, size); }

StreamingChecksum::StreamingChecksum() : state_(std::make_unique<State>()) {
  XXH3_64bits_reset(&state_->xxh);
}
StreamingChecksum::~StreamingChecksum() = default;

void StreamingChecksum::Update(const void* data, size_t size) {
  HashUpdate(&state_->xxh, data, size);
}

uint64_t StreamingChecksum::Digest() const { return XXH3_64bits_digest(&state_->xxh); }

const char* ChecksumImplementation() {
  return MC_XXH3_DISPATCH ? "xxh3-dispatch" : "xxh3-baseline";
}

}  // namespace mc
