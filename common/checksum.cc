#include "common/checksum.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack and in State
#include <xxhash.h>

#if MC_XXH3_DISPATCH
// Debian's libxxhash carries the x86 dispatcher: the same XXH3 values, computed with the widest
// vector unit the CPU has (SSE2, AVX2 or AVX-512), chosen at run time. Without it XXH3 runs on
// SSE2, the baseline x86-64 code is compiled for: 21 GB/s per core against 61 (AVX2) and 91
// (AVX-512) on a Zen 4 VM, where the verifying copy of a get then ran at half the memcpy rate.
#include <xxh_x86dispatch.h>
#define MC_XXH3_64(data, size) XXH3_64bits_dispatch(data, size)
#define MC_XXH3_UPDATE(state, data, size) XXH3_64bits_update_dispatch(state, data, size)
#else
#define MC_XXH3_64(data, size) XXH3_64bits(data, size)
#define MC_XXH3_UPDATE(state, data, size) XXH3_64bits_update(state, data, size)
#endif

namespace mc {

namespace {
// The dispatcher picks its implementation on first use, without a lock (each thread would store
// the same pointers). Picking it here, while the process starts and has one thread, keeps that
// first use out of concurrent code. Both entry points (one-shot long input, streaming update)
// have their own table.
[[maybe_unused]] const bool kDispatchChosen = [] {
  char block[1024] = {};
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  MC_XXH3_UPDATE(&state, block, sizeof(block));
  return (MC_XXH3_64(block, sizeof(block)) ^ XXH3_64bits_digest(&state)) == 0;
}();
}  // namespace

struct StreamingChecksum::State {
  XXH3_state_t xxh;
};

uint64_t Checksum(const void* data, size_t size) { return MC_XXH3_64(data, size); }

StreamingChecksum::StreamingChecksum() : state_(std::make_unique<State>()) {
  XXH3_64bits_reset(&state_->xxh);
}
StreamingChecksum::~StreamingChecksum() = default;

void StreamingChecksum::Update(const void* data, size_t size) {
  (void)MC_XXH3_UPDATE(&state_->xxh, data, size);  // XXH_OK unless `data` is null with size > 0
}

uint64_t StreamingChecksum::Digest() const { return XXH3_64bits_digest(&state_->xxh); }

const char* ChecksumImplementation() { return MC_XXH3_DISPATCH ? "xxh3-dispatch" : "xxh3-baseline"; }

}  // namespace mc
