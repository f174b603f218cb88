// libFuzzer target: INDEX frame payloads (transfer/index_notice.h) from the network. Any
// input either decodes into entries within the bounds, which encode back to exactly the same
// bytes, or is refused; never an out-of-bounds read or an oversized allocation.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "transfer/index_notice.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace transfer = mc::transfer;
  auto entries = transfer::DecodeIndexNotice(data, size);
  if (!entries.ok()) return 0;
  if (entries->empty() || entries->size() > transfer::kMaxIndexNoticeEntries) abort();
  for (const transfer::IndexNoticeEntry& e : *entries) {
    if (e.key.empty() || e.key.size() > mc::kMaxKeyBytes) abort();
  }
  auto again = transfer::EncodeIndexNotice(std::span<const transfer::IndexNoticeEntry>(*entries));
  if (!again.ok() || again->size() != size || std::memcmp(again->data(), data, size) != 0) {
    abort();  // the format has one encoding per entry list
  }
  return 0;
}
