// PeerNames: the (client id, data endpoint) pairs the object table's replicas name, interned
// once per process so that a stored replica holds a 32-bit index instead of two strings.
//
// Index 0 is ("", ""). Names are never removed (a process meets few distinct pairs: one per
// client registration at most), so an index stays valid for the life of the process.
// Thread-safe: Intern takes a lock (a reader lock when the pair is known); Get takes none (an
// index is read only after it was handed out, and every chunk it names is published before).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace mc::master {

class PeerNames {
 public:
  struct Peer {
    std::string client_id;
    std::string endpoint;
  };

  // The process's table.
  static PeerNames& Instance();

  // The index of (client_id, endpoint), added if new; NO_SPACE (nothing added) when the table
  // holds its capacity of pairs already. Registration interns a client's pairs this way, so a
  // full table refuses a registration instead of failing inside a later put.
  absl::StatusOr<uint32_t> TryIntern(std::string_view client_id, std::string_view endpoint);
  // TryIntern for pairs already interned at registration: a full table here is a bug (crash).
  uint32_t Intern(std::string_view client_id, std::string_view endpoint);
  // The pair at `index` (an index Intern returned).
  const Peer& Get(uint32_t index) const {
    return chunks_[index >> kChunkBits].load(std::memory_order_acquire)[index & (kChunkSize - 1)];
  }
  size_t SizeForTest() const;
  // Lowers the capacity (at most kMaxChunks * kChunkSize) so a test can fill the table.
  void SetCapacityForTest(uint32_t pairs);

  PeerNames();
  PeerNames(const PeerNames&) = delete;
  PeerNames& operator=(const PeerNames&) = delete;

 private:
  static constexpr uint32_t kChunkBits = 8;
  static constexpr uint32_t kChunkSize = 1u << kChunkBits;
  static constexpr uint32_t kMaxChunks = 1u << 16;  // 16 M pairs

  std::unique_ptr<std::atomic<Peer*>[]> chunks_;  // kMaxChunks; chunks never freed
  mutable absl::Mutex mu_;
  // client id -> endpoint -> index.
  absl::flat_hash_map<std::string, absl::flat_hash_map<std::string, uint32_t>> index_
      ABSL_GUARDED_BY(mu_);
  uint32_t size_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t capacity_ ABSL_GUARDED_BY(mu_) = kMaxChunks * kChunkSize;
};

}  // namespace mc::master
