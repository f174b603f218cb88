#include "master/etcd_http.h"

#include <httplib.h>

#include <exception>
#include <mutex>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"

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
  // The body of a 200 answer from the first endpoint that gives one.
  absl::StatusOr<std::string> Post(const std::string& path, const std::string& json) {
    absl::MutexLock lock(&mu_);
    std::string errors;
    for (size_t n = 0; n < options_.endpoints.size(); ++n) {
      const size_t i = (current_ + n) % options_.endpoints.size();
      const std::string& endpoint = options_.endpoints[i];
      try {
        httplib::Client client(endpoint);
        const time_t sec = options_.timeout_ms / 1000;
        const time_t usec = (options_.timeout_ms % 1000) * 1000;
        client.set_connection_timeout(sec, usec);
        client.set_read_timeout(sec, usec);
        client.set_write_timeout(sec, usec);
        httplib::Result res = client.Post(path.c_str(), json, "application/json");
        if (!res) {
          absl::StrAppend(&errors, endpoint, ": ", httplib::to_string(res.error()), "; ");
          continue;
        }
        if (res->status != 200) {
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

  const EtcdHttpOptions options_;
  absl::Mutex mu_;
  size_t current_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdKv>> CreateEtcdHttpKv(const EtcdHttpOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no etcd endpoints");
  for (const std::string& e : options.endpoints) {
    if (e.rfind("http://", 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd endpoint '", e, "': expected http://HOST:PORT"));
    }
  }
  return std::unique_ptr<EtcdKv>(new EtcdHttpKv(options));
}

}  // namespace mc::master
