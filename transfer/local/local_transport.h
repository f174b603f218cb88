// The `local` transport: requests whose segment lives in this process, served by memcpy through
// the SegmentTable. A batch of several requests (at least `parallel_batch_threshold` bytes) is
// spread over `copy_threads` helper threads plus the caller, one whole request per thread at a
// time; a lone request larger than `parallel_copy_threshold` (and not asking for a checksum) is
// cut into byte ranges copied in parallel instead. A read asking for Proof::kDeliveredBytes, or a
// write asking for Proof::kWrittenReplica (a put's local replica, from host or pinned memory), is
// copied in chunks of `checksum_chunk_bytes`, each hashed from the destination right after it
// was copied, while it is in cache: one pass over the source, and the checksum is that of the
// bytes stored. Buffers overlapping the segment range are copied with memmove, unchunked, and
// the destination hashed after. SSD records and index notices are refused (INVALID_ARGUMENT):
// this daemon reads its own records through its tier and updates its own index directly.
// Thread-safe: concurrent Submit() calls share the helper threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "transfer/segment_table.h"
#include "transfer/transfer_options.h"
#include "transfer/transport.h"
#include "transfer/worker_pool.h"

namespace mc::transfer {

class LocalTransport final : public Transport {
 public:
  // Claims the requests to `local_endpoint` (none when it is empty).
  LocalTransport(LocalTransportOptions options, SegmentTable& segments,
                 std::string local_endpoint = "");

  std::string_view name() const override { return "local"; }
  bool Claims(const TransferRequest& request) override {
    return !local_endpoint_.empty() && request.endpoint == local_endpoint_;
  }
  void Submit(std::span<const TransferRequest* const> requests, std::span<TransferResult> results,
              int64_t deadline_ms) override;

 private:
  struct Copy {
    char* dst;
    const char* src;
    uint64_t length;
  };
  // `may_split`: the copy may be spread over the helpers (only when the caller is alone).
  TransferResult Execute(const TransferRequest& request, bool may_split);
  void CopyParallel(const std::vector<Copy>& copies, uint64_t total);

  const LocalTransportOptions options_;
  SegmentTable& segments_;
  const std::string local_endpoint_;
  WorkerPool pool_;
};

}  // namespace mc::transfer
