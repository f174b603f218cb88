// PendingBatch: the IoBatch both engines hand out for Submit. It owns the engine's batch state
// (which must have a `std::vector<IoResult> results` member, complete once `done` is set) and
// waits for `done` before giving the results back or freeing the state, so an engine's threads
// never write into freed memory and a caller's buffers are never released while I/O runs.
#pragma once

#include <future>
#include <memory>
#include <utility>
#include <vector>

#include "offload/io_engine.h"

namespace mc::offload::internal {

template <typename State>
class PendingBatch final : public IoBatch {
 public:
  PendingBatch(std::unique_ptr<State> state, std::future<void> done)
      : state_(std::move(state)), done_(std::move(done)) {}
  ~PendingBatch() override {
    if (done_.valid()) done_.wait();
  }
  std::vector<IoResult> Wait() override {
    if (!done_.valid()) return {};
    done_.get();
    return std::move(state_->results);
  }

 private:
  std::unique_ptr<State> state_;
  std::future<void> done_;
};

}  // namespace mc::offload::internal
