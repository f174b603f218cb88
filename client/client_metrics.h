// The mc-client's own metrics, registered once and shared by its components.
#pragma once

#include <string>

#include "common/metrics.h"
#include "common/status.h"

namespace mc::client {

class ClientMetrics {
 public:
  explicit ClientMetrics(MetricsRegistry& registry);

  MetricsRegistry& registry() { return registry_; }
  // Per RPC: requests, latency; per RPC and code: items.
  void CountRequest(const char* rpc) { Requests(rpc).Inc(); }
  void CountItem(const char* rpc, Code code);
  Histogram& Latency(const char* rpc);

  Counter& bytes_in;            // payload bytes put by applications
  Counter& bytes_out;           // payload bytes handed to applications
  Counter& duplicate_keys;      // get items served from another item's transfer
  Counter& checksum_mismatches;
  Counter& lease_expiries;      // transfers that outlived their lease
  Counter& replica_fallbacks;   // a failed replica replaced by another

 private:
  Counter& Requests(const char* rpc);
  MetricsRegistry& registry_;
};

}  // namespace mc::client
