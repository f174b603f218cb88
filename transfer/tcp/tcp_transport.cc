#include "transfer/tcp/tcp_transport.h"

#include <poll.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "transfer/tcp/pipeline.h"

namespace mc::transfer {
namespace {

using tcp::FrameOp;
using tcp::PipelinedConnection;
using tcp::WireOp;

// The local iovecs of bytes [from, from+length) of a request's scatter list.
std::vector<iovec> SliceLocal(const TransferRequest& request, uint64_t from, uint64_t length) {
  std::vector<iovec> out;
  uint64_t pos = 0;
  for (const LocalBuffer& b : request.local) {
    if (length == 0) break;
    if (from >= pos + b.length) {
      pos += b.length;
      continue;
    }
    const uint64_t skip = from > pos ? from - pos : 0;
    const uint64_t n = std::min(b.length - skip, length);
    out.push_back({b.data + skip, n});
    from += n;
    length -= n;
    pos += b.length;
  }
  return out;
}

// Drives all connections until each finished, failed, or the deadline passed.
void RunPipelines(std::vector<std::unique_ptr<PipelinedConnection>>& conns, int64_t deadline_ms) {
  std::vector<pollfd> fds;
  std::vector<PipelinedConnection*> live;
  while (true) {
    fds.clear();
    live.clear();
    for (auto& c : conns) {
      if (c->Finished()) continue;
      fds.push_back({c->fd(), c->WantedEvents(), 0});
      live.push_back(c.get());
    }
    if (live.empty()) return;
    int timeout = -1;
    if (deadline_ms != 0) {
      const int64_t left = deadline_ms - RealClock::Get().NowMs();
      if (left <= 0) {
        for (PipelinedConnection* c : live) c->FailPending(DeadlineError());
        return;
      }
      timeout = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    const int rc = ::poll(fds.data(), fds.size(), timeout);
    if (rc <= 0) continue;  // timeout (deadline re-checked) or EINTR
    for (size_t i = 0; i < live.size(); ++i) {
      const short ev = fds[i].revents;
      if (ev == 0) continue;
      absl::Status s;
      if ((fds[i].events & POLLOUT) && (ev & (POLLOUT | POLLERR | POLLHUP))) s = live[i]->OnWritable();
      if (s.ok() && (ev & (POLLIN | POLLERR | POLLHUP))) s = live[i]->OnReadable();
      if (!s.ok()) live[i]->FailPending(s);
    }
  }
}

}  // namespace

TcpTransport::TcpTransport(TcpTransportOptions options)
    : options_(options),
      pool_(tcp::ConnectionPoolOptions{options.connections_per_peer,
                                       options.socket_buffer_bytes}) {}

void TcpTransport::Submit(std::span<const TransferRequest* const> requests,
                          std::span<TransferResult> results, int64_t deadline_ms) {
  const uint64_t frame_bytes = std::clamp<uint64_t>(options_.frame_bytes, 1, tcp::kDefaultMaxFrameLength);
  if (deadline_ms != 0 && RealClock::Get().NowMs() >= deadline_ms) {
    for (TransferResult& r : results) r.status = DeadlineError();
    return;
  }
  // Frames, grouped per peer.
  std::vector<WireOp> ops;
  std::map<std::string, std::vector<size_t>> by_peer;  // endpoint -> indices into ops
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& req = *requests[i];
    const uint64_t total = TotalLength(req);
    if (req.offset > UINT64_MAX - total) {
      results[i].status = McError(Code::kInvalidArgument, "segment offset + length overflows");
      continue;
    }
    const FrameOp fop = req.op == OpKind::kRead    ? FrameOp::kRead
                        : req.op == OpKind::kWrite ? FrameOp::kWrite
                                                   : FrameOp::kReadDisk;
    // A disk record is read whole (its owner verifies it as one unit): one frame.
    const uint64_t step = fop == FrameOp::kReadDisk ? std::max<uint64_t>(total, 1) : frame_bytes;
    for (uint64_t done = 0; done < total; done += step) {
      const uint64_t n = std::min(step, total - done);
      WireOp op;
      op.request = i;
      op.header = tcp::MakeRequest(fop, next_request_id_.fetch_add(1), req.segment_id,
                                   fop == FrameOp::kReadDisk ? req.offset : req.offset + done, n);
      op.header.reserved = req.tag;
      op.header_bytes = tcp::EncodeFrameHeader(op.header);
      op.local = SliceLocal(req, done, n);
      by_peer[req.endpoint].push_back(ops.size());
      ops.push_back(std::move(op));
    }
  }
  // Connections: spread each peer's frames over its connections, balancing bytes.
  std::vector<std::unique_ptr<PipelinedConnection>> conns;
  for (auto& [endpoint, indices] : by_peer) {
    const int want = static_cast<int>(std::min<size_t>(
        std::max(1, options_.connections_per_peer), indices.size()));
    auto acquired = pool_.Acquire(endpoint, want, deadline_ms);
    if (!acquired.ok()) {
      const absl::Status err = McError(Code::kTransferFailed, absl::StrCat(
          "tcp: ", std::string(acquired.status().message())));
      for (size_t k : indices) {
        ops[k].done = true;
        ops[k].status = err;
      }
      continue;
    }
    std::vector<std::vector<WireOp*>> assigned(acquired->size());
    std::vector<uint64_t> load(acquired->size(), 0);
    for (size_t k : indices) {
      const size_t c = std::min_element(load.begin(), load.end()) - load.begin();
      assigned[c].push_back(&ops[k]);
      load[c] += ops[k].header.length + tcp::kFrameHeaderSize;
    }
    for (size_t c = 0; c < acquired->size(); ++c) {
      conns.push_back(std::make_unique<PipelinedConnection>(std::move((*acquired)[c]),
                                                            std::move(assigned[c])));
    }
  }
  RunPipelines(conns, deadline_ms);
  for (auto& c : conns) {
    tcp::PeerConnection pc = c->TakeConnection();
    if (pc.fd.valid()) pool_.Release(std::move(pc));
  }
  // Results: a request is OK only when every one of its frames is.
  for (const WireOp& op : ops) {
    TransferResult& r = results[op.request];
    if (!op.status.ok() || !op.done) {
      if (r.status.ok()) r.status = op.done ? op.status : McError(Code::kInternal, "frame lost");
    } else {
      r.bytes += op.header.length;
    }
  }
}

}  // namespace mc::transfer
