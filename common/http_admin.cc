#include "common/http_admin.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace mc {

AdminServer::AdminServer(AdminServerOptions options)
    : options_(std::move(options)), server_(std::make_unique<httplib::Server>()) {}

AdminServer::~AdminServer() { Stop(); }

void AdminServer::Handle(const std::string& path, const std::string& content_type,
                         Handler handler) {
  server_->Get(path, [handler = std::move(handler), content_type](const httplib::Request&,
                                                                   httplib::Response& res) {
    res.set_content(handler(), content_type.c_str());
  });
}

absl::StatusOr<std::string> AdminServer::Start() {
  int port = options_.port;
  if (port == 0) {
    port = server_->bind_to_any_port(options_.host.c_str());
  } else if (!server_->bind_to_port(options_.host.c_str(), port)) {
    port = -1;
  }
  if (port <= 0) {
    return McError(Code::kUnavailable,
                   absl::StrCat("admin HTTP cannot bind ", options_.host, ":", options_.port));
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  return absl::StrCat(options_.host, ":", port);
}

void AdminServer::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace mc
