#include "transfer/tcp/frame.h"

#include "absl/strings/str_cat.h"
#include "common/byte_order.h"

namespace mc::transfer::tcp {
namespace {

absl::Status Malformed(const std::string& what) {
  return McError(Code::kInvalidArgument, absl::StrCat("malformed frame: ", what));
}

}  // namespace

void EncodeFrameHeader(const FrameHeader& h, uint8_t* out) {
  uint8_t* p = out;
  PutLe(p, h.magic);
  PutLe(p, h.version);
  PutLe(p, h.op);
  PutLe(p, h.request_id);
  PutLe(p, h.segment_id);
  PutLe(p, h.offset);
  PutLe(p, h.length);
  PutLe(p, h.code);
  PutLe(p, h.reserved);
}

FrameBytes EncodeFrameHeader(const FrameHeader& header) {
  FrameBytes bytes;
  EncodeFrameHeader(header, bytes.data());
  return bytes;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(const uint8_t* data, size_t size,
                                              uint64_t max_length) {
  if (data == nullptr || size != kFrameHeaderSize) {
    return Malformed(absl::StrCat("header of ", size, " bytes"));
  }
  const uint8_t* p = data;
  FrameHeader h;
  h.magic = GetLe<uint32_t>(p);
  h.version = GetLe<uint16_t>(p);
  h.op = GetLe<uint16_t>(p);
  h.request_id = GetLe<uint64_t>(p);
  h.segment_id = GetLe<uint64_t>(p);
  h.offset = GetLe<uint64_t>(p);
  h.length = GetLe<uint64_t>(p);
  h.code = GetLe<uint32_t>(p);
  h.reserved = GetLe<uint32_t>(p);
  if (h.magic != kFrameMagic) return Malformed(absl::StrCat("bad magic ", h.magic));
  if (h.version != kFrameVersion) return Malformed(absl::StrCat("bad version ", h.version));
  if (h.base_op() == 0 || h.base_op() > kMaxFrameOp) {
    return Malformed(absl::StrCat("bad op ", h.op));
  }
  if (h.length > max_length) {
    return Malformed(absl::StrCat("length ", h.length, " above limit ", max_length));
  }
  if (h.is_response() ? h.code > static_cast<uint32_t>(kMaxCode) : h.code != 0) {
    return Malformed(absl::StrCat("bad code ", h.code));
  }
  // The last word is reserved (zero) except in kReadDisk requests, where it tags the key.
  if (h.reserved != 0 && !(h.op == static_cast<uint16_t>(FrameOp::kReadDisk))) {
    return Malformed("reserved bits set");
  }
  return h;
}

FrameHeader MakeRequest(FrameOp op, uint64_t request_id, uint64_t segment_id, uint64_t offset,
                        uint64_t length) {
  FrameHeader h;
  h.op = static_cast<uint16_t>(op);
  h.request_id = request_id;
  h.segment_id = segment_id;
  h.offset = offset;
  h.length = length;
  return h;
}

FrameHeader MakeResponse(const FrameHeader& request, Code code, uint64_t payload_length) {
  FrameHeader h = request;
  h.op = static_cast<uint16_t>(request.base_op() | kResponseBit);
  h.code = static_cast<uint32_t>(code);
  h.length = payload_length;
  h.reserved = 0;
  return h;
}

}  // namespace mc::transfer::tcp
