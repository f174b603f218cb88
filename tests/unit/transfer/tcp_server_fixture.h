// The fixture the authenticated and encrypted data-plane tests (tcp_auth_test.cc,
// tcp_encryption_test.cc) share: one segment of `segment_bytes` filled with 'M' behind a real
// TcpDataServer on loopback, the cluster keys of secret "s"*40, a capability verifier holding
// the segment owner's key with the master's clock at kMasterNow, and builders for the server's
// and the engine's options and for capabilities. Each test class sets what it tests on the
// options (handshake timeout, required encryption, ...) and starts the server itself.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/auth.h"
#include "common/capability.h"
#include "common/metrics.h"
#include "tests/fakes/fake_clock.h"
#include "transfer/tcp/server.h"
#include "transfer/transfer_engine.h"

namespace mc::transfer::testing {

inline constexpr uint64_t kSegment = 5;
inline constexpr int64_t kMasterNow = 5'000'000;

class TcpServerFixture : public ::testing::Test {
 protected:
  explicit TcpServerFixture(uint64_t segment_bytes)
      : keys_(*auth::ClusterKeys::FromSecrets({std::string(40, 's')})),
        owner_key_(32, 'o'),
        verifier_({.clock_skew_ms = 50}, clock_) {
    memory_.assign(segment_bytes, 'M');
    table_.Add(kSegment, memory_.data(), memory_.size());
    verifier_.SetKey(owner_key_);
    verifier_.SetMasterClock(kMasterNow, clock_.NowMs());
  }

  // A server on a free loopback port over the segment, with `keys` (default keys_), this
  // fixture's metrics and capability verifier.
  tcp::TcpDataServerOptions ServerOptions(auth::ClusterKeysPtr keys = nullptr) {
    tcp::TcpDataServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.metrics = &metrics_;
    o.cluster_keys = keys != nullptr ? std::move(keys) : keys_;
    o.capabilities = &verifier_;
    return o;
  }
  // A tcp transfer engine proving `keys` (none when null) that sends frames of `frame_bytes`.
  static TransferEngineOptions EngineOptions(auth::ClusterKeysPtr keys, uint64_t frame_bytes) {
    TransferEngineOptions o;
    o.local_endpoint = "127.0.0.1:1";
    o.transport = "tcp";
    o.tcp.cluster_keys = std::move(keys);
    o.tcp.frame_bytes = frame_bytes;
    return o;
  }
  // A capability for `right` on [offset, offset + length) of `segment`, minted with the owner's
  // key (or `key`), valid until `expiry` on the master's clock.
  std::string Cap(auth::Right right, uint64_t segment, uint64_t offset, uint64_t length,
                  int64_t expiry = kMasterNow + 1000, const std::string& key = "") const {
    const auth::CapabilityBytes b =
        auth::MintCapability(auth::OwnerKey(key.empty() ? owner_key_ : key),
                             auth::Capability{right, 0, segment, offset, length, 1, expiry});
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  bool SegmentUntouched() const {
    return std::all_of(memory_.begin(), memory_.end(), [](char c) { return c == 'M'; });
  }

  FakeClock clock_;
  auth::ClusterKeysPtr keys_;
  std::string owner_key_;
  auth::CapabilityVerifier verifier_;
  MetricsRegistry metrics_;
  std::vector<char> memory_;
  SegmentTable table_;
  SegmentTable local_table_;
  std::unique_ptr<tcp::TcpDataServer> server_;
};

}  // namespace mc::transfer::testing
