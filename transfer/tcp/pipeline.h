// One client connection driving a pipelined list of frames: every request frame is written
// (WRITE payloads gathered from the local buffers with sendmsg), and responses are read in order
// (READ payloads scattered straight into the local buffers with readv). Non-blocking: the owner
// polls fd() for WantedEvents() and calls OnWritable()/OnReadable(). The first protocol or I/O
// error leaves the connection broken: the caller fails what is still pending and closes it.
// On an encrypted connection (conn.sealer set; sealed_records.h) the same frames travel in
// sealed records: each request's header (+ capability block) in one record, a WRITE/INDEX
// payload in records of at most kMaxRecordBytes sealed from the local buffers into a bounded
// send buffer; each READ payload record is received straight into the local buffers, decrypted
// there in place and its tag checked before its bytes are hashed or the op completes. A record
// that fails its tag breaks the connection (every pending op fails).
// Not thread-safe: owned by the thread that runs the batch.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "common/checksum.h"
#include "transfer/tcp/connection_pool.h"
#include "transfer/tcp/frame.h"

namespace mc::transfer::tcp {

// One frame of a batch: a slice of one TransferRequest.
struct WireOp {
  size_t request = 0;  // index of the request in its transport batch
  FrameHeader header;  // the request frame
  FrameBytes header_bytes{};
  // The capability block sent after a data op's header (zeros when the request has none).
  std::array<uint8_t, kCapabilityBlockSize> capability{};
  std::vector<iovec> local;  // the slice of local memory (exactly header.length bytes)
  // Optional: when a READ payload completed, its bytes are hashed from `local` into this state.
  // Every frame of a hashed request rides one connection, so they are hashed in order.
  StreamingChecksum* checksum = nullptr;
  bool done = false;
  absl::Status status;  // set when done
};

class PipelinedConnection {
 public:
  PipelinedConnection(PeerConnection conn, std::vector<WireOp*> ops);

  int fd() const { return conn_.fd.get(); }
  short WantedEvents() const;  // POLLOUT while sending, POLLIN while responses are due
  absl::Status OnWritable();
  absl::Status OnReadable();
  bool Finished() const { return next_response_ == ops_.size(); }
  // Marks every unanswered op failed with `status` (the connection is then unusable).
  void FailPending(const absl::Status& status);
  PeerConnection TakeConnection() { return std::move(conn_); }

 private:
  absl::Status AcceptHeader();
  void Complete(absl::Status status);
  bool encrypted() const { return conn_.sealer != nullptr; }
  bool SendPending() const;
  absl::Status OnWritableSealed();
  absl::Status OnReadableSealed();
  // A sealed record was received whole: check it and act on its plaintext.
  absl::Status OpenRecord();

  PeerConnection conn_;
  std::vector<WireOp*> ops_;
  // Sending: every header and WRITE payload in order.
  std::vector<iovec> send_iov_;
  size_t send_first_ = 0;
  // Receiving: the response to ops_[next_response_].
  size_t next_response_ = 0;
  uint8_t header_buf_[kFrameHeaderSize] = {};
  size_t header_got_ = 0;
  bool in_payload_ = false;
  std::vector<iovec> recv_iov_;
  size_t recv_first_ = 0;
  // Encrypted connections only. Sending: plaintext offsets (into send_iov_'s bytes) where
  // records end, the next to seal, and sealed bytes waiting for the socket.
  std::vector<uint64_t> record_ends_;
  size_t next_record_ = 0;
  uint64_t sealed_upto_ = 0;
  size_t out_len_ = 0;  // in conn_.send_buffer
  size_t out_sent_ = 0;
  // Receiving one record: its prefix, body (into header_buf_ or the READ destination), tag.
  enum class RxStage { kPrefix, kBody, kTag };
  RxStage rx_stage_ = RxStage::kPrefix;
  uint8_t rx_prefix_[kRecordPrefixSize] = {};
  uint8_t rx_tag_[kRecordTagSize] = {};
  size_t rx_got_ = 0;
  std::vector<iovec> rx_body_;  // where the record's body lands (decrypted there)
  std::vector<iovec> rx_work_;  // the same, consumed as bytes arrive
  size_t rx_first_ = 0;
  uint64_t payload_left_ = 0;  // READ payload bytes still due
};

}  // namespace mc::transfer::tcp
