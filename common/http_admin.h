// The HTTP admin endpoint both daemons serve: /metrics, /status, /healthz and whatever else a
// daemon registers. Handlers are plain functions returning a body; they run on the server's own
// threads and must be thread-safe. Start() binds (port 0 picks a free one) and serves in the
// background; Stop() (or the destructor) ends serving and joins.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace mc {

struct AdminServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = any free port
};

class AdminServer {
 public:
  using Handler = std::function<std::string()>;

  explicit AdminServer(AdminServerOptions options);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Registers GET `path`; call before Start().
  void Handle(const std::string& path, const std::string& content_type, Handler handler);

  // Binds and starts serving; returns "HOST:PORT" actually bound.
  absl::StatusOr<std::string> Start();
  void Stop();

 private:
  const AdminServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace mc
