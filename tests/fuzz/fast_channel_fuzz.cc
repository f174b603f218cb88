// libFuzzer target: the fast channel's datagram handling (client/fast/fast_dispatch.h): header
// checks, the ATTACH rules, body parsing and dispatch, reply framing. The Store behind it is a
// fake whose BatchGet answers grow with the request (so answers over the limit happen) and whose
// other calls answer empty or with an error. The input is a first byte choosing the
// connection's uid, then datagrams each prefixed by a 2-byte little-endian length, served in
// order on one connection until one closes it.
// Every datagram must get one well-formed reply within the limit; nothing may crash.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "client/access/store_auth.h"
#include "client/fast/fast_dispatch.h"
#include "client/fast/fast_protocol.h"
#include "common/logging.h"
#include "common/metrics.h"

namespace {

namespace v1 = mcstore::v1;
using mc::client::FastCaller;

constexpr uint32_t kLimit = 4096;
constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

class Sessions final : public mc::client::CallerSessions {
 public:
  bool IsLive(std::string_view owner) const override { return owner == kToken; }
  std::optional<uid_t> UidOf(std::string_view owner) const override {
    if (owner == kToken) return 1000;
    return std::nullopt;
  }
};

class FakeStore final : public mc::client::FastStoreCalls {
 public:
  grpc::Status BatchPut(const FastCaller&, const v1::BatchPutRequest* req,
                        v1::BatchPutResponse* resp) override {
    for (int i = 0; i < req->items_size(); ++i) resp->add_results();
    return grpc::Status::OK;
  }
  grpc::Status BatchGet(const FastCaller&, const v1::BatchGetRequest* req,
                        v1::BatchGetResponse* resp) override {
    for (const v1::GetItem& item : req->items()) {
      std::string data;
      for (int i = 0; i < 64 && data.size() < (1u << 16); ++i) data += item.key();
      resp->add_results()->set_data(std::move(data));
    }
    return grpc::Status::OK;
  }
  grpc::Status BatchExist(const FastCaller&, const v1::BatchExistRequest* req,
                          v1::BatchExistResponse* resp) override {
    for (int i = 0; i < req->keys_size(); ++i) resp->add_exists(i % 2 == 0);
    return grpc::Status::OK;
  }
  grpc::Status MatchPrefix(const FastCaller&, const v1::MatchPrefixRequest*,
                           v1::MatchPrefixResponse*) override {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        std::string(mc::client::StoreAuth::kSessionLost) + std::string(9000, 'm'));
  }
  grpc::Status ReleaseLease(const FastCaller&, const v1::ReleaseLeaseRequest*,
                            v1::ReleaseLeaseResponse*) override {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no lease");
  }
  grpc::Status BatchRemove(const FastCaller&, const v1::BatchRemoveRequest* req,
                           v1::BatchRemoveResponse* resp) override {
    for (int i = 0; i < req->keys_size(); ++i) resp->add_results();
    return grpc::Status::OK;
  }
};

void CheckReply(const std::string& reply) {
  if (reply.size() < mc::client::fast::kReplyHeaderSize || reply.size() > kLimit ||
      std::memcmp(reply.data(), "MCR1", 4) != 0) {
    abort();
  }
  const uint32_t message = mc::client::fast::LoadLe32(reply.data() + 16);
  if (message > reply.size() - mc::client::fast::kReplyHeaderSize) abort();
  const uint32_t code = mc::client::fast::LoadLe32(reply.data() + 4);
  if (code != 0 && reply.size() != mc::client::fast::kReplyHeaderSize + message) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* state = [] {
    mc::SetLogLevel("off");
    struct State {
      mc::MetricsRegistry metrics;
      Sessions sessions;
      FakeStore store;
      mc::client::FastDispatcher dispatch{store, &sessions, kLimit, metrics};
    };
    return new State();
  }();
  if (size == 0) return 0;
  mc::client::FastConnection conn;
  conn.peer_uid = (data[0] & 1) != 0 ? 1000 : 1001;
  ++data;
  --size;
  google::protobuf::Arena arena;
  std::string reply;
  while (size >= 2) {
    // The datagram's real length may exceed what is passed (a truncated receive).
    const size_t len = static_cast<size_t>(data[0]) | (static_cast<size_t>(data[1]) << 8);
    data += 2;
    size -= 2;
    const size_t have = std::min(len, size);
    const size_t real = len > kLimit ? len : have;
    std::string datagram(reinterpret_cast<const char*>(data), have);
    data += have;
    size -= have;
    const bool keep = state->dispatch.Handle(conn, datagram.data(), real, &reply, &arena);
    CheckReply(reply);
    arena.Reset();
    if (!keep) break;
  }
  return 0;
}
