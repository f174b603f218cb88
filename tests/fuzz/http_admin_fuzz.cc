// libFuzzer target: the admin HTTP server's request parsing and routing (what any local process
// can send to /metrics, /status, /healthz).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/http_admin.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static mc::AdminServer* server = [] {
    auto* s = new mc::AdminServer(mc::AdminServerOptions{});
    s->Handle("/metrics", "text/plain", [] { return std::string("m 1\n"); });
    s->HandleReply("/healthz", "text/plain", [] { return mc::AdminServer::Reply{503, "no\n"}; });
    return s;
  }();
  std::string_view in(reinterpret_cast<const char*>(data), size);
  mc::HttpRequestHead head;
  const mc::HttpParse p = mc::ParseHttpRequestHead(in, 8192, &head);
  if (p == mc::HttpParse::kComplete && (head.path.empty() || head.path[0] != '/')) abort();
  const std::string out = server->Respond(in);
  if (out.rfind("HTTP/1.1 ", 0) != 0) abort();
  return 0;
}
