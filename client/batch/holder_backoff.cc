#include "client/batch/holder_backoff.h"

namespace mc::client {

bool HolderBackoff::Refused(const std::string& endpoint) {
  if (backoff_ms_ <= 0) return true;
  const int64_t now = clock_.NowMs();
  absl::MutexLock lock(&mu_);
  auto it = until_ms_.find(endpoint);
  if (it != until_ms_.end() && it->second > now) return false;
  if (it == until_ms_.end() && until_ms_.size() >= kMaxEndpoints) {
    absl::erase_if(until_ms_, [now](const auto& entry) { return entry.second <= now; });
    if (until_ms_.size() >= kMaxEndpoints) return true;
  }
  until_ms_[endpoint] = now + backoff_ms_;
  return true;
}

bool HolderBackoff::BackingOff(std::string_view endpoint) const {
  if (backoff_ms_ <= 0) return false;
  absl::MutexLock lock(&mu_);
  auto it = until_ms_.find(absl::string_view(endpoint.data(), endpoint.size()));
  return it != until_ms_.end() && it->second > clock_.NowMs();
}

size_t HolderBackoff::CountForTest() const {
  absl::MutexLock lock(&mu_);
  return until_ms_.size();
}

}  // namespace mc::client
