// FdChannelServer: buffers handed over as file descriptors (SCM_RIGHTS) and what an attacker may
// send instead: malformed requests, no fd, several fds, fds that are not shared memory or not
// writable, huge sizes, silence. Every one is answered with an error; none leaks an fd. A
// session's buffers are released when it closes; sessions are bounded.
#include "client/buffers/fd_channel.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/fakes/await.h"

namespace mc::client {
namespace {

// "fd=target ..." of this process, for failure messages.
std::string OpenFdList() {
  std::string out;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = readdir(d)) {
    char target[256] = {};
    std::string p = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(p.c_str(), target, sizeof(target) - 1) > 0) {
      out += std::string(e->d_name) + "=" + target + " ";
    }
  }
  closedir(d);
  return out;
}

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

std::string Request(uint32_t op, uint64_t size) {
  std::string r = "MCF1";
  for (int i = 0; i < 4; ++i) r.push_back(static_cast<char>((op >> (8 * i)) & 0xff));
  for (int i = 0; i < 8; ++i) r.push_back(static_cast<char>((size >> (8 * i)) & 0xff));
  return r;
}

int Memfd(uint64_t size) {
  int fd = memfd_create("mc-fd-test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
  return fd;
}

class FdChannel : public ::testing::Test {
 protected:
  void Start(FdChannelOptions options = {}, BufferRegistryOptions buffers = {}) {
    options.path = ::testing::TempDir() + "/mc-fd-" + std::to_string(getpid()) + ".sock";
    path_ = options.path;
    buffers.metrics = &metrics_;
    registry_ = std::make_unique<BufferRegistry>(buffers);
    server_ = std::make_unique<FdChannelServer>(options, *registry_, metrics_);
    absl::Status s = server_->Start();
    ASSERT_TRUE(s.ok()) << s;
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
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    socks_.push_back(fd);
    return fd;
  }
  // Sends `msg` with `fds` and returns the answer ("" when the connection closed).
  std::string Ask(int sock, const std::string& msg, std::vector<int> fds = {}) {
    iovec iov{const_cast<char*>(msg.data()), msg.size()};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    if (!fds.empty()) {
      mh.msg_control = control.data();
      mh.msg_controllen = control.size();
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    EXPECT_EQ(sendmsg(sock, &mh, MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()))
        << std::strerror(errno);
    char reply[512];
    ssize_t n = recv(sock, reply, sizeof(reply), 0);
    return n <= 0 ? "" : std::string(reply, static_cast<size_t>(n));
  }
  // "OK <owner> <handle>": the handle.
  static std::string HandleOf(const std::string& reply) {
    EXPECT_EQ(reply.rfind("OK ", 0), 0u) << reply;
    return reply.substr(reply.rfind(' ') + 1);
  }
  static std::string OwnerOf(const std::string& reply) {
    return reply.substr(3, reply.find(' ', 3) - 3);
  }
  template <typename Pred>
  bool Eventually(Pred pred) {
    return WaitFor(pred);
  }

  MetricsRegistry metrics_;
  std::string path_;
  std::unique_ptr<BufferRegistry> registry_;
  std::unique_ptr<FdChannelServer> server_;
  std::vector<int> socks_;
};

TEST_F(FdChannel, RegisteredFdBecomesTheSessionsBuffer) {
  Start();
  int sock = Connect();
  int mem = Memfd(8192);
  std::string reply = Ask(sock, Request(kFdOpRegister, 4096), {mem});
  close(mem);  // the daemon holds its own reference
  const std::string handle = HandleOf(reply);
  const std::string owner = OwnerOf(reply);
  EXPECT_EQ(handle.size(), 32u);
  EXPECT_TRUE(server_->IsLive(owner));
  auto id = registry_->Claim(handle);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(ToCode(registry_->Claim(handle).status()), Code::kNotFound) << "a handle is one-time";
  BufferRef ref;
  auto p = registry_->Resolve(*id, 0, 4096, &ref, owner);
  ASSERT_TRUE(p.ok()) << p.status();
  std::memset(*p, 1, 4096);
  EXPECT_FALSE(registry_->Resolve(*id, 0, 16, &ref, "someone-else").ok());
  EXPECT_FALSE(registry_->Resolve(*id, 0, 16, &ref, "").ok());
  EXPECT_EQ(ToCode(registry_->Unregister(*id, "someone-else")), Code::kNotFound);
  EXPECT_EQ(registry_->OwnerMismatches(), 3u);
  // HELLO answers the same owner.
  EXPECT_EQ(OwnerOf(Ask(sock, Request(kFdOpHello, 0))), owner);
}

TEST_F(FdChannel, FdsThatAreNotWritableSharedMemoryAreRefused) {
  Start();
  int sock = Connect();
  Ask(sock, Request(kFdOpHello, 0));  // accepted: the daemon's end is open from now on
  const int before = OpenFds();
  const std::string before_list = OpenFdList();
  int mem = Memfd(8192);
  int read_only = open(("/proc/self/fd/" + std::to_string(mem)).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(read_only, 0);
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  int dir = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int pipes[2];
  ASSERT_EQ(pipe2(pipes, O_CLOEXEC), 0);
  int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  std::string reply = Ask(sock, Request(kFdOpRegister, 4096), {read_only});
  EXPECT_NE(reply.find("ERR INVALID_ARGUMENT"), std::string::npos) << reply;
  EXPECT_NE(reply.find("O_RDWR"), std::string::npos) << reply;
  for (int fd : {pair[0], dir, pipes[1], devnull}) {
    reply = Ask(sock, Request(kFdOpRegister, 4096), {fd});
    EXPECT_NE(reply.find("ERR INVALID_ARGUMENT"), std::string::npos) << reply;
    EXPECT_NE(reply.find("not a shared-memory object"), std::string::npos) << reply;
  }
  reply = Ask(sock, Request(kFdOpRegister, 8193), {mem});
  EXPECT_NE(reply.find("has 8192 bytes"), std::string::npos) << reply;
  reply = Ask(sock, Request(kFdOpRegister, ~0ull), {mem});
  EXPECT_NE(reply.find("ERR INVALID_ARGUMENT"), std::string::npos) << reply;
  for (int fd : {mem, read_only, pair[0], pair[1], dir, pipes[0], pipes[1], devnull}) close(fd);
  EXPECT_EQ(registry_->Count(), 0u);
  EXPECT_TRUE(Eventually([&] { return OpenFds() == before; }))
      << "no fd leaked: " << OpenFdList() << " vs " << before_list;
}

TEST_F(FdChannel, MalformedMessagesAreAnsweredAndLeakNothing) {
  Start();
  int sock = Connect();
  Ask(sock, Request(kFdOpHello, 0));  // accepted: the daemon's end is open from now on
  const int before = OpenFds();
  int mem = Memfd(4096);
  std::vector<int> many;
  for (int i = 0; i < 20; ++i) many.push_back(mem);
  struct Case {
    std::string msg;
    std::vector<int> fds;
  };
  std::vector<Case> cases = {
      {"MCF1", {mem}},                                           // short
      {Request(kFdOpRegister, 4096) + "x", {mem}},               // long
      {"XXXX" + Request(kFdOpRegister, 4096).substr(4), {mem}},  // bad magic
      {Request(kFdOpRegister, 4096), {}},                        // no fd
      {Request(kFdOpRegister, 4096), {mem, mem}},                // two fds
      {Request(kFdOpRegister, 4096), many},                      // more than the daemon takes
      {Request(kFdOpHello, 0), {mem}},                           // HELLO with an fd
      {Request(99, 4096), {mem}},                                // unknown op
      {std::string(300, 'M'), {mem}},                            // longer than any message
  };
  for (const Case& c : cases) {
    std::string reply = Ask(sock, c.msg, c.fds);
    EXPECT_EQ(reply.rfind("ERR INVALID_ARGUMENT", 0), 0u) << reply;
  }
  EXPECT_TRUE(Eventually([&] { return OpenFds() == before + 1; }))
      << "no fd leaked (only our memfd is open): " << OpenFds() << " vs " << before;
  EXPECT_EQ(HandleOf(Ask(sock, Request(kFdOpRegister, 4096), {mem})).size(), 32u)
      << "the session survives bad messages";
  close(mem);
  EXPECT_EQ(
      metrics_.GetCounter("mc_store_fd_messages_total", "", {{"result", "bad_message"}}).Value(),
      cases.size());
}

TEST_F(FdChannel, ClosingTheSessionReleasesItsBuffers) {
  Start();
  int sock = Connect();
  int mem = Memfd(4096);
  std::string reply = Ask(sock, Request(kFdOpRegister, 0), {mem});
  close(mem);
  ASSERT_TRUE(registry_->Claim(HandleOf(reply)).ok());
  HandleOf(Ask(sock, Request(kFdOpRegister, 0), {Memfd(4096)}));  // staged, never claimed
  EXPECT_EQ(registry_->Count(), 1u);
  EXPECT_EQ(registry_->CountOwned(OwnerOf(reply)), 2u);
  close(sock);
  socks_.clear();
  EXPECT_TRUE(Eventually([&] { return registry_->CountOwned(OwnerOf(reply)) == 0; }));
  EXPECT_EQ(registry_->Count(), 0u);
  EXPECT_FALSE(server_->IsLive(OwnerOf(reply)));
}

TEST_F(FdChannel, SessionEndHooksReleaseTheOwnersOtherResources) {
  // What the GPU buffers registry hangs here (client_server.cc): called with the session's owner
  // once it ends, its count added to the log line.
  std::atomic<int> calls{0};
  std::string seen_owner;
  absl::Mutex mu;
  FdChannelOptions options;
  options.path = ::testing::TempDir() + "/mc-fd-" + std::to_string(getpid()) + ".sock";
  path_ = options.path;
  registry_ = std::make_unique<BufferRegistry>(BufferRegistryOptions{.metrics = &metrics_});
  server_ = std::make_unique<FdChannelServer>(options, *registry_, metrics_);
  server_->AddSessionEndHook([&](const std::string& owner) {
    absl::MutexLock lock(&mu);
    seen_owner = owner;
    ++calls;
    return size_t{3};
  });
  ASSERT_TRUE(server_->Start().ok());
  int sock = Connect();
  const int mem = Memfd(4096);
  std::string reply = Ask(sock, Request(kFdOpRegister, 0), {mem});
  close(mem);
  const std::string owner = OwnerOf(reply);
  EXPECT_EQ(calls.load(), 0);
  close(sock);
  socks_.clear();
  EXPECT_TRUE(Eventually([&] { return calls.load() == 1; }));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(seen_owner, owner);
}

// REGISTER_GPU parks a POSIX-fd GPU handle for the session's owner (client/gpu/gpu_fd_tickets.h):
// the reply's ticket gives the same file back to that owner only; without GPU buffers, or
// without exactly one fd, it is refused; the session's parked fds go when it ends.
TEST_F(FdChannel, GpuHandlesAreParkedForTheSessionsOwner) {
  GpuFdTickets tickets;
  FdChannelOptions options;
  options.path = ::testing::TempDir() + "/mc-fd-" + std::to_string(getpid()) + ".sock";
  path_ = options.path;
  registry_ = std::make_unique<BufferRegistry>(BufferRegistryOptions{.metrics = &metrics_});
  server_ = std::make_unique<FdChannelServer>(options, *registry_, metrics_);
  server_->SetGpuFdTickets(&tickets);
  server_->AddSessionEndHook([&](const std::string& owner) { return tickets.ReleaseOwner(owner); });
  ASSERT_TRUE(server_->Start().ok());
  int sock = Connect();
  const int handle = Memfd(4096);  // stands for a cuMemExportToShareableHandle fd
  struct stat want {};
  ASSERT_EQ(fstat(handle, &want), 0);
  std::string reply = Ask(sock, Request(kFdOpRegisterGpu, 0), {handle});
  ASSERT_EQ(reply.rfind("OK ", 0), 0u) << reply;
  const std::string owner = OwnerOf(reply);
  const uint64_t ticket = std::stoull(HandleOf(reply));
  EXPECT_EQ(ToCode(tickets.Take(ticket, "someone-else").status()), Code::kNotFound);
  absl::StatusOr<int> fd = tickets.Take(ticket, owner);
  ASSERT_TRUE(fd.ok()) << fd.status();
  struct stat got {};
  ASSERT_EQ(fstat(*fd, &got), 0);
  EXPECT_EQ(got.st_ino, want.st_ino) << "the same file, passed by SCM_RIGHTS";
  close(*fd);
  EXPECT_EQ(Ask(sock, Request(kFdOpRegisterGpu, 0)).rfind("ERR INVALID_ARGUMENT", 0), 0u);
  EXPECT_EQ(
      Ask(sock, Request(kFdOpRegisterGpu, 0), {handle, handle}).rfind("ERR INVALID_ARGUMENT", 0),
      0u);
  // Parked, never claimed: released with the session.
  ASSERT_EQ(Ask(sock, Request(kFdOpRegisterGpu, 0), {handle}).rfind("OK ", 0), 0u);
  EXPECT_EQ(tickets.Count(), 1u);
  close(sock);
  socks_.clear();
  EXPECT_TRUE(Eventually([&] { return tickets.Count() == 0; }));
  close(handle);
  server_->Stop();  // before `tickets` goes
  server_.reset();
}

TEST_F(FdChannel, GpuHandlesAreRefusedWithoutGpuBuffers) {
  Start();
  int sock = Connect();
  const int handle = Memfd(4096);
  const std::string reply = Ask(sock, Request(kFdOpRegisterGpu, 0), {handle});
  close(handle);
  EXPECT_EQ(reply.rfind("ERR INVALID_ARGUMENT", 0), 0u) << reply;
  EXPECT_NE(reply.find("--cuda_device"), std::string::npos) << reply;
}

TEST_F(FdChannel, SilentConnectionsAreClosedAndSessionsBounded) {
  FdChannelOptions options;
  options.max_connections = 8;
  options.max_connections_per_uid = 2;
  options.first_message_timeout_ms = 100;
  Start(options);
  int silent = Connect();
  char c;
  EXPECT_EQ(recv(silent, &c, 1, 0), 0) << "closed after first_message_timeout_ms";
  int a = Connect();
  int b = Connect();
  EXPECT_EQ(Ask(a, Request(kFdOpHello, 0)).rfind("OK ", 0), 0u);
  EXPECT_EQ(Ask(b, Request(kFdOpHello, 0)).rfind("OK ", 0), 0u);
  int third = Connect();
  char reply[256];
  ssize_t n = recv(third, reply, sizeof(reply), 0);
  ASSERT_GT(n, 0);
  EXPECT_NE(std::string(reply, n).find("--store_fd_max_connections_per_uid"), std::string::npos);
}

TEST_F(FdChannel, SessionsOfOneUidShareTheUidsBufferLimits) {
  BufferRegistryOptions limits;
  limits.max_buffers_per_owner = 2;
  limits.max_buffers_per_account = 3;
  Start({}, limits);
  // Every session of this test runs under one uid: two sessions of 2 buffers each would be 4.
  int a = Connect();
  int b = Connect();
  EXPECT_EQ(Ask(a, Request(kFdOpRegister, 0), {Memfd(4096)}).rfind("OK ", 0), 0u);
  EXPECT_EQ(Ask(a, Request(kFdOpRegister, 0), {Memfd(4096)}).rfind("OK ", 0), 0u);
  EXPECT_EQ(Ask(b, Request(kFdOpRegister, 0), {Memfd(4096)}).rfind("OK ", 0), 0u);
  std::string reply = Ask(b, Request(kFdOpRegister, 0), {Memfd(4096)});
  EXPECT_NE(reply.find("ERR RESOURCE_EXHAUSTED"), std::string::npos) << reply;
  EXPECT_NE(reply.find("--store_max_buffers_per_uid"), std::string::npos) << reply;
  EXPECT_EQ(registry_->AccountUsage(FdChannelServer::AccountOfUid(getuid())).first, 3u);
}

TEST_F(FdChannel, PerCallerBufferLimitsAnswerResourceExhausted) {
  BufferRegistryOptions limits;
  limits.max_buffers_per_owner = 2;
  limits.max_bytes_per_owner = 12288;
  Start({}, limits);
  int sock = Connect();
  EXPECT_EQ(Ask(sock, Request(kFdOpRegister, 0), {Memfd(4096)}).rfind("OK ", 0), 0u);
  std::string reply = Ask(sock, Request(kFdOpRegister, 0), {Memfd(16384)});
  EXPECT_NE(reply.find("ERR RESOURCE_EXHAUSTED"), std::string::npos) << reply;
  EXPECT_NE(reply.find("--store_max_buffer_bytes_per_caller"), std::string::npos) << reply;
  EXPECT_EQ(Ask(sock, Request(kFdOpRegister, 0), {Memfd(4096)}).rfind("OK ", 0), 0u);
  reply = Ask(sock, Request(kFdOpRegister, 0), {Memfd(4096)});
  EXPECT_NE(reply.find("--store_max_buffers_per_caller"), std::string::npos) << reply;
  // Another session has limits of its own.
  EXPECT_EQ(Ask(Connect(), Request(kFdOpRegister, 0), {Memfd(4096)}).rfind("OK ", 0), 0u);
  EXPECT_EQ(
      metrics_.GetCounter("mc_store_limit_refusals_total", "", {{"limit", "buffers"}}).Value(), 1u);
}

TEST_F(FdChannel, SocketFileHasTheConfiguredMode) {
  FdChannelOptions options;
  options.mode = 0600;
  Start(options);
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

}  // namespace
}  // namespace mc::client
