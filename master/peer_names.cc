#include "master/peer_names.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/status_macros.h"

namespace mc::master {

PeerNames& PeerNames::Instance() {
  static PeerNames* const names = new PeerNames();  // never destroyed: indices outlive statics
  return *names;
}

PeerNames::PeerNames() : chunks_(new std::atomic<Peer*>[kMaxChunks]) {
  for (uint32_t i = 0; i < kMaxChunks; ++i) chunks_[i].store(nullptr, std::memory_order_relaxed);
  uint32_t empty = Intern("", "");
  MC_CHECK(empty == 0);
}

uint32_t PeerNames::Intern(std::string_view client_id, std::string_view endpoint) {
  absl::StatusOr<uint32_t> index = TryIntern(client_id, endpoint);
  MC_CHECK(index.ok());
  return *index;
}

absl::StatusOr<uint32_t> PeerNames::TryIntern(std::string_view client_id,
                                              std::string_view endpoint) {
  const absl::string_view c(client_id.data(), client_id.size());
  const absl::string_view e(endpoint.data(), endpoint.size());
  {
    absl::ReaderMutexLock lock(&mu_);
    auto client = index_.find(c);
    if (client != index_.end()) {
      auto it = client->second.find(e);
      if (it != client->second.end()) return it->second;
    }
  }
  absl::MutexLock lock(&mu_);
  auto client = index_.find(c);
  if (client != index_.end()) {
    auto it = client->second.find(e);
    if (it != client->second.end()) return it->second;  // added meanwhile
  }
  const uint32_t index = size_;
  if (index >= capacity_) {
    return McError(
        Code::kNoSpace,
        absl::StrCat("the master's table of (client id, data endpoint) pairs is full (", capacity_,
                     " pairs, one per registration with a new endpoint, never freed): "
                     "restart or fail over the master to clear it"));
  }
  Peer* chunk = chunks_[index >> kChunkBits].load(std::memory_order_relaxed);
  if (chunk == nullptr) chunk = new Peer[kChunkSize];
  chunk[index & (kChunkSize - 1)] = Peer{std::string(client_id), std::string(endpoint)};
  chunks_[index >> kChunkBits].store(chunk, std::memory_order_release);
  index_[c].emplace(std::string(endpoint), index);
  ++size_;
  return index;
}

size_t PeerNames::SizeForTest() const {
  absl::MutexLock lock(&mu_);
  return size_;
}

void PeerNames::SetCapacityForTest(uint32_t pairs) {
  absl::MutexLock lock(&mu_);
  capacity_ = std::min<uint32_t>(pairs, kMaxChunks * kChunkSize);
}

}  // namespace mc::master
