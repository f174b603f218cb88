#include "offload/io_engine.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/logging.h"
#include "common/status.h"

namespace mc::offload {
namespace {

absl::Status ErrnoError(IoOp op, int err) {
  return McError(Code::kTransferFailed,
                 std::string(op == IoOp::kRead ? "pread: " : "pwrite: ") + std::strerror(err));
}

class PosixIoEngine final : public IoEngine {
 public:
  std::vector<IoResult> SubmitAndWait(std::span<const IoRequest> requests) override {
    std::vector<IoResult> results;
    results.reserve(requests.size());
    for (const IoRequest& r : requests) results.push_back(RunOne(r));
    return results;
  }
  std::string_view Name() const override { return "posix"; }

 private:
  static IoResult RunOne(const IoRequest& r) {
    uint64_t done = 0;
    while (done < r.length) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(r.length - done, 1u << 30));
      const off_t at = static_cast<off_t>(r.offset + done);
      ssize_t n = r.op == IoOp::kRead ? ::pread(r.fd, r.buffer + done, chunk, at)
                                      : ::pwrite(r.fd, r.buffer + done, chunk, at);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return ErrnoError(r.op, errno);
      }
      if (n == 0) {
        return McError(Code::kTransferFailed,
                       r.op == IoOp::kRead ? "short read (end of file)" : "short write");
      }
      done += static_cast<uint64_t>(n);
    }
    return done;
  }
};

}  // namespace

std::unique_ptr<IoEngine> CreatePosixIoEngine() { return std::make_unique<PosixIoEngine>(); }

std::unique_ptr<IoEngine> CreateIoEngine(const IoEngineOptions& options) {
  static auto& log = Logger("offload");
  if (options.force_posix) {
    log.warn("io engine: io_uring disabled by option, using pread/pwrite");
    return CreatePosixIoEngine();
  }
  auto uring = CreateUringIoEngine(options.queue_depth);
  if (uring.ok()) return std::move(*uring);
  log.warn("io engine: io_uring unavailable ({}), falling back to pread/pwrite",
           std::string(uring.status().message()));
  return CreatePosixIoEngine();
}

}  // namespace mc::offload
