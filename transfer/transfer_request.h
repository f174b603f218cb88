// What the transfer engine moves: a TransferRequest names local memory, a direction, the daemon
// at the other end and, on that daemon, a typed target; it completes with a TransferResult.
//
// The target is a sum type, one alternative per kind of remote thing, each with its own fields:
// a byte range of a memory segment (read or written), a record of the SSD tier (read whole and
// verified by its owner) or the object index (written: an index notice). The checksum a caller
// may ask for is typed by what it proves (Proof): the hash of the bytes delivered into the local
// buffers (reads), or the proof of the replica a GPU write stored. How a transport carries a
// target (tcp frame fields, an rdma remote address) is the transport's business: the wire
// formats are in transfer/tcp/frame.h and transfer/rdma/handshake.h.
// Plain data, no allocation beyond the caller's vectors and strings (std::variant is inline).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"

namespace mc::transfer {

// A contiguous piece of local memory (host memory: a segment, an mmap'd shm buffer, a string;
// or GPU memory the engine was told about).
struct LocalBuffer {
  char* data;
  uint64_t length;
};

// Bytes [offset, offset + total local length) of segment `segment_id` of the remote daemon.
// READ and WRITE; served by every transport that reaches the daemon.
struct SegmentRange {
  uint64_t segment_id = 0;
  uint64_t offset = 0;  // byte offset inside the remote segment
};

// A record of the remote daemon's SSD tier, read whole and verified by its owner before a byte
// leaves (key tag, generation, payload checksum). READ only; served two-sided (tcp), never by
// the local transport (this daemon reads its own records through its tier).
struct DiskRecord {
  uint64_t generation = 0;  // the object's generation, as the master recorded it
  uint64_t locator = 0;     // where the record lies in the owner's tier (the DISK replica's offset)
  uint32_t key_tag = 0;     // low 32 bits of the key's XXH3 (offload/record_format.h)
};

// The remote daemon's object index: the local buffers hold one encoded index notice
// (transfer/index_notice.h), sent whole. WRITE only; served two-sided (tcp).
struct IndexNotice {};

using RemoteTarget = std::variant<SegmentRange, DiskRecord, IndexNotice>;

// kRead: remote target -> local buffers; kWrite: local buffers -> remote target.
enum class Direction : uint8_t { kRead, kWrite };

// What TransferResult::checksum is asked to prove.
enum class Proof : uint8_t {
  kNone,
  // READ: the XXH3-64 of the local bytes as delivered, i.e. hashed from the destination buffers
  // (in order) after each piece landed there, while it is cache-hot (GPU memory: on the
  // device). A transport that cannot leaves the checksum empty and the caller hashes itself.
  kDeliveredBytes,
  // WRITE: the XXH3-64 of the replica as written where this daemon can hash it (its own
  // segment: the local transport hashes each chunk from the segment right after copying it; the
  // cuda transport after its device copy), else, from GPU memory, the device hash of the source
  // after the NIC read it (GPUDirect RDMA). tcp and rdma leave it empty for host memory. The
  // BatchPutter records it as the put's checksum (host sources) or compares it with the device
  // hash it took before the put (GPU sources).
  kWrittenReplica,
};

struct TransferRequest {
  Direction direction = Direction::kRead;
  std::vector<LocalBuffer> local;  // scatter/gather list; total length = bytes moved
  std::string endpoint;            // data-plane "HOST:PORT" of the daemon holding the target
  RemoteTarget target;
  // The master's grant for this target (common/capability.h), sent with every frame of a remote
  // request; empty where none is needed (local transport, --auth=false) or none was granted.
  std::string capability = {};
  Proof proof = Proof::kNone;
};

struct TransferResult {
  absl::Status status;
  uint64_t bytes = 0;  // bytes actually moved
  // The hash the request's proof asked for, only when the status is OK (and the transport could
  // compute it; see Proof).
  std::optional<uint64_t> checksum;
};

// The alternatives, for the transports' dispatch.
inline const SegmentRange* AsSegmentRange(const TransferRequest& r) {
  return std::get_if<SegmentRange>(&r.target);
}
inline const DiskRecord* AsDiskRecord(const TransferRequest& r) {
  return std::get_if<DiskRecord>(&r.target);
}
inline bool IsIndexNotice(const TransferRequest& r) {
  return std::holds_alternative<IndexNotice>(r.target);
}

}  // namespace mc::transfer
