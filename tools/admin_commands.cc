#include "tools/admin_commands.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_format.h"
#include "client/buffers/fd_session.h"
#include "common/auth.h"
#include "common/keys.h"
#include "common/master_credentials.h"
#include "common/util.h"

namespace mc::tools {

namespace v1 = mcstore::v1;

namespace {

// The deadline, the Store token and, for calls that use a buffer, its fd session's owner.
void SetDeadline(grpc::ClientContext* c, const AdminContext& ctx, const std::string& owner = "") {
  c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ctx.timeout_ms));
  if (!ctx.store_token.empty()) c->AddMetadata("authorization", "Bearer " + ctx.store_token);
  if (!owner.empty()) c->AddMetadata("x-mc-owner", owner);
}

// False (after saying why) when a key breaks the keys' rule: refused here as the daemon would.
bool KeysValid(const AdminContext& ctx, const char* what, const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    if (absl::Status s = ValidateKey(k); !s.ok()) {
      std::fprintf(ctx.err, "%s: %s\n", what, std::string(s.message()).c_str());
      return false;
    }
  }
  return true;
}

int RpcFailed(const AdminContext& ctx, const char* what, const grpc::Status& s) {
  std::fprintf(ctx.err, "%s failed: %s (%d)\n", what, s.error_message().c_str(),
               static_cast<int>(s.error_code()));
  return 2;
}

// A POSIX shared-memory object registered with the daemon for the life of this object: its fd
// is passed over the daemon's fd socket, in a session of its own (owner()).
class ShmBuffer {
 public:
  ShmBuffer(const AdminContext& ctx, uint64_t size) : ctx_(ctx), size_(size) {
    if (ctx_.fd_socket.empty()) {
      std::fprintf(ctx_.err,
                   "a payload this large goes through shared memory, which needs the daemon's "
                   "fd socket: use --client unix:PATH or --fd_socket\n");
      return;
    }
    auto session = client::FdSession::Open(ctx_.fd_socket, ctx_.timeout_ms);
    if (!session.ok()) {
      std::fprintf(ctx_.err, "%s\n", session.status().ToString().c_str());
      return;
    }
    session_ = *std::move(session);
    std::random_device rd;
    name_ = absl::StrFormat("/mc-admin-%d-%08x", getpid(), rd());
    int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return;
    if (ftruncate(fd, static_cast<off_t>(size)) == 0) {
      void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) base_ = static_cast<char*>(p);
    }
    absl::StatusOr<std::string> handle = base_ == nullptr
                                             ? absl::InternalError("cannot map shared memory")
                                             : session_->Register(fd, size);
    close(fd);
    if (!handle.ok()) {
      std::fprintf(ctx_.err, "registering a buffer: %s\n", handle.status().ToString().c_str());
      return;
    }
    grpc::ClientContext c;
    SetDeadline(&c, ctx_);
    v1::RegisterBufferRequest req;
    req.set_handle(*handle);
    v1::RegisterBufferResponse resp;
    grpc::Status s = ctx_.store->RegisterBuffer(&c, req, &resp);
    if (s.ok()) {
      id_ = resp.buffer_id();
    } else {
      std::fprintf(ctx_.err, "RegisterBuffer failed: %s\n", s.error_message().c_str());
    }
  }
  ~ShmBuffer() {
    if (id_ != 0) {
      grpc::ClientContext c;
      SetDeadline(&c, ctx_, owner());
      v1::UnregisterBufferRequest req;
      req.set_buffer_id(id_);
      v1::UnregisterBufferResponse resp;
      (void)ctx_.store->UnregisterBuffer(&c, req, &resp);  // best effort at exit
    }
    if (base_ != nullptr) munmap(base_, size_);
    if (!name_.empty()) shm_unlink(name_.c_str());
  }
  bool ok() const { return id_ != 0; }
  char* data() const { return base_; }
  uint64_t id() const { return id_; }
  std::string owner() const { return session_ ? session_->owner() : ""; }

 private:
  const AdminContext& ctx_;
  std::unique_ptr<client::FdSession> session_;
  const uint64_t size_;
  std::string name_;
  char* base_ = nullptr;
  uint64_t id_ = 0;
};

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

bool WriteFile(const std::string& path, const char* data, uint64_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(size));
  return static_cast<bool>(out);
}

}  // namespace

int CmdStatus(const AdminContext& ctx) {
  std::vector<v1::Master::Stub*> masters = ctx.masters;
  if (masters.empty()) masters.push_back(ctx.master);
  v1::GetStatusResponse resp;
  grpc::Status s;
  // With standbys, each answers UNAVAILABLE naming the leader; the leader answers.
  for (v1::Master::Stub* master : masters) {
    grpc::ClientContext c;
    SetDeadline(&c, ctx);
    if (ctx.cluster_keys) {  // a read-only admin proof for this master's run (docs/security.md)
      grpc::ClientContext hello_ctx;
      SetDeadline(&hello_ctx, ctx);
      v1::HelloResponse hello;
      s = master->Hello(&hello_ctx, v1::HelloRequest(), &hello);
      if (!s.ok()) {
        if (s.error_code() == grpc::StatusCode::UNAVAILABLE) continue;  // a standby: the next
        break;
      }
      c.AddMetadata(auth::kProofHeader,
                    auth::MakeProof(*ctx.cluster_keys, auth::ProofRole::kAdmin, "mc-admin", "",
                                    auth::UnixNowMs(), hello.run_id()));
    }
    resp.Clear();
    s = master->GetStatus(&c, v1::GetStatusRequest(), &resp);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
  }
  if (!s.ok()) return RpcFailed(ctx, "GetStatus", s);
  std::fprintf(ctx.out, "%s\n", resp.status_line().c_str());
  std::fprintf(ctx.out, "%-32s %-22s %21s %21s\n", "CLIENT", "DATA", "MEMORY USED", "SSD USED");
  for (const auto& cl : resp.clients()) {
    std::fprintf(ctx.out, "%-32s %-22s %10s/%-10s %10s/%-10s\n", cl.client_id().c_str(),
                 cl.data_endpoint().c_str(), FormatBytes(cl.used()).c_str(),
                 FormatBytes(cl.capacity()).c_str(), FormatBytes(cl.disk_used()).c_str(),
                 FormatBytes(cl.disk_capacity()).c_str());
  }
  return 0;
}

int CmdPut(const AdminContext& ctx, const std::string& file, const std::string& key) {
  if (!KeysValid(ctx, "put", {key})) return 2;
  std::string payload;
  if (!ReadFile(file, &payload)) {
    std::fprintf(ctx.err, "cannot read %s\n", file.c_str());
    return 2;
  }
  v1::BatchPutRequest req;
  v1::PutItem* item = req.add_items();
  item->set_key(key);
  std::unique_ptr<ShmBuffer> shm;
  if (payload.size() <= ctx.inline_limit) {
    item->set_data(payload);
  } else {
    shm = std::make_unique<ShmBuffer>(ctx, payload.size());
    if (!shm->ok()) return 2;
    std::memcpy(shm->data(), payload.data(), payload.size());
    v1::Slice* slice = item->add_slices();
    slice->set_buffer_id(shm->id());
    slice->set_length(payload.size());
  }
  grpc::ClientContext c;
  SetDeadline(&c, ctx, shm ? shm->owner() : "");
  v1::BatchPutResponse resp;
  grpc::Status s = ctx.store->BatchPut(&c, req, &resp);
  if (!s.ok()) return RpcFailed(ctx, "BatchPut", s);
  const v1::Result& r = resp.results(0);
  if (r.code() != v1::OK) {
    std::fprintf(ctx.err, "put %s: %s: %s\n", key.c_str(), v1::Code_Name(r.code()).c_str(),
                 r.message().c_str());
    return 1;
  }
  std::fprintf(ctx.out, "put %s: %zu bytes\n", key.c_str(), payload.size());
  return 0;
}

int CmdGet(const AdminContext& ctx, const std::string& key, const std::string& file) {
  if (!KeysValid(ctx, "get", {key})) return 2;
  v1::BatchGetRequest req;
  req.add_items()->set_key(key);
  grpc::ClientContext c;
  SetDeadline(&c, ctx);
  v1::BatchGetResponse resp;
  grpc::Status s = ctx.store->BatchGet(&c, req, &resp);
  if (!s.ok()) return RpcFailed(ctx, "BatchGet", s);
  v1::GetResult r = resp.results(0);
  if (r.code() == v1::INVALID_ARGUMENT && r.size() > 0) {
    // Too large to come back inline: read it through shared memory.
    ShmBuffer shm(ctx, r.size());
    if (!shm.ok()) return 2;
    v1::BatchGetRequest again;
    v1::GetItem* item = again.add_items();
    item->set_key(key);
    v1::Slice* slice = item->add_slices();
    slice->set_buffer_id(shm.id());
    slice->set_length(r.size());
    grpc::ClientContext c2;
    SetDeadline(&c2, ctx, shm.owner());
    v1::BatchGetResponse resp2;
    s = ctx.store->BatchGet(&c2, again, &resp2);
    if (!s.ok()) return RpcFailed(ctx, "BatchGet", s);
    r = resp2.results(0);
    if (r.code() == v1::OK) r.set_data(std::string(shm.data(), r.size()));
  }
  if (r.code() != v1::OK) {
    std::fprintf(ctx.err, "get %s: %s: %s\n", key.c_str(), v1::Code_Name(r.code()).c_str(),
                 r.message().c_str());
    return 1;
  }
  if (!WriteFile(file, r.data().data(), r.data().size())) {
    std::fprintf(ctx.err, "cannot write %s\n", file.c_str());
    return 2;
  }
  std::fprintf(ctx.out, "get %s: %zu bytes -> %s\n", key.c_str(), r.data().size(), file.c_str());
  return 0;
}

int CmdExist(const AdminContext& ctx, const std::vector<std::string>& keys) {
  if (!KeysValid(ctx, "exist", keys)) return 2;
  v1::BatchExistRequest req;
  for (const auto& k : keys) req.add_keys(k);
  grpc::ClientContext c;
  SetDeadline(&c, ctx);
  v1::BatchExistResponse resp;
  grpc::Status s = ctx.store->BatchExist(&c, req, &resp);
  if (!s.ok()) return RpcFailed(ctx, "BatchExist", s);
  int rc = 0;
  for (int i = 0; i < resp.exists_size(); ++i) {
    std::fprintf(ctx.out, "%s: %s\n", keys[i].c_str(), resp.exists(i) ? "exists" : "missing");
    if (!resp.exists(i)) rc = 1;
  }
  return rc;
}

int CmdRemove(const AdminContext& ctx, const std::vector<std::string>& keys) {
  if (!KeysValid(ctx, "remove", keys)) return 2;
  v1::BatchRemoveRequest req;
  for (const auto& k : keys) req.add_keys(k);
  grpc::ClientContext c;
  SetDeadline(&c, ctx);
  v1::BatchRemoveResponse resp;
  grpc::Status s = ctx.store->BatchRemove(&c, req, &resp);
  if (!s.ok()) return RpcFailed(ctx, "BatchRemove", s);
  int rc = 0;
  for (int i = 0; i < resp.results_size(); ++i) {
    const auto& r = resp.results(i);
    std::fprintf(ctx.out, "%s: %s%s%s\n", keys[i].c_str(), v1::Code_Name(r.code()).c_str(),
                 r.message().empty() ? "" : ": ", r.message().c_str());
    if (r.code() != v1::OK) rc = 1;
  }
  return rc;
}

namespace {

// Creates `path` (mode 0600; never overwrites) holding `content`; 0, or 1 with the error printed.
int WritePrivateFile(const AdminContext& ctx, const char* cmd, const std::string& path,
                     const std::string& content) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    std::fprintf(ctx.err,
                 "%s: cannot create %s: %s (an existing file is never "
                 "overwritten)\n",
                 cmd, path.c_str(), std::strerror(errno));
    return 1;
  }
  bool ok = write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  ok = fsync(fd) == 0 && ok;
  ok = close(fd) == 0 && ok;
  if (!ok) {
    std::fprintf(ctx.err, "%s: cannot write %s: %s\n", cmd, path.c_str(), std::strerror(errno));
    unlink(path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int CmdGenSecret(const AdminContext& ctx, const std::string& path) {
  if (WritePrivateFile(ctx, "gen-secret", path, auth::NewSecret() + "\n") != 0) return 1;
  std::fprintf(ctx.out, "wrote a new cluster secret to %s (mode 0600)\n", path.c_str());
  return 0;
}

int CmdIssueMember(const AdminContext& ctx, const std::string& client_id, uint64_t serial,
                   const std::string& path) {
  if (ctx.cluster_keys == nullptr) {
    std::fprintf(ctx.err, "issue-member: needs --cluster_secret_file (the cluster secret)\n");
    return 2;
  }
  absl::StatusOr<std::string> text =
      auth::FormatMemberCredential(*ctx.cluster_keys, client_id, serial);
  if (!text.ok()) {
    std::fprintf(ctx.err, "issue-member: %s\n", std::string(text.status().message()).c_str());
    return 2;
  }
  if (WritePrivateFile(ctx, "issue-member", path, *text) != 0) return 1;
  std::fprintf(ctx.out,
               "wrote the member credential of %s serial %llu to %s (mode 0600; cluster secret "
               "fingerprint %s)\n",
               client_id.c_str(), static_cast<unsigned long long>(serial), path.c_str(),
               ctx.cluster_keys->fingerprint().c_str());
  return 0;
}

}  // namespace mc::tools
