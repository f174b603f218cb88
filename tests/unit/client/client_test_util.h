// Shared fixture for the client batch-path tests: the real master in-process (FakeMasterClient on
// a FakeClock), a real TransferEngine whose local endpoint is the "local" fake client's endpoint
// (so its replicas move by memcpy through a SegmentTable of vector-backed segments), and an
// optional second client served over loopback TCP by a real TcpDataServer.
#pragma once

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/batch/batch_get.h"
#include "client/batch/batch_put.h"
#include "client/batch/prefix_leases.h"
#include "client/client_metrics.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_master_client.h"
#include "transfer/tcp/server.h"
#include "transfer/transfer_engine.h"

namespace mc::client::testing {

inline constexpr char kLocalId[] = "client-a";
inline constexpr char kLocalEndpoint[] = "local-a:1";
inline constexpr char kSentinel = '\x5a';

// Deterministic pseudo-random payload for `seed`.
inline std::string Payload(size_t size, uint64_t seed) {
  std::string out(size, '\0');
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>(rng() >> 17);
  return out;
}

inline Code CodeOf(const absl::Status& s) { return ToCode(s); }

// A fake client's memory: vector-backed segments registered with the master and published in a
// SegmentTable under the ids the master assigned.
struct FakeSegments {
  std::string client_id;
  std::string endpoint;
  std::vector<std::vector<char>> backing;
  std::vector<uint64_t> ids;
  transfer::SegmentTable* table = nullptr;

  // Pointer to [offset, offset+len) of segment `id`, or nullptr if not ours.
  char* Resolve(uint64_t id, uint64_t offset, uint64_t len) const {
    auto r = table->Resolve(id, offset, len);
    return r.ok() ? *r : nullptr;
  }
};

class ClientFixture : public ::testing::Test {
 protected:
  ClientFixture() : ClientFixture(FakeMasterClient::DefaultOptions()) {}
  explicit ClientFixture(master::MasterOptions options)
      : ClientFixture(std::move(options), EngineOptions()) {}
  // `engine`: EngineOptions() with changes (e.g. a fake CUDA device).
  ClientFixture(master::MasterOptions options, transfer::TransferEngineOptions engine)
      // The engine's deadlines are on the real steady clock: start the fake clock there.
      : clock_(RealClock::Get().NowMs()),
        master_(clock_, options),
        engine_(std::move(engine), local_table_),
        metrics_(registry_),
        prefix_leases_(clock_),
        putter_(PutOptions(0), master_, engine_, clock_, metrics_),
        getter_(BatchGetOptions{kLocalId, kLocalEndpoint, 0, 8}, master_, engine_, prefix_leases_,
                clock_, metrics_) {}

  void SetUp() override { local_ = Register(kLocalId, kLocalEndpoint, local_table_, 2, 1 << 20); }

  static BatchPutOptions PutOptions(int64_t no_space_wait_ms) {
    return {.client_id = kLocalId, .max_replicas = 8, .no_space_wait_ms = no_space_wait_ms};
  }

  static transfer::TransferEngineOptions EngineOptions() {
    transfer::TransferEngineOptions o;
    o.local_endpoint = kLocalEndpoint;
    o.local.copy_threads = 1;
    o.tcp.connections_per_peer = 1;
    o.tcp.socket_buffers = {.send_bytes = 1 << 20, .receive_bytes = 1 << 20};
    return o;
  }

  // Registers a fake client with `count` segments of `size` bytes published in `table`.
  std::unique_ptr<FakeSegments> Register(const std::string& id, const std::string& endpoint,
                                         transfer::SegmentTable& table, int count, uint64_t size) {
    auto segs = std::make_unique<FakeSegments>();
    segs->client_id = id;
    segs->endpoint = endpoint;
    segs->table = &table;
    v1::RegisterClientRequest req;
    req.set_client_id(id);
    req.set_host("host-" + id);
    req.set_data_endpoint(endpoint);
    for (int i = 0; i < count; ++i) {
      auto* s = req.add_segments();
      s->set_local_index(i);
      s->set_size(size);
      segs->backing.emplace_back(size, '\0');
    }
    v1::RegisterClientResponse resp;
    absl::Status s = master_.RegisterClient(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    for (int i = 0; i < resp.segment_ids_size(); ++i) {
      segs->ids.push_back(resp.segment_ids(i));
      table.Add(resp.segment_ids(i), segs->backing[i].data(), size);
    }
    return segs;
  }

  // Starts a second client whose segments are served over loopback TCP.
  void StartRemote(int count = 1, uint64_t size = 1 << 20) {
    transfer::tcp::TcpDataServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.socket_buffers = {.send_bytes = 1 << 20, .receive_bytes = 1 << 20};
    remote_server_ = std::make_unique<transfer::tcp::TcpDataServer>(o, remote_table_);
    ASSERT_TRUE(remote_server_->Start().ok());
    remote_ = Register("client-b", remote_server_->endpoint(), remote_table_, count, size);
  }

  std::vector<absl::Status> Put(const std::vector<std::string>& keys,
                                const std::vector<std::string>& payloads, uint32_t replicas = 1,
                                int pieces = 1) {
    std::vector<PutRequestItem> items(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      items[i].key = keys[i];
      const std::string& p = payloads[i];
      const size_t step = p.size() / pieces;
      size_t pos = 0;
      for (int k = 0; k < pieces; ++k) {
        size_t n = k + 1 == pieces ? p.size() - pos : step;
        items[i].pieces.push_back({const_cast<char*>(p.data()) + pos, n});
        pos += n;
      }
    }
    return putter_.Put(items, replicas);
  }
  void PutOk(const std::string& key, const std::string& payload, uint32_t replicas = 1) {
    auto s = Put({key}, {payload}, replicas);
    ASSERT_TRUE(s[0].ok()) << key << ": " << s[0];
  }

  // The lookup of `key` straight from the master (no lease).
  v1::KeyReplicas Lookup(const std::string& key) {
    v1::GetReplicasRequest req;
    req.add_keys(key);
    req.set_no_lease(true);
    v1::GetReplicasResponse resp;
    EXPECT_TRUE(master_.GetReplicas(req, &resp).ok());
    return resp.results_size() == 1 ? resp.results(0) : v1::KeyReplicas();
  }

  // Flips one byte of the replica of `key` held by `segs` (returns false if it holds none).
  bool Scribble(const std::string& key, const FakeSegments& segs, uint64_t at = 0) {
    v1::KeyReplicas kr = Lookup(key);
    for (const auto& rep : kr.replicas()) {
      if (rep.client_id() != segs.client_id) continue;
      char* p = segs.Resolve(rep.segment_id(), rep.offset(), rep.length());
      if (p == nullptr) return false;
      p[at] ^= 0x01;
      return true;
    }
    return false;
  }

  FakeClock clock_;
  FakeMasterClient master_;
  transfer::SegmentTable local_table_;
  transfer::SegmentTable remote_table_;
  transfer::TransferEngine engine_;
  MetricsRegistry registry_;
  ClientMetrics metrics_;
  PrefixLeases prefix_leases_;
  BatchPutter putter_;
  BatchGetter getter_;
  std::unique_ptr<FakeSegments> local_;
  // Declared before the server so it is destroyed after it: the server's threads may still be
  // answering a read out of this memory when a test ends (ASan caught one doing so).
  std::unique_ptr<FakeSegments> remote_;
  std::unique_ptr<transfer::tcp::TcpDataServer> remote_server_;
};

// Destination memory for gets: one arena, pre-filled with a sentinel, carved into slices.
class DestArena {
 public:
  explicit DestArena(size_t size) : mem_(size, kSentinel) {}
  // `len` bytes at `offset`, split into `pieces` slices.
  std::vector<LocalBuffer> Slices(size_t offset, size_t len, int pieces = 1) {
    std::vector<LocalBuffer> out;
    const size_t step = len / pieces;
    size_t pos = 0;
    for (int k = 0; k < pieces; ++k) {
      size_t n = k + 1 == pieces ? len - pos : step;
      out.push_back({mem_.data() + offset + pos, n});
      pos += n;
    }
    return out;
  }
  std::string Bytes(size_t offset, size_t len) const {
    return std::string(mem_.data() + offset, len);
  }
  bool AllSentinel(size_t offset, size_t len) const {
    for (size_t i = 0; i < len; ++i) {
      if (mem_[offset + i] != kSentinel) return false;
    }
    return true;
  }
  char* data() { return mem_.data(); }

 private:
  std::vector<char> mem_;
};

// Concatenation of scattered slices.
inline std::string Gather(const std::vector<LocalBuffer>& slices) {
  std::string out;
  for (const LocalBuffer& b : slices) out.append(b.data, b.length);
  return out;
}

// An InlineSink backed by strings, one per item.
class StringSink final : public InlineSink {
 public:
  explicit StringSink(size_t items, uint64_t max = UINT64_MAX) : data_(items), max_(max) {}
  char* Allocate(size_t item, uint64_t size) override {
    if (size > max_) return nullptr;
    data_[item].assign(size, kSentinel);
    return data_[item].data();
  }
  const std::string& data(size_t item) const { return data_[item]; }

 private:
  std::vector<std::string> data_;
  uint64_t max_;
};

// `key` must outlive the item (GetRequestItem holds a string_view).
inline GetRequestItem SliceItem(std::string_view key, std::vector<LocalBuffer> slices) {
  GetRequestItem item;
  item.key = key;
  item.slices = std::move(slices);
  return item;
}
inline GetRequestItem InlineItem(std::string_view key) {
  GetRequestItem item;
  item.key = key;
  item.inline_data = true;
  return item;
}

// Gets `keys` through `getter` (one slice each, of payloads[i].size() bytes cut into 1 + i % 3
// pieces), checks that each OK item holds exactly its payload and that `master` is left holding
// no lease, and returns the results (a caller checks which items must succeed).
inline std::vector<GetItemResult> GetAndCheck(BatchGetter& getter, FakeMasterClient& master,
                                              const std::vector<std::string>& keys,
                                              const std::vector<std::string>& payloads) {
  size_t total = 0;
  for (const auto& p : payloads) total += p.size();
  DestArena arena(total);
  std::vector<GetRequestItem> items;
  size_t pos = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    items.push_back(SliceItem(keys[i], arena.Slices(pos, payloads[i].size(), 1 + i % 3)));
    pos += payloads[i].size();
  }
  std::vector<GetItemResult> res = getter.Get(items, 0, nullptr);
  EXPECT_EQ(res.size(), keys.size());
  pos = 0;
  for (size_t i = 0; i < res.size(); ++i) {
    if (res[i].status.ok()) {
      EXPECT_EQ(res[i].bytes_written, payloads[i].size()) << keys[i];
      EXPECT_TRUE(arena.Bytes(pos, payloads[i].size()) == payloads[i])
          << keys[i] << ": OK but its destination does not hold the payload";
    }
    pos += payloads[i].size();
  }
  EXPECT_EQ(master.service().ActiveLeaseCount(), 0u) << "leases of this get must be released";
  return res;
}

}  // namespace mc::client::testing
