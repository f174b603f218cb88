#include "master/etcd_http.h"

#include <httplib.h>

#include <exception>
#include <mutex>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"

namespace mc::master {

namespace internal {

std::optional<std::string> JsonField(const std::string& json, const std::string& name,
                                     size_t from) {
  const std::string quoted = absl::StrCat("\"", name, "\"");
  size_t at = json.find(quoted, from);
  while (at != std::string::npos) {
    size_t i = at + quoted.size();
    while (i < json.size() && (json[i] == ' ' || json[i] == '\n' || json[i] == '\t')) ++i;
    if (i < json.size() && json[i] == ':') {
      ++i;
      while (i < json.size() && (json[i] == ' ' || json[i] == '\n' || json[i] == '\t')) ++i;
      if (i < json.size() && json[i] == '"') {
        size_t end = json.find('"', i + 1);
        if (end == std::string::npos) return std::nullopt;
        return json.substr(i + 1, end - i - 1);
      }
      size_t end = json.find_first_of(",}] \n\t", i);
      if (end == std::string::npos) end = json.size();
      return json.substr(i, end - i);
    }
    at = json.find(quoted, at + 1);
  }
  return std::nullopt;
}

}  // namespace internal

namespace {

using internal::JsonField;

class EtcdHttpKv final : public EtcdKv {
 public:
  explicit EtcdHttpKv(EtcdHttpOptions options) : options_(std::move(options)) {}

  absl::StatusOr<int64_t> GrantLease(int64_t ttl_s) override {
    absl::StatusOr<std::string> body =
        Post("/v3/lease/grant", absl::StrCat("{\"TTL\":", ttl_s, "}"));
    if (!body.ok()) return body.status();
    int64_t id = 0;
    std::optional<std::string> field = JsonField(*body, "ID");
    if (!field || !absl::SimpleAtoi(*field, &id) || id == 0) {
      return absl::UnavailableError(absl::StrCat("etcd lease grant: no lease id in ", *body));
    }
    return id;
  }

  absl::StatusOr<int64_t> KeepAlive(int64_t lease_id) override {
    absl::StatusOr<std::string> body =
        Post("/v3/lease/keepalive", absl::StrCat("{\"ID\":\"", lease_id, "\"}"));
    if (!body.ok()) return body.status();
    if (body->find("\"error\"") != std::string::npos) {
      // A lease etcd no longer has comes back as TTL 0 (or an error naming it).
      if (body->find("lease not found") != std::string::npos) return 0;
      return absl::UnavailableError(absl::StrCat("etcd lease keepalive: ", *body));
    }
    int64_t ttl = 0;
    std::optional<std::string> field = JsonField(*body, "TTL");
    if (field && !absl::SimpleAtoi(*field, &ttl)) {
      return absl::UnavailableError(absl::StrCat("etcd lease keepalive: bad TTL in ", *body));
    }
    return ttl;  // absent: proto3 leaves 0 out, the lease is gone
  }

  absl::Status RevokeLease(int64_t lease_id) override {
    return Post("/v3/lease/revoke", absl::StrCat("{\"ID\":\"", lease_id, "\"}")).status();
  }

  absl::StatusOr<bool> CreateIfAbsent(const std::string& key, const std::string& value,
                                      int64_t lease_id) override {
    const std::string k = absl::Base64Escape(key);
    const std::string txn = absl::StrCat(
        "{\"compare\":[{\"key\":\"", k,
        "\",\"result\":\"EQUAL\",\"target\":\"CREATE\",\"create_revision\":\"0\"}],"
        "\"success\":[{\"request_put\":{\"key\":\"",
        k, "\",\"value\":\"", absl::Base64Escape(value), "\",\"lease\":\"", lease_id, "\"}}]}");
    absl::StatusOr<std::string> body = Post("/v3/kv/txn", txn);
    if (!body.ok()) return body.status();
    std::optional<std::string> succeeded = JsonField(*body, "succeeded");
    return succeeded.has_value() && *succeeded == "true";
  }

  absl::StatusOr<std::optional<std::string>> Get(const std::string& key) override {
    absl::StatusOr<std::string> body =
        Post("/v3/kv/range", absl::StrCat("{\"key\":\"", absl::Base64Escape(key), "\"}"));
    if (!body.ok()) return body.status();
    const size_t kvs = body->find("\"kvs\"");
    if (kvs == std::string::npos) return std::optional<std::string>();
    std::optional<std::string> encoded = JsonField(*body, "value", kvs);
    std::string value;
    if (encoded && !absl::Base64Unescape(*encoded, &value)) {
      return absl::UnavailableError(absl::StrCat("etcd range: bad base64 value in ", *body));
    }
    return std::optional<std::string>(std::move(value));
  }

 private:
  // The body of a 200 answer from the first endpoint that gives one. With authentication, a
  // missing or refused token is (re)acquired once per call.
  absl::StatusOr<std::string> Post(const std::string& path, const std::string& json) {
    absl::MutexLock lock(&mu_);
    if (options_.user.empty()) return PostLocked(path, json, /*with_token=*/false);
    if (token_.empty()) MC_RETURN_IF_ERROR(AuthenticateLocked());
    absl::StatusOr<std::string> body = PostLocked(path, json, /*with_token=*/true);
    if (body.ok() || !token_refused_) return body;
    MC_RETURN_IF_ERROR(AuthenticateLocked());
    return PostLocked(path, json, /*with_token=*/true);
  }

  absl::Status AuthenticateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    token_.clear();
    const std::string request =
        absl::StrCat("{\"name\":\"", JsonEscape(options_.user), "\",\"password\":\"",
                     JsonEscape(options_.password), "\"}");
    absl::StatusOr<std::string> body =
        PostLocked("/v3/auth/authenticate", request, /*with_token=*/false);
    if (!body.ok()) {
      return absl::UnavailableError(absl::StrCat("etcd authentication as '", options_.user,
                                                 "' failed: ", body.status().message()));
    }
    std::optional<std::string> token = JsonField(*body, "token");
    if (!token || token->empty()) {
      return absl::UnavailableError(
          absl::StrCat("etcd authentication as '", options_.user, "': no token in the answer"));
    }
    token_ = *std::move(token);
    return absl::OkStatus();
  }

  std::unique_ptr<httplib::Client> MakeClient(const std::string& endpoint) const {
    std::unique_ptr<httplib::Client> client;
    if (!options_.cert_file.empty()) {
      client = std::make_unique<httplib::Client>(endpoint, options_.cert_file, options_.key_file);
    } else {
      client = std::make_unique<httplib::Client>(endpoint);
    }
    if (endpoint.rfind("https://", 0) == 0) {
      client->enable_server_certificate_verification(true);
      if (!options_.ca_file.empty()) client->set_ca_cert_path(options_.ca_file.c_str());
    }
    const time_t sec = options_.timeout_ms / 1000;
    const time_t usec = (options_.timeout_ms % 1000) * 1000;
    client->set_connection_timeout(sec, usec);
    client->set_read_timeout(sec, usec);
    client->set_write_timeout(sec, usec);
    return client;
  }

  absl::StatusOr<std::string> PostLocked(const std::string& path, const std::string& json,
                                         bool with_token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::string errors;
    token_refused_ = false;
    for (size_t n = 0; n < options_.endpoints.size(); ++n) {
      const size_t i = (current_ + n) % options_.endpoints.size();
      const std::string& endpoint = options_.endpoints[i];
      try {
        std::unique_ptr<httplib::Client> client = MakeClient(endpoint);
        httplib::Headers headers;
        if (with_token) headers.emplace("Authorization", token_);
        httplib::Result res = client->Post(path, headers, json, "application/json");
        if (!res) {
          absl::StrAppend(&errors, endpoint, ": ", httplib::to_string(res.error()));
          if (res.error() == httplib::Error::SSLServerVerification) {
            absl::StrAppend(&errors, " (etcd's certificate did not verify",
                            options_.ca_file.empty()
                                ? " against the system's CAs; set --etcd_ca_file"
                                : absl::StrCat(" against ", options_.ca_file),
                            ")");
          } else if (endpoint.rfind("https://", 0) == 0 && options_.cert_file.empty() &&
                     (res.error() == httplib::Error::SSLConnection ||
                      res.error() == httplib::Error::Read ||
                      res.error() == httplib::Error::Write)) {
            absl::StrAppend(&errors,
                            " (the TLS session failed: if etcd runs with --client-cert-auth, set "
                            "--etcd_cert_file and --etcd_key_file)");
          }
          absl::StrAppend(&errors, "; ");
          continue;
        }
        if (res->status != 200) {
          // etcd answers 401 (gRPC UNAUTHENTICATED) for a missing, invalid or expired token.
          if (with_token &&
              (res->status == 401 || res->body.find("invalid auth token") != std::string::npos)) {
            token_refused_ = true;
          }
          absl::StrAppend(&errors, endpoint, ": HTTP ", res->status, " ", res->body, "; ");
          continue;
        }
        current_ = i;
        return res->body;
      } catch (const std::exception& e) {
        absl::StrAppend(&errors, endpoint, ": ", e.what(), "; ");
      }
    }
    return absl::UnavailableError(absl::StrCat("etcd ", path, ": ", errors));
  }

  static std::string JsonEscape(std::string_view in) {
    std::string out;
    for (char c : in) {
      if (c == '"' || c == '\\') {
        out.push_back('\\');
        out.push_back(c);
      } else if (static_cast<unsigned char>(c) < 0x20) {
        absl::StrAppend(&out, "\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
      } else {
        out.push_back(c);
      }
    }
    return out;
  }

  const EtcdHttpOptions options_;
  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
  std::string token_ ABSL_GUARDED_BY(mu_);
  bool token_refused_ ABSL_GUARDED_BY(mu_) = false;  // the last PostLocked saw a 401
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdKv>> CreateEtcdHttpKv(const EtcdHttpOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoints");
  const bool tls = !options.ca_file.empty() || !options.cert_file.empty();
  for (const std::string& e : options.endpoints) {
    const bool https = e.rfind("https://", 0) == 0;
    if (!https && e.rfind("http://", 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", e, "': expected http://HOST:PORT or https://HOST:PORT"));
    }
    if (tls && !https) {
      return absl::InvalidArgumentError(absl::StrCat(
          "etcd endpoint '", e, "': TLS files are set, so every endpoint must be https://"));
    }
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "an etcd client certificate needs both its cert and key file");
  }
  if (options.user.empty() && !options.password.empty()) {
    return absl::InvalidArgumentError("an etcd password without an etcd user");
  }
  return std::unique_ptr<EtcdKv>(new EtcdHttpKv(options));
}

}  // namespace mc::master
