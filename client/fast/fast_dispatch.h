// FastDispatcher: the fast channel's datagram handling without the socket (fast_protocol.h
// holds the format): header checks, the ATTACH rules, the request body parsed on an arena, the
// call made through FastStoreCalls, the reply written. FastChannelServer runs it on each
// connection's thread; the fuzz target and unit tests drive it directly.
//
// Rules (docs/security.md): a connection's first call must be ATTACH; ATTACH with a token is
// OK only when the token names a live fd session whose peer uid equals the connection's; a
// malformed datagram (short, bad magic, unknown method, over the limit) or a failed ATTACH or a
// call before ATTACH is answered and the connection closed; a body that does not parse is
// answered INVALID_ARGUMENT and the connection stays; an answer over the limit has its items'
// messages cut (256 down to 16 bytes each, every code kept) and, still over, is
// RESOURCE_EXHAUSTED. Thread-safe (each connection's state is its own).
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "client/access/store_auth.h"
#include "client/fast/fast_protocol.h"
#include "client/fast/fast_store_calls.h"
#include "common/metrics.h"
#include "google/protobuf/arena.h"

namespace mc::client {

// One connection's state.
struct FastConnection {
  uid_t peer_uid = 0;  // SO_PEERCRED of the connection
  bool attached = false;
  FastCaller caller;  // set by ATTACH
};

class FastDispatcher {
 public:
  // `calls`, `sessions` (may be null: no fd sessions, only anonymous ATTACH) and `metrics` are
  // borrowed and must outlive this object. `max_message_bytes`: the largest request or reply.
  FastDispatcher(FastStoreCalls& calls, const CallerSessions* sessions, uint32_t max_message_bytes,
                 MetricsRegistry& metrics);

  // Handles one request datagram: `data` holds its first min(size, max_message_bytes) bytes,
  // `size` is its real length (recv with MSG_TRUNC). Writes the reply into `*reply` (reusing its
  // capacity); messages live on `arena`, which the caller may Reset once the reply is sent.
  // Returns whether the connection stays open after the reply.
  bool Handle(FastConnection& conn, const char* data, size_t size, std::string* reply,
              google::protobuf::Arena* arena);

  uint32_t max_message_bytes() const { return max_message_bytes_; }
  // Counts a refused connection or datagram in mc_store_fast_refused_total{reason}.
  void CountRefused(const char* reason);

 private:
  bool Attach(FastConnection& conn, uint64_t call_id, const char* body, size_t size,
              std::string* reply);
  // Parses the body as Req, calls `fn`, writes the answer. True: the connection stays.
  template <typename Req, typename Resp>
  void Call(grpc::Status (FastStoreCalls::*fn)(const FastCaller&, const Req*, Resp*),
            FastConnection& conn, uint32_t method, uint64_t call_id, const char* body, size_t size,
            std::string* reply, google::protobuf::Arena* arena);
  // The reply's header and error message (cut to fit the limit).
  void WriteHeader(uint32_t code, uint64_t call_id, std::string_view message, std::string* reply);
  void CountCall(uint32_t method, uint32_t code);

  FastStoreCalls& calls_;
  const CallerSessions* const sessions_;
  const uint32_t max_message_bytes_;
  MetricsRegistry& metrics_;
  std::array<Counter*, fast::kLastMethod + 1> ok_calls_{};  // calls_total{method, code="OK"}
};

}  // namespace mc::client
