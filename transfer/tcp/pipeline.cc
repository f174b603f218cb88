#include "transfer/tcp/pipeline.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "transfer/tcp/socket_util.h"

namespace mc::transfer::tcp {
namespace {

absl::Status Broken(const std::string& what) {
  return McError(Code::kTransferFailed, absl::StrCat("tcp: ", what));
}

bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK; }

}  // namespace

PipelinedConnection::PipelinedConnection(PeerConnection conn, std::vector<WireOp*> ops)
    : conn_(std::move(conn)), ops_(std::move(ops)) {
  for (WireOp* op : ops_) {
    send_iov_.push_back({op->header_bytes.data(), op->header_bytes.size()});
    if (CarriesCapability(op->header.base_op())) {
      send_iov_.push_back({op->capability.data(), op->capability.size()});
    }
    if (SendsPayload(op->header.op)) {
      send_iov_.insert(send_iov_.end(), op->local.begin(), op->local.end());
    }
  }
  if (!encrypted()) return;
  // Record boundaries: a request's header (+ capability) alone, then its payload in records.
  uint64_t end = 0;
  for (WireOp* op : ops_) {
    end += kFrameHeaderSize + (CarriesCapability(op->header.base_op()) ? kCapabilityBlockSize : 0);
    record_ends_.push_back(end);
    if (!SendsPayload(op->header.op)) continue;
    for (uint64_t done = 0; done < op->header.length; done += kMaxRecordBytes) {
      end += std::min<uint64_t>(kMaxRecordBytes, op->header.length - done);
      record_ends_.push_back(end);
    }
  }
}

bool PipelinedConnection::SendPending() const {
  if (encrypted()) return out_sent_ < out_len_ || next_record_ < record_ends_.size();
  return send_first_ < send_iov_.size();
}

short PipelinedConnection::WantedEvents() const {
  short events = 0;
  if (SendPending()) events |= POLLOUT;
  if (!Finished()) events |= POLLIN;
  return events;
}

// Seals records into a bounded buffer (about 1 MiB of them at a time) and sends it.
constexpr size_t kOutCapacity = 4 * (kMaxRecordBytes + kRecordOverhead);
absl::Status PipelinedConnection::OnWritableSealed() {
  if (conn_.send_buffer == nullptr) {
    conn_.send_buffer.reset(new uint8_t[kOutCapacity]);  // not zeroed: always written first
  }
  uint8_t* const out = conn_.send_buffer.get();
  while (true) {
    if (out_sent_ < out_len_) {
      const ssize_t n =
          ::send(fd(), out + out_sent_, out_len_ - out_sent_, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && WouldBlock()) return absl::OkStatus();
      if (n < 0) {
        return Broken(absl::StrCat("send to ", conn_.endpoint, ": ", std::strerror(errno)));
      }
      out_sent_ += static_cast<size_t>(n);
      continue;
    }
    if (next_record_ == record_ends_.size()) return absl::OkStatus();
    out_len_ = out_sent_ = 0;
    while (next_record_ < record_ends_.size()) {
      const uint64_t n = record_ends_[next_record_] - sealed_upto_;
      if (out_len_ + n + kRecordOverhead > kOutCapacity) break;
      MC_RETURN_IF_ERROR(conn_.sealer->Seal(send_iov_.data() + send_first_,
                                            send_iov_.size() - send_first_, n, out + out_len_));
      send_first_ = ConsumeIov(send_iov_.data(), send_iov_.size(), send_first_, n);
      sealed_upto_ += n;
      out_len_ += n + kRecordOverhead;
      ++next_record_;
    }
  }
}

absl::Status PipelinedConnection::OnWritable() {
  if (encrypted()) return OnWritableSealed();
  while (send_first_ < send_iov_.size()) {
    msghdr msg{};
    msg.msg_iov = send_iov_.data() + send_first_;
    msg.msg_iovlen = std::min<size_t>(send_iov_.size() - send_first_, IOV_MAX);
    const ssize_t n = ::sendmsg(fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && WouldBlock()) return absl::OkStatus();
    if (n < 0) return Broken(absl::StrCat("send to ", conn_.endpoint, ": ", std::strerror(errno)));
    send_first_ = ConsumeIov(send_iov_.data(), send_iov_.size(), send_first_, n);
  }
  return absl::OkStatus();
}

absl::Status PipelinedConnection::OnReadableSealed() {
  while (!Finished()) {
    ssize_t n;
    if (rx_stage_ == RxStage::kPrefix) {
      n = ::recv(fd(), rx_prefix_ + rx_got_, sizeof(rx_prefix_) - rx_got_, MSG_DONTWAIT);
    } else if (rx_stage_ == RxStage::kTag) {
      n = ::recv(fd(), rx_tag_ + rx_got_, sizeof(rx_tag_) - rx_got_, MSG_DONTWAIT);
    } else {
      msghdr msg{};
      msg.msg_iov = rx_work_.data() + rx_first_;
      msg.msg_iovlen = std::min<size_t>(rx_work_.size() - rx_first_, IOV_MAX);
      n = ::recvmsg(fd(), &msg, MSG_DONTWAIT);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && WouldBlock()) return absl::OkStatus();
    if (n < 0)
      return Broken(absl::StrCat("recv from ", conn_.endpoint, ": ", std::strerror(errno)));
    if (n == 0) return Broken(absl::StrCat(conn_.endpoint, " closed the connection"));
    if (rx_stage_ == RxStage::kPrefix) {
      rx_got_ += static_cast<size_t>(n);
      if (rx_got_ < sizeof(rx_prefix_)) continue;
      // A response header is one record of exactly its size; a READ payload's records
      // together make exactly the bytes asked.
      size_t length = 0;
      const size_t most =
          in_payload_ ? std::min<uint64_t>(kMaxRecordBytes, payload_left_) : kFrameHeaderSize;
      if (absl::Status s = RecordOpener::BodyLength(rx_prefix_, most, &length); !s.ok()) {
        return Broken(absl::StrCat("from ", conn_.endpoint, ": ", std::string(s.message())));
      }
      if (!in_payload_ && length != kFrameHeaderSize) {
        return Broken(
            absl::StrCat("from ", conn_.endpoint, ": a header record of ", length, " bytes"));
      }
      if (in_payload_) {
        rx_body_ = SliceIov(recv_iov_.data(), recv_iov_.size(), recv_first_, length);
      } else {
        rx_body_.assign(1, iovec{header_buf_, kFrameHeaderSize});
      }
      rx_work_ = rx_body_;
      rx_first_ = 0;
      rx_got_ = 0;
      rx_stage_ = RxStage::kBody;
    } else if (rx_stage_ == RxStage::kBody) {
      rx_first_ = ConsumeIov(rx_work_.data(), rx_work_.size(), rx_first_, n);
      if (rx_first_ == rx_work_.size()) rx_stage_ = RxStage::kTag;
    } else {
      rx_got_ += static_cast<size_t>(n);
      if (rx_got_ < sizeof(rx_tag_)) continue;
      rx_got_ = 0;
      rx_stage_ = RxStage::kPrefix;
      MC_RETURN_IF_ERROR(OpenRecord());
    }
  }
  return absl::OkStatus();
}

absl::Status PipelinedConnection::OpenRecord() {
  if (absl::Status s = conn_.opener->Open(rx_prefix_, rx_body_.data(), rx_body_.size(), rx_tag_);
      !s.ok()) {
    return Broken(absl::StrCat("from ", conn_.endpoint, ": ", std::string(s.message())));
  }
  if (!in_payload_) {
    MC_RETURN_IF_ERROR(AcceptHeader());
    if (in_payload_) payload_left_ = ops_[next_response_]->header.length;
    return absl::OkStatus();
  }
  // Authenticated: only now are its bytes hashed (while cache-hot) and counted as delivered.
  WireOp& op = *ops_[next_response_];
  uint64_t length = 0;
  for (const iovec& v : rx_body_) {
    if (op.checksum != nullptr) op.checksum->Update(v.iov_base, v.iov_len);
    length += v.iov_len;
  }
  recv_first_ = ConsumeIov(recv_iov_.data(), recv_iov_.size(), recv_first_, length);
  payload_left_ -= length;
  if (payload_left_ == 0) Complete(absl::OkStatus());
  return absl::OkStatus();
}

absl::Status PipelinedConnection::OnReadable() {
  if (encrypted()) return OnReadableSealed();
  while (!Finished()) {
    ssize_t n;
    if (!in_payload_) {
      n = ::recv(fd(), header_buf_ + header_got_, kFrameHeaderSize - header_got_, MSG_DONTWAIT);
    } else {
      msghdr msg{};
      msg.msg_iov = recv_iov_.data() + recv_first_;
      msg.msg_iovlen = std::min<size_t>(recv_iov_.size() - recv_first_, IOV_MAX);
      n = ::recvmsg(fd(), &msg, MSG_DONTWAIT);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && WouldBlock()) return absl::OkStatus();
    if (n < 0)
      return Broken(absl::StrCat("recv from ", conn_.endpoint, ": ", std::strerror(errno)));
    if (n == 0) return Broken(absl::StrCat(conn_.endpoint, " closed the connection"));
    if (!in_payload_) {
      header_got_ += static_cast<size_t>(n);
      if (header_got_ == kFrameHeaderSize) MC_RETURN_IF_ERROR(AcceptHeader());
    } else {
      // Hash the bytes just delivered while they are cache-hot (a frame of several MiB would
      // have left the cache by its end); a frame's bytes arrive in order, so the digest is the
      // frame's, and a frame cut short fails its op whatever was hashed.
      if (StreamingChecksum* sum = ops_[next_response_]->checksum; sum != nullptr) {
        uint64_t left = static_cast<uint64_t>(n);
        for (size_t k = recv_first_; left > 0 && k < recv_iov_.size(); ++k) {
          const size_t take = static_cast<size_t>(std::min<uint64_t>(left, recv_iov_[k].iov_len));
          sum->Update(recv_iov_[k].iov_base, take);
          left -= take;
        }
      }
      recv_first_ = ConsumeIov(recv_iov_.data(), recv_iov_.size(), recv_first_, n);
      if (recv_first_ == recv_iov_.size()) Complete(absl::OkStatus());
    }
  }
  return absl::OkStatus();
}

// Validates the response header against the op it must answer; an error breaks the connection.
absl::Status PipelinedConnection::AcceptHeader() {
  header_got_ = 0;
  WireOp& op = *ops_[next_response_];
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(header_buf_, kFrameHeaderSize);
  if (!h.ok()) return Broken(absl::StrCat("bad response: ", std::string(h.status().message())));
  if (!h->is_response() || h->base_op() != op.header.op || h->request_id != op.header.request_id) {
    return Broken(absl::StrCat("response op ", h->op, " id ", h->request_id, " does not answer op ",
                               op.header.op, " id ", op.header.request_id));
  }
  const Code code = CodeFromInt(static_cast<int>(h->code));
  const bool read_ok =
      code == Code::kOk && (op.header.op == static_cast<uint16_t>(FrameOp::kRead) ||
                            op.header.op == static_cast<uint16_t>(FrameOp::kReadDisk));
  const uint64_t expected = read_ok ? op.header.length : 0;
  if (h->length != expected) {
    return Broken(absl::StrCat("response length ", h->length, ", expected ", expected));
  }
  if (code != Code::kOk) {
    Complete(McError(
        code, absl::StrCat("remote ", conn_.endpoint, " answered ", std::string(CodeName(code)),
                           " for segment ", op.header.segment_id, " offset ", op.header.offset,
                           " length ", op.header.length)));
  } else if (read_ok) {
    in_payload_ = true;
    recv_iov_ = op.local;
    recv_first_ = ConsumeIov(recv_iov_.data(), recv_iov_.size(), 0, 0);
  } else {
    Complete(absl::OkStatus());
  }
  return absl::OkStatus();
}

void PipelinedConnection::Complete(absl::Status status) {
  WireOp& op = *ops_[next_response_];
  op.done = true;
  op.status = std::move(status);
  in_payload_ = false;
  ++next_response_;
}

void PipelinedConnection::FailPending(const absl::Status& status) {
  for (size_t i = next_response_; i < ops_.size(); ++i) {
    ops_[i]->done = true;
    ops_[i]->status = status;
  }
  next_response_ = ops_.size();
  send_first_ = send_iov_.size();
  next_record_ = record_ends_.size();
  out_sent_ = out_len_;
  conn_.fd.reset();
}

}  // namespace mc::transfer::tcp
