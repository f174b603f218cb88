#include "transfer/tcp/tcp_transport.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checksum.h"
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

// How a request's target travels in frame fields (frame.h): a segment range as READ or WRITE
// frames at consecutive offsets; an SSD record as one READ_DISK frame (segment_id = generation,
// offset = locator, reserved = key tag); an index notice as one INDEX frame (fields 0).
struct FramePlan {
  FrameOp op;
  uint64_t segment_id = 0;
  uint64_t offset = 0;  // of the first frame
  uint32_t reserved = 0;
  // One frame for the whole request: a disk record is read whole (its owner verifies it as one
  // unit), an index notice decoded whole.
  bool whole = false;
};

FramePlan PlanFrames(const TransferRequest& request) {
  if (const SegmentRange* range = AsSegmentRange(request)) {
    return {request.direction == Direction::kRead ? FrameOp::kRead : FrameOp::kWrite,
            range->segment_id, range->offset};
  }
  if (const DiskRecord* record = AsDiskRecord(request)) {
    return {FrameOp::kReadDisk, record->generation, record->locator, record->key_tag, true};
  }
  return {FrameOp::kIndex, 0, 0, 0, true};
}

// Hash state for each request that wants its delivered bytes' checksum (null for the others).
std::vector<std::unique_ptr<StreamingChecksum>> DeliveredBytesSums(
    std::span<const TransferRequest* const> requests) {
  std::vector<std::unique_ptr<StreamingChecksum>> sums(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i]->proof == Proof::kDeliveredBytes) {
      sums[i] = std::make_unique<StreamingChecksum>();
    }
  }
  return sums;
}

// The frames of a batch, grouped per peer.
struct Frames {
  std::vector<WireOp> ops;
  std::map<std::string, std::vector<size_t>> by_peer;  // endpoint -> indices into ops
};

// Cuts each request into frames of at most `frame_bytes` (one frame for a whole-record plan);
// a request whose range overflows fails in `results` and gets none.
Frames CutFrames(std::span<const TransferRequest* const> requests,
                 std::span<TransferResult> results, uint64_t frame_bytes,
                 const std::vector<std::unique_ptr<StreamingChecksum>>& sums,
                 std::atomic<uint64_t>& next_request_id) {
  Frames frames;
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& req = *requests[i];
    const uint64_t total = TotalLength(req);
    const FramePlan plan = PlanFrames(req);
    if (plan.offset > UINT64_MAX - total) {
      results[i].status = McError(Code::kInvalidArgument, "segment offset + length overflows");
      continue;
    }
    const uint64_t step = plan.whole ? std::max<uint64_t>(total, 1) : frame_bytes;
    for (uint64_t done = 0; done < total; done += step) {
      const uint64_t n = std::min(step, total - done);
      WireOp op;
      op.request = i;
      op.header = tcp::MakeRequest(plan.op, next_request_id.fetch_add(1), plan.segment_id,
                                   plan.offset + done, n);
      op.header.reserved = plan.reserved;
      op.header_bytes = tcp::EncodeFrameHeader(op.header);
      // Every frame cut from the request carries the capability of the whole range.
      if (req.capability.size() == op.capability.size()) {
        std::memcpy(op.capability.data(), req.capability.data(), op.capability.size());
      }
      op.local = SliceLocal(req, done, n);
      op.checksum = sums[i].get();
      frames.by_peer[req.endpoint].push_back(frames.ops.size());
      frames.ops.push_back(std::move(op));
    }
  }
  return frames;
}

// Units of assignment among one peer's frames `indices`: a hashed request (all its frames), or
// one frame of another.
size_t AssignmentUnits(const std::vector<WireOp>& ops, const std::vector<size_t>& indices) {
  size_t units = 0;
  for (size_t j = 0; j < indices.size(); ++j) {
    const WireOp& op = ops[indices[j]];
    if (op.checksum == nullptr || j == 0 || ops[indices[j - 1]].request != op.request) ++units;
  }
  return units;
}

// Spreads one peer's frames `indices` over `connections`, balancing bytes; a hashed request's
// frames (consecutive in `indices`) stay on the connection its first frame got, in order, and
// count whole toward that connection's load.
std::vector<std::vector<WireOp*>> SpreadFrames(std::vector<WireOp>& ops,
                                               const std::vector<size_t>& indices,
                                               std::span<const TransferRequest* const> requests,
                                               uint64_t frame_bytes, size_t connections) {
  std::vector<std::vector<WireOp*>> assigned(connections);
  std::vector<uint64_t> load(connections, 0);
  size_t sticky_request = SIZE_MAX, sticky_conn = 0;
  for (size_t k : indices) {
    const WireOp& op = ops[k];
    size_t c;
    if (op.checksum != nullptr && op.request == sticky_request) {
      c = sticky_conn;
    } else {
      c = std::min_element(load.begin(), load.end()) - load.begin();
      if (op.checksum != nullptr) {
        sticky_request = op.request;
        sticky_conn = c;
        const uint64_t total = TotalLength(*requests[op.request]);
        const uint64_t frames = (total + frame_bytes - 1) / frame_bytes;
        load[c] += total + frames * tcp::kFrameHeaderSize;
      }
    }
    assigned[c].push_back(&ops[k]);
    if (op.checksum == nullptr) load[c] += op.header.length + tcp::kFrameHeaderSize;
  }
  return assigned;
}

// Results: a request is OK only when every one of its frames is; its checksum when it asked
// for one and every byte arrived.
void CollectResults(std::span<const TransferRequest* const> requests,
                    const std::vector<WireOp>& ops,
                    const std::vector<std::unique_ptr<StreamingChecksum>>& sums,
                    std::span<TransferResult> results) {
  for (const WireOp& op : ops) {
    TransferResult& r = results[op.request];
    if (!op.status.ok() || !op.done) {
      if (r.status.ok()) r.status = op.done ? op.status : McError(Code::kInternal, "frame lost");
    } else {
      r.bytes += op.header.length;
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (sums[i] != nullptr && results[i].status.ok() &&
        results[i].bytes == TotalLength(*requests[i])) {
      results[i].checksum = sums[i]->Digest();
    }
  }
}

// Drives the connections of one group until each finished, failed, or the deadline passed.
void RunPipelines(const std::vector<PipelinedConnection*>& conns, int64_t deadline_ms) {
  std::vector<pollfd> fds;
  std::vector<PipelinedConnection*> live;
  while (true) {
    fds.clear();
    live.clear();
    for (PipelinedConnection* c : conns) {
      if (c->Finished()) continue;
      fds.push_back({c->fd(), c->WantedEvents(), 0});
      live.push_back(c);
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
      if ((fds[i].events & POLLOUT) && (ev & (POLLOUT | POLLERR | POLLHUP)))
        s = live[i]->OnWritable();
      if (s.ok() && (ev & (POLLIN | POLLERR | POLLHUP))) s = live[i]->OnReadable();
      if (!s.ok()) live[i]->FailPending(s);
    }
  }
}

}  // namespace

TcpTransport::TcpTransport(TcpTransportOptions options)
    : options_(options),
      pool_(tcp::ConnectionPoolOptions{.connections_per_peer = options.connections_per_peer,
                                       .socket_buffers = options.socket_buffers,
                                       .cluster_keys = options.cluster_keys,
                                       .encrypt = options.encryption}),
      workers_(std::max(0, options.receive_threads)) {}

void TcpTransport::Submit(std::span<const TransferRequest* const> requests,
                          std::span<TransferResult> results, int64_t deadline_ms) {
  const uint64_t frame_bytes =
      std::clamp<uint64_t>(options_.frame_bytes, 1, tcp::kDefaultMaxFrameLength);
  if (deadline_ms != 0 && RealClock::Get().NowMs() >= deadline_ms) {
    for (TransferResult& r : results) r.status = DeadlineError();
    return;
  }
  const std::vector<std::unique_ptr<StreamingChecksum>> sums = DeliveredBytesSums(requests);
  Frames frames = CutFrames(requests, results, frame_bytes, sums, next_request_id_);
  // Connections: spread each peer's frames over its connections, balancing bytes.
  std::vector<std::unique_ptr<PipelinedConnection>> conns;
  for (auto& [endpoint, indices] : frames.by_peer) {
    const int want = static_cast<int>(std::min<size_t>(std::max(1, options_.connections_per_peer),
                                                       AssignmentUnits(frames.ops, indices)));
    auto acquired = pool_.Acquire(endpoint, want, deadline_ms);
    if (!acquired.ok()) {
      const absl::Status err = WithPeerUnreachableOf(
          McError(Code::kTransferFailed,
                  absl::StrCat("tcp: ", std::string(acquired.status().message()))),
          acquired.status());
      for (size_t k : indices) {
        frames.ops[k].done = true;
        frames.ops[k].status = err;
      }
      continue;
    }
    std::vector<std::vector<WireOp*>> assigned =
        SpreadFrames(frames.ops, indices, requests, frame_bytes, acquired->size());
    for (size_t c = 0; c < acquired->size(); ++c) {
      conns.push_back(
          std::make_unique<PipelinedConnection>(std::move((*acquired)[c]), std::move(assigned[c])));
    }
  }
  // Poll loops: connection c belongs to group c % groups; the groups run in parallel.
  const size_t groups = std::min<size_t>(conns.size(), static_cast<size_t>(workers_.size()) + 1);
  std::vector<std::vector<PipelinedConnection*>> group(groups);
  for (size_t c = 0; c < conns.size(); ++c) group[c % groups].push_back(conns[c].get());
  workers_.Run(groups, [&group, deadline_ms](size_t g) { RunPipelines(group[g], deadline_ms); });
  for (auto& c : conns) {
    tcp::PeerConnection pc = c->TakeConnection();
    if (pc.fd.valid()) pool_.Release(std::move(pc));
  }
  CollectResults(requests, frames.ops, sums, results);
}

}  // namespace mc::transfer
