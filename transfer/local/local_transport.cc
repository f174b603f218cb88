#include "transfer/local/local_transport.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/checked_math.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/status.h"

namespace mc::transfer {
namespace {

bool Overlaps(const char* a, uint64_t a_len, const char* b, uint64_t b_len) {
  return a < b + b_len && b < a + a_len;
}

}  // namespace

LocalTransport::LocalTransport(LocalTransportOptions options, SegmentTable& segments,
                               std::string local_endpoint)
    : options_(options),
      segments_(segments),
      local_endpoint_(std::move(local_endpoint)),
      pool_(std::max(0, options.copy_threads)) {}

void LocalTransport::Submit(std::span<const TransferRequest* const> requests,
                            std::span<TransferResult> results, int64_t deadline_ms) {
  uint64_t total = 0;
  for (const TransferRequest* r : requests) total = SaturatingAdd(total, TotalLength(*r));
  const bool spread =
      requests.size() > 1 && pool_.size() > 0 && total >= options_.parallel_batch_threshold;
  auto one = [&](size_t i) {
    if (deadline_ms != 0 && RealClock::Get().NowMs() >= deadline_ms) {
      results[i].status = DeadlineError();
      return;
    }
    results[i] = Execute(*requests[i], /*may_split=*/!spread);
  };
  if (!spread) {
    for (size_t i = 0; i < requests.size(); ++i) one(i);
    return;
  }
  pool_.Run(requests.size(), one);
}

TransferResult LocalTransport::Execute(const TransferRequest& request, bool may_split) {
  TransferResult result;
  const SegmentRange* range = AsSegmentRange(request);
  if (range == nullptr) {
    result.status = McError(Code::kInvalidArgument,
                            AsDiskRecord(request) != nullptr
                                ? "local transport: SSD records are read through the tier itself"
                                : "local transport: the own object index is updated directly");
    return result;
  }
  const bool read = request.direction == Direction::kRead;
  const uint64_t total = TotalLength(request);
  absl::StatusOr<char*> seg = segments_.Resolve(range->segment_id, range->offset, total);
  if (!seg.ok()) {
    result.status = seg.status();
    return result;
  }
  std::vector<Copy> copies;
  copies.reserve(request.local.size());
  bool overlap = false;
  uint64_t pos = 0;
  for (const LocalBuffer& b : request.local) {
    if (b.length == 0) continue;
    char* remote = *seg + pos;
    overlap = overlap || Overlaps(remote, b.length, b.data, b.length);
    if (read) {
      copies.push_back({b.data, remote, b.length});
    } else {
      copies.push_back({remote, b.data, b.length});
    }
    pos += b.length;
  }
  // A read proves the bytes it delivered, a write the replica it stored: both are hashed from
  // the destination (the engine checked each proof's direction).
  const bool hash = request.proof != Proof::kNone;
  if (hash && !overlap) {
    // Fused: copy a chunk, hash it from the destination while it is cache-hot, in order. One
    // pass over the source; the hash is of the bytes as they landed, whatever the source did
    // meanwhile.
    const uint64_t chunk = std::max<uint64_t>(options_.checksum_chunk_bytes, 4096);
    StreamingChecksum sum;
    for (const Copy& c : copies) {
      for (uint64_t off = 0; off < c.length; off += chunk) {
        const uint64_t n = std::min(chunk, c.length - off);
        std::memcpy(c.dst + off, c.src + off, n);
        sum.Update(c.dst + off, n);
      }
    }
    result.checksum = sum.Digest();
  } else {
    if (overlap || !may_split || pool_.size() == 0 || total <= options_.parallel_copy_threshold) {
      for (const Copy& c : copies) std::memmove(c.dst, c.src, c.length);
    } else {
      CopyParallel(copies, total);
    }
    if (hash) {  // overlapping buffers: hash the destination as it ended up
      StreamingChecksum sum;
      for (const Copy& c : copies) sum.Update(c.dst, c.length);
      result.checksum = sum.Digest();
    }
  }
  result.bytes = total;
  return result;
}

// Cuts the copy list into helpers+1 byte ranges of near-equal size, copied in parallel.
void LocalTransport::CopyParallel(const std::vector<Copy>& copies, uint64_t total) {
  const uint64_t parts = static_cast<uint64_t>(pool_.size()) + 1;
  const uint64_t per_part = (total + parts - 1) / parts;
  std::vector<std::vector<Copy>> plan(parts);
  size_t part = 0;
  uint64_t filled = 0;
  for (Copy c : copies) {
    while (c.length > 0) {
      const uint64_t n = std::min(c.length, per_part - filled);
      plan[part].push_back({c.dst, c.src, n});
      c.dst += n;
      c.src += n;
      c.length -= n;
      filled += n;
      if (filled == per_part && part + 1 < parts) {
        ++part;
        filled = 0;
      }
    }
  }
  pool_.Run(parts, [&plan](size_t p) {
    for (const Copy& c : plan[p]) std::memcpy(c.dst, c.src, c.length);
  });
}

}  // namespace mc::transfer
