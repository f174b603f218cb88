// FastChannelServer: Store calls as datagrams on a real socket, served by a real
// StoreGrpcService over the in-process master, and what an attacker may send instead: calls
// before ATTACH, tokens that name no session or another uid's, malformed and oversized
// datagrams, floods of connections, silence. Every refusal is answered; closes, limits, Stop and
// fds are counted back to their baseline.
#include "client/fast/fast_channel.h"

#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "client/fast/fast_protocol.h"
#include "client/store/store_service.h"
#include "gtest/gtest.h"
#include "tests/fakes/await.h"
#include "tests/unit/client/client_test_util.h"

namespace mc::client::testing {
namespace {

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

// Live fd sessions: token -> peer uid.
class FakeSessions final : public CallerSessions {
 public:
  void Add(const std::string& token, uid_t uid) {
    absl::MutexLock lock(&mu_);
    live_[token] = uid;
  }
  void End(const std::string& token) {
    absl::MutexLock lock(&mu_);
    live_.erase(token);
  }
  bool IsLive(std::string_view owner) const override { return UidOf(owner).has_value(); }
  std::optional<uid_t> UidOf(std::string_view owner) const override {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(std::string(owner));
    if (it == live_.end()) return std::nullopt;
    return it->second;
  }

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uid_t> live_ ABSL_GUARDED_BY(mu_);
};

struct Reply {
  bool closed = false;  // the daemon closed instead of answering
  uint32_t code = 0;
  uint64_t call_id = 0;
  std::string message;
  std::string body;
};

std::string Datagram(uint32_t method, uint64_t call_id, std::string_view body) {
  std::string d(fast::kRequestHeaderSize, '\0');
  fast::PutRequestHeader(d.data(), method, call_id);
  d.append(body);
  return d;
}

class FastChannel : public ClientFixture {
 protected:
  FastChannel()
      : service_(StoreServiceOptions{.client_id = kLocalId}, buffers_, putter_, getter_, master_,
                 prefix_leases_, clock_, metrics_) {
    service_.SetAccess(nullptr, &sessions_);
    sessions_.Add(kToken, getuid());
  }

  void Start(FastChannelOptions options = {}) {
    options.path = ::testing::TempDir() + "/mc-fast-" + std::to_string(getpid()) + ".sock";
    server_ = std::make_unique<FastChannelServer>(options, service_, &sessions_, registry_);
    absl::Status s = server_->Start();
    ASSERT_TRUE(s.ok()) << s;
    path_ = options.path;
  }
  void TearDown() override {
    for (int fd : socks_) close(fd);
    if (server_) server_->Stop();
  }

  int Connect() {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    int big = 8 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    socks_.push_back(fd);
    return fd;
  }
  // The next datagram from the daemon (or closed), within 10 s.
  static Reply Receive(int fd) {
    Reply r;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10'000) != 1) {
      ADD_FAILURE() << "no answer in time";
      return r;
    }
    std::string buf(fast::kMaxMessageBytes, '\0');
    ssize_t n = recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) {
      r.closed = true;
      return r;
    }
    EXPECT_GE(n, static_cast<ssize_t>(fast::kReplyHeaderSize));
    EXPECT_EQ(buf.substr(0, 4), "MCR1");
    r.code = fast::LoadLe32(buf.data() + 4);
    r.call_id = fast::LoadLe64(buf.data() + 8);
    const uint32_t m = fast::LoadLe32(buf.data() + 16);
    r.message = buf.substr(fast::kReplyHeaderSize, m);
    r.body = buf.substr(fast::kReplyHeaderSize + m, n - fast::kReplyHeaderSize - m);
    return r;
  }
  static Reply Ask(int fd, const std::string& datagram) {
    EXPECT_EQ(send(fd, datagram.data(), datagram.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(datagram.size()));
    return Receive(fd);
  }
  static bool ClosedByDaemon(int fd) { return Receive(fd).closed; }
  int Attached(std::string_view token = kToken) {
    int fd = Connect();
    Reply r = Ask(fd, Datagram(fast::kAttach, 1, token));
    EXPECT_EQ(r.code, 0u) << r.message;
    return fd;
  }
  template <typename Resp>
  Reply Call(int fd, uint32_t method, const google::protobuf::MessageLite& req, Resp* resp,
             uint64_t call_id = 7) {
    Reply r = Ask(fd, Datagram(method, call_id, req.SerializeAsString()));
    EXPECT_EQ(r.call_id, call_id);
    if (r.code == 0) {
      EXPECT_TRUE(resp->ParseFromString(r.body));
    }
    return r;
  }
  double Refused(const char* reason) {
    return registry_.GetCounter("mc_store_fast_refused_total", "", {{"reason", reason}}).Value();
  }
  double Calls(const char* method, const char* code) {
    return registry_
        .GetCounter("mc_store_fast_calls_total", "", {{"method", method}, {"code", code}})
        .Value();
  }

  static constexpr char kToken[] = "0123456789abcdef0123456789abcdef";
  FakeSessions sessions_;
  BufferRegistry buffers_;
  StoreGrpcService service_;
  std::unique_ptr<FastChannelServer> server_;
  std::string path_;
  std::vector<int> socks_;
};

v1::BatchPutRequest PutOf(const std::string& key, const std::string& value) {
  v1::BatchPutRequest req;
  auto* item = req.add_items();
  item->set_key(key);
  item->set_data(value);
  return req;
}

v1::BatchGetRequest GetOf(const std::string& key) {
  v1::BatchGetRequest req;
  req.add_items()->set_key(key);
  return req;
}

TEST_F(FastChannel, AttachedSessionPutsAndGetsLikeGrpc) {
  Start();
  int fd = Connect();
  Reply attach = Ask(fd, Datagram(fast::kAttach, 41, kToken));
  ASSERT_EQ(attach.code, 0u) << attach.message;
  EXPECT_EQ(attach.call_id, 41u);
  ASSERT_EQ(attach.body.size(), 4u);
  EXPECT_EQ(fast::LoadLe32(attach.body.data()), server_->max_message_bytes());
  EXPECT_EQ(server_->max_message_bytes(), 262144u);

  const std::string value = Payload(50'000, 3);
  v1::BatchPutResponse put;
  Reply r = Call(fd, fast::kBatchPut, PutOf("fast-a", value), &put);
  ASSERT_EQ(r.code, 0u) << r.message;
  ASSERT_EQ(put.results_size(), 1);
  EXPECT_EQ(put.results(0).code(), v1::OK);
  v1::BatchGetResponse got;
  r = Call(fd, fast::kBatchGet, GetOf("fast-a"), &got, 8);
  ASSERT_EQ(r.code, 0u) << r.message;
  ASSERT_EQ(got.results_size(), 1);
  EXPECT_EQ(got.results(0).code(), v1::OK);
  EXPECT_EQ(got.results(0).data(), value);
  v1::BatchExistRequest exist;
  exist.add_keys("fast-a");
  exist.add_keys("fast-none");
  v1::BatchExistResponse exists;
  ASSERT_EQ(Call(fd, fast::kBatchExist, exist, &exists).code, 0u);
  ASSERT_EQ(exists.exists_size(), 2);
  EXPECT_TRUE(exists.exists(0));
  EXPECT_FALSE(exists.exists(1));
  // Counted as fast calls and in the Store service's own per-RPC metrics.
  EXPECT_EQ(Calls("BatchPut", "OK"), 1);
  EXPECT_EQ(Calls("ATTACH", "OK"), 1);
  EXPECT_EQ(metrics_.For("BatchGet").requests.Value(), 1);
  EXPECT_EQ(server_->Connections(), 1);
}

TEST_F(FastChannel, AnonymousAttachIsTheUnixCaller) {
  Start();
  int fd = Attached("");
  v1::BatchPutResponse put;
  ASSERT_EQ(Call(fd, fast::kBatchPut, PutOf("anon-a", "x"), &put).code, 0u);
  EXPECT_EQ(put.results(0).code(), v1::OK);
}

TEST_F(FastChannel, AttachRefusalsAreUnauthenticatedAndClose) {
  Start();
  sessions_.Add("other-uid-token", getuid() + 1);
  const std::vector<std::string> bodies = {"no-such-session", "other-uid-token",
                                           std::string(200, 'a'), std::string("bad\ntoken")};
  for (const std::string& body : bodies) {
    int fd = Connect();
    Reply r = Ask(fd, Datagram(fast::kAttach, 5, body));
    EXPECT_EQ(r.code, 16u) << body;
    EXPECT_EQ(r.call_id, 5u);
    EXPECT_FALSE(r.message.empty());
    EXPECT_TRUE(ClosedByDaemon(fd)) << body;
  }
  // A call before ATTACH.
  int fd = Connect();
  v1::BatchExistRequest exist;
  exist.add_keys("k");
  Reply r = Ask(fd, Datagram(fast::kBatchExist, 6, exist.SerializeAsString()));
  EXPECT_EQ(r.code, 16u);
  EXPECT_TRUE(ClosedByDaemon(fd));
  EXPECT_EQ(Refused("attach"), 5);
  EXPECT_TRUE(WaitFor([&] { return server_->Connections() == 0; }));
}

TEST_F(FastChannel, SecondAttachIsRefusedAndTheConnectionStays) {
  Start();
  int fd = Attached();
  Reply r = Ask(fd, Datagram(fast::kAttach, 2, kToken));
  EXPECT_EQ(r.code, 9u);
  v1::BatchExistRequest exist;
  exist.add_keys("k");
  v1::BatchExistResponse resp;
  EXPECT_EQ(Call(fd, fast::kBatchExist, exist, &resp).code, 0u);
}

TEST_F(FastChannel, MalformedDatagramsAreRefusedAndClose) {
  FastChannelOptions options;
  options.max_message_bytes = 8192;
  Start(options);
  const std::vector<std::pair<std::string, uint64_t>> bad = {
      {"", 0},                                                    // empty
      {"MCQ1abc", 0},                                             // short
      {"XXXX" + Datagram(fast::kBatchPut, 3, "").substr(4), 0},   // bad magic
      {Datagram(99, 4, ""), 4},                                   // unknown method
      {Datagram(0, 4, ""), 4},                                    // method 0
      {Datagram(fast::kBatchPut, 9, std::string(9000, 'x')), 9},  // over the limit
  };
  for (const auto& [datagram, call_id] : bad) {
    int fd = Attached();
    Reply r = Ask(fd, datagram);
    EXPECT_EQ(r.code, 3u) << r.message;
    EXPECT_EQ(r.call_id, call_id) << r.message;
    EXPECT_TRUE(ClosedByDaemon(fd)) << r.message;
  }
  EXPECT_EQ(Refused("malformed"), 5);
  EXPECT_EQ(Refused("oversize"), 1);
  // A body that does not parse is answered; the connection stays.
  int fd = Attached();
  Reply r = Ask(fd, Datagram(fast::kBatchGet, 10, "\xff\xff\xff"));
  EXPECT_EQ(r.code, 3u);
  EXPECT_NE(r.message.find("BatchGetRequest"), std::string::npos) << r.message;
  v1::BatchExistRequest exist;
  exist.add_keys("k");
  v1::BatchExistResponse resp;
  EXPECT_EQ(Call(fd, fast::kBatchExist, exist, &resp).code, 0u);
}

TEST_F(FastChannel, AnswerOverTheLimitIsResourceExhausted) {
  FastChannelOptions options;
  options.max_message_bytes = 8192;
  Start(options);
  v1::BatchPutRequest put = PutOf("big", Payload(20'000, 5));
  v1::BatchPutResponse put_resp;
  ASSERT_TRUE(service_.BatchPut(static_cast<grpc::ServerContext*>(nullptr), &put, &put_resp).ok());
  int fd = Attached();
  v1::BatchGetResponse got;
  Reply r = Call(fd, fast::kBatchGet, GetOf("big"), &got);
  EXPECT_EQ(r.code, 8u);
  EXPECT_NE(r.message.find("use the gRPC Store service"), std::string::npos) << r.message;
  v1::BatchExistRequest exist;
  exist.add_keys("big");
  v1::BatchExistResponse resp;
  EXPECT_EQ(Call(fd, fast::kBatchExist, exist, &resp).code, 0u) << "the connection stays";
}

// A store whose puts and removes fail every item with a long message (multi-byte UTF-8 in it).
class LongMessageStore final : public FastStoreCalls {
 public:
  static std::string Message(int i) {
    std::string m = "item " + std::to_string(i) + ": ";
    while (m.size() < 300) m += "\xc3\xa9t\xc3\xa9 ";  // "été ": cut points fall inside characters
    return m;
  }
  template <typename Resp>
  static grpc::Status Fail(int n, Resp* resp) {
    for (int i = 0; i < n; ++i) {
      auto* r = resp->add_results();
      r->set_code(v1::NO_SPACE);
      r->set_message(Message(i));
    }
    return grpc::Status::OK;
  }
  grpc::Status BatchPut(const FastCaller&, const v1::BatchPutRequest* req,
                        v1::BatchPutResponse* resp) override {
    return Fail(req->items_size(), resp);
  }
  grpc::Status BatchRemove(const FastCaller&, const v1::BatchRemoveRequest* req,
                           v1::BatchRemoveResponse* resp) override {
    return Fail(req->keys_size(), resp);
  }
  grpc::Status BatchGet(const FastCaller&, const v1::BatchGetRequest* req,
                        v1::BatchGetResponse* resp) override {
    for (int i = 0; i < req->items_size(); ++i)
      resp->add_results()->set_data(std::string(8192, 'x'));
    return grpc::Status::OK;
  }
  grpc::Status BatchExist(const FastCaller&, const v1::BatchExistRequest*,
                          v1::BatchExistResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status MatchPrefix(const FastCaller&, const v1::MatchPrefixRequest*,
                           v1::MatchPrefixResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status ReleaseLease(const FastCaller&, const v1::ReleaseLeaseRequest*,
                            v1::ReleaseLeaseResponse*) override {
    return grpc::Status::OK;
  }
};

// Whether `s` is valid UTF-8 (what a proto3 string must hold).
bool ValidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

TEST(FastDispatch, AnswerOverTheLimitKeepsEveryItemsCodeWithCutMessages) {
  LongMessageStore store;
  MetricsRegistry registry;
  FastDispatcher dispatcher(store, nullptr, 4096, registry);
  FastConnection conn;
  google::protobuf::Arena arena;
  std::string reply;
  const auto handle = [&](uint32_t method, const std::string& body) {
    std::string datagram(fast::kRequestHeaderSize, '\0');
    std::memcpy(datagram.data(), "MCQ1", 4);
    fast::StoreLe32(datagram.data() + 4, method);
    fast::StoreLe64(datagram.data() + 8, 5);
    datagram += body;
    return dispatcher.Handle(conn, datagram.data(), datagram.size(), &reply, &arena);
  };
  ASSERT_TRUE(handle(fast::kAttach, ""));
  // 60 puts: 60 x 300-byte messages would be 18 KB; cut, every code arrives.
  v1::BatchPutRequest put;
  for (int i = 0; i < 60; ++i) put.add_items()->set_key("k" + std::to_string(i));
  ASSERT_TRUE(handle(fast::kBatchPut, put.SerializeAsString()));
  ASSERT_LE(reply.size(), 4096u);
  ASSERT_EQ(fast::LoadLe32(reply.data() + 4), 0u);
  v1::BatchPutResponse resp;
  ASSERT_TRUE(resp.ParseFromString(reply.substr(fast::kReplyHeaderSize)));
  ASSERT_EQ(resp.results_size(), 60);
  for (int i = 0; i < 60; ++i) {
    const std::string& m = resp.results(i).message();
    EXPECT_EQ(resp.results(i).code(), v1::NO_SPACE);
    ASSERT_GE(m.size(), 4u);
    EXPECT_LE(m.size(), 64u);
    EXPECT_EQ(m.substr(m.size() - 3), "...");
    EXPECT_EQ(LongMessageStore::Message(i).substr(0, m.size() - 3), m.substr(0, m.size() - 3));
    EXPECT_TRUE(ValidUtf8(m)) << i;
  }
  // Removes likewise; a few items keep longer messages (the cut stops once it fits).
  v1::BatchRemoveRequest remove;
  for (int i = 0; i < 14; ++i) remove.add_keys("k" + std::to_string(i));
  ASSERT_TRUE(handle(fast::kBatchRemove, remove.SerializeAsString()));
  ASSERT_EQ(fast::LoadLe32(reply.data() + 4), 0u);
  v1::BatchRemoveResponse removed;
  ASSERT_TRUE(removed.ParseFromString(reply.substr(fast::kReplyHeaderSize)));
  ASSERT_EQ(removed.results_size(), 14);
  EXPECT_EQ(removed.results(0).message().size(), 256u);
  // Data cannot be cut: an inline get over the limit is still RESOURCE_EXHAUSTED.
  v1::BatchGetRequest get;
  get.add_items()->set_key("k0");
  ASSERT_TRUE(handle(fast::kBatchGet, get.SerializeAsString()));
  EXPECT_EQ(fast::LoadLe32(reply.data() + 4), 8u);
}

TEST_F(FastChannel, ConnectionsAreBoundedInAllAndPerUid) {
  FastChannelOptions options;
  options.max_connections = 2;
  Start(options);
  Attached();
  Attached();
  int fd = Connect();
  Reply r = Receive(fd);
  EXPECT_EQ(r.code, 8u);
  EXPECT_NE(r.message.find("--store_fast_max_connections"), std::string::npos);
  EXPECT_TRUE(ClosedByDaemon(fd));
  EXPECT_EQ(Refused("limit"), 1);
  for (int s : socks_) close(s);
  socks_.clear();
  EXPECT_TRUE(WaitFor([&] { return server_->Connections() == 0; }));
  Attached();  // room again

  server_->Stop();
  options.max_connections = 10;
  options.max_connections_per_uid = 1;
  Start(options);
  Attached();
  fd = Connect();
  r = Receive(fd);
  EXPECT_EQ(r.code, 8u);
  EXPECT_NE(r.message.find("per_uid"), std::string::npos) << r.message;
  EXPECT_EQ(Refused("uid_limit"), 1);
}

TEST_F(FastChannel, SilentConnectionIsClosedAfterTheFirstMessageTimeout) {
  FastChannelOptions options;
  options.first_message_timeout_ms = 200;
  Start(options);
  int fd = Connect();
  EXPECT_TRUE(ClosedByDaemon(fd));
  EXPECT_EQ(Refused("timeout"), 1);
  EXPECT_TRUE(WaitFor([&] { return server_->Connections() == 0; }));
  // An attached connection may then stay idle.
  fd = Attached();
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 400), 0) << "attached and idle: not closed";
}

TEST_F(FastChannel, EndedSessionAnswersSessionLost) {
  Start();
  int fd = Attached();
  sessions_.End(kToken);
  v1::BatchExistRequest exist;
  exist.add_keys("k");
  v1::BatchExistResponse resp;
  Reply r = Call(fd, fast::kBatchExist, exist, &resp);
  EXPECT_EQ(r.code, 9u);
  EXPECT_EQ(r.message.rfind(StoreAuth::kSessionLost, 0), 0u) << r.message;
}

TEST_F(FastChannel, StopJoinsEveryConnectionAndLeaksNothing) {
  const int before = OpenFds();
  Start();
  for (int i = 0; i < 3; ++i) Attached();
  Connect();  // silent
  EXPECT_TRUE(WaitFor([&] { return server_->Connections() == 4; }));
  server_->Stop();
  EXPECT_EQ(server_->Connections(), 0);
  for (int fd : socks_) EXPECT_TRUE(ClosedByDaemon(fd));
  for (int fd : socks_) close(fd);
  socks_.clear();
  EXPECT_EQ(access(path_.c_str(), F_OK), -1) << "socket unlinked";
  EXPECT_EQ(OpenFds(), before);
}

}  // namespace
}  // namespace mc::client::testing
