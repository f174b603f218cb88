#include "transfer/cuda/gpu_mover.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>

#include "common/logging.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "transfer/transport.h"

namespace mc::transfer::cuda {

struct GpuMover::Lane {
  Stream stream = 0;
  HashRange* ranges = nullptr;  // pinned, `capacity` entries
  uint64_t* out = nullptr;      // pinned, `capacity` entries
  uint32_t capacity = 0;
};

namespace {

struct Op {
  size_t request;
  CopyOp copy;
};

// One batched submission of copies [first, end) of a lane, fenced by `event`.
struct Submission {
  size_t first = 0;
  size_t end = 0;
  Event event = 0;
  bool recorded = false;
  bool done = false;
};

}  // namespace

struct GpuMover::Plan {
  struct LanePlan {
    Lane* lane = nullptr;
    std::vector<Op> ops;
    std::vector<Submission> subs;
    std::vector<size_t> hashed;  // request of hash slot i
    Submission hash;             // the kernel's fence (first/end unused)
    bool hash_enqueued = false;
    bool hash_done = false;
    std::vector<Event> events;  // every event recorded on the stream, in order
    size_t limit = 0;           // submissions that may complete (an enqueue failure cuts it)
    size_t next = 0;            // first submission not yet known done
    bool async_failed = false;  // an event reported an error: nothing further is known
    absl::Status error;         // the first failure of this lane
    bool Finished() const {
      return async_failed || (next == limit && (!hash_enqueued || hash_done));
    }
  };
  std::vector<LanePlan> lanes;
  std::vector<absl::Status> invalid;  // per request: set when it was rejected before planning
  bool deadline_passed = false;
};

GpuMover::GpuMover(CudaApi& api, GpuMoverOptions options)
    : api_(api),
      options_(options),
      clock_(options.clock != nullptr ? *options.clock : RealClock::Get()) {}

absl::StatusOr<std::unique_ptr<GpuMover>> GpuMover::Create(CudaApi& api, GpuMoverOptions options) {
  if (options.streams < 1 || options.streams_per_move < 1 || options.max_ops_per_batch < 1) {
    return McError(Code::kInvalidArgument, "gpu mover: streams and batch sizes must be >= 1");
  }
  std::unique_ptr<GpuMover> mover(new GpuMover(api, options));
  for (int i = 0; i < options.streams; ++i) {
    auto lane = std::make_unique<Lane>();
    MC_ASSIGN_OR_RETURN(lane->stream, api.CreateStream(options.device));
    mover->lanes_.push_back(std::move(lane));
    MC_RETURN_IF_ERROR(
        mover->EnsureHashCapacity(*mover->lanes_.back(), options.max_hashes_per_stream));
  }
  absl::MutexLock lock(&mover->mu_);
  for (auto& lane : mover->lanes_) mover->idle_.push_back(lane.get());
  return mover;
}

GpuMover::~GpuMover() {
  absl::MutexLock lock(&mu_);
  if (lost_) return;  // abandoned streams may still reference memory: leak rather than free
  for (auto& lane : lanes_) {
    api_.SynchronizeStream(lane->stream).IgnoreError();  // best effort; the process moves on
    api_.DestroyStream(lane->stream);
    if (lane->ranges != nullptr) api_.FreePinned(lane->ranges);
    if (lane->out != nullptr) api_.FreePinned(lane->out);
  }
}

absl::Status GpuMover::EnsureHashCapacity(Lane& lane, uint32_t count) {
  if (count <= lane.capacity) return absl::OkStatus();
  const uint32_t capacity = std::max(count, lane.capacity * 2);
  MC_ASSIGN_OR_RETURN(void* ranges, api_.AllocPinned(uint64_t{capacity} * sizeof(HashRange)));
  absl::StatusOr<void*> out = api_.AllocPinned(uint64_t{capacity} * sizeof(uint64_t));
  if (!out.ok()) {
    api_.FreePinned(ranges);
    return out.status();
  }
  if (lane.ranges != nullptr) api_.FreePinned(lane.ranges);
  if (lane.out != nullptr) api_.FreePinned(lane.out);
  lane.ranges = static_cast<HashRange*>(ranges);
  lane.out = static_cast<uint64_t*>(*out);
  lane.capacity = capacity;
  return absl::OkStatus();
}

std::vector<GpuMover::Lane*> GpuMover::AcquireLanes(size_t wanted) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return lost_ || !idle_.empty(); };
  mu_.Await(absl::Condition(&ready));
  std::vector<Lane*> taken;
  if (lost_) return taken;
  wanted = std::min({wanted, idle_.size(), static_cast<size_t>(options_.streams_per_move)});
  for (size_t i = 0; i < wanted; ++i) {
    taken.push_back(idle_.back());
    idle_.pop_back();
  }
  return taken;
}

void GpuMover::ReleaseLanes(std::span<Lane* const> lanes, bool abandoned) {
  absl::MutexLock lock(&mu_);
  if (abandoned) {
    lost_ = true;
    return;
  }
  idle_.insert(idle_.end(), lanes.begin(), lanes.end());
}

void GpuMover::Enqueue(Plan& plan, size_t lane_index, std::span<const GpuMoveRequest> requests) {
  Plan::LanePlan& lp = plan.lanes[lane_index];
  Lane& lane = *lp.lane;
  auto record = [&](Submission& sub) -> absl::Status {
    absl::StatusOr<Event> event = api_.RecordEvent(lane.stream);
    if (!event.ok()) return event.status();
    sub.event = *event;
    sub.recorded = true;
    lp.events.push_back(*event);
    return absl::OkStatus();
  };
  uint64_t batches = 0;
  std::vector<CopyOp> batch;
  for (size_t first = 0; first < lp.ops.size(); first += options_.max_ops_per_batch) {
    const size_t end = std::min(lp.ops.size(), first + size_t{options_.max_ops_per_batch});
    batch.clear();
    for (size_t i = first; i < end; ++i) batch.push_back(lp.ops[i].copy);
    Submission& sub = lp.subs.emplace_back();
    sub.first = first;
    sub.end = end;
    absl::Status s = api_.CopyBatchAsync(lane.stream, batch);
    ++batches;
    if (s.ok()) s = record(sub);
    if (!s.ok()) {
      lp.error = McError(Code::kTransferFailed, "cuda: " + std::string(s.message()));
      // Fence whatever the failed call may have enqueued, so the drain waits for it.
      Submission fence;
      record(fence).IgnoreError();  // a lost device fails this too; the drain then sees it
      break;
    }
    lp.limit = lp.subs.size();
  }
  if (lp.error.ok() && !lp.hashed.empty()) {
    absl::Status s = EnsureHashCapacity(lane, static_cast<uint32_t>(lp.hashed.size()));
    if (s.ok()) {
      for (size_t i = 0; i < lp.hashed.size(); ++i) {
        const GpuMoveRequest& r = requests[lp.hashed[i]];
        const CopyOp& c = r.copies[0];
        const void* hashed = r.hash_source ? c.src : c.dst;
        lane.ranges[i] = HashRange{reinterpret_cast<uint64_t>(hashed), c.length};
        lane.out[i] = 0;
      }
      s = api_.HashAsync(lane.stream, lane.ranges, lane.out,
                         static_cast<uint32_t>(lp.hashed.size()));
      if (s.ok()) {
        absl::MutexLock lock(&mu_);
        ++hash_launches_;
      }
    }
    if (s.ok()) s = record(lp.hash);
    if (s.ok()) {
      lp.hash_enqueued = true;
    } else {  // the copies may still complete; only the hash is lost
      lp.error = McError(Code::kTransferFailed, "cuda hash: " + std::string(s.message()));
      Submission fence;
      record(fence).IgnoreError();
    }
  }
  absl::MutexLock lock(&mu_);
  batches_ += batches;
}

void GpuMover::Wait(Plan& plan, int64_t deadline_ms) {
  while (true) {
    bool all = true;
    for (Plan::LanePlan& lp : plan.lanes) {
      while (!lp.async_failed && lp.next < lp.limit) {
        absl::StatusOr<bool> done = api_.QueryEvent(lp.subs[lp.next].event);
        if (!done.ok()) {
          lp.async_failed = true;
          lp.error =
              McError(Code::kTransferFailed, "cuda: " + std::string(done.status().message()));
        } else if (*done) {
          lp.subs[lp.next++].done = true;
        } else {
          break;
        }
      }
      if (!lp.async_failed && lp.next == lp.limit && lp.hash_enqueued && !lp.hash_done) {
        absl::StatusOr<bool> done = api_.QueryEvent(lp.hash.event);
        if (!done.ok()) {
          lp.async_failed = true;
          lp.error =
              McError(Code::kTransferFailed, "cuda hash: " + std::string(done.status().message()));
        } else {
          lp.hash_done = *done;
        }
      }
      all = all && lp.Finished();
    }
    if (all) return;
    if (deadline_ms != 0 && clock_.NowMs() >= deadline_ms) {
      plan.deadline_passed = true;
      return;
    }
    if (options_.poll_interval_us > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(options_.poll_interval_us));
    }
  }
}

size_t GpuMover::Validate(std::span<const GpuMoveRequest> requests, Plan& plan, uint64_t& total) {
  plan.invalid.resize(requests.size());
  size_t valid = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GpuMoveRequest& r = requests[i];
    if (r.hash_destination && r.hash_source) {
      plan.invalid[i] =
          McError(Code::kInvalidArgument, "device hash of the source or the destination, not both");
      continue;
    }
    if (r.hash_only && !r.hash_destination) {
      plan.invalid[i] = McError(Code::kInvalidArgument, "hash_only needs hash_destination");
      continue;
    }
    if ((r.hash_destination || r.hash_source) && r.copies.size() != 1) {
      plan.invalid[i] =
          McError(Code::kInvalidArgument, "device hash needs exactly one contiguous copy to hash");
      continue;
    }
    for (const CopyOp& c : r.copies) total += c.length;
    ++valid;
  }
  return valid;
}

void GpuMover::AssignToLanes(std::span<const GpuMoveRequest> requests, uint64_t total, Plan& plan) {
  // Contiguous runs of requests per lane, about total/lanes bytes each.
  const size_t lanes = plan.lanes.size();
  const uint64_t share = (total + lanes - 1) / lanes;
  size_t li = 0;
  uint64_t in_lane = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!plan.invalid[i].ok()) continue;
    if (in_lane >= share && li + 1 < lanes) {
      ++li;
      in_lane = 0;
    }
    Plan::LanePlan& lp = plan.lanes[li];
    for (const CopyOp& c : requests[i].copies) {
      if (c.length == 0) continue;
      if (!requests[i].hash_only) lp.ops.push_back(Op{i, c});
      in_lane += c.length;
    }
    if (requests[i].hash_destination || requests[i].hash_source) lp.hashed.push_back(i);
  }
}

std::vector<GpuMoveResult> GpuMover::Move(std::span<const GpuMoveRequest> requests,
                                          int64_t deadline_ms) {
  std::vector<GpuMoveResult> results(requests.size());
  Plan plan;
  uint64_t total = 0;
  if (Validate(requests, plan, total) == 0) {
    for (size_t i = 0; i < requests.size(); ++i) results[i].status = plan.invalid[i];
    return results;
  }

  std::vector<Lane*> lanes = AcquireLanes(options_.streams_per_move);
  if (lanes.empty()) {
    for (size_t i = 0; i < requests.size(); ++i) {
      results[i].status = plan.invalid[i].ok()
                              ? McError(Code::kUnavailable, "cuda: device declared lost")
                              : plan.invalid[i];
    }
    return results;
  }
  plan.lanes.resize(lanes.size());
  AssignToLanes(requests, total, plan);
  for (size_t l = 0; l < lanes.size(); ++l) {
    plan.lanes[l].lane = lanes[l];
    Enqueue(plan, l, requests);
  }
  Wait(plan, deadline_ms);
  const bool abandoned = !Drain(plan);
  Collect(plan, requests, abandoned, results);
  if (abandoned) {
    Logger("transfer")
        .error(
            "cuda: streams still busy {} ms after a deadline or error; device "
            "{} declared lost, GPU transfers disabled",
            options_.drain_grace_ms, options_.device);
  }
  ReleaseLanes(lanes, abandoned);
  return results;
}

bool GpuMover::Drain(Plan& plan) {
  // Streams with work in flight (deadline) or in an unknown state (error) must go idle before
  // the caller may touch the memory again.
  const int64_t drain_deadline = clock_.NowMs() + options_.drain_grace_ms;
  bool abandoned = false;
  for (Plan::LanePlan& lp : plan.lanes) {
    if (lp.Finished() && lp.error.ok()) continue;
    bool idle = lp.events.empty();
    while (!idle) {
      absl::StatusOr<bool> done = api_.QueryEvent(lp.events.back());
      idle = !done.ok() || *done;  // an error ends the stream's work too
      if (idle || clock_.NowMs() >= drain_deadline) break;
      if (options_.poll_interval_us > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(options_.poll_interval_us));
      }
    }
    if (!idle) abandoned = true;
  }
  return !abandoned;
}

void GpuMover::Collect(Plan& plan, std::span<const GpuMoveRequest> requests, bool abandoned,
                       std::vector<GpuMoveResult>& results) {
  // Per request: bytes of copies in completed submissions; missing ones.
  std::vector<uint64_t> missing(requests.size(), 0);
  std::vector<const absl::Status*> lane_error(requests.size(), nullptr);
  for (Plan::LanePlan& lp : plan.lanes) {
    std::vector<bool> landed(lp.ops.size(), false);  // ops never enqueued stay false
    for (const Submission& sub : lp.subs) {
      for (size_t k = sub.first; k < sub.end; ++k) landed[k] = sub.done;
    }
    for (size_t k = 0; k < lp.ops.size(); ++k) {
      const Op& op = lp.ops[k];
      if (landed[k]) {
        results[op.request].bytes += op.copy.length;
      } else {
        missing[op.request] += op.copy.length;
        lane_error[op.request] = &lp.error;
      }
    }
    for (size_t slot = 0; slot < lp.hashed.size(); ++slot) {
      const size_t r = lp.hashed[slot];
      if (lp.hash_done) {
        results[r].checksum = lp.lane->out[slot];
      } else if (lane_error[r] == nullptr) {
        lane_error[r] = &lp.error;
      }
    }
    if (!abandoned) {
      for (Event e : lp.events) api_.DestroyEvent(e);
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    GpuMoveResult& res = results[i];
    if (!plan.invalid[i].ok()) {
      res.status = plan.invalid[i];
      continue;
    }
    const bool hashed = requests[i].hash_destination || requests[i].hash_source;
    const bool complete = missing[i] == 0 && (!hashed || res.checksum.has_value());
    if (!complete) {
      res.checksum.reset();
      if (lane_error[i] != nullptr && !lane_error[i]->ok()) {
        res.status = *lane_error[i];
      } else {
        res.status = DeadlineError();
      }
      if (abandoned) {
        res.status = McError(Code::kTransferFailed,
                             std::string(res.status.message()) +
                                 "; cuda streams did not drain, bytes may still land");
      }
      continue;
    }
    if (hashed && requests[i].expected_checksum.has_value() &&
        *requests[i].expected_checksum != *res.checksum) {
      res.status = McError(Code::kChecksumMismatch,
                           requests[i].hash_source ? "device checksum of the source differs"
                                                   : "device checksum of the destination differs");
      continue;
    }
    res.status = absl::OkStatus();
  }
}

uint64_t GpuMover::batches_submitted() const {
  absl::MutexLock lock(&mu_);
  return batches_;
}
uint64_t GpuMover::hash_launches() const {
  absl::MutexLock lock(&mu_);
  return hash_launches_;
}
bool GpuMover::device_lost() const {
  absl::MutexLock lock(&mu_);
  return lost_;
}

}  // namespace mc::transfer::cuda
