// libFuzzer target: packed lookups from the network. The input is a PackedLookups message (or,
// with the first byte odd, a GetReplicasRequest whose packed keys are cut): columns that
// disagree must be an error, never an out-of-bounds read.
#include <cstdint>
#include <string>

#include "proto/packed_lookups.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const char* body = reinterpret_cast<const char*>(data + 1);
  const int body_size = static_cast<int>(size - 1);
  if ((data[0] & 1) == 0) {
    mcstore::v1::PackedLookups packed;
    if (!packed.ParseFromArray(body, body_size)) return 0;
    auto reader = mc::PackedLookupsReader::Open(packed);
    if (!reader.ok()) return 0;
    for (size_t row = 0; row < reader->rows(); ++row) {
      mcstore::v1::KeyReplicas out;
      (void)reader->code(row);
      reader->Unpack(row, &out);
    }
  } else {
    mcstore::v1::GetReplicasRequest req;
    if (!req.ParseFromArray(body, body_size)) return 0;
    auto keys = mc::RequestKeys(req);
    if (keys.ok()) {
      size_t total = 0;
      for (std::string_view k : *keys) total += k.size();  // every view is readable
      if (!req.packed_keys().empty() && total != req.packed_keys().size()) abort();
    }
  }
  return 0;
}
