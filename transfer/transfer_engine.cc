#include "transfer/transfer_engine.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/clock.h"
#include "common/status.h"
#include "transfer/transport.h"
#include "transfer/transport_registry.h"

namespace mc::transfer {

uint64_t TotalLength(const TransferRequest& request) {
  uint64_t total = 0;
  for (const LocalBuffer& b : request.local) total = SaturatingAdd(total, b.length);
  return total;
}

absl::Status DeadlineError() { return McError(Code::kTransferFailed, "deadline"); }

// Counters of one transport; null members when the engine has no registry.
struct TransportMetrics {
  Counter* read_bytes = nullptr;
  Counter* write_bytes = nullptr;
  Counter* errors = nullptr;
};

namespace {

// Checks what every transport relies on: a target read or written the way it can be, a proof
// of the request's direction, buffers present and a total that fits in 64 bits.
absl::Status ValidateRequest(const TransferRequest& request) {
  const bool read = request.direction == Direction::kRead;
  if (!read && AsDiskRecord(request) != nullptr) {
    return McError(Code::kInvalidArgument, "an SSD record is read, never written");
  }
  if (read && IsIndexNotice(request)) {
    return McError(Code::kInvalidArgument, "an index notice is written, never read");
  }
  if ((request.proof == Proof::kDeliveredBytes && !read) ||
      (request.proof == Proof::kWrittenReplica && read)) {
    return McError(Code::kInvalidArgument, "the proof asked for is the other direction's");
  }
  uint64_t total = 0;
  for (const LocalBuffer& b : request.local) {
    if (b.data == nullptr && b.length > 0) {
      return McError(Code::kInvalidArgument, "local buffer with null data");
    }
    if (b.length > UINT64_MAX - total) {
      return McError(Code::kInvalidArgument, "local buffers overflow 64 bits");
    }
    total += b.length;
  }
  return absl::OkStatus();
}

// mc_transfer_bytes_total{transport,op}.
Counter& TransferBytesCounter(MetricsRegistry& metrics, const std::string& transport,
                              const char* op) {
  return metrics.GetCounter("mc_transfer_bytes_total", "Bytes moved by the transfer engine.",
                            {{"transport", transport}, {"op", op}});
}

}  // namespace

TransferEngine::TransferEngine(TransferEngineOptions options, SegmentTable& local_segments)
    : options_(std::move(options)),
      registry_(std::make_unique<TransportRegistry>(options_, local_segments)) {
  for (const auto& transport : registry_->transports()) {
    auto m = std::make_unique<TransportMetrics>();
    if (options_.metrics != nullptr) {
      const std::string name(transport->name());
      m->read_bytes = &TransferBytesCounter(*options_.metrics, name, "read");
      m->write_bytes = &TransferBytesCounter(*options_.metrics, name, "write");
      m->errors = &options_.metrics->GetCounter(
          "mc_transfer_errors_total", "Transfer requests that failed.", {{"transport", name}});
    }
    metrics_.push_back(std::move(m));
  }
}

TransferEngine::~TransferEngine() = default;

std::vector<TransferResult> TransferEngine::Submit(std::span<const TransferRequest> requests,
                                                   int64_t deadline_ms) {
  std::vector<TransferResult> results(requests.size());
  const auto& transports = registry_->transports();
  // Per transport: the requests it serves and their positions in the batch.
  std::vector<std::vector<const TransferRequest*>> batch(transports.size());
  std::vector<std::vector<size_t>> positions(transports.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (absl::Status s = ValidateRequest(requests[i]); !s.ok()) {
      results[i].status = std::move(s);
      continue;
    }
    if (TotalLength(requests[i]) == 0) continue;  // nothing to move: OK, 0 bytes
    const size_t t = registry_->Choose(requests[i]);
    batch[t].push_back(&requests[i]);
    positions[t].push_back(i);
  }
  for (size_t t = 0; t < transports.size(); ++t) {
    if (batch[t].empty()) continue;
    std::vector<TransferResult> part(batch[t].size());
    transports[t]->Submit(batch[t], part, deadline_ms);
    const TransportMetrics& m = *metrics_[t];
    for (size_t k = 0; k < part.size(); ++k) {
      const TransferRequest& request = *batch[t][k];
      TransferResult& r = part[k];
      if (r.status.ok() && r.bytes != TotalLength(request)) {  // defensive: never a short OK
        r.status = McError(Code::kTransferFailed, absl::StrCat("short transfer: ", r.bytes, " of ",
                                                               TotalLength(request), " bytes"));
      }
      if (!r.status.ok() || request.proof == Proof::kNone) r.checksum.reset();
      if (m.errors != nullptr) {
        if (!r.status.ok()) {
          m.errors->Inc();
        } else {
          (request.direction == Direction::kWrite ? m.write_bytes : m.read_bytes)->Inc(r.bytes);
        }
      }
      results[positions[t][k]] = std::move(r);
    }
  }
  return results;
}

absl::Status TransferEngine::RegisterMemory(void* base, uint64_t length, MemoryAccess access) {
  const auto& transports = registry_->transports();
  for (size_t t = 0; t < transports.size(); ++t) {
    if (absl::Status s = transports[t]->RegisterMemory(base, length, access); !s.ok()) {
      for (size_t u = 0; u < t; ++u) transports[u]->UnregisterMemory(base);
      return s;
    }
  }
  return absl::OkStatus();
}

void TransferEngine::UnregisterMemory(void* base) {
  for (const auto& transport : registry_->transports()) transport->UnregisterMemory(base);
}

bool TransferEngine::NeedsLocalRegistration() const {
  for (const auto& transport : registry_->transports()) {
    if (transport->NeedsLocalRegistration()) return true;
  }
  return false;
}

GpuTransfers* TransferEngine::gpu() const { return registry_->gpu(); }

std::span<const DataOp> TransferEngine::TransportDataOps() { return TransportRegistry::DataOps(); }

absl::Status TransferEngine::ServeDataOp(const DataRequest& request, RequestStream& stream) {
  for (const auto& transport : registry_->transports()) {
    if (transport->ServesDataOp(request.op)) return transport->ServeDataOp(request, stream);
  }
  return RefuseDataOp(request, stream);
}

absl::Status TransferEngine::status() const { return registry_->status(); }

absl::Status EngineDataOps::RegisterWith(DataServer& server) {
  for (DataOp op : TransferEngine::TransportDataOps()) {
    absl::Status s =
        server.RegisterOpHandler(op, [this](const DataRequest& request, RequestStream& stream) {
          TransferEngine* engine = engine_.load();
          return engine != nullptr ? engine->ServeDataOp(request, stream)
                                   : RefuseDataOp(request, stream);
        });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace mc::transfer
