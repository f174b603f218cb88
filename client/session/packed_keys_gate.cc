#include "client/session/packed_keys_gate.h"

#include <chrono>

#include "common/logging.h"

namespace mc::client {

void PackedKeysGate::OlderMaster(uint64_t seen, size_t asked, std::string_view who) {
  off_until_ms_.store(clock_.NowMs() + retry_ms_, std::memory_order_relaxed);
  MC_LOG_EVERY(std::chrono::minutes(10), Logger("client"), warn,
               "the master does not read packed keys (it saw {} of {}, sent by {}); {} name "
               "them one by one for the next {} ms",
               seen, asked, who, what_, retry_ms_);
}

}  // namespace mc::client
