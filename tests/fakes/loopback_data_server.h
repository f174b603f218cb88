// A DataServer (transfer/data_server.h) without a transport: Serve() hands one request, with its
// payload from memory, to the registered handler on the caller's thread and returns what the
// handler answered. It proves the seam: a handler served here sees no socket, frame header or
// connection, only the DataRequest and the RequestStream, and the stream keeps the same handler
// contract as tcp's (the checks live in RequestStream). There is no authentication step: the
// tcp server's capability check runs before a handler, so handlers are tested without it.
// Not thread-safe: one test thread.
#pragma once

#include <sys/uio.h>

#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "transfer/data_server.h"

namespace mc::transfer {

// What a handler made of one request.
struct LoopbackResponse {
  // The handler's return, else the contract check: non-OK where a transport would close the
  // connection.
  absl::Status status;
  bool responded = false;
  Code code = Code::kOk;      // the response's code, when responded
  std::string payload;        // the response's payload bytes
  uint64_t payload_left = 0;  // request payload bytes the handler did not consume
};

class LoopbackRequestStream final : public RequestStream {
 public:
  explicit LoopbackRequestStream(std::string_view payload)
      : RequestStream(payload.size()), payload_(payload) {}
  LoopbackResponse& response() { return response_; }

 private:
  absl::Status DoReadExact(void* data, uint64_t length) override {
    if (length > 0) std::memcpy(data, payload_.data() + read_, length);
    read_ += length;
    return absl::OkStatus();
  }
  absl::Status DoSkip(uint64_t length) override {
    read_ += length;
    return absl::OkStatus();
  }
  absl::Status DoRespond(Code code, std::span<const iovec> payload) override {
    response_.responded = true;
    response_.code = code;
    for (const iovec& v : payload) {
      response_.payload.append(static_cast<const char*>(v.iov_base), v.iov_len);
    }
    return absl::OkStatus();
  }

  const std::string_view payload_;
  uint64_t read_ = 0;
  LoopbackResponse response_;
};

class LoopbackDataServer final : public DataServer {
 public:
  absl::Status RegisterOpHandler(DataOp op, DataOpHandler handler) override {
    if (started_) return McError(Code::kInternal, "RegisterOpHandler after Start");
    handlers_[static_cast<uint16_t>(op)] = std::move(handler);
    return absl::OkStatus();
  }
  absl::Status Start() override {
    if (started_) return McError(Code::kInternal, "loopback data server already started");
    started_ = true;
    return absl::OkStatus();
  }
  void Stop() override { started_ = false; }
  const std::string& endpoint() const override { return endpoint_; }
  absl::Status Health() const override { return absl::OkStatus(); }

  // Serves `request` (its payload_length is set here from its op and length) with `payload`,
  // which must be exactly the payload that request carries.
  LoopbackResponse Serve(DataRequest request, std::string_view payload = {}) {
    request.payload_length = RequestPayloadLength(request.op, request.length);
    LoopbackResponse out;
    if (!started_) {
      out.status = McError(Code::kUnavailable, "loopback data server not started");
      return out;
    }
    if (payload.size() != request.payload_length) {
      out.status = McError(Code::kInternal,
                           absl::StrCat("test error: ", payload.size(), " payload bytes for a ",
                                        "request that carries ", request.payload_length));
      return out;
    }
    auto it = handlers_.find(static_cast<uint16_t>(request.op));
    if (it == handlers_.end()) {
      ++closed_;
      out.status = McError(Code::kInvalidArgument, "unserved op");
      return out;
    }
    LoopbackRequestStream stream(payload);
    absl::Status s = it->second(request, stream);
    if (s.ok()) s = stream.CheckFinished();
    if (!s.ok()) ++closed_;
    out = std::move(stream.response());
    out.status = std::move(s);
    out.payload_left = stream.payload_left();
    return out;
  }
  // Requests after which a transport would have closed the connection.
  int closed_connections() const { return closed_; }

 private:
  const std::string endpoint_ = "loopback";
  absl::flat_hash_map<uint16_t, DataOpHandler> handlers_;
  bool started_ = false;
  int closed_ = 0;
};

}  // namespace mc::transfer
