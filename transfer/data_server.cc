#include "transfer/data_server.h"

#include "absl/strings/str_cat.h"

namespace mc::transfer {

absl::Status RequestStream::Take(uint64_t length, const char* what) {
  if (responded_) {
    return McError(Code::kInternal,
                   absl::StrCat("data-plane handler: ", what, " after responding"));
  }
  if (length > payload_left_) {
    return McError(Code::kInternal,
                   absl::StrCat("data-plane handler: ", what, " of ", length,
                                " bytes past the request payload (", payload_left_, " left)"));
  }
  payload_left_ -= length;
  return absl::OkStatus();
}

absl::Status RequestStream::ReadExact(void* data, uint64_t length) {
  if (absl::Status s = Take(length, "read"); !s.ok()) return s;
  return DoReadExact(data, length);
}

absl::Status RequestStream::Skip(uint64_t length) {
  if (absl::Status s = Take(length, "skip"); !s.ok()) return s;
  return DoSkip(length);
}

absl::Status RequestStream::Respond(Code code, std::span<const iovec> payload) {
  if (responded_) return McError(Code::kInternal, "data-plane handler: a second response");
  responded_ = true;
  return DoRespond(code, payload);
}

absl::Status RequestStream::CheckFinished() const {
  if (payload_left_ != 0) {
    return McError(Code::kInternal, absl::StrCat("data-plane handler: ", payload_left_,
                                                 " bytes of the request payload left unread"));
  }
  if (!responded_) return McError(Code::kInternal, "data-plane handler: no response");
  return absl::OkStatus();
}

absl::Status RefuseDataOp(const DataRequest& request, RequestStream& stream) {
  if (stream.payload_left() > kMaxRefusedPayloadBytes) {
    return McError(Code::kInvalidArgument,
                   absl::StrCat("data-plane op ", static_cast<int>(request.op),
                                " is not served here and its payload of ", stream.payload_left(),
                                " bytes is too long to skip"));
  }
  if (absl::Status s = stream.Skip(stream.payload_left()); !s.ok()) return s;
  return stream.Respond(Code::kUnavailable);
}

}  // namespace mc::transfer
