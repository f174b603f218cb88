// RpcScope: the per-RPC scope of the gRPC services (mc-master's Master service, mc-client's
// Store service). It counts the RPC when it begins and observes its latency in seconds
// (steady_clock) when it ends; whatever else a service counts per RPC (failures, per-item codes)
// it reaches through metrics(). `Metrics` is the service's record of one RPC's metrics, with
// `Counter& requests` and `Histogram& latency`. TooManyItems is both services' answer to a batch
// over their item limit.
#pragma once

#include <chrono>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mc {

template <typename Metrics>
class RpcScope {
 public:
  explicit RpcScope(Metrics& metrics)
      : metrics_(metrics), start_(std::chrono::steady_clock::now()) {
    metrics_.requests.Inc();
  }
  ~RpcScope() {
    const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start_;
    metrics_.latency.Observe(d.count());
  }
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;

  Metrics& metrics() { return metrics_; }

 private:
  Metrics& metrics_;
  const std::chrono::steady_clock::time_point start_;
};

// INVALID_ARGUMENT for a batch of `n` items over the limit of `max` (converted to the RPC's status
// by proto/status_convert.h).
inline absl::Status TooManyItems(size_t n, size_t max) {
  return absl::InvalidArgumentError(
      absl::StrCat("batch of ", n, " items exceeds the limit of ", max));
}

}  // namespace mc
