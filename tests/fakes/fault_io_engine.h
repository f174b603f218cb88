// An IoEngine that forwards to a real one but fails the requests a test asks it to fail.
#pragma once

#include <atomic>
#include <vector>

#include "common/status.h"
#include "offload/io_engine.h"

namespace mc::offload {

class FaultIoEngine final : public IoEngine {
 public:
  explicit FaultIoEngine(IoEngine& real) : real_(real) {}

  // While set, every write (or read) request fails with kTransferFailed without touching the file.
  std::atomic<bool> fail_writes{false};
  std::atomic<bool> fail_reads{false};

  std::vector<IoResult> SubmitAndWait(std::span<const IoRequest> requests) override {
    std::vector<IoRequest> pass;
    std::vector<int> index(requests.size(), -1);
    for (size_t i = 0; i < requests.size(); ++i) {
      const bool fail = requests[i].op == IoOp::kWrite ? fail_writes.load() : fail_reads.load();
      if (!fail) {
        index[i] = static_cast<int>(pass.size());
        pass.push_back(requests[i]);
      }
    }
    std::vector<IoResult> real = real_.SubmitAndWait(pass);
    std::vector<IoResult> out;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (index[i] < 0) {
        out.push_back(McError(Code::kTransferFailed, "injected I/O error"));
      } else {
        out.push_back(std::move(real[static_cast<size_t>(index[i])]));
      }
    }
    return out;
  }
  std::string_view Name() const override { return real_.Name(); }

 private:
  IoEngine& real_;
};

}  // namespace mc::offload
