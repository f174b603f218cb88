// Where protobuf's own log messages go. Protobuf logs through its stderr handler, one line per
// event; "String field ... contains invalid UTF-8 data when parsing" is logged for every
// request whose string field (a client_id, a key) is not UTF-8, over gRPC and the master lane
// alike, before the parse fails and the call is refused. An unauthenticated peer can send such
// requests as fast as it likes, so a daemon would write a log line per frame.
// RouteProtobufLogs() sends protobuf's non-fatal messages to the "protobuf" module logger at
// most once per 10 s (with the number suppressed; at warn: bad input is no operator's action),
// and counts them all. Refusals are unchanged: the parse still fails and the call is answered
// INVALID_ARGUMENT (lane) or refused by gRPC. Fatal messages are logged at once.
// Thread-safe; call once at daemon start (later calls do nothing).
#pragma once

#include <cstdint>

namespace mc {

void RouteProtobufLogs();

struct ProtobufLogStats {
  uint64_t messages = 0;  // non-fatal messages protobuf reported since RouteProtobufLogs()
  uint64_t logged = 0;    // of them, written to the log
};
ProtobufLogStats ProtobufLogStatsNow();

}  // namespace mc
